"""`disagg emulate`: an emulated GPU fleet behind the pods of DisaggDeployments.

Watches the pods of DisaggDeployments (labels disagg.dev/deployment and
disagg.dev/pool). Every Running pod whose readiness gate disagg.dev/routable is
True and that has no disagg.dev/drain annotation gets an emulated engine of its
pool, with the service models of its DisaggDeployment (the simulator's stage
logic, run on the wall clock). A load generator sends requests prefill -> KV
transfer -> decode (or to colocated pods); each pod's engine metrics (vLLM
names, or SGLang's with --engine sglang) are served for Prometheus on
127.0.0.1:--metrics-port. A pod that stops being routable is drained (no new
work; in-flight work finishes); a pod that disappears loses what it held
(disagg_emulator_lost_requests_total). --standalone runs a fixed fleet without
a cluster. A summary is printed at exit (and written with --summary-json).
"""

from __future__ import annotations

import argparse
import logging
import math
import sys
from typing import Any

from disagg.commands import traceflags
from disagg.names import POOL_COLOCATED, POOL_DECODE, POOL_ENCODER, POOL_PREFILL


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "emulate",
        help="emulated GPU fleet: engine metrics for the pods of DisaggDeployments under generated load",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    c = p.add_argument_group("cluster")
    c.add_argument(
        "--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, ~/.kube/config or in-cluster)"
    )
    c.add_argument("--namespace", "-n", help="only this namespace (default: all namespaces)")
    c.add_argument("--deployment", help="only this DisaggDeployment")
    c.add_argument(
        "--selector",
        "-l",
        metavar="LABELS",
        help="only the DisaggDeployments this label selector matches (the syntax of `disagg run "
        "--shard-selector`): several emulator processes, each with its own selector and metrics "
        "port, share a fleet too large for one",
    )
    c.add_argument(
        "--poll-interval", type=float, default=0.5, help="seconds between pod listings (default 0.5)"
    )
    s = p.add_argument_group("standalone fleet (no cluster)")
    s.add_argument("--standalone", action="store_true", help="emulate a fixed fleet; no cluster needed")
    s.add_argument("--prefill", type=int, default=1, help="standalone: prefill pods (default 1)")
    s.add_argument("--decode", type=int, default=2, help="standalone: decode pods (default 2)")
    s.add_argument("--encoder", type=int, default=0, help="standalone: encoder pods (default 0)")
    s.add_argument(
        "--colocated",
        type=int,
        default=0,
        help="standalone: colocated pods: a colocated fleet (ignores --prefill/--decode)",
    )
    s.add_argument(
        "--spec",
        metavar="FILE",
        help="standalone: a DisaggDeployment YAML whose service models and placement to use "
        "(default: the worked example, disaggregated)",
    )
    w = p.add_argument_group("load")
    w.add_argument("--rate", type=float, default=2.0, help="arrival rate, req/s (default 2)")
    w.add_argument(
        "--schedule",
        help='piecewise rates "T:RATE,...": from T seconds on the rate is RATE, e.g. "0:2,60:8,180:2"',
    )
    w.add_argument(
        "--rate-per",
        choices=("fleet", "deployment"),
        default="fleet",
        help="what --rate and --schedule count: the whole fleet's arrivals, round robin over the "
        "DisaggDeployments that can serve (default), or each DisaggDeployment's own, one stream per "
        "deployment from when its first pod can serve (as independent clients send them)",
    )
    w.add_argument(
        "--arrivals",
        choices=("poisson", "uniform"),
        default="poisson",
        help="Poisson or evenly spaced arrivals",
    )
    w.add_argument("--trace", metavar="FILE", help="replay a trace (Azure or BurstGPT CSV, Mooncake JSONL)")
    traceflags.add_window_flags(w)
    w.add_argument("--time-scale", type=float, default=1.0, help="trace: multiply arrival times (default 1)")
    w.add_argument("--input-tokens", type=int, default=1000, help="prompt tokens (default 1000)")
    w.add_argument("--input-tokens-std", type=float, default=0.0, help="prompt tokens std (default 0: fixed)")
    w.add_argument("--output-tokens", type=int, default=200, help="output tokens (default 200)")
    w.add_argument(
        "--output-tokens-std", type=float, default=0.0, help="output tokens std (default 0: fixed)"
    )
    w.add_argument(
        "--media-fraction",
        type=float,
        default=0.0,
        help="share of requests with media, for the encoder pool (default 0)",
    )
    w.add_argument("--media-items", type=int, default=1, help="media items per media request (default 1)")
    w.add_argument(
        "--duration",
        type=float,
        default=60.0,
        help="seconds of load, then exit (default 60; 0 = until SIGINT)",
    )
    w.add_argument(
        "--grace", type=float, default=0.0, help="after --duration, seconds to let in-flight work finish"
    )
    w.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    e = p.add_argument_group("emulated engines")
    e.add_argument(
        "--engine",
        choices=("vllm", "sglang", "auto"),
        default="vllm",
        help="metric names: vllm (default), sglang, or auto (each DisaggDeployment's spec.engine)",
    )
    e.add_argument(
        "--chunked",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="stream KV chunks while prefill runs (default: each DisaggDeployment's kvTransfer.streamChunks; "
        "standalone: off)",
    )
    e.add_argument("--kv-failure-prob", type=float, default=0.0, help="probability a KV transfer fails")
    e.add_argument(
        "--max-queue", type=int, default=1000, help="front-door queue bound; further requests are rejected"
    )
    h = p.add_argument_group("serving (OpenAI-compatible HTTP per emulated pod; docs/emulator.md)")
    h.add_argument(
        "--serve",
        action="store_true",
        help="each emulated pod serves /v1/completions, /v1/chat/completions, /v1/models, /health, "
        "/metrics on its pod IP (must be in 127.0.0.0/8); --rate 0 for no generated load",
    )
    h.add_argument(
        "--serve-address",
        default="127.2.0.2",
        help="standalone: address of the first pod, the next pods count up (default 127.2.0.2)",
    )
    h.add_argument(
        "--serve-port",
        type=int,
        default=8000,
        help="standalone: engine port of every pod (default 8000; 0 = any); in a cluster each pod's "
        "container port",
    )
    o = p.add_argument_group("output")
    o.add_argument("--metrics-port", type=int, default=9400, help="Prometheus port (default 9400; 0 = any)")
    o.add_argument("--metrics-host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    o.add_argument(
        "--gone-retention",
        type=float,
        default=600.0,
        help="seconds a deleted pod's lost-requests counter stays exported (default 600)",
    )
    o.add_argument("--summary-json", metavar="FILE", help="also write the exit summary as JSON")
    o.add_argument("--log-level", default="INFO", help="default INFO")
    p.set_defaults(func=run)


