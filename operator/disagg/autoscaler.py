"""The autoscaling decision, pure: one `decide(config, observation, state) -> Outcome`.

The operator's loop (disagg.loop) reads the cluster and Prometheus into an
`Observation`, calls `decide`, and applies the `Outcome`; `disagg evaluate`'s
`disagg` policy builds an `Observation` from the simulation and calls the same
`decide`. Both build the `Config` with `config_from_spec`.

One decision:

1. current replicas per pool: the Deployment's replicas minus the pods being
   drained (they are on their way out); pending pods are capacity already asked for;
2. calibration: fresh metrics add samples to the fitted stage models;
3. the rate to plan for (`policy.sizing_rate`) from the arrivals (the requests
   the engines counted plus the growth of those they hold uncounted,
   `arrivals_in_system`): fast attack from the short window
   (`SHORT_WINDOW_SCRAPES` scrapes), forecast one observed start-up ahead (a rise
   no further than the level bursts seen reach, `policy.burst_reach`), counting
   noise, backlog, observed-TTFT feedback;
4. the plan for that rate (its arrival term the counts' dispersion, or what the
   prefill queue's waits show beyond it, `wait_arrival_term`), and the floor (the plan for the observed rate: a
   budget rebalance never shrinks a donor below it);
5. `policy.decide`: stabilization, steps, budget;
6. what to do: pods to re-admit first on the way up, growth that fits the GPU
   budget now (the rest deferred while drained pods still hold GPUs), drains to
   start on the way down (victims with the least work).

The error budget (`budget_percentile`): while the requests judged over about the last
week have met TTFT more often than the SLO asks, the decision is made a second time
at a lower planning percentile, and that one is kept unless it would take a pool below
both what it holds and what the SLO percentile asks for.

Missing, stale or invalid metrics, or a plan the planner refuses, hold every pool.
`ScalerState` is everything remembered between decisions; it round-trips through
a bounded plain dict so the operator persists it in `status.scalerState`.

Pure: no Kopf, no Kubernetes client, no HTTP.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

from disagg import api, burstiness, drain, metrics, names, planner, policy, queueing, status
from disagg.calibration import Calibrator
from disagg.metrics import back_pool
from disagg.model import StageModels
from disagg.sizes import MIN_SIZE_SAMPLES, SizeDistribution, ttft_covers

__all__ = [
    "BURST_HORIZON_S",
    "COUNT_SCRAPES",
    "DEFAULT_LEAD_S",
    "DISPERSION_SPAN_S",
    "ERROR_BUDGET_MEMORY_S",
    "ERROR_BUDGET_SPREAD_S",
    "SHORT_WINDOW_SCRAPES",
    "Config",
    "DecisionRecord",
    "DrainOrder",
    "Observation",
    "Outcome",
    "PoolObservation",
    "ScalerState",
    "Tuning",
    "budget_percentile",
    "config_from_spec",
    "decide",
    "lead_time",
    "pool_observation",
    "startup_seconds",
]

#: The short rate window (fast attack on a real step up) spans this many scrape intervals.
SHORT_WINDOW_SCRAPES = 3
#: Arrival counts (burstiness, automatic headroom) are per this many scrape intervals: a
#: Prometheus `increase` needs two scrapes inside its sub-window.
COUNT_SCRAPES = 2
#: The index of dispersion is measured over the most recent this-many seconds of counts.
DISPERSION_SPAN_S = 600.0
#: The automatic headroom looks at the rises within this trailing horizon of counts.
BURST_HORIZON_S = 3600.0
#: Forecast horizon before any pod start-up has been observed.
DEFAULT_LEAD_S = 60.0
LEAD_MIN_S, LEAD_MAX_S = 5.0, 600.0
#: Start-up figures kept (the most recent pods').
MAX_STARTUP_SAMPLES = 50
#: In-system samples kept (`ScalerState.in_system`): a window and more at the shortest interval.
MAX_IN_SYSTEM_SAMPLES = 8
#: Calibration samples kept per stage.
MAX_CALIBRATION_SAMPLES = 240
#: The front load gain (`learnt_front_gain`): the least factor one lasting unpredicted TTFT
#: miss multiplies it by (more, up to its square, when the TTFT is more than that many times
#: the target), its ceiling, and its half-life while the target is met.
FRONT_GAIN_STEP = 2.0
FRONT_GAIN_MAX = 8.0
FRONT_GAIN_HALF_LIFE_S = 1800.0
#: Pools that queue requests for their first token: the front load gain sizes them.
FRONT_POOLS = (names.POOL_ENCODER, names.POOL_PREFILL)
#: The error budget (`budget_percentile`): the misses the SLO still lets through are spread
#: over at least the requests this many seconds bring at the current rate.
ERROR_BUDGET_SPREAD_S = 1800.0
#: Its counts fade with this time constant (`counted_slo`): the budget is about the last
#: week's, as an SLO is judged over days, not over every request since the deployment started.
ERROR_BUDGET_MEMORY_S = 7 * 86400.0
#: Token-shape keys remembered between windows that show no finished request.
SHAPE_KEYS = (
    "prompt_tokens_mean",
    "prompt_tokens_std",
    "output_tokens_mean",
    "output_tokens_std",
    "media_fraction",
    "media_items_per_request",
    "kv_footprint_tokens",
)
#: Requests the last token shape counts for against a window's (`weighed_shape`): as many
#: as a size distribution is built from at the least.
SHAPE_PRIOR_REQUESTS = float(MIN_SIZE_SAMPLES)
#: Running sequences on the back pool below which its KV usage says too little about the
#: footprint of one sequence to replace the estimate from the token means.
MIN_FOOTPRINT_SEQUENCES = 8


# --------------------------------------------------------------------------- config


@dataclass(frozen=True)
class Tuning:
    """Sizing-rate knobs that are not part of the spec (`disagg evaluate` can vary them).

    The defaults are `policy.sizing_rate`'s, which is what the operator runs.
    """

    z: float = 1.645  # standard deviations of Poisson counting noise planned for
    backlog_drain_s: float = 60.0  # clear an observed queue within this time
    backlog_lead_s: float | None = None  # project queue growth this far (None: the lead time)
    ttft_feedback: bool = True  # observed TTFT well below target: plan for the observation
    ttft_comfort: float = 0.5  # ... "well below" = at most this fraction of the target
    within_burst_reach: bool = True  # a rise's projection and the headroom stop at the level bursts reach


@dataclass(frozen=True)
class Config:
    """What `decide` needs from a DisaggDeployment spec (built by `config_from_spec`)."""

    pools: tuple[str, ...]
    planning: api.PlannerInputs
    base_policy: policy.PolicyConfig  # forecast horizon set per decision from observed start-ups
    window_s: float
    scrape_s: float
    short_window_s: float
    ttft_target_s: float
    interval_s: float = 30.0  # seconds between decisions (spec.autoscaling.intervalSeconds)
    custom_queries: tuple[str, ...] = ()
    tuning: Tuning = field(default_factory=Tuning)
    sizing: api.Sizing = field(default_factory=api.Sizing)  # which issue-14 inputs to use

    @property
    def count_interval_s(self) -> float:
        """The sub-window of the arrival counts the decision expects (`COUNT_SCRAPES` scrapes)."""
        return COUNT_SCRAPES * self.scrape_s

    def policy_config(self, lead_s: float) -> policy.PolicyConfig:
        return replace(self.base_policy, forecast_horizon_s=lead_s)

    def decision_lead(self, startup_s: float) -> float:
        """How far ahead a decision must provide: from the observation it reads to when the
        next decision's workers serve. The observation is up to a scrape old, workers asked
        for now serve after `startup_s`, and until the next decision's workers serve (one
        interval later) these are all there is. The forecast and the burst headroom both
        look this far."""
        return startup_s + self.interval_s + self.scrape_s


def config_from_spec(spec: api.DisaggDeploymentSpec, tuning: Tuning | None = None) -> Config:
    """The one translation of a spec into the decision's configuration."""
    pools = api.pools(spec)
    a = spec.autoscaling
    base = policy.PolicyConfig(
        scale_down_stabilization_s=float(a.scale_down_stabilization_seconds),
        max_step_up=a.max_scale_up_step,
        max_step_down=a.max_scale_down_step,
        min_replicas={k: p.min_replicas for k, p in pools.items()},
        max_replicas={k: p.max_replicas for k, p in pools.items()},
        gpus_per_replica={k: p.gpus_per_replica for k, p in pools.items()},
        gpu_budget=a.gpu_budget,
        forecast_horizon_s=DEFAULT_LEAD_S,
        headroom=float(a.headroom),
        paused=a.paused,
    )
    return Config(
        pools=tuple(pools),
        planning=api.planner_inputs(spec),
        base_policy=base,
        window_s=float(a.metric_window_seconds),
        scrape_s=float(a.scrape_interval_seconds),
        short_window_s=float(SHORT_WINDOW_SCRAPES * a.scrape_interval_seconds),
        ttft_target_s=spec.slo.ttft_seconds,
        interval_s=float(a.interval_seconds),
        custom_queries=tuple(sorted(a.queries or {})),
        tuning=tuning or Tuning(),
        sizing=a.sizing,
    )


# --------------------------------------------------------------------------- observation


@dataclass(frozen=True)
class PoolObservation:
    """One pool: its Deployment's replicas and its pods."""

    replicas: int  # the Deployment's spec.replicas (0 when it does not exist yet)
    pods: tuple[drain.PodView, ...] = ()
    pending: int | None = None  # pods that cannot start; None: count the Pending pods

    @property
    def pending_pods(self) -> int:
        if self.pending is not None:
            return self.pending
        return sum(1 for p in self.pods if p.active and p.phase == "Pending")

    @property
    def leaving(self) -> list[drain.PodView]:
        return [p for p in self.pods if p.leaving]

    @property
    def held(self) -> int:
        """Replicas holding GPUs on the cluster now: drained pods count until they are removed."""
        return max(self.replicas, sum(1 for p in self.pods if p.active))


