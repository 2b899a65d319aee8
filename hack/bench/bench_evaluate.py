#!/usr/bin/env python3
"""Benchmark: one trace at rate scale 1 through all five policies (target < 60 s on one core).

    python hack/bench/bench_evaluate.py [TRACE]

Prints wall time per policy and the headline figures (attainment, GPU-hours,
GPU-hours vs the oracle, scaling actions, drains, lost requests).
"""

from __future__ import annotations

import sys
import time

from disagg.evaluate import POLICIES, EvalSettings, run_policy
from disagg.workload import load_trace

DEFAULT = "/work/shared/traces/azure_llm_2023/AzureLLMInferenceTrace_conv.csv"


def main() -> int:
    path = sys.argv[1] if len(sys.argv) > 1 else DEFAULT
    t0 = time.perf_counter()
    w = load_trace(path)
    print(f"{path}: {len(w)} requests, {w.duration_s:.0f} s, load {time.perf_counter() - t0:.2f} s")
    s = EvalSettings()
    res = {}
    total = 0.0
    for name in ("oracle", *[p for p in POLICIES if p != "oracle"]):
        t = time.perf_counter()
        res[name] = run_policy(name, w, s).metrics
        dt = time.perf_counter() - t
        total += dt
        res[name]["wall_s"] = dt
    o = res["oracle"]["gpu_hours"]
    print(
        f"{'policy':<11}{'wall s':>8}{'attain':>9}{'GPU-h':>8}{'vs orc':>8}{'actions':>8}{'drains':>7}{'lost':>6}"
    )
    for name in POLICIES:
        m = res[name]
        print(
            f"{name:<11}{m['wall_s']:>8.2f}{100 * m['slo_attainment']:>8.2f}%{m['gpu_hours']:>8.2f}"
            f"{m['gpu_hours'] / o:>8.3f}{m['scaling_actions']:>8}{m['drains']:>7}{m['lost_requests']:>6}"
        )
    print(f"total {total:.1f} s ({len(w) * len(POLICIES) / total:.0f} requests/s simulated)")
    return 0 if total < 60 else 1


if __name__ == "__main__":
    sys.exit(main())
