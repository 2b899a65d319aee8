"""Shared fixtures.

Cluster tests (`@pytest.mark.cluster`) run against the local kwokctl cluster
(real kube-apiserver, etcd, controller-manager, scheduler; KWOK GPU nodes).
The session fixture reuses a running cluster or starts one with
`hack/cluster.sh up`; one it started itself is removed at the end unless
DISAGG_KEEP_CLUSTER=1. Prometheus tests start the real server binary.

A test marked `cluster`, `prometheus` or `browser` whose prerequisite is missing fails with
the command that installs it (tests/prereqs.py); `make test-unit` skips them instead.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from prereqs import chromium, cluster_tools_missing, missing_prerequisite, prometheus

ROOT = Path(__file__).resolve().parents[1]
HACK = ROOT / "hack"

# Everything the test run and the programs it starts (kubectl, helm, chromium, matplotlib)
# would cache or configure under the user's home goes to the project's cache directory.
PROJECT_CACHE = Path(os.environ.get("DISAGG_CACHE_DIR", Path.home() / ".cache" / "disagg-operator"))
for var, sub in (
    ("KUBECACHEDIR", "state/kube-cache"),
    ("MPLCONFIGDIR", "test-home/matplotlib"),
    ("XDG_CACHE_HOME", "test-home/cache"),
    ("XDG_CONFIG_HOME", "test-home/config"),
    ("XDG_DATA_HOME", "test-home/data"),
):
    os.environ.setdefault(var, str(PROJECT_CACHE / sub))


def tools_bin() -> Path:
    out = subprocess.run([str(HACK / "tools.sh"), "--print"], capture_output=True, text=True, check=True)
    return Path(out.stdout.strip())


def pytest_runtest_setup(item: pytest.Item) -> None:
    """A missing binary fails the tests that need it (or skips them under `make test-unit`)."""
    markers = {m.name for m in item.iter_markers()}
    if "browser" in markers and chromium() is None:
        missing_prerequisite("chromium (headless browser for the dashboard test: apt-get install chromium)")
    if "prometheus" in markers and prometheus() is None:
        missing_prerequisite("the Prometheus server binary (apt-get install prometheus)")
    if "cluster" in markers:
        why = cluster_tools_missing(tools_bin())
        if why:
            missing_prerequisite(why)


@dataclass
class Cluster:
    kubeconfig: str
    bin: Path

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["KUBECONFIG"] = self.kubeconfig
        env["PATH"] = f"{self.bin}:{env.get('PATH', '')}"
        return env

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            [str(self.bin / "kubectl"), f"--kubeconfig={self.kubeconfig}", *args],
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if check and proc.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr}")
        return proc

    def get_json(self, *args: str) -> dict:
        return json.loads(self.kubectl("get", *args, "-o", "json").stdout)

    def wait_established(self, crd: str, timeout: float = 60) -> None:
        """Until the CRD's Established condition is True. (`kubectl wait --for=condition=...`
        fails at once, instead of waiting, while a new CRD has no status conditions yet.)"""

        def established() -> bool:
            got = self.kubectl("get", f"crd/{crd}", "-o", "json", check=False)
            if got.returncode != 0:
                return False
            conds = (json.loads(got.stdout).get("status") or {}).get("conditions") or []
            return any(c.get("type") == "Established" and c.get("status") == "True" for c in conds)

        self.wait_for(established, timeout=timeout, what=f"CRD {crd} established")

    def wait_for(
        self, predicate: Callable[[], object], timeout: float = 60, interval: float = 0.5, what: str = ""
    ) -> object:
        deadline = time.monotonic() + timeout
        last: object = None
        while time.monotonic() < deadline:
            last = predicate()
            if last:
                return last
            time.sleep(interval)
        raise AssertionError(f"timed out after {timeout} s waiting for {what or predicate}")


def user_kubeconfig_state() -> bytes | None:
    """The bytes of the user's ~/.kube/config, or None when there is none."""
    path = Path.home() / ".kube" / "config"
    return path.read_bytes() if path.is_file() else None


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    binp = tools_bin()
    # The local cluster must never touch the user's kubeconfig (checked when the session ends).
    kubeconfig_before = user_kubeconfig_state()
    status = subprocess.run([str(HACK / "cluster.sh"), "status"], capture_output=True, text=True)
    started = status.returncode != 0
    up = subprocess.run([str(HACK / "cluster.sh"), "up"], capture_output=True, text=True, timeout=900)
    if up.returncode != 0:
        raise RuntimeError(f"hack/cluster.sh up failed:\n{up.stderr}")
    c = Cluster(kubeconfig=up.stdout.strip().splitlines()[-1], bin=binp)
    yield c
    if started and os.environ.get("DISAGG_KEEP_CLUSTER") != "1":
        subprocess.run([str(HACK / "cluster.sh"), "down"], capture_output=True, text=True)
    assert user_kubeconfig_state() == kubeconfig_before, "the tests changed the user's kubeconfig"


