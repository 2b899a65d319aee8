"""The yardstick: hindsight oracle, best fixed fleet, curve interpolation, the Dynamo baseline's rule."""

from __future__ import annotations

import io
import itertools
import math
from collections.abc import Callable
from dataclasses import replace

import numpy as np
import pytest

from disagg import baselines, yardstick
from disagg.baselines import (
    DynamoMetrics,
    dynamo_budget,
    dynamo_corrections,
    dynamo_decode_replicas,
    dynamo_encoder_budget,
    dynamo_encoder_replicas,
    dynamo_prefill_replicas,
    keda_desired,
)
from disagg.commands.evaluate import print_equal_attainment
from disagg.evaluate import EvalSettings, evaluate, run_policy
from disagg.model import DecodeModel, PrefillModel, StageModels
from disagg.monotone import smallest_passing
from disagg.workload import Workload, piecewise_poisson, poisson

SMALL = EvalSettings(startup_s=30.0, stabilization_s=120.0, timeline_points=50)


@pytest.fixture(scope="module")
def bursty() -> Workload:
    """Eight minutes: quiet minutes beside 2-minute bursts of long prompts, short outputs."""
    rng = np.random.default_rng(7)
    arrivals = piecewise_poisson([(60.0, 1.0), (120.0, 14.0), (120.0, 1.0), (120.0, 10.0), (60.0, 0.5)], rng)
    n = arrivals.shape[0]
    prompt = rng.integers(1000, 4000, size=n)
    output = rng.integers(20, 120, size=n)
    return Workload(arrivals, prompt, output, name="bursty")


@pytest.fixture(scope="module")
def doc(bursty: Workload) -> dict:
    names = ["disagg", "static", "hpa", "throughput", "dynamo", "keda", "planner-foresight"]
    return evaluate(bursty, names, SMALL)


# --------------------------------------------------------------------------- hindsight references


def test_oracle_is_cheapest_at_its_attainment(doc: dict) -> None:
    oracle = doc["references"]["oracle"]
    assert oracle["slo_attainment"] >= SMALL.target_attainment - 0.005
    rivals = {name: m for name, m in doc["policies"].items()}
    rivals["best_static"] = doc["references"]["best_static"]
    at_least_as_good = 0
    for name, m in rivals.items():
        if m["slo_attainment"] >= oracle["slo_attainment"]:
            at_least_as_good += 1
            assert oracle["gpu_hours"] <= m["gpu_hours"] + 1e-9, name
    assert at_least_as_good >= 1  # the comparison is not empty (best-static reaches the target)


def test_oracle_reports_its_search(doc: dict) -> None:
    o = doc["references"]["oracle"]
    assert o["simulations"] > 0
    assert o["replicas_max"]["prefill"] >= 2  # the bursts need more than one prefill worker
    assert doc["policies"]["planner-foresight"]["gpu_hours_vs_oracle"] is not None


def test_best_static_is_the_fewest_fixed_workers(bursty: Workload) -> None:
    target = SMALL.target_attainment
    trials: yardstick.FleetTrials = {}
    sizes, stats = yardstick.best_static(bursty, SMALL, trials=trials)
    assert stats.reached and stats.simulations > 0
    again, stats2 = yardstick.best_static(bursty, SMALL, trials=trials)  # a second search shares the trials
    assert again == sizes and stats2.simulations == 0
    assert yardstick.fixed_fleet_metrics(bursty, SMALL, sizes)["slo_attainment"] >= target
    for pool in ("prefill", "decode"):
        fewer = dict(sizes, **{pool: sizes[pool] - 1})
        if fewer[pool] >= 1:
            assert yardstick.fixed_fleet_metrics(bursty, SMALL, fewer)["slo_attainment"] < target, pool
    # the frontier sweep settled every fleet: with p prefill workers, the most decode workers
    # that still cost fewer GPUs miss the target (so, by monotonicity, does any fewer)
    assert stats.frontier == {"complete": True, "trials": stats.frontier["trials"]}
    total = sizes["prefill"] + sizes["decode"]
    for p in range(1, total - 1):
        cheaper = {"prefill": p, "decode": total - 1 - p}
        assert yardstick.fixed_fleet_metrics(bursty, SMALL, cheaper)["slo_attainment"] < target, cheaper


