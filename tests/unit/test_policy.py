"""Scaling policy: stabilization, steps, hysteresis, stale metrics, pending pods, budget, rebalance."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from disagg.policy import (
    REASONS,
    Decision,
    PolicyConfig,
    PolicyState,
    burst_reach,
    decide,
    forecast_rate,
    observe_rate,
    rebalance_steps,
    sizing_rate,
    total_gpus,
)

PROPS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def run(seq, cfg, current, **kw):
    """Feed (t, planned) pairs; apply each decision; return the decisions."""
    state = PolicyState()
    out = []
    for t, planned in seq:
        d = decide(t, current, planned, state, cfg, metrics_ok=True, **kw)
        assert d.reason in REASONS
        state = d.state
        current = d.targets
        out.append(d)
    return out


def test_scale_up_at_once():
    d = decide(
        0.0,
        {"prefill": 1, "decode": 2},
        {"prefill": 3, "decode": 7},
        PolicyState(),
        PolicyConfig(),
        metrics_ok=True,
    )
    assert d.targets == {"prefill": 3, "decode": 7}
    assert d.reason == "ScaleUp" and d.changed
    assert d.steps == [d.targets]


def test_max_step_up_and_down():
    cfg = PolicyConfig(max_step_up=2, max_step_down=1, scale_down_stabilization_s=0, hysteresis=0)
    d = decide(0.0, {"decode": 2}, {"decode": 9}, PolicyState(), cfg, metrics_ok=True)
    assert d.targets == {"decode": 4}
    d = decide(10.0, {"decode": 9}, {"decode": 2}, d.state, cfg, metrics_ok=True)
    assert d.targets == {"decode": 8} and d.reason == "ScaleDown"


def test_scale_down_waits_for_window_and_uses_window_max():
    cfg = PolicyConfig(scale_down_stabilization_s=300, hysteresis=0)
    seq = [(t, {"decode": 10 if t < 60 else 4}) for t in range(0, 700, 30)]
    ds = run(seq, cfg, {"decode": 10})
    targets = [d.targets["decode"] for d in ds]
    times = [t for t, _ in seq]
    for t, n in zip(times, targets, strict=True):
        if t < 300 + 60:  # the 10s at t < 60 are in the window until t >= 360
            assert n == 10, (t, n)
    assert targets[-1] == 4
    assert any(d.reason == "HoldStabilization" for d in ds)


def test_square_wave_never_scales_down_inside_window():
    cfg = PolicyConfig(scale_down_stabilization_s=300)
    seq = [(t, {"decode": 12 if (t // 120) % 2 == 0 else 3}) for t in range(0, 1200, 30)]
    ds = run(seq, cfg, {"decode": 12})
    assert all(d.targets["decode"] == 12 for d in ds)


def test_hysteresis_small_drop_needs_sustain():
    cfg = PolicyConfig(scale_down_stabilization_s=60, hysteresis=0.1, hysteresis_sustain_s=300)
    seq = [(t, {"decode": 19}) for t in range(0, 400, 30)]
    ds = run(seq, cfg, {"decode": 20})
    first_down = next(t for (t, _), d in zip(seq, ds, strict=True) if d.targets["decode"] == 19)
    assert first_down >= 300
    # a large drop goes after the stabilization window alone
    seq = [(t, {"decode": 10}) for t in range(0, 400, 30)]
    ds = run(seq, cfg, {"decode": 20})
    first_down = next(t for (t, _), d in zip(seq, ds, strict=True) if d.targets["decode"] == 10)
    assert 60 <= first_down < 120


def test_stale_metrics_hold_never_zero():
    cfg = PolicyConfig(min_replicas={"prefill": 1})
    d = decide(
        0.0, {"prefill": 4, "decode": 6}, {"prefill": 0, "decode": 0}, PolicyState(), cfg, metrics_ok=False
    )
    assert d.targets == {"prefill": 4, "decode": 6}
    assert d.reason == "HoldStaleMetrics" and not d.changed
    # invalid recommendation is treated as stale
    d = decide(0.0, {"decode": 6}, {"decode": float("nan")}, PolicyState(), cfg, metrics_ok=True)
    assert d.reason == "HoldStaleMetrics" and d.targets == {"decode": 6}


def test_paused():
    d = decide(0.0, {"decode": 6}, {"decode": 9}, PolicyState(), PolicyConfig(paused=True), metrics_ok=True)
    assert d.reason == "Paused" and d.targets == {"decode": 6}


def test_pending_pods_block_more_scale_up():
    d = decide(
        0.0,
        {"decode": 6},
        {"decode": 12},
        PolicyState(),
        PolicyConfig(),
        metrics_ok=True,
        pending={"decode": 2},
    )
    assert d.targets == {"decode": 6} and d.reason == "HoldPending"
    # repeated decisions with pending pods do not run away
    st_ = d.state
    for t in range(30, 600, 30):
        d = decide(
            float(t),
            {"decode": 6},
            {"decode": 40},
            st_,
            PolicyConfig(),
            metrics_ok=True,
            pending={"decode": 2},
        )
        st_ = d.state
        assert d.targets["decode"] == 6


def test_bounds_clamp():
    cfg = PolicyConfig(min_replicas={"decode": 2}, max_replicas={"decode": 5}, scale_down_stabilization_s=0)
    assert decide(0, {"decode": 3}, {"decode": 50}, PolicyState(), cfg, metrics_ok=True).targets == {
        "decode": 5
    }
    assert decide(0, {"decode": 3}, {"decode": 0}, PolicyState(), cfg, metrics_ok=True).targets == {
        "decode": 2
    }


def test_budget_trims_growth_last_resort():
    cfg = PolicyConfig(gpu_budget=10, gpus_per_replica={"prefill": 2, "decode": 1})
    d = decide(
        0.0, {"prefill": 2, "decode": 4}, {"prefill": 4, "decode": 6}, PolicyState(), cfg, metrics_ok=True
    )
    assert total_gpus(d.targets, cfg.gpus_per_replica) <= 10
    assert d.reason == "BudgetLimited"
    assert d.targets["prefill"] >= 2 and d.targets["decode"] >= 4


def test_budget_rebalance_bypasses_window_with_floor():
    cfg = PolicyConfig(gpu_budget=8)
    d = decide(
        0.0, {"prefill": 2, "decode": 6}, {"prefill": 4, "decode": 4}, PolicyState(), cfg, metrics_ok=True
    )
    assert d.targets == {"prefill": 4, "decode": 4} and d.reason == "Rebalance"
    assert d.steps[-1] == d.targets
    for s in d.steps:
        assert total_gpus(s) <= 8
    assert d.steps[0]["prefill"] == 2  # break a little first, then make
    d = decide(
        0.0,
        {"prefill": 2, "decode": 6},
        {"prefill": 4, "decode": 4},
        PolicyState(),
        cfg,
        metrics_ok=True,
        floor={"decode": 5},
    )
    assert d.targets["decode"] == 5 and d.targets["prefill"] == 3


def test_state_round_trip_json():
    cfg = PolicyConfig()
    st_ = PolicyState()
    for t, r in [(0, 1.0), (30, 2.0), (60, 3.0)]:
        st_ = observe_rate(st_, t, r, cfg)
    d = decide(60.0, {"decode": 2}, {"decode": 3}, st_, cfg, metrics_ok=True)
    blob = json.dumps(d.state.to_dict())
    back = PolicyState.from_dict(json.loads(blob))
    assert back == d.state
    assert PolicyState.from_dict({"recommendations": [{"bad": 1}]}) == PolicyState()
    assert PolicyState.from_dict(None) == PolicyState()
    assert isinstance(d, Decision) and json.dumps(d.to_dict())


def test_backlog_projection_and_marks():
    cfg = PolicyConfig(forecast_horizon_s=60, forecast_samples=4)
    kw = {"window_s": 60.0, "backlog_drain_s": 60.0}
    r0, st_ = sizing_rate(PolicyState(), 0.0, cfg, 10.0, queued=0, **kw)
    assert r0 == pytest.approx(10.0 + 1.645 * (10.0 / 60) ** 0.5) and st_.backlog_times == ()
    # 600 queued, +20/s since the last call: plan to clear 600 + 20 x 60 within 60 s
    st_ = PolicyState(queue_sample=(0.0, 0.0))
    r1, st1 = sizing_rate(st_, 30.0, cfg, 10.0, queued=600, **kw)
    assert r1 == pytest.approx(r0 + (600 + 20 * 60) / 60)
    assert st1.backlog_times == (30.0,) and st1.queue_sample == (30.0, 600.0)
    # a shrinking queue is not projected; a small queue is not "backlog-driven"
    r2, st2 = sizing_rate(st1, 60.0, cfg, 10.0, queued=300, **kw)
    assert r2 == pytest.approx(r0 + 300 / 60) and st2.backlog_times[-1] == 60.0
    _, st3 = sizing_rate(st2, 90.0, cfg, 10.0, queued=2, **kw)
    assert st3.backlog_times[-1] == 60.0
    # no projection without a lead time
    r4, _ = sizing_rate(
        PolicyState(queue_sample=(0.0, 0.0)), 30.0, cfg, 10.0, queued=600, backlog_lead_s=0, **kw
    )
    assert r4 == pytest.approx(r0 + 10.0)


def test_ttft_feedback_drops_headroom_only_when_comfortable():
    cfg = PolicyConfig(forecast_horizon_s=60)
    kw = {"window_s": 60.0, "ttft_target": 0.6}
    r, _ = sizing_rate(PolicyState(), 0.0, cfg, 10.0, ttft_observed=0.2, **kw)
    assert r == 10.0
    r, _ = sizing_rate(PolicyState(), 0.0, cfg, 10.0, ttft_observed=0.5, **kw)
    assert r > 10.0
    r, _ = sizing_rate(PolicyState(), 0.0, cfg, 10.0, ttft_observed=0.2, queued=900, **kw)
    assert r > 10.0 + 900 / 60 - 1e-9  # a backlog is never ignored
    r, _ = sizing_rate(PolicyState(), 0.0, cfg, 10.0, ttft_observed=float("nan"), **kw)
    assert r > 10.0


def test_headroom_scales_the_demand_not_the_backlog_and_survives_comfort():
    kw = {"window_s": 60.0, "ttft_target": 0.6, "backlog_drain_s": 60.0}
    base = PolicyConfig(forecast_horizon_s=60)
    spare = PolicyConfig(forecast_horizon_s=60, headroom=0.3)
    r0, _ = sizing_rate(PolicyState(), 0.0, base, 10.0, **kw)
    r1, _ = sizing_rate(PolicyState(), 0.0, spare, 10.0, **kw)
    assert r1 == pytest.approx(1.3 * r0)
    # a comfortable TTFT drops the counting-noise margin, never the headroom the user set
    r, _ = sizing_rate(PolicyState(), 0.0, spare, 10.0, ttft_observed=0.1, **kw)
    assert r == pytest.approx(13.0)
    # the backlog term is added on top, not multiplied: it is work already waiting
    r, _ = sizing_rate(PolicyState(), 0.0, spare, 10.0, ttft_observed=0.1, queued=600, **kw)
    assert r == pytest.approx(1.3 * r0 + 600 / 60)
    with pytest.raises(ValueError, match="headroom"):
        PolicyConfig(headroom=-0.1)


def test_backlog_recommendation_does_not_hold_the_window():
    cfg = PolicyConfig(scale_down_stabilization_s=300)
    st_ = PolicyState()
    cur = {"decode": 4}
    # steady load, then a backlog episode sized 12, then the queue is gone (need 6)
    for t in range(0, 330, 30):
        st_ = replace(st_, backlog_times=())
        d = decide(float(t), cur, {"decode": 4}, st_, cfg, metrics_ok=True)
        st_, cur = d.state, d.targets
    for t, want in [(330, 12), (360, 10)]:
        st_ = replace(st_, backlog_times=(*st_.backlog_times, float(t)))
        d = decide(float(t), cur, {"decode": want}, st_, cfg, metrics_ok=True)
        st_, cur = d.state, d.targets
    assert cur == {"decode": 12}  # held while the backlog lasts
    d = decide(390.0, cur, {"decode": 6}, st_, cfg, metrics_ok=True)
    assert d.targets == {"decode": 6}  # then only demand-driven recommendations hold
    st_, cur = d.state, d.targets
    d = decide(420.0, cur, {"decode": 4}, st_, cfg, metrics_ok=True)
    assert d.targets == {"decode": 6}  # ...and those hold for the whole window
    blob = json.dumps(d.state.to_dict())
    assert PolicyState.from_dict(json.loads(blob)) == d.state


def test_forecast_rising_falling_flat():
    cfg = PolicyConfig(forecast_horizon_s=60, forecast_samples=4)
    st_ = PolicyState()
    assert forecast_rate(st_, 0, cfg) is None
    for t, r in [(0, 10.0), (30, 12.0), (60, 14.0), (90, 16.0)]:
        st_ = observe_rate(st_, t, r, cfg)
    assert forecast_rate(st_, 90, cfg) == pytest.approx(20.0)
    st2 = PolicyState()
    for t, r in [(0, 16.0), (30, 14.0), (60, 12.0), (90, 10.0)]:
        st2 = observe_rate(st2, t, r, cfg)
    assert forecast_rate(st2, 90, cfg) == 10.0  # falling: keep the observation
    st3 = PolicyState()
    for t, r in [(0, 1.0), (30, 1.0), (60, 1.0), (90, 50.0)]:
        st3 = observe_rate(st3, t, r, cfg)
    assert forecast_rate(st3, 90, cfg) <= 100.0  # capped at 2x
    assert observe_rate(st3, 120, float("nan"), cfg) == st3


def _rates(points: list[tuple[float, float]], cfg: PolicyConfig) -> PolicyState:
    st_ = PolicyState()
    for t, r in points:
        st_ = observe_rate(st_, t, r, cfg)
    return st_


def test_forecast_does_not_project_a_step_that_stays():
    """A level that rose once and stays: the line through it is a ramp, but the rate has not
    risen since the newest sample whose 60 s window does not overlap the latest one's."""
    cfg = PolicyConfig(forecast_horizon_s=60, forecast_samples=4)
    step = _rates([(0, 10.0), (30, 20.0), (60, 20.0), (90, 20.0)], cfg)
    assert forecast_rate(step, 90, cfg) > 25.0  # the fitted line projects the step as a ramp
    assert forecast_rate(step, 90, cfg, window_s=60.0) == 20.0
    # a rise slowing down: projected at the rate it still rises (4 req/s over the last minute)
    slowing = _rates([(0, 10.0), (30, 16.0), (60, 18.0), (90, 20.0)], cfg)
    assert forecast_rate(slowing, 90, cfg) == pytest.approx(27.2)
    assert forecast_rate(slowing, 90, cfg, window_s=60.0) == pytest.approx(24.0)
    # a rise speeding up: the line is the bound, as before
    rising = _rates([(0, 10.0), (30, 10.0), (60, 14.0), (90, 20.0)], cfg)
    assert forecast_rate(rising, 90, cfg, window_s=60.0) == pytest.approx(forecast_rate(rising, 90, cfg))
    # a steady ramp rises as fast as its line: the projection is the line's
    ramp = _rates([(0, 10.0), (30, 12.0), (60, 14.0), (90, 16.0)], cfg)
    assert forecast_rate(ramp, 90, cfg, window_s=60.0) == pytest.approx(forecast_rate(ramp, 90, cfg))
    # with no sample a window older the oldest kept one is the reference (here: the line's)
    short = _rates([(0, 10.0), (30, 12.0)], cfg)
    fitted = forecast_rate(short, 30, cfg)
    assert fitted is not None and fitted > 12.0
    assert forecast_rate(short, 30, cfg, window_s=60.0) == pytest.approx(fitted)


