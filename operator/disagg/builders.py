"""Pure manifests of a DisaggDeployment's children: per pool a Deployment, a Service and a PDB.

Every function returns plain dicts, ready for a server-side apply; nothing here
talks to the API server. `kube.py` applies them; the tests read them.

Naming: the children of DisaggDeployment `llama` are `llama-prefill`,
`llama-decode`, ... (one Deployment, Service and PodDisruptionBudget each).
The selector uses only the two stable labels `disagg.dev/deployment` and
`disagg.dev/pool` (a Deployment selector is immutable).

Pure module: no kopf, no kubernetes client, no HTTP.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from disagg import api, routers
from disagg.names import (
    ANNOTATION_TEMPLATE_HASH,
    LABEL_DEPLOYMENT,
    LABEL_POOL,
    LABEL_ROUTER,
    MANAGER,
    POOL_COLOCATED,
    POOL_DECODE,
    POOL_PREFILL,
    READINESS_GATE,
)

GPU_RESOURCE = api.GPU_RESOURCE
PART_OF = "disagg"
DEFAULT_HTTP_PORT = 8000
DEFAULT_METRICS_PORT = 9090


@dataclass(frozen=True)
class Owner:
    """The DisaggDeployment the children belong to."""

    name: str
    namespace: str
    uid: str
    api_version: str = api.API_VERSION
    kind: str = api.KIND

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> Owner:
        meta = body["metadata"]
        return cls(name=meta["name"], namespace=meta.get("namespace") or "default", uid=meta["uid"])

    def reference(self) -> dict[str, Any]:
        return {
            "apiVersion": self.api_version,
            "kind": self.kind,
            "name": self.name,
            "uid": self.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }


def child_name(owner_name: str, pool: str) -> str:
    return f"{owner_name}-{pool}"


def selector_labels(owner_name: str, pool: str) -> dict[str, str]:
    """The immutable selector of a pool's pods."""
    return {LABEL_DEPLOYMENT: owner_name, LABEL_POOL: pool}


def labels(owner_name: str, pool: str, engine: str) -> dict[str, str]:
    """All labels the operator puts on a pool's objects and pods."""
    return {
        **selector_labels(owner_name, pool),
        "app.kubernetes.io/name": engine,
        "app.kubernetes.io/instance": owner_name,
        "app.kubernetes.io/component": pool,
        "app.kubernetes.io/part-of": PART_OF,
        "app.kubernetes.io/managed-by": MANAGER,
    }


def deep_merge(base: Any, override: Any) -> Any:
    """Recursively merge mappings (override wins); any other value is replaced. Inputs are not modified."""
    if isinstance(base, Mapping) and isinstance(override, Mapping):
        out = {k: copy.deepcopy(v) for k, v in base.items()}
        for key, value in override.items():
            out[key] = deep_merge(out[key], value) if key in out else copy.deepcopy(value)
        return out
    return copy.deepcopy(override)


def template_hash(obj: Any) -> str:
    """Deterministic short hash of a JSON-able object (key order does not matter)."""
    text = json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def engine_container(containers: list[dict[str, Any]], engine: str) -> dict[str, Any]:
    """The container running the engine: the one named like the engine, else the first."""
    for c in containers:
        if c.get("name") == engine:
            return c
    return containers[0]


def _set_gpus(container: dict[str, Any], gpus: int) -> None:
    resources = container.setdefault("resources", {})
    requests = resources.setdefault("requests", {})
    limits = resources.setdefault("limits", {})
    # Extended resources need requests == limits; honour whichever the user set.
    value = limits.get(GPU_RESOURCE, requests.get(GPU_RESOURCE, gpus))
    requests.setdefault(GPU_RESOURCE, value)
    limits.setdefault(GPU_RESOURCE, value)


