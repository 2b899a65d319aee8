"""Decode KV capacity (issue 14, item 5): a decode worker's KV cache bounds its batch beside its slots.

The planner caps a decode worker's batch at the sequences whose KV (prompt +
output tokens each) fits its `kv_cache_tokens` and reports what sized the
pool; the simulator and the emulator admit a sequence only when its KV fits
(reserved at admission, FCFS); the spec field flows to the operator's and the
evaluation's planner.
"""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
from fakes import FakeClock, ListLoad, run_fake

from disagg import api
from disagg import worked_example as we
from disagg.autoscaler import config_from_spec
from disagg.cli import main
from disagg.emulator.driver import WallClockDriver
from disagg.emulator.fleet import DeploymentEmulator, Fleet
from disagg.model import DecodeModel, StageModels
from disagg.planner import SLO, Demand, plan
from disagg.sim import SimConfig, simulate
from disagg.workload import Request, Workload, poisson

M = StageModels()
# the same models with a KV cache no mix fills: the batch slots alone bound a decode worker
SLOTS_ONLY = replace(M, decode=replace(M.decode, kv_cache_tokens=10**9))
P = 0.9


# ---------------------------------------------------------------------------- model


def test_kv_slots_is_the_largest_batch_whose_kv_fits():
    d = DecodeModel(slots=32, kv_cache_tokens=100_000)
    assert d.kv_slots(10_000) == 10  # exactly full
    assert d.kv_slots(10_001) == 9
    assert d.kv_slots(1_000) == 32  # capped at the slots
    assert d.kv_slots(200_000) == 1  # larger than the cache: runs alone on an empty worker
    # a spread keeps n sequences within the cache at the z quantile: n x 10k + 1.28 sqrt(n) x 5k <= 100k
    n = d.kv_slots(10_000, 5_000, 1.2816)
    assert n == 8
    assert n * 10_000 + 1.2816 * np.sqrt(n) * 5_000 <= 100_000
    assert (n + 1) * 10_000 + 1.2816 * np.sqrt(n + 1) * 5_000 > 100_000
    with pytest.raises(ValueError, match=r"decode\.kv_cache_tokens must be > 0"):
        DecodeModel(kv_cache_tokens=0)
    with pytest.raises(ValueError, match=r"decode\.kv_cache_tokens must be an integer"):
        DecodeModel(kv_cache_tokens=1.5)


def test_default_capacity_is_derived_and_leaves_the_worked_example_slot_bound():
    # 0.9 x 2 x 79.1 GiB - 70.6e9 B of FP8 weights - 4 GiB, over 320 KiB per token, in 16-token blocks
    kv_bytes = (0.9 * 2 * 79.1 - 4.0) * 2**30 - 70.6e9
    assert we.DECODE_KV_CACHE_TOKENS == int(kv_bytes / 327_680) // 16 * 16 == 237_984
    pl = plan(Demand())
    assert pl.decode_bound == "slots"
    assert pl.stages["decode.kv_footprint_tokens"] == 6400.0
    assert pl.stages["decode.kv_slots"] == 32.0  # 37 sequences of 6,400 tokens fit; 32 slots
    assert pl.stages["decode.batch_cap"] == 32.0
    assert pl.replicas == plan(Demand(), SLOTS_ONLY).replicas


def test_footprint_is_output_weighted_from_sizes_or_moments():
    from disagg.planner import kv_footprint
    from disagg.sizes import SizeDistribution

    # mean/std: E[p] + E[o^2] / E[o]; spread sqrt(Var p + Var o)
    mean, std = kv_footprint(Demand(1.0, 10_000, 3_000, 400, 300))
    assert mean == pytest.approx(10_000 + (400**2 + 300**2) / 400)
    assert std == pytest.approx(np.hypot(3_000, 300))
    # size classes: half 1,000-token, half 30,000-token prompts; outputs 100 or 700 tokens
    sz = SizeDistribution((1_000.0, 30_000.0), (0.0, 0.0), (0.5, 0.5), (100.0, 700.0), (0.0, 0.0), (0.5, 0.5))
    mean, std = kv_footprint(Demand(1.0, sizes=sz))
    assert mean == pytest.approx(15_500 + (0.5 * 100**2 + 0.5 * 700**2) / 400)
    assert std == pytest.approx(np.hypot(14_500, 300))


# ---------------------------------------------------------------------------- planner + simulator


def long_context(rate: float = 1.0, prompt=32_000, seed: int = 7) -> tuple[Workload, Demand]:
    w = poisson(rate, 600.0, prompt_tokens=prompt, output_tokens=400, seed=seed)
    p, o = w.prompt_tokens.astype(float), w.output_tokens.astype(float)
    return w, Demand(rate, float(p.mean()), float(p.std()), float(o.mean()), float(o.std()))


