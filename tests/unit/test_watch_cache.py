"""The watch cache (disagg.cache): children by owner, newer versions win, deletions stick."""

from __future__ import annotations

import asyncio
import copy

from fakes import FakeKube, deployment, disagg_deployment, pod

from disagg import api, names
from disagg.cache import CachedKube, WatchCache


def _rv(obj: dict, rv: int) -> dict:
    obj["metadata"]["resourceVersion"] = str(rv)
    return obj


def test_children_are_found_by_owner_and_follow_relabels_and_deletions():
    c = WatchCache()
    c.observe(api.KIND, None, disagg_deployment("a", {}))
    c.observe("Pod", None, _rv(pod("a", "decode", 0, created=0, admitted=None), 1))
    c.observe("Pod", "ADDED", _rv(pod("b", "decode", 0, created=0, admitted=None), 2))
    c.observe("Deployment", "ADDED", _rv(deployment("a", "decode", 1), 3))
    assert [p["metadata"]["name"] for p in c.children("Pod", "ns", "a")] == ["a-decode-5f7c9-00000"]
    assert [d["metadata"]["name"] for d in c.children("Deployment", "ns", "a")] == ["a-decode"]
    moved = _rv(pod("a", "decode", 0, created=0, admitted=None), 4)
    moved["metadata"]["labels"]["disagg.dev/deployment"] = "b"
    c.observe("Pod", "MODIFIED", moved)
    assert c.children("Pod", "ns", "a") == []
    assert len(c.children("Pod", "ns", "b")) == 2
    c.observe("Pod", "DELETED", moved)
    assert [p["metadata"]["name"] for p in c.children("Pod", "ns", "b")] == ["b-decode-5f7c9-00000"]
    assert [o["metadata"]["name"] for o in c.disagg_deployments()] == ["a"]
    assert c.disagg_deployments(("other",)) == []


def test_a_list_never_overrides_a_newer_event_nor_revives_a_deleted_object():
    c = WatchCache()
    newer = _rv(deployment("a", "decode", 5), 10)
    c.observe("Deployment", "MODIFIED", newer)
    gone = _rv(deployment("a", "prefill", 1), 8)
    c.observe("Deployment", "DELETED", gone)
    c.prime("Deployment", [_rv(deployment("a", "decode", 2), 7), _rv(deployment("a", "prefill", 1), 7)])
    deps = c.children("Deployment", "ns", "a")
    assert [(d["metadata"]["name"], d["spec"]["replicas"]) for d in deps] == [("a-decode", 5)]
    c.prime("Deployment", [_rv(deployment("a", "decode", 3), 11)])  # a newer LIST does win
    assert c.get("Deployment", "ns", "a-decode")["spec"]["replicas"] == 3


def test_a_late_watch_event_never_replaces_the_operators_newer_write():
    """The answer to the operator's own write is cached at once; the watch then delivers the
    versions before it, late under load: they must not replace it."""
    kube = FakeKube()
    kube.put(disagg_deployment("a", {}))
    wc = WatchCache()
    wc.prime(api.KIND, [kube.obj(api.KIND, "ns", "a")])
    wc.primed_done()
    before = copy.deepcopy(kube.obj(api.KIND, "ns", "a"))
    ck = CachedKube(kube, wc)
    ready = {"type": "Ready", "status": "True", "reason": "AllPoolsReady", "message": "m"}
    asyncio.run(ck.patch(api.KIND, "ns", "a", {"status": {"conditions": [ready]}}, subresource="status"))
    wc.observe(api.KIND, "MODIFIED", before)  # the version before the write, delivered late
    assert wc.get(api.KIND, "ns", "a")["status"]["conditions"] == [ready]
    # the next version does replace it
    wc.observe(api.KIND, "MODIFIED", _rv(kube.obj(api.KIND, "ns", "a"), 1_000))
    assert wc.get(api.KIND, "ns", "a")["metadata"]["resourceVersion"] == "1000"


def test_managed_fields_are_not_kept():
    c = WatchCache()
    obj = _rv(pod("a", "decode", 0, created=0, admitted=None), 1)
    obj["metadata"]["managedFields"] = [{"manager": "x" * 1000}]
    c.observe("Pod", None, obj)
    assert "managedFields" not in c.get("Pod", "ns", obj["metadata"]["name"])["metadata"]


def test_cached_kube_reads_the_primed_cache_and_writes_through():
    kube = FakeKube()
    kube.put(deployment("a", "decode", 1))
    kube.put(pod("a", "decode", 0, created=0, admitted=0))
    wc = WatchCache()
    ck = CachedKube(kube, wc)
    sel = f"{names.LABEL_DEPLOYMENT}=a"
    # not primed yet: everything goes to the API server
    assert len(asyncio.run(ck.list("Pod", "ns", sel))) == 1 and kube.calls[("list", "Pod")] == 1
    wc.prime("Pod", [kube.obj("Pod", "ns", "a-decode-5f7c9-00000")])
    wc.prime("Deployment", [kube.obj("Deployment", "ns", "a-decode")])
    wc.primed_done()
    kube.calls.clear()
    assert [p["metadata"]["name"] for p in asyncio.run(ck.list("Pod", "ns", sel))] == ["a-decode-5f7c9-00000"]
    assert asyncio.run(ck.get("Deployment", "ns", "a-decode"))["spec"]["replicas"] == 1
    asyncio.run(ck.list("Pod", "ns", f"{sel},x=y"))  # another selector: the API server's answer
    assert dict(kube.calls) == {("list", "Pod"): 1}
    # the operator's own write is seen at once, before any watch event
    asyncio.run(ck.patch("Deployment", "ns", "a-decode", {"spec": {"replicas": 3}}))
    assert wc.get("Deployment", "ns", "a-decode")["spec"]["replicas"] == 3
    # an older answer (a slow write's) never replaces a newer cached version
    newer = kube.obj("Deployment", "ns", "a-decode")
    ck._write_through(
        "Deployment",
        {**newer, "metadata": {**newer["metadata"], "resourceVersion": "1"}, "spec": {"replicas": 9}},
    )
    assert wc.get("Deployment", "ns", "a-decode")["spec"]["replicas"] == 3
