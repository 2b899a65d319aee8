"""Closed-loop evaluation of autoscaling policies on virtual time.

Pure (numpy, the simulator, the planner and the policy). The simulator
(`disagg.sim.engine.Cluster`) replays a workload; every ``interval_s`` a
policy sets the pool sizes from metrics computed inside the simulation the
way Prometheus would serve them: rates and token statistics over a
``window_s`` window, read one scrape interval late; TTFT as a histogram
quantile. The ``disagg`` policy sees the requests as the engines count them
(`EngineCounts`: a request's prompt when its prefill is done, its output
when it finishes), as the operator reads them. New workers serve after
``startup_s``; removed workers drain (no new work; deleted once nothing is in
flight and no KV send is pending), so a draining policy loses no request.
GPU-hours integrate every worker that holds GPUs (starting, serving, draining)
x gpus per replica.

Policies (`POLICIES`):

* ``disagg``: this project - planner.plan on the observed demand (the larger
  of the rate forecast one decision lead ahead and the observation with the
  burst headroom, plus Poisson counting uncertainty) and policy.decide (HPA-like stabilization, drains, budget rebalance).
* ``static``: a fixed plan for the trace's peak 60 s arrival rate.
* ``hpa``: per pool, ``ceil(ready x utilisation / 0.7)`` with a 10 %
  tolerance and a 300 s scale-down stabilization (prefill: busy fraction;
  decode: batch-slot occupancy).
* ``throughput``: Dynamo-style, per pool ``ceil(rate / per-replica
  throughput)`` (prefill 1000/prefill_ms(mean prompt), decode
  slots/(mean output x step)), squeezed proportionally under a budget.
* ``dynamo``: Dynamo's SLA planner at its defaults (`disagg.baselines`).
* ``keda``: a KEDA-style per-pool rule on queue depth (`disagg.baselines`).
* ``oracle``: the hindsight oracle - per interval the fewest workers per pool
  meeting the target attainment, found by search through the simulator and
  applied instantly (`disagg.yardstick`): the GPU-hour reference.
* ``planner-foresight``: every interval the planner's fewest GPUs for that
  interval's true load, applied instantly (the old "oracle": it shows the
  planner's model error, not a bound).

A workload with media items adds the encoder pool (media requests are encoded
before prefill; every policy sizes it too). ``EvalSettings.placement``
``conditional`` prefills prompts below the split threshold on the decode
worker that serves them (the simulator's conditional placement; the planner's
conditional plan); the throughput baseline keeps sizing prefill for every request.

The baselines scale down the way their systems do: by default they delete
workers without draining (``baseline_drain=False``); their in-flight requests
are lost and count as SLO misses.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
from bisect import bisect_left
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, fields, is_dataclass, replace
from heapq import heappop, heappush
from typing import Any

import numpy as np
from pydantic import ValidationError

from disagg import api, autoscaler, names
from disagg.burstiness import arrival_counts
from disagg.forecast import PREDICTORS
from disagg.metrics import QUEUE_TIME_BUCKETS, back_pool, front_pool, histogram_quantile
from disagg.model import StageModels
from disagg.planner import SLO, Demand, PoolBounds, plan, split_threshold_tokens
from disagg.sim.core import DONE, INF, REJECTED, Job
from disagg.sim.engine import Cluster, SimConfig
from disagg.sizes import MIN_SIZE_SAMPLES, SizeDistribution
from disagg.workload import Workload, check_request_count, piecewise_poisson

__all__ = [
    "POLICIES",
    "POLICY_HELP",
    "EvalSettings",
    "diurnal",
    "evaluate",
    "rate_scaled",
    "run_policy",
]

POOLS = (names.POOL_PREFILL, names.POOL_DECODE)  # the pools of a text-only workload
MEDIA_POOLS = (
    names.POOL_ENCODER,
    names.POOL_PREFILL,
    names.POOL_DECODE,
)  # with media items: the encoder pool first
PLACEMENTS = ("disaggregated", "conditional")


def pools_for(w: Workload | None) -> tuple[str, ...]:
    """The pools a workload needs: the encoder pool only when some request carries media."""
    return MEDIA_POOLS if w is not None and len(w) and int(w.media_items.max()) > 0 else POOLS


POLICY_HELP = names.EVAL_POLICY_HELP  # the CLI shows the same lines
POLICIES = tuple(POLICY_HELP)
EVAL_PERCENTILE = 0.99  # default planner quantile of the evaluation (see EvalSettings.slo)
TTFT_BUCKETS = (0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 30.0, INF)


@dataclass(frozen=True)
class EvalSettings:
    models: StageModels = field(default_factory=StageModels)
    # Attainment counts every request, and the goal is 99 % of them: plan for that share
    # (p99), not for the CRD's default p90, or even the oracle would miss 1 request in 10.
    slo: SLO = field(default_factory=lambda: SLO(percentile=EVAL_PERCENTILE))
    interval_s: float = 30.0
    startup_s: float = 60.0
    window_s: float = float(api.METRIC_WINDOW_SECONDS_DEFAULT)  # the operator's default
    scrape_s: float = 15.0
    drain_poll_s: float = 5.0
    stabilization_s: float = 300.0
    gpus_per_replica: dict[str, int] = field(
        default_factory=lambda: {names.POOL_PREFILL: 1, names.POOL_DECODE: 1}
    )
    min_replicas: int = 1
    max_replicas: int = 10_000
    gpu_budget: int | None = None
    baseline_drain: bool = False
    hpa_target: float = 0.7
    hpa_tolerance: float = 0.1
    headroom_z: float = 1.645  # disagg: plan for rate + z x Poisson std of the windowed rate
    headroom: float = 0.0  # disagg: standing spare capacity (spec.autoscaling.headroom)
    # disagg: spec.autoscaling.sizing ({"requestSizes": bool, "burstiness": bool, "autoHeadroom": bool});
    # None: the spec's defaults
    sizing: dict[str, bool] | None = None
    backlog_drain_s: float = 60.0  # disagg: size to clear the observed queue within this time
    backlog_lead_s: float | None = None  # disagg: project queue growth this far (None: start-up time)
    ttft_feedback: bool = True  # disagg: observed p90 TTFT well below target drops the headroom
    ttft_comfort: float = 0.5  # ... "well below" = at most this fraction of the target
    # disagg: a rise's projection and the headroom at a burst's top stop at the level bursts
    # reach (policy.burst_reach)
    within_burst_reach: bool = True
    target_attainment: float = 0.99  # oracle and best-static: the attainment they must reach
    capacity_scale: float = 1.0  # static/throughput/dynamo: size for this multiple of their demand
    keda_queue_per_replica: float = 2.0  # keda: target requests per replica beyond its batch (curve knob)
    dynamo_predictor: str = "arima"  # dynamo: its load predictor (Dynamo's default "arima", or "constant")
    timeline_points: int = 300
    seed: int = 0
    placement: str = "disaggregated"  # or "conditional"
    split_threshold: float | None = (
        None  # conditional: prompt tokens from which prefill is remote; None: auto
    )

    def __post_init__(self) -> None:
        if self.placement not in PLACEMENTS:
            raise ValueError(f"placement must be one of {', '.join(PLACEMENTS)}, got {self.placement!r}")
        if self.split_threshold is not None and not self.split_threshold > 0:
            raise ValueError(f"split_threshold must be > 0, got {self.split_threshold!r}")
        for name in ("interval_s", "window_s", "scrape_s", "drain_poll_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)!r}")
        if not self.startup_s >= 0:
            raise ValueError(f"startup_s must be >= 0, got {self.startup_s!r}")
        if self.gpu_budget is not None and self.gpu_budget < 1:
            raise ValueError(f"gpu_budget must be >= 1, got {self.gpu_budget!r}")
        if not 0 <= self.headroom <= 4:
            raise ValueError(f"headroom must be in [0, 4], got {self.headroom!r}")
        if not 0 < self.hpa_target <= 1:
            raise ValueError("hpa_target must be in (0, 1]")
        if not 0 < self.target_attainment < 1:
            raise ValueError(f"target_attainment must be in (0, 1), got {self.target_attainment!r}")
        if not self.capacity_scale > 0 or not self.keda_queue_per_replica > 0:
            raise ValueError("capacity_scale and keda_queue_per_replica must be > 0")
        if self.models.decode.max_batch_for_itl(self.slo.itl_s * 1000.0) < 1:  # the planner's test
            step_s = float(self.models.decode.step_ms(1)) / 1000.0
            raise ValueError(
                f"itl_s {self.slo.itl_s:g} s is below one decode step at batch 1 ({step_s:.3g} s by the "
                "decode model): every request would miss it whatever the fleet, and no policy can be "
                "told from another; raise the ITL target or lower the decode step"
            )
        if self.dynamo_predictor not in PREDICTORS:
            raise ValueError(
                f"dynamo_predictor must be one of {', '.join(PREDICTORS)}, got {self.dynamo_predictor!r}"
            )

    def bounds(self) -> dict[str, PoolBounds]:
        return {
            p: PoolBounds(self.min_replicas, self.max_replicas, self.gpus_per_replica.get(p, 1))
            for p in MEDIA_POOLS
        }

    def threshold(self) -> float:
        """Conditional placement's split threshold: the given one, or the planner's for these models."""
        if self.split_threshold is not None:
            return float(self.split_threshold)
        return split_threshold_tokens(self.models, self.slo)

    def to_dict(self) -> dict[str, Any]:
        m = self.models
        return {
            "interval_s": self.interval_s,
            "startup_s": self.startup_s,
            "window_s": self.window_s,
            "scrape_s": self.scrape_s,
            "stabilization_s": self.stabilization_s,
            "gpus_per_replica": dict(self.gpus_per_replica),
            "gpu_budget": self.gpu_budget,
            "baseline_drain": self.baseline_drain,
            "dynamo_predictor": self.dynamo_predictor,
            "headroom": self.headroom,
            "target_attainment": self.target_attainment,
            "placement": self.placement,
            "split_threshold_tokens": self.threshold() if self.placement == "conditional" else None,
            "slo": {
                "ttft_s": self.slo.ttft_s,
                "ttft_s_per_1k_tokens": self.slo.ttft_s_per_1k_tokens,
                "itl_s": self.slo.itl_s,
                "percentile": self.slo.percentile,
                "itl_statistic": self.slo.itl_statistic,
            },
            "models": {
                "encoder_fixed_ms": m.encoder.fixed_ms,
                "encoder_ms_per_item": m.encoder.ms_per_item,
                "prefill_fixed_ms": m.prefill.fixed_ms,
                "prefill_ms_per_token": m.prefill.ms_per_token,
                "kv_bytes_per_token": m.transfer.kv_bytes_per_token,
                "link_setup_ms": m.transfer.setup_ms,
                "link_gibps": m.transfer.bandwidth_gibps,
                "decode_step_ms": m.decode.step_fixed_ms,
                "decode_ms_per_seq": m.decode.step_ms_per_seq,
                "decode_slots": m.decode.slots,
                "decode_kv_cache_tokens": m.decode.kv_cache_tokens,
            },
        }


# --------------------------------------------------------------------------- reusable references

# EvalSettings fields the hindsight references never read: start-up (the oracle's workers
# start at once and a fixed fleet never starts one) and the policies' own knobs. Two runs
# that differ only in these have the same references, so a matrix over start-up times
# searches them once (`reference_key`, `evaluate(..., references=)`).
POLICY_ONLY_SETTINGS = frozenset(
    {
        "startup_s",
        "stabilization_s",
        "baseline_drain",
        "hpa_target",
        "hpa_tolerance",
        "headroom_z",
        "headroom",
        "sizing",
        "backlog_drain_s",
        "backlog_lead_s",
        "ttft_feedback",
        "ttft_comfort",
        "within_burst_reach",
        "capacity_scale",
        "keda_queue_per_replica",
        "dynamo_predictor",
        "timeline_points",
    }
)


class ReferencesMismatch(ValueError):
    """Earlier references that cannot stand for this run's (another load, other settings, missing parts)."""


