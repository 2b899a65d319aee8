"""The deployment's PodMonitor: what it selects and labels, its plain-Prometheus translation, and
when the reconciler creates or deletes it."""

from __future__ import annotations

import asyncio
import copy
import re

import pytest
from fakes import FakeKube, disagg_deployment

from disagg import api, builders, metrics, reconcile, scrapeconfig

TEMPLATE = {
    "spec": {
        "containers": [{"name": "vllm", "image": "x", "ports": [{"name": "http", "containerPort": 8000}]}]
    }
}


def spec_dict(**over) -> dict:
    spec = {
        "engine": "vllm",
        "model": "m",
        "pools": {
            "prefill": {"minReplicas": 1, "maxReplicas": 2, "template": copy.deepcopy(TEMPLATE)},
            "decode": {"minReplicas": 1, "maxReplicas": 4, "template": copy.deepcopy(TEMPLATE)},
        },
        "autoscaling": {"enabled": False, "scrapeIntervalSeconds": 5, "metricWindowSeconds": 60},
    }
    spec.update(over)
    return spec


OWNER = builders.Owner(name="llama", namespace="team-a", uid="u1")


def pm(**over) -> dict:
    return builders.pod_monitor(OWNER, api.parse_spec(spec_dict(**over)))


# --------------------------------------------------------------------------- relabelling, as Prometheus does it
def apply_relabel(rules: list[dict], labels: dict[str, str]) -> dict[str, str] | None:
    """Prometheus' keep/drop/replace on a target's labels (the subset the configs use)."""
    labels = dict(labels)
    for r in rules:
        value = r.get("separator", ";").join(labels.get(s, "") for s in r.get("source_labels", []))
        m = re.fullmatch(r.get("regex", "(.*)"), value)
        action = r.get("action", "replace")
        if action == "keep" and not m:
            return None
        if action == "drop" and m:
            return None
        if action == "replace" and m:
            labels[r["target_label"]] = m.expand(r.get("replacement", "$1").replace("$1", r"\1"))
    return {k: v for k, v in labels.items() if not k.startswith("__")}


def discovered(pod: str, labels: dict[str, str], port_name: str, port: int, phase: str = "Running") -> dict:
    """The meta labels Kubernetes pod discovery gives one container port of a pod."""
    out = {
        "__meta_kubernetes_namespace": "team-a",
        "__meta_kubernetes_pod_name": pod,
        "__meta_kubernetes_pod_phase": phase,
        "__meta_kubernetes_pod_container_name": "c",
        "__meta_kubernetes_pod_container_port_name": port_name,
        "__meta_kubernetes_pod_container_port_number": str(port),
    }
    out.update({builders.meta_label(k): v for k, v in labels.items()})
    return out


ENGINE_LABELS = builders.labels("llama", "prefill", "vllm")
ROUTER_LABELS = builders.router_labels("llama", "vllm")


def test_pod_monitor_selects_every_pod_of_the_deployment_and_is_owned_by_it():
    obj = pm()
    assert obj["apiVersion"] == "monitoring.coreos.com/v1" and obj["kind"] == "PodMonitor"
    assert obj["metadata"]["name"] == "llama" and obj["metadata"]["namespace"] == "team-a"
    assert obj["metadata"]["ownerReferences"][0]["uid"] == "u1"
    sel = obj["spec"]["selector"]["matchLabels"]
    for pod_labels in (ENGINE_LABELS, ROUTER_LABELS, builders.labels("llama", "decode", "vllm")):
        assert all(pod_labels.get(k) == v for k, v in sel.items())
    assert not all(builders.labels("other", "decode", "vllm").get(k) == v for k, v in sel.items())
    engine, router = obj["spec"]["podMetricsEndpoints"]
    assert engine["port"] == "http" and router["port"] == "metrics"
    assert engine["interval"] == router["interval"] == "5s"  # the autoscaler's scrape interval


