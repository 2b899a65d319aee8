"""Shared state of the simulator: request jobs, stage counters, the prefix cache.

Nothing here knows about clocks: every method takes ``now`` (seconds, any origin)
and assumes calls arrive in non-decreasing ``now`` order.
"""

from __future__ import annotations

import math
from array import array
from collections import OrderedDict
from copy import deepcopy
from typing import Any

from disagg.model import gap_p99_rank

INF = float("inf")

# Job states.
WAITING = 0  # queued or in service somewhere on its path
DONE = 1  # last token emitted
FAILED = 2  # given up by the transfer-failure policy
LOST = 3  # its worker was removed
REJECTED = 4  # turned away at the front door (admission control)


_ATOMIC = frozenset({int, float, str, bool, type(None)})
_SLOTS: dict[type, tuple[str, ...]] = {}


def slot_deepcopy(self: Any, memo: dict[int, Any]) -> Any:
    """`copy.deepcopy` of an object whose state is all in `__slots__`: the same copy the generic
    path makes (every set slot deep-copied, through the same `memo`), without its per-object
    `__reduce_ex__` round trip. The hindsight searches copy whole clusters of such objects for
    every trial (disagg.yardstick), and the generic path was most of their time."""
    cls = type(self)
    names = _SLOTS.get(cls)
    if names is None:
        names = _SLOTS[cls] = tuple(n for k in reversed(cls.__mro__) for n in k.__dict__.get("__slots__", ()))
    new = cls.__new__(cls)
    memo[id(self)] = new
    for name in names:
        try:
            v = getattr(self, name)
        except AttributeError:  # a slot never set stays unset
            continue
        setattr(new, name, v if type(v) in _ATOMIC else deepcopy(v, memo))
    return new


class Job:
    """One request moving through the stages (mutable simulator state)."""

    __deepcopy__ = slot_deepcopy
    __slots__ = (
        "arrival",
        "attempt",
        "cached",
        "deadline",
        "dst",
        "fail_unit",
        "gaps",
        "hash_ids",
        "id",
        "itl",
        "media",
        "next_chunk",
        "output",
        "path",
        "pending",
        "prompt",
        "pw",
        "reprefills",
        "retries",
        "src",
        "state",
        "t_first",
        "t_kv",
        "t_pf_end",
        "t_stage",
        "units",
        "units_left",
    )

    def __init__(
        self,
        jid: int,
        arrival: float,
        prompt: int,
        output: int,
        media: int = 0,
        hash_ids: tuple[int, ...] | None = None,
        deadline: float = INF,
    ) -> None:
        self.id = jid
        self.arrival = arrival
        self.prompt = prompt
        self.output = output
        self.media = media
        self.hash_ids = hash_ids
        self.deadline = deadline
        self.state = WAITING
        self.path = 0  # 0 = disaggregated (remote prefill), 1 = local (colocated) prefill
        self.attempt = 0  # transfer attempt number; stale link units carry an older one
        self.retries = 0
        self.reprefills = 0
        self.cached = 0  # prefix-cache hit tokens of the last prefill
        self.dst = None  # decode worker holding this job's KV reservation (None: none held)
        self.src = None  # prefill worker holding this job's undelivered KV
        self.pw = None  # worker currently prefilling or queueing the job
        self.units = None  # in-flight link units of the current attempt
        self.units_left = 0  # units of the current attempt not yet delivered (incl. not yet sent)
        self.next_chunk = 0
        self.fail_unit = -1  # unit index that fails in this attempt (-1: none)
        self.pending = 0  # action deferred until prefill ends: 0 none, 1 retry, 2 re-prefill
        self.t_stage = 0.0  # entry time into the current stage
        self.t_pf_end = INF
        self.t_kv = INF
        self.t_first = INF
        self.gaps = None  # [(gap s, count)] of a finished job, until the host reads them
        self.itl = INF  # the ITL statistic of the finished job (seconds), INF until done


class StageStats:
    """Time-integrated queue/system counts, waits and sojourns of one stage.

    ``q`` counts jobs waiting, ``s`` jobs in the stage (waiting + in service).
    """

    __deepcopy__ = slot_deepcopy
    __slots__ = (
        "entered",
        "exited",
        "name",
        "q",
        "q_area",
        "q_last",
        "q_max",
        "s",
        "s_area",
        "s_last",
        "s_max",
        "sojourn_sum",
        "waits",
    )

    def __init__(self, name: str) -> None:
        self.name = name
        self.q = 0
        self.q_area = 0.0
        self.q_last = 0.0
        self.q_max = 0
        self.s = 0
        self.s_area = 0.0
        self.s_last = 0.0
        self.s_max = 0
        self.entered = 0
        self.exited = 0
        self.sojourn_sum = 0.0
        self.waits = array("d")

    def enter(self, now: float, queued: bool = True) -> None:
        """A job enters the stage (into its queue unless `queued` is False)."""
        self.s_area += self.s * (now - self.s_last)
        self.s_last = now
        self.s += 1
        if self.s > self.s_max:
            self.s_max = self.s
        self.entered += 1
        if queued:
            self.q_area += self.q * (now - self.q_last)
            self.q_last = now
            self.q += 1
            if self.q > self.q_max:
                self.q_max = self.q
        else:
            self.waits.append(0.0)

    def start(self, now: float, wait: float) -> None:
        """A queued job starts service after waiting `wait` seconds."""
        self.q_area += self.q * (now - self.q_last)
        self.q_last = now
        self.q -= 1
        self.waits.append(wait)

    def unqueue(self, now: float) -> None:
        """A queued job leaves the queue without service (lost or failed)."""
        self.q_area += self.q * (now - self.q_last)
        self.q_last = now
        self.q -= 1

    def leave(self, now: float, sojourn: float) -> None:
        self.s_area += self.s * (now - self.s_last)
        self.s_last = now
        self.s -= 1
        self.exited += 1
        self.sojourn_sum += sojourn

    def close(self, now: float) -> None:
        """Integrate the areas up to `now` (end of the run)."""
        if now > self.s_last:
            self.s_area += self.s * (now - self.s_last)
            self.s_last = now
        if now > self.q_last:
            self.q_area += self.q * (now - self.q_last)
            self.q_last = now


