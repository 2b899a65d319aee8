"""The autoscaler's executor: read, decide (disagg.autoscaler), apply, report.

One asyncio task of the operator looks at every DisaggDeployment once a second, in memory:
the objects, their pool Deployments and their pods come from the watch cache
(disagg.cache, fed by the operator's watches), so a tick sends no request. Each object
decides when it is next due (`spec.autoscaling.intervalSeconds`, first due at a phase drawn
from its uid, so objects created together spread over the interval); drains in progress
advance every tick, apart from the decisions. Due work runs as one task per object, so a
slow object (or a reconcile holding its lock) delays no other; at most
`LoopOptions.concurrency` of them write to the API server at once (`WriteSlot`). Kopf
timers are not used because they put a finalizer on every object (deleting one would then
wait for the operator).

Per decision: read the pool Deployments, the pods and Prometheus into an
`autoscaler.Observation`, call `autoscaler.decide`, then apply its outcome
(re-admit drained pods, grow within the GPU budget, start drains) and write
the status (conditions, `lastDecision`, `calibration`, `scalerState`) and an
Event when the targets change.

Everything that survives a restart lives in the cluster: drain records on the
pods, the scaler's memory (stabilization window, calibration samples, token
shape, start-up times) in `status.scalerState`, read back the first time the
loop sees the object.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import time
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple, Protocol

from pydantic import ValidationError

from disagg import (
    api,
    autoscaler,
    builders,
    drain,
    metrics,
    names,
    opmetrics,
    reconcile,
    routerclient,
    shard,
    status,
)
from disagg.cache import POOL_CHILD_KINDS, CachedKube, WatchCache
from disagg.kube import Kube, NotFound
from disagg.policy import PolicyState
from disagg.promclient import client_for
from disagg.sizes import SizeDistribution

log = logging.getLogger("disagg.loop")

#: A drain handed to the ReplicaSet whose pod is still there after this long took the wrong pod.
WRONG_VICTIM_AFTER_S = 30.0


#: Steps of the loop writing to the API server at once (a decision's writes, a drain's).
DEFAULT_CONCURRENCY = names.DECISIONS_AT_ONCE

#: `status.scalerState` is rewritten at least this often while the object is decided, even when
#: nothing a restart decides from changed (`state_write_reason`): it bounds what a restart loses
#: of the slowly accumulating parts (calibration samples, start-up figures, token shape, the
#: forecast's rate samples) to this long, at one write per object per this long.
SCALER_STATE_REFRESH_S = 300.0

#: `status.lastDecision` is rewritten when the reason, the planned sizes, the targets, the next
#: step or a condition change, or when the arrival rate moves by more than this share and by more than
#: the measurement's own noise (`rate_moved`).
LAST_DECISION_RATE_TOLERANCE = 0.1

#: How many standard deviations of the windowed rate's sampling noise a move of the rate must
#: exceed to be written: a rate measured over a short window moves by more than 10 % from one
#: decision to the next under any real load (a few requests a second are a few dozen arrivals a
#: window), which would otherwise cost a status write per decision.
RATE_NOISE_SIGMAS = 3.0


class MetricsSource(Protocol):
    async def run(self, queries: list[metrics.Query]) -> dict[str, Any]: ...


@dataclass
class Tracker:
    """In-memory state of one DisaggDeployment (the object's uid tells a recreated one apart)."""

    uid: str | None
    state: autoscaler.ScalerState = field(default_factory=autoscaler.ScalerState)
    last_decision_at: float = 0.0
    last_snapshot: metrics.Snapshot | None = None
    last_outcome: autoscaler.Outcome | None = None
    metrics_ok: bool | None = None
    # When the next decision is due (None: not scheduled yet), set by `tick`.
    next_due: float | None = None
    # The parsed spec of generation `spec_generation` (parsing every object every tick is costly).
    spec_generation: int | None = None
    spec: api.DisaggDeploymentSpec | None = None
    # The policy state last written to (or read back from) status.scalerState, and when.
    saved_policy: PolicyState | None = None
    saved_at: float | None = None
    # Read back from status.scalerState and not yet extended to the restart (`extend_restored`).
    restored: bool = False


@dataclass
class LoopOptions:
    tick_s: float = 1.0
    prometheus_url: str | None = None
    namespaces: tuple[str, ...] = ()
    # Label selector of this operator's shard (disagg.shard); None: every DisaggDeployment.
    shard_selector: str | None = None
    # Where metrics come from; None: the Prometheus of the spec or of --prometheus-url.
    metrics_source: MetricsSource | None = None
    # Pools and pods from the operator's watches; None: LIST them (tools and tests without one).
    cache: WatchCache | None = None
    # Objects stepped at once (each in its own task).
    concurrency: int = DEFAULT_CONCURRENCY
    # One query per metric per tick for all due objects sharing the operator's Prometheus
    # (metrics.fleet_queries), instead of each object's own.
    fleet_queries: bool = True


TRACKERS: dict[tuple[str, str], Tracker] = {}


def tracker(body: Mapping[str, Any]) -> Tracker:
    """The tracker of this object; on first sight (or for a recreated object) its state is read
    back from `status.scalerState`."""
    meta = body["metadata"]
    key = (meta["namespace"], meta["name"])
    tr = TRACKERS.get(key)
    if tr is None or tr.uid != meta.get("uid"):
        saved = (body.get("status") or {}).get("scalerState")
        state = autoscaler.ScalerState.from_dict(saved)
        tr = Tracker(uid=meta.get("uid"), state=state)
        if saved is not None:
            tr.saved_policy, tr.restored = state.policy, True
        TRACKERS[key] = tr
    return tr


def extend_restored(tr: Tracker, now: float) -> None:
    """After a restart: the recommendation read back from status.scalerState held until just now.

    The loop writes scalerState whenever the recommendation changes (`state_write_reason`), so
    every decision since the last write recommended exactly the last recommendation on record;
    only their times are missing. The stabilization window reads the latest time of each value,
    so the read-back history gets that recommendation once more, just before the restart's first
    decision. A scale-down it holds may then come at most one interval (plus the downtime) later
    than without the restart, never earlier."""
    if not tr.restored:
        return
    tr.restored = False
    pol = tr.state.policy
    if not pol.recommendations:
        return
    last_t, last_rec = pol.recommendations[-1]
    at = math.nextafter(now, -math.inf)
    if at > last_t:
        pol = replace(pol, recommendations=(*pol.recommendations, (at, dict(last_rec))))
        tr.state = replace(tr.state, policy=pol)


def state_write_reason(tr: Tracker, new: PolicyState, now: float) -> str | None:
    """Why this decision writes status.scalerState, or None: a steady object writes nothing.

    Written when what a restarted operator would decide from it changed: the latest
    recommendation (a restart extends it to the restart: `extend_restored`), the start of the
    stabilization window (`firstSeen`), the last action and its targets, a new backlog-driven
    recommendation (the window skips those later); and at least every SCALER_STATE_REFRESH_S
    for the rest (calibration samples, start-ups, shape, rate samples, the front load gain)."""
    old = tr.saved_policy
    if old is None or tr.saved_at is None:
        return "first decision"
    latest = new.recommendations[-1][1] if new.recommendations else None
    latest_saved = old.recommendations[-1][1] if old.recommendations else None
    if latest != latest_saved:
        return "recommendation changed"
    if (new.first_seen, new.last_action, new.last_targets) != (
        old.first_seen,
        old.last_action,
        old.last_targets,
    ):
        return "action or window start changed"
    if new.backlog_times and max(new.backlog_times) > max(old.backlog_times, default=-math.inf):
        return "backlog-driven recommendation"
    if now - tr.saved_at >= SCALER_STATE_REFRESH_S:
        return "refresh"
    return None


def forget(namespace: str, name: str) -> None:
    """Drop everything held in memory for a DisaggDeployment that is gone."""
    TRACKERS.pop((namespace, name), None)
    reconcile.forget(namespace, name)


def prune(live: set[tuple[str, str]], namespaces: tuple[str, ...] = ()) -> None:
    """Forget the objects (of the watched namespaces) that are not in `live`."""
    known = set(TRACKERS) | set(reconcile.DESIRED)
    for ns, name in known - live:
        if not namespaces or ns in namespaces:
            forget(ns, name)


# ---------------------------------------------------------------------------- reading


def pool_pods(pods: list[dict], pool: str) -> list[dict]:
    return [p for p in pods if (p["metadata"].get("labels") or {}).get(names.LABEL_POOL) == pool]


def routable(pod: Mapping[str, Any]) -> bool:
    return drain.pod_view(pod).routable


def observation(
    config: autoscaler.Config,
    snap: metrics.Snapshot,
    deployments: Mapping[str, dict],
    pods: list[dict],
    now: float,
    sizing: SizingReadings | None = None,
) -> autoscaler.Observation:
    """The decision's view of one DisaggDeployment: the snapshot, its pools, the time,
    and the optional issue-14 readings (`sizing_readings`)."""
    v = snap.values
    sz = sizing or SizingReadings()

    def val(key: str) -> float | None:
        x = v.get(key)
        return x if x is not None and math.isfinite(x) else None

    arrival = metrics.arrival_pool(config.pools, config.planning.placement)
    waiting, running = val(f"queue.{arrival}"), val(f"running.{arrival}")
    return autoscaler.Observation(
        now=now,
        metrics_ok=snap.ok,
        metrics_problem="" if snap.ok else snap.reason(),
        pools={p: autoscaler.pool_observation(deployments.get(p), pool_pods(pods, p)) for p in config.pools},
        arrival_rps=val("arrival_rps"),
        arrival_rps_short=val("arrival_rps_short"),
        shed_rps=val("shed_rps"),
        shed_rps_short=val("shed_rps_short"),
        prompt_tokens_mean=val("prompt_tokens_mean"),
        prompt_tokens_std=snap.spreads.get("prompt_tokens_std"),
        output_tokens_mean=val("output_tokens_mean"),
        output_tokens_std=snap.spreads.get("output_tokens_std"),
        output_finished_rps=val("output_tokens_count_rate"),
        queued={p: v[f"queue.{p}"] for p in config.pools if f"queue.{p}" in v},
        running={p: v[f"running.{p}"] for p in config.pools if f"running.{p}" in v},
        arrival_pool_in_system=None if waiting is None or running is None else waiting + running,
        kv_usage_sum=val("kv_usage_sum"),
        kv_running=val("kv_running_avg"),
        in_flight={p: dict(snap.in_flight(p)) for p in config.pools},
        ttft_observed_s=val("ttft_p"),
        itl_observed_s=val("itl_mean"),
        prefill_time_mean_s=val("prefill_time_mean"),
        media_fraction=metrics.media_fraction(v),
        media_items_per_request=metrics.media_items_per_request(v),
        custom={k: v[k] for k in config.custom_queries if val(k) is not None},
        startups=autoscaler.startup_seconds(pods),
        sizes=sz.sizes,
        arrival_counts=sz.arrival_counts,
        count_interval_s=sz.count_interval_s if sz.arrival_counts else None,
        arrival_counts_growth=sz.arrival_counts_growth if sz.arrival_counts else None,
        arrival_counts_shed=sz.arrival_counts_shed if sz.arrival_counts else None,
        ttft_buckets=sz.ttft_buckets,
        prefill_wait_buckets=sz.prefill_wait_buckets,
        prefill_wait_mean_s=sz.prefill_wait_mean_s,
        prefill_serving_min=sz.prefill_serving_min,
    )


@dataclass(frozen=True)
class SizingReadings:
    """The optional issue-14 inputs read from Prometheus; None where missing or unusable."""

    sizes: SizeDistribution | None = None
    arrival_counts: tuple[float, ...] | None = None
    count_interval_s: float | None = None
    problems: tuple[str, ...] = ()
    ttft_buckets: tuple[tuple[float, float], ...] | None = None  # cumulative (le, rate), with the sizes
    prefill_wait_buckets: tuple[tuple[float, float], ...] | None = None  # likewise, the front pool's queue
    # per count, the growth of the counted pool's uncounted requests over its sub-window (None: unknown)
    arrival_counts_growth: tuple[float | None, ...] | None = None
    # per count, the requests the front door shed in its sub-window (None: unknown)
    arrival_counts_shed: tuple[float | None, ...] | None = None
    # the front pool's mean queue wait over the window, and the fewest of its engines reporting
    # at the window's scrapes
    prefill_wait_mean_s: float | None = None
    prefill_serving_min: float | None = None


def sizing_query_list(spec: api.DisaggDeploymentSpec, namespace: str, name: str) -> list[metrics.Query]:
    """The queries the spec's `autoscaling.sizing` switches need (none when all are off)."""
    sz, a = spec.autoscaling.sizing, spec.autoscaling
    if not sz.reads_any:
        return []
    count_s = autoscaler.COUNT_SCRAPES * a.scrape_interval_seconds
    horizon = autoscaler.BURST_HORIZON_S if sz.auto_headroom else autoscaler.DISPERSION_SPAN_S
    qs = metrics.sizing_queries(
        spec.engine,
        namespace,
        name,
        api.pool_names(spec),
        a.metric_window_seconds,
        count_s,
        horizon_s=int(horizon),
        scrape_s=a.scrape_interval_seconds,
        placement=spec.placement.mode,
    )
    keep = set()
    if sz.reads_histograms:
        keep |= {
            "prompt_tokens_histogram",
            "prompt_tokens_sum_rate",
            "output_tokens_histogram",
            "output_tokens_sum_rate",
            "ttft_histogram",
            "prefill_queue_histogram",
        }
    if sz.burstiness or sz.auto_headroom:
        keep |= {"arrival_counts_horizon", metrics.IN_SYSTEM_SERIES, metrics.SHED_SERIES}
    if sz.burstiness:
        keep |= {"prefill_queue_mean", metrics.SERVING_SERIES}
    return [q for q in qs if q.name in keep]


def sizing_readings(results: Mapping[str, Any], count_interval_s: float) -> SizingReadings:
    """Parse the sizing queries' answers; a failed or unusable query is missing, never zero."""
    problems: list[str] = []

    def ok(name: str) -> Any:
        r = results.get(name)
        if r is None or isinstance(r, Exception):
            if r is not None:
                problems.append(f"{name}: {r}")
            return None
        return r

    sizes = None
    prompt, output = ok("prompt_tokens_histogram"), ok("output_tokens_histogram")
    if prompt is not None and output is not None:

        def total(name: str) -> float | None:
            r = ok(name)
            try:
                return metrics.parse_scalar(r, name) if r is not None else None
            except metrics.MetricError:
                return None

        try:
            sizes = metrics.size_distribution(
                prompt, output, total("prompt_tokens_sum_rate"), total("output_tokens_sum_rate")
            )
        except metrics.MetricError as exc:
            problems.append(str(exc))

    def beside_sizes(name: str) -> tuple[tuple[float, float], ...] | None:
        """A histogram read beside the sizes it is judged with (none without them)."""
        raw = ok(name)
        if sizes is None or raw is None:
            return None
        try:
            return tuple(metrics.parse_histogram(raw, name))
        except metrics.MetricError as exc:
            problems.append(str(exc))
            return None

    ttft_buckets = beside_sizes("ttft_histogram")
    wait_buckets = beside_sizes("prefill_queue_histogram")
    counts = growth = None
    raw = ok("arrival_counts_horizon")
    if raw is not None:
        try:
            points = metrics.parse_series_points(raw, "arrival_counts_horizon")
            times = [t for t, _ in points]
            counts = tuple(v for _, v in points) or None
        except metrics.MetricError as exc:
            problems.append(str(exc))
    raw = ok(metrics.IN_SYSTEM_SERIES) if counts else None
    if raw is not None:
        try:
            in_system = metrics.parse_series_points(raw, metrics.IN_SYSTEM_SERIES)
            growth = metrics.growth_over_steps(times, in_system, count_interval_s)
        except metrics.MetricError as exc:
            problems.append(str(exc))
    wait_mean = serving = None
    raw = ok("prefill_queue_mean")
    if raw:
        try:
            wait_mean = metrics.parse_scalar(raw, "prefill_queue_mean")
        except metrics.MetricError as exc:
            if exc.kind != "nan":  # 0 / 0: no request in the window, nothing to read and no fault
                problems.append(str(exc))
    raw = ok(metrics.SERVING_SERIES)
    if raw:
        try:
            serving = min(
                (v for _, v in metrics.parse_series_points(raw, metrics.SERVING_SERIES)), default=None
            )
        except metrics.MetricError as exc:
            problems.append(str(exc))
    shed = None
    raw = ok(metrics.SHED_SERIES) if counts else None
    if raw:  # no series: the front door has shed nothing
        try:
            shed = metrics.values_at(times, metrics.parse_series_points(raw, metrics.SHED_SERIES))
        except metrics.MetricError as exc:
            problems.append(str(exc))
    return SizingReadings(
        sizes,
        counts,
        float(count_interval_s) if counts else None,
        tuple(problems),
        ttft_buckets,
        wait_buckets,
        growth,
        shed,
        wait_mean,
        serving,
    )


async def read_sizing(
    kube: Kube,
    body: Mapping[str, Any],
    spec: api.DisaggDeploymentSpec,
    opts: LoopOptions,
    fleet: asyncio.Future | None = None,
) -> SizingReadings:
    """Run the sizing queries (optional: any failure is just "missing"). With `fleet` (the
    tick's fleet queries, which hold the sizing series too), they are split from it in memory."""
    meta = body["metadata"]
    queries = sizing_query_list(spec, meta["namespace"], meta["name"])
    if not queries:
        return SizingReadings()
    count_s = autoscaler.COUNT_SCRAPES * spec.autoscaling.scrape_interval_seconds
    results: dict[str, Any] = {}
    if fleet is not None:
        shared = await asyncio.shield(fleet)
        results = metrics.fleet_split(shared, queries, meta["namespace"], meta["name"], spec.slo.percentile)
    rest = [q for q in queries if q.name not in results]
    try:
        if rest:
            source = opts.metrics_source or await client_for(
                kube, meta["namespace"], spec.autoscaling.prometheus, opts.prometheus_url
            )
            results.update(await source.run(rest))
    except Exception as exc:  # optional input: the decision goes on without it
        return SizingReadings(problems=(f"sizing queries: {exc}",))
    readings = sizing_readings(results, count_s)
    for p in readings.problems:
        log.debug("%s/%s: sizing input missing: %s", meta["namespace"], meta["name"], p)
    return readings


async def snapshot(
    kube: Kube,
    body: Mapping[str, Any],
    spec: api.DisaggDeploymentSpec,
    pods: list[dict],
    opts: LoopOptions,
    now: float,
    fleet: asyncio.Future | None = None,
) -> metrics.Snapshot:
    """Read the object's metrics. With `fleet` (the tick's one query per metric for every due
    object, see `FleetBatch`), the built-in answers are split from it in memory and only the
    object's own queries (spec.autoscaling.queries) are asked separately."""
    meta = body["metadata"]
    a = spec.autoscaling
    pools = api.pool_names(spec)
    queries = object_queries(spec, meta["namespace"], meta["name"])
    need = {pool: [p["metadata"]["name"] for p in pool_pods(pods, pool) if routable(p)] for pool in pools}
    results: dict[str, Any] = {}
    if fleet is not None:
        shared = await asyncio.shield(fleet)
        own = list(a.queries or {})
        results = metrics.fleet_split(
            shared,
            queries,
            meta["namespace"],
            meta["name"],
            spec.slo.percentile,
            own=own,
            router_deployment=router_deployment(spec, meta["name"]),
        )
    rest = [q for q in queries if q.name not in results]
    if rest:
        try:
            source = opts.metrics_source or await client_for(
                kube, meta["namespace"], a.prometheus, opts.prometheus_url
            )
            results.update(await source.run(rest))
        except Exception as exc:
            results.update({q.name: exc for q in rest})
    return metrics.build_snapshot(queries, results, now, float(a.scrape_interval_seconds), need)


def object_queries(spec: api.DisaggDeploymentSpec, namespace: str, name: str) -> list[metrics.Query]:
    """Every query one decision of this object needs (disagg.metrics.build_queries)."""
    a = spec.autoscaling
    return metrics.build_queries(
        spec.engine,
        namespace,
        name,
        api.pool_names(spec),
        a.metric_window_seconds,
        spec.slo.percentile,
        a.queries,
        short_window_s=autoscaler.SHORT_WINDOW_SCRAPES * a.scrape_interval_seconds,
        placement=spec.placement.mode,
        # The router's per-worker in-flight counts, for the drains (pod_in_flight_fresh).
        router_deployment=router_deployment(spec, name),
    )


def router_deployment(spec: api.DisaggDeploymentSpec, name: str) -> str | None:
    """The Deployment of the object's router, whose pods count in-flight requests per worker
    (None when spec.router.enabled is false)."""
    return builders.router_name(name) if spec.router.enabled else None


def fleet_key(spec: api.DisaggDeploymentSpec, namespace: str) -> tuple:
    """Objects with equal keys share the tick's fleet queries: the same Prometheus, engine and
    windows. The operator's Prometheus serves every namespace; a Prometheus of the spec
    (`spec.autoscaling.prometheus`: URL, token and CA Secrets read in the object's namespace) is
    shared by the objects of one namespace that configure it identically."""
    a = spec.autoscaling
    windows = (
        spec.engine,
        a.metric_window_seconds,
        autoscaler.SHORT_WINDOW_SCRAPES * a.scrape_interval_seconds,
    )
    if a.prometheus is None:
        return (*windows, None, None)
    return (*windows, namespace, a.prometheus.model_dump_json())


#: Most characters of DisaggDeployment names one fleet batch asks for in its pod filter
#: (metrics.owners_pod_regex): the queries are GET URLs, which proxies in front of Prometheus
#: commonly cap at 8 KiB. A tick with more due objects sends one batch per this many characters.
FLEET_FILTER_MAX_CHARS = 4000


class FleetBatch:
    """The objects of one tick that share a fleet key: their namespaces and series, then one
    query per series for them all (`run`), asking only for those objects' pods, awaited by
    each object's step."""

    def __init__(self, key: tuple, prometheus: api.PrometheusConfig | None = None) -> None:
        self.key = key
        self.prometheus = prometheus  # the spec's (None: the operator's --prometheus-url)
        self.namespaces: set[str] = set()
        self.deployments: set[str] = set()
        self.filter_chars = 0
        self.roles: set[str] = set()
        self.future: asyncio.Future | None = None

    def full(self) -> bool:
        """Whether the pod filter has reached FLEET_FILTER_MAX_CHARS (the next object goes to
        another batch)."""
        return self.filter_chars >= FLEET_FILTER_MAX_CHARS

    def add(self, spec: api.DisaggDeploymentSpec, namespace: str, name: str) -> asyncio.Future:
        self.namespaces.add(namespace)
        if name not in self.deployments:
            self.deployments.add(name)
            self.filter_chars += len(name) + 2
        self.roles |= metrics.fleet_roles(
            object_queries(spec, namespace, name) + sizing_query_list(spec, namespace, name),
            own=list(spec.autoscaling.queries or {}),
        )
        if self.future is None:
            self.future = asyncio.get_running_loop().create_future()
        return self.future

    async def run(self, kube: Kube, opts: LoopOptions) -> None:
        engine, window_s, short_s, namespace, _ = self.key
        assert self.future is not None
        queries = metrics.fleet_queries(
            engine, sorted(self.namespaces), window_s, short_s, self.roles, sorted(self.deployments)
        )
        try:
            source = opts.metrics_source or await client_for(
                kube, namespace or "", self.prometheus, opts.prometheus_url
            )
            results = await source.run(queries)
        except Exception as exc:
            results = {q.name: exc for q in queries}
        if not self.future.done():
            # indexed once here, split by every object of the batch
            self.future.set_result(metrics.FleetAnswers(results))


def cached(kube: Kube, opts: LoopOptions) -> Kube:
    """`kube` reading the object and its pools from the watch cache (disagg.cache.CachedKube),
    when the loop has one: a decision then sends no GET and no LIST."""
    if opts.cache is None or isinstance(kube, (CachedKube, WriteGated)):
        return kube
    return CachedKube(kube, opts.cache)  # type: ignore[return-value]


async def read_pods(kube: Kube, opts: LoopOptions, namespace: str, name: str) -> list[dict]:
    """The object's pool pods: from the watch cache, or a LIST without one."""
    if opts.cache is not None:
        return opts.cache.children("Pod", namespace, name)
    return await kube.list("Pod", namespace, reconcile.owner_selector(name))


async def list_deployments(
    kube: Kube, namespace: str, name: str, opts: LoopOptions | None = None
) -> dict[str, dict]:
    """The object's pool Deployments by pool: from the watch cache, or a LIST without one."""
    if opts is not None and opts.cache is not None:
        found = opts.cache.children("Deployment", namespace, name)
    else:
        found = await kube.list("Deployment", namespace, reconcile.owner_selector(name))
    return {(d["metadata"].get("labels") or {}).get(names.LABEL_POOL, ""): d for d in found}


# ---------------------------------------------------------------------------- drains


#: Draining pods this process has taken out of routing (the gate False, and the worker removed
#: from the routers that ignore Ready: routerclient), with when. A drain this process did not
#: start (an operator restart) is taken out once more at its first drain step: the previous
#: process may have died between writing the drain record and calling the router, and the
#: router would go on sending the pod new requests until it is deleted; its drain then settles
#: from that moment, not from the record's start (drain.next_action's `left_routing_at`).
OUT_OF_ROUTING: dict[str, float] = {}


def _pod_key(pod: Mapping[str, Any]) -> str:
    meta = pod["metadata"]
    return meta.get("uid") or f"{meta['namespace']}/{meta['name']}"


async def take_out_of_routing(kube: Kube, pod: Mapping[str, Any], now: float) -> None:
    """The routable gate False (if it is not yet) and the worker removed from routers that ignore Ready."""
    if status.pod_condition(pod, names.READINESS_GATE) != "False":
        await reconcile.set_routable(
            kube, pod, False, names.GATE_DRAINING, "being drained by disagg-operator"
        )
    await routerclient.set_worker_routable(kube, pod, False)  # routers that ignore Ready
    OUT_OF_ROUTING[_pod_key(pod)] = now


async def set_drain(
    kube: Kube, pod: Mapping[str, Any], record: drain.DrainRecord | None, cost: str | None = None
) -> None:
    meta = pod["metadata"]
    ann: dict[str, str | None] = {names.ANNOTATION_DRAIN: record.to_annotation() if record else None}
    ann[names.ANNOTATION_DELETION_COST] = cost
    try:
        await kube.patch("Pod", meta["namespace"], meta["name"], {"metadata": {"annotations": ann}})
    except NotFound:
        return
    if record is None:
        OUT_OF_ROUTING.pop(_pod_key(pod), None)
        await reconcile.set_routable(
            kube, pod, True, names.GATE_READMITTED, "drain cancelled; routable again"
        )
        await routerclient.set_worker_routable(kube, pod, True)
    elif record.removing is not None:
        OUT_OF_ROUTING.pop(_pod_key(pod), None)  # being deleted: nothing more to remember
    elif status.pod_condition(pod, names.READINESS_GATE) != "False":
        await take_out_of_routing(kube, pod, record.since)


async def readmit(kube: Kube, body: Mapping[str, Any], pod: Mapping[str, Any], why: str) -> None:
    await set_drain(kube, pod, None)
    await kube.event(body, names.EVENT_DRAIN_CANCELLED, f"pod {pod['metadata']['name']} re-admitted: {why}")


async def start_drain(
    kube: Kube,
    body: Mapping[str, Any],
    spec: api.DisaggDeploymentSpec,
    order: autoscaler.DrainOrder,
    pod: Mapping[str, Any],
    now: float,
) -> None:
    policy = api.pools(spec)[order.pool].drain
    rec = drain.DrainRecord(now, now + policy.timeout_seconds, policy.on_timeout, idle=order.idle)
    await set_drain(kube, pod, rec)
    work = "unknown" if order.in_flight is None else f"{order.in_flight:g}"
    await kube.event(
        body,
        names.EVENT_DRAIN_STARTED,
        f"draining {order.pool} pod {order.pod} ({work} in flight); "
        f"timeout {policy.timeout_seconds}s then {policy.on_timeout}",
    )


async def drain_step(
    kube: Kube,
    body: Mapping[str, Any],
    spec: api.DisaggDeploymentSpec,
    pods: list[dict],
    snap: metrics.Snapshot,
    now: float,
    opts: LoopOptions | None = None,
) -> dict[str, int]:
    """Advance every drain of this DisaggDeployment; returns replicas removed per pool."""
    meta = body["metadata"]
    ns, name = meta["namespace"], meta["name"]
    removed: dict[str, int] = {}
    scrape = float(spec.autoscaling.scrape_interval_seconds)
    deployments = await list_deployments(kube, ns, name, opts)
    held: list[str] = []
    for pool in api.pool_names(spec):
        pp = pool_pods(pods, pool)
        draining = [p for p in pp if status.is_draining(p) and drain.is_active(p)]
        if not draining:
            continue
        victims = {p["metadata"]["name"] for p in draining}
        ready_to_remove: list[dict] = []
        for pod in draining:
            rec = drain.DrainRecord.from_pod(pod)
            assert rec is not None
            if rec.removing is None and _pod_key(pod) not in OUT_OF_ROUTING:
                await take_out_of_routing(kube, pod, now)  # a drain resumed after an operator restart
            # The router's count for this pod's worker URL (how the router names it) can only
            # lengthen the wait: pod_in_flight_fresh takes the larger of it and the engine's.
            work = metrics.pod_in_flight_fresh(
                snap, pool, pod["metadata"]["name"], scrape, worker=routerclient.worker_url(pod)
            )
            act = drain.next_action(
                pod,
                rec,
                work,
                now,
                sampled_at=snap.sampled_at(pool, pod["metadata"]["name"]),
                left_routing_at=OUT_OF_ROUTING.get(_pod_key(pod)),
            )
            if act.action == "verify":
                if now - (rec.removing or 0) > WRONG_VICTIM_AFTER_S:
                    # The ReplicaSet removed another pod (or none): this one is needed again.
                    await set_drain(kube, pod, None)
                    await kube.event(
                        body,
                        names.EVENT_WRONG_VICTIM,
                        f"pod {act.pod} was not removed by its ReplicaSet within "
                        f"{WRONG_VICTIM_AFTER_S:g} s; re-admitted",
                        type_="Warning",
                    )
                continue
            if act.action == "hold":
                held.append(f"{pool}/{act.pod}")
                continue
            if act.action == "readmit":
                await set_drain(kube, pod, None)
                await kube.event(
                    body, names.EVENT_DRAIN_TIMEOUT, f"{pool} pod {act.pod}: {act.detail}", type_="Warning"
                )
                opmetrics.DRAINS.labels(ns, name, pool, "timeout_readmit").inc()
                continue
            if act.action in ("remove", "timeout_proceed"):
                if act.action == "timeout_proceed":
                    await kube.event(
                        body,
                        names.EVENT_DRAIN_TIMEOUT,
                        f"{pool} pod {act.pod}: {act.detail}",
                        type_="Warning",
                    )
                ready_to_remove.append(pod)
        if not ready_to_remove:
            continue
        if drain.rolling_out(pp):
            continue  # the drained pods wait (unroutable, idle) until one ReplicaSet is left
        companions = drain.pending_companions(pp, victims)
        dep = deployments.get(pool)
        if dep is None:
            continue
        for pod in ready_to_remove:
            rec = drain.DrainRecord.from_pod(pod)
            assert rec is not None
            await set_drain(
                kube,
                pod,
                drain.DrainRecord(rec.since, rec.deadline, rec.on_timeout, removing=now),
                cost=drain.MIN_DELETION_COST,
            )
            outcome = "completed" if rec.deadline > now else "timeout_proceed"
            opmetrics.DRAINS.labels(ns, name, pool, outcome).inc()
            await kube.event(
                body,
                names.EVENT_DRAIN_COMPLETED,
                f"{pool} pod {pod['metadata']['name']} drained after {now - rec.since:.1f}s; removing it",
            )
        current = int(dep["spec"].get("replicas", 0))
        new = max(current - len(ready_to_remove) - len(companions), api.pools(spec)[pool].min_replicas)
        if companions:
            await kube.event(
                body,
                names.EVENT_PENDING_PODS_REMOVED,
                f"{pool}: {len(companions)} pending pod(s) removed with the drained ones "
                f"({', '.join(companions)}): the ReplicaSet deletes pending pods first",
            )
        if new < current:
            removed[pool] = current - new
            fresh = await kube.get(api.KIND, ns, name)
            await reconcile.reconcile(kube, fresh, replicas={pool: new})
    await report_held_drains(kube, body, held)
    return removed


async def report_held_drains(kube: Kube, body: Mapping[str, Any], held: list[str]) -> None:
    """`DrainHeld` while a timed-out drain waits for its pod's work to be known (an Event when
    the set of held pods changes); False again once none is held."""
    old = next(
        (c for c in (body.get("status") or {}).get("conditions") or [] if c["type"] == names.COND_DRAIN_HELD),
        None,
    )
    if not held and (old is None or old.get("status") != "True"):
        return  # never held: no condition at all
    message = (
        "drain timed out and the pods' in-flight work is unknown (no fresh metrics); held until "
        "the metrics return: " + ", ".join(sorted(held))
        if held
        else "no drain is held"
    )[:1000]
    cond = status.condition(
        names.COND_DRAIN_HELD, bool(held), "WorkUnknown" if held else "NoneHeld", message, None
    )
    if old is not None and old.get("status") == cond["status"] and old.get("message") == message:
        return
    fresh = await kube.get(api.KIND, body["metadata"]["namespace"], body["metadata"]["name"])
    conds = status.merge_conditions((fresh.get("status") or {}).get("conditions"), [cond])
    await reconcile.write_status(kube, fresh, {"conditions": conds})
    if held:
        await kube.event(body, names.EVENT_DRAIN_HELD, message, type_="Warning", action="Drain")


async def cancel_all_drains(kube: Kube, body: Mapping[str, Any], pods: list[dict], why: str) -> None:
    for pod in pods:
        if status.is_draining(pod) and drain.is_active(pod):
            rec = drain.DrainRecord.from_pod(pod)
            if rec and rec.removing is None:
                await readmit(kube, body, pod, why)


# ---------------------------------------------------------------------------- applying and reporting


class Deferred(NamedTuple):
    """What the reconcile of a growing decision left to the decision to write (`apply`)."""

    status: dict[str, Any] | None  # its status fields (pools, ratio, its conditions)
    events: list[tuple[str, str]]  # its pool Events, (reason, message): the decision's Event names them


async def apply(
    kube: Kube,
    body: Mapping[str, Any],
    spec: api.DisaggDeploymentSpec,
    pods: list[dict],
    outcome: autoscaler.Outcome,
    now: float,
) -> Deferred | None:
    """Carry out a decision: re-admit drained pods, grow within the budget, start drains.

    Returns what a growing decision's reconcile left unwritten (its status: pools and
    conditions; its pool Events), which `write_decision_status` writes with the decision's
    own status and Event."""
    by_name = {p["metadata"]["name"]: p for p in pods}
    for pool_pods_back in outcome.readmit.values():
        for pod_name in pool_pods_back:
            await readmit(kube, body, by_name[pod_name], "the pool grows again")
    pending = None
    if outcome.grow:
        done = await reconcile.reconcile(kube, body, replicas=outcome.grow, defer_status=True)
        pending = Deferred(done.get("deferredStatus"), done.get("deferredEvents") or [])
    for order in outcome.drains:
        await start_drain(kube, body, spec, order, by_name[order.pod], now)
    return pending


def not_serving_yet(
    tr: Tracker,
    snap: metrics.Snapshot,
    outcome: autoscaler.Outcome,
    pods: list[dict],
    now: float,
    scrape_s: float,
) -> bool:
    """A held decision of a new object whose metrics cannot exist yet: it is not reported.

    Until the object's first complete snapshot, while none of its pods serves, or the first
    was admitted less than two scrape intervals ago (the age a sample may reach before it is
    stale: a pod that serves has one by then), missing metrics are what a new deployment
    has. `HoldStaleMetrics` (a Warning Event and a status write) on every new object would be
    a false alarm, and while many objects start at once those reports queue for the API
    server with the object's lock held, in front of the reconciles that bring its pools up.
    Later decisions are reported as usual: a Prometheus that never sees the pods is named
    two scrape intervals after the first one serves."""
    if tr.metrics_ok is not None or snap.ok or outcome.changed:
        return False
    admitted = [t for p in pods if routable(p) and (t := admitted_at(p)) is not None]
    return not admitted or now - min(admitted) < 2 * scrape_s


def admitted_at(pod: Mapping[str, Any]) -> float | None:
    """When the pod's routable gate opened (unix seconds), None when unknown."""
    c = autoscaler.gate_condition(pod)
    return status.parse_time(c.get("lastTransitionTime")) if c and c.get("status") == "True" else None


class Report(NamedTuple):
    """What a decision writes about itself: status fields and Events ((reason, message, type))."""

    status: dict[str, Any]
    events: list[tuple[str, str, str]]
    persist: str | None  # why the scaler state is written (None: it is not)

    def writes(self, body: Mapping[str, Any]) -> bool:
        return bool(self.events) or reconcile.status_changed(body, self.status)


def decision_report(
    body: Mapping[str, Any],
    config: autoscaler.Config,
    outcome: autoscaler.Outcome,
    snap: metrics.Snapshot,
    tr: Tracker,
    pending: Deferred | None = None,
) -> Report:
    """Conditions, lastDecision, calibration and scalerState; an Event when the targets change
    or the metrics come or go. `status.ratio` is reconcile's (from the targets in DESIRED).

    `pending`: what a reconcile of this decision left unwritten (`apply`). Its status fields go
    out in the same patch, the decision's conditions merged over theirs; its pool Events'
    messages go into the decision's Event (posted on their own only when the decision has
    none)."""
    pending_status = pending.status if pending is not None else None
    pending_events = pending.events if pending is not None else []
    meta = body["metadata"]
    gen = meta.get("generation")
    plan = outcome.plan
    record = outcome.record.to_status()
    conds = [
        status.condition(
            names.COND_METRICS_AVAILABLE,
            snap.ok,
            "MetricsFresh" if snap.ok else "MetricsMissing",
            snap.condition_message()[:1000],
            gen,
        ),
        status.condition(
            names.COND_BUDGET_LIMITED,
            bool(plan and plan.budget_limited),
            "GpuBudgetShort" if plan and plan.budget_limited else "WithinBudget",
            (plan.sacrificed or "the plan fits the GPU budget") if plan else "no plan",
            gen,
        ),
    ]
    old = {**(body.get("status") or {}), **(pending_status or {})}  # as if the reconcile had written
    was_reason = _condition_reason(old, names.COND_SLO_REACHABLE)
    reach = autoscaler.slo_reach(config, outcome.record, plan, was_reason)
    if reach is not None:  # without a plan the condition is kept as it was
        conds.append(
            status.condition(names.COND_SLO_REACHABLE, reach.reachable, reach.reason, reach.message, gen)
        )
    prev = old.get("lastDecision") or {}
    new_status: dict[str, Any] = {
        **(pending_status or {}),
        "conditions": status.merge_conditions(old.get("conditions"), conds),
    }
    persist = state_write_reason(tr, outcome.state.policy, outcome.record.time)
    if persist is not None:
        new_status["scalerState"] = outcome.state.to_dict()
    outdated = last_decision_outdated(prev, record, config.window_s, outcome.record.arrival_dispersion)
    if outdated or not status.conditions_equal(old.get("conditions"), new_status["conditions"]):
        # A merge patch keeps the keys it does not mention: the fields of the previous decision
        # this one lacks (e.g. the arrival rate when the metrics are missing) are cleared.
        new_status["lastDecision"] = replacing(prev, record)
        new_status["calibration"] = outcome.calibration
    events: list[tuple[str, str, str]] = []
    if outcome.changed or tr.metrics_ok != snap.ok:
        detail = "; ".join(outcome.notes) or snap.reason()
        done = "".join(f"; {message}" for _, message in pending_events)
        message = f"{autoscaler.summary(outcome, config.pools)}{done}; {detail}"[:1000]
        events.append((outcome.reason, message, "Normal" if snap.ok else "Warning"))
    else:
        events.extend((reason, message, "") for reason, message in pending_events)
    if reach is not None and not reach.reachable and reach.reason != was_reason:
        events.append((reach.reason, reach.event[:1000], "Warning"))  # once per cause, when it begins
    return Report(new_status, events, persist)


def _condition_reason(st: Mapping[str, Any], ctype: str) -> str | None:
    """The reason of `st`'s condition `ctype` (None: no such condition)."""
    return next((c.get("reason") for c in st.get("conditions") or [] if c.get("type") == ctype), None)


async def write_decision_status(
    kube: Kube,
    body: Mapping[str, Any],
    config: autoscaler.Config,
    outcome: autoscaler.Outcome,
    snap: metrics.Snapshot,
    tr: Tracker,
    pending: Deferred | None = None,
) -> None:
    """Write `decision_report`: the patch and the Events are independent and sent at once (one
    round trip)."""
    report = decision_report(body, config, outcome, snap, tr, pending)
    events: list[Awaitable[None]] = [
        kube.event(body, reason, message, type_=kind, action="Autoscale")
        if kind
        else kube.event(body, reason, message)
        for reason, message, kind in report.events
    ]
    await asyncio.gather(reconcile.write_status(kube, body, report.status), *events)
    if report.persist is not None:
        tr.saved_policy, tr.saved_at = outcome.state.policy, outcome.record.time
    tr.metrics_ok = snap.ok


def replacing(old: Any, new: Any) -> Any:
    """`new` as a merge patch over `old` that leaves exactly `new`: keys of `old` that `new`
    lacks are set to null (maps recursively; other values replace whole)."""
    if not isinstance(old, Mapping) or not isinstance(new, Mapping):
        return new
    out: dict[str, Any] = {k: None for k in old if k not in new}
    for k, v in new.items():
        out[k] = replacing(old.get(k), v)
    return out


def last_decision_outdated(
    prev: Mapping[str, Any], record: Mapping[str, Any], window_s: float, dispersion: float | None = None
) -> bool:
    """Whether `status.lastDecision` (`prev`) no longer tells what the operator decides
    (`record`): another reason, other planned sizes, targets or next step, or an arrival rate
    that moved (`rate_moved`; over `window_s`, the counts' index of dispersion `dispersion`)."""
    if prev.get("reason") != record["reason"]:
        return True
    prev_out, out = prev.get("outputs") or {}, record["outputs"]
    if any(prev_out.get(k) != out.get(k) for k in ("targets", "nextStep", "planned")):
        return True
    was, rate = (prev.get("inputs") or {}).get("arrivalRps"), record["inputs"].get("arrivalRps")
    return rate_moved(was, rate, window_s, dispersion)


def rate_moved(was: float | None, rate: float | None, window_s: float, dispersion: float | None) -> bool:
    """Whether two arrival rates, each measured over `window_s`, differ by more than
    LAST_DECISION_RATE_TOLERANCE of the larger and by more than RATE_NOISE_SIGMAS standard
    deviations of their difference under the same load: a count over the window has variance
    `dispersion` x mean (Poisson: 1), so each rate r has variance dispersion x r / window_s."""
    if was is None or rate is None:
        return (was is None) != (rate is None)
    noise = RATE_NOISE_SIGMAS * math.sqrt(max(1.0, dispersion or 1.0) * (was + rate) / max(window_s, 1e-9))
    return abs(was - rate) > max(LAST_DECISION_RATE_TOLERANCE * max(was, rate), noise)


def export_metrics(
    body: Mapping[str, Any],
    spec: api.DisaggDeploymentSpec,
    outcome: autoscaler.Outcome,
    snap: metrics.Snapshot,
    pods: list[dict],
) -> None:
    ns, name = body["metadata"]["namespace"], body["metadata"]["name"]
    plan = outcome.plan
    targets = outcome.targets
    opmetrics.DECISIONS.labels(ns, name, outcome.reason).inc()
    opmetrics.METRICS_AVAILABLE.labels(ns, name).set(1 if snap.ok else 0)
    for p in snap.problems:
        opmetrics.METRIC_ERRORS.labels(ns, name, p.kind).inc()
    pools = api.pools(spec)
    prefill = targets.get(names.POOL_PREFILL) or targets.get(names.POOL_COLOCATED) or 0
    gpus = 0
    for pool, pspec in pools.items():
        pp = pool_pods(pods, pool)
        n = targets.get(pool, 0)
        opmetrics.POOL_REPLICAS_DESIRED.labels(ns, name, pool).set(n)
        opmetrics.POOL_REPLICAS.labels(ns, name, pool).set(sum(1 for p in pp if drain.is_active(p)))
        opmetrics.POOL_REPLICAS_READY.labels(ns, name, pool).set(sum(1 for p in pp if drain.is_ready(p)))
        opmetrics.POOL_DRAINING.labels(ns, name, pool).set(sum(1 for p in pp if status.is_draining(p)))
        opmetrics.POOL_RATIO.labels(ns, name, pool).set(n / prefill if prefill else 0)
        gpus += sum(1 for p in pp if drain.is_active(p)) * pspec.gpus_per_replica
    opmetrics.GPUS.labels(ns, name).set(gpus)
    if spec.autoscaling.gpu_budget:
        opmetrics.GPU_BUDGET.labels(ns, name).set(spec.autoscaling.gpu_budget)
    opmetrics.SLO_TTFT.labels(ns, name).set(spec.slo.ttft_seconds)
    opmetrics.SLO_ITL.labels(ns, name).set(spec.slo.itl_seconds)
    if outcome.record.observed_ttft_s is not None:
        opmetrics.OBSERVED_TTFT.labels(ns, name).set(outcome.record.observed_ttft_s)
    if outcome.record.observed_itl_s is not None:
        opmetrics.OBSERVED_ITL.labels(ns, name).set(outcome.record.observed_itl_s)
    if plan is not None:
        opmetrics.PREDICTED_TTFT.labels(ns, name).set(plan.ttft_s)
        opmetrics.PREDICTED_ITL.labels(ns, name).set(plan.itl_s)
        for stage, st in outcome.record.stages.items():
            opmetrics.STAGE_ARRIVAL_RATE.labels(ns, name, stage).set(st.arrival_rps)
            opmetrics.STAGE_WAIT.labels(ns, name, stage).set(st.wait_s)
            opmetrics.STAGE_IN_SYSTEM.labels(ns, name, stage).set(st.arrival_rps * st.wait_s)
            opmetrics.STAGE_UTILIZATION.labels(ns, name, stage).set(st.utilization)


# ---------------------------------------------------------------------------- one tick


async def _paused(kube: Kube, body: Mapping[str, Any], tr: Tracker, now: float, interval_s: float) -> None:
    if now - tr.last_decision_at < interval_s:
        return
    tr.last_decision_at = now
    prev = (body.get("status") or {}).get("lastDecision") or {}
    if prev.get("reason") != names.EVENT_PAUSED:
        note = "autoscaling paused: holding every pool"
        record = autoscaler.DecisionRecord.without_decision(now, names.EVENT_PAUSED, note)
        await reconcile.write_status(kube, body, {"lastDecision": record.to_status()})
        await kube.event(body, names.EVENT_PAUSED, note)


def parsed_spec(body: Mapping[str, Any], tr: Tracker) -> api.DisaggDeploymentSpec | None:
    """The object's spec, parsed once per generation; None when invalid (reconcile reports it)."""
    gen = body["metadata"].get("generation")
    if tr.spec is None or tr.spec_generation != gen or gen is None:
        try:
            tr.spec = api.parse_spec(body.get("spec") or {})
        except ValidationError:
            tr.spec = None
        tr.spec_generation = gen
    return tr.spec


async def step(
    kube: Kube,
    body: Mapping[str, Any],
    opts: LoopOptions,
    now: float,
    due: bool | None = None,
    fleet: asyncio.Future | None = None,
) -> None:
    """One tick for one DisaggDeployment. `due`: whether a decision is due (`tick` schedules
    it); None decides when `intervalSeconds` have passed since the last decision."""
    began = time.monotonic()
    kube = cached(kube, opts)
    meta = body["metadata"]
    ns, name = meta["namespace"], meta["name"]
    tr = tracker(body)
    spec = parsed_spec(body, tr)
    if spec is None:
        return  # reconcile reports InvalidSpec; never scale an invalid object
    pods = await read_pods(kube, opts, ns, name)
    a = spec.autoscaling
    if not a.enabled or a.paused:
        await cancel_all_drains(
            kube, body, pods, "autoscaling disabled" if not a.enabled else "autoscaling paused"
        )
        if a.enabled:
            await _paused(kube, body, tr, now, a.interval_seconds)
        return
    draining_now = any(status.is_draining(p) and drain.is_active(p) for p in pods)
    if due is None:
        due = now - tr.last_decision_at >= a.interval_seconds
    if not (due or draining_now):
        return
    if not draining_now and not set(api.pool_names(spec)) <= set(
        await list_deployments(kube, ns, name, opts)
    ):
        # A pool not created yet reads as 0 replicas, which a decision would "grow" to its
        # minimum by reconciling from here: the controller's reconcile creates the pools at
        # their spec's sizes; the first decision comes once they exist.
        return
    snap = await snapshot(kube, body, spec, pods, opts, now, fleet)
    tr.last_snapshot = snap
    if draining_now:
        removed = await drain_step(kube, body, spec, pods, snap, now, opts)
        if removed:
            # Read back at once: the drain records just written (the cache follows a moment later).
            pods = await kube.list("Pod", ns, reconcile.owner_selector(name))
    if not due:
        return
    if tr.last_decision_at:
        opmetrics.DECISION_GAP.observe(now - tr.last_decision_at)
    tr.last_decision_at = now
    config = autoscaler.config_from_spec(spec)
    extend_restored(tr, now)
    deployments = await list_deployments(kube, ns, name, opts)
    sizing = await read_sizing(kube, body, spec, opts, fleet)
    outcome = autoscaler.decide(config, observation(config, snap, deployments, pods, now, sizing), tr.state)
    tr.state = outcome.state
    tr.last_outcome = outcome
    # reconcile shows these targets (status.pools.*.desiredReplicas and status.ratio)
    reconcile.DESIRED[(ns, name)] = dict(outcome.targets)
    fresh = await kube.get(api.KIND, ns, name)
    pending = await apply(kube, fresh, spec, pods, outcome, now)
    if outcome.changed and not outcome.grow:
        await reconcile.reconcile(kube, await kube.get(api.KIND, ns, name))
    if isinstance(kube, WriteGated):
        # The decision is carried out; its report (status, Event) asks for a slot anew, behind
        # the steps already waiting to carry out theirs.
        kube.slot.release()
    fresh = await kube.get(api.KIND, ns, name)
    if not_serving_yet(tr, snap, outcome, pods, now, a.scrape_interval_seconds):
        export_metrics(fresh, spec, outcome, snap, pods)
        return
    if isinstance(kube, WriteGated) and decision_report(fresh, config, outcome, snap, tr, pending).writes(
        fresh
    ):
        # The report waits for its slot with the object's lock released: while many objects
        # start, a reconcile that brings a pool up does not queue behind a status write. It is
        # made from the object as it is once the slot is had (what a reconcile wrote meanwhile
        # stays); a growing decision's deferred status is dropped if one did.
        seen = fresh["metadata"].get("resourceVersion")
        await (kube.slot.take_unlocked(kube.lock) if kube.lock is not None else kube.slot.take())
        fresh = await kube.get(api.KIND, ns, name)
        if pending is not None and fresh["metadata"].get("resourceVersion") != seen:
            pending = Deferred(None, pending.events)
    await write_decision_status(kube, fresh, config, outcome, snap, tr, pending)
    export_metrics(fresh, spec, outcome, snap, pods)
    slot_wait_s = kube.slot.waited_s if isinstance(kube, WriteGated) else 0.0
    opmetrics.DECISION_SECONDS.labels("changed" if outcome.changed else "unchanged").observe(
        time.monotonic() - began - slot_wait_s
    )


# ---------------------------------------------------------------------------- scheduling


def phase(uid: str | None, key: tuple[str, str]) -> float:
    """A stable fraction in [0, 1) drawn from the object's uid (its name without one): where in
    its interval an object first comes due, so objects created together spread out."""
    digest = hashlib.sha256((uid or "/".join(key)).encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def next_due(previous: float, interval_s: float, now: float) -> float:
    """The first time after `now` on the object's grid (`previous` + k intervals): a late
    decision keeps the object's phase, and missed slots are skipped, not caught up."""
    if previous > now:
        return previous
    return previous + (math.floor((now - previous) / interval_s) + 1) * interval_s


def wants_step(body: Mapping[str, Any], tr: Tracker, pods: list[dict] | None, now: float) -> bool | None:
    """Whether `tick` starts a step for this object now: None for no; otherwise whether a decision
    is due. Advances the object's schedule when one is. `pods` None (no cache): assume a drain
    may be running, so the step looks (it reads the pods itself)."""
    spec = parsed_spec(body, tr)
    if spec is None:
        return None
    a = spec.autoscaling
    draining = pods is None or any(status.is_draining(p) and drain.is_active(p) for p in pods)
    if not a.enabled:
        return False if draining else None  # only drains to cancel
    interval = float(a.interval_seconds)
    if tr.next_due is None:
        key = (body["metadata"]["namespace"], body["metadata"]["name"])
        tr.next_due = now + phase(body["metadata"].get("uid"), key) * interval
    due = now >= tr.next_due
    if due:
        tr.next_due = next_due(tr.next_due, interval, now)
    return due if (due or draining) else None  # paused: `step` cancels drains, notes the pause


#: The step task of each object in flight: an object still busy is not started again.
INFLIGHT: dict[tuple[str, str], asyncio.Task] = {}
_slots: dict[tuple[int, int], asyncio.Semaphore] = {}


class WriteSlot:
    """One of the loop's slots (`LoopOptions.concurrency`), taken by a step at its first write
    to the API server and held until the step has carried out its decision (then again for its
    report: status and Event), or to its end.

    A decision reads the watch cache and the tick's metrics, so it needs no slot: every due
    object decides on the metrics of its own tick, and only the steps that write (a grow, a
    drain, a changed status) queue for one. Were the slot taken before deciding, a load step
    that makes many pools grow at once would keep the other due objects waiting behind those
    writes, to decide on metrics from before the step when their turn came. The slot is
    asked for with the object's lock held (a reconcile of the object waits for the step's
    writes, as it would for the step itself), but for a report's (`take_unlocked`): a report
    holds a slot while it asks for its object's lock, which only a reconcile (no slot) holds."""

    def __init__(self, slots: asyncio.Semaphore) -> None:
        self.slots = slots
        self.held = False
        self.waited_s = 0.0  # how long the step waited for it, every time it asked
        # A step sends some writes at once (a status patch beside its Event): they share one slot.
        self._taking = asyncio.Lock()

    async def take(self) -> None:
        async with self._taking:
            if self.held:
                return
            asked = time.monotonic()
            await self.slots.acquire()
            self.held = True
            waited = time.monotonic() - asked
            self.waited_s += waited
            opmetrics.DECISION_WAIT.labels("slot").observe(waited)

    async def take_unlocked(self, lock: asyncio.Lock) -> None:
        """`take`, with `lock` (held by the caller) released while waiting and held again after.

        Only a reconcile can hold an object's lock while a step waits for it here, and a
        reconcile takes no slot: holding a slot while asking for the lock cannot deadlock."""
        if self.held:
            return
        lock.release()
        try:
            await self.take()
        finally:
            await _reacquire(lock)

    def release(self) -> None:
        if self.held:
            self.held = False
            self.slots.release()


async def _reacquire(lock: asyncio.Lock) -> None:
    """Hold `lock` again, even when cancelled meanwhile (the caller's `async with` releases it)."""
    got = asyncio.ensure_future(lock.acquire())
    try:
        await asyncio.shield(got)
    except asyncio.CancelledError:
        await got
        raise


class WriteGated:
    """A Kube whose writes first take the step's `WriteSlot`; reads go straight through."""

    WRITES = frozenset({"apply", "create", "patch", "delete", "event"})

    def __init__(self, kube: Any, slot: WriteSlot, lock: asyncio.Lock | None = None) -> None:
        self.kube = kube
        self.slot = slot
        self.lock = lock  # the object's lock the step holds (None: it holds none)

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.kube, name)
        if name not in self.WRITES:
            return attr

        async def gated(*args: Any, **kwargs: Any) -> Any:
            await self.slot.take()
            return await attr(*args, **kwargs)

        return gated


def _slots_for(opts: LoopOptions) -> asyncio.Semaphore:
    """One semaphore per running event loop and LoopOptions (a Semaphore binds to its loop)."""
    key = (id(asyncio.get_running_loop()), id(opts))
    if key not in _slots:
        _slots.clear()  # from an earlier event loop (tests): never waited on again
        _slots[key] = asyncio.Semaphore(max(1, opts.concurrency))
    return _slots[key]


async def _step_in_task(
    kube: Kube,
    body: Mapping[str, Any],
    opts: LoopOptions,
    now: float,
    due: bool,
    started: float,
    fleet: asyncio.Future | None = None,
) -> None:
    meta = body["metadata"]
    key = (meta["namespace"], meta["name"])
    try:
        queued = time.monotonic() - started
        if fleet is not None:
            # The tick's shared metrics are awaited before the object's lock is taken: a slow
            # (or hung) Prometheus must not hold the object's reconciles.
            await asyncio.shield(fleet)
        asked = time.monotonic()
        opmetrics.DECISION_WAIT.labels("metrics").observe(asked - started)
        lock = reconcile.lock_for(*key)
        async with lock:
            locked = time.monotonic()
            opmetrics.DECISION_WAIT.labels("lock").observe(locked - asked)
            # A task that waited longer than a tick for the object's lock takes the time it
            # starts at; otherwise the tick's (one time for every object of a tick).
            waited = queued + locked - asked
            slot = WriteSlot(_slots_for(opts))
            try:
                await step(
                    WriteGated(cached(kube, opts), slot, lock),
                    body,
                    opts,
                    now + waited if waited > opts.tick_s else now,
                    due=due,
                    fleet=fleet,
                )
            finally:
                slot.release()
    except asyncio.CancelledError:
        raise
    except Exception:
        log.exception("autoscaling %s/%s failed; retrying next tick", *key)
    finally:
        INFLIGHT.pop(key, None)


async def tick(kube: Kube, opts: LoopOptions, now: float, wait: bool = False) -> list[asyncio.Task]:
    """One pass over every DisaggDeployment: starts a task for each one with work to do (a due
    decision, a drain) and not still busy from an earlier tick; forgets the ones that are gone.
    Returns the tasks started (`wait`: after they finished)."""
    if opts.cache is not None:
        mine = shard.parse_selector(opts.shard_selector)
        objs = [
            o
            for o in opts.cache.disagg_deployments(opts.namespaces)
            if mine.matches(o.get("metadata", {}).get("labels"))
        ]
    elif opts.namespaces:
        objs = [o for ns in opts.namespaces for o in await kube.list(api.KIND, ns, opts.shard_selector)]
    else:
        objs = await kube.list(api.KIND, None, opts.shard_selector)
    prune({(o["metadata"]["namespace"], o["metadata"]["name"]) for o in objs}, opts.namespaces)
    kube = cached(kube, opts)
    started = time.monotonic()
    tasks: list[asyncio.Task] = []
    batches: dict[tuple, list[FleetBatch]] = {}
    for body in objs:
        meta = body["metadata"]
        key = (meta["namespace"], meta["name"])
        if meta.get("deletionTimestamp") or key in INFLIGHT:
            continue
        pods = opts.cache.children("Pod", *key) if opts.cache is not None else None
        tr = tracker(body)
        due = wants_step(body, tr, pods, now)
        if due is None:
            continue
        fleet = None
        spec = tr.spec
        if (
            opts.fleet_queries
            and spec is not None
            and spec.autoscaling.enabled
            and not spec.autoscaling.paused
        ):
            fk = fleet_key(spec, key[0])
            open_ = batches.setdefault(fk, [])
            if not open_ or open_[-1].full():
                open_.append(FleetBatch(fk, spec.autoscaling.prometheus))
            fleet = open_[-1].add(spec, *key)
        task = asyncio.create_task(
            _step_in_task(kube, body, opts, now, due, started, fleet), name=f"disagg-step-{key[0]}/{key[1]}"
        )
        INFLIGHT[key] = task
        tasks.append(task)
    for batch in (b for group in batches.values() for b in group):
        # The tick's metrics, one query per series: held by the tasks (cancelled with them).
        tasks.append(asyncio.create_task(batch.run(kube, opts), name=f"disagg-fleet-{batch.key}"))
    if wait:
        await asyncio.gather(*tasks, return_exceptions=True)
    return tasks


async def prime(kube: Kube, opts: LoopOptions) -> None:
    """Fill the watch cache once (one LIST per kind and namespace) so the first ticks see every
    object even before the watches delivered it."""
    cache = opts.cache
    if cache is None or cache.primed:
        return
    selector = names.LABEL_DEPLOYMENT  # the label is present (any owner)
    for ns in opts.namespaces or (None,):
        cache.prime(api.KIND, await kube.list(api.KIND, ns, opts.shard_selector))
        for kind in POOL_CHILD_KINDS:
            cache.prime(kind, await kube.list(kind, ns, selector))
    cache.primed_done()


async def run_forever(kube: Kube, opts: LoopOptions) -> None:
    log.info("autoscaler loop started (tick %.1fs, %d at once)", opts.tick_s, opts.concurrency)
    previous: float | None = None
    try:
        while True:
            started = time.monotonic()
            if previous is not None:
                opmetrics.LOOP_TICK.observe(started - previous)
            previous = started
            try:
                await prime(kube, opts)
                await tick(kube, opts, time.time())
            except Exception:  # not CancelledError (a BaseException): that stops the loop
                log.exception("autoscaler tick failed; retrying")
            await asyncio.sleep(max(0.05, opts.tick_s - (time.monotonic() - started)))
    finally:
        # Stopped (cancelled, mostly while it sleeps between ticks): the steps still in flight
        # end with it, before the caller closes the API client they write through.
        running = list(INFLIGHT.values())
        for task in running:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)
