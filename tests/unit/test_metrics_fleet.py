"""One query per metric for many DisaggDeployments (disagg.metrics.fleet_queries/fleet_split):
each object's answers rebuilt in memory are the ones its own queries would have had."""

from __future__ import annotations

import itertools
import math

import pytest

from disagg import loop, metrics
from disagg.metrics import MetricError, QueryFailed

NS = "ns"
T = 1_800_000_000.0
POOLS = ("prefill", "decode")


def sample(pod: str, v: float, ns: str = NS, **labels: str) -> dict:
    return {"metric": {"namespace": ns, "pod": pod, **labels}, "value": [T, metrics._fmt(v)]}


def pods(obj: str, pool: str, n: int) -> list[str]:
    return [f"{obj}-{pool}-7d9f8c6b5-{i:05d}"[:-5] + f"ab{i:03d}" for i in range(n)]


def queries(obj: str) -> list[metrics.Query]:
    return metrics.build_queries("vllm", NS, obj, POOLS, 60, 0.9, short_window_s=30)


def fleet(per_pod: dict[str, float], extra: dict[str, list[dict]] | None = None) -> dict:
    """Fleet answers where each pod's series value is `per_pod[pod]` (the same for every role)."""
    roles = metrics.fleet_roles(queries("a"))
    out: dict = {}
    for q in metrics.fleet_queries("vllm", [NS], 60, 30, roles):
        role = q.name.removeprefix(metrics.FLEET_PREFIX)
        if role.endswith("_bucket"):
            out[q.name] = [
                s
                for pod, v in per_pod.items()
                for s in (sample(pod, v / 2, le="0.5"), sample(pod, v, le="+Inf"))
            ]
        elif role == "sample_time":
            out[q.name] = [sample(pod, T - 5) for pod in per_pod]
        elif role.startswith("front_door_shed"):
            out[q.name] = []  # no front door sheds
        else:
            out[q.name] = [sample(pod, v) for pod, v in per_pod.items()]
    out.update(extra or {})
    return out


def test_one_query_per_series_whatever_the_number_of_objects():
    roles = metrics.fleet_roles(queries("a"))
    qs = metrics.fleet_queries("vllm", ["b", "a", "a"], 60, 30, roles)
    assert len(qs) == len(roles) and len({q.promql for q in qs}) == len(qs)
    assert all('namespace=~"a|b"' in q.promql for q in qs)
    per_object = {q.name for q in qs if "by (namespace, deployment)" in q.promql}
    assert per_object == {"fleet.front_door_shed", "fleet.front_door_shed_short"}  # the front door's counter
    assert all("by (namespace, pod" in q.promql for q in qs if q.name not in per_object)
    with pytest.raises(ValueError, match="namespace"):
        metrics.fleet_queries("vllm", [], 60, 30, roles)


def test_answers_are_split_by_object_pool_and_pod():
    a_pre, a_dec = pods("a", "prefill", 2), pods("a", "decode", 3)
    b_pre = pods("b", "prefill", 1)
    values = {a_pre[0]: 1.0, a_pre[1]: 2.0, a_dec[0]: 10.0, a_dec[1]: 20.0, a_dec[2]: 30.0, b_pre[0]: 100.0}
    res = fleet(values, extra={})
    res["fleet.running"].append(sample(a_pre[0], 7.0, ns="other"))  # same name, other namespace
    got = metrics.fleet_split(res, queries("a"), NS, "a", 0.9)
    assert got["arrival_rps"][0]["value"][1] == "3.0"  # the prefill pool of "a" only
    assert got["prompt_tokens_mean"][0]["value"][1] == "1.0"  # a ratio of sums
    assert {s["metric"]["pod"]: float(s["value"][1]) for s in got["running_by_pod.decode"]} == {
        a_dec[0]: 10.0,
        a_dec[1]: 20.0,
        a_dec[2]: 30.0,
    }
    assert {s["metric"]["le"]: float(s["value"][1]) for s in got["output_tokens_buckets"]} == {
        "0.5": 30.0,
        "+Inf": 60.0,
    }
    assert float(got["kv_usage_max"][0]["value"][1]) == 30.0
    assert float(got["running_by_pod.prefill"][1]["value"][1]) == 2.0


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_pending_work_is_each_pools_own_series(engine: str):
    """Each pool's pending-KV series is its preset's (vLLM: prefill KV held; SGLang: a queue
    per end of the transfer), asked once for the fleet, by namespace and pod."""
    qs = metrics.build_queries(engine, NS, "a", POOLS, 60, 0.9, short_window_s=30)
    roles = metrics.fleet_roles(qs)
    fleet_q = {q.name: q.promql for q in metrics.fleet_queries(engine, [NS], 60, 30, roles)}
    for work in metrics.preset(engine).pending_kv:
        promql = fleet_q[f"{metrics.FLEET_PREFIX}pending_kv.{work.pool}"]
        assert promql == work.promql(f'namespace=~"{NS}"', by="namespace, pod")
        assert "(" not in work.series and work.series in promql