def pod_template(owner: Owner, spec: api.DisaggDeploymentSpec, pool: str) -> dict[str, Any]:
    """The pool's pod template: the user's template plus labels, GPUs and the routable readiness gate."""
    p = api.pools(spec)[pool]
    operator_part = {"metadata": {"labels": labels(owner.name, pool, spec.engine)}}
    tpl = deep_merge(p.template, operator_part)
    pod = tpl.setdefault("spec", {})
    containers = pod["containers"]
    _set_gpus(engine_container(containers, spec.engine), p.gpus_per_replica)
    gates = pod.setdefault("readinessGates", [])
    if not any(g.get("conditionType") == READINESS_GATE for g in gates):
        gates.append({"conditionType": READINESS_GATE})
    # The engine needs time to finish in-flight work on SIGTERM (rolling updates bypass our drain).
    pod.setdefault("terminationGracePeriodSeconds", p.drain.timeout_seconds)
    return tpl


def _meta(owner: Owner, spec: api.DisaggDeploymentSpec, pool: str) -> dict[str, Any]:
    return {
        "name": child_name(owner.name, pool),
        "namespace": owner.namespace,
        "labels": labels(owner.name, pool, spec.engine),
        "ownerReferences": [owner.reference()],
    }


def deployment(owner: Owner, spec: api.DisaggDeploymentSpec, pool: str, replicas: int) -> dict[str, Any]:
    """The pool's Deployment with `replicas` pods."""
    return _deployment_of(
        _meta(owner, spec, pool),
        pod_template(owner, spec, pool),
        int(replicas),
        selector_labels(owner.name, pool),
        strategy={"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}},
    )


def _deployment_of(
    meta: dict[str, Any],
    template: dict[str, Any],
    replicas: int,
    selector: dict[str, str],
    strategy: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A Deployment of `template`, its metadata annotated with the template's hash (what tells a
    changed spec from an unchanged one)."""
    meta["annotations"] = {ANNOTATION_TEMPLATE_HASH: template_hash(template)}
    dep_spec: dict[str, Any] = {"replicas": replicas, "selector": {"matchLabels": selector}}
    if strategy is not None:
        dep_spec["strategy"] = strategy
    dep_spec["template"] = template
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta, "spec": dep_spec}


def _ports(spec: api.DisaggDeploymentSpec, pool: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(http, metrics) Service ports from the engine container."""
    p = api.pools(spec)[pool]
    container = engine_container(p.template["spec"]["containers"], spec.engine)
    ports = [x for x in container.get("ports") or [] if isinstance(x, Mapping) and "containerPort" in x]
    metrics = next((x for x in ports if x.get("name") == "metrics"), None)
    serving = next((x for x in ports if x is not metrics), None)
    http_port = int(serving["containerPort"]) if serving else DEFAULT_HTTP_PORT
    http = {"name": "http", "port": http_port, "targetPort": http_port, "protocol": "TCP"}
    if metrics is not None:
        mp = int(metrics["containerPort"])
        return http, {"name": "metrics", "port": mp, "targetPort": mp, "protocol": "TCP"}
    # vLLM and SGLang serve /metrics on the API port: expose it under the name "metrics" too.
    port = DEFAULT_METRICS_PORT if http_port != DEFAULT_METRICS_PORT else DEFAULT_METRICS_PORT + 1
    return http, {"name": "metrics", "port": port, "targetPort": http_port, "protocol": "TCP"}


def service(owner: Owner, spec: api.DisaggDeploymentSpec, pool: str) -> dict[str, Any]:
    """ClusterIP Service of the pool (draining pods leave it through the readiness gate)."""
    http, metrics = _ports(spec, pool)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(owner, spec, pool),
        "spec": {
            "type": "ClusterIP",
            "selector": selector_labels(owner.name, pool),
            "ports": [http, metrics],
        },
    }


