"""The Dynamo baseline's load predictors: auto-ARIMA fitted by CSS, Dynamo's fallbacks, the baseline using it."""

from __future__ import annotations

import math

import numpy as np
import pytest

from disagg.baselines import DynamoMetrics, DynamoPolicy
from disagg.evaluate import EvalSettings, Obs
from disagg.forecast import (
    ARIMA_MIN_POINTS,
    ArimaPredictor,
    ConstantPredictor,
    auto_arima,
    choose_d,
    fit_arima,
    kpss_level_statistic,
)
from disagg.names import POOL_DECODE, POOL_PREFILL
from disagg.workload import Workload


def ar1(phi: float, n: int, seed: int, level: float = 10.0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    e = rng.normal(size=n)
    y = np.zeros(n)
    for t in range(1, n):
        y[t] = phi * y[t - 1] + e[t]
    return y + level


# --------------------------------------------------------------------------- the fit


def test_css_recovers_an_ar1_coefficient_and_mean() -> None:
    y = ar1(0.7, 2000, seed=0)
    fit = fit_arima(y, 1, 0, 0)
    assert fit is not None
    assert fit.phi[0] == pytest.approx(0.7, abs=0.04)
    assert fit.mean == pytest.approx(10.0, abs=0.3)
    assert fit.sigma2 == pytest.approx(1.0, abs=0.1)


def test_css_recovers_an_ma1_coefficient() -> None:
    rng = np.random.default_rng(3)
    e = rng.normal(size=1500)
    x = 5.0 + e[1:] + 0.5 * e[:-1]
    fit = fit_arima(x, 0, 0, 1)
    assert fit is not None
    assert fit.theta[0] == pytest.approx(0.5, abs=0.06)


def test_aic_prefers_the_ar_model_to_white_noise_on_ar1_data() -> None:
    y = ar1(0.7, 150, seed=0)
    fit = auto_arima(y, max_pq=2)
    assert fit is not None and fit.d == 0
    assert fit.p + fit.q >= 1
    noise = fit_arima(y, 0, 0, 0)
    assert noise is not None and fit.aic < noise.aic - 10
    # the chosen model's one-step forecast moves towards the mean from the last value
    assert abs(fit.forecast(y) - 10.0) < abs(y[-1] - 10.0) + 1e-9


def test_kpss_differences_a_trend_not_a_stationary_series() -> None:
    rng = np.random.default_rng(1)
    trend = 3.0 + 2.0 * np.arange(60) + rng.normal(scale=1.0, size=60)
    assert kpss_level_statistic(trend) > 0.463
    assert choose_d(trend) == 1
    assert choose_d(ar1(0.3, 200, seed=2)) == 0
    assert kpss_level_statistic(np.full(10, 4.0)) == 0.0  # no variance: stationary


def test_auto_arima_extrapolates_a_linear_trend() -> None:
    rng = np.random.default_rng(1)
    t = np.arange(40)
    y = 3.0 + 2.0 * t + rng.normal(scale=0.5, size=40)
    fit = auto_arima(y, max_pq=2)
    assert fit is not None and fit.d >= 1
    assert fit.forecast(y) == pytest.approx(3.0 + 2.0 * 40, abs=1.5)  # the trend's next value, not the last
    exact = 3.0 + 2.0 * t
    assert auto_arima(exact).forecast(exact) == pytest.approx(83.0, abs=1e-6)


def test_fit_refuses_an_order_the_series_cannot_carry() -> None:
    assert fit_arima([1.0, 2.0, 3.0, 2.0], 3, 0, 3) is None


# --------------------------------------------------------------------------- Dynamo's fallbacks


def test_fewer_than_min_points_returns_the_last_value() -> None:
    p = ArimaPredictor()
    for v in (10.0, 30.0, 20.0, 40.0)[: ARIMA_MIN_POINTS - 1]:
        p.add(v)
    assert p.predict() == 40.0
    assert p.fit is None


def test_leading_zeros_are_skipped_and_later_nan_counts_as_zero() -> None:
    p = ArimaPredictor()
    for v in (0.0, None, math.nan, 0.0, 5.0, None, -3.0, math.inf):
        p.add(v)
    assert p.values == [5.0, 0.0, 0.0, 0.0]  # idle start dropped; None/NaN/inf -> 0; clipped at 0
    assert ConstantPredictor().predict() == 0.0


def test_constant_series_returns_its_value() -> None:
    p = ArimaPredictor()
    for _ in range(8):
        p.add(7.0)
    assert p.predict() == 7.0


def test_a_ramp_is_predicted_above_its_last_value() -> None:
    arima, constant = ArimaPredictor(), ConstantPredictor()
    for v in (100.0, 130.0, 170.0, 200.0, 240.0, 270.0):
        arima.add(v)
        constant.add(v)
    assert constant.predict() == 270.0
    assert arima.predict() > 280.0
    # the order is chosen once; more points refit only the coefficients
    order = arima.fit.order
    arima.add(300.0)
    arima.predict()
    assert arima.fit.order == order


def test_a_raw_order_without_ar_or_ma_terms_falls_back_to_log_space() -> None:
    step = [10.0, 10.0, 10.0, 40.0, 40.0, 40.0]
    raw = auto_arima(step)
    assert raw is not None and raw.p == raw.q == 0  # a level alone is the best raw model
    p = ArimaPredictor()
    for v in step:
        p.add(v)
    forecast = p.predict()
    assert p.log_space  # Dynamo refits a (0, d, 0) raw order on log1p(y) and stays there
    assert forecast == pytest.approx(math.expm1(p.fit.forecast(np.log1p(step))))
    assert forecast < raw.forecast(step)  # the log-space level is below the raw mean (25)


# --------------------------------------------------------------------------- the baseline uses it


def _policy(predictor: str) -> DynamoPolicy:
    w = Workload(np.array([0.0, 1.0]), np.array([1000, 1000]), np.array([100, 100]), name="tiny")
    return DynamoPolicy(EvalSettings(dynamo_predictor=predictor), w, None)


def _ramp_targets(policy: DynamoPolicy, counts: list[float]) -> dict[str, int]:
    steps = iter(counts)
    policy.observe = lambda now: DynamoMetrics(  # type: ignore[method-assign]
        num_req=next(steps), isl=2000.0, osl=200.0, ttft_ms=150.0, itl_ms=40.0, request_duration_s=10.0
    )
    out: dict[str, int] = {}
    pools = {POOL_PREFILL: 2, POOL_DECODE: 2}
    for i in range(len(counts)):
        o = Obs(
            now=180.0 * (i + 1),
            rate=0.0,
            count=0,
            prompt_mean=2000.0,
            prompt_std=0.0,
            output_mean=200.0,
            output_std=0.0,
            util={},
            ready=dict(pools),
            requested=dict(pools),
            pending={},
            ttft_p=None,
        )
        out, _why = policy.decide(o)
    return out


def test_dynamo_baseline_forecasts_a_ramp_with_arima() -> None:
    counts = [1000.0 * i for i in range(1, 8)]
    arima = _policy("arima")
    constant = _policy("constant")
    a = _ramp_targets(arima, counts)
    c = _ramp_targets(constant, counts)
    assert constant.predicted["num_req"] == 7000.0
    assert arima.predicted["num_req"] > 7000.0 * 1.05  # the next interval of the ramp, not the last one
    assert a[POOL_PREFILL] + a[POOL_DECODE] > c[POOL_PREFILL] + c[POOL_DECODE]
    assert EvalSettings().dynamo_predictor == "arima"  # Dynamo's default


def test_unknown_predictor_is_refused() -> None:
    with pytest.raises(ValueError, match="dynamo_predictor must be one of"):
        EvalSettings(dynamo_predictor="prophet")


def test_closed_form_root_check_matches_numpy_roots() -> None:
    from disagg.forecast import ROOT_MARGIN, _stable

    rng = np.random.default_rng(0)
    for _ in range(3000):
        c = rng.uniform(-2.5, 2.5, size=int(rng.integers(1, 4)))
        sign = float(rng.choice([-1.0, 1.0]))
        reference = bool(np.all(np.abs(np.roots(np.concatenate([(sign * c)[::-1], [1.0]]))) > ROOT_MARGIN))
        assert _stable(c, sign) == reference, (c, sign)
