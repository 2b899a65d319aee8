"""Baseline autoscalers for `disagg evaluate`: Dynamo's SLA planner and a KEDA-style queue rule.

Pure (the stage models and the evaluation's `Policy`). Each rule is written as
pure functions of the observations (tested against hand-computed numbers) and a
thin `Policy` that feeds them from the simulated cluster.

``dynamo`` follows ai-dynamo/dynamo's SLA planner (components/src/dynamo/planner),
as read there; docs/evaluation.md lists the facts and files:

* defaults (defaults.py): adjustment interval 180 s, min_endpoint 1 replica per
  pool, load predictor "arima", correction factors on;
* every interval it reads, over the last interval, the mean TTFT and ITL, the
  request count, mean ISL and OSL and mean request duration (planner_core.py);
  a None or NaN metric skips the interval (Metrics.is_valid);
* prefill (prefill_planner.py): p_cf = TTFT_obs / TTFT_profile(ISL);
  replicas = ceil(num_req x ISL / T x min(1, p_cf) / prefill throughput per GPU(ISL)
  / GPUs per replica), at least min_endpoint;
* decode (decode_planner.py): d_cf = ITL_obs / ITL_profile(concurrency per worker,
  context ISL + OSL/2), concurrency = num_req / decode workers x request duration / T;
  replicas = ceil(num_req x OSL / T / best decode throughput per GPU with ITL at most
  ITL_target / d_cf / GPUs per replica), at least min_endpoint (min_endpoint when no
  batch meets the corrected target);
* a GPU budget squeezes prefill to floor(n_p x B / total) (at least min_endpoint,
  leaving min_endpoint decode replicas) and gives decode the rest
  (planner_core._apply_global_gpu_budget);
* encoder (a media workload's encoder pool; Dynamo's planner sizes prefill and
  decode only, so this is its throughput rule carried over, "phase 1": no
  correction factor): replicas = ceil(media requests x items per media request /
  T / encoder items/s per GPU / GPUs per replica), at least min_endpoint; under a
  GPU budget the encoder keeps what leaves min_endpoint prefill and decode
  replicas, and prefill and decode share the rest as above;
* a request made while the deployment is not ready is ignored
  (kubernetes_connector.set_component_replicas); scale-in deletes replicas, no drain.

Load predictor: Dynamo's default ARIMA (disagg.forecast.ArimaPredictor; the
predictors live in utils/load_predictor.py), one per series as Dynamo keeps one for
the request count, ISL and OSL (planner_core.BasePlanner), each fed every interval
(a None or NaN reading counts as 0, as there) before the validity check, and asked
for the next interval's value; the media series (an extension) get their own.
``EvalSettings.dynamo_predictor = "constant"`` gives Dynamo's constant predictor
(next = last). With fewer than 5 points ARIMA returns the last value: the first
15 minutes at 180 s behave as the constant predictor.

The "profile" is this project's stage models, the planner's own view of the hardware:
TTFT_profile(ISL) = prefill service time, prefill throughput = ISL / that time,
ITL_profile(concurrency) = decode step time at that batch (the models ignore context
length), best decode throughput = the largest batch whose step fits the target,
divided by its step.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from disagg.evaluate import EvalSettings, Obs, Policy, hpa_behaviour
from disagg.forecast import PREDICTORS, ConstantPredictor
from disagg.model import StageModels
from disagg.names import POOL_DECODE, POOL_ENCODER, POOL_PREFILL
from disagg.workload import Workload

__all__ = [
    "DYNAMO_ADJUSTMENT_INTERVAL_S",
    "DYNAMO_MIN_ENDPOINT",
    "POLICY_CLASSES",
    "DynamoMetrics",
    "DynamoPolicy",
    "KedaPolicy",
    "dynamo_budget",
    "dynamo_corrections",
    "dynamo_decode_replicas",
    "dynamo_encoder_budget",
    "dynamo_encoder_replicas",
    "dynamo_prefill_replicas",
    "keda_desired",
]

DYNAMO_ADJUSTMENT_INTERVAL_S = 180.0  # defaults.py BasePlannerDefaults.adjustment_interval
DYNAMO_MIN_ENDPOINT = 1  # defaults.py BasePlannerDefaults.min_endpoint
# the series Dynamo forecasts (request count, mean ISL, mean OSL) and this baseline's media ones
DYNAMO_SERIES = ("num_req", "isl", "osl", "media_req", "items")


@dataclass(frozen=True)
class DynamoMetrics:
    """What Dynamo's planner reads over one adjustment interval (None: no data)."""

    num_req: float | None  # requests in the interval
    isl: float | None  # mean input tokens
    osl: float | None  # mean output tokens
    ttft_ms: float | None  # mean TTFT
    itl_ms: float | None  # mean inter-token latency
    request_duration_s: float | None  # mean request duration
    media_req: float | None = None  # requests with media in the interval
    items: float | None = None  # mean media items per media request

    def is_valid(self) -> bool:
        """Dynamo's Metrics.is_valid: TTFT, ITL, ISL and OSL present and not NaN."""
        return all(
            v is not None and not math.isnan(v) for v in (self.ttft_ms, self.itl_ms, self.isl, self.osl)
        )


