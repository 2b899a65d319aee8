"""The issue-14 inputs on their way into the one decision: what the loop reads from
Prometheus (a failure is "missing", never zero) and what `autoscaler.sizing_inputs` makes of
an observation (switches, sub-window, too few counts, sub-Poisson readings)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from disagg import api, autoscaler, evaluate, loop
from disagg.evaluate import EvalSettings
from disagg.sizes import SizeDistribution

SETTINGS = EvalSettings(scrape_s=15.0, window_s=60.0)
ALL = {"requestSizes": True, "burstiness": True, "autoHeadroom": True}
PROMPT = [(500.0, 3.0), (2000.0, 4.0), (float("inf"), 5.0)]
OUTPUT = [(100.0, 2.0), (float("inf"), 5.0)]


def _hist(buckets):
    return [
        {"metric": {"le": "+Inf" if le == float("inf") else str(le)}, "value": [0, str(v)]}
        for le, v in buckets
    ]


def _series(values):
    return [{"metric": {}, "values": [[i * 30.0, str(v)] for i, v in enumerate(values)]}]


def _config(sizing: dict[str, bool] | None) -> autoscaler.Config:
    return autoscaler.config_from_spec(evaluate.spec_for(replace(SETTINGS, sizing=sizing)))


def _obs(**kw) -> autoscaler.Observation:
    return autoscaler.Observation(now=0.0, metrics_ok=True, pools={}, arrival_rps=1.0, **kw)


NO_GAIN = {"frontLoadGain": False, "errorBudget": False}


def test_queries_follow_the_switches() -> None:
    off = evaluate.spec_for(
        replace(
            SETTINGS, sizing={"requestSizes": False, "burstiness": False, "autoHeadroom": False, **NO_GAIN}
        )
    )
    assert loop.sizing_query_list(off, "ns", "x") == []
    on = evaluate.spec_for(replace(SETTINGS, sizing=ALL))
    qs = {q.name: q for q in loop.sizing_query_list(on, "ns", "x")}
    assert set(qs) == {
        "prompt_tokens_histogram",
        "prompt_tokens_sum_rate",
        "output_tokens_histogram",
        "output_tokens_sum_rate",
        "ttft_histogram",
        "prefill_queue_histogram",
        "prefill_queue_mean",
        "prefill_serving_window",
        "arrival_counts_horizon",
        "arrival_in_system_horizon",
        "arrival_shed_horizon",
    }
    # the front pool's queue waits (whether the prefill queue is what misses)
    assert qs["prefill_queue_histogram"].promql.startswith(
        "sum by (le) (rate(vllm:request_queue_time_seconds_bucket{"
    )
    assert qs["prefill_queue_histogram"].pool == "prefill"
    # their exact mean, and the front engines reporting at every scrape of the window (burstiness)
    assert qs["prefill_queue_mean"].promql.startswith("sum(rate(vllm:request_queue_time_seconds_sum{")
    assert qs["prefill_queue_mean"].pool == qs["prefill_serving_window"].pool == "prefill"
    assert qs["prefill_serving_window"].promql.startswith("(count(vllm:num_requests_running{")
    assert qs["prefill_serving_window"].promql.endswith(
        f"[{SETTINGS.window_s:.0f}s:{SETTINGS.scrape_s:.0f}s]"
    )
    # the back pool's TTFT buckets over the window, beside the token histograms
    assert qs["ttft_histogram"].promql.startswith(
        "sum by (le) (rate(vllm:time_to_first_token_seconds_bucket{"
    )
    sizes_only = evaluate.spec_for(
        replace(SETTINGS, sizing={"requestSizes": True, "burstiness": False, "autoHeadroom": False})
    )
    assert "ttft_histogram" in {q.name for q in loop.sizing_query_list(sizes_only, "ns", "x")}
    assert not {"prefill_queue_mean", "prefill_serving_window"} & {
        q.name for q in loop.sizing_query_list(sizes_only, "ns", "x")
    }
    headroom_only = evaluate.spec_for(
        replace(
            SETTINGS, sizing={"requestSizes": False, "burstiness": False, "autoHeadroom": True, **NO_GAIN}
        )
    )
    assert "ttft_histogram" not in {q.name for q in loop.sizing_query_list(headroom_only, "ns", "x")}
    # the error budget alone counts the TTFT histogram, read beside the token histograms
    budget_only = evaluate.spec_for(
        replace(
            SETTINGS,
            sizing={
                "requestSizes": False,
                "burstiness": False,
                "autoHeadroom": False,
                **NO_GAIN,
                "errorBudget": True,
            },
        )
    )
    budget_reads = {q.name for q in loop.sizing_query_list(budget_only, "ns", "x")}
    assert {"ttft_histogram", "prompt_tokens_histogram", "output_tokens_histogram"} <= budget_reads
    # counts per two scrapes (30 s) over the automatic headroom's hour, and the counted (front)
    # pool's waiting + running requests at the same steps from one step earlier (each count's growth)
    assert qs["arrival_counts_horizon"].promql.endswith("[3600s:30s]")
    in_system = qs["arrival_in_system_horizon"]
    assert in_system.promql.startswith("(sum(vllm:num_requests_waiting{")
    assert "+ sum(vllm:num_requests_running{" in in_system.promql
    assert in_system.promql.endswith("[3630s:30s]") and in_system.pool == "prefill"
    # and what this object's front door shed per sub-window, counted as the arrivals are
    shed = qs["arrival_shed_horizon"].promql
    assert 'disagg_front_door_rejected_requests_total{namespace="ns",deployment="x"}' in shed
    assert shed.startswith("(sum_over_time((sum (increase(") and shed.endswith("[3600s:30s]")
    assert all(not q.required for q in qs.values())


def test_under_the_conditional_placement_the_decode_pool_counts_and_holds_the_arrivals() -> None:
    """Short prompts never reach the prefill pool there: the prompt lengths, the counts and the
    requests held uncounted are the decode pool's, where the arrival rate is read."""
    cond = evaluate.spec_for(replace(SETTINGS, sizing=ALL), "conditional")
    qs = {q.name: q for q in loop.sizing_query_list(cond, "ns", "x")}
    for name in (
        "prompt_tokens_histogram",
        "prompt_tokens_sum_rate",
        "arrival_counts_horizon",
        "arrival_in_system_horizon",
    ):
        assert qs[name].pool == "decode", name
        assert 'pod=~"x-decode-' in qs[name].promql and "x-prefill" not in qs[name].promql, name
    assert qs["prefill_queue_histogram"].pool == "prefill"  # the prefill queue stays the prefill pool's
    rate = next(q for q in loop.object_queries(cond, "ns", "x") if q.name == "arrival_rps")
    assert rate.pool == qs["arrival_counts_horizon"].pool
    disagg = {
        q.name: q for q in loop.sizing_query_list(evaluate.spec_for(replace(SETTINGS, sizing=ALL)), "ns", "x")
    }
    assert disagg["arrival_counts_horizon"].pool == "prefill"