def pod_disruption_budget(owner: Owner, spec: api.DisaggDeploymentSpec, pool: str) -> dict[str, Any]:
    """At most one voluntary eviction at a time per pool (node drains, not our own scale-downs)."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": _meta(owner, spec, pool),
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": selector_labels(owner.name, pool)}},
    }


def pool_objects(
    owner: Owner, spec: api.DisaggDeploymentSpec, pool: str, replicas: int | None = None
) -> list[dict[str, Any]]:
    """Deployment, Service and PDB of one pool (replicas default to the pool's initial count)."""
    n = api.pools(spec)[pool].initial_replicas if replicas is None else replicas
    return [
        deployment(owner, spec, pool, n),
        service(owner, spec, pool),
        pod_disruption_budget(owner, spec, pool),
    ]


def all_objects(
    owner: Owner, spec: api.DisaggDeploymentSpec, replicas: Mapping[str, int] | None = None
) -> list[dict[str, Any]]:
    """Children of every present pool, in pipeline order."""
    replicas = replicas or {}
    out: list[dict[str, Any]] = []
    for pool in api.pool_names(spec):
        out.extend(pool_objects(owner, spec, pool, replicas.get(pool)))
    return out


# --------------------------------------------------------------------------- the router


def router_name(owner_name: str) -> str:
    return f"{owner_name}-router"


def router_selector_labels(owner_name: str) -> dict[str, str]:
    return {LABEL_ROUTER: owner_name}


def router_labels(owner_name: str, engine: str) -> dict[str, str]:
    return {
        **router_selector_labels(owner_name),
        "app.kubernetes.io/name": routers.preset(engine).package,
        "app.kubernetes.io/instance": owner_name,
        "app.kubernetes.io/component": "router",
        "app.kubernetes.io/part-of": PART_OF,
        "app.kubernetes.io/managed-by": MANAGER,
    }


def _router_meta(owner: Owner, spec: api.DisaggDeploymentSpec) -> dict[str, Any]:
    return {
        "name": router_name(owner.name),
        "namespace": owner.namespace,
        "labels": router_labels(owner.name, spec.engine),
        "ownerReferences": [owner.reference()],
    }


def engine_port(spec: api.DisaggDeploymentSpec) -> int:
    """The engines' HTTP port the router reaches the pods on (decode's, or colocated's).

    The router takes one port for all discovered pods, so prefill and decode must serve on the
    same port (see docs/router.md).
    """
    pool = POOL_COLOCATED if spec.placement.mode == "colocated" else POOL_DECODE
    return int(_ports(spec, pool)[0]["port"])


def router_args(owner: Owner, spec: api.DisaggDeploymentSpec) -> list[str]:
    """The router's flags: pool selectors, this namespace only, the engine port, spec.router.extraArgs."""
    if spec.placement.mode == "colocated":
        sel = {"worker_selector": selector_labels(owner.name, POOL_COLOCATED)}
    else:
        sel = {
            "prefill_selector": selector_labels(owner.name, POOL_PREFILL),
            "decode_selector": selector_labels(owner.name, POOL_DECODE),
        }
    return routers.router_args(
        spec.engine,
        namespace=owner.namespace,
        engine_port=engine_port(spec),
        extra=spec.router.extra_args,
        **sel,
    )


def router_service_account(owner: Owner, spec: api.DisaggDeploymentSpec) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _router_meta(owner, spec)}


def router_role(owner: Owner, spec: api.DisaggDeploymentSpec) -> dict[str, Any]:
    """Least privilege for the router's Kubernetes discovery: watch the pods of this namespace."""
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": _router_meta(owner, spec),
        "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}],
    }


def router_role_binding(owner: Owner, spec: api.DisaggDeploymentSpec) -> dict[str, Any]:
    name = router_name(owner.name)
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": _router_meta(owner, spec),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": owner.namespace}],
    }