def test_pod_monitor_ports_follow_the_engine_container():
    named = copy.deepcopy(TEMPLATE)
    named["spec"]["containers"][0]["ports"].append({"name": "metrics", "containerPort": 9100})
    unnamed = {"spec": {"containers": [{"name": "vllm", "image": "x", "ports": [{"containerPort": 30000}]}]}}
    pools = spec_dict()["pools"]
    for p in pools.values():
        p["template"] = named
    assert pm(pools=pools)["spec"]["podMetricsEndpoints"][0]["port"] == "metrics"
    for p in pools.values():
        p["template"] = unnamed
    assert pm(pools=pools)["spec"]["podMetricsEndpoints"][0]["targetPort"] == 30000
    pools["decode"]["template"] = named
    with pytest.raises(ValueError, match="different ports"):
        pm(pools=pools)


def test_without_a_router_only_the_engines_are_scraped():
    assert len(pm(router={"enabled": False})["spec"]["podMetricsEndpoints"]) == 1


def test_translated_config_gives_the_labels_the_autoscaler_selects_on():
    cfgs = scrapeconfig.scrape_configs(pm(), kubeconfig_file="/k")
    engine_cfg, router_cfg = cfgs
    assert engine_cfg["kubernetes_sd_configs"] == [
        {"role": "pod", "namespaces": {"names": ["team-a"]}, "kubeconfig_file": "/k"}
    ]
    assert engine_cfg["scrape_interval"] == "5s" and engine_cfg["metrics_path"] == "/metrics"
    pod = "llama-prefill-7d9c8b6f5-abcde"
    got = apply_relabel(engine_cfg["relabel_configs"], discovered(pod, ENGINE_LABELS, "http", 8000))
    assert got is not None
    assert got["namespace"] == "team-a" and got["pod"] == pod and got["pool"] == "prefill"
    assert got["deployment"] == "llama" and got["job"] == "team-a/llama"
    # The autoscaler's own selector matches the series of this target.
    sel = metrics.pool_selector("team-a", "llama", "prefill")
    ns_re, pod_re = re.fullmatch(r'namespace="(.*)",pod=~"(.*)"', sel).groups()
    assert got["namespace"] == ns_re and re.fullmatch(pod_re.replace("\\\\", "\\"), got["pod"])

    # Not scraped by the engine job: the router pod, a finished pod, another port, another deployment.
    router_pod = discovered("llama-router-5f-xyz12", ROUTER_LABELS, "http", 8000)
    assert apply_relabel(engine_cfg["relabel_configs"], router_pod) is None
    assert (
        apply_relabel(
            engine_cfg["relabel_configs"], discovered(pod, ENGINE_LABELS, "http", 8000, "Succeeded")
        )
        is None
    )
    assert apply_relabel(engine_cfg["relabel_configs"], discovered(pod, ENGINE_LABELS, "grpc", 9000)) is None
    other = builders.labels("llama2", "prefill", "vllm")
    assert apply_relabel(engine_cfg["relabel_configs"], discovered(pod, other, "http", 8000)) is None
    # A drained pod (not Ready) is still scraped: its in-flight work decides the drain.
    assert apply_relabel(
        engine_cfg["relabel_configs"], discovered(pod, ENGINE_LABELS, "http", 8000, "Running")
    )

    got = apply_relabel(
        router_cfg["relabel_configs"], discovered("llama-router-5f-xyz12", ROUTER_LABELS, "metrics", 29000)
    )
    assert got is not None and got["pool"] == "router" and got["pod"] == "llama-router-5f-xyz12"
    assert (
        apply_relabel(router_cfg["relabel_configs"], discovered(pod, ENGINE_LABELS, "metrics", 29000)) is None
    )


