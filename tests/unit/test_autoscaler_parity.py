"""The operator and `disagg evaluate` run the same autoscaler: one table of observations goes
through the operator's loop (a fake Kubernetes and a fake Prometheus, no cluster) and through
the evaluator's `disagg` policy, and every decision's targets and next step are identical.

Each sequence steps virtual time by the decision interval. A row sets the cluster the way it
is at that moment (the Deployments' replicas, pending pods, pods being drained, every pod
admitted 60 s after creation) and the metrics (arrival rate over the window and over the short
window, token means, queue, observed TTFT, stale samples); the evaluator gets the same
moment as its `Obs`. The scaler state carries over from row to row on both paths.
"""

from __future__ import annotations

import asyncio
import itertools
import math
from dataclasses import dataclass, field, replace

import pytest
from fakes import FakeKube, FakePrometheus, deployment, disagg_deployment, pod

from disagg import autoscaler, drain, evaluate, loop, metrics, reconcile
from disagg.evaluate import EvalSettings, Obs
from disagg.sizes import SizeDistribution

pytestmark = pytest.mark.usefixtures("fresh_loop_memory")

NS, NAME = "ns", "llm"
STARTUP_S = 60.0
SETTINGS = EvalSettings(startup_s=STARTUP_S, stabilization_s=120.0, scrape_s=15.0, window_s=60.0)


@dataclass
class Row:
    rate: float | None  # arrival rate over the metric window (None: the series is missing)
    replicas: dict[str, int]  # the Deployments' replicas
    short: float | None = None  # arrival rate over the short window
    prompt: float = 1000.0
    output: float = 200.0
    queued: float = 0.0
    ttft: float | None = None
    pending: dict[str, int] = field(default_factory=dict)
    draining: dict[str, int] = field(default_factory=dict)
    stale: bool = False
    # issue-14 inputs: token histograms (cumulative (le, rate) buckets) and arrival counts per
    # two scrapes over the trailing horizon (None: the query answers nothing)
    prompt_buckets: list[tuple[float, float]] | None = None
    output_buckets: list[tuple[float, float]] | None = None
    counts: list[float] | None = None
    # the counted pool's waiting + running at each count's end, from one count earlier (one
    # more than the counts; None: the query answers nothing)
    in_system: list[float] | None = None
    # the requests the front door shed per count (None: no series)
    shed_counts: list[float] | None = None
    # the back pool's engines: running sequences per pod now, and KV usage and running
    # sequences summed over its pods, each averaged over the window (None: no answer)
    running: float = 1.0
    kv_used: float | None = None
    kv_running: float | None = None
    # requests the back pool finished per second (its output histogram's count; None: the
    # histogram answers nothing), all with outputs between 0 and 2 x `output` tokens
    finished: float | None = None
    # requests the front door shed per second over the window and the short window (its
    # counter; None: no series)
    shed: float | None = None
    shed_short: float | None = None


