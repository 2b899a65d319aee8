"""Metric parsing: missing, NaN, Inf, negative, duplicate or stale values are never read as zero."""

from __future__ import annotations

import math
import re

import pytest

from disagg import metrics as m

NOW = 1_000_000.0


def sample(value, **labels):
    return {"metric": labels, "value": [NOW, str(value)]}


def test_presets_name_the_engine_metrics_from_the_field_notes():
    assert m.preset("vllm").running == "vllm:num_requests_running"
    assert m.preset("sglang").waiting == "sglang:num_queue_reqs"
    with pytest.raises(ValueError, match="unknown engine 'tgi'"):
        m.preset("tgi")


def test_queries_select_pools_by_pod_name_and_use_the_window():
    qs = {q.name: q for q in m.build_queries("vllm", "ns1", "llama", ["prefill", "decode"], 60, 0.9)}
    arrival = qs["arrival_rps"].promql
    assert 'namespace="ns1"' in arrival and 'pod=~"llama-prefill-' in arrival and "[60s]" in arrival
    assert "histogram_quantile(0.9" in qs["ttft_p"].promql and "llama-decode-" in qs["ttft_p"].promql
    assert "running_by_pod.decode" in qs and "pending_kv_by_pod.prefill" in qs


@pytest.mark.parametrize(
    ("engine", "usage", "running"),
    [
        ("vllm", "vllm:kv_cache_usage_perc", "vllm:num_requests_running"),
        ("sglang", "sglang:token_usage", "sglang:num_running_reqs"),
    ],
)
def test_kv_footprint_gauges_are_averaged_over_the_window(engine, usage, running):
    """The observed footprint is the back pool's window-averaged KV over its window-averaged
    running sequences (autoscaler.observed_kv_footprint), on one object and on the fleet."""
    qs = {q.name: q for q in m.build_queries(engine, "n", "d", ["prefill", "decode"], 300, 0.9)}
    for name, metric in (("kv_usage_sum", usage), ("kv_running_avg", running)):
        q = qs[name]
        assert q.promql.startswith(f"sum(avg_over_time({metric}{{") and q.promql.endswith("[300s]))")
        assert 'pod=~"d-decode-' in q.promql and q.pool == "decode" and not q.required
    roles = m.fleet_roles(list(qs.values()))
    assert {"kv_usage_avg", "running_avg"} <= roles
    fleet = {q.name: q.promql for q in m.fleet_queries(engine, ["n"], 300, None, roles)}
    assert (
        fleet[m.FLEET_PREFIX + "kv_usage_avg"]
        == f'max by (namespace, pod) (avg_over_time({usage}{{namespace=~"n"}}[300s]))'
    )
    assert (
        fleet[m.FLEET_PREFIX + "running_avg"]
        == f'sum by (namespace, pod) (avg_over_time({running}{{namespace=~"n"}}[300s]))'
    )


def test_pending_kv_reads_real_engine_series():
    vllm = {q.name: q.promql for q in m.build_queries("vllm", "n", "d", ["prefill", "decode"], 60, 0.9)}
    # vLLM exports no count of pending NIXL sends: a prefill pod holds KV blocks until its sends
    # are done, so its KV usage, rounded up to 1 while any is held, is the signal.
    assert vllm["pending_kv_by_pod.prefill"].startswith("sum by (pod) (ceil(vllm:kv_cache_usage_perc{")
    assert 'pod=~"d-prefill-' in vllm["pending_kv_by_pod.prefill"]
    assert "pending_kv_by_pod.decode" not in vllm  # a vLLM decode request whose KV lands is waiting
    assert not any("disagg_emulator" in q for q in vllm.values())
    sgl = {q.name: q.promql for q in m.build_queries("sglang", "n", "d", ["prefill", "decode"], 60, 0.9)}
    assert sgl["pending_kv_by_pod.prefill"].startswith(
        "sum by (pod) (sglang:num_prefill_inflight_queue_reqs{"
    )
    assert sgl["pending_kv_by_pod.decode"].startswith("sum by (pod) (sglang:num_decode_transfer_queue_reqs{")
    colocated = {q.name for q in m.build_queries("vllm", "n", "d", ["colocated"], 60, 0.9)}
    assert not any(n.startswith("pending_kv_by_pod") for n in colocated)


