"""disagg.api: the pydantic models, their defaults, rules and the samples."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from disagg import api

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = sorted((ROOT / "config/samples").glob("*.yaml"))
INVALID = sorted((ROOT / "config/samples/invalid").glob("*.yaml"))
CRD = ROOT / "crds/disagg.dev_disaggdeployments.yaml"

#: Phrases of the API server's OpenAPI (schema) validation errors.
OPENAPI_PHRASES = (
    "should be greater than or equal to",
    "should be greater than",
    "should be less than or equal to",
    "should be less than",
    "Unsupported value",
    "Required value",
    "must be of type",
    "Too many",
    "Too long",
    "field not declared in schema",  # strict field validation of server-side apply
)


def load(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def expectation(path: Path) -> str:
    m = re.search(r"^# expect: (.+)$", path.read_text(), re.M)
    assert m, f"{path.name}: no '# expect: <message>' line"
    return m.group(1).strip()


def cel_messages() -> list[str]:
    """Messages of every x-kubernetes-validations rule of the checked-in CRD."""
    out: list[str] = []

    def walk(node):
        if isinstance(node, dict):
            out.extend(r["message"] for r in node.get("x-kubernetes-validations") or [])
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(yaml.safe_load(CRD.read_text()))
    return out


def minimal_spec(**over) -> dict:
    tpl = {"spec": {"containers": [{"name": "vllm", "image": "x"}]}}
    spec = {
        "engine": "vllm",
        "model": "m",
        "pools": {
            "prefill": {"maxReplicas": 2, "template": tpl},
            "decode": {"maxReplicas": 4, "template": tpl},
        },
    }
    spec.update(over)
    return spec


def test_samples_exist():
    names = {p.name for p in SAMPLES}
    assert {
        "vllm-disaggregated-70b.yaml",
        "sglang-disaggregated.yaml",
        "multimodal-epd.yaml",
        "colocated.yaml",
    } <= names
    assert len(INVALID) >= 12


@pytest.mark.parametrize("path", SAMPLES, ids=lambda p: p.name)
def test_valid_sample_validates(path: Path):
    obj = load(path)
    assert obj["apiVersion"] == api.API_VERSION
    assert obj["kind"] == api.KIND
    spec = api.DisaggDeploymentSpec.model_validate(obj["spec"])
    assert api.pool_names(spec)
    # Round trip through the wire form is lossless.
    assert api.DisaggDeploymentSpec.model_validate(spec.to_dict()) == spec


@pytest.mark.parametrize("path", INVALID, ids=lambda p: p.name)
def test_invalid_sample_expectation_is_known(path: Path):
    expect = expectation(path)
    if any(expect in message for message in cel_messages()):
        return  # a CEL message of the CRD
    assert any(expect.startswith(phrase) for phrase in OPENAPI_PHRASES), (
        f"{path.name}: '{expect}' is neither a CEL message of the CRD nor an OpenAPI validation phrase"
    )


@pytest.mark.parametrize("path", INVALID, ids=lambda p: p.name)
def test_invalid_sample_refused_by_models(path: Path):
    """The operator refuses what the API server refuses (same message for CEL rules)."""
    expect = expectation(path)
    obj = load(path)
    name_error = api.name_error(obj["metadata"]["name"])
    if name_error is not None:  # a rule on metadata.name, checked by reconcile before the spec
        assert expect in name_error
        return
    with pytest.raises(ValidationError) as info:
        api.DisaggDeploymentSpec.model_validate(obj["spec"])
    if any(expect in message for message in cel_messages()):
        assert expect in str(info.value)


def test_defaults_are_the_worked_example():
    spec = api.parse_spec(minimal_spec())
    pre = spec.pools.prefill.service_model
    assert (pre.fixed_ms, pre.ms_per_token, pre.ms_per_token_squared, pre.chunk_tokens) == (
        20,
        0.035,
        0,
        2000,
    )
    dec = spec.pools.decode.service_model
    assert (dec.step_fixed_ms, dec.step_ms_per_sequence, dec.slots) == (45, 0, 32)
    kv = spec.kv_transfer
    assert (kv.bytes_per_token, kv.link_setup_ms, kv.bandwidth_gi_bps, kv.chunk_tokens) == (
        327680,
        12,
        22,
        2000,
    )
    assert (spec.slo.ttft_seconds, spec.slo.itl_seconds, spec.slo.percentile) == (0.6, 0.15, 0.9)
    a = spec.autoscaling
    assert (a.enabled, a.paused, a.interval_seconds, a.metric_window_seconds) == (True, False, 30, 60)
    assert a.scale_down_stabilization_seconds == 300
    assert a.gpu_budget is None
    assert spec.placement.mode == "disaggregated"
    assert spec.placement.split_threshold_tokens == "auto"
    d = spec.pools.decode.drain
    assert (d.timeout_seconds, d.on_timeout) == (300, "proceed")
    assert spec.pools.decode.min_replicas == 1
    assert spec.pools.decode.initial_replicas == 1


def test_camel_case_wire_names_and_snake_case_attributes():
    spec = api.parse_spec(minimal_spec(kvTransfer={"bandwidthGiBps": 10}))
    assert spec.kv_transfer.bandwidth_gi_bps == 10
    wire = spec.to_dict()
    assert wire["kvTransfer"]["bandwidthGiBps"] == 10
    assert wire["pools"]["prefill"]["serviceModel"]["msPerTokenSquared"] == 0
    assert "encoder" not in wire["pools"]
    # populate_by_name: snake_case input works too.
    assert (
        api.DisaggDeploymentSpec.model_validate(
            {**minimal_spec(), "kv_transfer": {"bandwidth_gi_bps": 5}}
        ).kv_transfer.bandwidth_gi_bps
        == 5
    )


def test_unknown_fields_refused():
    bad = minimal_spec()
    bad["pools"]["prefill"]["replica"] = 1
    with pytest.raises(ValidationError):
        api.parse_spec(bad)


def test_split_threshold_int_or_auto():
    assert api.parse_spec(
        minimal_spec(placement={"mode": "conditional", "splitThresholdTokens": 1500})
    ).placement
    for bad in (0, -5, "big"):
        with pytest.raises(ValidationError):
            api.parse_spec(minimal_spec(placement={"mode": "conditional", "splitThresholdTokens": bad}))


def test_template_needs_a_container():
    bad = minimal_spec()
    bad["pools"]["decode"]["template"] = {"spec": {"containers": []}}
    with pytest.raises(ValidationError, match="at least one container"):
        api.parse_spec(bad)


def test_gpu_budget_counts_every_pool():
    spec = minimal_spec(autoscaling={"gpuBudget": 6})
    spec["pools"]["prefill"].update(minReplicas=1, gpusPerReplica=4)
    spec["pools"]["decode"].update(minReplicas=1, gpusPerReplica=2)
    parsed = api.parse_spec(spec)
    assert api.min_gpus(parsed) == 6
    spec["autoscaling"]["gpuBudget"] = 5
    with pytest.raises(ValidationError, match="gpuBudget"):
        api.parse_spec(spec)


def test_pool_names_in_pipeline_order():
    spec = minimal_spec()
    spec["pools"]["encoder"] = {"maxReplicas": 1, "template": spec["pools"]["decode"]["template"]}
    assert api.pool_names(api.parse_spec(spec)) == ["encoder", "prefill", "decode"]


@pytest.mark.parametrize(
    ("replicas", "ratio"),
    [
        ({"prefill": 2, "decode": 5}, "1:2.5"),
        ({"prefill": 1, "decode": 3, "encoder": 1}, "1:3:1"),
        ({"prefill": 3, "decode": 4}, "1:1.33"),
        ({"prefill": 0, "decode": 2}, "0:2"),
        ({"colocated": 4}, "4"),
    ],
)
def test_format_ratio(replicas, ratio):
    assert api.format_ratio(replicas) == ratio


def test_status_is_permissive():
    status = api.DisaggDeploymentStatus.model_validate(
        {
            "observedGeneration": 3,
            "conditions": [{"type": "Ready", "status": "True", "reason": "PoolsReady", "extra": 1}],
            "pools": {"prefill": {"replicas": 2, "readyReplicas": 1, "drainingPods": ["p-1"]}},
            "ratio": "1:2",
            "lastDecision": {"reason": "ScaleUp", "inputs": {"lambda": 4.2, "nested": {"x": [1, 2]}}},
            "calibration": {"prefill": {"msPerToken": 0.03}},
            "somethingNew": True,
        }
    )
    assert status.pools["prefill"].draining_pods == ["p-1"]
    assert status.last_decision.inputs["nested"] == {"x": [1, 2]}


def test_stage_models_when_model_module_exists():
    m = pytest.importorskip("disagg.model")
    if not all(hasattr(m, n) for n in ("PrefillModel", "TransferModel", "DecodeModel", "EncoderModel")):
        pytest.skip("disagg.model does not define the stage dataclasses yet")
    spec = api.parse_spec(load(ROOT / "config/samples/multimodal-epd.yaml")["spec"])
    models = api.stage_models(spec)
    assert set(models) == {"encoder", "prefill", "transfer", "decode"}
    assert models["transfer"].kv_bytes_per_token == 57344
    colocated = api.parse_spec(load(ROOT / "config/samples/colocated.yaml")["spec"])
    assert set(api.stage_models(colocated)) == {"prefill", "decode"}


def test_pure_module_imports():
    src = (ROOT / "operator/disagg/api.py").read_text()
    for banned in ("kopf", "kubernetes", "aiohttp", "requests", "httpx", "urllib"):
        assert not re.search(rf"^\s*(import|from)\s+{banned}\b", src, re.M), banned


def test_stage_bundle_fills_absent_stages():
    m = pytest.importorskip("disagg.model")
    if not hasattr(m, "StageModels"):
        pytest.skip("disagg.model.StageModels not defined")
    spec = api.parse_spec(load(ROOT / "config/samples/vllm-disaggregated-70b.yaml")["spec"])
    bundle = api.stage_bundle(spec)
    assert bundle.prefill.chunk_tokens == 2000
    assert bundle.decode.slots == 32
    assert bundle.transfer.bandwidth_gibps == 22
    assert bundle.encoder == m.EncoderModel()  # no encoder pool: the model's defaults
    # The API's encoder defaults are the model's.
    enc = api.EncoderServiceModel()
    assert (enc.fixed_ms, enc.ms_per_item) == (m.EncoderModel().fixed_ms, m.EncoderModel().ms_per_item)
