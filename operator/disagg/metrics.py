"""PromQL presets for vLLM and SGLang, and strict parsing of the answers.

Pure: builds query strings and validates result vectors (the JSON `data.result`
of Prometheus' instant-query API). The HTTP call lives in disagg.promclient.

The rule that matters: a value that is missing, NaN, infinite, negative, older
than two scrape intervals, or given as several series where one is expected is
*missing*, never zero. A snapshot with a missing required value is not `ok`, and
the autoscaler holds the current sizes.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from disagg.names import METRIC_FRONT_DOOR_REJECTED, POOL_COLOCATED, POOL_DECODE, POOL_ENCODER, POOL_PREFILL


@dataclass(frozen=True)
class PendingWork:
    """Work a pod of `pool` still holds besides its running and waiting requests, per pod.

    `reading` says how the series counts it: "count" is a gauge of requests (summed per pod);
    "held" is a fraction of KV blocks in use, read as 1 while the pod holds any KV and 0 once it
    holds none (`ceil`), for an engine that exports no count.
    """

    pool: str
    series: str
    reading: str = "count"  # count | held

    def promql(self, selector: str, by: str = "pod") -> str:
        """Per pod (`by`: the grouping labels) over the pods `selector` matches."""
        expr = f"{self.series}{{{selector}}}"
        if self.reading == "held":
            expr = f"ceil({expr})"
        elif self.reading != "count":
            raise ValueError(f"unknown pending-work reading {self.reading!r}; known: count, held")
        return f"sum by ({by}) ({expr})"


# Upper bounds (seconds) of the queue-time histogram the emulated engines export and the
# evaluation gives the decision for its windows (vLLM's own starts at 0.3 s, see
# `histogram_quantile_past_first`).
QUEUE_TIME_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)


@dataclass(frozen=True)
class Preset:
    """Metric names of one engine."""

    engine: str
    prompt_tokens: str  # histogram: prompt tokens per request (observed at admission on prefill)
    output_tokens: str  # histogram: generated tokens per request
    ttft: str  # histogram, seconds
    itl: str  # histogram, seconds
    running: str  # gauge per pod
    waiting: str  # gauge per pod
    # Per pool: KV a pod still has to send (prefill) or still receives (decode), beyond its
    # running and waiting requests. A pool without an entry has none outside those two.
    pending_kv: tuple[PendingWork, ...]
    kv_transfer: str | None  # histogram, seconds
    kv_usage: str | None  # gauge, fraction 0..1
    prefill_time: str | None = None  # histogram, seconds of prefill per request (for calibration)
    queue_time: str | None = None  # histogram, seconds a request waited in the engine's queue
    # Encoder pool (multimodal E/P/D), counted on the encoder pods: series whose rate() is the
    # media requests they take and the media items (images, frames, clips) in them.
    media_requests: str | None = None
    media_items: str | None = None
    # Per pool: the engine's own P/D router's gauges of the requests bound for each worker,
    # labelled `worker="http://<pod IP>:<port>"` and summed (docs/metrics.md, "The routers'
    # per-worker counts"). A pool without an entry gets no router count.
    router_in_flight: tuple[tuple[str, tuple[str, ...]], ...] = ()

    def router_series(self, pool: str, selector: str) -> str | None:
        """The PromQL vector of `router_in_flight`'s gauges for `pool` under `selector`; None
        when the router counts nothing for it."""
        for p, names in self.router_in_flight:
            if p == pool:
                if len(names) == 1:
                    return f"{names[0]}{{{selector}}}"
                return f'{{__name__=~"{"|".join(names)}",{selector}}}'
        return None


VLLM = Preset(
    engine="vllm",
    prompt_tokens="vllm:request_prompt_tokens",
    output_tokens="vllm:request_generation_tokens",
    ttft="vllm:time_to_first_token_seconds",
    itl="vllm:inter_token_latency_seconds",
    running="vllm:num_requests_running",
    waiting="vllm:num_requests_waiting",
    # vLLM exports no count of the KV sends a prefill instance still owes (the NIXL connector
    # counts only sends that expired, vllm:nixl_num_kv_expired_reqs). A finished prefill request
    # whose KV the decode instance has not pulled yet keeps its KV blocks (the connector delays
    # their release until the transfer is notified done, or the abort timeout), so the prefill
    # pod's KV usage stays above 0 until every send is done: with nothing running or waiting,
    # vllm:kv_cache_usage_perc > 0 is exactly "sends pending" (the null block is left out of
    # the fraction, and prefix-cached free blocks count as free). On a decode instance a
    # request whose KV is still landing waits (WAITING_FOR_REMOTE_KVS), so it is in
    # vllm:num_requests_waiting already.
    pending_kv=(PendingWork(POOL_PREFILL, "vllm:kv_cache_usage_perc", "held"),),
    kv_transfer="vllm:nixl_xfer_time_seconds",
    kv_usage="vllm:kv_cache_usage_perc",
    prefill_time="vllm:request_prefill_time_seconds",
    queue_time="vllm:request_queue_time_seconds",
    # A vLLM encoder instance (disaggregated encoder, --ec-transfer-config) takes one request per
    # media request from the proxy, counted like any other by its prompt-tokens histogram; the
    # multimodal processor cache counts the items it looks up ("in terms of number of queried
    # items"), one per item of every request.
    media_requests="vllm:request_prompt_tokens_count",
    media_items="vllm:mm_cache_queries_total",
    # vllm-router 0.1.17 picks a request's decode worker when the request arrives and sends it
    # there only once the prefill stage is done: until then it counts the request as pending on
    # that worker, then as active while the stream is open. A decode pod whose engine reads
    # idle may still have requests on their way from prefill, so the drain reads both. For a
    # prefill worker it exports occupancy and tokens only, no per-request count: none.
    router_in_flight=(
        (POOL_DECODE, ("vllm_router_pd_active_decode_requests", "vllm_router_pd_pending_decode_requests")),
    ),
)

SGLANG = Preset(
    engine="sglang",
    prompt_tokens="sglang:prompt_tokens_histogram",
    output_tokens="sglang:generation_tokens_histogram",
    ttft="sglang:time_to_first_token_seconds",
    queue_time="sglang:queue_time_seconds",
    itl="sglang:inter_token_latency_seconds",
    running="sglang:num_running_reqs",
    waiting="sglang:num_queue_reqs",
    # SGLang counts both ends of a transfer in their own queues, outside running and waiting:
    # the prefill's inflight queue (KV being sent) and the decode's transfer queue (KV landing).
    pending_kv=(
        PendingWork(POOL_PREFILL, "sglang:num_prefill_inflight_queue_reqs"),
        PendingWork(POOL_DECODE, "sglang:num_decode_transfer_queue_reqs"),
    ),
    kv_transfer=None,
    kv_usage="sglang:token_usage",
    # SGLang's encoder server (--encoder-only) observes the items of every request it takes
    # in one histogram: its count is the requests, its sum the items.
    media_requests="sglang:encoder_mm_items_per_request_count",
    media_items="sglang:encoder_mm_items_per_request_sum",
    # sglang-router 0.3.2 counts the requests it has open on every worker, prefill and decode
    # alike (it holds the prefill request open for the whole stream).
    router_in_flight=(
        (POOL_PREFILL, ("smg_worker_requests_active",)),
        (POOL_DECODE, ("smg_worker_requests_active",)),
    ),
)

PRESETS = {"vllm": VLLM, "sglang": SGLANG}


def preset(engine: str) -> Preset:
    try:
        return PRESETS[engine]
    except KeyError:
        raise ValueError(f"unknown engine {engine!r}; known: {', '.join(sorted(PRESETS))}") from None


#: How Kubernetes names a pool's pods: the ReplicaSet is <deployment>-<pod-template-hash>
#: (the hash is 1 to 10 lowercase letters and digits), its pods take generateName "<replicaset>-",
#: cut to 58 characters, plus 5 random letters and digits, so a pod name has at most 63.
POD_TEMPLATE_HASH_MAX = 10
GENERATE_NAME_BASE_MAX = 58
GENERATE_NAME_RANDOM = 5


def generated_name_prefix(owner_name: str) -> str:
    """What every pod name of `owner_name` begins with (a Deployment's, or a DisaggDeployment's,
    whose children are named ``<name>-<pool>``): ``<name>-`` cut where Kubernetes cuts
    generateName."""
    return f"{owner_name}-"[:GENERATE_NAME_BASE_MAX]


def promql_pattern(regex: str) -> re.Pattern[str]:
    """An RE2 pattern as written inside a PromQL string literal (pod_name_regex,
    owners_pod_regex), compiled for Python: the literal's backslash escaping undone."""
    return re.compile(regex.replace("\\\\", "\\"))


