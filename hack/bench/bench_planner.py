#!/usr/bin/env python3
"""Benchmark: plan 1,000 demand points; print the median of repeated runs against the 50 ms target.

Usage: python hack/bench/bench_planner.py [--repeats N]

Two workloads:
  sweep    1,000 arrival rates (0..60 rps) over 10 request shapes (what an autoscaler
           or `disagg plan --sweep` does: the same shapes re-planned at new rates)
  distinct 1,000 different shapes and rates (per-shape setup never reused)
and two entry points: plan() (full Plan objects) and plan_replicas() (replica counts only).
No assertion: this prints numbers.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from disagg import planner
from disagg.planner import Demand, plan, plan_replicas

TARGET_MS = 50.0


def sweep_points(n: int = 1000) -> list[Demand]:
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


def distinct_points(n: int = 1000) -> list[Demand]:
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


def timed(fn, repeats: int, clear: bool) -> float:
    times = []
    for _ in range(repeats):
        if clear:
            planner._setup_cached.cache_clear()
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000.0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    print(f"planning 1,000 demand points; median of {args.repeats} runs; target {TARGET_MS:.0f} ms")
    for name, pts in (("sweep", sweep_points()), ("distinct", distinct_points())):
        for entry, fn in (
            ("plan()", lambda pts=pts: [plan(d) for d in pts]),
            ("plan_replicas()", lambda pts=pts: plan_replicas(pts)),
        ):
            ms = timed(fn, args.repeats, clear=(name == "distinct"))
            verdict = "within" if ms <= TARGET_MS else "OVER"
            print(f"  {name:<9}{entry:<17}{ms:8.1f} ms   {verdict} target")


if __name__ == "__main__":
    main()