def test_translation_refuses_what_it_cannot_express():
    obj = pm()
    obj["spec"]["selector"] = {"matchExpressions": [{"key": "a", "operator": "Exists"}]}
    with pytest.raises(ValueError, match=r"only selector\.matchLabels"):
        scrapeconfig.scrape_configs(obj)
    obj = pm()
    obj["spec"]["podMetricsEndpoints"][0]["tlsConfig"] = {}
    with pytest.raises(ValueError, match="tlsConfig"):
        scrapeconfig.scrape_configs(obj)
    with pytest.raises(ValueError, match="expected a PodMonitor"):
        scrapeconfig.scrape_configs({"kind": "ServiceMonitor", "metadata": {"name": "x"}})


def test_monitoring_mode_is_validated():
    with pytest.raises(ValueError, match="podMonitor"):
        api.parse_spec(spec_dict(monitoring={"podMonitor": "yes"}))
    assert api.parse_spec(spec_dict()).monitoring.pod_monitor == "auto"


# --------------------------------------------------------------------------- the reconciler
@pytest.fixture(autouse=True)
def fresh_served_cache(monkeypatch):
    monkeypatch.setattr(reconcile, "_served_cache", {})
    monkeypatch.setattr(reconcile, "_warned_unserved", set())


def reconcile_once(kube: FakeKube, name: str = "llama") -> None:
    asyncio.run(reconcile.reconcile(kube, kube.obj(api.KIND, "ns", name)))


def make_kube(served: bool, **spec_over) -> FakeKube:
    kube = FakeKube()
    kube.served_kinds = {"PodMonitor"} if served else set()
    kube.put(disagg_deployment("llama", spec_dict(**spec_over)))
    return kube


def pod_monitors(kube: FakeKube) -> list[dict]:
    return [o for (k, _, _), o in kube.objects.items() if k == "PodMonitor"]


def test_auto_creates_the_pod_monitor_only_where_the_crd_is_served():
    kube = make_kube(served=True)
    reconcile_once(kube)
    (obj,) = pod_monitors(kube)
    assert obj["metadata"]["name"] == "llama" and "PodMonitorCreated" in kube.reasons()
    writes = kube.writes
    reconcile_once(kube)  # unchanged: no write
    assert kube.writes - writes <= 1  # at most the status
    assert kube.reasons().count("PodMonitorCreated") == 1

    reconcile._served_cache.clear()  # another cluster, without the CRD
    kube = make_kube(served=False)
    reconcile_once(kube)
    assert not pod_monitors(kube) and "PodMonitorUnavailable" not in kube.reasons()


def test_enabled_without_the_crd_warns_once():
    kube = make_kube(served=False, monitoring={"podMonitor": "enabled"})
    reconcile_once(kube)
    reconcile_once(kube)
    assert kube.reasons().count("PodMonitorUnavailable") == 1


def test_disabled_deletes_an_existing_pod_monitor():
    kube = make_kube(served=True)
    reconcile_once(kube)
    assert pod_monitors(kube)
    obj = kube.obj(api.KIND, "ns", "llama")
    obj["spec"]["monitoring"] = {"podMonitor": "disabled"}
    obj["metadata"]["generation"] += 1
    reconcile_once(kube)
    assert not pod_monitors(kube) and "PodMonitorDeleted" in kube.reasons()


def test_operator_switch_leaves_pod_monitors_alone(monkeypatch):
    monkeypatch.setattr(reconcile, "POD_MONITORS_ALLOWED", False)
    kube = make_kube(served=True, monitoring={"podMonitor": "enabled"})
    reconcile_once(kube)
    assert not pod_monitors(kube)


def test_served_answer_is_reused_for_a_while():
    calls = []

    class Kube:
        async def served(self, kind):
            calls.append(kind)
            return True

    k = Kube()
    assert asyncio.run(reconcile.kind_served(k, "PodMonitor", now=0.0))
    assert asyncio.run(reconcile.kind_served(k, "PodMonitor", now=reconcile.SERVED_TTL_S - 1))
    assert len(calls) == 1
    asyncio.run(reconcile.kind_served(k, "PodMonitor", now=reconcile.SERVED_TTL_S + 1))
    assert len(calls) == 2
