"""The PodMonitor, for real: with the PodMonitor kind served (a schema-less stand-in for the
Prometheus Operator's CRD), the operator creates one per DisaggDeployment; its selector and
relabelings, translated into a plain scrape configuration (disagg.scrapeconfig), make a real
Prometheus discover the pods through the Kubernetes API and scrape the HTTP emulated fleet on the
pods' loopback IPs, and the autoscaler's own queries (disagg.metrics) then find one series per pod.

Needs the local cluster with its pod CIDR inside 127.0.0.0/8 and the `prometheus` binary.
"""

from __future__ import annotations

import ipaddress
import json
import sys
from pathlib import Path

import pytest
import samples
from router_util import Proc, http_json, wait_until

from disagg import metrics, scrapeconfig
from disagg.devtools.prometheus import PrometheusServer
from prereqs import missing_prerequisite

pytestmark = [pytest.mark.cluster, pytest.mark.prometheus, pytest.mark.timeout(600)]

CRD = Path(__file__).resolve().parent / "manifests" / "podmonitor-crd.yaml"
SCRAPE_S = 2


def routable(cluster, ns: str, name: str) -> list[dict]:
    pods = cluster.get_json("pods", "-n", ns, "-l", f"disagg.dev/deployment={name}")["items"]
    return [
        p
        for p in pods
        if p["status"].get("phase") == "Running"
        and any(
            c["type"] == "disagg.dev/routable" and c["status"] == "True"
            for c in p["status"].get("conditions", [])
        )
    ]


@pytest.fixture
def pod_monitor_crd(cluster):
    cluster.kubectl("apply", "--server-side", "-f", str(CRD))
    cluster.wait_established("podmonitors.monitoring.coreos.com")
    return "podmonitors.monitoring.coreos.com"


