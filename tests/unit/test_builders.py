"""disagg.builders: pure manifests of the pools."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from disagg import api, builders

ROOT = Path(__file__).resolve().parents[2]
OWNER = builders.Owner(name="llama", namespace="serving", uid="1234-uid")


def sample(name: str) -> api.DisaggDeploymentSpec:
    return api.parse_spec(yaml.safe_load((ROOT / "config/samples" / name).read_text())["spec"])


@pytest.fixture
def spec() -> api.DisaggDeploymentSpec:
    return sample("vllm-disaggregated-70b.yaml")


def test_owner_from_body():
    body = {"metadata": {"name": "a", "namespace": "ns", "uid": "u"}, "spec": {}}
    owner = builders.Owner.from_body(body)
    assert owner.reference() == {
        "apiVersion": "disagg.dev/v1alpha1",
        "kind": "DisaggDeployment",
        "name": "a",
        "uid": "u",
        "controller": True,
        "blockOwnerDeletion": True,
    }


def test_deployment(spec):
    d = builders.deployment(OWNER, spec, "prefill", replicas=3)
    assert d["apiVersion"] == "apps/v1" and d["kind"] == "Deployment"
    meta = d["metadata"]
    assert meta["name"] == "llama-prefill" and meta["namespace"] == "serving"
    assert meta["ownerReferences"] == [OWNER.reference()]
    assert meta["labels"] == {
        "disagg.dev/deployment": "llama",
        "disagg.dev/pool": "prefill",
        "app.kubernetes.io/name": "vllm",
        "app.kubernetes.io/instance": "llama",
        "app.kubernetes.io/component": "prefill",
        "app.kubernetes.io/part-of": "disagg",
        "app.kubernetes.io/managed-by": "disagg-operator",
    }
    s = d["spec"]
    assert s["replicas"] == 3
    assert s["selector"] == {"matchLabels": {"disagg.dev/deployment": "llama", "disagg.dev/pool": "prefill"}}
    assert s["strategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}}
    tpl = s["template"]
    assert s["selector"]["matchLabels"].items() <= tpl["metadata"]["labels"].items()
    c = tpl["spec"]["containers"][0]
    assert c["resources"]["requests"]["nvidia.com/gpu"] == 4
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 4
    assert {"conditionType": "disagg.dev/routable"} in tpl["spec"]["readinessGates"]
    assert tpl["spec"]["terminationGracePeriodSeconds"] == 120
    # The user's template survives.
    assert c["image"] == "vllm/vllm-openai:v0.11.0"
    assert c["env"][0]["name"] == "HF_TOKEN"
    assert meta["annotations"]["disagg.dev/template-hash"] == builders.template_hash(tpl)


def test_decode_gets_its_own_gpus(spec):
    d = builders.deployment(OWNER, spec, "decode", replicas=4)
    assert d["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 2


def test_user_template_is_not_modified(spec):
    before = copy.deepcopy(spec.pools.prefill.template)
    builders.all_objects(OWNER, spec)
    assert spec.pools.prefill.template == before


def test_user_labels_merged_and_operator_labels_win():
    s = sample("colocated.yaml").model_dump(by_alias=True)
    s["pools"]["colocated"]["template"]["metadata"]["labels"] = {"team": "a", "disagg.dev/pool": "hijack"}
    spec = api.parse_spec(s)
    tpl = builders.pod_template(OWNER, spec, "colocated")
    assert tpl["metadata"]["labels"]["team"] == "a"
    assert tpl["metadata"]["labels"]["disagg.dev/pool"] == "colocated"
    assert tpl["metadata"]["annotations"] == {"example.com/team": "inference"}


def _spec_with_containers(containers: list[dict], engine: str = "vllm", **pool) -> api.DisaggDeploymentSpec:
    tpl = {"spec": {"containers": containers}}
    return api.parse_spec(
        {
            "engine": engine,
            "model": "m",
            "pools": {
                "prefill": {"maxReplicas": 2, "gpusPerReplica": 2, "template": tpl, **pool},
                "decode": {
                    "maxReplicas": 2,
                    "template": {"spec": {"containers": [{"name": "x", "image": "i"}]}},
                },
            },
        }
    )


def test_gpus_go_to_the_engine_container():
    spec = _spec_with_containers(
        [{"name": "sidecar", "image": "s"}, {"name": "sglang", "image": "e"}], engine="sglang"
    )
    cs = builders.pod_template(OWNER, spec, "prefill")["spec"]["containers"]
    assert "resources" not in cs[0]
    assert cs[1]["resources"]["limits"]["nvidia.com/gpu"] == 2


def test_user_gpu_setting_is_kept_and_mirrored():
    spec = _spec_with_containers(
        [{"name": "vllm", "image": "e", "resources": {"limits": {"nvidia.com/gpu": 8}}}], gpusPerReplica=8
    )
    res = builders.pod_template(OWNER, spec, "prefill")["spec"]["containers"][0]["resources"]
    assert res == {"limits": {"nvidia.com/gpu": 8}, "requests": {"nvidia.com/gpu": 8}}


@pytest.mark.parametrize("part", ["limits", "requests"])
def test_template_gpus_that_disagree_with_gpus_per_replica_are_refused(part):
    # The planner and the GPU budget count gpusPerReplica (2 here): a template asking for 8 would
    # make them count a quarter of what the pods take.
    with pytest.raises(ValueError, match="gpusPerReplica must equal"):
        _spec_with_containers([{"name": "vllm", "image": "e", "resources": {part: {"nvidia.com/gpu": "8"}}}])


def test_existing_readiness_gate_not_duplicated():
    spec = _spec_with_containers([{"name": "vllm", "image": "e"}])
    raw = spec.model_dump(by_alias=True)
    raw["pools"]["prefill"]["template"]["spec"]["readinessGates"] = [
        {"conditionType": "other"},
        {"conditionType": "disagg.dev/routable"},
    ]
    gates = builders.pod_template(OWNER, api.parse_spec(raw), "prefill")["spec"]["readinessGates"]
    assert gates == [{"conditionType": "other"}, {"conditionType": "disagg.dev/routable"}]


def test_service_ports(spec):
    svc = builders.service(OWNER, spec, "decode")
    assert svc["metadata"]["name"] == "llama-decode"
    assert svc["spec"]["selector"] == {"disagg.dev/deployment": "llama", "disagg.dev/pool": "decode"}
    ports = {p["name"]: p for p in svc["spec"]["ports"]}
    assert ports["http"]["port"] == 8000 and ports["http"]["targetPort"] == 8000
    assert ports["metrics"]["targetPort"] == 8000 and ports["metrics"]["port"] != 8000


def test_service_default_port_and_dedicated_metrics_port():
    spec = _spec_with_containers([{"name": "vllm", "image": "e"}])
    ports = builders.service(OWNER, spec, "prefill")["spec"]["ports"]
    assert ports[0]["port"] == 8000
    spec = _spec_with_containers(
        [
            {
                "name": "vllm",
                "image": "e",
                "ports": [{"name": "metrics", "containerPort": 9100}, {"containerPort": 30000}],
            }
        ]
    )
    ports = {p["name"]: p for p in builders.service(OWNER, spec, "prefill")["spec"]["ports"]}
    assert ports["http"]["port"] == 30000
    assert ports["metrics"]["port"] == 9100 and ports["metrics"]["targetPort"] == 9100
    spec = _spec_with_containers([{"name": "vllm", "image": "e", "ports": [{"containerPort": 9090}]}])
    ports = [p["port"] for p in builders.service(OWNER, spec, "prefill")["spec"]["ports"]]
    assert len(set(ports)) == 2


def test_pdb(spec):
    pdb = builders.pod_disruption_budget(OWNER, spec, "prefill")
    assert pdb["apiVersion"] == "policy/v1"
    assert pdb["spec"] == {
        "maxUnavailable": 1,
        "selector": {"matchLabels": {"disagg.dev/deployment": "llama", "disagg.dev/pool": "prefill"}},
    }
    assert pdb["metadata"]["ownerReferences"][0]["controller"] is True


def test_all_objects():
    spec = sample("multimodal-epd.yaml")
    objs = builders.all_objects(OWNER, spec, {"decode": 5})
    assert [(o["kind"], o["metadata"]["name"]) for o in objs] == [
        (kind, f"llama-{pool}")
        for pool in ("encoder", "prefill", "decode")
        for kind in ("Deployment", "Service", "PodDisruptionBudget")
    ]
    reps = {o["metadata"]["name"]: o["spec"]["replicas"] for o in objs if o["kind"] == "Deployment"}
    assert reps == {"llama-encoder": 1, "llama-prefill": 1, "llama-decode": 5}


def test_initial_replicas_from_spec(spec):
    d = builders.pool_objects(OWNER, spec, "decode")[0]
    assert d["spec"]["replicas"] == 4


def test_template_hash():
    a = {"x": 1, "y": {"b": [1, 2], "a": None}}
    b = {"y": {"a": None, "b": [1, 2]}, "x": 1}
    assert builders.template_hash(a) == builders.template_hash(b)
    assert builders.template_hash(a) != builders.template_hash({**a, "x": 2})
    assert len(builders.template_hash(a)) == 16


def test_template_hash_tracks_template_changes_only(spec):
    h1 = builders.deployment(OWNER, spec, "prefill", 1)["metadata"]["annotations"]["disagg.dev/template-hash"]
    h2 = builders.deployment(OWNER, spec, "prefill", 7)["metadata"]["annotations"]["disagg.dev/template-hash"]
    assert h1 == h2  # replicas do not change the hash
    raw = spec.model_dump(by_alias=True)
    raw["pools"]["prefill"]["template"]["spec"]["containers"][0]["image"] = "vllm/vllm-openai:v0.12.0"
    h3 = builders.deployment(OWNER, api.parse_spec(raw), "prefill", 1)["metadata"]["annotations"][
        "disagg.dev/template-hash"
    ]
    assert h3 != h1
    raw = spec.model_dump(by_alias=True)
    raw["pools"]["prefill"]["gpusPerReplica"] = 8
    h4 = builders.deployment(OWNER, api.parse_spec(raw), "prefill", 1)["metadata"]["annotations"][
        "disagg.dev/template-hash"
    ]
    assert h4 != h1


def test_deep_merge():
    base = {"a": {"b": 1, "c": [1]}, "d": 1}
    over = {"a": {"c": [2], "e": 3}}
    assert builders.deep_merge(base, over) == {"a": {"b": 1, "c": [2], "e": 3}, "d": 1}
    assert base == {"a": {"b": 1, "c": [1]}, "d": 1}


def test_output_is_plain_yaml_serialisable(spec):
    for obj in builders.all_objects(OWNER, spec):
        assert yaml.safe_load(yaml.safe_dump(obj)) == obj


def test_pure_module_imports():
    import re

    src = (ROOT / "operator/disagg/builders.py").read_text()
    for banned in ("kopf", "kubernetes", "aiohttp", "requests", "httpx"):
        assert not re.search(rf"^\s*(import|from)\s+{banned}\b", src, re.M), banned
