"""Pure computation of a DisaggDeployment's status from its children.

No Kubernetes I/O here: the reconciler hands in the Deployments and Pods it
read, and gets back the status dict to write (or nothing, when unchanged).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from typing import Any

from disagg import api, names
from disagg.names import LABEL_POOL, READINESS_GATE

ANNOTATION_DRAIN = names.ANNOTATION_DRAIN


def now_iso() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(s: str | None) -> float | None:
    """Unix seconds of a Kubernetes timestamp (with or without fractional seconds); None if unreadable."""
    if not s:
        return None
    try:
        t = dt.datetime.fromisoformat(s.replace("Z", "+00:00"))
    except ValueError:
        return None
    return (t if t.tzinfo else t.replace(tzinfo=dt.UTC)).timestamp()


def condition(
    ctype: str, status: bool | str, reason: str, message: str, generation: int | None
) -> dict[str, Any]:
    if isinstance(status, bool):
        status = "True" if status else "False"
    return {
        "type": ctype,
        "status": status,
        "reason": reason,
        "message": message,
        "observedGeneration": generation,
    }


def merge_conditions(
    old: Iterable[Mapping[str, Any]] | None, new: Iterable[Mapping[str, Any]], now: str | None = None
) -> list[dict[str, Any]]:
    """New conditions replace old ones of the same type; lastTransitionTime moves only on a status change.

    Conditions of other types in `old` (owned by the autoscaler, say) are kept.
    """
    now = now or now_iso()
    by_type = {c["type"]: dict(c) for c in (old or [])}
    for c in new:
        prev = by_type.get(c["type"])
        merged = dict(c)
        if prev and prev.get("status") == c["status"] and prev.get("lastTransitionTime"):
            merged["lastTransitionTime"] = prev["lastTransitionTime"]
        else:
            merged["lastTransitionTime"] = now
        by_type[c["type"]] = merged
    order = {t: i for i, t in enumerate(names.CONDITION_TYPES)}
    return sorted(by_type.values(), key=lambda c: (order.get(c["type"], 99), c["type"]))


def conditions_equal(a: Iterable[Mapping[str, Any]] | None, b: Iterable[Mapping[str, Any]] | None) -> bool:
    def key(cs: Iterable[Mapping[str, Any]] | None) -> list[tuple]:
        return sorted(
            (c["type"], c["status"], c.get("reason"), c.get("message"), c.get("observedGeneration"))
            for c in (cs or [])
        )

    return key(a) == key(b)


def pod_condition(pod: Mapping[str, Any], ctype: str) -> str | None:
    for c in pod.get("status", {}).get("conditions", []) or []:
        if c.get("type") == ctype:
            return c.get("status")
    return None


def is_draining(pod: Mapping[str, Any]) -> bool:
    return ANNOTATION_DRAIN in (pod.get("metadata", {}).get("annotations") or {})


def needs_admission(pod: Mapping[str, Any]) -> bool:
    """A running pod whose routable gate was never set, and which is not being drained."""
    meta = pod.get("metadata", {})
    if meta.get("deletionTimestamp") or is_draining(pod):
        return False
    if pod.get("status", {}).get("phase") != "Running":
        return False
    gates = [g.get("conditionType") for g in pod.get("spec", {}).get("readinessGates", []) or []]
    return READINESS_GATE in gates and pod_condition(pod, READINESS_GATE) is None


def pool_status(
    spec: api.DisaggDeploymentSpec,
    deployments: Mapping[str, Mapping[str, Any]],
    pods: Iterable[Mapping[str, Any]],
    desired: Mapping[str, int] | None = None,
) -> dict[str, dict[str, Any]]:
    """Per pool: replicas, readyReplicas, desiredReplicas, drainingPods."""
    draining: dict[str, list[str]] = {}
    for p in pods:
        if is_draining(p):
            pool = (p["metadata"].get("labels") or {}).get(LABEL_POOL, "")
            draining.setdefault(pool, []).append(p["metadata"]["name"])
    out: dict[str, dict[str, Any]] = {}
    for name in api.pool_names(spec):
        d = deployments.get(name) or {}
        st = d.get("status", {}) or {}
        want = (desired or {}).get(name, (d.get("spec") or {}).get("replicas", 0))
        out[name] = {
            "replicas": int(st.get("replicas", 0) or 0),
            "readyReplicas": int(st.get("readyReplicas", 0) or 0),
            "desiredReplicas": int(want or 0),
            "drainingPods": sorted(draining.get(name, [])),
        }
    return out


def _deployment_problem(d: Mapping[str, Any]) -> str | None:
    for c in (d.get("status") or {}).get("conditions", []) or []:
        if c.get("type") == "ReplicaFailure" and c.get("status") == "True":
            return c.get("message") or c.get("reason")
        if c.get("type") == "Progressing" and c.get("status") == "False":
            return c.get("message") or c.get("reason")
    return None


def child_conditions(
    spec: api.DisaggDeploymentSpec,
    deployments: Mapping[str, Mapping[str, Any]],
    pools: Mapping[str, Mapping[str, Any]],
    generation: int | None,
    unschedulable: Mapping[str, int] | None = None,
) -> list[dict[str, Any]]:
    """Ready, Progressing and Degraded from the pool Deployments."""
    not_ready: list[str] = []
    rolling: list[str] = []
    problems: list[str] = []
    for name in api.pool_names(spec):
        d = deployments.get(name)
        ps = pools[name]
        if d is None:
            not_ready.append(f"{name}: Deployment not created yet")
            continue
        st = d.get("status") or {}
        want = (d.get("spec") or {}).get("replicas", 0)
        updated = int(st.get("updatedReplicas", 0) or 0)
        if (st.get("observedGeneration") or 0) < (d["metadata"].get("generation") or 0):
            rolling.append(f"{name}: controller has not observed the latest spec")
        elif updated < want or ps["replicas"] > want:
            rolling.append(f"{name}: {updated}/{want} replicas updated, {ps['replicas']} present")
        if ps["readyReplicas"] < want:
            not_ready.append(f"{name}: {ps['readyReplicas']}/{want} ready")
        problem = _deployment_problem(d)
        if problem:
            problems.append(f"{name}: {problem}")
        if unschedulable and unschedulable.get(name):
            problems.append(f"{name}: {unschedulable[name]} pod(s) unschedulable (not enough GPUs?)")
    ready = not not_ready and not rolling
    return [
        condition(
            names.COND_READY,
            ready,
            "AllPoolsReady" if ready else "PoolsNotReady",
            "every pool has its desired replicas ready" if ready else "; ".join(not_ready + rolling),
            generation,
        ),
        condition(
            names.COND_PROGRESSING,
            bool(rolling or not_ready),
            "RollingOut" if rolling else ("ScalingUp" if not_ready else "Stable"),
            "; ".join(rolling + not_ready) or "no rollout or scale in progress",
            generation,
        ),
        condition(
            names.COND_DEGRADED,
            bool(problems),
            "PoolProblem" if problems else "AsExpected",
            "; ".join(problems) or "no pool reports a problem",
            generation,
        ),
    ]


def unschedulable_pods(pods: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for p in pods:
        for c in p.get("status", {}).get("conditions", []) or []:
            if (
                c.get("type") == "PodScheduled"
                and c.get("status") == "False"
                and c.get("reason") == "Unschedulable"
            ):
                pool = (p["metadata"].get("labels") or {}).get(LABEL_POOL, "")
                out[pool] = out.get(pool, 0) + 1
    return out


def ratio(pools: Mapping[str, Mapping[str, Any]]) -> str:
    return api.format_ratio({k: v["desiredReplicas"] for k, v in pools.items()})


def draining_condition(pools: Mapping[str, Mapping[str, Any]], generation: int | None) -> dict[str, Any]:
    """Draining=True while any pod is being drained, naming them."""
    pods = [f"{pool}/{name}" for pool, st in pools.items() for name in st.get("drainingPods") or []]
    return condition(
        names.COND_DRAINING,
        bool(pods),
        "DrainInProgress" if pods else "NoDrain",
        ("draining " + ", ".join(pods))[:1000] if pods else "no pod is being drained",
        generation,
    )