def pod_name_regex(deployment_name: str) -> str:
    """RE2 pattern of exactly the pod names a Deployment's ReplicaSets generate, truncation included.

    Without truncation: <deployment>-<hash>-<5 random>. When the name is long, generateName is
    cut before the random part, so the hash, its dash or even the end of the Deployment's name
    may be missing; the pattern follows the cut instead of assuming the full prefix.
    """
    base = f"{deployment_name}-"
    rand = f"[a-z0-9]{{{GENERATE_NAME_RANDOM}}}"
    if len(base) >= GENERATE_NAME_BASE_MAX:
        return _escape(base[:GENERATE_NAME_BASE_MAX]) + rand
    room = GENERATE_NAME_BASE_MAX - len(base)  # characters left for "<hash>-"
    if room > POD_TEMPLATE_HASH_MAX:
        return f"{_escape(base)}[a-z0-9]{{1,{POD_TEMPLATE_HASH_MAX}}}-{rand}"
    # Either "<hash>-" fits (hash shorter than `room`), or it is cut to `room` characters.
    whole = f"[a-z0-9]{{1,{room - 1}}}-{rand}" if room > 1 else None
    cut = f"[a-z0-9]{{{room + GENERATE_NAME_RANDOM}}}"
    return f"{_escape(base)}({whole}|{cut})" if whole else f"{_escape(base)}{cut}"


def _escape(text: str) -> str:
    """A DNS name as an RE2 literal ('.' is the only special character such a name can hold)."""
    return text.replace(".", "\\\\.")


def router_selector(namespace: str, router_deployment: str) -> str:
    """Series of the router pods of a DisaggDeployment (its Deployment `router_deployment`),
    selected like a pool's (pool_selector)."""
    return f'namespace="{namespace}",pod=~"{pod_name_regex(router_deployment)}"'


def pool_selector(namespace: str, deployment: str, pool: str) -> str:
    """Series of one pool, selected by the `namespace` and `pod` labels every Kubernetes scrape
    config attaches (no relabelling of a `pool` label is needed). The pod names are matched as
    Kubernetes generates them, so long DisaggDeployment names, whose pod names are cut to 63
    characters, still match (see pod_name_regex)."""
    return f'namespace="{namespace}",pod=~"{pod_name_regex(f"{deployment}-{pool}")}"'


@dataclass(frozen=True)
class Query:
    name: str
    promql: str
    kind: str  # "scalar" | "by_pod" | "by_worker" | "buckets"
    required: bool = True
    pool: str | None = None
    # Required only while `pool` has routable pods: a pool with none reports nothing, which is
    # then no problem (the value is simply absent and its last measurement stands).
    required_with_pods: bool = False
    # A subquery's (span s, step s, scrape s), for a query of kind "series" (its fleet series
    # has them).
    series_window: tuple[int, int, int] | None = None


def front_pool(pools: Sequence[str]) -> str:
    return (
        POOL_PREFILL if POOL_PREFILL in pools else (POOL_COLOCATED if POOL_COLOCATED in pools else pools[0])
    )


def back_pool(pools: Sequence[str]) -> str:
    return POOL_DECODE if POOL_DECODE in pools else (POOL_COLOCATED if POOL_COLOCATED in pools else pools[-1])


def arrival_pool(pools: Sequence[str], placement: str = "disaggregated") -> str:
    """The pool whose prompt-tokens histogram counts every request once.

    Disaggregated and colocated: the front pool (every request is prefilled there). Conditional:
    the decode pool, which serves every request; short prompts never reach the prefill pool.
    An engine's decode instance counts each request it serves (vLLM and SGLang record the
    prompt-tokens histogram per finished request; the emulator when the KV lands).
    """
    return back_pool(pools) if placement == "conditional" else front_pool(pools)


def build_queries(
    engine: str,
    namespace: str,
    deployment: str,
    pools: Sequence[str],
    window_s: int,
    percentile: float,
    custom: Mapping[str, str] | None = None,
    short_window_s: int | None = None,
    placement: str = "disaggregated",
    router_deployment: str | None = None,
) -> list[Query]:
    """Every query one autoscaling step needs. `custom` overrides a query by name.

    `router_deployment` names the Deployment of the object's router (None: no router) and adds,
    for each pool the engine's router counts, `router_in_flight_by_worker.<pool>`: the requests
    the router replicas have in flight on each worker, summed over the replicas, per `worker`
    label (pod_in_flight_fresh takes it as a lower bound on the pod's own count).

    `short_window_s` adds `arrival_rps_short`, the rate over a few scrapes only, so a real
    step up is seen before the main window catches up. `placement` picks the pool that
    counts arrivals and prompt lengths (`arrival_pool`). With an encoder pool, `media_rps`
    and `media_items_rps` are the media requests and items its pods take.
    """
    p = preset(engine)
    w = f"{int(window_s)}s"
    front, back = front_pool(pools), back_pool(pools)
    arr = arrival_pool(pools, placement)
    fs, bs = pool_selector(namespace, deployment, front), pool_selector(namespace, deployment, back)
    as_ = pool_selector(namespace, deployment, arr)
    q: list[Query] = [
        Query("arrival_rps", f"sum(rate({p.prompt_tokens}_count{{{as_}}}[{w}]))", "scalar", pool=arr),
        Query(
            "prompt_tokens_mean",
            f"sum(rate({p.prompt_tokens}_sum{{{as_}}}[{w}])) / sum(rate({p.prompt_tokens}_count{{{as_}}}[{w}]))",
            "scalar",
            required=False,
            pool=arr,
        ),
        Query(
            "prompt_tokens_buckets",
            f"sum by (le) (rate({p.prompt_tokens}_bucket{{{as_}}}[{w}]))",
            "buckets",
            required=False,
            pool=arr,
        ),
        Query(
            "output_tokens_mean",
            f"sum(rate({p.output_tokens}_sum{{{bs}}}[{w}])) / sum(rate({p.output_tokens}_count{{{bs}}}[{w}]))",
            "scalar",
            required=False,
            pool=back,
        ),
        Query(
            "output_tokens_buckets",
            f"sum by (le) (rate({p.output_tokens}_bucket{{{bs}}}[{w}]))",
            "buckets",
            required=False,
            pool=back,
        ),
        Query(
            "ttft_p",
            f"histogram_quantile({percentile}, sum by (le) (rate({p.ttft}_bucket{{{bs}}}[{w}])))",
            "scalar",
            required=False,
            pool=back,
        ),
        Query(
            "itl_mean",
            f"sum(rate({p.itl}_sum{{{bs}}}[{w}])) / sum(rate({p.itl}_count{{{bs}}}[{w}]))",
            "scalar",
            required=False,
            pool=back,
        ),
    ]
    # what the front door shed (admission control): arrivals no engine counts; no series where
    # nothing sheds
    shed = f'{METRIC_FRONT_DOOR_REJECTED}{{namespace="{namespace}",deployment="{deployment}"}}'
    q.append(Query("shed_rps", f"sum(rate({shed}[{w}]))", "scalar", required=False))
    if short_window_s:
        q.append(
            Query(
                "arrival_rps_short",
                f"sum(rate({p.prompt_tokens}_count{{{as_}}}[{int(short_window_s)}s]))",
                "scalar",
                required=False,
                pool=arr,
            )
        )
        q.append(
            Query("shed_rps_short", f"sum(rate({shed}[{int(short_window_s)}s]))", "scalar", required=False)
        )
    if POOL_ENCODER in pools and p.media_requests and p.media_items:
        es = pool_selector(namespace, deployment, POOL_ENCODER)
        q += [
            Query(
                "media_rps",
                f"sum(rate({p.media_requests}{{{es}}}[{w}]))",
                "scalar",
                required=False,
                pool=POOL_ENCODER,
                required_with_pods=True,
            ),
            Query(
                "media_items_rps",
                f"sum(rate({p.media_items}{{{es}}}[{w}]))",
                "scalar",
                required=False,
                pool=POOL_ENCODER,
                required_with_pods=True,
            ),
        ]
    for pool in pools:
        sel = pool_selector(namespace, deployment, pool)
        q += [
            Query(f"running_by_pod.{pool}", f"sum by (pod) ({p.running}{{{sel}}})", "by_pod", pool=pool),
            Query(f"waiting_by_pod.{pool}", f"sum by (pod) ({p.waiting}{{{sel}}})", "by_pod", pool=pool),
            Query(
                f"sample_time_by_pod.{pool}",
                f"max by (pod) (timestamp({p.running}{{{sel}}}))",
                "by_pod",
                pool=pool,
            ),
        ]
    for pending in p.pending_kv:
        if pending.pool not in pools:
            continue
        sel = pool_selector(namespace, deployment, pending.pool)
        q.append(
            Query(
                f"pending_kv_by_pod.{pending.pool}",
                pending.promql(sel),
                "by_pod",
                required=False,
                pool=pending.pool,
            )
        )
    if router_deployment:
        rs = router_selector(namespace, router_deployment)
        for pool, _ in p.router_in_flight:
            if pool not in pools:
                continue
            q.append(
                Query(
                    f"router_in_flight_by_worker.{pool}",
                    f"sum by (worker) ({p.router_series(pool, rs)})",
                    "by_worker",
                    required=False,
                    pool=pool,
                )
            )
    if p.prefill_time:
        q.append(
            Query(
                "prefill_time_mean",
                f"sum(rate({p.prefill_time}_sum{{{fs}}}[{w}])) / sum(rate({p.prefill_time}_count{{{fs}}}[{w}]))",
                "scalar",
                required=False,
                pool=front,
            )
        )
    if p.kv_usage:
        sel = pool_selector(namespace, deployment, back)
        q.append(Query("kv_usage_max", f"max({p.kv_usage}{{{sel}}})", "scalar", required=False, pool=back))
        # Each pod's usage averaged over the window, summed over the pods: x kvCacheTokens, the
        # KV tokens the pool holds on average; over the running sequences averaged over the same
        # window it is one sequence's time-weighted footprint (autoscaler.observed_kv_footprint).
        # Window averages: the instantaneous ratio swings too much to size a pool by.
        q.append(
            Query(
                "kv_usage_sum",
                f"sum(avg_over_time({p.kv_usage}{{{sel}}}[{w}]))",
                "scalar",
                required=False,
                pool=back,
            )
        )
        q.append(
            Query(
                "kv_running_avg",
                f"sum(avg_over_time({p.running}{{{sel}}}[{w}]))",
                "scalar",
                required=False,
                pool=back,
            )
        )
    if custom:
        names = {x.name for x in q}
        for name, promql in custom.items():
            if name in names:
                q = [
                    Query(x.name, promql, x.kind, x.required, x.pool, x.required_with_pods)
                    if x.name == name
                    else x
                    for x in q
                ]
            else:
                q.append(Query(name, promql, "scalar", required=False))
    return q