@dataclass(frozen=True)
class Observation:
    """What one decision sees: a metrics snapshot, the pools, the time.

    A metric value is None when missing; `metrics_ok` False holds every pool.
    """

    now: float
    metrics_ok: bool
    pools: dict[str, PoolObservation]
    metrics_problem: str = ""
    arrival_rps: float | None = None  # over the metric window
    arrival_rps_short: float | None = None  # over SHORT_WINDOW_SCRAPES scrape intervals
    # requests the front door shed per second over the window and the short window
    # (`names.METRIC_FRONT_DOOR_REJECTED`): arrivals no engine counted; None: none reported
    shed_rps: float | None = None
    shed_rps_short: float | None = None
    prompt_tokens_mean: float | None = None
    prompt_tokens_std: float | None = None
    output_tokens_mean: float | None = None
    output_tokens_std: float | None = None
    # requests the back pool finished per second over the window (its output-length
    # histogram's count): how many the output mean and spread are read from
    output_finished_rps: float | None = None
    # Multimodal demand: the fraction of requests carrying media and the items per such
    # request. Absent (None) until media metrics are read; the planner then assumes none.
    media_fraction: float | None = None
    media_items_per_request: float | None = None
    queued: dict[str, float] = field(default_factory=dict)  # waiting requests per pool
    running: dict[str, float] = field(default_factory=dict)  # running requests per pool
    # Requests the arrival pool's engines hold now and have not counted yet (waiting plus
    # running: `metrics.arrival_pool`): the arrival rate is what they counted, so its growth
    # is the arrivals the rate does not show yet (`arrivals_in_system`)
    arrival_pool_in_system: float | None = None
    # The back (decode or colocated) pool's KV usage summed over its pods (each 0..1, as
    # vllm:kv_cache_usage_perc / sglang:token_usage), each averaged over the metric window:
    # x kvCacheTokens, the tokens it holds on average. `kv_running` is the same pool's running
    # sequences averaged over the same window: their ratio is the time-weighted footprint of
    # one sequence (`observed_kv_footprint`). Window averages, not the instantaneous gauges:
    # the ratio of two instantaneous sums over a few dozen heavy-tailed sequences swings by
    # a factor of several between scrapes (docs/planner.md, "Decode KV capacity").
    kv_usage_sum: float | None = None
    kv_running: float | None = None
    in_flight: dict[str, dict[str, float]] = field(default_factory=dict)  # pool -> pod -> work
    ttft_observed_s: float | None = None  # at the SLO percentile
    itl_observed_s: float | None = None  # mean
    prefill_time_mean_s: float | None = None  # for calibration
    custom: dict[str, float] = field(default_factory=dict)  # user-defined queries
    startups: dict[str, float] = field(default_factory=dict)  # observed pod start-up s, by pod
    # Issue-14 inputs, each optional (None: missing, the decision keeps today's behaviour):
    # the window's request-size distribution (token histograms), and arrivals per
    # `count_interval_s` sub-window over up to BURST_HORIZON_S, oldest first (a sub-window
    # without a scrape is left out, never counted as zero).
    sizes: SizeDistribution | None = None
    arrival_counts: tuple[float, ...] | None = None
    count_interval_s: float | None = None
    # per sub-window of `arrival_counts`, the growth over it of the requests the counted pool
    # holds uncounted (waiting + running; None: unknown), which turns the counts into arrivals
    # (`burstiness.arrivals_from_counts`)
    arrival_counts_growth: tuple[float | None, ...] | None = None
    # per sub-window of `arrival_counts`, the requests the front door shed in it (None: unknown;
    # no engine counts them)
    arrival_counts_shed: tuple[float | None, ...] | None = None
    # the window's TTFT histogram, cumulative (upper bound, count or rate) pairs ending at
    # +Inf, read with the sizes: any quantile of it, not only the SLO percentile's
    ttft_buckets: tuple[tuple[float, float], ...] | None = None
    # the front (prefill) pool's queue waits over the window, cumulative like the TTFT buckets:
    # whether the prefill queue is what makes the reachable requests miss
    prefill_wait_buckets: tuple[tuple[float, float], ...] | None = None
    # the front pool's mean queue wait over the window (the queue-time histogram's sum over its
    # count, exact where its buckets are not), and the fewest of its engines reporting at any
    # scrape of the window: the count those waits were waited at (`wait_arrival_term`)
    prefill_wait_mean_s: float | None = None
    prefill_serving_min: float | None = None