def test_nothing_matched_is_missing_and_zero_over_zero_is_nan_never_zero():
    res = fleet({pods("a", "decode", 1)[0]: 0.0})
    got = metrics.fleet_split(res, queries("a"), NS, "a", 0.9)
    assert got["arrival_rps"] == []  # no prefill pod reports: empty, as sum() over nothing
    with pytest.raises(MetricError) as err:
        metrics.parse_scalar(got["itl_mean"], "itl_mean")
    assert err.value.kind == "nan"


def test_a_failed_fleet_query_fails_the_answers_made_of_it_only():
    res = fleet({p: 1.0 for p in pods("a", "prefill", 1) + pods("a", "decode", 1)})
    res["fleet.itl_count"] = QueryFailed("Prometheus did not answer within 5 s")
    got = metrics.fleet_split(res, queries("a"), NS, "a", 0.9)
    assert isinstance(got["itl_mean"], QueryFailed)
    assert not isinstance(got["arrival_rps"], Exception)


def test_the_objects_own_queries_are_left_to_it():
    res = fleet({pods("a", "prefill", 1)[0]: 1.0})
    got = metrics.fleet_split(res, queries("a"), NS, "a", 0.9, own=["arrival_rps"])
    assert "arrival_rps" not in got and "prompt_tokens_mean" in got
    assert "prompt_count" in metrics.fleet_roles(queries("a"), own=["arrival_rps"])  # the mean needs it


def test_snapshot_from_the_split_equals_the_per_object_one():
    a_pre, a_dec = pods("a", "prefill", 1), pods("a", "decode", 2)
    values = {a_pre[0]: 0.4, a_dec[0]: 0.1, a_dec[1]: 0.3}
    split = metrics.fleet_split(fleet(values), queries("a"), NS, "a", 0.5)

    def own(pool_pods: list[str], v: float) -> list[dict]:
        return [{"metric": {}, "value": [T, metrics._fmt(v)]}]

    direct = {
        "arrival_rps": own(a_pre, 0.4),
        "arrival_rps_short": own(a_pre, 0.4),
        "prompt_tokens_mean": own(a_pre, 1.0),
        "output_tokens_mean": own(a_dec, 1.0),
        "itl_mean": own(a_dec, 1.0),
        "prefill_time_mean": own(a_pre, 1.0),
        "kv_usage_max": own(a_dec, 0.3),
        "kv_usage_sum": own(a_dec, 0.4),
        "kv_running_avg": own(a_dec, 0.4),  # the fake fleet's window averages are its values
        # histogram_quantile(0.5) of le 0.5 -> 2, +Inf -> 4: rank 2 is the 0.5 bucket's top
        "ttft_p": own(a_dec, 0.5),
    }
    for pool, pp in (("prefill", a_pre), ("decode", a_dec)):
        for series in ("running", "waiting", "pending_kv"):
            direct[f"{series}_by_pod.{pool}"] = [
                {"metric": {"pod": p}, "value": [T, metrics._fmt(values[p])]} for p in pp
            ]
        direct[f"sample_time_by_pod.{pool}"] = [
            {"metric": {"pod": p}, "value": [T, metrics._fmt(T - 5)]} for p in pp
        ]
    for name, pp in (("prompt_tokens_buckets", a_pre), ("output_tokens_buckets", a_dec)):
        direct[name] = [
            {"metric": {"le": "0.5"}, "value": [T, metrics._fmt(sum(values[p] for p in pp) / 2)]},
            {"metric": {"le": "+Inf"}, "value": [T, metrics._fmt(sum(values[p] for p in pp))]},
        ]
    qs = queries("a")
    routable = {"prefill": a_pre, "decode": a_dec}
    one = metrics.build_snapshot(qs, split, T, 15.0, routable)
    other = metrics.build_snapshot(qs, direct, T, 15.0, routable)
    assert one.ok and one.to_dict() == other.to_dict() and one.by_pod == other.by_pod


