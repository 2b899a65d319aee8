"""What reconcile writes to the object: InvalidSpec, ReconcileFailed and Warning conditions, Events.

A fake API (dicts in memory) stands in for the cluster; it can refuse writes the way the API
server does (an ApiError with the server's message).
"""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import pytest

from disagg import api, reconcile
from disagg.kube import ApiError, NotFound


class FakeKube:
    def __init__(self, refuse: dict[str, str] | None = None) -> None:
        self.objects: dict[tuple[str, str], dict] = {}
        self.status_patches: list[dict] = []
        self.events: list[tuple[str, str, str]] = []
        self.refuse = refuse or {}  # kind -> message of a 422

    async def list(self, kind: str, namespace: str | None = None, selector: str | None = None) -> list[dict]:
        want = dict(kv.split("=", 1) for kv in selector.split(",")) if selector else {}

        def selected(o: dict) -> bool:
            labels = o["metadata"].get("labels") or {}
            return all(labels.get(k) == v for k, v in want.items())

        return [copy.deepcopy(o) for (k, _), o in self.objects.items() if k == kind and selected(o)]

    async def apply(self, obj: dict, subresource: str | None = None, force: bool = True) -> dict:
        if obj["kind"] in self.refuse:
            raise ApiError(422, f"PATCH {obj['kind']}: 422 {self.refuse[obj['kind']]}")
        self.objects[(obj["kind"], obj["metadata"]["name"])] = copy.deepcopy(obj)
        return copy.deepcopy(obj)

    async def patch(self, kind, namespace, name, patch, subresource=None, patch_type="merge") -> dict:
        if kind == api.KIND and subresource == "status":
            self.status_patches.append(copy.deepcopy(patch["status"]))
            return {}
        raise NotFound(name)

    async def delete(self, kind, namespace, name, uid=None) -> bool:
        return self.objects.pop((kind, name), None) is not None

    async def served(self, kind: str) -> bool:
        """Kinds the fake API server serves beyond the built-in ones (CRDs): `served_kinds`."""
        return kind in getattr(self, "served_kinds", set())

    async def event(self, owner, reason, message, type_="Normal", action="Reconcile") -> None:
        self.events.append((type_, reason, message))


def body(name: str = "llama", **spec_over: Any) -> dict:
    tpl = {"spec": {"containers": [{"name": "vllm", "image": "x"}]}}
    spec = {
        "engine": "vllm",
        "model": "m",
        "pools": {
            "prefill": {"minReplicas": 1, "maxReplicas": 2, "template": tpl},
            "decode": {"minReplicas": 1, "maxReplicas": 4, "template": tpl},
        },
        "autoscaling": {"enabled": False},
    }
    spec.update(spec_over)
    return {
        "apiVersion": api.API_VERSION,
        "kind": api.KIND,
        "metadata": {"name": name, "namespace": "ns", "uid": "u1", "generation": 3},
        "spec": spec,
    }


def conditions(kube: FakeKube) -> dict[str, dict]:
    assert kube.status_patches, "no status was written"
    return {c["type"]: c for c in kube.status_patches[-1]["conditions"]}


def run(kube: FakeKube, obj: dict) -> dict:
    return asyncio.run(reconcile.reconcile(kube, obj))


@pytest.mark.parametrize(
    ("obj", "expect"),
    [
        (body(model=""), "model"),
        (body(name="llama-3.1-8b"), "metadata.name must be at most"),
        (body(name="a" * (api.MAX_NAME_LENGTH + 1)), "metadata.name must be at most"),
    ],
    ids=["bad-spec", "dotted-name", "long-name"],
)
def test_invalid_spec_is_true_and_nothing_is_created(obj, expect):
    kube = FakeKube()
    run(kube, obj)
    conds = conditions(kube)
    assert conds["InvalidSpec"]["status"] == "True"
    assert expect in conds["InvalidSpec"]["message"]
    assert conds["Ready"]["status"] == "False"
    assert kube.objects == {}  # no half-created set of children
    assert [(t, r) for t, r, _ in kube.events] == [("Warning", "InvalidSpec")]


