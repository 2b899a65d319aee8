"""The KV link as a resource with a queue: at most `max_transfers` sends at once, the rest FIFO."""

from __future__ import annotations

import random

import numpy as np
import pytest

from disagg.emulator.fleet import from_spec
from disagg.model import StageModels, TransferModel
from disagg.sim import SimConfig, simulate
from disagg.workload import Workload, mix, poisson

M = StageModels()
SERIAL_MS = M.transfer.serial_ms(6000)  # ~95.23 ms: 12 ms setup + 1.83 GiB at 22 GiB/s
PREFILL_MS = 230.0
STEP_MS = 45.0


def two_long_prompts(**cfg):
    """Two 6,000-token prompts at t = 0 on two prefill workers sharing one link."""
    w = Workload([0.0, 0.0], [6000, 6000], [10, 10])
    return simulate(w, M, SimConfig(prefill=2, decode=2, link_scope="shared", **cfg))


def test_one_transfer_at_a_time_queues_the_second_fifo():
    r = two_long_prompts(max_transfers=1)
    ttft = np.sort(r.samples["ttft_s"]) * 1000
    assert ttft[0] == pytest.approx(PREFILL_MS + SERIAL_MS + STEP_MS)  # the worked example's 370 ms
    assert ttft[1] == pytest.approx(PREFILL_MS + 2 * SERIAL_MS + STEP_MS)  # waited one whole send
    t = r.stages["transfer"]
    assert t["queue_max"] == 1
    assert t["wait_mean_ms"] == pytest.approx(SERIAL_MS / 2)  # waits 0 and one send
    assert t["L"] == pytest.approx(t["lambda"] * t["W_ms"] / 1000, rel=1e-9)


def test_no_limit_is_processor_sharing_with_no_queue():
    r = two_long_prompts()
    wire = SERIAL_MS - M.transfer.setup_ms
    assert np.allclose(r.samples["ttft_s"] * 1000, PREFILL_MS + M.transfer.setup_ms + 2 * wire + STEP_MS)
    assert r.stages["transfer"]["queue_max"] == 0
    assert two_long_prompts(max_transfers=2).samples["ttft_s"] == pytest.approx(r.samples["ttft_s"])


def test_chunked_sends_queue_chunk_by_chunk_and_all_land():
    free = two_long_prompts(chunked=True)
    one = two_long_prompts(chunked=True, max_transfers=1)
    assert one.completed == 2 and one.bytes_transferred == free.bytes_transferred == 2 * 6000 * 327680
    assert one.stages["transfer"]["entered"] == 6  # three 2,000-token chunks each
    assert one.stages["transfer"]["queue_max"] >= 1
    # FIFO: the first request's chunks go first, so it beats processor sharing; the second pays for it
    assert min(one.samples["ttft_s"]) < min(free.samples["ttft_s"])
    assert max(one.samples["ttft_s"]) > max(free.samples["ttft_s"])


@pytest.mark.parametrize("seed", range(8))
def test_bounded_links_conserve_requests_under_failures(seed):
    rnd = random.Random(seed)
    w = mix(rnd.uniform(2.0, 10.0), 40.0, long_fraction=rnd.random(), output_tokens=(1, 200), seed=seed)
    cfg = SimConfig(
        placement=rnd.choice(["disaggregated", "conditional"]),
        prefill=rnd.randint(1, 3),
        decode=rnd.randint(1, 3),
        chunked=rnd.random() < 0.5,
        failure_prob=rnd.choice([0.0, 0.2, 0.5]),
        link_scope=rnd.choice(["worker", "shared"]),
        max_transfers=rnd.randint(1, 3),
        ttft_ms=rnd.choice([None, 400.0, 2000.0]),
        seed=seed,
    )
    r = simulate(w, M, cfg)
    assert r.completed + r.failed == len(w)
    assert r.failures["leaked_reservations"] == 0
    t = r.stages.get("transfer")
    if t is not None and t["L"] > 1e-3:
        assert t["L"] == pytest.approx(t["lambda"] * t["W_ms"] / 1000.0, rel=1e-6)


def test_max_transfers_validation_spec_and_emulator():
    with pytest.raises(ValueError, match="max_transfers"):
        SimConfig(max_transfers=-1).validate()
    pod = {"maxReplicas": 4, "template": {"spec": {"containers": [{"name": "e", "image": "x"}]}}}
    spec = {
        "engine": "vllm",
        "model": "m",
        "pools": {"prefill": pod, "decode": pod},
        "kvTransfer": {"maxConcurrentTransfers": 2},
    }
    dep = from_spec("ns", "d", spec)
    assert dep.cfg.max_transfers == 2


def test_a_link_slower_than_the_compute_spreads_its_sends_over_the_idle_workers():
    """At 1 GiB/s a 1,000-token prompt holds its worker's link 0.31 s for 0.055 s of compute,
    so the computes are idle at nearly every arrival and tie. Ties go to the worker whose link
    carries fewer sends: 6 req/s keep each of four links ~46 % busy. (Sent to the first idle
    worker, as before, two thirds of the sends shared one link and the median TTFT was 15 s.)"""
    slow = StageModels(transfer=TransferModel(bandwidth_gibps=1.0))
    w = poisson(6.0, 300.0, prompt_tokens=1000, output_tokens=(50, 200), seed=7)
    r = simulate(w, slow, SimConfig(prefill=4, decode=4, ttft_ms=1500))
    bare_s = (slow.prefill.service_ms(1000) + slow.transfer.serial_ms(1000) + STEP_MS) / 1000
    assert np.median(r.samples["ttft_s"]) < 1.25 * bare_s  # 0.48 s against a bare 0.42 s
    assert r.slo_attainment > 0.95
