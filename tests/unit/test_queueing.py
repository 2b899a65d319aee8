"""Queueing helpers against closed forms."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from disagg import queueing as q


def erlang_b_exact(c: int, a: float) -> float:
    terms = [a**k / math.factorial(k) for k in range(c + 1)]
    return terms[-1] / sum(terms)


def test_littles_law():
    assert q.littles_law_l(4.0, 0.5) == pytest.approx(2.0)
    assert q.littles_law_w(2.0, 4.0) == pytest.approx(0.5)
    assert q.littles_law_w(2.0, 0.0) == 0.0


@pytest.mark.parametrize("c,a", [(1, 0.5), (2, 1.0), (5, 3.2), (10, 9.9), (20, 30.0), (40, 35.0)])
def test_erlang_b_matches_factorial_formula(c, a):
    assert q.erlang_b(c, a) == pytest.approx(erlang_b_exact(c, a), rel=1e-10)


def test_mm1_closed_forms():
    lam, mu = 3.0, 5.0
    rho = lam / mu
    assert q.erlang_c(1, lam / mu) == pytest.approx(rho)
    assert q.mmc_mean_wait(1, lam, mu) == pytest.approx(rho / (mu - lam))
    t = 0.7
    assert q.mmc_wait_tail(t, 1, lam, mu) == pytest.approx(rho * math.exp(-(mu - lam) * t))
    p = 0.9
    assert q.mmc_wait_percentile(p, 1, lam, mu) == pytest.approx(math.log(rho / (1 - p)) / (mu - lam))


def test_mm2_known_values():
    # lam = mu = 1, c = 2: rho = 0.5, P(wait) = 2 rho^2 / (1 + rho) = 1/3, Wq = 1/3.
    assert q.erlang_b(2, 1.0) == pytest.approx(0.2)
    assert q.erlang_c(2, 1.0) == pytest.approx(1 / 3)
    assert q.mmc_mean_wait(2, 1.0, 1.0) == pytest.approx(1 / 3)
    # lam = 3, mu = 2 (a = 1.5, rho = 0.75): C = 2 rho^2/(1+rho) = 9/14, Wq = C/(4-3)
    assert q.erlang_c(2, 1.5) == pytest.approx(9 / 14)
    assert q.mmc_mean_wait(2, 3.0, 2.0) == pytest.approx(9 / 14)


def test_unstable_and_idle():
    assert q.erlang_c(2, 2.0) == 1.0
    assert math.isinf(q.mmc_mean_wait(2, 4.0, 2.0))
    assert math.isinf(q.mmc_wait_percentile(0.9, 2, 4.0, 2.0))
    assert q.erlang_c(3, 0.0) == 0.0
    assert q.mmc_mean_wait(3, 0.0, 1.0) == 0.0
    assert q.erlang_b(0, 1.0) == 1.0


def test_huge_c_no_overflow():
    b = q.erlang_b(5000, 4900.0)
    assert 0 < b < 0.05 and math.isfinite(b)
    c = q.erlang_c(20000, 19500.0)
    assert 0 <= c <= 1 and math.isfinite(c)
    assert q.erlang_b(100_000, 10.0) == 0.0
    w = q.mmc_wait_percentile(0.99, 5000, 4900.0, 1.0)
    assert math.isfinite(w) and w >= 0


def test_vectorised_over_c_and_lambda():
    cs = np.array([1, 2, 5, 10])
    out = q.erlang_b(cs, 1.0)
    np.testing.assert_allclose(out, [erlang_b_exact(int(c), 1.0) for c in cs], rtol=1e-10)
    lams = np.array([0.5, 1.0, 1.5])
    w = q.mmc_mean_wait(2, lams, 1.0)
    assert w.shape == (3,)
    assert np.all(np.diff(w) > 0)
    grid = q.erlang_c(cs[:, None], lams[None, :])
    assert grid.shape == (4, 3)


def test_erlang_b_table_matches_vector():
    tab = q.erlang_b_table(37.3, 80)
    for c in (38, 45, 60, 80):
        assert tab[c] == pytest.approx(q.erlang_b(c, 37.3), rel=1e-12)
    assert q.erlang_b_table(0.0, 3) == [1.0, 0.0, 0.0, 0.0]


def test_mgc_scales_mmc():
    base = q.mmc_mean_wait(4, 3.0, 1.0)
    assert q.mgc_mean_wait(4, 3.0, 1.0, cs2=0.0) == pytest.approx(base / 2)  # M/D/c ~ half
    assert q.mgc_mean_wait(4, 3.0, 1.0, cs2=1.0) == pytest.approx(base)
    p_mm = q.mmc_wait_percentile(0.95, 4, 3.0, 1.0)
    assert q.mgc_wait_percentile(0.95, 4, 3.0, 1.0, cs2=3.0) == pytest.approx(2 * p_mm)
    # tail at the percentile is 1 - p
    t = q.mgc_wait_percentile(0.95, 4, 3.0, 1.0, cs2=0.5)
    assert q.mgc_wait_tail(t, 4, 3.0, 1.0, cs2=0.5) == pytest.approx(0.05)


def test_percentile_zero_when_wait_probability_small():
    # C(10, 2) is tiny: 90th percentile wait is 0
    assert q.wait_percentile(0.9, 10, 2.0, 1.0) == 0.0


def test_decode_slot_wait_worked_example():
    # 2 replicas x 32 slots, 18 s hold -> capacity 3.56 rps; at 3 rps there is some wait
    mean, p90 = q.decode_slot_wait(0.9, 2, 32, 3.0, 400, 45.0)
    assert 0 <= mean <= p90 < 18
    _mean0, p0 = q.decode_slot_wait(0.9, 3, 32, 3.0, 400, 45.0)
    assert p0 <= p90


def test_bad_inputs():
    with pytest.raises(ValueError, match="percentile"):
        q.wait_percentile(1.5, 2, 1.0, 1.0)
    with pytest.raises(ValueError, match="lam"):
        q.mmc_mean_wait(2, -1.0, 1.0)
    with pytest.raises(ValueError, match="c must"):
        q.erlang_b(-1, 1.0)
    with pytest.raises(ValueError, match="mu"):
        q.mmc_mean_wait(2, 1.0, 0.0)


@settings(max_examples=60, deadline=None)
@given(c=st.integers(1, 60), rho=st.floats(0.01, 0.99))
def test_erlang_properties(c, rho):
    a = rho * c
    b = q.erlang_b(c, a)
    cc = q.erlang_c(c, a)
    assert b == pytest.approx(erlang_b_exact(c, a), rel=1e-8, abs=1e-300)
    assert 0 <= b <= cc <= 1
    # more servers never wait longer
    assert q.mmc_mean_wait(c + 1, a, 1.0) <= q.mmc_mean_wait(c, a, 1.0) + 1e-15


@pytest.mark.parametrize("a", [0.0, 1e-9, 0.3, 5.0, 37.3, 150.0, 400.5, 1000.0, 4321.7, 20000.0])
@pytest.mark.parametrize("k", [1, 7, 32])
def test_erlang_b_stride_matches_scalar_recursion(a, k):
    # starts below, at and above the load; the vectorised block (large a) agrees to ~1e-13
    sq = math.sqrt(a)
    for c0 in sorted({0, 1, max(0, int(a - 8 * sq) - 6), int(a) + 1, int(a + 3 * sq) + 1}):
        got = list(itertools.islice(q.erlang_b_stride(a, c0, k), 50))
        ref = q.erlang_b_range(a, 0, c0 + 50 * k)
        for i, g in enumerate(got):
            r = ref[c0 + i * k]
            assert g == pytest.approx(r, rel=1e-12, abs=1e-290), (c0, i)


def test_erlang_b_stride_past_hint_and_cutoff():
    a = 2500.0
    # a tiny hint: the rest of the stride comes from the scalar recursion, unchanged values
    got = list(itertools.islice(q.erlang_b_stride(a, 2400, 10, c_hint=2450), 40))
    ref = q.erlang_b_range(a, 2400, 2400 + 400)
    np.testing.assert_allclose(got, ref[::10][:40], rtol=1e-12)
    # beyond a + 40 sqrt(a) + 50 servers B is 0, as in erlang_b_range
    far = list(itertools.islice(q.erlang_b_stride(a, 4600, 1), 3))
    assert far == [0.0, 0.0, 0.0] == q.erlang_b_range(a, 4600, 4602)
    with pytest.raises(ValueError, match="a must"):
        next(q.erlang_b_stride(-1.0, 0))
    with pytest.raises(ValueError, match="k >= 1"):
        next(q.erlang_b_stride(1.0, 0, 0))
