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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any


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
    pending_kv: str | None  # gauge per prefill pod: KV sends not yet acknowledged
    kv_transfer: str | None  # histogram, seconds
    kv_usage: str | None  # gauge, fraction 0..1
    prefill_time: str | None = None  # histogram, seconds of prefill per request (for calibration)


VLLM = Preset(
    engine="vllm",
    prompt_tokens="vllm:request_prompt_tokens",
    output_tokens="vllm:request_generation_tokens",
    ttft="vllm:time_to_first_token_seconds",
    itl="vllm:inter_token_latency_seconds",
    running="vllm:num_requests_running",
    waiting="vllm:num_requests_waiting",
    # vLLM has no per-pod gauge of pending NIXL sends; the emulator exports this name and a
    # sidecar can too. Override with spec.autoscaling.queries.pendingKvSends.
    pending_kv="disagg_emulator_pending_kv_sends",
    kv_transfer="vllm:nixl_xfer_time_seconds",
    kv_usage="vllm:kv_cache_usage_perc",
    prefill_time="vllm:request_prefill_time_seconds",
)

SGLANG = Preset(
    engine="sglang",
    prompt_tokens="sglang:prompt_tokens_histogram",
    output_tokens="sglang:generation_tokens_histogram",
    ttft="sglang:time_to_first_token_seconds",
    itl="sglang:inter_token_latency_seconds",
    running="sglang:num_running_reqs",
    waiting="sglang:num_queue_reqs",
    pending_kv="sglang:num_prefill_inflight_queue_reqs",
    kv_transfer=None,
    kv_usage="sglang:token_usage",
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
    kind: str  # "scalar" | "by_pod" | "buckets"
    required: bool = True
    pool: str | None = None


def front_pool(pools: Sequence[str]) -> str:
    return "prefill" if "prefill" in pools else ("colocated" if "colocated" in pools else pools[0])


def back_pool(pools: Sequence[str]) -> str:
    return "decode" if "decode" in pools else ("colocated" if "colocated" in pools else pools[-1])


def build_queries(
    engine: str,
    namespace: str,
    deployment: str,
    pools: Sequence[str],
    window_s: int,
    percentile: float,
    custom: Mapping[str, str] | None = None,
    short_window_s: int | None = None,
) -> list[Query]:
    """Every query one autoscaling step needs. `custom` overrides a query by name.

    `short_window_s` adds `arrival_rps_short`, the rate over a few scrapes only, so a real
    step up is seen before the main window catches up.
    """
    p = preset(engine)
    w = f"{int(window_s)}s"
    front, back = front_pool(pools), back_pool(pools)
    fs, bs = pool_selector(namespace, deployment, front), pool_selector(namespace, deployment, back)
    q: list[Query] = [
        Query("arrival_rps", f"sum(rate({p.prompt_tokens}_count{{{fs}}}[{w}]))", "scalar", pool=front),
        Query(
            "prompt_tokens_mean",
            f"sum(rate({p.prompt_tokens}_sum{{{fs}}}[{w}])) / sum(rate({p.prompt_tokens}_count{{{fs}}}[{w}]))",
            "scalar",
            required=False,
            pool=front,
        ),
        Query(
            "prompt_tokens_buckets",
            f"sum by (le) (rate({p.prompt_tokens}_bucket{{{fs}}}[{w}]))",
            "buckets",
            required=False,
            pool=front,
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
    if short_window_s:
        q.append(
            Query(
                "arrival_rps_short",
                f"sum(rate({p.prompt_tokens}_count{{{fs}}}[{int(short_window_s)}s]))",
                "scalar",
                required=False,
                pool=front,
            )
        )
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
    if p.pending_kv and "prefill" in pools:
        sel = pool_selector(namespace, deployment, "prefill")
        q.append(
            Query(
                "pending_kv_by_pod.prefill",
                f"sum by (pod) ({p.pending_kv}{{{sel}}})",
                "by_pod",
                required=False,
                pool="prefill",
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
    if custom:
        names = {x.name for x in q}
        for name, promql in custom.items():
            if name in names:
                q = [Query(x.name, promql, x.kind, x.required, x.pool) if x.name == name else x for x in q]
            else:
                q.append(Query(name, promql, "scalar", required=False))
    return q


class QueryFailed(Exception):
    """A Prometheus query that gave no answer, with a short message that is safe to show.

    The message is built from fixed text and the HTTP status code only: a reply's body (which
    whoever runs the endpoint controls) never reaches the object's status or its Events.
    """


class MetricError(ValueError):
    """A value that must be treated as missing."""

    def __init__(self, name: str, kind: str, detail: str) -> None:
        super().__init__(f"{name}: {detail}")
        self.name = name
        self.kind = kind  # missing | nan | inf | negative | multiple | stale | invalid


def _value(sample: Mapping[str, Any], name: str) -> float:
    try:
        v = float(sample["value"][1])
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        raise MetricError(name, "invalid", f"malformed sample {sample!r}") from exc
    if math.isnan(v):
        raise MetricError(name, "nan", "value is NaN")
    if math.isinf(v):
        raise MetricError(name, "inf", "value is infinite")
    if v < 0:
        raise MetricError(name, "negative", f"value {v} is negative")
    return v


def parse_scalar(result: Sequence[Mapping[str, Any]] | None, name: str) -> float:
    """Exactly one finite, non-negative sample."""
    if not result:
        raise MetricError(name, "missing", "empty result")
    if len(result) > 1:
        raise MetricError(name, "multiple", f"{len(result)} series where one was expected")
    return _value(result[0], name)


def parse_by_pod(result: Sequence[Mapping[str, Any]] | None, name: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for s in result or []:
        pod = (s.get("metric") or {}).get("pod")
        if not pod:
            raise MetricError(name, "invalid", "a series without a pod label")
        if pod in out:
            raise MetricError(name, "multiple", f"several series for pod {pod}")
        out[pod] = _value(s, name)
    return out


def parse_buckets(result: Sequence[Mapping[str, Any]] | None, name: str) -> tuple[float, float]:
    """Mean and standard deviation estimated from cumulative histogram bucket rates."""
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
    return mean, math.sqrt(var)


@dataclass
class Snapshot:
    """What one scrape of Prometheus says about one DisaggDeployment."""

    time: float
    values: dict[str, float] = field(default_factory=dict)
    spreads: dict[str, float] = field(default_factory=dict)
    by_pod: dict[str, dict[str, float]] = field(default_factory=dict)  # e.g. "in_flight.prefill" -> {pod: n}
    problems: list[MetricError] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def reason(self) -> str:
        return "; ".join(str(p) for p in self.problems[:5]) or "all metrics present and fresh"

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
                mean, std = parse_buckets(res, q.name)
                base = q.name.removesuffix("_buckets")
                snap.values.setdefault(f"{base}_mean", mean)
                snap.spreads[f"{base}_std"] = std
            else:
                snap.by_pod[q.name] = parse_by_pod(res, q.name)
        except MetricError as err:
            if q.required:
                snap.problems.append(err)
    # Freshness and completeness per pool: every routable pod must have a recent sample.
    for pool, pods in routable_pods.items():
        times = snap.by_pod.get(f"sample_time_by_pod.{pool}", {})
        for pod in pods:
            t = times.get(pod)
            if t is None:
                snap.problems.append(MetricError(f"{pool}/{pod}", "missing", "pod reports no metrics"))
            elif now - t > max_age:
                snap.problems.append(
                    MetricError(
                        f"{pool}/{pod}", "stale", f"last sample {now - t:.1f} s old (max {max_age:.0f} s)"
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
            )
        )
    return snap


def pod_in_flight_fresh(snap: Snapshot, pool: str, pod: str, scrape_interval_s: float) -> float | None:
    """In-flight work of one pod, or None when its sample is missing or stale (never read as zero)."""
    t = snap.by_pod.get(f"sample_time_by_pod.{pool}", {}).get(pod)
    if t is None or snap.time - t > 2 * scrape_interval_s:
        return None
    return snap.in_flight(pool).get(pod, None)
