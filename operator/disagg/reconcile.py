"""Reconciliation: make the pool children match a DisaggDeployment, report status.

Level-triggered and idempotent: every call reads the current children, computes
what they should be with the pure builders, and writes only what differs. An
unchanged object costs reads, never writes.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
from collections.abc import Mapping
from typing import Any

from kubernetes_asyncio.client.exceptions import ApiException
from pydantic import ValidationError

from disagg import api, builders, names, status
from disagg.cache import POOL_CHILD_KINDS
from disagg.kube import ApiError, Conflict, Kube, NotFound

log = logging.getLogger("disagg.reconcile")

ANNOTATION_APPLIED = names.ANNOTATION_APPLIED
#: The pools' children reconcile writes (the pods it reads are the ReplicaSets' doing).
APPLIED_KINDS = ("Deployment", "Service", "PodDisruptionBudget")

_locks: dict[tuple[str, str], asyncio.Lock] = {}

# The autoscaler's latest targets per DisaggDeployment (shown as status.pools.*.desiredReplicas).
DESIRED: dict[tuple[str, str], dict[str, int]] = {}
# Objects (namespace, name, uid) without a router whose last reconcile found no router object:
# their next reconciles skip the router's LISTs (five kinds). A restart lists once again.
NO_ROUTER: set[tuple[str, str, str | None]] = set()


def lock_for(namespace: str, name: str) -> asyncio.Lock:
    """One lock per DisaggDeployment: reconciliation, status and autoscaling never interleave."""
    return _locks.setdefault((namespace, name), asyncio.Lock())


def forget(namespace: str, name: str) -> None:
    """Drop what is held in memory for a DisaggDeployment that is gone (its lock only when free)."""
    DESIRED.pop((namespace, name), None)
    for key in [k for k in NO_ROUTER if k[:2] == (namespace, name)]:
        NO_ROUTER.discard(key)
    lock = _locks.get((namespace, name))
    if lock is not None and not lock.locked():
        del _locks[(namespace, name)]


def applied_hash(obj: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]


def with_hash(obj: dict[str, Any]) -> dict[str, Any]:
    h = applied_hash(obj)
    obj["metadata"].setdefault("annotations", {})[ANNOTATION_APPLIED] = h
    return obj


def owner_selector(name: str) -> str:
    return f"{names.LABEL_DEPLOYMENT}={name}"


def clamp(n: int, pool: api.Pool) -> int:
    return max(pool.min_replicas, min(pool.max_replicas, n))


async def read_children(kube: Kube, namespace: str, name: str) -> dict[str, list[dict]]:
    sel = owner_selector(name)
    kinds = POOL_CHILD_KINDS
    results = await asyncio.gather(*(kube.list(k, namespace, sel) for k in kinds))
    return dict(zip(kinds, results, strict=True))


def by_pool(objs: list[dict]) -> dict[str, dict]:
    return {(o["metadata"].get("labels") or {}).get(names.LABEL_POOL, ""): o for o in objs}


def target_replicas(spec: api.DisaggDeploymentSpec, deployments: Mapping[str, dict]) -> dict[str, int]:
    """Replicas each pool Deployment should have now.

    With autoscaling on, the count belongs to the autoscaler: keep what the
    Deployment has (clamped to the bounds, which a spec edit may have moved).
    Otherwise the spec's `replicas` rules.
    """
    out: dict[str, int] = {}
    for pool_name, pool in api.pools(spec).items():
        existing = deployments.get(pool_name)
        if spec.autoscaling.enabled and existing is not None:
            out[pool_name] = clamp(int(existing["spec"].get("replicas", pool.initial_replicas)), pool)
        else:
            out[pool_name] = pool.initial_replicas
    return out


def status_changed(body: Mapping[str, Any], new_status: Mapping[str, Any]) -> bool:
    """Whether writing `new_status` changes the object's status (conditions by their content)."""
    old = body.get("status") or {}
    return any(
        (not status.conditions_equal(old.get(k), v)) if k == "conditions" else old.get(k) != v
        for k, v in new_status.items()
    )