def test_sizing_rate_plans_a_stopped_rise_at_its_level():
    """The rate the decision plans for after a step: the level plus its counting noise, not the
    step projected a start-up ahead."""
    cfg = PolicyConfig(forecast_horizon_s=60, forecast_samples=4)
    st_ = PolicyState()
    for t, r in [(0, 10.0), (30, 20.0), (60, 20.0)]:
        _, st_ = sizing_rate(st_, t, cfg, r, window_s=60.0, z=0.0)
    planned, _ = sizing_rate(st_, 90, cfg, 20.0, window_s=60.0, z=0.0)
    assert planned == pytest.approx(20.0)


def test_fast_attack_reads_the_short_window_with_the_measured_dispersion():
    """A short window 50 % above the window's rate is a step under Poisson counting noise, and
    within the noise of traffic whose counts vary ten times as much: then it is not taken."""
    cfg = PolicyConfig(forecast_horizon_s=60, forecast_samples=4)

    def planned(dispersion: float | None) -> float:
        got, _ = sizing_rate(
            PolicyState(),
            0.0,
            cfg,
            20.0,
            window_s=60.0,
            rate_short=30.0,
            short_window_s=45.0,
            z=1.645,
            dispersion=dispersion,
        )
        return got

    noise = 1.645 * math.sqrt(20.0 / 60.0)  # the window's own counting noise at Poisson
    poisson_lcb = 30.0 - 1.645 * math.sqrt(30.0 / 45.0)
    assert planned(None) == pytest.approx(poisson_lcb + 1.645 * math.sqrt(poisson_lcb / 60.0))
    assert planned(None) > 20.0 + noise
    # dispersion 10: the short window's bound (30 - 1.645 x sqrt(10 x 30 / 45) = 25.8) is still
    # above 20, but by less; at dispersion 80 (18.0) it is below 20 and the window's rate stands
    assert planned(10.0) < planned(None)
    assert planned(80.0) == pytest.approx(20.0 + 1.645 * math.sqrt(80.0 * 20.0 / 60.0))


