"""Argument checks that run before a command starts any long work.

`disagg.cli.main` calls `check(command, args, given)` after parsing: `given` is the set of
option destinations the user typed (not defaults), so a flag that does not apply to the
chosen workload or mode is refused instead of silently ignored. A failed check raises
`UsageError` (one line, exit 2). Checks here only read arguments and small input files;
the commands themselves keep the checks that need their own data (a loaded trace, a plan).
"""

from __future__ import annotations

import argparse
import importlib.util
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from disagg.commands.errors import CommandFailed, UsageError
from disagg.names import DECISIONS_AT_ONCE_MAX, POOL_COLOCATED, POOL_DECODE, POOL_ENCODER, POOL_PREFILL

PORT_OPTIONS = ("port", "metrics_port", "dashboard_port", "liveness_port")
PORT_MAX = 65535

# `disagg simulate`: the workloads each workload-specific flag applies to.
SIMULATE_WORKLOAD_FLAGS: dict[str, tuple[str, ...]] = {
    "rate": ("poisson", "burst", "mix"),
    "duration": ("poisson", "burst", "mix"),
    "requests": ("poisson", "mix"),
    "prompt_tokens": ("poisson",),
    "output_tokens": ("poisson", "burst", "mix"),
    "short_tokens": ("burst", "mix"),
    "long_tokens": ("burst", "mix"),
    "long_fraction": ("burst", "mix"),
    "burst_rate": ("burst",),
    "burst_period": ("burst",),
    "burst_duty": ("burst",),
    "media_fraction": ("poisson", "burst", "mix"),
    "media_items": ("poisson", "burst", "mix"),
    "trace": ("trace",),
    "format": ("trace",),
    "time_scale": ("trace",),
    "limit": ("trace",),
    "skip_bad_lines": ("trace",),
    "trace_start": ("trace",),
    "trace_duration": ("trace",),
}
# `disagg plan`: the request shape's flags, which --trace's requests replace.
PLAN_SHAPE_FLAGS = ("input_tokens", "input_tokens_std", "output_tokens", "output_tokens_std")
# `disagg emulate`: flags of one mode only.
EMULATE_STANDALONE_ONLY = (POOL_PREFILL, POOL_DECODE, POOL_ENCODER, POOL_COLOCATED, "spec")
EMULATE_CLUSTER_ONLY = ("kubeconfig", "poll_interval")
# `disagg emulate`: flags of the generated load, which a replayed --trace replaces.
EMULATE_GENERATED_LOAD = (
    "rate",
    "schedule",
    "arrivals",
    "input_tokens",
    "input_tokens_std",
    "output_tokens",
    "output_tokens_std",
)


def flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def given_options(parser: argparse.ArgumentParser, argv: list[str]) -> set[str]:
    """Destinations of the options that `argv` sets explicitly (a default does not count).

    argparse fills a default only for a destination the namespace lacks, so parsing into a
    namespace pre-set with markers leaves a marker exactly where nothing was given.
    """
    unset = object()
    accumulating = (argparse._AppendAction, argparse._AppendConstAction, argparse._CountAction)
    preset: dict[str, Any] = {}
    for action in parser._actions:
        if action.dest == argparse.SUPPRESS:
            continue
        preset[action.dest] = None if isinstance(action, accumulating) else unset
    ns, _ = parser.parse_known_args(argv, namespace=argparse.Namespace(**preset))
    return {dest for dest, marker in preset.items() if getattr(ns, dest) is not marker}


def require(ok: bool, message: str) -> None:
    if not ok:
        raise UsageError(message)


def check_ports(args: argparse.Namespace) -> None:
    for dest in PORT_OPTIONS:
        port = getattr(args, dest, None)
        if port is not None:
            require(0 <= port <= PORT_MAX, f"{flag(dest)} {port}: a port is 0..{PORT_MAX}")


def check_kubeconfig(args: argparse.Namespace) -> None:
    path = getattr(args, "kubeconfig", None)
    if path:
        require(Path(path).is_file(), f"--kubeconfig {path}: no such file")


