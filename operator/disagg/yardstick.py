"""The yardstick of `disagg evaluate`: hindsight oracle, best fixed fleet, equal-attainment curves.

Pure (numpy and the simulator). Three references answer "how many GPU-hours does
a policy need to meet the SLO, compared with what I would otherwise do":

* `oracle_schedule` - the per-interval search of the **hindsight oracle**. Every
  decision interval it picks the fewest workers per pool such that the requests
  it judges (the interval's arrivals and earlier ones still undecided) meet the
  SLO at the target attainment, by search through the simulator itself, starting
  from the simulated state at the interval's start (queues carried over), and
  applies them with no start-up delay. Misses left unspent by earlier intervals
  may be spent later; it aims a little above the target (`ORACLE_AIM_MARGIN`).
  Greedy (one interval at a time) and local (a fleet passes when one worker
  fewer in any pool fails).
* `hindsight_oracle` - the oracle `evaluate` reports: that schedule replayed,
  repaired (`ORACLE_REPAIR_PADS`) while its replay misses the target, and
  replaced by the best fixed fleet where that reaches the target and the
  schedule does not, or costs less: it reaches the target whenever the best
  fixed fleet does and never costs more. Not a proof that nothing is cheaper;
  `fluid_bound` is a true (loose) lower bound.
* `best_static` - the **best fixed fleet in hindsight**: the fewest workers per
  pool (encoder too for media workloads), fixed for the whole trace, that reach the target attainment;
  found by the same local search over whole-trace simulations, then by trading
  workers between the pools (a few more in one, the others shrunk) while that
  saves GPUs. An autoscaler is worth running only where it beats this.
* `gpu_hours_at` - GPU-hours a policy needs for an attainment, interpolated on
  the attainment / GPU-hours curve of its own knob (`KNOBS`).

Monotonicity (more workers never lower attainment) is assumed by the searches;
the simulator's least-loaded routing makes it hold closely but not exactly, and
every reported figure comes from a replay (`disagg.evaluate.run_policy`), not
from the search's own bookkeeping.
"""

from __future__ import annotations

import math
import time
from array import array
from collections.abc import Callable, Sequence
from copy import deepcopy
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from disagg.evaluate import (
    EvalSettings,
    Obs,
    Policy,
    PolicyResult,
    infeasible_mask,
    pools_for,
    run_policy,
    sim_config,
)
from disagg.monotone import smallest_passing
from disagg.names import POOL_DECODE, POOL_ENCODER, POOL_PREFILL
from disagg.sim.core import DONE, INF, WAITING, Job
from disagg.sim.engine import Cluster
from disagg.workload import Workload

__all__ = [
    "ATTAINMENT_TARGETS",
    "KNOBS",
    "FixedPolicy",
    "FleetTrials",
    "Hindsight",
    "HindsightOraclePolicy",
    "SearchStats",
    "best_static",
    "curve",
    "fluid_bound",
    "gpu_hours_at",
    "hindsight_oracle",
    "knob_value",
    "oracle_schedule",
    "with_knob",
]

# Attainments the equal-attainment comparison reads off every curve.
ATTAINMENT_TARGETS = (0.95, 0.99)
# The knob each policy is swept over for its curve: (EvalSettings field, a dotted path for a
# nested one, values). Default settings are included, so the curve passes through the
# default run. `disagg`'s is the percentile it plans at (`spec.slo.percentile`), what a user
# aiming at another attainment changes; its `headroom` is only a floor under the automatic
# one, so sweeping it could add capacity but never find a cheaper setting.
KNOBS: dict[str, tuple[str, tuple[float, ...]]] = {
    "disagg": ("slo.percentile", (0.9, 0.95, 0.99, 0.995)),
    "static": ("capacity_scale", (0.6, 0.8, 1.0, 1.25)),
    "hpa": ("hpa_target", (0.4, 0.55, 0.7, 0.85)),
    "throughput": ("capacity_scale", (1.0, 1.5, 2.0, 3.0)),
    "dynamo": ("capacity_scale", (1.0, 1.5, 2.0, 3.0)),
    "keda": ("keda_queue_per_replica", (1.0, 2.0, 4.0, 8.0)),
    "oracle": ("target_attainment", (0.95, 0.99)),
    "planner-foresight": ("headroom", (0.0,)),
}
_EPS = 1e-12
# The oracle's search aims this share of the allowed misses above its target: its trials
# do not judge requests still in flight across an interval boundary, and the replay does.
ORACLE_AIM_MARGIN = 0.25
# Misses a fleet's trial can gain or lose from routing ties alone (least-loaded routing breaks
# them differently on another fleet): a smaller change says nothing about capacity.
ROUTING_NOISE_MISSES = 2
# Workers a trade of the fixed-fleet search adds to one pool before shrinking the others
# (`_search_pools`): one more prefill worker can spare hundreds of decode workers when the
# TTFT misses sit on the knife-edge, so coordinate-wise shrinking alone stops at dearer fleets.
TRADE_STEPS = (1, 2, 4, 8)
# Most trades one search moves by: each lands on a strictly cheaper passing fleet, so this
# bounds only the cost of a search that keeps finding cheaper ones.
MAX_TRADES = 8
# Most trials the best fixed fleet's frontier sweep asks for (`_sweep_frontier`): a fleet
# differs from the next by one worker, so a sweep usually needs a trial per prefill count
# that could beat the local search's fleet plus two bisections (a dozen on small fleets).
FRONTIER_MAX_TRIALS = 120
_CHECK_EVERY = 128  # arrivals between two looks at a trial's misses
_TAIL_STEP_S = 1.0  # after the last arrival a trial advances this much between looks


