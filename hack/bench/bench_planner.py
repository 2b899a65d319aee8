#!/usr/bin/env python3
"""Benchmark: plan 1,000 demand points; print the median of repeated runs against the 50 ms target.

Times are CPU time of this process (`time.process_time`; the planner is single-threaded,
so on an idle machine CPU equals wall time): the dev box is shared and its wall time
grows with everyone else's load. Even CPU time grows on a busy box (shared caches and
cores), so the load average is printed beside the figures, the rows are timed
round-robin (one run of each per round) and the sizes row is also given as a ratio to
the distinct row (a ratio moves less with the load than either figure).

Usage: python hack/bench/bench_planner.py [--repeats N]

Workloads (1,000 points each):
  distinct  1,000 different demand points: arrival rate, prompt/output token means
            AND spreads all drawn at random, so no per-shape setup is ever reused;
            every planner cache is cleared before each run (cold)
  repeated  1,000 arrival rates (0..60 rps) over 10 request shapes (what an autoscaler
            or `disagg plan --sweep` does: the same shapes re-planned at new rates)
  sizes     1,000 demand points, each with its own request-size distribution (engine
            histograms: 1-2-5 buckets, 4 classes each) and arrival ca^2 (disagg.sizes;
            target 100 ms, issue 14); every run plans new (equal) distributions, so what
            a distribution caches about itself (its slices) is computed inside the timed
            call, as in the operator, where each decision builds a new one
  sweep     1,000 arrival rates (0..60 rps) over one request-size distribution, what
            `disagg plan --trace FILE --sweep` plans (target 100 ms, as sizes): the
            distribution's classes and covers are derived once, each rate plans the pools

Entry points:
  plan()          the call the operator makes (operator/disagg/loop.py):
                  plan(demand, models, slo, bounds, budget, placement, chunked=...)
  plan() fresh    the same, but with new (equal) models/slo/bounds objects for every
                  point, as api.planner_inputs builds them each interval (objects built
                  before the clock starts; only plan() is timed)
  plan_replicas() replica counts only, no Plan objects

No assertion: this prints numbers.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import math
import os
import random
import statistics
import time
from collections.abc import Callable

from disagg import planner
from disagg.model import StageModels
from disagg.planner import SLO, Demand, PoolBounds, plan, plan_replicas
from disagg.sizes import SizeDistribution, demand_with_sizes

TARGET_MS = 50.0
SIZES_TARGET_MS = 100.0  # with request-size distributions (issue 14)
N = 1000
# token histogram bucket bounds, 1-2-5 as vLLM exports them
BUCKET_EDGES = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000]


def repeated_points(n: int = N) -> list[Demand]:
    rng = random.Random(7)
    shapes = [
        dict(
            prompt_tokens_mean=rng.choice([500, 2000, 6000, 12000]),
            output_tokens_mean=rng.choice([100, 400, 1000]),
            prompt_tokens_std=rng.choice([0, 500, 2000]),
            output_tokens_std=rng.choice([0, 200]),
            media_fraction=rng.choice([0.0, 0.0, 0.3]),
        )
        for _ in range(10)
    ]
    return [Demand(arrival_rps=60.0 * i / n, **shapes[i % len(shapes)]) for i in range(n)]


def distinct_points(n: int = N) -> list[Demand]:
    rng = random.Random(11)
    return [
        Demand(
            arrival_rps=rng.uniform(0, 60),
            prompt_tokens_mean=rng.uniform(200, 12000),
            prompt_tokens_std=rng.uniform(0, 3000),
            output_tokens_mean=rng.uniform(50, 1500),
            output_tokens_std=rng.uniform(0, 500),
        )
        for _ in range(n)
    ]


def _histogram(rng: random.Random, edges: list[float], scale: float) -> list[tuple[float, float]]:
    """Cumulative bucket counts of a random log-normal-ish sample (what the engines export)."""
    xs = [rng.lognormvariate(math.log(scale), rng.uniform(0.3, 1.3)) for _ in range(200)]
    return [(e, float(sum(x <= e for x in xs))) for e in edges] + [(math.inf, float(len(xs)))]


def size_points(n: int = N) -> list[Demand]:
    rng = random.Random(13)
    return [
        demand_with_sizes(
            rng.uniform(0, 60),
            SizeDistribution.from_buckets(
                _histogram(rng, BUCKET_EDGES, rng.uniform(300, 6000)),
                _histogram(rng, BUCKET_EDGES, rng.uniform(50, 800)),
            ),
            arrival_ca2=rng.uniform(0.8, 4.0),
        )
        for _ in range(n)
    ]


def sweep_points(n: int = N) -> list[Demand]:
    rng = random.Random(17)
    sizes = SizeDistribution.from_buckets(
        _histogram(rng, BUCKET_EDGES, 2000.0), _histogram(rng, BUCKET_EDGES, 300.0)
    )
    return [demand_with_sizes(60.0 * i / n, sizes) for i in range(n)]


def fresh_sizes(pts: list[Demand]) -> list[Demand]:
    """The same demands with new, equal size distributions, built as the operator builds them
    (`demand_with_sizes`, which reads their means): their slices are not cached yet. Demands
    that shared a distribution share its new one (a sweep plans one distribution)."""
    new: dict[int, SizeDistribution] = {}

    def renewed(sizes: SizeDistribution) -> SizeDistribution:
        got = new.get(id(sizes))
        if got is None:
            got = new[id(sizes)] = SizeDistribution(*dataclasses.astuple(sizes))
        return got

    return [
        demand_with_sizes(d.arrival_rps, renewed(d.sizes), arrival_ca2=d.arrival_ca2)
        if d.sizes is not None
        else d
        for d in pts
    ]


def operator_args() -> tuple[StageModels, SLO, dict[str, PoolBounds]]:
    """What api.planner_inputs(...).plan passes for a default DisaggDeployment (no budget, disaggregated, serial)."""
    bounds = {
        "encoder": PoolBounds(0, 10_000, 1),
        "prefill": PoolBounds(1, 10_000, 1),
        "decode": PoolBounds(1, 10_000, 1),
    }
    return StageModels(), SLO(), bounds


def timed_round_robin(
    jobs: list[tuple[str, Callable[[], Callable[[], object]]]], repeats: int
) -> dict[str, float]:
    """Median CPU time (ms) of each job over `repeats` rounds, every planner cache cleared before each run.

    A job is made anew for every run, outside the clock (its inputs' own caches start
    empty), and only the call it returns is timed. The jobs run round-robin (one run of
    each per round), so a change in the shared machine's load falls on every row alike
    and ratios between rows stay comparable.
    """
    times: dict[str, list[float]] = {name: [] for name, _ in jobs}
    for _ in range(repeats):
        for name, make in jobs:
            fn = make()
            planner._clear_caches()
            t0 = time.process_time()
            fn()
            times[name].append((time.process_time() - t0) * 1000.0)
    return {name: statistics.median(ts) for name, ts in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    print(
        f"planning {N:,} demand points; CPU ms, median of {args.repeats} runs; target {TARGET_MS:.0f} ms "
        f"({SIZES_TARGET_MS:.0f} ms with sizes); load average {os.getloadavg()[0]:.1f}"
    )
    sets = (
        ("distinct", distinct_points()),
        ("repeated", repeated_points()),
        ("sizes", size_points()),
        ("sweep", sweep_points()),
    )
    targets = {"sizes": SIZES_TARGET_MS, "sweep": SIZES_TARGET_MS}
    jobs: list[tuple[str, Callable[[], Callable[[], object]]]] = []
    for name, pts in sets:
        models, slo, bounds = operator_args()
        fresh = [operator_args() for _ in pts]

        def op(pts: list[Demand], models=models, slo=slo, bounds=bounds) -> object:
            return [plan(d, models, slo, bounds, None, "disaggregated", chunked=False) for d in pts]

        def op_fresh(pts: list[Demand], fresh=fresh) -> object:
            return [
                plan(d, m, s, b, None, "disaggregated", chunked=False)
                for d, (m, s, b) in zip(pts, fresh, strict=True)
            ]

        def reps(pts: list[Demand], models=models, slo=slo, bounds=bounds) -> object:
            return plan_replicas(pts, models, slo, bounds)

        for entry, fn in (("plan()", op), ("plan() fresh", op_fresh), ("plan_replicas()", reps)):
            jobs.append(
                (f"{name:<9}{entry:<17}", lambda fn=fn, pts=pts: functools.partial(fn, fresh_sizes(pts)))
            )
    medians = timed_round_robin(jobs, args.repeats)
    for label, ms in medians.items():
        target = targets.get(label.split()[0], TARGET_MS)
        verdict = "within" if ms <= target else "OVER"
        print(f"  {label}{ms:8.1f} ms  ({ms / target:4.0%} of {target:.0f} ms, {verdict})")
    ratio = medians[f"{'sizes':<9}{'plan()':<17}"] / medians[f"{'distinct':<9}{'plan()':<17}"]
    print(
        f"  sizes/distinct plan(): {ratio:.2f}x (the rows ran round-robin; load average {os.getloadavg()[0]:.1f})"
    )


if __name__ == "__main__":
    main()