async def write_status(kube: Kube, body: Mapping[str, Any], new_status: dict[str, Any]) -> bool:
    """Server-side apply of the operator's status fields; skipped when nothing changed."""
    if not status_changed(body, new_status):
        return False
    old = body.get("status") or {}
    meta = body["metadata"]
    payload = dict(new_status)
    if "pools" in payload and isinstance(old.get("pools"), dict):
        # A merge patch keeps map keys it does not mention: null out removed pools.
        payload["pools"] = {
            **{k: None for k in old["pools"] if k not in payload["pools"]},
            **payload["pools"],
        }
    patch = {"status": payload}
    try:
        await kube.patch(api.KIND, meta["namespace"], meta["name"], patch, subresource="status")
    except NotFound:
        return False
    return True


async def reconcile(
    kube: Kube,
    body: Mapping[str, Any],
    replicas: Mapping[str, int] | None = None,
    defer_status: bool = False,
) -> dict:
    """Bring the children of one DisaggDeployment to their desired state, then update its status.

    `replicas` overrides the pool sizes (the autoscaler passes its decision).
    Returns a summary: {"applied": [...], "deleted": [...], "statusWritten": bool}.
    With `defer_status` (the autoscaler, which writes the status of its decision next) a valid
    spec's status is not written but returned as summary["deferredStatus"], for the caller to
    write in its own patch, and the pool Events (PoolCreated, PoolUpdated) are not posted but
    returned as summary["deferredEvents"] ([(reason, message)]), for the caller's own Event to
    carry: one status write and one Event per growing decision instead of two of each.
    """
    meta = body["metadata"]
    ns, name = meta["namespace"], meta["name"]
    generation = meta.get("generation")
    summary: dict[str, Any] = {"applied": [], "deleted": [], "statusWritten": False}
    # A name the API server would refuse for a child (objects stored before the CRD's name rule)
    # is an invalid spec too: nothing is created rather than half the pools.
    msg = api.name_error(name)
    spec = None
    if msg is None:
        try:
            spec = api.parse_spec(body.get("spec") or {})
        except ValidationError as exc:
            msg = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())[:1000]
    if spec is None:
        assert msg is not None
        conds = status.merge_conditions(
            (body.get("status") or {}).get("conditions"),
            [
                status.condition(names.COND_INVALID_SPEC, True, "ValidationFailed", msg, generation),
                status.condition(
                    names.COND_READY, False, "InvalidSpec", "the spec is invalid: " + msg, generation
                ),
            ],
        )
        written = await write_status(kube, body, {"observedGeneration": generation, "conditions": conds})
        if written:
            await kube.event(body, names.EVENT_INVALID_SPEC, msg, type_="Warning")
        summary["statusWritten"] = written
        return summary

    try:
        return await _reconcile_valid(kube, body, spec, replicas, summary, defer_status)
    except (ApiError, ApiException, Conflict, NotFound) as exc:
        # Whatever the API server refused reaches the object, not only the log.
        detail = api_error_message(exc)
        log.warning("reconcile of %s/%s failed: %s", ns, name, detail)
        conds = status.merge_conditions(
            (body.get("status") or {}).get("conditions"),
            [status.condition(names.COND_RECONCILE_FAILED, True, "ApiError", detail, generation)],
        )
        try:
            if await write_status(kube, body, {"conditions": conds}):
                await kube.event(body, names.COND_RECONCILE_FAILED, detail, type_="Warning")
        except (ApiError, ApiException, Conflict) as status_exc:
            log.warning("could not report the failure on %s/%s: %s", ns, name, status_exc)
        raise


def api_error_message(exc: BaseException) -> str:
    """The API server's own words for a failed call (its Status message), bounded."""
    if isinstance(exc, ApiException):
        text = f"{exc.status} {exc.reason}"
        try:
            body = json.loads(exc.body or "{}")
        except (TypeError, ValueError):
            body = {}
        if isinstance(body, dict) and body.get("message"):
            text = f"{exc.status}: {body['message']}"
        return text[:1024]
    return str(exc)[:1024]