@dataclass
class SearchStats:
    """Cost of a search: simulations run (trials) and wall time."""

    simulations: int = 0
    wall_s: float = 0.0
    reached: bool = True  # False: no size tried reached the target (the largest tried is used)
    misses: int = 0  # whole-trace misses in the search's own simulation (oracle_schedule)
    judged: int = 0  # feasible requests judged there
    short_intervals: int = 0  # oracle_schedule: intervals where no size tried met the allowance
    passes: int = 0  # oracle: schedules replayed (the search's, then its repairs; `hindsight_oracle`)
    source: str = ""  # oracle: which candidate schedule was kept
    frontier: dict[str, Any] | None = None  # best_static: what its frontier sweep checked

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "simulations": self.simulations,
            "search_wall_s": round(self.wall_s, 3),
            "target_reached": self.reached,
        }
        if self.frontier is not None:
            d["frontier"] = self.frontier
        if self.source:
            d.update(replays=self.passes, short_intervals=self.short_intervals, schedule_source=self.source)
        return d


# --------------------------------------------------------------------------- curves


def gpu_hours_at(points: Sequence[dict[str, Any]], target: float) -> float | None:
    """GPU-hours needed for `target` attainment on a policy's curve; None if never reached.

    `points` carry ``slo_attainment`` and ``gpu_hours``. Only the Pareto frontier
    counts (a point costing more than another with at least its attainment is
    ignored). The answer is the cheapest frontier point at or above `target`,
    linearly interpolated towards the frontier point just below it; no
    extrapolation below the cheapest point or above the best attainment.
    """
    pts = sorted(
        (float(p["gpu_hours"]), float(p["slo_attainment"]))
        for p in points
        if p.get("slo_attainment") is not None and p.get("gpu_hours") is not None
    )
    frontier: list[tuple[float, float]] = []
    for h, a in pts:
        if not frontier or a > frontier[-1][1] + _EPS:
            frontier.append((h, a))
    for j, (h1, a1) in enumerate(frontier):
        if a1 + _EPS >= target:
            if j == 0:
                return h1
            h0, a0 = frontier[j - 1]
            return h0 + (target - a0) / (a1 - a0) * (h1 - h0)
    return None


def knob_value(s: EvalSettings, knob: str) -> Any:
    """The setting `knob` (an EvalSettings field, or a dotted path into a nested one) has in `s`."""
    v: Any = s
    for part in knob.split("."):
        v = getattr(v, part)
    return v


def with_knob(s: Any, knob: str, value: float) -> Any:
    """`s` (EvalSettings) with the setting `knob` (see `knob_value`) at `value`; every other setting kept."""
    head, _, rest = knob.partition(".")
    if not rest:
        return replace(s, **{head: value})
    return replace(s, **{head: with_knob(getattr(s, head), rest, value)})


def curve(
    name: str,
    w: Workload,
    s: EvalSettings,
    values: Sequence[float] | None = None,
    progress: Callable[[str], None] | None = None,
) -> list[dict[str, Any]]:
    """Run policy `name` at every setting of its knob; one point per setting."""
    if name not in KNOBS:
        raise ValueError(f"no knob to sweep for policy {name!r}")
    knob, default_values = KNOBS[name]
    out = []
    for v in default_values if values is None else values:
        if progress is not None:
            progress(f"curve {name}: {knob}={v:g}")
        m = run_policy(name, w, with_knob(s, knob, v)).metrics
        out.append(
            {
                "knob": knob,
                "value": v,
                "slo_attainment": m["slo_attainment"],
                "gpu_hours": m["gpu_hours"],
                "lost_requests": m["lost_requests"],
                "rejected_requests": m.get("rejected_requests", 0),
            }
        )
    return out


# --------------------------------------------------------------------------- simulation helpers


def _resize(cl: Cluster, sizes: dict[str, int], now: float) -> None:
    """Set the serving pool sizes at once (every pool in `sizes`), as the evaluation loop applies
    an instant target.

    Growing first un-drains draining workers, then adds new ones; shrinking drains
    the workers with the least in flight (they finish what they hold).
    """
    for p in sizes:
        serving = [w for w in cl.pools[p] if not w.draining]
        diff = int(sizes[p]) - len(serving)
        if diff > 0:
            for w in [w for w in cl.pools[p] if w.draining][:diff]:
                cl.set_draining(w, False, now)
                diff -= 1
            for _ in range(diff):
                cl.add_worker(p, now)
        elif diff < 0:
            for w in sorted(serving, key=lambda w: (cl.in_flight(w), w.name))[:-diff]:
                cl.set_draining(w, True, now)


def _reap(cl: Cluster, now: float) -> None:
    """Delete drained workers (nothing in flight, no KV send pending), as the loop's drain poll does."""
    for p in cl.pools:
        for w in [w for w in cl.pools[p] if w.draining]:
            if cl.in_flight(w) == 0 and cl.pending_kv_sends(w) == 0:
                cl.remove_worker(w, now)


class _Tracker:
    """Which judged requests met the SLO, missed it, or are still open, as a simulation runs.

    A request is a miss once it ended without completing (failed, lost), got its
    first token late or passed its TTFT deadline without one, or completed with the
    simulator's ITL over target; it is good once it completed within both targets.
    When even a full decode batch steps within the ITL target and decode workers
    only decode (disaggregated placement), no gap can exceed it, so a request is
    good as soon as its first token is on time: trials need not run every decode
    to its end.
    """

    def __init__(self, cl: Cluster, itl_s: float) -> None:
        self.cl = cl
        self.itl_s = itl_s
        self.open: dict[int, Job] = {}
        self.misses = 0
        self.good = 0
        self.seen = len(cl.r_id)  # completion records already read
        slowest_step_s = float(cl.models.decode.step_ms(cl.models.decode.slots)) / 1000.0
        self.itl_safe = cl.placement == "disaggregated" and slowest_step_s <= itl_s + _EPS

    def update(self, now: float) -> None:
        cl, open_ = self.cl, self.open
        r_id, r_ttft = cl.r_id, cl.r_ttft
        r_itl = (cl.r_itl, cl.r_itl_p99, cl.r_itl_max)[cl.itl_stat]  # the SLO's statistic of the gaps
        for k in range(self.seen, len(r_id)):
            job = open_.pop(r_id[k], None)
            if job is None:
                continue
            # each request's own TTFT target: its deadline (flat, or growing with its prompt)
            if r_ttft[k] <= job.deadline - job.arrival + _EPS and r_itl[k] <= self.itl_s + _EPS:
                self.good += 1
            else:
                self.misses += 1
        self.seen = len(r_id)
        missed, good = [], []
        safe = self.itl_safe
        for jid, j in open_.items():
            if j.state != WAITING and j.state != DONE:
                missed.append(jid)
            elif j.t_first == INF:
                if now > j.deadline + _EPS:
                    missed.append(jid)
            elif j.t_first > j.deadline + _EPS:
                missed.append(jid)
            elif safe and j.state == WAITING:
                good.append(jid)
        for jid in missed:
            del open_[jid]
        for jid in good:
            del open_[jid]
        self.misses += len(missed)
        self.good += len(good)


