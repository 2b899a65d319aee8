#!/usr/bin/env python3
"""Reconciliation benchmark against the local cluster (hack/cluster.sh up first, or it starts one).

Prints:
  * apply -> all pool Deployments present, and apply -> status Ready: median of N runs;
  * writes per reconcile of an unchanged object (counted at the client, target 0) and object
    changes per minute with the operator running on unchanged objects (target 0);
  * operator resident memory with 100 DisaggDeployments.
No pass/fail: figures only.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

from benchlib import ROOT, disagg_deployment, kubeconfig, kubectl, operator_cmd, rss_mib


def dd(name: str, replicas: int = 1) -> dict:
    c = {"name": "vllm", "image": "example.invalid/vllm:bench"}
    pool = {
        "replicas": replicas,
        "minReplicas": 0,
        "maxReplicas": 4,
        "gpusPerReplica": 1,
        "template": {"spec": {"containers": [c]}},
    }
    return disagg_deployment(name, {"prefill": pool, "decode": pool})


def start_operator(kc: str, nss: list[str], log: Path) -> subprocess.Popen:
    return subprocess.Popen(operator_cmd(kc, nss), stdout=open(log, "wb"), stderr=subprocess.STDOUT)


def get(kc: str, ns: str, kind: str, name: str = "") -> dict:
    return json.loads(kubectl(kc, "get", kind, *([name] if name else []), "-n", ns, "-o", "json").stdout)


def bench_latency(kc: str, runs: int, tmp: Path) -> None:
    present, ready = [], []
    for i in range(runs):
        ns = f"bench-{uuid.uuid4().hex[:6]}"
        kubectl(kc, "create", "namespace", ns)
        op = start_operator(kc, [ns], tmp / f"op-lat-{i}.log")
        time.sleep(2)  # the operator's watches start
        t0 = time.monotonic()
        kubectl(kc, "apply", "--server-side", "-n", ns, "-f", "-", input=json.dumps(dd("lat")))
        t_present = t_ready = None
        while time.monotonic() - t0 < 60 and t_ready is None:
            if t_present is None and len(get(kc, ns, "deployments")["items"]) == 2:
                t_present = time.monotonic() - t0
            conds = (get(kc, ns, "disaggdeployment", "lat").get("status") or {}).get("conditions", [])
            if any(c["type"] == "Ready" and c["status"] == "True" for c in conds):
                t_ready = time.monotonic() - t0
            time.sleep(0.05)
        op.terminate()
        op.wait()
        kubectl(kc, "delete", "namespace", ns, "--wait=false")
        present.append(t_present or float("nan"))
        ready.append(t_ready or float("nan"))
    print(
        f"apply -> pool Deployments present: median {statistics.median(present):.2f} s over {runs} runs "
        f"(min {min(present):.2f}, max {max(present):.2f})"
    )
    print(
        f"apply -> status Ready:             median {statistics.median(ready):.2f} s over {runs} runs "
        f"(min {min(ready):.2f}, max {max(ready):.2f})"
    )


def bench_writes(kc: str, tmp: Path, seconds: int) -> None:
    from disagg import reconcile
    from disagg.kube import Kube

    ns = f"bench-{uuid.uuid4().hex[:6]}"
    kubectl(kc, "create", "namespace", ns)
    op = start_operator(kc, [ns], tmp / "op-writes.log")
    kubectl(kc, "apply", "--server-side", "-n", ns, "-f", "-", input=json.dumps(dd("steady")))
    time.sleep(8)

    async def count() -> int:
        kube = await Kube.connect(kc)
        body = await kube.get("DisaggDeployment", ns, "steady")
        before = kube.writes
        for _ in range(10):
            await reconcile.reconcile(kube, body)
        n = kube.writes - before
        await kube.close()
        return n

    per10 = asyncio.run(count())
    print(f"writes in 10 reconciles of an unchanged object (client-side count): {per10} (target 0)")

    def versions() -> dict[str, str]:
        out = {}
        for kind in ("disaggdeployments", "deployments", "services", "poddisruptionbudgets", "pods"):
            for o in get(kc, ns, kind)["items"]:
                out[f"{kind}/{o['metadata']['name']}"] = o["metadata"]["resourceVersion"]
        return out

    v0 = versions()
    time.sleep(seconds)
    v1 = versions()
    changed = sum(1 for k in v0.keys() | v1.keys() if v0.get(k) != v1.get(k))
    print(
        f"object changes with the operator running on an unchanged object: {changed * 60 / seconds:.1f}/min "
        f"(measured over {seconds} s; target 0)"
    )
    op.terminate()
    op.wait()
    kubectl(kc, "delete", "namespace", ns, "--wait=false")


def bench_memory(kc: str, tmp: Path, n: int) -> None:
    ns = f"bench-{uuid.uuid4().hex[:6]}"
    kubectl(kc, "create", "namespace", ns)
    op = start_operator(kc, [ns], tmp / "op-mem.log")
    time.sleep(3)
    base = rss_mib(op.pid)
    docs = "\n---\n".join(json.dumps(dd(f"m{i:03d}", replicas=0)) for i in range(n))
    kubectl(kc, "apply", "--server-side", "-n", ns, "-f", "-", input=docs)
    t0 = time.monotonic()
    while time.monotonic() - t0 < 120:
        items = get(kc, ns, "disaggdeployments")["items"]
        done = sum(1 for o in items if (o.get("status") or {}).get("observedGeneration"))
        if done >= n:
            break
        time.sleep(1)
    settle = time.monotonic() - t0
    time.sleep(5)
    print(
        f"operator RSS: {base:.0f} MiB idle, {rss_mib(op.pid):.0f} MiB with {n} DisaggDeployments "
        f"(all reconciled in {settle:.1f} s)"
    )
    op.terminate()
    op.wait()
    kubectl(kc, "delete", "namespace", ns, "--wait=false")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--steady-seconds", type=int, default=60)
    ap.add_argument("--objects", type=int, default=100)
    args = ap.parse_args()
    kc = kubeconfig()
    kubectl(kc, "apply", "--server-side", "--force-conflicts", "-f", str(ROOT / "crds"))
    kubectl(kc, "wait", "--for=condition=Established", "crd/disaggdeployments.disagg.dev")
    os.environ["KUBECONFIG"] = kc
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        bench_latency(kc, args.runs, tmp)
        bench_writes(kc, tmp, args.steady_seconds)
        bench_memory(kc, tmp, args.objects)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