class QueryFailed(Exception):
    """A Prometheus query that gave no answer, with a short message that is safe to show.

    The message is built from fixed text and the HTTP status code only: a reply's body (which
    whoever runs the endpoint controls) never reaches the object's status or its Events.
    """


METRICS_FRESH = "all metrics present and fresh"


class MetricError(ValueError):
    """A value that must be treated as missing."""

    def __init__(self, name: str, kind: str, detail: str, steady: str | None = None) -> None:
        super().__init__(f"{name}: {detail}")
        self.name = name
        self.kind = kind  # missing | nan | inf | negative | multiple | stale | invalid
        # The detail without the figures that change from one read to the next (a sample's
        # age, the bad value): what a status condition shows.
        self.steady = f"{name}: {steady or detail}"


def _value(sample: Mapping[str, Any], name: str) -> float:
    try:
        v = float(sample["value"][1])
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        raise MetricError(name, "invalid", f"malformed sample {sample!r}", "malformed sample") from exc
    if math.isnan(v):
        raise MetricError(name, "nan", "value is NaN")
    if math.isinf(v):
        raise MetricError(name, "inf", "value is infinite")
    if v < 0:
        raise MetricError(name, "negative", f"value {v} is negative", "a negative value")
    return v


def evaluation_time(result: Sequence[Mapping[str, Any]] | None) -> float | None:
    """The time Prometheus evaluated an instant query at: its samples' timestamp (the same for
    every series of one answer); None when the answer has no usable one."""
    for s in result or []:
        try:
            t = float(s["value"][0])
        except (KeyError, IndexError, TypeError, ValueError):
            return None
        return t if math.isfinite(t) else None
    return None


def parse_scalar(result: Sequence[Mapping[str, Any]] | None, name: str) -> float:
    """Exactly one finite, non-negative sample."""
    if not result:
        raise MetricError(name, "missing", "empty result")
    if len(result) > 1:
        raise MetricError(name, "multiple", f"{len(result)} series where one was expected")
    return _value(result[0], name)


def parse_by_pod(
    result: Sequence[Mapping[str, Any]] | None, name: str, label: str = "pod"
) -> dict[str, float]:
    """One value per `label` value (a pod name; "worker" for a router's per-worker series)."""
    out: dict[str, float] = {}
    for s in result or []:
        key = (s.get("metric") or {}).get(label)
        if not key:
            raise MetricError(name, "invalid", f"a series without a {label} label")
        if key in out:
            raise MetricError(name, "multiple", f"several series for {label} {key}")
        out[key] = _value(s, name)
    return out


class BucketSummary(NamedTuple):
    mean: float
    std: float
    rate: float  # observations per second (the +Inf bucket's rate)


def parse_buckets(result: Sequence[Mapping[str, Any]] | None, name: str) -> BucketSummary:
    """Mean and standard deviation estimated from cumulative histogram bucket rates, and the
    rate of observations they hold."""
    pts: list[tuple[float, float]] = []
    for s in result or []:
        le = (s.get("metric") or {}).get("le")
        if le is None:
            raise MetricError(name, "invalid", "bucket series without le")
        bound = math.inf if le in ("+Inf", "Inf", "inf") else float(le)
        pts.append((bound, _value(s, name)))
    if not pts:
        raise MetricError(name, "missing", "no buckets")
    pts.sort()
    total = pts[-1][1]
    if total <= 0:
        raise MetricError(name, "missing", "no observations in the window")
    lo, prev, mean, sq = 0.0, 0.0, 0.0, 0.0
    for bound, cum in pts:
        n = cum - prev
        if n < -1e-9:
            raise MetricError(name, "invalid", "buckets are not cumulative")
        hi = bound if math.isfinite(bound) else lo * 2 if lo > 0 else 1.0
        mid = (lo + hi) / 2
        mean += n * mid
        sq += n * (mid * mid + (hi - lo) ** 2 / 12)  # uniform within a bucket
        prev, lo = cum, hi
    mean /= total
    var = max(sq / total - mean * mean, 0.0)
    return BucketSummary(mean, math.sqrt(var), total)


@dataclass
class Snapshot:
    """What one scrape of Prometheus says about one DisaggDeployment."""

    time: float
    values: dict[str, float] = field(default_factory=dict)
    spreads: dict[str, float] = field(default_factory=dict)
    by_pod: dict[str, dict[str, float]] = field(default_factory=dict)  # e.g. "in_flight.prefill" -> {pod: n}
    # e.g. "router_in_flight_by_worker.decode" -> {"http://10.0.0.5:8000": n}
    by_worker: dict[str, dict[str, float]] = field(default_factory=dict)
    problems: list[MetricError] = field(default_factory=list)
    failed: set[str] = field(default_factory=set)  # optional queries that failed (unknown, not empty)
    # Per pool, when Prometheus evaluated its sample-time query (the answer's own timestamp).
    evaluated_at: dict[str, float] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.problems

    def sample_age(self, pool: str, pod: str) -> float | None:
        """How old the pod's newest sample was when Prometheus answered, on Prometheus' own clock
        (the answer's timestamp minus the sample's), None without a sample. Neither the time the
        decision waited after the query nor a skew between the operator's clock and
        Prometheus' makes a sample look older than it was (an answer without a usable
        timestamp is measured against the snapshot's time)."""
        t = self.by_pod.get(f"sample_time_by_pod.{pool}", {}).get(pod)
        if t is None:
            return None
        return self.evaluated_at.get(pool, self.time) - t

    def sampled_at(self, pool: str, pod: str) -> float | None:
        """When the pod's newest sample was taken, on the operator's clock: the snapshot's time
        (when the operator asked) less the sample's age on Prometheus' clock. The operator asked
        before Prometheus answered, so this is never later than the sample's true time, whatever
        the skew between the two clocks."""
        age = self.sample_age(pool, pod)
        return None if age is None else self.time - age

    def reason(self) -> str:
        """The problems with their figures (a sample's age, a bad value): for Events and logs."""
        return "; ".join(str(p) for p in self.problems[:5]) or METRICS_FRESH

    def condition_message(self) -> str:
        """The problems without their figures, for the MetricsAvailable condition: the same
        outage gives the same message from one decision to the next (a stale sample's age grows
        every decision), so it does not rewrite the status each time."""
        return "; ".join(p.steady for p in self.problems[:5]) or METRICS_FRESH

    def in_flight(self, pool: str) -> dict[str, float]:
        return self.by_pod.get(f"in_flight.{pool}", {})

    def to_dict(self) -> dict[str, Any]:
        return {
            "time": self.time,
            "values": {k: round(v, 6) for k, v in self.values.items()},
            "spreads": {k: round(v, 6) for k, v in self.spreads.items()},
            "problems": [str(p) for p in self.problems],
        }


