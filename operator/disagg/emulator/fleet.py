"""The emulated fleet: the simulator's stage logic, one emulated engine per pod, per-pod metric state.

Clock-free like `disagg.sim`: every method takes ``now`` (seconds, any origin,
non-decreasing). `disagg.emulator.driver` feeds it the wall clock; tests feed it
a fake one. Each DisaggDeployment gets a `DeploymentEmulator`, a subclass of
the simulator's `Cluster` (the same workers, KV links, routing, reservations and
failure policy); each routable pod is one of its workers. The subclass only
observes: it records what a real engine on that pod would export (TTFT at the
first token, every inter-token gap, queue waits, prompt tokens at admission,
KV transfers) into a `PodStats` per pod.

Pure: the standard library, numpy (through the simulator) and disagg modules only.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections import deque
from dataclasses import dataclass, field
from heapq import heappop

from disagg.metrics import QUEUE_TIME_BUCKETS
from disagg.model import StageModels
from disagg.sim.core import DONE, FAILED, INF, REJECTED, WAITING, Job, StageStats
from disagg.sim.engine import Cluster, SimConfig
from disagg.sim.workers import (
    COLOCATED,
    DECODE,
    ENCODER,
    HYBRID,
    PREFILL,
    STEPPING,
    FcfsWorker,
    ServeWorker,
)
from disagg.workload import Request

POOLS = (ENCODER, PREFILL, DECODE, COLOCATED)

# Bucket upper bounds (seconds / tokens). Chosen to resolve the worked example:
# 6,000-token prompt, ~230 ms prefill, ~95 ms transfer, 45 ms decode step, ~370 ms TTFT.
TTFT_BUCKETS = (
    0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0,
    1.25, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 7.5, 10.0,
)  # fmt: skip
ITL_BUCKETS = (
    0.01, 0.02, 0.03, 0.04, 0.045, 0.05, 0.06, 0.075, 0.1, 0.125, 0.15, 0.2, 0.25, 0.3,
    0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
)  # fmt: skip
E2E_BUCKETS = (
    0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 15.0, 20.0, 30.0, 45.0, 60.0, 90.0, 120.0, 180.0, 300.0, 600.0,
)  # fmt: skip
XFER_BUCKETS = (0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.0, 5.0)
TOKEN_BUCKETS = tuple(16 * 2**k for k in range(14))  # 16 .. 131072
ITEM_BUCKETS = (1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 16, 24, 32, 64)  # media items per request


class Hist:
    """A cumulative-on-export histogram that takes n equal observations at once."""

    __slots__ = ("bounds", "count", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # last: above the top bound
        self.sum = 0.0
        self.count = 0

    def observe(self, v: float, n: int = 1) -> None:
        self.counts[bisect_left(self.bounds, v)] += n
        self.sum += v * n
        self.count += n

    def cumulative(self) -> list[tuple[str, int]]:
        out = []
        acc = 0
        for b, c in zip(self.bounds, self.counts, strict=False):
            acc += c
            out.append((_fmt(b), acc))
        out.append(("+Inf", self.count))
        return out


def _fmt(b: float) -> str:
    return str(float(b))


class PodStats:
    """What one emulated engine exports (its histograms and counters)."""

    __slots__ = (
        "e2e",
        "gen_tokens",
        "gen_total",
        "itl",
        "lost",
        "mm_items",
        "mm_items_per_request",
        "prefill_time",
        "prompt_tokens",
        "prompt_total",
        "queue",
        "success",
        "ttft",
        "xfer_bytes",
        "xfer_failed",
        "xfer_time",
    )

    def __init__(self) -> None:
        self.ttft = Hist(TTFT_BUCKETS)
        self.itl = Hist(ITL_BUCKETS)
        self.e2e = Hist(E2E_BUCKETS)
        self.queue = Hist(QUEUE_TIME_BUCKETS)
        # prefill service time per request, on the pod that prefills
        self.prefill_time = Hist(QUEUE_TIME_BUCKETS)
        self.prompt_tokens = Hist(TOKEN_BUCKETS)
        self.gen_tokens = Hist(TOKEN_BUCKETS)
        self.xfer_time = Hist(XFER_BUCKETS)
        self.mm_items = 0  # media items taken (encoder pod)
        self.mm_items_per_request = Hist(ITEM_BUCKETS)  # media items of each request taken (encoder pod)
        self.prompt_total = 0
        self.gen_total = 0
        self.success = 0
        self.xfer_bytes = 0.0
        self.xfer_failed = 0
        self.lost = 0


class _TapStage:
    """Stands in for a worker's shared `StageStats`: forwards, and records queue waits on the pod."""

    __slots__ = ("hist", "inner")

    def __init__(self, inner: StageStats, hist: Hist) -> None:
        self.inner = inner
        self.hist = hist

    def enter(self, now: float, queued: bool = True) -> None:
        self.inner.enter(now, queued)

    def start(self, now: float, wait: float) -> None:
        self.inner.start(now, wait)
        self.hist.observe(wait)

    def unqueue(self, now: float) -> None:
        self.inner.unqueue(now)

    def leave(self, now: float, sojourn: float) -> None:
        self.inner.leave(now, sojourn)

    def close(self, now: float) -> None:
        self.inner.close(now)