def gate_condition(pod: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The pod's routable readiness-gate condition, None before the operator set it."""
    for c in pod.get("status", {}).get("conditions", []) or []:
        if c.get("type") == names.READINESS_GATE:
            return c
    return None


def pool_observation(
    deployment: Mapping[str, Any] | None, pods: Sequence[Mapping[str, Any]]
) -> PoolObservation:
    replicas = int(((deployment or {}).get("spec") or {}).get("replicas", 0) or 0)
    return PoolObservation(replicas=replicas, pods=tuple(drain.pod_view(p) for p in pods))


def startup_seconds(pods: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """Observed pod start-up by pod name: creation to first admission (the routable gate set True)."""
    out: dict[str, float] = {}
    for p in pods:
        c = gate_condition(p)
        if c and c.get("status") == "True" and c.get("reason") == names.GATE_ADMITTED:
            t0 = status.parse_time(p["metadata"].get("creationTimestamp"))
            t1 = status.parse_time(c.get("lastTransitionTime"))
            if t0 is not None and t1 is not None and t1 >= t0:
                out[p["metadata"]["name"]] = t1 - t0
    return out


def lead_time(samples: Sequence[float]) -> float:
    """Forecast horizon: the median observed start-up within [5 s, 600 s]; 60 s before any is seen."""
    xs = sorted(samples)
    if not xs:
        return DEFAULT_LEAD_S
    return min(LEAD_MAX_S, max(LEAD_MIN_S, xs[len(xs) // 2]))


# --------------------------------------------------------------------------- state


def _pairs(raw: Any, limit: int) -> tuple[tuple[float, float], ...]:
    out = []
    for x in list(raw or [])[-limit:]:
        a, b = float(x[0]), float(x[1])
        if math.isfinite(a) and math.isfinite(b):
            out.append((a, b))
    return tuple(out)


@dataclass(frozen=True)
class ScalerState:
    """Everything one DisaggDeployment's autoscaler remembers between decisions."""

    policy: policy.PolicyState = field(default_factory=policy.PolicyState)
    decode_samples: tuple[tuple[float, float], ...] = ()  # (batch, step ms)
    prefill_samples: tuple[tuple[float, float], ...] = ()  # (prompt tokens, prefill ms)
    shape: dict[str, float] = field(default_factory=dict)  # last measured token means
    startups: dict[str, float] = field(default_factory=dict)  # observed start-up s by pod
    # the front load gain (`learnt_front_gain`), when it was last updated, and the first
    # decision of the current run of TTFT misses with the fleet at plan
    front_gain: float = 1.0
    front_gain_at: float | None = None
    miss_since: float | None = None
    # (time, `Observation.arrival_pool_in_system`) of recent decisions, oldest first
    in_system: tuple[tuple[float, float], ...] = ()
    # the error budget (`counted_slo`): requests judged against the TTFT target (fading over
    # about a week), how many of them missed it, and when they were last counted
    slo_judged: float = 0.0
    slo_missed: float = 0.0
    slo_counted_at: float | None = None
    # the last decision's reading of the arrival term off the prefill queue's waits
    # (`wait_arrival_term`) and when it was read: a reading is used only beside the one before it
    wait_term: float | None = None
    wait_term_at: float | None = None

    def calibrator(self) -> Calibrator:
        c = Calibrator(max_samples=MAX_CALIBRATION_SAMPLES)
        c.decode.extend(self.decode_samples)
        c.prefill.extend(self.prefill_samples)
        return c

    def to_dict(self) -> dict[str, Any]:
        """A plain, bounded dict (JSON-ready): at most MAX_CALIBRATION_SAMPLES samples per stage,
        MAX_STARTUP_SAMPLES start-ups, and the policy's windows (which it prunes itself)."""
        return {
            "policy": self.policy.to_dict(),
            "calibration": {
                "decode": [[round(x, 4), round(y, 4)] for x, y in self.decode_samples],
                "prefill": [[round(x, 4), round(y, 4)] for x, y in self.prefill_samples],
            },
            "shape": {k: round(v, 4) for k, v in self.shape.items()},
            # pairs, not a map: a merge patch of status replaces a list whole (a map would keep
            # the names it does not mention, and grow without bound)
            "startups": [[k, round(v, 3)] for k, v in self.startups.items()],
            # times only when known: a merge patch deletes a null, and the read-back must equal this
            "frontGain": _without_none(
                {"gain": round(self.front_gain, 4), "at": self.front_gain_at, "missSince": self.miss_since}
            ),
            "inSystem": [[round(t, 3), round(n, 3)] for t, n in self.in_system],
            "errorBudget": _without_none(
                {
                    "judged": round(self.slo_judged, 3),
                    "missed": round(self.slo_missed, 3),
                    "at": self.slo_counted_at,
                }
            ),
            "waitTerm": _without_none(
                {
                    "term": None if self.wait_term is None else round(self.wait_term, 4),
                    "at": self.wait_term_at,
                }
            ),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None) -> ScalerState:
        """Rebuild from `to_dict` output; a missing or damaged part starts fresh."""
        if not isinstance(d, Mapping):
            return cls()
        try:
            cal = d.get("calibration") or {}
            decode = _pairs(cal.get("decode"), MAX_CALIBRATION_SAMPLES)
            prefill = _pairs(cal.get("prefill"), MAX_CALIBRATION_SAMPLES)
        except (TypeError, ValueError, IndexError, AttributeError):
            decode, prefill = (), ()
        try:
            shape = {
                str(k): float(v)
                for k, v in (d.get("shape") or {}).items()
                if k in SHAPE_KEYS and math.isfinite(float(v)) and float(v) > 0
            }
        except (TypeError, ValueError, AttributeError):
            shape = {}
        try:
            items = list(d.get("startups") or [])[-MAX_STARTUP_SAMPLES:]
            startups = {str(k): float(v) for k, v in items if math.isfinite(float(v)) and float(v) >= 0}
        except (TypeError, ValueError, AttributeError):
            startups = {}
        gain, gain_at, miss_since = 1.0, None, None
        try:
            fg = d.get("frontGain") or {}
            g = float(fg.get("gain", 1.0))
            gain = min(FRONT_GAIN_MAX, g) if math.isfinite(g) and g >= 1.0 else 1.0
            gain_at, miss_since = _time_or_none(fg.get("at")), _time_or_none(fg.get("missSince"))
        except (TypeError, ValueError, AttributeError):
            gain, gain_at, miss_since = 1.0, None, None
        try:
            in_system = tuple((t, n) for t, n in _pairs(d.get("inSystem"), MAX_IN_SYSTEM_SAMPLES) if n >= 0)
        except (TypeError, ValueError, IndexError, AttributeError):
            in_system = ()
        judged, missed, counted_at = 0.0, 0.0, None
        try:
            eb = d.get("errorBudget") or {}
            j, m = float(eb.get("judged", 0.0)), float(eb.get("missed", 0.0))
            if math.isfinite(j) and math.isfinite(m) and 0.0 <= m <= j:
                judged, missed, counted_at = j, m, _time_or_none(eb.get("at"))
        except (TypeError, ValueError, AttributeError):
            judged, missed, counted_at = 0.0, 0.0, None
        wait_term, wait_term_at = None, None
        try:
            wt = d.get("waitTerm") or {}
            term, at = wt.get("term"), _time_or_none(wt.get("at"))
            if term is not None and at is not None and math.isfinite(float(term)):
                wait_term, wait_term_at = float(term), at
        except (TypeError, ValueError, AttributeError):
            wait_term, wait_term_at = None, None
        pol = d.get("policy")
        return cls(
            policy=policy.PolicyState.from_dict(pol if isinstance(pol, dict) else None),
            decode_samples=decode,
            prefill_samples=prefill,
            shape=shape,
            startups=startups,
            front_gain=gain,
            front_gain_at=gain_at,
            miss_since=miss_since,
            in_system=in_system,
            slo_judged=judged,
            slo_missed=missed,
            slo_counted_at=counted_at,
            wait_term=wait_term,
            wait_term_at=wait_term_at,
        )


def arrivals_in_system(
    samples: Sequence[tuple[float, float]], now: float, in_system: float, span_s: float
) -> float | None:
    """Arrivals per second the engines have not counted yet: the growth of the requests the
    arrival pool holds uncounted, from the latest sample at least `span_s` old (the rate's
    window: the latest earlier one for a shorter rate) to `in_system` now. Flow conservation:
    what arrived over a span is what was counted plus what is still held (a prefill queue
    growing under a burst, the growth falling as it drains). None without a sample within
    twice the span (after a gap the growth would not be the rate's)."""
    then = [(t, n) for t, n in samples if now - t >= span_s - 1e-6] or [(t, n) for t, n in samples if t < now]
    if not then or now - then[-1][0] > 2.0 * span_s:
        return None
    t, n = then[-1]
    return (in_system - n) / (now - t)


def _kept_in_system(
    samples: tuple[tuple[float, float], ...], now: float, in_system: float, config: Config
) -> tuple[tuple[float, float], ...]:
    """The samples `arrivals_in_system` may read next time (a window and two intervals back), with now's."""
    keep = [x for x in samples if now - x[0] <= config.window_s + 2.0 * config.interval_s]
    return (*keep, (now, in_system))[-MAX_IN_SYSTEM_SAMPLES:]


def _rate_or_none(x: float | None) -> float | None:
    """A rate above zero, else None."""
    return x if x is not None and math.isfinite(x) and x > 0 else None


def _time_or_none(x: Any) -> float | None:
    """A time read back from the state: a finite number, else None (a damaged field starts fresh)."""
    if x is None:
        return None
    t = float(x)
    return t if math.isfinite(t) else None


# --------------------------------------------------------------------------- outcome


@dataclass(frozen=True)
class DrainOrder:
    """Start draining `pod` of `pool`. `idle`: it never received work (pending or never admitted)."""

    pool: str
    pod: str
    in_flight: float | None
    idle: bool


@dataclass(frozen=True)
class StageFigures:
    arrival_rps: float
    wait_s: float  # W = queueing + service
    utilization: float


def _r(x: float | None, nd: int = 4) -> float | None:
    return None if x is None or not math.isfinite(x) else round(float(x), nd)


def _iso(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _without_none(d: dict[str, Any]) -> dict[str, Any]:
    return {k: _without_none(v) if isinstance(v, dict) else v for k, v in d.items() if v is not None}


@dataclass(frozen=True)
class DecisionRecord:
    """One decision and the figures behind it: what `status.lastDecision` and the dashboard show."""

    time: float
    reason: str
    metrics_ok: bool | None  # None: the tick read no metrics (autoscaling paused)
    metrics_problem: str | None
    arrival_rps: float | None
    planned_rps: float | None
    lead_time_s: float
    prompt_tokens_mean: float | None
    output_tokens_mean: float | None
    observed_ttft_s: float | None
    observed_itl_s: float | None
    custom: dict[str, float]
    current: dict[str, int]
    pending: dict[str, int]
    stages: dict[str, StageFigures]
    predicted_ttft_s: float | None
    predicted_itl_s: float | None
    targets: dict[str, int]
    next_step: dict[str, int]
    planned: dict[str, int]
    feasible: bool | None
    budget_limited: bool
    sacrificed: str | None
    notes: tuple[str, ...]
    admitted_fraction: float | None = None  # share of the load the plan serves (the rest is shed)
    arrival_dispersion: float | None = None  # measured index of dispersion used (None: Poisson)
    # the arrival term read off the prefill queue's waits, where it was used (None: not)
    wait_arrival_term: float | None = None
    auto_headroom: float | None = None  # automatic headroom used (None: the spec's headroom only)
    before_rise: float | None = None  # share of the rate a rise under way began from (None: unknown)
    burst_floor_rps: float | None = None  # rate stood ready for, for rises no headroom covers (None: none)
    front_gain: float | None = None  # learnt multiplier on the front pools' load (None: switched off)
    size_classes: int | None = None  # prompt size classes planned over (None: the mean request)
    planning_percentile: float | None = None  # the percentile the plan was made at (None: not planned)
    # share of the window's requests that miss TTFT whatever the fleet (`out_of_reach_share`;
    # None: not planned, or no prompt lengths read)
    out_of_reach: float | None = None

    @classmethod
    def without_decision(cls, time: float, reason: str, note: str) -> DecisionRecord:
        """A tick that read nothing and decided nothing (autoscaling paused): every pool is held.

        No figures (they are left out of the status) and no targets; `note` says why."""
        return cls(
            time=time,
            reason=reason,
            metrics_ok=None,
            metrics_problem=None,
            arrival_rps=None,
            planned_rps=None,
            lead_time_s=math.nan,
            prompt_tokens_mean=None,
            output_tokens_mean=None,
            observed_ttft_s=None,
            observed_itl_s=None,
            custom={},
            current={},
            pending={},
            stages={},
            predicted_ttft_s=None,
            predicted_itl_s=None,
            targets={},
            next_step={},
            planned={},
            feasible=None,
            budget_limited=False,
            sacrificed=None,
            notes=(note,),
        )

    def to_status(self) -> dict[str, Any]:
        """The dict written to `status.lastDecision` (camelCase keys; pool maps are {pool: n}).

        Unknown figures are left out (a merge patch would delete a null anyway)."""
        return _without_none(self._status())

    def _status(self) -> dict[str, Any]:
        return {
            "time": _iso(self.time),
            "reason": self.reason,
            "inputs": {
                "metricsOk": self.metrics_ok,
                "metricsProblem": self.metrics_problem,
                "arrivalRps": _r(self.arrival_rps),
                "plannedRps": _r(self.planned_rps),
                "arrivalDispersion": _r(self.arrival_dispersion),
                "waitArrivalTerm": _r(self.wait_arrival_term),
                "autoHeadroom": _r(self.auto_headroom),
                "beforeRise": _r(self.before_rise),
                "burstFloorRps": _r(self.burst_floor_rps),
                "frontLoadGain": _r(self.front_gain),
                "sizeClasses": self.size_classes,
                "planningPercentile": _r(self.planning_percentile, 5),
                "custom": {k: _r(v) for k, v in self.custom.items()},
                "leadTimeSeconds": _r(self.lead_time_s, 1),
                "promptTokensMean": _r(self.prompt_tokens_mean),
                "outputTokensMean": _r(self.output_tokens_mean),
                "observedTtftSeconds": _r(self.observed_ttft_s),
                "observedItlSeconds": _r(self.observed_itl_s),
                "current": dict(self.current),
                "pending": dict(self.pending),
                "stages": {
                    k: {
                        "lambda": _r(v.arrival_rps),
                        "W": _r(v.wait_s),
                        "L": _r(v.arrival_rps * v.wait_s),
                        "utilization": _r(v.utilization),
                    }
                    for k, v in self.stages.items()
                },
                "predicted": {"ttft_s": _r(self.predicted_ttft_s), "itl_s": _r(self.predicted_itl_s)},
                "observed": {"ttft_s": _r(self.observed_ttft_s), "itl_s": _r(self.observed_itl_s)},
            },
            "outputs": {
                "targets": dict(self.targets),
                "nextStep": dict(self.next_step),
                "planned": dict(self.planned),
                "predictedTtftSeconds": _r(self.predicted_ttft_s),
                "predictedItlSeconds": _r(self.predicted_itl_s),
                "feasible": self.feasible,
                "budgetLimited": self.budget_limited,
                "admittedFraction": _r(self.admitted_fraction),
                "outOfReachFraction": _r(self.out_of_reach),
                "notes": list(self.notes),
            },
        }


@dataclass(frozen=True)
class Outcome:
    targets: dict[str, int]  # where each pool is headed
    next_step: dict[str, int]  # what to write now (the first make-before-break step)
    current: dict[str, int]  # replicas requested before this decision (draining pods excluded)
    changed: bool
    reason: str
    notes: tuple[str, ...]
    readmit: dict[str, list[str]]  # pool -> draining pods to make routable again
    grow: dict[str, int]  # pool -> new Deployment replicas that fit the GPU budget now
    deferred: dict[str, int]  # pool -> replicas of growth waiting for drained pods' GPUs
    drains: list[DrainOrder]
    plan: planner.Plan | None
    record: DecisionRecord
    state: ScalerState
    calibration: dict[str, Any]  # fitted stage-model parameters (status.calibration)


# --------------------------------------------------------------------------- decide


@dataclass(frozen=True)
class SizingInputs:
    """The issue-14 inputs one decision uses (None: missing or switched off in the spec)."""

    sizes: SizeDistribution | None = None
    dispersion: float | None = None  # index of dispersion of arrival counts
    auto_headroom: float | None = None  # fraction of demand, from the burst profile
    before_rise: float | None = None  # where a rise under way began, share of now
    burst_floor_rps: float | None = None  # rate the rises no headroom covers reach
    # arrival term read off the prefill queue's waits (`wait_arrival_term`), used where above the dispersion
    wait_term: float | None = None


def sizing_inputs(config: Config, obs: Observation, lead_s: float) -> SizingInputs:
    """What the spec's `autoscaling.sizing` switches on and the observation carries.

    Counts are used only at the sub-window the decision expects; too few counts give
    None (Poisson, the spec's headroom), never a smooth reading.
    """
    sz = config.sizing
    sizes = obs.sizes if sz.request_sizes and isinstance(obs.sizes, SizeDistribution) else None
    counts = obs.arrival_counts
    step = obs.count_interval_s
    if not counts or step is None or not math.isclose(step, config.count_interval_s, rel_tol=1e-6):
        counts = None
    else:
        counts = burstiness.arrivals_from_counts(counts, obs.arrival_counts_growth, obs.arrival_counts_shed)
    disp = auto = base = floor_rps = None
    try:
        if counts is not None and sz.burstiness:
            span = max(1, round(DISPERSION_SPAN_S / step))
            measured = burstiness.index_of_dispersion(counts[-span:])
            # Below Poisson is read as Poisson: from ~20 sub-windows the estimate's relative
            # standard error is ~30 %, and sizing below Poisson on that noise lost attainment
            # on smooth traffic (docs/planner.md). Bursts (above 1) are used as measured.
            disp = None if measured is None else max(1.0, measured)
        if counts is not None and sz.auto_headroom:
            # Rises are judged against Poisson counting noise (no `dispersion`): one measured on
            # the same counts includes the bursts themselves and would explain them away.
            pct = config.planning.slo.percentile
            z = burstiness.noise_z(pct)
            auto, floor_rps = burstiness.burst_profile(
                counts, step, startup_s=lead_s, window_s=config.window_s, quantile=pct, z=z
            )
            if auto is not None:
                base = burstiness.before_rise(counts, step, window_s=config.window_s, z=z)
    except ValueError:
        disp = auto = base = floor_rps = None  # invalid counts: missing
    return SizingInputs(
        sizes=sizes, dispersion=disp, auto_headroom=auto, before_rise=base, burst_floor_rps=floor_rps
    )


def weighed_shape(
    obs: Observation, inputs: SizingInputs, shape: dict[str, float], window_s: float
) -> tuple[Observation, SizingInputs]:
    """The prompt and output lengths to plan with: the window's, each weighed against the last
    ones planned with by the requests it was read from; `shape` keeps the result.

    The engines count a request's lengths when it finishes, so a quiet window shows a few
    requests, and for the outputs they are the stragglers of the last busy window, its
    longest requests: read alone, one request of 2,000 tokens finishing where the traffic's
    mean is 30 sized the decode pool for 2,000-token requests at whatever rate the decision
    plans for (docs/planner.md, "Output lengths seen when requests finish"). The window's n
    requests (the prompt histogram's count, which is the arrival rate, and the output
    histogram's, `output_finished_rps`) weigh n against `SHAPE_PRIOR_REQUESTS` for the last
    shape: a busy window sets the shape nearly alone, one request moves it a few per cent.
    Each result is the mixture of the two, so its spread includes their difference; with a
    size distribution the last shape is one more class of that marginal.

    A marginal stays as read (and is remembered) where its count or last shape is unknown;
    one the window does not show holds as before (`demand_for`).
    """
    dist = inputs.sizes
    seen: dict[str, float] = {}
    for side, count_rps in (("prompt", obs.arrival_rps), ("output", obs.output_finished_rps)):
        if dist is not None:
            m_w, s_w = getattr(dist, f"{side}_mean_std")
        else:
            m_w, s_w = getattr(obs, f"{side}_tokens_mean"), getattr(obs, f"{side}_tokens_std")
        if m_w is None or not (math.isfinite(m_w) and m_w > 0):
            continue
        s_w = s_w if s_w is not None and math.isfinite(s_w) and s_w >= 0 else 0.0
        m_0 = shape.get(f"{side}_tokens_mean")
        if count_rps is None or not (math.isfinite(count_rps) and count_rps >= 0) or m_0 is None:
            _remember_spread(shape, side, s_w)
            continue
        s_0 = shape.get(f"{side}_tokens_std", 0.0)
        n = count_rps * window_s
        a = n / (n + SHAPE_PRIOR_REQUESTS) if n + SHAPE_PRIOR_REQUESTS > 0 else 1.0  # the window's share
        mean = a * m_w + (1.0 - a) * m_0
        var = max(0.0, a * (s_w * s_w + m_w * m_w) + (1.0 - a) * (s_0 * s_0 + m_0 * m_0) - mean * mean)
        seen[f"{side}_tokens_mean"], seen[f"{side}_tokens_std"] = mean, math.sqrt(var)
        _remember_spread(shape, side, seen[f"{side}_tokens_std"])
        if dist is not None:
            tokens, variances, weights = (getattr(dist, f"{side}_{k}") for k in ("tokens", "var", "weight"))
            dist = replace(
                dist,
                **{
                    f"{side}_tokens": (*tokens, m_0),
                    f"{side}_var": (*variances, s_0 * s_0),
                    f"{side}_weight": (*(a * w for w in weights), 1.0 - a),
                },
            )
    if dist is not inputs.sizes:
        inputs = replace(inputs, sizes=dist)
    return (replace(obs, **seen) if seen else obs), inputs


def _remember_spread(shape: dict[str, float], side: str, std: float) -> None:
    """Keep the spread planned with (a shape value is remembered only above zero)."""
    if std > 0:
        shape[f"{side}_tokens_std"] = std
    else:
        shape.pop(f"{side}_tokens_std", None)


def observed_kv_footprint(obs: Observation, kv_cache_tokens: float) -> float | None:
    """KV tokens one running sequence of the back pool holds, from the engines' own gauges:
    window-averaged summed KV usage x capacity / window-averaged running sequences, i.e.
    the footprint weighted by how long each sequence holds it (Little's law: the time
    average of the pool's KV over the time average of its sequences). None with too few
    sequences to tell, or without both window averages (missing: the last reading holds).

    It sees what the token means cannot: how prompt and output lengths go together (long
    prompts with short outputs hold less than independent lengths say).
    """
    used, running = obs.kv_usage_sum, obs.kv_running
    if used is None or running is None or not (math.isfinite(used) and math.isfinite(running)):
        return None
    if running < MIN_FOOTPRINT_SEQUENCES or used <= 0 or not math.isfinite(kv_cache_tokens):
        return None
    return used * kv_cache_tokens / running


def demand_for(
    obs: Observation,
    rate: float,
    shape: dict[str, float],
    inputs: SizingInputs | None = None,
    kv_footprint: float | None = None,
) -> planner.Demand:
    """The planner's demand at `rate` with the observed request shape.

    With a size distribution (`inputs.sizes`) its moments replace the mean/std and the
    planner sizes over its classes; the arrival term `arrival_ca2` is the larger of the
    dispersion and the term read off the prefill queue's waits (Poisson, 1, without either).

    A token mean the window does not show (no request finished in it) keeps its last
    measured value in `shape`, which is updated in place; with none ever measured it is
    1 token, the smallest valid value, never a guess. Media: absent means no media.
    `kv_footprint` (`observed_kv_footprint`) replaces the planner's estimate of one decode
    sequence's KV tokens; without a reading the last one is kept, and with none ever the
    planner derives it from the token means.
    """

    def pos(key: str, v: float | None) -> float:
        if v is not None and math.isfinite(v) and v > 0:
            shape[key] = v
            return v
        return shape.get(key, 1.0)

    def spread(v: float | None) -> float:
        return v if v is not None and math.isfinite(v) and v >= 0 else 0.0

    def remembered(key: str, v: float | None, default: float) -> float:
        if v is not None and math.isfinite(v) and v >= 0:
            shape[key] = v
        return shape.get(key, default)

    media = remembered("media_fraction", obs.media_fraction, 0.0)
    items = remembered("media_items_per_request", obs.media_items_per_request, 1.0)
    footprint = remembered("kv_footprint_tokens", kv_footprint, 0.0)
    inputs = inputs or SizingInputs()
    pm, ps = obs.prompt_tokens_mean, obs.prompt_tokens_std
    om, os_ = obs.output_tokens_mean, obs.output_tokens_std
    if inputs.sizes is not None:
        (pm, ps), (om, os_) = inputs.sizes.prompt_mean_std, inputs.sizes.output_mean_std
    return planner.Demand(
        arrival_rps=max(rate, 0.0),
        prompt_tokens_mean=pos("prompt_tokens_mean", pm),
        prompt_tokens_std=spread(ps),
        output_tokens_mean=pos("output_tokens_mean", om),
        output_tokens_std=spread(os_),
        media_fraction=min(media, 1.0),
        items_per_request=max(items, 1.0),
        sizes=inputs.sizes,
        arrival_ca2=max(inputs.dispersion or 1.0, inputs.wait_term or 1.0),
        kv_footprint_tokens=footprint,
    )


def wait_arrival_term(
    config: Config,
    obs: Observation,
    rate: float,
    shape: Mapping[str, float],
    inputs: SizingInputs,
    models: StageModels,
) -> float | None:
    """The arrival term (Allen-Cunneen's ca^2) that explains the prefill queue's measured waits.

    Requests that arrive together inside one scrape (a client that fans out, a batch job,
    timestamps cut to the second) queue for the prefill workers at once, and no count per
    sub-window shows it: the counts of such traffic are as even as Poisson's. The queue's
    waits do. The planner's mean prefill wait is Allen-Cunneen's, the M/G/c wait times
    (ca^2 + cs^2) / 2 over that of Poisson arrivals (ca^2 = 1): the ca^2 at which the model's
    mean wait equals the window's measured one is the window's reading, taken at the window's
    arrival rate `rate` and at the fewest prefill engines reporting over it, or the pool's pods
    not being drained if fewer (a scale-up inside the window serves only its end: against the
    count of now, the waits at the count before it would read as a burst). Below 1 it says
    nothing more than Poisson; the caller uses it only where it is above the dispersion of the
    counts.

    The model matches the simulator's least-work routing within 2-8 % at fixed pools wherever
    the mean wait is a few milliseconds or more (`hack/bench/bench_queue_model.py`); below that
    a window holds a handful of waits, and the mean is read at its lower noise bound
    (`burstiness.NOISE_Z` standard errors of the queue-time histogram's spread over the
    window's requests). None (missing) without the readings, with no arrivals, under another placement than
    disaggregated (the prefill pool then sees only part of the arrivals, or is none), or where
    the model's queue is unstable or never waits.
    """
    waited, serving = obs.prefill_wait_mean_s, obs.prefill_serving_min
    pool = obs.pools.get(names.POOL_PREFILL)
    if config.planning.placement != "disaggregated" or waited is None or serving is None or pool is None:
        return None
    # the engines reporting include pods being drained, which take no new request
    n = min(math.floor(serving), pool.replicas - len(pool.leaving))
    spread = metrics.histogram_spread(obs.prefill_wait_buckets) if obs.prefill_wait_buckets else None
    if spread is None or not (math.isfinite(waited) and waited >= 0 and n >= 1 and rate > 0):
        return None
    # the mean's lower noise bound over the window's requests: a light queue's few waits of a
    # millisecond read as a burst of many times Poisson, and what it says is that nothing waits
    std, per_s = spread
    requests = per_s * config.window_s
    if not requests >= 1.0:
        return None
    waited = max(0.0, waited - burstiness.NOISE_Z * std / math.sqrt(requests))
    demand = demand_for(obs, rate, dict(shape), replace(inputs, dispersion=None, wait_term=None))
    service_s, cs2 = planner.prefill_queue(demand, models, config.planning.slo, config.planning.chunked)
    # Poisson arrivals at each sub-window's own rate, the waits weighed by its arrivals: a rise
    # or a spike inside the window is then a rate, not a burst (the forecast and the headroom
    # answer it); one rate for the window where its counts are not read
    rates = [(1.0, rate)]
    step = obs.count_interval_s
    if obs.arrival_counts and step is not None and math.isclose(step, config.count_interval_s, rel_tol=1e-6):
        recent = burstiness.arrivals_from_counts(
            obs.arrival_counts, obs.arrival_counts_growth, obs.arrival_counts_shed
        )[-max(1, round(config.window_s / step)) :]
        if sum(recent) > 0:
            rates = [(c, c / step) for c in recent if c > 0]
    weight = sum(w for w, _ in rates)
    poisson_wait = (
        sum(w * float(queueing.mgc_mean_wait(n, lam, service_s, cs2, 1.0)) for w, lam in rates) / weight
    )
    if not (math.isfinite(poisson_wait) and poisson_wait > 0):
        return None
    return (waited / poisson_wait) * (1.0 + cs2) - cs2


def paired_wait_term(reading: float | None, state: ScalerState, now: float, window_s: float) -> float | None:
    """The arrival term to plan with: the smaller of this reading and the last decision's, when
    that one was read within a window before it; None otherwise.

    One window's waits at the onset of a burst read as a large term (the window's mean rate
    is below the rate they were waited at), and the next window's no longer do; clumps inside
    every scrape read the same window after window. A missing reading breaks the pair.
    """
    prev, at = state.wait_term, state.wait_term_at
    if reading is None or prev is None or at is None or not 0.0 < now - at <= window_s:
        return None
    return min(reading, prev)


def link_bound_note(plan: planner.Plan, config: Config) -> str | None:
    """A note when the KV link, not the compute, sets the prefill pool's size; None otherwise.

    A prefill worker's link sends one prompt's KV while the worker computes the next, so the
    slower of the two is what the pool is sized by. When it is the link, the plan for the mean
    prompt is optimistic for the long ones (their sends take longest and share the link), and
    with the size classes off nothing sizes for them (docs/evaluation.md, "Remedies measured,
    none landed": `sizing.requestSizes` is what reached the SLO there).
    """
    link_ms = plan.stages.get("transfer.link_busy_ms")
    compute_ms = plan.stages.get("prefill.service_ms")
    if link_ms is None or compute_ms is None or not link_ms > compute_ms:
        return None
    advice = (
        ""
        if config.sizing.request_sizes
        else "; the plan is for the mean prompt, and the long prompts' sends miss first: "
        "spec.autoscaling.sizing.requestSizes sizes for them"
    )
    return (
        f"the KV link sets the prefill pool's size: {link_ms:.0f} ms of link per request against "
        f"{compute_ms:.0f} ms of compute (spec.kvTransfer.bandwidthGiBps){advice}"
    )


def _pooled(plan: planner.Plan, pools: Sequence[str]) -> dict[str, int]:
    """The plan's replicas for this deployment's pools (a plan names every stage)."""
    return {k: v for k, v in plan.replicas.items() if k in pools}


def fit_growth_in_budget(
    config: Config, obs: Observation, grow: dict[str, int]
) -> tuple[dict[str, int], dict[str, int]]:
    """Trim new replica counts so that GPUs requested on the cluster never exceed the budget.

    The policy counts a draining pod as gone; the cluster does not until it is removed.
    Growth that would only fit once drains finish waits for the next decision
    (make-before-break within the budget). Returns (the growth that fits, what was deferred).
    """
    budget = config.base_policy.gpu_budget
    if budget is None:
        return dict(grow), {}
    gpr = {p: config.base_policy.gpr(p) for p in config.pools}
    held = {p: obs.pools[p].held if p in obs.pools else 0 for p in config.pools}
    used = sum(held[p] * gpr[p] for p in config.pools)
    fits: dict[str, int] = {}
    deferred: dict[str, int] = {}
    for name in sorted(grow, key=lambda n: gpr[n]):
        room = max(0, (budget - used) // gpr[name])
        add = min(max(0, grow[name] - held[name]), room)
        if add > 0:
            fits[name] = held[name] + add
            used += add * gpr[name]
        if grow[name] - held[name] > add:
            deferred[name] = grow[name] - held[name] - add
    return fits, deferred


def _format_pools(counts: Mapping[str, int], pools: Sequence[str]) -> str:
    return ", ".join(f"{p} {counts[p]}" for p in pools if p in counts)


def summary(outcome: Outcome, pools: Sequence[str]) -> str:
    """One human line: 'targets prefill 2, decode 4 (was prefill 1, decode 2)'."""
    line = f"targets {_format_pools(outcome.targets, pools)} (was {_format_pools(outcome.current, pools)})"
    if outcome.next_step != outcome.targets:
        line += f"; next step {_format_pools(outcome.next_step, pools)}"
    return line


def learnt_front_gain(
    config: Config,
    obs: Observation,
    state: ScalerState,
    models: StageModels,
    *,
    current: Mapping[str, int],
    planned: Mapping[str, int],
    startup_s: float,
) -> tuple[float, float | None, float | None]:
    """(gain, when it was last updated, since when TTFT has missed at plan) after this observation.

    The queueing model can be wrong in ways no input shows: requests that arrive together
    inside one scrape (a trace with coarse timestamps, a client that fans out) queue for
    the prefill workers all at once, which neither the rate nor the dispersion of counts
    per sub-window reveals. The front load gain multiplies the load the front pools
    (encoder, prefill) are sized for; it starts at 1 and is learnt from the observed TTFT
    at the SLO percentile against the target:

    * a miss counts only when the fleet was steady for the whole window (no pod pending
      or draining, no scaling action for one start-up and one window, the autoscaler on
      record that long) and is at least what the model asks for now: the model said
      enough, the window said not. A miss while the fleet was below plan or changing is
      the lag the forecast and the headroom answer;
    * it must last two windows that do not overlap, so that one slow window's quantile (a
      few requests) does not count. Then the gain grows, up to `FRONT_GAIN_MAX`, by the
      factor the judged TTFT stands above the target, at least `FRONT_GAIN_STEP` and at most
      its square: a miss of three times the target is not answered a doubling at a time,
      each waiting out a start-up and two windows while the requests queue; the bound keeps
      one very slow window (near saturation a few workers more cut the wait many times)
      from buying the front pools more than two steps at once;
    * a window comfortably within the target (at most `Tuning.ttft_comfort` of it) lowers
      it toward 1 (half-life `FRONT_GAIN_HALF_LIFE_S`): a gain no longer needed goes. One
      between comfort and the target holds it: lowering it there probes back into misses.

    Requests that miss on an idle system, or with less slack than one decode step
    (`unreachable_share`, u), miss whatever the pools: no capacity fixes them. With the
    window's size distribution and TTFT histogram (read whenever the gain is on; the plan
    uses the sizes only with `sizing.requestSizes`), the TTFT judged
    is the histogram's quantile at (1 - u) x p: above the target exactly when more than
    1 - p of the reachable requests miss, since every unreachable one does. Without them
    only the SLO percentile's TTFT is known, and nothing is learnt while u is more than
    half the share the percentile lets go (that quantile then tells little about the
    fleet). A window with fewer reachable requests than one beyond the percentile (a strict
    percentile on light traffic: at p99.5, under 200 requests) is judged at the highest
    quantile with one beyond it (`judged_ttft`): a miss there is a miss of the SLO and counts;
    a window within the target there holds the gain and the run of misses as they are (the
    percentile itself may still miss). Without the histograms such a window teaches nothing
    (its percentile is its slowest request), and nothing is learnt under a target that grows
    with the prompt, whose percentile says little about which requests missed.
    With the front pool's queue-time histogram too, a miss counts only when as many requests
    waited at least the miss for a prefill worker as the reachable ones beyond the judged
    quantile (waits inside the first bucket read as none): more prefill
    workers cannot shorten anything else, and the gain would grow without end where the
    reachable requests miss on the decode side.
    `spec.autoscaling.sizing.frontLoadGain` off: the gain stays 1.
    """
    gain, at, since = state.front_gain, state.front_gain_at, state.miss_since
    if not config.sizing.front_load_gain:
        return 1.0, None, None
    judged = judged_ttft(config, obs, models)
    if judged is None:
        return gain, at, since
    ttft, reachable, q = judged.ttft_s, judged.reachable, judged.quantile
    judged_reachable = judged.at_reachable_quantile
    now = obs.now
    p = config.planning.slo.percentile
    target = config.ttft_target_s
    if ttft <= target:
        if q < p:
            # judged below the percentile, in a window of few requests: no miss shown, none ruled out
            return gain, at, since
        if ttft <= config.tuning.ttft_comfort * target and gain > 1.0 and at is not None and now > at:
            dt = min(now - at, 2.0 * config.interval_s)  # a gap in the metrics is not a met window
            gain = max(1.0, gain * 0.5 ** (dt / FRONT_GAIN_HALF_LIFE_S))
        return gain, now, None
    pol = state.policy
    settle = startup_s + config.window_s
    # With the front pool's queue-time histogram, a miss counts below only when the prefill
    # queue's waits explain it: then only the front pools need to have been steady (a change of
    # the decode pool does not lengthen those waits). Without it, any pool's change may.
    queue_judged = judged_reachable and bool(obs.prefill_wait_buckets)
    watched = [p for p in obs.pools if p in FRONT_POOLS] if queue_judged else []
    watched = watched or list(obs.pools)
    last_change = pol.changed_since(watched)
    steady = (
        all(not obs.pools[p].leaving and obs.pools[p].pending_pods == 0 for p in watched)
        and pol.first_seen is not None
        and now - pol.first_seen >= settle
        and (last_change is None or now - last_change >= settle)
        and all(current.get(k, 0) >= n for k, n in planned.items() if k in watched)
    )
    if not steady:
        return gain, now, None
    if not judged_reachable and unreachable_share(config, obs, models) > (1.0 - p) / 2.0:
        return gain, now, None
    if queue_judged and not _prefill_waits_explain(obs, reachable, q, ttft - target):
        return gain, now, None
    if since is None:
        return gain, now, now
    if now - since >= config.window_s:
        step = min(FRONT_GAIN_STEP**2, max(FRONT_GAIN_STEP, ttft / target))
        return min(FRONT_GAIN_MAX, gain * step), now, None
    return gain, now, since


class JudgedTtft(NamedTuple):
    """The window's TTFT as the front load gain judges it (`judged_ttft`)."""

    ttft_s: float  # at the judged quantile: a miss of the SLO percentile when above the target
    reachable: float  # share of the requests capacity can bring within the target (1: not known)
    at_reachable_quantile: bool  # read off the TTFT histogram at the reachable requests' quantile
    quantile: float  # of the reachable requests: the SLO percentile, or lower in a window of few


def judged_ttft(config: Config, obs: Observation, models: StageModels) -> JudgedTtft | None:
    """The TTFT to judge the fleet by, or None when the window cannot tell.

    With the window's size distribution and TTFT histogram, the histogram's quantile at
    (1 - u) x q, u the share out of reach (`unreachable_share`) and q the SLO percentile p;
    in a window with fewer than one reachable request beyond p, q is the highest quantile
    with one beyond it, 1 - 1/n for n reachable requests (at least two: q >= 1/2). A TTFT
    above the target there is one above it at p too (a quantile never falls as it rises),
    so a miss judged at q < p is a miss of the SLO; a TTFT within the target there says
    nothing about p (`learnt_front_gain` then holds). Without the histograms, the SLO
    percentile's TTFT, and None when fewer than one request is beyond it (its quantile is
    then the slowest request's). None with stale metrics, a target that grows with the
    prompt, or no TTFT or rate.
    """
    ttft, rate = obs.ttft_observed_s, obs.arrival_rps
    p = config.planning.slo.percentile
    if (
        not obs.metrics_ok
        or config.planning.slo.ttft_s_per_1k_tokens
        or rate is None
        or not math.isfinite(rate)
    ):
        return None
    reachable, q = 1.0, p
    at_reachable = isinstance(obs.sizes, SizeDistribution) and bool(obs.ttft_buckets)
    if at_reachable:
        reachable = 1.0 - unreachable_share(config, obs, models)
        n = rate * config.window_s * reachable
        if n * (1.0 - p) < 1.0:
            if n < 2.0:
                return None
            q = 1.0 - 1.0 / n
        ttft = metrics.histogram_quantile(reachable * q, obs.ttft_buckets or ())
    elif rate * config.window_s * (1.0 - p) < 1.0:
        return None
    if ttft is None or not math.isfinite(ttft):
        return None
    return JudgedTtft(ttft, reachable, at_reachable, q)


def _prefill_waits_explain(obs: Observation, reachable: float, p: float, miss_s: float) -> bool:
    """Whether the prefill queue's waits explain a miss of `miss_s` at the reachable requests' quantile.

    Prefill capacity shortens only the wait for a prefill worker. The reachable requests
    beyond the judged quantile, a share reachable x (1 - p) of all, each miss by at least
    `miss_s`; when fewer requests than that waited so long for a prefill worker (the waits'
    quantile at 1 - that share is shorter), the misses are elsewhere (the first decode step,
    room on a decode worker). Waits within the first bucket read as none.
    """
    wait = metrics.histogram_quantile_past_first(1.0 - reachable * (1.0 - p), obs.prefill_wait_buckets or ())
    return bool(wait >= miss_s)  # NaN (unreadable buckets) counts as not shown


def prefill_queue_miss(config: Config, obs: Observation, models: StageModels) -> float | None:
    """The TTFT judged at the reachable requests' quantile when it misses the target and the
    prefill queue's waits explain the miss (`learnt_front_gain`'s test, without its wait for a
    steady fleet); None otherwise, or when the window cannot tell.

    Needs what that test reads (fresh metrics, the size distribution, the TTFT and queue-time
    histograms, at least one reachable request beyond the percentile, a flat target) and the
    gain switched on (`spec.autoscaling.sizing.frontLoadGain`). A window of fewer requests,
    which the gain judges below the percentile, holds nothing: this acts at once, without the
    gain's steady fleet and run of misses, and a scale-down is not held on a quantile below the
    SLO's.
    """
    if not (config.sizing.front_load_gain and obs.prefill_wait_buckets):
        return None
    judged = judged_ttft(config, obs, models)
    target = config.ttft_target_s
    p = config.planning.slo.percentile
    if judged is None or not judged.at_reachable_quantile or judged.quantile < p or judged.ttft_s <= target:
        return None
    return judged.ttft_s if _prefill_waits_explain(obs, judged.reachable, p, judged.ttft_s - target) else None


def unreachable_share(config: Config, obs: Observation, models: StageModels) -> float:
    """Share of the window's requests that miss TTFT even on an idle system, or with less slack
    than one decode step (on time only on an idle decode worker): no capacity brings them in.

    From the window's size distribution when there is one, else from the prompt and output
    means and spreads read as log-normal; 1 (nothing known) without a prompt mean.
    """
    sizes = obs.sizes if isinstance(obs.sizes, SizeDistribution) else None
    if sizes is None:
        pm, ps = obs.prompt_tokens_mean, obs.prompt_tokens_std
        om, os_ = obs.output_tokens_mean, obs.output_tokens_std
        if pm is None or not math.isfinite(pm) or pm <= 0:
            return 1.0
        ok = [v if v is not None and math.isfinite(v) and v >= 0 else 0.0 for v in (ps, om, os_)]
        sizes = SizeDistribution.from_mean_std(pm, ok[0], max(ok[1], 1.0), ok[2])
    slo = config.planning.slo
    cov = ttft_covers(
        sizes,
        models,
        slo.ttft_s,
        slo.percentile,
        chunked=config.planning.chunked,
        extra_s=2.0 * float(models.decode.step_ms(1)) / 1000.0,  # the first token and one step of slack
        target_s_per_1k_tokens=slo.ttft_s_per_1k_tokens,
    )
    return cov.idle_miss_fraction


def out_of_reach_share(config: Config, obs: Observation, models: StageModels) -> float | None:
    """`unreachable_share` of the observed requests; None when their prompt lengths were not read."""
    pm = obs.prompt_tokens_mean
    if not isinstance(obs.sizes, SizeDistribution) and (pm is None or not math.isfinite(pm) or pm <= 0):
        return None
    return unreachable_share(config, obs, models)


#: A `RequestsOutOfReach` condition clears only once the share out of reach falls to this
#: fraction of what the SLO lets miss: a share at the edge does not flap the condition.
OUT_OF_REACH_CLEAR = 0.8


class SloReach(NamedTuple):
    """The `SloReachable` condition of a decision, and the Event that announces a False one."""

    reachable: bool
    reason: str
    message: str  # the condition's: the same from decision to decision while the cause lasts
    event: str  # the Event's: the figures of this decision too


def slo_reach(
    config: Config, record: DecisionRecord, plan: planner.Plan | None, was: str | None = None
) -> SloReach | None:
    """Whether some fleet can meet the SLO on the observed requests; None without a plan.

    Not reachable when the ITL target is below one decode step at batch 1 (the stage model
    the plan used, calibrated or the spec's), or when more of the requests are out of reach
    of the TTFT target (`out_of_reach_share`: slower than the target on an idle system, or
    with less slack than one decode step) than the SLO percentile lets miss. The pools are
    sized all the same (the decode pool at the shortest step, the front pools for the
    requests in reach); the condition says that attainment cannot reach the SLO and which
    field to change. `was`: the condition's reason so far (`OUT_OF_REACH_CLEAR`).
    """
    if plan is None:
        return None
    slo = config.planning.slo
    if plan.best_itl_s - slo.itl_s > 1e-9:  # the planner's own test, to its tolerance
        message = (
            f"spec.slo.itlSeconds {slo.itl_s:g} s is below one decode step at batch 1 by the decode "
            "model: no decode pool meets it; the decode pool is sized at batch 1, the shortest step"
        )
        return SloReach(False, "ItlBelowOneStep", message, f"{message} ({plan.best_itl_s:.3g} s)")
    share = record.out_of_reach
    allowed = 1.0 - slo.percentile
    target = f"spec.slo.ttftSeconds {slo.ttft_s:g} s"
    if slo.ttft_s_per_1k_tokens:
        target += (
            f" + spec.slo.ttftSecondsPerThousandTokens {slo.ttft_s_per_1k_tokens:g} s per 1,000 prompt tokens"
        )
    limit = allowed * OUT_OF_REACH_CLEAR if was == "RequestsOutOfReach" else allowed
    if share is not None and share > limit:
        message = (
            f"more of the requests than the {allowed:.2%} the SLO percentile {slo.percentile:g} lets "
            f"miss are out of reach of {target}: their own prefill, KV transfer and first decode "
            "step take longer, or leave less than one step of slack, on an idle system; attainment "
            "cannot reach the SLO (the share: status.lastDecision.outputs.outOfReachFraction). A "
            "target that grows with the prompt (spec.slo.ttftSecondsPerThousandTokens) judges long "
            "prompts by their length"
        )
        return SloReach(False, "RequestsOutOfReach", message, f"{share:.1%} of the requests: {message}")
    message = f"some fleet meets every target on the requests observed ({target})"
    return SloReach(True, "Reachable", message, message)


def front_sized(
    config: Config,
    plan_at: Callable[[float], planner.Plan],
    rate: float,
    gain: float,
    planned: dict[str, int],
) -> dict[str, int]:
    """`planned` with the front pools sized for `rate` x `gain` (`learnt_front_gain`), the
    other pools as they were; within the GPU budget (over it: `planned` unchanged)."""
    if gain <= 1.0 or not any(p in planned for p in FRONT_POOLS):
        return planned
    front = _pooled(plan_at(rate * gain), config.pools)
    out = {p: max(n, front[p]) if p in FRONT_POOLS and p in front else n for p, n in planned.items()}
    budget = config.base_policy.gpu_budget
    if budget is not None and policy.total_gpus(out, config.base_policy.gpus_per_replica) > budget:
        return planned
    return out


def counted_slo(config: Config, obs: Observation, state: ScalerState) -> tuple[float, float, float | None]:
    """The error budget's counts with this observation's: (requests judged, of them missed, when).

    The TTFT histogram over the metric window (`Observation.ttft_buckets`, per second as
    rate() gives it) tells the share of the window's requests within the target and the
    rate they finished at; the requests since the last count are that rate times the time
    since (at most a window: the requests of a gap in the metrics are not counted either
    way). A target between bucket bounds is judged at the bound below it, so the share met
    is a lower bound. The earlier counts fade by exp(-time since / `ERROR_BUDGET_MEMORY_S`).
    The counts are held as they were with the budget switched off, stale metrics, no
    histogram, or a target that grows with the prompt (one bound cannot judge it).
    """
    judged, missed, at = state.slo_judged, state.slo_missed, state.slo_counted_at
    slo = config.planning.slo
    if not (config.sizing.error_budget and obs.metrics_ok and obs.ttft_buckets) or slo.ttft_s_per_1k_tokens:
        return judged, missed, at
    got = metrics.count_within(slo.ttft_s, obs.ttft_buckets)
    if got is None or not math.isfinite(got[1]) or got[1] <= 0:
        return judged, missed, at
    within, total = got
    since = config.interval_s if at is None else max(obs.now - at, 0.0)
    n = total * min(since, config.window_s)
    kept = 1.0 if at is None else math.exp(-since / ERROR_BUDGET_MEMORY_S)
    return judged * kept + n, missed * kept + n * max(0.0, 1.0 - within / total), obs.now


def budget_percentile(p: float, judged: float, missed: float, rate: float | None) -> float:
    """The percentile to plan at while the requests judged so far left misses unspent (`p` otherwise).

    The surplus is the misses the SLO still lets through, (1 - p) x judged - missed. Spread
    over the requests to come, at least as many as were judged and as `rate` brings in
    `ERROR_BUDGET_SPREAD_S`, it lets a decision plan for a share of misses of (1 - p) +
    surplus / that: at most twice the SLO's (the surplus is at most (1 - p) x judged).
    Spread so, a surplus is never spent at once: a deployment that has served few requests,
    or whose load has just risen, plans at nearly `p`.
    """
    surplus = (1.0 - p) * judged - missed
    if surplus <= 0 or rate is None or not math.isfinite(rate) or rate < 0:
        return p
    spread = max(judged, rate * ERROR_BUDGET_SPREAD_S)
    return p - surplus / spread


def _floor_planned(record: DecisionRecord) -> bool:
    """Whether the rate a decision planned for is its burst floor (no other term asked more)."""
    floor, planned = record.burst_floor_rps, record.planned_rps
    return floor is not None and planned is not None and planned <= floor * (1.0 + 1e-9)


def _at_percentile(config: Config, p: float) -> Config:
    pl = config.planning
    return replace(config, planning=replace(pl, slo=replace(pl.slo, percentile=p)))


def _with_note(out: Outcome, note: str) -> Outcome:
    notes = (*out.notes, note)
    return replace(out, notes=notes, record=replace(out.record, notes=notes))


def decide(config: Config, obs: Observation, state: ScalerState) -> Outcome:
    """One autoscaling decision. See the module docstring.

    With a surplus in the error budget (`budget_percentile`) the decision is also made at
    the lower percentile, and that one is kept unless it takes a pool below both what the
    pool holds and what the decision at the SLO percentile wants: an unspent budget may
    hold back growth, never shrink a pool the SLO percentile would keep (a budget earned in
    quiet minutes would otherwise be spent by the standing capacity of the next burst). For
    the same reason it is not spent while the demand planned for is the burst floor
    (`burstiness.burst_floor_rate`): the floor is that standing capacity, and holding back
    its growth would spend the budget on the next burst's misses.
    """
    judged, missed, counted_at = counted_slo(config, obs, state)
    p = config.planning.slo.percentile
    out = _decide(config, obs, state)
    lowered = p
    if config.sizing.error_budget and out.plan is not None and not _floor_planned(out.record):
        lowered = budget_percentile(p, judged, missed, obs.arrival_rps)
    if lowered < p:
        low = _decide(_at_percentile(config, lowered), obs, state)
        cut = [
            q
            for q in config.pools
            if low.next_step.get(q, 0) < min(out.current[q], out.next_step.get(q, out.current[q]))
        ]
        said = (
            f"error budget: {missed:.0f} of {judged:.0f} requests judged (over about a week) missed TTFT "
            f"(the SLO lets {(1.0 - p) * judged:.0f})"
        )
        if low.plan is not None and not cut:
            out = _with_note(low, f"{said}: planned at p{100.0 * lowered:.3g}")
        elif cut:
            out = _with_note(
                out,
                f"{said}: p{100.0 * lowered:.3g} would shrink {', '.join(cut)}, planned at p{100.0 * p:.3g}",
            )
    return replace(
        out, state=replace(out.state, slo_judged=judged, slo_missed=missed, slo_counted_at=counted_at)
    )


def _decide(config: Config, obs: Observation, state: ScalerState) -> Outcome:
    """`decide` at the spec's planning percentile (`config.planning.slo.percentile`)."""
    pools = config.pools
    now = obs.now
    empty = PoolObservation(replicas=0)
    pobs = {p: obs.pools.get(p, empty) for p in pools}
    leaving = {p: pobs[p].leaving for p in pools}
    current = {p: pobs[p].replicas - len(leaving[p]) for p in pools}
    pending = {p: pobs[p].pending_pods for p in pools}

    startups = {**state.startups, **obs.startups}
    while len(startups) > MAX_STARTUP_SAMPLES:  # keep the most recent pods' figures
        startups.pop(next(iter(startups)))
    startup_s = lead_time(list(startups.values()))
    lead = config.decision_lead(startup_s)
    pcfg = config.policy_config(lead)
    tn = config.tuning

    # Calibration: fresh metrics add one sample per stage.
    calibrator = state.calibrator()
    base_models = config.planning.models
    if obs.metrics_ok:
        back = back_pool(pools)
        serving = [p for p in pobs[back].pods if p.routable]
        values: dict[str, float] = {}
        for key, v in (
            ("itl_mean", obs.itl_observed_s),
            ("prefill_time_mean", obs.prefill_time_mean_s),
            ("prompt_tokens_mean", obs.prompt_tokens_mean),
        ):
            if v is not None:
                values[key] = v
        running = obs.running.get(back)
        batch = running / max(len(serving), 1) if running is not None else None
        calibrator.observe(values, batch)
    models = calibrator.models(base_models)

    shape = dict(state.shape)
    pstate = state.policy
    observed = obs.arrival_rps if obs.metrics_ok else None
    observed_short = obs.arrival_rps_short
    notes: list[str] = []
    # the requests the front door shed arrived too: the plan's admitted share is of all of them
    if observed is not None and (shed := _rate_or_none(obs.shed_rps)) is not None:
        notes.append(f"{shed:.3g} req/s shed at the front door count as arrivals")
        observed += shed
    if observed_short is not None and (shed_short := _rate_or_none(obs.shed_rps_short)) is not None:
        observed_short += shed_short
    in_system = obs.arrival_pool_in_system
    if not (in_system is not None and math.isfinite(in_system) and in_system >= 0 and obs.metrics_ok):
        in_system = None  # missing or unusable: no growth read, nothing kept
    if in_system is not None and observed is not None:
        # the rate counts requests as the engines finish them: the ones they hold uncounted add
        # their growth (a prefill queue under a burst) or take its fall (the queue draining)
        growth = arrivals_in_system(state.in_system, now, in_system, config.window_s)
        if growth is not None:
            counted, observed = observed, max(0.0, observed + growth)
            if abs(growth) * config.window_s >= 1.0:
                notes.append(
                    f"arrival rate {observed:.3g} req/s: {counted:.3g} counted, {growth:+.3g} the growth "
                    "of the requests waiting for or in the arrival pool"
                )
        if observed_short is not None:
            growth_short = arrivals_in_system(state.in_system, now, in_system, config.short_window_s)
            if growth_short is not None:
                observed_short = max(0.0, observed_short + growth_short)
    plan: planner.Plan | None = None
    planned = dict(current)
    floor: dict[str, int] = {}
    plan_rate: float | None = None
    admitted: float | None = None
    inputs = sizing_inputs(config, obs, lead) if observed is not None else SizingInputs()
    # the demand's view: the token lengths weighed against the last ones (the record keeps the window's)
    seen = obs
    if observed is not None:
        seen, inputs = weighed_shape(obs, inputs, shape, config.window_s)
    gain, gain_at, miss_since = state.front_gain, state.front_gain_at, state.miss_since
    wait_reading = None
    if observed is not None and config.sizing.burstiness:
        wait_reading = wait_arrival_term(config, seen, observed, shape, inputs, models)
        term = paired_wait_term(wait_reading, state, now, config.window_s)
        if term is not None and term > max(inputs.dispersion or 1.0, 1.0):
            inputs = replace(inputs, wait_term=term)
            notes.append(
                f"arrival term {term:.3g} read off the prefill queue's mean wait "
                f"{1000.0 * (obs.prefill_wait_mean_s or 0.0):.3g} ms in two windows in a row (the counts' "
                f"dispersion: {inputs.dispersion or 1.0:.3g}): requests arrive together within a scrape"
            )
    if observed is not None:
        queued = sum(v for v in obs.queued.values() if v is not None and math.isfinite(v))
        rate, pstate = policy.sizing_rate(
            pstate,
            now,
            pcfg,
            observed,
            window_s=config.window_s,
            rate_short=observed_short,
            short_window_s=config.short_window_s,
            queued=queued,
            z=tn.z,
            backlog_drain_s=tn.backlog_drain_s,
            backlog_lead_s=tn.backlog_lead_s,
            ttft_observed=obs.ttft_observed_s if tn.ttft_feedback else None,
            ttft_target=config.ttft_target_s,
            ttft_comfort=tn.ttft_comfort,
            dispersion=inputs.dispersion,
            auto_headroom=inputs.auto_headroom,
            before_rise=inputs.before_rise,
            burst_floor_rps=inputs.burst_floor_rps,
            reach_z=burstiness.noise_z(config.planning.slo.percentile) if tn.within_burst_reach else None,
        )
        plan_rate = rate
        try:
            footprint = observed_kv_footprint(obs, models.decode.kv_cache_tokens)
            plan = config.planning.plan(demand_for(seen, rate, shape, inputs, footprint), models)
            planned = _pooled(plan, pools)
            gain, gain_at, miss_since = learnt_front_gain(
                config, obs, state, models, current=current, planned=planned, startup_s=startup_s
            )
            base = planned
            planned = front_sized(
                config,
                lambda r: config.planning.plan(demand_for(seen, r, shape, inputs, footprint), models),
                rate,
                gain,
                planned,
            )
            if (bound := link_bound_note(plan, config)) is not None:
                notes.append(bound)
            if planned != base:  # the record's stage figures and predictions are the base plan's
                notes.append(
                    f"front load gain {gain:.2f}: {_format_pools(planned, FRONT_POOLS)} sized for "
                    f"{gain:.2f}x the planned rate (the plan's figures are for {_format_pools(base, FRONT_POOLS)})"
                )
            # Fewer front workers only lengthen the prefill queue: while its waits explain a
            # miss, the front pools are not planned below what they hold.
            shrinking = {p: current[p] for p in FRONT_POOLS if p in planned and planned[p] < current[p]}
            missed = prefill_queue_miss(config, obs, models) if shrinking else None
            if missed is not None:
                planned = {**planned, **shrinking}
                notes.append(
                    f"{_format_pools(shrinking, FRONT_POOLS)} held: TTFT {missed:.3g}s at the reachable "
                    f"requests' quantile is above the target {config.ttft_target_s:.3g}s and the "
                    "prefill queue's waits explain it"
                )
            # What the current load needs: a budget rebalance never shrinks a donor below it.
            # The share of the load to admit is that plan's too: under a short budget the front
            # door sheds what the pools cannot serve now, not what a forecast might bring.
            admitted = plan.admitted_fraction
            if pcfg.gpu_budget is not None and rate > observed:
                now_plan = config.planning.plan(demand_for(seen, observed, shape, inputs, footprint), models)
                floor = _pooled(now_plan, pools)
                admitted = now_plan.admitted_fraction
            else:
                floor = dict(planned)
        except ValueError as exc:
            plan = None
            notes.append(f"planner refused the input: {exc}")
    d = policy.decide(
        now,
        current,
        planned,
        pstate,
        pcfg,
        metrics_ok=bool(obs.metrics_ok and plan is not None),
        pending=pending,
        floor=floor,
    )
    notes = [*d.notes, *notes]
    step = dict(d.steps[0]) if d.steps else dict(d.targets)

    # What to do: re-admit drained pods first on the way up, then grow; shrink through drains.
    readmit: dict[str, list[str]] = {}
    grow: dict[str, int] = {}
    drains: list[DrainOrder] = []
    for p in pools:
        want = int(step.get(p, current[p]))
        if want > current[p]:
            back_in = [v.name for v in leaving[p][: want - current[p]]]
            if back_in:
                readmit[p] = back_in
            extra = want - current[p] - len(back_in)
            if extra > 0:
                grow[p] = pobs[p].replicas + extra
        elif want < current[p]:
            if drain.rolling_out(pobs[p].pods):
                notes.append(f"scale-down of {p} waits for its rollout (pods of several ReplicaSets)")
                continue
            flight = obs.in_flight.get(p, {})
            views = {v.name: v for v in pobs[p].pods}
            for name in drain.choose_victims(pobs[p].pods, flight, current[p] - want):
                drains.append(DrainOrder(p, name, flight.get(name), idle=not views[name].routable))
    deferred: dict[str, int] = {}
    if grow:
        grow, deferred = fit_growth_in_budget(config, obs, grow)
        if deferred:
            notes.append(
                f"growth of {_format_pools(deferred, pools)} deferred: draining pods still hold their GPUs"
            )
    if plan is not None and plan.budget_limited and d.reason in ("Hold", "ScaleUp", "ScaleDown", "Rebalance"):
        notes.append(f"budget limited: {plan.sacrificed}")

    new_state = ScalerState(
        policy=d.state,
        decode_samples=tuple(calibrator.decode),
        prefill_samples=tuple(calibrator.prefill),
        shape=shape,
        startups=startups,
        front_gain=gain,
        front_gain_at=gain_at,
        miss_since=miss_since,
        in_system=state.in_system
        if in_system is None
        else _kept_in_system(state.in_system, now, in_system, config),
        wait_term=wait_reading,
        wait_term_at=now if wait_reading is not None else None,
    )
    record = DecisionRecord(
        time=now,
        reason=d.reason,
        metrics_ok=obs.metrics_ok,
        metrics_problem=None if obs.metrics_ok else obs.metrics_problem,
        arrival_rps=observed,
        planned_rps=plan_rate,
        lead_time_s=lead,
        prompt_tokens_mean=obs.prompt_tokens_mean,
        output_tokens_mean=obs.output_tokens_mean,
        observed_ttft_s=obs.ttft_observed_s,
        observed_itl_s=obs.itl_observed_s,
        custom={k: v for k, v in obs.custom.items() if k in config.custom_queries},
        current=dict(current),
        pending=dict(pending),
        stages={
            k: StageFigures(v.arrival_rps, v.wait_mean_s + v.service_s, v.utilization)
            for k, v in (plan.pools.items() if plan else [])
            if k in pools
        },
        predicted_ttft_s=plan.ttft_s if plan else None,
        predicted_itl_s=plan.itl_s if plan else None,
        targets=dict(d.targets),
        next_step=step,
        planned=dict(planned),
        feasible=plan.feasible if plan else None,
        budget_limited=bool(plan and plan.budget_limited),
        sacrificed=(plan.sacrificed or None) if plan and plan.budget_limited else None,
        notes=tuple(n for n in notes if n),
        admitted_fraction=admitted,
        arrival_dispersion=inputs.dispersion,
        wait_arrival_term=inputs.wait_term,
        auto_headroom=inputs.auto_headroom,
        before_rise=inputs.before_rise,
        burst_floor_rps=inputs.burst_floor_rps,
        front_gain=gain if config.sizing.front_load_gain else None,
        size_classes=len(inputs.sizes.prompt_tokens) if inputs.sizes is not None else None,
        planning_percentile=config.planning.slo.percentile if plan is not None else None,
        out_of_reach=out_of_reach_share(config, obs, models) if plan is not None else None,
    )
    return Outcome(
        targets=dict(d.targets),
        next_step=step,
        current=dict(current),
        changed=d.changed,
        reason=d.reason,
        notes=record.notes,
        readmit=readmit,
        grow=grow,
        deferred=deferred,
        drains=drains,
        plan=plan,
        record=record,
        state=new_state,
        calibration=calibrator.status(base_models),
    )