def test_valid_spec_is_not_invalid_and_creates_every_child():
    kube = FakeKube()
    run(kube, body())
    conds = conditions(kube)
    assert conds["InvalidSpec"]["status"] == "False"
    assert conds["ReconcileFailed"]["status"] == "False"
    assert conds["Warning"]["status"] == "False"
    assert sorted(kube.objects) == [
        ("Deployment", "llama-decode"),
        ("Deployment", "llama-prefill"),
        ("Deployment", "llama-router"),
        ("PodDisruptionBudget", "llama-decode"),
        ("PodDisruptionBudget", "llama-prefill"),
        ("Role", "llama-router"),
        ("RoleBinding", "llama-router"),
        ("Service", "llama-decode"),
        ("Service", "llama-prefill"),
        ("Service", "llama-router"),
        ("ServiceAccount", "llama-router"),
    ]


def test_a_refused_write_reaches_the_object_with_the_servers_message():
    kube = FakeKube(refuse={"Service": 'Service "llama-decode" is invalid: quota exceeded'})
    with pytest.raises(ApiError):
        run(kube, body())
    conds = conditions(kube)
    assert conds["ReconcileFailed"]["status"] == "True"
    assert "quota exceeded" in conds["ReconcileFailed"]["message"]
    assert ("Warning", "ReconcileFailed") in [(t, r) for t, r, _ in kube.events]
    # Fixed: the next reconcile clears it.
    kube.refuse.clear()
    obj = body()
    obj["status"] = kube.status_patches[-1]
    run(kube, obj)
    assert conditions(kube)["ReconcileFailed"]["status"] == "False"


def test_one_event_names_every_pool_child_a_reconcile_created():
    """The pools' children are written together and reported in one Event, not one each (at
    N=1,000 objects an Event per child was the largest share of the operator's writes)."""
    kube = FakeKube()
    run(kube, body(router={"enabled": False}))
    created = [m for _, r, m in kube.events if r == "PoolCreated"]
    assert len(created) == 1, kube.events
    for child in (
        "Deployment llama-prefill (replicas 1)",
        "Deployment llama-decode (replicas 1)",
        "Service llama-prefill",
        "Service llama-decode",
        "PodDisruptionBudget llama-prefill",
        "PodDisruptionBudget llama-decode",
    ):
        assert child in created[0], created[0]
    # Nothing changed: the next reconcile writes nothing and reports nothing.
    obj = body(router={"enabled": False})
    obj["status"] = kube.status_patches[-1]
    kube.events.clear()
    run(kube, obj)
    assert not [r for _, r, _ in kube.events if r in ("PoolCreated", "PoolUpdated")], kube.events


def test_a_refused_child_does_not_keep_the_others_from_being_written():
    kube = FakeKube(refuse={"PodDisruptionBudget": "PodDisruptionBudget is forbidden: quota"})
    with pytest.raises(ApiError):
        run(kube, body(router={"enabled": False}))
    assert sorted(k for k, _ in kube.objects) == ["Deployment", "Deployment", "Service", "Service"]
    created = [m for _, r, m in kube.events if r == "PoolCreated"]
    assert len(created) == 1 and "PodDisruptionBudget" not in created[0], created
    assert "quota" in conditions(kube)["ReconcileFailed"]["message"]


def test_unusual_values_give_a_warning_condition_and_event_naming_the_field():
    kube = FakeKube()
    run(kube, body(slo={"ttftSeconds": 600}))
    warning = conditions(kube)["Warning"]
    assert warning["status"] == "True" and "spec.slo.ttftSeconds" in warning["message"]
    assert any(r == "SpecWarning" and "spec.slo.ttftSeconds" in m for _, r, m in kube.events)