class EmulatedPod:
    """One pod's emulated engine: the simulator worker plus the pod's identity and metric state."""

    __slots__ = (
        "added",
        "deployment",
        "draining",
        "last_tok",
        "model_name",
        "name",
        "namespace",
        "owner",
        "pool",
        "seg_k",
        "seg_t",
        "stats",
        "uid",
        "worker",
    )

    def __init__(self, owner: DeploymentEmulator, pool: str, name: str, uid: str, worker, now: float) -> None:
        self.owner = owner
        self.namespace = owner.namespace
        self.deployment = owner.name
        self.model_name = owner.model_name
        self.pool = pool
        self.name = name
        self.uid = uid
        self.worker = worker
        self.added = now
        self.draining = False
        self.stats = PodStats()
        self.seg_t = -INF  # t_base of the decode segment whose tokens are being accounted
        self.seg_k = 0  # steps of that segment already accounted
        self.last_tok = -INF  # time of the last token emitted to sequences that already had one

    @property
    def labels(self) -> tuple[str, str, str, str, str]:
        return (self.namespace, self.deployment, self.pool, self.name, self.model_name)

    # -- gauges (read at scrape time)
    def running(self) -> int:
        """Requests in service. A prefill request whose KV is still to be sent is finished for
        the engine (vLLM frees its slot and keeps only its KV blocks; SGLang moves it to the
        inflight queue), so it is not counted: it shows in `kv_usage` (vLLM) and in the
        inflight-queue gauge (SGLang) instead, as on a real engine."""
        w = self.worker
        if isinstance(w, FcfsWorker):
            return int(w.cur is not None)
        return len(w.batch) + (w.pf_job is not None)

    def waiting(self) -> int:
        """Requests queued. On a vLLM decode pod a request whose KV is still landing waits
        (vLLM keeps it in its waiting queue, state WAITING_FOR_REMOTE_KVS); SGLang counts it in
        its transfer-queue gauge instead."""
        w = self.worker
        if isinstance(w, FcfsWorker):
            return len(w.queue)
        landing = w.incoming if self.owner.engine == "vllm" else 0
        return len(w.waiting) + len(w.pq) + landing

    def kv_held(self) -> int:
        """Requests whose KV a prefill (or encoder) pod holds: in service, or still to be sent."""
        w = self.worker
        n = len(w.sends)
        if w.cur is not None and w.cur not in w.sends:
            n += 1
        return n

    def in_flight(self) -> int:
        return self.owner.in_flight(self.worker)

    def pending_kv_sends(self) -> int:
        return self.owner.pending_kv_sends(self.worker)

    def kv_usage(self) -> float:
        """Share of the KV cache held (0..1), as vllm:kv_cache_usage_perc / sglang:token_usage report it.

        Decode (and colocated) pods: the KV tokens their running sequences reserve
        (prompt + output each, `ServeWorker`) over the model's `kv_cache_tokens`.
        Prefill and encoder pods: the requests in service per decode slot (their
        KV is held only until it is sent).
        """
        w = self.worker
        if isinstance(w, FcfsWorker):
            slots = self.owner.slots
            return min(1.0, self.kv_held() / slots) if slots else 0.0
        return min(1.0, w.kv_used / w.kv_tokens)

    # -- token accounting of a decode/colocated worker
    def flush_tokens(self, now: float, final: bool = False) -> None:
        """Account every decode step completed up to `now` (``final``: the worker's event at `now`).

        Sequences in the batch emit one token per step; a sequence's first token
        is its TTFT, each later one an inter-token gap. Steps inside a segment
        (between two events of the worker) all have the same length, so gaps are
        recorded in bulk; the first gap of a segment spans whatever came before
        (a stall for a local prefill, a longer or shorter step).
        """
        w = self.worker
        mode = w.mode
        if mode != STEPPING and mode != HYBRID:
            return
        d = w.d
        if d <= 0:
            return
        tb = w.t_base
        if self.seg_t != tb:
            self.seg_t = tb
            self.seg_k = 0
        if mode == HYBRID:
            k = 1 if final or now >= tb + d - 1e-9 else 0
        else:
            if final:
                k = round((now - tb) / d)
            else:
                k = int((now - tb) / d + 1e-9)
                if w.next_time < INF:
                    k = min(k, round((w.next_time - tb) / d))
        new = k - self.seg_k
        if new <= 0:
            return
        st = self.stats
        batch = w.batch
        n_all = len(batch)
        if self.seg_k == 0:
            t1 = tb + d
            n_new = 0
            for _, _, j in batch:
                if abs(j.t_first - t1) < 1e-9:
                    n_new += 1
                    ttft = j.t_first - j.arrival
                    st.ttft.observe(ttft)
                    self.owner.on_first_token(j, ttft)
            n_old = n_all - n_new
            if n_old:
                st.itl.observe(t1 - self.last_tok, n_old)
            if new > 1:
                st.itl.observe(d, n_all * (new - 1))
        else:
            st.itl.observe(d, n_all * new)
        st.gen_total += n_all * new
        self.last_tok = tb + k * d
        self.seg_k = k