@pytest.mark.parametrize(
    ("q", "want"),
    [(0.5, 0.1), (0.75, 0.15), (1.0, 0.2), (0.0, 0.0), (-1, -math.inf), (2, math.inf)],
)
def test_histogram_quantile_interpolates_like_prometheus(q: float, want: float):
    buckets = [(0.1, 10.0), (0.2, 20.0), (math.inf, 20.0)]
    assert metrics.histogram_quantile(q, buckets) == pytest.approx(want)


def test_histogram_quantile_without_observations_or_inf_bucket_is_nan():
    assert math.isnan(metrics.histogram_quantile(0.5, [(0.1, 0.0), (math.inf, 0.0)]))
    assert math.isnan(metrics.histogram_quantile(0.5, [(0.1, 1.0), (0.2, 2.0)]))
    assert metrics.histogram_quantile(0.99, [(0.1, 5.0), (math.inf, 10.0)]) == 0.1  # in +Inf: last bound


def sizing(obj: str) -> list[metrics.Query]:
    return metrics.sizing_queries("vllm", NS, obj, POOLS, 60, 30, horizon_s=3600, scrape_s=15)


def counts(pod: str, points: dict[float, float]) -> dict:
    return {
        "metric": {"namespace": NS, "pod": pod},
        "values": [[t, metrics._fmt(v)] for t, v in sorted(points.items())],
    }


