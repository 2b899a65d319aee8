"""Stage service-time models: every figure of the worked example, validation, fitting."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from disagg.model import (
    GIB,
    MIB,
    DecodeModel,
    EncoderModel,
    PrefillModel,
    StageModels,
    TransferModel,
    fit_decode,
    fit_linear,
    fit_prefill,
)

M = StageModels()


def test_prefill_6000_tokens_is_230ms():
    assert M.prefill.service_ms(6000) == pytest.approx(230.0)


def test_kv_bytes_6000_tokens():
    assert M.transfer.kv_bytes(6000) == 1_966_080_000
    assert M.transfer.kv_bytes(6000) / GIB == pytest.approx(1.831, abs=1e-3)


def test_serial_transfer_about_95_23ms():
    assert M.transfer.serial_ms(6000) == pytest.approx(95.23, abs=0.01)


def test_chunked_pipeline_ends_about_269_7ms_instead_of_325_2():
    chunked = M.transfer.chunked_end_ms(M.prefill, 6000)
    serial = M.prefill.service_ms(6000) + M.transfer.serial_ms(6000)
    assert chunked == pytest.approx(269.74, abs=0.05)
    assert serial == pytest.approx(325.23, abs=0.05)


def test_chunk_ready_times():
    np.testing.assert_allclose(M.prefill.chunk_ready_ms(6000, 2000), [90.0, 160.0, 230.0])
    np.testing.assert_allclose(M.prefill.chunk_ready_ms(5000, 2000), [90.0, 160.0, 195.0])
    np.testing.assert_allclose(M.prefill.chunk_ready_ms(1000, 2000), [55.0])


def test_remote_ttft_serial_and_chunked():
    assert M.remote_ttft_ms(6000) == pytest.approx(370.23, abs=0.01)
    assert M.remote_ttft_ms(6000, chunked=True) == pytest.approx(314.74, abs=0.01)
    assert M.colocated_ttft_ms(6000) == pytest.approx(275.0)
    assert M.transfer_ms(6000, chunked=True) == pytest.approx(39.74, abs=0.01)


def test_capacities_and_ratio():
    assert M.prefill.capacity_rps(6000) == pytest.approx(4.348, abs=1e-3)
    assert M.decode.capacity_rps(400) == pytest.approx(1.778, abs=1e-3)
    assert M.decode_per_prefill(6000, 400) == pytest.approx(2.445, abs=1e-3)
    assert M.decode.slot_hold_s(400) == pytest.approx(18.0)


def test_short_prompt_500_tokens():
    assert M.prefill.service_ms(500) == pytest.approx(37.5)
    assert M.transfer.kv_bytes(500) / MIB == pytest.approx(156.25)


def test_prefix_cache_hits_skip_cached_part():
    assert M.prefill.service_ms(6000, cached_tokens=4000) == pytest.approx(90.0)
    # cached beyond the prompt is clipped
    assert M.prefill.service_ms(100, cached_tokens=1000) == pytest.approx(20.0)


def test_vectorised_over_arrays():
    out = M.prefill.service_ms(np.array([500, 6000]))
    np.testing.assert_allclose(out, [37.5, 230.0])
    np.testing.assert_allclose(M.transfer.serial_ms(np.array([0, 6000])), [12.0, 95.2298], atol=1e-3)
    np.testing.assert_allclose(M.transfer.chunked_end_ms_array(M.prefill, [6000]), [269.74], atol=0.01)


def test_quadratic_term():
    p = PrefillModel(ms_per_token_sq=1e-6)
    assert p.service_ms(1000) == pytest.approx(20 + 35 + 1.0)
    assert p.service_ms(1000, cached_tokens=500) == pytest.approx(20 + 17.5 + 0.75)


def test_decode_step_grows_with_batch_and_itl_cap():
    d = DecodeModel(step_fixed_ms=30.0, step_ms_per_seq=1.0, slots=64)
    assert d.step_ms(10) == pytest.approx(40.0)
    assert d.max_batch_for_itl(50.0) == 20
    assert d.max_batch_for_itl(29.0) == 0
    assert DecodeModel().max_batch_for_itl(150.0) == 32


def test_encoder():
    e = EncoderModel()
    assert e.service_ms(2) == pytest.approx(65.0)


@pytest.mark.parametrize(
    "factory,field",
    [
        (lambda: TransferModel(bandwidth_gibps=0), "bandwidth_gibps"),
        (lambda: TransferModel(setup_ms=-1), "setup_ms"),
        (lambda: DecodeModel(slots=0), "slots"),
        (lambda: DecodeModel(slots=2.5), "slots"),
        (lambda: DecodeModel(step_fixed_ms=float("nan")), "step_fixed_ms"),
        (lambda: PrefillModel(ms_per_token=float("inf")), "ms_per_token"),
        (lambda: PrefillModel(fixed_ms=-0.1), "fixed_ms"),
        (lambda: EncoderModel(ms_per_item=-1), "ms_per_item"),
    ],
)
def test_validation_names_field(factory, field):
    with pytest.raises(ValueError, match=field):
        factory()


def test_negative_tokens_rejected():
    with pytest.raises(ValueError, match="tokens"):
        M.prefill.service_ms(-5)
    with pytest.raises(ValueError, match="tokens"):
        M.transfer.kv_bytes(float("nan"))


def test_models_are_frozen():
    with pytest.raises(AttributeError):
        M.prefill.fixed_ms = 1.0  # type: ignore[misc]


def test_fit_linear_recovers_line_despite_outliers():
    rng = np.random.default_rng(1)
    x = rng.uniform(100, 8000, 200)
    y = 20 + 0.035 * x + rng.normal(0, 1.0, x.size)
    y[:10] += 500  # gross outliers
    a, b, _ = fit_linear(x, y)
    assert a == pytest.approx(20, abs=1.5)
    assert b == pytest.approx(0.035, rel=0.02)


def test_fit_prior_dominates_few_samples():
    fr = fit_prefill([1000.0], [100.0], prior=PrefillModel(), prior_weight=100.0)
    assert fr.samples == 1
    assert fr.model.service_ms(1000) == pytest.approx(55.0, abs=2.0)
    fr0 = fit_prefill([], [], prior=PrefillModel())
    assert fr0.model == PrefillModel()


def test_fit_decode():
    b = np.arange(1, 33)
    fr = fit_decode(b, 40 + 0.5 * b)
    assert fr.model.step_fixed_ms == pytest.approx(40.0)
    assert fr.model.step_ms_per_seq == pytest.approx(0.5)
    assert fr.samples == 32


@settings(max_examples=50, deadline=None)
@given(
    tokens=st.integers(1, 200_000),
    chunk=st.integers(1, 50_000),
)
def test_chunked_never_later_than_serial_plus_setups(tokens, chunk):
    serial = M.prefill.service_ms(tokens) + M.transfer.serial_ms(tokens)
    chunked = M.transfer.chunked_end_ms(M.prefill, tokens, chunk)
    n_chunks = math.ceil(tokens / chunk)
    assert chunked >= M.prefill.service_ms(tokens)
    assert chunked <= serial + (n_chunks - 1) * M.transfer.setup_ms + 1e-6
