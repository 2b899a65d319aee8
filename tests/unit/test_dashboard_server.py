"""disagg.dashboard.server: read-only routes, headers, self-contained page, the three sources."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import aiohttp
import pytest

from disagg.dashboard.history import History
from disagg.dashboard.server import STATIC, ClusterSource, FileSource, HistorySource, bound_url, serve


def run(coro):
    return asyncio.run(coro)


async def fetch_all(source, requests: list[tuple[str, str]]) -> list[tuple[int, dict, bytes]]:
    runner = await serve(source, port=0)
    out = []
    try:
        base = bound_url(runner)
        async with aiohttp.ClientSession() as s:
            for method, path in requests:
                async with s.request(method, base + path) as r:
                    out.append((r.status, dict(r.headers), await r.read()))
    finally:
        await runner.cleanup()
    return out


def test_routes_are_get_only_with_csp() -> None:
    h = History()
    h.record("ns", "a", {"replicas": {"prefill": 1, "decode": 2}})
    res = run(
        fetch_all(
            HistorySource(h),
            [
                ("GET", ""),
                ("GET", "static/app.js"),
                ("GET", "static/style.css"),
                ("GET", "api/state"),
                ("GET", "healthz"),
                ("POST", "api/state"),
                ("DELETE", "api/state"),
                ("GET", "static/../server.py"),
                ("GET", "static/nope.js"),
            ],
        )
    )
    page, js, css, state, health, post, delete, escape, missing = res
    assert page[0] == js[0] == css[0] == state[0] == health[0] == 200
    assert page[1]["Content-Type"].startswith("text/html")
    assert js[1]["Content-Type"].startswith("text/javascript")
    assert "default-src 'none'" in page[1]["Content-Security-Policy"]
    assert post[0] == delete[0] == 405
    assert escape[0] == 404 and missing[0] == 404
    doc = json.loads(state[2])
    assert doc["deployments"][0]["pools"]["decode"]["replicas"] == 2


def test_page_references_no_external_resources() -> None:
    for f in STATIC.iterdir():
        text = f.read_text()
        # the only absolute URL anywhere is the SVG namespace name (an identifier, never fetched)
        assert set(re.findall(r"(?:https?:)?//[a-z0-9-]+\.[a-z0-9.-]+[^\s\"'`]*", text, re.I)) <= {
            "http://www.w3.org/2000/svg"
        }, f.name
        assert "@import" not in text and "url(" not in text, f.name
    html = (STATIC / "index.html").read_text()
    assert re.findall(r'(?:src|href)="([^"]+)"', html) == ["static/style.css", "static/app.js"]


def test_file_source(tmp_path: Path) -> None:
    f = tmp_path / "eval.json"
    f.write_text(json.dumps({"timeline": [{"t": 0, "replicas": {"prefill": 2, "decode": 6}}]}))
    src = FileSource(f)
    doc = run(src.state())
    assert doc["deployments"][0]["ratio"] == "1:3"
    assert doc["time_axis"] == "relative"
    with pytest.raises(OSError):
        FileSource(tmp_path / "missing.json")


class FakeKube:
    def __init__(self, items: list[dict]) -> None:
        self.items = items
        self.calls: list[tuple] = []
        self.fail = False

    async def list(self, kind, namespace=None, selector=None):
        self.calls.append((kind, namespace, selector))
        if self.fail:
            raise RuntimeError("apiserver down")
        return self.items if kind == "DisaggDeployment" else []

    async def close(self):
        pass


def body(decode: int) -> dict:
    return {
        "metadata": {"namespace": "ns", "name": "a"},
        "spec": {"pools": {"prefill": {}, "decode": {}}},
        "status": {
            "pools": {
                "prefill": {"replicas": 1, "readyReplicas": 1, "desiredReplicas": 1},
                "decode": {"replicas": decode, "readyReplicas": decode, "desiredReplicas": decode},
            },
            "ratio": f"1:{decode}",
        },
    }


def test_cluster_source_polls_into_history_and_reports_errors() -> None:
    async def scenario():
        kube = FakeKube([body(2)])
        src = ClusterSource(kube, namespace="ns", interval=0.2)
        doc = await src.state()  # starts polling, waits for the first poll
        assert doc["deployments"][0]["pools"]["decode"]["replicas"] == 2
        kube.items = [body(3)]
        await asyncio.sleep(0.5)
        doc = await src.state()
        dep = doc["deployments"][0]
        assert dep["pools"]["decode"]["replicas"] == 3
        assert len(dep["history"]) >= 2
        assert ("DisaggDeployment", "ns", None) in kube.calls
        kube.fail = True
        await asyncio.sleep(0.5)
        doc = await src.state()
        assert "apiserver down" in doc["error"]
        assert doc["deployments"]  # last data kept
        kube.fail = False
        kube.items = []
        await asyncio.sleep(0.5)
        doc = await src.state()
        assert doc["deployments"] == [] and doc["error"] is None  # deleted ones disappear
        await src.close()

    run(scenario())
