"""Clock-free stage state machines: FCFS workers, the KV link, serving (decode/colocated) workers.

Every component exposes ``next_time`` (seconds; ``INF`` when nothing is scheduled)
and ``advance(now)``, which must be called exactly when ``now == next_time``; it
performs that event, reports what happened through the *host* (the `Cluster`)
callbacks, and leaves the following event time in ``next_time``. Mutating calls
(``submit``, ``offer_kv``, ``start``, ``cancel`` ...) also take ``now`` and may
move ``next_time``. A driver keeps one heap entry per component (``sched`` and
``ver`` are its bookkeeping) and works the same on virtual time (the simulator)
and on the wall clock (the emulator).

Host callbacks used here::

    host.prefill_plan(worker, job) -> (service_s, marks)   # marks: chunk-ready offsets or None
    host.enc_done(worker, job, now)
    host.pf_start(worker, job, now)
    host.pf_chunk(worker, job, k, now)
    host.pf_done(worker, job, now)
    host.tx_done(link, unit, now)
    host.serve_done(worker, job, now)
"""

from __future__ import annotations

from bisect import bisect_right
from collections import deque
from heapq import heappop, heappush

from disagg.names import POOL_COLOCATED, POOL_DECODE, POOL_ENCODER, POOL_PREFILL
from disagg.sim.core import INF, Job, PrefixCache, StageStats, slot_deepcopy

ENCODER = POOL_ENCODER
PREFILL = POOL_PREFILL
DECODE = POOL_DECODE
COLOCATED = POOL_COLOCATED
LINK = "link"
QUEUED = -2.0  # Unit.tag of a send waiting for a place on its link


class Component:
    """Scheduling bookkeeping shared by every event source."""

    __deepcopy__ = slot_deepcopy  # inherited by every worker and link
    __slots__ = ("next_time", "sched", "ver")

    def __init__(self) -> None:
        self.next_time = INF
        self.sched = INF  # time of this component's live heap entry
        self.ver = 0  # heap entries carrying an older version are stale


class FcfsWorker(Component):
    """One server with a FCFS queue: an encoder or a prefill worker.

    A prefill worker may emit chunk-ready events while it serves (chunked KV
    sends): ``marks`` are the chunk completion offsets from service start; the
    last mark is the end of service.
    """

    __slots__ = (
        "busy_s",
        "cache",
        "cur",
        "draining",
        "host",
        "link",
        "load_s",
        "mark_i",
        "marks",
        "name",
        "pool",
        "queue",
        "removed",
        "role",
        "sends",
        "stage",
        "t_start",
    )

    def __init__(
        self,
        host,
        role: str,
        name: str,
        stage: StageStats,
        cache: PrefixCache | None = None,
        link: Link | None = None,
    ) -> None:
        super().__init__()
        self.host = host
        self.role = role
        self.name = name
        self.pool = role
        self.stage = stage
        self.cache = cache
        self.link = link
        self.queue: deque[tuple[Job, float]] = deque()
        self.cur: Job | None = None
        self.t_start = 0.0
        self.marks: list[float] | None = None
        self.mark_i = 0
        self.busy_s = 0.0
        self.load_s = 0.0  # estimated outstanding work (routing signal)
        self.draining = False
        self.removed = False
        self.sends: set[Job] = set()  # jobs whose KV this worker still has to deliver

    # -- routing signals
    def load(self) -> float:
        """Outstanding work in seconds (queued service + remaining service): least-work routing."""
        if self.cur is not None:
            return self.load_s - (self.host.now - self.t_start)
        return self.load_s

    def in_flight(self) -> int:
        return len(self.queue) + (self.cur is not None)

    def jobs(self) -> list[Job]:
        out = [j for j, _ in self.queue]
        if self.cur is not None:
            out.append(self.cur)
        return out

    # -- mutations
    def submit(self, job: Job, now: float, est_s: float) -> None:
        job.pw = self
        self.load_s += est_s
        self.stage.enter(now)
        job.t_stage = now
        self.queue.append((job, est_s))
        if self.cur is None:
            self._start(now)

    def _start(self, now: float) -> None:
        job, est = self.queue.popleft()
        self.load_s -= est
        self.stage.start(now, now - job.t_stage)
        if self.role == PREFILL:
            log = self.host.prefill_wait_log
            if log is not None:
                log.append((now, now - job.t_stage))
        self.cur = job
        self.t_start = now
        svc, marks = self.host.prefill_plan(self, job)
        job.t_pf_end = now + svc  # expected end; exact once service completes
        self.load_s += svc
        self.marks = marks
        self.mark_i = 0
        self.next_time = now + (marks[0] if marks else svc)
        self.host.pf_start(self, job, now)

    def advance(self, now: float) -> None:
        job = self.cur
        marks = self.marks
        if marks is not None and self.mark_i < len(marks) - 1:
            k = self.mark_i
            self.mark_i = k + 1
            self.next_time = self.t_start + marks[k + 1]
            self.host.pf_chunk(self, job, k, now)
            return
        self.busy_s += now - self.t_start
        self.load_s = max(0.0, self.load_s - (now - self.t_start))
        self.stage.leave(now, now - job.t_stage)
        self.cur = None
        self.next_time = INF
        if self.cache is not None:
            self.cache.insert(job.hash_ids)
        if self.role == PREFILL:
            self.host.pf_done(self, job, now)
        else:
            self.host.enc_done(self, job, now)
        if self.cur is None and self.queue:
            self._start(now)

    def drop_all(self, now: float) -> list[Job]:
        """Remove every queued and running job (worker removal); returns them."""
        lost = []
        while self.queue:
            job, _ = self.queue.popleft()
            self.stage.unqueue(now)
            self.stage.leave(now, now - job.t_stage)
            lost.append(job)
        if self.cur is not None:
            self.busy_s += now - self.t_start
            self.stage.leave(now, now - self.cur.t_stage)
            lost.append(self.cur)
            self.cur = None
        self.load_s = 0.0
        self.next_time = INF
        return lost


