"""`disagg plan`: size encoder / prefill / decode pools for a demand and an SLO.

Every model flag defaults to the worked example (prefill 20 + 0.035 ms/token,
320 KiB/token KV over 12 ms + 22 GiB/s, 45 ms decode steps with 32 slots,
TTFT 0.6 s / ITL 0.15 s at p90). `--from FILE` reads a DisaggDeployment YAML
(pools, kvTransfer, slo, autoscaling.gpuBudget, placement); explicit flags
override it. `--trace FILE` plans for a trace's requests: their prompt and output
lengths as a size distribution (each size class with its own slack), at the
trace's busiest minute unless --arrival-rate says otherwise. `--output json`
prints the stable schema of docs/planner.md.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any, NamedTuple

from disagg import names
from disagg import worked_example as we
from disagg.commands import modelflags, traceflags

POOL_NAMES = names.POOL_NAMES

# flag dest -> worked-example default
DEFAULTS: dict[str, Any] = {
    "arrival_rate": we.ARRIVAL_RPS,
    "input_tokens": we.PROMPT_TOKENS,
    "input_tokens_std": 0.0,
    "output_tokens": we.OUTPUT_TOKENS,
    "output_tokens_std": 0.0,
    "media_fraction": 0.0,
    "items_per_request": 1.0,
    "prefix_hit_rate": 0.0,
    **modelflags.defaults(),
    "itl_statistic": modelflags.ITL_STATISTIC_CHOICES[0],
    "gpu_budget": None,
    "placement": "disaggregated",
    "chunked": False,
}
POOL_DEFAULTS = {
    names.POOL_ENCODER: (0, 10_000, 1),
    names.POOL_PREFILL: (1, 10_000, 1),
    names.POOL_DECODE: (1, 10_000, 1),
    names.POOL_COLOCATED: (1, 10_000, 1),
}


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "plan",
        help="size the encoder/prefill/decode pools for a demand and an SLO",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    f = p.add_argument
    g = p.add_argument_group("demand")
    g.add_argument("--arrival-rate", type=float, help=f"requests per second (default {we.ARRIVAL_RPS:g})")
    g.add_argument("--input-tokens", type=float, help=f"mean prompt tokens (default {we.PROMPT_TOKENS:g})")
    g.add_argument("--input-tokens-std", type=float, help="prompt tokens standard deviation (default 0)")
    g.add_argument("--output-tokens", type=float, help=f"mean output tokens (default {we.OUTPUT_TOKENS:g})")
    g.add_argument("--output-tokens-std", type=float, help="output tokens standard deviation (default 0)")
    g.add_argument("--media-fraction", type=float, help="fraction of requests with media (default 0)")
    g.add_argument("--items-per-request", type=float, help="media items per media request (default 1)")
    g.add_argument("--prefix-hit-rate", type=float, help="fraction of prompt tokens cached (default 0)")
    g.add_argument(
        "--trace",
        metavar="FILE",
        help="plan for this trace's requests (Azure or BurstGPT CSV, Mooncake JSONL): their prompt and "
        "output lengths as a size distribution, at the trace's busiest minute unless --arrival-rate is given",
    )
    g.add_argument("--format", default="auto", choices=traceflags.FORMAT_CHOICES, help=traceflags.FORMAT_HELP)
    traceflags.add_window_flags(g)
    slo_flags = p.add_argument_group("SLO")
    modelflags.add_flags(slo_flags, tuple(modelflags.SLO_FLAGS))
    modelflags.add_itl_statistic_flag(slo_flags, unset=True)
    m = p.add_argument_group("service-time models")
    modelflags.add_flags(m, tuple(modelflags.MODEL_FLAGS))
    m.add_argument(
        "--chunked",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="stream KV in chunks as prefill proceeds (default: serial)",
    )
    pl = p.add_argument_group("pools")
    pl.add_argument("--gpu-budget", type=int, help="most GPUs all pools may use (default: none)")
    pl.add_argument(
        "--placement",
        choices=list(names.PLACEMENTS),
        help="default disaggregated",
    )
    for pool in POOL_NAMES:
        pl.add_argument(f"--{pool}-min-replicas", type=int, metavar="N")
        pl.add_argument(f"--{pool}-max-replicas", type=int, metavar="N")
        pl.add_argument(f"--{pool}-gpus-per-replica", type=int, metavar="N")
    f(
        "--from",
        dest="from_file",
        metavar="FILE",
        help="read models, SLO, bounds from a DisaggDeployment YAML",
    )
    f("--output", "-o", choices=["table", "json"], default="table", help="output format (default table)")
    f("--sweep", metavar="START:STOP:STEP", help="plan a range of arrival rates (rps), STOP inclusive")
    f("--plot", metavar="FILE.png", help="with --sweep: write replicas and ratio vs load as a PNG")
    p.set_defaults(func=run)


# --------------------------------------------------------------------------- inputs


def _from_file(path: str) -> dict[str, Any]:
    """Read settings from a DisaggDeployment YAML: the api models if available, else raw keys."""
    import yaml

    from disagg.cli import UsageError

    try:
        with open(path, encoding="utf-8") as fh:
            doc = yaml.safe_load(fh)
    except OSError as exc:
        raise UsageError(f"--from {path}: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise UsageError(f"--from {path}: not valid YAML ({str(exc).splitlines()[0]})") from None
    if not isinstance(doc, dict):
        raise UsageError(f"--from {path}: expected a DisaggDeployment mapping")
    spec = doc.get("spec", doc)
    if not isinstance(spec, dict):
        raise UsageError(f"--from {path}: spec must be a mapping")
    from disagg import api

    try:
        sp = api.parse_spec(spec)
    except Exception as exc:
        first = str(exc).splitlines()
        msg = " ".join(first[:3]) if first else type(exc).__name__
        raise UsageError(f"--from {path}: invalid DisaggDeployment spec: {msg}") from None
    # The same translation the operator and the emulator use, flattened into flag values.
    pi = api.planner_inputs(sp)
    m = pi.models
    out: dict[str, Any] = {
        "encoder_fixed_ms": m.encoder.fixed_ms,
        "encoder_ms_per_item": m.encoder.ms_per_item,
        "prefill_fixed_ms": m.prefill.fixed_ms,
        "prefill_ms_per_token": m.prefill.ms_per_token,
        "prefill_ms_per_token_sq": m.prefill.ms_per_token_sq,
        "kv_bytes_per_token": m.transfer.kv_bytes_per_token,
        "link_setup_ms": m.transfer.setup_ms,
        "link_gibps": m.transfer.bandwidth_gibps,
        "chunk_tokens": m.transfer.chunk_tokens,
        "decode_step_ms": m.decode.step_fixed_ms,
        "decode_ms_per_seq": m.decode.step_ms_per_seq,
        "decode_slots": m.decode.slots,
        "decode_kv_cache_tokens": m.decode.kv_cache_tokens,
        "ttft": pi.slo.ttft_s,
        "ttft_per_1k": pi.slo.ttft_s_per_1k_tokens,
        "itl": pi.slo.itl_s,
        "percentile": pi.slo.percentile,
        "itl_statistic": pi.slo.itl_statistic,
        "placement": pi.placement,
        "chunked": pi.chunked,
    }
    if pi.budget is not None:
        out["gpu_budget"] = pi.budget
    for pool, b in pi.bounds.items():
        out[f"{pool}_min_replicas"] = b.min_replicas
        out[f"{pool}_max_replicas"] = b.max_replicas
        out[f"{pool}_gpus_per_replica"] = b.gpus_per_replica
    return out


def _resolve(args: argparse.Namespace) -> dict[str, Any]:
    file_vals = _from_file(args.from_file) if args.from_file else {}
    vals: dict[str, Any] = {}
    keys = list(DEFAULTS) + [
        f"{pool}_{k}" for pool in POOL_NAMES for k in ("min_replicas", "max_replicas", "gpus_per_replica")
    ]
    for key in keys:
        v = getattr(args, key, None)
        if v is None:
            v = file_vals.get(key)
        if v is None:
            if key in DEFAULTS:
                v = DEFAULTS[key]
            else:
                pool, _, what = key.partition("_")
                idx = ("min_replicas", "max_replicas", "gpus_per_replica").index(what)
                v = POOL_DEFAULTS[pool][idx]
        vals[key] = v
    return vals


def _build(vals: dict[str, Any], arrival: float | None = None, sizes: Any = None) -> tuple[Any, ...]:
    """(demand, models, slo, bounds, budget) from the resolved flag values; with `sizes` (a
    `SizeDistribution`) the demand's request shape is that distribution's."""
    from disagg.model import DecodeModel, EncoderModel, PrefillModel, StageModels, TransferModel
    from disagg.planner import SLO, Demand, PoolBounds
    from disagg.sizes import demand_with_sizes

    def num(name: str, flag: str, *, positive: bool = False) -> float:
        v = vals[name]
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(float(v)):
            raise ValueError(f"--{flag} must be a finite number, got {v!r}")
        if positive and float(v) <= 0:
            raise ValueError(f"--{flag} must be > 0, got {v!r}")
        if float(v) < 0:
            raise ValueError(f"--{flag} must be >= 0, got {v!r}")
        return float(v)

    def whole(name: str, flag: str) -> int:
        x = num(name, flag)
        if x != int(x):
            raise ValueError(f"--{flag} must be an integer, got {vals[name]!r}")
        return int(x)

    def wrap(flag: str, fn: Any) -> Any:
        try:
            return fn()
        except ValueError as exc:
            msg = str(exc)
            if msg.startswith("--"):
                raise
            raise ValueError(modelflags.with_flag(msg) or f"--{flag}: {msg}") from None

    models = StageModels(
        encoder=wrap(
            "encoder-*",
            lambda: EncoderModel(
                num("encoder_fixed_ms", "encoder-fixed-ms"), num("encoder_ms_per_item", "encoder-ms-per-item")
            ),
        ),
        prefill=wrap(
            "prefill-*",
            lambda: PrefillModel(
                num("prefill_fixed_ms", "prefill-fixed-ms"),
                num("prefill_ms_per_token", "prefill-ms-per-token"),
                num("prefill_ms_per_token_sq", "prefill-ms-per-token-sq"),
            ),
        ),
        transfer=wrap(
            "link-*",
            lambda: TransferModel(
                num("kv_bytes_per_token", "kv-bytes-per-token"),
                num("link_setup_ms", "link-setup-ms"),
                num("link_gibps", "link-gibps"),
                whole("chunk_tokens", "chunk-tokens"),
            ),
        ),
        decode=wrap(
            "decode-*",
            lambda: DecodeModel(
                num("decode_step_ms", "decode-step-ms"),
                num("decode_ms_per_seq", "decode-ms-per-seq"),
                whole("decode_slots", "decode-slots"),
                whole("decode_kv_cache_tokens", "decode-kv-cache-tokens"),
            ),
        ),
    )
    shared = {  # the demand fields the trace does not give
        "media_fraction": lambda: num("media_fraction", "media-fraction"),
        "items_per_request": lambda: num("items_per_request", "items-per-request"),
        "prefix_hit_rate": lambda: num("prefix_hit_rate", "prefix-hit-rate"),
    }
    rate = (lambda: num("arrival_rate", "arrival-rate")) if arrival is None else (lambda: arrival)
    if sizes is not None:
        demand = wrap(
            "demand", lambda: demand_with_sizes(rate(), sizes, **{k: f() for k, f in shared.items()})
        )
    else:
        demand = wrap(
            "demand",
            lambda: Demand(
                arrival_rps=rate(),
                prompt_tokens_mean=num("input_tokens", "input-tokens"),
                prompt_tokens_std=num("input_tokens_std", "input-tokens-std"),
                output_tokens_mean=num("output_tokens", "output-tokens"),
                output_tokens_std=num("output_tokens_std", "output-tokens-std"),
                **{k: f() for k, f in shared.items()},
            ),
        )
    slo = wrap(
        "ttft/--ttft-per-1k/--itl/--percentile/--itl-statistic",
        lambda: SLO(
            num("ttft", "ttft", positive=True),
            num("itl", "itl", positive=True),
            num("percentile", "percentile", positive=True),
            vals["itl_statistic"],
            ttft_s_per_1k_tokens=num("ttft_per_1k", "ttft-per-1k"),
        ),
    )
    bounds = {}
    for pool in POOL_NAMES:
        flag = f"{pool}-*-replicas"
        bounds[pool] = wrap(
            flag,
            lambda pool=pool: PoolBounds(
                whole(f"{pool}_min_replicas", f"{pool}-min-replicas"),
                whole(f"{pool}_max_replicas", f"{pool}-max-replicas"),
                whole(f"{pool}_gpus_per_replica", f"{pool}-gpus-per-replica"),
            ),
        )
    budget = vals["gpu_budget"]
    if budget is not None:
        budget = whole("gpu_budget", "gpu-budget")
        if budget <= 0:
            raise ValueError(f"--gpu-budget must be > 0, got {vals['gpu_budget']!r}")
    return demand, models, slo, bounds, budget


class _TraceDemand(NamedTuple):
    """What `--trace` gives the plan."""

    sizes: Any  # the requests' prompt and output lengths (`disagg.sizes.SizeDistribution`)
    rate: float  # the arrival rate to plan at: --arrival-rate, else the busiest window's
    summary: dict[str, Any]  # what the trace holds (the output's "trace" section)


def _quantiles(xs: Any) -> dict[str, float]:
    import numpy as np

    return {
        "mean": float(np.mean(xs)),
        "p50": float(np.percentile(xs, 50)),
        "p99": float(np.percentile(xs, 99)),
    }


def _trace_demand(args: argparse.Namespace) -> _TraceDemand:
    """The trace's requests as a size distribution, and the rate to plan them at."""
    from disagg import api
    from disagg.cli import UsageError
    from disagg.sizes import MIN_SIZE_SAMPLES, SizeDistribution

    w = traceflags.read_trace(args, fmt=args.format)
    n = len(w)
    if n < MIN_SIZE_SAMPLES:
        raise UsageError(
            f"{args.trace}: {n} request{'' if n == 1 else 's'}; a size distribution needs at least "
            f"{MIN_SIZE_SAMPLES} (give the shape with --input-tokens/--output-tokens instead)"
        )
    window = float(api.METRIC_WINDOW_SECONDS_DEFAULT)
    span = float(w.arrival_s[-1] - w.arrival_s[0])
    busiest = w.busiest_rate(window)
    given = args.arrival_rate is not None
    summary = {
        "file": args.trace,
        "requests": n,
        "duration_s": span,
        "mean_rps": n / span if span > 0 else None,
        "busiest_rps": busiest,
        "window_s": window,
        "prompt_tokens": _quantiles(w.prompt_tokens),
        "output_tokens": _quantiles(w.output_tokens),
        "rate_from": "arrival-rate" if given else "busiest window",
    }
    sizes = SizeDistribution.from_samples(w.prompt_tokens, w.output_tokens)
    return _TraceDemand(sizes, float(args.arrival_rate) if given else busiest, summary)


