"""The drain's router query through real Prometheus: per decode worker, vllm-router's open
streams plus the requests bound for it that are still in their prefill stage, summed over the
router's replicas and over nothing else (disagg.metrics.VLLM.router_in_flight)."""

from __future__ import annotations

import json
import time
import urllib.parse
import urllib.request

import pytest
from textserver import serve_text

from disagg import metrics

NS = "ns"
ROUTER_PODS = ("a-router-7d9f8c6b5-ab001", "a-router-7d9f8c6b5-ab002")  # two replicas of a's router
OTHER_ROUTER = "b-router-7d9f8c6b5-ab001"  # another object's router in the namespace
W1, W2 = "http://10.1.0.5:8000", "http://10.1.0.6:8000"


def exposition() -> str:
    """vllm-router's decode gauges as a PodMonitor labels them: (active, pending) per worker."""
    gauges = {
        ROUTER_PODS[0]: {W1: (2, 3), W2: (0, 0)},
        ROUTER_PODS[1]: {W1: (1, 0), W2: (0, 4)},
        OTHER_ROUTER: {W1: (9, 9), W2: (9, 9)},
    }
    lines = []
    for pod, by_worker in gauges.items():
        for worker, (active, pending) in by_worker.items():
            labels = f'namespace="{NS}",pod="{pod}",worker="{worker}",rank="aggregate"'
            lines.append(f"vllm_router_pd_active_decode_requests{{{labels}}} {active}")
            lines.append(f"vllm_router_pd_pending_decode_requests{{{labels}}} {pending}")
    # a series of another kind on the router pods, which the query must not add
    lines.append(f'vllm_router_worker_load{{namespace="{NS}",pod="{ROUTER_PODS[0]}",worker="{W1}"}} 50')
    return "\n".join(lines) + "\n"


def query(url: str, promql: str) -> list[dict]:
    qs = urllib.parse.urlencode({"query": promql})
    with urllib.request.urlopen(f"{url}/api/v1/query?{qs}", timeout=5) as r:
        body = json.loads(r.read())
    assert body["status"] == "success", body
    return body["data"]["result"]


@pytest.mark.prometheus
def test_the_decode_router_count_adds_requests_still_in_prefill_in_real_prometheus(prometheus_factory):
    server = serve_text(exposition)
    try:
        prom = prometheus_factory({"routers": [f"127.0.0.1:{server.server_port}"]})
        qs = {
            q.name: q
            for q in metrics.build_queries(
                "vllm", NS, "a", ["prefill", "decode"], 60, 0.9, router_deployment="a-router"
            )
        }
        own = qs["router_in_flight_by_worker.decode"]
        assert "router_in_flight_by_worker.prefill" not in qs  # vllm-router counts no prefill requests
        deadline = time.monotonic() + 30
        answer: list[dict] = []
        while time.monotonic() < deadline:
            answer = query(prom.url, own.promql)
            if answer:
                break
            time.sleep(0.5)
        got = {s["metric"]["worker"]: float(s["value"][1]) for s in answer}
        # W1: 2 + 3 on one replica, 1 + 0 on the other; W2: 0 + 4 (b's router not counted)
        assert got == {W1: 6.0, W2: 4.0}
        # The fleet query (one for every object, split per object in memory) gives the same.
        roles = metrics.fleet_roles(list(qs.values()))
        fleet = {
            q.name: query(prom.url, q.promql)
            for q in metrics.fleet_queries("vllm", [NS], 60, 30, roles)
            if q.name == "fleet.router_in_flight.decode"
        }
        assert fleet, "no fleet query for the router's decode count"
        split = metrics.fleet_split(fleet, list(qs.values()), NS, "a", 0.9, router_deployment="a-router")
        assert {s["metric"]["worker"]: float(s["value"][1]) for s in split[own.name]} == got
    finally:
        server.shutdown()