SAMPLE = {"vllm": "vllm-disaggregated-70b.yaml", "sglang": "sglang-disaggregated.yaml"}
ENGINE_PORT = {"vllm": 8000, "sglang": 30000}  # the samples' engine container ports
RUNNING = {"vllm": "vllm:num_requests_running", "sglang": "sglang:num_running_reqs"}


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_operator_creates_a_pod_monitor_that_prometheus_scrapes_with_the_autoscalers_labels(
    engine, cluster, namespace, pod_monitor_crd, operator_factory, tmp_path
):
    obj = samples.fixed(SAMPLE[engine], prefill=1, decode=2)
    obj["spec"]["autoscaling"]["scrapeIntervalSeconds"] = SCRAPE_S
    name = obj["metadata"]["name"]
    operator_factory([namespace])
    cluster.kubectl("apply", "--server-side", "-n", namespace, "-f", "-", input=json.dumps(obj))

    def pod_monitor():
        r = cluster.kubectl("get", "podmonitor", name, "-n", namespace, "-o", "json", check=False)
        return json.loads(r.stdout) if r.returncode == 0 else None

    pm = cluster.wait_for(pod_monitor, timeout=90, what=f"PodMonitor {namespace}/{name}")
    dd = cluster.get_json("disaggdeployment", name, "-n", namespace)
    (ref,) = pm["metadata"]["ownerReferences"]
    assert ref["kind"] == "DisaggDeployment" and ref["uid"] == dd["metadata"]["uid"] and ref["controller"]
    assert pm["spec"]["selector"] == {
        "matchLabels": {"app.kubernetes.io/instance": name, "app.kubernetes.io/part-of": "disagg"}
    }
    engine_ep, router_ep = pm["spec"]["podMetricsEndpoints"]
    assert engine_ep["port"] == "http" and router_ep["port"] == "metrics"
    assert engine_ep["interval"] == f"{SCRAPE_S}s"

    # The selector selects exactly the deployment's pods: the pools' and the router's.
    sel = ",".join(f"{k}={v}" for k, v in pm["spec"]["selector"]["matchLabels"].items())
    cluster.wait_for(
        lambda: len(routable(cluster, namespace, name)) == 3, timeout=180, what="3 routable pods"
    )
    selected = {p["metadata"]["name"] for p in cluster.get_json("pods", "-n", namespace, "-l", sel)["items"]}
    engine_pods = {p["metadata"]["name"] for p in routable(cluster, namespace, name)}
    router_pods = {
        p["metadata"]["name"]
        for p in cluster.get_json("pods", "-n", namespace, "-l", f"disagg.dev/router={name}")["items"]
    }
    assert router_pods and selected == engine_pods | router_pods
    ips = [p["status"]["podIP"] for p in routable(cluster, namespace, name)]
    if not all(ipaddress.ip_address(ip) in ipaddress.ip_network("127.0.0.0/8") for ip in ips):
        missing_prerequisite(f"a local cluster with loopback pod IPs, not {ips} (hack/cluster.sh down && up)")

    # The emulated engines serve /metrics on their pod IPs; Prometheus finds them by itself.
    emu = Proc(
        [
            sys.executable, "-m", "disagg.cli", "emulate", "--kubeconfig", cluster.kubeconfig,
            "--namespace", namespace, "--serve", "--rate", "0", "--duration", "400", "--engine", "auto",
            "--metrics-port", "0",
        ],
        tmp_path / "emulator.log",
        env=cluster.env(),
    )  # fmt: skip
    # Debian's Prometheus is built without Kubernetes discovery: the pods' discovery labels come
    # from a file (scrapeconfig.pod_targets, refreshed below from the API server); the selection
    # and relabelling are Prometheus' own, on the translated PodMonitor.
    sd_file = tmp_path / "pods.json"

    def discover() -> None:
        pods = cluster.get_json("pods", "-n", namespace)["items"]
        tmp = sd_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(scrapeconfig.pod_targets(pods)))
        tmp.replace(sd_file)

    discover()
    prom = PrometheusServer(
        scrape_interval=f"{SCRAPE_S}s",
        scrape_configs=scrapeconfig.scrape_configs(pm, file_sd_path=str(sd_file)),
        workdir=tmp_path / "prometheus",
    )
    try:
        for p in routable(cluster, namespace, name):
            url = f"http://{p['status']['podIP']}:{ENGINE_PORT[engine]}/health"
            wait_until(lambda u=url: http_json(u, timeout=2)[0] == 200, 60, f"emulated engine {url}")
        prom.start()
        queries = {
            q.name: q.promql
            for q in metrics.build_queries(engine, namespace, name, ["prefill", "decode"], 60, 0.9)
        }
        by_pool = {
            pool: {
                p["metadata"]["name"]
                for p in routable(cluster, namespace, name)
                if p["metadata"]["labels"]["disagg.dev/pool"] == pool
            }
            for pool in ("prefill", "decode")
        }

        def every_pod_reports():
            for pool, pods in by_pool.items():
                got = {s["metric"].get("pod") for s in prom.query(queries[f"sample_time_by_pod.{pool}"])}
                if got != pods:
                    return False
            return True

        discover()  # the router pod may have started after the first listing
        wait_until(every_pod_reports, 60, "the autoscaler's queries to see every pod")
        # The target labels the PodMonitor's relabelings set, seen on `up` (which has no label of
        # the scraped engine's own: the emulator also exports namespace, pod and pool, a real
        # engine does not).
        for pool, pods in by_pool.items():
            up = prom.query(f'up{{job="{namespace}/{name}",pool="{pool}"}}')
            assert {s["metric"]["pod"] for s in up} == pods
            for s in up:
                assert s["value"][1] == "1" and s["metric"]["namespace"] == namespace
                assert s["metric"]["deployment"] == name and s["metric"]["endpoint"] == "http"
        # One series per pod of what the autoscaler reads.
        for pool, pods in by_pool.items():
            series = prom.query(f"{RUNNING[engine]}{{{metrics.pool_selector(namespace, name, pool)}}}")
            assert {s["metric"]["pod"] for s in series} == pods
            for s in series:
                m = s["metric"]
                assert m["namespace"] == namespace and m["pool"] == pool and m["deployment"] == name
                assert m["job"] == f"{namespace}/{name}"
        # The preset's pending-KV queries (docs/metrics.md "Drain signals") answer for every pod.
        for pool, pods in by_pool.items():
            if f"pending_kv_by_pod.{pool}" in queries:
                pending = {s["metric"]["pod"] for s in prom.query(queries[f"pending_kv_by_pod.{pool}"])}
                assert pending == pods, pool
        # The router pods are discovered on their metrics port with pool="router" (KWOK runs no
        # router here, so the scrape itself fails: up == 0).
        # (A router pod found by the last discovery waits for Prometheus' next scrape.)
        wait_until(
            lambda: (
                {s["metric"]["pod"] for s in prom.query(f'up{{namespace="{namespace}",pool="router"}}')}
                == router_pods
            ),
            60,
            "the router pods among Prometheus' targets",
        )
        router_up = prom.query(f'up{{namespace="{namespace}",pool="router"}}')
        assert all(s["metric"]["endpoint"] == "metrics" for s in router_up)
        # No other target: nothing outside the deployment was selected.
        every = {s["metric"]["pod"] for s in prom.query(f'up{{job="{namespace}/{name}"}}')}
        assert every == engine_pods | router_pods
    finally:
        prom.close()
        emu.stop()

    # Turned off in the spec: the operator deletes it.
    cluster.kubectl(
        "patch", "disaggdeployment", name, "-n", namespace, "--type=merge",
        "-p", json.dumps({"spec": {"monitoring": {"podMonitor": "disabled"}}}),
    )  # fmt: skip
    cluster.wait_for(lambda: pod_monitor() is None, timeout=60, what="the PodMonitor deleted")