def _row_cluster(kube: FakeKube, prom: FakePrometheus, row: Row, now: float, pools: tuple[str, ...]) -> None:
    for kind, _, name in list(kube.objects):
        if kind in ("Deployment", "Pod"):
            kube.remove(kind, NS, name)
    prom.now = now
    prom.per_pod = {}
    prom.scalars = {}
    prom.sample_age_s = 2.5 * SETTINGS.scrape_s if row.stale else 1.0
    for p in pools:
        n = row.replicas[p]
        kube.put(deployment(NAME, p, n))
        pending = row.pending.get(p, 0)
        leaving = row.draining.get(p, 0)
        rec = drain.DrainRecord(now - 10, now + 3600, "readmit").to_annotation()
        prom.per_pod[p] = {}
        for i in range(n):
            created = now - 1000 - i
            if i < pending:
                kube.put(pod(NAME, p, i, created=created, admitted=None, phase="Pending"))
                continue
            is_leaving = i < pending + leaving
            kube.put(
                pod(
                    NAME,
                    p,
                    i,
                    created=created,
                    admitted=created + STARTUP_S,
                    drain=rec if is_leaving else None,
                )
            )
            prom.per_pod[p][f"{NAME}-{p}-5f7c9-{i:05d}"] = (row.running if p == pools[-1] else 1.0, 0.0)
    front = pools[0]
    first = next(iter(prom.per_pod[front]), None)
    if first is not None:
        prom.per_pod[front][first] = (1.0, row.queued)
    for key, v in (
        ("arrival_rps", row.rate),
        ("arrival_rps_short", row.short),
        ("prompt_tokens_mean", row.prompt),
        # a window that finished nothing has no mean (Prometheus answers 0 / 0)
        ("output_tokens_mean", None if row.finished == 0 else row.output),
        ("ttft_p", row.ttft),
        ("kv_usage_sum", row.kv_used),
        ("kv_running_avg", row.kv_running),
        ("shed_rps", row.shed),
        ("shed_rps_short", row.shed_short),
    ):
        if v is not None:
            prom.scalars[key] = v
    prom.histograms = {}
    if row.prompt_buckets is not None and row.output_buckets is not None:
        prom.histograms = {
            "prompt_tokens_histogram": row.prompt_buckets,
            "output_tokens_histogram": row.output_buckets,
        }
    if row.finished is not None:
        prom.histograms["output_tokens_buckets"] = [
            (2 * row.output, row.finished),
            (float("inf"), row.finished),
        ]
    prom.series = {} if row.counts is None else {"arrival_counts_horizon": row.counts}
    if row.in_system is not None:
        prom.series[metrics.IN_SYSTEM_SERIES] = row.in_system
    if row.shed_counts is not None:
        prom.series[metrics.SHED_SERIES] = row.shed_counts


def _sizes(row: Row) -> SizeDistribution | None:
    """What the operator builds from the row's histograms (no _sum answers: none in the fake)."""
    if row.prompt_buckets is None or row.output_buckets is None:
        return None
    return SizeDistribution.from_buckets(row.prompt_buckets, row.output_buckets)


def _arrival_pool_in_system(row: Row, pools: tuple[str, ...], placement: str) -> float:
    """Waiting plus running on the arrival pool's pods, as `_row_cluster` reports them."""
    arrival = metrics.arrival_pool(pools, placement)
    per_pod = [(row.running if arrival == pools[-1] else 1.0, 0.0)] * (
        row.replicas[arrival] - row.pending.get(arrival, 0)
    )
    if arrival == pools[0] and per_pod:
        per_pod[0] = (1.0, row.queued)
    return sum(r + w for r, w in per_pod)


def _obs(row: Row, now: float, pools: tuple[str, ...], placement: str = "disaggregated") -> Obs:
    return Obs(
        now=now,
        rate=row.rate or 0.0,
        count=0,
        prompt_mean=row.prompt,
        prompt_std=0.0,
        output_mean=row.output,
        # the spread the operator reads from the row's one bucket (uniform over it)
        output_std=0.0 if row.finished is None else 2 * row.output / 12**0.5,
        output_finished_rps=row.finished,
        util={},
        ready={},
        requested={p: row.replicas[p] - row.draining.get(p, 0) for p in pools},
        pending={p: row.pending.get(p, 0) for p in pools},
        ttft_p=row.ttft,
        queued=int(row.queued),
        rate_short=row.short,
        metrics_ok=not row.stale and row.rate is not None,
        sizes=_sizes(row),
        arrival_counts=None if row.counts is None else tuple(row.counts),
        arrival_counts_growth=(
            None
            if row.counts is None or row.in_system is None
            else tuple(b - a for a, b in itertools.pairwise(row.in_system))
        ),
        arrival_counts_shed=None if row.counts is None or row.shed_counts is None else tuple(row.shed_counts),
        count_interval_s=None if row.counts is None else autoscaler.COUNT_SCRAPES * SETTINGS.scrape_s,
        back_running=row.running * (row.replicas[pools[-1]] - row.pending.get(pools[-1], 0)),
        kv_usage_sum=row.kv_used,
        kv_running=row.kv_running,
        arrival_pool_in_system=_arrival_pool_in_system(row, pools, placement),
        shed_rps=row.shed,
        shed_rps_short=row.shed_short,
    )


