"""The drain's in-flight count takes the router's per-worker count beside the engine's own.

The router's count (summed over its replicas, per `worker` URL) can only lengthen a drain:
the result is max(engine, router). A restarted router counts from 0 while the engines still
finish their streams, so the engine's count stays primary; a router series that is missing or
a router query that failed adds nothing, and an unknown engine count stays unknown
(disagg.metrics.pod_in_flight_fresh, docs/metrics.md "The routers' per-worker counts").
"""

from __future__ import annotations

import re

import pytest
from test_loop_executor import NS, T0, World, _draining

from disagg import drain, metrics, names, routerclient
from disagg.metrics import QueryFailed

NOW = 1_000_000.0
SCRAPE = 1.0
POD, OTHER = "d-decode-5f7c9-00001", "d-decode-5f7c9-00002"
WORKER, OTHER_WORKER = "http://10.1.0.5:8000", "http://10.1.0.6:8000"
ROUTER_QUERY = "router_in_flight_by_worker.decode"


def sample(value, **labels):
    return {"metric": labels, "value": [NOW, str(value)]}


def snapshot(
    engine: dict[str, float], router: list | Exception | None, *, fresh: bool = True
) -> metrics.Snapshot:
    """A vLLM prefill/decode snapshot: `engine` is each decode pod's running count (nothing
    waiting); `router` the router query's answer (None: the query was not asked)."""
    qs = metrics.build_queries(
        "vllm",
        "n",
        "d",
        ["prefill", "decode"],
        60,
        0.9,
        router_deployment=None if router is None else "d-router",
    )
    results: dict = {q.name: [] for q in qs}
    results["arrival_rps"] = [sample(1.0)]
    results["running_by_pod.decode"] = [sample(v, pod=p) for p, v in engine.items()]
    results["waiting_by_pod.decode"] = [sample(0, pod=p) for p in engine]
    stamp = NOW if fresh else NOW - 10 * SCRAPE
    results["sample_time_by_pod.decode"] = [sample(stamp, pod=p) for p in engine]
    if router is not None:
        assert ROUTER_QUERY in results
        results[ROUTER_QUERY] = router
    return metrics.build_snapshot(qs, results, NOW, SCRAPE, {"decode": list(engine)})


def test_an_engine_at_zero_waits_while_the_router_counts_requests_on_its_worker():
    snap = snapshot({POD: 0, OTHER: 0}, [sample(3, worker=WORKER), sample(0, worker=OTHER_WORKER)])
    assert metrics.pod_in_flight_fresh(snap, "decode", POD, SCRAPE, worker=WORKER) == 3.0
    assert metrics.pod_in_flight_fresh(snap, "decode", OTHER, SCRAPE, worker=OTHER_WORKER) == 0.0


def test_a_restarted_router_at_zero_does_not_shorten_the_engines_count():
    snap = snapshot({POD: 2}, [sample(0, worker=WORKER)])
    assert metrics.pod_in_flight_fresh(snap, "decode", POD, SCRAPE, worker=WORKER) == 2.0


@pytest.mark.parametrize(
    "router",
    [
        None,  # not asked (no router)
        ConnectionError("prometheus refused the router query"),  # asked, failed
        [],  # asked, no series (router not scraped yet)
        [sample(5, worker=OTHER_WORKER)],  # asked, but nothing for this pod's worker
    ],
    ids=["not-asked", "failed", "empty", "other-worker"],
)
def test_a_missing_or_failed_router_count_leaves_the_engines_count_unchanged(router):
    snap = snapshot({POD: 2}, router)
    assert snap.ok, snap.reason()  # the router query is optional: it never blocks a decision
    assert metrics.pod_in_flight_fresh(snap, "decode", POD, SCRAPE, worker=WORKER) == 2.0
    zero = snapshot({POD: 0}, router)
    assert metrics.pod_in_flight_fresh(zero, "decode", POD, SCRAPE, worker=WORKER) == 0.0


def test_without_a_worker_url_the_router_count_is_not_read():
    snap = snapshot({POD: 0}, [sample(3, worker=WORKER)])
    assert metrics.pod_in_flight_fresh(snap, "decode", POD, SCRAPE) == 0.0  # a pod without an IP


def test_an_unknown_engine_count_stays_unknown_whatever_the_router_says():
    stale = snapshot({POD: 0}, [sample(3, worker=WORKER)], fresh=False)
    assert metrics.pod_in_flight_fresh(stale, "decode", POD, SCRAPE, worker=WORKER) is None
    absent = snapshot({OTHER: 0}, [sample(3, worker=WORKER)])  # POD reports no engine series
    assert metrics.pod_in_flight_fresh(absent, "decode", POD, SCRAPE, worker=WORKER) is None
    # A fresh sample, but the pod is missing from the running series.
    partial = snapshot({POD: 0}, [sample(3, worker=WORKER)])
    del partial.by_pod["running_by_pod.decode"][POD]
    assert metrics.pod_in_flight_fresh(partial, "decode", POD, SCRAPE, worker=WORKER) is None


def test_a_router_series_without_a_worker_label_is_refused_and_adds_nothing():
    snap = snapshot({POD: 1}, [sample(3)])
    assert ROUTER_QUERY in snap.failed
    assert metrics.pod_in_flight_fresh(snap, "decode", POD, SCRAPE, worker=WORKER) == 1.0