def test_the_frontier_sweep_under_a_gpu_budget_stays_within_it(bursty: Workload) -> None:
    """The sweep's bounds try fleets over the budget (monotonicity still holds there); what it
    returns costs no more than the fleet the search found within the budget."""
    free, _ = yardstick.best_static(bursty, SMALL)
    budget = yardstick._gpus(SMALL, free) + 1
    s = replace(SMALL, gpu_budget=budget)
    sizes, stats = yardstick.best_static(bursty, s)
    assert stats.reached and stats.frontier is not None and stats.frontier["complete"]
    assert yardstick._gpus(s, sizes) == yardstick._gpus(SMALL, free) <= budget


def test_the_oracle_under_a_gpu_budget_never_holds_more_gpus_than_it(bursty: Workload) -> None:
    """A budget too small for the bursts: the search's schedule misses the target, and its
    repair (every interval's pools grown) must grow only within the budget, not reach the
    target with GPUs no policy was allowed."""
    budget = 3
    s = replace(SMALL, gpu_budget=budget)
    h = yardstick.hindsight_oracle(bursty, s, fixed_floor=False)
    assert max(yardstick._gpus(s, x) for x in h.schedule) <= budget
    assert sum(h.oracle.metrics["replicas_max"].values()) <= budget
    assert h.oracle.metrics["slo_attainment"] < s.target_attainment  # 3 GPUs cannot serve the bursts


def test_json_references_and_equal_attainment(doc: dict) -> None:
    refs = doc["references"]
    assert set(refs) == {"oracle", "best_static", "fluid_bound"}
    assert set(refs["best_static"]["replicas"]) == {"prefill", "decode"}
    assert refs["best_static"]["frontier"]["complete"] is True
    text = io.StringIO()
    print_equal_attainment(doc, text)
    assert "no cheaper fixed fleet passes (every prefill count swept)" in text.getvalue()
    for m in doc["policies"].values():
        assert set(m["gpu_hours_at"]) == {"0.95", "0.99"}
        for k, h in m["gpu_hours_at"].items():
            # without curves: the default run's GPU-hours where it reaches the attainment, else not reached
            assert h == (m["gpu_hours"] if m["slo_attainment"] >= float(k) else None)


def test_curves_sweep_the_knob(bursty: Workload) -> None:
    d = evaluate(bursty, ["static"], SMALL, curves=True, best_static=False)
    pts = d["policies"]["static"]["curve"]
    assert [p["value"] for p in pts] == list(yardstick.KNOBS["static"][1])
    assert sum(1 for p in pts if p.get("default")) == 1
    hours = [p["gpu_hours"] for p in pts]
    assert hours == sorted(hours) and hours[0] < hours[-1]  # a bigger peak plan costs more
    assert d["policies"]["static"]["gpu_hours_at"]["0.95"] == yardstick.gpu_hours_at(pts, 0.95)


def test_disagg_curve_sweeps_the_percentile_it_plans_at(bursty: Workload) -> None:
    d = evaluate(bursty, ["disagg"], SMALL, curves=True, best_static=False)
    pts = d["policies"]["disagg"]["curve"]
    assert [p["value"] for p in pts] == list(yardstick.KNOBS["disagg"][1])
    assert all(p["knob"] == "slo.percentile" for p in pts)
    (default,) = [p for p in pts if p.get("default")]
    assert default["value"] == SMALL.slo.percentile
    assert default["gpu_hours"] == d["policies"]["disagg"]["gpu_hours"]
    # planning for fewer of the requests needs fewer GPUs: the curve has cheaper points
    assert pts[0]["gpu_hours"] < default["gpu_hours"] <= pts[-1]["gpu_hours"]


def test_with_knob_sets_a_nested_setting_and_keeps_the_rest() -> None:
    s = yardstick.with_knob(SMALL, "slo.percentile", 0.95)
    assert yardstick.knob_value(s, "slo.percentile") == 0.95
    assert s.slo.ttft_s == SMALL.slo.ttft_s and s.startup_s == SMALL.startup_s
    assert yardstick.with_knob(SMALL, "headroom", 0.5).headroom == 0.5


# --------------------------------------------------------------------------- media: the encoder pool


@pytest.fixture(scope="module")
def media() -> Workload:
    """Five minutes at 8 rps, 60 % with eight images: 4.8 x (15 + 8 x 25) ms = 1.03 busy encoders."""
    return poisson(
        8.0, 300.0, prompt_tokens=1000, output_tokens=60, media_fraction=0.6, media_items=8, seed=5
    )


@pytest.fixture(scope="module")
def media_doc(media: Workload) -> dict:
    return evaluate(media, ["dynamo", "keda"], SMALL)


