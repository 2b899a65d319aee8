"""Safe drain: victim choice and the per-pod drain state machine (pure).

A drain has three observable states, all persisted on the pod itself so that
an operator restart resumes it:

1. draining: annotation `disagg.dev/drain` = {"since", "deadline", "onTimeout"},
   readiness gate `disagg.dev/routable` False (the pod leaves the Service's
   endpoints; routers stop sending work), and
   `controller.kubernetes.io/pod-deletion-cost` at the minimum, so the
   ReplicaSet picks exactly this pod when its Deployment shrinks;
2. removable: its in-flight requests and (prefill) pending KV sends read zero
   from a fresh sample taken at least `ROUTING_SETTLE_S` after the drain began (a
   sample from while routers could still send it work says nothing about the
   requests they sent since); a missing or stale sample is never read as zero;
3. removing: the Deployment's replicas were lowered by one for it (annotation
   gets "removing": <time>); the ReplicaSet deletes it. If the ReplicaSet
   removed another pod instead, the victim is re-admitted.

Timeout: `proceed` removes the pod anyway (an Event says how much work it had), but
never while its work is unknown (no fresh metrics): the drain is then held until the
metrics return; `readmit` makes it routable again and cancels that part of the scale-down.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from disagg.names import ANNOTATION_DRAIN, LABEL_POD_TEMPLATE_HASH, READINESS_GATE
from disagg.status import is_draining, parse_time, pod_condition

MIN_DELETION_COST = "-2147483648"
#: Seconds routers may go on sending a drained pod new work after its drain began: the gate's
#: write, the EndpointSlice update and each router's watch of it, or the router API call for
#: routers that ignore readiness. Only an in-flight count sampled after this tells that
#: nothing more is on its way; Kubernetes' own advice for endpoint propagation (a preStop
#: sleep) is of the same order.
ROUTING_SETTLE_S = 5.0


@dataclass(frozen=True)
class DrainRecord:
    since: float
    deadline: float
    on_timeout: str  # proceed | readmit
    removing: float | None = None
    idle: bool = False  # never routable when the drain started (pending or not yet admitted): no work

    def to_annotation(self) -> str:
        d: dict[str, Any] = {
            "since": round(self.since, 3),
            "deadline": round(self.deadline, 3),
            "onTimeout": self.on_timeout,
        }
        if self.removing is not None:
            d["removing"] = round(self.removing, 3)
        if self.idle:
            d["idle"] = True
        return json.dumps(d, sort_keys=True)

    @classmethod
    def from_pod(cls, pod: Mapping[str, Any]) -> DrainRecord | None:
        raw = (pod.get("metadata", {}).get("annotations") or {}).get(ANNOTATION_DRAIN)
        if not raw:
            return None
        try:
            d = json.loads(raw)
            return cls(
                float(d["since"]),
                float(d["deadline"]),
                str(d.get("onTimeout", "readmit")),
                float(d["removing"]) if d.get("removing") is not None else None,
                bool(d.get("idle")),
            )
        except (ValueError, KeyError, TypeError):
            # A damaged record: treat as an expired drain that re-admits (never stuck unroutable).
            return cls(0.0, 0.0, "readmit")


def is_active(pod: Mapping[str, Any]) -> bool:
    """Present, not being deleted, and not failed."""
    return not pod["metadata"].get("deletionTimestamp") and pod.get("status", {}).get("phase") not in (
        "Failed",
        "Succeeded",
    )


def is_ready(pod: Mapping[str, Any]) -> bool:
    return pod.get("status", {}).get("phase") == "Running" and pod_condition(pod, "Ready") == "True"


@dataclass(frozen=True)
class PodView:
    """One pod as victim choice and the autoscaling decision need it."""

    name: str
    phase: str  # Pending | Running | ...
    active: bool  # present, not being deleted, not failed or finished
    gate_open: bool  # the routable readiness gate is True
    drain: DrainRecord | None  # its drain record, when being drained
    created: float | None = None  # creation time (unix seconds)
    revision: str | None = None  # its ReplicaSet's pod-template-hash

    @property
    def draining(self) -> bool:
        return self.drain is not None

    @property
    def routable(self) -> bool:
        """Receives work: active, running, gate open and not being drained."""
        return self.active and self.phase == "Running" and self.gate_open and not self.draining

    @property
    def leaving(self) -> bool:
        """Being drained and not yet handed to its ReplicaSet for removal (can be re-admitted)."""
        return self.active and self.drain is not None and self.drain.removing is None


def pod_view(pod: Mapping[str, Any]) -> PodView:
    """A Kubernetes pod (dict) as victim choice and the decision see it."""
    meta = pod["metadata"]
    return PodView(
        name=meta["name"],
        phase=pod.get("status", {}).get("phase") or "Unknown",
        active=is_active(pod),
        gate_open=pod_condition(pod, READINESS_GATE) == "True",
        drain=DrainRecord.from_pod(pod) if is_draining(pod) else None,
        created=parse_time(meta.get("creationTimestamp")),
        revision=(meta.get("labels") or {}).get(LABEL_POD_TEMPLATE_HASH),
    )


def rolling_out(pods: Sequence[PodView | Mapping[str, Any]]) -> bool:
    """Active pods of more than one ReplicaSet: the pool's Deployment is rolling out. Lowering its
    replicas now lets the Deployment controller pick which ReplicaSet shrinks, so the drained pod
    (whose deletion cost only orders pods within its own ReplicaSet) may not be the one removed."""
    views = [p if isinstance(p, PodView) else pod_view(p) for p in pods]
    return len({p.revision for p in views if p.active and p.revision}) > 1


def choose_victims(
    pods: Sequence[PodView | Mapping[str, Any]], in_flight: Mapping[str, float | None], n: int
) -> list[str]:
    """The `n` pods a scale-down should drain.

    Already-draining pods are not candidates. Pods that hold no work for sure come
    first (pending or not yet routable), then running pods by least in-flight work; a pod
    whose in-flight count is unknown ranks last. Ties go to the youngest pod.
    """
    if n <= 0:
        return []
    views = [p if isinstance(p, PodView) else pod_view(p) for p in pods]
    cands = [p for p in views if p.active and not p.draining]

    def key(p: PodView) -> tuple:
        idle_for_sure = not (p.phase == "Running" and p.gate_open)
        work = in_flight.get(p.name)
        youngest_first = -p.created if p.created is not None else -math.inf
        return (0 if idle_for_sure else 1, work is None, work or 0.0, youngest_first, p.name)

    return [p.name for p in sorted(cands, key=key)[:n]]


@dataclass(frozen=True)
class DrainAction:
    pod: str
    action: str  # wait | remove | readmit | timeout_proceed | hold | verify
    detail: str = ""


def next_action(
    pod: Mapping[str, Any],
    record: DrainRecord,
    in_flight: float | None,
    now: float,
    *,
    sampled_at: float | None,
    left_routing_at: float | None = None,
) -> DrainAction:
    """What to do with one draining pod now.

    `in_flight` is its work from a fresh sample (None: unknown) and `sampled_at` when that
    sample was taken, on the operator's clock (None: not known). A count of zero removes the
    pod only from a sample taken at least `ROUTING_SETTLE_S` after the drain began: one taken
    earlier misses the requests routers sent the pod until they learnt it was leaving, and the
    pod's deletion would lose them.
    `left_routing_at` is when routers were last told to stop (a drain resumed by a restarted
    operator is taken out of routing again); None: when the drain began.
    """
    name = pod["metadata"]["name"]
    if record.removing is not None:
        return DrainAction(name, "verify", "waiting for the ReplicaSet to remove it")
    if record.idle or pod.get("status", {}).get("phase") == "Pending":
        return DrainAction(name, "remove", "never received work")
    if in_flight is not None and in_flight <= 0:
        settle_from = max(record.since, left_routing_at or record.since)
        if sampled_at is not None and sampled_at >= settle_from + ROUTING_SETTLE_S:
            return DrainAction(name, "remove", "no work in flight")
        if now < record.deadline:
            return DrainAction(name, "wait", "no work in flight in a sample from before routing settled")
    if now >= record.deadline:
        work = "unknown (no fresh metrics)" if in_flight is None else f"{in_flight:g} in flight"
        if record.on_timeout == "proceed" and in_flight is None:
            # Never remove a pod whose work is unknown: hold until the metrics return (then
            # proceed with what they show) or the user acts.
            return DrainAction(name, "hold", f"drain timed out with {work}; held until metrics return")
        if record.on_timeout == "proceed":
            return DrainAction(name, "timeout_proceed", f"drain timed out with {work}; removing anyway")
        return DrainAction(name, "readmit", f"drain timed out with {work}; re-admitted")
    work = "unknown (no fresh metrics)" if in_flight is None else f"{in_flight:g} in flight"
    return DrainAction(name, "wait", work)


def pending_companions(pool_pods: Sequence[Mapping[str, Any]], victims: set[str]) -> list[str]:
    """Non-victim pods the ReplicaSet would delete before any victim when replicas drop.

    It deletes unscheduled and pending pods first, then not-ready ones by deletion cost:
    a running victim (not ready, minimum cost) goes before every running non-victim, but
    never before a pending pod. A pending pod holds no work, so a removal lowers the
    replicas by these too, and the ReplicaSet then takes them and the victims together.
    """
    out = []
    for p in pool_pods:
        name = p["metadata"]["name"]
        if name in victims or not is_active(p):
            continue
        if p.get("status", {}).get("phase") != "Running":
            out.append(name)
    return out
