"""Joint pool planner: size encoder, prefill and decode pools from one queueing model.

Pure (numpy + the stage models + queueing). See docs/planner.md.

Each pool is an M/G/c queue (Allen-Cunneen): c = replicas for encoder and
prefill, c = replicas x effective batch slots for decode (a sequence holds a
slot for output_tokens x step_ms). The TTFT at the SLO percentile is

    enc wait_p + enc service + prefill wait_p + prefill service
    + transfer (serial or chunked) + decode slot wait_p + one decode step

(summing per-stage percentiles: conservative; the encoder's at the percentile of its own
requests that the SLO's percentile of all requests leaves, `_Spec`). ITL is the decode step at the
expected batch occupancy; the batch per replica is capped so the step at the
cap fits the ITL target (matters when step_ms_per_seq > 0).

The planner finds the replica counts that minimise GPUs subject to
TTFT_p <= target and ITL <= target, by exact search: per pool a table of the
percentile wait for every replica count from the smallest stable count to the
first with zero percentile wait; then every (encoder, prefill) pair takes the
fewest decode replicas that fit the remaining TTFT slack. Under a GPU budget
(or max-replica bounds) too small for the demand, it maximises goodput: the
largest admitted fraction of the arrival rate whose plan meets the SLO within
the budget (bisection), and says how much load is shed. It never squeezes
pools proportionally.
"""

from __future__ import annotations

import bisect
import functools
import math
from dataclasses import dataclass, field, replace
from typing import Any, Literal, NamedTuple, TypeVar

import numpy as np

from disagg import sizes as _sizes
from disagg import worked_example as we
from disagg.model import (
    DEFAULT_ITL_STATISTIC,
    GIB,
    DecodeModel,
    EncoderModel,
    PrefillModel,
    StageModels,
    TransferModel,
    check_itl_statistic,
    gap_p99_rank,
)
from disagg.monotone import smallest_passing
from disagg.names import PLACEMENTS, POOL_COLOCATED, POOL_DECODE, POOL_ENCODER, POOL_PREFILL
from disagg.queueing import erlang_b_stride, poisson_cdf, poisson_quantile, summed_wait_tail
from disagg.sizes import (
    Covers,
    SizeDistribution,
    miss_fraction,
    output_moments,
    prefill_moments,
    ttft_covers,
)

__all__ = [
    "SLO",
    "Demand",
    "Plan",
    "PoolBounds",
    "PoolPlan",
    "kv_footprint",
    "measured_kv_footprint",
    "plan",
    "plan_replicas",
    "predict",
    "prefill_queue",
    "split_threshold_tokens",
]

Placement = Literal["disaggregated", "colocated", "conditional"]
POOLS = (POOL_ENCODER, POOL_PREFILL, POOL_DECODE)
_T = TypeVar("_T")
ENCODER_CS2 = 1.0  # encoder service variability (items per request vary): exponential-like


def _num(
    name: str,
    v: Any,
    *,
    positive: bool = False,
    unit: bool = False,
    integer: bool = False,
    at_most: float | None = None,
) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float):
        try:
            v = float(v)  # numpy scalars
        except (TypeError, ValueError):
            raise ValueError(f"{name} must be a number, got {v!r}") from None
    x = float(v)
    if math.isnan(x) or math.isinf(x):
        raise ValueError(f"{name} must be finite, got {v!r}")
    if positive and x <= 0:
        raise ValueError(f"{name} must be > 0, got {v!r}")
    if x < 0:
        raise ValueError(f"{name} must be >= 0, got {v!r}")
    if unit and x > 1:
        raise ValueError(f"{name} must be <= 1, got {v!r}")
    if at_most is not None and x > at_most:
        raise ValueError(f"{name} must be <= {at_most:,.0f}, got {v!r}")
    if integer and x != int(x):
        raise ValueError(f"{name} must be an integer, got {v!r}")
    return x


# --------------------------------------------------------------------------- inputs

# Longest mean prompt or output a demand may have: above any served model's context window
# (the longest are a few million tokens); a typo of 1e12 would otherwise build per-chunk
# transfer schedules of billions of entries.
MAX_REQUEST_TOKENS = 10_000_000


@dataclass(frozen=True)
class Demand:
    """Offered load: arrival rate and request shape (defaults: the worked example at 1 rps)."""

    arrival_rps: float = we.ARRIVAL_RPS
    prompt_tokens_mean: float = we.PROMPT_TOKENS
    prompt_tokens_std: float = 0.0
    output_tokens_mean: float = we.OUTPUT_TOKENS
    output_tokens_std: float = 0.0
    media_fraction: float = 0.0
    items_per_request: float = 1.0
    prefix_hit_rate: float = 0.0
    # Optional (docs/planner.md, "Request sizes and burstiness"): size classes of prompt and
    # output tokens (the queues' service moments and per-class TTFT slack come from them; the
    # mean/std fields above are then only reported), and the arrival process's squared
    # coefficient of variation (Allen-Cunneen's ca^2; 1 = Poisson), e.g. the measured index
    # of dispersion of arrival counts (disagg.burstiness).
    sizes: SizeDistribution | None = None
    arrival_ca2: float = 1.0
    # Optional (docs/planner.md, "Decode KV capacity"): the measured output-weighted mean of
    # the KV tokens a decode sequence holds, E[(p + o) o] / E[o] over the window's requests;
    # 0: derived from the prompt and output marginals as if independent (`kv_footprint`)
    kv_footprint_tokens: float = 0.0

    def __post_init__(self) -> None:
        _num("arrival_rps", self.arrival_rps)
        _num("prompt_tokens_mean", self.prompt_tokens_mean, at_most=MAX_REQUEST_TOKENS)
        _num("prompt_tokens_std", self.prompt_tokens_std)
        _num("output_tokens_mean", self.output_tokens_mean, positive=True, at_most=MAX_REQUEST_TOKENS)
        _num("output_tokens_std", self.output_tokens_std)
        _num("media_fraction", self.media_fraction, unit=True)
        _num("items_per_request", self.items_per_request)
        _num("prefix_hit_rate", self.prefix_hit_rate, unit=True)
        _num("arrival_ca2", self.arrival_ca2)
        _num("kv_footprint_tokens", self.kv_footprint_tokens)
        if self.sizes is not None and not isinstance(self.sizes, SizeDistribution):
            raise ValueError(f"sizes must be a SizeDistribution or None, got {type(self.sizes).__name__}")

    @property
    def prompt_tokens_cv(self) -> float:
        return self.prompt_tokens_std / self.prompt_tokens_mean if self.prompt_tokens_mean > 0 else 0.0


@dataclass(frozen=True)
class SLO:
    """Targets at `percentile` of requests; a request's ITL is its gaps' `itl_statistic` (max, p99, mean)."""

    ttft_s: float = we.TTFT_S
    itl_s: float = we.ITL_S
    percentile: float = we.PERCENTILE
    itl_statistic: str = DEFAULT_ITL_STATISTIC
    # a TTFT target that grows with the prompt: ttft_s + this x prompt tokens / 1000 (per size
    # class with Demand.sizes; at the mean prompt without)
    ttft_s_per_1k_tokens: float = 0.0

    def __post_init__(self) -> None:
        _num("ttft_s", self.ttft_s, positive=True)
        _num("ttft_s_per_1k_tokens", self.ttft_s_per_1k_tokens)
        _num("itl_s", self.itl_s, positive=True)
        check_itl_statistic(self.itl_statistic)
        p = _num("percentile", self.percentile, positive=True)
        if p >= 1:
            raise ValueError(f"percentile must be < 1, got {self.percentile!r}")

    def ttft_target_s(self, prompt_tokens: Any) -> Any:
        """The TTFT target of a request of `prompt_tokens` (a number or an array), in seconds."""
        return self.ttft_s + self.ttft_s_per_1k_tokens * prompt_tokens / 1000.0


@dataclass(frozen=True)
class PoolBounds:
    min_replicas: int = 1
    max_replicas: int = 10_000
    gpus_per_replica: int = 1

    def __post_init__(self) -> None:
        _num("min_replicas", self.min_replicas, integer=True)
        _num("max_replicas", self.max_replicas, integer=True)
        _num("gpus_per_replica", self.gpus_per_replica, positive=True, integer=True)
        if self.min_replicas > self.max_replicas:
            raise ValueError(
                f"min_replicas ({self.min_replicas}) must be <= max_replicas ({self.max_replicas})"
            )


_DEFAULT_MODELS = StageModels()  # frozen: one shared default instead of a new one per call
_DEFAULT_SLO = SLO()

DEFAULT_BOUNDS: dict[str, PoolBounds] = {
    POOL_ENCODER: PoolBounds(min_replicas=0),
    POOL_PREFILL: PoolBounds(),
    POOL_DECODE: PoolBounds(),
    POOL_COLOCATED: PoolBounds(),
}


# --------------------------------------------------------------------------- outputs


@dataclass(frozen=True)
class PoolPlan:
    name: str
    replicas: int
    gpus: int
    gpus_per_replica: int
    servers_per_replica: int  # 1, or decode batch slots in use per replica
    arrival_rps: float
    service_s: float  # mean service (decode: slot hold) time
    capacity_rps: float  # per replica, at full utilisation
    utilization: float
    wait_mean_s: float  # over the pool's own requests
    wait_p_s: float  # at the SLO's percentile of all requests (the encoder's: `_Spec`)
    queue_len: float  # Little: L_q = lambda x W_q
    in_service: float  # Little: lambda x S

    def to_dict(self) -> dict[str, Any]:
        return {
            "replicas": self.replicas,
            "gpus": self.gpus,
            "gpus_per_replica": self.gpus_per_replica,
            "servers_per_replica": self.servers_per_replica,
            "arrival_rps": _j(self.arrival_rps),
            "service_s": _j(self.service_s),
            "capacity_rps": _j(self.capacity_rps),
            "utilization": _j(self.utilization),
            "wait_mean_s": _j(self.wait_mean_s),
            "wait_p_s": _j(self.wait_p_s),
            "queue_len": _j(self.queue_len),
            "in_service": _j(self.in_service),
        }


def _j(x: float) -> float | None:
    """JSON-safe float: None for inf/NaN, 6 significant digits otherwise."""
    if x is None or math.isnan(x) or math.isinf(x):
        return None
    return float(f"{x:.6g}")


@dataclass(frozen=True)
class Plan:
    placement: str
    pools: dict[str, PoolPlan]
    stages: dict[str, float]
    ttft_s: float
    itl_s: float
    percentile: float
    decode_per_prefill: float | None
    encoder_per_prefill: float | None
    capacity_ratio: float | None  # decode replicas one prefill replica feeds at full batch (throughput only)
    total_gpus: int
    gpu_budget: int | None
    feasible: bool
    reason: str
    best_ttft_s: float
    best_itl_s: float
    budget_limited: bool
    admitted_fraction: float
    goodput_rps: float
    shed_rps: float
    sacrificed: str
    interference_ms: float
    split_threshold_tokens: float | None
    remote_fraction: float | None
    demand: Demand = field(default_factory=Demand)
    slo: SLO = field(default_factory=SLO)
    # what caps a decode worker's batch: "slots", "itl" (the step at a full batch would break
    # the ITL target) or "kv" (the KV cache fills first: the decode pool is sized by KV memory)
    decode_bound: str = "slots"

    @property
    def replicas(self) -> dict[str, int]:
        return {k: v.replicas for k, v in self.pools.items()}

    def to_dict(self) -> dict[str, Any]:
        """Stable JSON form (documented in docs/planner.md; key order fixed, inf -> null)."""
        return {
            "schema": "disagg.plan/v1",
            "placement": self.placement,
            "feasible": self.feasible,
            "reason": self.reason,
            "pools": {k: self.pools[k].to_dict() for k in sorted(self.pools)},
            "stages": {k: {kk: _j(vv) for kk, vv in v.items()} for k, v in _nest_stages(self.stages).items()},
            "predicted": {
                "ttft_s": _j(self.ttft_s),
                "itl_s": _j(self.itl_s),
                "percentile": self.percentile,
                "interference_ms": _j(self.interference_ms),
            },
            "best_achievable": {"ttft_s": _j(self.best_ttft_s), "itl_s": _j(self.best_itl_s)},
            "ratio": {
                "decode_per_prefill": None
                if self.decode_per_prefill is None
                else _j(self.decode_per_prefill),
                "encoder_per_prefill": None
                if self.encoder_per_prefill is None
                else _j(self.encoder_per_prefill),
                "capacity_decode_per_prefill": None
                if self.capacity_ratio is None
                else _j(self.capacity_ratio),
            },
            "decode_bound": self.decode_bound,
            "gpus": {"total": self.total_gpus, "budget": self.gpu_budget},
            "budget": {
                "limited": self.budget_limited,
                "admitted_fraction": _j(self.admitted_fraction),
                "goodput_rps": _j(self.goodput_rps),
                "shed_rps": _j(self.shed_rps),
                "sacrificed": self.sacrificed,
            },
            "conditional": {
                "split_threshold_tokens": None
                if self.split_threshold_tokens is None
                else _j(self.split_threshold_tokens),
                "remote_fraction": None if self.remote_fraction is None else _j(self.remote_fraction),
            },
            "demand": {
                "arrival_rps": _j(self.demand.arrival_rps),
                "prompt_tokens_mean": _j(self.demand.prompt_tokens_mean),
                "prompt_tokens_std": _j(self.demand.prompt_tokens_std),
                "output_tokens_mean": _j(self.demand.output_tokens_mean),
                "output_tokens_std": _j(self.demand.output_tokens_std),
                "media_fraction": _j(self.demand.media_fraction),
                "items_per_request": _j(self.demand.items_per_request),
                "prefix_hit_rate": _j(self.demand.prefix_hit_rate),
                **(
                    {"kv_footprint_tokens": _j(self.demand.kv_footprint_tokens)}
                    if self.demand.kv_footprint_tokens
                    else {}
                ),
            },
            "slo": {
                "ttft_s": self.slo.ttft_s,
                "itl_s": self.slo.itl_s,
                "percentile": self.slo.percentile,
                "itl_statistic": self.slo.itl_statistic,
                **(
                    {"ttft_s_per_1k_tokens": self.slo.ttft_s_per_1k_tokens}
                    if self.slo.ttft_s_per_1k_tokens
                    else {}
                ),
            },
        }


