"""`disagg evaluate`: closed-loop, virtual-time comparison of autoscaling policies on a trace.

The simulator replays the trace; every --interval seconds each policy resizes
the prefill and decode pools (and the encoder pool when requests carry media:
--media-fraction adds a synthetic multimodal mix) from in-simulation metrics
(one scrape late). --placement conditional prefills prompts below the split
threshold on the decode workers.
Reports SLO attainment, TTFT/ITL percentiles, GPU-hours (and vs the hindsight
oracle), scaling actions, drains and lost requests per policy, then the
equal-attainment table: the GPU-hours each policy needs for 95 % and 99 %
attainment (on its knob's curve with --curves) against the hindsight oracle and
the best fixed fleet. See docs/evaluation.md.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from typing import Any

from disagg.commands import modelflags, traceflags
from disagg.names import EVAL_POLICY_HELP, POOL_DECODE, POOL_ENCODER, POOL_PREFILL

# The model flags evaluate takes. Attainment is scored over every request and the goal
# is 99 % of them, so the evaluation plans for p99 (disagg.evaluate.EVAL_PERCENTILE),
# not `disagg plan`'s p90.
MODEL_NAMES = (
    "encoder_fixed_ms",
    "encoder_ms_per_item",
    "ttft",
    "ttft_per_1k",
    "itl",
    "percentile",
    "prefill_fixed_ms",
    "prefill_ms_per_token",
    "decode_step_ms",
    "decode_ms_per_seq",
    "decode_slots",
    "decode_kv_cache_tokens",
    "kv_bytes_per_token",
    "link_setup_ms",
    "link_gibps",
)
MODEL_DEFAULTS: dict[str, Any] = {**modelflags.defaults(MODEL_NAMES), "percentile": 0.99}


def register(subparsers: Any) -> None:
    epilog = "policies:\n" + "\n".join(f"  {k:<18} {v}" for k, v in EVAL_POLICY_HELP.items())
    p = subparsers.add_parser(
        "evaluate",
        help="compare autoscaling policies on a trace in a virtual-time closed loop",
        description=__doc__,
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    f = p.add_argument
    f("--trace", required=True, metavar="FILE", help="request trace (Azure or BurstGPT CSV, Mooncake JSONL)")
    f("--format", default="auto", help=traceflags.FORMAT_HELP)
    traceflags.add_window_flags(p)
    f(
        "--policy",
        action="append",
        metavar="NAME",
        help=f"policy to run (repeatable; default all: {', '.join(EVAL_POLICY_HELP)}); the oracle always runs",
    )
    f("--startup-seconds", type=float, default=60.0, help="worker start-up time (default 60)")
    f("--interval", type=float, default=30.0, help="seconds between autoscaling decisions (default 30)")
    f("--rate-scale", type=int, default=1, help="superpose K time-shifted copies of the trace (default 1)")
    f(
        "--thin",
        type=int,
        default=1,
        metavar="K",
        help="keep one request in K at random (seeded by --seed), before --workload and --rate-scale: "
        "the trace's bursts at a K-th of its rate, as a smaller deployment sees them (default 1)",
    )
    f("--workload", default="trace", help="trace (replay) or diurnal (synthetic 2 h day; default trace)")
    f(
        "--seed",
        type=int,
        default=0,
        help="seed for --thin, the rate-scale offsets and the diurnal workload (default 0)",
    )
    f(
        "--coarse-timestamps",
        type=float,
        metavar="SECONDS",
        help="floor every arrival to a multiple of SECONDS, after --workload and --rate-scale: the "
        "requests of each such quantum arrive together, as a trace with coarse timestamps replays them",
    )
    f("--output", "-o", default="table", help="table or json (default table)")
    f("--plot", metavar="FILE.png", help="write load and pool sizes over time per policy")
    f("--gpu-budget", type=int, help="most GPUs all pools may hold (default: none)")
    f(
        "--headroom",
        type=float,
        default=0.0,
        help="disagg: spare capacity above the forecast, a fraction (spec.autoscaling.headroom; default 0)",
    )
    f("--baseline-drain", action="store_true", help="let hpa/throughput/dynamo/keda drain on scale-down too")
    f(
        "--dynamo-predictor",
        choices=("arima", "constant"),
        default="arima",
        help="dynamo: its load predictor (default arima, Dynamo's default; constant: next = last interval)",
    )
    f(
        "--target-attainment",
        type=float,
        default=0.99,
        help="attainment the hindsight oracle and the best fixed fleet must reach (default 0.99)",
    )
    f(
        "--curves",
        action="store_true",
        help="also run every policy at each setting of its knob (slow): attainment / GPU-hours curves, "
        "GPU-hours for 95 %% and 99 %% interpolated on them",
    )
    f("--no-best-static", action="store_true", help="skip the best-fixed-fleet search (faster)")
    f(
        "--references",
        metavar="FILE",
        help="reuse the hindsight oracle and best fixed fleet of an earlier --output json run of the "
        "same trace and settings (start-up and the policies' knobs may differ) instead of searching "
        "them again (with --curves after a run without them, only the oracle's other curve points are "
        "searched); refused, naming the difference, otherwise",
    )
    f("--limit", type=int, help="read at most N trace rows")
    f(
        "--media-fraction",
        type=float,
        default=0.0,
        help="share of requests given media items (seeded; adds the encoder pool; default 0)",
    )
    f("--media-items", type=int, default=1, help="media items per media request (default 1)")
    f(
        "--placement",
        default="disaggregated",
        help="disaggregated (default) or conditional (prompts below the split threshold prefilled on decode)",
    )
    f(
        "--split-threshold",
        type=int,
        metavar="TOKENS",
        help="conditional: prompt tokens from which prefill is remote (default: the planner's, from the models)",
    )
    m = p.add_argument_group("SLO and service-time models (as in `disagg plan`)")
    modelflags.add_flags(
        m,
        MODEL_NAMES,
        overrides={"percentile": MODEL_DEFAULTS["percentile"]},
        helps={"percentile": "planner quantile of the targets; attainment counts every request"},
    )
    modelflags.add_itl_statistic_flag(m)
    for pool in (POOL_ENCODER, POOL_PREFILL, POOL_DECODE):
        m.add_argument(f"--{pool}-gpus-per-replica", type=int, default=1, metavar="N", help="default 1")
    p.set_defaults(func=run)


def _settings(args: argparse.Namespace) -> Any:
    from disagg.evaluate import EvalSettings
    from disagg.model import DecodeModel, EncoderModel, PrefillModel, StageModels, TransferModel
    from disagg.planner import SLO

    v = {k: (getattr(args, k) if getattr(args, k) is not None else d) for k, d in MODEL_DEFAULTS.items()}
    for k, x in v.items():
        if not math.isfinite(float(x)):
            raise ValueError(f"--{k.replace('_', '-')} must be finite, got {x!r}")
    models = StageModels(
        encoder=EncoderModel(v["encoder_fixed_ms"], v["encoder_ms_per_item"]),
        prefill=PrefillModel(v["prefill_fixed_ms"], v["prefill_ms_per_token"]),
        transfer=TransferModel(v["kv_bytes_per_token"], v["link_setup_ms"], v["link_gibps"]),
        decode=DecodeModel(
            v["decode_step_ms"], v["decode_ms_per_seq"], v["decode_slots"], v["decode_kv_cache_tokens"]
        ),
    )
    slo = SLO(v["ttft"], v["itl"], v["percentile"], args.itl_statistic, ttft_s_per_1k_tokens=v["ttft_per_1k"])
    return EvalSettings(
        models=models,
        slo=slo,
        interval_s=args.interval,
        startup_s=args.startup_seconds,
        gpus_per_replica={
            POOL_ENCODER: args.encoder_gpus_per_replica,
            POOL_PREFILL: args.prefill_gpus_per_replica,
            POOL_DECODE: args.decode_gpus_per_replica,
        },
        gpu_budget=args.gpu_budget,
        headroom=args.headroom,
        baseline_drain=args.baseline_drain,
        dynamo_predictor=args.dynamo_predictor,
        target_attainment=args.target_attainment,
        seed=args.seed,
        placement=args.placement,
        split_threshold=args.split_threshold,
    )


def checked_settings(args: argparse.Namespace) -> Any:
    """The evaluation settings, checked up front (the `disagg` policy's spec too), errors naming the flag."""
    from disagg.cli import UsageError
    from disagg.evaluate import spec_for

    try:
        settings = _settings(args)
        spec_for(settings, settings.placement, (POOL_ENCODER, POOL_PREFILL, POOL_DECODE))
    except ValueError as exc:
        raise UsageError(modelflags.with_flag(str(exc)) or str(exc)) from None
    return settings


def _fmt(x: Any, nd: int = 3) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.{nd}f}"
    return str(x)


