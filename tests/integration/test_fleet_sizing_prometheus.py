"""The sizing inputs through real Prometheus: the tick's fleet queries (one per series for every
object, the arrival counts a subquery grouped by pod) split in memory give each object the
readings its own queries give, evaluated at the same instant."""

from __future__ import annotations

import asyncio
import json
import math
import time
import urllib.parse
import urllib.request

import pytest
from textserver import serve_text

from disagg import loop, metrics

NS = "ns"
# pod -> (role, requests per second); the names follow the pods of a pool's Deployment
PODS = {
    "a-prefill-7d9f8c6b5-ab001": ("prefill", 3.0),
    "a-prefill-7d9f8c6b5-ab002": ("prefill", 1.0),
    "a-decode-7d9f8c6b5-ab001": ("decode", 4.0),
    "b-prefill-7d9f8c6b5-ab001": ("prefill", 7.0),  # another object in the same namespace
}
PROMPT_LE = (256.0, 1024.0, 4096.0)
OUTPUT_LE = (64.0, 256.0)
WINDOW_S, STEP_S, SPAN_S = 6, 2, 10
SCRAPE_S = 1  # prometheus_factory's scrape interval
SHED_RPS = {"a": 2.0, "b": 9.0}  # requests each object's front door sheds per second


def exposition(elapsed_s: float) -> str:
    """vLLM's token histograms for every pod: requests arrive at the pod's rate; a quarter of
    the prompts fall in each bucket (the last in +Inf) and outputs alternate two buckets."""
    lines = []
    for pod, (role, rps) in PODS.items():
        n = int(rps * elapsed_s)
        labels = f'namespace="{NS}",pod="{pod}"'
        metric, les = (
            ("vllm:request_prompt_tokens", PROMPT_LE)
            if role == "prefill"
            else ("vllm:request_generation_tokens", OUTPUT_LE)
        )
        share = [n * (i + 1) // (len(les) + 1) for i in range(len(les))]
        for le, c in zip(les, share, strict=True):
            lines.append(f'{metric}_bucket{{{labels},le="{le:g}"}} {c}')
        lines.append(f'{metric}_bucket{{{labels},le="+Inf"}} {n}')
        lines.append(f"{metric}_count{{{labels}}} {n}")
        lines.append(f"{metric}_sum{{{labels}}} {n * (900 if role == 'prefill' else 120)}")
        if role == "decode":  # the back pool's TTFT: half within 0.3 s, three quarters within 1 s
            ttft = "vllm:time_to_first_token_seconds"
            for le, c in (("0.3", n // 2), ("1", 3 * n // 4), ("+Inf", n)):
                lines.append(f'{ttft}_bucket{{{labels},le="{le}"}} {c}')
        else:  # the front pool's queue waits: three quarters within 0.3 s
            queue = "vllm:request_queue_time_seconds"
            for le, c in (("0.3", 3 * n // 4), ("+Inf", n)):
                lines.append(f'{queue}_bucket{{{labels},le="{le}"}} {c}')
            lines.append(f"{queue}_count{{{labels}}} {n}")
            lines.append(f"{queue}_sum{{{labels}}} {n * 0.1:g}")  # a mean wait of 0.1 s
            # the requests it holds: a queue that grows by one a second and empties every 5 s
            lines.append(f"vllm:num_requests_waiting{{{labels}}} {int(elapsed_s) % 5}")
            lines.append(f"vllm:num_requests_running{{{labels}}} {rps:g}")
    for obj, shed_rps in SHED_RPS.items():  # the front doors' counters, one per object
        labels = f'namespace="{NS}",deployment="{obj}"'
        lines.append(
            f"disagg_front_door_rejected_requests_total{{{labels}}} {1000 + int(shed_rps * elapsed_s)}"
        )
    return "\n".join(lines) + "\n"


class AtInstant:
    """A metrics source asking every query at one fixed evaluation time."""

    def __init__(self, url: str, at: float) -> None:
        self.url, self.at = url, at

    def _one(self, promql: str) -> list[dict]:
        qs = urllib.parse.urlencode({"query": promql, "time": f"{self.at:.3f}"})
        with urllib.request.urlopen(f"{self.url}/api/v1/query?{qs}", timeout=5) as r:
            body = json.loads(r.read())
        assert body["status"] == "success", body
        return body["data"]["result"]

    async def run(self, queries: list[metrics.Query]) -> dict:
        return {q.name: self._one(q.promql) for q in queries}


@pytest.mark.prometheus
def test_fleet_split_sizing_readings_equal_the_objects_own_in_real_prometheus(prometheus_factory):
    t0 = time.monotonic()

    server = serve_text(lambda: exposition(time.monotonic() - t0))
    try:
        prom = prometheus_factory({"engines": [f"127.0.0.1:{server.server_port}"]})
        time.sleep(SPAN_S + WINDOW_S + 2)  # a span of counts and a window of rates
        at = time.time() - 1.0
        source = AtInstant(prom.url, at)
        queries = metrics.sizing_queries(
            "vllm", NS, "a", ("prefill", "decode"), WINDOW_S, STEP_S, horizon_s=SPAN_S, scrape_s=SCRAPE_S
        )
        own = asyncio.run(source.run(queries))
        roles = metrics.fleet_roles(queries)
        fleet = asyncio.run(source.run(metrics.fleet_queries("vllm", [NS], WINDOW_S, None, roles)))
        assert not [n for n, r in fleet.items() if not r], fleet  # every fleet series answered
        split = metrics.fleet_split(fleet, queries, NS, "a", 0.9)
        assert set(split) == {q.name for q in queries}
        got, want = loop.sizing_readings(split, STEP_S), loop.sizing_readings(own, STEP_S)
        assert not want.problems and want.sizes is not None and want.arrival_counts, want
        # about 4 arrivals per second into "a"'s prefill pool (not "b"'s 7), counted per 2 s step
        assert 6.0 <= sum(want.arrival_counts) / len(want.arrival_counts) <= 10.0, want
        assert got.sizes == want.sizes
        assert want.ttft_buckets is not None and [le for le, _ in want.ttft_buckets] == [0.3, 1.0, math.inf]
        assert got.ttft_buckets is not None
        assert [le for le, _ in got.ttft_buckets] == [le for le, _ in want.ttft_buckets]
        assert [c for _, c in got.ttft_buckets] == pytest.approx([c for _, c in want.ttft_buckets], rel=1e-12)
        assert want.prefill_wait_buckets is not None
        assert [le for le, _ in want.prefill_wait_buckets] == [0.3, math.inf]
        assert got.prefill_wait_buckets is not None
        assert [le for le, _ in got.prefill_wait_buckets] == [0.3, math.inf]
        assert [c for _, c in got.prefill_wait_buckets] == pytest.approx(
            [c for _, c in want.prefill_wait_buckets], rel=1e-12
        )
        # the prefill queue's mean wait and "a"'s two prefill engines at every scrape of the window
        assert want.prefill_wait_mean_s == pytest.approx(0.1, rel=1e-6)
        assert got.prefill_wait_mean_s == pytest.approx(want.prefill_wait_mean_s, rel=1e-12)
        assert want.prefill_serving_min == got.prefill_serving_min == 2.0
        assert got.arrival_counts == pytest.approx(want.arrival_counts, rel=1e-12)
        assert got.count_interval_s == want.count_interval_s
        # the prefill pool's waiting + running at the counts' steps: each count's growth
        assert want.arrival_counts_growth is not None
        assert len(want.arrival_counts_growth) == len(want.arrival_counts)
        # (the first count's start may precede the first scrape of the gauge: unknown, not zero)
        assert all(g is not None for g in want.arrival_counts_growth[1:]), want.arrival_counts_growth
        assert got.arrival_counts_growth == want.arrival_counts_growth
        # "a"'s front door sheds 2 a second (not "b"'s 9): about 4 per 2 s step
        assert want.arrival_counts_shed is not None and got.arrival_counts_shed == want.arrival_counts_shed
        shed = [x for x in want.arrival_counts_shed if x is not None]
        assert shed and 3.0 <= sum(shed) / len(shed) <= 5.0, shed
        # Asked for "a"'s pods only (the tick's due objects), Prometheus answers those alone, and
        # the split is the same.
        only_a = asyncio.run(source.run(metrics.fleet_queries("vllm", [NS], WINDOW_S, None, roles, ["a"])))
        pods = {s["metric"]["pod"] for answer in only_a.values() for s in answer if "pod" in s["metric"]}
        assert pods and all(p.startswith("a-") for p in pods), pods
        # the front door's counter is selected by the object's name (its series carry no pod)
        objects = {s["metric"].get("deployment") for answer in only_a.values() for s in answer}
        assert objects == {None, "a"}, objects
        split_a = metrics.fleet_split(only_a, queries, NS, "a", 0.9)
        assert loop.sizing_readings(split_a, STEP_S) == got
    finally:
        server.shutdown()


@pytest.mark.prometheus
def test_the_arrival_counts_count_every_arrival_once_in_real_prometheus(prometheus_factory):
    """120 arrivals between two scrapes, then none: the counts over the span add up to 120,
    all in one sub-window. (`increase` over each sub-window alone sees only the scrapes inside
    it: it would count the 120 twice, or not at all when they land between two sub-windows.)"""
    pod = "a-prefill-7d9f8c6b5-ab001"
    scrapes: list[float] = []
    jump_after = 4  # scrapes before the arrivals

    def text() -> str:
        scrapes.append(time.monotonic())
        # a counter far from zero, as a running engine's is (Prometheus extrapolates no
        # increase back past the counter's zero)
        n = 1000 + (120 if len(scrapes) > jump_after else 0)
        return f'vllm:request_prompt_tokens_count{{namespace="{NS}",pod="{pod}"}} {n}\n'

    server = serve_text(text)
    try:
        prom = prometheus_factory({"engines": [f"127.0.0.1:{server.server_port}"]})
        deadline = time.monotonic() + 60
        while len(scrapes) < jump_after + 8 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert len(scrapes) >= jump_after + 8, "Prometheus did not scrape"
        source = AtInstant(prom.url, time.time() - 1.0)
        span = 16
        queries = metrics.sizing_queries(
            "vllm", NS, "a", ("prefill", "decode"), WINDOW_S, STEP_S, horizon_s=span, scrape_s=SCRAPE_S
        )
        own = asyncio.run(source.run(queries))
        counts = loop.sizing_readings(own, STEP_S).arrival_counts
        assert counts, own
        assert sum(counts) == pytest.approx(120, rel=0.03), counts
        assert max(counts) == pytest.approx(120, rel=0.03), counts  # one sub-window holds them all
        roles = metrics.fleet_roles(queries)
        fleet = asyncio.run(source.run(metrics.fleet_queries("vllm", [NS], WINDOW_S, None, roles)))
        split = loop.sizing_readings(metrics.fleet_split(fleet, queries, NS, "a", 0.9), STEP_S)
        assert split.arrival_counts == pytest.approx(counts, rel=1e-12)
    finally:
        server.shutdown()