def build_snapshot(
    queries: Sequence[Query],
    results: Mapping[str, Sequence[Mapping[str, Any]] | Exception],
    now: float,
    scrape_interval_s: float,
    routable_pods: Mapping[str, Sequence[str]],
) -> Snapshot:
    """Validate every answer. `routable_pods` lists, per pool, the pods that must report.

    A required value that fails validation, a routable pod without a fresh sample, or a
    query that raised (connection error, bad status) makes the snapshot not ok.
    """
    snap = Snapshot(time=now)
    max_age = 2 * scrape_interval_s
    for q in queries:
        res = results.get(q.name)
        try:
            if isinstance(res, Exception):
                # Only our own fixed wording is shown; any other error by its type alone.
                detail = str(res) if isinstance(res, QueryFailed) else type(res).__name__
                raise MetricError(q.name, "missing", f"query failed: {detail}"[:300])
            if q.kind == "scalar":
                snap.values[q.name] = parse_scalar(res, q.name)
            elif q.kind == "buckets":
                mean, std, rate = parse_buckets(res, q.name)
                base = q.name.removesuffix("_buckets")
                snap.values.setdefault(f"{base}_mean", mean)
                snap.spreads[f"{base}_std"] = std
                snap.values[f"{base}_count_rate"] = rate  # e.g. requests finished per second
            elif q.kind == "by_worker":
                snap.by_worker[q.name] = parse_by_pod(res, q.name, label="worker")
            else:
                snap.by_pod[q.name] = parse_by_pod(res, q.name)
                if q.name.startswith("sample_time_by_pod.") and (at := evaluation_time(res)) is not None:
                    snap.evaluated_at[q.name.partition(".")[2]] = at
        except MetricError as err:
            if q.required or (q.required_with_pods and routable_pods.get(q.pool or "")):
                snap.problems.append(err)
            else:
                snap.failed.add(q.name)
    # Freshness and completeness per pool: every routable pod must have a recent sample.
    for pool, pods in routable_pods.items():
        for pod in pods:
            age = snap.sample_age(pool, pod)
            if age is None:
                snap.problems.append(MetricError(f"{pool}/{pod}", "missing", "pod reports no metrics"))
            elif age > max_age:
                snap.problems.append(
                    MetricError(
                        f"{pool}/{pod}",
                        "stale",
                        f"last sample {age:.1f} s old (max {max_age:.0f} s)",
                        f"no sample in the last {max_age:.0f} s",
                    )
                )
        running = snap.by_pod.get(f"running_by_pod.{pool}", {})
        waiting = snap.by_pod.get(f"waiting_by_pod.{pool}", {})
        pending = snap.by_pod.get(f"pending_kv_by_pod.{pool}", {})
        snap.by_pod[f"in_flight.{pool}"] = {
            pod: running.get(pod, 0.0) + waiting.get(pod, 0.0) + pending.get(pod, 0.0)
            for pod in set(running) | set(waiting) | set(pending)
        }
        snap.values[f"queue.{pool}"] = sum(waiting.values())
        snap.values[f"running.{pool}"] = sum(running.values())
    usage = snap.values.get("kv_usage_max")
    if usage is not None and usage > 1.0 + 1e-9:
        snap.problems.append(
            MetricError(
                "kv_usage_max",
                "invalid",
                f"{usage} > 1: a percentage where a fraction was expected (renamed or rescaled metric?)",
                "above 1: a percentage where a fraction was expected (renamed or rescaled metric?)",
            )
        )
    return snap


def _nonneg(values: Mapping[str, float], key: str) -> float | None:
    x = values.get(key)
    return x if x is not None and math.isfinite(x) and x >= 0 else None


def media_fraction(values: Mapping[str, float]) -> float | None:
    """Share of requests carrying media: the encoder pods' media request rate over the arrival
    rate, both over the same window; None when the window cannot give it (no encoder query, no
    encoder pod reporting, no traffic). An engine that takes one request per item counts more
    media requests than arrivals, so the share is capped at 1."""
    arrival, media = _nonneg(values, "arrival_rps"), _nonneg(values, "media_rps")
    if media is None or arrival is None or arrival <= 0:
        return None
    return min(1.0, media / arrival)


def media_items_per_request(values: Mapping[str, float]) -> float | None:
    """Media items per media request (at least 1); None when the window shows no media request."""
    media, items = _nonneg(values, "media_rps"), _nonneg(values, "media_items_rps")
    if items is None or media is None or media <= 0:
        return None
    return max(1.0, items / media)


def pod_in_flight_fresh(
    snap: Snapshot, pool: str, pod: str, scrape_interval_s: float, worker: str | None = None
) -> float | None:
    """In-flight work of one pod (running + waiting + pending KV sends), or None when it is not
    known: a stale or missing sample, the pod absent from the running or waiting series, or,
    where the pool has a pending-KV query, absent from its answer (even an empty one: the engine
    exports that series, so a pod without it has unknown KV still to move), or that query failed.
    Never read as zero.

    `worker` is how the router names the pod (routerclient.worker_url: http://<pod IP>:<port>).
    When the router's per-worker query (`router_in_flight_by_worker.<pool>`) answered for that
    worker, the result is the larger of the engine's count and the router's: the router's can
    only lengthen a drain, never shorten it (a restarted router counts from 0 while the engine
    still finishes its streams). A router count that is missing, or a query that failed or was
    not asked, adds nothing; an unknown engine count stays unknown whatever the router says."""
    age = snap.sample_age(pool, pod)
    if age is None or age > 2 * scrape_interval_s:
        return None
    pending_name = f"pending_kv_by_pod.{pool}"
    if pending_name in snap.failed:
        return None
    parts = [snap.by_pod.get(f"running_by_pod.{pool}", {}), snap.by_pod.get(f"waiting_by_pod.{pool}", {})]
    if pending_name in snap.by_pod:  # asked (the preset or an override names a series) and answered
        parts.append(snap.by_pod[pending_name])
    if any(pod not in part for part in parts):
        return None
    engine = sum(part[pod] for part in parts)
    router = snap.by_worker.get(f"router_in_flight_by_worker.{pool}", {}).get(worker) if worker else None
    return engine if router is None else max(engine, router)


# --------------------------------------------------------------------------- sizing inputs
# Request-size distribution and burstiness (disagg.sizes, disagg.burstiness). Separate
# query names from `build_queries`, all optional: when one is missing the planner keeps
# the mean/std request shape and Poisson arrivals, never a zero.


# the sizing queries of the counted pool's waiting + running requests at every sub-window's end,
# and of the requests the front door shed per sub-window (sizing_queries)
IN_SYSTEM_SERIES = "arrival_in_system_horizon"
SHED_SERIES = "arrival_shed_horizon"
# the sizing query of the front pool's engines reporting at every scrape of the window (sizing_queries)
SERVING_SERIES = "prefill_serving_window"


