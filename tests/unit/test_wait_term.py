"""The arrival term read off the prefill queue's waits (autoscaler.wait_arrival_term): requests
that arrive together inside a scrape show in the queue's mean wait, not in any count."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from disagg import autoscaler, drain, evaluate, planner, policy, queueing
from disagg.autoscaler import Observation, PoolObservation, ScalerState, paired_wait_term, wait_arrival_term
from disagg.workload import poisson, with_coarse_timestamps

SETTINGS = evaluate.EvalSettings()  # flat 0.6 s TTFT at p99, 60 s window, 30 s interval, 15 s scrapes
CONFIG = autoscaler.config_from_spec(evaluate.spec_for(SETTINGS, "disaggregated"))
MODELS = CONFIG.planning.models
STEP = CONFIG.count_interval_s  # 30 s
T0 = 10_000.0
# a tight spread: every wait in one bucket, so the noise bound moves nothing
TIGHT = ((0.001, 0.0), (0.1, 6.0), (math.inf, 6.0))


def obs(now: float = T0, *, waited: float | None, serving: float | None = 2.0, **kw) -> Observation:
    pools = kw.pop("pools", {"prefill": PoolObservation(2), "decode": PoolObservation(3)})
    fields = dict(
        arrival_rps=6.0,
        prompt_tokens_mean=1000.0,
        output_tokens_mean=100.0,
        arrival_counts=(6.0 * STEP,) * 20,
        count_interval_s=STEP,
        prefill_wait_buckets=TIGHT,
        prefill_wait_mean_s=waited,
        prefill_serving_min=serving,
    )
    fields.update(kw)
    return Observation(now=now, metrics_ok=True, pools=pools, **fields)


def model_wait(n: int, rate: float, ca2: float) -> float:
    """The planner's mean prefill wait (Allen-Cunneen) for the test's requests."""
    demand = autoscaler.demand_for(obs(waited=0.0), rate, {})
    service_s, cs2 = planner.prefill_queue(demand, MODELS, CONFIG.planning.slo)
    return float(queueing.mgc_mean_wait(n, rate, service_s, cs2, ca2))


def reading(o: Observation) -> float | None:
    return wait_arrival_term(CONFIG, o, o.arrival_rps, {}, autoscaler.SizingInputs(), MODELS)


def test_the_reading_is_the_arrival_term_that_explains_the_mean_wait() -> None:
    for ca2 in (1.0, 4.0, 20.0):
        assert reading(obs(waited=model_wait(2, 6.0, ca2))) == pytest.approx(ca2, rel=1e-6)
    # a queue that waited less than Poisson's says nothing more than Poisson: the caller keeps 1
    assert reading(obs(waited=0.0)) < 1.0


def test_the_waits_are_read_at_the_count_they_were_waited_at() -> None:
    """The fewest engines reporting over the window: waits at 2 workers read against the 4 of
    now (after a scale-up inside the window) would be a burst of many times Poisson."""
    waited = model_wait(2, 6.0, 1.0)
    grown = {"prefill": PoolObservation(4), "decode": PoolObservation(3)}
    assert reading(obs(waited=waited, serving=2.0, pools=grown)) == pytest.approx(1.0)
    assert reading(obs(waited=waited, serving=4.0, pools=grown)) > 20.0  # what the count of now would say
    # engines still reporting while drained take no new request: the pods staying count
    draining = {"prefill": PoolObservation(2, pods=(leaving_pod(),)), "decode": PoolObservation(3)}
    assert reading(obs(waited=model_wait(1, 6.0, 1.0), serving=2.0, pools=draining)) == pytest.approx(1.0)


def leaving_pod() -> drain.PodView:
    return drain.PodView(
        "prefill-0", "Running", True, False, drain.DrainRecord(T0 - 10.0, T0 + 600.0, "proceed")
    )


def test_a_spike_inside_the_window_is_a_rate_not_a_burst() -> None:
    """2 req/s, then 12 req/s for the window's last sub-window: the waits are those of Poisson
    arrivals at each sub-window's rate. Read against the window's mean rate (7 req/s) they
    would be a burst; against the rates the counts show they are Poisson."""
    counts = (2.0 * STEP,) * 19 + (12.0 * STEP,)
    spiky = [(2.0 * STEP, 2.0), (12.0 * STEP, 12.0)]
    waited = sum(c * model_wait(4, lam, 1.0) for c, lam in spiky) / sum(c for c, _ in spiky)
    o = obs(waited=waited, serving=4.0, arrival_rps=7.0, arrival_counts=counts)
    o = replace(o, pools={"prefill": PoolObservation(4), "decode": PoolObservation(3)})
    assert reading(o) == pytest.approx(1.0, rel=1e-6)
    assert reading(replace(o, arrival_counts=None)) > 3.0  # one rate for the window


def test_a_light_queues_few_waits_are_read_at_their_noise_bound() -> None:
    """Two requests of the window's 360 waited 30 ms: a mean of 0.17 ms, several times the
    model's at this load, and within the noise of nothing waiting. Read at its lower bound it is
    no burst; the same mean from waits all alike (a tight spread) is one."""
    waited = 2 * 0.03 / 360.0
    few = ((0.001, 6.0 - 2 / 60.0), (0.05, 6.0), (math.inf, 6.0))  # per second, as rate() reads them
    light = obs(
        waited=waited, serving=3.0, pools={"prefill": PoolObservation(3), "decode": PoolObservation(3)}
    )
    assert reading(light) > 2.0
    assert reading(replace(light, prefill_wait_buckets=few)) < 1.0


@pytest.mark.parametrize(
    "missing",
    [
        {"prefill_wait_mean_s": None},
        {"prefill_serving_min": None},
        {"prefill_wait_buckets": None},  # no spread to bound the mean's noise with
        {"prefill_serving_min": 0.0},
        {"arrival_rps": 0.0},
        {"prefill_wait_mean_s": math.nan},
    ],
)
def test_without_its_inputs_there_is_no_reading(missing: dict) -> None:
    o = replace(obs(waited=model_wait(2, 6.0, 4.0)), **missing)
    assert reading(o) is None


def test_other_placements_read_nothing() -> None:
    conditional = autoscaler.config_from_spec(evaluate.spec_for(SETTINGS, "conditional"))
    o = obs(waited=model_wait(2, 6.0, 4.0))
    assert wait_arrival_term(conditional, o, 6.0, {}, autoscaler.SizingInputs(), MODELS) is None


def test_a_reading_counts_beside_the_one_before_it() -> None:
    """The smaller of two readings a window apart at most; a missing one breaks the pair."""
    before = ScalerState(wait_term=6.0, wait_term_at=T0 - 30.0)
    assert paired_wait_term(4.0, before, T0, 60.0) == 4.0
    assert paired_wait_term(9.0, before, T0, 60.0) == 6.0
    assert paired_wait_term(None, before, T0, 60.0) is None
    assert paired_wait_term(4.0, ScalerState(), T0, 60.0) is None
    assert paired_wait_term(4.0, replace(before, wait_term_at=T0 - 61.0), T0, 60.0) is None  # stale


def test_the_decision_plans_with_two_readings_in_a_row_and_says_so() -> None:
    pol = policy.PolicyState(first_seen=0.0, last_action=0.0)
    bursty = obs(waited=model_wait(2, 6.0, 30.0))
    first = autoscaler.decide(CONFIG, bursty, ScalerState(policy=pol))
    assert first.record.wait_arrival_term is None  # one reading: not yet
    assert first.state.wait_term == pytest.approx(30.0) and first.state.wait_term_at == T0
    second = autoscaler.decide(CONFIG, replace(bursty, now=T0 + 30.0), first.state)
    assert second.record.wait_arrival_term == pytest.approx(30.0)
    assert second.record.to_status()["inputs"]["waitArrivalTerm"] == pytest.approx(30.0)
    assert any("prefill queue's mean wait" in n for n in second.record.notes)
    assert second.plan.replicas["prefill"] > first.plan.replicas["prefill"]
    # switched off: nothing read, nothing kept
    off = replace(CONFIG, sizing=CONFIG.sizing.model_copy(update={"burstiness": False}))
    quiet = autoscaler.decide(off, replace(bursty, now=T0 + 30.0), first.state)
    assert quiet.record.wait_arrival_term is None and quiet.state.wait_term is None
    assert quiet.plan.replicas["prefill"] == first.plan.replicas["prefill"]


def test_the_reading_survives_the_status_round_trip_and_damage_starts_fresh() -> None:
    st = ScalerState(wait_term=3.25, wait_term_at=T0)
    back = ScalerState.from_dict(st.to_dict())
    assert (back.wait_term, back.wait_term_at) == (3.25, T0)
    assert "waitTerm" in st.to_dict() and ScalerState().to_dict()["waitTerm"] == {}
    for damaged in ({"term": "x", "at": T0}, {"term": math.nan, "at": T0}, {"term": 2.0}, [1]):
        back = ScalerState.from_dict({**st.to_dict(), "waitTerm": damaged})
        assert (back.wait_term, back.wait_term_at) == (None, None)


def test_requests_that_arrive_together_are_served_by_the_reading() -> None:
    """Poisson arrivals floored to 3 s (~18 requests at once): the counts per sub-window look
    Poisson and only the queue's waits show it. The front load gain off in every run, so the
    reading alone is what changes: most of the requests lost on time are served, and the same
    arrivals spread out cost not a GPU-second more."""
    w = poisson(6, 2400, prompt_tokens=(3, 2000), output_tokens=(20, 200), seed=5)
    batched = with_coarse_timestamps(w, 3.0)
    on = replace(SETTINGS, sizing={"frontLoadGain": False})
    off = replace(SETTINGS, sizing={"frontLoadGain": False, "burstiness": False})
    a_on = evaluate.run_policy("disagg", batched, on).metrics["slo_attainment"]
    a_off = evaluate.run_policy("disagg", batched, off).metrics["slo_attainment"]
    assert a_off < 0.7 and a_on > 0.95
    smooth_on = evaluate.run_policy("disagg", w, on).metrics["gpu_hours"]
    smooth_off = evaluate.run_policy("disagg", w, off).metrics["gpu_hours"]
    assert smooth_on == smooth_off
