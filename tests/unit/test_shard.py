"""Shards (`disagg run --shard-selector`): the selector parser and matcher, the shard's Lease
name, the handlers' event filters, and the refused flags."""

from __future__ import annotations

import asyncio

import pytest

from disagg import api, handlers, names, shard
from disagg.cli import main

A = {"disagg.dev/shard": "a", "team": "x"}
B = {"disagg.dev/shard": "b"}
NONE: dict[str, str] = {}


@pytest.mark.parametrize(
    ("selector", "matching", "not_matching"),
    [
        ("disagg.dev/shard=a", [A], [B, NONE]),
        ("disagg.dev/shard==a", [A], [B, NONE]),
        # != and notin hold for objects without the label (the API server's rule)
        ("disagg.dev/shard!=a", [B, NONE], [A]),
        ("disagg.dev/shard in (a, b)", [A, B], [NONE]),
        ("disagg.dev/shard notin (a)", [B, NONE], [A]),
        ("disagg.dev/shard", [A, B], [NONE]),
        ("!disagg.dev/shard", [NONE], [A, B]),
        ("disagg.dev/shard=a,team=x", [A], [B, NONE, {"disagg.dev/shard": "a"}]),
        ("", [A, B, NONE], []),
    ],
)
def test_selector_matches_like_the_api_server(selector, matching, not_matching):
    sel = shard.parse_selector(selector)
    for labels in matching:
        assert sel.matches(labels), (selector, labels)
    for labels in not_matching:
        assert not sel.matches(labels), (selector, labels)
    # The text sent as labelSelector= parses back to the same selector.
    assert shard.parse_selector(str(sel)) == sel


@pytest.mark.parametrize(
    ("selector", "message"),
    [
        ("disagg.dev/shard=a,,team=x", "empty requirement"),
        ("bad key=a", "not a valid label key"),
        ("k=a b", "not a valid label value"),
        ("k in (a", "unbalanced"),
        ("k in ()", "at least one value"),
    ],
)
def test_bad_selectors_are_refused_with_the_offending_part(selector, message):
    with pytest.raises(ValueError, match=message):
        shard.parse_selector(selector)


def test_shard_names_and_leases_are_distinct_per_selector():
    a = shard.default_shard_name(shard.parse_selector("disagg.dev/shard=a"))
    b = shard.default_shard_name(shard.parse_selector("disagg.dev/shard=b"))
    # Two selectors whose readable parts coincide still get different names.
    c = shard.default_shard_name(shard.parse_selector("disagg.dev-shard=a"))
    assert len({a, b, c}) == 3
    assert a.startswith("disagg.dev-shard-a-")
    for n in (a, b, c):
        assert shard.check_shard_name(n) == n
    assert shard.lease_name("disagg-operator-leader", "a") == "disagg-operator-leader-a"
    assert shard.lease_name("disagg-operator-leader", None) == "disagg-operator-leader"
    with pytest.raises(ValueError, match="shard name"):
        shard.check_shard_name("Shard_A")


@pytest.fixture
def shard_a(monkeypatch):
    monkeypatch.setattr(handlers.State, "shard", shard.parse_selector("disagg.dev/shard=a"))
    monkeypatch.setattr(handlers.State, "owned", set())


def body(labels):
    return {"metadata": {"namespace": "ns", "name": "m", "labels": labels}}


def test_handlers_see_only_their_shards_objects_and_children(shard_a):
    assert handlers._mine_or_was(body(A), "ns", "m")
    assert not handlers._mine_or_was(body(B), "ns", "m")
    # A child's event counts once its owner was seen in the shard.
    child = {names.LABEL_DEPLOYMENT: "m"}
    assert not handlers._owner_mine(child, "ns")
    handlers.State.owned.add(("ns", "m"))
    assert handlers._owner_mine(child, "ns")
    assert not handlers._owner_mine(child, "other-ns")
    # Relabelled into shard b: this shard's handler still hears it once, to let go of it.
    assert handlers._mine_or_was(body(B), "ns", "m")


