"""The EMULATOR against the real API server and a real Prometheus.

The operator creates the pools' pods and sets their routable gate; `disagg emulate`
runs as a subprocess, emulates an engine on each routable pod and is scraped
by Prometheus every second.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from disagg.devtools.prometheus import free_port

pytestmark = [pytest.mark.cluster, pytest.mark.prometheus]

SAMPLES = Path(__file__).resolve().parents[2] / "config" / "samples"


def deployment(prefill: int = 1, decode: int = 2) -> dict:
    """The SGLang sample, disaggregated, autoscaling off, fixed pool sizes."""
    obj = yaml.safe_load((SAMPLES / "sglang-disaggregated.yaml").read_text())
    spec = obj["spec"]
    spec["autoscaling"] = {"enabled": False}
    spec["placement"] = {"mode": "disaggregated"}
    for pool, n in (("prefill", prefill), ("decode", decode)):
        p = spec["pools"][pool]
        p["replicas"] = n
        p["minReplicas"] = min(p.get("minReplicas", 1), n)
        p["maxReplicas"] = max(p.get("maxReplicas", n), n + 2)
    return obj


def routable_pods(cluster, ns: str, name: str) -> list[dict]:
    pods = cluster.get_json("pods", "-n", ns, "-l", f"disagg.dev/deployment={name}")["items"]
    out = []
    for p in pods:
        if p["metadata"].get("deletionTimestamp") or p["status"].get("phase") != "Running":
            continue
        conds = {c["type"]: c["status"] for c in p["status"].get("conditions", [])}
        if conds.get("disagg.dev/routable") == "True":
            out.append(p)
    return out


def start(cluster, ns: str, port: int, summary: Path, *extra: str) -> subprocess.Popen:
    args = [
        sys.executable,
        "-m",
        "disagg.cli",
        "emulate",
        "--kubeconfig",
        cluster.kubeconfig,
        "--namespace",
        ns,
        "--metrics-port",
        str(port),
        "--summary-json",
        str(summary),
        *extra,
    ]
    log = open(summary.with_suffix(".log"), "wb")  # noqa: SIM115 - owned by the child
    proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=cluster.env())
    log.close()
    return proc


def scrape(port: int) -> dict:
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    out: dict = {}
    for fam in text_string_to_metric_families(body):
        for s in fam.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def scalar(result: list[dict]) -> float | None:
    return float(result[0]["value"][1]) if result else None


@pytest.fixture
def pools_up(cluster, namespace, operator_factory):
    obj = deployment(prefill=1, decode=2)
    name = obj["metadata"]["name"]
    operator_factory([namespace])
    cluster.kubectl(
        "apply",
        "--server-side",
        "--field-manager=test-user",
        "-n",
        namespace,
        "-f",
        "-",
        input=json.dumps(obj),
    )
    cluster.wait_for(
        lambda: len(routable_pods(cluster, namespace, name)) == 3, timeout=120, what="3 routable pods"
    )
    return name


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_prometheus_sees_the_arrival_rate_and_prompt_size_on_prefill(
    cluster, namespace, pools_up, prometheus_factory, tmp_path
):
    port = free_port()
    summary = tmp_path / "summary.json"
    prom = prometheus_factory(targets={"emulator": [f"127.0.0.1:{port}"]}, scrape_interval="1s")
    proc = start(
        cluster,
        namespace,
        port,
        summary,
        "--rate",
        "4",
        "--arrivals",
        "uniform",
        "--input-tokens",
        "1000",
        "--output-tokens",
        "100",
        "--duration",
        "40",
    )
    try:
        cluster.wait_for(
            lambda: prom.query('up{job="emulator"} == 1'), timeout=30, what="Prometheus scrapes the emulator"
        )
        time.sleep(30)
        rate = scalar(prom.query('sum(rate(vllm:request_prompt_tokens_count{pool="prefill"}[20s]))'))
        mean = scalar(
            prom.query(
                'sum(rate(vllm:request_prompt_tokens_sum{pool="prefill"}[20s])) / '
                'sum(rate(vllm:request_prompt_tokens_count{pool="prefill"}[20s]))'
            )
        )
        log = summary.with_suffix(".log").read_text(errors="replace")
        assert rate is not None and rate == pytest.approx(4.0, rel=0.05), log
        assert mean == pytest.approx(1000.0, rel=0.05)
        # prompts are counted on the prefill pod at admission and on the decode pod when the KV
        # lands (each request once per pool); TTFT and generated tokens on decode pods
        by_pool = prom.query("sum by (pool) (rate(vllm:request_prompt_tokens_count[20s]))")
        assert {r["metric"]["pool"] for r in by_pool if float(r["value"][1]) > 0} == {"prefill", "decode"}
        ttft = prom.query("sum by (pool) (rate(vllm:time_to_first_token_seconds_count[20s]))")
        assert {r["metric"]["pool"] for r in ttft if float(r["value"][1]) > 0} == {"decode"}
        assert len(prom.query('vllm:num_requests_running{pool="decode"}')) == 2
        labels = prom.query("vllm:num_requests_waiting")[0]["metric"]
        assert labels["namespace"] == namespace and labels["deployment"] == pools_up
        assert {"pod", "pool", "model_name"} <= set(labels)
        proc.wait(30)
    finally:
        stop(proc)
    assert proc.returncode == 0
    s = json.loads(summary.read_text())
    assert s["requests"]["generated"] == 160
    assert s["requests"]["lost"] == 0 and s["requests"]["rejected"] == 0
    assert s["pods_seen"]["prefill"] == 1 and s["pods_seen"]["decode"] == 2
    assert s["ttft_s"]["p50"] is not None


def test_deleting_a_pod_that_holds_requests_counts_them_lost(
    cluster, namespace, pools_up, prometheus_factory, tmp_path
):
    port = free_port()
    summary = tmp_path / "summary.json"
    prom = prometheus_factory(targets={"emulator": [f"127.0.0.1:{port}"]}, scrape_interval="1s")
    proc = start(
        cluster,
        namespace,
        port,
        summary,
        "--rate",
        "4",
        "--arrivals",
        "uniform",
        "--input-tokens",
        "1000",
        "--output-tokens",
        "3000",  # ~2 min of decode each: requests stay in flight
        "--duration",
        "45",
    )
    try:

        def busy_decode_pod():
            try:
                m = scrape(port)
            except OSError:
                return None
            for labels, v in m.get("disagg_emulator_in_flight_requests", []):
                if labels["pool"] == "decode" and v >= 3:
                    return labels["pod"], v
            return None

        victim, held = cluster.wait_for(busy_decode_pod, timeout=40, what="a decode pod holding requests")
        cluster.kubectl("delete", "pod", victim, "-n", namespace, "--wait=false")

        def lost():
            return scalar(prom.query(f'disagg_emulator_lost_requests_total{{pod="{victim}"}} > 0'))

        n = cluster.wait_for(lost, timeout=60, what="lost requests of the deleted pod in Prometheus")
        assert n >= held
        # the deleted pod's engine series are gone from the emulator (only the lost counter stays)
        m = scrape(port)
        left = [name for name, samples in m.items() for labels, _ in samples if labels.get("pod") == victim]
        assert set(left) == {"disagg_emulator_lost_requests_total"}
        proc.wait(60)
    finally:
        stop(proc)
    s = json.loads(summary.read_text())
    assert s["requests"]["lost"] >= held
    assert s["lost_by_pod"][f"{namespace}/{victim}"] >= held
