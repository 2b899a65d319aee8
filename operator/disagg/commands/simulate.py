"""`disagg simulate`: discrete-event simulation of colocated, disaggregated and conditional placement.

Runs a workload (Poisson, square-wave bursts, a short/long prompt mix, or a
replayed Azure / Mooncake trace) through encoder -> prefill -> KV transfer ->
decode pools on virtual time and reports every stage queue, TTFT, ITL, goodput,
bytes transferred, failure cleanups and idle capacity. `--placement all` (the
default) runs the three placements side by side on the same requests. Model
flags are those of `disagg plan` and default to the worked example; SLO targets
are in seconds.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from disagg import names
from disagg.commands import checks, modelflags, traceflags

WORKLOADS = ("poisson", "burst", "mix", "trace")
PLACEMENT_CHOICES = (*names.PLACEMENTS, "all")


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "simulate",
        help="simulate colocated / disaggregated / conditional placement on a workload",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    w = p.add_argument_group("workload")
    w.add_argument("--workload", choices=WORKLOADS, default="mix", help="default: mix")
    w.add_argument("--rate", type=float, default=2.0, help="mean arrival rate, req/s (default 2)")
    w.add_argument("--duration", type=float, default=300.0, help="seconds of arrivals (default 300)")
    w.add_argument("--requests", type=int, help="exactly N Poisson arrivals instead of --duration")
    w.add_argument("--prompt-tokens", type=int, default=1000, help="poisson: prompt tokens (default 1000)")
    w.add_argument("--output-tokens", type=int, default=400, help="output tokens (default 400)")
    w.add_argument("--short-tokens", type=int, default=500, help="mix/burst: short prompt (default 500)")
    w.add_argument("--long-tokens", type=int, default=6000, help="mix/burst: long prompt (default 6000)")
    w.add_argument("--long-fraction", type=float, default=0.2, help="mix/burst: share of long (default 0.2)")
    w.add_argument("--burst-rate", type=float, help="burst: rate during bursts (default 3 x --rate)")
    w.add_argument("--burst-period", type=float, default=60.0, help="burst: period in s (default 60)")
    w.add_argument(
        "--burst-duty",
        type=float,
        default=0.25,
        help="burst: share of the period at the high rate (default 0.25)",
    )
    w.add_argument(
        "--media-fraction", type=float, default=0.0, help="share of requests with media (default 0)"
    )
    w.add_argument("--media-items", type=int, default=1, help="media items per media request (default 1)")
    w.add_argument("--trace", metavar="FILE", help="trace file to replay (--workload trace)")
    w.add_argument("--format", choices=traceflags.FORMAT_CHOICES, default="auto", help=traceflags.FORMAT_HELP)
    traceflags.add_window_flags(w)
    w.add_argument(
        "--time-scale", type=float, default=1.0, help="multiply trace arrival times (0.5 = twice as fast)"
    )
    w.add_argument("--limit", type=int, help="use only the first N trace rows")
    w.add_argument("--skip-bad-lines", action="store_true", help="skip malformed trace lines (counted)")
    w.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    pl = p.add_argument_group("pools and placement")
    pl.add_argument("--prefill", type=int, default=1, help="prefill workers (default 1)")
    pl.add_argument("--decode", type=int, default=2, help="decode workers (default 2)")
    pl.add_argument("--encoder", type=int, default=0, help="encoder workers (default 0)")
    pl.add_argument(
        "--colocated", type=int, default=0, help="colocated workers (default 0 = prefill + decode: same GPUs)"
    )
    pl.add_argument("--placement", choices=PLACEMENT_CHOICES, default="all", help="default: all three")
    pl.add_argument(
        "--split-threshold",
        type=int,
        help=f"conditional: prompt tokens >= go remote (default {names.SPLIT_THRESHOLD_DEFAULT_TOKENS})",
    )
    pl.add_argument(
        "--sweep-threshold", action="store_true", help="conditional: pick the best split threshold"
    )
    pl.add_argument(
        "--chunked", action="store_true", help="stream KV chunks during prefill; chunked local prefill"
    )
    pl.add_argument(
        "--link-scope", choices=("worker", "shared"), default="worker", help="one link per prefill worker"
    )
    pl.add_argument(
        "--max-transfers",
        type=int,
        default=0,
        help="sends one KV link carries at once; later ones queue FIFO (default 0: no limit)",
    )
    pl.add_argument(
        "--admit-fraction",
        type=float,
        default=1.0,
        help="admission control: share of arrivals admitted; the rest, and arrivals that would queue past "
        "the TTFT target, are rejected early (default 1: off)",
    )
    pl.add_argument(
        "--failure-prob", type=float, default=0.0, help="probability a transfer attempt fails (default 0)"
    )
    pl.add_argument("--max-retries", type=int, default=1, help="transfer retries per request (default 1)")
    pl.add_argument("--prefix-cache-tokens", type=int, default=0, help="per-worker prefix cache (0 = off)")
    modelflags.add_flags(
        p.add_argument_group("service-time models (as `disagg plan`)"),
        tuple(modelflags.MODEL_FLAGS),
        unset=False,
        helps={"chunk_tokens": "KV chunk / local prefill chunk tokens"},
    )
    slo = p.add_argument_group("SLO")
    modelflags.add_flags(slo, ("ttft", "ttft_per_1k", "itl"), unset=False)
    modelflags.add_itl_statistic_flag(slo)
    o = p.add_argument_group("output")
    o.add_argument(
        "--output", "-o", choices=("table", "json"), default="table", help="output format (default table)"
    )
    o.add_argument("--plot", metavar="FILE.png", help="plot queues and latency over time")
    o.add_argument("--quiet", action="store_true", help="no progress on stderr")
    p.set_defaults(func=run)


def build_models(args: argparse.Namespace):
    from disagg.model import DecodeModel, EncoderModel, PrefillModel, StageModels, TransferModel

    return StageModels(
        encoder=EncoderModel(args.encoder_fixed_ms, args.encoder_ms_per_item),
        prefill=PrefillModel(args.prefill_fixed_ms, args.prefill_ms_per_token, args.prefill_ms_per_token_sq),
        transfer=TransferModel(
            args.kv_bytes_per_token, args.link_setup_ms, args.link_gibps, args.chunk_tokens
        ),
        decode=DecodeModel(
            args.decode_step_ms, args.decode_ms_per_seq, args.decode_slots, args.decode_kv_cache_tokens
        ),
    )


def build_workload(args: argparse.Namespace):
    from disagg import workload as wl
    from disagg.cli import UsageError

    common = {"media_fraction": args.media_fraction, "media_items": args.media_items, "seed": args.seed}
    if args.workload == "trace":
        if not args.trace:
            raise UsageError("--workload trace needs --trace FILE")
        return traceflags.read_trace(
            args,
            fmt=args.format,
            quiet=args.quiet,
            time_scale=args.time_scale,
            on_error="skip" if args.skip_bad_lines else "stop",
            limit=args.limit,
        )
    if args.trace:
        raise UsageError("--trace needs --workload trace")
    duration = None if args.requests else args.duration
    if args.workload == "poisson":
        return wl.poisson(
            args.rate,
            duration,
            n=args.requests,
            prompt_tokens=args.prompt_tokens,
            output_tokens=args.output_tokens,
            **common,
        )
    mix_kw = {
        "short_tokens": args.short_tokens,
        "long_tokens": args.long_tokens,
        "long_fraction": args.long_fraction,
        "output_tokens": args.output_tokens,
        **common,
    }
    if args.workload == "mix":
        return wl.mix(args.rate, duration, n=args.requests, **mix_kw)
    high = args.burst_rate if args.burst_rate is not None else 3.0 * args.rate
    shape = wl.burst(args.rate, high, args.burst_period, args.duration, duty=args.burst_duty, seed=args.seed)
    w = wl.mix(0.0 + 1.0, arrivals=shape.arrival_s, **mix_kw)
    w.name = f"{shape.name} x {w.name}"
    return w


def check_size(args: argparse.Namespace) -> None:
    """Refuse, naming the flags, a synthetic workload too large for one run (`workload.MAX_REQUESTS`)."""
    from disagg.cli import UsageError
    from disagg.workload import MAX_REQUESTS

    if args.workload == "trace":
        return
    if args.requests is not None and args.workload != "burst":
        if args.requests > MAX_REQUESTS:
            raise UsageError(
                f"--requests {args.requests:,} is over {MAX_REQUESTS:,}, the most one run simulates"
            )
        return
    rate = args.rate
    if args.workload == "burst":
        rate = max(rate, args.burst_rate if args.burst_rate is not None else 3.0 * args.rate)
    expected = rate * args.duration
    if not expected <= MAX_REQUESTS:
        flags = "--rate" if rate == args.rate else "--burst-rate"
        raise UsageError(
            f"{flags} {rate:g} req/s for --duration {args.duration:g} s is about {expected:,.0f} requests; "
            f"one run simulates at most {MAX_REQUESTS:,}"
        )


def sweep_threshold(workload, models, base, progress=None) -> tuple[int, list[dict[str, Any]]]:
    """Conditional placement at prompt-token cuts (quantiles of the workload); returns the best by goodput."""
    import dataclasses

    import numpy as np

    from disagg.sim import simulate

    tokens = workload.prompt_tokens
    cuts = sorted({int(x) for x in np.percentile(tokens, np.arange(0, 101, 10))} | {int(tokens.max()) + 1})
    rows = []
    for cut in cuts:
        cfg = dataclasses.replace(base, placement="conditional", split_threshold=cut)
        r = simulate(workload, models, cfg)
        rows.append(
            {
                "threshold": cut,
                "remote_share": float((tokens >= cut).mean()),
                "goodput_rps": r.goodput_rps,
                "slo_attainment": r.slo_attainment,
                "ttft_p90_ms": r.ttft_ms["p90"],
                "itl_p90_ms": r.itl_ms["p90"],
            }
        )
        if progress:
            progress(f"sweep: threshold {cut}: goodput {r.goodput_rps:.3f} req/s")
    best = max(rows, key=lambda r: (r["goodput_rps"], -r["ttft_p90_ms"]))
    return best["threshold"], rows


def run(args: argparse.Namespace) -> int:
    import dataclasses

    from disagg.cli import UsageError
    from disagg.sim import SimConfig, format_table, simulate
    from disagg.sim.report import plot

    if args.ttft <= 0 or args.itl <= 0:
        raise UsageError("--ttft and --itl must be > 0")
    if not args.ttft_per_1k >= 0:
        raise UsageError(f"--ttft-per-1k must be >= 0, got {args.ttft_per_1k}")
    if args.rate <= 0 and args.workload != "trace":
        raise UsageError("--rate must be > 0")
    check_size(args)
    conditional = args.placement in ("conditional", "all")
    if args.split_threshold is not None and not conditional:
        raise UsageError(
            f"--split-threshold applies to --placement conditional (or all), not {args.placement}"
        )
    if args.sweep_threshold and not conditional:
        raise UsageError(
            f"--sweep-threshold applies to --placement conditional (or all), not {args.placement}"
        )
    if args.split_threshold is not None and args.split_threshold < 1:
        raise UsageError(f"--split-threshold must be >= 1 token, got {args.split_threshold}")
    if not 0.0 < args.admit_fraction <= 1.0:
        raise UsageError(
            f"--admit-fraction must be in (0, 1] (1: admission control off; 0 would reject every request), "
            f"got {args.admit_fraction}"
        )
    models = build_models(args)
    workload = build_workload(args)
    if len(workload) == 0:
        raise UsageError("the workload is empty")
    checks.check_prefix_cache(args, workload)
    quiet = args.quiet

    def say(msg: str) -> None:
        if not quiet:
            print(msg, file=sys.stderr, flush=True)

    base = SimConfig(
        prefill=args.prefill,
        decode=args.decode,
        encoder=args.encoder,
        colocated=args.colocated,
        split_threshold=names.SPLIT_THRESHOLD_DEFAULT_TOKENS
        if args.split_threshold is None
        else args.split_threshold,
        chunked=args.chunked,
        failure_prob=args.failure_prob,
        max_retries=args.max_retries,
        prefix_cache_tokens=args.prefix_cache_tokens,
        ttft_ms=args.ttft * 1000.0,
        ttft_ms_per_1k_tokens=args.ttft_per_1k * 1000.0,
        itl_ms=args.itl * 1000.0,
        link_scope=args.link_scope,
        max_transfers=args.max_transfers,
        admit_fraction=args.admit_fraction,
        itl_statistic=args.itl_statistic,
        seed=args.seed,
    )
    placements = (
        ("colocated", "disaggregated", "conditional") if args.placement == "all" else (args.placement,)
    )
    for pl in placements:
        dataclasses.replace(base, placement=pl).validate()
    sweep_rows = None
    if args.sweep_threshold and "conditional" in placements:
        best, sweep_rows = sweep_threshold(
            workload, models, base, progress=say if len(workload) > 20000 else None
        )
        base = dataclasses.replace(base, split_threshold=best)
    big = len(workload) >= 100_000
    reports = []
    for pl in placements:
        prog = None
        if big and not quiet:

            def prog(i, n, t, pl=pl):
                say(f"{pl}: {i}/{n} requests (t = {t:.0f} s)")

        say(f"simulating {pl} on {len(workload)} requests ...") if big else None
        reports.append(simulate(workload, models, dataclasses.replace(base, placement=pl), progress=prog))
    if args.plot:
        plot(reports, args.plot)
        say(f"wrote {args.plot}")
    if args.output == "json":
        doc = {
            "workload": workload.summary(),
            "results": [r.to_dict() for r in reports],
        }
        if sweep_rows is not None:
            doc["threshold_sweep"] = {"best": base.split_threshold, "rows": sweep_rows}
        print(json.dumps(doc, indent=2))
        return 0
    ws = workload.summary()
    print(
        f"workload {ws['name']}: {ws['requests']} requests over {ws['duration_s']:.0f} s "
        f"({ws['mean_rate']:.2f} req/s), prompt {ws['mean_prompt_tokens']:.0f} / output "
        f"{ws['mean_output_tokens']:.0f} tokens mean"
    )
    print(
        f"pools: prefill {base.prefill}, decode {base.decode}, encoder {base.encoder}, colocated "
        f"{base.colocated_workers()}; split threshold {base.split_threshold}; "
        f"SLO TTFT {args.ttft:g} s{f' + {args.ttft_per_1k:g} s per 1,000 prompt tokens' if args.ttft_per_1k else ''}, ITL ({args.itl_statistic} gap) {args.itl:g} s"
        f"{'; chunked' if base.chunked else ''}"
    )
    if sweep_rows is not None:
        print("\nsplit-threshold sweep (conditional):")
        print(
            f"  {'threshold':>9}  {'remote':>6}  {'goodput':>8}  {'SLO':>5}  {'TTFT p90':>8}  {'ITL p90':>7}"
        )
        for r in sweep_rows:
            mark = "  <- best" if r["threshold"] == base.split_threshold else ""
            print(
                f"  {r['threshold']:>9}  {r['remote_share']:>6.0%}  {r['goodput_rps']:>8.3f}  "
                f"{r['slo_attainment']:>5.0%}  {r['ttft_p90_ms']:>8.0f}  {r['itl_p90_ms']:>7.0f}{mark}"
            )
    print()
    print(format_table(reports))
    return 0