async def _reconcile_valid(
    kube: Kube,
    body: Mapping[str, Any],
    spec: api.DisaggDeploymentSpec,
    replicas: Mapping[str, int] | None,
    summary: dict[str, Any],
    defer_status: bool = False,
) -> dict:
    meta = body["metadata"]
    ns, name = meta["namespace"], meta["name"]
    generation = meta.get("generation")
    children = await read_children(kube, ns, name)
    deployments = by_pool(children["Deployment"])
    want = target_replicas(spec, deployments)
    if replicas:
        want.update({k: clamp(int(v), api.pools(spec)[k]) for k, v in replicas.items() if k in want})
    owner = builders.Owner.from_body(body)
    existing = {(o["kind"], o["metadata"]["name"]): o for k in APPLIED_KINDS for o in children[k]}

    writes: list[tuple[dict[str, Any], bool]] = []  # (object, created)
    for obj in builders.all_objects(owner, spec, want):
        obj.setdefault("kind", obj["kind"])
        with_hash(obj)
        cur = existing.get((obj["kind"], obj["metadata"]["name"]))
        cur_hash = ((cur or {}).get("metadata", {}).get("annotations") or {}).get(ANNOTATION_APPLIED)
        drifted = (
            cur is not None
            and obj["kind"] == "Deployment"
            and cur["spec"].get("replicas") != obj["spec"].get("replicas")
        )
        if cur is not None and cur_hash == obj["metadata"]["annotations"][ANNOTATION_APPLIED] and not drifted:
            continue
        writes.append((obj, cur is None))
    # The children are independent: written at once, so a reconcile costs one round trip to the
    # API server for all of them rather than one each.
    results = await asyncio.gather(*(kube.apply(obj) for obj, _ in writes), return_exceptions=True)
    done: dict[bool, list[str]] = {True: [], False: []}  # created, updated
    for (obj, created), result in zip(writes, results, strict=True):
        if isinstance(result, BaseException):
            continue
        if obj["kind"] == "Deployment":
            deployments[(obj["metadata"].get("labels") or {}).get(names.LABEL_POOL, "")] = result
        summary["applied"].append(f"{obj['kind']}/{obj['metadata']['name']}")
        done[created].append(
            f"{obj['kind']} {obj['metadata']['name']}"
            + (f" (replicas {obj['spec']['replicas']})" if obj["kind"] == "Deployment" else "")
        )
    # One Event per verb and reconcile, naming every child it wrote (or left to the caller).
    pool_events = [
        (reason, f"{verb} " + ", ".join(done[created]))
        for created, reason, verb in (
            (True, names.EVENT_POOL_CREATED, "Created"),
            (False, names.EVENT_POOL_UPDATED, "Updated"),
        )
        if done[created]
    ]
    failed = next((r for r in results if isinstance(r, BaseException)), None)
    if defer_status and failed is None:
        summary["deferredEvents"] = pool_events
    else:  # a failed reconcile returns nothing to the caller: what it wrote is told here
        for reason, message in pool_events:
            await kube.event(body, reason, message)
    if failed is not None:
        raise failed

    # Pools removed from the spec: delete their children.
    present = set(api.pool_names(spec))
    for kind in APPLIED_KINDS:
        for obj in children[kind]:
            pool = (obj["metadata"].get("labels") or {}).get(names.LABEL_POOL)
            if pool not in present and await kube.delete(kind, ns, obj["metadata"]["name"]):
                summary["deleted"].append(f"{kind}/{obj['metadata']['name']}")
                deployments.pop(pool, None)
                await kube.event(
                    body,
                    names.EVENT_POOL_DELETED,
                    f"Deleted {kind} {obj['metadata']['name']} (pool {pool} removed)",
                )

    await reconcile_router(kube, body, spec, owner, summary)
    await reconcile_pod_monitor(kube, body, spec, owner, summary)

    # New pods become routable once running (the operator owns the readiness gate).
    await asyncio.gather(*(admit(kube, pod) for pod in children["Pod"] if status.needs_admission(pod)))

    desired = dict(want)
    if spec.autoscaling.enabled:
        desired.update({k: v for k, v in DESIRED.get((ns, name), {}).items() if k in desired})
    pools = status.pool_status(spec, deployments, children["Pod"], desired)
    warnings = api.spec_warnings(spec)
    conds = status.merge_conditions(
        (body.get("status") or {}).get("conditions"),
        [
            *status.child_conditions(
                spec, deployments, pools, generation, status.unschedulable_pods(children["Pod"])
            ),
            status.condition(names.COND_INVALID_SPEC, False, "Valid", "the spec is valid", generation),
            status.condition(
                names.COND_RECONCILE_FAILED, False, "Reconciled", "every child was written", generation
            ),
            warning_condition(warnings, generation),
            status.draining_condition(pools, generation),
        ],
    )
    new_status = {
        "observedGeneration": generation,
        "conditions": conds,
        "pools": pools,
        "ratio": status.ratio(pools),
        "endpoint": builders.router_endpoint(owner, spec),
    }
    if defer_status and failed is None:
        summary["deferredStatus"] = new_status
    else:
        summary["statusWritten"] = await write_status(kube, body, new_status)
    # (a changed condition is a changed status: the deferred write carries it)
    if (
        (defer_status or summary["statusWritten"])
        and warnings
        and _condition_changed(body, conds, names.COND_WARNING)
    ):
        await kube.event(body, "SpecWarning", warning_text(warnings), type_="Warning")
    return summary