def sizing_queries(
    engine: str,
    namespace: str,
    deployment: str,
    pools: Sequence[str],
    window_s: int,
    sub_window_s: int,
    horizon_s: int | None = None,
    *,
    scrape_s: int,
    placement: str = "disaggregated",
) -> list[Query]:
    """Histogram buckets of prompt/output tokens, and arrival counts per sub-window.

    * ``prompt_tokens_histogram`` / ``output_tokens_histogram`` (kind ``histogram``):
      ``sum by (le) (rate(<tokens>_bucket[window]))``, with ``*_sum_rate`` for the
      ``+Inf`` bucket's mean;
    * ``ttft_histogram`` (kind ``histogram``): the back pool's TTFT buckets over the window,
      so the front load gain can read any quantile of them (`autoscaler.learnt_front_gain`);
    * ``prefill_queue_histogram`` (kind ``histogram``, engines that export a queue-time
      histogram): the front pool's queue waits over the window, which tell the gain whether
      the prefill queue is what misses;
    * ``prefill_queue_mean`` (kind ``scalar``, the same engines): the front pool's mean queue
      wait over the window, the histogram's sum over its count, and
      ``prefill_serving_window`` (kind ``series``): how many of its engines report at every
      scrape of the window -- the arrival term read off the queue's waits
      (`autoscaler.wait_arrival_term`) and the count they were waited at;
    * ``arrival_counts`` (kind ``series``): arrivals per ``sub_window_s`` (a multiple
      of the scrape interval ``scrape_s``, at least two) over the window, each arrival
      counted once (`arrival_counts_promql`) -- the index of dispersion's input;
    * ``arrival_counts_horizon`` (kind ``series``, with ``horizon_s``): the same over
      the trailing horizon -- the automatic headroom's input;
    * ``arrival_in_system_horizon`` (kind ``series``, with ``horizon_s``): the requests the
      counted pool holds uncounted (waiting + running) at every sub-window's end over the
      horizon and one sub-window before it, so that each count has the growth of that gauge
      over its sub-window (`autoscaler.Observation.arrival_counts_growth`): the engines count
      a request when it leaves the pool, so a count plus that growth is what arrived;
    * ``arrival_shed_horizon`` (kind ``series``, with ``horizon_s``): the requests the front
      door shed per sub-window over the horizon (its counter, counted like the arrivals; no
      series where nothing was shed), which no engine counts.

    The prompt lengths, the counts and the gauge are the arrival pool's (`arrival_pool`: the
    one that counts every request, the decode pool under the conditional placement), as the
    arrival rate is.
    """
    if sub_window_s <= 0 or window_s <= 0:
        raise ValueError("window_s and sub_window_s must be > 0")
    if scrape_s <= 0 or sub_window_s % scrape_s or sub_window_s < 2 * scrape_s:
        raise ValueError("sub_window_s must be a multiple of scrape_s, at least two scrapes")
    p = preset(engine)
    w, sub = f"{int(window_s)}s", f"{int(sub_window_s)}s"
    front, back, arr = front_pool(pools), back_pool(pools), arrival_pool(pools, placement)
    fs, bs = pool_selector(namespace, deployment, front), pool_selector(namespace, deployment, back)
    as_ = pool_selector(namespace, deployment, arr)
    q = [
        Query(
            "prompt_tokens_histogram",
            f"sum by (le) (rate({p.prompt_tokens}_bucket{{{as_}}}[{w}]))",
            "histogram",
            required=False,
            pool=arr,
        ),
        Query(
            "prompt_tokens_sum_rate",
            f"sum(rate({p.prompt_tokens}_sum{{{as_}}}[{w}]))",
            "scalar",
            required=False,
            pool=arr,
        ),
        Query(
            "output_tokens_histogram",
            f"sum by (le) (rate({p.output_tokens}_bucket{{{bs}}}[{w}]))",
            "histogram",
            required=False,
            pool=back,
        ),
        Query(
            "output_tokens_sum_rate",
            f"sum(rate({p.output_tokens}_sum{{{bs}}}[{w}]))",
            "scalar",
            required=False,
            pool=back,
        ),
        Query(
            "ttft_histogram",
            f"sum by (le) (rate({p.ttft}_bucket{{{bs}}}[{w}]))",
            "histogram",
            required=False,
            pool=back,
        ),
    ]
    if p.queue_time:
        q.append(
            Query(
                "prefill_queue_histogram",
                f"sum by (le) (rate({p.queue_time}_bucket{{{fs}}}[{w}]))",
                "histogram",
                required=False,
                pool=front,
            )
        )
        q.append(
            Query(
                "prefill_queue_mean",
                f"sum(rate({p.queue_time}_sum{{{fs}}}[{w}])) / sum(rate({p.queue_time}_count{{{fs}}}[{w}]))",
                "scalar",
                required=False,
                pool=front,
            )
        )
        q.append(
            Query(
                SERVING_SERIES,
                f"(count({p.running}{{{fs}}}))[{int(window_s)}s:{int(scrape_s)}s]",
                "series",
                required=False,
                pool=front,
                series_window=(int(window_s), int(scrape_s), int(scrape_s)),
            )
        )
    counts = arrival_counts_promql(f"{p.prompt_tokens}_count{{{as_}}}", "", int(sub_window_s), int(scrape_s))
    spans = [("arrival_counts", int(window_s))]
    inner = {"arrival_counts": counts}
    if horizon_s:
        spans.append(("arrival_counts_horizon", int(horizon_s)))
        inner["arrival_counts_horizon"] = counts
        # one sub-window longer: the first count's growth needs the gauge at its start too
        spans.append((IN_SYSTEM_SERIES, int(horizon_s) + int(sub_window_s)))
        inner[IN_SYSTEM_SERIES] = f"sum({p.waiting}{{{as_}}}) + sum({p.running}{{{as_}}})"
        spans.append((SHED_SERIES, int(horizon_s)))
        inner[SHED_SERIES] = arrival_counts_promql(
            f'{METRIC_FRONT_DOOR_REJECTED}{{namespace="{namespace}",deployment="{deployment}"}}',
            "",
            int(sub_window_s),
            int(scrape_s),
        )
    for name, span in spans:
        q.append(
            Query(
                name,
                f"({inner[name]})[{span}s:{sub}]",
                "series",
                required=False,
                pool=arr,
                series_window=(span, int(sub_window_s), int(scrape_s)),
            )
        )
    return q


def arrival_counts_promql(counter: str, by: str, sub_window_s: int, scrape_s: int) -> str:
    """PromQL for the arrivals per `sub_window_s` of a counter, every arrival counted once.

    ``increase(c[sub])`` evaluated every `sub` seconds sees only the scrapes inside each
    sub-window: with two scrapes per sub-window it measures the increase between them
    (one scrape interval of the two) and extrapolates it to the whole sub-window, so the
    arrivals between one sub-window's last scrape and the next one's first are never
    counted and the others count twice (Poisson traffic then reads at twice its index of
    dispersion). Instead, ``increase(c[2 scrapes])`` every scrape interval spans exactly
    two scrapes, the increase between consecutive scrapes extrapolated to twice its
    length; summed over the sub-window's scrape steps and halved, each arrival counts
    once. The sub-window's range is half a scrape short of it, so that it holds its own
    scrape steps alone whether Prometheus' ranges include their start (2.x) or not (3.x).
    `by`: a grouping clause such as ``" by (namespace, pod)"``, or empty.
    """
    inner = f"sum{by} (increase({counter}[{2 * scrape_s}s]))"
    return f"sum_over_time(({inner})[{1000 * sub_window_s - 500 * scrape_s}ms:{scrape_s}s]) / 2"


def parse_histogram(result: Sequence[Mapping[str, Any]] | None, name: str) -> list[tuple[float, float]]:
    """Cumulative ``(le, value)`` pairs of one histogram, sorted by ``le``, validated."""
    pts: list[tuple[float, float]] = []
    seen: set[float] = set()
    for s in result or []:
        le = (s.get("metric") or {}).get("le")
        if le is None:
            raise MetricError(name, "invalid", "bucket series without le")
        try:
            bound = math.inf if le in ("+Inf", "Inf", "inf") else float(le)
        except ValueError:
            raise MetricError(name, "invalid", f"bucket bound {le!r} is not a number") from None
        if bound in seen:
            raise MetricError(name, "multiple", f"several series for le={le}")
        seen.add(bound)
        pts.append((bound, _value(s, name)))
    if not pts:
        raise MetricError(name, "missing", "no buckets")
    pts.sort()
    if pts[-1][1] <= 0:
        raise MetricError(name, "missing", "no observations in the window")
    for i in range(1, len(pts)):
        (_, below), (le, cum) = pts[i - 1], pts[i]
        if cum < below - 1e-9 * max(1.0, below):
            raise MetricError(name, "invalid", f"buckets are not cumulative at le={le}")
    return pts


def parse_series_points(result: Sequence[Mapping[str, Any]] | None, name: str) -> list[tuple[float, float]]:
    """The (time, value) points of exactly one range-vector series (a subquery), oldest first."""
    if not result:
        raise MetricError(name, "missing", "empty result")
    if len(result) > 1:
        raise MetricError(name, "multiple", f"{len(result)} series where one was expected")
    values = result[0].get("values")
    if not isinstance(values, list) or not values:
        raise MetricError(name, "missing", "a series without values")
    out: list[tuple[float, float]] = []
    for v in values:
        value = _value({"value": v}, name)
        try:
            at = float(v[0])
        except (IndexError, TypeError, ValueError):
            raise MetricError(name, "invalid", f"a point without a time: {v!r}") from None
        out.append((at, value))
    return out


def growth_over_steps(
    times: Sequence[float], gauge: Sequence[tuple[float, float]], step_s: float
) -> tuple[float | None, ...]:
    """Per time t of `times`, the gauge's change over the step that ends there: its value at t
    minus its value at t - `step_s` (points of a subquery with that step: both on its grid),
    None where either is missing (a scrape gap is unknown, never no change)."""
    ends = values_at(times, gauge)
    starts = values_at([t - step_s for t in times], gauge)
    return tuple(None if e is None or s is None else e - s for e, s in zip(ends, starts, strict=True))