def test_readings_parse_and_failures_are_missing() -> None:
    good = loop.sizing_readings(
        {
            "prompt_tokens_histogram": _hist(PROMPT),
            "output_tokens_histogram": _hist(OUTPUT),
            "arrival_counts_horizon": _series([3, 4, 5]),
        },
        30.0,
    )
    assert good.sizes == SizeDistribution.from_buckets(PROMPT, OUTPUT)
    assert good.arrival_counts == (3.0, 4.0, 5.0) and good.count_interval_s == 30.0
    assert good.ttft_buckets is None  # not asked: missing
    ttft = [(0.5, 2.0), (1.0, 3.0), (float("inf"), 4.0)]
    with_ttft = loop.sizing_readings(
        {
            "prompt_tokens_histogram": _hist(PROMPT),
            "output_tokens_histogram": _hist(OUTPUT),
            "ttft_histogram": _hist(ttft),
        },
        30.0,
    )
    assert with_ttft.ttft_buckets == tuple(ttft) and with_ttft.sizes == good.sizes
    # a broken TTFT histogram is missing; the sizes still read. Without the sizes it is not read:
    # the quantile the front load gain takes of it needs the sizes' share of unreachable requests
    bad_ttft = loop.sizing_readings(
        {
            "prompt_tokens_histogram": _hist(PROMPT),
            "output_tokens_histogram": _hist(OUTPUT),
            "ttft_histogram": _hist([(0.5, 3.0), (float("inf"), 1.0)]),
        },
        30.0,
    )
    assert bad_ttft.ttft_buckets is None and bad_ttft.sizes == good.sizes and len(bad_ttft.problems) == 1
    no_sizes = loop.sizing_readings({"ttft_histogram": _hist(ttft)}, 30.0)
    assert no_sizes.ttft_buckets is None
    failed = loop.sizing_readings(
        {
            "prompt_tokens_histogram": RuntimeError("down"),
            "output_tokens_histogram": _hist(OUTPUT),
            "arrival_counts_horizon": [],
        },
        30.0,
    )
    assert failed.sizes is None and failed.arrival_counts is None and failed.count_interval_s is None
    assert any("down" in p for p in failed.problems)
    broken = loop.sizing_readings(
        {
            "prompt_tokens_histogram": _hist([(500.0, 3.0), (float("inf"), 1.0)]),  # not cumulative
            "output_tokens_histogram": _hist(OUTPUT),
            "arrival_counts_horizon": _series([1, float("nan")]),
        },
        30.0,
    )
    assert broken.sizes is None and broken.arrival_counts is None and len(broken.problems) == 2


