#!/usr/bin/env python3
"""`disagg` against the best fixed fleet under SLO and worker specs it was not developed at.

Usage: PYTHONPATH=operator python hack/bench/spec_sweep.py [--cases CASE,...] [--specs SPEC,...] [--equal]

Every constant of the `disagg` decision was developed at the evaluation's defaults (TTFT
0.6 s, ITL 0.15 s, planner at p99, one GPU per replica, 30 s decisions). A user's spec is
another: this replays workloads at other targets, percentiles, replica shapes, decision
intervals and KV capacities, with the `disagg` policy at its defaults (the one decision the
operator runs, `autoscaler.decide`), and searches the best fixed fleet in hindsight at the
spec's own attainment target (the spec's percentile: a p90 SLO is met by 90 % of requests).

Cases: the synthetic workloads of `stress_sizing.py` (`stress:smooth`, `stress:heavy`,
`stress:on/off`, `stress:long prompts`, `stress:batched`) and shared traces as
`azure|msyn|mconv:trace|diurnal:K`. Per row: `disagg`'s attainment and GPU-hours, the best
fixed fleet (its sizes, attainment, GPU-hours; "target not reached" when no fixed fleet
the search tried reaches it, e.g. where most requests have less slack than one decode step),
their ratio and whether `disagg` reached the target. With --equal, also the best fixed
fleet at `disagg`'s own attainment when that is above the target (an equal-attainment
comparison: a policy that over-provisions past a p90 target is compared with a fixed fleet
that does as well).

No assertion: this prints numbers. Start-up 60 s. Results: docs/evaluation.md, "Other SLO
and worker specs".
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import time
from collections.abc import Callable

import stress_sizing  # this directory's: the synthetic workloads

from disagg import evaluate as ev
from disagg import names, yardstick
from disagg.workload import Workload, load_trace, with_media

TRACES = os.environ.get("TRACES", os.path.join(os.path.dirname(__file__), "../../../shared/traces"))
TRACE_FILES = {
    "azure": "azure_llm_2023/AzureLLMInferenceTrace_conv.csv",
    "mconv": "mooncake_fast25/conversation_trace.0-40min.jsonl",
    "msyn": "mooncake_fast25/synthetic_trace.jsonl",
}
MEDIA_SHARE = 0.3  # the `media` spec: this share of requests carries one image (the encoder pool)


def _slo(s: ev.EvalSettings, **changes: float) -> ev.EvalSettings:
    return dataclasses.replace(s, slo=dataclasses.replace(s.slo, **changes))


def _percentile(s: ev.EvalSettings, p: float) -> ev.EvalSettings:
    """A p-percentile SLO: planned at p, met when a share p of the requests is on time."""
    return dataclasses.replace(_slo(s, percentile=p), target_attainment=p)


def _kv_cache(s: ev.EvalSettings, share: float) -> ev.EvalSettings:
    dec = s.models.decode
    small = dataclasses.replace(dec, kv_cache_tokens=int(dec.kv_cache_tokens * share))
    return dataclasses.replace(s, models=dataclasses.replace(s.models, decode=small))


def _link(s: ev.EvalSettings, gibps: float) -> ev.EvalSettings:
    slow = dataclasses.replace(s.models.transfer, bandwidth_gibps=gibps)
    return dataclasses.replace(s, models=dataclasses.replace(s.models, transfer=slow))


def _replicas(s: ev.EvalSettings, pool: str, gpus: int) -> ev.EvalSettings:
    return dataclasses.replace(s, gpus_per_replica={**s.gpus_per_replica, pool: gpus})


# name: (what it changes, the settings from the defaults); `media` also changes the workload
SPECS: dict[str, tuple[str, Callable[[ev.EvalSettings], ev.EvalSettings]]] = {
    "default": ("the evaluation's defaults", lambda s: s),
    "ttft-2s": ("TTFT target 2 s", lambda s: _slo(s, ttft_s=2.0)),
    "ttft-0.3s": ("TTFT target 0.3 s", lambda s: _slo(s, ttft_s=0.3)),
    "p90": ("SLO at p90 (target attainment 90 %)", lambda s: _percentile(s, 0.90)),
    "p95": ("SLO at p95 (target attainment 95 %)", lambda s: _percentile(s, 0.95)),
    "itl-50ms": ("ITL target 50 ms", lambda s: _slo(s, itl_s=0.05)),
    "decode-2gpu": ("decode replicas of 2 GPUs", lambda s: _replicas(s, names.POOL_DECODE, 2)),
    "prefill-2gpu": ("prefill replicas of 2 GPUs", lambda s: _replicas(s, names.POOL_PREFILL, 2)),
    "interval-60s": ("a decision every 60 s", lambda s: dataclasses.replace(s, interval_s=60.0)),
    "kv-quarter": ("a quarter of the decode KV cache", lambda s: _kv_cache(s, 0.25)),
    "media": (f"{MEDIA_SHARE:.0%} of requests with an image (encoder pool)", lambda s: s),
    # 2 GiB/s (16 Gb/s, TCP without RDMA): 0.15 ms of link per token against the compute's 0.035
    "link-2gibps": ("a KV link of 2 GiB/s, slower than the compute", lambda s: _link(s, 2.0)),
}


def workload(case: str, synthetic: dict[str, Workload]) -> Workload:
    if case.startswith("stress:"):
        key = case.split(":", 1)[1]
        found = [w for name, w in synthetic.items() if key in name]
        if len(found) != 1:
            raise SystemExit(f"{case}: no single synthetic workload has {key!r} in its name")
        return found[0]
    try:
        name, kind, scale = case.split(":")
        k = int(scale)
        path = os.path.join(TRACES, TRACE_FILES[name])
    except (ValueError, KeyError):
        raise SystemExit(f"{case}: expected stress:<name> or azure|msyn|mconv:trace|diurnal:K") from None
    w = load_trace(path)
    if kind == "diurnal":
        return ev.diurnal(w, k)
    return ev.rate_scaled(w, k) if k > 1 else w


def row(case: str, spec: str, w: Workload, s: ev.EvalSettings, equal: bool) -> str:
    t0 = time.perf_counter()
    m = ev.run_policy("disagg", w, s).metrics
    sizes, stats = yardstick.best_static(w, s)
    fixed = yardstick.fixed_fleet_metrics(w, s, sizes)
    # a fleet that does not reach the target is the search's last try, not a reference
    reached = "" if stats.reached else " (target not reached)"
    att, gh = m["slo_attainment"], m["gpu_hours"]
    verdict = "met" if att >= s.target_attainment else "SHORT"
    line = (
        f"{case:<18} {spec:<13} disagg {att:7.2%} {gh:7.2f} GPU-h ({verdict})   best fixed "
        f"{yardstick._label(sizes):>9} {fixed['slo_attainment']:7.2%} {fixed['gpu_hours']:7.2f} GPU-h"
        f"{reached}   ratio {gh / fixed['gpu_hours']:.2f}"
    )
    if equal and att > s.target_attainment and att > fixed["slo_attainment"]:
        eq_sizes, _ = yardstick.best_static(w, s, target=att, guess=sizes)
        eq = yardstick.fixed_fleet_metrics(w, s, eq_sizes)
        line += (
            f"   at disagg's attainment: {yardstick._label(eq_sizes)} {eq['slo_attainment']:.2%}"
            f" {eq['gpu_hours']:.2f} GPU-h, ratio {gh / eq['gpu_hours']:.2f}"
        )
    return line + f"   ({time.perf_counter() - t0:.0f} s)"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--cases", default="stress:smooth,stress:heavy,azure:trace:1,msyn:trace:1,azure:diurnal:1"
    )
    ap.add_argument("--specs", default=",".join(SPECS), help=f"comma-separated, of: {', '.join(SPECS)}")
    ap.add_argument("--equal", action="store_true", help="also the fixed fleet at disagg's attainment")
    args = ap.parse_args()
    specs = args.specs.split(",")
    unknown = [x for x in specs if x not in SPECS]
    if unknown:
        ap.error(f"unknown spec {', '.join(unknown)}; known: {', '.join(SPECS)}")
    synthetic = stress_sizing.workloads(60.0)
    base = ev.with_startup(ev.EvalSettings(), 60.0)
    for case in args.cases.split(","):
        w = workload(case, synthetic)
        for spec in specs:
            s = SPECS[spec][1](base)
            ws = with_media(w, MEDIA_SHARE, 1, seed=0) if spec == "media" else w
            print(row(case, spec, ws, s, args.equal), flush=True)


if __name__ == "__main__":
    main()