def test_media_oracle_and_best_static_size_the_encoder(media_doc: dict) -> None:
    refs = media_doc["references"]
    oracle, fixed = refs["oracle"], refs["best_static"]
    assert set(oracle["replicas_max"]) == set(fixed["replicas"]) == {"encoder", "prefill", "decode"}
    assert oracle["replicas_max"]["encoder"] >= 2  # one encoder cannot carry 1.03 busy encoders' work
    assert fixed["replicas"]["encoder"] >= 2
    for ref in (oracle, fixed):
        assert ref["slo_attainment"] >= SMALL.target_attainment - 0.005
        assert ref["lost_requests"] == 0
    text = io.StringIO()
    print_equal_attainment(media_doc, text)
    r = fixed["replicas"]
    assert f"best fixed fleet: {r['encoder']}E+{r['prefill']}P+{r['decode']}D," in text.getvalue()
    assert "fluid bound (no schedule needs less):" in text.getvalue()


def test_media_baselines_size_the_encoder(media_doc: dict) -> None:
    for name in ("dynamo", "keda"):
        tl = media_doc["policies"][name]["timeline"]
        assert all(set(x["replicas"]) == {"encoder", "prefill", "decode"} for x in tl), name
    # Dynamo from its first adjustment: ~900 media requests x 8 items per 180 s = 40 items/s;
    # a GPU encodes 8 items in 215 ms, 37.2 items/s: ceil(1.08) = 2 encoders
    after = [x["replicas"]["encoder"] for x in media_doc["policies"]["dynamo"]["timeline"] if x["t"] >= 180.0]
    assert after and set(after) == {2}
    # KEDA: the encoder queue (3 requests per replica) grows past one worker's share
    assert max(x["replicas"]["encoder"] for x in media_doc["policies"]["keda"]["timeline"]) >= 2


def test_media_best_static_one_encoder_fewer_fails(media: Workload) -> None:
    target = SMALL.target_attainment
    sizes, stats = yardstick.best_static(media, SMALL)
    assert stats.reached and set(sizes) == {"encoder", "prefill", "decode"}
    assert sizes["encoder"] >= 2
    assert yardstick.fixed_fleet_metrics(media, SMALL, sizes)["slo_attainment"] >= target
    fewer = dict(sizes, encoder=sizes["encoder"] - 1)
    assert yardstick.fixed_fleet_metrics(media, SMALL, fewer)["slo_attainment"] < target


def test_text_only_searches_no_encoder(bursty: Workload) -> None:
    schedule, _stats = yardstick.oracle_schedule(bursty, SMALL)
    assert all(set(x) == {"prefill", "decode"} for x in schedule)


# --------------------------------------------------------------------------- curve interpolation


def test_gpu_hours_at_interpolates_on_the_frontier() -> None:
    pts = [
        {"gpu_hours": 1.0, "slo_attainment": 0.90},
        {"gpu_hours": 2.5, "slo_attainment": 0.97},  # dominated by the 2.0 point: ignored
        {"gpu_hours": 2.0, "slo_attainment": 0.98},
        {"gpu_hours": 3.0, "slo_attainment": 1.0},
        {"gpu_hours": 4.0, "slo_attainment": None},
    ]
    assert yardstick.gpu_hours_at(pts, 0.95) == pytest.approx(1.0 + 0.05 / 0.08 * 1.0)
    assert yardstick.gpu_hours_at(pts, 0.99) == pytest.approx(2.5)
    assert yardstick.gpu_hours_at(pts, 0.85) == pytest.approx(1.0)  # no extrapolation below
    assert yardstick.gpu_hours_at(pts[:3], 0.99) is None  # never reached
    assert yardstick.gpu_hours_at([], 0.95) is None


def test_smallest_passing_finds_the_threshold_with_few_tests() -> None:
    for threshold in (1, 2, 7, 30):
        for guess in (1, 5, 40):
            calls: list[int] = []

            def ok(n: int, threshold: int = threshold, calls: list[int] = calls) -> bool:
                calls.append(n)
                return n >= threshold

            assert smallest_passing(ok, guess, 64) == threshold
            assert len(calls) <= 2 * math.ceil(math.log2(64)) + 2


# --------------------------------------------------------------------------- Dynamo's rule, by hand

MODELS = StageModels(prefill=PrefillModel(20.0, 0.035), decode=DecodeModel(45.0, 0.5, 32))


