"""The operator's own API calls end: a timeout per call, retries with backoff for idempotent ones.

A loopback HTTP server plays a stuck or flapping API server.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from kubernetes_asyncio import client

from disagg import kube as kube_mod
from disagg.kube import ApiError, Kube


class Api(BaseHTTPRequestHandler):
    plan: list[int | str] = []  # per request: an HTTP status, or "stall"
    hits: list[str] = []

    def _answer(self) -> None:
        Api.hits.append(f"{self.command} {self.path}")
        step = Api.plan.pop(0) if Api.plan else 200
        if step == "stall":
            time.sleep(3)
            step = 200
        body = json.dumps({"kind": "Pod", "metadata": {"name": "p"}} if step == 200 else {"message": "busy"})
        data = body.encode()
        try:
            self.send_response(int(step))
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            pass

    do_GET = do_PATCH = do_POST = do_DELETE = _answer

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def api_server():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Api)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    Api.plan, Api.hits = [], []
    yield f"http://127.0.0.1:{srv.server_port}"
    srv.shutdown()
    srv.server_close()


def run(url: str, coro_fn, timeout_s: float = 0.5):
    async def main():
        cfg = client.Configuration(host=url)
        k = Kube(client.ApiClient(configuration=cfg))
        k.request_timeout_s = timeout_s
        try:
            return await coro_fn(k), k
        finally:
            await k.close()

    return asyncio.run(main())


@pytest.fixture(autouse=True)
def fast_backoff(monkeypatch):
    monkeypatch.setattr(kube_mod, "RETRY_BACKOFF_S", 0.01)
    monkeypatch.setattr(kube_mod, "LEASE_REQUEST_TIMEOUT_S", 0.5)


def test_a_stalled_call_times_out_and_is_retried(api_server):
    Api.plan = ["stall", 200]
    started = time.monotonic()
    pod, k = run(api_server, lambda k: k.get("Pod", "ns", "p"))
    assert pod["metadata"]["name"] == "p"
    assert k.retries == 1 and len(Api.hits) == 2
    assert time.monotonic() - started < 2.5  # did not wait for the stalled answer


def test_a_stuck_api_server_gives_an_error_not_a_hang(api_server):
    Api.plan = ["stall"] * kube_mod.ATTEMPTS
    started = time.monotonic()
    with pytest.raises(ApiError, match="no answer from the API server"):
        run(api_server, lambda k: k.get("Pod", "ns", "p"))
    assert len(Api.hits) == kube_mod.ATTEMPTS
    assert time.monotonic() - started < kube_mod.ATTEMPTS * 0.5 + 2


@pytest.mark.parametrize("status", [429, 500, 503])
def test_transient_statuses_are_retried(api_server, status):
    Api.plan = [status, status, 200]
    pod, k = run(api_server, lambda k: k.patch("Pod", "ns", "p", {"metadata": {}}))
    assert pod["metadata"]["name"] == "p" and k.retries == 2


def test_a_refusal_is_not_retried(api_server):
    Api.plan = [422]
    with pytest.raises(ApiError, match="422 busy"):
        run(api_server, lambda k: k.patch("Pod", "ns", "p", {"metadata": {}}))
    assert len(Api.hits) == 1


def test_post_is_never_repeated(api_server):
    Api.plan = [503]
    with pytest.raises(ApiError):
        run(api_server, lambda k: k.create({"kind": "Pod", "metadata": {"name": "p", "namespace": "ns"}}))
    assert len(Api.hits) == 1


def test_lease_calls_are_short_and_single(api_server):
    Api.plan = ["stall"]
    started = time.monotonic()
    with pytest.raises(ApiError):
        run(api_server, lambda k: k.get("Lease", "ns", "leader"), timeout_s=10)
    assert len(Api.hits) == 1 and time.monotonic() - started < 2
