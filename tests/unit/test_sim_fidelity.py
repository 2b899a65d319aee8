"""Fidelity of the simulator against the chapter's worked example and queueing closed forms."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from disagg.model import DecodeModel, PrefillModel, StageModels
from disagg.queueing import mmc_mean_wait
from disagg.sim import SimConfig, simulate
from disagg.workload import Workload, burst, load_trace, mix, poisson

AZURE = "/work/shared/traces/azure_llm_2023/AzureLLMInferenceTrace_conv.csv"
M = StageModels()


def one(prompt=6000, output=400, **cfg):
    return simulate(Workload([0.0], [prompt], [output]), M, SimConfig(**cfg))


def by_id(report):
    ids = report.samples["id"]
    order = np.argsort(ids)
    return {k: v[order] for k, v in report.samples.items()}


def test_single_long_request_serial_matches_worked_example():
    r = one()
    assert r.ttft_ms["mean"] == pytest.approx(370.2, abs=0.1)
    assert r.ttft_ms["mean"] == pytest.approx(M.remote_ttft_ms(6000), rel=1e-9)
    assert r.itl_ms["mean"] == pytest.approx(45.0, rel=1e-9)
    assert r.bytes_transferred == pytest.approx(6000 * 327680)


def test_single_long_request_chunked_matches_worked_example():
    r = one(chunked=True)
    assert r.ttft_ms["mean"] == pytest.approx(314.7, abs=0.1)
    assert r.ttft_ms["mean"] == pytest.approx(M.remote_ttft_ms(6000, chunked=True), rel=1e-9)
    assert r.itl_ms["mean"] == pytest.approx(45.0, rel=1e-9)
    assert r.bytes_transferred == pytest.approx(6000 * 327680)


def test_single_request_colocated_has_no_transfer():
    r = one(placement="colocated")
    assert r.ttft_ms["mean"] == pytest.approx(M.colocated_ttft_ms(6000), rel=1e-9)  # 230 + 45
    assert r.bytes_transferred == 0


def test_single_prefill_worker_saturates_at_4_35_per_second():
    w = poisson(8.0, 200.0, prompt_tokens=6000, output_tokens=5, seed=1)
    r = simulate(w, M, SimConfig(prefill=1, decode=4))
    assert r.completed == len(w)
    assert r.throughput_rps == pytest.approx(1000.0 / 230.0, rel=0.01)
    assert r.pools["prefill"]["idle_fraction"] < 0.01


@pytest.mark.parametrize("placement", ["disaggregated", "colocated", "conditional"])
def test_littles_law_per_stage(placement):
    w = load_trace(AZURE, limit=6000)
    r = simulate(w, M, SimConfig(placement=placement, prefill=2, decode=4, chunked=placement != "colocated"))
    assert r.completed == len(w)
    checked = 0
    for name, s in r.stages.items():
        if s["L"] > 1e-3:
            assert s["L"] == pytest.approx(s["lambda"] * s["W_ms"] / 1000.0, rel=0.02), name
            checked += 1
    assert checked >= 2


def test_mmc_prefill_pool_matches_erlang_c():
    # Exponential service: 0.01 ms per token, tokens ~ Exp(mean 20,000) -> service ~ Exp(mean 200 ms).
    c, lam, mean_s = 3, 12.0, 0.2  # rho = 0.8
    rng = np.random.default_rng(7)
    n = 120_000

    def exp_tokens(_rng, k):
        return np.maximum(1, np.rint(rng.exponential(mean_s * 1e5, size=k))).astype(np.int64)

    w = poisson(lam, n=n, prompt_tokens=exp_tokens, output_tokens=1, seed=3)
    models = StageModels(
        prefill=PrefillModel(fixed_ms=0.0, ms_per_token=0.01),
        decode=DecodeModel(step_fixed_ms=1.0, slots=256),
    )
    r = simulate(w, models, SimConfig(prefill=c, decode=2, ttft_ms=None, itl_ms=None))
    mu = 1.0 / float(np.mean(w.prompt_tokens) * 1e-5)
    expected_ms = float(mmc_mean_wait(c, lam, mu)) * 1000.0
    assert r.stages["prefill"]["wait_mean_ms"] == pytest.approx(expected_ms, rel=0.05)


@pytest.mark.parametrize("chunked", [False, True])
def test_failure_injection_cleans_up_every_reservation(chunked):
    w = mix(3.0, 300.0, long_fraction=0.4, output_tokens=(20, 200), seed=5)
    r = simulate(w, M, SimConfig(prefill=2, decode=3, failure_prob=0.3, chunked=chunked, seed=2))
    f = r.failures
    assert f["transfer_failures"] > 50
    assert f["cleanups"] == f["transfer_failures"]
    assert f["retries"] > 0 and f["reprefills"] + f["failed_requests"] > 0
    assert f["reservations_released"] == f["reprefills"] + f["failed_requests"]
    assert f["leaked_reservations"] == 0
    assert r.completed + r.failed == len(w)


def test_failure_policy_fails_when_budget_is_gone():
    # Tiny TTFT budget: after a failure neither a retry nor a re-prefill fits.
    w = Workload([0.0], [6000], [10])
    r = simulate(w, M, SimConfig(failure_prob=1.0, ttft_ms=380.0))
    assert r.failed == 1 and r.completed == 0
    assert r.failures["retries"] == 0 and r.failures["leaked_reservations"] == 0
    # Ample budget: a bounded retry with the reservation held (fails again: p = 1), then one
    # re-prefill (fails too), then no option is left: three failures, one request failed.
    r = simulate(w, M, SimConfig(failure_prob=1.0, ttft_ms=5000.0, max_retries=1, max_reprefills=1))
    assert r.failures["transfer_failures"] == 3
    assert r.failures["retries"] == 1 and r.failures["reprefills"] == 1
    assert r.failed == 1 and r.failures["leaked_reservations"] == 0


def test_colocated_long_prompt_stalls_neighbours_itl():
    # Eight short requests decoding, then one 6,000-token prompt arrives on the same worker.
    arrivals = [0.0] * 8 + [1.0]
    prompts = [100] * 8 + [6000]
    outputs = [100] * 8 + [10]
    w = Workload(arrivals, prompts, outputs)
    base = Workload(arrivals[:8], prompts[:8], outputs[:8])
    col = by_id(simulate(w, M, SimConfig(placement="colocated", colocated=1)))
    col0 = by_id(simulate(base, M, SimConfig(placement="colocated", colocated=1)))
    stall_ms = 230.0 / 99  # one 230 ms stall spread over 99 gaps
    assert np.allclose(col["itl_s"][:8] * 1000, col0["itl_s"][:8] * 1000 + stall_ms, atol=0.05)
    dis = by_id(simulate(w, M, SimConfig(placement="disaggregated", prefill=1, decode=1)))
    assert np.allclose(dis["itl_s"][:8] * 1000, 45.0)
    # Chunked prefill interleaves: smaller stall per gap but the same compute.
    chk = by_id(simulate(w, M, SimConfig(placement="colocated", colocated=1, chunked=True)))
    assert np.all(chk["itl_s"][:8] > col0["itl_s"][:8])


def test_placements_under_bursts_report_sensible_numbers():
    arrivals = burst(1.5, 6.0, 60.0, 600.0, duty=0.25, seed=11).arrival_s
    w = mix(
        1.0,
        arrivals=arrivals,
        short_tokens=500,
        long_tokens=6000,
        long_fraction=0.3,
        output_tokens=200,
        seed=4,
    )
    base = SimConfig(prefill=2, decode=3, split_threshold=2048, ttft_ms=600, itl_ms=150)
    out = {
        p: simulate(w, M, dataclasses.replace(base, placement=p))
        for p in ("colocated", "disaggregated", "conditional")
    }
    for r in out.values():
        assert r.completed == len(w)
        assert 0 <= r.goodput_rps <= r.throughput_rps + 1e-9
        assert r.failures["leaked_reservations"] == 0
    # Conditional moves only long prompts: fewer bytes than always-disaggregated, none for colocated.
    assert 0 < out["conditional"].bytes_transferred < out["disaggregated"].bytes_transferred
    assert out["colocated"].bytes_transferred == 0
    # Disaggregation isolates decode: its ITL is the bare decode step; colocated pays stalls.
    assert out["disaggregated"].itl_ms["p99"] == pytest.approx(45.0, abs=0.01)
    assert out["colocated"].itl_ms["p99"] > 45.5
    assert out["conditional"].goodput_rps >= min(
        out["colocated"].goodput_rps, out["disaggregated"].goodput_rps
    )


def test_prefix_cache_hits_reduce_prefill():
    w = load_trace("/work/shared/traces/mooncake_fast25/conversation_trace.0-40min.jsonl", limit=800)
    cfg = SimConfig(prefill=8, decode=16, ttft_ms=None, itl_ms=None)
    off = simulate(w, M, cfg)
    on = simulate(w, M, dataclasses.replace(cfg, prefix_cache_tokens=2_000_000))
    assert off.prefix_cache["token_hit_rate"] == 0
    assert on.prefix_cache["token_hit_rate"] > 0.03  # least-loaded routing has no cache affinity
    assert on.stages["prefill"]["W_ms"] < off.stages["prefill"]["W_ms"]
