"""The cluster: routing, KV reservations, transfer-failure policy; and the virtual-time driver.

`Cluster` owns the workers and links and decides what happens between stages.
It never reads a clock: ``submit(job, now)``, ``advance(now)`` and
``next_event_time()`` are all it needs, so the simulator drives it on virtual
time (`simulate`) and the emulator can drive it from asyncio on the wall clock::

    cluster = Cluster(models, config)          # config.prefill/decode/... workers added at t=0
    w = cluster.add_worker("decode", now)       # a pod came up
    cluster.set_draining(w, True, now)          # stop routing to it; in-flight work finishes
    cluster.in_flight(w), cluster.pending_kv_sends(w)   # 0 and 0: safe to delete
    lost = cluster.remove_worker(w, now)        # jobs it still held are marked LOST
    job = cluster.submit(request, now)          # arrival
    finished = cluster.advance(now)             # run every event due at or before now
    t = cluster.next_event_time()               # sleep until min(t, next arrival)
"""

from __future__ import annotations

import itertools
import math
import random
from array import array
from dataclasses import dataclass
from heapq import heappop, heappush

from disagg import names
from disagg.model import DEFAULT_ITL_STATISTIC, StageModels, check_itl_statistic
from disagg.sim.core import (
    DONE,
    FAILED,
    INF,
    LOST,
    REJECTED,
    WAITING,
    GapHistogram,
    Job,
    PrefixCache,
    StageStats,
    gap_summary,
)
from disagg.sim.workers import (
    COLOCATED,
    DECODE,
    ENCODER,
    PREFILL,
    FcfsWorker,
    Link,
    ServeWorker,
    Unit,
)
from disagg.workload import Request, Workload

PLACEMENTS = names.PLACEMENTS


# Outstanding prefill work within this of the least is a tie (an idle worker's is rounding residue).
_TIE_S = 1e-9


@dataclass(frozen=True)
class SimConfig:
    """What to simulate. Pool sizes are worker counts; SLO targets are in milliseconds.

    * ``colocated``: colocated workers for placement "colocated" (0 = prefill + decode,
      the same number of GPUs as the disaggregated pools).
    * ``conditional``: prompts with ``>= split_threshold`` tokens go to the prefill
      pool and transfer; shorter ones are prefilled locally on a decode worker.
    * ``chunked``: disaggregated prefill streams KV chunk by chunk (TransferModel.chunk_tokens)
      while it runs; colocated/local prefills run as chunks interleaved with decode steps
      (``local_chunk_tokens``, default PrefillModel.chunk_tokens or the transfer chunk).
    * ``failure_prob``: probability that a transfer attempt fails (detected when its failing
      unit would land); the policy then retries (reservation held), re-prefills, or fails
      the request, by the remaining TTFT budget.
    * ``link_scope``: "worker" (one link per prefill worker) or "shared" (one link for all).
    * ``max_transfers``: sends one link carries at once (0 = no limit: processor sharing
      among all); later sends wait in the link's FIFO queue (stage "transfer").
    * ``itl_statistic``: how a request's inter-token gaps meet ``itl_ms``: "max" (every
      gap), "p99" (nearest-rank 99th percentile gap) or "mean" (the mean gap).
    * ``admit_fraction``: admission control at the front door (`Cluster.set_admission`
      changes it while running). Below 1 the front door admits that share of arrivals
      (evenly spread) and also turns away an arrival that would queue past its TTFT
      target (every decode slot promised, or the prefill backlog too long); those are
      rejected at once (state REJECTED, counted apart from misses).
    """

    placement: str = "disaggregated"
    prefill: int = 1
    decode: int = 2
    encoder: int = 0
    colocated: int = 0
    split_threshold: int = names.SPLIT_THRESHOLD_DEFAULT_TOKENS
    chunked: bool = False
    local_chunk_tokens: int = 0
    failure_prob: float = 0.0
    max_retries: int = 1
    max_reprefills: int = 1
    prefix_cache_tokens: int = 0
    ttft_ms: float | None = 600.0
    # added to ttft_ms per 1,000 prompt tokens: a target that grows with the prompt (SLO.ttft_s_per_1k_tokens)
    ttft_ms_per_1k_tokens: float = 0.0
    itl_ms: float | None = 150.0
    link_scope: str = "worker"
    max_transfers: int = 0
    admit_fraction: float = 1.0
    itl_statistic: str = DEFAULT_ITL_STATISTIC
    seed: int = 0

    def validate(self) -> None:
        if self.placement not in PLACEMENTS:
            raise ValueError(f"unknown placement {self.placement!r}; choose from {', '.join(PLACEMENTS)}")
        for name in (
            "prefill",
            "decode",
            "encoder",
            "colocated",
            "split_threshold",
            "prefix_cache_tokens",
            "max_transfers",
        ):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.placement in ("disaggregated", "conditional"):
            if self.prefill < 1 or self.decode < 1:
                raise ValueError(f"placement {self.placement} needs --prefill >= 1 and --decode >= 1")
        elif self.colocated_workers() < 1:
            raise ValueError("placement colocated needs at least one colocated worker")
        if not 0.0 <= self.admit_fraction <= 1.0:
            raise ValueError(f"admit_fraction must be in [0, 1], got {self.admit_fraction}")
        if not 0.0 <= self.failure_prob <= 1.0:
            raise ValueError(f"failure_prob must be in [0, 1], got {self.failure_prob}")
        if self.max_retries < 0 or self.max_reprefills < 0:
            raise ValueError("max_retries and max_reprefills must be >= 0")
        if self.link_scope not in ("worker", "shared"):
            raise ValueError(f"link_scope must be 'worker' or 'shared', got {self.link_scope!r}")
        check_itl_statistic(self.itl_statistic)
        for name in ("ttft_ms", "itl_ms"):
            v = getattr(self, name)
            if v is not None and not v > 0:
                raise ValueError(f"{name} must be > 0, got {v}")
        if not (math.isfinite(self.ttft_ms_per_1k_tokens) and self.ttft_ms_per_1k_tokens >= 0):
            raise ValueError(f"ttft_ms_per_1k_tokens must be >= 0, got {self.ttft_ms_per_1k_tokens}")

    def colocated_workers(self) -> int:
        return self.colocated or (self.prefill + self.decode)


