"""Two operator replicas: a Lease makes exactly one of them act; the standby takes over."""

from __future__ import annotations

import json
import time

import pytest
from samples import fixed

pytestmark = pytest.mark.cluster


def leader_of(cluster, ns: str) -> str | None:
    proc = cluster.kubectl("get", "lease", "disagg-operator-leader", "-n", ns, "-o", "json", check=False)
    return json.loads(proc.stdout)["spec"]["holderIdentity"] if proc.returncode == 0 else None


def test_one_active_replica_and_failover(cluster, namespace, operator_factory):
    extra = ["--leader-election", "--leader-election-namespace", namespace]
    a = operator_factory([namespace], extra=extra)
    cluster.wait_for(lambda: "acquired leadership" in a.log(), timeout=30, what="first operator leads")
    b = operator_factory([namespace], extra=extra)
    cluster.wait_for(lambda: "standing by" in b.log(), timeout=30, what="second operator stands by")
    assert "acquired leadership" not in b.log()
    holder = leader_of(cluster, namespace)
    assert holder

    obj = fixed(decode=1)
    name = obj["metadata"]["name"]
    cluster.kubectl("apply", "--server-side", "-n", namespace, "-f", "-", input=json.dumps(obj))
    cluster.wait_for(
        lambda: len(cluster.get_json("deployments", "-n", namespace, "-l", "disagg.dev/pool")["items"]) == 2,
        timeout=30,
        what="pools created by the leader",
    )
    # The standby never reconciled anything: its watches have not even started.
    assert "Handler 'on_disaggdeployment'" not in b.log()

    a.kill()  # no goodbye: the Lease must expire
    t0 = time.monotonic()
    cluster.wait_for(lambda: "acquired leadership" in b.log(), timeout=40, what="the standby takes over")
    assert leader_of(cluster, namespace) not in (None, holder)
    assert time.monotonic() - t0 < 30
    obj["spec"]["pools"]["decode"]["replicas"] = 2
    cluster.kubectl("apply", "--server-side", "-n", namespace, "-f", "-", input=json.dumps(obj))
    cluster.wait_for(
        lambda: cluster.get_json("deployment", f"{name}-decode", "-n", namespace)["spec"]["replicas"] == 2,
        timeout=30,
        what="the new leader applies a spec change",
    )
