"""The emulated fleet served over HTTP like an engine: one OpenAI-compatible server per emulated pod.

Each emulated pod listens on its own pod IP (inside 127.0.0.0/8: the local
cluster's pod CIDR is on loopback) and answers what a vLLM or SGLang server
answers: ``/v1/completions`` and ``/v1/chat/completions`` (non-streaming, and
streaming SSE with a final usage chunk), ``/v1/models``, ``/health`` and
``/metrics`` (the pod's own series). Tokens are paced by the emulated engine:
the request's job runs through the simulator's stage logic on the wall clock,
so its first token comes after prefill, KV transfer and the first decode step,
and then one token per decode step of its batch.

P/D handshakes (docs/router.md):

* vLLM (NIXL, as `vllm-router` drives it): a prefill request carries
  ``kv_transfer_params.do_remote_decode``; the prefill pod runs the prompt and
  answers with ``kv_transfer_params`` naming itself (``remote_host``,
  ``remote_engine_id``, ``remote_block_ids``). The KV stays on the prefill pod
  (a pending KV send) until the decode request, carrying those params, pulls
  it over the prefill pod's emulated KV link.
* SGLang (bootstrap, as `sglang-router` drives it): the same body, with
  ``bootstrap_host``/``bootstrap_port``/``bootstrap_room``, goes to the prefill
  and the decode pod at once; the decode pod waits for room ``bootstrap_room``
  of the prefill at ``bootstrap_host`` and pulls its KV when it is ready.
* No handshake fields on a decode or colocated pod: the whole request runs
  there (local prefill, then decode).

Token counting is the emulator's own rule, so a client can size prompts exactly:
a prompt of text has one token per whitespace-separated word (at least one); a
prompt given as token ids has one per id; chat messages add up their contents.
Every request generates exactly ``max_tokens`` tokens (``finish_reason``
"length"), default 16.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
import time
import uuid
from collections.abc import Callable
from typing import Any

from disagg.emulator.fleet import DeploymentEmulator, EmulatedPod, Fleet
from disagg.sim.core import DONE, FAILED, INF, LOST, WAITING, Job
from disagg.sim.workers import PREFILL
from disagg.workload import Request

log = logging.getLogger("disagg.emulator.http")

LOOPBACK = ipaddress.ip_network("127.0.0.0/8")
DEFAULT_ENGINE_PORT = 8000
DEFAULT_MAX_TOKENS = 16
# Longest a handler sleeps without looking at its job (a missed notification costs at most this).
MAX_WAIT_S = 0.25
# How long a prefilled job's KV waits for its decode request before it is freed (vLLM's
# VLLM_NIXL_ABORT_REQUEST_TIMEOUT is 480 s; shorter here so an abandoned test run cleans up).
KV_PULL_TIMEOUT_S = 120.0
# How long an SGLang decode request waits for its prefill's room to appear.
BOOTSTRAP_WAIT_S = 30.0


class BadRequest(ValueError):
    """The request body is not something the engine accepts (HTTP 400)."""


def count_tokens(value: Any) -> int:
    """Prompt tokens under the emulator's rule: words of text, ids of a token list, sum of a list."""
    if isinstance(value, str):
        return len(value.split())
    if isinstance(value, list):
        if all(isinstance(x, int) for x in value):
            return len(value)
        return sum(count_tokens(x) for x in value)
    if isinstance(value, dict):  # chat content part {"type": "text", "text": ...}
        return count_tokens(value.get("text", ""))
    return 0


def parse_request(body: Any, chat: bool) -> tuple[int, int]:
    """(prompt tokens, output tokens) of an OpenAI-style body; raises BadRequest."""
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    if chat:
        msgs = body.get("messages")
        if not isinstance(msgs, list) or not msgs:
            raise BadRequest("'messages' must be a non-empty list")
        prompt = sum(count_tokens(m.get("content", "")) for m in msgs if isinstance(m, dict))
    else:
        if "prompt" not in body:
            raise BadRequest("'prompt' is required")
        prompt = count_tokens(body["prompt"])
    out = body.get("max_completion_tokens") if chat else None
    if out is None:
        out = body.get("max_tokens")
    if out is None:
        out = DEFAULT_MAX_TOKENS
    if not isinstance(out, int) or isinstance(out, bool) or out < 1:
        raise BadRequest(f"max_tokens must be a positive integer, got {out!r}")
    return max(1, prompt), out