def build_load(args: argparse.Namespace):
    import numpy as np

    from disagg.cli import UsageError
    from disagg.emulator.load import LoadGenerator, PerDeploymentLoad, TokenDraw, TraceLoad, parse_schedule

    duration = args.duration if args.duration > 0 else math.inf
    per_deployment = args.rate_per == "deployment"
    if args.trace and per_deployment:
        raise UsageError("--rate-per deployment needs --rate or --schedule: a trace is one stream")
    if args.trace:
        trace = traceflags.read_trace(args, time_scale=args.time_scale)
        return TraceLoad(trace, duration)
    if args.schedule:
        schedule = parse_schedule(args.schedule)
    else:
        if args.serve and args.rate == 0:
            from disagg.emulator.driver import _NoLoad

            return _NoLoad()  # requests come over HTTP only
        if not args.rate > 0:
            raise UsageError(f"--rate must be > 0, got {args.rate}")
        schedule = [(0.0, args.rate)]
    if not 0.0 <= args.media_fraction <= 1.0:
        raise UsageError(f"--media-fraction must be between 0 and 1, got {args.media_fraction}")
    if args.media_items < 1:
        raise UsageError(f"--media-items must be >= 1, got {args.media_items}")

    def stream(rng: np.random.Generator, start_s: float = 0.0) -> LoadGenerator:
        return LoadGenerator(
            schedule,
            TokenDraw(args.input_tokens, args.input_tokens_std, rng),
            TokenDraw(args.output_tokens, args.output_tokens_std, rng),
            arrivals=args.arrivals,
            duration_s=duration,
            rng=rng,
            media_fraction=args.media_fraction,
            media_items=args.media_items,
            start_s=start_s,
        )

    if per_deployment:  # the i-th deployment seen draws from its own seeded generator
        return PerDeploymentLoad(lambda i, start_s: stream(np.random.default_rng([args.seed, i]), start_s))
    return stream(np.random.default_rng(args.seed))