def run_both(rows: list[Row], settings: EvalSettings = SETTINGS, placement: str = "disaggregated"):
    """(operator decisions, evaluator decisions), each a list of (targets, next step, reason)."""
    loop.TRACKERS.clear()  # a fresh operator for each table
    spec = evaluate.spec_for(settings, placement)
    pools = autoscaler.config_from_spec(spec).pools
    kube = FakeKube()
    prom = FakePrometheus()
    kube.put(disagg_deployment(NAME, spec.to_dict(), NS))
    opts = loop.LoopOptions(metrics_source=prom)
    policy = evaluate.DisaggPolicy(settings, None, None, spec=spec)
    ops, evs = [], []
    t0 = 1_800_000_000.0
    for i, row in enumerate(rows):
        now = t0 + i * 30.0
        _row_cluster(kube, prom, row, now, pools)
        asyncio.run(loop.step(kube, kube.obj("DisaggDeployment", NS, NAME), opts, now))
        out = loop.TRACKERS[(NS, NAME)].last_outcome
        assert out is not None and out.record.time == now
        ops.append((out.targets, out.next_step, out.reason))
        assert reconcile.DESIRED[(NS, NAME)] == out.targets
        step, reason = policy.decide(_obs(row, now, pools, placement))
        evs.append((policy.last.targets, step, reason))
    return ops, evs


PD = {"prefill": 1, "decode": 1}

LOAD_STEPS = [
    Row(2.0, PD),
    Row(8.0, PD, short=8.0),
    Row(8.0, {"prefill": 2, "decode": 3}, short=8.0),
    Row(8.0, {"prefill": 3, "decode": 4}),
    Row(2.0, {"prefill": 3, "decode": 4}, short=1.0),
    Row(2.0, {"prefill": 3, "decode": 4}, short=2.0),
    Row(2.0, {"prefill": 3, "decode": 4}, ttft=0.05),
    Row(2.0, {"prefill": 3, "decode": 4}, ttft=0.05),
    Row(2.0, {"prefill": 3, "decode": 4}, ttft=0.05),
    Row(2.0, {"prefill": 3, "decode": 4}, ttft=0.05),
]
BURST = [
    Row(3.0, {"prefill": 2, "decode": 2}, short=3.0),
    Row(3.0, {"prefill": 2, "decode": 2}, short=3.0),
    Row(3.5, {"prefill": 2, "decode": 2}, short=12.0),  # the short window sees the burst first
    Row(6.0, {"prefill": 2, "decode": 2}, short=14.0, queued=40),
    Row(10.0, {"prefill": 4, "decode": 5}, short=12.0, queued=10),
]
STALE = [
    Row(6.0, {"prefill": 2, "decode": 3}),
    Row(1.0, {"prefill": 2, "decode": 3}, stale=True),
    Row(None, {"prefill": 2, "decode": 3}),
    Row(12.0, {"prefill": 2, "decode": 3}, short=12.0, stale=True),
    Row(6.0, {"prefill": 2, "decode": 3}),
]
DRAINS = [
    Row(8.0, {"prefill": 3, "decode": 5}),
    Row(2.0, {"prefill": 3, "decode": 5}, draining={"decode": 1}),
    Row(2.0, {"prefill": 3, "decode": 5}, draining={"decode": 2, "prefill": 1}),
    Row(9.0, {"prefill": 3, "decode": 5}, short=9.0, draining={"decode": 2}),
    Row(9.0, {"prefill": 3, "decode": 6}, pending={"decode": 1}),
    Row(12.0, {"prefill": 3, "decode": 6}, short=12.0, pending={"decode": 2}),
]
BUDGET = [  # 6 GPUs: the load outgrows them, then its shape moves GPUs from decode to prefill
    Row(2.0, {"prefill": 1, "decode": 2}),
    Row(8.0, {"prefill": 1, "decode": 2}, short=8.0),
    Row(12.0, {"prefill": 2, "decode": 4}, short=14.0, queued=30),
    Row(6.0, {"prefill": 2, "decode": 4}, prompt=3000.0, output=60.0),
    Row(6.0, {"prefill": 3, "decode": 3}, prompt=3000.0, output=60.0, draining={"decode": 1}),
    Row(3.0, {"prefill": 3, "decode": 3}, short=2.0),
]

