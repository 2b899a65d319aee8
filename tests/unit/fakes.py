"""In-memory stand-ins for the Kubernetes API and Prometheus, for tests without a cluster.

`FakeKube` has the methods of `disagg.kube.Kube` the operator calls (get, list, apply,
create, patch, delete, event) on plain dicts, with label selectors, JSON merge patches,
strategic merge of pod conditions, resourceVersion checks and NotFound/Conflict.
`FakePrometheus` answers `disagg.metrics.Query` lists by query name from a table of values.
`FakeClock`, `ListLoad` and `run_fake` drive the emulator's `WallClockDriver` without waiting
on a clock; `decisions_seen` records what the `disagg` policy decides on in `disagg evaluate`.
"""

from __future__ import annotations

import copy
import datetime as dt
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

from disagg import api, metrics, names
from disagg.cache import KINDS as cache_kinds
from disagg.cache import WatchCache
from disagg.kube import Conflict, NotFound
from disagg.workload import Request


def iso(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: maps merge, null deletes, everything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = merge_patch(out.get(k), v)
    return out


def _selected(obj: Mapping[str, Any], selector: str | None) -> bool:
    if not selector:
        return True
    labels = obj["metadata"].get("labels") or {}
    for term in selector.split(","):
        key, eq, value = term.partition("=")
        if labels.get(key) != value if eq else key not in labels:  # key=value, or key present
            return False
    return True


class FakeKube:
    def __init__(self) -> None:
        self.objects: dict[tuple[str, str | None, str], dict] = {}
        self.events: list[dict[str, str]] = []
        self.writes = 0
        self._rv = 0
        self._uid = 0
        self.fail_patch: Callable[[str, str], Exception | None] | None = None
        self.fail_apply: Callable[[dict], Exception | None] | None = None
        # Called with (event type, object) after every change, like a watch stream.
        self.watchers: list[Callable[[str, dict], None]] = []
        # Requests by verb and kind, e.g. calls[("list", "Pod")] (what a test may count).
        self.calls: Counter[tuple[str, str]] = Counter()

    def _notify(self, event_type: str, obj: dict) -> None:
        for watcher in self.watchers:
            watcher(event_type, copy.deepcopy(obj))

    def _next_rv(self) -> str:
        self._rv += 1
        return str(self._rv)

    def put(self, obj: dict) -> dict:
        """Store an object as is (test set-up), giving it a uid and resourceVersion."""
        obj = copy.deepcopy(obj)
        meta = obj["metadata"]
        if not meta.get("uid"):
            self._uid += 1
            meta["uid"] = f"uid-{self._uid}"
        meta["resourceVersion"] = self._next_rv()
        meta.setdefault("generation", 1)
        key = (obj["kind"], meta.get("namespace"), meta["name"])
        self._notify("MODIFIED" if key in self.objects else "ADDED", obj)
        self.objects[key] = obj
        return copy.deepcopy(obj)

    def remove(self, kind: str, namespace: str | None, name: str) -> None:
        gone = self.objects.pop((kind, namespace, name), None)
        if gone is not None:
            self._notify("DELETED", gone)

    def obj(self, kind: str, namespace: str | None, name: str) -> dict:
        return self.objects[(kind, namespace, name)]

    # -- the Kube interface ------------------------------------------------------------
    async def get(self, kind: str, namespace: str | None, name: str) -> dict:
        self.calls[("get", kind)] += 1
        try:
            return copy.deepcopy(self.objects[(kind, namespace, name)])
        except KeyError:
            raise NotFound(f"{kind} {namespace}/{name}") from None

    async def get_or_none(self, kind: str, namespace: str | None, name: str) -> dict | None:
        try:
            return await self.get(kind, namespace, name)
        except NotFound:
            return None

    async def list(self, kind: str, namespace: str | None = None, selector: str | None = None) -> list[dict]:
        self.calls[("list", kind)] += 1
        return [
            copy.deepcopy(o)
            for (k, ns, _), o in sorted(self.objects.items(), key=lambda kv: kv[0][2])
            if k == kind and (namespace is None or ns == namespace) and _selected(o, selector)
        ]

    async def apply(self, obj: dict, subresource: str | None = None, force: bool = True) -> dict:
        self.writes += 1
        self.calls[("apply", obj["kind"])] += 1
        if self.fail_apply is not None:
            err = self.fail_apply(obj)
            if err is not None:
                raise err
        key = (obj["kind"], obj["metadata"].get("namespace"), obj["metadata"]["name"])
        cur = self.objects.get(key)
        new = copy.deepcopy(obj)
        if cur is not None:
            new["metadata"] = {**cur["metadata"], **new["metadata"]}
            if "status" in cur and "status" not in new:
                new["status"] = cur["status"]
            new["metadata"]["resourceVersion"] = self._next_rv()
            self.objects[key] = new
            self._notify("MODIFIED", new)
            return copy.deepcopy(new)
        return self.put(new)

    async def create(self, obj: dict) -> dict:
        self.writes += 1
        key = (obj["kind"], obj["metadata"].get("namespace"), obj["metadata"]["name"])
        if key in self.objects:
            raise Conflict(f"{key} exists")
        return self.put(obj)

    async def patch(
        self,
        kind: str,
        namespace: str | None,
        name: str,
        patch: dict,
        subresource: str | None = None,
        patch_type: str = "merge",
    ) -> dict:
        self.writes += 1
        self.calls[("patch", kind)] += 1
        if self.fail_patch is not None:
            err = self.fail_patch(kind, name)
            if err is not None:
                raise err
        key = (kind, namespace, name)
        cur = self.objects.get(key)
        if cur is None:
            raise NotFound(f"{kind} {namespace}/{name}")
        want_rv = (patch.get("metadata") or {}).get("resourceVersion")
        if want_rv is not None and want_rv != cur["metadata"]["resourceVersion"]:
            raise Conflict(f"{kind} {name}: resourceVersion {want_rv} is not current")
        patch = copy.deepcopy(patch)
        if subresource == "status":
            patch = {"status": patch.get("status") or {}}
        conds = None
        if patch_type == "strategic":
            conds = (patch.get("status") or {}).pop("conditions", None)
        new = merge_patch(cur, patch)
        if conds is not None:  # strategic merge: conditions merge by type
            by_type = {c["type"]: c for c in (new.get("status") or {}).get("conditions") or []}
            for c in conds:
                by_type[c["type"]] = {**by_type.get(c["type"], {}), **c}
            new.setdefault("status", {})["conditions"] = list(by_type.values())
        new["metadata"]["resourceVersion"] = self._next_rv()
        self.objects[key] = new
        self._notify("MODIFIED", new)
        return copy.deepcopy(new)

    async def delete(self, kind: str, namespace: str | None, name: str, uid: str | None = None) -> bool:
        self.writes += 1
        self.calls[("delete", kind)] += 1
        gone = self.objects.pop((kind, namespace, name), None)
        if gone is not None:
            self._notify("DELETED", gone)
        return gone is not None

    async def served(self, kind: str) -> bool:
        """Kinds the fake API server serves beyond the built-in ones (CRDs): `served_kinds`."""
        return kind in getattr(self, "served_kinds", set())

    async def event(
        self, owner: dict, reason: str, message: str, type_: str = "Normal", action: str = "Reconcile"
    ) -> None:
        self.events.append({"reason": reason, "message": message, "type": type_, "action": action})

    # -- helpers -----------------------------------------------------------------------
    def api_requests(self) -> int:
        """Every request counted so far (Events excluded: they are best effort)."""
        return sum(self.calls.values())

    def reasons(self) -> list[str]:
        return [e["reason"] for e in self.events]

    def condition(self, namespace: str, name: str, ctype: str) -> dict | None:
        st = self.objects[(api.KIND, namespace, name)].get("status") or {}
        return next((c for c in st.get("conditions") or [] if c["type"] == ctype), None)


def disagg_deployment(name: str, spec: dict, namespace: str = "ns") -> dict:
    return {
        "apiVersion": api.API_VERSION,
        "kind": api.KIND,
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


def deployment(owner: str, pool: str, replicas: int, namespace: str = "ns") -> dict:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": f"{owner}-{pool}",
            "namespace": namespace,
            "labels": {names.LABEL_DEPLOYMENT: owner, names.LABEL_POOL: pool},
        },
        "spec": {"replicas": replicas},
        "status": {"replicas": replicas, "readyReplicas": replicas},
    }


