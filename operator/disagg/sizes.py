"""Request-size distributions: size classes of prompt and output tokens, and what they mean for TTFT.

Pure (numpy and the standard library). The planner sized for the mean request:
TTFT at the percentile was the percentile waits plus the *mean* request's own
prefill and transfer. With a wide prompt distribution the requests that miss are
the long ones, whose own prefill and transfer eat the slack the mean request
still has. A `SizeDistribution` lets the planner size for the share of requests
instead:

* the prefill queue's service-time moments (mean, squared CV) are those of the
  mixture of classes (`prefill_moments`), and the decode slot hold's are those
  of the output classes (`output_moments`);
* each prompt class has its own bare latency (prefill + transfer) and so its own
  slack; `ttft_covers` turns the classes into candidate (slack, wait percentile)
  pairs, and the planner keeps the cheapest candidate (see below).

Covers. Sort the prompt classes by slack (their TTFT target minus their bare
latency), most first, and let ``F_k`` be the share of requests in classes 1..k.
If the pools keep the wait below ``target_k - bare_k``
with probability ``q``, every request of classes 1..k whose wait is below that
meets TTFT, so at least ``F_k q`` of all requests meet it. Choosing
``q = p / F_k`` (needs ``F_k > p``) makes that at least ``p``. Each k with
``F_k > p`` is one candidate: cover the short classes up to k at a higher wait
percentile, or all of them at the SLO percentile with the longest class's
(smallest) slack. Every candidate guarantees the target share under the
planner's wait model (it gives up on the uncovered classes entirely), so the
cheapest candidate does too. With one class the only candidate is ``F = 1``,
``q = p``: the mean-request planner.

Requests whose bare latency alone exceeds the TTFT target miss even on an idle
system. They are counted apart (as `disagg evaluate` does): the shares above are
over the requests that can meet the target, and `Covers.idle_miss_fraction`
reports the rest.

Inputs: engine histograms (`from_buckets`, e.g. vLLM ``vllm:request_prompt_tokens_bucket`` /
``vllm:request_generation_tokens_bucket``, SGLang ``sglang:prompt_tokens_histogram_bucket`` /
``sglang:generation_tokens_histogram_bucket``), a window's requests (`from_samples`),
or a mean and standard deviation (`from_mean_std`, a log-normal).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from statistics import NormalDist
from typing import Any, NamedTuple

import numpy as np

from disagg.model import GIB, StageModels

__all__ = [
    "MIN_SIZE_SAMPLES",
    "Covers",
    "SizeDistribution",
    "demand_with_sizes",
    "miss_fraction",
    "output_moments",
    "prefill_moments",
    "ttft_covers",
]

SUBCLASSES_PER_BUCKET = 4  # a histogram bucket becomes this many equal-width classes (uniform within)
# Quantile edges of the classes built from samples or a parametric law: fine in the tail,
# where the classes that set a high percentile live, coarse in the body.
CLASS_EDGES = (0.0, 0.25, 0.5, 0.7, 0.8, 0.85, 0.9, 0.93, 0.95, 0.97, 0.98, 0.99, 0.995, 0.999, 1.0)
MAX_COVERS = 8  # candidate covers the planner tries (the F = 1 cover is always one of them)
# Relaxed candidates: size for the slice at these shares of the feasible requests at the SLO
# percentile itself, kept only when the exact mixture (`miss_fraction`) meets the target.
# Off by default: they trust the wait model's far tail, and on the held-out Mooncake traces
# that cost 0.2-5.9 points of attainment (docs/planner.md); (0.5, 0.75, 0.9, 0.95, 0.99,
# 0.999) turns them on.
RELAXED_SHARES: tuple[float, ...] = ()
# Covers that would need the waits below this far into their tail are not tried: they
# only win when nearly every request is covered anyway, and their tables are long.
MAX_WAIT_PERCENTILE = 0.999
#: Requests a size distribution is built from at the least (`disagg evaluate`'s windows, `disagg
#: plan --trace`): with fewer, the tail classes hold a request or two each.
MIN_SIZE_SAMPLES = 20
_LOGNORMAL_POINTS = 2000  # quantile points that discretise a log-normal
# position of each slice's upper edge in its class: j / n for j = 1..n (the last exactly 1)
_SLICE_FRACTIONS = np.arange(1, SUBCLASSES_PER_BUCKET + 1) / SUBCLASSES_PER_BUCKET
_LAST_SLICE = _SLICE_FRACTIONS == 1.0  # the slice every class keeps, with or without spread


class _Classes(NamedTuple):
    tokens: tuple[float, ...]  # mean tokens of each class
    var: tuple[float, ...]  # variance of tokens within each class
    weight: tuple[float, ...]  # share of requests (sums to 1)


def _classes(name: str, tokens: Sequence[float], var: Sequence[float], weight: Sequence[float]) -> _Classes:
    t = [float(x) for x in tokens]
    v = [float(x) for x in var]
    w = [float(x) for x in weight]
    if not t:
        raise ValueError(f"{name}: at least one size class is needed")
    if not (len(t) == len(v) == len(w)):
        raise ValueError(f"{name}: tokens, var and weight have different lengths")
    for what, xs in (("tokens", t), ("var", v), ("weight", w)):
        if any(not math.isfinite(x) or x < 0 for x in xs):
            raise ValueError(f"{name}: {what} must be finite and >= 0")
    total = sum(w)
    if total <= 0:
        raise ValueError(f"{name}: weights sum to 0 (no observations)")
    keep = [i for i in range(len(t)) if w[i] > 0]
    return _Classes(tuple(t[i] for i in keep), tuple(v[i] for i in keep), tuple(w[i] / total for i in keep))


def _moments(c: _Classes) -> tuple[float, float]:
    w = np.asarray(c.weight)
    t = np.asarray(c.tokens)
    mean = float(w @ t)
    second = float(w @ (t * t + np.asarray(c.var)))
    return mean, math.sqrt(max(second - mean * mean, 0.0))


def _frozen_arrays(*columns: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The columns as read-only float arrays (cached on a frozen distribution, so never written)."""
    out = tuple(np.asarray(x, dtype=float) for x in columns)
    for a in out:
        a.flags.writeable = False
    return out  # type: ignore[return-value]