def test_dynamo_prefill_by_hand() -> None:
    # 3,600 requests of 2,000 tokens in 180 s: 40,000 tokens/s; one GPU prefills
    # 2,000 tokens in 20 + 70 = 90 ms: 22,222 tokens/s -> ceil(1.8) = 2
    assert dynamo_prefill_replicas(3600, 2000, 1.8, 180.0, MODELS) == 2
    # a correction factor below 1 (TTFT better than profiled) lowers the demand: ceil(0.9) = 1
    assert dynamo_prefill_replicas(3600, 2000, 0.5, 180.0, MODELS) == 1
    # two GPUs per replica: 11,111 tokens/s per GPU, / 2 GPUs -> ceil(1.8) = 2 replicas
    assert dynamo_prefill_replicas(3600, 2000, 1.0, 180.0, MODELS, gpus_per_replica=2) == 2
    assert dynamo_prefill_replicas(0, 2000, 1.0, 180.0, MODELS) == 1  # at least min_endpoint


def test_dynamo_decode_by_hand() -> None:
    # 3,600 x 200 tokens / 180 s = 4,000 tokens/s. ITL 150 ms / d_cf 1.5 = 100 ms fits the
    # full 32-slot batch (step 45 + 16 = 61 ms): 524.6 tokens/s per GPU -> ceil(7.62) = 8
    assert dynamo_decode_replicas(3600, 2000, 200, 1.5, 180.0, MODELS, 150.0) == 8
    # d_cf 3: 50 ms fits a batch of 10 (step 50 ms): 200 tokens/s -> 20 replicas
    assert dynamo_decode_replicas(3600, 2000, 200, 3.0, 180.0, MODELS, 150.0) == 20
    # no batch meets 150 / 4 = 37.5 ms (the step alone is 45 ms): min_endpoint
    assert dynamo_decode_replicas(3600, 2000, 200, 4.0, 180.0, MODELS, 150.0) == 1


def test_dynamo_corrections_by_hand() -> None:
    m = DynamoMetrics(num_req=3600, isl=2000, osl=200, ttft_ms=180.0, itl_ms=91.5, request_duration_s=10.0)
    # TTFT 180 / profiled 90 ms; concurrency 3,600 / 4 workers x 10 s / 180 s = 50 -> 32 slots,
    # profiled ITL 45 + 0.5 x 32 = 61 ms; 91.5 / 61 = 1.5
    p_cf, d_cf = dynamo_corrections(m, MODELS, decode_workers=4, interval_s=180.0)
    assert p_cf == pytest.approx(2.0)
    assert d_cf == pytest.approx(1.5)
    assert dynamo_corrections(m, MODELS, decode_workers=0, interval_s=180.0, previous=(1.0, 1.3))[1] == 1.3


def test_dynamo_encoder_by_hand() -> None:
    # 1,800 media requests x 4 items / 180 s = 40 items/s; one GPU encodes 4 items in
    # 15 + 4 x 25 = 115 ms: 34.8 items/s -> ceil(1.15) = 2
    assert dynamo_encoder_replicas(1800, 4, 180.0, MODELS) == 2
    assert dynamo_encoder_replicas(720, 4, 180.0, MODELS) == 1  # 16 items/s: ceil(0.46)
    # two GPUs per replica: 17.4 items/s per GPU, / 2 GPUs -> ceil(1.15) = 2 replicas
    assert dynamo_encoder_replicas(1800, 4, 180.0, MODELS, gpus_per_replica=2) == 2
    assert dynamo_encoder_replicas(0, 4, 180.0, MODELS) == 1  # at least min_endpoint
    # a budget of 4 GPUs leaves room for 2 encoders beside 1 prefill + 1 decode
    assert dynamo_encoder_budget(3, 4) == (2, 2)
    assert dynamo_encoder_budget(3, 10) == (3, 7)
    assert dynamo_encoder_budget(3, None) == (3, None)


def test_dynamo_budget_and_validity() -> None:
    # 6 + 10 GPUs into 8: prefill floor(6 x 8 / 16) = 3, decode the other 5
    assert dynamo_budget(6, 10, 8) == (3, 5)
    assert dynamo_budget(6, 10, None) == (6, 10)
    assert dynamo_budget(2, 2, 8) == (2, 2)
    assert dynamo_budget(3, 3, 1) == (0, 0)  # below min_endpoint for both: zero replicas
    assert not DynamoMetrics(10, 100, 10, None, 50.0, 1.0).is_valid()
    assert not DynamoMetrics(10, 100, 10, 200.0, float("nan"), 1.0).is_valid()
    assert DynamoMetrics(10, 100, 10, 200.0, 50.0, 1.0).is_valid()