# A wide prompt mix (most short, a tail of long ones) and on/off arrivals: 1 min at 10 rps,
# 3 min at 2 rps, per 30 s sub-window, for 40 min, ending at the low rate (the standing
# headroom then stands whole); with one more count at 10 rps a burst is under way and uses it.
WIDE_PROMPTS = [(500.0, 3.0), (2000.0, 4.0), (8000.0, 4.8), (float("inf"), 5.0)]
OUTPUTS = [(100.0, 2.0), (400.0, 4.5), (float("inf"), 5.0)]
ON_OFF = ([300.0] * 2 + [60.0] * 6) * 10
SIZED = [
    Row(5.0, PD, prompt_buckets=WIDE_PROMPTS, output_buckets=OUTPUTS, counts=ON_OFF),
    Row(5.0, {"prefill": 2, "decode": 2}, prompt_buckets=WIDE_PROMPTS, output_buckets=OUTPUTS, counts=ON_OFF),
    Row(9.0, {"prefill": 2, "decode": 2}, short=10.0, prompt_buckets=WIDE_PROMPTS, output_buckets=OUTPUTS),
    Row(9.0, {"prefill": 3, "decode": 3}, short=10.0, counts=[*ON_OFF, 300.0]),
    Row(2.0, {"prefill": 3, "decode": 3}, counts=ON_OFF[:3]),  # too few counts: Poisson, spec headroom
    Row(2.0, {"prefill": 3, "decode": 3}, stale=True, counts=ON_OFF),
]
# Long prompts with short outputs: from the token means a decode sequence holds 30,200 KV
# tokens (7 per worker); the engines' KV gauges show 8,000 (the long prompts have the shortest
# outputs): 12 sequences on 3 workers holding 0.403 x 237,984 tokens, both averaged over the
# window. The footprint is kept through a window whose gauges answer nothing, and through one
# with too few sequences to tell.
KV_FOOTPRINT = 8000.0
KV = [
    Row(2.0, PD, prompt=30000.0, output=200.0),
    Row(
        2.0,
        {"prefill": 2, "decode": 3},
        prompt=30000.0,
        output=200.0,
        running=4.0,
        kv_used=12 * KV_FOOTPRINT / 237_984,
        kv_running=12.0,
    ),
    Row(3.0, {"prefill": 2, "decode": 3}, short=3.0, prompt=30000.0, output=200.0, running=4.0),
    Row(
        3.0,
        {"prefill": 2, "decode": 3},
        prompt=30000.0,
        output=200.0,
        running=1.0,
        kv_used=0.1,
        kv_running=3.0,
    ),
]
# The fleet the model asks for at 4 rps of 1,000-token prompts, steady, yet TTFT at p99 misses
# the 0.6 s target window after window (requests that arrive together): the front load gain
# grows, and with it the prefill pool alone. The last rows have the added prefill pending.
AT_PLAN = {"prefill": 1, "decode": 2}
MISSES = [
    Row(4.0, AT_PLAN, ttft=0.3),
    Row(4.0, AT_PLAN, ttft=0.3),
    *[Row(4.0, AT_PLAN, ttft=0.9)] * 8,
    Row(4.0, {"prefill": 2, "decode": 2}, ttft=0.9, pending={"prefill": 1}),
    Row(4.0, {"prefill": 2, "decode": 2}, ttft=0.9),
]
# Output lengths counted as requests finish: busy windows of 20-token outputs, then a quiet
# one that finished a single 2,000-token request (weighed by its one request), then one that
# finished none (the shape holds).
STRAGGLERS = [
    Row(6.0, PD, output=20.0, finished=6.0),
    Row(6.0, {"prefill": 2, "decode": 2}, output=20.0, finished=6.0),
    Row(0.5, {"prefill": 2, "decode": 2}, output=2000.0, finished=1 / 60),
    Row(0.5, {"prefill": 2, "decode": 2}, output=2000.0, finished=0.0),
    Row(6.0, {"prefill": 2, "decode": 2}, short=6.0, output=2000.0, finished=6.0),
]
# 6 GPUs short of the load: the front door sheds part of it, which the engines never count
SHEDDING = [
    Row(8.0, {"prefill": 2, "decode": 4}),
    Row(9.0, {"prefill": 2, "decode": 4}, short=9.0, shed=5.0, shed_short=6.0),
    Row(9.0, {"prefill": 2, "decode": 4}, short=9.0, shed=7.0),
    Row(8.0, {"prefill": 2, "decode": 4}, shed=0.0, shed_short=0.0),
]