def _print_trace(t: _TraceDemand, sweep: bool) -> None:
    sm = t.summary
    mean = "" if sm["mean_rps"] is None else f", mean {sm['mean_rps']:.3g} rps"
    pt, ot = sm["prompt_tokens"], sm["output_tokens"]
    sys.stdout.write(
        f"trace {sm['file']}: {sm['requests']} requests over {sm['duration_s']:.0f} s{mean}, "
        f"busiest {sm['window_s']:g} s {sm['busiest_rps']:.3g} rps\n"
        f"prompt tokens mean {pt['mean']:.0f} (p50 {pt['p50']:.0f}, p99 {pt['p99']:.0f}), "
        f"output tokens mean {ot['mean']:.0f} (p50 {ot['p50']:.0f}, p99 {ot['p99']:.0f})\n"
    )
    if sweep:
        sys.stdout.write("planned over the requests' sizes at each rate of the sweep\n\n")
    elif sm["rate_from"] == "arrival-rate":
        sys.stdout.write(f"planned over the requests' sizes at {t.rate:g} rps (--arrival-rate)\n\n")
    else:
        sys.stdout.write(
            f"planned over the requests' sizes at {t.rate:.4g} rps, the busiest {sm['window_s']:g} s "
            "(--arrival-rate to choose another)\n\n"
        )