def values_at(times: Sequence[float], points: Sequence[tuple[float, float]]) -> tuple[float | None, ...]:
    """Per time of `times`, the value of `points` at that time (None where it has none)."""
    at = {round(t * 1000.0): v for t, v in points}
    return tuple(at.get(round(t * 1000.0)) for t in times)


def size_distribution(
    prompt: Sequence[Mapping[str, Any]] | None,
    output: Sequence[Mapping[str, Any]] | None,
    prompt_sum: float | None = None,
    output_sum: float | None = None,
) -> Any:
    """A `disagg.sizes.SizeDistribution` from the two histogram answers (MetricError if unusable)."""
    from disagg.sizes import SizeDistribution

    pb = parse_histogram(prompt, "prompt_tokens_histogram")
    ob = parse_histogram(output, "output_tokens_histogram")
    try:
        return SizeDistribution.from_buckets(pb, ob, prompt_sum=prompt_sum, output_sum=output_sum)
    except ValueError as exc:
        raise MetricError("size_distribution", "invalid", str(exc)) from exc


# ---------------------------------------------------------------------------- one query per metric
#
# Many DisaggDeployments that use the same Prometheus ask one query per metric per tick instead
# of each its own: the series are grouped by the labels that identify a pod (namespace, pod, and
# le for histogram buckets), and `fleet_split` rebuilds, in memory, exactly the answer each
# object's own query (build_queries, sizing_queries) would have had: sums and maxima over the
# pool's pods (the same pod-name pattern, pool_selector), ratios of sums, buckets summed by le,
# histogram_quantile over them, and a subquery's points summed per step (the arrival counts).
# The answers then go through build_snapshot unchanged, so the freshness rules and "missing is
# never zero" hold as before.

#: The fleet series of the front door's counter (`names.METRIC_FRONT_DOOR_REJECTED`), per object.
_SHED_ROLE = "front_door_shed"
# fleet series "shed_counts.<span s>.<step s>.<scrape s>": the same counter per sub-window, per object
_SHED_COUNTS_ROLE = "shed_counts"
#: Per-object query name -> (how its value is made, the fleet series it is made of).
_RECIPES: dict[str, tuple[str, tuple[str, ...]]] = {
    "arrival_rps": ("sum", ("prompt_count",)),
    "arrival_rps_short": ("sum", ("prompt_count_short",)),
    "prompt_tokens_mean": ("ratio", ("prompt_sum", "prompt_count")),
    "prompt_tokens_buckets": ("buckets", ("prompt_bucket",)),
    "output_tokens_mean": ("ratio", ("output_sum", "output_count")),
    "output_tokens_buckets": ("buckets", ("output_bucket",)),
    "ttft_p": ("quantile", ("ttft_bucket",)),
    "itl_mean": ("ratio", ("itl_sum", "itl_count")),
    "media_rps": ("sum", ("media_requests",)),
    "media_items_rps": ("sum", ("media_items",)),
    "prefill_time_mean": ("ratio", ("prefill_sum", "prefill_count")),
    "kv_usage_max": ("max", ("kv_usage",)),
    "kv_usage_sum": ("sum", ("kv_usage_avg",)),
    "kv_running_avg": ("sum", ("running_avg",)),
    # the sizing inputs (sizing_queries)
    "prompt_tokens_histogram": ("buckets", ("prompt_bucket",)),
    "prompt_tokens_sum_rate": ("sum", ("prompt_sum",)),
    "output_tokens_histogram": ("buckets", ("output_bucket",)),
    "output_tokens_sum_rate": ("sum", ("output_sum",)),
    "ttft_histogram": ("buckets", ("ttft_bucket",)),
    "prefill_queue_histogram": ("buckets", ("queue_bucket",)),
    "prefill_queue_mean": ("ratio", ("queue_sum", "queue_count")),
    # the front door's counter, per DisaggDeployment (its series carry no pod)
    "shed_rps": ("deployment_sum", (_SHED_ROLE,)),
    "shed_rps_short": ("deployment_sum", (_SHED_ROLE + "_short",)),
}
_BY_POD_RECIPES = {
    "running_by_pod": "running",
    "waiting_by_pod": "waiting",
    "sample_time_by_pod": "sample_time",
}
_PENDING_ROLE = "pending_kv"  # fleet series "pending_kv.<pool>", one per PendingWork
_ROUTER_ROLE = "router_in_flight"  # fleet series "router_in_flight.<pool>", per Preset.router_in_flight
# fleet series "arrival_counts.<span s>.<step s>.<scrape s>": arrivals per pod per step over the span, a
# subquery (sizing_queries' arrival counts, the burstiness and automatic headroom inputs)
_COUNTS_ROLE = "arrival_counts"
# fleet series "in_system.<span s>.<step s>": waiting + running per pod at every step over the span
# (sizing_queries' arrival_in_system_horizon: the growth that turns the counts into arrivals)
_IN_SYSTEM_ROLE = "in_system"
# fleet series "serving.<span s>.<step s>": 1 per reporting pod at every step over the span
# (sizing_queries' prefill_serving_window: summed per step, the engines reporting)
_SERVING_ROLE = "serving"
FLEET_PREFIX = "fleet."


def _recipe(q: Query) -> tuple[str, tuple[str, ...]] | None:
    name = q.name
    if q.series_window is not None:
        span, step, scrape = q.series_window
        if name == IN_SYSTEM_SERIES:
            return ("series", (f"{_IN_SYSTEM_ROLE}.{span}.{step}",))
        if name == SERVING_SERIES:
            return ("series", (f"{_SERVING_ROLE}.{span}.{step}",))
        if name == SHED_SERIES:  # the front door's counter: this object's own series
            return ("deployment_series", (f"{_SHED_COUNTS_ROLE}.{span}.{step}.{scrape}",))
        return ("series", (f"{_COUNTS_ROLE}.{span}.{step}.{scrape}",))
    if name in _RECIPES:
        return _RECIPES[name]
    base, _, pool = name.partition(".")
    if base == "pending_kv_by_pod":  # each pool has its own series (PendingWork)
        return ("by_pod", (f"{_PENDING_ROLE}.{pool}",))
    if base == "router_in_flight_by_worker":  # over the router pods, per worker URL
        return ("by_worker", (f"{_ROUTER_ROLE}.{pool}",))
    return ("by_pod", (_BY_POD_RECIPES[base],)) if base in _BY_POD_RECIPES else None


def fleet_roles(queries: Sequence[Query], own: Sequence[str] = ()) -> set[str]:
    """The fleet series that the built-in `queries` are made of (`own`: names the object defines
    itself, spec.autoscaling.queries, which stay its own queries)."""
    roles: set[str] = set()
    for q in queries:
        r = _recipe(q)
        if r is not None and q.name not in own:
            roles.update(r[1])
    return roles


def _fleet_promql(p: Preset, role: str, ns: str, window_s: int, short_window_s: int | None) -> str | None:
    w = f"{int(window_s)}s"

    def rate(metric: str | None, window: str = w) -> str | None:
        return f"sum by (namespace, pod) (rate({metric}{{{ns}}}[{window}]))" if metric else None

    def buckets(metric: str) -> str:
        return f"sum by (namespace, pod, le) (rate({metric}_bucket{{{ns}}}[{w}]))"

    table: dict[str, str | None] = {
        "prompt_count": rate(f"{p.prompt_tokens}_count"),
        "prompt_count_short": rate(f"{p.prompt_tokens}_count", f"{int(short_window_s or 0)}s"),
        "prompt_sum": rate(f"{p.prompt_tokens}_sum"),
        "prompt_bucket": buckets(p.prompt_tokens),
        "output_sum": rate(f"{p.output_tokens}_sum"),
        "output_count": rate(f"{p.output_tokens}_count"),
        "output_bucket": buckets(p.output_tokens),
        "ttft_bucket": buckets(p.ttft),
        "queue_bucket": buckets(p.queue_time) if p.queue_time else None,
        "queue_sum": rate(f"{p.queue_time}_sum" if p.queue_time else None),
        "queue_count": rate(f"{p.queue_time}_count" if p.queue_time else None),
        "itl_sum": rate(f"{p.itl}_sum"),
        "itl_count": rate(f"{p.itl}_count"),
        "media_requests": rate(p.media_requests),
        "media_items": rate(p.media_items),
        "prefill_sum": rate(f"{p.prefill_time}_sum" if p.prefill_time else None),
        "prefill_count": rate(f"{p.prefill_time}_count" if p.prefill_time else None),
        "kv_usage": f"max by (namespace, pod) ({p.kv_usage}{{{ns}}})" if p.kv_usage else None,
        "running": f"sum by (namespace, pod) ({p.running}{{{ns}}})",
        # window averages of the KV usage and the running sequences (the observed footprint)
        "kv_usage_avg": f"max by (namespace, pod) (avg_over_time({p.kv_usage}{{{ns}}}[{w}]))"
        if p.kv_usage
        else None,
        "running_avg": f"sum by (namespace, pod) (avg_over_time({p.running}{{{ns}}}[{w}]))",
        "waiting": f"sum by (namespace, pod) ({p.waiting}{{{ns}}})",
        "sample_time": f"max by (namespace, pod) (timestamp({p.running}{{{ns}}}))",
    }
    for work in p.pending_kv:
        table[f"{_PENDING_ROLE}.{work.pool}"] = work.promql(ns, by="namespace, pod")
    for pool, _ in p.router_in_flight:
        table[f"{_ROUTER_ROLE}.{pool}"] = f"sum by (namespace, pod, worker) ({p.router_series(pool, ns)})"
    base, _, window = role.partition(".")
    if base == _COUNTS_ROLE:
        span, step, scrape = (int(x) for x in window.split("."))
        counts = arrival_counts_promql(
            f"{p.prompt_tokens}_count{{{ns}}}", " by (namespace, pod)", step, scrape
        )
        return f"({counts})[{span}s:{step}s]"
    if base == _IN_SYSTEM_ROLE:
        span, step = (int(x) for x in window.split("."))
        return f"({table['waiting']} + {table['running']})[{span}s:{step}s]"
    if base == _SERVING_ROLE:
        span, step = (int(x) for x in window.split("."))
        return f"(count by (namespace, pod) ({p.running}{{{ns}}}))[{span}s:{step}s]"
    return table.get(role)