@dataclass(frozen=True)
class SizeDistribution:
    """Size classes of prompt and output tokens (independent marginals), hashable.

    ``prompt_*``/``output_*``: per class the mean tokens, the variance within the
    class and its weight (normalised to sum to 1; zero-weight classes dropped).
    """

    prompt_tokens: tuple[float, ...]
    prompt_var: tuple[float, ...]
    prompt_weight: tuple[float, ...]
    output_tokens: tuple[float, ...]
    output_var: tuple[float, ...]
    output_weight: tuple[float, ...]

    def __post_init__(self) -> None:
        p = _classes("prompt", self.prompt_tokens, self.prompt_var, self.prompt_weight)
        o = _classes("output", self.output_tokens, self.output_var, self.output_weight)
        if _moments(o)[0] <= 0:
            raise ValueError("output: mean output tokens must be > 0")
        for name, vals in zip(("prompt", "output"), (p, o), strict=True):
            for suffix, v in zip(("tokens", "var", "weight"), vals, strict=True):
                object.__setattr__(self, f"{name}_{suffix}", v)
        object.__setattr__(self, "_hash", hash((*p, *o)))  # planner caches key on it: hash once

    def __hash__(self) -> int:
        return self._hash  # type: ignore[attr-defined]

    @classmethod
    def _of(cls, p: _Classes, o: _Classes) -> SizeDistribution:
        return cls(p.tokens, p.var, p.weight, o.tokens, o.var, o.weight)

    # ------------------------------------------------------------------ constructors

    @classmethod
    def from_buckets(
        cls,
        prompt_buckets: Sequence[tuple[float, float]],
        output_buckets: Sequence[tuple[float, float]],
        *,
        prompt_sum: float | None = None,
        output_sum: float | None = None,
    ) -> SizeDistribution:
        """From cumulative histogram buckets ``[(le, count_or_rate), ...]`` (Prometheus ``_bucket``).

        Each finite bucket is split into `SUBCLASSES_PER_BUCKET` equal-width classes
        (tokens uniform within a bucket). The ``+Inf`` bucket has no upper edge: its
        mean comes from the histogram's ``_sum`` when given (what is left after the
        finite buckets' midpoints), else twice its lower edge.
        """
        return cls._of(
            _from_buckets("prompt", prompt_buckets, prompt_sum),
            _from_buckets("output", output_buckets, output_sum),
        )

    @classmethod
    def from_samples(
        cls, prompt_tokens: Sequence[float] | np.ndarray, output_tokens: Sequence[float] | np.ndarray
    ) -> SizeDistribution:
        """From a window's requests: classes between the quantiles `CLASS_EDGES` (empirical)."""
        return cls._of(_from_samples("prompt", prompt_tokens), _from_samples("output", output_tokens))

    @classmethod
    def from_mean_std(
        cls, prompt_mean: float, prompt_std: float, output_mean: float, output_std: float
    ) -> SizeDistribution:
        """A log-normal with these moments per marginal (one class when the std is 0)."""
        return cls._of(
            _lognormal("prompt", prompt_mean, prompt_std), _lognormal("output", output_mean, output_std)
        )

    # ------------------------------------------------------------------ summaries

    # Derived once per distribution (cached in the instance dict; the fields are frozen): the
    # planner reads the moments `demand_with_sizes` computed, not its own copy.

    @cached_property
    def prompt_mean_second(self) -> tuple[float, float]:
        """(mean, mean square) of the prompt tokens over the classes (within-class variance included)."""
        t, _, w = self.prompt_arrays
        return float(w @ t), float(w @ self.prompt_class_squares)

    @cached_property
    def prompt_class_squares(self) -> np.ndarray:
        """Per prompt class, tokens^2 + var: its mean square (read-only; `prefill_moments` reads it too)."""
        t, v, _ = self.prompt_arrays
        squares = t * t + v
        squares.flags.writeable = False
        return squares

    @cached_property
    def output_mean_second(self) -> tuple[float, float]:
        """(mean, mean square) of the output tokens over the classes (within-class variance included)."""
        t, v, w = self.output_arrays
        return float(w @ t), float(w @ (t * t + v))

    @cached_property
    def prompt_mean_std(self) -> tuple[float, float]:
        mean, second = self.prompt_mean_second
        return mean, math.sqrt(max(second - mean * mean, 0.0))

    @cached_property
    def output_mean_std(self) -> tuple[float, float]:
        mean, second = self.output_mean_second
        return mean, math.sqrt(max(second - mean * mean, 0.0))

    @cached_property
    def prompt_slices(self) -> tuple[np.ndarray, np.ndarray]:
        """(upper edge, weight) of `SUBCLASSES_PER_BUCKET` equal slices of every spread class.

        A class of mean t and variance v is taken as uniform on t -/+ sqrt(3 v)
        (clipped at 0) and cut into equal slices. The covers judge each slice by
        its upper edge, so every request of a covered slice has at least the
        cover's slack, and a class that straddles the idle-feasibility limit is
        split at it to a slice's resolution, not dropped or kept whole.
        """
        t, v, w = self.prompt_arrays
        half = np.sqrt(3.0 * v)
        lo = np.maximum(t - half, 0.0)
        # every class cut in SUBCLASSES_PER_BUCKET at once (a row each); a class without
        # spread keeps only its last slice (its upper edge lo + (hi - lo) x 1 is its mean)
        # and all its weight
        edges = lo[:, None] + (t + half - lo)[:, None] * _SLICE_FRACTIONS
        spread = v > 0
        count = np.where(spread, SUBCLASSES_PER_BUCKET, 1)  # slices kept per class
        edges = edges[spread[:, None] | _LAST_SLICE]
        weights = (w / count).repeat(count)
        for a in (edges, weights):
            a.flags.writeable = False
        return edges, weights

    @cached_property
    def prompt_arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(tokens, var, weight) of the prompt classes as numpy arrays (read-only)."""
        return _frozen_arrays(self.prompt_tokens, self.prompt_var, self.prompt_weight)

    @cached_property
    def output_arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(tokens, var, weight) of the output classes as numpy arrays (read-only)."""
        return _frozen_arrays(self.output_tokens, self.output_var, self.output_weight)

    def to_dict(self) -> dict[str, Any]:
        return {
            "prompt": [
                {"tokens": t, "var": v, "weight": w}
                for t, v, w in zip(self.prompt_tokens, self.prompt_var, self.prompt_weight, strict=True)
            ],
            "output": [
                {"tokens": t, "var": v, "weight": w}
                for t, v, w in zip(self.output_tokens, self.output_var, self.output_weight, strict=True)
            ],
        }