class Cluster:
    """Workers, links and the policies between them. Times are seconds."""

    def __init__(self, models: StageModels, config: SimConfig, now: float = 0.0) -> None:
        config.validate()
        self.models = models
        self.cfg = config
        self.placement = config.placement
        self.rng = random.Random(config.seed)
        self.heap: list = []
        self._seq = itertools.count()
        self.now = now
        self.stages: dict[str, StageStats] = {}
        self.pools: dict[str, list] = {ENCODER: [], PREFILL: [], DECODE: [], COLOCATED: []}
        self.workers: list = []  # every worker ever added (for utilisation)
        self.added_per_role: dict[str, int] = {}  # workers ever added, per role (their names)
        self.life: dict = {}  # worker -> [added, removed]
        self.links: list[Link] = []
        self.shared_link: Link | None = None
        self.unplaced: list[tuple[str, Job]] = []
        self.reservations: set[Job] = set()
        self._out: list[Job] = []
        self._ids = itertools.count()
        # model memo tables (seconds)
        self._pf: dict = {}
        self._marks: dict = {}
        self._wire: dict = {}
        self._bytes: dict = {}
        self._enc: dict = {}
        dm = models.decode
        self.slots = int(dm.slots)
        self.kv_tokens = int(dm.kv_cache_tokens)  # KV-cache capacity of a decode/colocated worker
        self.step_s = [float(dm.step_ms(max(b, 1))) / 1000.0 for b in range(self.slots + 1)]
        self.setup_s = float(models.transfer.setup_ms) / 1000.0
        self.tx_chunk = int(models.transfer.chunk_tokens)
        self.local_chunk = int(config.local_chunk_tokens or models.prefill.chunk_tokens or self.tx_chunk)
        self.chunked = bool(config.chunked and self.tx_chunk > 0)
        self.ttft_s = INF if config.ttft_ms is None else config.ttft_ms / 1000.0
        self.ttft_s_per_token = float(config.ttft_ms_per_1k_tokens) / 1e6
        self.itl_s = INF if config.itl_ms is None else config.itl_ms / 1000.0
        # counters
        self.submitted = 0
        self.completed = 0
        self.failed = 0
        self.lost = 0
        self.tx_failures = 0
        self.retries = 0
        self.reprefills = 0
        self.cleanups = 0
        self.released_on_failure = 0
        self.chunks_cleared = 0
        self.good = 0
        self.rejected = 0
        self.kv_reserved_max = 0
        self.admit_fraction = float(config.admit_fraction)
        self._admit_credit = 0.0
        self.itl_stat = {"mean": 0, "p99": 1, "max": 2}[config.itl_statistic]
        self.gaps = GapHistogram()  # every inter-token gap of every completed request
        # per-request results (completed requests)
        self.r_id = array("q")
        self.r_arrival = array("d")
        self.r_ttft = array("d")
        self.r_itl = array("d")  # mean gap
        self.r_itl_p99 = array("d")  # nearest-rank 99th percentile gap
        self.r_itl_max = array("d")  # largest gap
        self.r_done = array("d")
        # Set to a list to have (time, seconds) appended when the engines would observe them: each
        # first token's TTFT at that token (vLLM's and SGLang's TTFT histograms are observed then,
        # not when the request finishes) and each prefill's queue wait when it starts. A request
        # in a long decode has had its TTFT observed minutes before it shows among the completed.
        self.first_token_log: list[tuple[float, float]] | None = None
        self.prefill_wait_log: list[tuple[float, float]] | None = None
        if config.placement == "colocated":
            n_pf, n_dec, n_col = 0, 0, config.colocated_workers()
        else:
            n_pf, n_dec, n_col = config.prefill, config.decode, 0
        for _ in range(config.encoder):
            self.add_worker(ENCODER, now)
        for _ in range(n_pf):
            self.add_worker(PREFILL, now)
        for _ in range(n_dec):
            self.add_worker(DECODE, now)
        for _ in range(n_col):
            self.add_worker(COLOCATED, now)

    # ------------------------------------------------------------------ model memo (seconds)

    def prefill_s(self, tokens: int, cached: int = 0) -> float:
        key = (tokens, cached)
        v = self._pf.get(key)
        if v is None:
            v = self._pf[key] = float(self.models.prefill.service_ms(tokens, cached)) / 1000.0
        return v

    def chunk_marks(self, tokens: int, chunk: int) -> list[float]:
        key = (tokens, chunk)
        v = self._marks.get(key)
        if v is None:
            v = self._marks[key] = [
                float(x) / 1000.0 for x in self.models.prefill.chunk_ready_ms(tokens, chunk)
            ]
        return v

    def wire_s(self, tokens: int) -> float:
        v = self._wire.get(tokens)
        if v is None:
            v = self._wire[tokens] = float(self.models.transfer.wire_ms(tokens)) / 1000.0
        return v

    def kv_bytes(self, tokens: int) -> float:
        v = self._bytes.get(tokens)
        if v is None:
            v = self._bytes[tokens] = float(self.models.transfer.kv_bytes(tokens))
        return v

    def encoder_s(self, items: int) -> float:
        v = self._enc.get(items)
        if v is None:
            v = self._enc[items] = float(self.models.encoder.service_ms(items)) / 1000.0
        return v

    # ------------------------------------------------------------------ scheduling core

    def stage(self, name: str) -> StageStats:
        s = self.stages.get(name)
        if s is None:
            s = self.stages[name] = StageStats(name)
            s.q_last = s.s_last = self.now
        return s

    def _touch(self, c) -> None:
        t = c.next_time
        if t != c.sched:
            c.ver += 1
            c.sched = t
            if t < INF:
                heappush(self.heap, (t, next(self._seq), c.ver, c))

    def next_event_time(self) -> float:
        heap = self.heap
        while heap and heap[0][2] != heap[0][3].ver:
            heappop(heap)
        return heap[0][0] if heap else INF

    def advance(self, now: float) -> list[Job]:
        """Run every event due at or before `now`; returns jobs that ended (done/failed/lost)."""
        heap = self.heap
        out = self._out = []
        touch = self._touch
        while heap and heap[0][0] <= now:
            t, _, ver, c = heappop(heap)
            if ver != c.ver:
                continue
            c.sched = INF
            self.now = t
            c.advance(t)
            touch(c)
        if now > self.now:
            self.now = now
        return out

    # ------------------------------------------------------------------ membership

    def add_worker(self, role: str, now: float | None = None) -> FcfsWorker | ServeWorker:
        now = self.now if now is None else now
        cache = PrefixCache(self.cfg.prefix_cache_tokens) if self.cfg.prefix_cache_tokens else None
        k = self.added_per_role.get(role, 0)
        self.added_per_role[role] = k + 1
        name = f"{role}-{k}"
        if role == ENCODER:
            w = FcfsWorker(self, ENCODER, name, self.stage("encoder"))
        elif role == PREFILL:
            link = self._link_for(name, now)
            w = FcfsWorker(self, PREFILL, name, self.stage("prefill"), cache=cache, link=link)
        elif role == DECODE:
            w = ServeWorker(
                self,
                DECODE,
                name,
                self.step_s,
                self.slots,
                self.stage("decode"),
                self.stage("local_prefill"),
                cache=cache,
                chunked=self.cfg.chunked,
                kv_tokens=self.kv_tokens,
            )
        elif role == COLOCATED:
            w = ServeWorker(
                self,
                COLOCATED,
                name,
                self.step_s,
                self.slots,
                self.stage("colocated_decode"),
                self.stage("colocated_prefill"),
                cache=cache,
                chunked=self.cfg.chunked,
                kv_tokens=self.kv_tokens,
            )
        else:
            raise ValueError(f"unknown worker role {role!r}")
        if isinstance(w, ServeWorker):
            w.last = now
            w.t_base = now
        self.pools[role].append(w)
        self.workers.append(w)
        self.life[w] = [now, None]
        self._retry_unplaced(now)
        return w

    def _link_for(self, name: str, now: float) -> Link:
        if self.cfg.link_scope == "shared" and self.shared_link is not None:
            return self.shared_link
        link = Link(self, f"link-{name}", self.setup_s, self.stage("transfer"), self.cfg.max_transfers)
        link.last = now
        self.links.append(link)
        if self.cfg.link_scope == "shared":
            self.shared_link = link
        return link

    def set_draining(self, worker, draining: bool = True, now: float | None = None) -> None:
        """Draining workers get no new work; what they hold finishes."""
        worker.draining = draining
        if not draining:
            self._retry_unplaced(self.now if now is None else now)

    def in_flight(self, worker) -> int:
        """Jobs queued, in service, or (decode) reserved on the worker."""
        return worker.in_flight()

    def pending_kv_sends(self, worker) -> int:
        """Prefill worker: jobs whose KV it still has to deliver. Decode worker: transfers still landing."""
        if isinstance(worker, FcfsWorker):
            return len(worker.sends)
        return worker.incoming

    def remove_worker(self, worker, now: float | None = None) -> list[Job]:
        """Remove a worker now; the jobs it held (queued, running, KV in flight) are LOST and returned."""
        now = self.now if now is None else now
        if worker.removed:
            return []
        worker.removed = True
        self.pools[worker.role].remove(worker)
        self.life[worker][1] = now
        lost = worker.drop_all(now)
        if isinstance(worker, FcfsWorker):
            lost.extend(j for j in list(worker.sends) if j not in lost)
        else:
            lost.extend(
                j for j in list(self.reservations) if j.dst is worker and j.t_kv == INF and j not in lost
            )
        self._touch(worker)
        out = []
        for job in lost:
            if job.state != WAITING:
                continue
            self._abort_units(job, now)
            self._release(job)
            if job.src is not None:
                job.src.sends.discard(job)
                job.src = None
            job.state = LOST
            self.lost += 1
            self._out.append(job)
            out.append(job)
        if isinstance(worker, FcfsWorker) and worker.link is not None and worker.link is not self.shared_link:
            self.links.remove(worker.link)
        return out

    def _retry_unplaced(self, now: float) -> None:
        if not self.unplaced:
            return
        pending, self.unplaced = self.unplaced, []
        for what, job in pending:
            if job.state != WAITING:
                continue
            if what == "arrive":
                self._arrive(job, now)
            elif what == "prefill":
                self._to_prefill(job, now)
            else:
                self._start_serial(job, now)

    def _pick(self, role: str):
        """The least-loaded worker of `role` that is not draining, the first of equals."""
        best = None
        bl = INF
        if role in (DECODE, COLOCATED):
            # A serving worker's load (ServeWorker.load, inlined: this is the simulator's
            # hottest loop) counts held sequences, never below zero: the first idle worker is
            # the pick, and a large, mostly idle pool is not scanned to its end.
            for w in self.pools[role]:
                if not w.draining:
                    lo = w.held / w.slots
                    if lo < bl:
                        best, bl = w, lo
                        if lo == 0.0:
                            break
            return best
        now = self.now
        for w in self.pools[role]:
            if not w.draining:
                lo = w.load_s - (now - w.t_start) if w.cur is not None else w.load_s  # FcfsWorker.load
                if lo < bl:
                    best, bl = w, lo
        if best is None or best.link is None:
            return best
        # Ties (idle workers, mostly; within _TIE_S, an idle worker's load being rounding
        # residue): the one whose own KV link carries the fewest sends, as routers spread
        # ties. A link slower than the compute would otherwise take every send of an idle
        # pool on the first worker's link.
        sends = best.link.active_n + len(best.link.queue)
        if sends == 0:
            return best
        for w in self.pools[role]:
            if w is best or w.draining or w.link is None or w.link is best.link:
                continue
            if w.load() - bl <= _TIE_S:  # off the hot path: only when the least loaded's link is busy
                mine = w.link.active_n + len(w.link.queue)
                if mine < sends:
                    best, sends = w, mine
                    if sends == 0:
                        break
        return best

    # ------------------------------------------------------------------ request flow

    def set_admission(self, fraction: float) -> None:
        """Admit this share of arrivals from now on (1: admission control off)."""
        if not 0.0 <= fraction <= 1.0:
            raise ValueError(f"admission fraction must be in [0, 1], got {fraction!r}")
        self.admit_fraction = float(fraction)
        if fraction >= 1.0:
            self._admit_credit = 0.0

    def admit(self, job: Job) -> bool:
        """Front-door admission of an arriving job; a rejected one ends here (REJECTED)."""
        f = self.admit_fraction
        if f >= 1.0:
            return True
        self._admit_credit += f
        ok = self._admit_credit >= 1.0
        if ok:
            self._admit_credit -= 1.0
            ok = self._can_meet_ttft(job)
        if not ok:
            job.state = REJECTED
            self.rejected += 1
        return ok

    def _can_meet_ttft(self, job: Job) -> bool:
        """Early rejection (as Mooncake's): False when the request would queue past its TTFT target.

        Two signals: the decode (colocated) slots are all promised - to running,
        waiting and incoming sequences and to the requests still in prefill - so
        its first token would wait for others to finish; or the least-loaded
        prefill worker's backlog plus its own prefill, transfer and first step
        exceed the target.
        """
        if self.ttft_s == INF or job.media:
            return True
        serve = self.pools[COLOCATED if self.placement == "colocated" else DECODE]
        slots = sum(w.slots for w in serve if not w.draining)
        if slots:
            promised = sum(w.in_flight() for w in serve) + sum(w.in_flight() for w in self.pools[PREFILL])
            if promised >= slots:
                return False
        if self.placement == "colocated" or (
            self.placement == "conditional" and job.prompt < self.cfg.split_threshold
        ):
            return True
        w = self._pick(PREFILL)
        if w is None:
            return True  # no worker yet: it waits at the front door (the scaler's business)
        bare = self.prefill_s(job.prompt) + self.setup_s + self.wire_s(job.prompt) + self.step_s[1]
        return w.load() + bare <= self.ttft_target_s(job.prompt)

    def ttft_target_s(self, prompt: int) -> float:
        """The TTFT target of a request of `prompt` tokens (flat, or growing with the prompt)."""
        return self.ttft_s + self.ttft_s_per_token * prompt

    def submit(self, req: Request | Job, now: float) -> Job:
        """A request arrives at `now` (rejected at once when admission control turns it away)."""
        if isinstance(req, Job):
            job = req
        else:
            job = Job(
                next(self._ids), now, req.prompt_tokens, req.output_tokens, req.media_items, req.hash_ids
            )
        job.arrival = now
        job.deadline = now + self.ttft_target_s(job.prompt)
        self.submitted += 1
        self.now = now
        if self.admit(job):
            self._arrive(job, now)
        return job

    def _arrive(self, job: Job, now: float) -> None:
        if job.media and self.cfg.encoder >= 0 and self.pools[ENCODER]:
            w = self._pick(ENCODER)
            if w is None:
                self.unplaced.append(("arrive", job))
                return
            w.submit(job, now, self.encoder_s(job.media))
            self._touch(w)
            return
        self._to_prefill(job, now)

    def _to_prefill(self, job: Job, now: float) -> None:
        placement = self.placement
        if placement == "disaggregated" or (
            placement == "conditional" and job.prompt >= self.cfg.split_threshold
        ):
            job.path = 0
            w = self._pick(PREFILL)
            if w is None:
                self.unplaced.append(("prefill", job))
                return
            w.submit(job, now, self.prefill_s(job.prompt))
            self._touch(w)
            return
        job.path = 1
        w = self._pick(COLOCATED if placement == "colocated" else DECODE)
        if w is None:
            self.unplaced.append(("prefill", job))
            return
        w.submit_local(job, now)
        self._touch(w)

    # host callbacks ------------------------------------------------------------

    def prefill_plan(self, worker, job: Job) -> tuple[float, list[float] | None]:
        if worker.role == ENCODER:
            return self.encoder_s(job.media), None
        cached = worker.cache.match(job.hash_ids, job.prompt) if worker.cache is not None else 0
        job.cached = cached
        svc = self.prefill_s(job.prompt, cached)
        if not self.chunked:
            return svc, None
        chunk = self.tx_chunk if worker.role == PREFILL else self.local_chunk
        new = job.prompt - cached
        if new <= chunk:
            return svc, None
        marks = self.chunk_marks(new, chunk)
        if cached:  # chunks cover the new tokens; the last one ends with the service
            marks = [*(min(m, svc) for m in marks[:-1]), svc]
        return svc, marks

    def enc_done(self, worker, job: Job, now: float) -> None:
        if job.state == WAITING:
            self._to_prefill(job, now)

    def pf_start(self, worker, job: Job, now: float) -> None:
        if worker.role != PREFILL or not self.chunked or job.state != WAITING:
            return
        marks = worker.marks
        if marks is None:
            return  # one chunk: sent when prefill ends
        dst = self._pick(DECODE)
        if dst is None:
            return  # no decode capacity now: fall back to a serial send at the end
        self._reserve(job, dst)
        job.src = worker
        worker.sends.add(job)
        self._begin_attempt(job, len(marks))

    def pf_chunk(self, worker, job: Job, k: int, now: float) -> None:
        if job.state != WAITING or job.dst is None or job.pending or job.units_left == 0:
            return
        self._send_chunk(job, worker, k, now)

    def pf_done(self, worker, job: Job, now: float) -> None:
        job.t_pf_end = now
        if job.state != WAITING:
            return
        pending = job.pending
        if pending == 2:
            job.pending = 0
            worker.sends.discard(job)
            job.src = None
            self._to_prefill(job, now)
            return
        if pending == 1:
            job.pending = 0
            self._send_serial(job, now)
            return
        if job.dst is not None and job.units_left > 0 and worker.marks is not None:
            self._send_chunk(job, worker, len(worker.marks) - 1, now)
            return
        job.src = worker
        worker.sends.add(job)
        self._start_serial(job, now)

    def _start_serial(self, job: Job, now: float) -> None:
        if job.dst is None:
            dst = self._pick(DECODE)
            if dst is None:
                self.unplaced.append(("send", job))
                return
            self._reserve(job, dst)
        self._send_serial(job, now)

    def tx_done(self, link: Link, unit: Unit, now: float) -> None:
        job = unit.job
        if unit.attempt != job.attempt or job.state != WAITING:
            return
        units = job.units
        if units is not None:
            units.remove(unit)
        if unit.fails:
            self._transfer_failed(job, now)
            return
        job.units_left -= 1
        if job.units_left == 0:
            job.t_kv = now
            if job.src is not None:
                job.src.sends.discard(job)
                job.src = None
            job.units = None
            dst = job.dst
            dst.offer_kv(job, now)
            self._touch(dst)

    def serve_done(self, worker, job: Job, now: float) -> None:
        job.state = DONE
        if job.dst is not None:
            self.reservations.discard(job)
            job.dst = None
        self.completed += 1
        ttft = job.t_first - job.arrival
        mean = (now - job.t_first) / (job.output - 1) if job.output > 1 else 0.0
        runs = job.gaps
        job.gaps = None
        _, _, p99, mx = gap_summary(runs)
        if runs:
            add = self.gaps.add
            for g, c in runs:
                add(g, c)
        itl = (mean, p99, mx)[self.itl_stat]
        job.itl = itl
        self.r_id.append(job.id)
        self.r_arrival.append(job.arrival)
        self.r_ttft.append(ttft)
        self.r_itl.append(mean)
        self.r_itl_p99.append(p99)
        self.r_itl_max.append(mx)
        self.r_done.append(now)
        if ttft <= self.ttft_target_s(job.prompt) and itl <= self.itl_s:
            self.good += 1
        self._out.append(job)

    # reservations and transfers ----------------------------------------------

    def _reserve(self, job: Job, dst) -> None:
        dst.reserve()
        job.dst = dst
        job.t_kv = INF
        self.reservations.add(job)
        if len(self.reservations) > self.kv_reserved_max:
            self.kv_reserved_max = len(self.reservations)

    def _release(self, job: Job) -> None:
        dst = job.dst
        if dst is None:
            return
        if job.t_kv == INF:
            dst.unreserve()
        job.dst = None
        self.reservations.discard(job)

    def _begin_attempt(self, job: Job, n_units: int) -> None:
        job.attempt += 1
        job.units = []
        job.units_left = n_units
        p = self.cfg.failure_prob
        job.fail_unit = self.rng.randrange(n_units) if p > 0 and self.rng.random() < p else -1

    def _send_chunk(self, job: Job, worker, k: int, now: float) -> None:
        chunk = self.tx_chunk
        new = job.prompt - job.cached
        tokens = min(chunk, new - k * chunk)
        if k == 0:
            tokens += job.cached
        self._send(job, worker.link, k, tokens, now)

    def _send_serial(self, job: Job, now: float) -> None:
        self._begin_attempt(job, 1)
        self._send(job, job.src.link, 0, job.prompt, now)

    def _send(self, job: Job, link: Link, k: int, tokens: int, now: float) -> None:
        unit = Unit(job, job.attempt, k, self.wire_s(tokens), self.kv_bytes(tokens), k == job.fail_unit)
        job.units.append(unit)
        link.start(unit, now, next(self._seq))
        self._touch(link)

    def _abort_units(self, job: Job, now: float, failed_unit: bool = False) -> None:
        """Cancel the attempt's in-flight sends and clear its pending-chunk bookkeeping."""
        if job.units:
            for u in job.units:
                link = self._link_of(job)
                if link is not None:
                    link.cancel(u, now)
                    self._touch(link)
        cleared = job.units_left - (1 if failed_unit else 0)
        if cleared > 0:
            self.chunks_cleared += cleared
        job.units = None
        job.units_left = 0

    def _link_wait_s(self, link: Link) -> float:
        """Rough wait for a place on a bounded link: the queued sends ahead, each a serial send of the mean size."""
        if not link.max_active or link.active_n < link.max_active:
            return 0.0
        ahead = [u for u, _ in link.queue if not u.dead]
        if not ahead:
            return 0.0
        return len(ahead) * (self.setup_s + sum(u.work for u in ahead) / len(ahead)) / link.max_active

    def _link_of(self, job: Job) -> Link | None:
        return job.src.link if job.src is not None else None

    def _transfer_failed(self, job: Job, now: float) -> None:
        """Failure path: clean up the attempt, then retry / re-prefill / fail by remaining TTFT budget."""
        self.tx_failures += 1
        self.cleanups += 1
        self._abort_units(job, now, failed_unit=True)
        job.attempt += 1
        running = job.t_pf_end > now  # chunked: the prefill is still producing KV
        ready = job.t_pf_end if running else now
        step = self.step_s[1]
        link = job.src.link
        retry_s = self.setup_s + self.wire_s(job.prompt) * (link.n + 1) + self._link_wait_s(link)
        if job.retries < self.cfg.max_retries and ready + retry_s + step <= job.deadline:
            job.retries += 1
            self.retries += 1
            if running:
                job.pending = 1
            else:
                self._send_serial(job, now)
            return
        self._release(job)
        self.released_on_failure += 1
        w = self._pick(PREFILL)
        if w is not None and job.reprefills < self.cfg.max_reprefills:
            redo_s = w.load_s + self.prefill_s(job.prompt) + self.setup_s + self.wire_s(job.prompt) + step
            if ready + redo_s <= job.deadline:
                job.reprefills += 1
                self.reprefills += 1
                if running:
                    job.pending = 2
                else:
                    job.src.sends.discard(job)
                    job.src = None
                    self._to_prefill(job, now)
                return
        job.src.sends.discard(job)
        job.src = None
        job.state = FAILED
        self.failed += 1
        self._out.append(job)

    # ------------------------------------------------------------------ end of run

    def close(self, now: float) -> None:
        """Integrate time-weighted counters up to `now`."""
        for s in self.stages.values():
            s.close(now)
        for w in self.workers:
            if isinstance(w, ServeWorker) and not w.removed:
                w._account(now)
        for link in self.links:
            link._sync(now)

    def leaked_reservations(self) -> int:
        """Reservations still held by jobs that ended (must be zero) plus, when idle, any held at all."""
        ended = sum(1 for j in self.reservations if j.state != WAITING)
        if self.next_event_time() == INF and not self.unplaced:
            ended = len(self.reservations) + sum(
                w.incoming for w in self.pools[DECODE] + self.pools[COLOCATED]
            )
        return ended


