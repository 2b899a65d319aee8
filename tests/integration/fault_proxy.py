"""A fault-injecting HTTP proxy between the operator and the local kube-apiserver.

It listens on 127.0.0.1 (plain HTTP, loopback only) and forwards every request to the real
API server over TLS with the client certificate of the cluster's kubeconfig; the operator
gets a kubeconfig (`write_kubeconfig`) that points at the proxy and holds no credentials.

While `faults` is set, each request draws one fault (or none) from a seeded random source:

* watches: `410 Gone` as an ERROR event inside the stream (the API server's "too old
  resource version"), a stream cut cleanly or dropped after a few seconds;
* writes (PATCH, POST, PUT, DELETE): `409 Conflict` or `500` without reaching the server, a
  response lost after the server applied the write (connection dropped), or a stall longer
  than the client's timeout (the server applied it; the answer never comes);
* reads: `500`, a dropped connection or a stall.

Every request's method, path and body is recorded (`requests`), so a test can check what the
operator asked the API server to write, whether or not the write got through.
"""

from __future__ import annotations

import asyncio
import base64
import json
import random
import ssl
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from aiohttp import web
from yarl import URL

#: Longer than the operator's own request timeout (disagg.kube.REQUEST_TIMEOUT_S, 10 s).
STALL_S = 12.0
HOP_BY_HOP = {
    "host",
    "connection",
    "keep-alive",
    "transfer-encoding",
    "content-length",
    "accept-encoding",
    "content-encoding",
    "upgrade",
    "proxy-connection",
}


@dataclass
class FaultPlan:
    """Probabilities of each fault per request (the rest pass through untouched)."""

    seed: int = 16
    # The API server reports an expired resourceVersion inside the watch stream (an ERROR
    # event with code 410), which Kopf restarts from. A 410 as the HTTP status of the watch
    # request itself is not what kube-apiserver sends; Kopf ends the operator on it (exit 1),
    # so it is off by default.
    watch_gone_status: float = 0.0
    watch_gone_event: float = 0.3
    watch_cut: float = 0.2  # stream ends (cleanly or dropped) after 1-6 s
    write_conflict: float = 0.2
    write_error: float = 0.15
    write_lost: float = 0.1  # applied, then the connection drops
    write_stall: float = 0.05  # applied, the answer held past the client's timeout, then dropped
    read_error: float = 0.1
    read_drop: float = 0.05
    read_stall: float = 0.03
    # Faults the first requests of a kind get, in order, before any is drawn: an operator that
    # reads from its watches sends few reads, and at these rates a run could see none of the
    # rarer faults (a test asserting each kind happened would then depend on the timing).
    first: dict[str, list[str]] = field(
        default_factory=lambda: {"read": ["read_drop", "read_stall"], "write": ["write_lost", "write_stall"]}
    )
    rng: random.Random = field(init=False)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)

    def draw(self, options: list[tuple[str, float]], kind: str = "") -> str | None:
        forced = self.first.get(kind)
        if forced:
            return forced.pop(0)
        x = self.rng.random()
        for name, p in options:
            if x < p:
                return name
            x -= p
        return None


@dataclass
class Recorded:
    method: str
    path: str
    query: str
    body: Any
    fault: str | None
    at: float


def status_body(code: int, reason: str, message: str) -> dict:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


def pem_file(section: dict, key: str, workdir: Path) -> str:
    """The file a kubeconfig entry names, or its inline `<key>-data` written to `workdir`."""
    if section.get(key):
        return section[key]
    path = workdir / f"{key}.pem"
    path.write_bytes(base64.b64decode(section[f"{key}-data"]))
    path.chmod(0o600)
    return str(path)


def is_watch(request: web.Request) -> bool:
    return request.query.get("watch") in ("true", "1")