def _from_buckets(name: str, buckets: Sequence[tuple[float, float]], total_sum: float | None) -> _Classes:
    pts: list[tuple[float, float]] = []
    for le, cum in buckets:
        le_f, cum_f = float(le), float(cum)
        if math.isnan(le_f) or not math.isfinite(cum_f) or cum_f < 0:
            raise ValueError(f"{name}: bad bucket ({le!r}, {cum!r})")
        pts.append((le_f, cum_f))
    if not pts:
        raise ValueError(f"{name}: no buckets")
    pts.sort()
    if pts[-1][1] <= 0:
        raise ValueError(f"{name}: no observations in the buckets")
    tokens: list[float] = []
    var: list[float] = []
    weight: list[float] = []
    lo, prev = 0.0, 0.0
    inf_count = 0.0
    finite_sum = 0.0
    for bound, cum in pts:
        n = cum - prev
        if n < -1e-9 * max(1.0, cum):
            raise ValueError(f"{name}: buckets are not cumulative (le={bound})")
        n = max(n, 0.0)
        if not math.isfinite(bound):
            inf_count, prev = n, cum
            break
        if n > 0:
            width = (bound - lo) / SUBCLASSES_PER_BUCKET
            for i in range(SUBCLASSES_PER_BUCKET):
                tokens.append(lo + (i + 0.5) * width)
                var.append(width * width / 12.0)
                weight.append(n / SUBCLASSES_PER_BUCKET)
            finite_sum += n * (lo + bound) / 2.0
        prev, lo = cum, max(lo, bound)
    if inf_count > 0:
        guess = 2.0 * lo if lo > 0 else 1.0
        if total_sum is not None and math.isfinite(total_sum) and total_sum > finite_sum:
            guess = max(lo, (total_sum - finite_sum) / inf_count)
        tokens.append(guess)
        var.append(0.0)
        weight.append(inf_count)
    return _classes(name, tokens, var, weight)