def _parse_sweep(text: str) -> list[float]:
    from disagg.cli import UsageError

    parts = text.split(":")
    if len(parts) != 3:
        raise UsageError(f"--sweep expects START:STOP:STEP, got {text!r}")
    try:
        start, stop, step = (float(x) for x in parts)
    except ValueError:
        raise UsageError(f"--sweep expects numbers START:STOP:STEP, got {text!r}") from None
    if not all(math.isfinite(x) for x in (start, stop, step)) or start < 0 or stop < start or step <= 0:
        raise UsageError(f"--sweep needs 0 <= START <= STOP and STEP > 0, got {text!r}")
    n = math.floor((stop - start) / step + 1e-9) + 1
    if n > 100_000:
        raise UsageError(f"--sweep has {n} points; at most 100000")
    return [round(start + i * step, 12) for i in range(n)]


# --------------------------------------------------------------------------- output


def _fmt(x: Any, nd: int = 3) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        if math.isinf(x) or math.isnan(x):
            return "inf"
        return f"{x:.{nd}f}"
    return str(x)


# Plan.decode_bound -> what the table says sizes the decode pool
_BOUND_TEXT = {
    "slots": "batch slots",
    "itl": "the ITL target (batch capped below the slots)",
    "kv": "KV memory (the KV cache fills before the slots)",
}