def test_dynamo_acts_every_180_s(bursty: Workload) -> None:
    res = run_policy("dynamo", bursty, SMALL)
    tl = res.timeline
    for prev, cur in itertools.pairwise(tl):
        if cur["replicas"] != prev["replicas"]:
            assert cur["t"] % baselines.DYNAMO_ADJUSTMENT_INTERVAL_S == pytest.approx(0.0, abs=1e-6)
    assert res.metrics["drains_workers"] is False  # Dynamo deletes without draining


def test_keda_rule() -> None:
    assert keda_desired(30, 3.0, 4) == 10
    assert keda_desired(12.5, 3.0, 4) == 4  # within the 10 % tolerance: hold
    assert keda_desired(0, 3.0, 4) == 0  # an empty queue asks for none (the caller clamps to min)


def test_an_out_of_reach_interval_shrinks_past_routing_noise() -> None:
    """Some misses no fleet can prevent (requests feasible only on an idle worker) plus a few
    from routing ties that move from one fleet to the next: the oracle's interval search must
    still shrink to about the capacity the load needs, not keep the generous fleet it counted
    the unavoidable misses on (the next interval starts from what it keeps)."""
    need = {"prefill": 12, "decode": 20}
    unavoidable, allowed = 40, 6

    def misses(sizes: dict[str, int]) -> int:
        short = sum(5 * max(0, need[p] - n) for p, n in sizes.items())
        tie = (sizes["prefill"] * 7 + sizes["decode"] * 3) % 3  # 0-2 misses from routing ties
        return unavoidable + short + tie

    limits: set[int] = set()

    def trial(sizes: dict[str, int], limit: int | None) -> tuple[bool, int]:
        if limit is not None:
            limits.add(limit)
        m = misses(sizes)
        return (limit is None or m <= limit), m

    start = {"prefill": 10, "decode": 18}  # the previous interval's sizes, short of this load
    spare = max(allowed, yardstick.ROUTING_NOISE_MISSES)
    sizes, reached = yardstick._search_pools(
        trial, ("prefill", "decode"), start, 1, 10_000, allowed, EvalSettings(), spare_when_short=spare
    )
    assert not reached
    assert sizes["prefill"] <= need["prefill"] and sizes["decode"] <= need["decode"]
    limit = max(limits)  # the generous fleet's misses plus the spare
    assert unavoidable + spare <= limit <= unavoidable + 2 + spare
    assert misses(sizes) <= limit
    for pool in sizes:  # one worker fewer in either pool fails
        assert misses({**sizes, pool: sizes[pool] - 1}) > limit


def _prefill_spares_decode(sizes: dict[str, int]) -> int:
    """Misses short of a fleet where each prefill worker beyond 10 spares 3 decode workers
    (down to 15): TTFT misses on the knife-edge, which more decode workers also absorb."""
    p, d = sizes["prefill"], sizes["decode"]
    return 5 * max(0, 10 - p) + max(0, max(15, 60 - 3 * (p - 10)) - d)


def _encoder_spares_prefill(sizes: dict[str, int]) -> int:
    """Misses short of a fleet where each encoder beyond 2 spares 2 prefill workers (down to 4);
    decode needs 20 whatever the others."""
    e, p, d = sizes["encoder"], sizes["prefill"], sizes["decode"]
    return 5 * max(0, 2 - e) + max(0, max(4, 16 - 2 * (e - 2)) - p) + max(0, 20 - d)