def test_each_count_gets_the_growth_of_the_requests_held_over_its_sub_window() -> None:
    """The in-system gauge is read at the counts' steps from one step before the first: each
    count has the gauge's change over its own sub-window; a step the gauge lacks is unknown."""
    got = loop.sizing_readings(
        {
            "arrival_counts_horizon": _series([3, 4, 5, 6]),  # at 0, 30, 60, 90 s
            # at -30, 0, 30 and 90 s: the one at 60 s is missing
            "arrival_in_system_horizon": [
                {"metric": {}, "values": [[-30.0, "2"], [0.0, "7"], [30.0, "4"], [90.0, "1"]]}
            ],
        },
        30.0,
    )
    assert got.arrival_counts == (3.0, 4.0, 5.0, 6.0)
    assert got.arrival_counts_growth == (5.0, -3.0, None, None)
    assert got.arrival_counts_shed is None  # no series: the front door shed nothing
    assert autoscaler.burstiness.arrivals_from_counts(got.arrival_counts, got.arrival_counts_growth) == (
        8.0,
        1.0,
        5.0,
        6.0,
    )
    # the front door's shed requests per sub-window are arrivals too (a step without a point: unknown)
    shed = loop.sizing_readings(
        {
            "arrival_counts_horizon": _series([3, 4, 5, 6]),
            "arrival_shed_horizon": [{"metric": {}, "values": [[0.0, "2"], [60.0, "7"], [90.0, "0"]]}],
        },
        30.0,
    )
    assert shed.arrival_counts_shed == (2.0, None, 7.0, 0.0) and shed.arrival_counts_growth is None
    assert autoscaler.burstiness.arrivals_from_counts(
        got.arrival_counts, got.arrival_counts_growth, shed.arrival_counts_shed
    ) == (10.0, 1.0, 12.0, 6.0)
    # a failed gauge query: the counts as they are, the problem said
    failed = loop.sizing_readings(
        {"arrival_counts_horizon": _series([3, 4]), "arrival_in_system_horizon": RuntimeError("down")}, 30.0
    )
    assert failed.arrival_counts == (3.0, 4.0) and failed.arrival_counts_growth is None
    assert any("down" in p for p in failed.problems)


def test_the_burst_profile_reads_the_arrivals_not_the_drain() -> None:
    """A burst that doubles the traffic queues at the counted pool until capacity arrives a
    start-up later, and then drains: the engines count the pool's throughput (flat, then three
    times the level while the queue drains). Read as arrivals, the drain is a rise of 3x the
    level within a start-up; with each count's growth of the queue, the decision reads the
    rise the traffic made (2x) and stands ready for that."""
    base, hour = 60.0, 120  # 30 s counts
    arrived, counted, growth = [], [], []
    queue = 0.0
    for k in range(hour):
        phase = k % 40  # a burst of four sub-windows every 20 minutes
        a = 2 * base if 30 <= phase < 34 else base
        capacity = 3 * base if 32 <= phase < 36 else base  # added a minute into the burst
        done = min(capacity, queue + a)
        arrived.append(a)
        counted.append(done)
        growth.append(a - done)
        queue += a - done
    config = _config(ALL)
    raw = autoscaler.sizing_inputs(config, _obs(arrival_counts=tuple(counted), count_interval_s=30.0), 60.0)
    flow = autoscaler.sizing_inputs(
        config,
        _obs(arrival_counts=tuple(counted), arrival_counts_growth=tuple(growth), count_interval_s=30.0),
        60.0,
    )
    truth = autoscaler.sizing_inputs(config, _obs(arrival_counts=tuple(arrived), count_interval_s=30.0), 60.0)
    assert flow == truth
    assert truth.auto_headroom is not None and raw.auto_headroom is not None
    assert truth.auto_headroom < raw.auto_headroom