def _ttft_profile_ms(models: StageModels, isl: float) -> float:
    return float(models.prefill.service_ms(max(isl, 0.0)))


def _itl_profile_ms(models: StageModels, concurrency: float) -> float:
    return float(models.decode.step_ms(max(1.0, min(float(models.decode.slots), concurrency))))


def dynamo_corrections(
    m: DynamoMetrics,
    models: StageModels,
    decode_workers: int,
    interval_s: float,
    previous: tuple[float, float] = (1.0, 1.0),
) -> tuple[float, float]:
    """(p_cf, d_cf): observed / profiled TTFT and ITL; d_cf kept when there is no decode worker."""
    p_cf = float(m.ttft_ms) / _ttft_profile_ms(models, float(m.isl))
    d_cf = previous[1]
    if decode_workers > 0 and m.num_req is not None and m.request_duration_s is not None:
        concurrency = m.num_req / decode_workers * m.request_duration_s / interval_s
        d_cf = float(m.itl_ms) / _itl_profile_ms(models, concurrency)
    return p_cf, d_cf


def _replicas_for(demand_per_s: float, per_gpu: float, gpus_per_replica: int, min_endpoint: int) -> int:
    """ceil(demand / per-GPU rate / GPUs per replica), at least min_endpoint (Dynamo's rounding)."""
    n = math.ceil(demand_per_s / per_gpu / gpus_per_replica - 1e-9)
    return max(n, min_endpoint)


def dynamo_prefill_replicas(
    num_req: float,
    isl: float,
    p_cf: float,
    interval_s: float,
    models: StageModels,
    gpus_per_replica: int = 1,
    min_endpoint: int = DYNAMO_MIN_ENDPOINT,
) -> int:
    """ceil(num_req x ISL / T x min(1, p_cf) / prefill tokens/s per GPU / GPUs per replica)."""
    tokens_per_s = num_req * isl / interval_s * min(1.0, p_cf)
    per_gpu = max(isl, 1e-9) * 1000.0 / _ttft_profile_ms(models, isl) / gpus_per_replica
    return _replicas_for(tokens_per_s, per_gpu, gpus_per_replica, min_endpoint)


def dynamo_decode_replicas(
    num_req: float,
    isl: float,
    osl: float,
    d_cf: float,
    interval_s: float,
    models: StageModels,
    itl_target_ms: float,
    gpus_per_replica: int = 1,
    min_endpoint: int = DYNAMO_MIN_ENDPOINT,
) -> int:
    """ceil(num_req x OSL / T / best tokens/s per GPU with ITL <= target / d_cf / GPUs per replica).

    `isl` only sets the context length (ISL + OSL/2) Dynamo interpolates at; the
    stage models do not depend on it.
    """
    corrected_itl = itl_target_ms / d_cf if d_cf > 0 else itl_target_ms
    batch = models.decode.max_batch_for_itl(corrected_itl)
    if batch <= 0:
        return min_endpoint  # no batch meets the corrected target: Dynamo falls back to min_endpoint
    per_gpu = batch * 1000.0 / float(models.decode.step_ms(batch)) / gpus_per_replica
    tokens_per_s = num_req * osl / interval_s
    return _replicas_for(tokens_per_s, per_gpu, gpus_per_replica, min_endpoint)


def dynamo_encoder_replicas(
    media_req: float,
    items: float,
    interval_s: float,
    models: StageModels,
    gpus_per_replica: int = 1,
    min_endpoint: int = DYNAMO_MIN_ENDPOINT,
) -> int:
    """ceil(media requests x items / T / encoder items/s per GPU / GPUs per replica), throughput only.

    One GPU encodes a request of `items` items in ``encoder.service_ms(items)``
    (fixed cost + per item): ``items / that time`` items/s.
    """
    items = max(items, 1.0)
    items_per_s = media_req * items / interval_s
    per_gpu = items * 1000.0 / float(models.encoder.service_ms(items)) / gpus_per_replica
    return _replicas_for(items_per_s, per_gpu, gpus_per_replica, min_endpoint)


