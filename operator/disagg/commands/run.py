"""`disagg run`: the operator (Kopf) with its autoscaler, metrics and dashboard."""

from __future__ import annotations

import argparse
import os

from disagg.names import DECISIONS_AT_ONCE


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "run",
        help="run the operator against the current cluster",
        description="Run the disagg-operator: reconcile DisaggDeployments, autoscale and drain pools.",
    )
    p.add_argument(
        "-n",
        "--namespace",
        action="append",
        default=[],
        help="watch only this namespace (repeatable); default: all namespaces",
    )
    p.add_argument(
        "--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, ~/.kube/config or in-cluster)"
    )
    p.add_argument(
        "--metrics-port",
        type=int,
        default=8080,
        help="port of the operator's Prometheus metrics (0 disables; default 8080)",
    )
    p.add_argument(
        "--dashboard-port",
        type=int,
        default=8081,
        help="port of the read-only web dashboard (0 disables; default 8081)",
    )
    p.add_argument(
        "--liveness-port",
        type=int,
        default=8082,
        help="port of the probes: /healthz (alive, from start-up on) and /readyz (this replica "
        "acts: it holds the Lease or runs without election); 0 disables; default 8082",
    )
    p.add_argument(
        "--bind",
        default="127.0.0.1",
        help="address the HTTP endpoints listen on (default 127.0.0.1; 0.0.0.0 in a pod)",
    )
    p.add_argument(
        "--prometheus-url",
        default=os.environ.get("DISAGG_PROMETHEUS_URL"),
        help="Prometheus for DisaggDeployments that name none (default: $DISAGG_PROMETHEUS_URL)",
    )
    p.add_argument(
        "--allow-prometheus-url",
        action="append",
        default=[],
        metavar="URL_PREFIX",
        help="a DisaggDeployment may name its own spec.autoscaling.prometheus.url only if it starts "
        "with one of these (repeatable); default: none, every object uses --prometheus-url",
    )
    p.add_argument(
        "--allow-prometheus-secret",
        action="append",
        default=[],
        metavar="NAMESPACE/NAME",
        help="a Secret usable as per-object Prometheus credentials without the label "
        'disagg.dev/prometheus-credentials="true" (repeatable)',
    )
    p.add_argument(
        "--leader-election",
        action="store_true",
        help="hold a Lease before acting, so that of several replicas only one writes",
    )
    p.add_argument(
        "--leader-election-namespace",
        default=os.environ.get("POD_NAMESPACE") or "default",
        help="namespace of the Lease (default: $POD_NAMESPACE or default)",
    )
    p.add_argument(
        "--leader-election-id",
        default="disagg-operator-leader",
        help="name of the Lease; a shard's Lease is <this>-<shard name>",
    )
    p.add_argument(
        "--shard-selector",
        metavar="SELECTOR",
        help="own only the DisaggDeployments matching this label selector (e.g. "
        "'disagg.dev/shard=a'); run one operator per shard, with disjoint selectors, to share "
        "a fleet between processes (docs/scale.md). Default: every DisaggDeployment",
    )
    p.add_argument(
        "--shard-name",
        metavar="NAME",
        help="name of this shard, in its Lease's name and its log (default: derived from "
        "--shard-selector; give one for a shard made of --namespace only)",
    )
    p.add_argument("--no-autoscaler", action="store_true", help="reconcile only; never change pool sizes")
    p.add_argument(
        "--decisions-at-once",
        type=int,
        default=DECISIONS_AT_ONCE,
        metavar="N",
        help=f"autoscaling decisions (and drain steps) writing to the API server at once (default "
        f"{DECISIONS_AT_ONCE}; deciding itself is not bounded: it reads the watch cache). A decision that "
        "scales waits on several API writes; raise it when many DisaggDeployments change at once "
        "and the API server has room (docs/scale.md)",
    )
    p.add_argument(
        "--no-pod-monitors",
        action="store_true",
        help="never create, update or delete PodMonitors, whatever spec.monitoring.podMonitor says "
        "(for an operator without rights on monitoring.coreos.com podmonitors)",
    )
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import logging

    import kopf

    from disagg import handlers, promclient, reconcile, shard
    from disagg.commands.checks import check_cluster_config

    selector = shard.parse_selector(args.shard_selector)  # checked already (checks.check_run)
    shard_name = args.shard_name or (shard.default_shard_name(selector) if selector else None)
    check_cluster_config(args.kubeconfig)  # exit 1 now rather than Kopf retrying start-up forever
    promclient.POLICY = promclient.AccessPolicy(
        allowed_url_prefixes=tuple(args.allow_prometheus_url),
        allowed_secrets=frozenset(args.allow_prometheus_secret),
    )

    reconcile.POD_MONITORS_ALLOWED = not args.no_pod_monitors
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    handlers.State.options = {
        # One source of credentials for Kopf's watches (handlers.login) and the operator's own
        # client (handlers.startup): this file, else $KUBECONFIG / ~/.kube/config / in-cluster.
        "kubeconfig": args.kubeconfig,
        "metrics_port": args.metrics_port,
        "dashboard_port": args.dashboard_port,
        "bind": args.bind,
        "health_port": args.liveness_port,
        "autoscaler": not args.no_autoscaler,
        "decisions_at_once": args.decisions_at_once,
        "prometheus_url": args.prometheus_url,
        "namespaces": list(args.namespace),
        "leader_election": (
            args.leader_election_namespace,
            shard.lease_name(args.leader_election_id, shard_name),
        )
        if args.leader_election
        else None,
        # Server-side filter of the autoscaling loop's DisaggDeployment LIST.
        "shard_selector": str(selector) or None,
    }
    handlers.State.shard = selector
    if shard_name:
        logging.getLogger("disagg.run").info(
            "shard %s: owning the DisaggDeployments matching %r%s",
            shard_name,
            str(selector) or "(any labels)",
            f" in {', '.join(args.namespace)}" if args.namespace else "",
        )
    try:
        import importlib

        runtime = importlib.import_module("disagg.runtime")  # metrics, dashboard and autoscaling loop
        handlers.State.options["on_startup"] = runtime.start
    except ModuleNotFoundError as exc:
        if exc.name != "disagg.runtime":
            raise
    # The probes are the operator's own (disagg.health), served before the Lease is held;
    # Kopf's liveness endpoint would start only after start-up, i.e. never on a standby.
    kopf.run(
        standalone=True,
        clusterwide=not args.namespace,
        namespaces=args.namespace or (),
    )
    return 0
