"""Admission control: what the plan does not admit is rejected early, counted apart from misses."""

from __future__ import annotations

import pytest

from disagg import evaluate as ev
from disagg.emulator.fleet import DeploymentEmulator, admitted_fraction
from disagg.evaluate import EvalSettings, run_policy
from disagg.model import StageModels
from disagg.sim import REJECTED, Cluster, SimConfig, simulate
from disagg.workload import Request, poisson

M = StageModels()
OVERLOAD = dict(prompt_tokens=(500, 3000), output_tokens=(20, 200), seed=5)


def test_half_admitted_serves_the_admitted_within_the_slo():
    w = poisson(14.0, 200.0, **OVERLOAD)  # one prefill worker serves ~8 req/s of these
    full = simulate(w, M, SimConfig(prefill=1, decode=2))
    half = simulate(w, M, SimConfig(prefill=1, decode=2, admit_fraction=0.5))
    assert full.rejected == 0 and full.slo_attainment < 0.2  # the queue grows without bound
    assert half.rejected >= len(w) // 2
    assert half.completed + half.rejected == len(w)
    assert half.admitted_slo_attainment > 0.97
    assert half.slo_attainment == pytest.approx(half.goodput_rps * half.horizon_s / len(w))
    assert half.slo_attainment > 0.4
    doc = half.to_dict()
    assert doc["rejected_requests"] == half.rejected and doc["admitted_slo_attainment"] > 0.97


def test_admission_is_an_even_thinning_plus_early_rejection():
    cl = Cluster(M, SimConfig(prefill=4, decode=4))
    cl.set_admission(0.25)
    jobs = [cl.submit(Request(0.001 * i, 100, 10), 0.001 * i) for i in range(8)]
    assert [j.state == REJECTED for j in jobs] == [True, True, True, False] * 2
    cl.set_admission(1.0)
    assert cl.submit(Request(1.0, 100, 10), 1.0).state != REJECTED
    # early rejection: a prompt whose bare pipeline alone misses the TTFT target
    cl.advance(2.0)
    cl.set_admission(0.999)
    cl._admit_credit = 1.0
    assert cl.submit(Request(2.0, 20000, 10), 2.0).state == REJECTED
    with pytest.raises(ValueError, match="admission fraction"):
        cl.set_admission(1.5)
    with pytest.raises(ValueError, match="admit_fraction"):
        SimConfig(admit_fraction=-0.1).validate()


def test_budget_short_evaluation_serves_the_admitted(monkeypatch):
    """`evaluate --gpu-budget 4` on twice the load the budget can serve: shed early instead of missing all."""
    w = poisson(14.0, 600.0, **OVERLOAD)
    s = EvalSettings(gpu_budget=4, startup_s=30.0)
    m = run_policy("disagg", w, s).metrics
    assert m["rejected_requests"] > 0.1 * len(w)
    assert m["slo_attainment_admitted"] > 0.97
    assert m["slo_attainment"] > 0.5
    assert m["lost_requests"] == 0
    monkeypatch.setattr(ev.DisaggPolicy, "admits", False)
    without = run_policy("disagg", w, s).metrics
    assert without["rejected_requests"] == 0 and without["slo_attainment"] < 0.1


def test_emulator_front_door_sheds_what_the_plan_does_not_admit():
    dep = DeploymentEmulator("ns", "d", M)
    dep.add_pod("prefill", "p0", "u0", 0.0)
    dep.add_pod("decode", "d0", "u1", 0.0)
    dep.set_admission(admitted_fraction({"status": {"lastDecision": {"outputs": {"admittedFraction": 0.5}}}}))
    got = [dep.offer(Request(0.01 * i, 200, 5), 0.01 * i) for i in range(10)]
    assert sum(j is None for j in got) == 5
    assert dep.rejected == 5 and dep.submitted == 5
    assert admitted_fraction({}) == 1.0
    assert admitted_fraction({"status": {"lastDecision": {"outputs": {"admittedFraction": "x"}}}}) == 1.0
    assert admitted_fraction({"status": {"lastDecision": {"outputs": {"admittedFraction": 2}}}}) == 1.0
