"""The operator's watch cache: DisaggDeployments and their pools' children, in memory.

Fed by the operator's watch streams (the Kopf event handlers in disagg.handlers call
`observe` for every event, including the initial listing) and primed once by one LIST per kind
and namespace when the autoscaler starts (`prime`, the only LISTs it sends). The autoscaler
loop reads pools and pods from here, so its steady state sends no request per object per tick.

Children are indexed by their owner (the `disagg.dev/deployment` label). An event, a LIST and
the answer to the operator's own write can race: the newer resourceVersion wins, and a
deletion leaves a tombstone so a LIST that was answered before the deletion cannot bring the
object back. (A cached object older than the server's is not only a stale read: a status
write merged over it puts the old conditions back, and nothing reconciles a status-only
change.)

Pure: no Kopf, no Kubernetes client, no HTTP (only dicts in, dicts out).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from disagg import api, names

#: The pools' children, each kept here (reconcile and the loop read them; the operator watches
#: each, by the `disagg.dev/deployment` label).
POOL_CHILD_KINDS = ("Deployment", "Service", "PodDisruptionBudget", "Pod")
#: The kinds kept: the custom resource and the pools' children.
KINDS = (api.KIND, *POOL_CHILD_KINDS)

Key = tuple[str, str]  # (namespace, name)


def _rv(obj: Mapping[str, Any]) -> int | None:
    """The resourceVersion as a number (etcd revisions), None when absent or not numeric."""
    raw = (obj.get("metadata") or {}).get("resourceVersion")
    try:
        return int(raw)
    except (TypeError, ValueError):
        return None


def _newer(new: Mapping[str, Any], old: Mapping[str, Any] | None) -> bool:
    """True when `new` should replace `old` (unknown versions: the later arrival wins)."""
    if old is None:
        return True
    a, b = _rv(new), _rv(old)
    return a is None or b is None or a >= b


def _slim(obj: Mapping[str, Any]) -> dict[str, Any]:
    """The object without its managedFields (large, never read), sharing everything else."""
    meta = obj.get("metadata") or {}
    if "managedFields" not in meta:
        return dict(obj)
    return {**obj, "metadata": {k: v for k, v in meta.items() if k != "managedFields"}}


def owner_of(obj: Mapping[str, Any]) -> str | None:
    return ((obj.get("metadata") or {}).get("labels") or {}).get(names.LABEL_DEPLOYMENT)


class WatchCache:
    """Objects by kind and (namespace, name); children also by (namespace, owner)."""

    def __init__(self) -> None:
        self._objects: dict[str, dict[Key, dict[str, Any]]] = {k: {} for k in KINDS}
        self._children: dict[str, dict[Key, set[str]]] = {k: {} for k in KINDS if k != api.KIND}
        self._tombstones: dict[tuple[str, str, str], int | None] = {}
        self.primed = False
        self.events = 0  # watch events seen (for tests and benchmarks)

    # -- feeding ---------------------------------------------------------------------
    def observe(self, kind: str, event_type: str | None, obj: Mapping[str, Any]) -> None:
        """One watch event (type None: Kopf's initial listing)."""
        if kind not in self._objects:
            raise ValueError(f"the watch cache does not keep kind {kind!r}")
        self.events += 1
        meta = obj.get("metadata") or {}
        key = (meta.get("namespace") or "", meta["name"])
        if event_type == "DELETED":
            if not self.primed:  # only a LIST still to come could bring it back
                self._tombstones[(kind, *key)] = _rv(obj)
            self._drop(kind, key)
            return
        self._tombstones.pop((kind, *key), None)
        # A watch delivers each object's versions in order, but the operator's own writes are
        # stored from their answers (`CachedKube`), before the watch has delivered the versions
        # written in between: an event older than the cached version is one of those.
        if _newer(obj, self._objects[kind].get(key)):
            self._store(kind, key, obj)

    def prime(self, kind: str, objs: Iterable[Mapping[str, Any]]) -> None:
        """A LIST's answer: adds what the watches have not delivered yet, never over a newer
        version nor over a later deletion. Removals come from the watches only."""
        for obj in objs:
            meta = obj["metadata"]
            key = (meta.get("namespace") or "", meta["name"])
            tomb = (kind, *key)
            if tomb in self._tombstones:
                gone_rv, rv = self._tombstones[tomb], _rv(obj)
                if gone_rv is None or rv is None or rv <= gone_rv:
                    continue  # deleted after this LIST was answered
            if _newer(obj, self._objects[kind].get(key)):
                self._store(kind, key, obj)

    def primed_done(self) -> None:
        """Every kind is primed: later deletions need no tombstone."""
        self.primed = True
        self._tombstones.clear()

    def _store(self, kind: str, key: Key, obj: Mapping[str, Any]) -> None:
        old = self._objects[kind].get(key)
        self._objects[kind][key] = _slim(obj)
        if kind == api.KIND:
            return
        old_owner = owner_of(old) if old is not None else None
        new_owner = owner_of(obj)
        if old_owner is not None and old_owner != new_owner:
            self._unindex(kind, (key[0], old_owner), key[1])
        if new_owner is not None:
            self._children[kind].setdefault((key[0], new_owner), set()).add(key[1])

    def _drop(self, kind: str, key: Key) -> None:
        old = self._objects[kind].pop(key, None)
        if old is not None and kind != api.KIND and (owner := owner_of(old)) is not None:
            self._unindex(kind, (key[0], owner), key[1])

    def _unindex(self, kind: str, owner: Key, name: str) -> None:
        members = self._children[kind].get(owner)
        if members is not None:
            members.discard(name)
            if not members:
                del self._children[kind][owner]

    # -- reading ---------------------------------------------------------------------
    def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        return self._objects[kind].get((namespace, name))

    def disagg_deployments(self, namespaces: tuple[str, ...] = ()) -> list[dict[str, Any]]:
        """Every cached DisaggDeployment (of `namespaces`, when given), by namespace and name."""
        objs = self._objects[api.KIND]
        return [objs[k] for k in sorted(objs) if not namespaces or k[0] in namespaces]

    def children(self, kind: str, namespace: str, owner: str) -> list[dict[str, Any]]:
        """The `kind` objects labelled as belonging to DisaggDeployment `owner`, by name."""
        members = self._children[kind].get((namespace, owner), ())
        objs = self._objects[kind]
        return [objs[(namespace, n)] for n in sorted(members)]

    def keys(self, kind: str) -> list[Key]:
        return sorted(self._objects[kind])

    def count(self, kind: str) -> int:
        return len(self._objects[kind])


class CachedKube:
    """A Kube (disagg.kube) whose reads of cached kinds come from a primed watch cache, and whose
    writes are written through to it.

    * `get` of a cached kind answers from the cache (a missing object falls through to the API
      server: created a moment ago, its event not delivered yet, or gone: NotFound);
    * `list` of a pool child kind of one owner (`disagg.dev/deployment=<name>`, the
      selector reconcile and the loop use) answers from the cache's owner index;
    * the objects the API server returns from `apply` and `patch` (the operator's own writes)
      are stored at once, so the next read sees them before the watch delivers them (an older
      answer never replaces a newer cached version: resourceVersions decide);
    * everything else goes to the wrapped client unchanged.

    Until the cache is primed (`WatchCache.primed`, the loop's start-up LIST) every read goes
    to the API server: a cache still filling would miss children and reconcile would recreate
    them.
    """

    def __init__(self, kube: Any, cache: WatchCache) -> None:
        self.kube = kube
        self.cache = cache

    def __getattr__(self, name: str) -> Any:
        return getattr(self.kube, name)

    async def get(self, kind: str, namespace: str | None, name: str) -> dict[str, Any]:
        if self.cache.primed and kind in KINDS:
            obj = self.cache.get(kind, namespace or "", name)
            if obj is not None:
                return dict(obj)
        return await self.kube.get(kind, namespace, name)

    async def get_or_none(self, kind: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        if self.cache.primed and kind in KINDS:
            obj = self.cache.get(kind, namespace or "", name)
            if obj is not None:
                return dict(obj)
        return await self.kube.get_or_none(kind, namespace, name)

    async def list(
        self, kind: str, namespace: str | None = None, selector: str | None = None
    ) -> list[dict[str, Any]]:
        owner = _owner_selector(selector)
        if self.cache.primed and kind in KINDS and kind != api.KIND and namespace and owner:
            return self.cache.children(kind, namespace, owner)
        return await self.kube.list(kind, namespace, selector)

    async def apply(self, obj: dict, subresource: str | None = None, force: bool = True) -> dict:
        result = await self.kube.apply(obj, subresource=subresource, force=force)
        self._write_through(obj.get("kind", ""), result)
        return result

    async def patch(
        self,
        kind: str,
        namespace: str | None,
        name: str,
        patch: dict,
        subresource: str | None = None,
        patch_type: str = "merge",
    ) -> dict:
        result = await self.kube.patch(
            kind, namespace, name, patch, subresource=subresource, patch_type=patch_type
        )
        self._write_through(kind, result)
        return result

    def _write_through(self, kind: str, result: Any) -> None:
        if kind not in KINDS or not isinstance(result, Mapping) or "metadata" not in result:
            return
        if kind != api.KIND and owner_of(result) is None:
            return  # not a pool child (a router's Deployment): the watches do not keep it either
        meta = result["metadata"]
        if self.cache.get(kind, meta.get("namespace") or "", meta["name"]) is None and kind == api.KIND:
            return  # not (or no longer) this operator's object: only its watch adds it
        self.cache.prime(kind, [result])  # only over an older cached version


def _owner_selector(selector: str | None) -> str | None:
    """The owner named by a selector that is exactly `disagg.dev/deployment=<name>`, else None."""
    if not selector or "," in selector:
        return None
    key, eq, value = selector.partition("=")
    if eq != "=" or key.strip() != names.LABEL_DEPLOYMENT or value.startswith("="):
        return None
    return value.strip() or None