def test_the_sizing_inputs_are_fleet_series_split_like_the_objects_own():
    """The request-size histograms and the arrival counts (a subquery) come from the tick's
    fleet queries: one series per pod, summed per `le` and per step over the object's pool."""
    qs = sizing("a")
    roles = metrics.fleet_roles(qs)
    fleet_q = {q.name: q.promql for q in metrics.fleet_queries("vllm", [NS], 60, 30, roles)}
    # One counts series per (span, step, scrape), each pod's own arrivals per step.
    assert fleet_q["fleet.arrival_counts.3600.30.15"] == (
        "(sum_over_time((sum by (namespace, pod) "
        '(increase(vllm:request_prompt_tokens_count{namespace=~"ns"}[30s])))[22500ms:15s]) / 2)'
        "[3600s:30s]"
    )
    assert "fleet.arrival_counts.60.30.15" in fleet_q  # the window's counts, a series of its own
    # each pod's waiting + running at the same steps, one step further back (each count's growth)
    assert fleet_q["fleet.in_system.3630.30"] == (
        '(sum by (namespace, pod) (vllm:num_requests_waiting{namespace=~"ns"}) + '
        'sum by (namespace, pod) (vllm:num_requests_running{namespace=~"ns"}))[3630s:30s]'
    )
    # the front door's shed requests per sub-window, one series per object (its counter has no pod)
    assert fleet_q["fleet.shed_counts.3600.30.15"] == (
        "(sum_over_time((sum by (namespace, deployment) "
        '(increase(disagg_front_door_rejected_requests_total{namespace=~"ns"}[30s])))[22500ms:15s]) / 2)'
        "[3600s:30s]"
    )
    a_pre, a_dec, b_pre = pods("a", "prefill", 2), pods("a", "decode", 1), pods("b", "prefill", 1)
    values = {a_pre[0]: 1.0, a_pre[1]: 3.0, a_dec[0]: 5.0, b_pre[0]: 100.0}
    res = fleet(values)
    # the queue-time histogram is read for the sizing inputs alone
    res["fleet.queue_bucket"] = [
        s for pod, v in values.items() for s in (sample(pod, v / 2, le="0.5"), sample(pod, v, le="+Inf"))
    ]
    res["fleet.arrival_counts.3600.30.15"] = [
        counts(a_pre[0], {T - 60: 2.0, T - 30: 4.0, T: 1.0}),
        counts(a_pre[1], {T - 30: 6.0, T: 0.0}),  # started later: no point at T - 60
        counts(a_dec[0], {T - 30: 50.0, T: 50.0}),  # decode pods are not the arrival pool
        counts(b_pre[0], {T - 30: 70.0, T: 70.0}),  # another object
    ]
    res["fleet.in_system.3630.30"] = [
        counts(a_pre[0], {T - 90: 1.0, T - 60: 5.0, T - 30: 2.0, T: 0.0}),
        counts(a_pre[1], {T - 30: 4.0, T: 1.0}),
        counts(a_dec[0], {T - 30: 9.0, T: 9.0}),
        counts(b_pre[0], {T - 30: 70.0, T: 70.0}),
    ]
    res["fleet.shed_counts.3600.30.15"] = [
        {"metric": {"namespace": NS, "deployment": "a"}, "values": [[T - 30, "3"], [T, "0"]]},
        {"metric": {"namespace": NS, "deployment": "b"}, "values": [[T, "50"]]},
    ]
    got = metrics.fleet_split(res, qs, NS, "a", 0.9)
    assert got["arrival_shed_horizon"] == [{"metric": {}, "values": [[T - 30, "3.0"], [T, "0.0"]]}]
    assert metrics.fleet_split(res, qs, NS, "c", 0.9)["arrival_shed_horizon"] == []  # none shed: no series
    assert got["arrival_counts_horizon"] == [
        {"metric": {}, "values": [[T - 60, "2.0"], [T - 30, "10.0"], [T, "1.0"]]}
    ]
    assert got["arrival_in_system_horizon"] == [
        {"metric": {}, "values": [[T - 90, "1.0"], [T - 60, "5.0"], [T - 30, "6.0"], [T, "1.0"]]}
    ]
    assert got["arrival_counts"] == []  # its series was not answered: missing, never zero
    assert {s["metric"]["le"]: float(s["value"][1]) for s in got["prompt_tokens_histogram"]} == {
        "0.5": 2.0,
        "+Inf": 4.0,
    }
    assert float(got["prompt_tokens_sum_rate"][0]["value"][1]) == 4.0
    assert float(got["output_tokens_sum_rate"][0]["value"][1]) == 5.0
    # Parsed by the loop exactly as its own answers would be.
    own = {
        "prompt_tokens_histogram": [
            {"metric": {"le": "0.5"}, "value": [T, "2.0"]},
            {"metric": {"le": "+Inf"}, "value": [T, "4.0"]},
        ],
        "prompt_tokens_sum_rate": [{"metric": {}, "value": [T, "4.0"]}],
        "output_tokens_histogram": [
            {"metric": {"le": "0.5"}, "value": [T, "2.5"]},
            {"metric": {"le": "+Inf"}, "value": [T, "5.0"]},
        ],
        "output_tokens_sum_rate": [{"metric": {}, "value": [T, "5.0"]}],
        "ttft_histogram": [
            {"metric": {"le": "0.5"}, "value": [T, "2.5"]},
            {"metric": {"le": "+Inf"}, "value": [T, "5.0"]},
        ],
        "prefill_queue_histogram": [
            {"metric": {"le": "0.5"}, "value": [T, "2.0"]},
            {"metric": {"le": "+Inf"}, "value": [T, "4.0"]},
        ],
        "arrival_counts_horizon": [{"metric": {}, "values": [[T - 60, "2"], [T - 30, "10"], [T, "1"]]}],
        "arrival_in_system_horizon": [
            {"metric": {}, "values": [[T - 90, "1"], [T - 60, "5"], [T - 30, "6"], [T, "1"]]}
        ],
        "arrival_shed_horizon": [{"metric": {}, "values": [[T - 30, "3"], [T, "0"]]}],
    }
    assert loop.sizing_readings(got, 30.0) == loop.sizing_readings(own, 30.0)
    assert loop.sizing_readings(got, 30.0).arrival_counts == (2.0, 10.0, 1.0)
    assert loop.sizing_readings(got, 30.0).arrival_counts_growth == (4.0, 1.0, -5.0)
    assert loop.sizing_readings(got, 30.0).arrival_counts_shed == (None, 3.0, 0.0)
    assert loop.sizing_readings(got, 30.0).ttft_buckets == ((0.5, 2.5), (math.inf, 5.0))  # the decode pod's
    assert loop.sizing_readings(got, 30.0).prefill_wait_buckets == ((0.5, 2.0), (math.inf, 4.0))  # prefill's