def test_inputs_follow_switches_and_never_read_missing_as_smooth() -> None:
    sizes = SizeDistribution.from_buckets(PROMPT, OUTPUT)
    bursty = tuple([10.0, 10.0, 90.0, 90.0] * 30)  # 2 h of 30 s counts, on/off
    got = autoscaler.sizing_inputs(
        _config(ALL), _obs(sizes=sizes, arrival_counts=bursty, count_interval_s=30.0), 60.0
    )
    assert got.sizes is sizes
    assert got.dispersion is not None and got.dispersion > 10
    # bursts of 9x the low rate, beyond the headroom's cap: the rate they reach stands (3 req/s
    # less its counting noise), beside the headroom read from the other rises
    assert got.auto_headroom is not None
    assert got.burst_floor_rps is not None and 2.0 < got.burst_floor_rps <= 3.0
    off = autoscaler.sizing_inputs(
        _config({"requestSizes": False, "burstiness": False, "autoHeadroom": False}),
        _obs(sizes=sizes, arrival_counts=bursty, count_interval_s=30.0),
        60.0,
    )
    assert off == autoscaler.SizingInputs()
    # counts at another resolution than the decision's sub-window, or too few: missing
    other = autoscaler.sizing_inputs(_config(ALL), _obs(arrival_counts=bursty, count_interval_s=15.0), 60.0)
    assert other.dispersion is None and other.auto_headroom is None
    one = autoscaler.sizing_inputs(_config(ALL), _obs(arrival_counts=(5.0,), count_interval_s=30.0), 60.0)
    assert one.dispersion is None and one.auto_headroom is None
    # two counts are one pair: the dispersion is measured (at least Poisson), not the headroom
    few = autoscaler.sizing_inputs(_config(ALL), _obs(arrival_counts=(5.0, 7.0), count_interval_s=30.0), 60.0)
    assert few.dispersion == pytest.approx(1.0) and few.auto_headroom is None
    first = autoscaler.sizing_inputs(
        _config(ALL), _obs(arrival_counts=(10.0, 200.0), count_interval_s=30.0), 60.0
    )
    assert first.dispersion == pytest.approx(190**2 / 210 / 3.8415, rel=1e-3)  # the 95 % bound
    # a sub-Poisson reading (perfectly regular counts) is planned as Poisson, not as smooth
    regular = autoscaler.sizing_inputs(
        _config(ALL), _obs(arrival_counts=(30.0,) * 40, count_interval_s=30.0), 60.0
    )
    assert regular.dispersion == pytest.approx(1.0)


def test_demand_carries_sizes_and_dispersion() -> None:
    sizes = SizeDistribution.from_buckets(PROMPT, OUTPUT)
    obs = _obs(prompt_tokens_mean=900.0, output_tokens_mean=50.0)
    plain = autoscaler.demand_for(obs, 2.0, {})
    assert plain.sizes is None and plain.arrival_ca2 == 1.0 and plain.prompt_tokens_mean == 900.0
    d = autoscaler.demand_for(obs, 2.0, {}, autoscaler.SizingInputs(sizes=sizes, dispersion=4.0))
    assert d.sizes is sizes and d.arrival_ca2 == 4.0
    assert (d.prompt_tokens_mean, d.prompt_tokens_std) == pytest.approx(sizes.prompt_mean_std)


def test_spec_defaults_are_the_documented_ones() -> None:
    s = api.Autoscaling().sizing
    assert (s.request_sizes, s.burstiness, s.auto_headroom) == (
        api.SIZING_REQUEST_SIZES_DEFAULT,
        api.SIZING_BURSTINESS_DEFAULT,
        api.SIZING_AUTO_HEADROOM_DEFAULT,
    )