def owners_pod_regex(deployments: Sequence[str]) -> str:
    """RE2 pattern matching the pods of every pool and of the router of the DisaggDeployments
    `deployments` (and possibly of others whose names begin the same way: a superset, which the
    split narrows per object). A pod's generated name begins with ``<name>-`` cut to
    GENERATE_NAME_BASE_MAX characters (see pod_name_regex)."""
    prefixes = sorted({_escape(generated_name_prefix(d)) for d in deployments})
    return "(?:" + "|".join(prefixes) + ").*"


def fleet_queries(
    engine: str,
    namespaces: Sequence[str],
    window_s: int,
    short_window_s: int | None,
    roles: set[str],
    deployments: Sequence[str] | None = None,
) -> list[Query]:
    """One query per fleet series in `roles`, over the pods of `namespaces` (named
    `fleet.<role>`), for the objects that share the engine and the windows. With `deployments`,
    only the pods of those DisaggDeployments are asked for (`owners_pod_regex`): a tick's
    answers then grow with the objects due in it, not with every object of the namespaces."""
    if not namespaces:
        raise ValueError("fleet queries need at least one namespace")
    p = preset(engine)
    in_namespaces = 'namespace=~"' + "|".join(sorted(set(namespaces))) + '"'
    # the pods' series are selected by pod name; the front door's counter, one per
    # DisaggDeployment, by its `deployment` label
    selector = by_object = in_namespaces
    if deployments:
        selector += f',pod=~"{owners_pod_regex(deployments)}"'
        by_object += ',deployment=~"' + "|".join(sorted({_escape(d) for d in deployments})) + '"'
    out = []
    for role in sorted(roles):
        if role.startswith(_SHED_COUNTS_ROLE + "."):
            span, step, scrape = (int(x) for x in role.split(".")[1:])
            counted = arrival_counts_promql(
                f"{METRIC_FRONT_DOOR_REJECTED}{{{by_object}}}", " by (namespace, deployment)", step, scrape
            )
            promql: str | None = f"({counted})[{span}s:{step}s]"
        elif role.startswith(_SHED_ROLE):
            window = short_window_s if role.endswith("_short") else window_s
            if not window:
                continue
            promql = f"sum by (namespace, deployment) (rate({METRIC_FRONT_DOOR_REJECTED}{{{by_object}}}[{int(window)}s]))"
        else:
            promql = _fleet_promql(p, role, selector, window_s, short_window_s)
        if promql is not None:
            out.append(Query(FLEET_PREFIX + role, promql, "fleet", required=False))
    return out


def _fmt(v: float) -> str:
    """A value as Prometheus writes it in JSON."""
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return repr(v)


def _cumulative(buckets: Sequence[tuple[float, float]]) -> tuple[list[float], list[float]] | None:
    """Upper bounds and cumulative counts, series of one bound summed and counts made
    non-decreasing (precision loss in rate()); None without a +Inf bucket or any count."""
    merged: dict[float, float] = {}
    for le, c in buckets:
        merged[le] = merged.get(le, 0.0) + c
    pts = sorted(merged.items())
    if len(pts) < 2 or not math.isinf(pts[-1][0]):
        return None
    counts = [c for _, c in pts]
    for i in range(1, len(counts)):
        counts[i] = max(counts[i], counts[i - 1])
    if counts[-1] == 0 or math.isnan(counts[-1]):
        return None
    return [le for le, _ in pts], counts


def histogram_spread(buckets: Sequence[tuple[float, float]]) -> tuple[float, float] | None:
    """(standard deviation, total count) of the values of cumulative (upper bound, count) buckets,
    each bucket's values taken at its midpoint (the first bucket's from 0, the +Inf bucket's at
    its lower bound); None when they are unreadable. Counts or rates alike, as `count_within`."""
    cum = _cumulative(buckets)
    if cum is None:
        return None
    bounds, counts = cum
    lower, below, first, second = 0.0, 0.0, 0.0, 0.0
    for le, c in zip(bounds, counts, strict=True):
        x = lower if math.isinf(le) else (lower + le) / 2.0
        share = c - below
        first += share * x
        second += share * x * x
        lower, below = (lower if math.isinf(le) else le), c
    total = counts[-1]
    mean = first / total
    return math.sqrt(max(0.0, second / total - mean * mean)), total


def histogram_quantile(q: float, buckets: Sequence[tuple[float, float]]) -> float:
    """Prometheus' histogram_quantile over cumulative (upper bound, count) buckets."""
    if math.isnan(q):
        return math.nan
    if q < 0:
        return -math.inf
    if q > 1:
        return math.inf
    cum = _cumulative(buckets)
    if cum is None:
        return math.nan
    bounds, counts = cum
    pts = list(zip(bounds, counts, strict=True))
    rank = q * counts[-1]
    b = next(i for i, c in enumerate(counts) if c >= rank)
    if b == len(pts) - 1:
        return pts[-2][0]
    if b == 0 and pts[0][0] <= 0:
        return pts[0][0]
    start, end, count = 0.0, pts[b][0], counts[b]
    if b > 0:
        start = pts[b - 1][0]
        count -= counts[b - 1]
        rank -= counts[b - 1]
    return start + (end - start) * (rank / count)


def histogram_quantile_past_first(q: float, buckets: Sequence[tuple[float, float]]) -> float:
    """`histogram_quantile`, except that a quantile inside the first bucket reads 0, that
    bucket's lower bound. The linear reading puts it anywhere between 0 and the first bound,
    which says nothing about values smaller than that bound: vLLM's queue-time histogram
    starts at 0.3 s, wider than many a TTFT miss, and waits of 0 read up to 0.3 s there."""
    cum = _cumulative(buckets)
    if cum is None or math.isnan(q) or not 0 <= q <= 1:
        return histogram_quantile(q, buckets)
    counts = cum[1]
    return 0.0 if q * counts[-1] <= counts[0] else histogram_quantile(q, buckets)


def count_within(bound: float, buckets: Sequence[tuple[float, float]]) -> tuple[float, float] | None:
    """(count at or below `bound`, total count) of cumulative (upper bound, count) buckets; None
    when they are unreadable (no +Inf bucket, no count).

    The count is the bucket at the largest upper bound not above `bound`: exact when `bound`
    is a bucket bound, otherwise a lower bound (nothing is interpolated), and 0 below the first
    bucket. Counts or rates alike: a rate() of the buckets gives (rate within, total rate)."""
    cum = _cumulative(buckets)
    if cum is None or math.isnan(bound):
        return None
    bounds, counts = cum
    within = 0.0
    for le, c in zip(bounds, counts, strict=True):
        if le > bound * (1.0 + 1e-9):
            break
        within = c
    return within, counts[-1]


def _le(text: str) -> float:
    return math.inf if text in ("+Inf", "Inf", "inf") else float(text)