class NothingToAttain(ValueError):
    """No request of the workload can meet its TTFT target, even on an idle system."""


def check_attainable(w: Workload, s: EvalSettings) -> None:
    """Raise `NothingToAttain` when every request is out of reach of its TTFT target.

    Attainment counts the requests that some fleet can serve on time (`infeasible_mask`);
    with none, it is undefined and no policy can be told from another.
    """
    if len(w) and bool(infeasible_mask(w, s).all()):
        target = f"{s.slo.ttft_s:g} s"
        if s.slo.ttft_s_per_1k_tokens:
            target += f" + {s.slo.ttft_s_per_1k_tokens:g} s per 1,000 prompt tokens"
        raise NothingToAttain(
            f"every one of the {len(w):,} requests misses the TTFT target ({target}) even on an idle "
            "system (its own prefill, KV transfer and first decode step take longer): there is no "
            "attainment to compare; raise the target or let it grow with the prompt"
        )


def workload_fingerprint(w: Workload) -> str:
    """SHA-256 of the requests (arrival times, prompt, output and media sizes): equal only for the same load."""
    h = hashlib.sha256()
    for a in (w.arrival_s, w.prompt_tokens, w.output_tokens, w.media_items):
        arr = np.ascontiguousarray(a)
        h.update(f"{arr.dtype.str}{arr.shape}".encode())
        h.update(arr.tobytes())
    return h.hexdigest()


def _plain(x: Any) -> Any:
    if is_dataclass(x) and not isinstance(x, type):
        return asdict(x)
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, (set, frozenset)):
        return sorted(x)
    raise TypeError(f"cannot key {type(x).__name__}")


def reference_key(w: Workload, s: EvalSettings) -> dict[str, Any]:
    """What the hindsight references depend on: the requests and every setting but `POLICY_ONLY_SETTINGS`.

    JSON-ready (the form `evaluate` writes as ``reference_key``), so a key read back
    from a file compares equal to a freshly computed one."""
    kept = {f.name: getattr(s, f.name) for f in fields(s) if f.name not in POLICY_ONLY_SETTINGS}
    key = {"workload": {"requests": len(w), "sha256": workload_fingerprint(w)}, "settings": kept}
    return json.loads(json.dumps(key, default=_plain, sort_keys=True))


def reference_key_differences(a: Any, b: Any, path: str = "") -> list[str]:
    """Dotted paths where two reference keys differ (empty: the same)."""
    if isinstance(a, dict) and isinstance(b, dict):
        out: list[str] = []
        for k in sorted(set(a) | set(b)):
            sub = f"{path}.{k}" if path else str(k)
            if k not in a or k not in b:
                out.append(sub)
            else:
                out += reference_key_differences(a[k], b[k], sub)
        return out
    return [] if a == b else [path or "(key)"]


# what `evaluate` derives from a policy's run against the oracle (recomputed, never reused)
_DERIVED = ("gpu_hours_vs_oracle", "gpu_hours_at", "gpu_hours_at_vs_oracle", "curve", "timeline")


def reused_references(
    doc: dict[str, Any], key: dict[str, Any], *, best_static: bool, oracle_policy: bool
) -> tuple[dict[str, Any], PolicyResult | None]:
    """The references of an earlier `evaluate` result `doc`, checked to be valid for `key`,
    and with `oracle_policy` its oracle run as a policy (metrics and timeline). An earlier
    result without ``--curves`` still gives them; `evaluate` then searches only the
    oracle's other curve points.

    Raises `ReferencesMismatch` naming what differs when they were computed for another
    load or other settings, or lack what this run reports."""
    if not isinstance(doc, dict) or "reference_key" not in doc or "references" not in doc:
        raise ReferencesMismatch(
            "the earlier result has no reference_key (written by an older version or not by "
            "`disagg evaluate --output json`): run it again to reuse its references"
        )
    diff = reference_key_differences(doc["reference_key"], key)
    if diff:
        raise ReferencesMismatch(
            "the earlier result's references are for another load or other settings; "
            f"differing: {', '.join(diff[:8])}{' ...' if len(diff) > 8 else ''}"
        )
    refs = copy.deepcopy(doc["references"])
    if "gpu_hours_at" not in refs.get("oracle", {}):
        raise ReferencesMismatch("the earlier result has no hindsight oracle to reuse")
    if best_static and "best_static" not in refs:
        raise ReferencesMismatch("the earlier result ran without the best fixed fleet (--no-best-static)")
    if not best_static:
        refs.pop("best_static", None)
    refs["reused"] = True
    oracle = None
    if oracle_policy:
        earlier = doc.get("policies", {}).get("oracle")
        if not isinstance(earlier, dict):
            raise ReferencesMismatch("the earlier result did not list the oracle among its policies")
        earlier = copy.deepcopy(earlier)
        metrics = {k: v for k, v in earlier.items() if k not in _DERIVED}
        oracle = PolicyResult("oracle", metrics, earlier.get("timeline", []))
    return refs, oracle


# --------------------------------------------------------------------------- workloads


def rate_scaled(w: Workload, k: int, seed: int = 0) -> Workload:
    """`k` copies of `w` superposed, each but the first circularly shifted by a seeded random offset."""
    if k < 1 or int(k) != k:
        raise ValueError(f"rate scale must be an integer >= 1, got {k!r}")
    if k == 1 or len(w) == 0:
        return w
    check_request_count(k * len(w), f"{k} copies of {len(w):,} requests")
    rng = np.random.default_rng(seed)
    t0 = w.arrival_s - w.arrival_s[0]
    span = float(t0[-1]) + (w.duration_s / max(1, len(w) - 1))
    arr = [t0]
    for _ in range(k - 1):
        off = float(rng.uniform(0.0, span))
        arr.append((t0 + off) % span)
    a = np.concatenate(arr)
    return Workload(
        a,
        np.tile(w.prompt_tokens, k),
        np.tile(w.output_tokens, k),
        np.tile(w.media_items, k),
        None,
        name=f"{w.name} x{k}",
    )


def diurnal(w: Workload, k: int = 1, seed: int = 0, duration_s: float = 7200.0) -> Workload:
    """Synthetic two-hour 'day': (prompt, output) pairs sampled from `w`; rate swings 5x, with bursts.

    rate(t) = r_min x (1 + 4 sin^2(pi t / T)) averages `k` x the trace's mean rate;
    six bursts of 2-4 minutes add 50-100 % on top.
    """
    if len(w) == 0:
        raise ValueError("diurnal: empty source workload")
    rng = np.random.default_rng(seed)
    mean = w.mean_rate * k
    r_min = mean / 3.0
    seg = 10.0
    n_seg = math.ceil(duration_s / seg)
    mid = (np.arange(n_seg) + 0.5) * seg
    rate = r_min * (1.0 + 4.0 * np.sin(np.pi * mid / duration_s) ** 2)
    for _ in range(6):
        start = rng.uniform(0.05, 0.9) * duration_s
        length = rng.uniform(120.0, 240.0)
        rate[(mid >= start) & (mid < start + length)] *= 1.0 + rng.uniform(0.5, 1.0)
    arrivals = piecewise_poisson([(seg, float(r)) for r in rate], rng)
    idx = rng.integers(0, len(w), size=arrivals.shape[0])
    return Workload(
        arrivals,
        w.prompt_tokens[idx],
        w.output_tokens[idx],
        w.media_items[idx],
        None,
        name=f"diurnal({w.name}) x{k}",
    )


# --------------------------------------------------------------------------- observations