def test_by_default_the_loop_reads_the_counts_and_what_the_front_gain_judges_by() -> None:
    """Default: automatic headroom on (its counts are read) and the front load gain on (the
    token, TTFT and prefill queue-time histograms: which requests are in reach, and whether
    the prefill queue is what makes them miss), and burstiness on (the same counts' index of
    dispersion in Allen-Cunneen, and the prefill queue's mean wait and serving count for the
    arrival term its waits show); request sizes off, so the plan keeps the means."""
    spec = evaluate.spec_for(SETTINGS)
    assert sorted(q.name for q in loop.sizing_query_list(spec, "ns", "x")) == [
        "arrival_counts_horizon",
        "arrival_in_system_horizon",
        "arrival_shed_horizon",
        "output_tokens_histogram",
        "output_tokens_sum_rate",
        "prefill_queue_histogram",
        "prefill_queue_mean",
        "prefill_serving_window",
        "prompt_tokens_histogram",
        "prompt_tokens_sum_rate",
        "ttft_histogram",
    ]
    sized = _obs(
        prompt_tokens_mean=1000.0,
        output_tokens_mean=100.0,
        sizes=SizeDistribution.from_buckets(PROMPT, OUTPUT),
    )
    assert autoscaler.sizing_inputs(autoscaler.config_from_spec(spec), sized, 60.0).sizes is None
    # batches of about 8 in every 30 s count: the default plans with their dispersion
    batched = tuple(8.0 * np.random.default_rng(3).poisson(5.0, 40))
    inputs = autoscaler.sizing_inputs(
        autoscaler.config_from_spec(spec), _obs(arrival_counts=batched, count_interval_s=30.0), 60.0
    )
    assert inputs.dispersion == pytest.approx(8.0, rel=0.4)


def test_the_decision_record_shows_the_inputs_it_used() -> None:
    """status.lastDecision.inputs carries the dispersion, automatic headroom and size classes."""
    cfg = _config(ALL)
    bursty = tuple([10.0, 10.0, 90.0, 90.0] * 30)
    obs = autoscaler.Observation(
        now=0.0,
        metrics_ok=True,
        pools={},
        arrival_rps=2.0,
        prompt_tokens_mean=1000.0,
        output_tokens_mean=100.0,
        sizes=SizeDistribution.from_buckets(PROMPT, OUTPUT),
        arrival_counts=bursty,
        count_interval_s=30.0,
    )
    got = autoscaler.decide(cfg, obs, autoscaler.ScalerState()).record.to_status()["inputs"]
    assert got["arrivalDispersion"] > 10 and "autoHeadroom" in got and got["sizeClasses"] > 1
    # the counts end in a rise from 10 to 90 per sub-window: the least window mean over the last
    # window is 20 against 180 now (burstiness.before_rise)
    assert got["beforeRise"] == pytest.approx(20.0 / 180.0, abs=1e-4)
    plain = autoscaler.decide(
        cfg, replace(obs, sizes=None, arrival_counts=None), autoscaler.ScalerState()
    ).record.to_status()["inputs"]
    assert not {"arrivalDispersion", "autoHeadroom", "beforeRise", "sizeClasses", "burstFloorRps"} & set(
        plain
    )
    # on/off whose bursts are 9x its low level stands ready for the rate they reach (3 req/s
    # less counting noise); so does traffic that stopped, for the rate it stopped from (4 req/s
    # from 120 counts of 30 s, then 10 minutes of nothing), and the plan is for it
    assert 2.0 < got["burstFloorRps"] <= 3.0
    stopped = tuple([120.0] * 100 + [0.0] * 20)
    quiet = autoscaler.decide(
        cfg, replace(obs, arrival_rps=0.0, arrival_counts=stopped), autoscaler.ScalerState()
    ).record.to_status()["inputs"]
    assert 2.5 < quiet["burstFloorRps"] <= 4.0  # less its counting noise
    assert quiet["plannedRps"] >= quiet["burstFloorRps"]


def test_a_deployments_first_pair_of_bursty_counts_raises_its_plan() -> None:
    """Two counts (one minute) of clustered arrivals plan more prefill than as many smooth ones."""
    cfg = autoscaler.config_from_spec(evaluate.spec_for(SETTINGS))  # the spec's defaults

    def prefill(counts: tuple[float, ...]) -> tuple[int, float | None]:
        obs = autoscaler.Observation(
            now=0.0,
            metrics_ok=True,
            pools={},
            arrival_rps=sum(counts) / 60.0,
            prompt_tokens_mean=3000.0,
            output_tokens_mean=100.0,
            arrival_counts=counts,
            count_interval_s=30.0,
        )
        out = autoscaler.decide(cfg, obs, autoscaler.ScalerState())
        return out.targets["prefill"], out.record.arrival_dispersion

    smooth, smooth_disp = prefill((235.0, 245.0))
    clustered, clustered_disp = prefill((60.0, 420.0))
    assert smooth_disp == pytest.approx(1.0) and clustered_disp == pytest.approx(
        360**2 / 480 / 3.8415, rel=1e-3
    )
    assert clustered > smooth
