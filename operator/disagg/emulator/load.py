"""The emulator's load generator: arrivals (Poisson or evenly spaced, piecewise rates) or a trace.

Lazy: `next_arrival()` gives the time (seconds from the start) of the next
request and `pop()` returns it, so an unbounded run needs no precomputed
workload. `PerDeploymentLoad` gives every emulated DisaggDeployment a stream
of its own. Pure: numpy and the standard library.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from disagg.workload import Request, Workload

INF = math.inf


def parse_schedule(text: str) -> list[tuple[float, float]]:
    """``"0:2,60:8,180:2"`` -> [(0, 2), (60, 8), (180, 2)]: from t seconds on, the rate is r req/s."""
    out: list[tuple[float, float]] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            t, r = part.split(":")
            seg = (float(t), float(r))
        except ValueError:
            raise ValueError(f"bad --schedule entry {part!r}: expected SECONDS:RATE") from None
        if seg[0] < 0 or seg[1] < 0 or not all(math.isfinite(x) for x in seg):
            raise ValueError(f"bad --schedule entry {part!r}: times and rates must be finite and >= 0")
        if out and seg[0] <= out[-1][0]:
            raise ValueError("--schedule times must increase")
        out.append(seg)
    if not out:
        raise ValueError("--schedule is empty")
    if out[0][0] > 0:
        out.insert(0, (0.0, 0.0))
    return out


class TokenDraw:
    """Token counts: a constant (std 0) or a normal(mean, std) rounded and clipped to >= 1."""

    def __init__(self, mean: int, std: float, rng: np.random.Generator) -> None:
        if mean < 1:
            raise ValueError(f"token counts must be >= 1, got {mean}")
        if std < 0:
            raise ValueError(f"token std must be >= 0, got {std}")
        self.mean = int(mean)
        self.std = float(std)
        self.rng = rng

    def __call__(self) -> int:
        if self.std == 0:
            return self.mean
        return max(1, round(self.rng.normal(self.mean, self.std)))


class LoadGenerator:
    """Arrivals at piecewise-constant rates (Poisson or uniform spacing) until `duration_s`.

    With ``media_fraction`` > 0 that share of the requests (drawn per request) carries
    ``media_items`` media items, for the encoder pool.
    """

    def __init__(
        self,
        schedule: list[tuple[float, float]],
        prompt: TokenDraw,
        output: TokenDraw,
        *,
        arrivals: str = "poisson",
        duration_s: float = INF,
        rng: np.random.Generator | None = None,
        media_fraction: float = 0.0,
        media_items: int = 1,
        start_s: float = 0.0,
    ) -> None:
        if arrivals not in ("poisson", "uniform"):
            raise ValueError(f"arrivals must be poisson or uniform, got {arrivals!r}")
        if not 0.0 <= media_fraction <= 1.0:
            raise ValueError(f"media fraction must be in [0, 1], got {media_fraction}")
        if media_fraction > 0 and media_items < 1:
            raise ValueError(f"media items per media request must be >= 1, got {media_items}")
        self.media_fraction = media_fraction
        self.media_items = int(media_items)
        self.schedule = schedule
        self.prompt = prompt
        self.output = output
        self.arrivals = arrivals
        self.duration_s = duration_s
        self.rng = rng or np.random.default_rng(0)
        self.seg = 0
        while self._end_of(self.seg) <= start_s:  # a stream that starts late: its segment
            self.seg += 1
        self._next = self._draw(start_s, first=True)

    def _rate_at(self, i: int) -> float:
        return self.schedule[i][1]

    def _end_of(self, i: int) -> float:
        return self.schedule[i + 1][0] if i + 1 < len(self.schedule) else INF

    def _draw(self, t: float, first: bool = False) -> float:
        """The next arrival after `t` (memoryless across rate changes)."""
        while self.seg < len(self.schedule):
            rate = self._rate_at(self.seg)
            end = self._end_of(self.seg)
            if rate > 0:
                if self.arrivals == "poisson":
                    nxt = t + self.rng.exponential(1.0 / rate)
                else:
                    nxt = t + (0.5 / rate if first else 1.0 / rate)
                if nxt < end:
                    return nxt if nxt < self.duration_s else INF
            if end == INF:
                return INF
            t = end
            first = True
            self.seg += 1
        return INF

    def next_arrival(self) -> float:
        return self._next

    def pop(self) -> Request:
        t = self._next
        # a share `media_fraction` of the requests carries `media_items` images (or frames, clips)
        media = self.media_items if self.media_fraction > 0 and self.rng.random() < self.media_fraction else 0
        req = Request(t, self.prompt(), self.output(), media)
        self._next = self._draw(t)
        return req


class PerDeploymentLoad:
    """One arrival stream per emulated DisaggDeployment, as independent clients send them.

    The fleet-wide sources spread one stream round robin over the deployments that can
    serve, so while few of them can (a fleet being created) each gets a multiple of its
    share. Here every deployment gets ``make(index, start_s)``'s stream from the moment
    it joins the fleet (its first pod that can serve) and its requests go to it alone,
    whatever the others do. The streams' times are the driver's clock, so a schedule's
    steps come at once for every deployment.
    """

    def __init__(self, make: Callable[[int, float], LoadGenerator]) -> None:
        self.make = make
        self.streams = 0  # deployments followed
        self._seq = 0  # ties in the heap
        self._heap: list[tuple[float, int, Any, LoadGenerator]] = []

    def attach(self, fleet: Any, now: float) -> None:
        """Follow `fleet`: a stream for each deployment it has now and each it gets later."""
        for dep in list(fleet.deployments.values()):
            self._add(dep, now)
        fleet.listeners.append(self._add)

    def _add(self, dep: Any, now: float) -> None:
        gen = self.make(self.streams, now)
        self.streams += 1
        self._push(gen.next_arrival(), dep, gen)

    def _push(self, t: float, dep: Any, gen: LoadGenerator) -> None:
        if t < INF:
            heapq.heappush(self._heap, (t, self._seq, dep, gen))
            self._seq += 1

    def next_arrival(self) -> float:
        return self._heap[0][0] if self._heap else INF

    def submit(self, fleet: Any, t: float) -> None:
        """Offer the next arrival (due at `t`) to its own deployment."""
        _, _, dep, gen = heapq.heappop(self._heap)
        fleet.offer_to(dep, gen.pop(), t)
        self._push(gen.next_arrival(), dep, gen)


class TraceLoad:
    """Replays a `Workload` (a trace already scaled by --time-scale), up to `duration_s`."""

    def __init__(self, workload: Workload, duration_s: float = INF) -> None:
        self.w = workload
        self.i = 0
        self.duration_s = duration_s

    def next_arrival(self) -> float:
        if self.i >= len(self.w):
            return INF
        t = float(self.w.arrival_s[self.i])
        return t if t < self.duration_s else INF

    def pop(self) -> Request:
        r = self.w[self.i]
        self.i += 1
        return Request(r.arrival_s, r.prompt_tokens, r.output_tokens, r.media_items, r.hash_ids)