@pytest.fixture(scope="session")
def kube(cluster: Cluster) -> str:
    """Path of the local cluster's kubeconfig."""
    return cluster.kubeconfig


@pytest.fixture
def kubectl(cluster: Cluster) -> Callable[..., subprocess.CompletedProcess[str]]:
    return cluster.kubectl


@pytest.fixture
def namespace(cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace per test, deleted afterwards (without waiting)."""
    base = request.node.name.lower().replace("_", "-")
    base = "".join(ch for ch in base if ch.isalnum() or ch == "-")[:40].strip("-")
    name = f"t-{base}-{uuid.uuid4().hex[:5]}"
    cluster.kubectl("create", "namespace", name)
    # kube-controller-manager creates it; on a cluster that has just started on a loaded
    # machine its service-account controller can take more than 30 s to begin.
    cluster.wait_for(
        lambda: cluster.kubectl("get", "serviceaccount", "default", "-n", name, check=False).returncode == 0,
        timeout=120,
        what=f"default service account in {name}",
    )
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture
def prometheus_factory(tmp_path: Path) -> Iterator[Callable[..., object]]:
    """Start real Prometheus servers on loopback; all are stopped at the end of the test."""
    from disagg.devtools.prometheus import PrometheusServer

    servers: list[PrometheusServer] = []

    def make(targets: dict[str, list[str]] | None = None, scrape_interval: str = "1s") -> PrometheusServer:
        srv = PrometheusServer(
            targets=targets, scrape_interval=scrape_interval, workdir=tmp_path / f"prom{len(servers)}"
        )
        servers.append(srv)
        return srv.start()

    yield make
    for s in servers:
        s.close()


class OperatorProcess:
    """`disagg run` as a subprocess against the local cluster, watching given namespaces."""

    def __init__(
        self, cluster: Cluster, namespaces: list[str], log_path: Path, extra: list[str] | None = None
    ):
        self.cluster = cluster
        self.namespaces = namespaces
        self.log_path = log_path
        self.extra = extra or []
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> OperatorProcess:
        import sys

        args = [
            sys.executable,
            "-m",
            "disagg.cli",
            "run",
            "--kubeconfig",
            self.cluster.kubeconfig,
            "--metrics-port",
            "0",
            "--dashboard-port",
            "0",
            "--liveness-port",
            "0",
            *self.extra,
        ]
        for ns in self.namespaces:
            args += ["--namespace", ns]
        log = open(self.log_path, "ab")  # noqa: SIM115 - owned by the child
        self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=self.cluster.env())
        log.close()
        return self

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


@pytest.fixture(scope="session")
def crd(cluster: Cluster) -> str:
    """The DisaggDeployment CRD, applied from crds/ and Established."""
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(ROOT / "crds"))
    cluster.wait_established("disaggdeployments.disagg.dev")
    return "disaggdeployments.disagg.dev"


@pytest.fixture
def operator_factory(cluster: Cluster, crd: str, tmp_path: Path) -> Iterator[Callable[..., OperatorProcess]]:
    procs: list[OperatorProcess] = []

    def make(
        namespaces: list[str], extra: list[str] | None = None, kubeconfig: str | None = None
    ) -> OperatorProcess:
        """`kubeconfig`: another way to the same cluster (e.g. through a fault-injecting proxy)."""
        where = dataclasses.replace(cluster, kubeconfig=kubeconfig) if kubeconfig else cluster
        p = OperatorProcess(where, namespaces, tmp_path / f"operator{len(procs)}.log", extra).start()
        procs.append(p)
        return p

    yield make
    for p in procs:
        p.stop()