def test_config_validation():
    with pytest.raises(ValueError, match="min_replicas"):
        PolicyConfig(min_replicas={"decode": 5}, max_replicas={"decode": 2})
    with pytest.raises(ValueError, match="hysteresis"):
        PolicyConfig(hysteresis=1.5)
    with pytest.raises(ValueError, match="max_step_up"):
        PolicyConfig(max_step_up=0)


# --------------------------------------------------------------------------- properties

pool_names = ["encoder", "prefill", "decode"]


@st.composite
def rebalance_cases(draw):
    g = {p: draw(st.integers(1, 4)) for p in pool_names}
    cur = {p: draw(st.integers(0, 12)) for p in pool_names}
    tgt = {p: draw(st.integers(0, 12)) for p in pool_names}
    floor = {p: draw(st.integers(0, 12)) for p in pool_names}
    lo = max(total_gpus(cur, g), total_gpus(tgt, g))
    budget = draw(st.integers(lo, lo + 6))
    return cur, tgt, g, budget, floor


@PROPS
@given(rebalance_cases())
def test_rebalance_steps_properties(case):
    cur, tgt, g, budget, floor = case
    steps = rebalance_steps(cur, tgt, g, budget, floor)
    if cur == tgt:
        assert steps == []
        return
    assert steps[-1] == tgt
    prev = cur
    for s in steps:
        assert total_gpus(s, g) <= budget
        assert s != prev
        for p in pool_names:
            assert s[p] >= min(floor[p], tgt[p], cur[p])
            assert min(cur[p], tgt[p]) <= s[p] <= max(cur[p], tgt[p])
        prev = s


