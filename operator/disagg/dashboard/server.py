"""The dashboard's HTTP server (aiohttp, GET only) and its data sources.

Routes: `/` the page, `/static/<file>` its script and style, `/api/state` the
JSON document of `disagg.dashboard.history.History.to_json()`, `/healthz`.
Every other method gets 405: the dashboard never changes anything.

A source is any object with `async def state() -> dict`; optional
`async def start()` / `async def close()` are called when the server starts
and stops. Three are provided:

* `HistorySource(history)`: inside the operator, whose runtime records into
  the History at each reconcile / decision;
* `ClusterSource(kube, namespace, interval)`: polls the cluster's
  DisaggDeployments (and their pool Deployments) into its own History;
* `FileSource(path)`: a saved `disagg simulate|evaluate --output json` result.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Protocol

from aiohttp import web

from disagg.dashboard.history import History, load_result, snapshot_from_object
from disagg.names import LABEL_DEPLOYMENT, LABEL_POOL

log = logging.getLogger("disagg.dashboard")

STATIC = Path(__file__).resolve().parent / "static"
STATIC_FILES = {
    "index.html": "text/html",
    "app.js": "text/javascript",
    "style.css": "text/css",
}
# The page loads nothing but its own files: enforced by the browser too.
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)


class Source(Protocol):
    async def state(self) -> dict[str, Any]: ...


class HistorySource:
    """Serves a History that someone else (the operator's runtime) records into."""

    def __init__(self, history: History) -> None:
        self.history = history

    async def state(self) -> dict[str, Any]:
        return self.history.to_json()


class FileSource:
    """Serves a saved simulation/evaluation result; the file is re-read when it changes."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._mtime: float | None = None
        self._doc: dict[str, Any] | None = None
        self._load()  # fail early on a missing or malformed file

    def _load(self) -> None:
        mtime = self.path.stat().st_mtime
        if mtime != self._mtime:
            self._doc = load_result(self.path).to_json()
            self._mtime = mtime

    async def state(self) -> dict[str, Any]:
        try:
            self._load()
        except (OSError, ValueError) as exc:
            assert self._doc is not None
            return {**self._doc, "error": f"could not re-read {self.path}: {exc}"}
        assert self._doc is not None
        return {**self._doc, "generated_at": time.time()}


class ClusterSource:
    """Polls DisaggDeployments every `interval` seconds with a `disagg.kube.Kube` into its own History."""

    def __init__(
        self,
        kube: Any,
        namespace: str | None = None,
        interval: float = 5.0,
        history: History | None = None,
        close_kube: bool = False,
    ) -> None:
        self.kube = kube
        self.namespace = namespace or None
        self.interval = max(0.2, float(interval))
        self.history = history or History(source=f"cluster{': ' + namespace if namespace else ''}")
        self.close_kube = close_kube
        self._task: asyncio.Task | None = None
        self._polled = asyncio.Event()

    async def poll(self) -> None:
        """One poll: list DisaggDeployments and their pool Deployments, record a snapshot of each."""
        from disagg.api import KIND

        items = await self.kube.list(KIND, self.namespace)
        children: dict[tuple[str, str], dict[str, dict]] = {}
        for ns in sorted({(i.get("metadata") or {}).get("namespace", "") for i in items}):
            try:
                deps = await self.kube.list("Deployment", ns, LABEL_DEPLOYMENT)
            except Exception as exc:  # the status alone is enough; children only fill gaps
                log.debug("listing pool Deployments in %s: %s", ns, exc)
                deps = []
            for d in deps:
                labels = (d.get("metadata") or {}).get("labels") or {}
                key = (ns, labels.get(LABEL_DEPLOYMENT, ""))
                children.setdefault(key, {})[labels.get(LABEL_POOL, "")] = d
        now = time.time()
        keys = []
        for body in items:
            meta = body.get("metadata") or {}
            key = (meta.get("namespace", ""), meta.get("name", ""))
            keys.append(key)
            snap, conditions, decision = snapshot_from_object(body, t=now, children=children.get(key))
            self.history.record(*key, snap, conditions)
            if decision:
                self.history.record_decision(*key, **decision)
        self.history.retain(keys)
        self.history.error = None

    async def _loop(self) -> None:
        while True:
            try:
                await self.poll()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.history.error = f"polling the cluster failed: {exc}"
                log.warning("%s", self.history.error)
            self._polled.set()
            await asyncio.sleep(self.interval)

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._loop(), name="disagg-dashboard-poll")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self.close_kube:
            await self.kube.close()

    async def state(self) -> dict[str, Any]:
        if self._task is None:
            await self.start()
        if not self._polled.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._polled.wait(), timeout=10)
        return self.history.to_json()


# -- the app ------------------------------------------------------------------
@web.middleware
async def _headers(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]):
    resp = await handler(request)
    resp.headers.setdefault("Content-Security-Policy", CSP)
    resp.headers.setdefault("X-Content-Type-Options", "nosniff")
    resp.headers.setdefault("Referrer-Policy", "no-referrer")
    resp.headers.setdefault("Cache-Control", "no-store")
    return resp


def make_app(source: Source) -> web.Application:
    """The read-only dashboard app for `source`."""
    app = web.Application(middlewares=[_headers])

    async def index(_: web.Request) -> web.Response:
        return _static_response("index.html")

    async def static(request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if name not in STATIC_FILES:
            raise web.HTTPNotFound()
        return _static_response(name)

    async def state(_: web.Request) -> web.Response:
        try:
            doc = await source.state()
        except Exception as exc:
            log.exception("dashboard state")
            return web.json_response({"deployments": [], "error": f"state unavailable: {exc}"}, status=503)
        return web.json_response(doc, dumps=_dumps)

    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    app.router.add_get("/", index)
    app.router.add_get("/static/{name}", static)
    app.router.add_get("/api/state", state)
    app.router.add_get("/healthz", healthz)

    async def on_startup(_: web.Application) -> None:
        start = getattr(source, "start", None)
        if start is not None:
            await start()

    async def on_cleanup(_: web.Application) -> None:
        close = getattr(source, "close", None)
        if close is not None:
            await close()

    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)
    return app


def _dumps(obj: Any) -> str:
    import json

    return json.dumps(obj, separators=(",", ":"), default=str)


def _static_response(name: str) -> web.Response:
    return web.Response(body=(STATIC / name).read_bytes(), content_type=STATIC_FILES[name], charset="utf-8")


async def serve(source: Source, host: str = "127.0.0.1", port: int = 8081) -> web.AppRunner:
    """Start the dashboard in the running event loop; returns the runner (`await runner.cleanup()` stops it).

    With port 0 the OS picks a free port: `bound_url(runner)` tells which.
    """
    runner = web.AppRunner(make_app(source), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    log.info("dashboard on %s", bound_url(runner))
    return runner


def bound_url(runner: web.AppRunner) -> str:
    host, port = runner.addresses[0][:2]
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}/"


def run(
    source: Source | Callable[[], Awaitable[Source]],
    host: str = "127.0.0.1",
    port: int = 8081,
    on_ready: Callable[[str], None] | None = None,
) -> None:
    """Serve until interrupted (blocking). `source` may be an async factory, run inside the loop."""

    async def main() -> None:
        src = await source() if callable(source) and not hasattr(source, "state") else source
        runner = await serve(src, host, port)  # type: ignore[arg-type]
        try:
            if on_ready:
                on_ready(bound_url(runner))
            await asyncio.Event().wait()
        finally:
            await runner.cleanup()

    asyncio.run(main())