class PrefixCache:
    """LRU over prefix hash blocks (`block_tokens` tokens each), capacity in tokens."""

    __deepcopy__ = slot_deepcopy
    __slots__ = (
        "block_tokens",
        "blocks",
        "capacity",
        "hit_requests",
        "hit_tokens",
        "lookup_tokens",
        "lookups",
    )

    def __init__(self, capacity_tokens: int, block_tokens: int = 512) -> None:
        self.block_tokens = block_tokens
        self.capacity = max(0, int(capacity_tokens) // block_tokens)
        self.blocks: OrderedDict[int, None] = OrderedDict()
        self.hit_tokens = 0
        self.lookup_tokens = 0
        self.hit_requests = 0
        self.lookups = 0

    def match(self, hash_ids: tuple[int, ...] | None, prompt: int) -> int:
        """Cached tokens of the longest cached prefix (at most prompt - 1: the last token is computed)."""
        self.lookups += 1
        self.lookup_tokens += prompt
        if not hash_ids or not self.capacity:
            return 0
        blocks = self.blocks
        k = 0
        for h in hash_ids:
            if h not in blocks:
                break
            blocks.move_to_end(h)
            k += 1
        cached = min(k * self.block_tokens, prompt - 1)
        if cached > 0:
            self.hit_tokens += cached
            self.hit_requests += 1
        return cached

    def insert(self, hash_ids: tuple[int, ...] | None) -> None:
        if not hash_ids or not self.capacity:
            return
        blocks = self.blocks
        for h in hash_ids:
            if h in blocks:
                blocks.move_to_end(h)
            else:
                blocks[h] = None
        while len(blocks) > self.capacity:
            blocks.popitem(last=False)


def gap_summary(pairs: list[tuple[float, int]] | None) -> tuple[int, float, float, float]:
    """(gaps, sum, p99, max) of one request's inter-token gaps given as (gap, count) runs.

    The p99 is the nearest-rank one (`disagg.model.gap_p99_rank`): with 100 gaps
    or fewer it is the largest gap.
    """
    if not pairs:
        return 0, 0.0, 0.0, 0.0
    n = 0
    total = 0.0
    mx = 0.0
    for g, c in pairs:
        n += c
        total += g * c
        if g > mx:
            mx = g
    rank = gap_p99_rank(n)
    if rank >= n:
        return n, total, mx, mx
    acc = 0
    for g, c in sorted(pairs):
        acc += c
        if acc >= rank:
            return n, total, g, mx
    return n, total, mx, mx  # not reached: acc ends at n >= rank


class GapHistogram:
    """Every inter-token gap of every finished request, in log-spaced bins 1 % wide.

    Memory is fixed (~1,900 bins from 0.1 ms to 10,000 s, clamped at both ends)
    however many requests run. A percentile is the mean gap of the bin holding
    its nearest rank: exact when the bin holds one gap length (a fixed decode
    step), within 1 % otherwise.
    """

    LO_S = 1e-4
    HI_S = 1e4
    RATIO = 1.01

    __deepcopy__ = slot_deepcopy
    __slots__ = ("count", "counts", "max", "sums", "total")

    _SCALE = 1.0 / math.log(RATIO)
    _BINS = int(math.log(HI_S / LO_S) / math.log(RATIO)) + 2

    def __init__(self) -> None:
        self.counts = [0] * self._BINS
        self.sums = [0.0] * self._BINS
        self.count = 0
        self.total = 0.0
        self.max = 0.0

    def add(self, gap: float, n: int = 1) -> None:
        i = int(math.log(gap / self.LO_S) * self._SCALE) if gap > self.LO_S else 0
        if i >= self._BINS:
            i = self._BINS - 1
        self.counts[i] += n
        self.sums[i] += gap * n
        self.count += n
        self.total += gap * n
        if gap > self.max:
            self.max = gap

    def percentile(self, q: float) -> float:
        """Nearest-rank q-quantile (q in [0, 1]); NaN when empty."""
        if not self.count:
            return math.nan
        rank = max(1, math.ceil(q * self.count - 1e-9))
        acc = 0
        for i, c in enumerate(self.counts):
            if c:
                acc += c
                if acc >= rank:
                    return self.sums[i] / c
        return self.max

    def summary_ms(self) -> dict[str, float]:
        if not self.count:
            return {k: math.nan for k in ("mean", "p50", "p90", "p99", "p99.9", "max")}
        return {
            "mean": 1000.0 * self.total / self.count,
            "p50": 1000.0 * self.percentile(0.5),
            "p90": 1000.0 * self.percentile(0.9),
            "p99": 1000.0 * self.percentile(0.99),
            "p99.9": 1000.0 * self.percentile(0.999),
            "max": 1000.0 * self.max,
        }
