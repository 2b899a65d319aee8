"""A PodMonitor as a plain Prometheus scrape configuration, for a Prometheus without the Operator.

`scrape_configs(pod_monitor)` gives one `scrape_configs` entry per pod metrics endpoint, with the
target selection the Prometheus Operator performs for a PodMonitor (as its documentation
describes it): Kubernetes service discovery of pods in the PodMonitor's namespace; keep the
pods whose labels match the selector's `matchLabels`, that are not finished (phase Succeeded or
Failed), and whose container port matches the endpoint's `port` (by name) or `targetPort` (by
name or number); set `namespace`, `pod`, `container`, `endpoint` and `job`; then the endpoint's
own relabelings. docs/metrics.md shows the result for a sample deployment, and
tests/integration/test_pod_monitor_cluster.py runs a real Prometheus on it.

Only what the operator's own PodMonitor uses is supported; anything else (matchExpressions,
metricRelabelings, TLS, authorization, ...) is refused with a clear message rather than
silently dropped.

Pure: standard library only.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from typing import Any

#: Relabeling fields of the Prometheus Operator's RelabelConfig and their names in Prometheus'
#: own configuration file.
RELABEL_FIELDS = {
    "sourceLabels": "source_labels",
    "separator": "separator",
    "targetLabel": "target_label",
    "regex": "regex",
    "modulus": "modulus",
    "replacement": "replacement",
    "action": "action",
}
ENDPOINT_FIELDS = {"port", "targetPort", "path", "interval", "scrapeTimeout", "honorLabels", "relabelings"}


def _sanitize(label: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_]", "_", label)


def _relabel(r: Mapping[str, Any]) -> dict[str, Any]:
    unknown = set(r) - set(RELABEL_FIELDS)
    if unknown:
        raise ValueError(f"relabeling fields not supported: {', '.join(sorted(unknown))}")
    out: dict[str, Any] = {}
    for k, v in r.items():
        out[RELABEL_FIELDS[k]] = v.lower() if k == "action" else copy.deepcopy(v)
    return out


def _keep(source: str, regex: str) -> dict[str, Any]:
    return {"source_labels": [source], "regex": regex, "action": "keep"}


def _set(source: str, target: str) -> dict[str, Any]:
    return {"source_labels": [source], "target_label": target, "action": "replace"}


def scrape_configs(
    pod_monitor: Mapping[str, Any],
    *,
    kubeconfig_file: str | None = None,
    scrape_timeout: str | None = None,
    file_sd_path: str | None = None,
) -> list[dict[str, Any]]:
    """One Prometheus scrape config per endpoint of `pod_monitor` (a monitoring.coreos.com/v1 object).

    `kubeconfig_file` points the service discovery at a cluster from outside it (Prometheus'
    `kubernetes_sd_configs.kubeconfig_file`); in a pod, leave it None (in-cluster account).
    `file_sd_path` replaces the Kubernetes discovery by a file of target groups carrying the same
    meta labels (`pod_targets`), for a Prometheus built without Kubernetes discovery (Debian's
    package is); the relabelling is the same.
    """
    if pod_monitor.get("kind") != "PodMonitor":
        raise ValueError(f"expected a PodMonitor, got {pod_monitor.get('kind')!r}")
    meta, spec = pod_monitor["metadata"], pod_monitor.get("spec") or {}
    ns, name = meta.get("namespace") or "default", meta["name"]
    selector = spec.get("selector") or {}
    if set(selector) - {"matchLabels"}:
        raise ValueError("only selector.matchLabels is supported")
    namespaces = (spec.get("namespaceSelector") or {}).get("matchNames") or [ns]
    sd: dict[str, Any] = {"role": "pod", "namespaces": {"names": list(namespaces)}}
    if kubeconfig_file:
        sd["kubeconfig_file"] = kubeconfig_file
    discovery: dict[str, Any] = (
        {"file_sd_configs": [{"files": [file_sd_path], "refresh_interval": "1s"}]}
        if file_sd_path
        else {"kubernetes_sd_configs": [sd]}
    )

    out = []
    for i, ep in enumerate(spec.get("podMetricsEndpoints") or []):
        unknown = set(ep) - ENDPOINT_FIELDS
        if unknown:
            raise ValueError(f"pod metrics endpoint fields not supported: {', '.join(sorted(unknown))}")
        relabel = [
            _keep(f"__meta_kubernetes_pod_label_{_sanitize(k)}", re.escape(str(v)))
            for k, v in sorted((selector.get("matchLabels") or {}).items())
        ]
        relabel.append(
            {
                "source_labels": ["__meta_kubernetes_pod_phase"],
                "regex": "(Failed|Succeeded)",
                "action": "drop",
            }
        )
        if "port" in ep:
            relabel.append(_keep("__meta_kubernetes_pod_container_port_name", re.escape(str(ep["port"]))))
            endpoint = str(ep["port"])
        elif "targetPort" in ep:
            tp = ep["targetPort"]
            meta_port = "number" if isinstance(tp, int) else "name"
            relabel.append(_keep(f"__meta_kubernetes_pod_container_port_{meta_port}", re.escape(str(tp))))
            endpoint = str(tp)
        else:
            raise ValueError(f"endpoint {i} names no port (port or targetPort)")
        relabel += [
            _set("__meta_kubernetes_namespace", "namespace"),
            _set("__meta_kubernetes_pod_container_name", "container"),
            _set("__meta_kubernetes_pod_name", "pod"),
            {"target_label": "job", "replacement": f"{ns}/{name}", "action": "replace"},
            {"target_label": "endpoint", "replacement": endpoint, "action": "replace"},
        ]
        relabel += [_relabel(r) for r in ep.get("relabelings") or []]
        cfg: dict[str, Any] = {
            "job_name": f"podMonitor/{ns}/{name}/{i}",
            "honor_labels": bool(ep.get("honorLabels", False)),
            "metrics_path": ep.get("path", "/metrics"),
            **copy.deepcopy(discovery),
            "relabel_configs": relabel,
        }
        if ep.get("interval"):
            cfg["scrape_interval"] = ep["interval"]
        timeout = ep.get("scrapeTimeout") or scrape_timeout
        if timeout:
            cfg["scrape_timeout"] = timeout
        out.append(cfg)
    if not out:
        raise ValueError(f"PodMonitor {ns}/{name} has no podMetricsEndpoints")
    return out


def pod_targets(pods: list[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """file_sd target groups for `pods` (Kubernetes Pod objects) with the meta labels Prometheus'
    Kubernetes pod discovery gives them: one target per declared container port, at the pod IP,
    labelled with the namespace, pod name, phase, readiness, pod labels and the port's container,
    name and number. Pods without an IP yet are left out (discovery gives them no address either).
    """
    groups = []
    for pod in pods:
        meta, status = pod["metadata"], pod.get("status") or {}
        ip = status.get("podIP")
        if not ip:
            continue
        ready = next(
            (c["status"] for c in status.get("conditions") or [] if c.get("type") == "Ready"), "False"
        )
        base = {
            "__meta_kubernetes_namespace": meta.get("namespace", "default"),
            "__meta_kubernetes_pod_name": meta["name"],
            "__meta_kubernetes_pod_ip": ip,
            "__meta_kubernetes_pod_phase": status.get("phase", ""),
            "__meta_kubernetes_pod_ready": ready.lower(),
            "__meta_kubernetes_pod_node_name": (pod.get("spec") or {}).get("nodeName", ""),
        }
        for k, v in (meta.get("labels") or {}).items():
            base[f"__meta_kubernetes_pod_label_{_sanitize(k)}"] = v
            base[f"__meta_kubernetes_pod_labelpresent_{_sanitize(k)}"] = "true"
        for c in (pod.get("spec") or {}).get("containers") or []:
            for port in c.get("ports") or []:
                labels = {
                    **base,
                    "__meta_kubernetes_pod_container_name": c["name"],
                    "__meta_kubernetes_pod_container_port_name": port.get("name", ""),
                    "__meta_kubernetes_pod_container_port_number": str(port["containerPort"]),
                    "__meta_kubernetes_pod_container_port_protocol": port.get("protocol", "TCP"),
                }
                groups.append({"targets": [f"{ip}:{port['containerPort']}"], "labels": labels})
    return groups