def _from_samples(name: str, xs: Sequence[float] | np.ndarray) -> _Classes:
    a = np.sort(np.asarray(xs, dtype=float).ravel())
    if a.size == 0:
        raise ValueError(f"{name}: no samples")
    if not np.all(np.isfinite(a)) or a[0] < 0:
        raise ValueError(f"{name}: samples must be finite and >= 0")
    n = a.size
    cuts = sorted({round(q * n) for q in CLASS_EDGES})
    tokens: list[float] = []
    var: list[float] = []
    weight: list[float] = []
    for lo, hi in itertools.pairwise(cuts):
        if hi <= lo:
            continue
        seg = a[lo:hi]
        tokens.append(float(seg.mean()))
        var.append(float(seg.var()))
        weight.append((hi - lo) / n)
    return _classes(name, tokens, var, weight)


def _lognormal(name: str, mean: float, std: float) -> _Classes:
    if not (math.isfinite(mean) and math.isfinite(std)) or mean < 0 or std < 0:
        raise ValueError(f"{name}: mean and std must be finite and >= 0, got {mean!r}, {std!r}")
    if std == 0 or mean == 0:
        return _classes(name, [mean], [0.0], [1.0])
    s2 = math.log1p((std / mean) ** 2)
    mu = math.log(mean) - s2 / 2
    nd = NormalDist(mu, math.sqrt(s2))
    qs = (np.arange(_LOGNORMAL_POINTS) + 0.5) / _LOGNORMAL_POINTS
    pts = np.exp([nd.inv_cdf(float(q)) for q in qs])
    pts *= mean / pts.mean()  # the discretisation keeps the mean exact
    return _from_samples(name, pts)


# --------------------------------------------------------------------------- what the planner needs


