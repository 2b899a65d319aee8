"""Queueing helpers: Little's law, Erlang B/C (M/M/c), an M/G/c approximation, decode slots.

Pure (numpy only). Conventions: ``c`` servers (int >= 0), arrival rate
``lam`` and service rate ``mu`` in the same time unit (the planner uses
seconds), offered load ``a = lam / mu`` (Erlangs).

Erlang B is computed with the stable recursion

    B(0) = 1,   B(k) = a B(k-1) / (k + a B(k-1))

which needs no factorials and never overflows. Two truncations keep it
fast for thousands of servers without losing double precision:

* it starts at ``k0 = a - 7 sqrt(a) - 5`` (not 0) from the overload fixed
  point ``B ~ 1 - k0/a``: the recursion contracts any start error by
  ``prod(k/a)`` ~ exp(-24) before reaching ``k = a``;
* beyond ``a + 40 sqrt(a) + 50`` servers B is below 1e-300 and returned as 0.

Everything broadcasts over numpy arrays of ``c`` and ``a``/``lam``.
`erlang_b_stride` (the planner's tables) yields B at c0, c0 + k, ... lazily and
solves long recursions as one vectorised block (the recursion is linear in 1/B).

M/G/c uses the Allen-Cunneen (Kingman-style) correction: the M/M/c wait is
scaled by ``f = (ca^2 + cs^2) / 2``, and the tail ``P(W > t) ~ C exp(-(c mu -
lam) t / f)`` is stretched by the same factor. ``ca^2`` is the arrival
process's variability: 1 for Poisson (the default), the measured index of
dispersion of arrival counts otherwise (`disagg.burstiness`).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import numpy as np

__all__ = [
    "decode_slot_wait",
    "erlang_b",
    "erlang_b_range",
    "erlang_b_stride",
    "erlang_b_table",
    "erlang_c",
    "littles_law_l",
    "littles_law_w",
    "mgc_factor",
    "mgc_mean_wait",
    "mgc_wait_percentile",
    "mgc_wait_tail",
    "mmc_mean_wait",
    "mmc_wait_percentile",
    "mmc_wait_tail",
    "poisson_cdf",
    "poisson_quantile",
    "summed_wait_tail",
    "wait_percentile",
]

_START_SIGMAS = 7.0
_CUTOFF_SIGMAS = 40.0
_HINT_SIGMAS = 4.0  # erlang_b_stride: first vectorised block reaches a + 4 sqrt(a) (+ one stride)
_VECTOR_MIN_STEPS = 160  # below this many recursion steps the scalar loop beats numpy's call overhead


def _out(x: np.ndarray) -> Any:
    return float(x) if np.ndim(x) == 0 else x


def _nonneg(name: str, x: Any) -> np.ndarray:
    a = np.asarray(x, dtype=float)
    if np.any(np.isnan(a)) or np.any(a < 0):
        raise ValueError(f"{name} must be >= 0 and not NaN")
    return a


def _percentile(p: float) -> float:
    if not (isinstance(p, int | float) and 0 < p < 1):
        raise ValueError(f"percentile must be in (0, 1), got {p!r}")
    return float(p)


# --------------------------------------------------------------------------- Little's law


def littles_law_l(arrival_rps: Any, time_s: Any) -> Any:
    """L = lambda x W: mean number in the system (or in queue) from rate and time."""
    return _out(_nonneg("arrival_rps", arrival_rps) * _nonneg("time_s", time_s))


def littles_law_w(l_count: Any, arrival_rps: Any) -> Any:
    """W = L / lambda (0 when lambda is 0)."""
    lam = _nonneg("arrival_rps", arrival_rps)
    num = _nonneg("l_count", l_count)
    with np.errstate(divide="ignore", invalid="ignore"):
        w = np.where(lam > 0, num / np.where(lam > 0, lam, 1.0), 0.0)
    return _out(w)


# --------------------------------------------------------------------------- Erlang B / C


def erlang_b(c: Any, a: Any) -> Any:
    """Erlang B blocking probability for c servers and offered load a (vectorised)."""
    c_arr = np.asarray(c)
    if np.any(c_arr < 0) or np.any(np.asarray(c_arr, dtype=float) != np.floor(c_arr)):
        raise ValueError("c must be a non-negative integer")
    a_arr = _nonneg("a", a)
    if np.any(np.isinf(a_arr)):
        raise ValueError("a must be finite")
    c_b, a_b = np.broadcast_arrays(c_arr.astype(np.int64), a_arr)
    c_b = c_b.astype(np.int64)
    sq = np.sqrt(a_b)
    k0 = np.clip(np.floor(a_b - _START_SIGMAS * sq - 5.0), 0, None).astype(np.int64)
    k0 = np.minimum(k0, c_b)
    cutoff = np.ceil(a_b + _CUTOFF_SIGMAS * sq + 50.0).astype(np.int64)
    c_eff = np.minimum(c_b, cutoff)
    with np.errstate(divide="ignore", invalid="ignore"):
        B = np.where(k0 == 0, 1.0, 1.0 - k0 / np.where(a_b > 0, a_b, 1.0))
    B = np.asarray(B, dtype=float).copy()
    if B.size:
        kmin = int(k0.min())
        kmax = int(c_eff.max())
        for k in range(kmin + 1, kmax + 1):
            active = (k > k0) & (k <= c_eff)
            if not active.any():
                continue
            aB = a_b * B
            B = np.where(active, aB / (k + aB), B)
    B = np.where(c_b > cutoff, 0.0, B)
    return _out(B)


def erlang_b_table(a: float, c_max: int) -> list[float]:
    """Erlang B for every c = 0..c_max at one load (one recursion pass; pure Python floats).

    Entries below the truncated start ``k0`` are the overload approximation
    and only meant for c < a (unstable anyway for waiting systems).
    """
    if a < 0 or math.isnan(a) or math.isinf(a):
        raise ValueError("a must be finite and >= 0")
    if c_max < 0:
        raise ValueError("c_max must be >= 0")
    sq = math.sqrt(a)
    k0 = int(max(0.0, math.floor(a - _START_SIGMAS * sq - 5.0)))
    k0 = min(k0, c_max)
    cutoff = math.ceil(a + _CUTOFF_SIGMAS * sq + 50.0)
    out = [0.0] * (c_max + 1)
    for k in range(k0):
        out[k] = 1.0 - k / a  # overload approximation (k0 > 0 implies a > 0)
    b = 1.0 if k0 == 0 else 1.0 - k0 / a
    out[k0] = b
    for k in range(k0 + 1, min(c_max, cutoff) + 1):
        ab = a * b
        b = ab / (k + ab)
        out[k] = b
    return out


def _c_from_b(c: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        denom = c - a * (1.0 - b)
        cc = np.where(denom > 0, c * b / np.where(denom > 0, denom, 1.0), 1.0)
    cc = np.where(a >= c, 1.0, np.clip(cc, 0.0, 1.0))
    return cc


def erlang_c(c: Any, a: Any) -> Any:
    """Erlang C: probability an arrival waits in M/M/c (1 when a >= c)."""
    b = np.asarray(erlang_b(c, a), dtype=float)
    c_arr, a_arr = np.broadcast_arrays(np.asarray(c, dtype=float), np.asarray(a, dtype=float))
    return _out(_c_from_b(c_arr, a_arr, b))


def _rates(c: Any, lam: Any, mu: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    lam_a = _nonneg("lam", lam)
    mu_a = np.asarray(mu, dtype=float)
    if np.any(~np.isfinite(mu_a)) or np.any(mu_a <= 0):
        raise ValueError("mu must be > 0 and finite")
    if np.any(np.isinf(lam_a)):
        raise ValueError("lam must be finite")
    c_a = np.asarray(c)
    a = lam_a / mu_a
    pw = np.asarray(erlang_c(c_a, a), dtype=float)
    c_f, lam_b, mu_b = np.broadcast_arrays(np.asarray(c_a, dtype=float), lam_a, mu_a)
    gap = c_f * mu_b - lam_b  # drain rate of the queue
    return pw, gap, lam_b, c_f


def mmc_mean_wait(c: Any, lam: Any, mu: Any) -> Any:
    """Mean queueing delay Wq = C / (c mu - lam); inf when unstable."""
    pw, gap, _, _ = _rates(c, lam, mu)
    with np.errstate(divide="ignore", invalid="ignore"):
        w = np.where(gap > 0, pw / np.where(gap > 0, gap, 1.0), np.inf)
    w = np.where(pw == 0, 0.0, w)
    return _out(w)


def mmc_wait_tail(t: Any, c: Any, lam: Any, mu: Any) -> Any:
    """P(W > t) = C exp(-(c mu - lam) t) for t >= 0 (1 when unstable)."""
    t_a = _nonneg("t", t)
    pw, gap, _, _ = _rates(c, lam, mu)
    tail = np.where(gap > 0, pw * np.exp(-np.maximum(gap, 0.0) * t_a), 1.0)
    return _out(tail)


def mmc_wait_percentile(p: float, c: Any, lam: Any, mu: Any) -> Any:
    """Smallest t with P(W <= t) >= p: max(0, ln(C / (1-p)) / (c mu - lam)); inf if unstable."""
    return mgc_wait_percentile(p, c, lam, 1.0 / np.asarray(mu, dtype=float), cs2=1.0)


def mgc_factor(cs2: Any, ca2: Any = 1.0) -> Any:
    """Allen-Cunneen factor (ca^2 + cs^2) / 2."""
    return _out((_nonneg("ca2", ca2) + _nonneg("cs2", cs2)) / 2.0)


def _mgc(
    c: Any, lam: Any, service: Any, cs2: Any, ca2: Any = 1.0
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    s = np.asarray(service, dtype=float)
    if np.any(~np.isfinite(s)) or np.any(s <= 0):
        raise ValueError("service time must be > 0 and finite")
    pw, gap, _, _ = _rates(c, lam, 1.0 / s)
    f = np.asarray(mgc_factor(cs2, ca2), dtype=float)
    return pw, gap, f


def mgc_mean_wait(c: Any, lam: Any, service: Any, cs2: Any = 1.0, ca2: Any = 1.0) -> Any:
    """Allen-Cunneen mean wait: Erlang-C wait x (ca^2 + cs^2) / 2."""
    pw, gap, f = _mgc(c, lam, service, cs2, ca2)
    with np.errstate(divide="ignore", invalid="ignore"):
        w = np.where(gap > 0, f * pw / np.where(gap > 0, gap, 1.0), np.inf)
    return _out(np.where(pw == 0, 0.0, w))


def mgc_wait_tail(t: Any, c: Any, lam: Any, service: Any, cs2: Any = 1.0, ca2: Any = 1.0) -> Any:
    """P(W > t) ~ C exp(-(c mu - lam) t / f), f = (ca^2 + cs^2) / 2."""
    t_a = _nonneg("t", t)
    pw, gap, f = _mgc(c, lam, service, cs2, ca2)
    with np.errstate(divide="ignore", invalid="ignore"):
        rate = np.where(f > 0, np.maximum(gap, 0.0) / np.where(f > 0, f, 1.0), np.inf)
        tail = np.where(gap > 0, pw * np.exp(-rate * t_a), 1.0)
    tail = np.where((f == 0) & (gap > 0) & (t_a > 0), 0.0, tail)
    return _out(tail)


def mgc_wait_percentile(p: float, c: Any, lam: Any, service: Any, cs2: Any = 1.0, ca2: Any = 1.0) -> Any:
    """p-quantile of the queueing delay under the G/G/c tail approximation (inf if unstable)."""
    q = _percentile(p)
    pw, gap, f = _mgc(c, lam, service, cs2, ca2)
    with np.errstate(divide="ignore", invalid="ignore"):
        t = f * np.log(np.maximum(pw, 1e-300) / (1.0 - q)) / np.where(gap > 0, gap, 1.0)
    t = np.where(pw <= 1.0 - q, 0.0, np.maximum(t, 0.0))
    t = np.where(gap > 0, t, np.inf)
    return _out(t)


def wait_percentile(
    p: float, c: Any, arrival_rps: Any, service_s: Any, cs2: Any = 1.0, ca2: Any = 1.0
) -> Any:
    """Queueing delay (seconds) at percentile p for c servers: G/G/c (Allen-Cunneen) approximation."""
    return mgc_wait_percentile(p, c, arrival_rps, service_s, cs2, ca2)


def summed_wait_tail(s: Any, stages: list[tuple[float, float, float]]) -> Any:
    """P(W_1 + ... + W_n > s) under the sum-of-percentiles model of the stage waits.

    ``stages``: per stage (P(wait), drain rate c mu - lam, Allen-Cunneen factor f),
    whose p-quantile wait is ``(f / gap) ln(P(wait) / (1 - p))`` when P(wait) > 1 - p,
    else 0. The planner sizes with the sum of the stage quantiles at one p; this is
    the inverse: the tail x = 1 - p at which that sum equals s. With the stages
    active at x (P(wait) >= x), ``x = exp((sum a_i ln P_i - s) / sum a_i)``,
    ``a_i = f_i / gap_i``. An unstable stage (gap <= 0) gives 1. Vectorised over s.
    """
    s_a = np.asarray(s, dtype=float)
    act = []
    for pw, gap, f in stages:
        if gap <= 0 and pw > 0:
            return _out(np.ones_like(s_a))
        if pw > 0 and f > 0:
            act.append((float(pw), float(f) / float(gap)))
    if not act:
        return _out(np.zeros_like(s_a))
    act.sort(reverse=True)  # largest P(wait) first: stage j is active while x <= P_j
    x = np.zeros_like(s_a)
    a_sum = b_sum = 0.0
    for j, (pw, a) in enumerate(act):
        a_sum += a
        b_sum += a * math.log(pw)
        xj = np.minimum(np.exp((b_sum - np.maximum(s_a, 0.0)) / a_sum), pw)
        lower = act[j + 1][0] if j + 1 < len(act) else 0.0
        x = np.where((xj >= lower) & (x == 0.0), xj, x)
    return _out(x)


# --------------------------------------------------------------------------- Poisson counts

_POISSON_NORMAL_MEAN = 400.0  # above this mean the normal approximation is within ~1 count


def poisson_cdf(k: int, mean: float) -> float:
    """P(N <= k) for N ~ Poisson(mean) (exact sum below `_POISSON_NORMAL_MEAN`, normal above)."""
    if not (mean >= 0 and math.isfinite(mean)):
        raise ValueError(f"mean must be finite and >= 0, got {mean!r}")
    if k < 0:
        return 0.0
    if mean == 0:
        return 1.0
    if mean > _POISSON_NORMAL_MEAN:
        z = (k + 0.5 - mean) / math.sqrt(mean)
        return 0.5 * math.erfc(-z / math.sqrt(2.0))
    term = math.exp(-mean)
    total = term
    for i in range(1, int(k) + 1):
        term *= mean / i
        total += term
        if total >= 1.0:
            return 1.0
    return min(1.0, total)


def poisson_quantile(p: float, mean: float) -> int:
    """Smallest k with P(N <= k) >= p for N ~ Poisson(mean)."""
    q = _percentile(p)
    if not (mean >= 0 and math.isfinite(mean)):
        raise ValueError(f"mean must be finite and >= 0, got {mean!r}")
    if mean == 0:
        return 0
    if mean > _POISSON_NORMAL_MEAN:
        lo = max(0, int(mean - 10 * math.sqrt(mean)))
        hi = int(mean + 10 * math.sqrt(mean)) + 1
        while lo < hi:
            mid = (lo + hi) // 2
            if poisson_cdf(mid, mean) >= q:
                hi = mid
            else:
                lo = mid + 1
        return lo
    term = math.exp(-mean)
    total = term
    k = 0
    while total < q:
        k += 1
        term *= mean / k
        total += term
        if term == 0.0 and k > mean:  # the remaining mass is below double precision
            break
    return k


def decode_slot_wait(
    p: float,
    replicas: Any,
    slots: int,
    arrival_rps: Any,
    output_tokens: float,
    step_ms: float,
    output_cv: float = 0.0,
) -> tuple[Any, Any]:
    """Wait for a decode slot: c = replicas x slots servers, each held output_tokens x step.

    The hold time's squared CV is the output-length CV squared (step time is
    taken as constant at the planned batch). Returns (mean_s, percentile_s).
    """
    if slots <= 0:
        raise ValueError("slots must be > 0")
    if not (output_tokens > 0 and math.isfinite(output_tokens)):
        raise ValueError("output_tokens must be > 0")
    if not (step_ms > 0 and math.isfinite(step_ms)):
        raise ValueError("step_ms must be > 0")
    c = np.asarray(replicas, dtype=np.int64) * int(slots)
    hold = output_tokens * step_ms / 1000.0
    cs2 = float(output_cv) ** 2
    return (
        mgc_mean_wait(c, arrival_rps, hold, cs2),
        mgc_wait_percentile(p, c, arrival_rps, hold, cs2),
    )


def erlang_b_range(a: float, c_lo: int, c_hi: int) -> list[float]:
    """Erlang B for c = c_lo..c_hi at one load, in one recursion pass (pure Python, fast for scalars).

    Values for c below the truncated start (c < a - 7 sqrt(a) - 5) are the
    overload approximation 1 - c/a; waiting systems never use them (unstable).
    """
    if a < 0 or math.isnan(a) or math.isinf(a):
        raise ValueError("a must be finite and >= 0")
    if c_lo < 0 or c_hi < c_lo:
        raise ValueError("need 0 <= c_lo <= c_hi")
    sq = math.sqrt(a)
    k0 = int(max(0.0, math.floor(a - _START_SIGMAS * sq - 5.0)))
    cutoff = math.ceil(a + _CUTOFF_SIGMAS * sq + 50.0)
    out: list[float] = []
    k = k0
    b = 1.0 if k0 == 0 else 1.0 - k0 / a
    for c in range(c_lo, min(c_hi, k0) + 1):
        out.append(1.0 if c == 0 else max(0.0, 1.0 - c / a) if c < k0 else b)
    stop = min(c_hi, cutoff)
    while k < stop:
        k += 1
        ab = a * b
        b = ab / (k + ab)
        if k >= c_lo:
            out.append(b)
    out.extend([0.0] * (c_hi - c_lo + 1 - len(out)))
    return out


def _b_block(
    a: float, k_start: int, y_start: float, k_end: int, first: int, k: int
) -> tuple[list[float], float]:
    """Erlang B at c = first, first + k, ... <= k_end, and at k_end, from 1/B(k_start) = y_start (vectorised).

    The recursion is linear in y = 1/B: ``y(c) = 1 + (c/a) y(c-1)``. With
    ``L(c) = sum_{k_start < i <= c} ln(a/i)`` it solves to
    ``B(c) = exp(L(c)) / (y_start + sum_{k_start < j <= c} exp(L(j)))``: one
    cumulative sum of logs and one of exponentials. From the truncated start
    (a - 7 sqrt(a)) exp(L) stays below ~e^64, so nothing overflows; far above
    the load it underflows to 0 like B itself. Agrees with the scalar
    recursion to ~1e-13 (relative).
    """
    x = np.arange(k_start + 1, k_end + 1, dtype=float)
    np.divide(a, x, out=x)
    np.log(x, out=x)
    x.cumsum(out=x)
    np.exp(x, out=x)
    den = x.cumsum()
    s = first - k_start - 1
    picked = (x[s::k] / (den[s::k] + y_start)).tolist()
    return picked, float(x[-1] / (den[-1] + y_start))


def erlang_b_stride(a: float, c0: int, k: int = 1, c_hint: int | None = None) -> Iterator[float]:
    """Erlang B at c = c0, c0 + k, c0 + 2k, ... (an endless generator; 0.0 beyond the cutoff).

    Same truncations as `erlang_b_range`. Consumers that stop early (the
    planner stops at the first server count whose percentile wait is 0) pay
    only for the steps they use. Long recursions (large loads) are done as one
    vectorised block up to ``c_hint`` (default ``a + 4 sqrt(a) + k``) by
    `_b_block`; the rest, and short ones, by the scalar recursion.
    """
    if a < 0 or math.isnan(a) or math.isinf(a):
        raise ValueError("a must be finite and >= 0")
    if c0 < 0 or k < 1:
        raise ValueError("need c0 >= 0 and k >= 1")
    sq = math.sqrt(a)
    k0 = int(max(0.0, math.floor(a - _START_SIGMAS * sq - 5.0)))
    cutoff = math.ceil(a + _CUTOFF_SIGMAS * sq + 50.0)
    b = 1.0 if k0 == 0 else 1.0 - k0 / a
    c = c0
    while c <= k0:  # below the start: the overload approximation (as erlang_b_range)
        yield 1.0 if c == 0 else max(0.0, 1.0 - c / a) if c < k0 else b
        c += k
    kk = k0
    end = math.ceil(a + _HINT_SIGMAS * sq) + k if c_hint is None else int(c_hint)
    end = min(cutoff, max(end, c))
    if c <= cutoff and end - kk >= _VECTOR_MIN_STEPS:
        picked, b_end = _b_block(a, kk, 1.0 / b, end, c, k)
        for v in picked:
            yield v
            c += k
        kk, b = end, b_end
    while c <= cutoff:
        if b == 0.0:
            break
        while kk < c:
            kk += 1
            ab = a * b
            b = ab / (kk + ab)
        yield b
        c += k
    while True:
        yield 0.0