class DeploymentEmulator(Cluster):
    """The simulator's `Cluster` for one DisaggDeployment, with one worker per routable pod."""

    def __init__(
        self,
        namespace: str,
        name: str,
        models: StageModels,
        *,
        placement: str = "disaggregated",
        split_threshold: int = 2048,
        chunked: bool = False,
        failure_prob: float = 0.0,
        max_transfers: int = 0,
        model_name: str = "emulated",
        engine: str = "vllm",
        max_queue: int = 1000,
        seed: int = 0,
        now: float = 0.0,
    ) -> None:
        cfg = SimConfig(
            placement=placement,
            prefill=1,
            decode=1,
            colocated=1,
            split_threshold=split_threshold,
            chunked=chunked,
            failure_prob=failure_prob,
            max_transfers=max_transfers,
            ttft_ms=None,
            itl_ms=None,
            seed=seed,
        )
        super().__init__(models, cfg, now)
        for w in list(self.workers):  # pods bring the workers; start empty
            self.remove_worker(w, now)
        self.namespace = namespace
        self.name = name
        self.model_name = model_name
        self.engine = engine
        self.max_queue = max_queue
        self.pod_of: dict = {}  # worker -> EmulatedPod
        self._pf_t0: dict[int, float] = {}  # id(job) -> prefill start, for the prefill-time histogram
        self.rejected = 0
        self.ttfts: list[float] = []
        self.first_tokens = 0
        # Requests routed from outside (an HTTP router picks the pods; see `serve_prefill`).
        self.held: set[Job] = set()  # prefilled for a remote decode: KV stays on the prefill pod until pulled
        self.abandoned: set[Job] = set()  # held jobs released before their prefill ended
        self.listener = (
            None  # called with a served job when its state moves (prefilled, KV landed, done, lost)
        )

    # -- pods
    def add_pod(self, pool: str, name: str, uid: str, now: float) -> EmulatedPod:
        self.advance(now)
        w = self.add_worker(pool, now)
        w.name = name
        pod = EmulatedPod(self, pool, name, uid, w, now)
        if isinstance(w, FcfsWorker):
            w.stage = _TapStage(w.stage, pod.stats.queue)
        else:
            w.kv_stage = _TapStage(w.kv_stage, pod.stats.queue)
            w.pf_stage = _TapStage(w.pf_stage, pod.stats.queue)
        self.pod_of[w] = pod
        self._retry_unplaced(now)  # work queued at the front door before the worker existed
        return pod

    def set_pod_draining(self, pod: EmulatedPod, draining: bool, now: float) -> None:
        self.advance(now)
        pod.draining = draining
        self.set_draining(pod.worker, draining, now)

    def remove_pod(self, pod: EmulatedPod, now: float) -> list[Job]:
        """The pod is gone: what it held is lost (counted on the pod)."""
        self.advance(now)
        if isinstance(pod.worker, ServeWorker):
            pod.flush_tokens(now)
        lost = self.remove_worker(pod.worker, now)
        pod.stats.lost += len(lost)
        self.held.difference_update(lost)
        self.abandoned.difference_update(lost)
        self._notify(lost)
        self.pod_of.pop(pod.worker, None)
        return lost

    def pods(self) -> list[EmulatedPod]:
        return list(self.pod_of.values())

    def live(self, pool: str | None = None) -> bool:
        return any(not p.draining and (pool is None or p.pool == pool) for p in self.pod_of.values())

    # -- front door
    def front_door(self) -> int:
        return sum(1 for what, j in self.unplaced if what != "send" and j.state == WAITING)

    def offer(self, req: Request, now: float) -> Job | None:
        """A request arrives; None if rejected: the front-door queue is full, or admission control
        (`set_admission`: the share of the load the operator's plan admits) turns it away."""
        self.advance(now)
        if self.unplaced and self.front_door() >= self.max_queue:
            self.rejected += 1
            return None
        job = self.submit(req, now)
        if job.state == REJECTED:
            self.submitted -= 1  # `rejected` (the Cluster's counter) has it; submitted + rejected = offered
            return None
        return job

    # -- driver
    def advance(self, now: float) -> list[Job]:
        """`Cluster.advance`, with the decode workers' tokens accounted just before each of their events."""
        heap = self.heap
        out = self._out = []
        touch = self._touch
        pods = self.pod_of
        while heap and heap[0][0] <= now:
            t, _, ver, c = heappop(heap)
            if ver != c.ver:
                continue
            c.sched = INF
            self.now = t
            if c.__class__ is ServeWorker:
                p = pods.get(c)
                if p is not None:
                    p.flush_tokens(t, final=True)
            c.advance(t)
            touch(c)
        if now > self.now:
            self.now = now
        return out

    def flush(self, now: float) -> None:
        """Account decode tokens emitted up to `now` (before a scrape)."""
        self.advance(now)
        for p in self.pod_of.values():
            if isinstance(p.worker, ServeWorker):
                p.flush_tokens(now)

    # -- host callbacks (observe, then defer to the simulator)
    def _arrive(self, job: Job, now: float) -> None:
        """A media request taken by an encoder pod counts there: one request, its items."""
        n = len(self.unplaced)
        super()._arrive(job, now)
        if job.media and len(self.unplaced) == n:
            pod = self.pod_of.get(job.pw)
            if pod is not None and pod.pool == ENCODER:
                st = pod.stats
                st.prompt_tokens.observe(job.prompt)
                st.mm_items += job.media
                st.mm_items_per_request.observe(job.media)

    def _to_prefill(self, job: Job, now: float) -> None:
        n = len(self.unplaced)
        super()._to_prefill(job, now)
        if len(self.unplaced) == n:  # admitted to a worker now
            pod = self.pod_of.get(job.pw)
            if pod is not None:
                st = pod.stats
                st.prompt_tokens.observe(job.prompt)
                st.prompt_total += job.prompt

    def tx_done(self, link, unit, now: float) -> None:
        job = unit.job
        if unit.attempt == job.attempt and job.state == WAITING and job.dst is not None:
            pod = self.pod_of.get(job.dst)
            if pod is not None:
                st = pod.stats
                st.xfer_time.observe(now - unit.t0)
                if unit.fails:
                    st.xfer_failed += 1
                else:
                    st.xfer_bytes += unit.nbytes
                    if job.units_left == 1:
                        # the KV has landed: the decode engine takes the request and counts its
                        # prompt, as vLLM and SGLang decode instances count every request they serve
                        st.prompt_tokens.observe(job.prompt)
        super().tx_done(link, unit, now)
        self._notify((job,))

    def pf_start(self, worker, job: Job, now: float) -> None:
        self._pf_t0[id(job)] = now
        if job not in self.held:  # a held job's decode pod is not known yet: no early chunked send
            super().pf_start(worker, job, now)

    def pf_done(self, worker, job: Job, now: float) -> None:
        t0 = self._pf_t0.pop(id(job), None)
        pod = self.pod_of.get(worker)
        if t0 is not None and pod is not None:
            pod.stats.prefill_time.observe(now - t0)
        if job in self.held:
            self._hold_kv(worker, job, now)
            return
        super().pf_done(worker, job, now)

    def serve_done(self, worker, job: Job, now: float) -> None:
        super().serve_done(worker, job, now)
        pod = self.pod_of.get(worker)
        if pod is not None:
            st = pod.stats
            st.e2e.observe(now - job.arrival)
            st.gen_tokens.observe(job.output)
            st.success += 1
        self._notify((job,))

    def on_first_token(self, job: Job, ttft: float) -> None:
        self.first_tokens += 1

    # -- requests routed from outside: the router picks the pods (disagg.emulator.http)
    def _notify(self, jobs) -> None:
        if self.listener is not None:
            for j in jobs:
                self.listener(j)

    def _new_job(self, req: Request, now: float) -> Job:
        self.advance(now)
        job = Job(next(self._ids), now, req.prompt_tokens, req.output_tokens, req.media_items, req.hash_ids)
        job.deadline = now + self.ttft_s
        self.submitted += 1
        return job

    def _admitted(self, pod: EmulatedPod, job: Job) -> None:
        st = pod.stats
        st.prompt_tokens.observe(job.prompt)
        st.prompt_total += job.prompt

    def serve_prefill(self, pod: EmulatedPod, req: Request, now: float) -> Job:
        """A prefill for a remote decode, on `pod` (a prefill pod): FCFS on the pod; when it ends the
        KV stays there (a pending KV send) until a decode pod pulls it (`pull_kv`) or it is released."""
        job = self._new_job(req, now)
        job.path = 0
        self.held.add(job)
        pod.worker.submit(job, now, self.prefill_s(job.prompt))
        self._admitted(pod, job)
        self._touch(pod.worker)
        return job

    def _hold_kv(self, worker, job: Job, now: float) -> None:
        job.t_pf_end = now
        if job.state != WAITING:
            return
        job.src = worker
        worker.sends.add(job)
        if job in self.abandoned:
            self._fail_held(job)
            return
        self._notify((job,))

    def prefilled(self, job: Job) -> bool:
        """The job's KV is ready on its prefill pod, waiting to be pulled."""
        return job.state == WAITING and job in self.held and job.src is not None

    def pull_kv(self, job: Job, pod: EmulatedPod, now: float, output_tokens: int | None = None) -> bool:
        """A decode pod pulls a held job's KV over the prefill pod's link, then decodes it
        (`output_tokens`: the decode request's length; the prefill request asked for one token).
        False if the KV is gone (prefill pod removed, released, or already pulled)."""
        self.advance(now)
        if not self.prefilled(job):
            return False
        if output_tokens is not None:
            job.output = output_tokens
        self.held.discard(job)
        self._reserve(job, pod.worker)
        self._send_serial(job, now)
        return True

    def release_kv(self, job: Job, now: float) -> None:
        """Nobody will pull a held job's KV (the router gave up on it): free it; the job failed.
        A job still queued or prefilling is dropped when its prefill ends."""
        self.advance(now)
        if job not in self.held or job.state != WAITING:
            return
        if job.src is None:
            self.abandoned.add(job)
            return
        self._fail_held(job)

    def _fail_held(self, job: Job) -> None:
        self.held.discard(job)
        self.abandoned.discard(job)
        if job.src is not None:
            job.src.sends.discard(job)
            job.src = None
        job.state = FAILED
        self.failed += 1
        self._notify((job,))

    def serve_local(self, pod: EmulatedPod, req: Request, now: float) -> Job:
        """A whole request on a decode or colocated pod: local prefill, then decode there."""
        job = self._new_job(req, now)
        job.path = 1
        pod.worker.submit_local(job, now)
        self._admitted(pod, job)
        self._touch(pod.worker)
        return job

    def tokens_out(self, job: Job, pod: EmulatedPod, now: float) -> int:
        """Tokens `job` has emitted on decode/colocated `pod` by `now` (after `advance(now)`)."""
        if job.state == DONE:
            return job.output
        if job.t_first > now:
            return 0
        w = pod.worker
        for end, _, j in w.batch:
            if j is job:
                k = w.steps
                if w.mode == STEPPING and w.d > 0:
                    k += int((now - w.t_base) / w.d + 1e-9)
                elif w.mode == HYBRID and now >= w.t_base + w.d - 1e-9:
                    k += 1
                return max(0, min(job.output, k - (end - job.output)))
        return 0

    def next_token_time(self, pod: EmulatedPod, now: float) -> float:
        """When `pod` next emits tokens or changes its batch (INF if idle)."""
        w = pod.worker
        t = w.next_time
        if w.mode == STEPPING and w.d > 0:
            t = min(t, w.t_base + (int((now - w.t_base) / w.d + 1e-9) + 1) * w.d)
        elif w.mode == HYBRID:
            t = min(t, w.t_base + w.d)
        return t


