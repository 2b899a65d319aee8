"""Status computed from the children (pure)."""

from __future__ import annotations

from pathlib import Path

import yaml

from disagg import api, status

SAMPLE = Path(__file__).resolve().parents[2] / "config" / "samples" / "sglang-disaggregated.yaml"


def spec():
    return api.parse_spec(yaml.safe_load(SAMPLE.read_text())["spec"])


def deployment(pool, want, ready, updated=None, gen=1, observed=1):
    return {
        "metadata": {"generation": gen, "labels": {"disagg.dev/pool": pool}},
        "spec": {"replicas": want},
        "status": {
            "replicas": want,
            "readyReplicas": ready,
            "updatedReplicas": want if updated is None else updated,
            "observedGeneration": observed,
        },
    }


def test_transition_time_moves_only_when_the_status_changes():
    old = [{"type": "Ready", "status": "True", "reason": "A", "message": "m", "lastTransitionTime": "T0"}]
    same = status.merge_conditions(old, [status.condition("Ready", True, "B", "other message", 2)], now="T1")
    assert same[0]["lastTransitionTime"] == "T0" and same[0]["reason"] == "B"
    flipped = status.merge_conditions(old, [status.condition("Ready", False, "C", "m", 2)], now="T2")
    assert flipped[0]["lastTransitionTime"] == "T2"


def test_conditions_owned_by_the_autoscaler_survive_a_reconcile():
    old = [
        {
            "type": "MetricsAvailable",
            "status": "False",
            "reason": "MetricsMissing",
            "message": "x",
            "lastTransitionTime": "T0",
        }
    ]
    merged = status.merge_conditions(old, [status.condition("Ready", True, "AllPoolsReady", "", 1)], now="T1")
    assert {c["type"] for c in merged} == {"Ready", "MetricsAvailable"}


def test_ready_only_when_every_pool_is_ready_and_rolled_out():
    s = spec()
    deps = {"prefill": deployment("prefill", 1, 1), "decode": deployment("decode", 2, 2)}
    pools = status.pool_status(s, deps, [])
    conds = {c["type"]: c for c in status.child_conditions(s, deps, pools, 1)}
    assert conds["Ready"]["status"] == "True" and conds["Progressing"]["status"] == "False"
    deps["decode"] = deployment("decode", 3, 2, updated=3)
    pools = status.pool_status(s, deps, [])
    conds = {c["type"]: c for c in status.child_conditions(s, deps, pools, 1)}
    assert conds["Ready"]["status"] == "False" and "decode: 2/3 ready" in conds["Ready"]["message"]
    assert conds["Progressing"]["status"] == "True"


def test_unschedulable_pods_make_the_deployment_degraded():
    s = spec()
    deps = {"prefill": deployment("prefill", 1, 1), "decode": deployment("decode", 2, 1)}
    pending = {
        "metadata": {"name": "d-x", "labels": {"disagg.dev/pool": "decode"}},
        "status": {
            "phase": "Pending",
            "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}],
        },
    }
    unsched = status.unschedulable_pods([pending])
    pools = status.pool_status(s, deps, [pending])
    conds = {c["type"]: c for c in status.child_conditions(s, deps, pools, 1, unsched)}
    assert conds["Degraded"]["status"] == "True" and "unschedulable" in conds["Degraded"]["message"]


def test_draining_pods_are_listed_and_named_in_a_condition():
    s = spec()
    pod = {
        "metadata": {
            "name": "d-1",
            "labels": {"disagg.dev/pool": "decode"},
            "annotations": {status.ANNOTATION_DRAIN: "{}"},
        },
        "status": {},
    }
    pools = status.pool_status(s, {}, [pod])
    assert pools["decode"]["drainingPods"] == ["d-1"]
    cond = status.draining_condition(pools, 4)
    assert cond["status"] == "True" and "decode/d-1" in cond["message"]
    assert status.ratio({"prefill": {"desiredReplicas": 2}, "decode": {"desiredReplicas": 5}}) == "1:2.5"


def test_parse_time_reads_both_kubernetes_timestamp_forms() -> None:
    from disagg.status import parse_time

    assert parse_time("2026-01-01T00:00:10Z") - parse_time("2026-01-01T00:00:00Z") == 10.0
    assert parse_time("2026-01-01T00:00:00.250000Z") == parse_time("2026-01-01T00:00:00Z") + 0.25
    assert parse_time("1970-01-01T00:01:00Z") == 60.0  # UTC, whatever the machine's zone
    assert parse_time("yesterday") is None and parse_time(None) is None and parse_time("") is None