def check_loopback(ip: str) -> str:
    """The address an emulated engine may bind: only inside 127.0.0.0/8."""
    try:
        addr = ipaddress.ip_address(ip)
    except ValueError:
        raise ValueError(f"not an IP address: {ip!r}") from None
    if addr not in LOOPBACK:
        raise ValueError(
            f"pod IP {ip} is outside 127.0.0.0/8; emulated engines bind loopback only "
            "(set the cluster's pod CIDR inside 127.0.0.0/8, see hack/cluster.sh DISAGG_POD_CIDR)"
        )
    return ip


class _Format:
    """OpenAI response shapes for one request (chat or completions)."""

    def __init__(self, chat: bool, model: str) -> None:
        self.chat = chat
        self.model = model
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())

    @staticmethod
    def text(first: int, n: int) -> str:
        return "".join(f" t{i}" for i in range(first, first + n))

    def usage(self, prompt: int, completion: int) -> dict:
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}

    def whole(self, prompt: int, completion: int, extra: dict | None = None) -> dict:
        text = self.text(0, completion)
        if self.chat:
            choice = {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": None,
                "finish_reason": "length",
            }
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": "length"}
        out = {
            "id": self.id,
            "object": "chat.completion" if self.chat else "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": [choice],
            "usage": self.usage(prompt, completion),
        }
        if extra:
            out.update(extra)
        return out

    def chunk(self, delta: dict | str | None, finish: str | None = None) -> dict:
        if self.chat:
            choice = {"index": 0, "delta": delta if isinstance(delta, dict) else {}, "logprobs": None}
        else:
            choice = {"index": 0, "text": delta if isinstance(delta, str) else "", "logprobs": None}
        choice["finish_reason"] = finish
        return {
            "id": self.id,
            "object": "chat.completion.chunk" if self.chat else "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": [choice],
        }

    def token_chunk(self, first: int, n: int) -> dict:
        t = self.text(first, n)
        return self.chunk({"content": t} if self.chat else t)

    def usage_chunk(self, prompt: int, completion: int) -> dict:
        return {
            "id": self.id,
            "object": "chat.completion.chunk" if self.chat else "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": [],
            "usage": self.usage(prompt, completion),
        }