def simulate(
    workload: Workload,
    models: StageModels | None = None,
    config: SimConfig | None = None,
    *,
    sample_every_s: float | None = None,
    progress=None,
):
    """Run `workload` to completion on virtual time; returns a `disagg.sim.report.Report`."""
    import time

    from disagg.sim.report import Report, Series

    models = models or StageModels()
    config = config or SimConfig()
    if len(workload) and int(workload.media_items.max()) > 0 and config.encoder < 1:
        raise ValueError("the workload has media items but there is no encoder worker (--encoder)")
    wall0 = time.perf_counter()
    cl = Cluster(models, config)
    arrival = workload.arrival_s.tolist()
    prompt = workload.prompt_tokens.tolist()
    output = workload.output_tokens.tolist()
    media = workload.media_items.tolist()
    hashes = workload.hash_ids
    n = len(arrival)
    span = (arrival[-1] - arrival[0]) if n > 1 else 1.0
    dt = sample_every_s or max(span / 400.0, 1e-3)
    series = Series(dt, list(cl.stages))
    next_sample = arrival[0] if n else 0.0
    heap = cl.heap
    advance = cl.advance
    arrive = cl._arrive
    admit = cl.admit
    ttft_target_s = cl.ttft_target_s
    report_every = max(1, n // 20)
    for i in range(n):
        t = arrival[i]
        if heap and heap[0][0] <= t:
            advance(t)
        cl.now = t
        if t >= next_sample:
            next_sample = series.sample(cl, t, next_sample)
        job = Job(
            i,
            t,
            prompt[i],
            output[i],
            media[i],
            hashes[i] if hashes is not None else None,
            t + ttft_target_s(prompt[i]),
        )
        cl.submitted += 1
        if admit(job):
            arrive(job, t)
        if progress is not None and i % report_every == 0 and i:
            progress(i, n, t)
    while True:
        t = cl.next_event_time()
        if t == INF:
            break
        if t >= next_sample:
            next_sample = series.sample(cl, t, next_sample)
        advance(t)
    end = max(cl.now, arrival[-1] if n else 0.0)
    cl.close(end)
    return Report.build(cl, workload, series, time.perf_counter() - wall0, end)