def dynamo_encoder_budget(
    n_e: int,
    budget: int | None,
    gpus_e: int = 1,
    gpus_p: int = 1,
    gpus_d: int = 1,
    min_endpoint: int = DYNAMO_MIN_ENDPOINT,
) -> tuple[int, int | None]:
    """(encoder replicas, GPUs left for prefill and decode): the encoder keeps at most what leaves
    min_endpoint prefill and decode replicas (and at least min_endpoint itself while that fits)."""
    if budget is None:
        return n_e, None
    room = budget - min_endpoint * (gpus_p + gpus_d)
    n_e = max(0, min(n_e, room // gpus_e))
    return n_e, budget - n_e * gpus_e


def dynamo_budget(
    n_p: int,
    n_d: int,
    budget: int | None,
    gpus_p: int = 1,
    gpus_d: int = 1,
    min_endpoint: int = DYNAMO_MIN_ENDPOINT,
) -> tuple[int, int]:
    """Dynamo's global GPU budget: prefill floor(n_p x B / total), decode the rest; (0, 0) if B is too small."""
    if budget is None:
        return n_p, n_d
    total = n_p * gpus_p + n_d * gpus_d
    if total <= budget:
        return n_p, n_d
    if budget < min_endpoint * (gpus_p + gpus_d):
        return 0, 0
    scale = budget / total
    max_p = math.floor((budget - min_endpoint * gpus_d) / gpus_p)
    p = max(min_endpoint, min(max_p, math.floor(n_p * scale)))
    d = max(min_endpoint, math.floor((budget - p * gpus_p) / gpus_d))
    return p, d


class DynamoPolicy(Policy):
    """`dynamo`: Dynamo's SLA planner at its defaults (see the module docstring)."""

    name = "dynamo"

    def __init__(self, s: EvalSettings, w: Workload, pre: Any) -> None:
        super().__init__(s, w, pre)
        self.drains = s.baseline_drain
        self.interval_s = DYNAMO_ADJUSTMENT_INTERVAL_S
        self.last_adjust = 0.0  # the planner starts with the deployment
        self.corrections = (1.0, 1.0)
        # one load predictor per series, as Dynamo keeps one each for requests, ISL and OSL
        self.predictors: dict[str, ConstantPredictor] = {
            k: PREDICTORS[s.dynamo_predictor]() for k in DYNAMO_SERIES
        }
        self.predicted: dict[str, float] = {}
        self.cluster: Any = None
        self.output = w.output_tokens
        self.skipped = 0

    def attach(self, cluster: Any) -> None:
        self.cluster = cluster

    def observe(self, now: float) -> DynamoMetrics:
        """The interval's metrics as Prometheus serves them, one scrape late."""
        ts = now - self.s.scrape_s
        lo = ts - self.interval_s
        n, pm, _ps, om, _os = self.pre.stats(lo, ts)
        share, items = self.pre.media(lo, ts)
        media_req, items = (float(n) * share, items) if n else (None, None)
        cl = self.cluster
        done = np.frombuffer(cl.r_done, dtype=np.float64) if len(cl.r_done) else np.zeros(0)
        sel = (done >= lo) & (done < ts)
        if n == 0 or not sel.any():
            return DynamoMetrics(float(n), None, None, None, None, None, media_req, items)
        ttft = np.frombuffer(cl.r_ttft, dtype=np.float64)[sel]
        itl = np.frombuffer(cl.r_itl, dtype=np.float64)[sel]
        arrival = np.frombuffer(cl.r_arrival, dtype=np.float64)[sel]
        ids = np.frombuffer(cl.r_id, dtype=np.int64)[sel]
        gaps = np.maximum(self.output[ids].astype(np.float64) - 1.0, 0.0)
        # the frontend's ITL histogram has one observation per token gap: a token-weighted mean
        itl_ms = float((itl * gaps).sum() / gaps.sum()) * 1000.0 if gaps.sum() > 0 else None
        return DynamoMetrics(
            num_req=float(n),
            isl=pm,
            osl=om,
            ttft_ms=float(ttft.mean()) * 1000.0,
            itl_ms=itl_ms,
            request_duration_s=float((done[sel] - arrival).mean()),
            media_req=media_req,
            items=items,
        )

    def decide(self, o: Obs) -> tuple[dict[str, int], str]:
        if o.now - self.last_adjust < self.interval_s - 1e-9:
            return dict(o.requested), "dynamo: between adjustments"
        self.last_adjust = o.now
        m = self.observe(o.now)
        for k in DYNAMO_SERIES:
            self.predictors[k].add(getattr(m, k))
        if not m.is_valid():
            self.skipped += 1
            return dict(o.requested), "dynamo: metrics None/NaN, skipped"
        self.corrections = dynamo_corrections(
            m, self.s.models, o.ready[POOL_DECODE], self.interval_s, self.corrections
        )
        self.predicted = {k: self.predictors[k].predict() for k in DYNAMO_SERIES}
        num_req, isl, osl, media_req, items = (self.predicted[k] for k in DYNAMO_SERIES)
        num_req *= self.s.capacity_scale
        media_req *= self.s.capacity_scale
        g = self.s.gpus_per_replica
        budget = self.s.gpu_budget
        out: dict[str, int] = {}
        if POOL_ENCODER in self.pools:
            n_e = dynamo_encoder_replicas(
                media_req, items, self.interval_s, self.s.models, g.get(POOL_ENCODER, 1)
            )
            out[POOL_ENCODER], budget = dynamo_encoder_budget(
                n_e, budget, g.get(POOL_ENCODER, 1), g.get(POOL_PREFILL, 1), g.get(POOL_DECODE, 1)
            )
        n_p = dynamo_prefill_replicas(
            num_req, isl, self.corrections[0], self.interval_s, self.s.models, g.get(POOL_PREFILL, 1)
        )
        n_d = dynamo_decode_replicas(
            num_req,
            isl,
            osl,
            self.corrections[1],
            self.interval_s,
            self.s.models,
            self.s.slo.itl_s * 1000.0,
            g.get(POOL_DECODE, 1),
        )
        out[POOL_PREFILL], out[POOL_DECODE] = dynamo_budget(
            n_p, n_d, budget, g.get(POOL_PREFILL, 1), g.get(POOL_DECODE, 1)
        )
        if any(o.ready[p] != o.requested[p] or o.pending.get(p, 0) for p in self.pools):
            return dict(o.requested), "dynamo: deployment not ready, request ignored"
        return out, "dynamo"

    def report(self) -> dict[str, Any]:
        fits = {k: p.fit.order for k, p in self.predictors.items() if getattr(p, "fit", None) is not None}
        return {"skipped_intervals": self.skipped, "predictor": self.s.dynamo_predictor, "arima_orders": fits}


def keda_desired(in_pool: float, per_replica: float, current: int, tolerance: float = 0.1) -> int:
    """HPA on an AverageValue metric: ceil(total / target per replica), unless within the tolerance."""
    if current > 0 and abs(in_pool / (current * per_replica) - 1.0) <= tolerance:
        return current
    return math.ceil(in_pool / per_replica - 1e-9)


class KedaPolicy(Policy):
    """`keda`: per pool, requests in the pool (running + waiting) over a target per replica.

    Every pool the workload needs (the encoder pool too when requests carry
    media), each on its own queue. Target per replica: what it serves at once
    (encoder 1, prefill 1, decode the largest batch meeting the ITL target) plus
    ``keda_queue_per_replica`` waiting. HPA
    semantics as `hpa`: 10 % tolerance, scale-up limit x2 or +4, 300 s scale-down
    stabilization; no drain. Gauges read at the decision (KEDA polls every 30 s).
    """

    name = "keda"

    def __init__(self, s: EvalSettings, w: Workload, pre: Any) -> None:
        super().__init__(s, w, pre)
        self.drains = s.baseline_drain
        self.cluster: Any = None
        self.hist: list[tuple[float, dict[str, int]]] = []
        batch = s.models.decode.max_batch_for_itl(s.slo.itl_s * 1000.0) or 1
        q = s.keda_queue_per_replica
        self.per_replica = {POOL_ENCODER: 1.0 + q, POOL_PREFILL: 1.0 + q, POOL_DECODE: batch + q}

    def attach(self, cluster: Any) -> None:
        self.cluster = cluster

    def in_pool(self) -> dict[str, int]:
        cl = self.cluster
        unplaced = dict.fromkeys(self.pools, 0)
        # "arrive": waiting for an encoder worker (only media requests do); "send": for a decode slot
        to_pool = {"arrive": "encoder" if POOL_ENCODER in self.pools else "prefill", "prefill": "prefill"}
        for what, _job in cl.unplaced:
            unplaced[to_pool.get(what, POOL_DECODE)] += 1
        return {p: sum(w.in_flight() for w in cl.pools[p]) + unplaced[p] for p in self.pools}

    def decide(self, o: Obs) -> tuple[dict[str, int], str]:
        s = self.s
        load = self.in_pool()
        wants = {}
        for p in self.pools:
            wants[p] = keda_desired(load[p], self.per_replica[p], o.ready[p])
        return hpa_behaviour(wants, self.hist, o, s), "keda"


POLICY_CLASSES: dict[str, Callable[..., Policy]] = {"dynamo": DynamoPolicy, "keda": KedaPolicy}
