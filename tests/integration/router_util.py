"""Run the pinned P/D routers (real binaries from PyPI) and the emulated fleet over HTTP, on loopback.

`routers_dir()` is where hack/routers.sh installs them; tests skip when a router is
not installed. Every process binds 127.0.0.0/8 and is stopped by its own handle.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from disagg import routers
from disagg.devtools.prometheus import free_port

ROOT = Path(__file__).resolve().parents[2]


#: How long sglang-router's background removal job may take after `DELETE /workers/<id>`
#: answered 202 (milliseconds on a quiet machine; the bound is for a loaded one).
REMOVAL_TIMEOUT_S = 10.0


def routers_dir() -> Path:
    return Path(os.environ.get("DISAGG_ROUTERS_DIR", Path.home() / ".cache/disagg-operator/routers"))


def router_binary(engine: str) -> Path | None:
    p = routers.preset(engine)
    b = routers_dir() / f"{p.package}-{p.version}" / "bin" / p.binary
    return b if b.exists() else None


def http_json(url: str, method: str = "GET", body: dict | None = None, timeout: float = 10.0):
    """(status, parsed JSON or text) of one request."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            status, raw = r.status, r.read()
    except urllib.error.HTTPError as e:
        status, raw = e.code, e.read()
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw.decode(errors="replace")


def wait_until(pred, timeout: float, what: str, interval: float = 0.2):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            last = pred()
            if last:
                return last
        except OSError as exc:
            last = exc
        time.sleep(interval)
    raise AssertionError(f"timed out waiting for {what} (last: {last!r})")


class Proc:
    """A subprocess with its log in a file; stopped by its own pid."""

    def __init__(self, args: list[str], log: Path, env: dict | None = None) -> None:
        self.log_path = log
        self._fh = open(log, "w")  # noqa: SIM115 - closed in stop()
        self.p = subprocess.Popen(args, stdout=self._fh, stderr=subprocess.STDOUT, env=env)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, sig_timeout: float = 10.0) -> int | None:
        if self.p.poll() is None:
            self.p.terminate()
            try:
                self.p.wait(sig_timeout)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait(5)
        self._fh.close()
        return self.p.returncode


class StandaloneFleet(Proc):
    """`disagg emulate --standalone --serve`: pods on consecutive addresses from `first`, one port."""

    def __init__(self, tmp: Path, first: str, *, prefill: int, decode: int, engine: str, duration: int = 300):
        self.port = free_port(first)
        self.summary_path = tmp / "emulator-summary.json"
        octets = first.split(".")
        self.addresses = [".".join([*octets[:3], str(int(octets[3]) + i)]) for i in range(prefill + decode)]
        args = [
            sys.executable, "-m", "disagg.cli", "emulate", "--standalone", "--serve", "--rate", "0",
            "--prefill", str(prefill), "--decode", str(decode), "--engine", engine,
            "--serve-address", first, "--serve-port", str(self.port), "--metrics-port", "0",
            "--duration", str(duration), "--summary-json", str(self.summary_path),
        ]  # fmt: skip
        env = dict(os.environ, PYTHONPATH=str(ROOT / "operator"))
        super().__init__(args, tmp / "emulator.log", env)
        self.prefill_urls = [f"http://{a}:{self.port}" for a in self.addresses[:prefill]]
        self.decode_urls = [f"http://{a}:{self.port}" for a in self.addresses[prefill:]]
        for url in self.prefill_urls + self.decode_urls:
            wait_until(lambda u=url: http_json(f"{u}/health")[0] == 200, 30, f"emulated pod {url}")

    def summary(self) -> dict:
        self.stop()
        return json.loads(self.summary_path.read_text())


class StaticRouter(Proc):
    """The real router in P/D mode over fixed worker URLs (no Kubernetes)."""

    def __init__(self, tmp: Path, engine: str, prefill_urls: list[str], decode_urls: list[str], extra=()):
        binary = router_binary(engine)
        assert binary is not None
        self.engine = engine
        self.port = free_port()
        p = routers.preset(engine)
        args = [str(binary), *p.subcommand, "--host", "127.0.0.1", "--port", str(self.port), p.pd_flag]
        for u in prefill_urls:
            args += ["--prefill", u]
        for u in decode_urls:
            args += ["--decode", u]
        args += ["--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port()), *extra]
        super().__init__(args, tmp / f"{engine}-router.log")
        self.url = f"http://127.0.0.1:{self.port}"
        wait_until(
            lambda: len(self.workers()) == len(prefill_urls) + len(decode_urls),
            60,
            f"{engine} router workers",
        )

    def workers(self) -> list[dict]:
        """[{url, worker_type, id?}] as the router lists them."""
        status, body = http_json(f"{self.url}/workers")
        return body.get("workers", []) if status == 200 and isinstance(body, dict) else []

    def remove_worker(self, url: str) -> int:
        """The worker-removal API of the pinned router (docs/router.md); returns the HTTP status."""
        if self.engine == "vllm":
            return http_json(f"{self.url}/remove_worker?url={url}", "POST")[0]
        ids = [w["id"] for w in self.workers() if w["url"] == url]
        assert ids, f"{url} is not a worker of the router"
        status = http_json(f"{self.url}/workers/{ids[0]}", "DELETE")[0]
        if status == 202:  # accepted: sglang-router removes the worker in a background job
            wait_until(
                lambda: url not in [w["url"] for w in self.workers()],
                REMOVAL_TIMEOUT_S,
                f"the router to drop {url} after its 202",
            )
        return status
