"""Output lengths as the engines report them: counted when a request finishes.

`disagg evaluate` shows a decision the output lengths of the requests finished in its window
(the decode pool's generation-tokens histogram), not those of the requests that arrived in it,
and the decision weighs a window's token shape by the requests it was read from
(`autoscaler.weighed_shape`), so the stragglers of a burst do not size the decode pool.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from fakes import decisions_seen

from disagg import autoscaler
from disagg import evaluate as ev
from disagg.sizes import SizeDistribution
from disagg.workload import Workload, piecewise_poisson

STARTUP = ev.with_startup(ev.EvalSettings(), 60.0)


def test_a_shift_to_long_outputs_shows_when_those_requests_finish() -> None:
    """2 req/s with 20-token outputs, then 1,500-token outputs from 300 s: the long requests
    take a minute or more to decode, so the first windows after the shift still show short
    outputs, and only then the long ones, as the engines' histograms would."""
    rng = np.random.default_rng(5)
    t = piecewise_poisson([(300.0, 2.0), (300.0, 2.0)], rng)
    w = Workload(t, np.full(t.size, 500), np.where(t < 300.0, 20, 1500), name="output-shift")
    seen = {round(o.now): o for o in decisions_seen(w, STARTUP)}
    before, just_after, later = seen[270], seen[330], seen[480]
    assert before.output_mean == pytest.approx(20.0)
    assert before.output_finished_rps == pytest.approx(2.0, rel=0.3)  # what the window counted
    # the window [255, 315) holds ~30 arrivals of the long kind, none of them finished yet
    assert just_after.output_mean == pytest.approx(20.0)
    assert later.output_mean > 1000.0


def test_a_window_that_finished_nothing_shows_no_output_lengths() -> None:
    """The decision is given none (it holds its last shape), as an engine's empty histogram."""
    o = ev.Obs(
        now=100.0,
        rate=0.0,
        count=0,
        prompt_mean=1000.0,
        prompt_std=0.0,
        output_mean=200.0,
        output_std=10.0,
        util={},
        ready={},
        requested={"prefill": 1, "decode": 1},
        pending={},
        ttft_p=None,
        output_finished_rps=0.0,
    )
    seen = ev.observation_from(o, 60.0)
    assert seen.output_tokens_mean is None and seen.output_tokens_std is None
    counted = ev.observation_from(ev.replace(o, output_finished_rps=0.5), 60.0)
    assert counted.output_tokens_mean == 200.0 and counted.output_finished_rps == 0.5


def _obs(mean: float, std: float, finished_rps: float | None) -> autoscaler.Observation:
    return autoscaler.Observation(
        now=0.0,
        metrics_ok=True,
        pools={},
        output_tokens_mean=mean,
        output_tokens_std=std,
        output_finished_rps=finished_rps,
    )


def test_one_straggler_moves_the_output_shape_by_its_weight() -> None:
    """A window that finished one 2,000-token request, after a shape of 30-token outputs:
    the mixture of the two, one request against `SHAPE_PRIOR_REQUESTS`."""
    k = autoscaler.SHAPE_PRIOR_REQUESTS
    shape = {"output_tokens_mean": 30.0}
    seen, _ = autoscaler.weighed_shape(_obs(2000.0, 0.0, 1 / 60), autoscaler.SizingInputs(), shape, 60.0)
    a = 1 / (1 + k)
    mean = a * 2000.0 + (1 - a) * 30.0
    assert seen.output_tokens_mean == pytest.approx(mean)
    assert seen.output_tokens_mean < 150.0
    assert seen.output_tokens_std == pytest.approx(math.sqrt(a * 2000.0**2 + (1 - a) * 30.0**2 - mean**2))
    assert shape["output_tokens_std"] == pytest.approx(seen.output_tokens_std)
    # a busy window (1,000 requests) sets the shape nearly alone
    shape = {"output_tokens_mean": 30.0}
    busy, _ = autoscaler.weighed_shape(_obs(2000.0, 0.0, 1000 / 60), autoscaler.SizingInputs(), shape, 60.0)
    assert busy.output_tokens_mean == pytest.approx((1000 * 2000.0 + k * 30.0) / (1000 + k))
    # no count (an engine without the histogram) or no shape yet: the window's, as read
    for finished, last in ((None, {"output_tokens_mean": 30.0}), (1 / 60, {})):
        same, _ = autoscaler.weighed_shape(_obs(2000.0, 5.0, finished), autoscaler.SizingInputs(), last, 60.0)
        assert same.output_tokens_mean == 2000.0 and same.output_tokens_std == 5.0