class Unit:
    """One send on a link: a whole KV state or one chunk of it."""

    __deepcopy__ = slot_deepcopy
    __slots__ = ("attempt", "dead", "fails", "idx", "job", "nbytes", "t0", "tag", "work")

    def __init__(self, job: Job, attempt: int, idx: int, work: float, nbytes: float, fails: bool) -> None:
        self.job = job
        self.attempt = attempt
        self.idx = idx
        self.work = work  # seconds of link time at full bandwidth
        self.nbytes = nbytes
        self.fails = fails
        self.dead = False
        self.t0 = 0.0
        self.tag = -1.0  # -1 while in setup


class Link(Component):
    """A KV link: each send waits `setup_s`, then shares the bandwidth equally (processor sharing).

    Virtual-time PS: with n sends in their byte phase, each progresses at 1/n of
    the link; a send joining at virtual time V with `work` seconds of full-rate
    link time finishes when V reaches V + work.

    With ``max_active`` > 0 the link carries at most that many sends at once
    (setup or bytes; each chunk of a streamed send is one send); later sends wait
    in a FIFO queue and start as earlier ones finish or are cancelled. The
    stage's queue length and waits are this queue's.
    """

    __slots__ = (
        "active_n",
        "busy_s",
        "bytes_done",
        "host",
        "last",
        "max_active",
        "n",
        "name",
        "pbytes",
        "queue",
        "setup_s",
        "setups",
        "stage",
        "v",
    )

    def __init__(self, host, name: str, setup_s: float, stage: StageStats, max_active: int = 0) -> None:
        super().__init__()
        self.host = host
        self.name = name
        self.setup_s = setup_s
        self.stage = stage
        self.max_active = max_active  # 0: no limit
        self.setups: list[tuple[float, int, Unit]] = []  # (setup end, seq, unit)
        self.pbytes: list[tuple[float, int, Unit]] = []  # (finish tag, seq, unit)
        self.queue: deque[tuple[Unit, int]] = deque()  # sends waiting for a free place, FIFO
        self.n = 0  # sends in the byte phase
        self.active_n = 0  # sends in setup or in the byte phase
        self.v = 0.0  # virtual time
        self.last = 0.0  # real time of the last virtual-time update
        self.busy_s = 0.0
        self.bytes_done = 0.0

    def _sync(self, now: float) -> None:
        if self.n:
            dt = now - self.last
            self.v += dt / self.n
            self.busy_s += dt
        self.last = now

    def _next(self) -> None:
        pb = self.pbytes
        while pb and pb[0][2].dead:
            heappop(pb)
        t = INF
        if pb:
            t = self.last + (pb[0][0] - self.v) * self.n
        st = self.setups
        while st and st[0][2].dead:
            heappop(st)
        if st and st[0][0] < t:
            t = st[0][0]
        self.next_time = t

    def active(self) -> int:
        """Sends in setup or in the byte phase (not the queued ones)."""
        return self.active_n

    def start(self, unit: Unit, now: float, seq: int) -> None:
        unit.t0 = now
        self._sync(now)
        if self.max_active and self.active_n >= self.max_active:
            unit.tag = QUEUED
            self.stage.enter(now)
            self.queue.append((unit, seq))
        else:
            self.stage.enter(now, queued=False)
            self._begin(unit, now, seq)
        self._next()

    def _begin(self, unit: Unit, now: float, seq: int) -> None:
        """The send gets a place on the link: setup, then bytes."""
        self.active_n += 1
        unit.tag = -1.0
        if self.setup_s > 0:
            heappush(self.setups, (now + self.setup_s, seq, unit))
        else:
            self._join(unit, seq)

    def _admit_queued(self, now: float) -> None:
        q = self.queue
        while q and (not self.max_active or self.active_n < self.max_active):
            unit, seq = q.popleft()
            if unit.dead:
                continue
            self.stage.start(now, now - unit.t0)
            self._begin(unit, now, seq)

    def _join(self, unit: Unit, seq: int) -> None:
        unit.tag = self.v + unit.work
        self.n += 1
        heappush(self.pbytes, (unit.tag, seq, unit))

    def cancel(self, unit: Unit, now: float) -> None:
        """Abort a send (failure cleanup or worker removal); its bytes are not counted."""
        if unit.dead:
            return
        self._sync(now)
        unit.dead = True
        if unit.tag == QUEUED:
            self.stage.unqueue(now)
        else:
            self.active_n -= 1
            if unit.tag >= 0:
                self.n -= 1
        self.stage.leave(now, now - unit.t0)
        if self.queue:
            self._admit_queued(now)
        self._next()

    def advance(self, now: float) -> None:
        self._sync(now)
        done = []
        st = self.setups
        while st and (st[0][2].dead or st[0][0] <= now):
            _, seq, unit = heappop(st)
            if not unit.dead:
                self._join(unit, seq)
        pb = self.pbytes
        # Done when less than a nanosecond of real time remains: far above the float
        # resolution of `now` (so the next event always moves time forward).
        horizon = self.v + 1e-9 / max(self.n, 1)
        while pb and (pb[0][2].dead or pb[0][0] <= horizon):
            _, _, unit = heappop(pb)
            if unit.dead:
                continue
            unit.dead = True
            self.n -= 1
            self.active_n -= 1
            self.bytes_done += unit.nbytes
            self.stage.leave(now, now - unit.t0)
            done.append(unit)
        if self.n == 0:
            self.v = 0.0
            pb.clear()
        if self.queue:
            self._admit_queued(now)
        self._next()
        for unit in done:
            self.host.tx_done(self, unit, now)


