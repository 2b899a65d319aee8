"""The autoscaling loop: snapshot -> planner -> policy -> apply, and the drain state machine.

One asyncio task of the operator walks every DisaggDeployment once a second.
Each one decides at its own `spec.autoscaling.intervalSeconds`; drains in
progress advance every tick. Kopf timers are not used because they put a
finalizer on every object (deleting one would then wait for the operator).

Everything that survives a restart lives in the cluster: drain records on the
pods, the last decision in the status. The policy's in-memory history starts
empty after a restart, which can only delay a scale-down (the stabilization
window must fill again), never cause one.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from pydantic import ValidationError

from disagg import api, builders, drain, metrics, opmetrics, planner, policy, reconcile, routerclient, status
from disagg.calibration import Calibrator
from disagg.kube import Kube, NotFound
from disagg.promclient import client_for

log = logging.getLogger("disagg.loop")


@dataclass
class Tracker:
    """In-memory state of one DisaggDeployment."""

    policy_state: policy.PolicyState = field(default_factory=policy.PolicyState)
    last_decision_at: float = 0.0
    last_snapshot: metrics.Snapshot | None = None
    last_plan: planner.Plan | None = None
    targets: dict[str, int] = field(default_factory=dict)
    metrics_ok: bool | None = None
    calibrator: Calibrator = field(default_factory=Calibrator)
    shape: dict[str, float] = field(default_factory=dict)  # last measured token means
    startups: dict[str, float] = field(default_factory=dict)  # observed pod start-up seconds by pod


@dataclass
class LoopOptions:
    tick_s: float = 1.0
    prometheus_url: str | None = None
    namespaces: tuple[str, ...] = ()


TRACKERS: dict[tuple[str, str], Tracker] = {}

# The short rate window (fast attack on a real step up) spans this many scrapes.
SHORT_WINDOW_SCRAPES = 3


def tracker(ns: str, name: str) -> Tracker:
    return TRACKERS.setdefault((ns, name), Tracker())


# ---------------------------------------------------------------------------- pure helpers


def pool_pods(pods: list[dict], pool: str) -> list[dict]:
    return [p for p in pods if (p["metadata"].get("labels") or {}).get(builders.LABEL_POOL) == pool]


def routable(pod: Mapping[str, Any]) -> bool:
    return (
        drain.is_active(pod)
        and pod.get("status", {}).get("phase") == "Running"
        and status.pod_condition(pod, builders.READINESS_GATE) == "True"
        and not status.is_draining(pod)
    )


def pending_count(pods: list[dict]) -> int:
    return sum(1 for p in pods if drain.is_active(p) and p.get("status", {}).get("phase") == "Pending")


def demand_from(snap: metrics.Snapshot, rate: float, last: dict[str, float] | None = None) -> planner.Demand:
    """The planner's demand from a snapshot. A token mean the window does not show (no request
    finished in it) keeps its last measured value in `last`, which is updated in place; with
    none ever measured it is 1 token, the smallest valid value, never a guess."""
    v, s = snap.values, snap.spreads
    last = {} if last is None else last

    def pos(key: str) -> float:
        x = v.get(key)
        if x is not None and math.isfinite(x) and x > 0:
            last[key] = x
            return x
        return last.get(key, 1.0)

    return planner.Demand(
        arrival_rps=max(rate, 0.0),
        prompt_tokens_mean=pos("prompt_tokens_mean"),
        prompt_tokens_std=s.get("prompt_tokens_std", 0.0),
        output_tokens_mean=pos("output_tokens_mean"),
        output_tokens_std=s.get("output_tokens_std", 0.0),
    )


DEFAULT_LEAD_S = 60.0


def startup_seconds(pods: list[dict]) -> dict[str, float]:
    """Observed pod start-up by pod name: creation to first admission (the routable gate set True)."""
    out: dict[str, float] = {}
    for p in pods:
        for c in p.get("status", {}).get("conditions", []) or []:
            if (
                c.get("type") == builders.READINESS_GATE
                and c.get("status") == "True"
                and c.get("reason") == "Admitted"
            ):
                t0 = status.parse_time(p["metadata"].get("creationTimestamp"))
                t1 = status.parse_time(c.get("lastTransitionTime"))
                if t0 is not None and t1 is not None and t1 >= t0:
                    out[p["metadata"]["name"]] = t1 - t0
    return out


def lead_time(samples: list[float] | Any) -> float:
    """Forecast horizon: the median observed start-up, within [5 s, 600 s]; 60 s before any is seen."""
    xs = sorted(samples)
    if not xs:
        return DEFAULT_LEAD_S
    return min(600.0, max(5.0, xs[len(xs) // 2]))


def fit_growth_in_budget(
    spec: api.DisaggDeploymentSpec, deployments: Mapping[str, dict], pods: list[dict], grow: dict[str, int]
) -> tuple[dict[str, int], dict[str, int]]:
    """Trim new replica counts so that GPUs requested on the cluster never exceed the budget.

    The policy counts a draining pod as gone; the cluster does not until it is removed. Growth
    that would only fit once drains finish waits for the next decision (make-before-break
    within the budget). Returns (the growth that fits, what was deferred).
    """
    budget = spec.autoscaling.gpu_budget
    pools = api.pools(spec)
    held = {
        name: max(
            int((deployments.get(name) or {}).get("spec", {}).get("replicas", 0)),
            sum(1 for p in pool_pods(pods, name) if drain.is_active(p)),
        )
        for name in pools
    }
    used = sum(held[n] * pools[n].gpus_per_replica for n in pools)
    fits: dict[str, int] = {}
    deferred: dict[str, int] = {}
    for name in sorted(grow, key=lambda n: pools[n].gpus_per_replica):
        gpr = pools[name].gpus_per_replica
        room = max(0, (budget - used) // gpr) if budget is not None else grow[name]
        add = min(max(0, grow[name] - held[name]), room)
        if add > 0:
            fits[name] = held[name] + add
            used += add * gpr
        if grow[name] - held[name] > add:
            deferred[name] = grow[name] - held[name] - add
    return fits, deferred


def policy_config(spec: api.DisaggDeploymentSpec, lead_s: float = DEFAULT_LEAD_S) -> policy.PolicyConfig:
    pools = api.pools(spec)
    a = spec.autoscaling
    return policy.PolicyConfig(
        scale_down_stabilization_s=float(a.scale_down_stabilization_seconds),
        max_step_up=a.max_scale_up_step,
        max_step_down=a.max_scale_down_step,
        min_replicas={k: p.min_replicas for k, p in pools.items()},
        max_replicas={k: p.max_replicas for k, p in pools.items()},
        gpus_per_replica={k: p.gpus_per_replica for k, p in pools.items()},
        gpu_budget=a.gpu_budget,
        forecast_horizon_s=lead_s,
        headroom=float(a.headroom),
        paused=a.paused,
    )


def _pooled(plan: planner.Plan, pools: Mapping[str, Any]) -> dict[str, int]:
    """The plan's replicas for this deployment's pools (a plan names every stage)."""
    return {k: v for k, v in plan.replicas.items() if k in pools}


def placement_of(spec: api.DisaggDeploymentSpec) -> str:
    return spec.placement.mode


def plan_for(spec: api.DisaggDeploymentSpec, demand: planner.Demand, models: Any = None) -> planner.Plan:
    pools = api.pools(spec)
    bounds = {
        k: planner.PoolBounds(p.min_replicas, p.max_replicas, p.gpus_per_replica) for k, p in pools.items()
    }
    slo = planner.SLO(spec.slo.ttft_seconds, spec.slo.itl_seconds, spec.slo.percentile)
    chunked = spec.kv_transfer.stream_chunks
    return planner.plan(
        demand,
        models or api.stage_bundle(spec),
        slo,
        bounds,
        spec.autoscaling.gpu_budget,
        placement_of(spec),
        chunked=chunked,
    )


# ---------------------------------------------------------------------------- I/O steps


async def snapshot(
    kube: Kube, body: Mapping[str, Any], spec: api.DisaggDeploymentSpec, pods: list[dict], opts: LoopOptions
) -> metrics.Snapshot:
    meta = body["metadata"]
    a = spec.autoscaling
    pools = api.pool_names(spec)
    queries = metrics.build_queries(
        spec.engine,
        meta["namespace"],
        meta["name"],
        pools,
        a.metric_window_seconds,
        spec.slo.percentile,
        a.queries,
    )
    need = {pool: [p["metadata"]["name"] for p in pool_pods(pods, pool) if routable(p)] for pool in pools}
    try:
        client = await client_for(kube, meta["namespace"], a.prometheus, opts.prometheus_url)
        results = await client.run(queries)
    except Exception as exc:
        results = {q.name: exc for q in queries}
    return metrics.build_snapshot(queries, results, time.time(), float(a.scrape_interval_seconds), need)


async def set_drain(
    kube: Kube, pod: Mapping[str, Any], record: drain.DrainRecord | None, cost: str | None = None
) -> None:
    meta = pod["metadata"]
    ann: dict[str, str | None] = {status.ANNOTATION_DRAIN: record.to_annotation() if record else None}
    ann[drain.DELETION_COST] = cost
    try:
        await kube.patch("Pod", meta["namespace"], meta["name"], {"metadata": {"annotations": ann}})
    except NotFound:
        return
    if record is None:
        await reconcile.set_routable(kube, pod, True, "Readmitted", "drain cancelled; routable again")
        await routerclient.set_worker_routable(kube, pod, True)
    elif record.removing is None and status.pod_condition(pod, builders.READINESS_GATE) != "False":
        await reconcile.set_routable(kube, pod, False, "Draining", "being drained by disagg-operator")
        await routerclient.set_worker_routable(kube, pod, False)  # routers that ignore Ready


async def readmit(kube: Kube, body: Mapping[str, Any], pod: Mapping[str, Any], why: str) -> None:
    await set_drain(kube, pod, None)
    await kube.event(body, "DrainCancelled", f"pod {pod['metadata']['name']} re-admitted: {why}")


async def start_drains(
    kube: Kube,
    body: Mapping[str, Any],
    spec: api.DisaggDeploymentSpec,
    pool: str,
    pods: list[dict],
    snap: metrics.Snapshot | None,
    n: int,
) -> list[str]:
    pool_spec = api.pools(spec)[pool]
    in_flight = snap.in_flight(pool) if snap else {}
    victims = drain.choose_victims(pods, in_flight, n)
    now = time.time()
    rec = drain.DrainRecord(now, now + pool_spec.drain.timeout_seconds, pool_spec.drain.on_timeout)
    by_name = {p["metadata"]["name"]: p for p in pods}
    for v in victims:
        pod = by_name[v]
        await set_drain(kube, pod, rec if routable(pod) else replace(rec, idle=True))
        await kube.event(
            body,
            "DrainStarted",
            f"draining {pool} pod {v} ({in_flight.get(v, 'unknown')} in flight); "
            f"timeout {pool_spec.drain.timeout_seconds}s then {pool_spec.drain.on_timeout}",
        )
    return victims


async def drain_step(
    kube: Kube,
    body: Mapping[str, Any],
    spec: api.DisaggDeploymentSpec,
    pods: list[dict],
    snap: metrics.Snapshot,
) -> dict[str, int]:
    """Advance every drain of this DisaggDeployment; returns replicas removed per pool."""
    meta = body["metadata"]
    ns, name = meta["namespace"], meta["name"]
    removed: dict[str, int] = {}
    scrape = float(spec.autoscaling.scrape_interval_seconds)
    deployments = {
        d["metadata"]["labels"][builders.LABEL_POOL]: d
        for d in await kube.list("Deployment", ns, reconcile.owner_selector(name))
    }
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
            work = metrics.pod_in_flight_fresh(snap, pool, pod["metadata"]["name"], scrape)
            act = drain.next_action(pod, rec, work, time.time())
            if act.action == "verify":
                if time.time() - (rec.removing or 0) > 30:
                    # The ReplicaSet removed another pod (or none): this one is needed again.
                    await set_drain(kube, pod, None)
                    await kube.event(
                        body,
                        "WrongVictim",
                        f"pod {act.pod} was not removed by its ReplicaSet within 30 s; re-admitted",
                        type_="Warning",
                    )
                continue
            if act.action == "readmit":
                await set_drain(kube, pod, None)
                await kube.event(body, "DrainTimeout", f"{pool} pod {act.pod}: {act.detail}", type_="Warning")
                opmetrics.DRAINS.labels(ns, name, pool, "timeout_readmit").inc()
                continue
            if act.action in ("remove", "timeout_proceed"):
                if act.action == "timeout_proceed":
                    await kube.event(
                        body, "DrainTimeout", f"{pool} pod {act.pod}: {act.detail}", type_="Warning"
                    )
                ready_to_remove.append(pod)
        if not ready_to_remove:
            continue
        companions = drain.pending_companions(pp, victims)
        dep = deployments.get(pool)
        if dep is None:
            continue
        now = time.time()
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
                "DrainCompleted",
                f"{pool} pod {pod['metadata']['name']} drained after {now - rec.since:.1f}s; removing it",
            )
        current = int(dep["spec"].get("replicas", 0))
        new = max(current - len(ready_to_remove) - len(companions), api.pools(spec)[pool].min_replicas)
        if companions:
            await kube.event(
                body,
                "PendingPodsRemoved",
                f"{pool}: {len(companions)} pending pod(s) removed with the drained ones "
                f"({', '.join(companions)}): the ReplicaSet deletes pending pods first",
            )
        if new < current:
            removed[pool] = current - new
            fresh = await kube.get(api.KIND, ns, name)
            await reconcile.reconcile(kube, fresh, replicas={pool: new})
    return removed


async def cancel_all_drains(kube: Kube, body: Mapping[str, Any], pods: list[dict], why: str) -> None:
    for pod in pods:
        if status.is_draining(pod) and drain.is_active(pod):
            rec = drain.DrainRecord.from_pod(pod)
            if rec and rec.removing is None:
                await readmit(kube, body, pod, why)


async def decide_and_apply(
    kube: Kube,
    body: Mapping[str, Any],
    spec: api.DisaggDeploymentSpec,
    pods: list[dict],
    snap: metrics.Snapshot,
    tr: Tracker,
) -> dict[str, Any]:
    meta = body["metadata"]
    ns, name = meta["namespace"], meta["name"]
    now = time.time()
    deployments = {
        d["metadata"]["labels"][builders.LABEL_POOL]: d
        for d in await kube.list("Deployment", ns, reconcile.owner_selector(name))
    }
    pools = api.pool_names(spec)
    # Replicas requested now, counting pods that are still starting; draining pods are on their way out.
    draining = {
        pool: [
            p
            for p in pool_pods(pods, pool)
            if status.is_draining(p)
            and drain.is_active(p)
            and (drain.DrainRecord.from_pod(p) or drain.DrainRecord(0, 0, "")).removing is None
        ]
        for pool in pools
    }
    current = {
        pool: int((deployments.get(pool) or {}).get("spec", {}).get("replicas", 0)) - len(draining[pool])
        for pool in pools
    }
    pending = {pool: pending_count(pool_pods(pods, pool)) for pool in pools}
    tr.startups.update(startup_seconds(pods))
    while len(tr.startups) > 50:  # keep the most recent pods' figures
        tr.startups.pop(next(iter(tr.startups)))
    cfg = policy_config(spec, lead_time(list(tr.startups.values())))

    observed = snap.values.get("arrival_rps") if snap.ok else None
    plan = None
    planned = dict(current)
    floor: dict[str, int] = {}
    base_models = api.stage_bundle(spec)
    if snap.ok:
        decode_pods = [p for p in pool_pods(pods, metrics.back_pool(pools)) if routable(p)]
        batch = snap.values.get(f"running.{metrics.back_pool(pools)}", 0.0) / max(len(decode_pods), 1)
        tr.calibrator.observe(snap.values, batch)
    models = tr.calibrator.models(base_models)
    plan_rate: float | None = None
    if snap.ok and observed is not None:
        a = spec.autoscaling
        queued = sum(v for k, v in snap.values.items() if k.startswith("queue."))
        rate, tr.policy_state = policy.sizing_rate(
            tr.policy_state,
            now,
            cfg,
            observed,
            window_s=float(a.metric_window_seconds),
            rate_short=snap.values.get("arrival_rps_short"),
            short_window_s=float(SHORT_WINDOW_SCRAPES * a.scrape_interval_seconds),
            queued=queued,
            ttft_observed=snap.values.get("ttft_p"),
            ttft_target=spec.slo.ttft_seconds,
        )
        plan_rate = rate
        try:
            plan = plan_for(spec, demand_from(snap, rate, tr.shape), models)
            planned = _pooled(plan, pools)
            # what the current load needs: donors never shrink below it in a rebalance
            floor = (
                _pooled(plan_for(spec, demand_from(snap, observed, tr.shape), models), pools)
                if rate > observed
                else dict(planned)
            )
        except ValueError as exc:
            log.warning("%s/%s: planner refused the input: %s", ns, name, exc)
    decision = policy.decide(
        now,
        current,
        planned,
        tr.policy_state,
        cfg,
        metrics_ok=bool(snap.ok and plan),
        pending=pending,
        floor=floor,
    )
    tr.policy_state = decision.state
    target = decision.steps[0] if decision.steps else decision.targets
    tr.targets = dict(decision.targets)
    tr.last_plan = plan

    # Apply: re-admit draining pods first on the way up, then grow; shrink through drains.
    grow: dict[str, int] = {}
    for pool in pools:
        want = int(target.get(pool, current[pool]))
        if want > current[pool]:
            extra = want - current[pool]
            for pod in draining[pool][:extra]:
                rec = drain.DrainRecord.from_pod(pod)
                if rec and rec.removing is None:
                    await readmit(kube, body, pod, "the pool grows again")
                    extra -= 1
            if extra > 0:
                grow[pool] = int((deployments.get(pool) or {}).get("spec", {}).get("replicas", 0)) + extra
        elif want < current[pool]:
            live = [p for p in pool_pods(pods, pool) if drain.is_active(p)]
            await start_drains(kube, body, spec, pool, live, snap, current[pool] - want)
    if grow and spec.autoscaling.gpu_budget:
        grow, deferred = fit_growth_in_budget(spec, deployments, pods, grow)
        if deferred:
            decision.notes.append(f"growth of {deferred} deferred: draining pods still hold their GPUs")
    if grow:
        await reconcile.reconcile(kube, body, replicas=grow)

    reason = decision.reason
    if plan is not None and plan.budget_limited and reason in ("Hold", "ScaleUp", "ScaleDown", "Rebalance"):
        reason_note = f"budget limited: {plan.sacrificed}"
    else:
        reason_note = ""
    record = {
        "time": status.now_iso(),
        "reason": reason,
        "inputs": {
            "metricsOk": snap.ok,
            "metricsProblem": None if snap.ok else snap.reason(),
            "arrivalRps": _r(observed),
            "plannedRps": _r(plan_rate),
            "custom": {k: _r(v) for k, v in snap.values.items() if k in (spec.autoscaling.queries or {})},
            "leadTimeSeconds": _r(cfg.forecast_horizon_s, 1),
            "promptTokensMean": _r(snap.values.get("prompt_tokens_mean")),
            "outputTokensMean": _r(snap.values.get("output_tokens_mean")),
            "observedTtftSeconds": _r(snap.values.get("ttft_p")),
            "observedItlSeconds": _r(snap.values.get("itl_mean")),
            "current": current,
            "pending": pending,
            "stages": {
                k: {
                    "lambda": _r(v.arrival_rps),
                    "W": _r(v.wait_mean_s + v.service_s),
                    "L": _r(v.arrival_rps * (v.wait_mean_s + v.service_s)),
                    "utilization": _r(v.utilization),
                }
                for k, v in (plan.pools.items() if plan else [])
                if k in pools
            },
            "predicted": {
                "ttft_s": _r(plan.ttft_s) if plan else None,
                "itl_s": _r(plan.itl_s) if plan else None,
            },
            "observed": {"ttft_s": _r(snap.values.get("ttft_p")), "itl_s": _r(snap.values.get("itl_mean"))},
        },
        "outputs": {
            "targets": dict(decision.targets),
            "nextStep": dict(target),
            "planned": planned,
            "predictedTtftSeconds": _r(plan.ttft_s) if plan else None,
            "predictedItlSeconds": _r(plan.itl_s) if plan else None,
            "feasible": plan.feasible if plan else None,
            "budgetLimited": plan.budget_limited if plan else False,
            "notes": [n for n in [*decision.notes, reason_note] if n],
        },
    }
    return {
        "decision": decision,
        "plan": plan,
        "record": record,
        "current": current,
        "calibration": tr.calibrator.status(base_models),
    }


def _close(a: float | None, b: float | None, rel: float = 0.1) -> bool:
    """Equal within `rel` (so a steady load does not rewrite the status every interval)."""
    if a is None or b is None:
        return a is None and b is None
    return abs(a - b) <= rel * max(abs(a), abs(b), 1e-9)


def _r(x: float | None, nd: int = 4) -> float | None:
    return None if x is None or not math.isfinite(x) else round(float(x), nd)


async def write_decision_status(
    kube: Kube, body: Mapping[str, Any], result: dict[str, Any], snap: metrics.Snapshot, tr: Tracker
) -> None:
    meta = body["metadata"]
    gen = meta.get("generation")
    decision: policy.Decision = result["decision"]
    plan: planner.Plan | None = result["plan"]
    conds = [
        status.condition(
            "MetricsAvailable",
            snap.ok,
            "MetricsFresh" if snap.ok else "MetricsMissing",
            snap.reason()[:1000],
            gen,
        ),
        status.condition(
            "BudgetLimited",
            bool(plan and plan.budget_limited),
            "GpuBudgetShort" if plan and plan.budget_limited else "WithinBudget",
            (plan.sacrificed or "the plan fits the GPU budget") if plan else "no plan",
            gen,
        ),
    ]
    old = body.get("status") or {}
    prev = old.get("lastDecision") or {}
    same = (
        prev.get("reason") == result["record"]["reason"]
        and (prev.get("outputs") or {}).get("targets") == result["record"]["outputs"]["targets"]
        and _close((prev.get("inputs") or {}).get("arrivalRps"), result["record"]["inputs"]["arrivalRps"])
    )
    new_status: dict[str, Any] = {"conditions": status.merge_conditions(old.get("conditions"), conds)}
    if not same or not status.conditions_equal(old.get("conditions"), new_status["conditions"]):
        new_status["lastDecision"] = result["record"]
        new_status["calibration"] = result["calibration"]
        if plan is not None:
            new_status["ratio"] = api.format_ratio({k: v for k, v in decision.targets.items()})
    await reconcile.write_status(kube, body, new_status)
    if decision.changed or tr.metrics_ok != snap.ok:
        etype = "Normal" if snap.ok else "Warning"
        await kube.event(
            body,
            decision.reason,
            f"targets {decision.targets} (was {result['current']}); "
            + ("; ".join(decision.notes) or snap.reason())[:600],
            type_=etype,
            action="Autoscale",
        )
    tr.metrics_ok = snap.ok


def export_metrics(
    body: Mapping[str, Any],
    spec: api.DisaggDeploymentSpec,
    result: dict[str, Any],
    snap: metrics.Snapshot,
    pods: list[dict],
    opts: LoopOptions,
) -> None:
    ns, name = body["metadata"]["namespace"], body["metadata"]["name"]
    decision: policy.Decision = result["decision"]
    plan: planner.Plan | None = result["plan"]
    opmetrics.DECISIONS.labels(ns, name, decision.reason).inc()
    opmetrics.METRICS_AVAILABLE.labels(ns, name).set(1 if snap.ok else 0)
    for p in snap.problems:
        opmetrics.METRIC_ERRORS.labels(ns, name, p.kind).inc()
    pools = api.pools(spec)
    prefill = decision.targets.get("prefill") or decision.targets.get("colocated") or 0
    gpus = 0
    for pool, pspec in pools.items():
        pp = pool_pods(pods, pool)
        n = decision.targets.get(pool, 0)
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
    if snap.values.get("ttft_p") is not None and math.isfinite(snap.values["ttft_p"]):
        opmetrics.OBSERVED_TTFT.labels(ns, name).set(snap.values["ttft_p"])
    if snap.values.get("itl_mean") is not None and math.isfinite(snap.values["itl_mean"]):
        opmetrics.OBSERVED_ITL.labels(ns, name).set(snap.values["itl_mean"])
    if plan is not None:
        opmetrics.PREDICTED_TTFT.labels(ns, name).set(plan.ttft_s)
        opmetrics.PREDICTED_ITL.labels(ns, name).set(plan.itl_s)
        for stage, pp in ((k, v) for k, v in plan.pools.items() if k in pools):
            w = pp.wait_mean_s + pp.service_s
            opmetrics.STAGE_ARRIVAL_RATE.labels(ns, name, stage).set(pp.arrival_rps)
            opmetrics.STAGE_WAIT.labels(ns, name, stage).set(w)
            opmetrics.STAGE_IN_SYSTEM.labels(ns, name, stage).set(pp.arrival_rps * w)
            opmetrics.STAGE_UTILIZATION.labels(ns, name, stage).set(pp.utilization)


async def step(kube: Kube, body: Mapping[str, Any], opts: LoopOptions, now: float) -> None:
    """One tick for one DisaggDeployment."""
    meta = body["metadata"]
    ns, name = meta["namespace"], meta["name"]
    try:
        spec = api.parse_spec(body.get("spec") or {})
    except ValidationError:
        return  # reconcile reports InvalidSpec; never scale an invalid object
    tr = tracker(ns, name)
    pods = await kube.list("Pod", ns, reconcile.owner_selector(name))
    a = spec.autoscaling
    if not a.enabled or a.paused:
        await cancel_all_drains(
            kube, body, pods, "autoscaling disabled" if not a.enabled else "autoscaling paused"
        )
        if a.enabled and a.paused and now - tr.last_decision_at >= a.interval_seconds:
            tr.last_decision_at = now
            reason = {
                "time": status.now_iso(),
                "reason": "Paused",
                "inputs": {},
                "outputs": {"notes": ["paused"]},
            }
            prev = (body.get("status") or {}).get("lastDecision") or {}
            if prev.get("reason") != "Paused":
                await reconcile.write_status(kube, body, {"lastDecision": reason})
                await kube.event(body, "Paused", "autoscaling paused: holding every pool")
        return
    draining_now = any(status.is_draining(p) and drain.is_active(p) for p in pods)
    due = now - tr.last_decision_at >= a.interval_seconds
    if not (due or draining_now):
        return
    snap = await snapshot(kube, body, spec, pods, opts)
    tr.last_snapshot = snap
    if draining_now:
        removed = await drain_step(kube, body, spec, pods, snap)
        if removed:
            pods = await kube.list("Pod", ns, reconcile.owner_selector(name))
    if not due:
        return
    tr.last_decision_at = now
    fresh = await kube.get(api.KIND, ns, name)
    result = await decide_and_apply(kube, fresh, spec, pods, snap, tr)
    fresh = await kube.get(api.KIND, ns, name)
    await write_decision_status(kube, fresh, result, snap, tr)
    export_metrics(fresh, spec, result, snap, pods, opts)
    reconcile.DESIRED[(ns, name)] = dict(result["decision"].targets)


async def run_forever(kube: Kube, opts: LoopOptions) -> None:
    log.info("autoscaler loop started (tick %.1fs)", opts.tick_s)
    while True:
        started = time.monotonic()
        try:
            if opts.namespaces:
                objs = [o for ns in opts.namespaces for o in await kube.list(api.KIND, ns)]
            else:
                objs = await kube.list(api.KIND)
            now = time.time()
            for body in objs:
                meta = body["metadata"]
                if meta.get("deletionTimestamp"):
                    continue
                try:
                    async with reconcile.lock_for(meta["namespace"], meta["name"]):
                        await step(kube, body, opts, now)
                except asyncio.CancelledError:
                    raise
                except Exception:
                    log.exception(
                        "autoscaling %s/%s failed; retrying next tick", meta["namespace"], meta["name"]
                    )
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("autoscaler tick failed; retrying")
        await asyncio.sleep(max(0.05, opts.tick_s - (time.monotonic() - started)))
