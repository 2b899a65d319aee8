"""The error budget (autoscaler.counted_slo, budget_percentile, decide): misses the SLO still
lets through may hold back growth, never shrink a pool the SLO percentile would keep."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from disagg import autoscaler, evaluate, metrics, policy
from disagg.autoscaler import (
    ERROR_BUDGET_MEMORY_S,
    ERROR_BUDGET_SPREAD_S,
    Observation,
    PoolObservation,
    ScalerState,
    budget_percentile,
    counted_slo,
)
from disagg.planner import SLO

SETTINGS = evaluate.EvalSettings()  # flat 0.6 s TTFT at p99, 60 s window, 30 s interval
CONFIG = autoscaler.config_from_spec(evaluate.spec_for(SETTINGS, "disaggregated"))
T0 = 10_000.0
# per second, as rate() of the engines' TTFT buckets: 10 req/s finished, 9.9 within 0.6 s
BUCKETS = ((0.3, 8.0), (0.6, 9.9), (1.0, 9.95), (math.inf, 10.0))


def faded(count: float, seconds: float) -> float:
    """An earlier count `seconds` later (the budget's memory of about a week)."""
    return count * math.exp(-seconds / ERROR_BUDGET_MEMORY_S)


def obs(now: float = T0, rate: float = 5.5, pools: tuple[int, int] = (1, 2), **kw) -> Observation:
    fields = dict(arrival_rps=rate, prompt_tokens_mean=1000.0, output_tokens_mean=200.0, ttft_observed_s=0.3)
    fields.update(kw)
    return Observation(
        now=now,
        metrics_ok=True,
        pools={"prefill": PoolObservation(pools[0]), "decode": PoolObservation(pools[1])},
        **fields,
    )


def state(judged: float = 0.0, missed: float = 0.0, at: float | None = None) -> ScalerState:
    steady = policy.PolicyState(first_seen=0.0, last_action=0.0)
    return ScalerState(policy=steady, slo_judged=judged, slo_missed=missed, slo_counted_at=at)


def test_the_share_met_is_read_at_the_bucket_bound_at_or_below_the_target() -> None:
    assert metrics.count_within(0.6, BUCKETS) == (9.9, 10.0)  # on a bound: exact
    assert metrics.count_within(0.7, BUCKETS) == (9.9, 10.0)  # between bounds: the one below
    assert metrics.count_within(0.2, BUCKETS) == (0.0, 10.0)  # below the first bound: none known
    assert metrics.count_within(0.6, ((0.6, 3.0), (1.0, 4.0))) is None  # no +Inf bucket
    assert metrics.count_within(0.6, ((0.6, 0.0), (math.inf, 0.0))) is None  # nothing counted


def test_without_a_surplus_the_slo_percentile_is_planned() -> None:
    assert budget_percentile(0.99, 0.0, 0.0, 5.0) == 0.99  # nothing judged yet
    assert budget_percentile(0.99, 10_000.0, 100.0, 5.0) == 0.99  # exactly the share the SLO lets miss
    assert budget_percentile(0.99, 10_000.0, 300.0, 5.0) == 0.99  # more: never above p either
    assert budget_percentile(0.99, 10_000.0, 0.0, None) == 0.99  # no rate: nothing to spread over


def test_the_surplus_is_spread_over_the_requests_to_come() -> None:
    # 50 misses unspent over 10,000 judged (more than 30 minutes at 4 req/s bring): p99 - 0.5 %
    assert budget_percentile(0.99, 10_000.0, 50.0, 4.0) == pytest.approx(0.985)
    # the same surplus at a rate that brings more in 30 minutes is spread thinner
    assert budget_percentile(0.99, 10_000.0, 50.0, 20.0) == pytest.approx(
        0.99 - 50.0 / (20.0 * ERROR_BUDGET_SPREAD_S)
    )
    # never below twice the SLO's share of misses, however large the surplus
    assert budget_percentile(0.99, 1e9, 0.0, 0.0) == pytest.approx(0.98)
    # a young deployment with a clean record plans at nearly p
    assert budget_percentile(0.99, 300.0, 0.0, 10.0) == pytest.approx(0.99 - 3.0 / 18_000.0)


def test_the_histogram_counts_the_requests_since_the_last_count() -> None:
    judged, missed, at = counted_slo(CONFIG, obs(ttft_buckets=BUCKETS), state())
    # the first count covers one decision interval: 10 req/s for 30 s, 1 % of them late
    assert (judged, missed, at) == (pytest.approx(300.0), pytest.approx(3.0), T0)
    judged, missed, at = counted_slo(CONFIG, obs(T0 + 30, ttft_buckets=BUCKETS), state(300.0, 3.0, T0))
    assert (judged, missed, at) == (
        pytest.approx(faded(300.0, 30) + 300.0),
        pytest.approx(faded(3.0, 30) + 3.0),
        T0 + 30,
    )
    # after a gap in the metrics only a window's requests are counted (the gap's are not known)
    judged, _, _ = counted_slo(CONFIG, obs(T0 + 600, ttft_buckets=BUCKETS), state(300.0, 3.0, T0))
    assert judged == pytest.approx(faded(300.0, 600) + 10.0 * SETTINGS.window_s)


def test_the_counts_fade_over_about_a_week() -> None:
    """A week-old record weighs 1/e: the budget is about the last week's, as an SLO is judged."""
    judged, missed, _ = counted_slo(
        CONFIG, obs(T0 + ERROR_BUDGET_MEMORY_S, ttft_buckets=BUCKETS), state(30_000.0, 30.0, T0)
    )
    assert judged == pytest.approx(30_000.0 / math.e + 10.0 * SETTINGS.window_s)
    assert missed == pytest.approx(30.0 / math.e + 0.1 * SETTINGS.window_s)


def test_a_target_between_bucket_bounds_is_judged_at_the_bound_below() -> None:
    config = autoscaler.config_from_spec(
        evaluate.spec_for(replace(SETTINGS, slo=SLO(ttft_s=0.8)), "disaggregated")
    )
    judged, missed, _ = counted_slo(config, obs(ttft_buckets=BUCKETS), state())
    assert missed / judged == pytest.approx(0.01)  # read at 0.6 s: a lower bound on the share met


@pytest.mark.parametrize(
    "why",
    ["stale metrics", "no histogram", "unreadable histogram", "growing target", "switched off"],
)
def test_the_counts_are_held_when_the_window_cannot_tell(why: str) -> None:
    config, o = CONFIG, obs(ttft_buckets=BUCKETS)
    if why == "stale metrics":
        o = replace(o, metrics_ok=False)
    elif why == "no histogram":
        o = replace(o, ttft_buckets=None)
    elif why == "unreadable histogram":
        o = replace(o, ttft_buckets=((0.6, 0.0), (math.inf, 0.0)))
    elif why == "growing target":
        slo = SLO(ttft_s=0.6, ttft_s_per_1k_tokens=0.1)
        config = autoscaler.config_from_spec(evaluate.spec_for(replace(SETTINGS, slo=slo), "disaggregated"))
    else:
        spec = evaluate.spec_for(SETTINGS, "disaggregated")
        sizing = spec.autoscaling.sizing.model_copy(update={"error_budget": False})
        spec = spec.model_copy(update={"autoscaling": spec.autoscaling.model_copy(update={"sizing": sizing})})
        config = autoscaler.config_from_spec(spec)
    assert counted_slo(config, o, state(300.0, 3.0, T0 - 30)) == (300.0, 3.0, T0 - 30)


def test_an_unspent_budget_holds_back_growth() -> None:
    """At 5.5 req/s p99 wants a third decode worker; with misses to spare the pool holds two."""
    tight = autoscaler.decide(CONFIG, obs(), state())
    assert tight.targets["decode"] == 3 and tight.record.planning_percentile == 0.99
    spare = autoscaler.decide(CONFIG, obs(), state(100_000.0, 0.0, T0 - 30))
    assert spare.targets == {"prefill": 1, "decode": 2}
    assert spare.record.planning_percentile == pytest.approx(0.98)
    assert spare.record.to_status()["inputs"]["planningPercentile"] == pytest.approx(0.98)
    assert any("error budget" in n and "planned at p98" in n for n in spare.notes)
    # a record that spent its misses plans at p99 again
    spent = autoscaler.decide(CONFIG, obs(), state(100_000.0, 1_000.0, T0 - 30))
    assert spent.targets["decode"] == 3 and spent.record.planning_percentile == 0.99


def test_an_unspent_budget_never_shrinks_a_pool_the_slo_percentile_keeps() -> None:
    """Holding three decode workers at 5.5 req/s: p98 would drain one, p99 keeps it, so it stays."""
    strict = autoscaler.decide(CONFIG, obs(pools=(1, 3)), state())
    assert strict.targets["decode"] == 3
    lowered = autoscaler.decide(autoscaler._at_percentile(CONFIG, 0.98), obs(pools=(1, 3)), state())
    assert lowered.targets["decode"] == 2  # what the lower percentile alone would do
    spare = autoscaler.decide(CONFIG, obs(pools=(1, 3)), state(100_000.0, 0.0, T0 - 30))
    assert spare.targets["decode"] == 3 and not spare.drains
    assert spare.record.planning_percentile == 0.99
    assert any("would shrink decode" in n for n in spare.notes)


def test_the_decision_counts_and_keeps_the_budget_in_its_state() -> None:
    out = autoscaler.decide(CONFIG, obs(ttft_buckets=BUCKETS), state(1_000.0, 2.0, T0 - 30))
    assert out.state.slo_judged == pytest.approx(faded(1_000.0, 30) + 300.0)
    assert out.state.slo_missed == pytest.approx(faded(2.0, 30) + 3.0)
    assert out.state.slo_counted_at == T0
    back = ScalerState.from_dict(out.state.to_dict())
    assert back.slo_counted_at == T0
    assert (back.slo_judged, back.slo_missed) == pytest.approx(
        (out.state.slo_judged, out.state.slo_missed), abs=1e-3
    )


@pytest.mark.parametrize(
    "damaged",
    [
        {"judged": "x"},
        {"judged": 10.0, "missed": 20.0},
        {"judged": math.inf},
        {"judged": -1.0, "missed": -2.0},
    ],
)
def test_a_damaged_budget_starts_fresh(damaged: dict) -> None:
    d = {**state().to_dict(), "errorBudget": damaged}
    back = ScalerState.from_dict(d)
    assert (back.slo_judged, back.slo_missed, back.slo_counted_at) == (0.0, 0.0, None)


def _replay(w, budget: bool) -> dict:
    settings = replace(evaluate.with_startup(SETTINGS, 60.0), sizing={"errorBudget": budget})
    return evaluate.run_policy("disagg", w, settings).metrics


def test_on_steady_traffic_the_budget_saves_gpu_hours_and_keeps_the_slo() -> None:
    """Poisson 6 req/s, prompts 3-7,400 tokens: p99 every window ends far above 99 %; spending
    the surplus serves the same half hour with fewer GPU-hours, still above 99 %."""
    from disagg.workload import poisson

    w = poisson(6.0, 1800.0, prompt_tokens=(3, 7400), output_tokens=(20, 200), seed=4)
    tight, spent = _replay(w, budget=False), _replay(w, budget=True)
    assert tight["slo_attainment"] > 0.998
    assert spent["gpu_hours"] < 0.99 * tight["gpu_hours"]
    assert spent["slo_attainment"] >= SETTINGS.slo.percentile


def test_on_bursts_the_budget_costs_no_attainment() -> None:
    """On/off 2 <-> 10 req/s: the surplus earned in the quiet minutes is not spent on the next
    burst's misses (at the burst's rate it is spread thin, and no pool is cut before it)."""
    from disagg.workload import burst

    w = burst(2, 10, 600, 3600.0, duty=0.3, prompt_tokens=(3, 7400), output_tokens=(20, 200), seed=1)
    tight, spent = _replay(w, budget=False), _replay(w, budget=True)
    assert spent["slo_attainment"] >= tight["slo_attainment"] - 1e-9
    assert spent["gpu_hours"] <= tight["gpu_hours"] + 1e-9
