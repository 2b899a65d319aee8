#!/usr/bin/env python3
"""The automatic headroom on pure noise and on real bursts, per rate, window, lead and percentile.

Usage: PYTHONPATH=operator python hack/bench/bench_burst_noise.py [--hours 100] [--sub 10]

For each cell, `burstiness.burst_headroom` (as the autoscaler calls it: z from
`burstiness.noise_z` at the SLO percentile) over many independent hours of counts:

  poisson   pure Poisson arrivals at the rate: any headroom here is paid for noise;
  on/off    the same mean rate, doubled for 3 minutes of every 10 (two thirds of it
            between): the headroom a real burst of +100 % should get.

Prints the median and the 90th percentile over the hours. No assertion: this prints numbers
(tests/unit/test_burstiness.py holds the behaviour).
"""

from __future__ import annotations

import argparse
import itertools
import time

import numpy as np

from disagg.burstiness import burst_headroom, noise_z

HOUR_S = 3600.0


def poisson_counts(rng: np.random.Generator, rate: float, sub: float) -> np.ndarray:
    return rng.poisson(rate * sub, int(HOUR_S // sub)).astype(float)


def on_off_counts(rng: np.random.Generator, rate: float, sub: float) -> np.ndarray:
    """Mean `rate`: 3 minutes at twice the base, 7 at the base, base = rate / 1.3."""
    n = int(HOUR_S // sub)
    t = np.arange(n) * sub
    base = rate / 1.3
    level = np.where((t % 600.0) < 180.0, 2.0 * base, base)
    return rng.poisson(level * sub).astype(float)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hours", type=int, default=100, help="independent hours per cell")
    ap.add_argument("--sub", type=float, default=10.0, help="sub-window of the counts, s (two scrapes)")
    args = ap.parse_args()
    rng = np.random.default_rng(7)
    print(f"{args.hours} hours per cell, {args.sub:g} s sub-windows; headroom median / p90 over the hours")
    print(f"{'req/s':>6} {'window':>6} {'lead':>5} {'pct':>5} | {'poisson':>13} | {'on/off':>13}")
    start = time.perf_counter()
    for (rate, window), lead, q in itertools.product(
        [(0.5, 20.0), (0.5, 60.0), (2.0, 20.0), (2.0, 60.0), (10.0, 60.0), (50.0, 60.0)],
        [30.0, 90.0, 180.0],
        [0.9, 0.95, 0.99],
    ):
        kw = {"startup_s": lead, "window_s": window, "quantile": q, "z": noise_z(q)}
        cells = []
        for make in (poisson_counts, on_off_counts):
            got = [
                burst_headroom(make(rng, rate, args.sub), args.sub, **kw) or 0.0 for _ in range(args.hours)
            ]
            cells.append(f"{np.median(got):5.2f} / {np.quantile(got, 0.9):5.2f}")
        print(f"{rate:6g} {window:6g} {lead:5g} {q:5g} | {cells[0]:>13} | {cells[1]:>13}", flush=True)
    print(f"({time.perf_counter() - start:.0f} s)")


if __name__ == "__main__":
    main()