@dataclass
class Obs:
    """What a policy sees at a decision (Prometheus-like, one scrape late)."""

    now: float
    rate: float
    count: int
    prompt_mean: float | None  # None: no request counted in the window
    prompt_std: float | None
    output_mean: float
    output_std: float
    util: dict[str, float]
    ready: dict[str, int]
    requested: dict[str, int]
    pending: dict[str, int]
    ttft_p: float | None
    queued: int = 0  # requests waiting for a prefill worker or a decode slot (num_requests_waiting)
    # requests finished per second over the window: those the output shape is read from
    # (None: not counted, the output mean and spread are taken as read)
    output_finished_rps: float | None = None
    rate_short: float | None = None  # arrival rate over the short window (autoscaler.SHORT_WINDOW_SCRAPES)
    metrics_ok: bool = True
    media_fraction: float = 0.0  # share of the window's requests with media (encoder pods' rate / arrivals)
    items_per_request: float = 1.0  # media items per media request
    # Issue-14 inputs (filled only for a policy that uses them, see `sizing_observation`):
    sizes: SizeDistribution | None = None  # the window's requests' sizes
    arrival_counts: tuple[float, ...] | None = None  # per scrape-resolution sub-window, oldest first
    count_interval_s: float | None = None
    # per count, the growth over its sub-window of the requests arrived and not counted yet
    # (`autoscaler.Observation.arrival_counts_growth`; None where not read)
    arrival_counts_growth: tuple[float | None, ...] | None = None
    # per count, the requests shed at the front door in its sub-window (None: no series: none shed yet)
    arrival_counts_shed: tuple[float | None, ...] | None = None
    # the window's TTFTs and its prefill queue waits, per second (as rate() of the engines'
    # buckets), with the sizes
    ttft_buckets: tuple[tuple[float, float], ...] | None = None
    prefill_wait_buckets: tuple[tuple[float, float], ...] | None = None
    prefill_wait_mean_s: float | None = None  # the window's mean prefill queue wait
    prefill_serving_min: float | None = None  # the fewest front engines at the window's scrapes
    # The back pool's running sequences now (num_requests_running), and its KV usage summed
    # over its workers (kv_cache_usage_perc) and running sequences, both averaged over the
    # metric window as the operator's avg_over_time queries read them; None where not read
    back_running: float | None = None
    kv_usage_sum: float | None = None
    kv_running: float | None = None
    # requests the arrival pool holds and has not counted yet, at the last scrape (its engines'
    # num_requests_waiting + num_requests_running; None where not read)
    arrival_pool_in_system: float | None = None
    # requests the front door shed per second over the window and the short window (its
    # counter; None where not read or nothing shed yet)
    shed_rps: float | None = None
    shed_rps_short: float | None = None

    def demand(self, rate: float | None = None) -> Demand:
        return Demand(
            arrival_rps=self.rate if rate is None else rate,
            prompt_tokens_mean=self.prompt_mean,
            prompt_tokens_std=self.prompt_std,
            output_tokens_mean=max(1.0, self.output_mean),
            output_tokens_std=self.output_std,
            media_fraction=self.media_fraction,
            items_per_request=self.items_per_request,
        )


class _Prefix:
    """Windowed count/mean/std of arrivals by prefix sums (what rate()/histogram sums give)."""

    def __init__(self, w: Workload) -> None:
        self.t = w.arrival_s
        p = w.prompt_tokens.astype(np.float64)
        o = w.output_tokens.astype(np.float64)
        z = np.zeros(1)
        self.p1 = np.concatenate([z, np.cumsum(p)])
        self.p2 = np.concatenate([z, np.cumsum(p * p)])
        self.o1 = np.concatenate([z, np.cumsum(o)])
        self.o2 = np.concatenate([z, np.cumsum(o * o)])
        media = w.media_items.astype(np.float64)
        self.m_req = np.concatenate([z, np.cumsum(media > 0)])
        self.m_items = np.concatenate([z, np.cumsum(media)])
        n_media = float((media > 0).sum())
        self.media_default = (
            n_media / len(media) if len(media) else 0.0,
            float(media.sum()) / n_media if n_media else 1.0,
        )
        self.default = (
            float(p.mean()) if len(p) else 1.0,
            float(p.std()) if len(p) else 0.0,
            float(o.mean()) if len(o) else 1.0,
            float(o.std()) if len(o) else 0.0,
        )

    def stats(self, a: float, b: float) -> tuple[int, float, float, float, float]:
        i, j = np.searchsorted(self.t, [a, b], side="left")
        n = int(j - i)
        if n <= 0:
            return 0, *self.default
        pm = (self.p1[j] - self.p1[i]) / n
        om = (self.o1[j] - self.o1[i]) / n
        ps = math.sqrt(max(0.0, (self.p2[j] - self.p2[i]) / n - pm * pm))
        os_ = math.sqrt(max(0.0, (self.o2[j] - self.o2[i]) / n - om * om))
        return n, pm, ps, om, os_

    def media(self, a: float, b: float) -> tuple[float, float]:
        """(share of requests with media, items per media request) of the arrivals in [a, b)."""
        i, j = np.searchsorted(self.t, [a, b], side="left")
        n = int(j - i)
        if n <= 0:
            return self.media_default
        req = float(self.m_req[j] - self.m_req[i])
        items = float(self.m_items[j] - self.m_items[i])
        return req / n, (items / req if req else self.media_default[1])

    def demand(self, a: float, b: float, rate: float) -> Demand:
        """The demand of the arrivals in [a, b) at `rate` (token shape and media mix of the window)."""
        _n, pm, ps, om, os_ = self.stats(a, b)
        mf, items = self.media(a, b)
        return Demand(rate, pm, ps, max(1.0, om), os_, mf, max(1.0, items))


def ttft_histogram(values: list[float]) -> tuple[tuple[float, float], ...]:
    """Cumulative (upper bound, count) pairs of TTFTs over TTFT_BUCKETS, as an engine's histogram exports them."""
    return cumulative_histogram(values, TTFT_BUCKETS[:-1])


def cumulative_histogram(values: list[float], bounds: Sequence[float]) -> tuple[tuple[float, float], ...]:
    """Cumulative (upper bound, count) pairs of `values` over finite `bounds` and +Inf, as an
    engine exports a histogram."""
    counts = np.histogram(np.minimum(values, 1e9), bins=[0.0, *bounds, 1e10])[0]
    return tuple(zip((*bounds, INF), np.cumsum(counts).astype(float).tolist(), strict=True))


# --------------------------------------------------------------------------- policies


class Policy:
    name = "?"
    drains = True
    instant = False  # no start-up delay (oracle)
    admits = False  # sheds at the front door what its plan does not admit (admission control)
    # sees the arrival rate, arrival counts and prompt lengths as the engines count them
    # (`EngineCounts`), as the operator reads them; the baselines' counterparts count arrivals
    reads_engine_counts = False
    last_admitted = 1.0  # the admitted fraction of the last plan (planner.Plan.admitted_fraction)

    def __init__(self, s: EvalSettings, w: Workload, pre: _Prefix) -> None:
        self.s = s
        self.w = w
        self.pre = pre
        self.pools = pools_for(w)

    def _plan(self, d: Demand, budget: int | None = None) -> dict[str, int]:
        s = self.s
        split = s.threshold() if s.placement == "conditional" else None
        p = plan(d, s.models, s.slo, s.bounds(), budget, s.placement, split_threshold=split)  # type: ignore[arg-type]
        self.last_admitted = p.admitted_fraction
        return {k: int(p.replicas[k]) for k in self.pools}

    def initial(self) -> dict[str, int]:
        n = self.pre.stats(0.0, self.s.window_s)[0]
        return self._plan(self.pre.demand(0.0, self.s.window_s, n / self.s.window_s), self.s.gpu_budget)

    def decide(self, o: Obs) -> tuple[dict[str, int], str]:
        raise NotImplementedError

    def attach(self, cluster: Cluster) -> None:
        """Called once with the simulated cluster (a policy reading served-request metrics keeps it)."""

    def report(self) -> dict[str, Any]:
        """Extra figures for the policy's result (e.g. a search's cost)."""
        return {}


def spec_for(
    s: EvalSettings, placement: str = "disaggregated", pools: tuple[str, ...] | None = None
) -> api.DisaggDeploymentSpec:
    """The DisaggDeployment spec these settings describe, so `disagg` runs on the operator's
    configuration (`autoscaler.config_from_spec`). Seconds must be whole, as in a spec."""

    def whole(name: str, v: float) -> int:
        if float(v) != int(v):
            raise ValueError(f"{name} must be whole seconds for the disagg policy, got {v!r}")
        return int(v)

    m = s.models
    template = {"spec": {"containers": [{"name": "engine", "image": "simulated"}]}}
    prefill = {
        "fixedMs": m.prefill.fixed_ms,
        "msPerToken": m.prefill.ms_per_token,
        "msPerTokenSquared": m.prefill.ms_per_token_sq,
    }
    decode = {
        "stepFixedMs": m.decode.step_fixed_ms,
        "stepMsPerSequence": m.decode.step_ms_per_seq,
        "slots": m.decode.slots,
        "kvCacheTokens": m.decode.kv_cache_tokens,
    }
    models = {
        names.POOL_PREFILL: prefill,
        names.POOL_DECODE: decode,
        names.POOL_COLOCATED: {**prefill, **decode},
        names.POOL_ENCODER: {"fixedMs": m.encoder.fixed_ms, "msPerItem": m.encoder.ms_per_item},
    }
    pools = pools or POOLS
    if placement == "colocated":
        pools = (*(p for p in pools if p == names.POOL_ENCODER), names.POOL_COLOCATED)
    autoscaling: dict[str, Any] = {
        "intervalSeconds": whole("interval_s", s.interval_s),
        "scrapeIntervalSeconds": whole("scrape_s", s.scrape_s),
        "metricWindowSeconds": whole("window_s", s.window_s),
        "scaleDownStabilizationSeconds": whole("stabilization_s", s.stabilization_s),
        "headroom": s.headroom,
    }
    if s.gpu_budget is not None:
        autoscaling["gpuBudget"] = s.gpu_budget
    if s.sizing is not None:
        autoscaling["sizing"] = dict(s.sizing)
    try:
        return api.parse_spec(
            {
                "engine": "vllm",
                "model": "evaluated",
                "placement": {"mode": placement}
                | (
                    {"splitThresholdTokens": int(s.split_threshold)}
                    if placement == "conditional" and s.split_threshold is not None
                    else {}
                ),
                "pools": {
                    p: {
                        "minReplicas": s.min_replicas,
                        "maxReplicas": s.max_replicas,
                        "gpusPerReplica": s.gpus_per_replica.get(p, 1),
                        "template": template,
                        "serviceModel": models[p],
                    }
                    for p in pools
                },
                "kvTransfer": {
                    "bytesPerToken": int(m.transfer.kv_bytes_per_token),
                    "linkSetupMs": m.transfer.setup_ms,
                    "bandwidthGiBps": m.transfer.bandwidth_gibps,
                    "chunkTokens": m.transfer.chunk_tokens,
                },
                "slo": {
                    "ttftSeconds": s.slo.ttft_s,
                    "ttftSecondsPerThousandTokens": s.slo.ttft_s_per_1k_tokens,
                    "itlSeconds": s.slo.itl_s,
                    "percentile": s.slo.percentile,
                    "itlStatistic": s.slo.itl_statistic,
                },
                "autoscaling": autoscaling,
            }
        )
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(x) for x in err["loc"])
        raise ValueError(f"settings the disagg policy cannot run: spec.{where}: {err['msg']}") from None


