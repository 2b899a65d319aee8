"""Online calibration: the spec's model is the prior; enough samples replace it."""

from __future__ import annotations

import numpy as np
import pytest

from disagg.calibration import Calibrator
from disagg.model import DecodeModel, PrefillModel, StageModels


def test_too_few_samples_keep_the_spec_model():
    cal = Calibrator(min_samples=5)
    base = StageModels()
    for b in (4, 8):
        cal.observe({"itl_mean": 0.1}, b)
    assert cal.models(base).decode == base.decode
    st = cal.status(base)
    assert st["decode"]["samples"] == 2 and st["decode"]["fitted"] is False


def test_decode_step_time_is_fitted_from_itl_against_batch():
    true = DecodeModel(step_fixed_ms=30.0, step_ms_per_seq=0.5, slots=32)
    rng = np.random.default_rng(1)
    cal = Calibrator(min_samples=5, prior_weight=1.0)
    for _ in range(60):
        batch = float(rng.uniform(1, 32))
        cal.observe({"itl_mean": true.step_ms(batch) / 1000 * (1 + rng.normal(0, 0.01))}, batch)
    fitted = cal.models(StageModels()).decode  # prior: 45 ms flat
    assert fitted.step_fixed_ms == pytest.approx(30.0, rel=0.1)
    assert fitted.step_ms_per_seq == pytest.approx(0.5, rel=0.15)
    assert fitted.slots == 32
    assert cal.status(StageModels())["decode"]["samples"] == 60


def test_prefill_is_fitted_from_prefill_time_against_tokens_and_outliers_do_not_dominate():
    true = PrefillModel(fixed_ms=25.0, ms_per_token=0.05)
    cal = Calibrator(min_samples=5, prior_weight=1.0)
    for tokens in np.linspace(500, 8000, 40):
        cal.observe({"prefill_time_mean": true.service_ms(tokens) / 1000, "prompt_tokens_mean": tokens}, None)
    cal.observe({"prefill_time_mean": 50.0, "prompt_tokens_mean": 1000.0}, None)  # a 50 s outlier
    fitted = cal.models(StageModels()).prefill
    assert fitted.ms_per_token == pytest.approx(0.05, rel=0.1)
    assert fitted.fixed_ms == pytest.approx(25.0, abs=10)


def test_missing_or_invalid_values_add_no_sample():
    cal = Calibrator()
    cal.observe({"itl_mean": float("nan")}, 4)
    cal.observe({"itl_mean": 0.05}, 0)
    cal.observe({"prefill_time_mean": -1.0, "prompt_tokens_mean": 100}, None)
    assert len(cal.decode) == 0 and len(cal.prefill) == 0