class FleetAnswers(Mapping[str, Any]):
    """The answers of one batch of fleet queries (query name -> series, or the exception it
    raised), with each series indexed once by its namespace and the Deployment its pod's name
    says it belongs to. Every object of the batch splits its own series out of the same
    answers (fleet_split); with the index that costs what its own series cost, not a scan of
    the whole batch's (at hundreds of objects a tick, the scans were most of the operator's
    CPU and held its event loop for seconds)."""

    def __init__(self, results: Mapping[str, Sequence[Mapping[str, Any]] | Exception]) -> None:
        self.results = dict(results)
        # role -> ({(namespace, deployment): [(position, series)]}, {namespace: [(position, series)]})
        self._index: dict[str, tuple[dict[tuple[str, str], list], dict[str, list]]] = {}

    def __getitem__(self, name: str) -> Any:
        return self.results[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.results)

    def __len__(self) -> int:
        return len(self.results)

    def of_object(self, role: str, namespace: str, deployment: str) -> list[Mapping[str, Any]] | Exception:
        """The series of `role` labelled with this DisaggDeployment's `namespace` and `deployment`
        (a per-object series, such as the front door's counter)."""
        res = self.results.get(FLEET_PREFIX + role)
        if isinstance(res, Exception):
            return res
        key = "object:" + role
        if key not in self._index:
            owned: dict[tuple[str, str], list] = {}
            for position, s in enumerate(res or []):
                labels = s.get("metric") or {}
                owned.setdefault((labels.get("namespace") or "", labels.get("deployment") or ""), []).append(
                    (position, s)
                )
            self._index[key] = (owned, {})
        return [s for _, s in self._index[key][0].get((namespace, deployment), [])]

    def candidates(self, role: str, namespace: str, deployment: str) -> list[Mapping[str, Any]] | Exception:
        """The series of `role` that may be on pods of `deployment` in `namespace`, in the
        answer's order: a superset the caller narrows with pod_name_regex. A pod name that
        Kubernetes did not cut is ``<deployment>-<hash>-<random>``, so dropping its last two
        segments names its Deployment; a name long enough to have been cut is a candidate for
        every Deployment of its namespace."""
        res = self.results.get(FLEET_PREFIX + role)
        if isinstance(res, Exception):
            return res
        if role not in self._index:
            owned: dict[tuple[str, str], list] = {}
            long: dict[str, list] = {}
            for position, s in enumerate(res or []):
                labels = s.get("metric") or {}
                pod, ns = labels.get("pod") or "", labels.get("namespace") or ""
                if len(pod) >= GENERATE_NAME_BASE_MAX + GENERATE_NAME_RANDOM:
                    long.setdefault(ns, []).append((position, s))
                elif pod.count("-") >= 2:
                    owned.setdefault((ns, pod.rsplit("-", 2)[0]), []).append((position, s))
            self._index[role] = (owned, long)
        owned, long = self._index[role]
        found = owned.get((namespace, deployment), [])
        cut = long.get(namespace)
        if cut:
            found = sorted(found + cut, key=lambda item: item[0])
        return [s for _, s in found]


def fleet_split(
    results: Mapping[str, Sequence[Mapping[str, Any]] | Exception],
    queries: Sequence[Query],
    namespace: str,
    deployment: str,
    percentile: float,
    own: Sequence[str] = (),
    router_deployment: str | None = None,
) -> dict[str, Sequence[Mapping[str, Any]] | Exception]:
    """The answers of this object's built-in `queries` (except `own`), rebuilt from the fleet
    series in `results` (see fleet_queries). A failed fleet query fails every answer made of it;
    a malformed series is left out (its answer is then missing, never zero). The router's
    per-worker counts are split by the pods of `router_deployment` (as build_queries was given
    it; None leaves them to the object's own queries)."""
    out: dict[str, Sequence[Mapping[str, Any]] | Exception] = {}
    answers = results if isinstance(results, FleetAnswers) else FleetAnswers(results)
    pattern_of: dict[str, re.Pattern[str]] = {}

    def pool_series(role: str, pods_of: str) -> list[Mapping[str, Any]] | Exception:
        """The fleet series of `role` on this namespace's pods of the Deployment `pods_of`."""
        candidates = answers.candidates(role, namespace, pods_of)
        if isinstance(candidates, Exception):
            return candidates
        if pods_of not in pattern_of:
            pattern_of[pods_of] = promql_pattern(pod_name_regex(pods_of))
        pat = pattern_of[pods_of]
        prefix = generated_name_prefix(pods_of)  # a cheap test before the pattern's
        return [
            s
            for s in candidates
            if (pod := (s.get("metric") or {}).get("pod") or "").startswith(prefix)
            and (s.get("metric") or {}).get("namespace") == namespace
            and pat.fullmatch(pod)
        ]

    def num(s: Mapping[str, Any]) -> float | None:
        try:
            return float(s["value"][1])
        except (KeyError, IndexError, TypeError, ValueError):
            return None

    def stamp(series: Sequence[Mapping[str, Any]]) -> Any:
        return series[0]["value"][0]

    def total(series: Sequence[Mapping[str, Any]]) -> float:
        return math.fsum(v for s in series if (v := num(s)) is not None)

    def per_step(series: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """Range-vector series summed per step into one (none without a point)."""
        at: dict[Any, list[float]] = {}
        for s in series:
            for point in s.get("values") or []:
                try:
                    at.setdefault(point[0], []).append(float(point[1]))
                except (IndexError, TypeError, ValueError):
                    continue  # a malformed point is left out
        return [{"metric": {}, "values": [[t, _fmt(math.fsum(at[t]))] for t in sorted(at)]}] if at else []

    for q in queries:
        recipe = _recipe(q)
        if recipe is None or q.name in own:
            continue
        how, roles = recipe
        if how == "by_worker" and not router_deployment:
            continue
        if how in ("deployment_sum", "deployment_series"):  # this object's own series, summed
            mine = answers.of_object(roles[0], namespace, deployment)
            if isinstance(mine, Exception) or not mine:
                out[q.name] = mine
            elif how == "deployment_series":
                out[q.name] = per_step(mine)
            else:
                out[q.name] = [{"metric": {}, "value": [stamp(mine), _fmt(total(mine))]}]
            continue
        pods_of = router_deployment if how == "by_worker" else f"{deployment}-{q.pool or ''}"
        assert pods_of is not None
        parts = [pool_series(r, pods_of) for r in roles]
        failed = next((x for x in parts if isinstance(x, Exception)), None)
        if failed is not None:
            out[q.name] = failed
            continue
        series = [x for x in parts if not isinstance(x, Exception)]
        if any(not s for s in series):
            out[q.name] = []  # an aggregation over nothing answers nothing
            continue
        first = series[0]
        if how == "sum":
            out[q.name] = [{"metric": {}, "value": [stamp(first), _fmt(total(first))]}]
        elif how == "max":
            vals = [v for s in first if (v := num(s)) is not None]
            out[q.name] = [{"metric": {}, "value": [stamp(first), _fmt(max(vals))]}] if vals else []
        elif how == "ratio":
            a, b = total(series[0]), total(series[1])
            v = a / b if b else (math.nan if a == 0 else math.copysign(math.inf, a))
            out[q.name] = [{"metric": {}, "value": [stamp(first), _fmt(v)]}]
        elif how == "by_worker":  # summed over the router replicas, as `sum by (worker)`
            workers: dict[str, float] = {}
            for s in first:
                worker, v = (s.get("metric") or {}).get("worker"), num(s)
                if worker and v is not None:
                    workers[worker] = workers.get(worker, 0.0) + v
            out[q.name] = [
                {"metric": {"worker": w}, "value": [stamp(first), _fmt(v)]} for w, v in workers.items()
            ]
        elif how == "series":  # a subquery's points summed per step over the pods, as `sum`
            out[q.name] = per_step(first)
        elif how == "by_pod":
            pods = {s["metric"]["pod"]: v for s in first if (v := num(s)) is not None}  # one per pod
            out[q.name] = [
                {"metric": {"pod": pod}, "value": [stamp(first), _fmt(v)]} for pod, v in pods.items()
            ]
        else:  # buckets, quantile: summed by le
            by_le: dict[str, float] = {}
            for s in first:
                le, v = (s.get("metric") or {}).get("le"), num(s)
                if le is not None and v is not None:
                    by_le[le] = by_le.get(le, 0.0) + v
            if how == "buckets":
                out[q.name] = [
                    {"metric": {"le": le}, "value": [stamp(first), _fmt(v)]} for le, v in by_le.items()
                ]
            else:
                pts = [(_le(le), v) for le, v in by_le.items()]
                out[q.name] = (
                    [{"metric": {}, "value": [stamp(first), _fmt(histogram_quantile(percentile, pts))]}]
                    if pts
                    else []
                )
    return out