def tuning_for(s: EvalSettings) -> autoscaler.Tuning:
    return autoscaler.Tuning(
        z=s.headroom_z,
        backlog_drain_s=s.backlog_drain_s,
        backlog_lead_s=s.backlog_lead_s,
        ttft_feedback=s.ttft_feedback,
        ttft_comfort=s.ttft_comfort,
        within_burst_reach=s.within_burst_reach,
    )


def sizing_observation(
    counted_s: np.ndarray,
    prompts: np.ndarray,
    lo: float,
    hi: float,
    count_interval_s: float,
    outputs: Sequence[float] | np.ndarray,
    sizes: bool = True,
    arrived_s: np.ndarray | None = None,
    shed_s: Sequence[float] = (),
) -> tuple[
    SizeDistribution | None,
    tuple[float, ...] | None,
    tuple[float | None, ...] | None,
    tuple[float | None, ...] | None,
]:
    """The issue-14 inputs at a decision seeing requests counted in [lo, hi): the size
    distribution of the window's requests (what the engines' token histograms give), the
    requests counted per `count_interval_s` over the trailing `autoscaler.BURST_HORIZON_S` (the
    Prometheus subquery) and, with `arrived_s` (sorted arrival times) and `shed_s` (sorted
    times of the requests shed at the front door), each count's growth of the requests arrived
    and neither counted nor shed (the counted pool's waiting + running at the sub-windows'
    edges, the operator's second subquery) and the requests shed per sub-window (the front
    door's counter; None before it shed any). `counted_s` (sorted) and `prompts`: when each
    request was counted and its prompt length (`EngineCounts`). `outputs`: the output lengths
    the decode pool's histogram holds (the requests it finished in the window, as the engines
    record them). `sizes` False: no size distribution (the spec does not use it; it is the
    costly part)."""
    i, j = np.searchsorted(counted_s, [lo, hi])
    dist = None
    # fewer requests: no size distribution, the mean/std shape
    if sizes and j - i >= MIN_SIZE_SAMPLES and len(outputs) > 0:
        dist = SizeDistribution.from_samples(prompts[i:j], outputs)
    start = max(0.0, hi - autoscaler.BURST_HORIZON_S)
    a, b = np.searchsorted(counted_s, [start, hi])
    counts = arrival_counts(counted_s[a:b], count_interval_s, start, hi)
    if not len(counts):
        return dist, None, None, None
    growth = shed = None
    if arrived_s is not None:
        edges = start + count_interval_s * np.arange(len(counts) + 1)
        shed_at = np.asarray(shed_s, dtype=float)
        held = (
            np.searchsorted(arrived_s, edges)
            - np.searchsorted(counted_s, edges)
            - np.searchsorted(shed_at, edges)
        )
        growth = tuple(float(g) for g in np.diff(held))
        if shed_at.size:
            shed = tuple(float(x) for x in np.diff(np.searchsorted(shed_at, edges)))
    return dist, tuple(float(c) for c in counts), growth, shed


def observation_from(o: Obs, startup_s: float, pools: tuple[str, ...] = POOLS) -> autoscaler.Observation:
    """The decision's view of the simulation: what the operator would read from the cluster
    and Prometheus at the same moment (replicas requested, pending, the metrics)."""
    return autoscaler.Observation(
        now=o.now,
        metrics_ok=o.metrics_ok,
        metrics_problem="" if o.metrics_ok else "simulated metrics outage",
        pools={
            p: autoscaler.PoolObservation(
                replicas=int(o.requested.get(p, 0)), pending=int(o.pending.get(p, 0))
            )
            for p in pools
        },
        arrival_rps=o.rate,
        arrival_rps_short=o.rate_short,
        prompt_tokens_mean=o.prompt_mean,
        prompt_tokens_std=o.prompt_std,
        # none finished in the window: no output lengths (the decision holds its last shape)
        output_tokens_mean=None if o.output_finished_rps == 0 else max(1.0, o.output_mean),
        output_tokens_std=None if o.output_finished_rps == 0 else o.output_std,
        output_finished_rps=o.output_finished_rps,
        media_fraction=o.media_fraction,
        media_items_per_request=o.items_per_request,
        queued={pools[0]: float(o.queued)},
        running={} if o.back_running is None else {back_pool(pools): o.back_running},
        arrival_pool_in_system=o.arrival_pool_in_system,
        shed_rps=o.shed_rps,
        shed_rps_short=o.shed_rps_short,
        kv_usage_sum=o.kv_usage_sum,
        kv_running=o.kv_running,
        ttft_observed_s=o.ttft_p,
        startups={"simulated": startup_s},
        sizes=o.sizes,
        arrival_counts=o.arrival_counts,
        count_interval_s=o.count_interval_s,
        arrival_counts_growth=o.arrival_counts_growth,
        arrival_counts_shed=o.arrival_counts_shed,
        ttft_buckets=o.ttft_buckets,
        prefill_wait_buckets=o.prefill_wait_buckets,
        prefill_wait_mean_s=o.prefill_wait_mean_s,
        prefill_serving_min=o.prefill_serving_min,
    )


class DisaggPolicy(Policy):
    """The operator's decision (`autoscaler.decide`) on the simulation's observations."""

    name = "disagg"
    admits = True  # the last plan of a decision is for the observed rate (the budget floor)
    reads_engine_counts = True

    def __init__(
        self, s: EvalSettings, w: Workload, pre: _Prefix, spec: api.DisaggDeploymentSpec | None = None
    ) -> None:
        super().__init__(s, w, pre)
        self.config = autoscaler.config_from_spec(spec or spec_for(s, s.placement, self.pools), tuning_for(s))
        self.pools = tuple(p for p in self.config.pools if p != names.POOL_COLOCATED) or self.config.pools
        self.state = autoscaler.ScalerState()
        self.last: autoscaler.Outcome | None = None
        sz = self.config.sizing
        # as the operator reads them (`loop.sizing_query_list`): the sizes and the histograms
        # beside them also when the plan keeps the means
        self.sizing_interval_s = self.config.count_interval_s if sz.reads_any else None
        self.sizing_sizes = sz.reads_histograms

    def decide(self, o: Obs) -> tuple[dict[str, int], str]:
        out = autoscaler.decide(
            self.config, observation_from(o, self.s.startup_s, self.config.pools), self.state
        )
        self.state = out.state
        self.last = out
        if out.record.admitted_fraction is not None:
            self.last_admitted = out.record.admitted_fraction
        return out.next_step, out.reason


class StaticPolicy(Policy):
    name = "static"

    def initial(self) -> dict[str, int]:
        if len(self.w) == 0:
            return dict.fromkeys(self.pools, self.s.min_replicas)
        peak = self.w.busiest_rate(self.s.window_s) * self.s.capacity_scale
        d = self.pre.demand(-math.inf, math.inf, peak)  # the whole trace's shape and media mix
        return self._plan(d, self.s.gpu_budget)

    def decide(self, o: Obs) -> tuple[dict[str, int], str]:
        return dict(o.requested), "Hold"


def hpa_behaviour(
    wants: dict[str, int], hist: list[tuple[float, dict[str, int]]], o: Obs, s: EvalSettings
) -> dict[str, int]:
    """The HPA's behaviour around each pool's wanted count: the default scale-up policy (at most
    100 % or 4 pods more), min/max replicas, and the scale-down stabilization window (the highest
    desired count over the window). `hist` is the caller's window, updated in place."""
    desired = {}
    for p, want in wants.items():
        cur = o.requested[p]
        want = min(want, max(2 * cur, cur + 4))  # default scale-up policy: 100 % or 4 pods
        desired[p] = min(s.max_replicas, max(s.min_replicas, want))
    hist[:] = [(t, d) for t, d in hist if t > o.now - s.stabilization_s] + [(o.now, desired)]
    out = {}
    for p in wants:
        if desired[p] < o.requested[p]:
            out[p] = min(o.requested[p], max(d[p] for _, d in hist))
        else:
            out[p] = desired[p]
    return out