def prefill_moments(d: SizeDistribution, m: StageModels, prefix_hit_rate: float = 0.0) -> tuple[float, float]:
    """(mean prefill service in ms, its squared CV) over the prompt classes.

    Within a class the service is linearised around the class mean (as the
    mean-only planner does for the whole distribution); across classes the
    mixture's moments are exact.
    """
    pf = m.prefill
    h = prefix_hit_rate
    t, v, w = d.prompt_arrays
    s = (
        pf.fixed_ms
        + pf.ms_per_token * (1 - h) * t
        + pf.ms_per_token_sq * (1 - h * h) * d.prompt_class_squares
    )
    slope = pf.ms_per_token * (1 - h) + 2 * pf.ms_per_token_sq * (1 - h * h) * t
    mean = float(w @ s)
    second = float(w @ (s * s + slope * slope * v))
    cs2 = max(second / (mean * mean) - 1.0, 0.0) if mean > 0 else 0.0
    return mean, cs2


def output_moments(d: SizeDistribution) -> tuple[float, float]:
    """(mean output tokens, squared CV of the output length): the decode slot hold's moments."""
    mean, std = d.output_mean_std
    return mean, (std / mean) ** 2


def bare_ms(
    d: SizeDistribution,
    m: StageModels,
    chunked: bool,
    prefix_hit_rate: float = 0.0,
    *,
    tokens: np.ndarray | None = None,
) -> np.ndarray:
    """Per prompt class (or at ``tokens``): own prefill + transfer (ms), the part of TTFT that is not waiting."""
    t = d.prompt_arrays[0] if tokens is None else tokens
    h = prefix_hit_rate
    p, tr = m.prefill, m.transfer
    # PrefillModel.service_ms and TransferModel.serial_ms, without their per-call validation
    if h:
        cached = h * t
        pf = p.fixed_ms + p.ms_per_token * (t - cached) + p.ms_per_token_sq * (t * t - cached * cached)
    else:  # nothing cached: the same values (t - 0 is t), four array operations fewer
        pf = p.fixed_ms + p.ms_per_token * t + p.ms_per_token_sq * (t * t)
    if chunked and tr.chunk_tokens > 0:
        transfer = np.asarray([m.transfer_ms(x, chunked=True, cached_tokens=h * x) for x in t.tolist()])
    else:
        transfer = tr.setup_ms + 1000.0 * (tr.kv_bytes_per_token * t) / (tr.bandwidth_gibps * GIB)
    transfer[t <= 0] = 0.0  # an empty prompt sends no KV
    return pf + transfer


class Covers(NamedTuple):
    """Candidate (binding class, wait percentile) pairs; see the module docstring."""

    fixed_s: tuple[float, ...]  # bare TTFT of the binding (least-slack) covered class
    target_s: tuple[float, ...]  # that class's own TTFT target
    wait_percentile: tuple[float, ...]  # percentile the summed waits must meet
    covered: tuple[float, ...]  # F_k: share of the feasible requests covered
    idle_miss_fraction: float  # share of all requests that miss even on an idle system
    floor_s: float  # bare TTFT of the class with the most slack (its slack is the best any has)
    # every feasible slice, most slack first: bare TTFT, target, share (of the feasible), cumulative
    slices: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None = None