def test_the_prefill_queues_mean_wait_and_serving_count_are_split_like_the_objects_own():
    """The queue-time histogram's sum over its count, over the object's prefill pods; the prefill
    engines reporting at every scrape of the window (one series per pod, 1 where it reports),
    summed per step; the loop takes the fewest."""
    qs = sizing("a")
    fleet_q = {q.name: q.promql for q in metrics.fleet_queries("vllm", [NS], 60, 30, metrics.fleet_roles(qs))}
    assert fleet_q["fleet.serving.60.15"] == (
        '(count by (namespace, pod) (vllm:num_requests_running{namespace=~"ns"}))[60s:15s]'
    )
    assert fleet_q["fleet.queue_sum"].startswith(
        "sum by (namespace, pod) (rate(vllm:request_queue_time_seconds_sum{"
    )
    a_pre, a_dec, b_pre = pods("a", "prefill", 2), pods("a", "decode", 1), pods("b", "prefill", 1)
    res = {
        "fleet.queue_sum": [
            sample(a_pre[0], 0.3),
            sample(a_pre[1], 0.1),
            sample(a_dec[0], 9.0),
            sample(b_pre[0], 9.0),
        ],
        "fleet.queue_count": [
            sample(a_pre[0], 2.0),
            sample(a_pre[1], 2.0),
            sample(a_dec[0], 1.0),
            sample(b_pre[0], 1.0),
        ],
        "fleet.serving.60.15": [
            counts(a_pre[0], {T - 45: 1.0, T - 30: 1.0, T - 15: 1.0, T: 1.0}),
            counts(a_pre[1], {T - 15: 1.0, T: 1.0}),  # ready since the last two scrapes
            counts(a_dec[0], {T - 45: 1.0, T - 30: 1.0, T - 15: 1.0, T: 1.0}),  # not the prefill pool
            counts(b_pre[0], {T - 45: 1.0, T: 1.0}),  # another object
        ],
    }
    got = metrics.fleet_split(res, qs, NS, "a", 0.9)
    assert float(got["prefill_queue_mean"][0]["value"][1]) == pytest.approx(0.1)  # (0.3 + 0.1) / 4
    own = {
        "prefill_queue_mean": [{"metric": {}, "value": [T, "0.1"]}],
        metrics.SERVING_SERIES: [
            {"metric": {}, "values": [[T - 45, "1"], [T - 30, "1"], [T - 15, "2"], [T, "2"]]}
        ],
    }
    read, mine = loop.sizing_readings(got, 30.0), loop.sizing_readings(own, 30.0)
    assert (read.prefill_wait_mean_s, read.prefill_serving_min) == (
        mine.prefill_wait_mean_s,
        mine.prefill_serving_min,
    )
    assert (read.prefill_wait_mean_s, read.prefill_serving_min) == (pytest.approx(0.1), 1.0)
    # no request in the window: 0 / 0 is no reading, and no problem either
    quiet = loop.sizing_readings({"prefill_queue_mean": [{"metric": {}, "value": [T, "NaN"]}]}, 30.0)
    assert quiet.prefill_wait_mean_s is None and quiet.problems == ()


def generated_pod(deployment: str, template_hash: str = "7d9f8c6b5", random: str = "x7k2q") -> str:
    """A pod name as Kubernetes generates it: <deployment>-<hash>- cut to 58 characters, then 5."""
    return f"{deployment}-{template_hash}-"[: metrics.GENERATE_NAME_BASE_MAX] + random


def test_the_pod_filter_holds_every_pod_of_the_objects_asked_for_and_no_other():
    asked = ["a", "web.v2", "x" * 60]  # short, dotted, and long enough to be cut in pod names
    pattern = metrics.promql_pattern(metrics.owners_pod_regex(asked))
    for name in asked:
        for child in (f"{name}-prefill", f"{name}-decode", f"{name}-encoder", f"{name}-router"):
            assert pattern.fullmatch(generated_pod(child)), (name, child)
    for other in ("b", "webxv2", "aa", "x" * 59):  # "." is literal; "x"*59 is cut like "x"*60
        hit = pattern.fullmatch(generated_pod(f"{other}-prefill"))
        assert bool(hit) == (other == "x" * 59), other
    q = metrics.fleet_queries("vllm", [NS], 60, 30, {"running"}, ["a"])[0]
    assert 'namespace=~"ns",pod=~"(?:a-).*"' in q.promql