def _queued_bursts() -> tuple[list[float], list[float]]:
    """An hour of 30 s counts of a pool that queues bursts: 60 arrivals per count, 120 for two
    minutes every 20; the capacity (60 per count) triples a minute into each burst. The counts
    are its throughput (flat, then a drain at 3x); the second list is its queue at each count's
    end, from one count earlier."""
    counts, queue = [], [0.0]
    for k in range(120):
        arrived = 120.0 if 30 <= k % 40 < 34 else 60.0
        capacity = 180.0 if 32 <= k % 40 < 36 else 60.0
        counts.append(min(capacity, queue[-1] + arrived))
        queue.append(queue[-1] + arrived - counts[-1])
    return counts, queue


DRAINED, QUEUE = _queued_bursts()
# The same counts read with and without the queue's growth: the headroom stands for the 2x rise
# the traffic made, not the 3x the drain shows (a row without the gauge reads the counts alone);
# then with 300 requests the front door shed at each burst's start, arrivals too (a 6x rise)
SHED_AT_BURSTS = [300.0 if k % 40 == 30 else 0.0 for k in range(len(DRAINED))]
QUEUED_BURSTS = [
    Row(2.0, PD, counts=DRAINED, in_system=QUEUE),
    Row(2.0, {"prefill": 2, "decode": 2}, counts=DRAINED, in_system=QUEUE),
    Row(2.0, {"prefill": 2, "decode": 2}, counts=DRAINED),
    Row(2.0, {"prefill": 3, "decode": 3}, counts=DRAINED, in_system=QUEUE),
    Row(2.0, {"prefill": 3, "decode": 3}, counts=DRAINED, in_system=QUEUE, shed_counts=SHED_AT_BURSTS),
]
ALL_SIZING = {"requestSizes": True, "burstiness": True, "autoHeadroom": True}
NO_SIZING = {
    "requestSizes": False,
    "burstiness": False,
    "autoHeadroom": False,
    "frontLoadGain": False,
    "errorBudget": False,
}

CASES = {
    "load steps": (LOAD_STEPS, SETTINGS),
    "burst": (BURST, SETTINGS),
    "stale metrics": (STALE, SETTINGS),
    "drains in flight": (DRAINS, SETTINGS),
    "budget pressure": (BUDGET, replace(SETTINGS, gpu_budget=6)),
    "sizes and bursty counts": (SIZED, replace(SETTINGS, sizing=ALL_SIZING)),
    "observed KV footprint": (KV, SETTINGS),
    "lasting TTFT misses at plan": (MISSES, SETTINGS),
    "output lengths as requests finish": (STRAGGLERS, SETTINGS),
    "requests shed at the front door": (SHEDDING, replace(SETTINGS, gpu_budget=6)),
    "counts with their queue's growth": (QUEUED_BURSTS, SETTINGS),
}


@pytest.mark.parametrize("case", list(CASES))
def test_disaggregated_decisions_are_identical(case: str) -> None:
    rows, settings = CASES[case]
    ops, evs = run_both(rows, settings)
    assert ops == evs
    assert len({str(t) for t, _, _ in ops}) > 1 or case == "stale metrics"  # the table moves the pools


def _colocated(rows: list[Row]) -> list[Row]:
    def fold(d: dict[str, int]) -> dict[str, int]:
        return {"colocated": max(d.values())} if d else {}

    return [
        replace(r, replicas=fold(r.replicas), pending=fold(r.pending), draining=fold(r.draining))
        for r in rows
    ]


@pytest.mark.parametrize("case", ["load steps", "burst", "drains in flight", "budget pressure"])
def test_colocated_decisions_are_identical(case: str) -> None:
    rows, settings = CASES[case]
    ops, evs = run_both(_colocated(rows), settings, placement="colocated")
    assert ops == evs
    assert {p for t, _, _ in ops for p in t} == {"colocated"}


@pytest.mark.parametrize(
    "case", ["load steps", "sizes and bursty counts", "counts with their queue's growth"]
)
def test_conditional_decisions_are_identical(case: str) -> None:
    """Under the conditional placement the decode pool counts every request: the operator reads
    the rate, the counts and the requests held from it, as the evaluation counts them."""
    rows, settings = CASES[case]
    ops, evs = run_both(rows, settings, placement="conditional")
    assert ops == evs


