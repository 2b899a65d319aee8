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

from disagg import evaluate as ev
from disagg.workload import Workload, piecewise_poisson

STARTUP = ev.with_startup(ev.EvalSettings(), 60.0)
FLOOD_START, FLOOD_S, FLOOD_RPS = 300.0, 30.0, 40.0


def _seen(w: Workload, policy: type[ev.Policy]) -> list[ev.Obs]:
    """Every observation `policy` decides on while `w` is replayed."""
    seen: list[ev.Obs] = []

    class Recording(policy):  # type: ignore[valid-type,misc]
        def decide(self, o: ev.Obs) -> tuple[dict[str, int], str]:
            seen.append(o)
            return super().decide(o)

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
    # shed at the front door: counted (its counter), no prompt length on record
    counts.add(30.0, None)
    counts.add(30.5, None)
    assert counts.prompt_stats(30.0, 31.0) == (2, None, None)
    assert counts.prompt_stats(29.985, 31.0) == (3, 100.0, 0.0)