class _Events:
    """Stands in for the controller: records what the handlers hand it."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str | None, str]] = []

    def on_event(self, kind: str, event_type: str | None, obj: dict) -> None:
        self.seen.append((kind, event_type, obj["metadata"]["name"]))


def test_relabelled_object_is_let_go(shard_a, monkeypatch):
    """An object relabelled into another shard is, to this operator, deleted: the controller
    drops it from the cache and the autoscaler forgets it."""
    events = _Events()
    monkeypatch.setattr(handlers.State, "controller", events)
    handlers.State.owned.add(("ns", "m"))
    moved = body(B)
    asyncio.run(
        handlers.on_disaggdeployment(
            event={"type": "MODIFIED", "object": moved}, body=moved, namespace="ns", name="m"
        )
    )
    assert ("ns", "m") not in handlers.State.owned
    assert events.seen == [(api.KIND, "DELETED", moved["metadata"]["name"])]


def test_without_a_selector_every_object_is_owned(monkeypatch):
    monkeypatch.setattr(handlers.State, "shard", shard.Selector())
    monkeypatch.setattr(handlers.State, "owned", set())
    assert handlers._mine_or_was(body(NONE), "ns", "m")
    assert handlers._owner_mine({names.LABEL_DEPLOYMENT: "m"}, "ns")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--shard-selector", "bad key=a"], "--shard-selector: 'bad key' in"),
        (["--shard-selector", " "], "--shard-selector is empty"),
        (["--shard-name", "Shard_A"], "--shard-name: shard name 'Shard_A'"),
    ],
)
def test_run_refuses_bad_shard_flags(capsys, args, message):
    assert main(["run", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("disagg run: error: "), err
    assert message in err


# ---------------------------------------------------------------------------- overlap between shards

S = "disagg.dev/shard"


def _scope(name: str, selector: str, *namespaces: str) -> shard.Scope:
    return shard.Scope(name, shard.parse_selector(selector), frozenset(namespaces))


@pytest.mark.parametrize(
    ("a", "b", "overlaps"),
    [
        ((f"{S}=a",), (f"{S}=a",), "the same selector"),
        ((f"{S}=a",), (f"{S}=b",), None),  # the same key with another value: disjoint
        ((f"{S}=a",), (f"{S}!=a",), None),
        ((f"{S}=a",), (f"{S} notin (a,b)",), None),  # the chart's catch-all shard
        ((f"{S}=a",), (f"!{S}",), None),
        ((f"{S} in (a,b)",), (f"{S} in (b,c)",), f"{S}=b"),
        ((f"{S}=a",), ("team=x",), f"{S}=a,team=x"),  # different keys: an object may carry both
        ((f"{S}",), (f"{S}!=a",), f"{S}=x0"),
        ((f"{S}=a", "ns1"), (f"{S}=a", "ns2"), None),  # disjoint namespace sets
        ((f"{S}=a", "ns1", "ns2"), (f"{S}=a", "ns2"), "in namespace ns2"),
        (("", "ns1"), ("",), "the same selector"),  # every object of ns1, and every object
    ],
)
def test_overlap_is_decided_exactly_on_the_selectors(a, b, overlaps):
    why = shard.overlap(_scope("x", a[0], *a[1:]), _scope("y", b[0], *b[1:]))
    if overlaps is None:
        assert why is None
    else:
        assert why is not None and overlaps in why, why


def test_a_scope_round_trips_through_its_lease_annotation():
    s = _scope("disagg-operator-leader-a", f"{S}=a,team in (x,y)", "ns2", "ns1")
    back = shard.Scope.from_annotation(s.name, s.to_annotation())
    assert back == s
    assert shard.Scope.from_annotation("x", "{not json") is None
    assert shard.Scope.from_annotation("x", None) is None


def _lease(name: str, scope: shard.Scope | None) -> dict:
    ann = {shard.SCOPE_ANNOTATION: scope.to_annotation()} if scope else {}
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": name, "namespace": "ops", "annotations": ann},
        "spec": {},
    }


def test_the_elector_records_the_scope_and_the_check_reports_overlaps():
    from fakes import FakeKube, disagg_deployment

    from disagg import opmetrics
    from disagg.leader import LeaderElector, ShardOverlapCheck

    kube = FakeKube()
    mine = _scope("lease-a", f"{S}=a")
    elector = LeaderElector(
        kube, "ops", "lease-a", annotations={shard.SCOPE_ANNOTATION: mine.to_annotation()}
    )
    assert asyncio.run(elector.try_acquire())
    recorded = kube.obj("Lease", "ops", "lease-a")["metadata"]["annotations"][shard.SCOPE_ANNOTATION]
    assert shard.Scope.from_annotation("lease-a", recorded) == mine
    kube.put(_lease("lease-b", _scope("lease-b", f"{S}=b")))  # disjoint
    kube.put(_lease("lease-old", None))  # records nothing: not judged
    obj = disagg_deployment("llm", {}, "ns")
    obj["metadata"]["labels"] = {S: "a", "team": "x"}
    owned = [kube.put(obj)]
    check = ShardOverlapCheck(kube, "ops", mine, owned=lambda: owned)
    assert asyncio.run(check.check()) == []
    assert not kube.events

    def gauge(other: str, kind: str) -> float | None:
        return opmetrics.REGISTRY.get_sample_value(
            "disagg_operator_shard_overlaps", {"other_shard": other, "kind": kind}
        )

    assert gauge("lease-b", "selectors") == 0
    kube.put(_lease("lease-c", _scope("lease-c", "team=x")))  # another key: overlaps
    found = asyncio.run(check.check())
    assert any("lease-c" in f and "team=x" in f for f in found)
    assert any(f.startswith("ns/llm is owned by shards lease-a and lease-c") for f in found)
    assert gauge("lease-c", "selectors") == 1 and gauge("lease-c", "objects") == 1
    warnings = [e for e in kube.events if e["type"] == "Warning" and e["reason"] == "ShardOverlap"]
    assert len(warnings) == 2  # one on this shard's Lease (the selectors), one on the object
    asyncio.run(check.check())
    assert len([e for e in kube.events if e["reason"] == "ShardOverlap"]) == 2  # reported once