def _print_table(pl: Any, disaggregated: Any = None) -> None:
    """The plan as text; `disaggregated`, the same demand's disaggregated plan, is offered
    beside a colocated one that prefill stalls over the ITL target made large."""
    d = pl.to_dict()
    out = sys.stdout.write
    st = d["stages"]
    out(
        f"placement {d['placement']}   demand {pl.demand.arrival_rps:g} rps   "
        f"SLO ttft {pl.slo.ttft_s:g}s"
        + (f" + {pl.slo.ttft_s_per_1k_tokens:g}s per 1k prompt tokens" if pl.slo.ttft_s_per_1k_tokens else "")
        + f" itl {pl.slo.itl_s:g}s at p{pl.slo.percentile * 100:g}\n\n"
    )
    hdr = f"{'pool':<10}{'replicas':>9}{'gpus':>6}{'cap rps/rep':>13}{'util':>7}{'wait mean s':>13}{'wait p s':>10}{'L=λW':>9}\n"
    out(hdr)
    for name in names.POOL_NAMES:
        if name not in d["pools"]:
            continue
        p = d["pools"][name]
        out(
            f"{name:<10}{p['replicas']:>9}{p['gpus']:>6}{_fmt(p['capacity_rps']):>13}"
            f"{_fmt(p['utilization'], 2):>7}{_fmt(p['wait_mean_s']):>13}{_fmt(p['wait_p_s']):>10}"
            f"{_fmt(p['queue_len'], 2):>9}\n"
        )
    out("\n")
    out(
        f"prefill service {_fmt(st['prefill']['service_ms'], 1)} ms   "
        + (
            "no KV transfer (colocated)   "
            if d["placement"] == names.PLACEMENT_COLOCATED
            else f"KV {st['transfer']['kv_bytes'] / 2**30:.2f} GiB   "
            f"transfer serial {_fmt(st['transfer']['serial_ms'], 2)} ms / chunked tail "
            f"{_fmt(st['transfer']['chunked_ms'], 2)} ms   "
        )
        + f"decode step {_fmt(st['decode']['step_ms'], 1)} ms "
        f"(batch cap {int(st['decode']['batch_cap'])})\n"
    )
    dec = st["decode"]
    if "kv_slots" in dec:
        out(
            f"decode sized by {_BOUND_TEXT.get(d['decode_bound'], d['decode_bound'])}   KV cache "
            f"{int(dec['kv_cache_tokens']):,} tokens / {_fmt(dec['kv_footprint_tokens'], 0)} per sequence "
            f"-> {int(dec['kv_slots'])} sequence{'' if int(dec['kv_slots']) == 1 else 's'} (up to the slots)\n"
        )
    sz = st.get("sizes")
    if sz:
        out(
            f"request sizes: sized for {_fmt(100 * sz['covered_fraction'], 1)} % of the requests that can meet "
            f"TTFT, their waits at p{_fmt(100 * sz['wait_percentile'], 2)}; "
            f"{_fmt(100 * sz['idle_miss_fraction'], 2)} % miss even on an idle system\n"
        )
    pr = d["predicted"]
    out(
        f"predicted TTFT p{pl.slo.percentile * 100:g} {_fmt(pr['ttft_s'])} s   ITL {_fmt(pr['itl_s'])} s   "
        + (
            f"best achievable TTFT {_fmt(d['best_achievable']['ttft_s'])} s"
            if d["best_achievable"]["ttft_s"] is not None
            else "best achievable TTFT: none"
        )
    )
    if pr["interference_ms"]:
        out(f"   prefill stall on colocated decode {_fmt(pr['interference_ms'], 1)} ms")
    out("\n")
    r = d["ratio"]
    if r["decode_per_prefill"] is not None:
        out(
            f"ratio decode:prefill {_fmt(r['decode_per_prefill'], 2)} (throughput-only "
            f"{_fmt(r['capacity_decode_per_prefill'], 3)})   encoder:prefill {_fmt(r['encoder_per_prefill'], 2)}\n"
        )
    c = d["conditional"]
    if c["split_threshold_tokens"] is not None:
        out(
            f"split threshold {_fmt(c['split_threshold_tokens'], 0)} tokens   remote fraction "
            f"{_fmt(c['remote_fraction'], 3)}\n"
        )
    out(
        f"GPUs {d['gpus']['total']}"
        + (f" of budget {d['gpus']['budget']}" if d["gpus"]["budget"] else "")
        + "\n"
    )
    out(f"feasible {'yes' if d['feasible'] else 'NO'}: {d['reason']}\n")
    if d["budget"]["sacrificed"]:
        out(f"sacrificed: {d['budget']['sacrificed']}\n")
    if disaggregated is not None:
        out(
            f"note: each prefill stalls the decodes running on its colocated worker for "
            f"{_fmt(pr['interference_ms'], 0)} ms, over the {pl.slo.itl_s:g} s ITL target "
            f"({pl.slo.itl_statistic} gap), so the plan spreads requests until {pl.slo.percentile * 100:g} % of "
            f"them decode without another's prefill on their worker. Disaggregated pools need "
            f"{disaggregated.total_gpus} GPUs (--placement disaggregated); --itl-statistic mean judges "
            f"a request by its mean gap instead.\n"
        )