def warning_text(warnings: list[tuple[str, str]]) -> str:
    return "; ".join(f"{field}: {why}" for field, why in warnings)[:1024]


def warning_condition(warnings: list[tuple[str, str]], generation: int | None) -> dict[str, Any]:
    """`Warning` condition: True (naming each field) while the spec has allowed but unusual values."""
    if warnings:
        return status.condition(names.COND_WARNING, True, "UnusualValues", warning_text(warnings), generation)
    return status.condition(names.COND_WARNING, False, "NoWarnings", "no unusual values", generation)


def _condition_changed(body: Mapping[str, Any], conds: list[dict[str, Any]], ctype: str) -> bool:
    def pick(cs: Any) -> tuple | None:
        c = next((c for c in cs or [] if c.get("type") == ctype), None)
        return (c.get("status"), c.get("message")) if c else None

    return pick((body.get("status") or {}).get("conditions")) != pick(conds)


async def reconcile_router(
    kube: Kube, body: Mapping[str, Any], spec: api.DisaggDeploymentSpec, owner: builders.Owner, summary: dict
) -> None:
    """Apply the router's objects (spec.router), delete them when it is disabled.

    A refused write (e.g. the operator may not create Roles) is reported as an event and
    logged; the pools are reconciled regardless.
    """
    sel = f"{names.LABEL_ROUTER}={owner.name}"
    wanted = builders.router_objects(owner, spec)
    memo = (owner.namespace, owner.name, body["metadata"].get("uid"))
    if not wanted and memo in NO_ROUTER:
        return  # no router, and none was left the last time it was looked for
    NO_ROUTER.discard(memo)
    try:
        found = await asyncio.gather(*(kube.list(k, owner.namespace, sel) for k in builders.ROUTER_KINDS))
        existing = {
            (k, o["metadata"]["name"]): o
            for k, objs in zip(builders.ROUTER_KINDS, found, strict=True)
            for o in objs
        }
        if not wanted and not existing:
            NO_ROUTER.add(memo)
        for obj in wanted:
            with_hash(obj)
            key = (obj["kind"], obj["metadata"]["name"])
            cur = existing.pop(key, None)
            cur_hash = ((cur or {}).get("metadata", {}).get("annotations") or {}).get(ANNOTATION_APPLIED)
            drifted = (
                cur is not None
                and obj["kind"] == "Deployment"
                and cur["spec"].get("replicas") != obj["spec"]["replicas"]
            )
            if (
                cur is not None
                and cur_hash == obj["metadata"]["annotations"][ANNOTATION_APPLIED]
                and not drifted
            ):
                continue
            await kube.apply(obj)
            verb = "Created" if cur is None else "Updated"
            summary["applied"].append(f"{key[0]}/{key[1]}")
            await kube.event(body, f"Router{verb}", f"{verb} {key[0]} {key[1]}")
        for (kind, name), _obj in existing.items():  # router disabled (or a kind no longer used)
            if await kube.delete(kind, owner.namespace, name):
                summary["deleted"].append(f"{kind}/{name}")
                await kube.event(body, "RouterDeleted", f"Deleted {kind} {name}")
    except ApiError as exc:
        log.warning("router of %s/%s not reconciled: %s", owner.namespace, owner.name, exc)
        await kube.event(body, "RouterFailed", f"router not reconciled: {exc}"[:1000], type_="Warning")


#: The operator may manage PodMonitors at all (`disagg run --no-pod-monitors` clears it: the chart
#: then grants no rights on them).
POD_MONITORS_ALLOWED = True
#: How long an answer of "is the PodMonitor CRD served?" is reused (a CRD installed later is
#: picked up within this time).
SERVED_TTL_S = 60.0
_served_cache: dict[str, tuple[float, bool]] = {}
# DisaggDeployment generations already warned that their PodMonitor cannot be created.
_warned_unserved: set[str] = set()


