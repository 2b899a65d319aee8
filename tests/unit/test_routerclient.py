"""disagg.routerclient against a stand-in of sglang-router 0.3.2's worker API, on loopback."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web

from disagg import routerclient, routers

ROUTER_IP = "127.2.60.2"


def pod(engine: str = "sglang", ip: str | None = "127.1.0.9") -> dict:
    return {
        "metadata": {
            "name": "llama-decode-x",
            "namespace": "serving",
            "labels": {
                "disagg.dev/deployment": "llama",
                "disagg.dev/pool": "decode",
                "app.kubernetes.io/name": engine,
            },
        },
        "spec": {
            "containers": [
                {"name": engine, "ports": [{"containerPort": 30000}, {"name": "metrics", "containerPort": 9}]}
            ]
        },
        "status": {"podIP": ip} if ip else {},
    }


class FakeKube:
    def __init__(self, router_ip: str = ROUTER_IP) -> None:
        self.router_ip = router_ip
        self.selectors: list[str] = []

    async def list(self, kind: str, ns: str, selector: str) -> list[dict]:
        self.selectors.append(selector)
        return [{"status": {"podIP": self.router_ip, "phase": "Running"}}]


async def with_router(port: int, body):
    """Run `body(calls)` with a stand-in router on ROUTER_IP:port listing one decode worker."""
    calls: list[tuple[str, str, object]] = []
    workers = [{"id": "6f1c", "url": "http://127.1.0.9:30000", "worker_type": "decode"}]

    async def list_workers(_r):
        return web.json_response({"workers": workers})

    async def delete(r):
        calls.append(("DELETE", r.match_info["wid"], None))
        workers.clear()
        return web.json_response({"status": "accepted"}, status=202)

    async def add(r):
        calls.append(("POST", "", await r.json()))
        return web.json_response({"status": "accepted"}, status=202)

    app = web.Application()
    app.router.add_get("/workers", list_workers)
    app.router.add_delete("/workers/{wid}", delete)
    app.router.add_post("/workers", add)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, ROUTER_IP, port).start()
    try:
        return await body(calls)
    finally:
        await runner.cleanup()


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind((ROUTER_IP, 0))
        return s.getsockname()[1]


def test_a_drained_sglang_worker_is_removed_and_readded_on_every_router(monkeypatch):
    port = free_port()
    monkeypatch.setattr(routers, "ROUTER_HTTP_PORT", port)
    kube = FakeKube()

    async def body(calls):
        removed = await routerclient.set_worker_routable(kube, pod(), False)
        again = await routerclient.set_worker_routable(kube, pod(), False)  # already gone: nothing to do
        added = await routerclient.set_worker_routable(kube, pod(), True)
        return removed, again, added, list(calls)

    removed, again, added, calls = asyncio.run(with_router(port, body))
    assert (removed, again, added) == (1, 0, 1)
    assert calls == [
        ("DELETE", "6f1c", None),
        ("POST", "", {"url": "http://127.1.0.9:30000", "worker_type": "decode"}),
    ]
    assert kube.selectors == ["disagg.dev/router=llama"] * 3


def test_vllm_and_pods_without_an_ip_need_no_call():
    kube = FakeKube()
    assert asyncio.run(routerclient.set_worker_routable(kube, pod("vllm"), False)) == 0
    assert asyncio.run(routerclient.set_worker_routable(kube, pod(ip=None), False)) == 0
    assert kube.selectors == []


def test_an_unreachable_router_is_skipped_not_raised(monkeypatch, caplog):
    monkeypatch.setattr(routers, "ROUTER_HTTP_PORT", free_port())  # nobody listens there
    assert asyncio.run(routerclient.set_worker_routable(FakeKube(), pod(), False)) == 0
    assert "could not remove worker http://127.1.0.9:30000" in caplog.text


@pytest.mark.parametrize(
    ("ports", "url"),
    [([{"containerPort": 30000}], "http://1.2.3.4:30000"), ([], "http://1.2.3.4:8000")],
)
def test_worker_url_is_what_the_router_discovers(ports, url):
    p = {"spec": {"containers": [{"ports": ports}]}, "status": {"podIP": "1.2.3.4"}}
    assert routerclient.worker_url(p) == url