def _sweep_rows(plans: list[Any]) -> list[dict[str, Any]]:
    rows = []
    for pl in plans:
        rows.append(
            {
                "arrival_rps": pl.demand.arrival_rps,
                "replicas": pl.replicas,
                "gpus": pl.total_gpus,
                "decode_per_prefill": pl.decode_per_prefill,
                "ttft_s": pl.ttft_s,
                "itl_s": pl.itl_s,
                "feasible": pl.feasible,
                "admitted_fraction": pl.admitted_fraction,
            }
        )
    return rows


def _plot(path: str, plans: list[Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs = [pl.demand.arrival_rps for pl in plans]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    names = [n for n in POOL_NAMES if n in plans[0].pools]
    for name in names:
        ys = [pl.pools[name].replicas if name in pl.pools else 0 for pl in plans]
        if any(ys):
            ax.step(xs, ys, where="post", label=f"{name} replicas")
    ax.set_xlabel("arrival rate (req/s)")
    ax.set_ylabel("replicas")
    ax2 = ax.twinx()
    ratio = [pl.decode_per_prefill if pl.decode_per_prefill is not None else float("nan") for pl in plans]
    ax2.plot(xs, ratio, "k--", label="decode:prefill")
    ax2.set_ylabel("decode per prefill")
    h1, l1 = ax.get_legend_handles_labels()
    h2, l2 = ax2.get_legend_handles_labels()
    ax.legend(h1 + h2, l1 + l2, loc="upper left")
    ax.set_title("disagg plan: replicas and ratio vs load")
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=100)
    finally:
        plt.close(fig)


def run(args: argparse.Namespace) -> int:
    from disagg.cli import CommandFailed, UsageError
    from disagg.planner import plan

    if args.plot and not args.sweep:
        raise UsageError("--plot needs --sweep")
    if args.plot and not args.plot.lower().endswith(".png"):
        raise UsageError(f"--plot writes a PNG; give a .png file name, got {args.plot!r}")
    vals = _resolve(args)
    placement = vals["placement"]
    if placement not in ("disaggregated", "colocated", "conditional"):
        raise UsageError(f"placement must be disaggregated, colocated or conditional, got {placement!r}")
    chunked = bool(vals["chunked"])
    trace = _trace_demand(args) if args.trace else None
    sizes = trace.sizes if trace is not None else None
    if trace is not None and args.output != "json":
        _print_trace(trace, bool(args.sweep))
    if args.sweep:
        rates = _parse_sweep(args.sweep)
        plans = []
        for rate in rates:
            demand, models, slo, bounds, budget = _build(vals, arrival=rate, sizes=sizes)
            plans.append(plan(demand, models, slo, bounds, budget, placement, chunked))
        if args.output == "json":
            doc = {"schema": "disagg.plan.sweep/v1", "points": [pl.to_dict() for pl in plans]}
            if trace is not None:
                doc["trace"] = trace.summary
            sys.stdout.write(json.dumps(doc, indent=2) + "\n")
        else:
            pools = [n for n in POOL_NAMES if n in plans[0].pools]
            sys.stdout.write(
                f"{'rps':>8}"
                + "".join(f"{n:>10}" for n in pools)
                + f"{'gpus':>6}{'D/P':>7}{'ttft s':>8}{'itl s':>7}{'admit':>7}  feasible\n"
            )
            for pl in plans:
                sys.stdout.write(
                    f"{pl.demand.arrival_rps:>8g}"
                    + "".join(f"{pl.pools[n].replicas:>10}" for n in pools)
                    + f"{pl.total_gpus:>6}{_fmt(pl.decode_per_prefill, 2):>7}{_fmt(pl.ttft_s):>8}"
                    f"{_fmt(pl.itl_s):>7}{_fmt(pl.admitted_fraction, 2):>7}  {'yes' if pl.feasible else 'no'}\n"
                )
        if args.plot:
            _plot(args.plot, plans)
            if args.output != "json":
                sys.stdout.write(f"wrote {args.plot}\n")
        return 0
    demand, models, slo, bounds, budget = _build(
        vals, arrival=trace.rate if trace is not None else None, sizes=sizes
    )
    pl = plan(demand, models, slo, bounds, budget, placement, chunked)
    if args.output == "json":
        doc = pl.to_dict()
        if trace is not None:
            doc["trace"] = trace.summary
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
    else:
        stalled = (
            placement == names.PLACEMENT_COLOCATED
            and slo.itl_statistic != "mean"
            and pl.interference_ms > slo.itl_s * 1000.0
        )
        alt = (
            plan(demand, models, slo, bounds, budget, names.PLACEMENT_DISAGGREGATED, chunked)
            if stalled
            else None
        )
        _print_table(pl, alt)
    if not pl.feasible:  # the plan is printed (it says what is short); the exit status says it failed
        raise CommandFailed(f"no plan meets the SLO: {pl.to_dict()['reason']}")
    return 0
