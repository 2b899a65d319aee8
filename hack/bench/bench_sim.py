#!/usr/bin/env python3
"""Simulator throughput: simulated requests per wall-clock second.

1. The whole Azure conversation trace (19,366 requests) under disaggregated placement (target < 5 s).
2. N Poisson requests (default 1e6; target < 2 min), short/long prompt mix, disaggregated.

Usage: python hack/bench/bench_sim.py [--requests N] [--trace FILE] [--chunked]
"""

from __future__ import annotations

import argparse
import time

from disagg.model import StageModels
from disagg.sim import SimConfig, simulate
from disagg.workload import load_trace, poisson

AZURE = "/work/shared/traces/azure_llm_2023/AzureLLMInferenceTrace_conv.csv"


def run(label: str, workload, config: SimConfig) -> None:
    t0 = time.perf_counter()
    r = simulate(workload, StageModels(), config)
    wall = time.perf_counter() - t0
    print(
        f"{label}: {len(workload)} requests in {wall:.2f} s wall = {len(workload) / wall:,.0f} req/s "
        f"(simulated {r.horizon_s:,.0f} s; completed {r.completed}; TTFT p90 {r.ttft_ms['p90']:.0f} ms; "
        f"leaked {r.failures['leaked_reservations']})"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=1_000_000, help="Poisson requests (default 1e6)")
    ap.add_argument("--trace", default=AZURE)
    ap.add_argument("--chunked", action="store_true")
    args = ap.parse_args()
    t0 = time.perf_counter()
    w = load_trace(args.trace)
    print(f"trace load: {len(w)} rows in {time.perf_counter() - t0:.2f} s")
    run("azure conv, disaggregated 2P/4D", w, SimConfig(prefill=2, decode=4, chunked=args.chunked))
    t0 = time.perf_counter()
    w = poisson(40.0, n=args.requests, prompt_tokens=(100, 4000), output_tokens=(10, 400), seed=1)
    print(f"poisson generation: {time.perf_counter() - t0:.2f} s")
    run(
        f"poisson {args.requests:g}, disaggregated 12P/20D",
        w,
        SimConfig(prefill=12, decode=20, chunked=args.chunked),
    )


if __name__ == "__main__":
    main()