@pytest.mark.parametrize("prompt", [32_000, (16_000, 48_000)], ids=["32k", "16k-48k"])
def test_long_context_mix_is_sized_by_kv_memory(prompt):
    """32k-token prompts: 7 sequences fill a worker's KV cache long before its 32 slots.

    The planner sizes more decode workers than the slots alone need and says KV
    binds; the simulator (same KV rule) misses with the slot-bound count and with
    one worker fewer than planned, and meets the target with the planned count.
    """
    w, d = long_context(prompt=prompt)
    slo = SLO(3.0, 0.15, P)
    kv_plan = plan(d, M, slo)
    slot_plan = plan(d, SLOTS_ONLY, slo)
    assert kv_plan.feasible and slot_plan.feasible
    assert kv_plan.decode_bound == "kv" and slot_plan.decode_bound == "slots"
    assert kv_plan.stages["decode.batch_cap"] == kv_plan.stages["decode.kv_slots"] < 32
    n_kv, n_slots = kv_plan.replicas["decode"], slot_plan.replicas["decode"]
    assert n_kv > n_slots
    assert kv_plan.to_dict()["decode_bound"] == "kv"

    def attainment(models, decode: int) -> tuple[float, float]:
        cfg = SimConfig(prefill=kv_plan.replicas["prefill"], decode=decode, ttft_ms=3000.0, itl_ms=150.0)
        r = simulate(w, models, cfg)
        assert r.pools["decode"]["kv_peak"] <= 1.0 + 1e-12  # the cache is never overcommitted
        return r.slo_attainment, r.pools["decode"]["kv_occupancy"]

    planned, occ_planned = attainment(M, n_kv)
    assert planned >= P - 0.02
    fewer, occ_fewer = attainment(M, n_kv - 1)
    assert fewer < P - 0.05
    assert occ_fewer > occ_planned  # the same KV load on fewer workers
    assert attainment(M, n_slots)[0] < 0.5  # the slot-bound pool queues without bound
    # the slot-bound count serves the same load when KV is not the limit: KV is what binds
    assert attainment(SLOTS_ONLY, n_slots)[0] >= P - 0.02


def test_simulated_decode_worker_admits_fcfs_while_the_kv_fits():
    """Capacity 2,500 tokens, sequences of 1,000 + 100: two decode at once; the third waits for a slot's KV."""
    models = replace(M, decode=replace(M.decode, kv_cache_tokens=2_500))
    w = Workload([0.0, 0.0, 0.0], [1_000, 1_000, 1_000], [100, 100, 100])
    r = simulate(w, models, SimConfig(prefill=3, decode=1, ttft_ms=None, itl_ms=None))
    ttft = np.sort(r.samples["ttft_s"])
    hold_s = 100 * M.decode.step_fixed_ms / 1000.0
    assert ttft[1] - ttft[0] < 0.1  # the first two share the batch
    assert ttft[2] - ttft[0] == pytest.approx(hold_s, abs=0.1)  # the third joins when one finishes
    assert r.pools["decode"]["kv_peak"] == pytest.approx(2_200 / 2_500)
    # a sequence larger than the whole cache still runs, alone on an empty worker
    big = simulate(
        Workload([0.0, 0.0], [3_000, 100], [10, 10]), models, SimConfig(prefill=2, decode=1, ttft_ms=None)
    )
    assert big.completed == 2
    assert big.pools["decode"]["kv_peak"] == pytest.approx(3_010 / 2_500)


# ---------------------------------------------------------------------------- emulator


def test_emulated_decode_pod_reports_reserved_kv_and_queues_what_does_not_fit():
    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from disagg.emulator.metrics import build_registry

    models = replace(M, decode=replace(M.decode, kv_cache_tokens=3_000))
    fleet = Fleet()
    dep = DeploymentEmulator("ns", "dep", models)
    fleet.add_deployment(dep, 0.0)
    for i in range(3):
        fleet.add_pod(dep, "prefill", f"prefill-{i}", f"up{i}", 0.0)
    dec = fleet.add_pod(dep, "decode", "decode-0", "ud", 0.0)
    clock = FakeClock()
    driver = WallClockDriver(fleet, ListLoad([Request(0.01, 1_000, 100) for _ in range(3)]), clock=clock)
    run_fake(driver, clock, 1.0)  # prefilled (55 ms) and transferred; two decode, one waits
    now = driver.now()
    reg = build_registry(fleet, lambda: fleet.flush(now))
    got = {}
    for fam in text_string_to_metric_families(generate_latest(reg).decode()):
        for s in fam.samples:
            if dict(s.labels).get("pod") == "decode-0":
                got[s.name] = s.value
    assert got["vllm:kv_cache_usage_perc"] == pytest.approx(2_200 / 3_000)
    assert got["vllm:num_requests_running"] == 2
    assert got["vllm:num_requests_waiting"] == 1
    assert dec.kv_usage() == pytest.approx(2_200 / 3_000)


