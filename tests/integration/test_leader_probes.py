"""Two operator replicas probed as the kubelet would, with the chart's probe settings.

The chart is rendered with `replicaCount=2` (helm template) and its Deployment's liveness and
readiness probes are read from it: initial delay, period, timeout and failure threshold. Two
`disagg run` processes with the chart's leader-election flags then run side by side, each with
a prober thread that GETs /healthz and /readyz on those periods and, like the kubelet, kills
the container after `failureThreshold` failed liveness probes in a row.

* the standby is never killed by its liveness probe (it waits for the Lease for longer than
  the probe's initial delay plus failureThreshold periods);
* readiness is true on the leader only;
* when the leader is killed, the standby leads within the Lease bound and becomes ready
  within one more readiness period.
"""

from __future__ import annotations

import inspect
import json
import subprocess
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from disagg.leader import LeaderElector
from e2e.e2e_stack import free_port  # below the ephemeral port range
from prereqs import missing_prerequisite

pytestmark = pytest.mark.cluster

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "disagg-operator"
_ELECTOR = inspect.signature(LeaderElector.__init__).parameters
LEASE_S = float(_ELECTOR["lease_s"].default)
RENEW_S = float(_ELECTOR["renew_s"].default)
#: A standby notices an expired Lease at most one renew period after it expires.
TAKEOVER_BOUND_S = LEASE_S + RENEW_S


def chart_operator_container(tools: Path) -> dict:
    helm = tools / "helm"
    if not helm.exists():
        missing_prerequisite("helm (built by hack/tools.sh with the other cluster tools)")
    out = subprocess.run(
        [str(helm), "template", "rel", str(CHART), "--namespace", "ops", "--set", "replicaCount=2"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    (dep,) = [d for d in yaml.safe_load_all(out) if d and d["kind"] == "Deployment"]
    assert dep["spec"]["replicas"] == 2
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    return c


@dataclass
class Probe:
    """A kubelet HTTP probe: its settings from the chart, its results over time."""

    path: str
    initial_delay_s: float
    period_s: float
    timeout_s: float
    failure_threshold: int
    results: list[tuple[float, bool]] = field(default_factory=list)
    consecutive_failures: int = 0

    @classmethod
    def from_chart(cls, spec: dict) -> Probe:
        return cls(
            path=spec["httpGet"]["path"],
            initial_delay_s=float(spec.get("initialDelaySeconds", 0)),
            period_s=float(spec.get("periodSeconds", 10)),
            timeout_s=float(spec.get("timeoutSeconds", 1)),
            failure_threshold=int(spec.get("failureThreshold", 3)),
        )

    def once(self, port: int) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{self.path}", timeout=self.timeout_s) as r:
                ok = 200 <= r.status < 400  # the kubelet's rule for HTTP probes
        except (urllib.error.URLError, OSError):  # HTTPError (503) is a URLError
            ok = False
        self.results.append((time.monotonic(), ok))
        self.consecutive_failures = 0 if ok else self.consecutive_failures + 1
        return ok

    def passing(self) -> bool:
        """The kubelet's view: failing only after failureThreshold failures in a row."""
        return bool(self.results) and self.consecutive_failures < self.failure_threshold


class Kubelet:
    """Probes one operator process on the chart's schedule; kills it when liveness fails."""

    def __init__(self, op, port: int, container: dict) -> None:  # op: conftest.OperatorProcess
        self.op = op
        self.port = port
        self.liveness = Probe.from_chart(container["livenessProbe"])
        self.readiness = Probe.from_chart(container["readinessProbe"])
        self.killed_by_liveness = False
        self.started = time.monotonic()
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._run, args=(p,), daemon=True)
            for p in (self.liveness, self.readiness)
        ]
        for t in self._threads:
            t.start()

    def _run(self, probe: Probe) -> None:
        if self._stop.wait(probe.initial_delay_s):
            return
        while not self._stop.is_set():
            if self.op.proc is None or self.op.proc.poll() is not None:
                return
            probe.once(self.port)
            if probe is self.liveness and probe.consecutive_failures >= probe.failure_threshold:
                self.killed_by_liveness = True
                self.op.kill()
                return
            self._stop.wait(probe.period_s)

    def ready(self) -> bool:
        return self.readiness.passing() and self.readiness.results[-1][1]

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(15)


def test_two_replicas_with_the_charts_probes_standby_lives_only_leader_ready_failover(
    cluster, namespace, operator_factory
):
    container = chart_operator_container(cluster.bin)
    args = container["args"]
    assert "--leader-election" in args  # the chart's default: replicas 2-3 need the Lease
    lease_name = args[args.index("--leader-election-id") + 1]
    extra_common = ["--leader-election", "--leader-election-namespace", namespace]
    extra_common += ["--leader-election-id", lease_name, "--bind", "127.0.0.1"]
    liveness = Probe.from_chart(container["livenessProbe"])
    readiness = Probe.from_chart(container["readinessProbe"])
    # A kubelet kills a container whose liveness fails from the start at its
    # failureThreshold-th probe: the standby must outlive that moment.
    kill_window_s = liveness.initial_delay_s + liveness.period_s * (liveness.failure_threshold - 1)

    ports = [free_port(), free_port()]
    a = operator_factory([namespace], extra=[*extra_common, "--liveness-port", str(ports[0])])
    cluster.wait_for(lambda: "acquired leadership" in a.log(), timeout=60, what="the first replica leads")
    b = operator_factory([namespace], extra=[*extra_common, "--liveness-port", str(ports[1])])
    kubelets = [Kubelet(a, ports[0], container), Kubelet(b, ports[1], container)]
    ka, kb = kubelets
    try:
        cluster.wait_for(lambda: "standing by" in b.log(), timeout=60, what="the second replica stands by")
        time.sleep(kill_window_s + 3)  # past the moment a failing liveness probe would kill it
        assert not kb.killed_by_liveness, f"the standby was killed by its liveness probe\n{b.log()[-2000:]}"
        assert b.proc is not None and b.proc.poll() is None
        assert len(kb.liveness.results) >= liveness.failure_threshold
        assert all(ok for _, ok in kb.liveness.results), kb.liveness.results
        assert ka.ready(), ka.readiness.results
        assert kb.readiness.results and not any(ok for _, ok in kb.readiness.results), "a standby said ready"
        assert "acquired leadership" not in b.log()

        a.kill()  # no goodbye: the Lease must expire
        killed = time.monotonic()
        cluster.wait_for(
            lambda: "acquired leadership" in b.log(),
            timeout=TAKEOVER_BOUND_S + 10,
            what="the standby takes over",
        )
        took_over_s = time.monotonic() - killed
        assert took_over_s <= TAKEOVER_BOUND_S + 3, f"takeover after {took_over_s:.1f} s"
        cluster.wait_for(
            kb.ready,
            timeout=readiness.period_s + readiness.timeout_s + 5,
            what="the new leader's readiness probe passes",
        )
        assert not kb.killed_by_liveness and b.proc is not None and b.proc.poll() is None
        holder = json.loads(
            cluster.kubectl("get", "lease", lease_name, "-n", namespace, "-o", "json").stdout
        )["spec"]["holderIdentity"]
        assert holder and holder in b.log()
    finally:
        for k in kubelets:
            k.stop()
