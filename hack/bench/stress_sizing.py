#!/usr/bin/env python3
"""Stress workloads for issue 14's sizing inputs: what each one does under autoscaling.

Usage: PYTHONPATH=operator python hack/bench/stress_sizing.py [--minutes 60] [--startup 60]
       PYTHONPATH=operator python hack/bench/stress_sizing.py --trace FILE [--rate-scale K] [--diurnal]

Replays synthetic workloads none of the constants were tuned on -- smooth Poisson (what
each input costs), on/off bursts, heavy-tailed prompt lengths, a sudden shift from short
to long prompts -- through
`disagg evaluate`'s virtual-time harness with the `disagg` policy, and with the same
policy fed, one at a time and together, by

  sizes     the window's request-size classes (disagg.sizes) instead of mean/std,
  ca2       the index of dispersion of 15 s arrival counts over the last 10 min
            (disagg.burstiness) in Allen-Cunneen and the counting noise,
  headroom  the automatic burst headroom (last hour of 15 s counts, start-up, window).

Prints attainment and GPU-hours per variant. No assertion: this prints numbers. It
uses the evaluation harness's policy hooks (evaluate._CLASSES, DisaggPolicy), which the
one-autoscaler work may rename; adjust the subclass then.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace

import numpy as np

from disagg import evaluate as ev
from disagg.burstiness import arrival_counts, burst_headroom, index_of_dispersion
from disagg.policy import sizing_rate
from disagg.sizes import SizeDistribution
from disagg.workload import Workload, burst, load_trace, piecewise_poisson, poisson

COUNT_S = 15.0  # arrival counts per scrape
DISPERSION_SPAN_S = 600.0
HEADROOM_SPAN_S = 3600.0


def workloads(minutes: float) -> dict[str, Workload]:
    dur = minutes * 60.0
    rng = np.random.default_rng(21)

    def heavy(r: np.random.Generator, n: int) -> np.ndarray:
        return np.clip(r.lognormal(np.log(1500), 1.2, n), 1, 16000).astype(np.int64)

    shift_a = piecewise_poisson([(dur / 2, 4.0), (dur / 2, 4.0)], rng)
    half = shift_a < dur / 2
    shift_p = np.where(half, rng.integers(200, 800, shift_a.size), rng.integers(6000, 12000, shift_a.size))
    return {
        "smooth: Poisson 6 rps, uniform prompts (the cost of each input)": poisson(
            6, dur, prompt_tokens=(3, 7400), output_tokens=(20, 200), seed=4
        ),
        "on/off 2<->10 rps, 3 min bursts every 10 min": burst(
            2, 10, 600, dur, duty=0.3, prompt_tokens=(3, 7400), output_tokens=(20, 200), seed=1
        ),
        "heavy-tailed prompts (log-normal, 6 rps)": poisson(
            6, dur, prompt_tokens=heavy, output_tokens=(50, 400), seed=2
        ),
        "short -> long prompts at half time (4 rps)": Workload(
            shift_a, shift_p, rng.integers(50, 300, shift_a.size), name="shift"
        ),
    }


def variant(name: str, use_sizes: bool, use_ca2: bool, use_headroom: bool) -> type:
    """The `disagg` policy with some of the issue-14 inputs fed in (by name in evaluate._CLASSES)."""

    class Sized(ev.DisaggPolicy):
        def decide(self, o: ev.Obs):  # type: ignore[override]
            t = self.w.arrival_s
            lo, hi = np.searchsorted(t, [o.now - self.s.window_s - self.s.scrape_s, o.now - self.s.scrape_s])
            sizes = None
            if use_sizes and hi - lo >= 20:
                sizes = SizeDistribution.from_samples(
                    self.w.prompt_tokens[lo:hi], self.w.output_tokens[lo:hi]
                )
            end = o.now - self.s.scrape_s
            disp = None
            if use_ca2:
                disp = index_of_dispersion(arrival_counts(t, COUNT_S, max(0.0, end - DISPERSION_SPAN_S), end))
            auto = None
            if use_headroom:
                c = arrival_counts(t, COUNT_S, max(0.0, end - HEADROOM_SPAN_S), end)
                auto = burst_headroom(
                    c, COUNT_S, startup_s=self.s.startup_s, window_s=self.s.window_s, dispersion=disp or 1.0
                )
            f_hi, self.state = sizing_rate(
                self.state,
                o.now,
                self.cfg,
                o.rate,
                window_s=self.s.window_s,
                rate_short=o.rate_short,
                short_window_s=self.s.scrape_s,
                queued=o.queued,
                z=self.s.headroom_z,
                backlog_drain_s=self.s.backlog_drain_s,
                backlog_lead_s=self.s.backlog_lead_s,
                ttft_observed=o.ttft_p if self.s.ttft_feedback else None,
                ttft_target=self.s.slo.ttft_s,
                ttft_comfort=self.s.ttft_comfort,
                dispersion=disp,
                auto_headroom=auto,
            )

            def demand(rate: float):
                d = o.demand(rate)
                if sizes is not None:
                    pm, ps = sizes.prompt_mean_std
                    om, os_ = sizes.output_mean_std
                    d = replace(d, prompt_tokens_mean=pm, prompt_tokens_std=ps, output_tokens_mean=om)
                    d = replace(d, output_tokens_std=os_, sizes=sizes)
                return replace(d, arrival_ca2=disp) if disp is not None else d

            planned = self._plan(demand(f_hi), self.s.gpu_budget)
            d = ev.decide(
                o.now, o.requested, planned, self.state, self.cfg, metrics_ok=o.metrics_ok, pending=o.pending
            )
            self.state = d.state
            return (d.steps[0] if d.steps else d.targets), d.reason

    Sized.name = name
    return Sized


VARIANTS = {
    "disagg": None,
    "+sizes": (True, False, False),
    "+ca2": (False, True, False),
    "+headroom": (False, False, True),
    "+all": (True, True, True),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=60.0)
    ap.add_argument("--startup", type=float, default=60.0)
    ap.add_argument(
        "--trace", help="replay this trace (Azure CSV or Mooncake JSONL) instead of the synthetic set"
    )
    ap.add_argument("--rate-scale", type=int, default=1, help="with --trace: superpose K copies")
    ap.add_argument("--diurnal", action="store_true", help="with --trace: its diurnal day (evaluate.diurnal)")
    args = ap.parse_args()
    s = ev.with_startup(ev.EvalSettings(), args.startup)
    for name, flags in VARIANTS.items():
        if flags is not None:
            ev._CLASSES[name] = variant(name, *flags)
    if args.trace:
        w = load_trace(args.trace)
        if args.diurnal:
            w = ev.diurnal(w, args.rate_scale)
        elif args.rate_scale > 1:
            w = ev.rate_scaled(w, args.rate_scale)
        sets = {args.trace: w}
    else:
        sets = workloads(args.minutes)
    for wname, w in sets.items():
        print(f"{wname}: {len(w):,} requests over {w.duration_s / 60:.0f} min, start-up {args.startup:.0f} s")
        for name in VARIANTS:
            t0 = time.perf_counter()
            r = ev.run_policy(name, w, s).metrics
            print(
                f"  {name:<10} attainment {r['slo_attainment']:.4f}  GPU-h {r['gpu_hours']:6.2f}"
                f"  ttft p99 {r['ttft_p99_s'] or float('nan'):6.2f} s  ({time.perf_counter() - t0:4.0f} s wall)"
            )


if __name__ == "__main__":
    main()
