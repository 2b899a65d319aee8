#!/usr/bin/env python3
"""Benchmark: the hindsight oracle and best-fixed-fleet searches on one x10 trace (target < 5 min).

    python hack/bench/bench_yardstick.py [TRACE] [RATE_SCALE]

Prints, per search, its wall time, the number of simulations it ran (trials) and
what it found; then the replays' attainment and GPU-hours.
"""

from __future__ import annotations

import math
import sys
import time

from disagg import yardstick
from disagg.evaluate import EvalSettings, rate_scaled
from disagg.workload import load_trace

DEFAULT = "/work/shared/traces/azure_llm_2023/AzureLLMInferenceTrace_conv.csv"
TARGET_S = 300.0


def main() -> int:
    path = sys.argv[1] if len(sys.argv) > 1 else DEFAULT
    scale = int(sys.argv[2]) if len(sys.argv) > 2 else 10
    w = rate_scaled(load_trace(path), scale)
    s = EvalSettings()
    print(f"{w.name}: {len(w)} requests over {w.duration_s:.0f} s, target attainment {s.target_attainment}")
    t0 = time.perf_counter()
    schedule, ost = yardstick.oracle_schedule(w, s, progress=lambda m: print(m, file=sys.stderr, flush=True))
    t1 = time.perf_counter()
    peak = {p: max(x[p] for x in schedule) for p in ("prefill", "decode")}
    mean = {p: math.ceil(sum(x[p] for x in schedule) / len(schedule)) for p in ("prefill", "decode")}
    print(
        f"oracle search:      {t1 - t0:7.1f} s, {ost.simulations:5d} simulations "
        f"({len(schedule)} intervals), peak {peak['prefill']}P+{peak['decode']}D"
    )
    sizes, bst = yardstick.best_static(w, s, guess=mean)
    t2 = time.perf_counter()
    print(
        f"best-static search: {t2 - t1:7.1f} s, {bst.simulations:5d} simulations, "
        f"{sizes['prefill']}P+{sizes['decode']}D (target reached: {bst.reached})"
    )
    total = t2 - t0
    print(
        f"searches total {total:.1f} s ({'within' if total < TARGET_S else 'OVER'} the {TARGET_S:.0f} s target)"
    )
    replay = yardstick.run_policy(
        "oracle", w, s, make=lambda s_, w_, pre: yardstick.HindsightOraclePolicy(s_, w_, pre, schedule, ost)
    )
    om = replay.metrics
    bm = yardstick.fixed_fleet_metrics(w, s, sizes)
    print(f"replay oracle:      attainment {100 * om['slo_attainment']:.2f} %, {om['gpu_hours']:.2f} GPU-h")
    print(f"replay best-static: attainment {100 * bm['slo_attainment']:.2f} %, {bm['gpu_hours']:.2f} GPU-h")
    return 0 if total < TARGET_S else 1


if __name__ == "__main__":
    sys.exit(main())
