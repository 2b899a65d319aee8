"""The operator's watch cache: DisaggDeployments and their pools' Deployments and Pods, in memory.

Fed by the operator's watch streams (the Kopf event handlers in disagg.handlers call
`observe` for every event, including the initial listing) and primed once by one LIST per kind
and namespace when the autoscaler starts (`prime`, the only LISTs it sends). The autoscaler
loop reads pools and pods from here, so its steady state sends no request per object per tick.

Children are indexed by their owner (the `disagg.dev/deployment` label). An event and a LIST
can race: the newer resourceVersion wins, and a deletion leaves a tombstone so a LIST that was
answered before the deletion cannot bring the object back.

Pure: no Kopf, no Kubernetes client, no HTTP (only dicts in, dicts out).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from disagg import api, names

#: The kinds kept: the custom resource and the pool children the loop reads.
KINDS = (api.KIND, "Deployment", "Pod")

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
