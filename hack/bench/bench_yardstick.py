#!/usr/bin/env python3
"""Benchmark: the hindsight oracle and best-fixed-fleet searches on one x10 trace (target < 5 min).

    python hack/bench/bench_yardstick.py [TRACE] [RATE_SCALE]

Runs `yardstick.hindsight_oracle` (the per-interval search, its replay through the
evaluation loop and any repairs, the best fixed fleet's search from the oracle's mean
sizes and its replay) and prints, per search, its wall time, the simulations it ran
and what it found; then the replays' attainment and GPU-hours, and the fluid bound.
"""

from __future__ import annotations

import os
import sys
import time

from disagg import yardstick
from disagg.evaluate import EvalSettings, rate_scaled
from disagg.workload import load_trace

DEFAULT = "/work/shared/traces/azure_llm_2023/AzureLLMInferenceTrace_conv.csv"
TARGET_S = 300.0


def _fleet(sizes: dict[str, int]) -> str:
    return "+".join(f"{n}{p[0].upper()}" for p, n in sizes.items())


def main() -> int:
    path = sys.argv[1] if len(sys.argv) > 1 else DEFAULT
    scale = int(sys.argv[2]) if len(sys.argv) > 2 else 10
    w = rate_scaled(load_trace(path), scale)
    s = EvalSettings()
    print(f"{w.name}: {len(w)} requests over {w.duration_s:.0f} s, target attainment {s.target_attainment}")
    print(f"load average at start: {os.getloadavg()[0]:.1f} (shared machine)")
    c0, t0 = time.process_time(), time.perf_counter()
    h = yardstick.hindsight_oracle(w, s, progress=lambda m: print(m, file=sys.stderr, flush=True))
    total, cpu = time.perf_counter() - t0, time.process_time() - c0
    ost, bst = h.stats, h.fixed_stats
    peak = {p: max(x[p] for x in h.schedule) for p in h.schedule[0]}
    print(
        f"oracle search:      {ost.wall_s - bst.wall_s:7.1f} s, {ost.simulations:5d} interval simulations "
        f"+ {ost.passes} whole-trace replays ({ost.short_intervals} intervals short of the allowance), "
        f"peak {_fleet(peak)}, schedule from {ost.source}"
    )
    print(
        f"best-static search: {bst.wall_s:7.1f} s, {bst.simulations:5d} whole-trace simulations "
        f"+ 1 replay, {_fleet(h.fixed)} (target reached: {bst.reached})"
    )
    if bst.frontier is not None:
        fr = bst.frontier
        print(
            f"  frontier sweep:   {fr['trials']} trials (memoised ones included): "
            + (
                "no cheaper fixed fleet passes"
                if fr["complete"]
                else f"ran out of trials; prefill counts from {fr['unchecked_from_prefill']} up not checked"
            )
        )
    print(
        f"both searches {total:.1f} s wall, {cpu:.1f} s CPU "
        f"({'within' if total < TARGET_S else 'OVER'} the {TARGET_S:.0f} s target)"
    )
    om, bm = h.oracle.metrics, h.fixed_metrics
    bound = yardstick.fluid_bound(w, s)
    print(f"replay oracle:      attainment {100 * om['slo_attainment']:.2f} %, {om['gpu_hours']:.2f} GPU-h")
    print(f"replay best-static: attainment {100 * bm['slo_attainment']:.2f} %, {bm['gpu_hours']:.2f} GPU-h")
    print(
        f"fluid bound:        {bound['gpu_hours']:.2f} GPU-h "
        f"(oracle {om['gpu_hours'] / bound['gpu_hours']:.2f}x it)"
    )
    return 0 if total < TARGET_S else 1


if __name__ == "__main__":
    sys.exit(main())
