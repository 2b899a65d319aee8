"""The watch cache (disagg.cache): children by owner, newer versions win, deletions stick."""

from __future__ import annotations

from fakes import deployment, disagg_deployment, pod

from disagg import api
from disagg.cache import WatchCache


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


def test_managed_fields_are_not_kept():
    c = WatchCache()
    obj = _rv(pod("a", "decode", 0, created=0, admitted=None), 1)
    obj["metadata"]["managedFields"] = [{"manager": "x" * 1000}]
    c.observe("Pod", None, obj)
    assert "managedFields" not in c.get("Pod", "ns", obj["metadata"]["name"])["metadata"]
