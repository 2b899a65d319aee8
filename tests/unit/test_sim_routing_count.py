"""The simulator's routing pick: a serving worker's load is a kept count of the sequences it
holds (`ServeWorker.held`), read on every pick, and a pick stops at the first idle worker; a
prefill or encoder worker's load is read inline. At every pick, over placements, chunking, KV
limits, transfer failures, drains and removals, the count equals a recount of the worker's
queues and the pick is the full scan's (the least loaded worker that is not draining, the
first of equals; for prefill, of the workers tied with it, the one whose KV link carries the
fewest sends)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from disagg import evaluate
from disagg.evaluate import EvalSettings
from disagg.model import StageModels
from disagg.sim import INF, Cluster, SimConfig, simulate
from disagg.sim.engine import _TIE_S, COLOCATED, DECODE
from disagg.workload import burst

M = StageModels()
SMALL_KV = replace(M, decode=replace(M.decode, kv_cache_tokens=24_000))


def recount(w) -> int:
    return len(w.batch) + len(w.waiting) + len(w.pq) + w.incoming + (w.pf_job is not None)


@pytest.fixture
def checked_picks(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Every serving pick checked against a recount and the full scan; the picks' count."""
    picks: list[int] = []
    pick = Cluster._pick

    def checked(self: Cluster, role: str):
        got = pick(self, role)
        pool = self.pools[role]
        load = (lambda w: recount(w) / w.slots) if role in (DECODE, COLOCATED) else (lambda w: w.load())
        if role in (DECODE, COLOCATED):
            for w in pool:
                assert w.held == recount(w), (w.name, w.held, recount(w))
            picks.append(1)
        open_ = [w for w in pool if not w.draining]
        want = min(open_, key=load) if open_ else None  # min: the first of equals
        if want is not None and role not in (DECODE, COLOCATED) and want.link is not None:
            # prefill ties: within _TIE_S of the least, the fewest sends on the worker's own
            # link (the least loaded's first, then pool order)
            def sends(w):
                return w.link.active_n + len(w.link.queue)

            least = load(want)
            tied = [want] + [w for w in open_ if w is not want and load(w) - least <= _TIE_S]
            tied = [w for w in tied if w.link is not None and (w is want or w.link is not want.link)]
            want = min(tied, key=sends)
        assert got is want, (role, got and got.name, want and want.name)
        return got

    monkeypatch.setattr(Cluster, "_pick", checked)
    return picks


def bursts(seed: int = 0, long_prompts: bool = False):
    prompt = (4000, 16000) if long_prompts else (200, 6000)
    return burst(1.0, 12.0, 20.0, 90.0, prompt_tokens=prompt, output_tokens=(20, 300), seed=seed)


@pytest.mark.parametrize(
    ("models", "config", "long_prompts"),
    [
        (M, SimConfig(prefill=2, decode=3), False),
        (SMALL_KV, SimConfig(prefill=2, decode=3), True),  # sequences wait for KV, not slots
        (M, SimConfig(placement="colocated", colocated=3), False),
        (M, SimConfig(placement="colocated", colocated=3, chunked=True, local_chunk_tokens=512), False),
        (M, SimConfig(placement="conditional", prefill=1, decode=3, split_threshold=2048), False),
        (M, SimConfig(prefill=2, decode=3, failure_prob=0.2, max_retries=2, max_transfers=1), False),
    ],
)
def test_the_kept_count_and_the_pick_match_a_full_scan(checked_picks, models, config, long_prompts):
    r = simulate(bursts(long_prompts=long_prompts), models, config)
    assert r.completed > 100 and len(checked_picks) > 100
    assert r.failures["leaked_reservations"] == 0


def test_drains_and_removals_keep_the_count(checked_picks):
    cl = Cluster(M, SimConfig(prefill=2, decode=4))
    w = bursts(seed=3)
    removed = None
    for i in range(len(w)):
        req = w[i]
        while (nxt := cl.next_event_time()) <= req.arrival_s:
            cl.advance(nxt)
        t = req.arrival_s
        cl.submit(req, t)
        decode = cl.pools["decode"]
        if i == 40:
            cl.set_draining(decode[0], now=t)
        if i == 80:
            removed = decode[1]
            assert recount(removed) > 0
            assert cl.remove_worker(removed, now=t)  # its in-flight work is lost with it
            cl.add_worker("decode", t)
        if i == 120:
            cl.set_draining(decode[0], False, now=t)
    while (nxt := cl.next_event_time()) < INF:
        cl.advance(nxt)
    assert len(checked_picks) > 100
    assert all(x.held == recount(x) == 0 for x in cl.pools["decode"])
    assert removed is not None and removed.held == recount(removed) == 0


def test_the_closed_loop_with_scaling_keeps_the_count(checked_picks):
    s = EvalSettings(startup_s=30.0, interval_s=10.0)
    res = evaluate.run_policy("disagg", bursts(seed=5), s)
    assert res.metrics["requests"] > 100 and len(checked_picks) > 100
