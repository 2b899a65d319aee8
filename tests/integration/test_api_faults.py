"""API-server faults injected for real: the operator talks to the local kube-apiserver only
through a loopback proxy (tests/integration/fault_proxy.py) that answers watches with 410
Gone and cut or dropped streams, writes with 409 and 500 or loses their answers, and stalls
and drops reads, for a minute while the user edits the pool sizes.

The operator must never ask for a wrong size (every Deployment write the proxy saw carries a
size the spec had asked for by then, only the last one once converged, and, for an
autoscaled object without metrics, the one size it started with), stay up, and converge once
the faults stop.
"""

from __future__ import annotations

import json
import socket
import time
from collections import defaultdict

import pytest
from fault_proxy import FaultPlan, FaultProxy
from samples import fixed, load

pytestmark = pytest.mark.cluster

#: How long the faults last; the user changes the sizes every EDIT_EVERY_S meanwhile.
FAULT_PHASE_S = 60.0
EDIT_EVERY_S = 12.0
#: Bound for converging after the faults stop: a retry cycle of the operator's client (3
#: attempts of 10 s) plus a watch reconnect, with room on a loaded machine.
CONVERGE_S = 90.0
#: The user's successive pool sizes (prefill, decode) of the fixed-size object during the faults.
EDITS = [(2, 3), (1, 4), (3, 1), (2, 2), (1, 3)]


def closed_loopback_port() -> int:
    """A loopback port nothing listens on: the autoscaled object's Prometheus is down throughout."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def deployment_writes(proxy: FaultProxy, namespace: str) -> dict[str, list[tuple[float, int]]]:
    """Deployment name -> (time, `spec.replicas`) of every write the operator sent for it, in
    order, whether the proxy let it through or not."""
    prefix = f"/apis/apps/v1/namespaces/{namespace}/deployments/"
    out: dict[str, list[tuple[float, int]]] = defaultdict(list)
    for r in list(proxy.requests):
        if r.method not in ("PATCH", "PUT", "POST") or not r.path.startswith(prefix):
            continue
        name = r.path[len(prefix) :].split("/")[0]
        replicas = (r.body or {}).get("spec", {}).get("replicas") if isinstance(r.body, dict) else None
        if replicas is not None:
            out[name].append((r.at, int(replicas)))
    return out


def replicas(cluster, namespace: str, name: str) -> int | None:
    proc = cluster.kubectl("get", "deployment", name, "-n", namespace, "-o", "json", check=False)
    return json.loads(proc.stdout)["spec"]["replicas"] if proc.returncode == 0 else None


def test_api_faults_never_make_a_wrong_size_and_the_operator_converges(
    cluster, namespace, operator_factory, tmp_path
):
    proxy = FaultProxy(cluster.kubeconfig, tmp_path / "pki").start()
    op = None
    try:
        via_proxy = proxy.write_kubeconfig(tmp_path / "via-proxy.kubeconfig")
        prometheus = f"http://127.0.0.1:{closed_loopback_port()}"
        op = operator_factory([namespace], ["--prometheus-url", prometheus], kubeconfig=via_proxy)

        user = fixed(prefill=1, decode=2)
        user["metadata"]["name"] = "sized"
        auto = load("sglang-disaggregated.yaml")
        auto["metadata"]["name"] = "auto"
        # What the user said, and from when: (time of the apply, size) per pool Deployment.
        said: dict[str, list[tuple[float, int]]] = {"sized-prefill": [], "sized-decode": []}

        def apply(obj: dict) -> None:  # the user's writes go straight to the API server
            if obj is user:
                for pool in ("prefill", "decode"):
                    said[f"sized-{pool}"].append((time.time(), obj["spec"]["pools"][pool]["replicas"]))
            cluster.kubectl("apply", "--server-side", "-n", namespace, "-f", "-", input=json.dumps(obj))

        apply(user)
        apply(auto)
        pools = ("sized-prefill", "sized-decode", "auto-prefill", "auto-decode")
        cluster.wait_for(
            lambda: all(replicas(cluster, namespace, d) is not None for d in pools),
            timeout=60,
            what=f"both objects' pools, before any fault\n{op.log()[-2000:]}",
        )
        auto_start = {d: replicas(cluster, namespace, d) for d in ("auto-prefill", "auto-decode")}

        proxy.inject(FaultPlan())
        started = time.monotonic()
        for prefill, decode in EDITS:
            user["spec"]["pools"]["prefill"]["replicas"] = prefill
            user["spec"]["pools"]["decode"]["replicas"] = decode
            apply(user)
            time.sleep(max(0.0, min(EDIT_EVERY_S, started + FAULT_PHASE_S - time.monotonic())))
        time.sleep(max(0.0, started + FAULT_PHASE_S - time.monotonic()))
        proxy.inject(None)
        injected = dict(proxy.injected)
        assert op.proc is not None and op.proc.poll() is None, f"the operator died\n{op.log()[-3000:]}"

        final = {"sized-prefill": EDITS[-1][0], "sized-decode": EDITS[-1][1], **auto_start}
        cluster.wait_for(
            lambda: all(replicas(cluster, namespace, d) == n for d, n in final.items()),
            timeout=CONVERGE_S,
            what=f"the pools converge after the faults ({final})\n{op.log()[-3000:]}",
        )
        converged_at = time.time()
        time.sleep(5)  # a late write of an old size would show here
        # The watches are alive: a change after the faults is applied promptly.
        user["spec"]["pools"]["decode"]["replicas"] = 4
        edited_at = time.time()
        apply(user)
        cluster.wait_for(
            lambda: replicas(cluster, namespace, "sized-decode") == 4,
            timeout=30,
            what=f"a spec change after the faults\n{op.log()[-3000:]}",
        )

        writes = deployment_writes(proxy, namespace)
        for name, sent in writes.items():
            sizes = [n for _, n in sent]
            if name in said:
                for at, n in sent:  # only a size the user had asked for by then
                    allowed = {v for t, v in said[name] if t <= at}
                    assert n in allowed, f"{name}: the operator asked for {n}; the spec had said {said[name]}"
                    if converged_at <= at < edited_at:  # converged: only the last size
                        assert n == final[name], f"{name}: {n} written after converging to {final[name]}"
            else:  # the autoscaled pools (no metrics: hold) and the routers keep one size
                assert len(set(sizes)) == 1, f"{name} was written with several sizes {sizes}"
        for name, n in auto_start.items():
            assert {m for _, m in writes[name]} <= {n}, f"{name} changed size without metrics: {writes[name]}"
        assert op.proc is not None and op.proc.poll() is None
    finally:
        if op is not None:
            op.stop()
        proxy.stop()

    # The faults really happened, of every kind, while the operator ran.
    for kind in ("watch_gone_event", "watch_cut", "write_conflict", "write_error"):
        assert injected.get(kind), f"no {kind} was injected: {injected}"
    assert injected.get("write_lost", 0) + injected.get("write_stall", 0) >= 1, injected
    assert injected.get("read_stall", 0) + injected.get("read_drop", 0) >= 1, injected