class HpaPolicy(Policy):
    name = "hpa"

    def __init__(self, s: EvalSettings, w: Workload, pre: _Prefix) -> None:
        super().__init__(s, w, pre)
        self.drains = s.baseline_drain
        self.hist: list[tuple[float, dict[str, int]]] = []

    def decide(self, o: Obs) -> tuple[dict[str, int], str]:
        s = self.s
        wants = {}
        for p in self.pools:
            cur = o.requested[p]
            u = o.util.get(p, 0.0)
            ratio = u / s.hpa_target
            if abs(ratio - 1.0) <= s.hpa_tolerance or o.ready[p] == 0:
                want = cur
            else:
                want = math.ceil(o.ready[p] * ratio - 1e-9)
            wants[p] = want
        return hpa_behaviour(wants, self.hist, o, s), "hpa"


class ThroughputPolicy(Policy):
    name = "throughput"

    def __init__(self, s: EvalSettings, w: Workload, pre: _Prefix) -> None:
        super().__init__(s, w, pre)
        self.drains = s.baseline_drain

    def sizes(
        self, rate: float, prompt_mean: float, output_mean: float, media: float = 0.0, items: float = 1.0
    ) -> dict[str, int]:
        m, s = self.s.models, self.s
        pf_rps = 1000.0 / float(m.prefill.service_ms(max(prompt_mean, 0.0)))
        batch = m.decode.max_batch_for_itl(s.slo.itl_s * 1000.0) or 1
        step_s = float(m.decode.step_ms(batch)) / 1000.0
        dec_rps = batch / (max(output_mean, 1.0) * step_s)
        out = {
            names.POOL_PREFILL: max(s.min_replicas, math.ceil(rate / pf_rps - 1e-9)),
            names.POOL_DECODE: max(s.min_replicas, math.ceil(rate / dec_rps - 1e-9)),
        }
        if names.POOL_ENCODER in self.pools:
            enc_rps = 1000.0 / float(m.encoder.service_ms(max(items, 1.0)))
            out[names.POOL_ENCODER] = max(s.min_replicas, math.ceil(rate * media / enc_rps - 1e-9))
        out = {p: min(s.max_replicas, n) for p, n in out.items()}
        g = s.gpus_per_replica
        total = sum(out[p] * g.get(p, 1) for p in self.pools)
        if s.gpu_budget is not None and total > s.gpu_budget:
            f = s.gpu_budget / total
            out = {p: max(s.min_replicas, int(out[p] * f)) for p in self.pools}
        return out

    def initial(self) -> dict[str, int]:
        n, pm, _ps, om, _os = self.pre.stats(0.0, self.s.window_s)
        return self.sizes(n / self.s.window_s, pm, om, *self.pre.media(0.0, self.s.window_s))

    def decide(self, o: Obs) -> tuple[dict[str, int], str]:
        return (
            self.sizes(
                o.rate * self.s.capacity_scale,
                o.prompt_mean,
                o.output_mean,
                o.media_fraction,
                o.items_per_request,
            ),
            "throughput",
        )


class PlannerForesightPolicy(Policy):
    name = "planner-foresight"
    instant = True
    admits = True

    def truth(self, t: float) -> dict[str, int]:
        i = self.s.interval_s
        n = self.pre.stats(t, t + i)[0]
        return self._plan(self.pre.demand(t, t + i, n / i), self.s.gpu_budget)

    def initial(self) -> dict[str, int]:
        return self.truth(0.0)

    def decide(self, o: Obs) -> tuple[dict[str, int], str]:
        return self.truth(o.now), "planner-foresight"


_CLASSES: dict[str, Callable[..., Policy]] = {
    "disagg": DisaggPolicy,
    "static": StaticPolicy,
    "hpa": HpaPolicy,
    "throughput": ThroughputPolicy,
    "planner-foresight": PlannerForesightPolicy,
}


def _policy_classes() -> dict[str, Callable[..., Policy]]:
    """Every policy by name; the baselines and the oracle live in modules that import this one."""
    from disagg import baselines, yardstick

    return {**_CLASSES, **baselines.POLICY_CLASSES, "oracle": yardstick.HindsightOraclePolicy}


# --------------------------------------------------------------------------- the loop


class EngineCounts:
    """When the engines count each request in the token histograms the operator reads its
    arrival rate, arrival counts and prompt lengths from (`metrics.arrival_pool`), with the
    prompt length counted, in time order.

    vLLM and SGLang record a request's prompt tokens when it finishes on the engine: with
    disaggregated placement a prefill instance's request finishes with its prefill, so the
    front pool counts each request when its prefill is done (a prefill run again after a
    failed transfer counts again); with the other placements the pool counting arrivals is
    the one that serves the whole request, so a request counts when it completes. Under a
    prefill queue the counts are the pool's throughput, not the arrivals. Requests shed at the
    front door (admission control) never reach an engine: the front door counts them
    (`Obs.shed_rps`, `names.METRIC_FRONT_DOOR_REJECTED`).
    """

    def __init__(self) -> None:
        self._t = np.empty(1024)
        self._p = np.empty(1024)
        self.n = 0

    def add(self, t: float, prompt: float) -> None:
        """Count a request at `t`, with its prompt length."""
        n = self.n
        if n == self._t.size:  # grow by doubling; slices taken before stay valid (their own arrays)
            self._t = np.concatenate([self._t, np.empty(n)])
            self._p = np.concatenate([self._p, np.empty(n)])
        self._t[n] = t
        self._p[n] = prompt
        self.n = n + 1

    @property
    def times(self) -> np.ndarray:
        return self._t[: self.n]

    @property
    def prompts(self) -> np.ndarray:
        return self._p[: self.n]

    def count(self, a: float, b: float) -> int:
        """Requests counted in [a, b)."""
        i, j = np.searchsorted(self.times, [a, b])
        return int(j - i)

    def prompt_stats(self, a: float, b: float) -> tuple[int, float | None, float | None]:
        """(requests counted in [a, b), their prompt mean and standard deviation; None without any)."""
        i, j = np.searchsorted(self.times, [a, b])
        if j <= i:
            return 0, None, None
        p = self.prompts[i:j]
        return int(j - i), float(p.mean()), float(p.std())


class _EvalCluster(Cluster):
    """The simulator's cluster, remembering when each request finished (for its mean ITL) and
    when the engines count it (`EngineCounts`)."""

    def __init__(self, *a: Any, **kw: Any) -> None:
        self.done_at: dict[int, float] = {}
        self.engine_counts = EngineCounts()
        super().__init__(*a, **kw)
        self._count_at_prefill = self.placement == "disaggregated"

    def pf_done(self, worker: Any, job: Job, now: float) -> None:
        if self._count_at_prefill:
            self.engine_counts.add(now, job.prompt)
        super().pf_done(worker, job, now)

    def serve_done(self, worker: Any, job: Job, now: float) -> None:
        super().serve_done(worker, job, now)
        self.done_at[job.id] = now
        if not self._count_at_prefill:
            self.engine_counts.add(now, job.prompt)


