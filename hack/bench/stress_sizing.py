#!/usr/bin/env python3
"""Stress workloads for issue 14's sizing inputs: what each one does under autoscaling.

Usage: PYTHONPATH=operator python hack/bench/stress_sizing.py [--minutes 60] [--startup 60]
       PYTHONPATH=operator python hack/bench/stress_sizing.py --trace FILE [--thin K] [--rate-scale K] [--diurnal]

Replays synthetic workloads none of the constants were tuned on -- smooth Poisson (what
each input costs), on/off bursts, heavy-tailed prompt lengths, a sudden shift from short
to long prompts, arrivals in batches, spikes shorter than a start-up; added after the
decision's constants were set: the shift back to short prompts, a shift to long outputs,
a steady ramp, and traffic that stops and comes back; six probes written after all of
that was measured (an evening peak, tenants in turn, microbursts, long and heavy-tailed
outputs, a trickle); three of on/off traffic at random times; and three with media (the
encoder pool in the pipeline) -- through
`disagg evaluate`'s virtual-time harness with the `disagg` policy, and with the same
policy fed, one at a time and together, by

  sizes     the window's request-size classes (disagg.sizes) instead of mean/std,
  ca2       the index of dispersion of arrival counts per two scrapes over the last
            10 min (disagg.burstiness) in Allen-Cunneen and the counting noise,
  headroom  the automatic burst headroom (last hour of counts, start-up, window),
  front     the front load gain learnt from lasting TTFT misses at plan
            (autoscaler.learnt_front_gain),
  budget    the error budget (autoscaler.budget_percentile); `default` is the spec's defaults.

Prints attainment and GPU-hours per variant. No assertion: this prints numbers. The
variants are the operator's own switches, `spec.autoscaling.sizing` (EvalSettings.sizing),
so this runs the one decision (`autoscaler.decide`) the operator runs.

With --yardstick, each workload instead goes through `disagg evaluate` whole: every
policy at its default (and, with --curves, at every setting of its knob) against the
hindsight oracle and the best fixed fleet, printed as `disagg evaluate` prints them;
--out DIR keeps each workload's JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from dataclasses import replace

import numpy as np

from disagg import api
from disagg import evaluate as ev
from disagg.workload import (
    Workload,
    burst,
    load_trace,
    piecewise_poisson,
    poisson,
    random_bursts,
    spikes,
    thinned,
    with_coarse_timestamps,
)

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
    batched = poisson(6, dur, prompt_tokens=(3, 2000), output_tokens=(20, 200), seed=5)
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
        "batched: Poisson 6 rps, arrivals floored to 3 s (coarse timestamps)": with_coarse_timestamps(
            batched, 3.0
        ),
        "spikes: 3 -> 12 rps for 30 s every 5 min (shorter than a start-up)": spikes(
            3, 12, 300, 30, dur, prompt_tokens=(3, 4000), output_tokens=(20, 300), seed=3
        ),
        **later_workloads(dur),
        **probe_workloads(dur),
        **random_burst_workloads(dur),
        **media_workloads(dur),
    }


def later_workloads(dur: float) -> dict[str, Workload]:
    """Four workloads added after every constant of the decision was set, and measured once
    (docs/evaluation.md, "Four more adversarial workloads"): a shift the other way, a shift
    of the decode work, a steady ramp, and traffic that stops and comes back."""
    rng = np.random.default_rng(31)

    def halves(first: tuple[int, int], second: tuple[int, int], at: np.ndarray) -> np.ndarray:
        return np.where(at < dur / 2, rng.integers(*first, at.size), rng.integers(*second, at.size))

    long_short = piecewise_poisson([(dur, 4.0)], rng)
    outputs = piecewise_poisson([(dur, 4.0)], rng)
    steps = int(dur // 10.0)  # the ramp's rate changes every 10 s
    ramp = piecewise_poisson([(10.0, 1.0 + 11.0 * (i + 0.5) / steps) for i in range(steps)], rng)
    gap = piecewise_poisson([(dur / 3, 6.0), (dur / 3, 0.0), (dur / 3, 6.0)], rng)
    return {
        "long -> short prompts at half time (4 rps)": Workload(
            long_short,
            halves((6000, 12000), (200, 800), long_short),
            rng.integers(50, 300, long_short.size),
            name="long-short",
        ),
        "short -> long outputs at half time (4 rps)": Workload(
            outputs,
            rng.integers(200, 3000, outputs.size),
            halves((20, 200), (800, 2500), outputs),
            name="output-shift",
        ),
        "ramp 1 -> 12 rps over the hour": _uniform_sizes(rng, ramp, (3, 4000), (20, 300), "ramp"),
        "silence: 6 rps, nothing for a third of the time, then 6 rps again": _uniform_sizes(
            rng, gap, (3, 4000), (20, 300), "silence"
        ),
    }


def _uniform_sizes(
    rng: np.random.Generator,
    arrivals: np.ndarray,
    prompt: tuple[int, int],
    output: tuple[int, int],
    name: str,
) -> Workload:
    """Requests at `arrivals` with prompt and output lengths uniform over [lo, hi) (prompts drawn first)."""
    return Workload(
        arrivals, rng.integers(*prompt, arrivals.size), rng.integers(*output, arrivals.size), name=name
    )


def probe_workloads(dur: float) -> dict[str, Workload]:
    """Six workloads written after everything above was measured, each run once to find where
    the decision breaks (docs/evaluation.md, "Six probes"): an evening peak far above the day's
    level, two tenants taking turns, batches at one instant minutes apart, long and
    heavy-tailed outputs, and a trickle."""
    rng = np.random.default_rng(77)
    minutes = dur / 60.0
    # the evening: a sixth of the time at 1 req/s, a ramp to 15 over a sixth (one 10 s step per
    # minute of the whole), a third at 15, the ramp down, the rest at 1
    steps = round(minutes)
    ramp = [(10.0, 1.0 + 14.0 * (i + 0.5) / steps) for i in range(steps)]
    evening = piecewise_poisson(
        [(dur / 6, 1.0), *ramp, (dur / 3, 15.0), *reversed(ramp), (dur / 6, 1.0)], rng
    )
    # two tenants in turn, 5 minutes each: chat (8 req/s of short prompts) and retrieval (2 req/s
    # of long ones)
    turns = max(1, round(minutes / 5.0))
    tenants = piecewise_poisson([(dur / turns, 8.0 if i % 2 == 0 else 2.0) for i in range(turns)], rng)
    chat = (tenants // (dur / turns)).astype(int) % 2 == 0
    burst_times = np.repeat(np.arange(60.0, dur, 120.0), 40)  # 40 requests at one instant every 2 min
    batches = np.sort(np.concatenate([piecewise_poisson([(dur, 3.0)], rng), burst_times]))
    heavy_n = int(rng.poisson(4.0 * dur))
    heavy_out = np.sort(rng.uniform(0.0, dur, heavy_n))
    return {
        "evening peak: 1 -> 15 req/s and back (ramps of a sixth of the time)": _uniform_sizes(
            rng, evening, (200, 3000), (50, 400), "evening"
        ),
        "tenants in turn: 8 req/s of short prompts, then 2 req/s of long ones, 5 min each": Workload(
            tenants,
            np.where(chat, rng.integers(100, 500, tenants.size), rng.integers(4000, 8000, tenants.size)),
            np.where(chat, rng.integers(50, 200, tenants.size), rng.integers(100, 300, tenants.size)),
            name="tenants",
        ),
        "microbursts: 3 req/s and 40 requests at one instant every 2 min": _uniform_sizes(
            rng, batches, (200, 3000), (50, 300), "microbursts"
        ),
        "long outputs: 2 req/s, 1,000-4,000 output tokens": poisson(
            2, dur, prompt_tokens=(500, 2000), output_tokens=(1000, 4000), seed=8
        ),
        "heavy-tailed outputs (log-normal, 4 req/s)": Workload(
            heavy_out,
            rng.integers(200, 3000, heavy_n),
            np.clip(rng.lognormal(np.log(200), 1.1, heavy_n), 1, 8000).astype(np.int64),
            name="heavy-outputs",
        ),
        "trickle: 0.3 req/s": poisson(0.3, dur, prompt_tokens=(200, 3000), output_tokens=(50, 400), seed=9),
    }


def random_burst_workloads(dur: float) -> dict[str, Workload]:
    """Three probes of on/off traffic at random times (a two-state Markov-modulated Poisson source,
    `disagg.workload.random_bursts`), written after everything above was measured
    (docs/evaluation.md, "On/off bursts at random times"): the on/off workload's levels with
    exponential stays, the same switching four times as fast, and slower, larger swings."""
    kw = dict(prompt_tokens=(3, 4000), output_tokens=(20, 300))
    return {
        "random on/off: 2 <-> 10 req/s, stays of 4 min low and 1.5 min high on average": random_bursts(
            2.0, 10.0, 240.0, 90.0, dur, seed=1, **kw
        ),
        "random on/off, fast: 2 <-> 10 req/s, stays of 1 min and 30 s on average": random_bursts(
            2.0, 10.0, 60.0, 30.0, dur, seed=4, **kw
        ),
        "random on/off, slow: 1 <-> 8 req/s, stays of 10 min and 5 min on average": random_bursts(
            1.0, 8.0, 600.0, 300.0, dur, seed=5, **kw
        ),
    }


def media_workloads(dur: float) -> dict[str, Workload]:
    """Three probes with media (the encoder pool in the pipeline), written after everything above
    was measured (docs/evaluation.md, "Requests with media"): half the requests with four images
    each, a shift from none to most at half time, and on/off traffic with media on a third of it."""
    kw = dict(prompt_tokens=(200, 3000), output_tokens=(50, 400))
    text = poisson(5.0, dur / 2, seed=22, **kw)
    images = poisson(5.0, dur / 2, media_fraction=0.6, media_items=3, seed=23, **kw)
    return {
        "media on half the requests: Poisson 5 req/s, 4 images each": poisson(
            5.0, dur, media_fraction=0.5, media_items=4, seed=21, **kw
        ),
        "media 0 -> 60 % of the requests at half time (5 req/s, 3 images each)": Workload(
            np.concatenate([text.arrival_s, images.arrival_s + dur / 2]),
            np.concatenate([text.prompt_tokens, images.prompt_tokens]),
            np.concatenate([text.output_tokens, images.output_tokens]),
            np.concatenate([text.media_items, images.media_items]),
            name="media-shift",
        ),
        "on/off with media: 2 <-> 8 req/s, 3 min bursts every 10 min, a third with 2 images": burst(
            2, 8, 600, dur, duty=0.3, media_fraction=0.33, media_items=2, seed=24, **kw
        ),
    }


def settings(base: ev.EvalSettings, flags: tuple[bool, bool, bool, bool, bool]) -> ev.EvalSettings:
    """The `disagg` policy with some of the issue-14 inputs switched on (spec.autoscaling.sizing)."""
    sizes, ca2, headroom, front, budget = flags
    return replace(
        base,
        sizing={
            "requestSizes": sizes,
            "burstiness": ca2,
            "autoHeadroom": headroom,
            "frontLoadGain": front,
            "errorBudget": budget,
        },
    )


VARIANTS = {
    "disagg": (False, False, False, False, False),
    "+sizes": (True, False, False, False, False),
    "+ca2": (False, True, False, False, False),
    "+headroom": (False, False, True, False, False),
    "+ca2+headroom": (False, True, True, False, False),
    "+front": (False, False, False, True, False),
    "+budget": (False, False, False, False, True),
    "default": (
        api.SIZING_REQUEST_SIZES_DEFAULT,
        api.SIZING_BURSTINESS_DEFAULT,
        api.SIZING_AUTO_HEADROOM_DEFAULT,
        api.SIZING_FRONT_LOAD_GAIN_DEFAULT,
        api.SIZING_ERROR_BUDGET_DEFAULT,
    ),
    "+all": (True, True, True, True, True),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=60.0)
    ap.add_argument("--only", help="run only the workloads whose name contains this")
    ap.add_argument("--startup", type=float, default=60.0)
    ap.add_argument(
        "--trace", help="replay this trace (Azure CSV or Mooncake JSONL) instead of the synthetic set"
    )
    ap.add_argument(
        "--thin", type=int, default=1, help="with --trace: keep one request in K at random, before the rest"
    )
    ap.add_argument("--rate-scale", type=int, default=1, help="with --trace: superpose K copies")
    ap.add_argument("--diurnal", action="store_true", help="with --trace: its diurnal day (evaluate.diurnal)")
    ap.add_argument(
        "--yardstick",
        action="store_true",
        help="run every policy against the hindsight oracle and the best fixed fleet (disagg evaluate)",
    )
    ap.add_argument("--curves", action="store_true", help="with --yardstick: every policy's knob curve too")
    ap.add_argument("--out", help="with --yardstick: write each workload's JSON into this directory")
    args = ap.parse_args()
    if (args.curves or args.out) and not args.yardstick:
        ap.error("--curves and --out go with --yardstick")
    s = ev.with_startup(ev.EvalSettings(), args.startup)
    if args.trace:
        w = thinned(load_trace(args.trace), args.thin)
        if args.diurnal:
            w = ev.diurnal(w, args.rate_scale)
        elif args.rate_scale > 1:
            w = ev.rate_scaled(w, args.rate_scale)
        sets = {args.trace: w}
    else:
        sets = workloads(args.minutes)
        if args.only:
            sets = {k: v for k, v in sets.items() if args.only in k}
    for wname, w in sets.items():
        print(f"{wname}: {len(w):,} requests over {w.duration_s / 60:.0f} min, start-up {args.startup:.0f} s")
        if args.yardstick:
            yardstick(wname, w, s, args.curves, args.out)
            continue
        for name in VARIANTS:
            t0 = time.perf_counter()
            r = ev.run_policy("disagg", w, settings(s, VARIANTS[name])).metrics
            print(
                f"  {name:<14} attainment {r['slo_attainment']:.4f}  GPU-h {r['gpu_hours']:6.2f}"
                f"  ttft p99 {r['ttft_p99_s'] or float('nan'):6.2f} s  ({time.perf_counter() - t0:4.0f} s wall)"
            )


def yardstick(wname: str, w: Workload, s: ev.EvalSettings, curves: bool, out: str | None) -> None:
    """`disagg evaluate` on one workload: its per-policy table and its equal-attainment table."""
    from disagg.commands.evaluate import print_table

    t0 = time.perf_counter()
    doc = ev.evaluate(
        w, ev.POLICIES, s, lambda msg: print(f"    {msg}", file=sys.stderr, flush=True), curves=curves
    )
    print_table(doc)  # the per-policy table, then the equal-attainment one
    print(f"  ({time.perf_counter() - t0:.0f} s wall)", flush=True)
    if out:
        os.makedirs(out, exist_ok=True)
        slug = re.sub(r"[^a-z0-9]+", "-", wname.split(":")[0].lower()).strip("-")
        with open(os.path.join(out, f"{slug}.json"), "w", encoding="utf-8") as fh:
            json.dump(doc, fh, indent=1)


if __name__ == "__main__":
    main()