def test_held_kv_reads_as_one_per_pod_while_any_is_held():
    qs = m.build_queries("vllm", "n", "d", ["prefill", "decode"], 60, 0.9)
    results = {q.name: [] for q in qs}
    results["arrival_rps"] = [sample(1.0)]
    for series in ("running_by_pod", "waiting_by_pod"):
        results[f"{series}.prefill"] = [sample(0, pod="p1"), sample(0, pod="p2")]
    results["sample_time_by_pod.prefill"] = [sample(NOW, pod="p1"), sample(NOW, pod="p2")]
    # What Prometheus answers to sum by (pod) (ceil(usage)): p1 holds KV (usage 0.02), p2 none.
    results["pending_kv_by_pod.prefill"] = [sample(1, pod="p1"), sample(0, pod="p2")]
    snap = m.build_snapshot(qs, results, NOW, 1.0, {"prefill": ["p1", "p2"]})
    assert m.pod_in_flight_fresh(snap, "prefill", "p1", 1.0) == 1.0  # the drain waits
    assert m.pod_in_flight_fresh(snap, "prefill", "p2", 1.0) == 0.0  # the drain may remove it


def test_unknown_pending_work_reading_is_refused():
    with pytest.raises(ValueError, match="unknown pending-work reading 'ratio'"):
        m.PendingWork("prefill", "x", "ratio").promql('pod="a"')


def test_custom_queries_override_presets():
    qs = {
        q.name: q
        for q in m.build_queries(
            "vllm", "n", "d", ["prefill", "decode"], 60, 0.9, {"arrival_rps": "sum(my_rate)"}
        )
    }
    assert qs["arrival_rps"].promql == "sum(my_rate)"
    assert qs["arrival_rps"].required


@pytest.mark.parametrize(
    ("result", "kind"),
    [
        ([], "missing"),
        (None, "missing"),
        ([sample("NaN")], "nan"),
        ([sample("+Inf")], "inf"),
        ([sample(-1)], "negative"),
        ([sample(1, pod="a"), sample(2, pod="b")], "multiple"),
    ],
)
def test_bad_scalars_are_missing_not_zero(result, kind):
    with pytest.raises(m.MetricError) as err:
        m.parse_scalar(result, "arrival_rps")
    assert err.value.kind == kind


def test_zero_is_a_valid_value_when_reported():
    assert m.parse_scalar([sample(0)], "x") == 0.0


def test_bucket_mean_and_spread():
    # 100 observations uniform in (0, 1000]: buckets every 100.
    result = [sample(10 * i, le=str(100 * i)) for i in range(1, 11)] + [sample(100, le="+Inf")]
    mean, std, rate = m.parse_buckets(result, "prompt")
    assert mean == pytest.approx(500, rel=0.01)
    assert std == pytest.approx(1000 / math.sqrt(12), rel=0.02)
    assert rate == 100  # the +Inf bucket: how many observations the shape is read from


def routable_snapshot(pods_running, sample_times, required_pods):
    qs = m.build_queries("vllm", "n", "d", ["prefill", "decode"], 60, 0.9)
    results = {q.name: [] for q in qs}
    results["arrival_rps"] = [sample(4.0)]
    results["running_by_pod.prefill"] = [sample(v, pod=p) for p, v in pods_running.items()]
    results["waiting_by_pod.prefill"] = [sample(0, pod=p) for p in pods_running]
    results["sample_time_by_pod.prefill"] = [sample(t, pod=p) for p, t in sample_times.items()]
    results["pending_kv_by_pod.prefill"] = [sample(0, pod=p) for p in pods_running]
    return m.build_snapshot(qs, results, NOW, 1.0, {"prefill": required_pods})


def test_fresh_complete_snapshot_is_ok():
    snap = routable_snapshot({"p1": 2}, {"p1": NOW - 1}, ["p1"])
    assert snap.ok, snap.reason()
    assert snap.values["arrival_rps"] == 4.0
    assert snap.in_flight("prefill") == {"p1": 2.0}
    assert m.pod_in_flight_fresh(snap, "prefill", "p1", 1.0) == 2.0