# Serving worker modes.
IDLE = 0
STEPPING = 1  # decode steps of constant length (jumped over until the batch changes)
STALLED = 2  # a whole prefill runs; decode waits
HYBRID = 3  # one step = decode step + one prefill chunk


class ServeWorker(Component):
    """A decode worker with continuous batching; optionally also prefills locally (colocated).

    The batch holds up to ``slots`` sequences; sequences join and leave only at
    step boundaries. While the batch composition is unchanged every step has
    the same length, so the worker schedules its next event directly at the
    next completion (or at the next boundary if someone is waiting for a free
    slot) instead of stepping. Jobs whose KV has arrived wait in ``waiting``
    (holding their reservation) until a slot frees.

    Local prefills (colocated placement) queue in ``pq``, FCFS; each needs a
    free slot. Without chunking a prefill stalls the batch for its whole
    service time, and one decode step runs between consecutive prefills; with
    chunking each step carries one prefill chunk on top of the decode step.
    A sequence's first token comes at the end of its first decode step.

    KV capacity (``kv_tokens``): a sequence reserves its whole footprint, prompt
    + output tokens, when it joins the batch (or starts its local prefill) and
    frees it when it finishes, as a conservative scheduler that never preempts
    does. Admission is FCFS: while the head of ``waiting`` does not fit, it and
    everything behind it wait, even with free slots. A sequence larger than the
    whole cache joins an empty worker alone (so nothing waits forever). KV of a
    sequence whose transfer landed but that waits for admission is not counted
    (the planner models the same; docs/simulator.md).

    Token gaps: every completed step is logged as (first step index, gap)
    runs in ``log_k``/``log_g`` (a run per change of gap length: a batch
    change, or the first step after a stall, whose gap spans the stall). A
    sequence that joined at step S and leaves at step E saw the gaps of steps
    S+2 .. E; `gap_runs` reads them off the log when it finishes. The log is
    cleared when the worker idles and trimmed to the oldest sequence it still
    serves, so it stays short however long the run.
    """

    LOG_TRIM = 4096  # log entries before the first trim

    __slots__ = (
        "batch",
        "busy_s",
        "cache",
        "chunked",
        "d",
        "draining",
        "fresh",
        "held",
        "host",
        "incoming",
        "kv_area",
        "kv_peak",
        "kv_stage",
        "kv_tokens",
        "kv_used",
        "last",
        "last_pf",
        "last_tok",
        "log_g",
        "log_k",
        "log_trim",
        "mode",
        "name",
        "pf_i",
        "pf_job",
        "pf_marks",
        "pf_stage",
        "pf_t0",
        "pool",
        "pq",
        "removed",
        "role",
        "seq",
        "slot_area",
        "slots",
        "step_s",
        "steps",
        "t_base",
        "t_pf_end",
        "waiting",
    )

    def __init__(
        self,
        host,
        role: str,
        name: str,
        step_s: list[float],
        slots: int,
        kv_stage: StageStats,
        pf_stage: StageStats | None = None,
        cache: PrefixCache | None = None,
        chunked: bool = False,
        kv_tokens: int = 0,
    ) -> None:
        super().__init__()
        self.host = host
        self.role = role
        self.pool = role
        self.name = name
        self.step_s = step_s  # step_s[b]: step length (s) with batch b
        self.slots = slots
        self.kv_tokens = kv_tokens if kv_tokens > 0 else INF  # KV-cache capacity (0: unlimited)
        self.kv_used = 0  # KV tokens reserved by the batch and the local prefill
        self.kv_area = 0.0  # integral of kv_used over time (token-seconds)
        self.kv_peak = 0
        self.kv_stage = kv_stage
        self.pf_stage = pf_stage
        self.cache = cache
        self.chunked = chunked
        self.batch: list[tuple[int, int, Job]] = []  # heap of (end step, seq, job)
        self.waiting: deque[Job] = deque()
        self.pq: deque[Job] = deque()
        self.fresh: list[Job] = []  # joined, first decode step not started yet
        self.incoming = 0  # KV reservations whose transfer has not landed
        # Sequences held: batch, waiting, local prefill queue and running prefill, incoming
        # reservations. Kept as a count (the routing load's numerator, read on every pick).
        self.held = 0
        self.steps = 0  # decode steps completed up to t_base
        self.t_base = 0.0
        self.d = 0.0
        self.mode = IDLE
        self.pf_job: Job | None = None
        self.pf_marks: list[float] | None = None
        self.pf_i = 0
        self.pf_t0 = 0.0
        self.t_pf_end = INF
        self.last_pf = False
        self.seq = 0
        self.busy_s = 0.0
        self.slot_area = 0.0
        self.last = 0.0
        self.draining = False
        self.removed = False
        self.log_k: list[int] = []  # first step index of each run of equal gaps
        self.log_g: list[float] = []  # the gap (s) before each step of the run
        self.last_tok = 0.0  # end of the last completed decode step
        self.log_trim = self.LOG_TRIM

    # -- routing signals
    def load(self) -> float:
        return self.held / self.slots

    def in_flight(self) -> int:
        return self.held

    def _free(self) -> int:
        return self.slots - len(self.batch) - (self.pf_job is not None)

    def _account(self, now: float) -> None:
        dt = now - self.last
        if dt > 0:
            if self.mode != IDLE:
                self.busy_s += dt
            self.slot_area += len(self.batch) * dt
            self.kv_area += self.kv_used * dt
            self.last = now

    def kv_fits(self, job: Job) -> bool:
        """Whether `job`'s footprint (prompt + output tokens) fits the free KV, or the worker is empty."""
        if self.kv_used + job.prompt + job.output <= self.kv_tokens:
            return True
        return not self.batch and self.pf_job is None

    def _kv_take(self, job: Job) -> None:
        self.kv_used += job.prompt + job.output
        if self.kv_used > self.kv_peak:
            self.kv_peak = self.kv_used

    def _wake(self, now: float) -> None:
        """Something can join: make sure an event comes at the next step boundary."""
        if self.mode == IDLE:
            self.t_base = now
            self.next_time = now
        elif self.mode == STEPPING and self._free() > 0:
            k = int((now - self.t_base) / self.d + 1e-9) + 1
            t = self.t_base + k * self.d
            if t < self.next_time:
                self.next_time = t

    # -- mutations
    def reserve(self) -> None:
        self.incoming += 1
        self.held += 1

    def unreserve(self) -> None:
        self.incoming -= 1
        self.held -= 1

    def offer_kv(self, job: Job, now: float) -> None:
        """The job's KV has landed (its reservation holds it); it waits for a slot."""
        self.incoming -= 1
        job.t_stage = now
        self.kv_stage.enter(now)
        self.waiting.append(job)
        self._wake(now)

    def submit_local(self, job: Job, now: float) -> None:
        """Queue a local (colocated) prefill."""
        job.pw = self
        job.t_stage = now
        self.pf_stage.enter(now)
        self.pq.append(job)
        self.held += 1
        self._wake(now)

    # -- token gaps
    def _log_steps(self, n: int, now: float) -> None:
        """`n` decode steps of the current segment completed, the last one at `now`."""
        d = self.d
        k = self.steps + 1
        first = self.t_base + d - self.last_tok
        ks, gs = self.log_k, self.log_g
        if abs(first - d) > 1e-9:  # after a stall (or a step of another length): a run of its own
            if not gs or gs[-1] != first:
                ks.append(k)
                gs.append(first)
            if n > 1:
                ks.append(k + 1)
                gs.append(d)
        elif not gs or gs[-1] != d:
            ks.append(k)
            gs.append(d)
        self.steps += n
        self.last_tok = now
        if len(ks) > self.log_trim:
            self._trim_log()

    def _trim_log(self) -> None:
        """Drop log runs that end before the oldest gap any sequence in the batch still needs."""
        ks, gs = self.log_k, self.log_g
        need = min((e - j.output + 2 for e, _, j in self.batch), default=self.steps + 1)
        i = bisect_right(ks, need) - 1
        if i > 0:
            del ks[:i]
            del gs[:i]
        self.log_trim = max(self.LOG_TRIM, 2 * len(ks))

    def gap_runs(self, start: int, end: int) -> list[tuple[float, int]]:
        """(gap s, count) runs of the steps start .. end (inclusive) from the log."""
        out: list[tuple[float, int]] = []
        if end < start:
            return out
        ks, gs = self.log_k, self.log_g
        n = len(ks)
        i = bisect_right(ks, start) - 1
        if i < 0:
            raise RuntimeError(f"{self.name}: gap log trimmed past step {start}")
        while i < n and ks[i] <= end:
            lo = ks[i] if ks[i] > start else start
            hi = ks[i + 1] - 1 if i + 1 < n and ks[i + 1] - 1 < end else end
            out.append((gs[i], hi - lo + 1))
            i += 1
        return out

    def advance(self, now: float) -> None:
        self._account(now)
        mode = self.mode
        if mode == STEPPING:
            n = round((now - self.t_base) / self.d)
            if n > 0:
                self._log_steps(n, now)
        elif mode == HYBRID:
            self._log_steps(1, now)
        self.t_base = now
        host = self.host
        batch = self.batch
        steps = self.steps
        finished = []
        while batch and batch[0][0] <= steps:
            end, _, j = heappop(batch)
            j.gaps = self.gap_runs(end - j.output + 2, end)
            self.kv_used -= j.prompt + j.output
            finished.append(j)
        self.held -= len(finished)
        # Prefill progress.
        pf_done = None
        job = self.pf_job
        if job is not None:
            if mode == STALLED and now >= self.t_pf_end:
                pf_done = job
            elif mode == HYBRID:
                self.pf_i += 1
                if self.pf_i >= len(self.pf_marks):
                    pf_done = job
        joined = self.fresh
        if pf_done is not None:
            self.pf_job = None
            self.last_pf = True
            pf_done.t_pf_end = now
            if self.cache is not None:
                self.cache.insert(pf_done.hash_ids)
            self.pf_stage.leave(now, now - pf_done.t_stage)
            pf_done.t_stage = now
            self.kv_stage.enter(now, queued=False)
            self.seq += 1
            heappush(batch, (steps + pf_done.output, self.seq, pf_done))
            joined.append(pf_done)
        # Admit landed KV into free slots, FCFS, while the head's footprint fits the KV cache.
        waiting = self.waiting
        free = self.slots - len(batch) - (self.pf_job is not None)
        while waiting and free > 0 and self.kv_fits(waiting[0]):
            j = waiting.popleft()
            self._kv_take(j)
            self.kv_stage.start(now, now - j.t_stage)
            self.seq += 1
            heappush(batch, (steps + j.output, self.seq, j))
            joined.append(j)
            free -= 1
        # Start a local prefill: needs a slot; alternate with decode steps when not chunked.
        if (
            self.pf_job is None
            and self.pq
            and free > 0
            and (self.chunked or not self.last_pf or not batch or mode != STALLED)
            and self.kv_fits(self.pq[0])
        ):
            j = self.pq.popleft()
            self._kv_take(j)
            self.pf_stage.start(now, now - j.t_stage)
            log = host.prefill_wait_log
            if log is not None:
                log.append((now, now - j.t_stage))
            svc, marks = host.prefill_plan(self, j)
            self.pf_job = j
            self.pf_t0 = now
            if self.chunked and marks is not None and len(marks) > 1:
                self.pf_marks = [marks[0]] + [marks[i] - marks[i - 1] for i in range(1, len(marks))]
            else:
                self.pf_marks = [svc]
            self.pf_i = 0
            self.t_pf_end = now + svc
        # Next mode.
        if self.pf_job is not None and not self.chunked:
            self.mode = STALLED
            self.next_time = self.t_pf_end
        elif self.pf_job is not None:
            self.mode = HYBRID
            d = (self.step_s[len(batch)] if batch else 0.0) + self.pf_marks[self.pf_i]
            self.d = d
            self._first_tokens(now + d)
            self.next_time = now + d
        elif batch:
            self.last_pf = False
            self.mode = STEPPING
            d = self.step_s[len(batch)]
            self.d = d
            self._first_tokens(now + d)
            # someone could join at the next boundary (KV frees only when a sequence finishes)
            if free > 0 and (
                (waiting and self.kv_fits(waiting[0])) or (self.pq and self.kv_fits(self.pq[0]))
            ):
                self.next_time = now + d
            else:
                self.next_time = now + (batch[0][0] - steps) * d
        else:
            self.mode = IDLE
            self.d = 0.0
            self.next_time = INF
            self.log_k.clear()
            self.log_g.clear()
        for j in finished:
            self.kv_stage.leave(now, now - j.t_stage)
            host.serve_done(self, j, now)

    def _first_tokens(self, t: float) -> None:
        fresh = self.fresh
        if fresh and self.batch:
            log = self.host.first_token_log
            for j in fresh:
                j.t_first = t
                if log is not None:
                    log.append((t, t - j.arrival))
            fresh.clear()

    def drop_all(self, now: float) -> list[Job]:
        """Remove every job on the worker (worker removal); returns them (not incoming ones)."""
        self._account(now)
        lost = []
        for _, _, j in self.batch:
            self.kv_stage.leave(now, now - j.t_stage)
            lost.append(j)
        self.batch.clear()
        self.kv_used = 0
        self.fresh.clear()
        while self.waiting:
            j = self.waiting.popleft()
            self.kv_stage.unqueue(now)
            self.kv_stage.leave(now, now - j.t_stage)
            lost.append(j)
        while self.pq:
            j = self.pq.popleft()
            self.pf_stage.unqueue(now)
            self.pf_stage.leave(now, now - j.t_stage)
            lost.append(j)
        if self.pf_job is not None:
            self.pf_stage.leave(now, now - self.pf_job.t_stage)
            lost.append(self.pf_job)
            self.pf_job = None
        self.held = self.incoming
        self.mode = IDLE
        self.next_time = INF
        self.log_k.clear()
        self.log_g.clear()
        return lost
