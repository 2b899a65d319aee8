"""TTFT and prefill queue waits reach a decision when the engines observe them.

vLLM and SGLang observe a request's time to first token when that token comes out and a
prefill's queue wait when it leaves the queue, not when the request finishes. `disagg
evaluate` shows a decision the same histograms (`Cluster.first_token_log`,
`Cluster.prefill_wait_log`), so a burst that makes requests miss TTFT is seen within a
scrape or two even while those requests go on decoding for minutes.
"""

from __future__ import annotations

import numpy as np
import pytest
from fakes import FakeClock, ListLoad, decisions_seen, run_fake

from disagg import evaluate as ev
from disagg.emulator.driver import WallClockDriver
from disagg.emulator.fleet import DeploymentEmulator, Fleet
from disagg.model import StageModels
from disagg.sim.core import Job
from disagg.sim.engine import Cluster, SimConfig
from disagg.workload import Request, Workload, piecewise_poisson

STARTUP = ev.with_startup(ev.EvalSettings(), 60.0)
OUTPUT_TOKENS = 4000  # ~180 s of decode at the models' 45 ms step: nothing finishes for minutes


def _logging_cluster(reqs: list[Request], until: float, prefill: int, decode: int) -> Cluster:
    """The simulator the evaluation replays on, asked for its logs, run on `reqs` to `until`."""
    cl = Cluster(StageModels(), SimConfig(prefill=prefill, decode=decode))
    assert cl.first_token_log is None and cl.prefill_wait_log is None  # off unless asked for
    cl.first_token_log, cl.prefill_wait_log = [], []
    for i, r in enumerate(reqs):
        cl.advance(r.arrival_s)
        cl.submit(Job(i, r.arrival_s, r.prompt_tokens, r.output_tokens), r.arrival_s)
    while (t := cl.next_event_time()) < float("inf") and t <= until:
        cl.advance(t)
    return cl


def _burst_of_long_requests() -> Workload:
    """1 req/s, then 20 req/s for 15 s from 60 s, then 1 req/s: 4,000-token prompts and outputs."""
    rng = np.random.default_rng(3)
    t = piecewise_poisson([(60.0, 1.0), (15.0, 20.0), (225.0, 1.0)], rng)
    return Workload(t, np.full(t.size, 4000), np.full(t.size, OUTPUT_TOKENS), name="burst")


def test_a_burst_s_missed_ttft_shows_before_any_of_its_requests_finish() -> None:
    w = _burst_of_long_requests()
    seen = {round(o.now): o for o in decisions_seen(w, STARTUP)}
    target = STARTUP.slo.ttft_s
    # at 120 s (the window [45, 105) s, one scrape late) no request has finished
    first_done = float(w.arrival_s[0]) + OUTPUT_TOKENS * StageModels().decode.step_ms(1) / 1000.0
    assert first_done > 120.0
    o = seen[120]
    assert o.output_finished_rps == 0.0
    # ... but the burst's first tokens have come out, late: the decision sees the misses
    assert o.ttft_p is not None and o.ttft_p > target
    # the quiet opening's first tokens were on time, and seen as such
    assert seen[60].ttft_p is not None and seen[60].ttft_p < target
    # the prefill queue the burst built is in the window's waits, long before it finishes
    assert o.prefill_wait_mean_s is not None and o.prefill_wait_mean_s > 0.2
    assert seen[60].prefill_wait_mean_s is not None and seen[60].prefill_wait_mean_s < 0.1


def test_the_simulator_logs_first_tokens_and_prefill_starts_when_asked() -> None:
    """Each request's TTFT at its first token's time and its queue wait at its prefill's start:
    the same values the completed requests report, stamped earlier."""
    w = _burst_of_long_requests()
    cl = _logging_cluster(list(w), float("inf"), prefill=1, decode=4)
    by_id = np.argsort(np.frombuffer(cl.r_id, dtype=np.int64))
    ttft = np.frombuffer(cl.r_ttft)[by_id]
    arrival = np.frombuffer(cl.r_arrival)[by_id]
    logged_t, logged_ttft = np.array(cl.first_token_log).T
    order = np.argsort(logged_t - logged_ttft)  # by arrival
    assert len(cl.first_token_log) == len(w) == len(cl.prefill_wait_log)
    assert logged_ttft[order] == pytest.approx(ttft)
    assert (logged_t[order] - logged_ttft[order]) == pytest.approx(arrival)
    # every first token comes out before its request finishes (by the whole decode)
    done = np.frombuffer(cl.r_done)[by_id]
    assert np.all(logged_t[order] < done - 60.0)
    # ... and the queue waits are the prefill stage's own, one per prefill
    waits = sorted(x[1] for x in cl.prefill_wait_log)
    assert waits == pytest.approx(sorted(np.frombuffer(cl.stages["prefill"].waits)))
    assert max(waits) > 1.0  # the burst queued: the comparison is not of zeros


def test_the_evaluation_sees_what_the_emulated_engines_export() -> None:
    """The same requests through the emulator (what the operator's Prometheus scrapes) and
    through the simulator the evaluation replays on: twenty 6,000-token prompts 0.1 s apart on
    one prefill worker queue, then decode 2,000 tokens each (90 s). Ten seconds in, every first
    token is out and no request has finished; the TTFTs and queue waits the evaluation logged by
    then are the ones the emulated engines' histograms hold."""
    reqs = [Request(0.1 * (i + 1), 6000, 2000) for i in range(20)]
    fleet = Fleet()
    dep = DeploymentEmulator("ns", "dep", StageModels(), placement="disaggregated")
    fleet.add_deployment(dep, 0.0)
    pods = [
        fleet.add_pod(dep, pool, f"{pool}-{i}", f"uid-{pool}-{i}", 0.0)
        for pool, i in (("prefill", 0), ("decode", 0), ("decode", 1))
    ]
    clock = FakeClock()
    run_fake(WallClockDriver(fleet, ListLoad(reqs), clock=clock), clock, 10.0)
    exported_ttft = [p.stats.ttft for p in pods]
    exported_wait = pods[0].stats.queue

    cl = _logging_cluster(reqs, 10.0, prefill=1, decode=2)
    assert cl.completed == 0 and sum(p.stats.success for p in pods) == 0
    logged_ttft = [v for t, v in cl.first_token_log if t <= 10.0]
    logged_wait = [v for t, v in cl.prefill_wait_log if t <= 10.0]
    assert len(logged_ttft) == sum(h.count for h in exported_ttft) == 20
    assert sum(logged_ttft) == pytest.approx(sum(h.sum for h in exported_ttft), rel=1e-3)
    assert len(logged_wait) == exported_wait.count == 20
    assert sum(logged_wait) == pytest.approx(exported_wait.sum, rel=1e-3)
    assert max(logged_wait) == pytest.approx(19 * (0.230 - 0.1))  # 230 ms prefills 0.1 s apart