def test_a_pod_missing_from_a_work_series_has_unknown_work():
    def snap_with(waiting=None, pending=None):
        qs = m.build_queries("vllm", "n", "d", ["prefill", "decode"], 60, 0.9)
        results = {q.name: [] for q in qs}
        results["arrival_rps"] = [sample(4.0)]
        results["running_by_pod.prefill"] = [sample(0, pod="p1"), sample(0, pod="p2")]
        results["waiting_by_pod.prefill"] = waiting if waiting is not None else [sample(0, pod="p1")]
        results["sample_time_by_pod.prefill"] = [sample(NOW, pod="p1"), sample(NOW, pod="p2")]
        if pending is not None:
            results["pending_kv_by_pod.prefill"] = pending
        return m.build_snapshot(qs, results, NOW, 1.0, {"prefill": ["p1", "p2"]})

    s = snap_with(pending=[sample(0, pod="p1"), sample(0, pod="p2")])
    assert m.pod_in_flight_fresh(s, "prefill", "p1", 1.0) == 0.0  # every series reports it
    assert m.pod_in_flight_fresh(s, "prefill", "p2", 1.0) is None  # no waiting figure: unknown
    s = snap_with(waiting=[sample(0, pod="p1"), sample(0, pod="p2")], pending=[])
    # The preset's pending-KV series (vLLM: the prefill's KV usage) answers for no pod: the KV
    # still to send is unknown, never zero.
    assert m.pod_in_flight_fresh(s, "prefill", "p1", 1.0) is None
    s = snap_with(
        waiting=[sample(0, pod="p1"), sample(0, pod="p2")], pending=[sample(2, pod="p1")]
    )  # the pending-KV series reports p1 but not p2
    assert m.pod_in_flight_fresh(s, "prefill", "p1", 1.0) == 2.0
    assert m.pod_in_flight_fresh(s, "prefill", "p2", 1.0) is None
    s = snap_with(waiting=[sample(0, pod="p1"), sample(0, pod="p2")], pending=RuntimeError("query failed"))
    assert m.pod_in_flight_fresh(s, "prefill", "p1", 1.0) is None  # failed, not empty: unknown


def test_stale_pod_makes_the_snapshot_not_ok_and_its_in_flight_unknown():
    snap = routable_snapshot({"p1": 0}, {"p1": NOW - 30}, ["p1"])
    assert not snap.ok
    assert any(p.kind == "stale" for p in snap.problems)
    assert m.pod_in_flight_fresh(snap, "prefill", "p1", 1.0) is None


@pytest.mark.parametrize(
    ("decided_at", "age", "fresh"),
    [
        (NOW + 5, 1.8, True),  # the decision waited 5 s after Prometheus answered (a slot, a lock)
        (NOW + 30, 1.8, True),  # the operator's clock 30 s ahead of Prometheus'
        (NOW - 30, 1.8, True),  # or behind it
        (NOW, 2.2, False),  # stale when Prometheus answered
        (NOW - 30, 2.2, False),  # whatever the operator's clock says
    ],
)
def test_a_samples_age_is_measured_when_prometheus_answered(decided_at: float, age: float, fresh: bool):
    """The answer's timestamp is Prometheus' evaluation time (NOW here); a sample is stale when
    it was more than two scrapes old then, not against the decision's clock."""
    qs = m.build_queries("vllm", "n", "d", ["prefill", "decode"], 60, 0.9)
    results = {q.name: [] for q in qs}
    results["arrival_rps"] = [sample(4.0)]
    for series in ("running_by_pod", "waiting_by_pod", "pending_kv_by_pod"):
        results[f"{series}.prefill"] = [sample(0, pod="p1")]
    results["sample_time_by_pod.prefill"] = [sample(NOW - age, pod="p1")]
    snap = m.build_snapshot(qs, results, decided_at, 1.0, {"prefill": ["p1"]})
    assert snap.ok is fresh, snap.reason()
    assert snap.sample_age("prefill", "p1") == pytest.approx(age)
    assert (m.pod_in_flight_fresh(snap, "prefill", "p1", 1.0) is not None) is fresh


def test_routable_pod_without_metrics_is_incomplete():
    snap = routable_snapshot({"p1": 0}, {"p1": NOW}, ["p1", "p2"])
    assert not snap.ok
    assert any("p2" in str(p) and p.kind == "missing" for p in snap.problems)