def print_table(doc: dict[str, Any], out: Any = None) -> None:
    out = sys.stdout if out is None else out  # resolved per call, not at import
    cols = [
        ("policy", None, 18),
        ("attain", "slo_attainment", 8),
        ("ttft p50", "ttft_p50_s", 9),
        ("p90", "ttft_p90_s", 9),
        ("p99", "ttft_p99_s", 9),
        ("itl p90", "itl_p90_s", 8),
        ("GPU-h", "gpu_hours", 8),
        ("vs orc", "gpu_hours_vs_oracle", 7),
        ("actions", "scaling_actions", 8),
        ("drains", "drains", 7),
        ("lost", "lost_requests", 6),
        ("rej", "rejected_requests", 6),
    ]
    w = doc["workload"]
    out.write(
        f"{doc['trace']}: {w['requests']} requests over {w['duration_s']:.0f} s "
        f"({w['mean_rate']:.3g} rps); start-up {doc['settings']['startup_s']:g} s, "
        f"interval {doc['settings']['interval_s']:g} s\n"
    )
    out.write("".join(f"{h:>{n}}" if k else f"{h:<{n}}" for h, k, n in cols) + "\n")
    infeasible = marginal = None
    beyond: list[str] = []
    for name, m in doc["policies"].items():
        infeasible, marginal = m["infeasible_requests"], m.get("marginal_requests")
        if m.get("slo_attainment_beyond_marginal") is not None:
            beyond.append(f"{name} {100 * m['slo_attainment_beyond_marginal']:.2f}%")
        row = []
        for _h, k, n in cols:
            if k is None:
                row.append(f"{name:<{n}}")
            else:
                nd = 4 if k == "slo_attainment" else (2 if k.startswith("gpu") else 3)
                val = m.get(k)
                if k == "slo_attainment" and val is not None:
                    row.append(f"{100 * val:>{n - 1}.2f}%")
                    continue
                row.append(f"{_fmt(val, nd):>{n}}")
        out.write("".join(row) + "\n")
    out.write(f"infeasible requests (bare pipeline > TTFT target, excluded from attainment): {infeasible}\n")
    if marginal:
        out.write(
            f"marginal requests (feasible, but less slack than one decode step: they meet TTFT only on an "
            f"idle decode worker; counted in attainment): {marginal}; attainment without them: "
            + ", ".join(beyond)
            + "\n"
        )
    lines = [
        f"  {name}: {where_missed(m['misses_by_minute'])}"
        for name, m in doc["policies"].items()
        if m.get("misses_by_minute")
    ]
    if lines:
        out.write("where the misses were (feasible requests that missed, by minute of arrival):\n")
        out.write("\n".join(lines) + "\n")
    print_equal_attainment(doc, out)