def router_deployment(owner: Owner, spec: api.DisaggDeploymentSpec) -> dict[str, Any]:
    """The router's Deployment: the pinned router binary with the pools' selectors."""
    r = spec.router
    container = {
        "name": "router",
        "image": r.image or routers.DEFAULT_ROUTER_IMAGE,
        "command": routers.container_command(spec.engine),
        "args": router_args(owner, spec),
        "ports": [
            {"name": "http", "containerPort": routers.ROUTER_HTTP_PORT, "protocol": "TCP"},
            {"name": "metrics", "containerPort": routers.ROUTER_METRICS_PORT, "protocol": "TCP"},
        ],
        # Ready once the router can route: both routers listen before their discovery has added
        # a worker, and answer 503 "no available workers" until then; their /readiness is 503
        # until a healthy prefill and decode worker (or colocated one) is known. So a replaced
        # or rolled router pod gets traffic only once it can serve it (docs/router.md, "A router
        # restart"); an endpoint with no worker at all is unready (refused, not 503).
        "readinessProbe": {
            "httpGet": {"path": routers.READINESS_PATH, "port": "http"},
            "periodSeconds": routers.READINESS_PERIOD_S,
        },
    }
    if r.resources:
        container["resources"] = copy.deepcopy(r.resources)
    template = {
        "metadata": {"labels": router_labels(owner.name, spec.engine)},
        "spec": {"serviceAccountName": router_name(owner.name), "containers": [container]},
    }
    return _deployment_of(_router_meta(owner, spec), template, r.replicas, router_selector_labels(owner.name))


def router_service(owner: Owner, spec: api.DisaggDeploymentSpec) -> dict[str, Any]:
    """The deployment's endpoint: OpenAI-compatible API on port 8000, the router's metrics on 29000."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _router_meta(owner, spec),
        "spec": {
            "type": "ClusterIP",
            "selector": router_selector_labels(owner.name),
            "ports": [
                {"name": "http", "port": routers.ROUTER_HTTP_PORT, "targetPort": "http", "protocol": "TCP"},
                {
                    "name": "metrics",
                    "port": routers.ROUTER_METRICS_PORT,
                    "targetPort": "metrics",
                    "protocol": "TCP",
                },
            ],
        },
    }


def router_endpoint(owner: Owner, spec: api.DisaggDeploymentSpec) -> str | None:
    """The deployment's OpenAI-compatible base URL inside the cluster (None without a router)."""
    if not spec.router.enabled:
        return None
    return f"http://{router_name(owner.name)}.{owner.namespace}:{routers.ROUTER_HTTP_PORT}/v1"


#: Kinds of the router's objects, in apply order (the account and its rights before the pods).
ROUTER_KINDS = ("ServiceAccount", "Role", "RoleBinding", "Deployment", "Service")


def router_objects(owner: Owner, spec: api.DisaggDeploymentSpec) -> list[dict[str, Any]]:
    """The router's objects (none when spec.router.enabled is false)."""
    if not spec.router.enabled:
        return []
    return [
        router_service_account(owner, spec),
        router_role(owner, spec),
        router_role_binding(owner, spec),
        router_deployment(owner, spec),
        router_service(owner, spec),
    ]


# --------------------------------------------------------------------------- the PodMonitor
# A Prometheus Operator PodMonitor that scrapes the engine pods and the router with the labels
# the autoscaler's queries select on (disagg.metrics.pool_selector: `namespace` and `pod`),
# plus `pool` and `deployment` for people reading the series. Pods are scraped whether Ready or
# not: a drained pod (routable gate False) must still report the work it holds.

POD_MONITOR_API_VERSION = "monitoring.coreos.com/v1"
POD_MONITOR_KIND = "PodMonitor"
#: Where the engines serve their metrics (vLLM and SGLang: the API port) and the router its own.
METRICS_PATH = "/metrics"


def meta_label(label: str) -> str:
    """The Kubernetes service discovery's meta label of a pod label (every character that is
    not a letter, digit or underscore becomes an underscore)."""
    return "__meta_kubernetes_pod_label_" + "".join(ch if ch.isalnum() or ch == "_" else "_" for ch in label)


def pod_monitor_name(owner_name: str) -> str:
    return owner_name


def pod_monitor_selector_labels(owner_name: str) -> dict[str, str]:
    """Labels every pod of the deployment carries, engine and router alike (labels(), router_labels())."""
    return {"app.kubernetes.io/instance": owner_name, "app.kubernetes.io/part-of": PART_OF}