def test_a_long_named_objects_cut_pod_names_are_still_its_own():
    """Kubernetes cuts a long Deployment's pod names (generateName at 58 characters): the split
    still finds them, and only them."""
    long = "l" * 56  # "<long>-prefill-" is cut inside "prefill"
    mine = [generated_pod(f"{long}-prefill", random=f"p{i}abc") for i in range(2)]
    other = generated_pod(f"{long}x-prefill")  # another object whose cut names begin alike
    assert all(len(p) == metrics.GENERATE_NAME_BASE_MAX + metrics.GENERATE_NAME_RANDOM for p in mine)
    res = fleet({mine[0]: 1.0, mine[1]: 2.0, other: 100.0})
    got = metrics.fleet_split(res, queries(long), NS, long, 0.9)
    assert got["arrival_rps"][0]["value"][1] == "3.0"  # its two prefill pods, not the other's


def test_the_index_finds_exactly_what_a_scan_of_every_series_finds():
    """FleetAnswers indexes each series once by namespace and owning Deployment; what it hands
    an object, narrowed by the pod pattern, is what a scan of the whole answer finds, in the
    answer's order, for short, dotted, prefix-colliding and cut names, in two namespaces."""
    owners = ["a", "a-b", "web.v2", "llm-0000", "llm-0000-b", "l" * 40, "l" * 56, "l" * 56 + "x", "m" * 70]
    series = []
    for i, (ns, owner) in enumerate(itertools.product((NS, "other"), owners)):
        for pool in ("prefill", "decode", "router"):
            for j in range(2):
                pod = generated_pod(f"{owner}-{pool}", template_hash=f"h{i}{j}", random=f"r{j}{i:03d}"[:5])
                series.append(sample(pod, 1.0, ns))
    series.append(sample("not-a-generated-name", 1.0))
    series.append({"metric": {"namespace": NS}, "value": [0, "1"]})  # no pod label
    answers = metrics.FleetAnswers({metrics.FLEET_PREFIX + "running": series})
    for ns, owner, pool in itertools.product((NS, "other"), owners, ("prefill", "decode", "router")):
        deployment = f"{owner}-{pool}"
        pattern = metrics.promql_pattern(metrics.pod_name_regex(deployment))
        scanned = [
            s
            for s in series
            if s["metric"].get("namespace") == ns and pattern.fullmatch(s["metric"].get("pod") or "")
        ]
        got = [
            s
            for s in answers.candidates("running", ns, deployment)
            if pattern.fullmatch(s["metric"].get("pod") or "")
        ]
        assert got == scanned and len(scanned) >= 2, (ns, deployment)


def test_the_front_doors_counter_is_split_by_object() -> None:
    """Its series carry the DisaggDeployment's name, not a pod's: each object sums its own, and
    an object its front door has not counted for reads nothing (no shed rate, never zero)."""
    qs = metrics.fleet_queries("vllm", [NS], 60, 30, {"front_door_shed"}, deployments=["a", "b"])
    assert qs[0].promql == (
        f"sum by (namespace, deployment) (rate({metrics.METRIC_FRONT_DOOR_REJECTED}"
        '{namespace=~"ns",deployment=~"a|b"}[60s]))'
    )

    def counter(dep: str, v: float, ns: str = NS) -> dict:
        return {"metric": {"namespace": ns, "deployment": dep}, "value": [T, metrics._fmt(v)]}

    res = fleet(
        {},
        extra={"fleet.front_door_shed": [counter("a", 1.5), counter("b", 4.0), counter("a", 9.0, "other")]},
    )
    assert metrics.fleet_split(res, queries("a"), NS, "a", 0.9)["shed_rps"][0]["value"][1] == "1.5"
    assert metrics.fleet_split(res, queries("b"), NS, "b", 0.9)["shed_rps"][0]["value"][1] == "4.0"
    assert metrics.fleet_split(res, queries("c"), NS, "c", 0.9)["shed_rps"] == []
    failed = metrics.fleet_split(
        {**res, "fleet.front_door_shed": QueryFailed("x")}, queries("a"), NS, "a", 0.9
    )
    assert isinstance(failed["shed_rps"], QueryFailed)