def test_lasting_misses_at_plan_grow_the_prefill_pool_alone() -> None:
    """The misses row by row: the operator's gain (kept in status.scalerState between
    decisions) and the evaluator's grow alike; only prefill grows; without the switch nothing."""
    ops, evs = run_both(MISSES)
    assert ops == evs
    assert [t for t, _, _ in ops[:9]] == [AT_PLAN] * 9  # settling, then a miss that must last
    assert ops[9][0] == {"prefill": 2, "decode": 2} and ops[9][2] == "ScaleUp"
    gain = loop.TRACKERS[(NS, NAME)].last_outcome.state.front_gain
    assert gain > 1.0
    off, _ = run_both(MISSES, replace(SETTINGS, sizing={"frontLoadGain": False}))
    assert all(t == AT_PLAN for t, _, _ in off)


def test_the_table_exercises_the_short_window_and_the_budget() -> None:
    """The cases above are only worth comparing if the short window and the budget matter."""
    ops, _ = run_both(BURST)
    no_short = [replace(r, short=None) for r in BURST]
    ops_without, _ = run_both(no_short)
    assert ops != ops_without  # the fast attack changes what the burst rows decide
    budget_rows, budget_settings = CASES["budget pressure"]
    ops_budget, _ = run_both(budget_rows, budget_settings)
    reasons = {r for _, _, r in ops_budget}
    assert reasons & {"BudgetLimited", "Rebalance"}
    gpus = [sum(t.values()) for t, _, _ in ops_budget]
    assert max(gpus) <= 6


def observations_seen(monkeypatch) -> list[Obs]:
    """The observations `disagg evaluate` gives the disagg policy's decisions, appended as they come."""
    seen: list[Obs] = []
    real = evaluate.DisaggPolicy.decide

    def spy(self, o: Obs):
        seen.append(o)
        return real(self, o)

    monkeypatch.setattr(evaluate.DisaggPolicy, "decide", spy)
    return seen


def test_the_evaluator_measures_the_short_rate_over_the_operators_window(monkeypatch) -> None:
    """`disagg evaluate` reads the short rate over SHORT_WINDOW_SCRAPES scrapes, as the loop asks
    Prometheus for it (the decision itself is compared above)."""
    from disagg.workload import Workload

    seen = observations_seen(monkeypatch)
    # 60 requests in the first 30 s, then one at 200 s: at the decision at t = 60 (metrics of
    # t = 45), the last scrape interval saw nothing and the short window saw all 60.
    arrivals = [i * 0.5 for i in range(60)] + [200.0]
    w = Workload(arrivals, [100] * 61, [10] * 61, name="front-loaded")
    evaluate.run_policy("disagg", w, replace(SETTINGS, interval_s=30.0))
    at_60 = next(o for o in seen if o.now == 60.0)
    short_s = autoscaler.SHORT_WINDOW_SCRAPES * SETTINGS.scrape_s
    assert at_60.rate_short == pytest.approx(60 / short_s)
    # and the loop asks Prometheus for the same window
    assert autoscaler.config_from_spec(evaluate.spec_for(SETTINGS)).short_window_s == short_s


def test_the_sizing_row_is_decided_by_its_sizes_and_counts() -> None:
    """The sizes-and-counts table is only worth comparing if those inputs change decisions:
    each switch alone moves some target, and with every switch off the inputs are ignored."""
    ops_all, _ = run_both(SIZED, replace(SETTINGS, sizing=ALL_SIZING))
    ops_none, _ = run_both(SIZED, replace(SETTINGS, sizing=NO_SIZING))
    plain = [replace(r, prompt_buckets=None, output_buckets=None, counts=None) for r in SIZED]
    ops_plain, _ = run_both(plain, replace(SETTINGS, sizing=ALL_SIZING))
    assert ops_none == ops_plain  # switched off: as if nothing were measured
    assert ops_all != ops_none
    for switch in ALL_SIZING:
        one = {**NO_SIZING, switch: True}
        ops_one, evs_one = run_both(SIZED, replace(SETTINGS, sizing=one))
        assert ops_one == evs_one
        assert ops_one != ops_none, switch