#: A run's first minutes, whose misses `where_missed` counts apart (a cold start's).
FIRST_MINUTES = 10


def where_missed(by_minute: dict[str, list[int]]) -> str:
    """One line on when a run's misses happened: how many minutes had any, how few hold
    half of them, the worst minute, and the share in the first `FIRST_MINUTES` minutes."""
    missed, feasible = by_minute["missed"], by_minute["feasible"]
    total = sum(missed)
    if total == 0:
        return f"none missed in {len(missed)} minutes"
    worst = max(range(len(missed)), key=missed.__getitem__)
    running = half = 0
    for count in sorted(missed, reverse=True):
        running += count
        half += 1
        if 2 * running >= total:
            break
    first = sum(missed[:FIRST_MINUTES]) / total
    return (
        f"{total:,} missed in {sum(1 for c in missed if c)} of {len(missed)} minutes; half of them in "
        f"{half} minute{'s' if half > 1 else ''} (worst: minute {worst}, {missed[worst]:,} of "
        f"{feasible[worst]:,}); {100 * first:.0f} % in the first {FIRST_MINUTES} minutes"
    )


def _hours(h: Any, ref: Any) -> str:
    if h is None:
        return "not reached"
    return f"{h:.2f} ({h / ref:.2f}x)" if ref else f"{h:.2f}"