def standalone_fleet(args: argparse.Namespace):
    from disagg.cli import UsageError
    from disagg.emulator.fleet import DeploymentEmulator, Fleet, from_spec
    from disagg.model import StageModels

    fleet = Fleet(max_queue=args.max_queue, gone_retention_s=args.gone_retention)
    name = args.deployment or "standalone"
    ns = args.namespace or "default"
    engine = None if args.engine == "auto" else args.engine
    if args.spec:
        import yaml

        with open(args.spec) as fh:
            doc = yaml.safe_load(fh)
        if not isinstance(doc, dict) or "spec" not in doc:
            raise UsageError(f"{args.spec}: not a DisaggDeployment (no spec)")
        dep = from_spec(
            ns,
            name,
            doc["spec"],
            engine=engine,
            chunked=args.chunked,
            failure_prob=args.kv_failure_prob,
            max_queue=args.max_queue,
            seed=args.seed,
        )
    else:
        placement = "colocated" if args.colocated > 0 else "disaggregated"
        dep = DeploymentEmulator(
            ns,
            name,
            StageModels(),
            placement=placement,
            chunked=bool(args.chunked),
            failure_prob=args.kv_failure_prob,
            engine=engine or "vllm",
            max_queue=args.max_queue,
            seed=args.seed,
        )
    fleet.add_deployment(dep, 0.0)
    counts = {
        POOL_ENCODER: args.encoder,
        POOL_PREFILL: args.prefill,
        POOL_DECODE: args.decode,
        POOL_COLOCATED: args.colocated,
    }
    if dep.placement == "colocated":
        counts[POOL_PREFILL] = counts[POOL_DECODE] = 0
        counts[POOL_COLOCATED] = counts[POOL_COLOCATED] or 1
    else:
        counts[POOL_COLOCATED] = 0
    for pool, n in counts.items():
        if n < 0:
            raise UsageError(f"--{pool} must be >= 0")
        for i in range(n):
            fleet.add_pod(dep, pool, f"{name}-{pool}-{i}", f"standalone-{pool}-{i}", 0.0)
    return fleet


def run(args: argparse.Namespace) -> int:
    import asyncio

    from disagg.cli import UsageError
    from disagg.emulator.driver import PodWatcher, emulate, write_summary
    from disagg.emulator.fleet import Fleet

    logging.basicConfig(
        level=getattr(logging, str(args.log_level).upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(message)s",
        stream=sys.stderr,
    )
    if args.max_queue < 0:
        raise UsageError("--max-queue must be >= 0")
    load = build_load(args)
    duration = args.duration if args.duration > 0 else math.inf

    def serving(fleet, address_of):
        if not args.serve:
            return None
        from disagg.emulator.http import FleetServer

        return lambda now, metrics: FleetServer(fleet, now, address_of=address_of, metrics_text=metrics)

    async def main() -> dict:
        if args.standalone:
            fleet = standalone_fleet(args)
            if args.serve:
                from disagg.emulator.http import check_loopback, sequential_addresses

                try:
                    check_loopback(args.serve_address)
                except ValueError as exc:
                    raise UsageError(f"--serve-address: {exc}") from None
                address_of = sequential_addresses(args.serve_address, args.serve_port)
            # the fleet was built at t=0; the driver's clock starts now
            return await emulate(
                fleet,
                load,
                duration_s=duration,
                metrics_host=args.metrics_host,
                metrics_port=args.metrics_port,
                grace_s=args.grace,
                serve=serving(fleet, address_of) if args.serve else None,
            )
        from disagg import shard
        from disagg.kube import Kube

        try:
            selector = str(shard.parse_selector(args.selector)) or None
        except ValueError as exc:
            raise UsageError(f"--selector: {exc}") from None

        kube = await Kube.connect(args.kubeconfig)
        fleet = Fleet(max_queue=args.max_queue, gone_retention_s=args.gone_retention)
        try:
            return await emulate(
                fleet,
                load,
                duration_s=duration,
                metrics_host=args.metrics_host,
                metrics_port=args.metrics_port,
                watcher_factory=lambda now: PodWatcher(
                    kube,
                    fleet,
                    now,
                    namespace=args.namespace,
                    deployment=args.deployment,
                    selector=selector,
                    engine=None if args.engine == "auto" else args.engine,
                    chunked=args.chunked,
                    failure_prob=args.kv_failure_prob,
                    seed=args.seed,
                ),
                poll_interval_s=args.poll_interval,
                grace_s=args.grace,
                serve=serving(fleet, lambda pod: fleet.addresses.get((pod.namespace, pod.name, pod.uid))),
            )
        finally:
            await kube.close()

    summary = asyncio.run(main())
    write_summary(summary, args.summary_json)
    return 0