def check_cluster_config(kubeconfig: str | None) -> None:
    """Load the cluster configuration once, before Kopf starts (which would retry a bad one forever).

    Offline: reads the kubeconfig (or the in-cluster service account) without contacting the API
    server. Raises CommandFailed (exit 1) with the loader's reason.
    """
    import asyncio

    from kubernetes_asyncio.config import ConfigException

    from disagg.kube import Kube

    async def load() -> None:
        kube = await Kube.connect(kubeconfig)
        await kube.close()

    try:
        asyncio.run(load())
    except (ConfigException, OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        where = f"--kubeconfig {kubeconfig}" if kubeconfig else "the cluster configuration"
        why = str(exc) if isinstance(exc, ConfigException | OSError) else f"not a kubeconfig ({exc})"
        raise CommandFailed(
            f"cannot load {where}: {why}; give --kubeconfig FILE, set KUBECONFIG, or run in a pod"
        ) from None


def check_png(args: argparse.Namespace) -> None:
    path = getattr(args, "plot", None)
    if not path:
        return
    require(path.lower().endswith(".png"), f"--plot writes a PNG; give a .png file name, got {path!r}")
    require(
        importlib.util.find_spec("matplotlib") is not None,
        "--plot needs matplotlib: pip install 'disagg-operator[plot]'",
    )
    parent = Path(path).resolve().parent
    require(parent.is_dir(), f"--plot {path}: directory {parent} does not exist")


def _not_for(dests: Iterable[str], given: set[str], what: str) -> None:
    for dest in dests:
        require(dest not in given, f"{flag(dest)} does not apply {what}")


def check_simulate(args: argparse.Namespace, given: set[str]) -> None:
    workload = args.workload
    for dest, workloads in SIMULATE_WORKLOAD_FLAGS.items():
        if dest in given and workload not in workloads:
            names = " or ".join(
                [", ".join(workloads[:-1]), workloads[-1]] if len(workloads) > 2 else workloads
            )
            raise UsageError(
                f"{flag(dest)} applies to --workload {names}, not {workload}"
                + (" (the default)" if "workload" not in given else "")
            )
    require(
        not ("requests" in given and "duration" in given),
        "give --requests N or --duration S, not both",
    )
    if args.requests is not None:
        require(args.requests >= 1, f"--requests must be >= 1, got {args.requests}")
    require(args.duration > 0, f"--duration must be > 0 seconds, got {args.duration:g}")
    if args.limit is not None:
        require(args.limit >= 1, f"--limit must be >= 1, got {args.limit}")
    require(args.time_scale > 0, f"--time-scale must be > 0, got {args.time_scale:g}")
    require(
        args.prefix_cache_tokens >= 0, f"--prefix-cache-tokens must be >= 0, got {args.prefix_cache_tokens}"
    )
    if args.prefix_cache_tokens > 0:
        require(
            workload == "trace",
            "--prefix-cache-tokens needs a trace with prefix hash ids (--workload trace with a "
            f"Mooncake JSONL trace); the {workload} workload has none",
        )
    check_png(args)


def check_prefix_cache(args: argparse.Namespace, workload: Any) -> None:
    """After loading: --prefix-cache-tokens needs the trace's prefix hash ids (Mooncake has them)."""
    if getattr(args, "prefix_cache_tokens", 0) > 0:
        hashes = getattr(workload, "hash_ids", None)
        require(
            bool(hashes) and any(h for h in hashes),
            f"--prefix-cache-tokens needs prefix hash ids, and {args.trace} has none "
            "(Mooncake JSONL traces have them; Azure CSV traces do not)",
        )


def check_evaluate(args: argparse.Namespace, given: set[str]) -> None:
    if args.limit is not None:
        require(
            args.limit >= 2, f"--limit must be >= 2 (evaluate needs at least two requests), got {args.limit}"
        )
    if args.gpu_budget is not None:
        require(args.gpu_budget >= 1, f"--gpu-budget must be >= 1, got {args.gpu_budget}")
    check_png(args)


def _spec_placement(path: str) -> str:
    """The placement mode of a DisaggDeployment YAML, read up front so its errors come first."""
    import yaml

    try:
        with open(path) as fh:
            doc = yaml.safe_load(fh)
    except OSError as exc:
        raise UsageError(f"--spec {path}: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise UsageError(f"--spec {path}: not YAML ({str(exc).splitlines()[0]})") from None
    require(
        isinstance(doc, dict) and isinstance(doc.get("spec"), dict),
        f"{path}: not a DisaggDeployment (no spec)",
    )
    placement = doc["spec"].get("placement") or {}
    return str(placement.get("mode") or "disaggregated") if isinstance(placement, dict) else "disaggregated"


def check_emulate(args: argparse.Namespace, given: set[str]) -> None:
    require(args.duration >= 0, f"--duration must be >= 0 seconds (0 = until Ctrl-C), got {args.duration:g}")
    require(args.grace >= 0, f"--grace must be >= 0 seconds, got {args.grace:g}")
    require(args.poll_interval > 0, f"--poll-interval must be > 0 seconds, got {args.poll_interval:g}")
    require(args.time_scale > 0, f"--time-scale must be > 0, got {args.time_scale:g}")
    require(
        0 <= args.kv_failure_prob <= 1,
        f"--kv-failure-prob must be between 0 and 1, got {args.kv_failure_prob:g}",
    )
    require(args.max_queue >= 0, f"--max-queue must be >= 0, got {args.max_queue}")
    if args.trace:
        _not_for(EMULATE_GENERATED_LOAD, given, "with --trace (the trace gives arrivals and token counts)")
    else:
        _not_for(("time_scale", "trace_start", "trace_duration"), given, "without --trace")
        require(not ("rate" in given and "schedule" in given), "give --rate or --schedule, not both")
    if not args.standalone:
        _not_for(EMULATE_STANDALONE_ONLY, given, "without --standalone (pods come from the cluster)")
        return
    _not_for(EMULATE_CLUSTER_ONLY, given, "with --standalone (no cluster)")
    for pool in (POOL_PREFILL, POOL_DECODE, POOL_ENCODER, POOL_COLOCATED):
        n = getattr(args, pool)
        require(n >= 0, f"--{pool} must be >= 0, got {n}")
    placement = _spec_placement(args.spec) if args.spec else "disaggregated"
    if args.colocated > 0 or placement == "colocated":
        return
    require(
        args.prefill >= 1 and args.decode >= 1,
        f"a {placement} fleet needs at least one prefill and one decode pod "
        f"(--prefill {args.prefill} --decode {args.decode}); no request could finish",
    )


def check_plan(args: argparse.Namespace, given: set[str]) -> None:
    if args.trace:
        _not_for(PLAN_SHAPE_FLAGS, given, "with --trace (the trace's requests give the sizes)")
    else:
        _not_for(("format", "trace_start", "trace_duration"), given, "without --trace")


def check_dashboard(args: argparse.Namespace, given: set[str]) -> None:
    if not args.from_file:
        return
    from disagg.dashboard.history import load_result

    try:
        doc = load_result(args.from_file).to_json()
    except OSError as exc:
        raise UsageError(f"--from {args.from_file}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise UsageError(f"--from {args.from_file}: {exc}") from None
    # A JSON document of any shape gives a card; only a result has pool sizes or a series.
    cards = doc.get("deployments") or []
    require(
        any(card.get("pools") or card.get("history") for card in cards),
        f"--from {args.from_file}: no pools to show; expected a `disagg simulate --output json` or "
        "`disagg evaluate --output json` result",
    )


def check_run(args: argparse.Namespace, given: set[str]) -> None:
    from disagg import shard

    require(
        args.shard_selector is None or bool(args.shard_selector.strip()),
        "--shard-selector is empty; leave it out to own every DisaggDeployment",
    )
    try:
        shard.parse_selector(args.shard_selector)
    except ValueError as exc:
        raise UsageError(f"--shard-selector: {exc}") from None
    if args.shard_name is not None:
        try:
            shard.check_shard_name(args.shard_name)
        except ValueError as exc:
            raise UsageError(f"--shard-name: {exc}") from None
    require(
        1 <= args.decisions_at_once <= DECISIONS_AT_ONCE_MAX,
        f"--decisions-at-once must be between 1 and {DECISIONS_AT_ONCE_MAX}, got {args.decisions_at_once}",
    )


CHECKS: dict[str, Callable[[argparse.Namespace, set[str]], None]] = {
    "plan": check_plan,
    "simulate": check_simulate,
    "evaluate": check_evaluate,
    "emulate": check_emulate,
    "dashboard": check_dashboard,
    "run": check_run,
}


def check(command: str, args: argparse.Namespace, given: set[str]) -> None:
    """Every check for `command`; raises UsageError on the first problem."""
    check_ports(args)
    check_kubeconfig(args)
    extra = CHECKS.get(command)
    if extra:
        extra(args, given)