def test_query_failure_is_missing():
    qs = m.build_queries("vllm", "n", "d", ["prefill", "decode"], 60, 0.9)
    results = {q.name: m.QueryFailed("cannot reach Prometheus (ConnectionError)") for q in qs}
    snap = m.build_snapshot(qs, results, NOW, 1.0, {})
    assert not snap.ok
    assert "arrival_rps" in snap.reason() and "cannot reach Prometheus" in snap.reason()
    # Any other exception is shown by its type only: its text may come from a reply body.
    results = {q.name: ConnectionError("<body>") for q in qs}
    reason = m.build_snapshot(qs, results, NOW, 1.0, {}).reason()
    assert "ConnectionError" in reason and "<body>" not in reason


def test_percent_where_fraction_expected_is_invalid():
    snap = routable_snapshot({"p1": 0}, {"p1": NOW}, ["p1"])
    assert snap.ok
    qs = m.build_queries("vllm", "n", "d", ["prefill", "decode"], 60, 0.9)
    results = {q.name: [] for q in qs}
    results["arrival_rps"] = [sample(1)]
    results["kv_usage_max"] = [sample(87.5)]
    snap = m.build_snapshot(qs, results, NOW, 1.0, {})
    assert not snap.ok and "percentage" in snap.reason()


EPD = ["encoder", "prefill", "decode"]


def test_presets_name_the_engines_encoder_metrics():
    # vLLM: an encoder instance's requests (prompt-tokens histogram) and its multimodal cache
    # lookups, one per item; SGLang's encoder server: one histogram of items per request.
    assert m.preset("vllm").media_requests == "vllm:request_prompt_tokens_count"
    assert m.preset("vllm").media_items == "vllm:mm_cache_queries_total"
    assert m.preset("sglang").media_requests == "sglang:encoder_mm_items_per_request_count"
    assert m.preset("sglang").media_items == "sglang:encoder_mm_items_per_request_sum"


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_media_queries_read_the_encoder_pods_only_when_there_is_an_encoder_pool(engine):
    qs = {q.name: q for q in m.build_queries(engine, "ns", "vl", EPD, 60, 0.9)}
    p = m.preset(engine)
    for name, series in (("media_rps", p.media_requests), ("media_items_rps", p.media_items)):
        q = qs[name]
        assert q.promql == f"sum(rate({series}{{{m.pool_selector('ns', 'vl', 'encoder')}}}[60s]))"
        assert q.pool == "encoder" and q.required_with_pods and not q.required
    plain = {q.name for q in m.build_queries(engine, "ns", "vl", ["prefill", "decode"], 60, 0.9)}
    assert "media_rps" not in plain and "media_items_rps" not in plain


def test_conditional_placement_counts_arrivals_on_decode():
    # short prompts never reach the prefill pool: every request is counted where it is decoded
    dis = {
        q.name: q
        for q in m.build_queries("vllm", "n", "d", ["prefill", "decode"], 60, 0.9, short_window_s=45)
    }
    cond = {
        q.name: q
        for q in m.build_queries(
            "vllm", "n", "d", ["prefill", "decode"], 60, 0.9, short_window_s=45, placement="conditional"
        )
    }
    for name in ("arrival_rps", "arrival_rps_short", "prompt_tokens_mean", "prompt_tokens_buckets"):
        assert 'pod=~"d-prefill-' in dis[name].promql and dis[name].pool == "prefill"
        assert 'pod=~"d-decode-' in cond[name].promql and cond[name].pool == "decode"
    assert 'pod=~"d-prefill-' in cond["prefill_time_mean"].promql  # the prefill pool's own model


def _media_results(qs, media):
    results = {q.name: [] for q in qs}
    results["arrival_rps"] = [sample(4)]
    results.update(media)
    return results