@PROPS
@given(rebalance_cases())
def test_rebalance_donor_reaches_floor_before_target(case):
    cur, tgt, g, budget, floor = case
    steps = rebalance_steps(cur, tgt, g, budget, floor)
    donors = [p for p in pool_names if cur[p] > tgt[p]]
    for p in donors:
        # once any donor dips below its floor, no donor stays above its floor
        for s in steps[:-1]:
            if s[p] < min(floor[p], cur[p]):
                assert all(s[q] <= max(tgt[q], floor[q]) for q in donors)


@PROPS
@given(
    st.lists(st.integers(0, 40), min_size=1, max_size=40),
    st.integers(0, 40),
    st.booleans(),
)
def test_decide_invariants(plans, start, ok):
    cfg = PolicyConfig(
        scale_down_stabilization_s=120,
        max_step_down=3,
        min_replicas={"decode": 1},
        max_replicas={"decode": 30},
        gpu_budget=30,
    )
    cur = {"decode": max(1, min(start, 30))}
    state = PolicyState()
    history: list[tuple[float, int]] = []
    for i, n in enumerate(plans):
        t = 30.0 * i
        d = decide(t, cur, {"decode": n}, state, cfg, metrics_ok=ok)
        new = d.targets["decode"]
        assert 1 <= new <= 30
        assert new >= cur["decode"] - 3
        if not ok:
            assert new >= cur["decode"]
        if ok:
            history.append((t, min(30, max(1, n))))
            if new < cur["decode"]:
                assert new >= max(r for tt, r in history if tt >= t - 120)
                assert t >= 120
        state, cur = d.state, d.targets
    assume(True)


