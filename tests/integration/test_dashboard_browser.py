"""The dashboard in headless Chromium against a live DisaggDeployment.

The operator runs as a process (it creates the pools and writes status.pools);
`disagg dashboard --kubeconfig` polls the cluster; Chromium is driven over the
DevTools protocol (a minimal client on aiohttp's websocket). The page must show
the pools with their replica counts, follow a scale change without a reload,
and load nothing but its own origin. A screenshot is saved under the test's
tmp dir and copied to _artifacts/dashboard.png.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from samples import fixed

from disagg.devtools.prometheus import free_port
from prereqs import chromium

pytestmark = [pytest.mark.cluster, pytest.mark.browser]

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = chromium()  # a missing one fails the test with the install command (tests/conftest.py)


def http_get(url: str, timeout: float = 2) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read()


def wait_http(url: str, timeout: float, proc: subprocess.Popen, log: Path) -> bytes:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"{proc.args[:4]} exited ({proc.returncode}):\n{log.read_text()[-3000:]}")
        try:
            return http_get(url)
        except OSError:
            time.sleep(0.2)
    raise AssertionError(f"{url} not answering after {timeout} s:\n{log.read_text()[-3000:]}")


class CDP:
    """A minimal Chrome DevTools Protocol client: commands in order, events kept in `events`."""

    def __init__(self, ws: Any) -> None:
        self.ws = ws
        self.next_id = 0
        self.events: list[dict] = []

    async def send(self, method: str, timeout: float = 30, **params: Any) -> dict:
        self.next_id += 1
        mid = self.next_id
        await self.ws.send_str(json.dumps({"id": mid, "method": method, "params": params}))
        deadline = time.monotonic() + timeout
        while True:
            msg = await self.ws.receive(timeout=max(0.1, deadline - time.monotonic()))
            if msg.type.name != "TEXT":
                raise AssertionError(f"CDP connection closed during {method}: {msg}")
            data = json.loads(msg.data)
            if data.get("id") == mid:
                if "error" in data:
                    raise AssertionError(f"CDP {method}: {data['error']}")
                return data.get("result", {})
            if "method" in data:
                self.events.append(data)

    async def eval(self, expression: str) -> Any:
        res = await self.send(
            "Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True
        )
        if "exceptionDetails" in res:
            raise AssertionError(f"JS error in {expression!r}: {res['exceptionDetails']}")
        return res["result"].get("value")

    async def wait_for(self, expression: str, expected: Any, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            try:
                last = await self.eval(expression)
            except AssertionError as exc:  # e.g. no document.body yet right after navigating
                last = str(exc)
            if last == expected:
                return
            await asyncio.sleep(0.5)
        raise AssertionError(f"timed out after {timeout} s waiting for {what}: last {last!r} != {expected!r}")


def pool_text(key: str, pool: str) -> str:
    sel = json.dumps(f'[data-deployment="{key}"] [data-pool="{pool}"]')
    return f"(document.querySelector({sel}) || {{}}).textContent || null"


def ratio_text(key: str) -> str:
    sel = json.dumps(f'[data-deployment="{key}"] [data-ratio]')
    return f"(document.querySelector({sel}) || {{}}).textContent || null"


def condition_status(key: str, ctype: str) -> str:
    sel = json.dumps(f'[data-deployment="{key}"] [data-condition="{ctype}"]')
    return f"(document.querySelector({sel}) || {{dataset: {{}}}}).dataset.status || null"


def test_dashboard_shows_live_pools_and_follows_scaling(cluster, namespace, operator_factory, tmp_path):
    import aiohttp

    obj = fixed()
    name = obj["metadata"]["name"]
    key = f"{namespace}/{name}"
    op = operator_factory([namespace])
    cluster.kubectl("apply", "--server-side", "-n", namespace, "-f", "-", input=json.dumps(obj))

    def pools_are(prefill: int, decode: int):
        pools = (cluster.get_json("disaggdeployment", name, "-n", namespace).get("status") or {}).get("pools")
        got = {p: (v or {}).get("replicas") for p, v in (pools or {}).items()}
        return got == {"prefill": prefill, "decode": decode}

    try:
        cluster.wait_for(lambda: pools_are(1, 2), timeout=120, what="status.pools 1 prefill, 2 decode")
    except AssertionError:
        raise AssertionError(f"operator log:\n{op.log()[-4000:]}") from None

    procs: list[subprocess.Popen] = []
    try:
        dash_port = free_port()
        dash_log = tmp_path / "dashboard.log"
        with open(dash_log, "wb") as log:
            dash = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "disagg.cli",
                    "dashboard",
                    "--kubeconfig",
                    cluster.kubeconfig,
                    "--namespace",
                    namespace,
                    "--port",
                    str(dash_port),
                    "--interval",
                    "1",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=cluster.env(),
            )
        procs.append(dash)
        base = f"http://127.0.0.1:{dash_port}/"
        wait_http(base + "healthz", 30, dash, dash_log)
        doc = json.loads(http_get(base + "api/state", timeout=15))
        assert [f"{d['namespace']}/{d['name']}" for d in doc["deployments"]] == [key]
        assert "http://127.0.0.1" in dash_log.read_text()  # the command prints its URL

        cdp_port = free_port()
        chrome_log = tmp_path / "chromium.log"
        with open(chrome_log, "wb") as log:
            chrome = subprocess.Popen(
                [
                    CHROMIUM,
                    "--headless",
                    "--no-sandbox",
                    "--disable-gpu",
                    "--disable-quic",
                    "--no-first-run",
                    "--disable-background-networking",
                    "--disable-component-update",
                    "--disable-sync",
                    "--disable-dev-shm-usage",
                    f"--user-data-dir={tmp_path / 'chrome-profile'}",
                    f"--remote-debugging-port={cdp_port}",
                    "--window-size=1280,1100",
                    "about:blank",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        procs.append(chrome)
        wait_http(f"http://127.0.0.1:{cdp_port}/json/version", 60, chrome, chrome_log)
        targets = json.loads(http_get(f"http://127.0.0.1:{cdp_port}/json/list"))
        ws_url = next(t["webSocketDebuggerUrl"] for t in targets if t.get("type") == "page")

        async def drive() -> bytes:
            async with (
                aiohttp.ClientSession() as session,
                session.ws_connect(ws_url, max_msg_size=0) as ws,
            ):
                cdp = CDP(ws)
                await cdp.send("Network.enable")
                await cdp.send("Runtime.enable")
                await cdp.send(
                    "Emulation.setDeviceMetricsOverride",
                    width=1280,
                    height=1100,
                    deviceScaleFactor=1,
                    mobile=False,
                )
                await cdp.send("Page.navigate", url=base + "?refresh=1")
                await cdp.wait_for("Number(document.body.dataset.updates) > 0", True, 30, "first render")
                await cdp.wait_for(pool_text(key, "prefill"), "1", 30, "prefill shows 1 replica")
                await cdp.wait_for(pool_text(key, "decode"), "2", 30, "decode shows 2 replicas")
                assert await cdp.eval(ratio_text(key)) == "1:2"
                assert await cdp.eval("document.querySelectorAll('svg.chart path[data-series]').length") >= 4
                load_id = await cdp.eval("window.disaggDashboard.loadId")
                updates = await cdp.eval("window.disaggDashboard.updates")

                cluster.kubectl(
                    "patch",
                    "disaggdeployment",
                    name,
                    "-n",
                    namespace,
                    "--type=merge",
                    "-p",
                    json.dumps({"spec": {"pools": {"decode": {"replicas": 3}}}}),
                )
                await cdp.wait_for(
                    pool_text(key, "decode"), "3", 90, "decode shows 3 replicas after the patch"
                )
                await cdp.wait_for(ratio_text(key), "1:3", 30, "ratio 1:3")
                assert await cdp.eval("window.disaggDashboard.loadId") == load_id, "the page reloaded"
                assert await cdp.eval("window.disaggDashboard.updates") > updates
                ready = await cdp.eval(condition_status(key, "Ready"))
                assert ready in ("True", "False")
                await asyncio.sleep(1.5)  # one more refresh so the chart shows the step
                shot = await cdp.send("Page.captureScreenshot", format="png")
                # Everything the page requested came from the dashboard itself.
                urls = [
                    e["params"]["request"]["url"]
                    for e in cdp.events
                    if e.get("method") == "Network.requestWillBeSent"
                ]
                assert urls, "no requests seen"
                foreign = [u for u in urls if not u.startswith(base) and not u.startswith("data:")]
                assert not foreign, f"the page loaded external resources: {foreign}"
                errors = [
                    e["params"]
                    for e in cdp.events
                    if e.get("method") == "Runtime.exceptionThrown"
                    or (
                        e.get("method") == "Runtime.consoleAPICalled"
                        and e["params"].get("type") in ("error", "assert")
                    )
                ]
                assert not errors, f"page errors: {errors}"
                import base64

                return base64.b64decode(shot["data"])

        png = asyncio.run(drive())
        assert png.startswith(b"\x89PNG")
        (tmp_path / "dashboard.png").write_bytes(png)
        artifacts = ROOT / "_artifacts"
        artifacts.mkdir(exist_ok=True)
        (artifacts / "dashboard.png").write_bytes(png)
    finally:
        for p in reversed(procs):
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
