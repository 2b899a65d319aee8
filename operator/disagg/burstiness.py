"""Measured burstiness of the arrival process, and the standing headroom bursts call for.

Pure (numpy and the standard library). Four numbers, all from arrival counts per
equal sub-window (per scrape from Prometheus, or per bin from a window's requests):

* `index_of_dispersion`: variance over mean of the counts within a level. A Poisson
  process has 1 at every time scale; batches of B simultaneous requests have B;
  on/off traffic faster than a sub-window more than 1. It is the arrival term of
  Allen-Cunneen (``ca^2``, `disagg.planner.Demand.arrival_ca2`). It is read from
  consecutive pairs of counts, so a slow trend (a diurnal ramp, which the forecast
  follows) does not inflate it, and a level shift (a burst slower than a
  sub-window starting or ending, which the forecast and the burst headroom answer)
  is left out rather than read as variance of the whole span.
* `burst_headroom`: how far the planned-for rate (the trailing-window rate) rose
  within one start-up time, beyond counting noise, relative to the rate it rose
  from, at a quantile over the trailing horizon weighted by the requests each rise
  brings; a fall within one start-up counts as the rise its burst made when it
  began. Capacity added when a burst is seen serves one start-up later, so the
  requests that arrive during a rise larger than the standing headroom are the ones
  that miss: covering the rises of the SLO's share of requests (the autoscaler
  passes ``slo.percentile``) keeps them within what the SLO allows to miss. At a top far
  above where the traffic usually is (`COMPARABLE_LEVELS` times the horizon's median rate),
  only rises from comparable levels are read: at the top of an on/off burst the rises that
  brought it there say nothing of what may come on top.
  ``spec.autoscaling.headroom`` is a floor under it.
* `before_rise`: the rate a rise now under way began from, as a share of the current
  one (the least window mean over the last window): a burst still ramping into the
  window's mean is using the headroom that stood for it, and only the rest stands over it.
* `burst_floor_rate`: the rises `burst_headroom` cannot size, as the rates they reach: those
  from a silent window (or falls into one), for which a share of the current rate stands
  ready for nothing, and those larger than the headroom may be (its cap): on/off traffic
  whose bursts are many times its low level. This is the rate to stand ready for instead.
* `burst_profile`: both of the last two from one judging of the counts, as the decision
  reads them each interval.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from statistics import NormalDist
from typing import NamedTuple

import numpy as np

__all__ = [
    "BurstProfile",
    "arrival_counts",
    "arrivals_from_counts",
    "before_rise",
    "burst_floor_rate",
    "burst_headroom",
    "burst_profile",
    "index_of_dispersion",
    "noise_z",
]

MIN_COUNTS = 4  # sub-windows (three pairs) from which level shifts are screened out
BURST_QUANTILE = 0.95  # default share of requests whose rises the standing headroom covers
NOISE_Z = 1.645  # rises within this many standard deviations of counting noise are noise
# From fewer pairs than level shifts can be screened from, the dispersion taken is the one
# the pairs show at this one-sided confidence: the level at which NOISE_Z tells a rise from noise.
EARLY_CONFIDENCE = NormalDist().cdf(NOISE_Z)
NOISE_SHARE = 0.5  # of the share of rises a quantile leaves uncovered, what noise may take
MAX_AUTO_HEADROOM = 2.0  # the automatic headroom never asks for more than 3x the demand
# Rates further apart than this factor are different levels of traffic. When the current
# planned-for rate is that far above the horizon's median (the top of an on/off source or a
# batch job), the burst headroom reads only the rises whose foot is within this factor of it:
# such traffic rises from its low level, not from the top it jumped to. Elsewhere (a diurnal
# day, bursts over a base, dips and returns) every rise is read, as a share of its foot.
COMPARABLE_LEVELS = 3.0
# A pair of counts whose z is this many times the dispersion is a level shift, not variance:
# 4 standard deviations of Poisson's z (a chi-square of one degree), which pure noise passes
# once in ~16,000 pairs (a week of 30 s counts at any rate gives about one).
LEVEL_SHIFT_Z = 16.0
_CHI2_1_MEDIAN = NormalDist().inv_cdf(0.75) ** 2  # median of a chi-square of one degree (Poisson's z)


def _counts(counts: Sequence[float] | np.ndarray, name: str = "counts") -> np.ndarray:
    c = np.asarray(counts, dtype=float).ravel()
    if c.size and (not np.all(np.isfinite(c)) or np.any(c < 0)):
        raise ValueError(f"{name} must be finite and >= 0 (a missing scrape is dropped, not zero)")
    return c


def arrival_counts(
    arrival_s: Sequence[float] | np.ndarray, sub_window_s: float, start: float, end: float
) -> np.ndarray:
    """Arrivals per sub-window of [start, end) (the last partial sub-window dropped)."""
    if not (sub_window_s > 0 and math.isfinite(sub_window_s)):
        raise ValueError(f"sub_window_s must be > 0, got {sub_window_s!r}")
    n = int((end - start) // sub_window_s)
    if n <= 0:
        return np.zeros(0)
    edges = start + sub_window_s * np.arange(n + 1)
    t = np.asarray(arrival_s, dtype=float)
    got, _ = np.histogram(t, bins=edges)
    # numpy's last bin is closed; every sub-window here is half-open [a, b)
    got[-1] -= np.count_nonzero(t == edges[-1])
    return got.astype(float)


def arrivals_from_counts(
    counts: Sequence[float],
    growth: Sequence[float | None] | None,
    shed: Sequence[float | None] | None = None,
) -> tuple[float, ...]:
    """Arrivals per sub-window from the requests counted in it, the growth over it of the
    requests the counted pool holds uncounted, and the requests the front door shed in it (flow
    conservation: what arrived was counted leaving the pool, is still in it, or was turned
    away). An addend unknown for a sub-window is left out of it; a list of another length than
    the counts is not used.

    The engines count a request when it leaves the pool, so under a queue the counts are the
    pool's throughput: flat while a burst queues, then a rise when added capacity drains it,
    a start-up later than the burst. Read as arrivals, that drain is a rise the traffic never
    made; and without the shed, a front door admitting more or less reads as traffic rising
    and falling. A sum below zero (the gauge is sampled at scrapes, the counts between them)
    is none. An invalid count is returned as it is (the caller's checks refuse it; none is
    hidden as zero).
    """
    usable = [x for x in (growth, shed) if x is not None and len(x) == len(counts)]
    out = []
    for i, c in enumerate(counts):
        known = [v for x in usable if (v := x[i]) is not None and math.isfinite(v)]
        out.append(max(0.0, c + math.fsum(known)) if known and math.isfinite(c) else c)
    return tuple(out)


def _chi2_quantile(q: float, dof: int) -> float:
    """The q-quantile of a chi-square of 1 or 2 degrees of freedom (closed forms)."""
    if dof == 1:
        return NormalDist().inv_cdf((1.0 + q) / 2.0) ** 2
    if dof == 2:
        return -2.0 * math.log(1.0 - q)
    raise ValueError(f"dof must be 1 or 2, got {dof!r}")


def index_of_dispersion(counts: Sequence[float] | np.ndarray, *, detrend: bool = True) -> float | None:
    """Variance / mean of arrival counts per equal sub-window, within a level; None without enough data.

    ``detrend`` (default): from consecutive pairs. Each pair with arrivals gives
    ``z = (c[i+1] - c[i])^2 / (c[i+1] + c[i])``, whose mean is exactly 1 for Poisson
    counts at any rate (given the pair's total, the split is binomial) and about B
    for batches of B requests; a slow trend hardly moves it. A level shift between
    two sub-windows (a burst that starts or ends, slower than a sub-window: the
    forecast and the burst headroom answer those) makes that one pair's z far
    above the rest, and read as variance it would size the queues of the whole
    span for it. So pairs above `LEVEL_SHIFT_Z` times the median's estimate (the
    median over that of Poisson's z) are left out, and the mean of the rest is the
    estimate (with a median of 0, most pairs equal, the plain mean). The screen is set
    once, from the median: a shift inside a sub-window leaves a count between the two
    levels and so two pairs of middling z, and a screen rescaled by the mean of the
    pairs it keeps would let those in, rise, let larger ones in, and read on/off traffic
    whose every level is Poisson as several times Poisson. Pairs without arrivals say
    nothing and are skipped.

    With fewer than ``MIN_COUNTS - 1`` such pairs (a deployment's first minute or two, or
    traffic that comes and goes) there are too few to screen a shift out, but the pairs
    there are still measure the dispersion: the estimate is then its one-sided lower
    confidence bound at `EARLY_CONFIDENCE` from the pairs with arrivals on both sides
    (a pair with an empty side is traffic starting or stopping). Their z sum to the
    dispersion times a chi-square of as many degrees, so the bound is that sum over the
    chi-square's `EARLY_CONFIDENCE` quantile: what a shift alone would rarely show, not
    the point estimate a single shift would inflate. Assuming Poisson until more counts
    exist sized the first minutes of bursty traffic for smooth arrivals (docs/planner.md,
    "The first pairs of counts").

    Otherwise (``detrend`` False) the plain sample variance (ddof 1) over the mean, from
    `MIN_COUNTS` sub-windows on. None without such data or with no arrival at all: the
    caller keeps its default (Poisson, 1), it never reads a missing value as smooth.
    """
    c = _counts(counts)
    if not detrend:
        mean = float(c.mean()) if c.size else 0.0
        return float(c.var(ddof=1)) / mean if c.size >= MIN_COUNTS and mean > 0 else None
    total = c[1:] + c[:-1]
    seen = total > 0
    if int(seen.sum()) < MIN_COUNTS - 1:
        both = (c[1:] > 0) & (c[:-1] > 0)
        if not both.any():
            return None
        z = np.diff(c)[both] ** 2 / total[both]
        return float(z.sum()) / _chi2_quantile(EARLY_CONFIDENCE, z.size)
    z = np.diff(c)[seen] ** 2 / total[seen]
    est = float(np.median(z)) / _CHI2_1_MEDIAN
    if est <= 0.0:  # most pairs equal (a few arrivals a sub-window): no scale to tell shifts by
        return float(z.mean())
    return float(z[z <= LEVEL_SHIFT_Z * est].mean())  # never empty: the median pair stays


def noise_z(quantile: float) -> float:
    """Standard deviations of counting noise a rise must exceed to count at this quantile.

    Pure noise may pass for a burst at most `NOISE_SHARE` as often as the quantile lets
    rises go uncovered: at q = 0.99 one point in 200. Were it as often (one in 100), the
    quantile of an hour's rises on pure Poisson traffic would sit at the edge of the noise
    and be a burst half the time.
    """
    return max(NOISE_Z, NormalDist().inv_cdf(1.0 - NOISE_SHARE * (1.0 - quantile)))


def burst_headroom(
    counts: Sequence[float] | np.ndarray,
    sub_window_s: float,
    *,
    startup_s: float,
    window_s: float,
    quantile: float = BURST_QUANTILE,
    z: float = NOISE_Z,
    dispersion: float = 1.0,
    floor: float = 0.0,
    cap: float = MAX_AUTO_HEADROOM,
) -> float | None:
    """Standing headroom (a fraction of the demand) for bursts that rise faster than start-up.

    ``counts``: arrivals per sub-window over the trailing horizon, oldest first.
    At every sub-window end t, the planned-for rate is the mean over the trailing
    ``window_s``, m(t); the rise is ``max m(s) for s in (t, t + startup_s]`` minus
    m(t), less the counting noise of that difference (Poisson noise times
    ``dispersion``, the index of dispersion) at ``z`` standard deviations for the
    largest of the start-up's rates (`_single_z`); relative to m(t). A fall, m(t) less
    the least rate within the start-up, is read as the rise from that rate to m(t)
    (relative to the low rate, weighted by m(t)): a burst's end tells its size as well
    as its start, and its start may lie before the counts.
    The result is the ``quantile`` of those relative rises, each weighted by the
    rate it rises to (the requests it would leave unserved), between ``floor`` and
    ``cap``: with ``quantile`` the SLO's percentile, the rises larger than the
    headroom bring at most the share of requests the SLO lets miss. Rises larger than
    ``cap`` are not read here: no headroom allowed would cover them, and
    `burst_floor_rate` stands ready for the rates they reach instead.

    When the current planned-for rate is more than `COMPARABLE_LEVELS` times the median
    over the counts (a top far above where the traffic usually is), the rises read are
    those whose foot is within that factor of it (all of them when none is): a rise's
    foot is the level it began from, the least planned-for rate over the window before
    it (a step reaches the window's mean as a ramp lasting one window, whose points are
    no level), and a fall's is where it ends, the least over the start-up and the window
    after it. Traffic that jumps between two such levels then stands ready, at its top,
    for what rose from its top, not for a second jump of the same size on top of the
    first. Below that, every rise is read (bursts whose size grows with the level, and
    dips whose returns are bursts too, would otherwise go unread).

    Only windows after the first arrival in the counts are judged: before it the
    counts hold no traffic at all (a new deployment, clients not yet pointed at it, or
    no pod serving yet), and a window reaching back into that silence averages it in,
    so the traffic's own beginning would read as a rise of many times the load and keep
    the headroom at ``cap`` for as long as it stays in the horizon. Later silences
    (on/off traffic) are judged as they come. None when the counts from the first
    arrival on are shorter than one window plus one start-up (the caller keeps the
    floor).

    On smooth traffic the rises stay within counting noise and this is ~0 (see
    docs/planner.md for what it costs where they do not).
    """
    return burst_profile(
        counts,
        sub_window_s,
        startup_s=startup_s,
        window_s=window_s,
        quantile=quantile,
        z=z,
        dispersion=dispersion,
        floor=floor,
        cap=cap,
    ).headroom


def burst_floor_rate(
    counts: Sequence[float] | np.ndarray,
    sub_window_s: float,
    *,
    startup_s: float,
    window_s: float,
    quantile: float = BURST_QUANTILE,
    z: float = NOISE_Z,
    dispersion: float = 1.0,
    cap: float = MAX_AUTO_HEADROOM,
) -> float | None:
    """The rate (req/s) to stand ready for, for the rises a share of the current rate cannot.

    `burst_headroom` is a share of the current rate, so over a silent window it keeps
    nothing, and a rise from silence (or a fall into it, read as the rise its traffic
    made when it began) has no size relative to its foot: `burst_headroom` leaves those
    out. A window is silent when its count is within counting noise of none at ``z`` (a
    straggler or two of traffic that stopped, which the engines count as it finishes).
    Nor does it read the rises larger than ``cap`` times their foot (the most headroom it
    may ask): on/off traffic jumping from 2 req/s to 10 within a start-up would find, at
    its low level, three times 2 standing where 10 come. This judges both kinds as the
    rates they reach, beyond the same counting noise, each weighted by that rate: the
    requests it would bring before capacity asked for then serves. None when they bring
    at most ``1 - quantile`` of the requests of every rise in the horizon (the SLO lets
    them miss); otherwise the least rate that leaves no more than that share of them
    uncovered. The traffic's first arrival in the counts is never such a rise
    (`burst_headroom`'s docstring), so a new deployment stands ready for nothing.
    """
    return burst_profile(
        counts,
        sub_window_s,
        startup_s=startup_s,
        window_s=window_s,
        quantile=quantile,
        z=z,
        dispersion=dispersion,
        cap=cap,
    ).burst_floor_rps


class BurstProfile(NamedTuple):
    """What one reading of the horizon's rises gives the decision."""

    headroom: float | None  # `burst_headroom`
    burst_floor_rps: float | None  # `burst_floor_rate`; None whenever `headroom` is None


def burst_profile(
    counts: Sequence[float] | np.ndarray,
    sub_window_s: float,
    *,
    startup_s: float,
    window_s: float,
    quantile: float = BURST_QUANTILE,
    z: float = NOISE_Z,
    dispersion: float = 1.0,
    floor: float = 0.0,
    cap: float = MAX_AUTO_HEADROOM,
) -> BurstProfile:
    """`burst_headroom` and `burst_floor_rate` from one judging of the counts' rises (the
    decision needs both each interval). The floor is read only where the headroom is: with
    no rise from traffic above zero in the horizon there is none."""
    _check_profile_args(sub_window_s, window_s, startup_s, quantile, dispersion)
    if floor < 0 or cap < floor:
        raise ValueError(f"need 0 <= floor <= cap, got floor={floor!r}, cap={cap!r}")
    pts = _judged(
        counts, sub_window_s, startup_s=startup_s, window_s=window_s, z=z, dispersion=dispersion, cap=cap
    )
    if pts is None:
        return BurstProfile(None, None)
    rel, weight = pts.rel, pts.weight
    if pts.current > COMPARABLE_LEVELS * pts.typical:  # a top far above the usual level
        near = (pts.foot * COMPARABLE_LEVELS >= pts.current) & (pts.foot <= pts.current * COMPARABLE_LEVELS)
        if near.any():
            rel, weight = rel[near], weight[near]
    rise = _weighted_quantile(rel, weight, quantile) if rel.size else 0.0
    headroom = float(max(floor, rise))  # every rise read is within the cap (`_judged`)
    return BurstProfile(headroom, _burst_floor(pts, quantile))


def _burst_floor(pts: _Judged, quantile: float) -> float | None:
    """`burst_floor_rate` on judged rises."""
    if pts.beyond_share.size == 0:
        return None
    allowed = (1.0 - quantile) * (float(pts.weight.sum()) + float(pts.beyond_weight.sum()))
    order = np.argsort(-pts.beyond_share, kind="stable")  # the largest first
    uncovered = np.cumsum(pts.beyond_weight[order])
    if uncovered[-1] <= allowed:
        return None
    # largest first, the first rate at which the uncovered weight passes the allowed share:
    # standing ready for it covers it and every smaller one, and leaves only those above it
    i = int(np.searchsorted(uncovered, allowed, side="right"))
    return float(pts.beyond_share[order[i]])


def _check_profile_args(
    sub_window_s: float, window_s: float, startup_s: float, quantile: float, dispersion: float
) -> None:
    if not (sub_window_s > 0 and window_s > 0 and startup_s >= 0):
        raise ValueError("sub_window_s and window_s must be > 0, startup_s >= 0")
    if not 0 < quantile < 1:
        raise ValueError(f"quantile must be in (0, 1), got {quantile!r}")
    if not (dispersion > 0 and math.isfinite(dispersion)):
        raise ValueError(f"dispersion must be > 0, got {dispersion!r}")


class _Judged(NamedTuple):
    """The horizon's rises, as `burst_headroom` and `burst_floor_rate` judge them."""

    rel: np.ndarray  # rises from a rate above zero, relative to it (beyond noise, 0..cap)
    weight: np.ndarray  # the rate each rises to (the requests it would leave unserved)
    foot: np.ndarray  # the level each of `rel` rises from (a step's ramp read as its foot)
    # rises a share of the current rate cannot stand ready for (from a silent window or falls
    # into one, and those beyond the headroom's cap): the rate they reach, beyond noise
    beyond_share: np.ndarray
    beyond_weight: np.ndarray  # the rate each rises to (or falls from)
    current: float  # the latest planned-for rate (the window ending with the counts)
    typical: float  # the median planned-for rate over the counts


def _judged(
    counts: Sequence[float] | np.ndarray,
    sub_window_s: float,
    *,
    startup_s: float,
    window_s: float,
    z: float,
    dispersion: float,
    cap: float,
) -> _Judged | None:
    """Every rise within one start-up over the horizon (`burst_headroom`'s docstring); None
    when the counts from the first arrival on are shorter than one window plus one start-up,
    or hold no rise from traffic above zero. Rises more than ``cap`` times their foot are
    judged with those from silence (`burst_floor_rate`)."""
    c = _counts(counts)
    k = max(1, round(window_s / sub_window_s))  # sub-windows per planning window
    lead = max(1, math.ceil(startup_s / sub_window_s - 1e-9))  # sub-windows per start-up
    c = _since_traffic(c)
    if c is None or c.size < k + lead:
        return None
    w = k * sub_window_s
    m = _window_sums(c, k) / w  # m[j]: rate over the window ending at sub-window k - 1 + j
    n = m.size - lead
    if n <= 0:
        return None
    # the largest and smallest planned-for rate within one start-up after each point
    later = np.lib.stride_tricks.sliding_window_view(m[1:], lead)[:n]
    now = m[:n]
    zs = _single_z(z, lead, k)
    # A rise: from `now` to the start-up's largest rate, relative to `now`, weighted by the
    # rate it rises to. A fall: from `now` to the start-up's smallest rate, read as the rise
    # the other way (from the low rate to `now`) that the same burst made when it began. A
    # burst's end tells its size as well as its start, and the start may lie before the
    # counts (the trace or the deployment began inside a burst).
    ahead, low = later.max(axis=1), later.min(axis=1)
    rise = ahead - now - zs * np.sqrt(dispersion * (ahead + now) / w)
    # the least of a start-up's rates is biased low by that selection, so the fall's noise is
    # that of the larger rate on both sides
    fall = now - low - zs * np.sqrt(dispersion * 2.0 * now / w)
    # A foot whose count is within counting noise of none (its lower bound at z is zero or less:
    # c - z sqrt(dispersion c) <= 0) is silence: a few stragglers of traffic that stopped are not a
    # rate a relative rise means anything against
    quiet = z * z * dispersion / w
    ok_rise, ok_fall = now > quiet, low > quiet
    # From (or into) a silent window the rise has no size relative to its foot: it is kept
    # apart, as the rate it reaches
    up, down = ~ok_rise & (rise > 0), ok_rise & ~ok_fall & (fall > 0)
    # The level each point stands at is the least rate over the window before it: a step reaches
    # the window's mean as a ramp lasting one window, whose points are no level. A rise began
    # from that level; a fall ends at the least rate over the start-up and the window after it
    # (where its ramp ends); a point that does not fall stands at its own level.
    level = np.lib.stride_tricks.sliding_window_view(np.concatenate((np.full(k, m[0]), m)), k + 1)
    level = level[:n].min(axis=1)
    after = np.concatenate((m[1:], np.full(lead + k, np.inf)))
    fall_end = np.lib.stride_tricks.sliding_window_view(after, lead + k)[:n].min(axis=1)
    fall_foot = np.where(fall > 0, fall_end, level)
    foot_rate = np.concatenate((now[ok_rise], low[ok_fall]))  # the rate each relative rise is of
    if foot_rate.size == 0:
        return None
    rel = np.concatenate(
        (np.maximum(rise[ok_rise], 0.0) / now[ok_rise], np.maximum(fall[ok_fall], 0.0) / low[ok_fall])
    )
    weight = np.concatenate((ahead[ok_rise], now[ok_fall]))
    foot = np.concatenate((level[ok_rise], fall_foot[ok_fall]))
    # rises beyond the cap are read as the rates they reach (the foot's rate times 1 + the
    # relative rise, so less the same counting noise), with the weight they carry
    big = rel > cap
    keep = ~big
    return _Judged(
        rel[keep],
        weight[keep],
        foot[keep],
        np.concatenate((rise[up], fall[down], foot_rate[big] * (1.0 + rel[big]))),
        np.concatenate((ahead[up], now[down], weight[big])),
        float(m[-1]),
        float(np.median(m)),
    )


def before_rise(
    counts: Sequence[float] | np.ndarray, sub_window_s: float, *, window_s: float, z: float = NOISE_Z
) -> float | None:
    """The rate a rise now under way began from, as a share of the current planned-for rate: the
    least planned-for rate (the trailing window's mean) over the last window, over its latest
    value, in [0, 1]; None before a whole window of counts.

    A step in arrivals reaches the window's mean as a ramp lasting one window, and while it
    ramps, the burst it brings is using the standing headroom that was there for it: with
    the rate at 1 / s times the one at the ramp's foot, a headroom h leaves (1 + h) s - 1 over
    the current rate (`disagg.policy.sizing_rate`, ``before_rise``), not a second headroom
    over the burst. The means compared are those of the windows ending within the last one,
    back to the window just before the current one; a rise within ``z`` standard deviations of
    Poisson counting noise is none (1). The counts are those `burst_headroom` reads, oldest
    first, judged as it judges them: from the first whole sub-window with traffic.
    """
    if not (sub_window_s > 0 and window_s > 0):
        raise ValueError("sub_window_s and window_s must be > 0")
    c = _counts(counts)
    k = max(1, round(window_s / sub_window_s))  # sub-windows per planning window
    c = _since_traffic(c)
    if c is None or c.size < k:
        return None
    m = _window_sums(c[-2 * k :], k)  # arrivals in the k + 1 windows ending within the last window
    now, low = float(m[-1]), float(m.min())
    # A rise within counting noise is none: read as one, a wiggle of a few per cent took that
    # share off the headroom, and a real rise right after found a worker missing. The least of
    # k + 1 counts is biased low, so the noise is the larger count's on both sides, as for a
    # fall in `burst_headroom`.
    if now <= 0 or now - low <= z * math.sqrt(2.0 * now):
        return 1.0
    return low / now


def _since_traffic(c: np.ndarray) -> np.ndarray | None:
    """The counts from the first whole sub-window with traffic on (the traffic began inside the
    one before); None without any arrival."""
    arrived = np.flatnonzero(c > 0)
    return None if arrived.size == 0 else c[arrived[0] + 1 :]


def _window_sums(c: np.ndarray, k: int) -> np.ndarray:
    """Arrivals in every window of `k` consecutive sub-windows, oldest first."""
    cs = np.concatenate(([0.0], np.cumsum(c)))
    return cs[k:] - cs[:-k]


def _single_z(z: float, lead: int, k: int) -> float:
    """The z one rise must pass so that the largest of a start-up's rises passes ``z`` by noise
    no more often than one rise would (Sidak's correction for the maximum).

    The rise at a point is the largest of ``lead`` planned-for rates after it, windows of ``k``
    sub-windows sliding one at a time: about ``1 + (lead - 1) / k`` independent windows. Without
    this, pure noise at a start-up of many windows gets a standing headroom (the largest of
    nine noisy rates passes 2.33 sigma nine times as often as one does). The rises share the
    rate they rise from, so the correction is on the safe side of noise.
    """
    independent = 1.0 + (lead - 1) / k
    if independent <= 1.0:
        return z
    single_miss = -math.expm1(math.log1p(-NormalDist().cdf(-z)) / independent)
    return NormalDist().inv_cdf(1.0 - single_miss)


def _weighted_quantile(values: np.ndarray, weights: np.ndarray, q: float) -> float:
    """The smallest value whose cumulative weight (values sorted ascending) reaches q of the total."""
    order = np.argsort(values, kind="stable")
    cum = np.cumsum(weights[order])
    if cum[-1] <= 0:
        return float(np.quantile(values, q))
    i = int(np.searchsorted(cum, q * cum[-1], side="left"))
    return float(values[order[min(i, values.size - 1)]])