def pod(
    owner: str,
    pool: str,
    index: int,
    *,
    created: float,
    admitted: float | None,
    phase: str = "Running",
    drain: str | None = None,
    namespace: str = "ns",
) -> dict:
    """A pool pod named like a Deployment's (<owner>-<pool>-<hash>-<id>)."""
    conds: list[dict] = []
    if admitted is not None:
        conds.append(
            {
                "type": names.READINESS_GATE,
                "status": "False" if drain else "True",
                "reason": names.GATE_DRAINING if drain else names.GATE_ADMITTED,
                "lastTransitionTime": iso(admitted),
            }
        )
        conds.append({"type": "Ready", "status": "False" if drain else "True"})
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{owner}-{pool}-5f7c9-{index:05d}",
            "namespace": namespace,
            "labels": {names.LABEL_DEPLOYMENT: owner, names.LABEL_POOL: pool},
            "annotations": {names.ANNOTATION_DRAIN: drain} if drain else {},
            "creationTimestamp": iso(created),
        },
        "spec": {"readinessGates": [{"conditionType": names.READINESS_GATE}]},
        "status": {"phase": phase, "conditions": conds},
    }


class FakePrometheus:
    """Answers queries by name. `scalars` holds the scalar values (a missing name answers an
    empty result); `per_pod` maps pool -> pod -> (running, waiting); every pod's last sample
    is `sample_age_s` old at `now`. `error` makes every query fail. `histograms` holds
    cumulative (le, value) buckets and `series` a range vector's values (oldest first), by name.
    `router_in_flight` maps pool -> worker URL -> the router's in-flight count for that worker."""

    def __init__(self) -> None:
        self.now = 0.0
        self.scalars: dict[str, float] = {}
        self.per_pod: dict[str, dict[str, tuple[float, float]]] = {}
        self.pending_kv: dict[str, float] = {}
        self.router_in_flight: dict[str, dict[str, float]] = {}
        self.sample_age_s = 0.0
        self.error: Exception | None = None
        self.asked: list[str] = []
        self.sizing_asked: list[str] = []
        self.histograms: dict[str, list[tuple[float, float]]] = {}
        self.series: dict[str, list[float]] = {}

    async def run(self, queries: list[metrics.Query]) -> dict[str, Any]:
        names = [q.name for q in queries]
        if queries and all(
            q.kind in ("histogram", "series")
            or q.name.endswith("_sum_rate")
            or q.name == "prefill_queue_mean"
            for q in queries
        ):
            self.sizing_asked = names  # the loop's optional sizing queries, asked separately
        else:
            self.asked = names
        out: dict[str, Any] = {}
        for q in queries:
            if self.error is not None:
                out[q.name] = self.error
                continue
            if q.kind == "scalar":
                v = self.scalars.get(q.name)
                out[q.name] = [] if v is None else [{"metric": {}, "value": [self.now, str(v)]}]
            elif q.kind in ("buckets", "histogram"):
                out[q.name] = [
                    {"metric": {"le": "+Inf" if le == float("inf") else str(le)}, "value": [self.now, str(v)]}
                    for le, v in self.histograms.get(q.name, [])
                ]
            elif q.kind == "series":
                vals = self.series.get(q.name)
                step = 30.0
                out[q.name] = (
                    []
                    if vals is None
                    else [
                        {
                            "metric": {},
                            "values": [
                                [self.now - step * (len(vals) - 1 - i), str(v)] for i, v in enumerate(vals)
                            ],
                        }
                    ]
                )
            elif q.kind == "by_worker":
                _, _, pool = q.name.partition(".")
                out[q.name] = [
                    {"metric": {"worker": w}, "value": [self.now, str(v)]}
                    for w, v in self.router_in_flight.get(pool, {}).items()
                ]
            else:
                series, _, pool = q.name.partition(".")
                pods = self.per_pod.get(pool, {})
                if series == "running_by_pod":
                    vals = {p: rw[0] for p, rw in pods.items()}
                elif series == "waiting_by_pod":
                    vals = {p: rw[1] for p, rw in pods.items()}
                elif series == "sample_time_by_pod":
                    vals = dict.fromkeys(pods, self.now - self.sample_age_s)
                elif series == "pending_kv_by_pod":
                    vals = {p: self.pending_kv.get(p, 0.0) for p in pods}
                else:
                    vals = {}
                out[q.name] = [{"metric": {"pod": p}, "value": [self.now, str(v)]} for p, v in vals.items()]
        return out