def _fleet(replicas: dict[str, int]) -> str:
    """Pool sizes in short, encoder first when present: 2E+3P+4D."""
    return "+".join(f"{replicas[p]}{p[0].upper()}" for p in ("encoder", "prefill", "decode") if p in replicas)


def print_equal_attainment(doc: dict[str, Any], out: Any = None) -> None:
    """GPU-hours each policy needs for 95 % and 99 % attainment, against the hindsight oracle."""
    out = sys.stdout if out is None else out
    refs = doc.get("references", {})
    o = refs.get("oracle")
    if not o:
        return
    curves = doc["settings"].get("curves", False)
    out.write(
        "\nequal attainment: GPU-hours for 95 % / 99 % attainment (x the hindsight oracle's), "
        + (
            "interpolated on each policy's knob curve"
            if curves
            else "from the default run only (--curves to sweep)"
        )
        + "\n"
    )
    out.write(
        f"  oracle (target {100 * o.get('target_attainment', 0.99):g} %): {o['gpu_hours']:.2f} GPU-h at "
        f"{100 * o['slo_attainment']:.2f} %, peak {_fleet(o['replicas_max'])}, "
        f"{o.get('simulations', 0)} simulations"
        + (f", schedule from {o['schedule_source']}" if o.get("schedule_source") else "")
        + "\n"
    )
    fb = refs.get("fluid_bound")
    if fb and fb.get("gpu_hours"):
        out.write(
            f"  fluid bound (no schedule needs less): {fb['gpu_hours']:.2f} GPU-h "
            f"(the oracle is {o['gpu_hours'] / fb['gpu_hours']:.2f}x it)\n"
        )
    b = refs.get("best_static")
    if b:
        out.write(
            f"  best fixed fleet: {_fleet(b['replicas'])}, {b['gpu_hours']:.2f} GPU-h at "
            f"{100 * b['slo_attainment']:.2f} % ({b['gpu_hours'] / o['gpu_hours']:.2f}x the oracle), "
            f"{b.get('simulations', 0)} simulations{_frontier_note(b.get('frontier'))}\n"
        )
    oat = o.get("gpu_hours_at", {})
    out.write(f"  {'policy':<18}{'@95 %':>20}{'@99 %':>20}\n")
    for name, m in doc["policies"].items():
        at = m.get("gpu_hours_at", {})
        cells = [_hours(at.get(k), oat.get(k)) for k in ("0.95", "0.99")]
        out.write(f"  {name:<18}{cells[0]:>20}{cells[1]:>20}\n")


def _frontier_note(frontier: dict[str, Any] | None) -> str:
    """What the best fixed fleet's frontier sweep settled, for the summary line."""
    if frontier is None:  # an encoder pool, a target out of reach, or references from before the sweep
        return ""
    if frontier["complete"]:
        return "; no cheaper fixed fleet passes (every prefill count swept)"
    start = frontier.get("unchecked_from_prefill")
    where = f"from {start} prefill workers up" if start is not None else "at all"
    return f"; the sweep for a cheaper fixed fleet ran out of trials (not checked {where})"


#: The plot shades the minutes in which more than this share of the feasible requests missed.
SHADED_MISS_SHARE = 0.01


def missed_minutes(by_minute: dict[str, list[int]] | None) -> list[tuple[int, float]]:
    """(minute, share of its feasible requests that missed) for each minute above `SHADED_MISS_SHARE`."""
    if not by_minute:
        return []
    pairs = zip(by_minute["missed"], by_minute["feasible"], strict=True)
    return [(i, x / f) for i, (x, f) in enumerate(pairs) if f and x / f > SHADED_MISS_SHARE]