def test_trend_and_headroom_cover_one_rise_not_two():
    """A rising trend and a burst headroom both answer how far load rises before new
    capacity serves: the rate planned for is the larger of the two answers."""
    kw = {"window_s": 60.0}
    cfg = PolicyConfig(forecast_horizon_s=60, forecast_samples=4, forecast_max_growth=2.0)
    rising = PolicyState()
    for t, r in ((0.0, 8.0), (30.0, 9.0), (60.0, 10.0)):
        _, rising = sizing_rate(rising, t, cfg, r, **kw)
    now, rate = 90.0, 11.0
    trend_only, _ = sizing_rate(rising, now, cfg, rate, **kw)
    noise = 1.645 * (rate / 60.0) ** 0.5
    assert trend_only > rate + noise  # the trend projects above the observation
    small, _ = sizing_rate(rising, now, cfg, rate, auto_headroom=0.05, **kw)
    large, _ = sizing_rate(rising, now, cfg, rate, auto_headroom=0.6, **kw)
    assert small == pytest.approx(trend_only)  # the trend already covers a 5 % rise
    assert large == pytest.approx((rate + noise) * 1.6)  # the headroom covers more than the trend
    assert large < trend_only * 1.6  # and is not multiplied by it
    # on a flat trend the headroom applies to the observation, as before
    flat, _ = sizing_rate(PolicyState(), 0.0, cfg, rate, auto_headroom=0.6, **kw)
    assert flat == pytest.approx((rate + noise) * 1.6)