def engine_metrics_port(spec: api.DisaggDeploymentSpec) -> dict[str, Any]:
    """How a PodMonitor endpoint names the engines' metrics port: `port` (a container port's name)
    when the engine container names it, else `targetPort` (its number). A port named "metrics"
    wins; otherwise the serving port (vLLM and SGLang serve /metrics on their API port). Every pool
    must use the same one: a PodMonitor endpoint names a single port."""
    found: set[tuple[str, Any]] = set()
    for pool in api.pool_names(spec):
        p = api.pools(spec)[pool]
        container = engine_container(p.template["spec"]["containers"], spec.engine)
        ports = [x for x in container.get("ports") or [] if isinstance(x, Mapping) and "containerPort" in x]
        chosen = next((x for x in ports if x.get("name") == "metrics"), ports[0] if ports else None)
        if chosen is None:
            found.add(("targetPort", DEFAULT_HTTP_PORT))
        elif chosen.get("name"):
            found.add(("port", chosen["name"]))
        else:
            found.add(("targetPort", int(chosen["containerPort"])))
    if len(found) != 1:
        raise ValueError(
            "the pools' engine containers expose their metrics on different ports "
            f"({', '.join(f'{k} {v}' for k, v in sorted(found, key=str))}); a PodMonitor needs one: "
            'name the metrics port "metrics" in every pool, or use the same serving port'
        )
    key, value = found.pop()
    return {key: value}


def _relabel(source: str, target: str) -> dict[str, Any]:
    return {"sourceLabels": [source], "targetLabel": target, "action": "replace"}


def _keep_with_label(label: str) -> dict[str, Any]:
    return {"sourceLabels": [meta_label(label)], "regex": ".+", "action": "keep"}


def pod_monitor(owner: Owner, spec: api.DisaggDeploymentSpec) -> dict[str, Any]:
    """The deployment's PodMonitor: one endpoint for the engine pods, one for the router pods.

    Both endpoints select every pod of the deployment (pod_monitor_selector_labels) and keep the
    engine pods (which carry disagg.dev/pool) or the router pods (disagg.dev/router) respectively,
    so a port that both happen to name alike is never scraped on the wrong pod. The relabelings
    set `namespace` and `pod` (what the queries select on; the Prometheus Operator adds these
    too) and `pool` / `deployment` from the pod labels. The interval is the autoscaler's
    `scrapeIntervalSeconds`, which its freshness check (two intervals) assumes.
    """
    interval = f"{int(spec.autoscaling.scrape_interval_seconds)}s"
    common = [
        _relabel("__meta_kubernetes_namespace", "namespace"),
        _relabel("__meta_kubernetes_pod_name", "pod"),
    ]
    engine = {
        **engine_metrics_port(spec),
        "path": METRICS_PATH,
        "interval": interval,
        "relabelings": [
            _keep_with_label(LABEL_POOL),
            *common,
            _relabel(meta_label(LABEL_POOL), "pool"),
            _relabel(meta_label(LABEL_DEPLOYMENT), "deployment"),
        ],
    }
    endpoints = [engine]
    if spec.router.enabled:
        endpoints.append(
            {
                "port": "metrics",  # router_deployment's container port
                "path": METRICS_PATH,
                "interval": interval,
                "relabelings": [
                    _keep_with_label(LABEL_ROUTER),
                    *common,
                    {"targetLabel": "pool", "replacement": "router", "action": "replace"},
                    _relabel(meta_label(LABEL_ROUTER), "deployment"),
                ],
            }
        )
    return {
        "apiVersion": POD_MONITOR_API_VERSION,
        "kind": POD_MONITOR_KIND,
        "metadata": {
            "name": pod_monitor_name(owner.name),
            "namespace": owner.namespace,
            "labels": {
                LABEL_DEPLOYMENT: owner.name,
                "app.kubernetes.io/instance": owner.name,
                "app.kubernetes.io/component": "monitoring",
                "app.kubernetes.io/part-of": PART_OF,
                "app.kubernetes.io/managed-by": MANAGER,
            },
            "ownerReferences": [owner.reference()],
        },
        "spec": {
            "selector": {"matchLabels": pod_monitor_selector_labels(owner.name)},
            "podMetricsEndpoints": endpoints,
        },
    }