@dataclass
class GonePod:
    """A deleted pod: only its lost-requests counter is still exported (for `retention_s`)."""

    labels: tuple[str, str, str, str, str]
    lost: int
    engine: str
    t_gone: float


@dataclass
class Fleet:
    """Every emulated deployment; routes requests to deployments and keeps the run's totals."""

    max_queue: int = 1000
    gone_retention_s: float = 600.0
    deployments: dict = field(default_factory=dict)  # (namespace, name) -> DeploymentEmulator
    pods: dict = field(default_factory=dict)  # (namespace, pod name, uid) -> EmulatedPod
    gone: list = field(default_factory=list)
    pending: deque = field(default_factory=deque)  # requests before any deployment is known
    pods_seen: dict = field(default_factory=lambda: {p: 0 for p in POOLS})
    generated: int = 0
    rejected: int = 0
    lost: int = 0
    lost_by_pod: dict = field(default_factory=dict)
    addresses: dict = field(default_factory=dict)  # (namespace, pod name, uid) -> (pod IP, engine port)
    listeners: list = field(default_factory=list)  # called (deployment, now) when one is added
    _rr: int = 0

    def deployment(self, namespace: str, name: str) -> DeploymentEmulator | None:
        return self.deployments.get((namespace, name))

    def add_deployment(self, dep: DeploymentEmulator, now: float) -> DeploymentEmulator:
        self.deployments[(dep.namespace, dep.name)] = dep
        while self.pending:
            req = self.pending.popleft()
            self._offer(dep, req, now)
        for listener in self.listeners:
            listener(dep, now)
        return dep

    def add_pod(self, dep: DeploymentEmulator, pool: str, name: str, uid: str, now: float) -> EmulatedPod:
        pod = dep.add_pod(pool, name, uid, now)
        self.pods[(dep.namespace, name, uid)] = pod
        self.pods_seen[pool] = self.pods_seen.get(pool, 0) + 1
        return pod

    def remove_pod(self, pod: EmulatedPod, now: float) -> int:
        lost = pod.owner.remove_pod(pod, now)
        self.pods.pop((pod.namespace, pod.name, pod.uid), None)
        self.addresses.pop((pod.namespace, pod.name, pod.uid), None)
        self.lost += len(lost)
        key = f"{pod.namespace}/{pod.name}"
        self.lost_by_pod[key] = self.lost_by_pod.get(key, 0) + len(lost)
        self.gone.append(GonePod(pod.labels, pod.stats.lost, pod.owner.engine, now))
        return len(lost)

    def expire_gone(self, now: float) -> None:
        if self.gone:
            self.gone = [g for g in self.gone if now - g.t_gone < self.gone_retention_s]

    # -- requests
    def offer(self, req: Request, now: float) -> Job | None:
        """Route one arriving request to a deployment (round robin over those with routable pods)."""
        self.generated += 1
        deps = list(self.deployments.values())
        if not deps:
            if len(self.pending) >= self.max_queue:
                self.rejected += 1
                return None
            self.pending.append(req)
            return None
        live = [d for d in deps if d.live()] or deps
        dep = live[self._rr % len(live)]
        self._rr += 1
        return self._offer(dep, req, now)

    def offer_to(self, dep: DeploymentEmulator, req: Request, now: float) -> Job | None:
        """One arriving request for `dep` alone (its own client's: `PerDeploymentLoad`)."""
        self.generated += 1
        return self._offer(dep, req, now)

    def _offer(self, dep: DeploymentEmulator, req: Request, now: float) -> Job | None:
        job = dep.offer(req, now)
        if job is None:
            self.rejected += 1
        return job

    # -- driver
    def next_event_time(self) -> float:
        t = INF
        for d in self.deployments.values():
            x = d.next_event_time()
            if x < t:
                t = x
        return t

    def advance(self, now: float) -> None:
        for d in self.deployments.values():
            d.advance(now)

    def flush(self, now: float) -> None:
        for d in self.deployments.values():
            d.flush(now)
        self.expire_gone(now)

    def live_pods(self) -> list[EmulatedPod]:
        return list(self.pods.values())

    # -- summary
    def summary(self) -> dict:
        import numpy as np

        completed = failed = submitted = unfinished = queued = 0
        ttft: list = []
        itl: list = []
        for d in self.deployments.values():
            completed += d.completed
            failed += d.failed
            submitted += d.submitted
            ttft.extend(d.r_ttft)
            itl.extend(d.r_itl)
            queued += d.front_door()
        unfinished = submitted - completed - failed - self.lost
        queued += len(self.pending)

        def pct(xs: list) -> dict:
            if not xs:
                return {"p50": None, "p90": None, "p99": None}
            a = np.asarray(xs, dtype=float)
            return {f"p{q}": float(np.percentile(a, q)) for q in (50, 90, 99)}

        return {
            "requests": {
                "generated": self.generated,
                "completed": completed,
                "lost": self.lost,
                "rejected": self.rejected,
                "failed": failed,
                "unfinished": max(0, unfinished) + len(self.pending),
                "front_door_queued": queued,
            },
            "ttft_s": pct(ttft),
            "itl_s": pct(itl),
            "pods_seen": dict(self.pods_seen),
            "lost_by_pod": dict(self.lost_by_pod),
        }