@pytest.mark.parametrize(
    ("engine", "expected"),
    [
        # vLLM decode: streams open plus requests bound for the worker still in their prefill
        # stage; prefill: no per-request count
        (
            "vllm",
            {
                "decode": '{__name__=~"vllm_router_pd_active_decode_requests'
                '|vllm_router_pd_pending_decode_requests",'
            },
        ),
        ("sglang", {"prefill": "smg_worker_requests_active{", "decode": "smg_worker_requests_active{"}),
    ],
)
def test_the_router_query_per_engine_and_pool(engine, expected):
    pools = ["prefill", "decode"]
    qs = {
        q.name: q
        for q in metrics.build_queries(engine, "ns1", "llm", pools, 60, 0.9, router_deployment="llm-router")
    }
    got = {
        name.partition(".")[2]: q for name, q in qs.items() if name.startswith("router_in_flight_by_worker.")
    }
    assert set(got) == set(expected)
    for pool, series in expected.items():
        q = got[pool]
        assert q.kind == "by_worker" and not q.required and q.pool == pool
        assert q.promql.startswith(f"sum by (worker) ({series}")  # summed over the router replicas
        assert 'namespace="ns1"' in q.promql
        pattern = re.search(r'pod=~"([^"]+)"', q.promql).group(1).replace("\\\\", "\\")
        assert re.fullmatch(pattern, "llm-router-7d9f8c6b5-abcde")  # a router pod
        assert not re.fullmatch(pattern, f"llm-{pool}-7d9f8c6b5-abcde")  # an engine pod
    # Without a router (spec.router.enabled false), no router query.
    plain = metrics.build_queries(engine, "ns1", "llm", pools, 60, 0.9)
    assert not any(q.name.startswith("router_in_flight_by_worker") for q in plain)


def test_the_drain_decision_keeps_a_pod_the_router_still_counts():
    rec = drain.DrainRecord(0.0, 100.0, "readmit")
    pod = {"metadata": {"name": POD, "annotations": {}}, "status": {"phase": "Running"}}
    busy = snapshot({POD: 0}, [sample(1, worker=WORKER)])
    work = metrics.pod_in_flight_fresh(busy, "decode", POD, SCRAPE, worker=WORKER)
    assert drain.next_action(pod, rec, work, now=10, sampled_at=10).action == "wait"
    done = snapshot({POD: 0}, [sample(0, worker=WORKER)])
    work = metrics.pod_in_flight_fresh(done, "decode", POD, SCRAPE, worker=WORKER)
    assert drain.next_action(pod, rec, work, now=10, sampled_at=10).action == "remove"


@pytest.mark.usefixtures("fresh_loop_memory")
def test_the_loop_does_not_remove_a_drained_pod_whose_router_still_counts_a_request():
    w = World(prefill=1, decode=4)
    name = _draining(w, "decode", 3, deadline=T0 + 600, on_timeout="readmit")
    obj = w.kube.obj("Pod", NS, name)
    obj["status"]["podIP"] = "10.1.0.9"
    worker = routerclient.worker_url(obj)
    assert worker is not None
    w.load(2.0, **{name: 0.0})  # the engine reports nothing in flight
    w.prom.router_in_flight = {"decode": {worker: 1.0}}  # the router still streams one request
    w.step(1.0)
    assert names.EVENT_DRAIN_COMPLETED not in w.kube.reasons()
    assert w.replicas("decode") == 4
    assert names.ANNOTATION_DRAIN in w.kube.obj("Pod", NS, name)["metadata"]["annotations"]
    w.prom.router_in_flight = {"decode": {worker: 0.0}}  # the stream ended
    w.step(1.0)
    assert names.EVENT_DRAIN_COMPLETED in w.kube.reasons()
    assert w.replicas("decode") == 3
    assert ROUTER_QUERY in w.prom.asked  # the loop asked the router's count (spec.router.enabled)


def test_one_fleet_query_per_router_series_split_by_object_and_summed_over_its_replicas():
    qs = metrics.build_queries(
        "sglang", "ns", "a", ["prefill", "decode"], 60, 0.9, router_deployment="a-router"
    )
    roles = metrics.fleet_roles(qs)
    fleet = {q.name: q.promql for q in metrics.fleet_queries("sglang", ["ns"], 60, 30, roles)}
    assert fleet["fleet.router_in_flight.decode"] == (
        'sum by (namespace, pod, worker) (smg_worker_requests_active{namespace=~"ns"})'
    )

    def series(ns: str, pod: str, worker: str, v: float) -> dict:
        return {"metric": {"namespace": ns, "pod": pod, "worker": worker}, "value": [NOW, str(v)]}

    answer = [
        series("ns", "a-router-7d9f8c6b5-abc12", WORKER, 2),  # two replicas of a's router
        series("ns", "a-router-7d9f8c6b5-xyz34", WORKER, 1),
        series("ns", "a-router-7d9f8c6b5-xyz34", OTHER_WORKER, 0),
        series("ns", "b-router-7d9f8c6b5-abc12", WORKER, 5),  # another object's router
        series("other", "a-router-7d9f8c6b5-abc12", WORKER, 7),  # another namespace
        series("ns", "a-decode-7d9f8c6b5-abc12", WORKER, 9),  # not a router pod
    ]
    results = {name: [] for name in fleet} | {
        "fleet.router_in_flight.decode": answer,
        "fleet.router_in_flight.prefill": QueryFailed("Prometheus did not answer within 5 s"),
    }
    split = metrics.fleet_split(results, qs, "ns", "a", 0.9, router_deployment="a-router")
    got = {s["metric"]["worker"]: float(s["value"][1]) for s in split[ROUTER_QUERY]}
    assert got == {WORKER: 3.0, OTHER_WORKER: 0.0}
    assert isinstance(split["router_in_flight_by_worker.prefill"], QueryFailed)
    # Without the router's Deployment the split leaves the router queries to the object.
    assert ROUTER_QUERY not in metrics.fleet_split(results, qs, "ns", "a", 0.9)