def watch_cache(kube: FakeKube) -> WatchCache:
    """A watch cache fed by `kube`'s changes (as the operator's watches feed it), primed with
    what `kube` holds now."""
    cache = WatchCache()
    for (kind, _, _), obj in kube.objects.items():
        if kind in cache_kinds:
            cache.prime(kind, [copy.deepcopy(obj)])
    cache.primed_done()

    def feed(event_type: str, obj: dict) -> None:
        if obj["kind"] in cache_kinds:
            cache.observe(obj["kind"], event_type, obj)

    kube.watchers.append(feed)
    return cache


def resync(kube: FakeKube, cache: WatchCache) -> None:
    """Deliver `kube`'s current state to `cache` (for tests that edit objects in place, which
    no watch would see)."""
    for kind in cache_kinds:
        present = {(ns or "", name) for (k, ns, name) in kube.objects if k == kind}
        for ns, name in cache.keys(kind):
            if (ns, name) not in present:
                cache.observe(kind, "DELETED", {"metadata": {"namespace": ns, "name": name}})
    for (kind, _, _), obj in kube.objects.items():
        if kind in cache_kinds:
            cache.observe(kind, "MODIFIED", copy.deepcopy(obj))


class FakeClock:
    """A wall clock the test advances by hand (`t` seconds)."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class ListLoad:
    """A fixed list of requests for the emulator's driver (arrival times in emulated seconds)."""

    def __init__(self, reqs: list[Request]) -> None:
        self.reqs = sorted(reqs, key=lambda r: r.arrival_s)
        self.i = 0

    def next_arrival(self) -> float:
        return self.reqs[self.i].arrival_s if self.i < len(self.reqs) else float("inf")

    def pop(self) -> Request:
        self.i += 1
        return self.reqs[self.i - 1]


def run_fake(driver: Any, clock: FakeClock, until: float, dt: float = 0.01) -> None:
    """Drive with a fake clock in steps of dt (what the asyncio loop does, without sleeping)."""
    while driver.now() < until:
        clock.t += dt
        driver.step(driver.now())
    driver.fleet.flush(driver.now())  # what a scrape does first


def decisions_seen(w: Any, settings: Any) -> list[Any]:
    """Every observation (`evaluate.Obs`) the `disagg` policy decides on while `w` is replayed."""
    from disagg import evaluate as ev

    seen: list[ev.Obs] = []

    class Recording(ev.DisaggPolicy):
        def decide(self, o: ev.Obs) -> tuple[dict[str, int], str]:
            seen.append(o)
            return super().decide(o)

    ev.run_policy("disagg", w, settings, make=lambda s, w_, pre: Recording(s, w_, pre))
    return seen