def _nest_stages(stages: dict[str, float]) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for key, v in stages.items():
        stage, _, name = key.partition(".")
        out.setdefault(stage, {})[name] = v
    return out


# --------------------------------------------------------------------------- queue tables

# A pool's table: (r0, wait_p, wait_mean) -- the percentile and mean queueing wait
# for R = r0, r0 + 1, ... replicas (plain float lists: no per-row objects). The percentile
# wait is over all requests, the mean over the pool's own (see `_Spec`'s share).
_Table = tuple[int, list[float], list[float]]
# A pool's queue: (arrival rate, mean service s, service cs^2, servers per replica, bounds,
# share). The share is the fraction of all requests that visit the pool: the encoder sees only
# the requests with media, and one without waits nothing there. The SLO's percentile is over
# all requests, so a pool's wait is read at the tail of its own requests that the SLO's tail
# of all requests allows (`_visitor_tail`): at p99 with media on half the requests, the
# encoder's wait at p98 of its own.
_Spec = tuple[float, float, float, int, PoolBounds, float]
# The largest tail of a pool's own requests its waits are read at: the misses the SLO allows
# may fall on the requests with media, but the encoder is never planned for most of them to
# wait beyond the slack (media on fewer requests than twice the SLO's tail).
MAX_VISITOR_TAIL = 0.5


def _visitor_tail(tail: float, share: float) -> float:
    """The tail of a pool's own requests whose waits may exceed the slack, when ``tail`` of all
    requests may (`_Spec`): a pool every request visits reads its waits at ``tail`` itself."""
    if share >= 1.0:
        return tail
    return min(tail / share, max(tail, MAX_VISITOR_TAIL))


_INLINE_LOAD = 40.0  # Erlangs: below, the Erlang-B recursion starts at 0 and is short