class FaultProxy:
    def __init__(self, kubeconfig: str, workdir: Path) -> None:
        """`kubeconfig`: the cluster's (client-certificate login); `workdir` gets its key files."""
        cfg = yaml.safe_load(Path(kubeconfig).read_text())
        ctx_name = cfg["current-context"]
        ctx = next(c["context"] for c in cfg["contexts"] if c["name"] == ctx_name)
        cluster = next(c["cluster"] for c in cfg["clusters"] if c["name"] == ctx["cluster"])
        user = next(u["user"] for u in cfg["users"] if u["name"] == ctx["user"])
        self.upstream = cluster["server"].rstrip("/")
        workdir.mkdir(parents=True, exist_ok=True)
        self.ssl = ssl.create_default_context(cafile=pem_file(cluster, "certificate-authority", workdir))
        self.ssl.load_cert_chain(
            pem_file(user, "client-certificate", workdir), pem_file(user, "client-key", workdir)
        )
        self.faults: FaultPlan | None = None
        self.requests: list[Recorded] = []
        self.injected: Counter[str] = Counter()
        self.port = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self._lock = threading.Lock()
        self._cut_rng = random.Random(0)
        self._open_watches: dict[int, web.Request] = {}

    # -- life cycle (a thread of its own, so the blocking test code never stalls it) --------
    def start(self) -> FaultProxy:
        ready = threading.Event()

        def run() -> None:
            self._loop = asyncio.new_event_loop()
            self._loop.run_until_complete(self._serve())
            ready.set()
            self._loop.run_forever()

        self._thread = threading.Thread(target=run, name="fault-proxy", daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("the fault proxy did not start")
        return self

    async def _serve(self) -> None:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10), auto_decompress=False
        )

    def stop(self) -> None:
        if self._loop is None:
            return

        async def close() -> None:
            if self._runner:
                await self._runner.cleanup()
            if self._session:
                await self._session.close()

        asyncio.run_coroutine_threadsafe(close(), self._loop).result(30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread:
            self._thread.join(10)

    def inject(self, plan: FaultPlan | None) -> None:
        """Start (a plan) or stop (None) the faults. Starting drops every open watch, so that the
        client's watches are opened again, and meet the faults, at once."""
        self.faults = plan
        if plan is not None and self._loop is not None:

            def drop_watches() -> None:
                for request in list(self._open_watches.values()):
                    self._drop(request)

            self._loop.call_soon_threadsafe(drop_watches)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def write_kubeconfig(self, path: Path) -> str:
        """A kubeconfig that reaches the API server only through this proxy (no credentials)."""
        cfg = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "via-proxy", "cluster": {"server": self.url}}],
            "users": [{"name": "via-proxy", "user": {}}],
            "contexts": [{"name": "via-proxy", "context": {"cluster": "via-proxy", "user": "via-proxy"}}],
            "current-context": "via-proxy",
        }
        path.write_text(yaml.safe_dump(cfg))
        return str(path)

    # -- the proxy -------------------------------------------------------------------------
    def _record(self, request: web.Request, raw: bytes, fault: str | None) -> None:
        body: Any = None
        if raw:
            try:
                body = json.loads(raw)
            except ValueError:
                try:
                    body = yaml.safe_load(raw)
                except yaml.YAMLError:
                    body = raw[:200]
        rec = Recorded(request.method, request.path, request.query_string, body, fault, time.time())
        with self._lock:
            self.requests.append(rec)
            if fault:
                self.injected[fault] += 1

    def _draw(self, request: web.Request) -> str | None:
        plan = self.faults
        if plan is None:
            return None
        if is_watch(request):
            return plan.draw(
                [
                    ("watch_gone_status", plan.watch_gone_status),
                    ("watch_gone_event", plan.watch_gone_event),
                    ("watch_cut", plan.watch_cut),
                ]
            )
        if request.method == "GET":
            return plan.draw(
                [
                    ("read_error", plan.read_error),
                    ("read_drop", plan.read_drop),
                    ("read_stall", plan.read_stall),
                ],
                "read",
            )
        return plan.draw(
            [
                ("write_conflict", plan.write_conflict),
                ("write_error", plan.write_error),
                ("write_lost", plan.write_lost),
                ("write_stall", plan.write_stall),
            ],
            "write",
        )

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        fault = self._draw(request)
        self._record(request, raw, fault)
        if fault == "watch_gone_status":
            return web.json_response(status_body(410, "Expired", "too old resource version"), status=410)
        if fault == "write_conflict":
            msg = "the object has been modified; please apply your changes to the latest version"
            return web.json_response(status_body(409, "Conflict", msg), status=409)
        if fault in ("write_error", "read_error"):
            return web.json_response(status_body(500, "InternalError", "injected fault"), status=500)
        if fault == "read_drop":
            self._drop(request)
            return web.Response(status=500)  # never sent: the connection is gone
        if fault == "read_stall":
            await asyncio.sleep(STALL_S)
            self._drop(request)
            return web.Response(status=500)

        assert self._session is not None
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        async with self._session.request(
            request.method,
            URL(self.upstream + request.rel_url.raw_path_qs, encoded=True),
            data=raw if raw else None,
            headers=headers,
            ssl=self.ssl,
        ) as up:
            if fault in ("write_lost", "write_stall"):
                await up.read()  # the server applied the write
                if fault == "write_stall":
                    await asyncio.sleep(STALL_S)
                self._drop(request)
                return web.Response(status=500)
            resp = web.StreamResponse(status=up.status)
            for k, v in up.headers.items():
                if k.lower() not in HOP_BY_HOP:
                    resp.headers[k] = v
            await resp.prepare(request)
            if fault == "watch_gone_event":
                event = {"type": "ERROR", "object": status_body(410, "Expired", "too old resource version")}
                try:
                    await resp.write(json.dumps(event).encode() + b"\n")
                    await resp.write_eof()
                except (ConnectionResetError, aiohttp.ClientError):
                    pass
                return resp
            if is_watch(request):
                self._open_watches[id(request)] = request
            cut_at = time.monotonic() + self._cut_rng.uniform(1.0, 6.0) if fault == "watch_cut" else None
            try:
                while True:
                    timeout = None if cut_at is None else max(0.0, cut_at - time.monotonic())
                    try:
                        chunk = await asyncio.wait_for(up.content.readany(), timeout)
                    except TimeoutError:
                        break
                    if not chunk:
                        break
                    await resp.write(chunk)
                if cut_at is not None and self._cut_rng.random() < 0.5:  # half the cut watches drop
                    self._drop(request)
                    return resp
                await resp.write_eof()
            except (ConnectionResetError, aiohttp.ClientError):
                pass  # the client went away (it gave up, or the proxy dropped it)
            finally:
                self._open_watches.pop(id(request), None)
            return resp

    @staticmethod
    def _drop(request: web.Request) -> None:
        if request.transport is not None:
            request.transport.abort()
