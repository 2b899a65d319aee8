"""A coalescing work queue for reconciles: one key (a DisaggDeployment) is queued at most once
and worked on by at most one worker at a time; a failed run is retried with exponential backoff.

Many watch events for one object (its pods starting, its Deployments' status) become one
reconcile: a request for a key that is already queued only moves it earlier, and a request
while the key is being worked on runs it once more afterwards. Workers are bounded, so a
burst of objects never runs more than `concurrency` reconciles at once, and a slow object
holds one worker, never the others.

A failed run (an exception: e.g. the API server refused a child, the quota is full) is run
again after `backoff_s`, doubling up to `max_backoff_s`, until it succeeds; child events do not
shorten the wait, a spec change (`request(..., reset_backoff=True)`) does.

Pure: asyncio only.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import time
from collections.abc import Awaitable, Callable, Hashable

log = logging.getLogger("disagg.workqueue")

#: First wait before retrying a failed run; doubles per failure up to MAX_BACKOFF_S.
BACKOFF_S = 1.0
MAX_BACKOFF_S = 120.0


def backoff(failures: int, base_s: float = BACKOFF_S, max_s: float = MAX_BACKOFF_S) -> float:
    """Wait before the next attempt after `failures` consecutive failures (>= 1)."""
    return min(max_s, base_s * 2 ** max(0, failures - 1))


class WorkQueue:
    def __init__(
        self,
        work: Callable[[Hashable], Awaitable[None]],
        concurrency: int = 4,
        backoff_s: float = BACKOFF_S,
        max_backoff_s: float = MAX_BACKOFF_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, got {concurrency}")
        self._work = work
        self.concurrency = concurrency
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self._clock = clock
        self._due: dict[Hashable, float] = {}
        self._heap: list[tuple[float, int, Hashable]] = []
        self._seq = itertools.count()
        self._running: set[Hashable] = set()
        self._again: dict[Hashable, float] = {}
        self._failures: dict[Hashable, int] = {}
        self._retry_at: dict[Hashable, float] = {}
        self._wake = asyncio.Event()
        self.runs = 0  # completed runs, successful or not (for tests and benchmarks)
        self.failed_runs = 0

    # -- requests ------------------------------------------------------------------------
    def request(self, key: Hashable, delay_s: float = 0.0, reset_backoff: bool = False) -> None:
        """Run `key` after `delay_s` (coalesced with any pending request for it)."""
        if reset_backoff:
            self._failures.pop(key, None)
            self._retry_at.pop(key, None)
        due = self._clock() + delay_s
        if key in self._running:
            self._again[key] = min(due, self._again.get(key, due))
            return
        self._schedule(key, due)

    def forget(self, key: Hashable) -> None:
        """Drop a pending request and the failure count (the object is gone)."""
        self._due.pop(key, None)
        self._again.pop(key, None)
        self._failures.pop(key, None)
        self._retry_at.pop(key, None)

    def failures(self, key: Hashable) -> int:
        return self._failures.get(key, 0)

    def pending(self) -> int:
        return len(self._due) + len(self._again)

    def _schedule(self, key: Hashable, due: float) -> None:
        due = max(due, self._retry_at.get(key, due))  # a failing key waits out its backoff
        if key in self._due and self._due[key] <= due:
            return
        self._due[key] = due
        heapq.heappush(self._heap, (due, next(self._seq), key))
        self._wake.set()

    # -- running -------------------------------------------------------------------------
    async def run(self) -> None:
        """Dispatch due keys to at most `concurrency` workers, forever."""
        slots = asyncio.Semaphore(self.concurrency)
        workers: set[asyncio.Task] = set()
        try:
            while True:
                now = self._clock()
                while self._heap and self._heap[0][0] <= now:
                    due, _, key = heapq.heappop(self._heap)
                    if self._due.get(key) != due:
                        continue  # superseded by an earlier request, or forgotten
                    del self._due[key]
                    if key in self._running:
                        self._again[key] = due
                        continue
                    await slots.acquire()
                    self._running.add(key)
                    task = asyncio.create_task(self._one(key, slots))
                    workers.add(task)
                    task.add_done_callback(workers.discard)
                    now = self._clock()
                timeout = max(0.0, self._heap[0][0] - now) if self._heap else None
                self._wake.clear()
                try:
                    await asyncio.wait_for(self._wake.wait(), timeout)
                except TimeoutError:
                    pass
        finally:
            for task in workers:
                task.cancel()
            await asyncio.gather(*workers, return_exceptions=True)

    async def _one(self, key: Hashable, slots: asyncio.Semaphore) -> None:
        try:
            await self._work(key)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            n = self._failures[key] = self._failures.get(key, 0) + 1
            wait = backoff(n, self.backoff_s, self.max_backoff_s)
            self._retry_at[key] = self._clock() + wait
            self.failed_runs += 1
            log.warning("%s failed (%d in a row): %s; retrying in %.1f s", key, n, exc, wait)
            self._again[key] = min(self._retry_at[key], self._again.get(key, self._retry_at[key]))
        else:
            self._failures.pop(key, None)
            self._retry_at.pop(key, None)
        finally:
            self.runs += 1
            self._running.discard(key)
            slots.release()
            again = self._again.pop(key, None)
            if again is not None:
                self._schedule(key, again)
