#!/usr/bin/env python3
"""Benchmark: one trace at rate scale 1 through all five policies (target < 60 s on one core).

    python hack/bench/bench_evaluate.py [TRACE]

Prints wall and CPU time per policy and the headline figures (attainment, GPU-hours,
GPU-hours vs the oracle, scaling actions, drains, lost requests). The target is judged on
CPU time (this process, `time.process_time`): the dev box is shared, and wall time there
grows with everyone else's load.
"""

from __future__ import annotations

import os
import sys
import time

from disagg.evaluate import POLICIES, EvalSettings, run_policy
from disagg.workload import load_trace

TARGET_S = 60.0  # the whole run, one core
DEFAULT = "/work/shared/traces/azure_llm_2023/AzureLLMInferenceTrace_conv.csv"


def main() -> int:
    path = sys.argv[1] if len(sys.argv) > 1 else DEFAULT
    t0 = time.perf_counter()
    w = load_trace(path)
    print(f"{path}: {len(w)} requests, {w.duration_s:.0f} s, load {time.perf_counter() - t0:.2f} s")
    s = EvalSettings()
    res = {}
    total = cpu_total = 0.0
    for name in ("oracle", *[p for p in POLICIES if p != "oracle"]):
        t, c = time.perf_counter(), time.process_time()
        res[name] = run_policy(name, w, s).metrics
        dt, dc = time.perf_counter() - t, time.process_time() - c
        total += dt
        cpu_total += dc
        res[name]["wall_s"] = dt
        res[name]["cpu_s"] = dc
    o = res["oracle"]["gpu_hours"]
    print(
        f"{'policy':<18}{'wall s':>8}{'CPU s':>8}{'attain':>9}{'GPU-h':>8}{'vs orc':>8}{'actions':>8}{'drains':>7}{'lost':>6}"
    )
    for name in POLICIES:
        m = res[name]
        print(
            f"{name:<18}{m['wall_s']:>8.2f}{m['cpu_s']:>8.2f}{100 * m['slo_attainment']:>8.2f}%{m['gpu_hours']:>8.2f}"
            f"{m['gpu_hours'] / o:>8.3f}{m['scaling_actions']:>8}{m['drains']:>7}{m['lost_requests']:>6}"
        )
    print(
        f"total {total:.1f} s wall, {cpu_total:.1f} s CPU ({len(w) * len(POLICIES) / cpu_total:.0f} requests/s "
        f"simulated per CPU s; target {TARGET_S:.0f} s CPU: {'within' if cpu_total < TARGET_S else 'OVER'}; "
        f"load average {os.getloadavg()[0]:.1f})"
    )
    return 0 if cpu_total < TARGET_S else 1


if __name__ == "__main__":
    sys.exit(main())
