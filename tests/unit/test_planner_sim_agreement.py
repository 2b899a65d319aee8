"""The planner and the simulator agree: predicted TTFT/ITL percentiles against simulated ones.

For each case the planner sizes the pools for a Poisson load and a request mix
at the SLO's percentile (p = 0.9), then the simulator serves that load on those
pools with the same ITL statistic. Stated tolerance:

* ITL at the percentile (the SLO's statistic of each request's gaps): within
  10 % of the simulated value + 2 ms.
* TTFT at the percentile: within 20 % of the simulated value + one decode step.
  The step is the one term the planner leaves out on purpose for disaggregated
  serving: a landed KV joins the batch at the end of the running decode step
  (up to 45 ms), which the worked example's idle-pipeline 370 ms TTFT does not
  include and which docs/planner.md keeps exact.
* The simulated SLO attainment on the planned pools reaches the percentile
  (0.9) less 0.02 for sampling noise.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from disagg.model import DecodeModel, StageModels
from disagg.planner import SLO, Demand, plan
from disagg.sim import SimConfig, simulate
from disagg.workload import Workload, poisson

M = StageModels()
P = 0.9
STEP_S = M.decode.step_ms() / 1000.0


def demand_of(w: Workload, rate: float) -> Demand:
    p = w.prompt_tokens.astype(float)
    o = w.output_tokens.astype(float)
    return Demand(rate, float(p.mean()), float(p.std()), float(o.mean()), float(o.std()))


def quantile(x: np.ndarray, q: float) -> float:
    return float(np.quantile(x, q, method="inverted_cdf"))


def plan_and_simulate(placement: str, rate: float, prompt, output, statistic: str, models=M, itl_s=0.15):
    w = poisson(rate, max(300.0, 400.0 / rate), prompt_tokens=prompt, output_tokens=output, seed=7)
    slo = SLO(0.6, itl_s, P, statistic)
    pl = plan(demand_of(w, rate), models, slo, placement=placement)
    if pl.placement.endswith("colocated"):
        cfg = SimConfig(placement="colocated", colocated=pl.replicas["colocated"], itl_statistic=statistic)
    else:
        cfg = SimConfig(
            placement="conditional" if placement == "conditional" else "disaggregated",
            prefill=pl.replicas["prefill"],
            decode=pl.replicas["decode"],
            split_threshold=int(pl.split_threshold_tokens or 0),
            itl_statistic=statistic,
        )
    return pl, simulate(w, models, replace(cfg, itl_ms=itl_s * 1000.0))


CASES = [
    # placement, rate (req/s), prompt tokens, output tokens, ITL statistic
    ("disaggregated", 2.0, 6000, 400, "max"),
    ("disaggregated", 6.0, (1000, 5000), (50, 300), "max"),
    ("disaggregated", 12.0, (200, 2000), (20, 200), "p99"),
    ("colocated", 4.0, 6000, 400, "mean"),
    ("colocated", 6.0, 500, 200, "max"),
    ("colocated", 2.0, (300, 1500), (20, 300), "p99"),
    ("colocated", 0.1, 6000, 100, "max"),
    ("conditional", 3.0, 6000, 200, "max"),
    ("conditional", 8.0, 500, 100, "max"),
    ("conditional", 4.0, (300, 4000), (50, 200), "max"),  # ~60 % local: their stalls set the ITL
]


@pytest.mark.parametrize(("placement", "rate", "prompt", "output", "statistic"), CASES)
def test_predicted_percentiles_match_the_simulator(placement, rate, prompt, output, statistic):
    pl, r = plan_and_simulate(placement, rate, prompt, output, statistic)
    s = r.samples
    assert r.completed == r.requests
    ttft = quantile(s["ttft_s"], P)
    itl = quantile(s["itl_stat_s"][s["itl_max_s"] > 0], P)
    assert abs(pl.ttft_s - ttft) <= 0.2 * ttft + STEP_S, (pl.placement, pl.replicas, pl.ttft_s, ttft)
    assert abs(pl.itl_s - itl) <= 0.1 * itl + 0.002, (pl.placement, pl.replicas, pl.itl_s, itl)
    assert r.slo_attainment >= P - 0.02, (pl.placement, pl.replicas, r.slo_attainment)


@pytest.mark.parametrize("statistic", ["mean", "max"])
def test_decode_itl_when_the_step_grows_with_the_batch(statistic):
    """Step 40 + 3 ms per sequence, ITL 100 ms: the gaps follow the batch a request shares."""
    models = StageModels(decode=DecodeModel(40.0, 3.0, 32))
    pl, r = plan_and_simulate("disaggregated", 6.0, (500, 2000), (50, 300), statistic, models, itl_s=0.1)
    s = r.samples
    itl = quantile(s["itl_stat_s"][s["itl_max_s"] > 0], P)
    assert abs(pl.itl_s - itl) <= 0.1 * itl + 0.002, (pl.itl_s, itl)
    assert r.slo_attainment >= P - 0.02


def test_colocated_long_prompts_sized_like_the_simulator():
    """4 req/s of 6,000-token prompts: the planner asked for 11 colocated GPUs where 4-5 serve it.

    Under the mean statistic (each request's 230 ms stalls spread over its 399
    gaps) the planner now sizes what the simulator needs; under max (one stall
    is a breach) no fleet of that size meets the ITL target, and the planner
    says so by asking for hundreds of replicas.
    """
    pl, r = plan_and_simulate("colocated", 4.0, 6000, 400, "mean")
    assert pl.replicas["colocated"] <= 5
    assert r.slo_attainment >= 0.98
    w = poisson(4.0, 300.0, prompt_tokens=6000, output_tokens=400, seed=7)
    strict = plan(demand_of(w, 4.0), M, SLO(percentile=P, itl_statistic="max"), placement="colocated")
    assert strict.replicas["colocated"] > 100
    for n in (5, 11):
        sim = simulate(w, M, SimConfig(placement="colocated", colocated=n, itl_statistic="max"))
        assert sim.slo_attainment < 0.05


def test_poisson_helpers():
    import math

    from disagg.queueing import poisson_cdf, poisson_quantile

    assert poisson_cdf(0, 2.0) == pytest.approx(math.exp(-2.0))
    assert poisson_cdf(2, 2.0) == pytest.approx(5 * math.exp(-2.0))
    assert poisson_cdf(-1, 2.0) == 0.0 and poisson_cdf(3, 0.0) == 1.0
    # quantiles of numpy's Poisson sampler (400,000 draws, seed 0)
    assert [poisson_quantile(0.9, mu) for mu in (0.1, 3.0, 17.6, 399.0, 5000.0)] == [0, 5, 23, 425, 5091]
    with pytest.raises(ValueError):
        poisson_quantile(1.0, 3.0)
    with pytest.raises(ValueError):
        poisson_cdf(1, -1.0)