class _Loop:
    """Cluster + pool membership (starting / serving / draining) + GPU-hour integral."""

    def __init__(self, s: EvalSettings, pol: Policy, init: dict[str, int]) -> None:
        self.s = s
        self.pol = pol
        self.pools = pol.pools
        self.cl = _EvalCluster(s.models, sim_config(s, init, self.pools), now=0.0)
        self.startup = 0.0 if pol.instant else s.startup_s
        self.ctrl: list[tuple[float, int, str, Any]] = []
        self.seq = 0
        self.starting: dict[str, list[int]] = {p: [] for p in self.pools}  # tokens of starting workers
        self.waiting: dict[str, int] = dict.fromkeys(self.pools, 0)  # requested, no GPU free (budget)
        self.draining: list[Any] = []
        self.alloc = {p: len(self.cl.pools[p]) for p in self.pools}  # workers holding GPUs
        self.gpu_s = 0.0
        self.t_last = 0.0
        self.actions = 0
        self.drained = 0
        self.lost_removed = 0
        self.busy_prev: dict[Any, float] = {}
        self.t_prev_util = 0.0
        self.queue_samples: list[tuple[float, int]] = []
        self.in_system_samples: list[tuple[float, float]] = []  # (scrape time, `Obs.arrival_pool_in_system`)
        # The back pool's time integrals at each scrape: (t, KV usage-seconds, sequence-seconds),
        # cumulative over every worker it ever had (`kv_integrals`), for the window averages.
        self.kv_samples: list[tuple[float, float, float]] = []
        self.kv_retired = (0.0, 0.0)  # the integrals of removed back workers
        # (scrape time, engines of the front pool reporting): `Obs.prefill_serving_min`'s samples
        self.front_samples: list[tuple[float, int]] = []

    def queued(self) -> int:
        cl = self.cl
        n = len(cl.unplaced)
        for w in cl.pools[names.POOL_ENCODER]:
            n += len(w.queue)
        for w in cl.pools[names.POOL_PREFILL]:
            n += len(w.queue)
        for w in cl.pools[names.POOL_DECODE]:
            n += len(w.waiting) + len(w.pq)  # waiting for a slot, or for a local prefill
        return n

    # ---- bookkeeping
    def _integrate(self, now: float) -> None:
        g = self.s.gpus_per_replica
        self.gpu_s += sum(self.alloc[p] * g.get(p, 1) for p in self.pools) * (now - self.t_last)
        self.t_last = now

    def push(self, t: float, kind: str, data: Any = None) -> None:
        self.seq += 1
        heappush(self.ctrl, (t, self.seq, kind, data))

    def serving(self, p: str) -> list[Any]:
        return [w for w in self.cl.pools[p] if not w.draining]

    def requested(self) -> dict[str, int]:
        return {p: len(self.serving(p)) + len(self.starting[p]) + self.waiting[p] for p in self.pools}

    def used_gpus(self) -> int:
        g = self.s.gpus_per_replica
        return sum(self.alloc[p] * g.get(p, 1) for p in self.pools)

    def _start(self, p: str, now: float) -> None:
        self._integrate(now)
        self.alloc[p] += 1
        self.seq += 1
        tok = self.seq
        self.starting[p].append(tok)
        if self.startup <= 0:
            self._ready(p, tok, now)
        else:
            self.push(now + self.startup, "ready", (p, tok))

    def _ready(self, p: str, tok: int, now: float) -> None:
        if tok in self.starting[p]:
            self.starting[p].remove(tok)
            self.cl.add_worker(p, now)

    def _admit_waiting(self, now: float) -> None:
        b = self.s.gpu_budget
        for p in self.pools:
            while self.waiting[p] > 0 and (
                b is None or self.used_gpus() + self.s.gpus_per_replica.get(p, 1) <= b
            ):
                self.waiting[p] -= 1
                self._start(p, now)

    # ---- applying targets
    def apply(self, targets: dict[str, int], now: float) -> None:
        changed = False
        for p in self.pools:
            diff = int(targets[p]) - self.requested()[p]
            if diff > 0:
                changed = True
                for w in [w for w in self.cl.pools[p] if w.draining][:diff]:
                    self.cl.set_draining(w, False, now)  # cancel a drain: instantly back
                    self.draining.remove(w)
                    diff -= 1
                self.waiting[p] += diff
            elif diff < 0:
                changed = True
                k = -diff
                while k and self.waiting[p]:
                    self.waiting[p] -= 1
                    k -= 1
                while k and self.starting[p]:
                    self._integrate(now)
                    self.starting[p].pop()  # newest first; its "ready" event is ignored
                    self.alloc[p] -= 1
                    k -= 1
                if k:
                    victims = sorted(self.serving(p), key=lambda w: (self.cl.in_flight(w), w.name))[:k]
                    for w in victims:
                        if self.pol.drains:
                            self.cl.set_draining(w, True, now)
                            self.draining.append(w)
                        else:
                            self._remove(w, now)
        if changed:
            self.actions += 1
        self._admit_waiting(now)
        if self.draining:
            self._poll_drains(now)

    def _remove(self, w: Any, now: float) -> None:
        self._integrate(now)
        if w.role == back_pool(self.pools) and math.isfinite(w.kv_tokens):
            w._account(now)
            u, n = self.kv_retired
            self.kv_retired = (u + w.kv_area / w.kv_tokens, n + w.slot_area)
        lost = self.cl.remove_worker(w, now)
        self.lost_removed += len(lost)
        self.alloc[w.role] -= 1

    def _poll_drains(self, now: float) -> None:
        still = []
        for w in self.draining:
            if self.cl.in_flight(w) == 0 and self.cl.pending_kv_sends(w) == 0:
                self._remove(w, now)
                self.drained += 1
            else:
                still.append(w)
        self.draining = still
        if self.draining:
            self.push(now + self.s.drain_poll_s, "drain")
        self._admit_waiting(now)

    # ---- utilisation since the last decision (HPA signal)
    def kv_integrals(self, now: float) -> tuple[float, float, float]:
        """(now, KV usage-seconds, sequence-seconds) of the back pool since the start: the time
        integrals of its workers' summed kv_cache_usage_perc and num_requests_running gauges."""
        u, n = self.kv_retired
        for w in self.cl.pools[back_pool(self.pools)]:
            if math.isfinite(w.kv_tokens):
                w._account(now)
                u += w.kv_area / w.kv_tokens
                n += w.slot_area
        return now, u, n

    def kv_gauges(self, lo: float, hi: float) -> dict[str, float]:
        """The back pool's running sequences now, and its summed KV usage and running sequences
        averaged over the scrapes in [lo, hi] (the operator's avg_over_time over its window)."""
        ws = self.serving(back_pool(self.pools))
        if not ws:
            return {}
        out = {"back_running": float(sum(len(w.batch) for w in ws))}
        inside = [x for x in self.kv_samples if x[0] <= hi + 1e-9]
        if inside:
            end = inside[-1]
            start = next((x for x in reversed(inside) if x[0] <= lo + 1e-9), self.kv_samples[0])
            span = end[0] - start[0]
            if span > 0:
                out["kv_usage_sum"] = (end[1] - start[1]) / span
                out["kv_running"] = (end[2] - start[2]) / span
        return out

    def utilisation(self, now: float) -> dict[str, float]:
        out = {}
        dt = max(1e-9, now - self.t_prev_util)
        for p in self.pools:
            ws = self.cl.pools[p]
            if not ws:
                out[p] = 0.0
                continue
            tot = 0.0
            for w in ws:
                if p == names.POOL_DECODE:
                    w._account(now)
                    v = w.slot_area / w.slots
                else:
                    v = w.busy_s + ((now - w.t_start) if w.cur is not None else 0.0)
                prev = self.busy_prev.get(w)
                if prev is None:
                    prev = v
                    age = now - self.cl.life[w][0]
                    if age < dt:  # joined in this interval: count from its start
                        prev = v - min(v, age)
                tot += v - prev
                self.busy_prev[w] = v
            out[p] = min(1.0, tot / (dt * len(ws)))
        self.t_prev_util = now
        return out


@dataclass
class PolicyResult:
    name: str
    metrics: dict[str, Any]
    timeline: list[dict[str, Any]]


def _pct(a: np.ndarray, q: float) -> float | None:
    return float(np.percentile(a, q)) if a.size else None


def _gap(h: Any, q: float) -> float | None:
    return (h.max if q >= 1.0 else h.percentile(q)) if h.count else None


