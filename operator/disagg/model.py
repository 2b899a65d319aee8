"""Stage service-time models: encoder, prefill, KV transfer and decode.

Pure (numpy only). Every model is a frozen dataclass whose defaults are the
worked example of the stage-disaggregation chapter (`disagg.worked_example`):

* prefill_ms = 20 + 0.035 x tokens            (6,000 tokens -> 230 ms)
* KV state = 320 KiB per token                  (6,000 tokens -> 1.83 GiB)
* transfer_ms = 12 + bytes / 22 GiB/s           (6,000 tokens -> ~95.23 ms)
* decode step = 45 ms, 32 slots                 (400 tokens -> ~1.778 req/s)
* decode KV cache = 237,984 tokens per worker   (a second bound on the batch)

Units: times in milliseconds unless a name says ``_s``; bandwidth in GiB/s
(GiB = 2**30 bytes); rates in requests per second.

The fitting helpers (`fit_linear`, `fit_prefill`, `fit_decode`) are robust
(Huber IRLS) least squares with an optional prior, for online calibration
from measured (tokens, ms) and (batch, step ms) samples.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from disagg import worked_example as we

GIB = float(2**30)
MIB = float(2**20)
KIB = 1024.0

__all__ = [
    "DEFAULT_ITL_STATISTIC",
    "GIB",
    "ITL_STATISTICS",
    "KIB",
    "MIB",
    "DecodeModel",
    "EncoderModel",
    "FitResult",
    "PrefillModel",
    "StageModels",
    "TransferModel",
    "check_itl_statistic",
    "fit_decode",
    "fit_linear",
    "fit_prefill",
    "gap_p99_rank",
    "kv_batch",
]


# How one request's inter-token gaps are reduced to the number its ITL target is checked
# against: the mean gap, the 99th percentile gap (nearest rank) or the largest gap.
# "max" by default: one gap above the target is a visible stall (docs/simulator.md).
ITL_STATISTICS = ("max", "p99", "mean")
DEFAULT_ITL_STATISTIC = "max"


def check_itl_statistic(value: Any) -> str:
    """`value` if it names an ITL statistic; a ValueError naming the choices otherwise."""
    if value not in ITL_STATISTICS:
        raise ValueError(f"ITL statistic must be one of {', '.join(ITL_STATISTICS)}, got {value!r}")
    return str(value)


def gap_p99_rank(gaps: int) -> int:
    """1-based nearest rank of the 99th percentile among `gaps` sorted gaps: ceil(0.99 x gaps)."""
    return (99 * gaps + 99) // 100


# --------------------------------------------------------------------------- validation


def _check(name: str, value: Any, *, positive: bool = False, integer: bool = False) -> None:
    """Raise ValueError naming `name` unless value is a finite number >= 0 (> 0 if positive)."""
    if isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating):
        raise ValueError(f"{name} must be a number, got {value!r}")
    v = float(value)
    if math.isnan(v) or math.isinf(v):
        raise ValueError(f"{name} must be finite, got {value!r}")
    if integer and v != int(v):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if positive and v <= 0:
        raise ValueError(f"{name} must be > 0, got {value!r}")
    if v < 0:
        raise ValueError(f"{name} must be >= 0, got {value!r}")


def _arr(name: str, x: Any) -> Any:
    if type(x) is float or type(x) is int:  # scalar fast path (planner hot loop)
        if not math.isfinite(x):
            raise ValueError(f"{name} must be finite")
        if x < 0:
            raise ValueError(f"{name} must be >= 0")
        return float(x)
    a = np.asarray(x, dtype=float)
    if not np.all(np.isfinite(a)):
        raise ValueError(f"{name} must be finite")
    if np.any(a < 0):
        raise ValueError(f"{name} must be >= 0")
    return a


def _out(a: np.ndarray) -> Any:
    """Return a Python float for 0-d results, the array otherwise."""
    return float(a) if np.ndim(a) == 0 else a


# --------------------------------------------------------------------------- encoder


@dataclass(frozen=True)
class EncoderModel:
    """Multimodal encoder: ``fixed_ms + ms_per_item x items`` per request with media."""

    fixed_ms: float = we.ENCODER_FIXED_MS
    ms_per_item: float = we.ENCODER_MS_PER_ITEM

    def __post_init__(self) -> None:
        _check("encoder.fixed_ms", self.fixed_ms)
        _check("encoder.ms_per_item", self.ms_per_item)

    def service_ms(self, items: Any = 1.0) -> Any:
        n = _arr("items", items)
        return _out(self.fixed_ms + self.ms_per_item * n)


# --------------------------------------------------------------------------- prefill


@dataclass(frozen=True)
class PrefillModel:
    """Prefill: ``fixed + a x new_tokens + b x (tokens^2 - cached^2)``.

    Cached (prefix-hit) tokens skip their compute: the linear term counts only
    new tokens and the quadratic (attention) term counts the new tokens'
    attention over the whole context, ``tokens^2 - cached^2``.
    ``chunk_tokens`` is the chunked-prefill chunk size (0 = whole prompt at once);
    it is the default chunk for `chunk_ready_ms`.
    """

    fixed_ms: float = we.PREFILL_FIXED_MS
    ms_per_token: float = we.PREFILL_MS_PER_TOKEN
    ms_per_token_sq: float = 0.0
    chunk_tokens: int = 0

    def __post_init__(self) -> None:
        _check("prefill.fixed_ms", self.fixed_ms)
        _check("prefill.ms_per_token", self.ms_per_token)
        _check("prefill.ms_per_token_sq", self.ms_per_token_sq)
        _check("prefill.chunk_tokens", self.chunk_tokens, integer=True)

    def service_ms(self, tokens: Any, cached_tokens: Any = 0) -> Any:
        t = _arr("tokens", tokens)
        c = np.minimum(_arr("cached_tokens", cached_tokens), t)
        new = t - c
        ms = self.fixed_ms + self.ms_per_token * new + self.ms_per_token_sq * (t * t - c * c)
        return _out(ms)

    def chunk_ready_ms(self, tokens: float, chunk_tokens: int | None = None) -> np.ndarray:
        """Completion time (ms from prefill start) of each chunk of a prompt.

        The fixed cost is paid once, before the first chunk; each chunk then
        adds its tokens' linear and attention cost.
        """
        _check("tokens", tokens)
        ct = self.chunk_tokens if chunk_tokens is None else chunk_tokens
        _check("chunk_tokens", ct, integer=True)
        t = float(tokens)
        if ct <= 0 or t <= ct:
            return np.array([self.service_ms(t)])
        ends = np.arange(ct, t, ct, dtype=float)
        ends = np.append(ends, t)
        return self.fixed_ms + self.ms_per_token * ends + self.ms_per_token_sq * ends * ends

    def capacity_rps(self, tokens: float, cached_tokens: float = 0.0) -> float:
        """Requests per second one worker completes at this prompt length."""
        return 1000.0 / float(self.service_ms(tokens, cached_tokens))


# --------------------------------------------------------------------------- transfer


@dataclass(frozen=True)
class TransferModel:
    """KV transfer: each send pays ``setup_ms`` then ``bytes / bandwidth``."""

    kv_bytes_per_token: float = float(we.KV_BYTES_PER_TOKEN)
    setup_ms: float = we.LINK_SETUP_MS
    bandwidth_gibps: float = we.LINK_GIBPS
    chunk_tokens: int = we.CHUNK_TOKENS

    def __post_init__(self) -> None:
        _check("transfer.kv_bytes_per_token", self.kv_bytes_per_token)
        _check("transfer.setup_ms", self.setup_ms)
        _check("transfer.bandwidth_gibps", self.bandwidth_gibps, positive=True)
        _check("transfer.chunk_tokens", self.chunk_tokens, integer=True)

    def kv_bytes(self, tokens: Any) -> Any:
        return _out(self.kv_bytes_per_token * _arr("tokens", tokens))

    def wire_ms(self, tokens: Any) -> Any:
        """Link time of the payload alone (no setup)."""
        b = self.kv_bytes_per_token * _arr("tokens", tokens)
        return _out(1000.0 * b / (self.bandwidth_gibps * GIB))

    def serial_ms(self, tokens: Any) -> Any:
        """One send after prefill finishes: setup + bytes / bandwidth."""
        return _out(self.setup_ms + np.asarray(self.wire_ms(tokens)))

    def chunked_end_ms(self, prefill: PrefillModel, tokens: float, chunk_tokens: int | None = None) -> float:
        """Time (ms from prefill start) the last chunk lands.

        Chunk k is sent as soon as prefill chunk k completes; each send pays
        the setup; the link serialises sends (a chunk waits for the previous
        one to finish). With ``chunk_tokens == 0`` this is prefill + serial.
        """
        ct = self.chunk_tokens if chunk_tokens is None else chunk_tokens
        _check("chunk_tokens", ct, integer=True)
        _check("tokens", tokens)
        t = float(tokens)
        if ct <= 0:
            return float(prefill.service_ms(t)) + float(self.serial_ms(t))
        ready = prefill.chunk_ready_ms(t, ct)
        sizes = np.diff(np.concatenate(([0.0], np.minimum(np.arange(1, len(ready) + 1) * ct, t))))
        link_free = 0.0
        for r, n in zip(ready, sizes, strict=True):
            link_free = max(link_free, float(r)) + float(self.serial_ms(n))
        return link_free

    def chunked_end_ms_array(
        self, prefill: PrefillModel, tokens: Any, chunk_tokens: int | None = None
    ) -> Any:
        t = _arr("tokens", tokens)
        flat = [self.chunked_end_ms(prefill, float(x), chunk_tokens) for x in t.ravel()]
        return _out(np.asarray(flat).reshape(t.shape))


# --------------------------------------------------------------------------- decode


@dataclass(frozen=True)
class DecodeModel:
    """Decode: one step emits a token for every sequence in the batch.

    ``step_ms(batch) = step_fixed_ms + step_ms_per_seq x batch``; a sequence
    holds its slot for ``output_tokens`` steps.

    ``kv_cache_tokens`` is the worker's KV-cache capacity in tokens. A sequence
    reserves its whole footprint (prompt + output tokens) when it joins the
    batch and frees it when it leaves (a conservative scheduler: no preemption),
    so a long-context mix can fill the cache before the slots (`kv_slots`).
    """

    step_fixed_ms: float = we.DECODE_STEP_MS
    step_ms_per_seq: float = 0.0
    slots: int = we.DECODE_SLOTS
    kv_cache_tokens: int = we.DECODE_KV_CACHE_TOKENS

    def __post_init__(self) -> None:
        _check("decode.step_fixed_ms", self.step_fixed_ms, positive=True)
        _check("decode.step_ms_per_seq", self.step_ms_per_seq)
        _check("decode.slots", self.slots, positive=True, integer=True)
        _check("decode.kv_cache_tokens", self.kv_cache_tokens, positive=True, integer=True)

    def kv_slots(self, footprint_mean: float, footprint_std: float = 0.0, z: float = 0.0) -> int:
        """Sequences whose KV fits one worker: the largest n with n x mean + z x sqrt(n) x std <= capacity.

        `footprint_mean`/`footprint_std`: tokens one resident sequence holds
        (prompt + output); `z` > 0 keeps n sequences drawn from that spread
        inside the cache with the matching normal probability. At least 1 (a
        sequence larger than the cache still runs alone on an empty worker),
        at most `slots`.
        """
        _check("footprint_mean", footprint_mean)
        _check("footprint_std", footprint_std)
        return kv_batch(self.kv_cache_tokens, self.slots, float(footprint_mean), float(footprint_std), z)

    def step_ms(self, batch: Any = None) -> Any:
        b = self.slots if batch is None else batch
        return _out(self.step_fixed_ms + self.step_ms_per_seq * _arr("batch", b))

    def slot_hold_s(self, output_tokens: Any, batch: Any = None) -> Any:
        o = _arr("output_tokens", output_tokens)
        return _out(o * np.asarray(self.step_ms(batch)) / 1000.0)

    def max_batch_for_itl(self, itl_ms: float) -> int:
        """Largest batch (<= slots) whose step fits `itl_ms`; 0 if none does."""
        if self.step_ms_per_seq <= 0:
            return self.slots if self.step_fixed_ms <= itl_ms else 0
        b = math.floor((itl_ms - self.step_fixed_ms) / self.step_ms_per_seq + 1e-9)
        return int(max(0, min(self.slots, b)))

    def capacity_rps(self, output_tokens: Any, batch: Any = None) -> Any:
        """Requests per second one replica retires with `batch` (default: all) slots busy."""
        b = self.slots if batch is None else batch
        o = _arr("output_tokens", output_tokens)
        hold = np.asarray(self.slot_hold_s(np.maximum(o, 1e-12), b))
        return _out(np.asarray(b, dtype=float) / hold)


def kv_batch(capacity: float, slots: int, mean: float, std: float, z: float) -> int:
    """`DecodeModel.kv_slots` on checked floats (the planner's hot path calls it directly)."""
    if mean <= 0:
        return slots
    # n mean + z sqrt(n) std <= capacity: a quadratic in sqrt(n)
    spread = z * std if z > 0 else 0.0
    root = (-spread + math.sqrt(spread * spread + 4.0 * mean * capacity)) / (2.0 * mean)
    n = math.floor(root * root + 1e-9)
    while n > 0 and n * mean + spread * math.sqrt(n) > capacity + 1e-9:
        n -= 1
    return max(1, min(slots, n))


# --------------------------------------------------------------------------- bundle


@dataclass(frozen=True)
class StageModels:
    encoder: EncoderModel = field(default_factory=EncoderModel)
    prefill: PrefillModel = field(default_factory=PrefillModel)
    transfer: TransferModel = field(default_factory=TransferModel)
    decode: DecodeModel = field(default_factory=DecodeModel)

    def __post_init__(self) -> None:
        for name, typ in (
            ("encoder", EncoderModel),
            ("prefill", PrefillModel),
            ("transfer", TransferModel),
            ("decode", DecodeModel),
        ):
            if not isinstance(getattr(self, name), typ):
                raise ValueError(f"{name} must be a {typ.__name__}")

    def transfer_ms(self, tokens: float, chunked: bool = False, cached_tokens: float = 0.0) -> float:
        """Latency the transfer adds after prefill would have finished."""
        if chunked and self.transfer.chunk_tokens > 0:
            end = self.transfer.chunked_end_ms(self.prefill, tokens)
            return max(0.0, end - float(self.prefill.service_ms(tokens, cached_tokens)))
        return float(self.transfer.serial_ms(tokens))

    def remote_ttft_ms(
        self, tokens: float, chunked: bool = False, cached_tokens: float = 0.0, batch: Any = None
    ) -> float:
        """Idle-pipeline TTFT of disaggregated serving: prefill + transfer + one decode step."""
        pf = float(self.prefill.service_ms(tokens, cached_tokens))
        step = float(self.decode.step_ms(1 if batch is None else batch))
        if chunked and self.transfer.chunk_tokens > 0 and cached_tokens == 0:
            return self.transfer.chunked_end_ms(self.prefill, tokens) + step
        return pf + float(self.transfer.serial_ms(tokens)) + step

    def colocated_ttft_ms(self, tokens: float, cached_tokens: float = 0.0, batch: Any = None) -> float:
        """Idle-worker TTFT of colocated serving: prefill + one decode step, no transfer."""
        pf = float(self.prefill.service_ms(tokens, cached_tokens))
        return pf + float(self.decode.step_ms(1 if batch is None else batch))

    def interference_ms(self, tokens: float, cached_tokens: float = 0.0) -> float:
        """Stall a colocated prefill inflicts on every decode sequence sharing the worker."""
        return float(self.prefill.service_ms(tokens, cached_tokens))

    def decode_per_prefill(self, tokens: float, output_tokens: float, cached_tokens: float = 0.0) -> float:
        """Throughput ratio: decode replicas one prefill replica feeds at full batch."""
        return self.prefill.capacity_rps(tokens, cached_tokens) / float(
            self.decode.capacity_rps(output_tokens)
        )


# --------------------------------------------------------------------------- fitting


@dataclass(frozen=True)
class FitResult:
    """A fitted model, the samples behind it, and the robust residual scale."""

    model: Any
    samples: int
    intercept: float
    slope: float
    residual_ms: float


def fit_linear(
    xs: Any,
    ys: Any,
    prior: tuple[float, float] | None = None,
    prior_weight: float = 0.0,
    huber_k: float = 1.345,
    iterations: int = 30,
) -> tuple[float, float, float]:
    """Robust fit of ``y = a + b x`` (Huber loss, IRLS).

    ``prior=(a0, b0)`` with ``prior_weight=w`` adds the prior line as ``w``
    pseudo-samples split between x = 0 and the largest observed x, so a few
    noisy samples nudge, rather than replace, a known model. Returns
    ``(a, b, residual_scale)``; with no samples the prior is returned.
    """
    x = np.asarray(xs, dtype=float).ravel()
    y = np.asarray(ys, dtype=float).ravel()
    if x.shape != y.shape:
        raise ValueError("xs and ys must have the same length")
    if not (np.all(np.isfinite(x)) and np.all(np.isfinite(y))):
        raise ValueError("xs and ys must be finite")
    _check("prior_weight", prior_weight)
    if prior is not None:
        _check("prior[0]", abs(prior[0]))
        _check("prior[1]", abs(prior[1]))
    if x.size == 0:
        if prior is None:
            raise ValueError("fit_linear needs samples or a prior")
        return float(prior[0]), float(prior[1]), 0.0
    px = np.empty(0)
    py = np.empty(0)
    pw = np.empty(0)
    if prior is not None and prior_weight > 0:
        lo, hi = min(0.0, float(x.min())), float(x.max())
        if hi <= lo:
            hi = lo + 1.0
        px = np.array([lo, hi])
        py = prior[0] + prior[1] * px
        pw = np.array([prior_weight / 2, prior_weight / 2])
    X = np.column_stack([np.ones(x.size + px.size), np.concatenate([x, px])])
    Y = np.concatenate([y, py])
    base_w = np.concatenate([np.ones(x.size), pw])
    if px.size == 0 and np.ptp(x) == 0:
        # Slope is unidentifiable: fit a constant (zero slope) at the mean.
        return float(np.median(y)), 0.0, 0.0
    w = base_w.copy()
    coef = np.zeros(2)
    scale = 0.0
    for _ in range(iterations):
        sw = np.sqrt(w)
        coef_new, *_ = np.linalg.lstsq(X * sw[:, None], Y * sw, rcond=None)
        r = Y[: x.size] - X[: x.size] @ coef_new
        scale = float(1.4826 * np.median(np.abs(r - np.median(r))))
        if scale <= 1e-12:
            coef = coef_new
            break
        u = np.abs(r) / (huber_k * scale)
        hw = np.where(u <= 1.0, 1.0, 1.0 / np.maximum(u, 1e-12))
        w = base_w * np.concatenate([hw, np.ones(px.size)])
        if np.allclose(coef_new, coef, rtol=1e-9, atol=1e-12):
            coef = coef_new
            break
        coef = coef_new
    return float(coef[0]), float(coef[1]), scale


def fit_prefill(
    tokens: Any,
    ms: Any,
    prior: PrefillModel | None = None,
    prior_weight: float = 0.0,
) -> FitResult:
    """Fit ``prefill_ms = fixed + a x tokens`` from measured samples (quadratic term kept from prior)."""
    base = prior or PrefillModel()
    a, b, s = fit_linear(tokens, ms, (base.fixed_ms, base.ms_per_token), prior_weight)
    model = PrefillModel(
        fixed_ms=max(0.0, a),
        ms_per_token=max(0.0, b),
        ms_per_token_sq=base.ms_per_token_sq,
        chunk_tokens=base.chunk_tokens,
    )
    return FitResult(model, int(np.asarray(tokens).size), model.fixed_ms, model.ms_per_token, s)


def fit_decode(
    batch: Any,
    step_ms: Any,
    prior: DecodeModel | None = None,
    prior_weight: float = 0.0,
) -> FitResult:
    """Fit ``step_ms = fixed + per_seq x batch`` from measured (batch, step ms) samples."""
    base = prior or DecodeModel()
    a, b, s = fit_linear(batch, step_ms, (base.step_fixed_ms, base.step_ms_per_seq), prior_weight)
    model = DecodeModel(
        step_fixed_ms=max(1e-6, a),
        step_ms_per_seq=max(0.0, b),
        slots=base.slots,
        kv_cache_tokens=base.kv_cache_tokens,
    )
    return FitResult(model, int(np.asarray(batch).size), model.step_fixed_ms, model.step_ms_per_seq, s)