class FleetServer:
    """Serves every emulated pod of a `Fleet` on its own address; started and stopped with the pods."""

    def __init__(
        self,
        fleet: Fleet,
        now: Callable[[], float],
        *,
        address_of: Callable[[EmulatedPod], tuple[str, int] | None],
        metrics_text: Callable[[], bytes] | None = None,
        kv_pull_timeout_s: float = KV_PULL_TIMEOUT_S,
    ) -> None:
        self.fleet = fleet
        self.now = now
        self.address_of = address_of
        self.metrics_text = metrics_text
        self.kv_pull_timeout_s = kv_pull_timeout_s
        self.servers: dict[int, tuple[Any, str, int]] = {}  # id(pod) -> (runner, ip, port)
        self.by_address: dict[str, EmulatedPod] = {}  # "ip" -> pod (remote_host / bootstrap_host)
        self.events: dict[Job, asyncio.Event] = {}
        self.handles: dict[int, tuple[DeploymentEmulator, Job]] = {}  # remote block id -> held job
        self.rooms: dict[tuple[str, int], tuple[DeploymentEmulator, Job]] = {}  # (host, room) -> job
        self._room_waiters: dict[tuple[str, int], asyncio.Event] = {}
        self._next_handle = 1
        self.refused: list[str] = []
        # Client-visible counters (also in the /summary of `disagg emulate --serve`).
        self.requests = 0
        self.completed = 0
        self.errors = 0
        self.while_draining = 0  # requests that reached a pod already draining (the router should not send)

    # -- notifications from the emulated deployments
    def _listen(self, dep: DeploymentEmulator) -> None:
        if dep.listener is None:
            dep.listener = self._notify

    def _notify(self, job: Job) -> None:
        ev = self.events.get(job)
        if ev is not None:
            ev.set()

    async def _wait(self, job: Job, until: float) -> None:
        """Sleep until emulated time `until` (at most MAX_WAIT_S) or a notification for `job`."""
        dt = min(MAX_WAIT_S, max(0.0, until - self.now()))
        ev = self.events.get(job)
        if ev is None:
            await asyncio.sleep(dt)
            return
        ev.clear()
        try:
            await asyncio.wait_for(ev.wait(), dt)
        except TimeoutError:
            pass

    # -- lifecycle
    async def sync(self) -> None:
        """Start a server for every emulated pod with an address; stop those of gone pods."""
        live = {id(p): p for p in self.fleet.pods.values()}
        for key in [k for k in self.servers if k not in live]:
            runner, ip, _ = self.servers.pop(key)
            self.by_address.pop(ip, None)
            await runner.cleanup()
        for key, pod in live.items():
            if key in self.servers:
                continue
            addr = self.address_of(pod)
            if addr is None:
                continue
            ip, port = addr
            try:
                check_loopback(ip)
            except ValueError as exc:
                if pod.name not in self.refused:
                    self.refused.append(pod.name)
                    log.warning("emulator: not serving pod %s/%s: %s", pod.namespace, pod.name, exc)
                continue
            self._listen(pod.owner)
            runner, bound = await self._start(pod, ip, port)
            self.servers[key] = (runner, ip, bound)
            self.by_address[ip] = pod
            log.info("emulator: pod %s/%s serves http://%s:%d/v1", pod.namespace, pod.name, ip, bound)

    def address(self, pod: EmulatedPod) -> tuple[str, int] | None:
        """Where `pod` is served (after `sync`)."""
        s = self.servers.get(id(pod))
        return (s[1], s[2]) if s else None

    async def run(self, interval_s: float, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await self.sync()
            except OSError as exc:  # an address in use: retried next round
                log.warning("emulator: serving a pod failed: %s", exc)
            try:
                await asyncio.wait_for(stop.wait(), interval_s)
            except TimeoutError:
                pass

    def summary(self) -> dict:
        return {
            "requests": self.requests,
            "completed": self.completed,
            "errors": self.errors,
            "while_draining": self.while_draining,
            "endpoints": {
                f"{p.namespace}/{p.name}": f"http://{ip}:{port}/v1"
                for p in self.fleet.pods.values()
                if (s := self.servers.get(id(p))) is not None
                for ip, port in [(s[1], s[2])]
            },
        }

    async def close(self) -> None:
        for runner, _, _ in self.servers.values():
            await runner.cleanup()
        self.servers.clear()
        self.by_address.clear()

    async def _start(self, pod: EmulatedPod, ip: str, port: int):
        from aiohttp import web

        async def completions(request):
            return await self._generate(pod, request, chat=False)

        async def chat(request):
            return await self._generate(pod, request, chat=True)

        async def models(_request):
            return await self._models(pod)

        async def health(_request):
            return web.Response(status=200)

        async def metrics(_request):
            return await self._metrics(pod)

        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/completions", completions)
        app.router.add_post("/v1/chat/completions", chat)
        app.router.add_get("/v1/models", models)
        app.router.add_get("/health", health)
        app.router.add_get("/metrics", metrics)
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
        await runner.setup()
        site = web.TCPSite(runner, ip, port, reuse_address=True)
        await site.start()
        bound = port
        server = getattr(site, "_server", None)
        if server is not None and server.sockets:
            bound = server.sockets[0].getsockname()[1]
        return runner, bound

    # -- simple endpoints
    async def _models(self, pod: EmulatedPod):
        from aiohttp import web

        model = {"id": pod.model_name, "object": "model", "created": 0, "owned_by": "disagg-emulator"}
        return web.json_response({"object": "list", "data": [model]})

    async def _metrics(self, pod: EmulatedPod):
        from aiohttp import web

        text = self.metrics_text() if self.metrics_text else b""
        mark = f'pod="{pod.name}"'.encode()
        lines = [ln for ln in text.split(b"\n") if ln.startswith(b"#") or mark in ln]
        return web.Response(body=b"\n".join(lines) + b"\n", content_type="text/plain", charset="utf-8")

    # -- generation
    async def _generate(self, pod: EmulatedPod, request, chat: bool):
        from aiohttp import web

        self.requests += 1
        try:
            body = await request.json()
            prompt, out = parse_request(body, chat)
        except (BadRequest, ValueError) as exc:
            self.errors += 1
            return _error(400, str(exc))
        if pod.draining:
            self.while_draining += 1
        dep = pod.owner
        fmt = _Format(chat, body.get("model") or pod.model_name)
        kv = body.get("kv_transfer_params") or {}
        room = body.get("bootstrap_room")
        stream = bool(body.get("stream"))
        usage = bool((body.get("stream_options") or {}).get("include_usage"))
        if pod.pool == PREFILL:
            if kv.get("do_remote_decode"):
                return await self._vllm_prefill(pod, fmt, prompt, request)
            if room is not None:
                return await self._sglang_prefill(pod, fmt, prompt, body, request, stream)
            self.errors += 1
            return _error(400, "an emulated prefill pod serves only P/D prefill requests")
        if kv.get("do_remote_prefill"):
            job = await self._vllm_pull(pod, kv, out)
        elif room is not None:
            job = await self._sglang_pull(pod, body, out)
        else:
            job = dep.serve_local(pod, Request(self.now(), prompt, out), self.now())
            self.events[job] = asyncio.Event()
        if isinstance(job, web.Response):
            self.errors += 1
            return job
        try:
            if stream:
                return await self._stream(pod, job, fmt, prompt, usage, request)
            return await self._whole(pod, job, fmt, prompt)
        finally:
            self.events.pop(job, None)

    async def _until_prefilled(self, pod: EmulatedPod, job: Job) -> bool:
        dep = pod.owner
        while True:
            now = self.now()
            dep.advance(now)
            if dep.prefilled(job):
                return True
            if job not in dep.held and job.t_pf_end <= now and job.state in (WAITING, DONE):
                return True  # SGLang: the decode side already pulled the KV
            if job.state != WAITING:
                return False
            await self._wait(job, pod.worker.next_time)

    async def _await_prefill(self, pod: EmulatedPod, job: Job):
        """Wait until `job`'s prefill on `pod` is done: None, or the 503 answer if it was lost."""
        self.events[job] = asyncio.Event()
        try:
            ok = await self._until_prefilled(pod, job)
        finally:
            self.events.pop(job, None)
        if ok:
            return None
        self.errors += 1
        return _error(503, f"prefill lost on {pod.name}")

    async def _vllm_prefill(self, pod: EmulatedPod, fmt: _Format, prompt: int, request):
        from aiohttp import web

        dep = pod.owner
        now = self.now()
        job = dep.serve_prefill(pod, Request(now, prompt, 1), now)
        lost = await self._await_prefill(pod, job)
        if lost is not None:
            return lost
        handle = self._next_handle
        self._next_handle += 1
        self.handles[handle] = (dep, job)
        asyncio.get_running_loop().call_later(self.kv_pull_timeout_s, self._expire_handle, handle)
        ip = self.address(pod)
        params = {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "remote_engine_id": f"{pod.namespace}/{pod.name}",
            "remote_block_ids": [handle],
            "remote_host": ip[0] if ip else None,
            "remote_port": ip[1] if ip else None,
            "tp_size": 1,
        }
        self.completed += 1
        return web.json_response(fmt.whole(prompt, 1, {"kv_transfer_params": params}))

    def _expire_handle(self, handle: int) -> None:
        held = self.handles.pop(handle, None)
        if held is not None:
            dep, job = held
            dep.release_kv(job, self.now())

    async def _vllm_pull(self, pod: EmulatedPod, kv: dict, out: int):
        blocks = kv.get("remote_block_ids") or []
        held = self.handles.pop(blocks[0], None) if blocks and isinstance(blocks[0], int) else None
        if held is None:
            return _error(400, "kv_transfer_params name no KV held by an emulated prefill pod")
        dep, job = held
        if dep is not pod.owner:
            return _error(400, "the KV belongs to another DisaggDeployment")
        self.events[job] = asyncio.Event()
        if not dep.pull_kv(job, pod, self.now(), out):
            self.events.pop(job, None)
            return _error(503, "the prefilled KV is gone (its prefill pod was removed)")
        return job

    async def _sglang_prefill(self, pod: EmulatedPod, fmt: _Format, prompt: int, body: dict, request, stream):
        from aiohttp import web

        dep = pod.owner
        now = self.now()
        job = dep.serve_prefill(pod, Request(now, prompt, 1), now)
        key = (str(body.get("bootstrap_host")), int(body["bootstrap_room"]))
        self.rooms[key] = (dep, job)
        waiter = self._room_waiters.pop(key, None)
        if waiter is not None:
            waiter.set()
        asyncio.get_running_loop().call_later(self.kv_pull_timeout_s, self._expire_room, key)
        lost = await self._await_prefill(pod, job)
        if lost is not None:
            return lost
        self.completed += 1
        if not stream:
            return web.json_response(fmt.whole(prompt, 1))
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        await _sse(resp, fmt.token_chunk(0, 1))
        await _sse(resp, fmt.chunk({} if fmt.chat else "", "length"))
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    def _expire_room(self, key: tuple[str, int]) -> None:
        held = self.rooms.pop(key, None)
        if held is not None:
            held[0].release_kv(held[1], self.now())

    async def _sglang_pull(self, pod: EmulatedPod, body: dict, out: int):
        try:
            key = (str(body.get("bootstrap_host")), int(body["bootstrap_room"]))
        except (TypeError, ValueError):
            return _error(400, "bootstrap_room must be an integer")
        deadline = self.now() + BOOTSTRAP_WAIT_S
        while key not in self.rooms:  # the prefill request may arrive after the decode one
            if self.now() >= deadline:
                return _error(503, f"no prefill joined bootstrap room {key[1]} at {key[0]}")
            ev = self._room_waiters.setdefault(key, asyncio.Event())
            try:
                await asyncio.wait_for(ev.wait(), MAX_WAIT_S)
            except TimeoutError:
                pass
        dep, job = self.rooms.pop(key)
        if dep is not pod.owner:
            return _error(400, "the bootstrap room belongs to another DisaggDeployment")
        self.events[job] = asyncio.Event()
        prefill = self.by_address.get(key[0])
        while not dep.prefilled(job):  # SGLang's decode waits in the room while the prefill runs
            if job.state != WAITING:
                self.events.pop(job, None)
                return _error(503, "the prefill of this bootstrap room was lost")
            await self._wait(job, prefill.worker.next_time if prefill is not None else INF)
            dep.advance(self.now())
        if not dep.pull_kv(job, pod, self.now(), out):
            self.events.pop(job, None)
            return _error(503, "the prefilled KV is gone (its prefill pod was removed)")
        return job

    def _wake_time(self, pod: EmulatedPod, job: Job, now: float) -> float:
        if job.t_first == INF and job.src is not None:  # KV still on the wire
            return job.src.link.next_time
        return pod.owner.next_token_time(pod, now)

    async def _progress(self, pod: EmulatedPod, job: Job):
        """Yield the number of tokens emitted so far, each time it grows, until the job ends."""
        dep = pod.owner
        sent = 0
        while True:
            now = self.now()
            dep.advance(now)
            n = dep.tokens_out(job, pod, now)
            if n > sent:
                sent = n
                yield n
            if job.state != WAITING:
                return
            await self._wait(job, self._wake_time(pod, job, now))

    async def _whole(self, pod: EmulatedPod, job: Job, fmt: _Format, prompt: int):
        from aiohttp import web

        async for _ in self._progress(pod, job):
            pass
        if job.state != DONE:
            self.errors += 1
            return _error(503, _ended(job, pod))
        self.completed += 1
        return web.json_response(fmt.whole(prompt, job.output))

    async def _stream(self, pod: EmulatedPod, job: Job, fmt: _Format, prompt: int, usage: bool, request):
        from aiohttp import web

        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        sent = 0
        async for n in self._progress(pod, job):
            if sent == 0 and fmt.chat:
                await _sse(resp, fmt.chunk({"role": "assistant", "content": ""}))
            await _sse(resp, fmt.token_chunk(sent, n - sent))
            sent = n
        if job.state != DONE:
            # The engine died under the request: the stream ends without its final chunk, as a
            # real engine's would when its pod is deleted.
            self.errors += 1
            log.warning("emulator: stream on %s cut: %s", pod.name, _ended(job, pod))
            request.transport.close() if request.transport is not None else None
            return resp
        await _sse(resp, fmt.chunk({} if fmt.chat else "", "length"))
        if usage:
            await _sse(resp, fmt.usage_chunk(prompt, job.output))
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        self.completed += 1
        return resp


def _ended(job: Job, pod: EmulatedPod) -> str:
    what = {LOST: "lost (its pod was removed)", FAILED: "failed (KV transfer)"}.get(job.state, "ended")
    return f"request {what} on {pod.name}"


async def _sse(resp, obj: dict) -> None:
    await resp.write(b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n")


def _error(status: int, message: str):
    from aiohttp import web

    body = {
        "object": "error",
        "message": message,
        "type": "BadRequestError" if status == 400 else "ServiceUnavailable",
    }
    return web.json_response(body, status=status)


def sequential_addresses(base: str = "127.2.0.2", port: int = DEFAULT_ENGINE_PORT):
    """An `address_of` for standalone fleets: pods get consecutive loopback addresses from `base`."""
    start = ipaddress.ip_address(check_loopback(base))
    given: dict[int, tuple[str, int]] = {}

    def address_of(pod: EmulatedPod) -> tuple[str, int]:
        key = id(pod)
        if key not in given:
            given[key] = (check_loopback(str(start + len(given))), port)
        return given[key]

    return address_of
