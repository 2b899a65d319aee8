"""Autoscaling policy: turn planned pool sizes into safe scaling decisions.

Pure (standard library only): shared by the operator's autoscaling loop and by
the virtual-time evaluation harness (`disagg.evaluate`).

The planner answers "how many replicas does this load need"; this module
answers "what do we write now", given what is running and what happened
recently:

* scale up at once (bounded by ``max_step_up`` per decision);
* scale down only to the largest recommendation seen in the stabilization
  window (as the HPA does), only once the window is covered by history, and by
  at most ``max_step_down``; drops smaller than ``hysteresis`` x current need
  ``hysteresis_sustain_s`` of sustained recommendations (no 1-replica flapping
  in large pools);
* stale or missing metrics hold every pool (never down, never to zero);
* pending (unschedulable) pods are capacity already requested: no further
  scale-up for a pool while it has pending pods;
* never exceed the GPU budget: a plan that moves GPUs between pools becomes an
  ordered make-before-break sequence (`rebalance_steps`), each step within the
  budget and no pool below what its current load needs.

`PolicyState` round-trips through a plain dict (`to_dict` / `from_dict`) so the
operator can persist it in the status subresource.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

__all__ = [
    "REASONS",
    "Decision",
    "PolicyConfig",
    "PolicyState",
    "burst_reach",
    "decide",
    "forecast_rate",
    "observe_rate",
    "rebalance_steps",
    "sizing_rate",
    "total_gpus",
]

# Decision reasons (CamelCase, usable as Kubernetes condition/event reasons).
REASONS = (
    "ScaleUp",
    "ScaleDown",
    "Rebalance",
    "Hold",
    "HoldStaleMetrics",
    "HoldStabilization",
    "HoldPending",
    "BudgetLimited",
    "Paused",
)


def _nonneg(name: str, v: Any, *, integer: bool = False, allow_none: bool = False) -> None:
    if v is None and allow_none:
        return
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise ValueError(f"{name} must be a number, got {v!r}")
    if not math.isfinite(float(v)) or v < 0:
        raise ValueError(f"{name} must be a finite number >= 0, got {v!r}")
    if integer and float(v) != int(v):
        raise ValueError(f"{name} must be an integer, got {v!r}")


# --------------------------------------------------------------------------- config


@dataclass(frozen=True)
class PolicyConfig:
    """Knobs of the scaling policy. Pools not named in a per-pool dict get the default."""

    scale_down_stabilization_s: float = 300.0
    max_step_up: int | None = None
    max_step_down: int | None = None
    hysteresis: float = 0.1
    hysteresis_sustain_s: float | None = None  # None: 2 x the stabilization window
    min_replicas: dict[str, int] = field(default_factory=dict)
    max_replicas: dict[str, int] = field(default_factory=dict)
    gpus_per_replica: dict[str, int] = field(default_factory=dict)
    gpu_budget: int | None = None
    forecast_horizon_s: float = 60.0  # lead time: observed pod start-up
    forecast_samples: int = 4  # rate samples in the linear trend
    forecast_max_growth: float = 2.0  # projection capped at this multiple of the observation
    headroom: float = 0.0  # standing spare capacity, as a fraction of the demand (see sizing_rate)
    paused: bool = False

    def __post_init__(self) -> None:
        _nonneg("scale_down_stabilization_s", self.scale_down_stabilization_s)
        _nonneg("max_step_up", self.max_step_up, integer=True, allow_none=True)
        _nonneg("max_step_down", self.max_step_down, integer=True, allow_none=True)
        if self.max_step_up == 0:
            raise ValueError("max_step_up must be >= 1 or None")
        if self.max_step_down == 0:
            raise ValueError("max_step_down must be >= 1 or None")
        _nonneg("hysteresis", self.hysteresis)
        if self.hysteresis >= 1:
            raise ValueError(f"hysteresis must be < 1, got {self.hysteresis!r}")
        _nonneg("hysteresis_sustain_s", self.hysteresis_sustain_s, allow_none=True)
        _nonneg("gpu_budget", self.gpu_budget, integer=True, allow_none=True)
        _nonneg("forecast_horizon_s", self.forecast_horizon_s)
        _nonneg("forecast_samples", self.forecast_samples, integer=True)
        if self.forecast_max_growth < 1:
            raise ValueError("forecast_max_growth must be >= 1")
        _nonneg("headroom", self.headroom)
        for name in ("min_replicas", "max_replicas", "gpus_per_replica"):
            for pool, v in getattr(self, name).items():
                _nonneg(f"{name}[{pool}]", v, integer=True)
        for pool, g in self.gpus_per_replica.items():
            if g < 1:
                raise ValueError(f"gpus_per_replica[{pool}] must be >= 1")
        for pool, lo in self.min_replicas.items():
            hi = self.max_replicas.get(pool)
            if hi is not None and lo > hi:
                raise ValueError(f"min_replicas[{pool}] ({lo}) must be <= max_replicas[{pool}] ({hi})")

    def lo(self, pool: str) -> int:
        return int(self.min_replicas.get(pool, 0))

    def hi(self, pool: str) -> int | None:
        v = self.max_replicas.get(pool)
        return None if v is None else int(v)

    def gpr(self, pool: str) -> int:
        return int(self.gpus_per_replica.get(pool, 1))

    @property
    def sustain_s(self) -> float:
        if self.hysteresis_sustain_s is not None:
            return float(self.hysteresis_sustain_s)
        return 2.0 * float(self.scale_down_stabilization_s)

    def clamp(self, pool: str, n: int) -> int:
        n = max(self.lo(pool), int(n))
        hi = self.hi(pool)
        return n if hi is None else min(hi, n)


# --------------------------------------------------------------------------- state


@dataclass(frozen=True)
class PolicyState:
    """What the policy remembers between decisions (plain data; see to_dict)."""

    recommendations: tuple[tuple[float, dict[str, int]], ...] = ()
    rate_samples: tuple[tuple[float, float], ...] = ()
    first_seen: float | None = None  # time of the first recommendation on record
    last_action: float | None = None
    last_targets: dict[str, int] = field(default_factory=dict)
    # times of recommendations sized for a queued backlog (see sizing_rate): they
    # hold capacity only while current, never through the stabilization window
    backlog_times: tuple[float, ...] = ()
    queue_sample: tuple[float, float] | None = None  # last (time, queued) seen by sizing_rate
    changed_at: dict[str, float] = field(default_factory=dict)  # when each pool's target last changed

    def changed_since(self, pools: Iterable[str]) -> float | None:
        """When the policy last changed the target of any of `pools` (None: never on record).
        A state from before per-pool times were kept answers with its last action of any pool."""
        if not self.changed_at:
            return self.last_action
        return max((self.changed_at[p] for p in pools if p in self.changed_at), default=None)

    def with_change(self, now: float, before: Mapping[str, int], after: Mapping[str, int]) -> PolicyState:
        """This state after an action at `now` that set the targets `before` -> `after`.

        A state from before per-pool times were kept gives every pool its last action's time
        first: an earlier change is never forgotten.
        """
        seen = self.changed_at
        if not seen and self.last_action is not None:
            seen = {p: self.last_action for p in (*self.last_targets, *after)}
        moved = {p: float(now) for p, n in after.items() if before.get(p) != n}
        return replace(self, last_action=now, last_targets=dict(after), changed_at={**seen, **moved})

    def to_dict(self) -> dict[str, Any]:
        return {
            "recommendations": [{"t": t, "replicas": dict(r)} for t, r in self.recommendations],
            "rateSamples": [[t, r] for t, r in self.rate_samples],
            "firstSeen": self.first_seen,
            "lastAction": self.last_action,
            "lastTargets": dict(self.last_targets),
            "backlogTimes": list(self.backlog_times),
            "queueSample": None if self.queue_sample is None else list(self.queue_sample),
            # pairs, not a map: a merge patch of status replaces a list whole
            "changedAt": [[p, t] for p, t in self.changed_at.items()],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> PolicyState:
        """Rebuild from `to_dict` output; a missing or malformed dict gives a fresh state."""
        if not d:
            return cls()
        try:
            recs = tuple(
                (float(x["t"]), {str(k): int(v) for k, v in x["replicas"].items()})
                for x in d.get("recommendations", [])
            )
            rates = tuple((float(t), float(r)) for t, r in d.get("rateSamples", []))
            fs = d.get("firstSeen")
            la = d.get("lastAction")
            qs = d.get("queueSample")
            return cls(
                recommendations=recs,
                rate_samples=rates,
                first_seen=None if fs is None else float(fs),
                last_action=None if la is None else float(la),
                last_targets={str(k): int(v) for k, v in (d.get("lastTargets") or {}).items()},
                backlog_times=tuple(float(t) for t in d.get("backlogTimes") or ()),
                queue_sample=None if qs is None else (float(qs[0]), float(qs[1])),
                changed_at={str(p): float(t) for p, t in d.get("changedAt") or ()},
            )
        except (KeyError, TypeError, ValueError, AttributeError, IndexError):
            return cls()


# --------------------------------------------------------------------------- forecast


def observe_rate(state: PolicyState, now: float, rate: float, config: PolicyConfig) -> PolicyState:
    """Record an arrival-rate sample (non-finite or negative samples are ignored)."""
    if rate is None or not math.isfinite(rate) or rate < 0:
        return state
    keep = max(2, config.forecast_samples)
    samples = [s for s in state.rate_samples if s[0] < now] + [(float(now), float(rate))]
    return replace(state, rate_samples=tuple(samples[-keep:]))


def forecast_rate(
    state: PolicyState, now: float, config: PolicyConfig, window_s: float | None = None
) -> float | None:
    """Arrival rate expected one lead time (``forecast_horizon_s``) ahead.

    Least-squares line through the last ``forecast_samples`` samples. When the
    trend rises, the projection to ``now + horizon`` is used (capped at
    ``forecast_max_growth`` x the latest observation); when it falls, the latest
    observation is kept: scale-down is the stabilization window's job, and a
    pool sized for a forecast drop would be short if the drop does not come.
    With ``window_s`` (the window each rate sample is measured over), the projection
    also rises no faster than the rate rose since the newest sample whose window does
    not overlap the latest one's (the oldest kept sample when none is that old): a line
    through a step (a level that rose and stays) is a ramp, and projected a start-up
    ahead it asks for a rise that has stopped; with no rise since, the latest
    observation is kept. None when there is no sample.
    """
    s = state.rate_samples
    if not s:
        return None
    last_t, last = s[-1]
    pts = s[-max(2, config.forecast_samples) :]
    if len(pts) < 2 or config.forecast_horizon_s <= 0:
        return last
    n = len(pts)
    mt = sum(t for t, _ in pts) / n
    mr = sum(r for _, r in pts) / n
    var = sum((t - mt) ** 2 for t, _ in pts)
    if var <= 0:
        return last
    slope = sum((t - mt) * (r - mr) for t, r in pts) / var
    if slope <= 0:
        return last
    # project from the fitted line's value at the latest sample, never below the observation
    fitted_now = mr + slope * (last_t - mt)
    ahead = now - last_t + config.forecast_horizon_s
    proj = fitted_now + slope * ahead
    if window_s is not None:
        older = [(t, r) for t, r in pts[:-1] if last_t - t >= window_s - 1e-9]
        since_t, since = older[-1] if older else pts[0]
        recent = (last - since) / (last_t - since_t)
        proj = min(proj, last + max(0.0, recent) * ahead)
    return min(max(last, proj), last * config.forecast_max_growth if last > 0 else proj)


def sizing_rate(
    state: PolicyState,
    now: float,
    config: PolicyConfig,
    rate: float,
    *,
    window_s: float,
    rate_short: float | None = None,
    short_window_s: float | None = None,
    queued: float = 0.0,
    z: float = 1.645,
    backlog_drain_s: float = 60.0,
    backlog_lead_s: float | None = None,
    ttft_observed: float | None = None,
    ttft_target: float | None = None,
    ttft_comfort: float = 0.5,
    dispersion: float | None = None,
    auto_headroom: float | None = None,
    before_rise: float | None = None,
    burst_floor_rps: float | None = None,
    reach_z: float | None = None,
) -> tuple[float, PolicyState]:
    """The arrival rate to plan for, shared by the operator's loop and `disagg evaluate`.

    * fast attack: a short-window rate whose lower confidence bound (``z`` standard
      deviations of the same counting noise as below, over ``short_window_s``) is above
      the window's rate is a real step up, not noise, and is taken at once;
    * the rate one lead time ahead (`forecast_rate`), never below the observation;
    * plus ``z`` standard deviations of the counting noise of a rate measured over
      ``window_s``: var = dispersion x rate / window, where ``dispersion`` is the
      measured index of dispersion of arrival counts (`disagg.burstiness`; None or a
      bad value: 1, Poisson);
    * plus the capacity to clear, within ``backlog_drain_s``, the backlog expected
      when capacity added now serves: the ``queued`` requests plus their growth
      since the previous call projected over ``backlog_lead_s`` (default: the
      forecast horizon, i.e. the start-up time).

    The demand part (not the backlog) is the larger of the forecast plus its noise
    and the observation plus its noise times ``1 + max(config.headroom,
    auto_headroom)``: standing spare capacity for bursts that rise faster than a
    worker starts, which no reactive rule can catch (docs/evaluation.md). Both
    answer how far load may rise before capacity asked for now serves (the
    forecast from the recent trend, the headroom from the burst profile), so their
    product would count a rise twice. ``auto_headroom`` is derived from the observed burst
    profile and start-up (`disagg.burstiness.burst_headroom`); ``config.headroom``
    (``spec.autoscaling.headroom``) is then a floor under it. The headroom is kept
    even when the observed TTFT is comfortable: the bursts it covers come faster
    than the comfort can be lost. ``before_rise`` (`disagg.burstiness.before_rise`) is
    the rate a rise now under way began from, as a share s of the current rate: the
    rise has used its part of the automatic headroom h, which leaves (1 + h) s - 1
    (one more whole headroom on top of a burst still ramping into the window would
    size for two bursts stacked within one window); never below the spec's headroom.
    ``burst_floor_rps`` (`disagg.burstiness.burst_floor_rate`) is a floor under the demand part:
    the rate the burst horizon's largest rises reached, which no share of the current rate
    stands ready for: traffic that stopped may come back at it while the current rate is
    zero, and on/off bursts many times the low level jump to it from there.

    With ``reach_z``, a rising trend is projected no further than the level the bursts seen
    reach (`burst_reach`) while the rate is within ``reach_z`` standard deviations of Poisson
    counting noise of that level and the observed TTFT meets its target: the burst profile
    measured how far such rises go within a lead, and a line through a burst's first
    minute projected a lead ahead asks for far more than its top (up to twice it). A rise
    beyond that level (one of a kind not seen), or one the pools are not keeping up with
    (TTFT over the target, or not observed), is projected as before. Under the same TTFT
    condition, a rate within that noise of the burst floor or above it is at a burst's top:
    the automatic headroom's spare capacity then stops at the floor (or at the rate), with
    its counting noise, since the headroom's rises ran from feet to such tops, not beyond
    them; ``config.headroom`` still applies in full.

    A backlog term larger than the counting-noise term marks this recommendation
    as backlog-driven (``state.backlog_times``): `decide` then lets it hold
    capacity only while it is current, not through the stabilization window, so
    the extra workers go as soon as the queue is gone.
    Returns the rate and the state with this observation recorded.
    """
    r = rate
    disp = 1.0
    if dispersion is not None and math.isfinite(dispersion) and dispersion > 0:
        disp = float(dispersion)
    if rate_short is not None and short_window_s and math.isfinite(rate_short) and rate_short >= 0:
        lcb = rate_short - z * math.sqrt(disp * rate_short / short_window_s)
        r = max(r, lcb)
    state = observe_rate(state, now, r, config)
    f = forecast_rate(state, now, config, window_s) or 0.0
    # the observed TTFT meets its target (the comfort rule below asks for room to spare too)
    meets = bool(
        ttft_observed is not None
        and ttft_target
        and math.isfinite(ttft_observed)
        and 0 <= ttft_observed <= ttft_target
    )
    if reach_z is not None and f > r and meets:
        reach = burst_reach(r, auto_headroom, before_rise, burst_floor_rps)
        if reach is not None and r <= reach + reach_z * math.sqrt(reach / window_s):
            f = min(f, max(r, reach))
    noise = z * math.sqrt(disp * max(f, 0.0) / window_s)
    backlog = 0.0
    q = float(queued) if queued is not None and math.isfinite(queued) and queued > 0 else 0.0
    if q > 0 and backlog_drain_s > 0:
        lead = config.forecast_horizon_s if backlog_lead_s is None else backlog_lead_s
        prev = state.queue_sample
        growth = 0.0
        if prev is not None and now > prev[0]:
            growth = max(0.0, (q - prev[1]) / (now - prev[0]))
        backlog = (q + growth * max(0.0, lead)) / backlog_drain_s
    if backlog <= 0 and meets and ttft_observed <= ttft_comfort * ttft_target:
        # the pools meet the target with room to spare: plan for the observation,
        # no extrapolated growth and no counting-noise headroom
        f, noise = r, 0.0
    marks = tuple(t for t in state.backlog_times if t < now)
    if backlog > noise:
        marks = (*marks, float(now))
    state = replace(state, queue_sample=(float(now), q), backlog_times=marks[-64:])
    # The trend and the headroom are two answers to one question, how far load may rise
    # before capacity asked for now serves: plan for the larger, not their product.
    headroom = config.headroom
    if auto_headroom is not None and math.isfinite(auto_headroom) and auto_headroom > headroom:
        auto = float(auto_headroom)
        if before_rise is not None and math.isfinite(before_rise) and 0.0 <= before_rise < 1.0:
            auto = (1.0 + auto) * before_rise - 1.0  # a rise under way has used its share
        headroom = max(headroom, auto)
    noise_now = z * math.sqrt(disp * max(r, 0.0) / window_s) if noise > 0 else 0.0
    spare = (r + noise_now) * (1.0 + headroom)
    floor_ok = burst_floor_rps is not None and math.isfinite(burst_floor_rps)
    standing = float(burst_floor_rps) if floor_ok else 0.0
    if reach_z is not None and meets and standing > 0:
        # At the level bursts reach the burst is here: the headroom's rises ran from feet to
        # such tops, and one more on top of the top is a rise no burst has shown. The spare
        # capacity stops at that level (or the rate, with their counting noise); the spec's
        # own headroom stays.
        allow = reach_z * math.sqrt(standing / window_s)
        if r >= standing - allow:
            top = min(spare, max(standing + allow, r + noise_now))
            spare = max(top, (r + noise_now) * (1.0 + config.headroom))
    return max(f + noise, spare, standing) + backlog, state


def burst_reach(
    rate: float,
    auto_headroom: float | None,
    before_rise: float | None,
    burst_floor_rps: float | None,
) -> float | None:
    """The level the bursts seen reach from where the rate stands (req/s); None when none was seen.

    The higher of the burst floor (the rate the largest rises reached) and, while a rise is
    under way (``before_rise`` < 1: it began from that share of `rate`), its foot times one
    plus the automatic headroom (how far rises went within a lead). A headroom of 0 (no
    rise seen) or no rise under way says nothing about a level: the current rate would be
    its own reach.
    """
    reach = 0.0
    if burst_floor_rps is not None and math.isfinite(burst_floor_rps):
        reach = float(burst_floor_rps)
    if (
        auto_headroom is not None
        and math.isfinite(auto_headroom)
        and auto_headroom > 0
        and before_rise is not None
        and math.isfinite(before_rise)
        and 0.0 <= before_rise < 1.0
    ):
        reach = max(reach, (1.0 + auto_headroom) * before_rise * rate)
    return reach if reach > 0 else None


# --------------------------------------------------------------------------- budget helpers


def total_gpus(replicas: dict[str, int], gpus_per_replica: dict[str, int] | None = None) -> int:
    g = gpus_per_replica or {}
    return sum(int(n) * int(g.get(p, 1)) for p, n in replicas.items())


def rebalance_steps(
    current: dict[str, int],
    target: dict[str, int],
    gpus_per_replica: dict[str, int] | None = None,
    budget: int | None = None,
    floor: dict[str, int] | None = None,
) -> list[dict[str, int]]:
    """Ordered make-before-break steps from `current` to `target` (the last step is `target`).

    Growth comes first, as far as the free budget allows; when the budget is
    full, donors (pools above target) shrink only by what the next growth
    needs, and first only down to ``max(target, floor)`` (what their current
    load needs); only when no donor has replicas above its floor do they go
    the rest of the way to target. Every step is within the budget provided
    `current` and `target` are; no pool goes below ``min(current, target,
    floor)``; receivers never shrink and donors never grow. Without a budget:
    one step up (every growth), then the target. An empty list means nothing
    to do.
    """
    g = gpus_per_replica or {}
    fl = floor or {}
    pools = sorted(set(current) | set(target))
    s = {p: int(current.get(p, 0)) for p in pools}
    tg = {p: int(target.get(p, s[p])) for p in pools}
    gpr = {p: int(g.get(p, 1)) for p in pools}
    steps: list[dict[str, int]] = []

    start = dict(s)

    def emit() -> None:
        if s != (steps[-1] if steps else start):
            steps.append(dict(s))

    if s == tg:
        return []
    if budget is None:
        up = {p: max(s[p], tg[p]) for p in pools}
        if up != s:
            s.update(up)
            emit()
        s.update(tg)
        emit()
        return steps

    def used() -> int:
        return sum(s[p] * gpr[p] for p in pools)

    # A current state over budget (budget lowered): shrink donors to target first.
    if used() > budget:
        for p in pools:
            if s[p] > tg[p]:
                s[p] = tg[p]
        emit()
    for _ in range(4 * (sum(abs(s[p] - tg[p]) for p in pools) + 2)):
        # 1. grow receivers as far as the budget allows (largest deficit first)
        grew = False
        for p in sorted(pools, key=lambda q: (-(tg[q] - s[q]) * gpr[q], q)):
            if s[p] < tg[p]:
                free = budget - used()
                k = min(tg[p] - s[p], max(0, free) // gpr[p])
                if k > 0:
                    s[p] += k
                    grew = True
        if grew:
            emit()
        if s == tg:
            break
        need_growth = [p for p in pools if s[p] < tg[p]]
        if not need_growth:
            # only donors left: shrink them to target
            for p in pools:
                s[p] = min(s[p], tg[p]) if s[p] > tg[p] else s[p]
            emit()
            break
        # 2. free just enough GPUs for the smallest pending growth unit
        need = min(gpr[p] for p in need_growth) - (budget - used())
        for stage_floor in (True, False):
            donors = sorted(
                (p for p in pools if s[p] > tg[p]),
                key=lambda q: (-(s[q] - max(tg[q], fl.get(q, 0))), q),
            )
            for p in donors:
                low = max(tg[p], int(fl.get(p, 0))) if stage_floor else tg[p]
                while need > 0 and s[p] > low:
                    s[p] -= 1
                    need -= gpr[p]
            if need <= 0:
                break
        if need > 0:  # cannot happen when target fits the budget; bail out to the target
            s.update(tg)
            emit()
            break
        emit()
    if s != tg:
        s.update(tg)
        emit()
    return steps


# --------------------------------------------------------------------------- decide


@dataclass(frozen=True)
class Decision:
    targets: dict[str, int]
    reason: str
    changed: bool
    state: PolicyState
    notes: list[str] = field(default_factory=list)
    steps: list[dict[str, int]] = field(default_factory=list)  # make-before-break sequence; last = targets

    def to_dict(self) -> dict[str, Any]:
        return {
            "targets": dict(self.targets),
            "reason": self.reason,
            "changed": self.changed,
            "notes": list(self.notes),
            "steps": [dict(s) for s in self.steps],
        }


def _window_max(
    recs: tuple[tuple[float, dict[str, int]], ...],
    pool: str,
    since: float,
    default: int,
    skip: frozenset[float] = frozenset(),
) -> int:
    vals = [r[pool] for t, r in recs if t >= since and pool in r and t not in skip]
    return max(default, *vals) if vals else default


def decide(
    now: float,
    current: dict[str, int],
    planned: dict[str, int],
    state: PolicyState,
    config: PolicyConfig,
    *,
    metrics_ok: bool,
    pending: dict[str, int] | None = None,
    floor: dict[str, int] | None = None,
    reason_hint: str = "",
) -> Decision:
    """Decide the replicas to write now. See the module docstring for the rules.

    `current` is the replicas requested now (including pods still starting or
    pending); `planned` the planner's recommendation; `pending` the pods per
    pool that cannot be scheduled; `floor` the replicas each pool needs for its
    current load (protects donors during a rebalance; default: nothing).
    """
    pending = pending or {}
    notes: list[str] = [reason_hint] if reason_hint else []
    pools = sorted(set(current) | set(planned))
    cur = {p: int(current.get(p, 0)) for p in pools}

    def hold(reason: str, st: PolicyState, extra: str = "") -> Decision:
        tg = {p: max(cur[p], config.lo(p)) for p in pools}
        if extra:
            notes.append(extra)
        changed = tg != cur
        if changed:
            st = st.with_change(now, cur, tg)
        return Decision(tg, reason, changed, st, notes, [tg] if changed else [])

    if config.paused:
        return hold("Paused", state, "autoscaling paused")
    if not metrics_ok:
        return hold("HoldStaleMetrics", state, "metrics missing or stale: holding every pool")
    for p, v in planned.items():
        if v is None or (isinstance(v, float) and not math.isfinite(v)) or v < 0:
            return hold("HoldStaleMetrics", state, f"invalid recommendation for {p}: {v!r}")

    rec = {p: config.clamp(p, int(planned.get(p, cur[p]))) for p in pools}
    keep_s = max(config.scale_down_stabilization_s, config.sustain_s)
    recs = (*tuple((t, r) for t, r in state.recommendations if t >= now - keep_s and t < now), (now, rec))
    first = state.first_seen if state.first_seen is not None else now
    # backlog-driven recommendations (sizing_rate) hold capacity while the backlog
    # lasts, then no longer: once a recommendation is not backlog-driven, the
    # stabilization window skips them
    skip = frozenset() if now in state.backlog_times else frozenset(t for t in state.backlog_times if t < now)
    marks = tuple(t for t in state.backlog_times if t >= now - keep_s)
    st = replace(state, recommendations=recs, first_seen=first, backlog_times=marks)
    win = config.scale_down_stabilization_s
    covered = now - first >= win - 1e-9

    targets: dict[str, int] = {}
    held_stab: list[str] = []
    held_pending: list[str] = []
    for p in pools:
        c, want = cur[p], rec[p]
        if want > c:
            if pending.get(p, 0) > 0:
                targets[p] = c
                held_pending.append(p)
                continue
            step = want - c if config.max_step_up is None else min(want - c, config.max_step_up)
            targets[p] = c + step
        elif want < c:
            if c < config.lo(p):  # below min already (min raised): go up, never further down
                targets[p] = config.lo(p)
                continue
            cand = min(c, _window_max(recs, p, now - win, want, skip))
            drop = c - cand
            if drop > 0 and not covered:
                cand, drop = c, 0
                held_stab.append(p)
            elif drop > 0 and drop < config.hysteresis * c:
                sustained = now - first >= config.sustain_s - 1e-9
                cand_long = min(c, _window_max(recs, p, now - config.sustain_s, want, skip))
                if sustained and cand_long < c:
                    cand = max(cand, cand_long)
                else:
                    cand = c
                    held_stab.append(p)
                drop = c - cand
            elif drop == 0:
                held_stab.append(p)
            if config.max_step_down is not None:
                cand = max(cand, c - config.max_step_down)
            targets[p] = max(cand, config.lo(p))
        else:
            targets[p] = c

    reason = ""
    steps: list[dict[str, int]] = []
    g = {p: config.gpr(p) for p in pools}
    budget = config.gpu_budget
    if budget is not None:
        ups = [p for p in pools if targets[p] > cur[p]]
        downs_planned = [p for p in pools if rec[p] < cur[p]]
        if ups and total_gpus(targets, g) > budget and downs_planned:
            # The plan moves GPUs between pools: donors may shrink now (bypassing the
            # stabilization window) by what the receivers need, not below their floor.
            need = total_gpus(targets, g) - budget
            for p in sorted(downs_planned, key=lambda q: -(targets[q] - rec[q])):
                low = max(rec[p], int((floor or {}).get(p, 0)), config.lo(p))
                while need > 0 and targets[p] > low:
                    targets[p] -= 1
                    need -= g[p]
            if total_gpus(targets, g) <= budget:
                reason = "Rebalance"
        if total_gpus(targets, g) > budget:
            # last resort: trim growth, largest first; never below current
            reason = "BudgetLimited"
            while total_gpus(targets, g) > budget:
                grow = [p for p in pools if targets[p] > cur[p]]
                if not grow:
                    break
                p = max(grow, key=lambda q: (targets[q] - cur[q], q))
                targets[p] -= 1
            notes.append(f"GPU budget {budget}: targets trimmed to {total_gpus(targets, g)} GPUs")
        if targets != cur and total_gpus(cur, g) <= budget:
            steps = rebalance_steps(cur, targets, g, budget, floor)
    if not steps and targets != cur:
        steps = [dict(targets)]

    changed = targets != cur
    held_stab = [p for p in held_stab if targets[p] >= cur[p]]
    ups = [p for p in pools if targets[p] > cur[p]]
    downs = [p for p in pools if targets[p] < cur[p]]
    if not reason:
        if ups and downs:
            reason = "Rebalance"
        elif ups:
            reason = "ScaleUp"
        elif downs:
            reason = "ScaleDown"
        elif held_pending:
            reason = "HoldPending"
        elif held_stab:
            reason = "HoldStabilization"
        else:
            reason = "Hold"
    if held_pending:
        notes.append(f"pending pods in {', '.join(held_pending)}: no further scale-up")
    if held_stab:
        notes.append(f"scale-down of {', '.join(held_stab)} held by the stabilization window")
    if changed:
        st = st.with_change(now, cur, targets)
    return Decision(targets, reason, changed, st, notes, steps)