def _clone(cl: Cluster, tracker: _Tracker) -> tuple[Cluster, _Tracker]:
    """Deep copy of a cluster with a fresh tracker that judges the requests `tracker` still holds open.

    The open requests (arrived earlier, neither met nor missed yet) are judged in
    the copy too, so a trial sees what its pool sizes do to work in flight from
    earlier intervals, not only to its own arrivals. Completion records and the
    model memo tables are not copied (fresh records, shared tables).
    """
    memo: dict[int, Any] = {}
    for name in ("r_id", "r_arrival", "r_ttft", "r_itl", "r_done"):
        a = getattr(cl, name)
        memo[id(a)] = array(a.typecode)
    for name in ("models", "_pf", "_marks", "_wire", "_bytes", "_enc", "step_s"):
        v = getattr(cl, name)
        memo[id(v)] = v
    for st in cl.stages.values():  # per-job wait samples: a trial does not read them
        memo[id(st.waits)] = array(st.waits.typecode)
    for w in cl.workers:  # removed workers are inert: shared, not copied
        if w.removed:
            memo[id(w)] = w
    c2 = deepcopy(cl, memo)
    tr2 = _Tracker(c2, tracker.itl_s)
    for jid, job in tracker.open.items():
        copied = memo.get(id(job))
        if copied is not None:  # every open request is held somewhere in the cluster
            tr2.open[jid] = copied
    return c2, tr2


class _Trace:
    """The workload as plain lists, the SLO, and which requests count (feasible ones)."""

    def __init__(self, w: Workload, s: EvalSettings) -> None:
        self.s = s
        self.arrival = w.arrival_s.tolist()
        self.prompt = w.prompt_tokens.tolist()
        self.output = w.output_tokens.tolist()
        self.media = w.media_items.tolist()
        self.pools = pools_for(w)  # the encoder pool only when some request carries media
        self.feasible = (~infeasible_mask(w, s)).tolist()
        self.n = len(self.arrival)
        self.itl_s = s.slo.itl_s

    def cluster(self, sizes: dict[str, int]) -> tuple[Cluster, _Tracker]:
        cl = Cluster(self.s.models, sim_config(self.s, sizes, self.pools), now=0.0)
        return cl, _Tracker(cl, self.itl_s)

    def run(
        self,
        cl: Cluster,
        tr: _Tracker,
        lo: int,
        hi: int,
        allowed: int | None = None,
        until: float | None = None,
    ) -> bool:
        """Submit requests lo..hi-1 (feasible ones judged), then run on.

        With `until`: advance to that time and stop (True). Otherwise run until every
        judged request is decided; with `allowed`, stop early once the misses exceed
        it (False) or no longer can (True); without, count them all (True).
        """
        heap = cl.heap
        arrival, prompt, output, media = self.arrival, self.prompt, self.output, self.media
        feasible = self.feasible
        target = cl.ttft_target_s
        for i in range(lo, hi):
            t = arrival[i]
            if heap and heap[0][0] <= t:
                cl.advance(t)
            job = Job(i, t, prompt[i], output[i], media[i], None, t + target(prompt[i]))
            cl.submit(job, t)
            if feasible[i]:
                tr.open[i] = job
            if allowed is not None and (i - lo) % _CHECK_EVERY == _CHECK_EVERY - 1:
                tr.update(t)
                if tr.misses > allowed:
                    return False
        if until is not None:
            cl.advance(until)
            tr.update(until)
            return True
        t = arrival[hi - 1] if hi > lo else cl.now
        limit = math.inf if allowed is None else allowed
        while True:
            tr.update(t)
            if tr.misses > limit:
                return False
            if not tr.open or tr.misses + len(tr.open) <= limit:
                return True
            nxt = cl.next_event_time()
            if nxt == INF:  # nothing left to run: the open requests never finish
                tr.misses += len(tr.open)
                tr.open.clear()
                return tr.misses <= limit
            t = max(t + _TAIL_STEP_S, nxt)
            cl.advance(t)


def _label(sizes: dict[str, int]) -> str:
    """A fleet in short: 1E+3P+4D (encoder, prefill, decode workers)."""
    return "+".join(f"{n}{p[0].upper()}" for p, n in sizes.items())


def _allowed_misses(target: float, judged: int) -> int:
    return math.floor((1.0 - target) * judged + 1e-9)


def _gpus(s: EvalSettings, sizes: dict[str, int]) -> int:
    return sum(int(n) * s.gpus_per_replica.get(p, 1) for p, n in sizes.items())


def _shrink_to_budget(s: EvalSettings, sizes: dict[str, int], lo_n: int) -> dict[str, int]:
    """`sizes` within the GPU budget: the largest pool (the first of equals) loses a worker, in
    turn, until the fleet fits or every pool is at `lo_n`."""
    out = dict(sizes)
    order = list(out)
    while s.gpu_budget is not None and _gpus(s, out) > s.gpu_budget:
        over = [p for p in order if out[p] > lo_n]
        if not over:
            break
        largest = max(over, key=lambda p: (out[p], -order.index(p)))
        out[largest] -= 1
    return out


# --------------------------------------------------------------------------- hindsight oracle


