"""Two operators, two shards (`disagg run --shard-selector`), one namespace: each reconciles and
autoscales only its own DisaggDeployments, each holds its own Lease, and an object relabelled
into the other shard moves to the other operator. Events name their operator
(reportingInstance is the host name, set per process here)."""

from __future__ import annotations

import json
import time

import pytest
from samples import fixed

from disagg.shard import SCOPE_ANNOTATION, Scope, parse_selector

pytestmark = pytest.mark.cluster

SHARD_LABEL = "disagg.dev/shard"
LEASE_BASE = "disagg-operator-leader"
# How long an object of a shard without a running operator must stay untouched (the other
# operator receives its watch event within a second).
IGNORED_FOR_S = 8


def sharded(name: str, shard: str) -> dict:
    obj = fixed(decode=1)
    obj["metadata"]["name"] = name
    obj["metadata"]["labels"] = {SHARD_LABEL: shard}
    # Autoscaling on, no Prometheus: each operator's loop that sees the object records a decision
    # holding the pools (metrics missing) and an Event, so the loop's shard filter is tested
    # too, not only the handlers'.
    obj["spec"]["autoscaling"] = {"enabled": True}
    return obj


def last_decision(cluster, namespace: str, name: str) -> dict | None:
    obj = cluster.get_json("disaggdeployment", name, "-n", namespace)
    return (obj.get("status") or {}).get("lastDecision")


def events_by_instance(cluster, namespace: str, name: str) -> set[str]:
    items = cluster.get_json("events", "-n", namespace, "--field-selector", f"involvedObject.name={name}")[
        "items"
    ]
    return {e.get("reportingInstance", "") for e in items if e.get("reportingComponent") == "disagg-operator"}


def test_two_shards_side_by_side(cluster, namespace, operator_factory, monkeypatch):
    ops = {}
    for shard in ("a", "b"):
        # The host name is the Lease holder's identity and the Events' reportingInstance.
        monkeypatch.setenv("HOSTNAME", f"operator-{shard}")
        ops[shard] = operator_factory(
            [namespace],
            extra=[
                "--leader-election",
                "--leader-election-namespace",
                namespace,
                "--shard-selector",
                f"{SHARD_LABEL}={shard}",
                "--shard-name",
                shard,
            ],
        )
    for shard, op in ops.items():
        cluster.wait_for(
            lambda op=op: "acquired leadership" in op.log(), timeout=60, what=f"shard {shard} leads"
        )
    leases = {
        shard: cluster.get_json("lease", f"{LEASE_BASE}-{shard}", "-n", namespace)["spec"]["holderIdentity"]
        for shard in ops
    }
    assert leases["a"].startswith("operator-a-") and leases["b"].startswith("operator-b-"), leases
    # Each Lease records its shard's scope; the two selectors are disjoint: no overlap reported.
    for shard in ops:
        lease = cluster.get_json("lease", f"{LEASE_BASE}-{shard}", "-n", namespace)
        scope = Scope.from_annotation(
            lease["metadata"]["name"], lease["metadata"]["annotations"][SCOPE_ANNOTATION]
        )
        assert scope is not None and scope.selector == parse_selector(f"{SHARD_LABEL}={shard}")
        assert scope.namespaces == frozenset({namespace})

    objs = {"one-a": "a", "two-b": "b"}
    for name, shard in objs.items():
        cluster.kubectl(
            "apply", "--server-side", "-n", namespace, "-f", "-", input=json.dumps(sharded(name, shard))
        )
    for name in objs:
        cluster.wait_for(
            lambda name=name: (
                len(
                    cluster.get_json("deployments", "-n", namespace, "-l", f"disagg.dev/deployment={name}")[
                        "items"
                    ]
                )
                == 2
            ),
            timeout=60,
            what=f"pools of {name}",
        )
        cluster.wait_for(
            lambda name=name: last_decision(cluster, namespace, name),
            # the first decision waits for the pools' pods and the loop's first due time: over
            # 60 s once on this 2-core machine while the whole suite ran
            timeout=120,
            what=f"the decision of {name}",
        )
        cluster.wait_for(
            lambda name=name: events_by_instance(cluster, namespace, name),
            timeout=30,
            what=f"events of {name}",
        )

    assert not [op for op in ops.values() if "overlaps shard" in op.log()]
    for name, shard in objs.items():
        # Every Event on the object comes from its own shard's operator.
        assert events_by_instance(cluster, namespace, name) == {f"operator-{shard}"}
    # Each Lease is still held by its own operator.
    for shard in ops:
        lease = cluster.get_json("lease", f"{LEASE_BASE}-{shard}", "-n", namespace)
        assert lease["spec"]["holderIdentity"] == leases[shard]

    # Without shard b's operator, nobody acts on shard b's objects: operator a sees the change
    # (it watches the namespace) but leaves it alone.
    ops["b"].stop()
    changed = sharded("two-b", "b")
    changed["spec"]["autoscaling"] = {"enabled": False}  # the spec's sizes apply again
    changed["spec"]["pools"]["decode"]["replicas"] = 2
    cluster.kubectl("apply", "--server-side", "-n", namespace, "-f", "-", input=json.dumps(changed))
    time.sleep(IGNORED_FOR_S)
    assert cluster.get_json("deployment", "two-b-decode", "-n", namespace)["spec"]["replicas"] == 1

    # Relabelled into shard a: operator a takes the object over and applies the change.
    changed["metadata"]["labels"][SHARD_LABEL] = "a"
    cluster.kubectl("apply", "--server-side", "-n", namespace, "-f", "-", input=json.dumps(changed))
    cluster.wait_for(
        lambda: cluster.get_json("deployment", "two-b-decode", "-n", namespace)["spec"]["replicas"] == 2,
        timeout=60,
        what="the new owner applies the change",
    )
    assert ops["a"].proc is not None and ops["a"].proc.poll() is None