def test_missing_media_is_a_problem_only_while_encoder_pods_are_routable():
    qs = m.build_queries("vllm", "n", "d", EPD, 60, 0.9)
    running = [sample(0, pod="d-encoder-a-1")]
    times = [sample(NOW, pod="d-encoder-a-1")]
    results = _media_results(qs, {"running_by_pod.encoder": running, "sample_time_by_pod.encoder": times})
    snap = m.build_snapshot(qs, results, NOW, 1.0, {"encoder": ["d-encoder-a-1"]})
    assert not snap.ok  # the encoder pod reports, its media rates do not: missing, not zero
    assert {p.name for p in snap.problems} == {"media_rps", "media_items_rps"}
    assert "media_rps" not in snap.values
    # no routable encoder pod: nothing to report, no problem, and no value invented
    snap = m.build_snapshot(qs, _media_results(qs, {}), NOW, 1.0, {"encoder": []})
    assert snap.ok and "media_rps" not in snap.values
    # reported: zero is a valid value
    results["media_rps"] = [sample(0)]
    results["media_items_rps"] = [sample(0)]
    snap = m.build_snapshot(qs, results, NOW, 1.0, {"encoder": ["d-encoder-a-1"]})
    assert snap.ok and snap.values["media_rps"] == 0.0


def test_media_share_and_items_from_the_encoder_rates():
    assert m.media_fraction({"arrival_rps": 4.0}) is None  # no encoder stage measured
    assert m.media_items_per_request({"arrival_rps": 4.0}) is None
    v = {"arrival_rps": 4.0, "media_rps": 1.0, "media_items_rps": 3.0}
    assert (m.media_fraction(v), m.media_items_per_request(v)) == (0.25, 3.0)
    # no media in the window: the share is a measured 0, the items per request are unknown
    v = {"arrival_rps": 4.0, "media_rps": 0.0, "media_items_rps": 0.0}
    assert (m.media_fraction(v), m.media_items_per_request(v)) == (0.0, None)
    # values the window cannot give (NaN, no traffic) are unknown, never 0
    assert m.media_fraction({"arrival_rps": 0.0, "media_rps": 1.0}) is None
    assert m.media_fraction({"arrival_rps": 2.0, "media_rps": float("nan")}) is None
    # an engine taking one request per item can count more media requests than arrivals
    v = {"arrival_rps": 2.0, "media_rps": 6.0, "media_items_rps": 6.0}
    assert (m.media_fraction(v), m.media_items_per_request(v)) == (1.0, 1.0)


def kubernetes_pod_name(deployment: str, pod_template_hash: str, random5: str = "x7k2q") -> str:
    """A pod name as the ReplicaSet controller and the API server make it (generateName rules)."""
    base = f"{deployment}-{pod_template_hash}-"[:58]
    return base + random5


def selector_regex(selector: str) -> re.Pattern[str]:
    pattern = re.search(r'pod=~"(.*)"', selector).group(1).replace("\\\\", "\\")
    return re.compile(pattern)


@pytest.mark.parametrize("name_length", [1, 20, 38, 40, 42, 44, 45, 46, 48, 50, 53])
@pytest.mark.parametrize("pool", ["prefill", "decode", "colocated"])
def test_pool_selector_matches_pod_names_cut_to_63(name_length, pool):
    """Every valid DisaggDeployment name autoscales: the selector survives pod-name truncation."""
    name = ("llama" + "x" * 60)[:name_length]
    regex = selector_regex(m.pool_selector("ns", name, pool))
    for h in ("5", "7d9c6", "6f8b9c7d4f", "b8d5c7f9c"):
        pod = kubernetes_pod_name(f"{name}-{pool}", h)
        assert len(pod) <= 63
        assert regex.fullmatch(pod), (pod, regex.pattern)
    # Another pool's pods, or pods of a Deployment whose name extends this one, do not match.
    other = "decode" if pool != "decode" else "prefill"
    assert not regex.fullmatch(kubernetes_pod_name(f"{name}-{other}", "7d9c6f8b4"))
    if name_length + len(pool) < 40:
        assert not regex.fullmatch(kubernetes_pod_name(f"{name}-{pool}-x", "7d9c6f8b4"))


def test_old_prefix_selector_missed_truncated_names():
    """The case the issue reports: a 45-character name whose decode pods are cut."""
    name = "a" * 45
    pod = kubernetes_pod_name(f"{name}-decode", "6f8b9c7d4f")
    assert not re.fullmatch(f"{name}-decode-[a-z0-9]+-[a-z0-9]+", pod)
    assert selector_regex(m.pool_selector("ns", name, "decode")).fullmatch(pod)
