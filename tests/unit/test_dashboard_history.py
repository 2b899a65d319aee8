"""disagg.dashboard.history: bounded rings, the /api/state JSON shape, object snapshots, result loaders."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from disagg.dashboard.history import (
    History,
    format_ratio,
    history_from_result,
    load_result,
    normalize_snapshot,
    snapshot_from_object,
)

SNAP_KEYS = {
    "t",
    "replicas",
    "desired",
    "ready",
    "ratio",
    "arrival_rps",
    "planned_rps",
    "stages",
    "predicted",
    "observed",
    "slo",
    "draining",
    "gpus",
    "gpu_budget",
}
DEP_KEYS = {
    "namespace",
    "name",
    "conditions",
    "pools",
    "ratio",
    "slo",
    "gpus",
    "gpu_budget",
    "summary",
    "history",
    "decisions",
}


def test_is_pure() -> None:
    code = (
        "import sys, disagg.dashboard.history; "
        "bad = [m for m in ('aiohttp', 'kopf', 'kubernetes_asyncio', 'kubernetes') if m in sys.modules]; "
        "print(bad)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_ring_is_bounded_and_keeps_latest() -> None:
    h = History(max_points=5, max_decisions=3)
    for i in range(12):
        h.record("ns", "a", {"t": i, "replicas": {"prefill": 1, "decode": i}})
        h.record_decision("ns", "a", time=float(i), reason=f"r{i}", outputs={"decode": i})
    dep = h.to_json()["deployments"][0]
    assert [s["t"] for s in dep["history"]] == [7, 8, 9, 10, 11]
    assert [d["reason"] for d in dep["decisions"]] == ["r9", "r10", "r11"]
    assert dep["pools"]["decode"]["replicas"] == 11


def test_json_shape_and_ratio() -> None:
    h = History()
    h.record(
        "prod",
        "llm",
        {
            "t": 100.0,
            "replicas": {"decode": 4, "prefill": 2},
            "desired": {"prefill": 2, "decode": 5},
            "ready": {"prefill": 2, "decode": 4},
            "arrival_rps": 12.5,
            "stages": {"decode": {"lambda": 12.5, "W": 2.0, "utilization": 0.7}, "prefill": {"lambda": 12.5}},
            "predicted": {"ttft_s": 0.4, "itl_s": 0.05},
            "observed": {"ttft": 0.5, "itl": 0.06},
            "slo": {"ttft_s": 0.8, "itl_s": 0.1},
            "draining": {"decode": ["llm-decode-abc"]},
            "gpus": 12,
            "gpu_budget": 32,
        },
        conditions=[{"type": "Ready", "status": "True"}],
    )
    doc = h.to_json()
    assert set(doc) >= {"deployments", "source", "generated_at", "time_axis", "error"}
    json.dumps(doc)  # serialisable
    dep = doc["deployments"][0]
    assert set(dep) == DEP_KEYS
    snap = dep["history"][0]
    assert set(snap) == SNAP_KEYS
    assert list(dep["pools"]) == ["prefill", "decode"]  # canonical order
    assert dep["pools"]["decode"] == {"replicas": 4, "desired": 5, "ready": 4, "draining": ["llm-decode-abc"]}
    assert dep["ratio"] == "1:2.5"  # from desired
    assert snap["stages"]["decode"]["L"] == pytest.approx(25.0)  # Little's law filled in
    assert snap["stages"]["prefill"]["L"] is None
    assert list(snap["stages"]) == ["prefill", "decode"]
    assert snap["observed"] == {"ttft_s": 0.5, "itl_s": 0.06}
    assert dep["conditions"][0]["type"] == "Ready"


def test_bad_values_never_raise() -> None:
    snap = normalize_snapshot(
        {"replicas": {"prefill": "x", "decode": float("nan"), "encoder": "3"}, "arrival_rps": "fast"}, t=5
    )
    assert snap["replicas"] == {"encoder": 3}
    assert snap["arrival_rps"] is None
    assert snap["planned_rps"] is None  # absent: unknown, not 0
    assert snap["t"] == 5


def test_decision_repeat_is_ignored_and_forget() -> None:
    h = History()
    assert h.record_decision("ns", "a", "2025-01-01T00:00:00Z", "ScaleUp", {"decode": 3})
    assert not h.record_decision("ns", "a", "2025-01-01T00:00:00Z", "ScaleUp", {"decode": 3})
    assert h.record_decision("ns", "a", "2025-01-01T00:00:30Z", "ScaleUp", {"decode": 4})
    h.record("ns", "b", {"replicas": {"prefill": 1}})
    h.retain([("ns", "b")])
    assert h.keys() == [("ns", "b")]
    h.forget("ns", "b")
    assert h.to_json()["deployments"] == []


def test_format_ratio_matches_api() -> None:
    from disagg import api

    for r in (
        {"prefill": 2, "decode": 5},
        {"prefill": 0, "decode": 3},
        {"colocated": 4},
        {"prefill": 3, "decode": 3, "encoder": 1},
    ):
        assert format_ratio(r) == api.format_ratio(r)


def dd_body() -> dict:
    return {
        "apiVersion": "disagg.dev/v1alpha1",
        "kind": "DisaggDeployment",
        "metadata": {"namespace": "ns", "name": "qwen"},
        "spec": {
            "pools": {
                "prefill": {"minReplicas": 1, "gpusPerReplica": 2},
                "decode": {"minReplicas": 1, "gpusPerReplica": 2},
            },
            "slo": {"ttftSeconds": 0.8, "itlSeconds": 0.1},
            "autoscaling": {"gpuBudget": 32},
        },
        "status": {
            "pools": {
                "prefill": {"replicas": 1, "readyReplicas": 1, "desiredReplicas": 1, "drainingPods": []},
                "decode": {
                    "replicas": 3,
                    "readyReplicas": 2,
                    "desiredReplicas": 2,
                    "drainingPods": ["qwen-decode-x"],
                },
            },
            "ratio": "1:2",
            "conditions": [{"type": "Ready", "status": "False", "reason": "PoolsNotReady"}],
            "lastDecision": {
                "time": "2025-06-01T10:00:00Z",
                "reason": "ScaleDown",
                "inputs": {
                    "arrivalRps": 7.0,
                    "plannedRps": 9.5,
                    "stages": {"prefill": {"lambda": 9.5, "W": 0.2, "utilization": 0.4}},
                    "observed": {"ttft_s": 0.3},
                },
                "outputs": {
                    "targets": {"prefill": 1, "decode": 2},
                    "nextStep": {"prefill": 1, "decode": 3},
                    "planned": {"prefill": 1, "decode": 2},
                    "notes": ["scale-down of decode held by the stabilization window"],
                },
            },
        },
    }


def test_record_object() -> None:
    h = History()
    h.record_object(dd_body(), t=10.0)
    h.record_object(dd_body(), t=15.0)
    dep = h.to_json()["deployments"][0]
    assert (dep["namespace"], dep["name"]) == ("ns", "qwen")
    assert dep["pools"]["decode"] == {"replicas": 3, "desired": 2, "ready": 2, "draining": ["qwen-decode-x"]}
    assert dep["ratio"] == "1:2"
    assert dep["gpus"] == 8  # 4 replicas x 2 GPUs
    assert dep["gpu_budget"] == 32
    assert dep["slo"] == {"ttft_s": 0.8, "itl_s": 0.1}
    assert len(dep["history"]) == 2
    assert len(dep["decisions"]) == 1  # polled twice, stored once
    dec = dep["decisions"][0]
    assert dec["targets"] == dec["planned"] == {"prefill": 1, "decode": 2}
    assert dec["next_step"] == {"prefill": 1, "decode": 3}
    assert dec["message"] == "scale-down of decode held by the stabilization window"
    assert dep["history"][-1]["arrival_rps"] == 7.0
    # the stages are the plan's: at the rate it was sized for, which the snapshot carries beside
    # the observed one (the dashboard names both)
    assert dep["history"][-1]["planned_rps"] == 9.5
    assert dep["history"][-1]["stages"]["prefill"]["lambda"] == 9.5
    assert dep["history"][-1]["stages"]["prefill"]["L"] == pytest.approx(1.9)
    assert dep["history"][-1]["observed"]["ttft_s"] == 0.3
    assert dep["conditions"][0]["reason"] == "PoolsNotReady"


def test_snapshot_from_object_without_status_uses_children() -> None:
    body = dd_body()
    del body["status"]
    child = {"spec": {"replicas": 4}, "status": {"replicas": 3, "readyReplicas": 1}}
    snap, conds, dec = snapshot_from_object(body, t=1.0, children={"decode": child})
    assert snap["replicas"] == {"prefill": 0, "decode": 3}
    assert snap["desired"] == {"prefill": 1, "decode": 4}
    assert conds == [] and dec is None


def test_loader_timeline(tmp_path: Path) -> None:
    result = {
        "name": "sim-qwen",
        "metrics": {"ttft_p95_s": 0.41, "slo_attainment": 0.97},
        "timeline": [
            {"t": float(i), "replicas": {"prefill": 1, "decode": 2 + i // 5}, "arrival_rps": 3.0 + i}
            for i in range(20)
        ],
        "decisions": [{"t": 5.0, "reason": "ScaleUp", "outputs": {"decode": 3}}],
    }
    f = tmp_path / "sim.json"
    f.write_text(json.dumps(result))
    doc = load_result(f).to_json()
    assert doc["time_axis"] == "relative"
    assert doc["source"] == "file: sim"
    (dep,) = doc["deployments"]
    assert dep["name"] == "sim-qwen" and dep["namespace"] == "sim"
    assert len(dep["history"]) == 20
    assert dep["pools"]["decode"]["replicas"] == 5
    assert dep["ratio"] == "1:5"
    assert dep["decisions"][0]["reason"] == "ScaleUp"
    assert dep["summary"]["metrics.slo_attainment"] == 0.97


def test_loader_nested_runs_and_pools_of_dicts() -> None:
    data = {
        "runs": [
            {
                "policy": "queueing",
                "series": [{"time": 0, "pools": {"prefill": {"replicas": 2}, "decode": {"replicas": 4}}}],
            },
            {
                "policy": "hpa",
                "series": [{"time": 0, "pools": {"prefill": {"replicas": 1}, "decode": {"replicas": 6}}}],
            },
        ]
    }
    doc = history_from_result(data, label="eval").to_json()
    names = [d["name"] for d in doc["deployments"]]
    assert names == ["hpa", "queueing"]
    assert doc["deployments"][1]["ratio"] == "1:2"


def test_loader_summary_only_and_thinning() -> None:
    doc = history_from_result({"ttft_p95_s": 0.5, "gpus": 16, "notes": ["x"]}, label="ev").to_json()
    (dep,) = doc["deployments"]
    assert dep["name"] == "result"
    assert dep["history"] == []
    assert dep["summary"] == {"ttft_p95_s": 0.5, "gpus": 16}
    long = {"timeline": [{"t": i, "replicas": {"prefill": 1}} for i in range(10_001)]}
    dep = history_from_result(long, max_points=100).to_json()["deployments"][0]
    assert len(dep["history"]) == 100
    assert dep["history"][0]["t"] == 0 and dep["history"][-1]["t"] == 10_000


def test_loader_rejects_non_json(tmp_path: Path) -> None:
    f = tmp_path / "x.json"
    f.write_text("not json")
    with pytest.raises(ValueError, match="not JSON"):
        load_result(f)
    with pytest.raises(ValueError):
        history_from_result(3)


def test_loader_evaluate_shape() -> None:
    """`disagg evaluate --output json`: one card per policy, with the run's metrics as summary."""
    timeline = [
        {
            "t": 30.0 * i,
            "arrival_rps": 2.0 + i,
            "replicas": {"prefill": 1, "decode": 1 + i},
            "gpus": 4 + 2 * i,
        }
        for i in range(5)
    ]
    doc = {
        "trace": "azure.csv",
        "workload": {"requests": 1000, "duration_s": 150.0},
        "settings": {"slo": {"ttft_s": 0.8, "itl_s": 0.1, "percentile": 0.95}, "gpu_budget": 32},
        "policies": {
            "disagg": {"gpu_hours": 1.5, "slo_attainment": 0.99, "timeline": timeline},
            "static": {"gpu_hours": 3.0, "slo_attainment": 0.97, "timeline": timeline[:2]},
        },
    }
    out = history_from_result(doc, label="eval").to_json()
    assert [d["name"] for d in out["deployments"]] == ["disagg", "static"]
    dis = out["deployments"][0]
    assert dis["ratio"] == "1:5"
    assert dis["slo"] == {"ttft_s": 0.8, "itl_s": 0.1}
    assert dis["gpu_budget"] == 32 and dis["gpus"] == 12
    assert dis["history"][-1]["arrival_rps"] == 6.0
    assert dis["summary"] == {"gpu_hours": 1.5, "slo_attainment": 0.99}