def run_policy(
    name: str,
    w: Workload,
    s: EvalSettings,
    progress: Callable[[str], None] | None = None,
    make: Callable[[EvalSettings, Workload, Any], Policy] | None = None,
) -> PolicyResult:
    """Replay `w` under policy `name` (or the one `make` builds) on virtual time; metrics and a timeline."""
    classes = _policy_classes()
    if make is None and name not in classes:
        raise ValueError(f"unknown policy {name!r}; choose from {', '.join(POLICIES)}")
    pre = _Prefix(w)
    pol = (make or classes[name])(s, w, pre)
    init = pol.initial()
    lp = _Loop(s, pol, init)
    cl = lp.cl
    pol.attach(cl)
    if pol.admits:
        cl.set_admission(pol.last_admitted)
    arrival = w.arrival_s.tolist()
    prompt = w.prompt_tokens.tolist()
    output = w.output_tokens.tolist()
    media = w.media_items.tolist()
    n = len(arrival)
    jobs: list[Job] = []
    ttft_target = cl.ttft_target_s
    short_s = autoscaler.SHORT_WINDOW_SCRAPES * s.scrape_s  # the operator's short rate window
    lp.push(s.scrape_s, "scrape")
    lp.push(s.interval_s, "tick")
    timeline: list[dict[str, Any]] = []
    done_i = 0
    # The TTFT and prefill queue-time histograms as the engines fill them: a TTFT when the first
    # token comes out, a queue wait when the prefill starts (`Cluster.first_token_log`), not when
    # the request finishes, which for a long output is minutes later.
    cl.first_token_log, cl.prefill_wait_log = [], []
    ttft_window: list[tuple[float, float]] = []  # (first-token time, ttft) of recent first tokens
    wait_window: list[tuple[float, float]] = []  # (start time, queue wait) of recent prefills
    # The engines observe a request's output length when it finishes (the decode pool's
    # generation-tokens histogram), so the output shape a decision sees is that of the requests
    # finished in its window, not of those that arrived in it: after a shift to longer outputs
    # it shows only once they are done. The `disagg` policy sees none from a window that
    # finished none (the operator then holds its shape); the baselines, which keep no shape of
    # their own, are given the last window's (before the first request finishes, the arrivals').
    finished_outputs: list[tuple[float, int]] = []  # (done time, output tokens) of recent completions
    held_outputs: list[int] = []
    shed_at: list[float] = []  # arrival times of the requests shed at the front door, in order
    t_end_arrivals = arrival[-1] if n else 0.0
    report_every = max(1, n // 10)
    i = 0
    heap = cl.heap
    while True:
        t_ctrl = lp.ctrl[0][0] if lp.ctrl else INF
        t_arr = arrival[i] if i < n else INF
        if t_arr == INF and (t_ctrl == INF or (cl.next_event_time() == INF and not lp.draining)):
            break
        if t_arr <= t_ctrl:
            if heap and heap[0][0] <= t_arr:
                cl.advance(t_arr)
            job = Job(i, t_arr, prompt[i], output[i], media[i], None, t_arr + ttft_target(prompt[i]))
            cl.submit(job, t_arr)
            if job.state == REJECTED:  # shed at the front door: its counter's, no engine sees it
                shed_at.append(t_arr)
            jobs.append(job)
            i += 1
            if progress is not None and i % report_every == 0:
                progress(f"{name}: {i}/{n} requests, t={t_arr:.0f}s")
            continue
        t, _, kind, data = heappop(lp.ctrl)
        cl.advance(t)
        if kind == "ready":
            lp._ready(data[0], data[1], t)
        elif kind == "drain":
            if lp.draining and not any(c[2] == "drain" for c in lp.ctrl):
                lp._poll_drains(t)
        elif kind == "scrape":
            lp.queue_samples = [*lp.queue_samples[-3:], (t, lp.queued())]
            # what arrived and the engines have not counted yet (the shed never reach them)
            held = i - cl.engine_counts.n - len(shed_at)
            lp.in_system_samples = [*lp.in_system_samples[-3:], (t, float(held))]
            lp.kv_samples.append(lp.kv_integrals(t))
            if len(lp.kv_samples) > s.window_s / s.scrape_s + 4:  # a window's worth is enough
                del lp.kv_samples[0]
            # every engine of the front pool that serves metrics, draining ones too, as a count of
            # its running-requests series reads them
            lp.front_samples.append((t, len(cl.pools[front_pool(lp.pools)])))
            if len(lp.front_samples) > s.window_s / s.scrape_s + 4:
                del lp.front_samples[0]
            if i < n or cl.next_event_time() != INF:
                lp.push(t + s.scrape_s, "scrape")
        elif kind == "tick":
            # completions since the last tick, for the generation-tokens histogram
            while done_i < len(cl.r_done):
                finished_outputs.append((cl.r_done[done_i], output[cl.r_id[done_i]]))
                done_i += 1
            ts = t - s.scrape_s  # one scrape interval late
            lo = ts - s.window_s
            ttft_window = [x for x in (*ttft_window, *cl.first_token_log) if x[0] >= lo]
            wait_window = [x for x in (*wait_window, *cl.prefill_wait_log) if x[0] >= lo]
            cl.first_token_log.clear()
            cl.prefill_wait_log.clear()
            finished_outputs = [x for x in finished_outputs if x[0] >= lo]
            cnt, pm, ps, om, os_ = pre.stats(lo, ts)
            in_system = shed_rps = shed_rps_short = None
            if pol.reads_engine_counts:  # the requests the engines counted, not the arrivals
                cnt, pm, ps = cl.engine_counts.prompt_stats(lo, ts)
                cnt_short = cl.engine_counts.count(ts - short_s, ts)
                in_system = next((n for tq, n in reversed(lp.in_system_samples) if tq <= ts + 1e-9), 0.0)
                if shed_at:  # the front door's counter (no series before it shed anything)
                    upto = bisect_left(shed_at, ts)
                    shed_rps = (upto - bisect_left(shed_at, lo)) / min(s.window_s, max(ts, s.scrape_s))
                    shed_rps_short = (upto - bisect_left(shed_at, ts - short_s)) / min(
                        short_s, max(ts, s.scrape_s)
                    )
            else:  # a front-door counter: the arrivals
                cnt_short = pre.stats(ts - short_s, ts)[0]
            done_outputs = [x[1] for x in finished_outputs if x[0] < ts]
            if done_outputs:
                held_outputs = done_outputs
            if held_outputs:
                om, os_ = float(np.mean(held_outputs)), float(np.std(held_outputs))
            # the replay starts at t=0: early windows are divided by the part they cover
            # (the load is taken to have been running before), not read as a ramp from zero
            covered = min(s.window_s, max(ts, s.scrape_s))
            media_fraction, items_per_request = pre.media(lo, ts)
            seen = [x for x in ttft_window if x[0] < ts]
            waits = [x[1] for x in wait_window if x[0] < ts]
            # the engines' TTFT histogram over the window, per second as the operator's rate() reads
            # it (the error budget counts its requests; the queue-time histogram below likewise);
            # its SLO percentile is what the loop reads
            ttft_buckets = (
                tuple((le, c / covered) for le, c in ttft_histogram([x[1] for x in seen])) if seen else None
            )
            obs = Obs(
                now=t,
                rate=cnt / covered,
                count=cnt,
                prompt_mean=pm,
                prompt_std=ps,
                output_mean=om,
                output_std=os_,
                output_finished_rps=len(done_outputs) / s.window_s,
                util=lp.utilisation(t),
                ready={p: len(lp.serving(p)) for p in lp.pools},
                requested=lp.requested(),
                pending=dict(lp.waiting),
                ttft_p=histogram_quantile(s.slo.percentile, ttft_buckets) if ttft_buckets else None,
                rate_short=cnt_short / min(short_s, max(ts, s.scrape_s)),
                queued=next((q for tq, q in reversed(lp.queue_samples) if tq <= ts + 1e-9), 0),
                arrival_pool_in_system=in_system,
                shed_rps=shed_rps,
                shed_rps_short=shed_rps_short,
                media_fraction=media_fraction,
                items_per_request=items_per_request,
                **lp.kv_gauges(lo, ts),
            )
            count_s = getattr(pol, "sizing_interval_s", None)
            if count_s is not None:
                counted = cl.engine_counts
                sizes, counts, growth, shed_counts = sizing_observation(
                    counted.times if pol.reads_engine_counts else w.arrival_s,
                    counted.prompts if pol.reads_engine_counts else w.prompt_tokens,
                    lo,
                    ts,
                    count_s,
                    done_outputs,
                    getattr(pol, "sizing_sizes", True),
                    arrived_s=w.arrival_s if pol.reads_engine_counts else None,
                    shed_s=shed_at,
                )
                obs = replace(
                    obs,
                    sizes=sizes,
                    arrival_counts=counts,
                    count_interval_s=count_s,
                    arrival_counts_growth=growth,
                    arrival_counts_shed=shed_counts,
                    # the TTFT and queue-time histograms the operator reads beside the token histograms
                    ttft_buckets=ttft_buckets if sizes is not None else None,
                    prefill_wait_buckets=(
                        tuple((le, c / covered) for le, c in cumulative_histogram(waits, QUEUE_TIME_BUCKETS))
                        if sizes is not None and waits
                        else None
                    ),
                    # the queue-time histogram's sum over its count, and the fewest front engines
                    # at the window's scrapes (the operator's min_over_time of their count)
                    prefill_wait_mean_s=sum(waits) / len(waits) if waits else None,
                    prefill_serving_min=min(
                        (float(k) for tk, k in lp.front_samples if lo - 1e-9 <= tk <= ts + 1e-9), default=None
                    ),
                )
            targets, _reason = pol.decide(obs)
            if pol.admits:
                cl.set_admission(pol.last_admitted)
            lp.apply(targets, t)
            true_n = pre.stats(t - s.interval_s, t)[0]
            timeline.append(
                {
                    "t": round(t, 3),
                    "arrival_rps": round(true_n / s.interval_s, 4),
                    "replicas": lp.requested(),
                    "gpus": lp.used_gpus(),
                }
            )
            if i < n or cl.next_event_time() != INF:
                lp.push(t + s.interval_s, "tick")
    end = max(cl.now, t_end_arrivals)
    lp._integrate(end)
    cl.close(end)
    metrics = _metrics(jobs, w, s, lp, end)
    metrics.update(pol.report())
    return PolicyResult(name, metrics, _downsample(timeline, s.timeline_points))


def _downsample(tl: list[dict[str, Any]], k: int) -> list[dict[str, Any]]:
    if len(tl) <= k:
        return tl
    idx = np.unique(np.linspace(0, len(tl) - 1, k).round().astype(int))
    return [tl[j] for j in idx]


def _sim_threshold(s: EvalSettings) -> int:
    """The simulator's split threshold (whole tokens) for conditional placement."""
    return max(0, min(10_000_000, math.ceil(s.threshold())))


def sim_config(s: EvalSettings, sizes: dict[str, int], pools: tuple[str, ...]) -> SimConfig:
    """The simulator's configuration for these settings, starting with `sizes` workers per pool
    (the evaluation loop and the hindsight searches configure their clusters alike)."""
    return SimConfig(
        placement=s.placement,
        prefill=max(1, sizes[names.POOL_PREFILL]),
        decode=max(1, sizes[names.POOL_DECODE]),
        encoder=max(1, sizes[names.POOL_ENCODER]) if names.POOL_ENCODER in pools else 0,
        split_threshold=_sim_threshold(s)
        if s.placement == "conditional"
        else names.SPLIT_THRESHOLD_DEFAULT_TOKENS,
        ttft_ms=s.slo.ttft_s * 1000.0,
        ttft_ms_per_1k_tokens=s.slo.ttft_s_per_1k_tokens * 1000.0,
        itl_ms=s.slo.itl_s * 1000.0,
        itl_statistic=s.slo.itl_statistic,
        seed=s.seed,
    )


# rounding allowance when a request's bare path is compared with its target (ms)
_SLACK_EPS_MS = 1e-9


def infeasible_mask(w: Workload, s: EvalSettings) -> np.ndarray:
    """Requests whose bare path (encoder for media, prefill, serial transfer if remote, one decode
    step) exceeds their TTFT target."""
    return _infeasible(_slack_ms(w, s))


def marginal_mask(w: Workload, s: EvalSettings) -> np.ndarray:
    """Feasible requests with less slack than one decode step at a full batch.

    Such a request meets its TTFT target only when its first decode step starts at
    once: on a decode worker that is idle, not one in the middle of a step (a newcomer
    joins the batch at the next step boundary, so a busy worker adds up to one step).
    Serving them at a percentile takes decode workers kept idle; the evaluation counts
    them in the attainment and reports them apart (`marginal_requests`) so a miss
    there can be told from a sizing error.
    """
    return _marginal(_slack_ms(w, s), s)


def _infeasible(slack_ms: np.ndarray) -> np.ndarray:
    return slack_ms < -_SLACK_EPS_MS


def _marginal(slack_ms: np.ndarray, s: EvalSettings) -> np.ndarray:
    full_step_ms = float(s.models.decode.step_ms(s.models.decode.slots))
    return (slack_ms >= -_SLACK_EPS_MS) & (slack_ms < full_step_ms)


def _slack_ms(w: Workload, s: EvalSettings) -> np.ndarray:
    """Each request's TTFT target less its bare path (ms): negative when out of reach on an idle system."""
    m = s.models
    p = w.prompt_tokens.astype(np.float64)
    items = w.media_items.astype(np.float64)
    remote = np.ones(len(p), dtype=bool)
    if s.placement == "conditional":
        remote = w.prompt_tokens >= _sim_threshold(s)
    bare = (
        np.asarray(m.prefill.service_ms(p))
        + np.where(remote, np.asarray(m.transfer.serial_ms(p)), 0.0)
        + np.where(items > 0, np.asarray(m.encoder.service_ms(items)), 0.0)
        + float(m.decode.step_ms(1))
    )
    return np.asarray(s.slo.ttft_target_s(p)) * 1000.0 - bare


#: Misses are counted per this many seconds of arrival time (`misses_by_minute`).
MISS_BUCKET_S = 60.0


def misses_by_minute(arrival_s: np.ndarray, feasible: np.ndarray, good: np.ndarray) -> dict[str, list[int]]:
    """Per minute of arrival (from 0), the feasible requests and how many of them missed the SLO.

    Where in time attainment was lost: a cold start (every miss in the first minutes), the
    bursts of a trace, or a steady share (a fleet too small all along) read alike as one
    attainment figure. Requests out of reach on an idle system are in neither count.
    """
    minute = (np.asarray(arrival_s, dtype=float) // MISS_BUCKET_S).astype(np.int64)
    n = int(minute.max()) + 1 if minute.size else 0
    return {
        "feasible": np.bincount(minute[feasible], minlength=n).tolist(),
        "missed": np.bincount(minute[feasible & ~good], minlength=n).tolist(),
    }


def _metrics(jobs: list[Job], w: Workload, s: EvalSettings, lp: _Loop, end: float) -> dict[str, Any]:
    n = len(jobs)
    ttft = np.full(n, np.inf)
    itl = np.full(n, np.inf)
    for k, j in enumerate(jobs):
        if j.state == DONE:
            ttft[k] = j.t_first - j.arrival
            itl[k] = j.itl  # the SLO's statistic of the request's inter-token gaps (SimConfig.itl_statistic)
    done = np.isfinite(ttft)
    admitted = np.array([j.state != REJECTED for j in jobs], dtype=bool)
    slack = _slack_ms(w, s)[:n]  # one pass for both masks
    infeasible = _infeasible(slack)
    target = np.asarray(s.slo.ttft_target_s(w.prompt_tokens[:n].astype(np.float64)))
    good = done & (ttft <= target + 1e-12) & (itl <= s.slo.itl_s + 1e-12)
    feas = ~infeasible
    nf = int(feas.sum())
    clear = feas & ~_marginal(slack, s)  # feasible with at least one step of slack
    n_clear = int(clear.sum())
    td, il = ttft[done], itl[done]
    lost = int(lp.cl.lost)
    return {
        "requests": n,
        "completed": int(done.sum()),
        "infeasible_requests": int(infeasible.sum()),
        "slo_attainment": float(good[feas].sum() / nf) if nf else None,
        "slo_attainment_all": float(good.sum() / n) if n else None,
        "marginal_requests": nf - n_clear,
        "slo_attainment_beyond_marginal": float(good[clear].sum() / n_clear) if n_clear else None,
        "misses_by_minute": misses_by_minute(w.arrival_s[:n], feas, good),
        "ttft_p50_s": _pct(td, 50),
        "ttft_p90_s": _pct(td, 90),
        "ttft_p99_s": _pct(td, 99),
        "itl_p50_s": _pct(il, 50),
        "itl_p90_s": _pct(il, 90),
        "itl_p99_s": _pct(il, 99),
        "gap_p50_s": _gap(lp.cl.gaps, 0.5),  # every inter-token gap of every completed request
        "gap_p99_s": _gap(lp.cl.gaps, 0.99),
        "gap_max_s": _gap(lp.cl.gaps, 1.0),
        "gpu_hours": lp.gpu_s / 3600.0,
        "gpu_hours_vs_oracle": None,
        "scaling_actions": lp.actions,
        "drains": lp.drained,
        "lost_requests": lost,
        "failed_requests": int(lp.cl.failed),
        "rejected_requests": int(lp.cl.rejected),
        "slo_attainment_admitted": (
            float(good[feas & admitted].sum() / max(1, int((feas & admitted).sum()))) if nf else None
        ),
        "duration_s": end,
        "drains_workers": lp.pol.drains,
    }


def evaluate(
    w: Workload,
    policies: list[str] | tuple[str, ...] = POLICIES,
    s: EvalSettings | None = None,
    progress: Callable[[str], None] | None = None,
    *,
    curves: bool = False,
    best_static: bool = True,
    references: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Run every policy on `w`; JSON-ready result measured against the hindsight references.

    The hindsight oracle runs unless reused (``references.oracle``); the best fixed fleet
    unless `best_static` is False (``references.best_static``; without it the oracle
    has no fixed-fleet floor, see `yardstick.hindsight_oracle`). The fluid bound
    always (``references.fluid_bound``). With `curves`, every
    policy also runs at each setting of its knob (`disagg.yardstick.KNOBS`):
    ``policies.<name>.curve``; ``gpu_hours_at`` reads the GPU-hours for 95 % and
    99 % attainment off the curve (off the default run alone without `curves`).

    `references`: an earlier result of this function (its JSON) for the same requests and
    the same settings but `POLICY_ONLY_SETTINGS` (``reference_key``): its references are
    used instead of searching them again (``references.reused``), and so is its oracle
    run when the oracle is a listed policy; `ReferencesMismatch` names what differs otherwise.
    """
    from disagg import yardstick

    s = s or EvalSettings()
    classes = _policy_classes()
    for p in policies:
        if p not in classes:
            raise ValueError(f"unknown policy {p!r}; choose from {', '.join(POLICIES)}")
    check_attainable(w, s)
    names = list(dict.fromkeys(policies))
    key = reference_key(w, s)
    refs: dict[str, Any] | None = None
    res: dict[str, PolicyResult] = {}
    if references is not None:
        refs, earlier_oracle = reused_references(
            references, key, best_static=best_static, oracle_policy="oracle" in names
        )
        if earlier_oracle is not None:
            res["oracle"] = earlier_oracle
    run_names = [p for p in names if p not in res]
    if refs is None and "oracle" not in run_names:
        run_names.append("oracle")
    for p in run_names:
        if progress is not None:
            progress(f"running {p} ...")
        if p == "oracle":  # the oracle's search also finds the best fixed fleet (its floor)
            hindsight = yardstick.hindsight_oracle(w, s, progress=progress, fixed_floor=best_static)
            res[p] = hindsight.oracle
        else:
            res[p] = run_policy(p, w, s, progress)
    if refs is not None:
        found: dict[str, Any] = refs
        om = refs["oracle"]
    else:
        om = res["oracle"].metrics
        found = {"oracle": _reference(om)}
        if best_static:
            found["best_static"] = {
                **_reference(hindsight.fixed_metrics),
                **hindsight.fixed_stats.to_dict(),
            }
        found["fluid_bound"] = yardstick.fluid_bound(w, s)
    oracle_h = om["gpu_hours"]
    points: dict[str, list[dict[str, Any]]] = {}
    earlier_curve = None
    if refs is not None:  # the oracle did not run: its point (and curve) are the earlier run's
        earlier_curve = references.get("policies", {}).get("oracle", {}).get("curve") if references else None
        points["oracle"] = earlier_curve if curves and earlier_curve else [_default_point("oracle", om, s)]
        if curves and not earlier_curve:  # an earlier run without --curves: search the rest
            others = [v for v in yardstick.KNOBS["oracle"][1] if v != points["oracle"][0]["value"]]
            points["oracle"] = sorted(
                points["oracle"] + yardstick.curve("oracle", w, s, others, progress), key=lambda x: x["value"]
            )
    for p in run_names:
        knob, values = yardstick.KNOBS.get(p, (None, ()))
        default_point = _default_point(p, res[p].metrics, s)
        points[p] = [default_point]
        if curves and knob:
            others = [v for v in values if v != default_point["value"]]
            points[p] += yardstick.curve(p, w, s, others, progress)
            points[p].sort(key=lambda x: x["value"])
    at = {
        p: {f"{a:g}": yardstick.gpu_hours_at(points[p], a) for a in yardstick.ATTAINMENT_TARGETS}
        for p in points
    }
    if refs is not None and curves and earlier_curve:  # the oracle's curve is the earlier run's
        at["oracle"] = refs["oracle"]["gpu_hours_at"]
    out = {}
    for p in names:
        m = dict(res[p].metrics)
        m.setdefault("rejected_requests", 0)  # nothing sheds load unless the loop admits less
        m["gpu_hours_vs_oracle"] = m["gpu_hours"] / oracle_h if oracle_h > 0 else None
        m["gpu_hours_at"] = at[p]
        m["gpu_hours_at_vs_oracle"] = {
            k: (v / at["oracle"][k] if v is not None and at["oracle"][k] else None) for k, v in at[p].items()
        }
        if curves:
            m["curve"] = points[p]
        m["timeline"] = res[p].timeline
        out[p] = m
    found["oracle"]["gpu_hours_at"] = at["oracle"]
    return {
        "trace": w.name,
        "workload": {
            "requests": len(w),
            "duration_s": w.duration_s,
            "mean_rate": w.mean_rate,
            "prompt_tokens_mean": float(w.prompt_tokens.mean()) if len(w) else None,
            "output_tokens_mean": float(w.output_tokens.mean()) if len(w) else None,
            "media_fraction": float((w.media_items > 0).mean()) if len(w) else 0.0,
        },
        "settings": {**s.to_dict(), "curves": curves},
        "reference_key": key,
        "references": found,
        "policies": out,
    }


def _default_point(p: str, m: dict[str, Any], s: EvalSettings) -> dict[str, Any]:
    """A policy's point at its default setting, on its knob's curve (`yardstick.KNOBS`)."""
    from disagg import yardstick

    knob = yardstick.KNOBS.get(p, (None, ()))[0]
    return {
        "knob": knob,
        "value": yardstick.knob_value(s, knob) if knob else None,
        **{k: m.get(k, 0) for k in ("slo_attainment", "gpu_hours", "lost_requests")},
        "rejected_requests": m.get("rejected_requests", 0),
        "default": True,
    }


def _reference(m: dict[str, Any]) -> dict[str, Any]:
    keys = (
        "slo_attainment",
        "slo_attainment_beyond_marginal",
        "gpu_hours",
        "lost_requests",
        "rejected_requests",
        "target_attainment",
    )
    ref = {k: m[k] for k in keys if k in m}
    for k in (
        "replicas",
        "replicas_mean",
        "replicas_max",
        "simulations",
        "search_wall_s",
        "target_reached",
        "replays",
        "short_intervals",
        "schedule_source",
    ):
        if k in m:
            ref[k] = m[k]
    return ref


def with_startup(s: EvalSettings, startup_s: float) -> EvalSettings:
    return replace(s, startup_s=startup_s)
