"""The emulated fleet served over HTTP (disagg.emulator.http), driven by real clients.

Servers bind 127.2.0.0/16 addresses on free ports; every request stays on loopback.
The `openai` SDK streams chat completions; the P/D handshakes are sent the way the
routers send them (docs/router.md). Client-side TTFT and ITL are compared with the
service-time models of the emulated deployment (never faster, and within a tolerance
that absorbs a loaded 2-core machine).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time

import aiohttp
import openai
import pytest

from disagg.emulator.fleet import DeploymentEmulator, Fleet
from disagg.emulator.http import (
    FleetServer,
    check_loopback,
    count_tokens,
    parse_request,
    sequential_addresses,
)
from disagg.model import StageModels

PROMPT_TOKENS = 6000
OUTPUT_TOKENS = 12
LATE_S = 0.12  # how much later than the model a token may arrive on a busy machine
EARLY_S = 0.01  # how much earlier than the model (clock granularity)

_bases = itertools.count(2)


class Served:
    """A standalone emulated deployment with its pods served over HTTP."""

    def __init__(self, prefill: int = 1, decode: int = 1) -> None:
        self.t0 = time.monotonic()
        self.fleet = Fleet()
        self.dep = DeploymentEmulator("default", "demo", StageModels(), now=0.0)
        self.fleet.add_deployment(self.dep, 0.0)
        self.prefill = [
            self.fleet.add_pod(self.dep, "prefill", f"demo-prefill-{i}", f"p{i}", 0.0) for i in range(prefill)
        ]
        self.decode = [
            self.fleet.add_pod(self.dep, "decode", f"demo-decode-{i}", f"d{i}", 0.0) for i in range(decode)
        ]
        base = f"127.2.{next(_bases)}.2"
        self.server = FleetServer(self.fleet, self.now, address_of=sequential_addresses(base, 0))

    def now(self) -> float:
        return time.monotonic() - self.t0

    def url(self, pod) -> str:
        ip, port = self.server.address(pod)
        return f"http://{ip}:{port}"

    def model_ttft(self, prompt: int) -> float:
        d = self.dep
        return d.prefill_s(prompt) + d.setup_s + d.wire_s(prompt) + d.step_s[1]

    async def __aenter__(self) -> Served:
        await self.server.sync()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.server.close()


def words(n: int) -> str:
    return " ".join(["w"] * n)


async def vllm_prefill(session: aiohttp.ClientSession, url: str, body: dict) -> dict:
    """The prefill stage of vllm-router: max_tokens 1, not streamed, do_remote_decode."""
    pre = dict(body, max_tokens=1, stream=False, kv_transfer_params={"do_remote_decode": True})
    pre.pop("stream_options", None)
    async with session.post(f"{url}/v1/chat/completions", json=pre) as r:
        assert r.status == 200, await r.text()
        return (await r.json())["kv_transfer_params"]


async def stream_chat(client: openai.AsyncOpenAI, body: dict, t_start: float, clock) -> dict:
    """Stream one chat completion; returns token arrival times (from t_start), final chunk and usage."""
    stream = await client.chat.completions.create(
        model=body["model"],
        messages=body["messages"],
        max_tokens=body["max_tokens"],
        stream=True,
        stream_options={"include_usage": True},
        extra_body={k: v for k, v in body.items() if k in ("kv_transfer_params",)},
    )
    times, text, finish, usage = [], "", None, None
    async for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            if c.delta.content:
                times.append(clock() - t_start)
                text += c.delta.content
            if c.finish_reason is not None:
                finish = c.finish_reason
    return {"times": times, "tokens": len(text.split()), "finish": finish, "usage": usage}


def chat_body(prompt: int, out: int) -> dict:
    return {"model": "emulated", "messages": [{"role": "user", "content": words(prompt)}], "max_tokens": out}


def test_openai_sdk_streams_a_pd_chat_completion_paced_by_the_models():
    async def main():
        async with Served() as s, aiohttp.ClientSession() as session:
            client = openai.AsyncOpenAI(base_url=f"{s.url(s.decode[0])}/v1", api_key="unused", max_retries=0)
            # warm up both clients (the SDK's lazy imports, the connections) on small requests
            warm = chat_body(1, 1)
            warm["kv_transfer_params"] = await vllm_prefill(session, s.url(s.prefill[0]), warm)
            await stream_chat(client, warm, s.now(), s.now)
            results = []
            for _ in range(3):  # one at a time: idle pools, so the model's TTFT is exact
                body = chat_body(PROMPT_TOKENS, OUTPUT_TOKENS)
                t = s.now()
                body["kv_transfer_params"] = await vllm_prefill(session, s.url(s.prefill[0]), body)
                results.append(await stream_chat(client, body, t, s.now))
            await client.close()
            return results, s.model_ttft(PROMPT_TOKENS), s.dep.step_s[1], s.server.summary()

    results, ttft_model, step, summary = asyncio.run(main())
    for r in results:
        assert r["finish"] == "length", "every stream ends with its final chunk"
        assert r["usage"] is not None and r["usage"].completion_tokens == OUTPUT_TOKENS
        assert r["usage"].prompt_tokens == PROMPT_TOKENS
        assert r["tokens"] == OUTPUT_TOKENS
        ttft = r["times"][0]
        assert ttft_model - EARLY_S <= ttft <= ttft_model + LATE_S, (ttft, ttft_model)
        itl = (r["times"][-1] - r["times"][0]) / (len(r["times"]) - 1)
        assert step - EARLY_S <= itl <= step + LATE_S / 4, (itl, step)
    assert summary["errors"] == 0


def test_concurrent_streams_all_finish_and_share_the_decode_batch():
    async def main():
        async with Served(prefill=2, decode=2) as s, aiohttp.ClientSession() as session:

            async def one(i: int):
                dec = s.decode[i % 2]
                client = openai.AsyncOpenAI(base_url=f"{s.url(dec)}/v1", api_key="unused", max_retries=0)
                body = chat_body(500 + 100 * i, 8)
                t = s.now()
                body["kv_transfer_params"] = await vllm_prefill(session, s.url(s.prefill[i % 2]), body)
                r = await stream_chat(client, body, t, s.now)
                await client.close()
                return r

            out = await asyncio.gather(*(one(i) for i in range(8)))
            return (
                out,
                s.server.summary(),
                [p.in_flight() + p.pending_kv_sends() for p in s.fleet.pods.values()],
            )

    out, summary, held = asyncio.run(main())
    assert all(r["finish"] == "length" and r["usage"].completion_tokens == 8 for r in out)
    assert summary["errors"] == 0 and summary["completed"] == 16  # 8 prefill + 8 decode responses
    assert held == [0, 0, 0, 0], "no request or KV left on any pod"


def test_sglang_bootstrap_room_decode_may_arrive_before_the_prefill():
    async def main():
        async with Served() as s, aiohttp.ClientSession() as session:
            pip = s.server.address(s.prefill[0])[0]
            body = {
                "model": "emulated",
                "prompt": words(2000),
                "max_tokens": 5,
                "stream": True,
                "stream_options": {"include_usage": True},
                "bootstrap_host": pip,
                "bootstrap_port": None,
                "bootstrap_room": 12345,
            }

            async def decode():
                chunks = []
                async with session.post(f"{s.url(s.decode[0])}/v1/completions", json=body) as r:
                    assert r.status == 200, await r.text()
                    async for line in r.content:
                        if line.startswith(b"data: "):
                            chunks.append(line[6:].strip())
                return chunks

            async def prefill():
                await asyncio.sleep(0.1)  # the decode request is already waiting in the room
                async with session.post(f"{s.url(s.prefill[0])}/v1/completions", json=body) as r:
                    assert r.status == 200
                    await r.read()

            chunks, _ = await asyncio.gather(decode(), prefill())
            return chunks

    import json

    chunks = asyncio.run(main())
    assert chunks[-1] == b"[DONE]"
    events = [json.loads(c) for c in chunks[:-1]]
    assert events[-1]["usage"]["completion_tokens"] == 5
    assert events[-2]["choices"][0]["finish_reason"] == "length"
    assert sum(len(e["choices"][0]["text"].split()) for e in events if e["choices"]) == 5


def test_kv_of_a_removed_prefill_pod_cannot_be_pulled():
    async def main():
        async with Served() as s, aiohttp.ClientSession() as session:
            body = chat_body(1000, 4)
            params = await vllm_prefill(session, s.url(s.prefill[0]), body)
            held = s.prefill[0].pending_kv_sends()
            s.fleet.remove_pod(s.prefill[0], s.now())  # the prefill pod is deleted before the pull
            body["kv_transfer_params"] = params
            async with session.post(f"{s.url(s.decode[0])}/v1/chat/completions", json=body) as r:
                return held, r.status, s.fleet.lost

    held, status, lost = asyncio.run(main())
    assert held == 1, "after its prefill response the pod still holds the KV (a pending send)"
    assert status == 503
    assert lost == 1


def test_models_health_metrics_and_bad_requests():
    async def main():
        async with Served() as s, aiohttp.ClientSession() as session:
            url = s.url(s.decode[0])
            async with session.get(f"{url}/v1/models") as r:
                models = await r.json()
            async with session.get(f"{url}/health") as r:
                health = r.status
            async with session.post(f"{url}/v1/completions", json={"prompt": "a b", "max_tokens": 0}) as r:
                bad = r.status, (await r.json())["message"]
            async with session.post(f"{s.url(s.prefill[0])}/v1/completions", json={"prompt": "a"}) as r:
                plain_on_prefill = r.status
            async with session.post(f"{url}/v1/completions", json={"prompt": "a b c", "max_tokens": 2}) as r:
                whole = await r.json()
            return models, health, bad, plain_on_prefill, whole

    models, health, bad, plain_on_prefill, whole = asyncio.run(main())
    assert models["data"][0]["id"] == "emulated"
    assert health == 200
    assert bad[0] == 400 and "max_tokens" in bad[1]
    assert plain_on_prefill == 400
    assert whole["usage"] == {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
    assert whole["choices"][0]["finish_reason"] == "length"


def test_metrics_endpoint_serves_only_the_pods_own_series():
    from prometheus_client import generate_latest

    from disagg.emulator.metrics import build_registry

    async def main():
        async with Served(decode=2) as s, aiohttp.ClientSession() as session:
            registry = build_registry(s.fleet, lambda: s.fleet.flush(s.now()))
            s.server.metrics_text = lambda: generate_latest(registry)
            async with session.get(f"{s.url(s.decode[0])}/metrics") as r:
                return await r.text()

    text = asyncio.run(main())
    assert 'pod="demo-decode-0"' in text
    assert 'pod="demo-decode-1"' not in text and 'pod="demo-prefill-0"' not in text


def test_only_loopback_addresses_are_served():
    assert check_loopback("127.1.0.7") == "127.1.0.7"
    with pytest.raises(ValueError, match=r"outside 127\.0\.0\.0/8"):
        check_loopback("10.0.0.5")

    async def main():
        s = Served()
        s.server.address_of = lambda pod: ("10.0.0.5", 8000)
        await s.server.sync()
        served = dict(s.server.servers)
        await s.server.close()
        return served, s.server.refused

    served, refused = asyncio.run(main())
    assert served == {}
    assert refused == ["demo-prefill-0", "demo-decode-0"]


def test_token_counting_and_request_parsing():
    assert count_tokens("a b  c\nd") == 4
    assert count_tokens([1, 2, 3]) == 3
    assert count_tokens([{"type": "text", "text": "x y"}]) == 2
    assert parse_request({"prompt": "a b", "max_tokens": 7}, chat=False) == (2, 7)
    assert parse_request(
        {"messages": [{"role": "user", "content": "a b c"}], "max_completion_tokens": 3}, chat=True
    ) == (3, 3)
    assert parse_request({"prompt": "a"}, chat=False)[1] == 16
    for body, chat in (({"messages": []}, True), ({}, False), ({"prompt": "a", "max_tokens": "3"}, False)):
        with pytest.raises(ValueError):
            parse_request(body, chat)


def test_the_watcher_records_each_pods_engine_address_and_forgets_unlisted_pods():
    from disagg.emulator.driver import PodWatcher, pod_address

    def pod(name: str, ip: str | None, routable: bool = True) -> dict:
        return {
            "metadata": {
                "name": name,
                "namespace": "ns",
                "uid": name,
                "labels": {"disagg.dev/deployment": "demo", "disagg.dev/pool": "decode"},
            },
            "spec": {
                "containers": [{"ports": [{"name": "metrics", "containerPort": 9}, {"containerPort": 30000}]}]
            },
            "status": {
                "phase": "Running",
                **({"podIP": ip} if ip else {}),
                "conditions": [{"type": "disagg.dev/routable", "status": "True" if routable else "False"}],
            },
        }

    assert pod_address(pod("a", "127.1.0.4")) == ("127.1.0.4", 30000)
    assert pod_address(pod("a", None)) is None
    fleet = Fleet()
    fleet.add_deployment(DeploymentEmulator("ns", "demo", StageModels()), 0.0)
    w = PodWatcher(None, fleet, lambda: 0.0)
    w.apply({}, [pod("a", "127.1.0.4"), pod("b", "127.1.0.5", routable=False)], 0.0)
    assert fleet.addresses == {("ns", "a", "a"): ("127.1.0.4", 30000), ("ns", "b", "b"): ("127.1.0.5", 30000)}
    w.apply({}, [pod("a", "127.1.0.4")], 0.1)  # b is gone from the listing
    assert fleet.addresses == {("ns", "a", "a"): ("127.1.0.4", 30000)}


def test_replay_sends_a_trace_at_its_timestamps_and_checks_every_stream(tmp_path):
    """`disagg replay` against an emulated decode pod (whole requests, no handshake)."""
    from disagg import workload
    from disagg.replay import Replay, summarize

    trace = tmp_path / "trace.jsonl"
    rows = [(0, 300, 4), (200, 500, 6), (200, 100, 3), (700, 800, 5)]  # ms, prompt, output
    trace.write_text(
        "".join(
            json.dumps({"timestamp": t, "input_length": p, "output_length": o}) + "\n" for t, p, o in rows
        )
    )
    w = workload.load_trace(str(trace))

    async def main():
        async with Served() as s:
            rp = Replay(f"{s.url(s.decode[0])}/v1")
            await rp.run(w.arrival_s.tolist(), w.prompt_tokens.tolist(), w.output_tokens.tolist())
            bad = Replay(f"{s.url(s.prefill[0])}/v1")  # a prefill pod refuses plain requests
            await bad.run([0.0], [10], [2])
            return rp.results, bad.results, s.fleet.deployments

    results, bad, _ = asyncio.run(main())
    s = summarize(results)
    assert (s["requests"], s["ok"], s["failed"], s["truncated"]) == (4, 4, 0, 0)
    for r in results:
        assert 0 <= r.sent_s - r.scheduled_s < 0.1, "sent at its timestamp"
        assert r.ttft_s > 0 and r.itl_s > 0
    assert [r.scheduled_s for r in results] == [0.0, 0.2, 0.2, 0.7]
    assert summarize(bad)["failed"] == 1 and "HTTP 400" in bad[0].detail


def test_the_replay_summary_line_names_why_requests_failed():
    from disagg.replay import Result, format_summary, summarize

    results = [
        Result(0, 0.0, 0.0, 0.2, 0.04, 1.0, "ok"),
        Result(1, 1.0, 1.0, status="failed", detail="Connect call failed ('127.0.0.1', 9)"),
    ]
    text = format_summary(summarize(results))
    assert "requests=2 ok=1 failed=1" in text
    assert "first errors: #1: Connect call failed ('127.0.0.1', 9)" in text
    assert "first errors" not in format_summary(summarize(results[:1]))
