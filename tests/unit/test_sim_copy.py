"""Deep copies of a running cluster (the hindsight searches copy one for every trial): the
simulator's objects copy their slots directly (`core.slot_deepcopy`), and a copy taken in
flight runs on exactly as the original does, without touching it."""

from __future__ import annotations

import copy

from disagg.model import StageModels
from disagg.sim import INF, Cluster, SimConfig
from disagg.sim.core import Job, slot_deepcopy
from disagg.workload import burst


def finish(cl: Cluster) -> list[tuple]:
    ended = []
    while (t := cl.next_event_time()) < INF:
        ended += cl.advance(t)
    return sorted((j.id, j.state, j.t_first, j.t_kv, j.itl, str(j.gaps)) for j in ended)


def serving(cl: Cluster) -> list:
    return cl.pools["colocated" if cl.cfg.placement == "colocated" else "decode"]


def started(config: SimConfig) -> Cluster:
    """A cluster part way through a burst: queues, batches, transfers and a drain in flight."""
    cl = Cluster(StageModels(), config)
    w = burst(2.0, 14.0, 20.0, 60.0, prompt_tokens=(200, 9000), output_tokens=(20, 300), seed=7)
    for i in range(len(w)):
        req = w[i]
        while (t := cl.next_event_time()) <= req.arrival_s:
            cl.advance(t)
        cl.submit(req, req.arrival_s)
        if i == 30:
            cl.set_draining(serving(cl)[0], now=req.arrival_s)
    return cl


def test_a_copy_in_flight_runs_on_as_the_original():
    for config in (
        SimConfig(prefill=2, decode=3, failure_prob=0.1, max_retries=2),
        SimConfig(prefill=2, decode=3, chunked=True, max_transfers=1),
        SimConfig(placement="colocated", colocated=3),
    ):
        cl = started(config)
        assert cl.next_event_time() < INF  # work in flight
        twin = copy.deepcopy(cl)
        assert serving(twin)[0] is not serving(cl)[0] and serving(twin)[0].held == serving(cl)[0].held
        ran = finish(twin)
        assert ran and finish(cl) == ran  # the original was not touched by the copy's run


def test_slot_copy_keeps_unset_slots_unset_and_shares_through_the_memo():
    a = Job.__new__(Job)
    a.arrival = 1.5
    a.hash_ids = (1, 2)
    shared = [3]
    a.gaps = shared
    memo = {id(shared): shared}
    b = slot_deepcopy(a, memo)
    assert b is not a and b.arrival == 1.5 and b.hash_ids == (1, 2) and b.gaps is shared
    assert not hasattr(b, "t_first")  # never set on the original
    assert copy.deepcopy(a).gaps is not shared and copy.deepcopy(a).gaps == [3]