def _table(
    lam: float, service_s: float, cs2: float, k: int, r_lo: int, r_hi: int, p: float, share: float = 1.0
) -> _Table:
    """Percentile wait for R = first stable (>= r_lo) .. first R whose percentile wait is 0 (<= r_hi).

    One Erlang-B pass (`erlang_b_stride`, vectorised for large loads) that
    stops at the first zero-wait count. ``share``: the fraction of all requests
    that visit the pool (`_Spec`); the percentile is over all requests.
    """
    if lam <= 0 or service_s <= 0:
        return r_lo, [0.0], [0.0]
    a = lam * service_s
    r0 = max(r_lo, int(a // k) + 1)
    if r0 > r_hi:
        return r0, [], []
    f = (1.0 + cs2) / 2.0
    mu = 1.0 / service_s
    tail = _visitor_tail(1.0 - p, share)
    wps: list[float] = []
    wms: list[float] = []
    c = r0 * k
    c_last = r_hi * k
    log = math.log
    if a < _INLINE_LOAD and c <= 50:
        # light load: the scalar recursion from B(0) = 1, inline (erlang_b_stride's values,
        # without a generator; the zero-wait count comes long before its a + 40 sqrt(a) + 50 cutoff)
        b, kk = 1.0, 0
        while True:
            while kk < c:
                kk += 1
                ab = a * b
                b = ab / (kk + ab)
            denom = c - a * (1.0 - b)
            pw = min(1.0, c * b / denom) if denom > 0 else 1.0
            gap = c * mu - lam
            wp = f * log(pw / tail) / gap if pw > tail else 0.0
            wps.append(wp)
            wms.append(f * pw / gap)
            if wp <= 0.0 or c >= c_last:
                return r0, wps, wms
            c += k
    for b in erlang_b_stride(a, c, k):
        denom = c - a * (1.0 - b)
        pw = min(1.0, c * b / denom) if denom > 0 else 1.0
        gap = c * mu - lam
        wp = f * log(pw / tail) / gap if pw > tail else 0.0
        wps.append(wp)
        wms.append(f * pw / gap)
        if wp <= 0.0 or c >= c_last:
            break
        c += k
    return r0, wps, wms


# One pool's Erlang pass: (r0, P(wait) among its own arrivals, drain rate c mu - lam per
# count; Allen-Cunneen factor, share of all requests visiting it).
_Raw = tuple[int, list[float], list[float], float, float]


def _erlang_pass(
    lam: float, service_s: float, cs2: float, k: int, r_lo: int, r_hi: int, p_max: float, share: float = 1.0
) -> _Raw:
    """One pool's Erlang-B pass, from which `_table_at` cuts its table at any percentile <= p_max.

    The pass runs from the first stable count to the first with zero wait at
    ``p_max`` or to r_hi, as `_table` does at one percentile.
    """
    if lam <= 0 or service_s <= 0:
        return r_lo, [0.0], [1.0], 1.0, 1.0
    a = lam * service_s
    r0 = max(r_lo, int(a // k) + 1)
    if r0 > r_hi:
        return r0, [], [], 1.0, share
    f = (1.0 + cs2) / 2.0
    mu = 1.0 / service_s
    tail_min = _visitor_tail(1.0 - p_max, share)
    pws: list[float] = []
    gaps: list[float] = []
    c = r0 * k
    c_last = r_hi * k
    if a < _INLINE_LOAD and c <= 50:  # as in `_table`: the inline scalar recursion from B(0) = 1
        b, kk = 1.0, 0
        while True:
            while kk < c:
                kk += 1
                ab = a * b
                b = ab / (kk + ab)
            denom = c - a * (1.0 - b)
            pws.append(min(1.0, c * b / denom) if denom > 0 else 1.0)
            gaps.append(c * mu - lam)
            if pws[-1] <= tail_min or c >= c_last:
                break
            c += k
    else:
        for b in erlang_b_stride(a, c, k):
            denom = c - a * (1.0 - b)
            pws.append(min(1.0, c * b / denom) if denom > 0 else 1.0)
            gaps.append(c * mu - lam)
            if pws[-1] <= tail_min or c >= c_last:
                break
            c += k
    return r0, pws, gaps, f, share


def _table_at(raw: _Raw, p: float) -> _Table:
    """The table at percentile p (<= the pass's p_max): `_table`'s values, cut at its first zero wait.

    tests/unit/test_sizes.py checks it equals `_table` at p.
    """
    r0, pws, gaps, f, share = raw
    tail = _visitor_tail(1.0 - p, share)
    log = math.log
    wps: list[float] = []
    add = wps.append
    for pw, gap in zip(pws, gaps, strict=True):  # to the first zero wait (inclusive)
        if pw > tail:
            wp = f * log(pw / tail) / gap
            if wp > 0.0:
                add(wp)
                continue
        add(0.0)
        break
    n = len(wps)
    return r0, wps, [f * pws[i] / gaps[i] for i in range(n)]


# --------------------------------------------------------------------------- setup


class _Setup(NamedTuple):
    """Everything about one (demand shape, models, slo) that depends on neither rate nor replicas."""

    fixed_s: float  # latency floor: services + transfer + first step
    enc_s: float
    prefill_s: float
    prefill_cs2: float
    transfer_ms: float
    serial_ms: float
    chunked_ms: float
    kv_bytes: float
    step_cap_ms: float
    b_eff: int
    itl_ok: bool
    hold_s: float
    hold_cs2: float
    media: float
    # the KV link's busy time per request (its bytes at the link's bandwidth; the setup is a
    # delay, not link time) and its squared CV: a prefill worker's link carries every prompt's
    # KV while the worker computes the next prompt (`_prefill_queue`)
    link_s: float = 0.0
    link_cs2: float = 0.0
    ca2: float = 1.0  # arrival squared CV (Demand.arrival_ca2)
    covers: Covers | None = None  # per size class TTFT candidates (Demand.sizes)
    kv_footprint: float = 0.0  # KV tokens a resident decode sequence holds, time-weighted mean (`_with_kv`)
    kv_slots: int = 0  # sequences whose KV fits one decode worker (0: not computed)
    decode_bound: str = ""  # what caps the decode batch: "slots", "itl" or "kv" (`_with_kv`)


# `_with_kv` rebuilds a setup from its leading fields: the KV fields must stay the last three
_KV_FIELDS_AT = len(_Setup._fields) - 3
assert _Setup._fields[_KV_FIELDS_AT:] == ("kv_footprint", "kv_slots", "decode_bound")


class _Ctx:
    """Per (models, slo, chunked): model constants and the setups of the shapes seen so far."""

    __slots__ = (
        "b_eff",
        "chunked",
        "fast",
        "flat_step",
        "itl_ok",
        "kv_tail",
        "m",
        "shapes",
        "slo",
        "step1_ms",
        "step_cap_ms",
    )

    def __init__(self, m: StageModels, slo: SLO, chunked: bool) -> None:
        self.m, self.slo, self.chunked = m, slo, chunked
        # the inlined scalar formulas below are the model classes' own; subclasses take the slow path
        self.fast = (
            type(m.encoder) is EncoderModel
            and type(m.prefill) is PrefillModel
            and type(m.transfer) is TransferModel
            and type(m.decode) is DecodeModel
        )
        b_eff = m.decode.max_batch_for_itl(slo.itl_s * 1000.0)
        self.itl_ok = b_eff >= 1
        self.b_eff = max(1, b_eff)
        self.step_cap_ms = float(m.decode.step_ms(self.b_eff))
        self.step1_ms = float(m.decode.step_ms(1))
        # the step does not grow with the batch (step_ms_per_seq = 0): every batch steps in
        # step1_ms (step_fixed_ms + 0.0 x batch is step_fixed_ms exactly)
        self.flat_step = self.fast and m.decode.step_ms_per_seq == 0.0
        # a newcomer finds room for its KV beside the residents' at the SLO percentile (`_with_kv`)
        self.kv_tail = 1.0 - slo.percentile
        self.shapes: dict[tuple[float, ...], _Setup] = {}

    def step_ms(self, batch: float) -> float:
        dec = self.m.decode
        if self.fast:
            return dec.step_fixed_ms + dec.step_ms_per_seq * batch
        return float(dec.step_ms(batch))


_CTX_BY_ID: dict[tuple[int, int, bool], _Ctx] = {}
_CTX_BY_VALUE: dict[tuple[StageModels, SLO, bool], _Ctx] = {}
_CTX_MAX = 64
_SHAPES_MAX = 4096


def _ctx(m: StageModels, slo: SLO, chunked: bool) -> _Ctx:
    """The context for these (frozen) models and SLO: by identity first, by value on a miss."""
    c = _CTX_BY_ID.get((id(m), id(slo), chunked))
    if c is not None and c.m is m and c.slo is slo:
        return c
    vkey = (m, slo, chunked)
    c = _CTX_BY_VALUE.get(vkey)
    if c is None:
        if len(_CTX_BY_VALUE) >= _CTX_MAX:
            _CTX_BY_VALUE.clear()
        c = _CTX_BY_VALUE[vkey] = _Ctx(m, slo, chunked)
    if len(_CTX_BY_ID) >= _CTX_MAX:
        _CTX_BY_ID.clear()
    _CTX_BY_ID[(id(m), id(slo), chunked)] = c  # the context holds m and slo: their ids stay theirs
    return c


def _clear_caches() -> None:
    """Forget every cached context and shape setup (benchmarks; tests)."""
    _CTX_BY_ID.clear()
    _CTX_BY_VALUE.clear()


def _shape(ctx: _Ctx, d: Demand) -> _Setup:
    key = (
        d.prompt_tokens_mean,
        d.prompt_tokens_std,
        d.output_tokens_mean,
        d.output_tokens_std,
        d.media_fraction,
        d.items_per_request,
        d.prefix_hit_rate,
    )
    extra = d.sizes is not None or d.arrival_ca2 != 1.0 or d.kv_footprint_tokens > 0
    skey = (*key, d.sizes, d.arrival_ca2, d.kv_footprint_tokens) if extra else key
    st = ctx.shapes.get(skey)
    if st is None:
        if len(ctx.shapes) >= _SHAPES_MAX:
            ctx.shapes.clear()
        st = _setup_fast(key, ctx) if ctx.fast else _setup_reference(key, ctx.m, ctx.slo, ctx.chunked)
        if extra:
            st = _with_sizes(st, d, ctx)
        st = _with_kv(st, d, ctx)
        ctx.shapes[skey] = st
    return st


def kv_footprint(d: Demand) -> tuple[float, float]:
    """(mean, std) of the KV tokens one resident decode sequence holds: prompt + output tokens.

    A sequence holds its footprint for as long as it decodes, i.e. in proportion
    to its output tokens, so the footprint a decode worker sees at a random
    instant is output-weighted: E[p] + E[o^2] / E[o] (prompt and output
    independent). The spread is that of one sequence's footprint, sqrt(Var p + Var o).
    From the size classes when the demand has them, from the means and standard
    deviations otherwise. Cached prefix tokens count: the decode worker holds the
    whole prompt's KV. A measured `Demand.kv_footprint_tokens` replaces the mean (it
    sees how prompt and output lengths go together: long prompts with short outputs
    hold less than independent marginals say) and scales the spread with it (the
    marginals' coefficient of variation kept).
    """
    if d.sizes is not None:
        p_mean, p_second = d.sizes.prompt_mean_second
        p_var = max(0.0, p_second - p_mean * p_mean)
        o_mean, o_second = d.sizes.output_mean_second
    else:
        p_mean, p_var = d.prompt_tokens_mean, d.prompt_tokens_std**2
        o_mean = d.output_tokens_mean
        o_second = o_mean * o_mean + d.output_tokens_std**2
    o_var = max(0.0, o_second - o_mean * o_mean)
    mean = p_mean + o_second / o_mean
    std = math.sqrt(p_var + o_var)
    if d.kv_footprint_tokens > 0:
        # the measured footprint sets the scale, the marginals the shape (their coefficient of
        # variation): a spread in tokens taken from the marginals beside a measured mean a
        # fraction of theirs would size for spreads the resident sequences do not have
        std *= d.kv_footprint_tokens / mean
        mean = d.kv_footprint_tokens
    return mean, std


def kv_arrivals(d: Demand) -> tuple[tuple[float, float, float], ...]:
    """(weight, mean, variance) of the KV footprint of an ARRIVING decode sequence, per prompt class.

    Unlike the residents' footprint (`kv_footprint`, weighted by how long each is held),
    a newcomer is drawn from the requests as they come: its prompt class's tokens plus
    the output tokens, independent. One class (the prompt's mean and spread) without sizes.
    """
    if d.sizes is not None:
        sz = d.sizes
        o_mean, o_second = sz.output_mean_second
        o_var = max(0.0, o_second - o_mean * o_mean)
        # the fields are floats already (SizeDistribution normalises them)
        return tuple(
            [
                (w, t + o_mean, v + o_var)
                for w, t, v in zip(sz.prompt_weight, sz.prompt_tokens, sz.prompt_var, strict=True)
                if w > 0
            ]
        )
    return (
        (1.0, d.prompt_tokens_mean + d.output_tokens_mean, d.prompt_tokens_std**2 + d.output_tokens_std**2),
    )


def kv_room_batch(
    capacity: float,
    slots: int,
    mean: float,
    std: float,
    arrivals: tuple[tuple[float, float, float], ...],
    tail: float,
) -> int:
    """Sequences a decode worker holds with room for one more: the KV bound on its batch.

    A sequence joins a worker at once when the KV its n residents hold plus its own
    footprint fits the cache (the engine admits FCFS: one that does not fit also holds
    back the ones behind it). The residents' sum is normal, n x `mean` with variance
    n x `std`^2 (a sum of many footprints concentrates near its mean); the newcomer's
    footprint is drawn from `arrivals` (`kv_arrivals`: its prompt class, normal within
    it), so the rare long prompt is weighed by how rare it is, never taken at a
    quantile of its own. The answer is 1 + the largest n <= slots - 1 with
    P(residents + newcomer > capacity) <= `tail` (at least 1: a sequence larger than
    the cache runs alone on an empty worker).
    """

    var, erfc, sqrt = std * std, math.erfc, math.sqrt
    # per newcomer class: half its weight, its mean, twice its variance (x 2 and x 0.5 are
    # exact in floating point: the same sums as sqrt(2 (n var + f_var)) and 0.5 w erfc(...))
    terms = [(0.5 * w, w, f_mean, 2.0 * f_var) for w, f_mean, f_var in arrivals]

    def within(n: int) -> bool:
        """P(n residents + a newcomer overflow the cache) <= tail.

        The terms are >= 0, so the running sum never falls (in floating point too):
        once it is above the tail, the whole sum is, and the rest is not added.
        """
        out = 0.0
        room = capacity - n * mean
        spread = 2.0 * (n * var)
        for half_w, w, f_mean, f_var2 in terms:
            sd = sqrt(spread + f_var2)  # x sqrt(2): erfc's scale
            gap = room - f_mean
            if sd <= 0.0:
                out += w if gap < 0 else 0.0
            else:
                out += half_w * erfc(gap / sd)
            if out > tail:
                return False
        return out <= tail

    lo, hi = 0, max(0, slots - 1)  # the overflow grows with n: bisect for the largest n within the tail
    # When no newcomer's mean fits beside hi residents' (every gap the sum adds is < 0), every
    # term is at least half its weight: the overflow at hi is >= 1/2 > tail, so it is not computed.
    f_min = min([a[1] for a in arrivals]) if arrivals else 0.0  # the smallest newcomer's mean
    beyond = tail < 0.25 and bool(arrivals) and capacity - hi * mean - f_min < 0
    if not beyond and within(hi):
        return hi + 1
    if tail < 0.5 and mean > 0:
        # beyond this n even the smallest newcomer's mean does not fit: overflow >= 1/2 > tail
        fits = (capacity - f_min) / mean
        hi = max(0, min(hi, math.floor(fits)))
    if hi >= 1 and 0.0 < tail < 0.5 and mean > 0 and max([a[1] for a in arrivals]) <= capacity:
        # Every newcomer alone fits the cache: each term's gap / spread then falls as n grows, so
        # the overflow is monotone in n and a search from a good guess ends where bisection does.
        # The answer is the first count (1..hi + 1) that is not within; hi + 1 is never tested.
        guess = _kv_room_guess(capacity, mean, var, arrivals, tail, hi) + 1
        return smallest_passing(lambda n: n > hi or not within(n), guess, hi + 1)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if within(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo + 1


def _kv_room_guess(
    capacity: float,
    mean: float,
    var: float,
    arrivals: tuple[tuple[float, float, float], ...],
    tail: float,
    hi: int,
) -> int:
    """`kv_room_batch`'s answer under a normal newcomer (the mixture's mean and variance), in [1, hi].

    Solves capacity - n x mean - mu = z sqrt(n var + sigma^2) for n, z the normal's
    (1 - tail)-quantile: the smaller root of a quadratic in n. Only a starting point: the
    mixture's tail is not normal.
    """
    mu = second = 0.0
    for w, f_mean, f_var in arrivals:
        mu += w * f_mean
        second += w * (f_var + f_mean * f_mean)
    spread2 = max(0.0, second - mu * mu)
    room = capacity - mu
    z2 = _z(1.0 - tail) ** 2
    if room <= 0 or room * room <= z2 * spread2:
        return 1
    b = 2.0 * room * mean + z2 * var
    disc = b * b - 4.0 * mean * mean * (room * room - z2 * spread2)
    n = (b - math.sqrt(max(0.0, disc))) / (2.0 * mean * mean)
    return max(1, min(hi, int(n)))


def measured_kv_footprint(prompt_tokens: Any, output_tokens: Any) -> float:
    """`Demand.kv_footprint_tokens` from requests: sum((p + o) o) / sum(o), their joint output-weighted footprint."""
    p = np.asarray(prompt_tokens, dtype=float)
    o = np.asarray(output_tokens, dtype=float)
    if p.shape != o.shape or p.size == 0:
        raise ValueError("measured_kv_footprint needs prompt and output tokens of the same requests")
    weight = float(o.sum())
    if not math.isfinite(weight) or weight <= 0 or np.any(p < 0) or np.any(o < 0):
        raise ValueError("measured_kv_footprint needs finite token counts >= 0 and some output tokens")
    return float(((p + o) * o).sum()) / weight


def _with_kv(st: _Setup, d: Demand, ctx: _Ctx) -> _Setup:
    """The setup with the decode worker's KV capacity applied (docs/planner.md, "Decode KV capacity").

    A decode worker holds at most `kv_room_batch` sequences of this mix: with one
    fewer resident, a newcomer still finds room for its KV at the SLO percentile
    (residents' footprints `kv_footprint`, the newcomer's `kv_arrivals`). When that
    is below the batch the slots and the ITL target allow, it becomes the servers
    per decode replica (Erlang's count of busy servers is the count of residents:
    the count's variation is the queue's, the footprints' the KV bound's), and the
    step (and slot hold) are those of the smaller batch: the pool is then sized by
    KV memory.
    """
    dec = ctx.m.decode
    mean, std = kv_footprint(d)
    kv = kv_room_batch(dec.kv_cache_tokens, dec.slots, mean, std, kv_arrivals(d), ctx.kv_tail)
    slot_bound = "itl" if ctx.b_eff < dec.slots else "slots"
    if kv >= st.b_eff:  # the common case: the setup with its last three (KV) fields set, no _replace
        return tuple.__new__(_Setup, (*st[:_KV_FIELDS_AT], mean, kv, slot_bound))
    step = ctx.step_ms(kv)
    return st._replace(
        b_eff=kv,
        step_cap_ms=step,
        hold_s=st.hold_s * step / st.step_cap_ms,
        kv_footprint=mean,
        kv_slots=kv,
        decode_bound="kv",
    )


def _with_sizes(st: _Setup, d: Demand, ctx: _Ctx) -> _Setup:
    """The setup with the arrival variability and the size classes (disagg.sizes) applied.

    Queue service moments come from the classes; the bare TTFT (``fixed_s``) is the
    slowest feasible class's (the full cover: the conservative one `predict` uses);
    the planner tries every cover (`_pick_cover`).
    """
    if d.sizes is None:
        return st._replace(ca2=float(d.arrival_ca2))
    m, slo = ctx.m, ctx.slo
    s_ms, cs2 = prefill_moments(d.sizes, m, d.prefix_hit_rate)
    o_mean, o_cs2 = output_moments(d.sizes)
    shared = st.enc_s + ctx.step1_ms / 1000.0
    cov = ttft_covers(
        d.sizes,
        m,
        slo.ttft_s,
        slo.percentile,
        chunked=ctx.chunked,
        prefix_hit_rate=d.prefix_hit_rate,
        extra_s=shared,
        target_s_per_1k_tokens=slo.ttft_s_per_1k_tokens,
    )
    fixed = cov.fixed_s[-1] if cov.fixed_s else cov.floor_s
    t_mean, t_second = d.sizes.prompt_mean_second
    tr = m.transfer
    return st._replace(
        ca2=float(d.arrival_ca2),
        fixed_s=fixed,
        prefill_s=s_ms / 1000.0,
        prefill_cs2=cs2,
        # the link's time is linear in the tokens: its moments are the prompt's, scaled
        link_s=(tr.kv_bytes_per_token * t_mean) / (tr.bandwidth_gibps * GIB),
        link_cs2=max(t_second / (t_mean * t_mean) - 1.0, 0.0) if t_mean > 0 else 0.0,
        hold_s=o_mean * st.step_cap_ms / 1000.0,
        hold_cs2=o_cs2,
        covers=cov,
    )


def _ttft_target(slo: SLO, d: Demand) -> float:
    """The TTFT target of the mean request (SLO.ttft_s_per_1k_tokens)."""
    return float(slo.ttft_target_s(d.prompt_tokens_mean))


class _Pick(NamedTuple):
    """The size-class candidate the planner sizes for (`_pick_cover`)."""

    st: _Setup  # fixed_s: the binding slice's bare TTFT
    percentile: float  # the wait percentile
    target: float  # the binding slice's TTFT target
    covered: float  # share of the feasible requests at or below the binding slice
    miss: float | None  # exact mixture miss fraction of a relaxed candidate (None: a cover)
    tabs: list[_Table] | None = None  # the pools' tables at the demand's rate and this percentile
    idx: tuple[int, int, int] | None = None  # `_search`'s answer in `tabs` (None: not searched or none)


def _pick_cover(
    st: _Setup, lam: float, bounds: dict[str, PoolBounds], gpus: tuple[int, int, int], p: float, ttft_s: float
) -> _Pick:
    """The cheapest size-class candidate at rate lam, no budget (docs/planner.md).

    Covers guarantee the target share under the wait model (a bound); relaxed
    candidates size for one slice at the SLO percentile and are kept only when
    the exact mixture over every slice (`sizes.miss_fraction`) meets it. Fewest
    GPUs wins, then the most requests covered. Without feasible slices: the
    setup as is at p.
    """
    cov = st.covers
    if cov is None or not cov.fixed_s:
        return _Pick(st, p, ttft_s, 0.0, None)
    last = len(cov.fixed_s) - 1  # the full cover: the default when nothing fits (bounds)
    pcts = cov.wait_percentile
    # One Erlang pass per pool, deep enough for every cover's percentile; a cover's tables
    # are cut from it only when the cover is searched (most are ruled out by their first
    # fits, read off the passes directly, which also are the search's answer most of the time).
    p_max = max(pcts)
    raws = [
        _erlang_pass(lam_s, s, cs2, k, b.min_replicas, b.max_replicas, p_max, share)
        for lam_s, s, cs2, k, b, share in _specs(lam, st, bounds)
    ]
    built: dict[float, list[_Table]] = {}

    def tables(q: float) -> list[_Table]:
        t = built.get(q)
        if t is None:
            t = built[q] = [_table_at(r, q) for r in raws]
        return t

    best: tuple[int, float] | None = None
    # Covers from the most requests covered down; one whose cost cannot beat the best so far
    # (its first fits' cost, a lower bound) is not searched. Same pick as in index order keeping
    # the first of equal keys (hence `<=` in this backward loop); tests/unit/test_sizes.py checks.
    won, won_idx = -1, None
    for i in range(last, -1, -1):
        slack = max(0.0, cov.target_s[i] - cov.fixed_s[i])
        first = _first_fits(raws, gpus, pcts[i], slack)
        if first is None or (best is not None and (first[0], -cov.covered[i]) > best):
            continue
        cost, fits = first
        if _search_is_first_fits(fits, slack):
            idx = (fits[0][0], fits[1][0], fits[2][0])
        else:
            tabs = tables(pcts[i])
            found = _search(tabs, gpus, slack)
            if found is None:
                continue
            idx, cost = found, _cost(tabs, gpus, found)
        key = (cost, -cov.covered[i])
        if best is None or key <= best:
            best, won, won_idx = key, i, idx
    at = won if won >= 0 else last
    pick = _Pick(
        st._replace(fixed_s=cov.fixed_s[at]),
        pcts[won] if won >= 0 else p,
        cov.target_s[at],
        cov.covered[won] if won >= 0 else 1.0,
        None,
        tables(pcts[at]),
        won_idx,
    )
    if best is None or cov.slices is None or not _sizes.RELAXED_SHARES:
        return pick
    fixed, target, _, cum = cov.slices
    p_tabs = tables(pcts[last])  # the full cover's tables are at p
    seen: set[int] = set()
    for share in _sizes.RELAXED_SHARES:  # read at call time: a module setting
        j = min(int(np.searchsorted(cum, share - 1e-12)), len(cum) - 1)
        if j in seen:
            continue
        seen.add(j)
        idx = _search(p_tabs, gpus, max(0.0, float(target[j] - fixed[j])))
        if idx is None:
            continue
        key = (_cost(p_tabs, gpus, idx), -float(cum[j]))
        if key >= best:
            continue
        # the mixture's misses are of all requests: a pool's P(wait) over them (`_Spec`'s share)
        stages = [(r[4] * r[1][i], r[2][i], r[3]) for r, i in zip(raws, idx, strict=True)]
        miss = miss_fraction(cov, lambda s, stages=stages: summed_wait_tail(s, stages))
        if miss <= 1.0 - p + 1e-12:
            best = key
            pick = _Pick(
                st._replace(fixed_s=float(fixed[j])), p, float(target[j]), float(cum[j]), miss, p_tabs, idx
            )
    return pick


def _setup(d: Demand, m: StageModels, slo: SLO, chunked: bool) -> _Setup:
    return _shape(_ctx(m, slo, chunked), d)


def _setup_reference(key: tuple[float, ...], m: StageModels, slo: SLO, chunked: bool) -> _Setup:
    """The setup through the models' own methods (any model subclass; the reference for `_setup_fast`)."""
    d = Demand(1.0, *key)
    tokens = d.prompt_tokens_mean
    h = d.prefix_hit_rate
    pf = m.prefill
    cached = h * tokens
    # E[S] with the quadratic term's E[t^2] = mean^2 + std^2; linearised variance
    s_ms = pf.fixed_ms + pf.ms_per_token * (1 - h) * tokens
    s_ms += pf.ms_per_token_sq * (1 - h * h) * (tokens * tokens + d.prompt_tokens_std**2)
    slope = pf.ms_per_token * (1 - h) + 2 * pf.ms_per_token_sq * (1 - h * h) * tokens
    cs2 = (slope * d.prompt_tokens_std / s_ms) ** 2 if s_ms > 0 else 0.0
    serial = float(m.transfer.serial_ms(tokens))
    chunked_end = (
        m.transfer.chunked_end_ms(pf, tokens)
        if m.transfer.chunk_tokens > 0
        else float(pf.service_ms(tokens)) + serial
    )
    chunked_ms = max(0.0, chunked_end - float(pf.service_ms(tokens, cached)))
    transfer = m.transfer_ms(tokens, chunked=chunked, cached_tokens=cached) if tokens > 0 else 0.0
    itl_ms = slo.itl_s * 1000.0
    b_eff = m.decode.max_batch_for_itl(itl_ms)
    itl_ok = b_eff >= 1
    b_eff = max(1, b_eff)
    step_cap = float(m.decode.step_ms(b_eff))
    step1 = float(m.decode.step_ms(1))
    enc_s = float(m.encoder.service_ms(d.items_per_request)) / 1000.0 if d.media_fraction > 0 else 0.0
    fixed = enc_s + s_ms / 1000.0 + transfer / 1000.0 + step1 / 1000.0
    return _Setup(
        fixed_s=fixed,
        enc_s=enc_s,
        prefill_s=s_ms / 1000.0,
        prefill_cs2=cs2,
        transfer_ms=transfer,
        serial_ms=serial,
        chunked_ms=chunked_ms,
        kv_bytes=float(m.transfer.kv_bytes(tokens)),
        step_cap_ms=step_cap,
        b_eff=b_eff,
        itl_ok=itl_ok,
        hold_s=d.output_tokens_mean * step_cap / 1000.0,
        hold_cs2=(d.output_tokens_std / d.output_tokens_mean) ** 2,
        media=d.media_fraction,
        link_s=float(m.transfer.kv_bytes(tokens)) / (m.transfer.bandwidth_gibps * GIB),
        link_cs2=(d.prompt_tokens_std / tokens) ** 2 if tokens > 0 else 0.0,
    )


def _setup_fast(key: tuple[float, ...], ctx: _Ctx) -> _Setup:
    """`_setup_reference` with the model formulas inlined as scalar float arithmetic.

    Same operations in the same order as the model methods (so bit-identical;
    tests/unit/test_planner.py checks), without their per-call validation and
    numpy round trips.
    """
    tokens, t_std, o_mean, o_std, media, items, h = key
    m = ctx.m
    pf, tr = m.prefill, m.transfer
    p_fixed, p_lin, p_sq = pf.fixed_ms, pf.ms_per_token, pf.ms_per_token_sq
    cached = h * tokens
    s_ms = p_fixed + p_lin * (1 - h) * tokens
    s_ms += p_sq * (1 - h * h) * (tokens * tokens + t_std**2)
    slope = p_lin * (1 - h) + 2 * p_sq * (1 - h * h) * tokens
    cs2 = (slope * t_std / s_ms) ** 2 if s_ms > 0 else 0.0
    kvb, setup_ms = tr.kv_bytes_per_token, tr.setup_ms
    link = tr.bandwidth_gibps * GIB
    serial = setup_ms + 1000.0 * (kvb * tokens) / link
    full_ms = p_fixed + p_lin * tokens + p_sq * (tokens * tokens - 0.0 * 0.0)  # service_ms(tokens)
    c = min(cached, tokens)
    hit_ms = p_fixed + p_lin * (tokens - c) + p_sq * (tokens * tokens - c * c)  # service_ms(tokens, cached)
    ct = tr.chunk_tokens
    if ct > 0:  # TransferModel.chunked_end_ms
        if tokens <= ct:
            ready = [full_ms]
        else:
            ends = np.arange(ct, tokens, ct, dtype=float).tolist()
            ends.append(tokens)
            ready = [p_fixed + p_lin * e + p_sq * e * e for e in ends]
        link_free = 0.0
        prev = 0.0
        for i, r in enumerate(ready, 1):
            cur = min(float(i * ct), tokens)
            link_free = max(link_free, r) + (setup_ms + 1000.0 * (kvb * (cur - prev)) / link)
            prev = cur
        chunked_end = link_free
    else:
        chunked_end = full_ms + serial
    chunked_ms = max(0.0, chunked_end - hit_ms)
    if tokens > 0:
        transfer = chunked_ms if ctx.chunked and ct > 0 else serial
    else:
        transfer = 0.0
    step_cap = ctx.step_cap_ms
    enc = m.encoder
    enc_s = (enc.fixed_ms + enc.ms_per_item * items) / 1000.0 if media > 0 else 0.0
    fixed = enc_s + s_ms / 1000.0 + transfer / 1000.0 + ctx.step1_ms / 1000.0
    return _Setup(
        fixed,
        enc_s,
        s_ms / 1000.0,
        cs2,
        transfer,
        serial,
        chunked_ms,
        kvb * tokens,
        step_cap,
        ctx.b_eff,
        ctx.itl_ok,
        o_mean * step_cap / 1000.0,
        (o_std / o_mean) ** 2,
        media,
        (kvb * tokens) / link,
        (t_std / tokens) ** 2 if tokens > 0 else 0.0,
    )


# --------------------------------------------------------------------------- core


def _prefill_queue(st: _Setup) -> tuple[float, float]:
    """A prefill worker's service time per request and its squared CV, as its queue sees them.

    The worker computes a prompt, hands its KV to its link and computes the next while the
    link sends: a pipeline of two servers, whose capacity is the slower one's. That is the
    compute's on a fast link (the models' defaults: 0.08 s of link for 0.23 s of compute at
    6,000 tokens), the link's on a slow one (1 GiB/s carries 1.8 GiB of KV in 1.8 s), and the
    pool is then sized by its links.
    """
    if st.link_s > st.prefill_s:
        return st.link_s, st.link_cs2
    return st.prefill_s, st.prefill_cs2


def prefill_queue(
    demand: Demand, models: StageModels | None = None, slo: SLO | None = None, chunked: bool = False
) -> tuple[float, float]:
    """(seconds, squared coefficient of variation) of one request's service in the disaggregated
    prefill pool's queue, as the planner's M/G/c sizes it: the compute's, or the KV link's when
    the link is the slower of the two (`_prefill_queue`); over the size classes when `demand`
    has them. With `queueing.mgc_mean_wait` it gives the mean wait the planner expects."""
    return _prefill_queue(_setup(demand, models or _DEFAULT_MODELS, slo or _DEFAULT_SLO, chunked))


def _specs(lam: float, st: _Setup, bounds: dict[str, PoolBounds]) -> tuple[_Spec, _Spec, _Spec]:
    # Allen-Cunneen: the tables' factor (1 + cs2) / 2 becomes (ca2 + cs2) / 2; every stage
    # sees the arrival variability (conservative for decode: a queue smooths its departures)
    a = st.ca2 - 1.0
    prefill_s, prefill_cs2 = _prefill_queue(st)
    return (
        _encoder_spec(lam, st, bounds[POOL_ENCODER], a),
        (lam, prefill_s, prefill_cs2 + a, 1, bounds[POOL_PREFILL], 1.0),
        (lam, st.hold_s, st.hold_cs2 + a, st.b_eff, bounds[POOL_DECODE], 1.0),
    )


def _encoder_spec(lam: float, st: _Setup, bounds: PoolBounds, cs2_extra: float = 0.0) -> _Spec:
    """The encoder's queue at total rate `lam`: the requests with media, their share of all
    requests (`_Spec`; 1 when there are none: no arrivals then, and a share of 1 reads the
    table at the SLO's own tail). ``cs2_extra``: the arrival term Allen-Cunneen adds."""
    share = st.media if st.media > 0 else 1.0
    return (lam * st.media, st.enc_s, ENCODER_CS2 + cs2_extra, 1, bounds, share)


def _spec_table(spec: _Spec, p: float, r_lo: int, r_hi: int) -> _Table:
    """`_table` of one pool's queue for counts r_lo..r_hi."""
    lam, s, cs2, k, _b, share = spec
    return _table(lam, s, cs2, k, r_lo, r_hi, p, share)


def _tables(specs: tuple[_Spec, ...], p: float) -> list[_Table]:
    return [_spec_table(spec, p, spec[4].min_replicas, spec[4].max_replicas) for spec in specs]


_SEARCH_EPS = 1e-12  # `_search`'s tolerance on the summed waits against the slack (rounding)


def _search(tabs: list[_Table], gpus: tuple[int, int, int], slack: float) -> tuple[int, int, int] | None:
    """Fewest GPUs (then fewest replicas, then least wait) with summed percentile waits <= slack.

    Returns indices into the three tables. Every (encoder, prefill) pair takes
    the fewest decode replicas that fit the remaining slack (bisection: decode
    waits fall along the table). Pruned without changing the answer: costs only
    grow along the encoder and prefill tables, so once a pair's cost plus the
    decode minimum exceeds the best cost, no later pair can win.
    """
    (r0e, we, _), (r0p, wpp, _), (r0d, wd, _) = tabs
    if not we or not wpp or not wd:
        return None
    ge, gp, gd = gpus
    eps = _SEARCH_EPS
    neg_d = [-w for w in wd]  # decode waits fall along the table: bisect on the negated list
    floor_d = gd * r0d
    floor_p = gp * r0p
    best: tuple[int, int, float] | None = None
    best_idx: tuple[int, int, int] | None = None
    lim_e = slack + eps
    bl = bisect.bisect_left
    nd = len(wd)
    for i, w_e in enumerate(we):
        if w_e > lim_e:
            continue
        re_ = r0e + i
        ce = ge * re_
        if best is not None and ce + floor_p + floor_d > best[0]:
            break
        for j, w_p in enumerate(wpp):
            rem = slack - w_e - w_p
            if rem < -eps:
                continue
            rp = r0p + j
            cp = ce + gp * rp
            if best is not None and cp + floor_d > best[0]:
                break
            kd = bl(neg_d, -(rem + eps))
            if kd >= nd:
                continue
            rd = r0d + kd
            key = (cp + gd * rd, re_ + rp + rd, w_e + w_p + wd[kd])
            if best is None or key < best:
                best, best_idx = key, (i, j, kd)
    return best_idx


# Each pool's first count whose wait alone fits a slack (`_first_fits`), as (index into its
# table, the table's percentile wait there); a wait of 0.0 is the table's last entry.
_Fit = tuple[int, float]


def _first_fits(
    raws: list[_Raw], gpus: tuple[int, int, int], p: float, slack: float
) -> tuple[int, list[_Fit]] | None:
    """Each pool at its first count whose wait alone fits the slack at percentile p, and their cost.

    Every triple `_search` accepts has each pool's wait within the slack, so the
    cost is a lower bound on its answer's. The waits are read off the Erlang passes
    (no table built): the values `_table_at(raw, p)` would hold, up to that count
    (the table's zero entry ends it and is always within the slack, so the scan sees
    the same list). None exactly when some pool has no count within the slack, when
    `_search` finds nothing. (Decode's first fit by a scan is at or before the count
    `_search`'s bisection could return, so the bound holds whatever the table's shape.)
    """
    lim = slack + 1e-9  # looser than `_search`'s _SEARCH_EPS: rounding can only lower the bound
    log = math.log
    cost = 0
    fits: list[_Fit] = []
    for (r0, pws, gaps, f, share), g in zip(raws, gpus, strict=True):
        tail = _visitor_tail(1.0 - p, share)
        for j, pw in enumerate(pws):
            wait = f * log(pw / tail) / gaps[j] if pw > tail else 0.0
            if wait <= lim:
                break
        else:
            return None
        cost += g * (r0 + j)
        fits.append((j, wait if wait > 0.0 else 0.0))  # the table holds no negative wait
    return cost, fits


def _search_is_first_fits(fits: list[_Fit], slack: float) -> bool:
    """Whether `_search`'s answer at this slack is the first fits' triple (so it need not run).

    It is when `_search` accepts the triple and decode's count waits nothing. Accepted
    by its own tests (the same expressions and tolerance): the encoder's wait within the
    slack, and the rest of the slack, less the prefill's wait, not below -_SEARCH_EPS
    (decode's zero wait fits it). Decode's bisection then lands on that zero entry: it
    ends the table, and every earlier entry is above the slack (it came before the first
    fit). Any accepted triple has each count at or beyond its first fit and every replica
    costs >= 1 GPU, so a triple of the first fits' cost is that triple: the fewest GPUs,
    unique.
    """
    eps = _SEARCH_EPS
    (_, w_e), (_, w_p), (_, w_d) = fits
    return w_d == 0.0 and w_e <= slack + eps and slack - w_e - w_p >= -eps


def _cost(tabs: list[_Table], gpus: tuple[int, int, int], idx: tuple[int, int, int]) -> int:
    return sum((t[0] + i) * g for t, g, i in zip(tabs, gpus, idx, strict=True))


_Sol = tuple[tuple[_Spec, _Spec, _Spec], list[_Table], tuple[int, int, int]]


def _solve(
    lam: float,
    st: _Setup,
    bounds: dict[str, PoolBounds],
    gpus: tuple[int, int, int],
    p: float,
    slack: float,
    budget: int | None,
) -> _Sol | None:
    specs = _specs(lam, st, bounds)
    tabs = _tables(specs, p)
    idx = _search(tabs, gpus, slack)
    if idx is None:
        return None
    if budget is not None and _cost(tabs, gpus, idx) > budget:
        return None
    return specs, tabs, idx


def _new(cls: type[_T], **fields: Any) -> _T:
    """An output dataclass (PoolPlan, Plan) built without its generated ``__init__``.

    They are plain frozen records (no ``__post_init__``; every field passed
    here), and the generated init's per-field ``object.__setattr__`` is ~5 us
    of a ~30 us plan. Equal to ``cls(**fields)``; tests/unit/test_planner.py checks.
    """
    obj = object.__new__(cls)
    obj.__dict__.update(fields)
    return obj


def _pool_plan(name: str, spec: _Spec, r: int, wait_p: float, wait_mean: float) -> PoolPlan:
    lam, service_s, _cs2, k, b, _visiting = spec
    c = r * k
    cap = k / service_s if service_s > 0 else math.inf
    util = lam * service_s / c if c > 0 else (0.0 if lam == 0 else math.inf)
    return _new(
        PoolPlan,
        name=name,
        replicas=r,
        gpus=r * b.gpus_per_replica,
        gpus_per_replica=b.gpus_per_replica,
        servers_per_replica=k,
        arrival_rps=lam,
        service_s=service_s,
        capacity_rps=cap,
        utilization=util,
        wait_mean_s=wait_mean,
        wait_p_s=wait_p,
        queue_len=lam * wait_mean,
        in_service=lam * service_s,
    )


def _bounds(bounds: dict[str, PoolBounds] | None) -> dict[str, PoolBounds]:
    if not bounds:
        return DEFAULT_BOUNDS
    out = dict(DEFAULT_BOUNDS)
    for k, v in bounds.items():
        if k not in out:
            raise ValueError(f"bounds: unknown pool {k!r} (expected one of {sorted(out)})")
        if not isinstance(v, PoolBounds):
            raise ValueError(f"bounds[{k!r}] must be a PoolBounds")
        out[k] = v
    return out


def _check_budget(budget: int | None) -> int | None:
    if budget is None:
        return None
    _num("gpu_budget", budget, positive=True, integer=True)
    return int(budget)


def _admit(lam: float, feasible_at: Any, full_known_bad: bool = False) -> tuple[float, Any]:
    """Largest admitted rate f x lam (f in [0, 1]) for which feasible_at(rate) is not None."""
    if not full_known_bad:
        full = feasible_at(lam)
        if full is not None:
            return 1.0, full
    zero = feasible_at(0.0)
    if zero is None:
        return 0.0, None
    lo, hi, sol = 0.0, 1.0, zero
    for _ in range(30):
        mid = (lo + hi) / 2
        got = feasible_at(lam * mid)
        if got is not None:
            lo, sol = mid, got
        else:
            hi = mid
        if hi - lo < 1e-4:
            break
    return lo, sol


def _plan_disagg(
    d: Demand,
    m: StageModels,
    slo: SLO,
    bounds: dict[str, PoolBounds],
    budget: int | None,
    chunked: bool,
) -> Plan:
    p = slo.percentile
    ctx = _ctx(m, slo, chunked)
    st = _shape(ctx, d)
    target = _ttft_target(slo, d)
    reasons: list[str] = []
    eb, pb, db = bounds[POOL_ENCODER], bounds[POOL_PREFILL], bounds[POOL_DECODE]
    gpus = (eb.gpus_per_replica, pb.gpus_per_replica, db.gpus_per_replica)
    pick: _Pick | None = None
    if st.covers is not None:  # size classes: p and the target become the chosen candidate's
        pick = _pick_cover(st, d.arrival_rps, bounds, gpus, p, target)
        st, p, target = pick.st, pick.percentile, pick.target
    slack = target - st.fixed_s
    best_itl = ctx.step1_ms / 1000.0
    if slack < 0:
        reasons.append(
            f"TTFT target {target:.3g}s is below the bare pipeline latency {st.fixed_s:.4g}s "
            "(services + transfer + one decode step)"
        )
    if not st.itl_ok:
        reasons.append(f"ITL target {slo.itl_s:.3g}s is below one decode step at batch 1 ({best_itl:.4g}s)")
    slo_ok = not reasons
    eff_slack = max(slack, 0.0)

    if budget is not None:
        min_cost = sum(b.min_replicas * b.gpus_per_replica for n, b in bounds.items() if n in POOLS)
        if budget < min_cost:
            raise ValueError(f"gpu_budget ({budget}) is below the pools' minimum GPUs ({min_cost})")

    lam = d.arrival_rps
    specs_full = _specs(lam, st, bounds)
    # the size-class pick's tables are these (same specs and percentile; `_table_at` == `_table`)
    tabs_full = pick.tabs if pick is not None and pick.tabs is not None else _tables(specs_full, p)
    (_, w_e, _), (_, w_p, _), (_, w_d, _) = tabs_full
    # best TTFT these bounds allow: each pool at its largest table entry
    best_ttft = st.fixed_s + (w_e[-1] + w_p[-1] + w_d[-1]) if w_e and w_p and w_d else math.inf
    # the pick searched its tables at this slack already (max(0, target - fixed_s))
    idx_full = pick.idx if pick is not None and pick.idx is not None else _search(tabs_full, gpus, eff_slack)
    sol: _Sol | None
    if idx_full is not None and (budget is None or _cost(tabs_full, gpus, idx_full) <= budget):
        frac, sol = 1.0, (specs_full, tabs_full, idx_full)
    else:

        def at(rate: float) -> _Sol | None:
            return _solve(rate, st, bounds, gpus, p, eff_slack, budget)

        frac, sol = _admit(lam, at, full_known_bad=True)
    budget_limited = frac < 1.0 and budget is not None and idx_full is not None
    if sol is None:  # cannot happen: rate 0 always fits min bounds
        raise RuntimeError("planner: no plan even at zero load")
    specs, tabs, idx = sol
    sacrificed = ""
    if frac < 1.0:
        shed = lam * (1 - frac)
        if budget_limited:
            reasons.append(f"gpu_budget {budget} admits {frac:.1%} of {lam:.4g} rps within the SLO")
        else:
            caps = [n for n, t in zip(POOLS, tabs_full, strict=True) if not t[1] or t[1][-1] > eff_slack]
            reasons.append(
                f"maxReplicas of {', '.join(caps) or 'the pools'} admit {frac:.1%} of "
                f"{lam:.4g} rps within the SLO"
            )
        sacrificed = (
            f"shed {shed:.4g} rps ({1 - frac:.1%} of demand) at admission; the admitted "
            f"{lam * frac:.4g} rps meet TTFT/ITL"
        )
    (r0e, wpe, wme), (r0p, wpp, wmp), (r0d, wpd, wmd) = tabs
    ie, ip, i_d = idx
    enc = _pool_plan(POOL_ENCODER, specs[0], r0e + ie, wpe[ie], wme[ie])
    pre = _pool_plan(POOL_PREFILL, specs[1], r0p + ip, wpp[ip], wmp[ip])
    dec = _pool_plan(POOL_DECODE, specs[2], r0d + i_d, wpd[i_d], wmd[i_d])
    pools = {POOL_ENCODER: enc, POOL_PREFILL: pre, POOL_DECODE: dec}
    ttft = st.fixed_s + (wpe[ie] + wpp[ip] + wpd[i_d])
    # ITL at the expected decode occupancy, capped at the effective batch
    lam_adm = lam * frac
    n_occ = 0.0
    if dec.replicas > 0 and lam_adm > 0:
        o = d.output_tokens_mean
        denom = 1000.0 * dec.replicas - lam_adm * o * m.decode.step_ms_per_seq
        n_occ = st.b_eff if denom <= 0 else min(st.b_eff, lam_adm * o * m.decode.step_fixed_ms / denom)
    itl = _decode_itl(ctx, n_occ)
    pr = pre.replicas
    stages_out = {
        "encoder.service_ms": st.enc_s * 1000.0,
        "prefill.service_ms": st.prefill_s * 1000.0,
        "prefill.service_cv": math.sqrt(st.prefill_cs2),
        "transfer.kv_bytes": st.kv_bytes,
        "transfer.serial_ms": st.serial_ms,
        "transfer.chunked_ms": st.chunked_ms,
        "transfer.used_ms": st.transfer_ms,
        # the time one request's KV occupies its prefill worker's link (setup excluded): the
        # pool is sized by the larger of it and prefill.service_ms (`_prefill_queue`)
        "transfer.link_busy_ms": st.link_s * 1000.0,
        "decode.step_ms": st.step_cap_ms,
        "decode.batch_cap": float(st.b_eff),
        "decode.expected_batch": n_occ,
        "decode.slot_hold_s": st.hold_s,
        **_kv_stages(m, st),
    }
    if pick is not None and st.covers is not None:
        stages_out["sizes.wait_percentile"] = p
        stages_out["sizes.covered_fraction"] = pick.covered
        stages_out["sizes.mixture_miss"] = math.nan if pick.miss is None else pick.miss
        stages_out["sizes.idle_miss_fraction"] = st.covers.idle_miss_fraction
        stages_out["sizes.arrival_ca2"] = st.ca2
    return _new(
        Plan,
        placement="disaggregated",
        pools=pools,
        stages=stages_out,
        ttft_s=ttft,
        itl_s=itl,
        percentile=slo.percentile,
        decode_per_prefill=dec.replicas / pr if pr else None,
        encoder_per_prefill=enc.replicas / pr if pr else None,
        capacity_ratio=(dec.service_s / dec.servers_per_replica) / st.prefill_s if st.prefill_s > 0 else None,
        total_gpus=enc.gpus + pre.gpus + dec.gpus,
        gpu_budget=budget,
        feasible=slo_ok and frac >= 1.0,
        reason="; ".join(reasons) if reasons else "ok",
        best_ttft_s=best_ttft,
        best_itl_s=best_itl,
        budget_limited=budget_limited,
        admitted_fraction=frac,
        goodput_rps=lam * frac if slo_ok else 0.0,
        shed_rps=lam * (1 - frac),
        sacrificed=sacrificed,
        interference_ms=0.0,
        split_threshold_tokens=None,
        remote_fraction=None,
        demand=d,
        slo=slo,
        decode_bound=st.decode_bound,
    )


def _kv_stages(m: StageModels, st: _Setup) -> dict[str, float]:
    """The decode worker's KV figures for `Plan.stages` (docs/planner.md, "Decode KV capacity")."""
    return {
        "decode.kv_cache_tokens": float(m.decode.kv_cache_tokens),
        "decode.kv_footprint_tokens": st.kv_footprint,
        "decode.kv_slots": float(st.kv_slots),
    }


# --------------------------------------------------------------------------- colocated


def _decode_itl(ctx: _Ctx, n_occ: float) -> float:
    """ITL at the percentile on a decode replica holding n_occ sequences on average, by the SLO's statistic.

    A request sees itself plus ~Poisson(n_occ) others (arrivals see time
    averages). Mean: the step at that mean batch. Max and p99: the step at the
    batch's percentile (its largest gaps come from its fullest steps). Capped at
    the batch the ITL target allows (the planner's decode servers per replica).
    """
    if ctx.flat_step:  # every batch steps alike: no batch percentile to find
        return ctx.step1_ms / 1000.0
    if ctx.slo.itl_statistic == "mean" or n_occ + 1.0 >= ctx.b_eff:
        batch = 1.0 + n_occ
    else:
        batch = 1.0 + poisson_quantile(ctx.slo.percentile, n_occ)
    return ctx.step_ms(min(float(ctx.b_eff), max(1.0, batch))) / 1000.0


def _colocated_itl(lam_r: float, u: float, d: Demand, slo: SLO, st: _Setup) -> float:
    """ITL at the percentile, by the SLO's statistic of a request's gaps, on a colocated replica.

    Every local prefill started while a request decodes stalls it once: that gap
    is ``step + prefill``, the others one step (`_stall_itl`, with the step at
    the batch cap).
    """
    n = max(0, round(d.output_tokens_mean) - 1)
    return _stall_itl(st.step_cap_ms / 1000.0, lam_r, u, n, st.prefill_s, st.prefill_cs2, slo)


def _stall_itl(
    step: float,
    lam_r: float,
    u: float,
    n: int,
    stall_s: float,
    stall_cs2: float,
    slo: SLO,
    stall_cap_s: float = math.inf,
) -> float:
    """ITL at the percentile, by the SLO's statistic, of a request decoding beside local prefills.

    Local prefills start on the request's worker at `lam_r` per second and each
    one started while the request decodes stalls it once (gap ``step +
    prefill``); the other gaps are one `step`. Its n gaps span ``T = n step /
    (1 - u)`` (decode runs only while the worker is not prefilling, u = its
    prefill share), in which ~Poisson(lam_r T) prefills start. Mean: the
    percentile stall count spread over n gaps. Max: a breach unless the
    percentile request sees no stall. p99: unless it sees at most the
    n - ceil(0.99 n) stalls its top 1 % of gaps may hold. A visible stall is
    the prefill of a prompt at the percentile (normal approximation of the
    prefill-time spread), at most `stall_cap_s` (the longest prompt prefilled
    locally, when there is one).
    """
    if n == 0 or lam_r <= 0:
        return step
    stalls = lam_r * n * step / (1.0 - u)
    p = slo.percentile
    stat = slo.itl_statistic
    if stat == "mean":
        return step + poisson_quantile(p, stalls) * stall_s / n
    allowed = 0 if stat == "max" else n - gap_p99_rank(n)
    if poisson_cdf(allowed, stalls) >= p:
        return step
    return step + min(stall_s * (1.0 + _z(p) * math.sqrt(stall_cs2)), stall_cap_s)


@functools.lru_cache(maxsize=64)
def _z(p: float) -> float:
    """Standard normal p-quantile (bisection on erfc; p in (0, 1))."""
    lo, hi = -10.0, 10.0
    for _ in range(80):
        mid = (lo + hi) / 2
        if 0.5 * math.erfc(-mid / math.sqrt(2.0)) < p:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def _local_prefill_wait(
    lam_pf_r: float,
    lam_r: float,
    hold: float,
    prefill_s: float,
    prefill_cs2: float,
    step_s: float,
    p: float,
    ca2: float = 1.0,
) -> float | None:
    """Percentile wait of a local prefill on one serving worker, or None if its prefill queue is unstable.

    The worker runs its local prefills (`lam_pf_r` per second) one at a time,
    FCFS, with one decode step between consecutive prefills and each starting
    only at a step boundary: an M/G/1 with service prefill + step, and a wait
    of at least the running step's remainder (uniform over a step while the
    worker decodes, which it does with probability 1 - exp(-lam_r hold):
    Poisson occupancy of the `lam_r` per second sequences it serves). `ca2`: the
    arrivals' squared coefficient of variation (Allen-Cunneen; 1 for Poisson).
    """
    s_eff = prefill_s + step_s  # a decode step runs between consecutive local prefills
    if lam_pf_r * s_eff >= 1.0:
        return None
    cs2_eff = prefill_cs2 * (prefill_s / s_eff) ** 2
    r0, w_pf, _ = _table(lam_pf_r, s_eff, cs2_eff + ca2 - 1.0, 1, 1, 1, p)
    if r0 != 1 or not w_pf:
        return None
    busy = 1.0 - math.exp(-lam_r * hold)
    residual = step_s * (1.0 - (1.0 - p) / busy) if busy > 1.0 - p else 0.0
    return max(w_pf[0], residual)


def _colocated_eval(
    r: int, lam: float, d: Demand, m: StageModels, slo: SLO, st: _Setup
) -> tuple[float, float, float, float, float, float] | None:
    """(ttft_p, itl_p, prefill util, w_pf, w_slot, hold) for r colocated replicas, or None if unstable.

    Requests are spread over the replicas (least sequences first), each of which
    runs its local prefills one at a time, FCFS, with one decode step between
    consecutive prefills and each starting only at a step boundary: an M/G/1
    per replica with service prefill + step, and a wait of at least the
    running step's remainder (uniform over a step while the replica decodes,
    which it does with probability 1 - exp(-lam_r hold): Poisson occupancy).
    """
    if r <= 0:
        return None if lam > 0 else (st.fixed_s, st.step_cap_ms / 1000.0, 0.0, 0.0, 0.0, st.hold_s)
    p = slo.percentile
    step_s = st.step_cap_ms / 1000.0
    lam_r = lam / r
    u = lam_r * st.prefill_s
    if lam_r * (st.prefill_s + step_s) >= 1.0:
        return None
    hold = st.hold_s / (1.0 - u)  # decode runs only when the worker is not prefilling
    wp_ = _local_prefill_wait(lam_r, lam_r, hold, st.prefill_s, st.prefill_cs2, step_s, p, st.ca2)
    w_sl = _table(lam, hold, st.hold_cs2 + st.ca2 - 1.0, st.b_eff, r, r, p)[1]
    if wp_ is None or not w_sl:
        return None
    wp, ws = wp_, w_sl[0]
    ttft = st.enc_s + wp + st.prefill_s + ws + float(m.decode.step_ms(1)) / 1000.0
    return ttft, _colocated_itl(lam_r, u, d, slo, st), u, wp, ws, hold


def _plan_colocated(
    d: Demand, m: StageModels, slo: SLO, bounds: dict[str, PoolBounds], budget: int | None
) -> Plan:
    """Colocated workers (prefill and decode on one pool), behind the encoder pool when there is media.

    The encoder's percentile wait adds to the colocated TTFT: for every encoder
    row (fewest replicas first) the fewest colocated replicas that fit the rest,
    the cheapest pair wins.
    """
    st = _setup(d, m, slo, chunked=False)
    st = st._replace(fixed_s=st.enc_s + st.prefill_s + float(m.decode.step_ms(1)) / 1000.0)
    b = bounds[POOL_COLOCATED]
    eb = bounds[POOL_ENCODER]
    ge, gc = eb.gpus_per_replica, b.gpus_per_replica
    min_cost = b.min_replicas * gc + eb.min_replicas * ge
    if budget is not None and budget < min_cost:
        raise ValueError(f"gpu_budget ({budget}) is below the pools' minimum GPUs ({min_cost})")
    ttft_target = _ttft_target(slo, d)

    def ok(r: int, lam: float, extra: float) -> bool:
        e = _colocated_eval(r, lam, d, m, slo, st)
        return e is not None and e[0] + extra <= ttft_target + 1e-12 and e[1] <= slo.itl_s + 1e-12

    def min_r(lam: float, extra: float, r_cap: int) -> int | None:
        lo = b.min_replicas
        if ok(lo, lam, extra):
            return lo
        if r_cap < lo or not ok(r_cap, lam, extra):
            return None
        hi = r_cap
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if ok(mid, lam, extra):
                hi = mid
            else:
                lo = mid
        return hi

    def solve(lam: float) -> tuple[int, int, float] | None:
        """(encoder replicas, colocated replicas, encoder wait) of the fewest GPUs at rate `lam`."""
        r0e, we, _ = _tables((_encoder_spec(lam, st, eb),), p)[0]
        best: tuple[int, int, int, float] | None = None
        for i, w_e in enumerate(we):
            re_ = r0e + i
            r_cap = b.max_replicas if budget is None else min(b.max_replicas, (budget - ge * re_) // gc)
            if best is not None and ge * re_ + gc * b.min_replicas > best[0]:
                break
            r = min_r(lam, w_e, r_cap)
            if r is not None and (best is None or ge * re_ + gc * r < best[0]):
                best = (ge * re_ + gc * r, re_, r, w_e)
        return None if best is None else (best[1], best[2], best[3])

    p = slo.percentile
    reasons: list[str] = []
    lam = d.arrival_rps
    got = solve(lam)
    frac = 1.0
    if got is None:
        lo_f, hi_f = 0.0, 1.0
        got = solve(0.0)
        for _ in range(30):
            mid = (lo_f + hi_f) / 2
            g = solve(lam * mid)
            if g is not None:
                lo_f, got = mid, g
            else:
                hi_f = mid
            if hi_f - lo_f < 1e-4:
                break
        frac = lo_f
        r_cap_all = b.max_replicas if budget is None else min(b.max_replicas, budget // gc)
        if got is None:  # even zero load misses the SLO (latency floor): size for stability
            r = max(b.min_replicas, min(r_cap_all, int(lam * st.prefill_s / 0.9) + 1))
            got = (eb.min_replicas, r, 0.0)
            frac = 0.0
            reasons.append(
                f"colocated latency floor (TTFT {st.fixed_s:.4g}s, ITL with a prefill stall "
                f"{(st.step_cap_ms / 1000 + st.prefill_s):.4g}s) misses the SLO at any replica count"
            )
        elif budget is not None and r_cap_all < b.max_replicas:
            reasons.append(f"gpu_budget {budget} admits {frac:.1%} of {lam:.4g} rps within the SLO")
        else:
            reasons.append(f"colocated maxReplicas admits {frac:.1%} of {lam:.4g} rps within the SLO")
    r_enc, r, w_enc = got
    r_cap = b.max_replicas if budget is None else min(b.max_replicas, budget // gc)
    lam_adm = lam * frac if frac > 0 else lam
    ev = _colocated_eval(r, lam_adm, d, m, slo, st)
    ttft, itl, _u, wp, ws, hold = ev if ev is not None else (math.inf, math.inf, 1.0, math.inf, math.inf, 0)
    ttft += w_enc
    enc_spec = _encoder_spec(lam_adm, st, eb)
    enc_tab = _spec_table(enc_spec, slo.percentile, r_enc, r_enc)
    enc = _pool_plan(
        POOL_ENCODER,
        enc_spec,
        r_enc,
        enc_tab[1][0] if enc_tab[1] else math.inf,
        enc_tab[2][0] if enc_tab[2] else math.inf,
    )
    k = st.b_eff
    cap = 1.0 / (st.prefill_s + d.output_tokens_mean * st.step_cap_ms / 1000.0 / k)
    pool = PoolPlan(
        name=POOL_COLOCATED,
        replicas=r,
        gpus=r * b.gpus_per_replica,
        gpus_per_replica=b.gpus_per_replica,
        servers_per_replica=k,
        arrival_rps=lam_adm,
        service_s=st.prefill_s,
        capacity_rps=cap,
        utilization=min(1.0, lam_adm / (cap * r)) if r else 0.0,
        wait_mean_s=wp,
        wait_p_s=wp + ws,
        queue_len=lam_adm * (wp + ws),
        in_service=lam_adm * (st.prefill_s + hold),
    )
    feasible = frac >= 1.0 and not reasons
    sacrificed = ""
    if frac < 1.0:
        sacrificed = f"shed {lam * (1 - frac):.4g} rps ({1 - frac:.1%} of demand) at admission"
    return Plan(
        placement="colocated",
        pools={POOL_ENCODER: enc, POOL_COLOCATED: pool},
        stages={
            "encoder.service_ms": st.enc_s * 1000.0,
            "prefill.service_ms": st.prefill_s * 1000.0,
            "prefill.service_cv": math.sqrt(st.prefill_cs2),
            "transfer.kv_bytes": 0.0,
            "transfer.serial_ms": st.serial_ms,
            "transfer.chunked_ms": st.chunked_ms,
            "transfer.used_ms": 0.0,
            "decode.step_ms": st.step_cap_ms,
            "decode.batch_cap": float(k),
            "decode.expected_batch": float("nan"),
            "decode.slot_hold_s": hold,
            **_kv_stages(m, st),
        },
        ttft_s=ttft,
        itl_s=itl,
        percentile=slo.percentile,
        decode_per_prefill=None,
        encoder_per_prefill=None,
        capacity_ratio=None,
        total_gpus=pool.gpus + enc.gpus,
        gpu_budget=budget,
        feasible=feasible,
        reason="; ".join(reasons) if reasons else "ok",
        best_ttft_s=st.fixed_s,
        best_itl_s=float(m.decode.step_ms(1)) / 1000.0,
        budget_limited=budget is not None and frac < 1.0 and r_cap < b.max_replicas,
        admitted_fraction=frac,
        goodput_rps=lam * frac,
        shed_rps=lam * (1 - frac),
        sacrificed=sacrificed,
        interference_ms=st.prefill_s * 1000.0,
        split_threshold_tokens=None,
        remote_fraction=None,
        demand=d,
        slo=slo,
        decode_bound=st.decode_bound,
    )


# --------------------------------------------------------------------------- conditional


def split_threshold_tokens(
    models: StageModels | None = None,
    slo: SLO | None = None,
    cached_fraction: float = 0.0,
    max_tokens: float = 10_000_000.0,
) -> float:
    """Prompt tokens above which remote prefill + transfer beats colocated prefill.

    A colocated prefill of t tokens stalls every decode sequence on its worker
    for prefill_ms(t): the neighbours' inter-token gap becomes step + prefill_ms(t).
    Remote prefill pays the transfer instead and leaves the neighbours' ITL at
    one step. Remote wins once the stall breaches the ITL target, i.e. above
    the largest t with step(1) + prefill_ms(t) <= itl target. Returns 0 when
    even an empty prompt breaches it, ``max_tokens`` when none does.
    (Worked example: (150 - 45 - 20) / 0.035 ~ 2,428.6 tokens.)
    """
    m = models or _DEFAULT_MODELS
    s = slo or _DEFAULT_SLO
    _num("cached_fraction", cached_fraction, unit=True)
    budget_ms = s.itl_s * 1000.0 - float(m.decode.step_ms(1))

    def stall(t: float) -> float:
        return float(m.prefill.service_ms(t, cached_fraction * t))

    if stall(0.0) > budget_ms:
        return 0.0
    if stall(max_tokens) <= budget_ms:
        return max_tokens
    pf = m.prefill
    if pf.ms_per_token_sq == 0.0:
        return (budget_ms - pf.fixed_ms) / (pf.ms_per_token * (1 - cached_fraction))
    lo, hi = 0.0, max_tokens
    for _ in range(200):
        mid = (lo + hi) / 2
        if stall(mid) <= budget_ms:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-6:
            break
    return lo


def _remote_fraction(d: Demand, threshold: float) -> float:
    """P(prompt tokens > threshold) under a normal approximation of the prompt length."""
    if d.prompt_tokens_std <= 0:
        return 1.0 if d.prompt_tokens_mean > threshold else 0.0
    z = (threshold - d.prompt_tokens_mean) / d.prompt_tokens_std
    return 0.5 * math.erfc(z / math.sqrt(2.0))


def _split_shape(d: Demand, threshold: float, above: bool) -> Demand:
    """The demand's prompt shape above (remote) or at and below (local) the threshold.

    Mean and standard deviation of the normal prompt length truncated at the
    threshold (inverse Mills ratio); a fixed prompt length keeps its own shape.
    """
    mean, std = d.prompt_tokens_mean, d.prompt_tokens_std
    if std <= 0:
        return d
    z = (threshold - mean) / std
    pdf = math.exp(-0.5 * z * z) / math.sqrt(2.0 * math.pi)
    share = 0.5 * math.erfc((z if above else -z) / math.sqrt(2.0))
    if share <= 1e-12:  # (almost) no prompt on this side: its shape is the threshold itself
        return replace(d, prompt_tokens_mean=max(0.0, threshold), prompt_tokens_std=0.0)
    mills = pdf / share
    if above:
        m, var = mean + std * mills, std * std * (1.0 + z * mills - mills * mills)
    else:
        m, var = mean - std * mills, std * std * (1.0 - z * mills - mills * mills)
    return replace(d, prompt_tokens_mean=max(0.0, m), prompt_tokens_std=math.sqrt(max(0.0, var)))


class _CondSol(NamedTuple):
    """One conditional solution: replicas, waits and the decode pool's local-prefill load."""

    gpus: int
    encoder: int
    prefill: int
    decode: int
    w_enc: float
    w_pre: float
    w_dec: float
    w_local: float
    local_util: float  # share of a decode worker's time spent on local prefills
    hold_s: float  # decode slot hold, stretched by the local prefills
    n_occ: float  # expected decode batch (sequences per worker)
    itl_s: float  # ITL at the percentile, local-prefill stalls included


class _CondDecode(NamedTuple):
    """The decode pool of a conditional plan at one replica count (see `_cond_decode`)."""

    u: float
    hold_s: float
    n_occ: float
    itl_s: float


def _cond_decode(
    r_d: int,
    rate: float,
    lam_l: float,
    st_r: _Setup,
    st_l: _Setup,
    ctx: _Ctx,
    n_gaps: int,
    stall_cap_s: float,
) -> _CondDecode:
    """Local-prefill share, slot hold, batch and ITL of `r_d` > 0 decode workers (local queue stable).

    Every request holds a decode slot; the local ones (`lam_l` of `rate`) are
    first prefilled on their decode worker, which does not step its batch
    meanwhile: with u = local prefill load per worker a slot is held
    hold / (1 - u). ITL: the step at the batch the request shares
    (`_decode_itl`) plus the stalls of the local prefills started on its worker
    while it decodes, by the SLO's statistic (`_stall_itl`, as colocated).
    """
    u = lam_l * st_l.prefill_s / r_d
    hold = st_r.hold_s / (1.0 - u)
    n_occ = min(float(st_r.b_eff), rate * hold / r_d)
    step = _decode_itl(ctx, n_occ)
    itl = _stall_itl(step, lam_l / r_d, u, n_gaps, st_l.prefill_s, st_l.prefill_cs2, ctx.slo, stall_cap_s)
    return _CondDecode(u, hold, n_occ, itl)


def _solve_conditional(
    rate: float,
    remote: float,
    st_r: _Setup,
    st_l: _Setup,
    ctx: _Ctx,
    bounds: dict[str, PoolBounds],
    slack_r: float,
    slack_l: float,
    budget: int | None,
    n_gaps: int,
    stall_cap_s: float,
) -> _CondSol | None:
    """Fewest GPUs for `rate` req/s of which the share `remote` is prefilled on the prefill pool.

    The local share runs on the decode workers as on colocated ones: per worker
    an M/G/1 local prefill queue with service prefill + step and a step-boundary
    wait (`_local_prefill_wait`), slots held 1/(1 - u) longer, and ITL with the
    local prefills' stalls (`_cond_decode`), which must fit the target. Both
    paths must fit the TTFT target at the percentile: remote = encoder wait +
    prefill wait + decode slot wait within `slack_r`; local = encoder wait +
    local prefill wait + decode slot wait within `slack_l`. Decode replicas are
    scanned upward from the fewest whose ITL fits (found by bisection: ITL does
    not grow with the count), each with its own u, and for each the cheapest
    encoder and prefill rows that fit.
    """
    p = ctx.slo.percentile
    eb, pb, db = bounds[POOL_ENCODER], bounds[POOL_PREFILL], bounds[POOL_DECODE]
    ge, gp, gd = eb.gpus_per_replica, pb.gpus_per_replica, db.gpus_per_replica
    lam_r, lam_l = rate * remote, rate * (1.0 - remote)
    r0e, we, _ = _tables((_encoder_spec(rate, st_r, eb),), p)[0]
    r0p, wpp, _ = _table(lam_r, *_prefill_queue(st_r), 1, pb.min_replicas, pb.max_replicas, p)
    if not we or not wpp:
        return None
    neg_p = [-w for w in wpp]  # prefill waits fall along the table: bisect on the negated list
    eps = 1e-12
    # ITL below one step at batch 1 is reported by the caller; the plan then ignores it
    itl_max = ctx.slo.itl_s + 1e-12 if ctx.itl_ok else math.inf
    step_s = st_l.step_cap_ms / 1000.0
    floor_ep = ge * r0e + gp * r0p
    best: tuple[tuple[int, int, float], _CondSol] | None = None
    # a decode worker's local prefill queue is stable while lam_l / r_d x (prefill + step) < 1
    r_start = max(db.min_replicas, int(lam_l * (st_l.prefill_s + step_s)) + 1 if lam_l > 0 else 0)
    if r_start > db.max_replicas:
        return None

    def decode_at(r_d: int) -> _CondDecode:
        if r_d == 0:  # only at zero load (r_start > 0 otherwise)
            return _CondDecode(0.0, st_r.hold_s, 0.0, _decode_itl(ctx, 0.0))
        return _cond_decode(r_d, rate, lam_l, st_r, st_l, ctx, n_gaps, stall_cap_s)

    if decode_at(r_start).itl_s > itl_max:
        if decode_at(db.max_replicas).itl_s > itl_max:
            return None  # the local prefills' stalls breach the ITL target at every allowed count
        lo, hi = r_start, db.max_replicas
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if decode_at(mid).itl_s > itl_max:
                lo = mid
            else:
                hi = mid
        r_start = hi
    for r_d in range(r_start, db.max_replicas + 1):
        cost_d = gd * r_d
        if best is not None and cost_d + floor_ep > best[0][0]:
            break
        if budget is not None and cost_d + floor_ep > budget:
            break
        dec = decode_at(r_d)
        if dec.itl_s > itl_max:
            continue
        r0d, wd, _ = _table(rate, dec.hold_s, st_r.hold_cs2, st_r.b_eff, r_d, r_d, p)
        if not wd or r0d != r_d:
            continue
        if r_d == 0:
            w_l: float | None = 0.0
        else:
            w_l = _local_prefill_wait(
                lam_l / r_d, rate / r_d, dec.hold_s, st_l.prefill_s, st_l.prefill_cs2, step_s, p
            )
        if w_l is None:
            continue
        w_d = wd[0]
        found = False
        for i, w_e in enumerate(we):
            ce = ge * (r0e + i)
            if best is not None and ce + gp * r0p + cost_d > best[0][0]:
                break
            if w_e + w_l + w_d > slack_l + eps:
                continue
            rem = slack_r - w_e - w_d
            j = bisect.bisect_left(neg_p, -(rem + eps))
            if j >= len(wpp):
                continue
            cost = ce + gp * (r0p + j) + cost_d
            if budget is not None and cost > budget:
                continue
            key = (cost, r0e + i + r0p + j + r_d, w_e + wpp[j] + w_d)
            if best is None or key < best[0]:
                sol = _CondSol(
                    cost,
                    r0e + i,
                    r0p + j,
                    r_d,
                    w_e,
                    wpp[j],
                    w_d,
                    w_l,
                    dec.u,
                    dec.hold_s,
                    dec.n_occ,
                    dec.itl_s,
                )
                best = (key, sol)
            found = True
        if not found and w_d <= 0.0 and w_l <= 0.0:
            break  # no decode-side wait left to shrink (and ITL fits): more decode workers cannot help
    return None if best is None else best[1]


def _plan_conditional(
    d: Demand,
    m: StageModels,
    slo: SLO,
    bounds: dict[str, PoolBounds],
    budget: int | None,
    chunked: bool,
    threshold: float,
) -> Plan:
    """Prefill and decode pools (and the encoder) when prompts above `threshold` go remote.

    Prompts above the threshold are prefilled on the prefill pool and their KV sent to
    decode; shorter ones are prefilled on the decode worker that serves them (no transfer),
    which adds their prefill time to that pool's load. See `_solve_conditional`.
    """
    remote = _remote_fraction(d, threshold)
    if remote >= 1.0:  # every prompt goes remote: exactly the disaggregated plan
        pl = _plan_disagg(d, m, slo, bounds, budget, chunked)
        return replace(pl, placement="conditional", split_threshold_tokens=threshold, remote_fraction=1.0)
    ctx = _ctx(m, slo, chunked)
    st_r = _shape(ctx, _split_shape(d, threshold, above=True))
    st_l = _shape(ctx, _split_shape(d, threshold, above=False))
    step1_s = ctx.step1_ms / 1000.0
    local_fixed = st_l.enc_s + st_l.prefill_s + step1_s
    reasons: list[str] = []
    slack_r = slo.ttft_s - st_r.fixed_s if remote > 0 else math.inf
    slack_l = slo.ttft_s - local_fixed
    if min(slack_r, slack_l) < 0:
        reasons.append(
            f"TTFT target {slo.ttft_s:.3g}s is below the bare pipeline latency "
            f"{max(st_r.fixed_s if remote > 0 else 0.0, local_fixed):.4g}s"
        )
    if not st_r.itl_ok:
        reasons.append(f"ITL target {slo.itl_s:.3g}s is below one decode step at batch 1 ({step1_s:.4g}s)")
    slo_ok = not reasons
    eff_r = max(slack_r, 0.0)
    # Below the floor the pools are sized to reach it: zero waits, except that a local prefill may
    # wait for the running decode step to end (at most one step), which only a decode pool idle
    # most of the time avoids (hundreds of workers for a few req/s)
    eff_l = slack_l if slack_l >= 0 else st_l.step_cap_ms / 1000.0
    eb, pb, db = bounds[POOL_ENCODER], bounds[POOL_PREFILL], bounds[POOL_DECODE]
    if budget is not None:
        min_cost = sum(b.min_replicas * b.gpus_per_replica for b in (eb, pb, db))
        if budget < min_cost:
            raise ValueError(f"gpu_budget ({budget}) is below the pools' minimum GPUs ({min_cost})")
    lam = d.arrival_rps

    n_gaps = max(0, round(d.output_tokens_mean) - 1)
    # a local prompt is at most the threshold: its prefill bounds the stall a neighbour sees
    stall_cap_s = float(m.prefill.service_ms(threshold, d.prefix_hit_rate * threshold)) / 1000.0

    def at(rate: float) -> _CondSol | None:
        return _solve_conditional(
            rate, remote, st_r, st_l, ctx, bounds, eff_r, eff_l, budget, n_gaps, stall_cap_s
        )

    frac, sol = _admit(lam, at)
    if sol is None:  # cannot happen: rate 0 fits the minimum bounds
        raise RuntimeError("planner: no conditional plan even at zero load")
    unbounded = None
    if frac < 1.0 and budget is not None:
        unbounded = _solve_conditional(
            lam, remote, st_r, st_l, ctx, bounds, eff_r, eff_l, None, n_gaps, stall_cap_s
        )
    budget_limited = frac < 1.0 and unbounded is not None
    sacrificed = ""
    if frac < 1.0:
        if budget_limited:
            reasons.append(f"gpu_budget {budget} admits {frac:.1%} of {lam:.4g} rps within the SLO")
        else:
            reasons.append(f"maxReplicas of the pools admit {frac:.1%} of {lam:.4g} rps within the SLO")
        sacrificed = (
            f"shed {lam * (1 - frac):.4g} rps ({1 - frac:.1%} of demand) at admission; the admitted "
            f"{lam * frac:.4g} rps meet TTFT/ITL"
        )
    lam_adm = lam * frac
    u = sol.local_util
    hold = sol.hold_s
    enc = _pool_plan(
        POOL_ENCODER,
        _encoder_spec(lam_adm, st_r, eb),
        sol.encoder,
        sol.w_enc,
        sol.w_enc,
    )
    pre = _pool_plan(
        POOL_PREFILL,
        (lam_adm * remote, *_prefill_queue(st_r), 1, pb, 1.0),
        sol.prefill,
        sol.w_pre,
        sol.w_pre,
    )
    dec = _pool_plan(
        POOL_DECODE, (lam_adm, hold, st_r.hold_cs2, st_r.b_eff, db, 1.0), sol.decode, sol.w_dec, sol.w_dec
    )
    ttft_r = st_r.fixed_s + sol.w_enc + sol.w_pre + sol.w_dec if remote > 0 else 0.0
    ttft_l = local_fixed + sol.w_enc + sol.w_local + sol.w_dec if remote < 1 else 0.0
    n_occ = sol.n_occ
    itl = sol.itl_s
    return Plan(
        placement="conditional",
        pools={POOL_ENCODER: enc, POOL_PREFILL: pre, POOL_DECODE: dec},
        stages={
            "encoder.service_ms": st_r.enc_s * 1000.0,
            "prefill.service_ms": st_r.prefill_s * 1000.0,
            "prefill.service_cv": math.sqrt(st_r.prefill_cs2),
            "local_prefill.service_ms": st_l.prefill_s * 1000.0,
            "local_prefill.wait_p_ms": sol.w_local * 1000.0,
            "local_prefill.decode_share": u,
            "transfer.kv_bytes": st_r.kv_bytes,
            "transfer.serial_ms": st_r.serial_ms,
            "transfer.chunked_ms": st_r.chunked_ms,
            "transfer.used_ms": st_r.transfer_ms,
            "transfer.link_busy_ms": st_r.link_s * 1000.0,
            "decode.step_ms": st_r.step_cap_ms,
            "decode.batch_cap": float(st_r.b_eff),
            "decode.expected_batch": n_occ,
            "decode.slot_hold_s": hold,
            **_kv_stages(m, st_r),
        },
        ttft_s=max(ttft_r, ttft_l),
        itl_s=itl,
        percentile=slo.percentile,
        decode_per_prefill=dec.replicas / pre.replicas if pre.replicas else None,
        encoder_per_prefill=enc.replicas / pre.replicas if pre.replicas else None,
        capacity_ratio=None,
        total_gpus=enc.gpus + pre.gpus + dec.gpus,
        gpu_budget=budget,
        feasible=slo_ok and frac >= 1.0,
        reason="; ".join(reasons) if reasons else "ok",
        best_ttft_s=max(st_r.fixed_s if remote > 0 else 0.0, local_fixed),
        best_itl_s=step1_s,
        budget_limited=budget_limited,
        admitted_fraction=frac,
        goodput_rps=lam_adm if slo_ok else 0.0,
        shed_rps=lam * (1 - frac),
        sacrificed=sacrificed,
        interference_ms=st_l.prefill_s * 1000.0,
        split_threshold_tokens=threshold,
        remote_fraction=remote,
        demand=d,
        slo=slo,
        decode_bound=st_r.decode_bound,
    )


# --------------------------------------------------------------------------- entry points


def plan(
    demand: Demand | None = None,
    models: StageModels | None = None,
    slo: SLO | None = None,
    bounds: dict[str, PoolBounds] | None = None,
    budget: int | None = None,
    placement: Placement = "disaggregated",
    chunked: bool = False,
    split_threshold: float | None = None,
) -> Plan:
    """Plan replicas for one demand point. See the module docstring and docs/planner.md.

    ``split_threshold`` (conditional placement): prompt tokens above which a request is
    prefilled on the prefill pool; None derives it from the models (`split_threshold_tokens`).
    """
    d = demand or Demand()
    m = models or _DEFAULT_MODELS
    s = slo or _DEFAULT_SLO
    if not isinstance(d, Demand):
        raise ValueError("demand must be a Demand")
    if not isinstance(m, StageModels):
        raise ValueError("models must be a StageModels")
    if not isinstance(s, SLO):
        raise ValueError("slo must be an SLO")
    if placement not in PLACEMENTS:
        raise ValueError(f"placement must be one of {', '.join(PLACEMENTS)}, got {placement!r}")
    b = _bounds(bounds)
    g = _check_budget(budget)
    if placement == "disaggregated":
        return _plan_disagg(d, m, s, b, g, chunked)
    if placement == "colocated":
        return _plan_colocated(d, m, s, b, g)
    thr = split_threshold_tokens(m, s, d.prefix_hit_rate) if split_threshold is None else split_threshold
    _num("split_threshold", thr)
    return _plan_conditional(d, m, s, b, g, chunked, float(thr))


def plan_replicas(
    demands: list[Demand],
    models: StageModels | None = None,
    slo: SLO | None = None,
    bounds: dict[str, PoolBounds] | None = None,
    chunked: bool = False,
) -> list[tuple[int, int, int, bool]]:
    """Fast path for sweeps: (encoder, prefill, decode, feasible) per demand, no Plan objects, no budget."""
    m = models or _DEFAULT_MODELS
    s = slo or _DEFAULT_SLO
    b = _bounds(bounds)
    ctx = _ctx(m, s, chunked)
    gpus = (
        b[POOL_ENCODER].gpus_per_replica,
        b[POOL_PREFILL].gpus_per_replica,
        b[POOL_DECODE].gpus_per_replica,
    )
    out: list[tuple[int, int, int, bool]] = []
    p = s.percentile
    for d in demands:
        st = _shape(ctx, d)
        q, target = p, _ttft_target(s, d)
        pk: _Pick | None = None
        if st.covers is not None:
            pk = _pick_cover(st, d.arrival_rps, b, gpus, p, target)
            st, q, target = pk.st, pk.percentile, pk.target
        slack = target - st.fixed_s
        if pk is not None and pk.idx is not None and pk.tabs is not None:
            # the pick's tables and search are `_solve`'s at q and this slack
            tabs, (ie, ip, i_d) = pk.tabs, pk.idx
            out.append((tabs[0][0] + ie, tabs[1][0] + ip, tabs[2][0] + i_d, slack >= 0 and st.itl_ok))
            continue
        sol = _solve(d.arrival_rps, st, b, gpus, q, max(0.0, slack), None)
        if sol is None:
            out.append((-1, -1, -1, False))
            continue
        _, tabs, (ie, ip, i_d) = sol
        out.append((tabs[0][0] + ie, tabs[1][0] + ip, tabs[2][0] + i_d, slack >= 0 and st.itl_ok))
    return out


def predict(
    replicas: dict[str, int],
    demand: Demand | None = None,
    models: StageModels | None = None,
    slo: SLO | None = None,
    chunked: bool = False,
) -> dict[str, float]:
    """Predicted TTFT at the percentile and ITL for given disaggregated replica counts.

    Returns ``{"ttft_s", "itl_s", "encoder_wait_s", "prefill_wait_s", "decode_wait_s"}``;
    waits are inf when a pool is unstable (too few replicas for the load).
    """
    d = demand or Demand()
    m = models or _DEFAULT_MODELS
    s = slo or _DEFAULT_SLO
    st = _setup(d, m, s, chunked)
    p = s.percentile
    waits = {}
    if st.covers is not None and st.covers.fixed_s:
        p = st.covers.wait_percentile[-1]  # the full cover (st.fixed_s is its bare TTFT)
    specs = _specs(d.arrival_rps, st, _bounds(None))
    for name, spec in zip(POOLS, specs, strict=True):
        r = int(replicas.get(name, 0))
        r0, wps, _ = _spec_table(spec, p, r, r)
        waits[name] = wps[0] if wps and r0 == r else math.inf
    return {
        "ttft_s": st.fixed_s + sum(waits.values()),
        "itl_s": st.step_cap_ms / 1000.0 if st.itl_ok else float(m.decode.step_ms(1)) / 1000.0,
        "encoder_wait_s": waits[POOL_ENCODER],
        "prefill_wait_s": waits[POOL_PREFILL],
        "decode_wait_s": waits[POOL_DECODE],
    }