def ttft_covers(
    d: SizeDistribution,
    m: StageModels,
    target_s: float,
    percentile: float,
    *,
    chunked: bool = False,
    prefix_hit_rate: float = 0.0,
    extra_s: float = 0.0,
    target_s_per_1k_tokens: float = 0.0,
    max_covers: int = MAX_COVERS,
) -> Covers:
    """The cover candidates for a TTFT target at a percentile (module docstring).

    ``extra_s`` is the part of the bare TTFT every class shares (encoder service,
    one decode step). Each class is judged by slices at their upper edges
    (`SizeDistribution.prompt_slices`). A slice of t prompt tokens has the target
    ``target_s + target_s_per_1k_tokens x t / 1000`` (an SLO that grows with the
    prompt); classes are ordered by slack, target minus bare TTFT. Always includes
    the full cover (F = 1) when any class can meet its target on an idle system;
    empty when none can.
    """
    if not 0 < percentile < 1:
        raise ValueError(f"percentile must be in (0, 1), got {percentile!r}")
    if not (math.isfinite(target_s_per_1k_tokens) and target_s_per_1k_tokens >= 0):
        raise ValueError(f"target_s_per_1k_tokens must be >= 0, got {target_s_per_1k_tokens!r}")
    t, w = d.prompt_slices
    fixed = bare_ms(d, m, chunked, prefix_hit_rate, tokens=t) / 1000.0 + extra_s
    target = (
        target_s + target_s_per_1k_tokens * t / 1000.0
        if target_s_per_1k_tokens
        else np.full(t.size, target_s)
    )
    # each slice's slack, negated exactly (target - fixed is -(fixed - target) in floating
    # point too): most slack first is this key ascending, by a stable sort
    key = fixed - target
    if not (key[1:] >= key[:-1]).all():  # in order already (slices come by tokens): the sort keeps it
        order = np.argsort(key, kind="stable")
        fixed, target, w, key = fixed[order], target[order], w[order], key[order]
    # feasible on an idle system (slack >= -1e-12, i.e. key <= 1e-12): a prefix of the order
    n_ok = int(key.searchsorted(1e-12, side="right"))
    feasible = float(w[:n_ok].sum())
    idle_miss = 1.0 - feasible if feasible < 1.0 - 1e-12 else 0.0  # weights sum to 1 up to rounding
    if feasible <= 0:
        return Covers((), (), (), (), idle_miss, float(fixed[0]), None)
    f_ok, t_ok, w_ok = fixed[:n_ok], target[:n_ok], w[:n_ok] / feasible
    cum = w_ok.cumsum()
    cum[-1] = 1.0
    # a candidate needs F_k > p (within MAX_WAIT_PERCENTILE); slices of equal slack merge, so
    # k is a candidate only where the slack falls after it; the full cover (the last) always is
    last = n_ok - 1
    candidate = (percentile / cum[:last] <= MAX_WAIT_PERCENTILE) & (key[1:n_ok] > key[:last])
    idx = [*candidate.nonzero()[0].tolist(), last]
    if len(idx) > max_covers:
        idx = [idx[j] for j in _evenly_spaced(len(idx), max_covers)]
    at = np.array(idx)
    covered = cum[at].tolist()
    return Covers(
        fixed_s=tuple(f_ok[at].tolist()),
        target_s=tuple(t_ok[at].tolist()),
        wait_percentile=tuple([min(percentile / c, 1.0) for c in covered]),
        covered=tuple(covered),
        idle_miss_fraction=idle_miss,
        floor_s=float(fixed[0]),
        slices=(f_ok, t_ok, w_ok, cum),
    )


def _evenly_spaced(n: int, m: int) -> list[int]:
    """Sorted distinct round(linspace(0, n - 1, m)): m of the indexes 0..n-1, evenly spread.

    The same floats as numpy.linspace (i x step, the last exactly n - 1) and the
    same rounding (half to even), without numpy's per-call cost.
    """
    if m <= 1:
        return [0] if m == 1 else []
    step = (n - 1) / (m - 1)
    return sorted({round(i * step) for i in range(m - 1)} | {n - 1})


def miss_fraction(cov: Covers, tail: Any) -> float:
    """Share of the feasible requests missing TTFT: sum over slices of weight x P(wait > slack).

    ``tail(s)``: P(summed waits > s), vectorised (`disagg.queueing.summed_wait_tail`).
    The exact mixture under the planner's wait model, where a cover is a bound.
    """
    if cov.slices is None:
        return 1.0
    fixed, target, w, _ = cov.slices
    return float(w @ np.asarray(tail(target - fixed), dtype=float))


def demand_with_sizes(arrival_rps: float, sizes: SizeDistribution, **kw: Any) -> Any:
    """A planner `Demand` whose mean/std fields come from `sizes` and which carries it."""
    from disagg.planner import Demand  # the planner imports this module

    pm, ps = sizes.prompt_mean_std
    om, os_ = sizes.output_mean_std
    return Demand(
        arrival_rps=arrival_rps,
        prompt_tokens_mean=pm,
        prompt_tokens_std=ps,
        output_tokens_mean=om,
        output_tokens_std=os_,
        sizes=sizes,
        **kw,
    )
