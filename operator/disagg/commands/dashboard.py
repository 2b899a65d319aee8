"""`disagg dashboard`: the read-only web dashboard, standalone.

Either watches a cluster (polling its DisaggDeployments) or shows a saved
`disagg simulate|evaluate --output json` result. The operator (`disagg run`)
serves the same page itself on --dashboard-port.
"""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "dashboard",
        help="web dashboard of pool sizes and ratios (cluster or saved result)",
        description=(
            "Serve the read-only dashboard of DisaggDeployment pools: sizes over time, "
            "the P:D(:E) ratio, per-stage load, latency against the SLO, drains and decisions. "
            "Source: the cluster (default) or a saved simulate/evaluate JSON result (--from)."
        ),
    )
    p.add_argument(
        "--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, ~/.kube/config or in-cluster)"
    )
    p.add_argument("-n", "--namespace", help="only this namespace (default: all namespaces)")
    p.add_argument(
        "--from",
        dest="from_file",
        metavar="FILE",
        help="show a saved `disagg simulate|evaluate --output json` result instead of a cluster",
    )
    p.add_argument(
        "--interval",
        type=float,
        default=5.0,
        help="seconds between cluster polls (default 5)",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8081, help="port (default 8081; 0 picks a free one)")
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import logging
    import sys
    from pathlib import Path

    from disagg.cli import UsageError
    from disagg.dashboard import server

    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if args.from_file and (args.kubeconfig or args.namespace):
        raise UsageError("--from shows a saved result; it does not combine with --kubeconfig/--namespace")
    if not 0 <= args.port <= 65535:
        raise UsageError(f"--port {args.port}: must be 0..65535")
    if args.kubeconfig and not Path(args.kubeconfig).is_file():
        raise UsageError(f"--kubeconfig {args.kubeconfig}: no such file")
    if args.interval <= 0:
        raise UsageError(f"--interval {args.interval}: must be positive")

    if args.from_file:
        try:
            source: object = server.FileSource(args.from_file)
        except OSError as exc:
            raise UsageError(f"--from {args.from_file}: {exc.strerror or exc}") from None
        what = f"result {args.from_file}"
    else:
        from disagg.kube import Kube

        async def source() -> server.ClusterSource:  # connect inside the server's event loop
            kube = await Kube.connect(args.kubeconfig)
            return server.ClusterSource(kube, args.namespace, args.interval, close_kube=True)

        what = f"namespace {args.namespace}" if args.namespace else "all namespaces"

    def ready(url: str) -> None:
        print(f"disagg dashboard ({what}): {url}", flush=True)
        print("press Ctrl-C to stop", file=sys.stderr, flush=True)

    try:
        server.run(source, host=args.host, port=args.port, on_ready=ready)  # type: ignore[arg-type]
    except OSError as exc:  # port taken, address not available, unreadable kubeconfig
        raise UsageError(f"cannot serve on {args.host}:{args.port}: {exc.strerror or exc}") from None
    except Exception as exc:
        if type(exc).__name__ == "ConfigException":  # kubernetes_asyncio: no usable kubeconfig
            raise UsageError(f"kubeconfig: {exc}") from None
        raise
    return 0
