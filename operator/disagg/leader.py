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
                "metadata": {"name": self.name, "namespace": self.namespace},
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
        patch = {
            "metadata": {"resourceVersion": lease["metadata"]["resourceVersion"]},
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
