"""The arrival rate, arrival counts and prompt lengths as the engines count them.

The operator reads them off the arrival pool's prompt-tokens histogram, which vLLM and SGLang
record when a request finishes on the engine: on a prefill instance, when its prefill is done.
`disagg evaluate` shows the `disagg` policy the same (`evaluate.EngineCounts`), so a prefill
queue hides arrivals from the decision as it does from the operator.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from disagg import autoscaler
from disagg import evaluate as ev
from disagg.autoscaler import ScalerState, arrivals_in_system
from disagg.workload import Workload, piecewise_poisson

STARTUP = ev.with_startup(ev.EvalSettings(), 60.0)
FLOOD_START, FLOOD_S, FLOOD_RPS = 300.0, 30.0, 40.0


def _seen(w: Workload, policy: type[ev.Policy], records: list | None = None) -> list[ev.Obs]:
    """Every observation `policy` decides on while `w` is replayed (`records`: the `disagg`
    decisions' records, appended)."""
    seen: list[ev.Obs] = []

    class Recording(policy):  # type: ignore[valid-type,misc]
        def decide(self, o: ev.Obs) -> tuple[dict[str, int], str]:
            seen.append(o)
            out = super().decide(o)
            if records is not None:
                records.append(self.last.record)
            return out

    ev.run_policy(policy.name, w, STARTUP, make=lambda s, w_, pre: Recording(s, w_, pre))
    return seen


def _flood() -> Workload:
    """2 req/s of 500-token prompts, then half a minute of 40 req/s of 8,000-token prompts (a
    prefill worker does ~3 of those a second), then 2 req/s again."""
    rng = np.random.default_rng(3)
    t = piecewise_poisson([(FLOOD_START, 2.0), (FLOOD_S, FLOOD_RPS), (600.0, 2.0)], rng)
    in_flood = (t >= FLOOD_START) & (t < FLOOD_START + FLOOD_S)
    return Workload(t, np.where(in_flood, 8000, 500), np.full(t.size, 50), name="prefill-flood")


def test_the_decision_sees_the_prefills_done_not_the_arrivals() -> None:
    """Under the flood the prefill pool finishes a few requests a second while 40 arrive, and
    the rate the decision sees is what it finished; the rest wait in its queue, which the
    decision sees too. A baseline that models a front-door counter sees the arrivals."""
    w = _flood()
    at = FLOOD_START + 45.0 + STARTUP.scrape_s  # its window (one scrape late) ends 45 s into the flood
    o = next(o for o in _seen(w, ev.DisaggPolicy) if o.now == at)
    window_end = at - STARTUP.scrape_s
    arrived = int(
        np.count_nonzero((w.arrival_s >= window_end - STARTUP.window_s) & (w.arrival_s < window_end))
    )
    assert arrived / STARTUP.window_s > 15.0
    assert o.rate < 0.3 * arrived / STARTUP.window_s  # the prefill pool's throughput
    assert o.queued > 500  # the arrivals not counted yet wait for a prefill worker
    # the prompts counted are those of the requests finished: both kinds are in the window
    assert 500.0 < o.prompt_mean < 8000.0
    static = next(o for o in _seen(w, ev.StaticPolicy) if o.now == at)
    assert static.rate == pytest.approx(arrived / STARTUP.window_s)


def test_every_request_is_counted_once_when_its_prefill_is_done() -> None:
    """Nothing is lost or counted twice: once the flood's queue has drained, the decision's
    windows, which tile the replay every other decision, have counted every request that
    arrived before them, less only those still in prefill at the end."""
    w = _flood()
    seen = _seen(w, ev.DisaggPolicy)
    tiled = [o for o in seen if round(o.now / STARTUP.interval_s) % 2 == 1 and o.now <= 870.0]
    end = tiled[-1].now - STARTUP.scrape_s  # the last window's end
    assert tiled[0].now - STARTUP.scrape_s - STARTUP.window_s <= 0.0  # from the start, without gaps
    assert all(b.now - a.now == STARTUP.window_s for a, b in itertools.pairwise(tiled))
    counted = sum(o.count for o in tiled)
    assert np.count_nonzero(w.arrival_s < end - 5.0) <= counted <= np.count_nonzero(w.arrival_s < end)
    assert tiled[-1].queued < 5  # drained: a prefill takes well under 5 s again


def test_engine_counts_windows() -> None:
    counts = ev.EngineCounts()
    assert counts.prompt_stats(0.0, 10.0) == (0, None, None)
    for i in range(3000):  # past its first allocation
        counts.add(i * 0.01, 100.0 if i % 2 else 300.0)
    assert counts.n == 3000 and counts.times[-1] == pytest.approx(29.99)
    n, mean, std = counts.prompt_stats(10.0, 20.0)
    assert n == 1000 and mean == pytest.approx(200.0) and std == pytest.approx(100.0)
    assert counts.count(29.995, 40.0) == 0


def test_flow_conservation_gives_the_decision_the_arrivals_back() -> None:
    """The rate counted is the prefill pool's throughput, but the requests its engines hold
    uncounted grow by what arrived beyond it: the decision adds that growth (the arrivals
    the counts do not show yet) and plans for the flood's arrival rate, not its throughput."""
    w = _flood()
    records: list[autoscaler.DecisionRecord] = []
    seen = _seen(w, ev.DisaggPolicy, records)
    at = FLOOD_START + 45.0 + STARTUP.scrape_s
    k = next(k for k, o in enumerate(seen) if o.now == at)
    o, rec = seen[k], records[k]
    window_end = at - STARTUP.scrape_s
    arrived = np.count_nonzero((w.arrival_s >= window_end - STARTUP.window_s) & (w.arrival_s < window_end))
    assert o.rate < 0.3 * arrived / STARTUP.window_s  # what the engines counted
    assert o.arrival_pool_in_system > 500  # what they hold uncounted
    assert rec.arrival_rps == pytest.approx(arrived / STARTUP.window_s, rel=0.1)
    assert any("growth of the requests waiting" in n for n in rec.notes)


def test_each_count_with_its_growth_is_what_arrived() -> None:
    """The burst profile's counts are the pool's throughput under the flood (a few a second,
    then the drain); each with the growth over its sub-window of the requests arrived and not
    counted yet, they are the arrivals per sub-window, exactly, as the operator's in-system
    gauge gives them at its scrapes."""
    w = _flood()
    o = next(o for o in _seen(w, ev.DisaggPolicy) if o.now == FLOOD_START + 300.0)
    step = o.count_interval_s
    assert step is not None and o.arrival_counts is not None and o.arrival_counts_growth is not None
    end = o.now - STARTUP.scrape_s
    start = max(0.0, end - autoscaler.BURST_HORIZON_S)
    arrived = ev.arrival_counts(w.arrival_s, step, start, end)
    corrected = autoscaler.burstiness.arrivals_from_counts(o.arrival_counts, o.arrival_counts_growth)
    assert corrected == tuple(arrived)
    assert max(o.arrival_counts) < 0.5 * max(arrived)  # the counts alone: throughput, not the flood
    # the queue grew under the flood and fell as it drained
    assert min(o.arrival_counts_growth) < -50 and max(o.arrival_counts_growth) > 500


def test_arrivals_in_system_reads_the_growth_over_the_span() -> None:
    samples = ((0.0, 10.0), (30.0, 40.0), (60.0, 100.0))
    # over the window (60 s): from the sample at least that old
    assert arrivals_in_system(samples, 60.0, 130.0, 60.0) == pytest.approx((130.0 - 10.0) / 60.0)
    # a shorter span: the latest sample at least that old
    assert arrivals_in_system(samples, 90.0, 130.0, 45.0) == pytest.approx((130.0 - 40.0) / 60.0)
    # a queue draining: the growth is negative (the counts ran ahead of the arrivals)
    assert arrivals_in_system(samples, 90.0, 20.0, 60.0) == pytest.approx((20.0 - 40.0) / 60.0)
    # nothing old enough: the latest earlier one within twice the span, else none
    assert arrivals_in_system(((50.0, 0.0),), 60.0, 30.0, 60.0) == pytest.approx(3.0)
    assert arrivals_in_system((), 60.0, 30.0, 60.0) is None
    assert arrivals_in_system(((0.0, 0.0),), 200.0, 30.0, 60.0) is None


def test_the_in_system_samples_survive_a_restart() -> None:
    st = ScalerState(in_system=((1.0, 3.0), (31.0, 7.5)))
    assert ScalerState.from_dict(st.to_dict()).in_system == st.in_system
    assert ScalerState.from_dict({**st.to_dict(), "inSystem": "damaged"}).in_system == ()


def test_requests_shed_at_the_front_door_count_as_arrivals() -> None:
    """No engine sees a request the front door shed: its counter adds them to the rate the
    engines counted, so the share to admit is planned against all the load, not against what
    the last share let through (which would admit all of it again)."""
    config = autoscaler.config_from_spec(ev.spec_for(ev.replace(STARTUP, gpu_budget=4)))
    pools = {p: autoscaler.PoolObservation(replicas=2) for p in config.pools}
    obs = autoscaler.Observation(
        now=1000.0,
        metrics_ok=True,
        pools=pools,
        arrival_rps=8.0,
        prompt_tokens_mean=1500.0,
        output_tokens_mean=100.0,
        shed_rps=6.0,
    )
    seen = autoscaler.decide(config, obs, ScalerState()).record
    assert seen.arrival_rps == pytest.approx(14.0)
    assert any("shed at the front door" in n for n in seen.notes)
    unseen = autoscaler.decide(config, ev.replace(obs, shed_rps=None), ScalerState()).record
    assert unseen.arrival_rps == pytest.approx(8.0)
    assert seen.admitted_fraction < unseen.admitted_fraction


def test_the_emulators_front_door_keeps_the_contract_the_operator_reads() -> None:
    """The operator's query names the contract metric, per DisaggDeployment, for every engine."""
    from disagg import metrics, names

    for engine in ("vllm", "sglang"):
        qs = {
            q.name: q
            for q in metrics.build_queries(
                engine, "ns", "llm", ["prefill", "decode"], 60, 0.99, short_window_s=45
            )
        }
        for name, span in (("shed_rps", "60s"), ("shed_rps_short", "45s")):
            assert qs[name].promql == (
                f'sum(rate({names.METRIC_FRONT_DOOR_REJECTED}{{namespace="ns",deployment="llm"}}[{span}]))'
            )
            assert not qs[name].required  # no front door sheds: no series, nothing added
