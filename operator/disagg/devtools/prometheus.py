"""Start and stop a real Prometheus server on loopback, for tests and the demo.

Uses the `prometheus` binary from the system (Debian package `prometheus`).
Targets are given as a file_sd file, so they can change while the server runs
(Prometheus re-reads the file by itself).

    with PrometheusServer(targets={"emulator": ["127.0.0.1:9400"]}, scrape_interval="1s") as prom:
        print(prom.url)
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

#: Ports handed to servers started later, below Linux's ephemeral range (32768-60999): a port
#: the kernel picks for bind(0) can be taken by any outgoing connection before the server binds it.
SERVER_PORTS = range(20000, 32000)


def free_port(host: str = "127.0.0.1") -> int:
    """A port free now on `host` (a loopback address), from SERVER_PORTS."""
    for port in random.sample(SERVER_PORTS, 200):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port on {host} in {SERVER_PORTS}")


def find_prometheus() -> str:
    path = os.environ.get("DISAGG_PROMETHEUS_BIN") or shutil.which("prometheus")
    if not path:
        raise RuntimeError(
            "the Prometheus server binary was not found. Install it "
            "('apt-get install prometheus' on Debian/Ubuntu) or set DISAGG_PROMETHEUS_BIN."
        )
    return path


class PrometheusServer:
    """A Prometheus server process with its own data directory, on 127.0.0.1."""

    def __init__(
        self,
        targets: dict[str, list[str]] | None = None,
        scrape_interval: str = "1s",
        port: int | None = None,
        workdir: str | Path | None = None,
        log_path: str | Path | None = None,
        scrape_configs: list[dict] | None = None,
    ) -> None:
        """`scrape_configs` (Prometheus `scrape_configs` entries, e.g. from disagg.scrapeconfig)
        replace the file_sd job of `targets`."""
        self.port = port or free_port()
        self.scrape_configs = scrape_configs
        self.scrape_interval = scrape_interval
        self._own_dir = workdir is None
        self.dir = Path(workdir or tempfile.mkdtemp(prefix="disagg-prom-"))
        self.dir.mkdir(parents=True, exist_ok=True)
        self.sd_file = self.dir / "targets.json"
        self.log_path = Path(log_path) if log_path else self.dir / "prometheus.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.set_targets(targets or {})

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def set_targets(
        self, targets: dict[str, list[str]], labels: dict[str, dict[str, str]] | None = None
    ) -> None:
        """Replace the scrape targets: job name -> list of host:port. `labels` (job name -> label
        set) gives a job's series labels its targets do not export themselves, as Kubernetes
        discovery gives a pod's series its `namespace` and `pod`."""
        labels = labels or {}
        groups = [
            {"targets": addrs, "labels": {**labels.get(job, {}), "job": job}}
            for job, addrs in sorted(targets.items())
        ]
        tmp = self.sd_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(groups))
        tmp.replace(self.sd_file)

    def _config(self) -> str:
        if self.scrape_configs is not None:
            interval = self.scrape_interval
            glob = {"scrape_interval": interval, "scrape_timeout": interval, "evaluation_interval": interval}
            return json.dumps(
                {"global": glob, "scrape_configs": self.scrape_configs}, indent=1
            )  # JSON is YAML
        return (
            "global:\n"
            f"  scrape_interval: {self.scrape_interval}\n"
            f"  scrape_timeout: {self.scrape_interval}\n"
            f"  evaluation_interval: {self.scrape_interval}\n"
            "scrape_configs:\n"
            "  - job_name: disagg\n"
            "    honor_labels: true\n"
            "    file_sd_configs:\n"
            f"      - files: ['{self.sd_file}']\n"
            "        refresh_interval: 1s\n"
        )

    def start(self, timeout: float = 30.0) -> PrometheusServer:
        if self.proc and self.proc.poll() is None:
            return self
        binary = find_prometheus()
        cfg = self.dir / "prometheus.yml"
        cfg.write_text(self._config())
        log = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child process
        self.proc = subprocess.Popen(
            [
                binary,
                f"--config.file={cfg}",
                f"--storage.tsdb.path={self.dir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--storage.tsdb.retention.time=2h",
                "--web.enable-lifecycle",
                "--log.level=warn",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"prometheus exited with code {self.proc.returncode}; see {self.log_path}:\n"
                    + self.log_path.read_text()[-2000:]
                )
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=1) as r:
                    if r.status == 200:
                        return self
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"prometheus did not become ready within {timeout} s; see {self.log_path}")

    def stop(self, timeout: float = 10.0) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.proc = None

    def close(self) -> None:
        self.stop()
        if self._own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    def query(self, promql: str) -> list[dict]:
        """Instant query through the HTTP API; returns the result vector."""
        url = f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
        with urllib.request.urlopen(url, timeout=5) as r:
            body = json.loads(r.read())
        if body.get("status") != "success":
            raise RuntimeError(f"prometheus query failed: {body}")
        return body["data"]["result"]

    def __enter__(self) -> PrometheusServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


def main(argv: list[str] | None = None) -> int:
    """Run a Prometheus in the foreground (for the demo): python -m disagg.devtools.prometheus ..."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m disagg.devtools.prometheus", description=main.__doc__)
    ap.add_argument("--port", type=int, default=9090)
    ap.add_argument("--scrape-interval", default="2s")
    ap.add_argument("--workdir", help="data directory (default: a temporary one)")
    ap.add_argument(
        "--target", action="append", default=[], metavar="JOB=HOST:PORT", help="scrape target (repeatable)"
    )
    args = ap.parse_args(argv)
    targets: dict[str, list[str]] = {}
    for t in args.target:
        job, _, addr = t.partition("=")
        if not addr:
            ap.error(f"--target wants JOB=HOST:PORT, got {t!r}")
        targets.setdefault(job, []).append(addr)
    srv = PrometheusServer(
        targets, scrape_interval=args.scrape_interval, port=args.port, workdir=args.workdir
    )
    srv.start()
    print(f"prometheus on {srv.url} scraping {targets}", flush=True)
    stop = {"now": False}

    def on_signal(*_: object) -> None:
        stop["now"] = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        while not stop["now"] and srv.proc and srv.proc.poll() is None:
            time.sleep(0.5)
    finally:
        srv.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