# ---------------------------------------------------------------------------- spec, operator, CLI


def spec_with(**decode_model) -> api.DisaggDeploymentSpec:
    tpl = {"spec": {"containers": [{"name": "vllm", "image": "x"}]}}
    return api.parse_spec(
        {
            "engine": "vllm",
            "model": "m",
            "pools": {
                "prefill": {"maxReplicas": 8, "template": tpl},
                "decode": {"maxReplicas": 16, "template": tpl, "serviceModel": decode_model},
            },
        }
    )


def test_spec_field_reaches_the_operators_planner():
    assert api.planner_inputs(spec_with()).models.decode.kv_cache_tokens == we.DECODE_KV_CACHE_TOKENS
    sp = spec_with(kvCacheTokens=60_000)
    assert api.planner_inputs(sp).models.decode.kv_cache_tokens == 60_000
    assert config_from_spec(sp).planning.models.decode.kv_cache_tokens == 60_000
    # 60,000 tokens hold 9 sequences of 6,400: the worked example's demand becomes KV-bound
    pl = api.planner_inputs(sp).plan(Demand(arrival_rps=4.0))
    assert pl.decode_bound == "kv" and pl.stages["decode.batch_cap"] == 9.0
    assert (
        pl.replicas["decode"]
        > api.planner_inputs(spec_with()).plan(Demand(arrival_rps=4.0)).replicas["decode"]
    )
    with pytest.raises(ValueError, match="kvCacheTokens"):
        spec_with(kvCacheTokens=0)


def test_plan_cli_says_what_sizes_the_decode_pool(capsys):
    assert main(["plan", "--input-tokens", "32000", "--ttft", "3"]) == 0
    assert "decode sized by KV memory" in capsys.readouterr().out
    assert main(["plan", "--input-tokens", "32000", "--ttft", "3", "--output", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["decode_bound"] == "kv" and doc["stages"]["decode"]["kv_slots"] == 7
    argv = ["plan", "--input-tokens", "32000", "--ttft", "3", "--decode-kv-cache-tokens", "10000000"]
    assert main([*argv, "--output", "json"]) == 0
    doc2 = json.loads(capsys.readouterr().out)
    assert doc2["decode_bound"] == "slots"
    assert doc2["pools"]["decode"]["replicas"] < doc["pools"]["decode"]["replicas"]
    assert main(["plan", "--decode-kv-cache-tokens", "0"]) == 2
    assert "decode-kv-cache-tokens" in capsys.readouterr().err


def test_measured_footprint_sees_long_prompts_with_short_outputs():
    """Half 30,000-token prompts with 50 output tokens, half 1,000 with 700: the marginals, taken as
    independent, say ~16,000 resident tokens per sequence; the requests themselves ~3,600 (the long
    prompts leave quickly). With the measured footprint the planner keeps the slot-bound pool, and
    the simulator confirms it meets the target."""
    from disagg.planner import measured_kv_footprint

    rng = np.random.default_rng(3)
    base = poisson(3.0, 600.0, prompt_tokens=1000, output_tokens=10, seed=11)
    long_prompt = rng.random(len(base)) < 0.5
    p = np.where(long_prompt, 30_000, 1_000)
    o = np.where(long_prompt, 50, 700)
    w = Workload(base.arrival_s, p, o)
    fp = measured_kv_footprint(p, o)
    assert fp == pytest.approx(float(((p + o) * o).sum() / o.sum()))
    assert 3_000 < fp < 4_500
    slo = SLO(3.0, 0.15, P)
    marginal = plan(Demand(3.0, p.mean(), p.std(), o.mean(), o.std()), M, slo)
    measured = plan(Demand(3.0, p.mean(), p.std(), o.mean(), o.std(), kv_footprint_tokens=fp), M, slo)
    assert marginal.decode_bound == "kv" and measured.decode_bound == "slots"
    assert measured.stages["decode.kv_footprint_tokens"] == pytest.approx(fp)
    assert measured.to_dict()["demand"]["kv_footprint_tokens"] == pytest.approx(fp, rel=1e-5)
    assert measured.replicas["decode"] < marginal.replicas["decode"]
    # each measured footprint is its own shape (the planner caches setups per shape)
    heavier = plan(replace(measured.demand, kv_footprint_tokens=40_000.0), M, slo)
    assert heavier.decode_bound == "kv" and heavier.stages["decode.kv_footprint_tokens"] == 40_000.0
    cfg = SimConfig(prefill=measured.replicas["prefill"], decode=measured.replicas["decode"], ttft_ms=3000.0)
    assert simulate(w, M, cfg).slo_attainment >= P - 0.02
    with pytest.raises(ValueError, match="same requests"):
        measured_kv_footprint([1, 2], [3])
    with pytest.raises(ValueError, match="kv_footprint_tokens"):
        Demand(kv_footprint_tokens=-1.0)