async def kind_served(kube: Kube, kind: str, now: float | None = None) -> bool:
    """Kube.served, remembered for SERVED_TTL_S. An API error is "not known": False, not cached."""
    now = time.monotonic() if now is None else now
    hit = _served_cache.get(kind)
    if hit is not None and now - hit[0] < SERVED_TTL_S:
        return hit[1]
    try:
        served = await kube.served(kind)
    except (ApiError, ApiException) as exc:
        log.warning("could not tell whether %s is served: %s", kind, exc)
        return False
    _served_cache[kind] = (now, served)
    return served


async def reconcile_pod_monitor(
    kube: Kube, body: Mapping[str, Any], spec: api.DisaggDeploymentSpec, owner: builders.Owner, summary: dict
) -> None:
    """Apply the deployment's PodMonitor (spec.monitoring.podMonitor), delete it when turned off.

    auto: only where the Prometheus Operator's PodMonitor CRD is served. A refused write or a
    missing CRD with `enabled` is reported as a Warning event; the pools are reconciled regardless.
    """
    if not POD_MONITORS_ALLOWED:
        return
    mode = spec.monitoring.pod_monitor
    served = await kind_served(kube, builders.POD_MONITOR_KIND)
    if not served:
        if mode == "enabled":
            key = f"{owner.namespace}/{owner.name}/{body['metadata'].get('generation')}"
            if key not in _warned_unserved:
                _warned_unserved.add(key)
                await kube.event(
                    body,
                    "PodMonitorUnavailable",
                    "spec.monitoring.podMonitor is enabled but the API server does not serve "
                    "monitoring.coreos.com/v1 PodMonitor (install the Prometheus Operator's CRDs, "
                    "or scrape with the configuration in docs/metrics.md)",
                    type_="Warning",
                )
        return
    sel = f"{names.LABEL_DEPLOYMENT}={owner.name}"
    try:
        existing = {
            o["metadata"]["name"]: o for o in await kube.list(builders.POD_MONITOR_KIND, owner.namespace, sel)
        }
        if mode != "disabled":
            obj = with_hash(builders.pod_monitor(owner, spec))
            cur = existing.pop(obj["metadata"]["name"], None)
            cur_hash = ((cur or {}).get("metadata", {}).get("annotations") or {}).get(ANNOTATION_APPLIED)
            if cur is None or cur_hash != obj["metadata"]["annotations"][ANNOTATION_APPLIED]:
                await kube.apply(obj)
                verb = "Created" if cur is None else "Updated"
                summary["applied"].append(f"PodMonitor/{obj['metadata']['name']}")
                await kube.event(body, f"PodMonitor{verb}", f"{verb} PodMonitor {obj['metadata']['name']}")
        for pm_name in existing:  # turned off (or renamed)
            if await kube.delete(builders.POD_MONITOR_KIND, owner.namespace, pm_name):
                summary["deleted"].append(f"PodMonitor/{pm_name}")
                await kube.event(body, "PodMonitorDeleted", f"Deleted PodMonitor {pm_name}")
    except (ApiError, ApiException, NotFound, ValueError) as exc:
        detail = api_error_message(exc)
        log.warning("PodMonitor of %s/%s not reconciled: %s", owner.namespace, owner.name, detail)
        await kube.event(
            body, "PodMonitorFailed", f"PodMonitor not reconciled: {detail}"[:1000], type_="Warning"
        )


async def set_routable(kube: Kube, pod: Mapping[str, Any], routable: bool, reason: str, message: str) -> None:
    meta = pod["metadata"]
    patch = {
        "status": {
            "conditions": [
                {
                    "type": names.READINESS_GATE,
                    "status": "True" if routable else "False",
                    "reason": reason,
                    "message": message,
                    "lastTransitionTime": status.now_iso(),
                }
            ]
        }
    }
    try:
        await kube.patch(
            "Pod", meta["namespace"], meta["name"], patch, subresource="status", patch_type="strategic"
        )
    except NotFound:
        pass


async def admit(kube: Kube, pod: Mapping[str, Any]) -> None:
    await set_routable(kube, pod, True, names.GATE_ADMITTED, "running; routable by disagg-operator")