def test_loader_simulate_shape() -> None:
    """`disagg simulate --output json`: no series; one card per placement with pools, stages, summary."""
    result = {
        "placement": "disaggregated",
        "horizon_s": 600.0,
        "slo_attainment": 0.98,
        "ttft_ms": {"mean": 210.0, "p50": 180.0, "p90": 400.0, "p99": 700.0},
        "stages": {
            "prefill": {"L": 1.2, "lambda": 4.0, "W_ms": 300.0, "entered": 2400},
            "decode": {"L": 40.0, "lambda": 4.0, "W_ms": 10000.0},
        },
        "pools": {
            "prefill": {"workers": 2, "idle_fraction": 0.4},
            "decode": {"workers": 6, "idle_fraction": 0.2, "slot_occupancy": 0.5},
            "link": {"links": 2, "idle_fraction": 0.9},
        },
    }
    doc = {"workload": {"requests": 2400}, "results": [result, {**result, "placement": "colocated"}]}
    out = history_from_result(doc, label="sim").to_json()
    assert [d["name"] for d in out["deployments"]] == ["colocated", "disaggregated"]
    dep = out["deployments"][1]
    assert dep["pools"] == {
        "prefill": {"replicas": 2, "desired": None, "ready": None, "draining": []},
        "decode": {"replicas": 6, "desired": None, "ready": None, "draining": []},
    }
    assert dep["ratio"] == "1:3"
    (snap,) = dep["history"]
    assert snap["t"] == 600.0
    assert snap["stages"]["prefill"] == {"lambda": 4.0, "W": 0.3, "L": 1.2, "utilization": None}
    assert dep["summary"]["ttft_ms.p90"] == 400.0
    assert dep["summary"]["placement"] == "disaggregated"
