"""At most one active operator: a coordination.k8s.io/v1 Lease.

Kopf's peering only pauses operators that see each other, and equal priorities freeze
all of them; it is not leader election. With `disagg run --leader-election`, the
operator's startup waits until it holds the Lease, renews it every `renew_s`, and
exits the process (so its pod restarts as a standby) as soon as it cannot prove it
still holds it: before the Lease can expire for the others, the old leader is gone.

Every write is an optimistic-concurrency update (the Lease's resourceVersion), so two
candidates can never both believe they won the same term.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import os
import socket
import time
import uuid
from collections.abc import Callable
from typing import Any

from disagg.kube import ApiError, Conflict, Kube, NotFound
from disagg.status import parse_time

log = logging.getLogger("disagg.leader")


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def default_identity() -> str:
    return f"{os.environ.get('HOSTNAME') or socket.gethostname()}-{uuid.uuid4().hex[:6]}"


class LeaderElector:
    def __init__(
        self,
        kube: Kube,
        namespace: str,
        name: str = "disagg-operator-leader",
        identity: str | None = None,
        lease_s: int = 15,
        renew_s: float = 5.0,
        annotations: dict[str, str] | None = None,
    ) -> None:
        if renew_s * 2 >= lease_s:
            raise ValueError("renew_s must be well below lease_s (at most half)")
        self.kube = kube
        self.namespace = namespace
        self.name = name
        self.identity = identity or default_identity()
        self.lease_s = lease_s
        self.renew_s = renew_s
        self.last_renew = 0.0
        # Written on the Lease with every update (a shard's scope: disagg.shard.SCOPE_ANNOTATION).
        self.annotations = dict(annotations or {})

    def _spec(self, acquire: bool, transitions: int) -> dict:
        now = _now()
        spec = {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": self.lease_s,
            "renewTime": now,
            "leaseTransitions": transitions,
        }
        if acquire:
            spec["acquireTime"] = now
        return spec

    async def try_acquire(self) -> bool:
        """One attempt: create the Lease, renew our own, or take over an expired one."""
        try:
            lease = await self.kube.get("Lease", self.namespace, self.name)
        except NotFound:
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": self.name, "namespace": self.namespace, "annotations": self.annotations},
                "spec": self._spec(True, 0),
            }
            try:
                await self.kube.create(body)
            except Conflict:
                return False  # someone else created it first
            self.last_renew = time.monotonic()
            return True
        spec = lease.get("spec") or {}
        holder = spec.get("holderIdentity")
        expired = (parse_time(spec.get("renewTime")) or 0.0) + float(
            spec.get("leaseDurationSeconds") or self.lease_s
        ) < time.time()
        if holder not in (None, "", self.identity) and not expired:
            return False
        transitions = int(spec.get("leaseTransitions") or 0) + (0 if holder == self.identity else 1)
        meta: dict = {"resourceVersion": lease["metadata"]["resourceVersion"]}
        have = lease["metadata"].get("annotations") or {}
        if any(have.get(k) != v for k, v in self.annotations.items()):
            meta["annotations"] = self.annotations
        patch = {
            "metadata": meta,
            "spec": self._spec(holder != self.identity, transitions),
        }
        try:
            await self.kube.patch("Lease", self.namespace, self.name, patch)
        except (Conflict, NotFound):
            return False
        self.last_renew = time.monotonic()
        return True

    async def acquire(self) -> None:
        """Wait until this operator holds the Lease."""
        waited = False
        while True:
            try:
                if await self.try_acquire():
                    log.info(
                        "acquired leadership (Lease %s/%s) as %s", self.namespace, self.name, self.identity
                    )
                    return
            except ApiError as exc:
                log.warning("leader election: %s", exc)
            if not waited:
                log.info("another operator holds Lease %s/%s: standing by", self.namespace, self.name)
                waited = True
            await asyncio.sleep(self.renew_s)

    async def hold(self, on_lost: Callable[[], None]) -> None:
        """Renew until leadership cannot be proven any more, then call `on_lost`."""
        while True:
            await asyncio.sleep(self.renew_s)
            try:
                ok = await self.try_acquire()
            except Exception as exc:
                log.warning("renewing the Lease failed: %s", exc)
                ok = False
            # Give up before the Lease could expire for the others (one renew period early).
            if not ok and time.monotonic() - self.last_renew > self.lease_s - self.renew_s:
                log.error(
                    "lost leadership of Lease %s/%s: exiting so that one operator stays active",
                    self.namespace,
                    self.name,
                )
                on_lost()
                return


# ---------------------------------------------------------------------------- shards' scopes

#: How often a shard compares its scope with the other shards' Leases (and at start-up).
SHARD_CHECK_S = 60.0


class ShardOverlapCheck:
    """Compares this shard's scope (disagg.shard.Scope, recorded on its Lease) with the scopes
    the other shards recorded on theirs, in the Lease namespace.

    What it can decide, and reports: two shards whose namespace sets intersect and whose
    selectors can match one label set (`shard.overlap`: exact for the selector syntax accepted,
    e.g. identical selectors, or `k=a` with `k!=b`), and, more certain, existing
    DisaggDeployments of this shard that another shard owns too. Each new finding is a loud log
    line, a Warning Event (on the object both own, or on this shard's Lease), and the gauge
    `disagg_operator_shard_overlaps` (by other shard and `kind`: `selectors` or `objects`).
    What it cannot decide: selectors on different keys (`team=a`, `tier=gold`) are never
    disjoint in general (an object may carry both labels); they are reported as overlapping
    selectors even when no object has both yet. A shard without a recorded scope (an older
    operator, or another Lease namespace) is not seen."""

    def __init__(
        self, kube: Kube, namespace: str, scope: Any, owned: Callable[[], Any] | None = None
    ) -> None:
        self.kube = kube
        self.namespace = namespace
        self.scope = scope
        self.owned = owned  # () -> iterable of this shard's DisaggDeployments (the watch cache)
        self.reported: set[tuple[str, str]] = set()

    async def check(self) -> list[str]:
        """One comparison; returns the findings (new or not)."""
        from disagg import opmetrics, shard

        try:
            leases = await self.kube.list("Lease", self.namespace)
        except ApiError as exc:
            log.warning(
                "shard %s: cannot read the other shards' Leases (%s): overlap not checked",
                self.scope.name,
                exc,
            )
            return []
        findings: list[str] = []
        seen: set[str] = set()
        for lease in leases:
            meta = lease.get("metadata") or {}
            other_name = meta.get("name", "")
            if other_name == self.scope.name:
                continue
            other = shard.Scope.from_annotation(
                other_name, (meta.get("annotations") or {}).get(shard.SCOPE_ANNOTATION)
            )
            if other is None:
                continue
            seen.add(other_name)
            why = shard.overlap(self.scope, other)
            objs = []
            if why is not None and self.owned is not None:
                objs = [
                    o
                    for o in self.owned()
                    if other.owns(o["metadata"].get("namespace", ""), o["metadata"].get("labels"))
                ]
            opmetrics.SHARD_OVERLAPS.labels(other_name, "selectors").set(1 if why else 0)
            opmetrics.SHARD_OVERLAPS.labels(other_name, "objects").set(len(objs))
            if why is None:
                continue
            text = f"shard {self.scope.name} overlaps shard {other_name}: {why}"
            findings.append(text)
            if ("selectors", other_name) not in self.reported:
                self.reported.add(("selectors", other_name))
                log.error("%s; both operators would act on such objects: make the selectors disjoint", text)
                await self.kube.event(
                    lease_ref(lease_of(self.namespace, self.scope.name)),
                    "ShardOverlap",
                    text,
                    type_="Warning",
                    action="ShardCheck",
                )
            for o in objs:
                key = (other_name, f"{o['metadata'].get('namespace')}/{o['metadata']['name']}")
                findings.append(f"{key[1]} is owned by shards {self.scope.name} and {other_name}")
                if key not in self.reported:
                    self.reported.add(key)
                    log.error(
                        "%s/%s is owned by shards %s and %s: both act on it",
                        *key[1].split("/", 1),
                        self.scope.name,
                        other_name,
                    )
                    await self.kube.event(
                        o,
                        "ShardOverlap",
                        f"owned by shard {self.scope.name} and by shard {other_name} ({why}): both operators act on it",
                        type_="Warning",
                        action="ShardCheck",
                    )
        return findings

    async def run_forever(self) -> None:
        while True:
            try:
                await self.check()
            except Exception:
                log.exception("shard overlap check failed; trying again in %.0f s", SHARD_CHECK_S)
            await asyncio.sleep(SHARD_CHECK_S)


def lease_of(namespace: str, name: str) -> dict:
    return {"metadata": {"namespace": namespace, "name": name}}


def lease_ref(lease: dict) -> dict:
    """A Lease as the owner of an Event (Kube.event reads apiVersion, kind and metadata)."""
    return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", **lease}
