"""The worked example's figures are defined once (`disagg.worked_example`) and every default reads them."""

from __future__ import annotations

import pytest

from disagg import api, model, planner
from disagg import worked_example as we
from disagg.commands import modelflags

TPL = {"spec": {"containers": [{"name": "vllm", "image": "x"}]}}


def spec_without_models() -> api.DisaggDeploymentSpec:
    """A spec that leaves every service model, the KV link and the SLO at their defaults."""
    return api.DisaggDeploymentSpec.model_validate(
        {
            "engine": "vllm",
            "model": "m",
            "pools": {
                "encoder": {"maxReplicas": 2, "template": TPL},
                "prefill": {"maxReplicas": 2, "template": TPL},
                "decode": {"maxReplicas": 4, "template": TPL},
            },
        }
    )


def test_the_chapter_figures() -> None:
    # The chapter's numbers: 6,000 tokens prefill in 230 ms, 32 slots of 45 ms steps.
    assert pytest.approx(230.0) == we.PREFILL_FIXED_MS + we.PREFILL_MS_PER_TOKEN * we.PROMPT_TOKENS
    assert (we.KV_BYTES_PER_TOKEN, we.DECODE_SLOTS, we.DECODE_STEP_MS) == (320 * 1024, 32, 45.0)
    assert (we.TTFT_S, we.ITL_S, we.PERCENTILE) == (0.6, 0.15, 0.9)


def test_a_spec_without_models_plans_with_the_model_defaults() -> None:
    inputs = api.planner_inputs(spec_without_models())
    default = model.StageModels()
    assert inputs.models.encoder == default.encoder
    assert inputs.models.decode == default.decode
    assert inputs.models.transfer == default.transfer
    # the CRD's prefill chunk is the worked example's; the dataclass leaves chunking off
    assert inputs.models.prefill == model.PrefillModel(chunk_tokens=we.CHUNK_TOKENS)
    assert inputs.slo == planner.SLO()


def test_flag_defaults_are_the_model_defaults() -> None:
    flags = modelflags.defaults()
    m = model.StageModels()
    assert (flags["encoder_fixed_ms"], flags["encoder_ms_per_item"]) == (
        m.encoder.fixed_ms,
        m.encoder.ms_per_item,
    )
    assert (flags["prefill_fixed_ms"], flags["prefill_ms_per_token"]) == (
        m.prefill.fixed_ms,
        m.prefill.ms_per_token,
    )
    assert (flags["decode_step_ms"], flags["decode_slots"]) == (m.decode.step_fixed_ms, m.decode.slots)
    assert (
        flags["kv_bytes_per_token"],
        flags["link_setup_ms"],
        flags["link_gibps"],
        flags["chunk_tokens"],
    ) == (
        m.transfer.kv_bytes_per_token,
        m.transfer.setup_ms,
        m.transfer.bandwidth_gibps,
        m.transfer.chunk_tokens,
    )
    slo = planner.SLO()
    assert (flags["ttft"], flags["itl"], flags["percentile"]) == (slo.ttft_s, slo.itl_s, slo.percentile)
    demand = planner.Demand()
    assert (demand.arrival_rps, demand.prompt_tokens_mean, demand.output_tokens_mean) == (
        we.ARRIVAL_RPS,
        we.PROMPT_TOKENS,
        we.OUTPUT_TOKENS,
    )