def format_summary(s: dict) -> str:
    r = s["requests"]

    def ms(x: float | None) -> str:
        return "-" if x is None or not math.isfinite(x) else f"{x * 1000:.0f}ms"

    t, i = s["ttft_s"], s["itl_s"]
    pods = " ".join(f"{k}={v}" for k, v in s["pods_seen"].items() if v)
    return (
        f"emulator summary: generated={r['generated']} completed={r['completed']} lost={r['lost']} "
        f"rejected={r['rejected']} failed={r['failed']} unfinished={r['unfinished']} "
        f"ttft p50/p90/p99={ms(t['p50'])}/{ms(t['p90'])}/{ms(t['p99'])} "
        f"itl p50/p90/p99={ms(i['p50'])}/{ms(i['p90'])}/{ms(i['p99'])} pods seen: {pods or 'none'}"
    )


def admitted_fraction(dd: dict) -> float:
    """The share of the load the operator's last plan admits (status.lastDecision.outputs.admittedFraction).

    1.0 (admit everything) when the status does not say, or says something that is not a fraction.
    """
    outputs = (((dd.get("status") or {}).get("lastDecision") or {}).get("outputs")) or {}
    f = outputs.get("admittedFraction") if isinstance(outputs, dict) else None
    if isinstance(f, bool) or not isinstance(f, int | float) or not 0.0 <= f <= 1.0:
        return 1.0
    return float(f)