@pytest.mark.parametrize(
    ("misses", "start", "gpus_per_replica"),
    [
        (_prefill_spares_decode, {"prefill": 12, "decode": 60}, {}),
        (_prefill_spares_decode, {"prefill": 12, "decode": 60}, {"decode": 2}),
        (_prefill_spares_decode, {"prefill": 12, "decode": 60}, {"prefill": 2}),
        (_encoder_spares_prefill, {"encoder": 2, "prefill": 16, "decode": 20}, {}),
    ],
)
def test_the_fixed_fleet_search_trades_workers_between_pools(
    misses: Callable[[dict[str, int]], int], start: dict[str, int], gpus_per_replica: dict[str, int]
) -> None:
    """Where one pool's workers spare another's, shrinking one pool at a time stops at a fleet
    no single pool can shrink from, dearer than the cheapest passing one; the trades reach
    the cheapest, each fleet tried once."""
    s = EvalSettings(gpus_per_replica={"encoder": 1, "prefill": 1, "decode": 1, **gpus_per_replica})
    pools = tuple(start)
    fleets = [dict(zip(pools, c, strict=True)) for c in itertools.product(range(1, 64), repeat=len(pools))]
    cheapest = min(yardstick._gpus(s, f) for f in fleets if misses(f) == 0)
    tried: list[tuple[int, ...]] = []

    def trial(sizes: dict[str, int], limit: int | None) -> tuple[bool, int]:
        tried.append(tuple(sizes.values()))
        m = misses(sizes)
        return (limit is None or m <= limit), m

    def search(trade: bool) -> dict[str, int]:
        tried.clear()
        sizes, reached = yardstick._search_pools(
            trial, pools, start, 1, 10_000, 0, s, probe=True, trade=trade
        )
        assert reached and misses(sizes) == 0
        return sizes

    assert yardstick._gpus(s, search(trade=False)) > cheapest  # the coordinate search stops dearer
    assert yardstick._gpus(s, search(trade=True)) == cheapest
    assert len(tried) == len(set(tried)) <= 120  # no fleet twice; shrinking alone tries 8-9, trading 66-102


def _two_valleys(sizes: dict[str, int]) -> int:
    """Misses short of a fleet whose cheapest passing fleets lie in two valleys: decode alone
    carries the load from 60 workers beside 4 prefill workers; from 14 prefill workers up the
    prefill pool spares decode workers fast (4 each, down to 10). Trades of up to 8 prefill
    workers from the first valley only add GPUs, so the local search stays there."""
    p, d = sizes["prefill"], sizes["decode"]
    need_d = 60 if p < 14 else max(10, 60 - 4 * (p - 13))
    return 5 * max(0, 4 - p) + max(0, need_d - d)


@pytest.mark.parametrize(
    ("misses", "start", "gpus_per_replica"),
    [
        (_two_valleys, {"prefill": 4, "decode": 60}, {}),
        (_two_valleys, {"prefill": 4, "decode": 60}, {"prefill": 2}),
        (_prefill_spares_decode, {"prefill": 12, "decode": 60}, {"decode": 2}),
    ],
)
def test_the_fixed_fleet_frontier_sweep_finds_the_cheapest_fleet_anywhere(
    misses: Callable[[dict[str, int]], int], start: dict[str, int], gpus_per_replica: dict[str, int]
) -> None:
    """Past the reach of every trade, the sweep over prefill counts lands on the cheapest
    passing fleet of the whole grid, says it checked every count that could hold one, and
    stays within its trial bound."""
    s = EvalSettings(gpus_per_replica={"encoder": 1, "prefill": 1, "decode": 1, **gpus_per_replica})
    pools = ("prefill", "decode")
    fleets = [dict(zip(pools, c, strict=True)) for c in itertools.product(range(1, 80), repeat=2)]
    cheapest = min(yardstick._gpus(s, f) for f in fleets if misses(f) == 0)

    def trial(sizes: dict[str, int], limit: int | None) -> tuple[bool, int]:
        m = misses(sizes)
        return (limit is None or m <= limit), m

    local, reached = yardstick._search_pools(trial, pools, start, 1, 10_000, 0, s, probe=True, trade=True)
    assert reached and misses(local) == 0
    asked: list[tuple[int, int]] = []

    def ok(p: int, d: int) -> bool:
        asked.append((p, d))
        return misses({"prefill": p, "decode": d}) == 0

    gpus = (s.gpus_per_replica["prefill"], s.gpus_per_replica["decode"])
    found, checked = yardstick._sweep_frontier(ok, (local["prefill"], local["decode"]), gpus, 1, 10_000, 200)
    assert misses({"prefill": found[0], "decode": found[1]}) == 0
    assert yardstick._gpus(s, {"prefill": found[0], "decode": found[1]}) == cheapest
    assert checked["complete"] and checked["trials"] == len(asked) <= 200
    if misses is _two_valleys:  # the local search alone stops in the dearer valley
        assert yardstick._gpus(s, local) > cheapest
    # out of trials: it says so, and what it returns still passes
    asked.clear()
    part, short = yardstick._sweep_frontier(ok, (local["prefill"], local["decode"]), gpus, 1, 10_000, 6)
    assert not short["complete"] and len(asked) == 6 and "unchecked_from_prefill" in short
    assert misses({"prefill": part[0], "decode": part[1]}) == 0
