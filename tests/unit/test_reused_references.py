"""Reusing the hindsight references of an earlier run (`evaluate(references=)`, `--references`).

The references (oracle, best fixed fleet, fluid bound) are the expensive part of a case;
a matrix over start-up times reuses them, which is sound only if they do not read the
settings the key leaves out. These tests check that claim, that reuse gives the same
result as a fresh search, and that references for another load or settings are refused.
"""

from __future__ import annotations

import json
from dataclasses import fields, replace
from typing import Any

import numpy as np
import pytest

from disagg import yardstick
from disagg.cli import main
from disagg.evaluate import (
    POLICY_ONLY_SETTINGS,
    EvalSettings,
    ReferencesMismatch,
    evaluate,
    reference_key,
)
from disagg.workload import Workload, piecewise_poisson

SMALL = EvalSettings(startup_s=30.0, stabilization_s=120.0, timeline_points=50)
# every policy-only setting moved away from SMALL's value
MOVED = replace(
    SMALL,
    startup_s=120.0,
    stabilization_s=60.0,
    baseline_drain=True,
    hpa_target=0.5,
    hpa_tolerance=0.2,
    headroom_z=1.0,
    headroom=0.5,
    sizing={"requestSizes": False, "burstiness": False, "autoHeadroom": False},
    backlog_drain_s=30.0,
    backlog_lead_s=10.0,
    ttft_feedback=False,
    ttft_comfort=0.3,
    within_burst_reach=False,
    capacity_scale=1.5,
    keda_queue_per_replica=4.0,
    dynamo_predictor="constant",
    timeline_points=20,
)
POLICIES = ["static", "disagg", "oracle"]


def bursty_load(seed: int = 11) -> Workload:
    """Five minutes: a quiet minute, a two-minute burst of long prompts, two quiet minutes."""
    rng = np.random.default_rng(seed)
    arrivals = piecewise_poisson([(60.0, 1.0), (120.0, 12.0), (120.0, 1.0)], rng)
    n = arrivals.shape[0]
    return Workload(arrivals, rng.integers(1000, 4000, size=n), rng.integers(20, 120, size=n), name="bursty")


def without_wall_time(refs: dict[str, Any]) -> dict[str, Any]:
    return {
        k: ({kk: vv for kk, vv in v.items() if kk != "search_wall_s"} if isinstance(v, dict) else v)
        for k, v in refs.items()
        if k != "reused"
    }


@pytest.fixture(scope="module")
def load() -> Workload:
    return bursty_load()


@pytest.fixture(scope="module")
def earlier(load: Workload) -> dict[str, Any]:
    """A first run, read back from its JSON as `--references` reads it."""
    return json.loads(json.dumps(evaluate(load, POLICIES, SMALL)))


@pytest.fixture(scope="module")
def fresh(load: Workload) -> dict[str, Any]:
    """The references searched again with every policy-only setting moved."""
    return json.loads(json.dumps(evaluate(load, POLICIES, MOVED)))


def test_the_key_leaves_out_exactly_the_policy_only_settings(load: Workload) -> None:
    # MOVED moves every left-out setting, so the claim below covers each one
    moved = {f.name for f in fields(SMALL) if getattr(MOVED, f.name) != getattr(SMALL, f.name)}
    assert moved == POLICY_ONLY_SETTINGS
    assert reference_key(load, SMALL) == reference_key(load, MOVED)
    assert reference_key(load, SMALL) != reference_key(load, replace(SMALL, interval_s=15.0))
    assert reference_key(load, SMALL) != reference_key(bursty_load(seed=12), SMALL)


def test_references_do_not_read_the_policy_only_settings(earlier: dict, fresh: dict) -> None:
    # the claim the key rests on: a fresh search with every left-out setting moved finds
    # the same oracle, best fixed fleet and fluid bound
    assert without_wall_time(fresh["references"]) == without_wall_time(earlier["references"])
    assert fresh["policies"]["disagg"]["gpu_hours"] != earlier["policies"]["disagg"]["gpu_hours"]


