#!/usr/bin/env python3
"""Benchmark: the planner's prefill-queue formula against the simulator, at fixed pools.

Usage: python hack/bench/bench_queue_model.py [--minutes 60]

The planner sizes the prefill pool with one pooled M/G/c queue (Allen-Cunneen's mean wait,
`queueing.mgc_mean_wait`); the simulator, like the engines' routers, sends each request on
arrival to the prefill worker with the least outstanding work, where it queues alone. With
exact work estimates least-work routing is the pooled FCFS queue; this prints how close
the two are on Poisson arrivals, for prompt mixes of the stress workloads
(hack/bench/stress_sizing.py) at pools from one worker to light load: each row is one
simulation of a fixed fleet (no autoscaler), its measured mean prefill wait, the formula's
at the same arrival rate and service-time moments (the workload's own prompts through the
stage model), and their ratio.

A reading of the queue's waits (docs/evaluation.md, "Remedies measured")
assumes the formula holds on smooth traffic; a ratio far from 1 at a wait that matters would
say it does not. No assertion: this prints numbers.
"""

from __future__ import annotations

import argparse

import numpy as np

from disagg import queueing
from disagg.model import StageModels
from disagg.sim.engine import SimConfig, simulate
from disagg.workload import poisson

# (prompt tokens low, high, requests per second): uniform prompt lengths
MIXES = ((3, 7400, 6.0), (3, 2000, 12.0), (1000, 1000, 6.0), (3, 7400, 20.0))
POOLS = (1, 2, 3, 4, 6, 8)
# utilizations outside this range say little: near 1 the mean wait is dominated by the run's
# longest busy period, under 0.2 it is a fraction of a millisecond
RHO_RANGE = (0.2, 0.95)
DECODE_WORKERS = 40  # enough that the decode pool never holds a prefill back


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=60.0, help="simulated minutes per row")
    args = ap.parse_args()
    models = StageModels()
    print("prompts      req/s  pool   rho   cs2   formula ms  simulated ms   ratio")
    for lo, hi, rate in MIXES:
        w = poisson(rate, args.minutes * 60.0, prompt_tokens=(lo, hi), output_tokens=(20, 200), seed=4)
        service = np.asarray(models.prefill.service_ms(w.prompt_tokens), float) / 1000.0
        mean, cs2 = float(service.mean()), float(service.var() / service.mean() ** 2)
        lam = (len(w) - 1) / float(w.arrival_s[-1] - w.arrival_s[0])
        for c in POOLS:
            rho = lam * mean / c
            if not RHO_RANGE[0] <= rho <= RHO_RANGE[1]:
                continue
            rep = simulate(w, models, SimConfig(prefill=c, decode=DECODE_WORKERS, ttft_ms=None))
            simulated = rep.stages["prefill"]["wait_mean_ms"]
            formula = float(queueing.mgc_mean_wait(c, lam, mean, cs2, 1.0)) * 1000.0
            print(
                f"{lo:>5}-{hi:<5} {lam:6.2f} {c:5d} {rho:5.2f} {cs2:5.2f} {formula:11.2f} {simulated:13.2f} "
                f"{simulated / formula:7.2f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
