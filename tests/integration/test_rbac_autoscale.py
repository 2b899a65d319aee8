"""The chart's RBAC is enough, and no more, for the autoscaler too (issue 8, item 2).

The chart is installed with `watchNamespaces={<ns>}` (one Role + RoleBinding in
the test namespace). `disagg run` then runs locally with the chart
ServiceAccount's token (rbac_util.sa_kubeconfig) against a real Prometheus that
scrapes `disagg emulate`, through a full closed loop:

- reconcile: pool Deployments, Services, PDBs created by server-side apply;
  status patched; events posted; the Prometheus bearer token read from a Secret;
- scale-up: a load step to 8 rps grows both pools (Deployment patches);
- drain: the load drops to 1 rps, victims are annotated (pod patch), their
  readiness gate is set False (pods/status patch), and once idle the
  Deployment is shrunk: DrainStarted/DrainCompleted events, zero lost requests.

The operator log must hold no 403/Forbidden line, and actions outside the
chart's Role are refused with the same token. The emulator runs with the admin
kubeconfig: it stands in for the GPU fleet, it is not the operator.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from rbac_util import forbidden_lines, kubectl_as, sa_kubeconfig, start_operator, stop_operator

from disagg import api
from prereqs import missing_prerequisite

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))
from e2e_stack import Stack, deployment_spec, planned

pytestmark = [pytest.mark.cluster, pytest.mark.prometheus, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "disagg-operator"
PROMPT, OUTPUT = 6000, 400
HIGH, LOW, STEP_AT, DURATION = 8.0, 1.0, 50, 100


def helm(cluster, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    helm_bin = cluster.bin / "helm"
    if not helm_bin.exists():
        missing_prerequisite("helm (built by hack/tools.sh with the other cluster tools)")
    proc = subprocess.run(
        [str(helm_bin), *args], capture_output=True, text=True, env=cluster.env(), timeout=180
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr}")
    return proc


def refused(proc: subprocess.CompletedProcess[str]) -> bool:
    return proc.returncode != 0 and "forbidden" in proc.stderr.lower()


def test_autoscaler_scales_up_and_drains_with_exactly_the_chart_rbac(
    cluster, crd, namespace: str, tmp_path: Path, prometheus_factory
) -> None:
    rel = f"dop-{uuid.uuid4().hex[:6]}"
    sa = f"{rel}-disagg-operator"
    other = f"{namespace}-other"[:63]
    stack = Stack(cluster, namespace, tmp_path, prometheus_factory, operator_factory=None)
    # The object names its own Prometheus and token Secret: the admin allows that URL
    # (which is also what grants the operator `get secrets`).
    helm(
        cluster, "install", rel, str(CHART), "--namespace", namespace, "--skip-crds",
        "--set", f"watchNamespaces={{{namespace}}}",
        "--set", f"prometheus.allowedUrls={{{stack.prom.url}}}",
        "--wait", "--timeout", "120s",
    )  # fmt: skip
    try:
        run_closed_loop_and_refusals(cluster, stack, namespace, sa, other, tmp_path)
    finally:
        cluster.kubectl("delete", "namespace", other, "--wait=false", check=False)
        helm(cluster, "uninstall", rel, "--namespace", namespace, "--wait", "--timeout", "120s", check=False)


def run_closed_loop_and_refusals(
    cluster, stack: Stack, namespace: str, sa: str, other: str, tmp_path: Path
) -> None:
    proc = None
    log_path = tmp_path / "operator.log"
    try:
        assert cluster.get_json("role", sa, "-n", namespace)["rules"]
        kc = sa_kubeconfig(cluster, namespace, sa, directory=tmp_path)

        # The Prometheus token comes from a Secret: the operator reads it with `get secrets`,
        # and uses it because its owner labelled it for that.
        token = base64.b64encode(b"not-checked-by-this-prometheus").decode()
        secret = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {
                "name": "prom-token",
                "namespace": namespace,
                "labels": {"disagg.dev/prometheus-credentials": "true"},
            },
            "data": {"token": token},
        }
        cluster.kubectl("apply", "-f", "-", input=json.dumps(secret))
        # The step is this run's only burst: the automatic headroom reads its 8x fall as a burst
        # that may recur and would stand ready for its return (the burst floor) for an hour, so
        # it is off here and the pools shrink to the low rate's plan.
        obj = deployment_spec(
            stack.prom.url,
            prometheus={
                "url": stack.prom.url,
                "bearerTokenSecretRef": {"name": "prom-token", "key": "token"},
            },
            sizing={"autoHeadroom": False},
        )
        want_high = planned(obj, HIGH, PROMPT, OUTPUT)
        want_low = planned(obj, LOW, PROMPT, OUTPUT)
        assert want_high["prefill"] > want_low["prefill"] and want_high["decode"] > want_low["decode"]

        proc = start_operator(kc, [namespace], log_path, "--allow-prometheus-url", stack.prom.url)
        stack.apply(obj)

        def alive() -> None:
            """Fail fast: the operator died, or the API refused it something (a verb the chart lacks)."""
            text = log_path.read_text(errors="replace")
            assert proc.poll() is None, f"operator exited:\n{text[-4000:]}"
            denied = forbidden_lines(text)
            assert not denied, "the chart's RBAC refused the operator:\n" + "\n".join(denied[:10])

        def ready() -> bool:
            alive()
            return (stack.condition("Ready") or {}).get("status") == "True"

        # (1) full reconcile with the SA's permissions.
        cluster.wait_for(ready, timeout=90, interval=1, what="DisaggDeployment Ready")
        stack.wait_routable()
        kinds = {"deployments": 2, "services": None, "poddisruptionbudgets": None}
        for kind, count in kinds.items():
            items = cluster.get_json(kind, "-n", namespace, "-l", f"disagg.dev/deployment={stack.name}")
            assert items["items"], f"no {kind} created"
            assert count is None or len(items["items"]) == count

        # (2) scale-up: the load step is applied by the SA (Deployment patches).
        stack.start_emulator(
            "--schedule", f"0:{HIGH:g},{STEP_AT}:{LOW:g}", "--arrivals", "uniform",
            "--input-tokens", str(PROMPT), "--output-tokens", str(OUTPUT),
            "--duration", str(DURATION), "--grace", "15", "--seed", "7",
        )  # fmt: skip
        peak: dict[str, int] = {}

        def grown() -> bool:
            alive()
            cur = stack.replicas()
            for k, v in cur.items():
                peak[k] = max(peak.get(k, 0), v)
            return all(cur.get(k, 0) >= v for k, v in want_high.items())

        cluster.wait_for(
            grown, timeout=STEP_AT, interval=1, what=f"pools grown to {want_high}\n{stack.debug()}"
        )
        # The decision's record is patched through disaggdeployments/status just after the
        # replicas it applied: read in between, the status still holds the decision before it.
        cluster.wait_for(
            lambda: (
                stack.dd()["status"]["lastDecision"]["outputs"]["planned"]["decode"] >= want_high["decode"]
            ),
            timeout=10,
            interval=0.5,
            what=f"the decision that grew the pools recorded in status\n{stack.debug()}",
        )
        # The loop swallows a failed Secret read into "metrics missing" (no log line): metrics
        # available with a bearerTokenSecretRef set shows `get secrets` works.
        assert (stack.condition("MetricsAvailable") or {}).get("status") == "True", stack.debug()

        # (3) drain: annotations, readiness gate False, then the Deployments shrink to the plan for
        # the low rate (the spec's headroom, none by default, over it).
        draining_seen: set[str] = set()

        def drained_and_shrunk() -> bool:
            alive()
            for p in stack.pods():
                conds = {c["type"]: c["status"] for c in p.get("status", {}).get("conditions", [])}
                if "disagg.dev/drain" in (p["metadata"].get("annotations") or {}) and (
                    conds.get("disagg.dev/routable") == "False"
                ):
                    draining_seen.add(p["metadata"]["name"])
            reasons = {e["reason"] for e in stack.events()}
            cur = stack.replicas()
            low = planned(obj, LOW, PROMPT, OUTPUT)
            return (
                {"DrainStarted", "DrainCompleted"} <= reasons
                and cur.get("decode", 99) < peak["decode"]
                and cur.get("decode", 99) <= low["decode"] + 1
            )

        cluster.wait_for(
            drained_and_shrunk,
            timeout=DURATION - STEP_AT + 40,
            interval=1,
            what=f"drains and decode shrunk towards {want_low} (peak {peak})\n{stack.debug()}",
        )
        assert draining_seen, "no pod was seen annotated and gated off while draining"

        summary = stack.wait_emulator(timeout=DURATION + 30)
        assert summary["requests"]["lost"] == 0, summary
        assert summary["requests"]["completed"] > 0, summary
        alive()
        time.sleep(2)  # let any late request fail visibly in the log
    finally:
        if stack.emulator and stack.emulator.poll() is None:
            stack.emulator.terminate()
            try:
                stack.emulator.wait(10)
            except subprocess.TimeoutExpired:
                stack.emulator.kill()
        if proc is not None:
            stop_operator(proc)
        cluster.kubectl("delete", api.PLURAL, "--all", "-n", namespace, "--wait=false", check=False)

    text = log_path.read_text()
    assert "Handler 'on_disaggdeployment' succeeded" in text, text[-4000:]
    assert not forbidden_lines(text), "\n".join(forbidden_lines(text))

    # (4) outside the chart's Role, the same token is refused.
    cluster.kubectl("create", "namespace", other)
    cluster.kubectl(
        "create", "deployment", "victim", "--image=example.invalid/x", "--replicas=0", "-n", other
    )
    patch = json.dumps({"spec": {"replicas": 3}})
    r = kubectl_as(cluster, kc, "patch", "deployment", "victim", "-n", other, "-p", patch)
    assert refused(r), (r.returncode, r.stderr)
    assert cluster.get_json("deployment", "victim", "-n", other)["spec"]["replicas"] == 0
    node = cluster.get_json("nodes")["items"][0]["metadata"]["name"]
    r = kubectl_as(cluster, kc, "delete", "node", node, "--dry-run=server")
    assert refused(r), (r.returncode, r.stderr)
    r = kubectl_as(cluster, kc, "get", "secrets", "-n", namespace)  # get by name only, no list
    assert refused(r), (r.returncode, r.stderr)
    kubectl_as(cluster, kc, "get", "secret", "prom-token", "-n", namespace, check=True)
    r = kubectl_as(
        cluster, kc, "run", "intruder", "--image=example.invalid/x", "-n", namespace, "--dry-run=server"
    )
    assert refused(r), (r.returncode, r.stderr)
