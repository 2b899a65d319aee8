"""What the operator does with a watch event: feed the watch cache, and queue a reconcile of
the owning DisaggDeployment only when one can change something.

* A DisaggDeployment event reconciles it only when something reconcile reads changed since the
  last successful reconcile: its uid, generation (the spec), labels, annotations or deletion.
  The operator's own status writes (reconcile's, the autoscaler's) come back as events that
  change none of these, so they do not reconcile again.
* A Deployment or Pod event reconciles only its owner (the `disagg.dev/deployment` label),
  after CHILD_EVENT_DELAY_S, so a burst of events (pods starting) becomes one reconcile. A pool
  Service or PodDisruptionBudget reconciles its owner only when it is deleted.
* Reconciles run from a coalescing work queue (disagg.workqueue) with bounded workers; a
  failed one (the API server refused a child: a quota, the Service range, a webhook) has
  already set `ReconcileFailed` with the server's message (disagg.reconcile) and is retried
  with backoff until it succeeds.

Kopf-free: disagg.handlers calls `Controller.on_event` from its event handlers.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from typing import Any

from disagg import api, opmetrics, reconcile
from disagg.cache import CachedKube, WatchCache, owner_of
from disagg.kube import Kube, NotFound
from disagg.workqueue import WorkQueue

log = logging.getLogger("disagg.controller")

#: Child events wait this long before their owner's reconcile, so a burst coalesces into one.
CHILD_EVENT_DELAY_S = 0.5
#: Children whose events only feed the cache, but for a deletion (reconcile recreates them): the
#: operator's own applies and the disruption controller's PDB status updates come back as
#: events that reconcile would find nothing to do for.
CACHED_ONLY_KINDS = frozenset({"Service", "PodDisruptionBudget"})
#: Reconciles running at once (each holds one object's lock; others never wait behind it).
RECONCILE_CONCURRENCY = 16

Key = tuple[str, str]


def reconcile_key(body: Mapping[str, Any]) -> str:
    """What reconcile reads of the DisaggDeployment itself, besides its status (which it writes)."""
    meta = body.get("metadata") or {}
    return json.dumps(
        [
            meta.get("uid"),
            meta.get("generation"),
            meta.get("deletionTimestamp"),
            meta.get("labels") or {},
            meta.get("annotations") or {},
        ],
        sort_keys=True,
    )


class Controller:
    def __init__(
        self,
        kube: Callable[[], Kube],
        cache: WatchCache | None = None,
        concurrency: int = RECONCILE_CONCURRENCY,
        on_deleted: Callable[[str, str], None] | None = None,
        **queue_options: Any,
    ) -> None:
        self._kube = kube
        self.cache = cache if cache is not None else WatchCache()
        self.queue = WorkQueue(self._reconcile, concurrency=concurrency, **queue_options)
        self._on_deleted = on_deleted
        # reconcile_key of the body each object was last reconciled from, successfully.
        self.reconciled: dict[Key, str] = {}
        self.reconciles = 0  # started, for tests and benchmarks

    def on_event(self, kind: str, event_type: str | None, body: Mapping[str, Any]) -> None:
        """One watch event (type None: the initial listing). Never waits, never calls the API."""
        meta = body["metadata"]
        ns = meta.get("namespace") or ""
        self.cache.observe(kind, event_type, body)
        if kind == api.KIND:
            key = (ns, meta["name"])
            if event_type == "DELETED":
                # Children are garbage-collected through their owner references.
                self.queue.forget(key)
                self.reconciled.pop(key, None)
                if self._on_deleted is not None:
                    self._on_deleted(*key)
                return
            if self.reconciled.get(key) != reconcile_key(body):
                self.queue.request(key, reset_backoff=True)
            return
        if kind in CACHED_ONLY_KINDS and event_type != "DELETED":
            return
        owner = owner_of(body)
        if owner is not None:
            self.queue.request((ns, owner), delay_s=CHILD_EVENT_DELAY_S)

    async def _reconcile(self, key: Key) -> None:
        with opmetrics.RECONCILE_SECONDS.time():  # the lock wait included
            await self._reconcile_locked(key)

    async def _reconcile_locked(self, key: Key) -> None:
        ns, name = key
        # The object and its pool Deployments and Pods come from the watch cache once it is
        # primed (disagg.cache.CachedKube); the operator's own writes are written through to it.
        kube = CachedKube(self._kube(), self.cache)
        async with reconcile.lock_for(ns, name):
            try:
                body = await kube.get(api.KIND, ns, name)
            except NotFound:
                return
            self.reconciles += 1
            await reconcile.reconcile(kube, body)  # raises after reporting a refused write
            self.reconciled[key] = reconcile_key(body)