def _burst_under_way(cfg: PolicyConfig) -> PolicyState:
    """Rate samples of a burst's first minute: 2 -> 5 -> 8 req/s, 30 s apart."""
    state = PolicyState()
    for t, r in ((0.0, 2.0), (30.0, 5.0), (60.0, 8.0)):
        _, state = sizing_rate(state, t, cfg, r, window_s=60.0)
    return state


def test_a_rise_is_projected_no_further_than_the_bursts_seen_reach():
    """A line through a burst's first minute, projected a lead ahead, asks for far more than its
    top; where earlier bursts showed their level, the projection stops there while the pools keep up."""
    cfg = PolicyConfig(forecast_horizon_s=60, forecast_samples=4, forecast_max_growth=2.0)
    rising = _burst_under_way(cfg)
    rate, z = 9.5, 2.576
    kw = {"window_s": 60.0, "ttft_target": 0.6, "ttft_observed": 0.4, "burst_floor_rps": 10.0}
    unbounded, _ = sizing_rate(rising, 90.0, cfg, rate, **kw)
    assert unbounded > 1.5 * rate  # the trend alone: half as much again as the top, and more
    bounded, _ = sizing_rate(rising, 90.0, cfg, rate, reach_z=z, **kw)
    assert bounded == pytest.approx(10.0 + 1.645 * (10.0 / 60.0) ** 0.5)  # the floor, with its counting noise
    # the pools not keeping up (TTFT over the target, or not observed): projected as before
    late, _ = sizing_rate(rising, 90.0, cfg, rate, reach_z=z, **{**kw, "ttft_observed": 0.7})
    unseen, _ = sizing_rate(rising, 90.0, cfg, rate, reach_z=z, **{**kw, "ttft_observed": None})
    assert late == pytest.approx(unbounded) and unseen == pytest.approx(unbounded)
    # a rise beyond the level bursts reached, past counting noise: a new kind, projected as before
    beyond, _ = sizing_rate(rising, 90.0, cfg, rate, reach_z=z, **{**kw, "burst_floor_rps": 6.0})
    assert beyond == pytest.approx(unbounded)
    # within counting noise of that level it is the same burst: 9.5 against a floor of 9
    near, _ = sizing_rate(rising, 90.0, cfg, rate, reach_z=z, **{**kw, "burst_floor_rps": 9.0})
    assert near == pytest.approx(rate + 1.645 * (rate / 60.0) ** 0.5)
    # the burst profile's reach: a rise under way from half the rate, rises to 2.2x their foot seen
    profile = {**kw, "burst_floor_rps": None, "auto_headroom": 1.2, "before_rise": 0.5}
    reached, _ = sizing_rate(rising, 90.0, cfg, rate, reach_z=z, **profile)
    reach = 2.2 * 0.5 * rate
    spare = (rate + 1.645 * (rate / 60.0) ** 0.5) * (2.2 * 0.5)  # the headroom the rise has left
    assert reached == pytest.approx(max(reach + 1.645 * (reach / 60.0) ** 0.5, spare))
    assert reached < sizing_rate(rising, 90.0, cfg, rate, **profile)[0]