def test_the_evaluator_fills_sizes_and_counts_from_the_window(monkeypatch) -> None:
    """`disagg evaluate` gives the decision the window's request sizes and the arrivals per
    COUNT_SCRAPES scrapes (the operator's subquery resolution), only when the spec uses them."""
    from disagg.workload import Workload

    seen = observations_seen(monkeypatch)
    # 1 request/s for 300 s, prompts alternating 100 and 5,000 tokens
    n = 300
    w = Workload([float(i) for i in range(n)], [100, 5000] * (n // 2), [10] * n, name="two sizes")
    evaluate.run_policy("disagg", w, replace(SETTINGS, interval_s=30.0, sizing=ALL_SIZING))
    at = next(o for o in seen if o.now == 240.0)  # metrics of t = 225, window [165, 225)
    count_s = autoscaler.COUNT_SCRAPES * SETTINGS.scrape_s
    assert at.count_interval_s == count_s
    assert at.arrival_counts == tuple([count_s] * int(225 // count_s))  # 1 rps, whole sub-windows
    assert at.sizes is not None
    assert at.sizes.prompt_mean_std[0] == pytest.approx(2550.0, rel=0.01)
    # with the sizes, the window's TTFT histogram (the operator reads the engines' beside the
    # token histograms): cumulative over the evaluation's buckets, its SLO percentile the one
    # the decision sees as the observed TTFT
    assert at.ttft_buckets is not None and at.ttft_buckets[-1][0] == float("inf")
    counts = [c for _, c in at.ttft_buckets]
    assert counts == sorted(counts) and counts[-1] > 0
    assert metrics.histogram_quantile(SETTINGS.slo.percentile, at.ttft_buckets) == pytest.approx(at.ttft_p)
    # per second, as the operator's rate() of the engines' buckets: the window's 1 request/s
    assert counts[-1] == pytest.approx(1.0, rel=0.05)
    # and the prefill queue waits of the same requests, over the emulator's queue-time buckets
    assert at.prefill_wait_buckets is not None
    assert [le for le, _ in at.prefill_wait_buckets] == [*metrics.QUEUE_TIME_BUCKETS, float("inf")]
    assert at.prefill_wait_buckets[-1][1] == at.ttft_buckets[-1][1]
    # their exact mean (the histogram's sum over its count), within what the buckets allow, and
    # the prefill workers serving at the window's scrapes
    lower = upper = below = edge = 0.0
    for le, c in at.prefill_wait_buckets:
        lower, upper = lower + (c - below) * edge, upper + (c - below) * le
        below, edge = c, le
    assert at.prefill_wait_mean_s is not None
    assert lower / below <= at.prefill_wait_mean_s <= (upper / below if math.isfinite(upper) else math.inf)
    assert at.prefill_serving_min == at.requested["prefill"]  # a steady pool: all of it, all along
    seen.clear()
    # the front load gain alone (the default): the same sizes and histograms, for it to judge by
    evaluate.run_policy(
        "disagg", w, replace(SETTINGS, interval_s=30.0, sizing={**NO_SIZING, "frontLoadGain": True})
    )
    gained = next(o for o in seen if o.now == 240.0)
    assert gained.sizes == at.sizes and gained.ttft_buckets == at.ttft_buckets
    assert gained.prefill_wait_buckets == at.prefill_wait_buckets
    seen.clear()
    # the error budget alone (on by default too): the TTFT histogram it counts, beside the sizes
    evaluate.run_policy(
        "disagg", w, replace(SETTINGS, interval_s=30.0, sizing={**NO_SIZING, "errorBudget": True})
    )
    budgeted = next(o for o in seen if o.now == 240.0)
    assert budgeted.sizes == at.sizes and budgeted.ttft_buckets == at.ttft_buckets
    seen.clear()
    evaluate.run_policy("disagg", w, replace(SETTINGS, interval_s=30.0, sizing=NO_SIZING))
    assert all(
        o.sizes is None
        and o.arrival_counts is None
        and o.ttft_buckets is None
        and o.prefill_wait_buckets is None
        and o.prefill_wait_mean_s is None
        for o in seen
    )


def test_the_observed_kv_footprint_sizes_decode_on_both_paths() -> None:
    """The KV rows decide differently with the gauges than without: the footprint is used."""
    ops, _ = run_both(KV)
    blind, _ = run_both([replace(r, kv_used=None) for r in KV])
    assert [t["decode"] for t, _, _ in ops[1:]] < [t["decode"] for t, _, _ in blind[1:]]