def test_reused_references_give_the_fresh_result_without_a_search(
    load: Workload, earlier: dict, fresh: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_search(*a: Any, **kw: Any) -> None:
        raise AssertionError("the oracle was searched again")

    monkeypatch.setattr(yardstick, "hindsight_oracle", no_search)
    monkeypatch.setattr(yardstick, "fluid_bound", no_search)
    doc = evaluate(load, POLICIES, MOVED, references=earlier)
    assert doc["references"]["reused"] is True
    assert without_wall_time(doc["references"]) == without_wall_time(fresh["references"])
    for p in POLICIES:
        for k in (
            "slo_attainment",
            "gpu_hours",
            "gpu_hours_vs_oracle",
            "gpu_hours_at",
            "gpu_hours_at_vs_oracle",
        ):
            assert doc["policies"][p][k] == pytest.approx(fresh["policies"][p][k]), (p, k)
    assert doc["policies"]["oracle"]["timeline"] == fresh["policies"]["oracle"]["timeline"]
    assert doc["reference_key"] == earlier["reference_key"]


@pytest.mark.parametrize(
    ("change", "named"),
    [
        (lambda s: replace(s, slo=replace(s.slo, ttft_s=0.8)), "settings.slo.ttft_s"),
        (lambda s: replace(s, target_attainment=0.95), "settings.target_attainment"),
        (lambda s: replace(s, max_replicas=4), "settings.max_replicas"),
    ],
)
def test_references_for_other_settings_are_refused(
    load: Workload, earlier: dict, change: Any, named: str
) -> None:
    with pytest.raises(ReferencesMismatch, match=named.replace(".", r"\.")):
        evaluate(load, ["static"], change(SMALL), references=earlier)


def test_references_for_another_load_are_refused(earlier: dict) -> None:
    other = bursty_load(seed=12)
    with pytest.raises(ReferencesMismatch, match=r"workload\.(requests|sha256)"):
        evaluate(other, ["static"], SMALL, references=earlier)


def test_references_missing_what_this_run_reports_are_refused(load: Workload, earlier: dict) -> None:
    keyless = {k: v for k, v in earlier.items() if k != "reference_key"}
    with pytest.raises(ReferencesMismatch, match="no reference_key"):
        evaluate(load, ["static"], SMALL, references=keyless)
    no_oracle = {**earlier, "policies": {k: v for k, v in earlier["policies"].items() if k != "oracle"}}
    with pytest.raises(ReferencesMismatch, match="did not list the oracle"):
        evaluate(load, ["static", "oracle"], SMALL, references=no_oracle)


def test_curves_after_a_run_without_them_search_only_the_oracles_other_points(
    load: Workload, earlier: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the earlier run searched the oracle at the target (0.99); --curves adds its 0.95 point,
    # which only a search at 0.95 gives: the references and the 0.99 point are reused
    assert not earlier["settings"]["curves"]
    searched: list[float] = []
    real = yardstick.hindsight_oracle

    def counting(w: Workload, s: EvalSettings, **kw: Any) -> Any:
        searched.append(s.target_attainment)
        return real(w, s, **kw)

    monkeypatch.setattr(yardstick, "hindsight_oracle", counting)
    doc = evaluate(load, ["static"], SMALL, references=earlier, curves=True)
    assert searched == [0.95]
    assert doc["references"]["best_static"] == earlier["references"]["best_static"]
    at = doc["references"]["oracle"]["gpu_hours_at"]
    assert at["0.99"] == pytest.approx(earlier["references"]["oracle"]["gpu_hours"])
    assert at["0.95"] is not None and at["0.95"] <= at["0.99"]
    assert doc["policies"]["static"]["gpu_hours_at_vs_oracle"]["0.95"] is not None


AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"


def test_cli_refuses_references_of_another_trace_in_one_line(tmp_path: Any, capsys: Any) -> None:
    rows = "".join(f"2023-11-16 18:15:{10 + i:02d}.0,{300 + 10 * i},{20 + i}\n" for i in range(30))
    trace = tmp_path / "t.csv"
    trace.write_text(AZURE_HEADER + rows)
    other = tmp_path / "other.csv"
    other.write_text(AZURE_HEADER + rows.replace(",20\n", ",21\n"))
    first = tmp_path / "first.json"
    common = ["--policy", "static", "--no-best-static", "--output", "json"]
    assert main(["evaluate", "--trace", str(trace), *common]) == 0
    first.write_text(capsys.readouterr().out)
    assert (
        main(
            [
                "evaluate",
                "--trace",
                str(trace),
                *common,
                "--startup-seconds",
                "90",
                "--references",
                str(first),
            ]
        )
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    assert out["references"]["reused"] is True and out["references"]["source"] == str(first)
    assert main(["evaluate", "--trace", str(other), *common, "--references", str(first)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("disagg evaluate: error: --references"), err
    assert "workload.sha256" in err[0], err