def from_spec(
    namespace: str,
    name: str,
    spec: dict,
    *,
    engine: str | None = None,
    chunked: bool | None = None,
    failure_prob: float = 0.0,
    max_queue: int = 1000,
    seed: int = 0,
    now: float = 0.0,
) -> DeploymentEmulator:
    """A `DeploymentEmulator` for a DisaggDeployment spec (camelCase dict, as stored by the API server).

    Service models come from ``spec.pools.<pool>.serviceModel`` and ``spec.kvTransfer``
    (``streamChunks`` decides chunked KV sends unless ``chunked`` overrides it);
    ``placement.splitThresholdTokens: auto`` uses the planner's threshold for the spec's SLO.
    """
    from disagg import api

    s = api.parse_spec(spec)
    inputs = api.planner_inputs(s)  # the translation the operator's planner uses
    return DeploymentEmulator(
        namespace,
        name,
        inputs.models,
        placement=inputs.placement,
        split_threshold=max(0, min(inputs.split_threshold_tokens(), 10_000_000)),
        chunked=s.kv_transfer.stream_chunks if chunked is None else chunked,
        failure_prob=failure_prob,
        max_transfers=s.kv_transfer.max_concurrent_transfers,
        model_name=s.model,
        engine=engine or s.engine,
        max_queue=max_queue,
        seed=seed,
        now=now,
    )