def plot(doc: dict[str, Any], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pols = list(doc["policies"])
    fig, axes = plt.subplots(len(pols), 1, figsize=(10, 2.4 * len(pols)), sharex=True, squeeze=False)
    for ax, name in zip(axes[:, 0], pols, strict=True):
        tl = doc["policies"][name]["timeline"]
        t = [x["t"] / 60.0 for x in tl]
        ax2 = ax.twinx()
        ax2.plot(t, [x["arrival_rps"] for x in tl], color="0.7", lw=1, label="arrival rps")
        ax2.set_ylabel("rps", color="0.5")
        for pool, color in (
            (POOL_ENCODER, "tab:green"),
            (POOL_PREFILL, "tab:blue"),
            (POOL_DECODE, "tab:orange"),
        ):
            if tl and pool in tl[0]["replicas"]:
                ax.step(t, [x["replicas"][pool] for x in tl], where="post", color=color, label=pool)
        m = doc["policies"][name]
        for minute, share in missed_minutes(m.get("misses_by_minute")):
            ax.axvspan(minute, minute + 1, color="tab:red", alpha=min(0.45, 0.1 + 0.35 * share), lw=0)
        ax.set_title(
            f"{name}: attainment {100 * (m['slo_attainment'] or 0):.2f}%, {m['gpu_hours']:.2f} GPU-h"
            f" (red: minutes where over {100 * SHADED_MISS_SHARE:g} % of the requests missed)",
            fontsize=9,
        )
        ax.set_ylabel("replicas")
        ax.legend(loc="upper left", fontsize=7)
    axes[-1, 0].set_xlabel("minutes")
    st = doc["settings"]
    title = f"{os.path.basename(doc['trace'])}: {workload_label(st)}"
    fig.suptitle(f"{title}, start-up {st['startup_s']:g} s", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def workload_label(settings: dict[str, Any]) -> str:
    """What was replayed, for a figure's title: "trace x10", "diurnal x1, one request in 10"."""
    label = f"{settings.get('workload', 'trace')} x{settings.get('rate_scale', 1)}"
    thin = settings.get("thin", 1)
    return f"{label}, one request in {thin}" if thin and thin > 1 else label


def curves_path(plot_path: str) -> str:
    return plot_path[: -len(".png")] + "-curves.png"


def plot_curves(doc: dict[str, Any], path: str) -> None:
    """Attainment vs GPU-hours per policy (its knob's curve), with the hindsight references."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    for name, m in doc["policies"].items():
        pts = m.get("curve") or [{"gpu_hours": m["gpu_hours"], "slo_attainment": m["slo_attainment"]}]
        pts = [p for p in pts if p["slo_attainment"] is not None]
        ax.plot(
            [p["gpu_hours"] for p in pts],
            [100 * p["slo_attainment"] for p in pts],
            marker="o",
            ms=4,
            lw=1.2,
            label=name,
        )
    refs = doc.get("references", {})
    for key, marker in (("oracle", "*"), ("best_static", "s")):
        r = refs.get(key)
        if r:
            ax.plot(
                r["gpu_hours"], 100 * r["slo_attainment"], marker=marker, ms=12, color="k", ls="", label=key
            )
    for a in (95, 99):
        ax.axhline(a, color="0.8", lw=0.8, ls="--")
    ax.set_xlabel("GPU-hours")
    ax.set_ylabel("SLO attainment, %")
    ax.set_ylim(max(0.0, ax.get_ylim()[0]), 100.5)
    st = doc["settings"]
    ax.set_title(
        f"{os.path.basename(doc['trace'])}: {workload_label(st)}, start-up {st['startup_s']:g} s",
        fontsize=10,
    )
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run(args: argparse.Namespace) -> int:
    from disagg.cli import UsageError

    policies = args.policy or list(EVAL_POLICY_HELP)
    for p in policies:
        if p not in EVAL_POLICY_HELP:
            raise UsageError(f"unknown policy {p!r}; choose from {', '.join(EVAL_POLICY_HELP)}")
    if args.format not in ("auto", "azure", "mooncake"):
        raise UsageError(f"unknown trace format {args.format!r}; choose from auto, azure, mooncake")
    if args.workload not in ("trace", "diurnal"):
        raise UsageError(f"unknown workload {args.workload!r}; choose from trace, diurnal")
    if args.output not in ("table", "json"):
        raise UsageError(f"unknown output {args.output!r}; choose from table, json")
    if args.rate_scale < 1:
        raise UsageError(f"--rate-scale must be >= 1, got {args.rate_scale}")
    if args.thin < 1:
        raise UsageError(f"--thin keeps one request in K: K must be >= 1, got {args.thin}")
    if args.coarse_timestamps is not None and not args.coarse_timestamps > 0:
        raise UsageError(f"--coarse-timestamps must be > 0 seconds, got {args.coarse_timestamps}")
    if args.plot and not args.plot.lower().endswith(".png"):
        raise UsageError(f"--plot writes a PNG; give a .png file name, got {args.plot!r}")
    if args.startup_seconds < 0 or not args.interval > 0:
        raise UsageError("--startup-seconds must be >= 0 and --interval > 0")
    if args.placement not in ("disaggregated", "conditional"):
        raise UsageError(f"unknown placement {args.placement!r}; choose from disaggregated, conditional")
    if args.split_threshold is not None and args.placement != "conditional":
        raise UsageError(f"--split-threshold applies to --placement conditional, not {args.placement}")
    if args.split_threshold is not None and args.split_threshold < 1:
        raise UsageError(f"--split-threshold must be >= 1 token, got {args.split_threshold}")
    if not 0.0 <= args.media_fraction <= 1.0:
        raise UsageError(f"--media-fraction must be between 0 and 1, got {args.media_fraction}")
    if args.media_items < 1:
        raise UsageError(f"--media-items must be >= 1, got {args.media_items}")
    if not 0 < args.target_attainment < 1:
        raise UsageError(f"--target-attainment must be between 0 and 1, got {args.target_attainment}")
    if not 0 <= args.headroom <= 4:
        raise UsageError(
            f"--headroom must be between 0 and 4 (a fraction of the demand), got {args.headroom}"
        )
    settings = checked_settings(args)

    from disagg.evaluate import NothingToAttain, ReferencesMismatch, diurnal, evaluate, rate_scaled
    from disagg.workload import thinned, with_coarse_timestamps, with_media

    w = traceflags.read_trace(args, fmt=args.format, limit=args.limit)
    if len(w) < 2:
        raise UsageError(f"{args.trace}: needs at least two requests")
    try:
        w = thinned(w, args.thin, seed=args.seed)
    except ValueError as exc:
        raise UsageError(f"--thin {args.thin}: {exc}") from None
    try:  # both refuse, before drawing anything, a workload too large for one run
        if args.workload == "diurnal":
            w = diurnal(w, args.rate_scale, seed=args.seed)
        else:
            w = rate_scaled(w, args.rate_scale, seed=args.seed)
    except ValueError as exc:
        raise UsageError(f"--rate-scale {args.rate_scale}: {exc}") from None
    if args.coarse_timestamps is not None:
        w = with_coarse_timestamps(w, args.coarse_timestamps)
    if args.media_fraction > 0:
        w = with_media(w, args.media_fraction, args.media_items, seed=args.seed)

    def progress(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    earlier = None
    if args.references:
        try:
            with open(args.references, encoding="utf-8") as fh:
                earlier = json.load(fh)
        except OSError as exc:
            raise UsageError(f"cannot read {args.references}: {exc.strerror or exc}") from None
        except ValueError as exc:
            raise UsageError(f"{args.references}: not JSON ({exc})") from None
    try:
        doc = evaluate(
            w,
            policies,
            settings,
            progress,
            curves=args.curves,
            best_static=not args.no_best_static,
            references=earlier,
        )
    except ReferencesMismatch as exc:
        raise UsageError(f"--references {args.references}: {exc}") from None
    except NothingToAttain as exc:
        raise UsageError(f"--ttft / --ttft-per-1k: {exc}") from None
    if args.references:
        doc["references"]["source"] = args.references
    doc["settings"]["rate_scale"] = args.rate_scale
    doc["settings"]["thin"] = args.thin
    doc["settings"]["workload"] = args.workload
    doc["settings"]["seed"] = args.seed
    doc["settings"]["media_fraction"] = args.media_fraction
    doc["settings"]["media_items"] = args.media_items
    doc["settings"]["trace_start_s"] = args.trace_start
    doc["settings"]["trace_duration_s"] = args.trace_duration
    doc["trace"] = args.trace
    if args.output == "json":
        sys.stdout.write(json.dumps(doc, indent=1) + "\n")
    else:
        print_table(doc)
    if args.plot:
        plot(doc, args.plot)
        print(f"wrote {args.plot}", file=sys.stderr)
        if args.curves:
            path = curves_path(args.plot)
            plot_curves(doc, path)
            print(f"wrote {path}", file=sys.stderr)
    return 0