def oracle_schedule(
    w: Workload,
    s: EvalSettings,
    target: float | None = None,
    progress: Callable[[str], None] | None = None,
    margin: float = ORACLE_AIM_MARGIN,
) -> tuple[list[dict[str, int]], SearchStats]:
    """Per decision interval (``s.interval_s``), the fewest workers per pool meeting `target`.

    Interval k covers arrivals in [k x interval, (k+1) x interval). For each, from the
    simulated state at its start (queues carried over), a trial simulates the
    interval's arrivals on candidate pool sizes until each of its feasible arrivals
    has met or missed the SLO. A fleet (every pool the workload needs: the encoder
    pool too when some request carries media) passes when its misses - among the
    interval's arrivals and the earlier requests still undecided at its start -
    stay within ``(1 - aim)`` x the interval's feasible arrivals, or within the
    misses the whole run so far may still afford if that is more; ``aim`` is the
    target plus `margin` (default `ORACLE_AIM_MARGIN`) of its allowed misses
    (later intervals' sizes can still hurt requests in flight). Search:
    `_search_pools` from the previous interval's sizes. The chosen sizes are applied at the interval's
    start with no start-up delay; the state then advances to the next interval.
    """
    target = s.target_attainment if target is None else target
    aim = target + margin * (1.0 - target)
    t0 = time.perf_counter()
    stats = SearchStats()
    tr = _Trace(w, s)
    if tr.n == 0:
        return [dict.fromkeys(tr.pools, s.min_replicas)], stats
    iv = s.interval_s
    end = tr.arrival[-1]
    n_int = int(end // iv) + 1
    bounds = np.searchsorted(np.asarray(tr.arrival), np.arange(n_int + 1) * iv, side="left").tolist()
    bounds[-1] = tr.n
    lo_n = max(1, s.min_replicas)
    cap = s.max_replicas
    base, btr = tr.cluster(dict.fromkeys(tr.pools, 1))
    judged_total = 0  # feasible arrivals so far
    schedule: list[dict[str, int]] = []
    prev = dict.fromkeys(tr.pools, lo_n)
    for k in range(n_int):
        t_k = k * iv
        a, b = bounds[k], bounds[k + 1]
        base.advance(t_k)
        _reap(base, t_k)
        btr.update(t_k)
        new = sum(tr.feasible[a:b])
        judged_total += new
        # the interval's share of the run's allowance (fractions carried over, so small intervals
        # get a miss every few intervals), or more while earlier intervals left some unspent
        share = _allowed_misses(aim, judged_total) - _allowed_misses(aim, judged_total - new)
        allowed = max(share, _allowed_misses(aim, judged_total) - btr.misses)

        def trial(
            sizes: dict[str, int], limit: int | None, a: int = a, b: int = b, t_k: float = t_k
        ) -> tuple[bool, int]:
            cl, ctr = _clone(base, btr)
            _resize(cl, sizes, t_k)
            stats.simulations += 1
            return tr.run(cl, ctr, a, b, allowed=limit), ctr.misses

        chosen, reached = _search_pools(
            trial, tr.pools, prev, lo_n, cap, allowed, s, spare_when_short=max(allowed, ROUTING_NOISE_MISSES)
        )
        stats.reached = stats.reached and reached
        stats.short_intervals += not reached
        schedule.append(chosen)
        prev = chosen
        _resize(base, chosen, t_k)
        tr.run(base, btr, a, b, until=min((k + 1) * iv, end) if k + 1 < n_int else None)
        if progress is not None and (k % 20 == 0 or k == n_int - 1):
            progress(f"oracle: interval {k + 1}/{n_int}, {_label(chosen)}, {stats.simulations} simulations")
    stats.wall_s = time.perf_counter() - t0
    stats.misses, stats.judged = btr.misses, judged_total  # the search's own whole-trace count
    return schedule, stats


def _search_pools(
    trial: Callable[[dict[str, int], int | None], tuple[bool, int]],
    pools: tuple[str, ...],
    start: dict[str, int],
    lo_n: int,
    cap: int,
    allowed: int,
    s: EvalSettings,
    max_doublings: int = 3,
    probe: bool = False,
    spare_when_short: int = 0,
    trade: bool = False,
) -> tuple[dict[str, int], bool]:
    """Fewest workers per pool whose trial has at most `allowed` misses; (sizes, target reached).

    `pools` are the pools searched (encoder, prefill, decode for a media workload;
    prefill, decode otherwise). `trial(sizes, limit)` -> (passed, misses); limit None
    counts every miss. A local search from `start` for trials monotone in every
    pool. If `start`, or `start` with one more worker in one pool (decode first,
    then prefill, then encoder), passes, shrink each pool in turn (encoder,
    prefill, decode) as far as it passes (galloping down, then bisection).
    Otherwise count the misses of a generous fleet (twice `start` plus 4 per pool,
    doubled at most `max_doublings` times while that at least halves them, by 2 or
    more: smaller drops are routing noise); what even that fleet misses cannot be
    helped by more workers, so if it exceeds `allowed` the target is not reached and
    the limit becomes those misses plus `spare_when_short`. The oracle spares its
    interval's allowance, at least the routing noise (`ROUTING_NOISE_MISSES`): a
    limit of exactly the generous fleet's misses fails smaller fleets on routing
    ties alone, the search then stays at the generous sizes and the next interval
    starts from them. Then each pool in turn is shrunk to the
    smallest size passing with the pools before it at their found sizes and those
    after it at their generous sizes, searched from `start`. Either way the result
    passes and, by monotonicity, one worker fewer in any pool fails. With `probe`,
    fleets 2 and 3 workers below in each pool are tried too (trials are monotone
    only up to routing noise of a few misses), and the search shrinks again from
    the cheapest that passes.

    Shrinking one pool at a time stops at a fleet where no pool can lose a worker,
    which can cost far more than the cheapest one when the pools trade off (a
    prefill worker more, hundreds of decode workers fewer). With `trade`, the search
    then moves by trades: for each pool and each of `TRADE_STEPS`, that many workers
    more in the pool and the other pools shrunk in turn from their current sizes
    (the last only tried at the largest size that would cost fewer GPUs, and shrunk
    from there if that passes: one trial rejects a trade that cannot pay). Of the
    trades landing on a passing fleet with fewer GPUs (`_gpus`: pools may differ in
    GPUs per worker) the cheapest is taken, its grown pool shrunk again, and the
    trades are tried anew from there, at most `MAX_TRADES` times. Unless that bound
    stops it, the result then also has, by monotonicity, no cheaper passing fleet
    one such trade away; it still need not be the cheapest fleet overall.

    Fleets over the GPU budget fail, and no pool grows past `cap`. Trials are
    memoised: under one limit no fleet is tried twice.
    """
    k = len(pools)

    def sizes_of(c: tuple[int, ...]) -> dict[str, int]:
        return dict(zip(pools, c, strict=True))

    def fits(c: tuple[int, ...]) -> bool:
        return s.gpu_budget is None or _gpus(s, sizes_of(c)) <= s.gpu_budget

    def with_size(c: tuple[int, ...], i: int, n: int) -> tuple[int, ...]:
        return (*c[:i], n, *c[i + 1 :])

    def shrink_to_budget(c: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(_shrink_to_budget(s, sizes_of(c), lo_n).values())

    memo: dict[tuple[int, ...], bool] = {}
    limit = allowed

    def gpus(c: tuple[int, ...]) -> int:
        return _gpus(s, sizes_of(c))

    def ok(c: tuple[int, ...]) -> bool:
        if c not in memo:
            memo[c] = fits(c) and trial(sizes_of(c), limit)[0]
        return memo[c]

    x0 = tuple(max(lo_n, min(cap, start.get(p, lo_n))) for p in pools)
    reached = True
    neighbours = [c for i in reversed(range(k)) if (c := with_size(x0, i, min(cap, x0[i] + 1))) != x0]
    if ok(x0):
        big = x0
    elif any(ok(c) for c in neighbours):  # the common case of a small rise: one more worker
        big = next(c for c in neighbours if memo.get(c))
    else:
        big = shrink_to_budget(tuple(min(cap, 2 * n + 4) for n in x0))
        _passed, misses = trial(sizes_of(big), None)
        for _ in range(max_doublings):
            if misses <= allowed:
                break
            bigger = shrink_to_budget(tuple(min(cap, 2 * n) for n in big))
            if bigger == big:
                break
            _passed, m2 = trial(sizes_of(bigger), None)
            if misses - m2 < max(ROUTING_NOISE_MISSES, misses / 2):  # not a capacity shortage: stop
                break
            big, misses = bigger, m2
        if misses > allowed:  # out of reach: what more workers cannot prevent, and the spare
            reached = False
            limit = misses + spare_when_short
            memo.clear()
        memo[big] = True

    def shrink(c: tuple[int, ...], guess: tuple[int, ...]) -> tuple[int, ...]:
        """Each pool in turn to its smallest passing size (from `guess`), the others held."""
        for i in range(k):
            c = with_size(
                c, i, max(lo_n, smallest_passing(lambda n, c=c, i=i: ok(with_size(c, i, n)), guess[i], c[i]))
            )
        return c

    best = shrink(big, x0)
    if probe:  # routing noise makes trials not quite monotone: look a little further down
        below = [
            with_size(best, i, best[i] - d) for i in reversed(range(k)) for d in (2, 3) if best[i] - d >= lo_n
        ]
        passing = [c for c in below if ok(c)]
        if passing:
            cheapest = min(passing, key=lambda c: (gpus(c), c))
            best = shrink(cheapest, cheapest)

    def traded(c: tuple[int, ...], i: int, step: int, near: tuple[int, ...] | None) -> tuple[int, ...] | None:
        """Passing `c` with `step` more workers in pool i and the other pools shrunk in turn,
        if that fleet passes with fewer GPUs than `c`; else None. `near`: a smaller trade's
        fleet in the same pool, where the other pools' searches start."""
        if c[i] + step > cap:
            return None
        t = with_size(c, i, c[i] + step)  # passes as `c` does, by monotonicity: not tried
        *first, last = (j for j in range(k) if j != i)
        for j in first:
            guess = t[j] if near is None else near[j]
            size = smallest_passing(lambda n, t=t, j=j: n == t[j] or ok(with_size(t, j, n)), guess, t[j])
            t = with_size(t, j, max(lo_n, size))
        # the most workers the last pool may keep for the fleet to cost fewer GPUs than `c`
        over = gpus(t) - gpus(c)
        keep = min(t[last], t[last] - over // s.gpus_per_replica.get(pools[last], 1) - 1)
        if keep < lo_n or not ok(with_size(t, last, keep)):  # by monotonicity, fewer fail too
            return None
        guess = keep if near is None else near[last]
        size = smallest_passing(lambda n: ok(with_size(t, last, n)), guess, keep)
        return with_size(t, last, max(lo_n, size))

    for _ in range(MAX_TRADES if trade else 0):
        moves: list[tuple[int, ...]] = []
        for i in range(k):
            near = None  # a larger trade in the same pool lands near the smaller one's fleet
            for step in TRADE_STEPS:
                if (t := traded(best, i, step, near)) is not None:
                    moves.append(t)
                    near = t
        if not moves:
            break
        cheapest = min(moves, key=lambda c: (gpus(c), c))
        best = shrink(cheapest, cheapest)  # the grown pool may now do with fewer than it gained
    return sizes_of(best), reached


class _OutOfTrials(Exception):
    """The frontier sweep asked for its last allowed trial (`_sweep_frontier`)."""


def _sweep_frontier(
    ok: Callable[[int, int], bool],
    best: tuple[int, int],
    gpus_per_worker: tuple[int, int],
    lo_n: int,
    cap: int,
    max_trials: int,
) -> tuple[tuple[int, int], dict[str, Any]]:
    """The cheapest passing two-pool fleet (prefill p, decode d), checked at every prefill
    count that could beat `best`, a passing fleet; returns (fleet, what was checked).

    For trials monotone in both pools. A fleet cheaper than `best` costs at most C - 1 GPUs
    (C: best's), so it holds at most `p_top` prefill and `d_top` decode workers (the other
    pool at `lo_n`). Every passing fleet with p <= p_top has at least `d_floor` decode
    workers, the fewest that pass beside p_top prefill workers, and at least `p_floor`
    prefill workers, the fewest that pass beside d_top decode workers. Then for each p from
    p_floor up, one trial at the most decode workers that still cost less than C: if it
    fails, no fleet with that p is cheaper; if it passes, its decode pool is shrunk to its
    smallest passing size and that fleet becomes `best`. The sweep stops once even d_floor
    decode workers beside p prefill cost C or more. Unlike the local search, nothing cheaper
    is left anywhere, up to the trials' routing noise. `max_trials` bounds the trials asked
    (memoised ones included); when it runs out, the prefill counts not yet checked are
    reported (`complete` False, `unchecked_from_prefill`: the first prefill count not
    settled, None when the bounds were not found yet) and the cheapest fleet found so far
    is returned.
    """
    gp, gd = gpus_per_worker
    asked = 0

    def test(p: int, d: int) -> bool:
        nonlocal asked
        if asked >= max_trials:
            raise _OutOfTrials
        asked += 1
        return ok(p, d)

    def cost(p: int, d: int) -> int:
        return p * gp + d * gd

    settled_below: int | None = None  # every prefill count below this one is settled
    try:
        c = cost(*best)
        p_top = min(cap, (c - 1 - lo_n * gd) // gp)
        d_top = min(cap, (c - 1 - lo_n * gp) // gd)
        if p_top < lo_n or d_top < lo_n:
            return best, {"complete": True, "trials": asked}
        # beside more prefill workers than `best` has, `best`'s decode pool passes too
        d_floor = max(lo_n, smallest_passing(lambda d: test(max(p_top, best[0]), d), best[1], best[1]))
        # beside more decode workers than `best` has, `best`'s prefill pool passes too
        p = max(lo_n, smallest_passing(lambda p: test(p, max(d_top, best[1])), best[0], best[0]))
        settled_below = p
        while True:
            d_cap = min(cap, (cost(*best) - 1 - p * gp) // gd)
            if d_cap < max(lo_n, d_floor):
                break  # so is every larger prefill count's
            if p != best[0] and test(p, d_cap):
                d = smallest_passing(lambda d, p=p: test(p, d), d_cap, d_cap)
                best = (p, d)
            p += 1
            settled_below = p
        return best, {"complete": True, "trials": asked}
    except _OutOfTrials:
        return best, {"complete": False, "trials": asked, "unchecked_from_prefill": settled_below}


class HindsightOraclePolicy(Policy):
    """`oracle`: replays the hindsight oracle's schedule (see oracle_schedule), instantly."""

    name = "oracle"
    instant = True

    def __init__(
        self,
        s: EvalSettings,
        w: Workload,
        pre: Any,
        schedule: list[dict[str, int]] | None = None,
        stats: SearchStats | None = None,
    ) -> None:
        super().__init__(s, w, pre)
        self.schedule: list[dict[str, int]] = list(schedule or [])
        self.stats = stats or SearchStats()

    def initial(self) -> dict[str, int]:
        if not self.schedule:  # search now unless given the schedule
            h = hindsight_oracle(self.w, self.s)
            self.schedule, self.stats = h.schedule, h.stats
        return dict(self.schedule[0])

    def decide(self, o: Obs) -> tuple[dict[str, int], str]:
        k = round(o.now / self.s.interval_s)
        return dict(self.schedule[min(k, len(self.schedule) - 1)]), "oracle"

    def report(self) -> dict[str, Any]:
        sched = self.schedule
        return {
            "target_attainment": self.s.target_attainment,
            "replicas_mean": {p: round(sum(x[p] for x in sched) / len(sched), 3) for p in sched[0]},
            "replicas_max": {p: max(x[p] for x in sched) for p in sched[0]},
            **self.stats.to_dict(),
        }


# --------------------------------------------------------------------------- best fixed fleet


class FixedPolicy(Policy):
    """Fixed pool sizes for the whole trace (the best fixed fleet's replay)."""

    name = "fixed"

    def __init__(self, s: EvalSettings, w: Workload, pre: Any, sizes: dict[str, int]) -> None:
        super().__init__(s, w, pre)
        self.sizes = dict(sizes)

    def initial(self) -> dict[str, int]:
        return dict(self.sizes)

    def decide(self, o: Obs) -> tuple[dict[str, int], str]:
        return dict(self.sizes), "fixed"


# Whole-trace trials of fixed fleets by (fleet, miss limit): (passed, misses).
FleetTrials = dict[tuple[tuple[tuple[str, int], ...], int | None], tuple[bool, int]]


def best_static(
    w: Workload,
    s: EvalSettings,
    target: float | None = None,
    guess: dict[str, int] | None = None,
    progress: Callable[[str], None] | None = None,
    trials: FleetTrials | None = None,
    frontier_trials: int = FRONTIER_MAX_TRIALS,
) -> tuple[dict[str, int], SearchStats]:
    """Fewest fixed workers per pool reaching `target` over the whole trace.

    The pools are those the workload needs (the encoder pool too when some request
    carries media). Each trial simulates the whole trace on fixed pools and stops as
    soon as the misses exceed ``(1 - target)`` x the feasible requests. Search:
    `_search_pools` from `guess` (e.g. the oracle's mean sizes; 2 per pool it
    lacks), probing 2-3 workers below, then trading workers between the pools
    (`TRADE_STEPS` more in one pool, the others shrunk) while that finds a passing
    fleet with fewer GPUs. The result passes, one worker fewer in any pool does
    not, and (unless `MAX_TRADES` stopped it) no single trade of those sizes
    passes for fewer GPUs, all by monotonicity. For a text-only workload (prefill and
    decode) the search then sweeps every prefill count that could hold a cheaper fleet
    (`_sweep_frontier`, at most `frontier_trials` trials; `stats.frontier` says how far it
    got): when it completes, no cheaper fixed fleet passes anywhere, by monotonicity. With
    an encoder pool, or when the sweep runs out of trials, a cheaper fleet further away can
    still exist. `trials`, filled in, holds the trials already run for this trace,
    settings and target: searches from several guesses sharing it simulate no
    fleet twice (`stats.simulations` counts only the new ones).
    """
    target = s.target_attainment if target is None else target
    t0 = time.perf_counter()
    stats = SearchStats()
    tr = _Trace(w, s)
    allowed = _allowed_misses(target, sum(tr.feasible))
    known: FleetTrials = {} if trials is None else trials

    def trial(sizes: dict[str, int], limit: int | None) -> tuple[bool, int]:
        key = (tuple(sizes.items()), limit)
        if key not in known:
            cl, ctr = tr.cluster(sizes)
            stats.simulations += 1
            passed = tr.run(cl, ctr, 0, tr.n, allowed=limit)
            if progress is not None:
                progress(f"best-static: {_label(sizes)} {'passes' if passed else 'misses'}")
            known[key] = passed, ctr.misses
        return known[key]

    g = guess or {}
    lo_n = max(1, s.min_replicas)
    prev = {p: max(lo_n, int(g.get(p, 2))) for p in tr.pools}
    sizes, reached = _search_pools(
        trial, tr.pools, prev, lo_n, s.max_replicas, allowed, s, probe=True, trade=True
    )
    if reached and tr.pools == (POOL_PREFILL, POOL_DECODE) and frontier_trials > 0:
        # No GPU-budget check: every fleet the sweep may return costs less than the one found,
        # which fits; the larger fleets it tries only bound the others, by monotonicity.
        found, stats.frontier = _sweep_frontier(
            lambda p, d: trial({POOL_PREFILL: p, POOL_DECODE: d}, allowed)[0],
            (sizes[POOL_PREFILL], sizes[POOL_DECODE]),
            (s.gpus_per_replica.get(POOL_PREFILL, 1), s.gpus_per_replica.get(POOL_DECODE, 1)),
            lo_n,
            s.max_replicas,
            frontier_trials,
        )
        sizes = {POOL_PREFILL: found[0], POOL_DECODE: found[1]}
    stats.wall_s = time.perf_counter() - t0
    stats.reached = reached
    return sizes, stats


def fixed_fleet_metrics(w: Workload, s: EvalSettings, sizes: dict[str, int]) -> dict[str, Any]:
    """Replay fixed pools through the evaluation loop (the same accounting as every policy)."""
    res = run_policy("fixed", w, s, make=lambda s_, w_, pre: FixedPolicy(s_, w_, pre, sizes))
    return {**res.metrics, "replicas": dict(sizes)}


# --------------------------------------------------------------------------- oracle with guarantees

# Repairs of a per-interval schedule whose replay misses the target: every interval's pools
# grown by this share (at least one worker each), tried in turn until one reaches the target.
ORACLE_REPAIR_PADS = (0.1, 0.25, 0.5)


@dataclass
class Hindsight:
    """The hindsight references of one trace: the oracle's schedule and replay, the best fixed fleet."""

    schedule: list[dict[str, int]]
    stats: SearchStats  # the oracle's search (every pass)
    oracle: PolicyResult  # replay of `schedule` through the evaluation loop
    fixed: dict[str, int]  # the best fixed fleet
    fixed_stats: SearchStats
    fixed_metrics: dict[str, Any]  # its replay (fixed_fleet_metrics)


def _reaches(m: dict[str, Any], target: float) -> bool:
    a = m.get("slo_attainment")
    return a is not None and a + _EPS >= target


def _better(m: dict[str, Any], other: dict[str, Any], target: float) -> bool:
    """Replay `m` beats `other`: it reaches the target and `other` does not, or both do and it
    costs fewer GPU-hours, or neither does and its attainment is higher."""
    if _reaches(m, target) != _reaches(other, target):
        return _reaches(m, target)
    if _reaches(m, target):
        return m["gpu_hours"] < other["gpu_hours"]
    return (m["slo_attainment"] or 0.0) > (other["slo_attainment"] or 0.0)


def hindsight_oracle(
    w: Workload,
    s: EvalSettings,
    target: float | None = None,
    progress: Callable[[str], None] | None = None,
    fixed_floor: bool = True,
) -> Hindsight:
    """The hindsight oracle with the guarantees the yardstick states, and the best fixed fleet.

    1. The per-interval search (`oracle_schedule`), replayed through the evaluation
       loop. The replay can miss the target although the search's own simulation met
       it: routing ties break differently and requests on the knife-edge of the TTFT
       target flip (Mooncake conversation x1: 98.96 % in the search, 97.9 % in the
       replay). Then every interval's pools are grown by `ORACLE_REPAIR_PADS` in turn
       (each a replay) until one reaches the target.
    2. The best fixed fleet (`best_static`, searched from the schedule's mean sizes,
       before and after a repair when one was kept: the cheaper replay; the second
       search reuses the first's trials) and its replay. Each search trades workers
       between the pools after shrinking them, so it does not stop where no single
       pool can shrink but one more worker in one pool spares several in another.
    3. A fixed fleet is a schedule too: if it reaches the target and the pass does
       not, or reaches it for fewer GPU-hours, the oracle's schedule becomes that
       fleet at every interval (``schedule_source: best-static``).

    Without `fixed_floor` steps 2 and 3 are skipped (faster; no guarantee; `fixed` is empty).

    So the oracle reaches the target whenever the best fixed fleet does and never
    costs more GPU-hours than it (both replays through the same loop). It is not a
    proof that no schedule is cheaper: see `fluid_bound` for a true (loose) bound.
    """
    target = s.target_attainment if target is None else target
    s_t = replace(s, target_attainment=target)
    t0 = time.perf_counter()
    total = SearchStats(source="search")

    def replay(schedule: list[dict[str, int]]) -> PolicyResult:
        return run_policy(
            "oracle", w, s_t, make=lambda s_, w_, pre: HindsightOraclePolicy(s_, w_, pre, schedule, total)
        )

    sched, st = oracle_schedule(w, s_t, target, progress)
    total.simulations, total.short_intervals, total.passes = st.simulations, st.short_intervals, 1
    res = replay(sched)
    searched = sched
    for pad in ORACLE_REPAIR_PADS:
        if progress is not None:
            m = res.metrics
            progress(f"oracle replay: {m['slo_attainment'] or 0.0:.4f} at {m['gpu_hours']:.2f} GPU-h")
        if _reaches(res.metrics, target):
            break
        # grown, but never past the GPU budget (the searched sizes fit it: the search fails
        # fleets over it): a reference that broke the budget would flatter nothing fairly
        lo_n = max(1, s.min_replicas)
        padded = [
            _shrink_to_budget(
                s, {p: min(s.max_replicas, n + max(1, math.ceil(pad * n))) for p, n in x.items()}, lo_n
            )
            for x in searched
        ]
        total.passes += 1
        res2 = replay(padded)
        if _better(res2.metrics, res.metrics, target):
            sched, res = padded, res2
            total.source = f"search+{pad:g}"
    fixed: dict[str, int] = {}
    fst, fm = SearchStats(), {}
    if fixed_floor:
        # the local search depends on its start: from the searched schedule's mean sizes, and
        # from the repaired one's too when a repair was kept (the cheaper replay wins); the
        # second search reuses the first's trials
        trials: FleetTrials = {}
        guesses: list[dict[str, int]] = []
        for cand in (searched, sched):
            guess = {p: math.ceil(sum(x[p] for x in cand) / len(cand)) for p in cand[0]}
            if guess not in guesses:
                guesses.append(guess)
        for guess in guesses:
            if progress is not None:
                progress(f"searching the best fixed fleet from {_label(guess)} ...")
            f2, fst2 = best_static(w, s_t, target, guess=guess, progress=progress, trials=trials)
            sims, wall = fst.simulations + fst2.simulations, fst.wall_s + fst2.wall_s
            if f2 != fixed:
                fm2 = fixed_fleet_metrics(w, s_t, f2)
                if not fm or _better(fm2, fm, target):
                    fixed, fst, fm = f2, fst2, fm2
            fst.simulations, fst.wall_s = sims, wall  # the cost of every search run
    if fixed_floor and _better(fm, res.metrics, target):
        total.source = "best-static"
        sched = [dict(fixed)]
        res = replay(sched)
    total.reached = _reaches(res.metrics, target)
    total.wall_s = time.perf_counter() - t0
    res.metrics.update(HindsightOraclePolicy(s_t, w, None, sched, total).report())
    return Hindsight(sched, total, res, fixed, fst, fm)


def fluid_bound(w: Workload, s: EvalSettings, target: float | None = None) -> dict[str, Any]:
    """A true lower bound on the GPU-hours of any schedule reaching `target` attainment.

    Work-conserving ("fluid") accounting: the requests served within the SLO - at
    least ``ceil(target x feasible requests)`` of them - each need their prefill
    service time (`PrefillModel.service_ms`, one prompt at a time as the
    simulator's prefill workers serve them), their encoder time (media) and decode
    time. A decode worker yields at most ``slots / step(slots)`` tokens a second
    (every step at the full batch, ITL ignored), and holds at most
    ``kv_cache_tokens`` of KV, which a sequence reserves (prompt + output, at most
    the whole cache) for at least ``output x step(1)``; the decode pool needs the
    larger of the two. Per pool and per resource the cheapest such requests are
    counted, times the pool's GPUs per replica. No pool holds fewer than
    ``min_replicas`` replicas from the first to the last arrival (the floor).
    Disaggregated placement: per pool the larger of its work and its floor, summed;
    other placements share workers between stages, so the larger of all the work
    and all the floors. Ignores queueing, the SLO's latency and start-up times, so
    it is loose wherever a pool must run below full utilisation to meet the SLO.
    """
    target = s.target_attainment if target is None else target
    feas = ~infeasible_mask(w, s)
    need = math.ceil(target * int(feas.sum()) - 1e-9)
    m = s.models
    g = s.gpus_per_replica
    pools = pools_for(w)
    prompt = w.prompt_tokens[feas].astype(float)
    output = w.output_tokens[feas].astype(float)
    dec = m.decode
    token_s = output * float(dec.step_ms(dec.slots)) / dec.slots / 1000.0
    footprint = np.minimum(prompt + output, float(dec.kv_cache_tokens))
    kv_s = footprint * output * float(dec.step_ms(1)) / 1000.0 / float(dec.kv_cache_tokens)

    def cheapest(x: np.ndarray) -> float:
        return float(np.sort(x)[:need].sum()) if need > 0 else 0.0

    work_s = {
        POOL_PREFILL: cheapest(np.asarray(m.prefill.service_ms(prompt), dtype=float).reshape(-1) / 1000.0),
        POOL_DECODE: max(cheapest(token_s), cheapest(kv_s)),
    }
    if POOL_ENCODER in pools:
        items = w.media_items[feas]
        enc_ms = np.asarray(m.encoder.service_ms(np.maximum(items, 1)), dtype=float).reshape(-1)
        work_s[POOL_ENCODER] = cheapest(np.where(items > 0, enc_ms, 0.0) / 1000.0)
    work_s = {p: v * g.get(p, 1) for p, v in work_s.items()}
    duration = float(w.arrival_s[-1]) if len(w) else 0.0  # the replay runs from t = 0
    floor = {p: s.min_replicas * g.get(p, 1) * duration for p in pools}
    if s.placement == "disaggregated":
        total_s = sum(max(work_s[p], floor[p]) for p in pools)
    else:
        total_s = max(sum(work_s.values()), sum(floor.values()))
    return {
        "gpu_hours": total_s / 3600.0,
        "work_gpu_hours": {p: v / 3600.0 for p, v in work_s.items()},
        "floor_gpu_hours": {p: v / 3600.0 for p, v in floor.items()},
        "target_attainment": target,
    }