def test_at_a_bursts_top_the_headroom_stands_ready_for_no_further_rise():
    """The automatic headroom's rises ran from feet to tops: at the level bursts reach, standing
    ready for another rise of that share on top of the top would size for a burst not seen."""
    cfg = PolicyConfig(forecast_horizon_s=60)
    kw = {
        "window_s": 60.0,
        "ttft_target": 0.6,
        "ttft_observed": 0.4,
        "auto_headroom": 1.9,
        "before_rise": 1.0,
        "burst_floor_rps": 9.5,
    }
    z = 2.576

    def noise(x: float) -> float:
        return 1.645 * (x / 60.0) ** 0.5

    free, _ = sizing_rate(PolicyState(), 0.0, cfg, 10.0, **kw)
    assert free == pytest.approx((10.0 + noise(10.0)) * 2.9)  # another 2.9x from the top
    top, _ = sizing_rate(PolicyState(), 0.0, cfg, 10.0, reach_z=z, **kw)
    assert top == pytest.approx(10.0 + noise(10.0))  # the rate with its noise, above the floor's
    # just below the floor, within its counting noise: stops at the floor and its noise
    near, _ = sizing_rate(PolicyState(), 0.0, cfg, 9.0, reach_z=z, **kw)
    assert near == pytest.approx(9.5 + z * (9.5 / 60.0) ** 0.5)
    # at a foot the headroom stands ready for the rise, as before
    foot, _ = sizing_rate(PolicyState(), 0.0, cfg, 3.0, reach_z=z, **kw)
    assert foot == pytest.approx((3.0 + noise(3.0)) * 2.9)
    # pools not keeping up, or the spec's own headroom: neither is cut
    late, _ = sizing_rate(PolicyState(), 0.0, cfg, 10.0, reach_z=z, **{**kw, "ttft_observed": 0.8})
    assert late == pytest.approx(free)
    spec = PolicyConfig(forecast_horizon_s=60, headroom=0.3)
    kept, _ = sizing_rate(PolicyState(), 0.0, spec, 10.0, reach_z=z, **kw)
    assert kept == pytest.approx((10.0 + noise(10.0)) * 1.3)


def test_the_reach_of_bursts_is_a_level_seen_never_the_rate_itself():
    assert burst_reach(9.0, None, None, 12.0) == 12.0  # the burst floor
    assert burst_reach(9.0, 1.0, 0.5, None) == pytest.approx(9.0)  # from the rise's foot, 4.5 req/s
    assert burst_reach(9.0, 1.0, 0.5, 12.0) == 12.0  # the higher of the two
    # no rise under way, or no rise seen: a headroom over the current rate is no level
    assert burst_reach(9.0, 1.0, 1.0, None) is None
    assert burst_reach(9.0, 1.0, None, None) is None
    assert burst_reach(9.0, 0.0, 0.5, None) is None
    assert burst_reach(9.0, None, None, None) is None
    assert burst_reach(9.0, float("nan"), 0.5, float("nan")) is None


def test_each_pools_last_change_is_on_record_and_survives_the_round_trip():
    cfg = PolicyConfig(scale_down_stabilization_s=0)
    d = decide(
        100.0, {"prefill": 1, "decode": 2}, {"prefill": 1, "decode": 4}, PolicyState(), cfg, metrics_ok=True
    )
    assert d.targets == {"prefill": 1, "decode": 4}
    assert d.state.changed_at == {"decode": 100.0} and d.state.last_action == 100.0
    d = decide(200.0, d.targets, {"prefill": 3, "decode": 4}, d.state, cfg, metrics_ok=True)
    assert d.state.changed_at == {"decode": 100.0, "prefill": 200.0}
    assert d.state.changed_since(["decode"]) == 100.0 and d.state.changed_since(["encoder"]) is None
    assert PolicyState.from_dict(json.loads(json.dumps(d.state.to_dict()))) == d.state
    # a state recorded before per-pool times: every pool it targeted counts as changed at its last action
    old = PolicyState(first_seen=0.0, last_action=50.0, last_targets={"prefill": 1, "decode": 2})
    d = decide(300.0, {"prefill": 1, "decode": 2}, {"prefill": 1, "decode": 3}, old, cfg, metrics_ok=True)
    assert d.state.changed_at == {"prefill": 50.0, "decode": 300.0}