def test_a_quiet_windows_prompts_are_weighed_by_their_count_too() -> None:
    """The prompt histogram's count is the arrival rate: one 7,000-token prompt in a window
    after a shape of 2,000-token prompts moves it by one request's weight."""
    k = autoscaler.SHAPE_PRIOR_REQUESTS
    obs = autoscaler.Observation(
        now=0.0,
        metrics_ok=True,
        pools={},
        arrival_rps=1 / 60,
        prompt_tokens_mean=7000.0,
        prompt_tokens_std=0.0,
    )
    shape = {"prompt_tokens_mean": 2000.0, "prompt_tokens_std": 500.0}
    seen, _ = autoscaler.weighed_shape(obs, autoscaler.SizingInputs(), shape, 60.0)
    assert seen.prompt_tokens_mean == pytest.approx((7000.0 + k * 2000.0) / (1 + k))
    assert seen.output_tokens_mean is None  # no output lengths in the window: held by demand_for
    d = autoscaler.demand_for(seen, 5.0, shape)
    assert d.prompt_tokens_mean == pytest.approx(seen.prompt_tokens_mean)
    assert shape["prompt_tokens_mean"] == pytest.approx(seen.prompt_tokens_mean)  # the next one's prior


def test_with_a_size_distribution_the_last_shape_is_one_more_output_class() -> None:
    window = SizeDistribution.from_samples(np.full(40, 1000.0), np.full(40, 2000.0))
    shape = {"output_tokens_mean": 30.0, "output_tokens_std": 4.0}
    _, inputs = autoscaler.weighed_shape(
        _obs(2000.0, 0.0, 2 / 60), autoscaler.SizingInputs(sizes=window), shape, 60.0
    )
    mixed = inputs.sizes
    assert mixed is not None and len(mixed.output_tokens) == len(window.output_tokens) + 1
    a = 2 / (2 + autoscaler.SHAPE_PRIOR_REQUESTS)
    assert mixed.output_mean_std[0] == pytest.approx(a * 2000.0 + (1 - a) * 30.0)
    assert mixed.prompt_tokens == window.prompt_tokens  # the prompt classes are the window's


def _stragglers() -> Workload:
    """Every 5 minutes 150 requests of 20 output tokens within 30 s, and one of 3,000 tokens
    that finishes a minute or more after them, alone in a quiet window."""
    rng = np.random.default_rng(3)
    arrival, output = [], []
    for k in range(12):
        arrival += [*(300.0 * k + rng.uniform(0, 30, 150)), 300.0 * k + 5.0]
        output += [20] * 150 + [3000]
    order = np.argsort(arrival, kind="stable")
    n = len(arrival)
    return Workload(np.array(arrival)[order], np.full(n, 1000), np.array(output)[order], name="stragglers")


def test_the_stragglers_of_a_burst_do_not_size_the_decode_pool(monkeypatch) -> None:
    w = _stragglers()
    weighed = ev.run_policy("disagg", w, STARTUP)
    monkeypatch.setattr(autoscaler, "SHAPE_PRIOR_REQUESTS", 0.0)  # each window's shape alone
    alone = ev.run_policy("disagg", w, STARTUP)
    peak = {
        name: max(p["replicas"]["decode"] for p in r.timeline) for name, r in (("w", weighed), ("a", alone))
    }
    assert peak["w"] <= 3 < 6 <= peak["a"]  # read alone, one 3,000-token request asked for many
    assert weighed.metrics["slo_attainment"] >= 0.99
    assert weighed.metrics["gpu_hours"] < 0.6 * alone.metrics["gpu_hours"]
