"""Joint planner: worked example, SLO properties, minimality, budget goodput, validation."""

from __future__ import annotations

import itertools
import json
import math
import random
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from disagg import planner
from disagg import queueing as q
from disagg.model import DecodeModel, EncoderModel, PrefillModel, StageModels, TransferModel
from disagg.planner import (
    SLO,
    Demand,
    Plan,
    PoolBounds,
    PoolPlan,
    plan,
    plan_replicas,
    predict,
    split_threshold_tokens,
)
from disagg.sizes import SizeDistribution, demand_with_sizes

EPS = 1e-9

demands = st.builds(
    Demand,
    arrival_rps=st.floats(0.0, 60.0),
    prompt_tokens_mean=st.floats(100.0, 12000.0),
    prompt_tokens_std=st.floats(0.0, 4000.0),
    output_tokens_mean=st.floats(20.0, 1500.0),
    output_tokens_std=st.floats(0.0, 800.0),
    media_fraction=st.sampled_from([0.0, 0.0, 0.2, 1.0]),
    items_per_request=st.floats(0.0, 4.0),
    prefix_hit_rate=st.floats(0.0, 0.9),
)
slos = st.builds(
    SLO,
    ttft_s=st.floats(0.4, 3.0),
    itl_s=st.floats(0.05, 0.3),
    percentile=st.sampled_from([0.5, 0.9, 0.95, 0.99]),
)
decode_models = st.builds(
    DecodeModel,
    step_fixed_ms=st.floats(10.0, 60.0),
    step_ms_per_seq=st.sampled_from([0.0, 0.5, 2.0]),
    slots=st.integers(1, 128),
)
PROPS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def test_zero_load_gives_minimums():
    p = plan(Demand(arrival_rps=0.0))
    assert p.replicas == {"encoder": 0, "prefill": 1, "decode": 1}
    assert p.feasible
    p2 = plan(
        Demand(arrival_rps=0.0),
        bounds={"prefill": PoolBounds(2, 10), "decode": PoolBounds(3, 10), "encoder": PoolBounds(1, 4)},
    )
    assert p2.replicas == {"encoder": 1, "prefill": 2, "decode": 3}


def test_worked_example_stage_figures_in_plan():
    p = plan(Demand(arrival_rps=4.0))
    assert p.stages["prefill.service_ms"] == pytest.approx(230.0)
    assert p.stages["transfer.kv_bytes"] == 1_966_080_000
    assert p.stages["transfer.serial_ms"] == pytest.approx(95.23, abs=0.01)
    assert p.stages["transfer.chunked_ms"] == pytest.approx(39.74, abs=0.01)
    assert p.pools["prefill"].capacity_rps == pytest.approx(4.348, abs=1e-3)
    assert p.pools["decode"].capacity_rps == pytest.approx(1.778, abs=1e-3)
    assert p.capacity_ratio == pytest.approx(2.445, abs=1e-3)
    assert p.best_ttft_s == pytest.approx(0.37023, abs=1e-4)
    assert p.feasible and p.ttft_s <= 0.6 and p.itl_s <= 0.15
    # Little's law: decode slots in use = lambda x hold = 4 x 18 s
    assert p.pools["decode"].in_service == pytest.approx(72.0)


def test_chunked_transfer_lowers_floor():
    p = plan(Demand(arrival_rps=1.0), chunked=True)
    assert p.best_ttft_s == pytest.approx(0.31474, abs=1e-4)
    assert p.stages["transfer.used_ms"] == pytest.approx(39.74, abs=0.01)


SLOW_LINK = StageModels(transfer=TransferModel(bandwidth_gibps=1.0))  # 0.3 s of link per 1,000-token prompt


@pytest.mark.parametrize("sizes", [False, True])
def test_a_prefill_pool_on_a_slow_link_is_sized_by_its_links(sizes):
    """Each prefill worker's link carries every prompt's KV while the worker computes the next:
    at 1 GiB/s a 1,000-token prompt holds it 0.31 s against 0.055 s of compute, and 6 req/s
    need at least two links' worth of workers, whatever the compute needs (one)."""
    rng = np.random.default_rng(3)
    prompts = rng.uniform(500, 1500, 2000)
    d = (
        demand_with_sizes(6.0, SizeDistribution.from_samples(prompts, rng.uniform(50, 200, 2000)))
        if sizes
        else Demand(6.0, 1000.0, 290.0, 125.0, 40.0)
    )
    slo = SLO(1.5, 0.15, 0.9)
    link_s = float(SLOW_LINK.transfer.wire_ms(d.prompt_tokens_mean)) / 1000.0
    p = plan(d, SLOW_LINK, slo)
    pre = p.pools["prefill"]
    assert pre.service_s == pytest.approx(link_s)  # the link, not the 0.055 s of compute
    assert p.stages["prefill.service_ms"] < 100.0  # the compute is still reported as the compute
    assert 6.0 * link_s / pre.replicas < 0.9  # every link below saturation, with room for the wait
    # on the models' own link the compute sets the size, as before
    fast = plan(d, StageModels(), slo)
    assert fast.pools["prefill"].service_s == pytest.approx(fast.stages["prefill.service_ms"] / 1000.0)
    assert fast.pools["prefill"].replicas < pre.replicas


def test_high_load_ratio_approaches_capacity_ratio():
    p = plan(Demand(arrival_rps=200.0))
    assert p.feasible
    assert p.decode_per_prefill == pytest.approx(p.capacity_ratio, rel=0.12)


def test_infeasible_ttft_reports_best_achievable():
    p = plan(Demand(arrival_rps=2.0), slo=SLO(ttft_s=0.3))
    assert not p.feasible
    assert "below the bare pipeline latency" in p.reason
    assert p.best_ttft_s == pytest.approx(0.37023, abs=1e-4)
    assert p.ttft_s == pytest.approx(p.best_ttft_s)  # sized for the best it can do


def test_infeasible_itl():
    p = plan(Demand(arrival_rps=1.0), slo=SLO(itl_s=0.03))
    assert not p.feasible
    assert "ITL" in p.reason
    assert p.best_itl_s == pytest.approx(0.045)


def test_itl_caps_batch_when_step_grows():
    m = StageModels(decode=DecodeModel(step_fixed_ms=30.0, step_ms_per_seq=2.0, slots=64))
    p = plan(Demand(arrival_rps=10.0), models=m, slo=SLO(itl_s=0.07))
    assert p.stages["decode.batch_cap"] == 20
    assert p.feasible and p.itl_s <= 0.07 + EPS
    assert p.pools["decode"].servers_per_replica == 20


def test_budget_maximises_goodput_not_proportional():
    full = plan(Demand(arrival_rps=10.0))
    assert full.total_gpus == 11
    p = plan(Demand(arrival_rps=10.0), budget=8)
    assert p.budget_limited and not p.feasible
    assert p.total_gpus <= 8
    assert 0.5 < p.admitted_fraction < 1.0
    assert p.shed_rps == pytest.approx(10.0 * (1 - p.admitted_fraction))
    assert "shed" in p.sacrificed
    # the admitted load meets the SLO
    assert p.ttft_s <= 0.6 + EPS
    admitted = predict(p.replicas, Demand(arrival_rps=p.goodput_rps))
    assert admitted["ttft_s"] <= 0.6 + EPS
    # a proportional squeeze of (4, 7) into 8 GPUs would give (3, 5) or worse at the full load
    assert p.replicas != {"encoder": 0, "prefill": 3, "decode": 4} or p.admitted_fraction > 0


def test_budget_below_minimums_is_value_error():
    with pytest.raises(ValueError, match="gpu_budget"):
        plan(Demand(), bounds={"prefill": PoolBounds(4, 10)}, budget=3)


def test_max_bounds_limit_is_reported():
    p = plan(Demand(arrival_rps=10.0), bounds={"decode": PoolBounds(1, 4)})
    assert not p.feasible and not p.budget_limited
    assert "maxReplicas" in p.reason
    assert p.replicas["decode"] <= 4


@pytest.mark.parametrize(
    "kwargs,name",
    [
        ({"arrival_rps": -1.0}, "arrival_rps"),
        ({"arrival_rps": float("nan")}, "arrival_rps"),
        ({"prompt_tokens_mean": float("inf")}, "prompt_tokens_mean"),
        ({"output_tokens_mean": 0.0}, "output_tokens_mean"),
        ({"media_fraction": 1.5}, "media_fraction"),
        ({"prefix_hit_rate": -0.1}, "prefix_hit_rate"),
    ],
)
def test_bad_demand_names_input(kwargs, name):
    with pytest.raises(ValueError, match=name):
        Demand(**kwargs)


def test_bad_slo_bounds_budget_placement():
    with pytest.raises(ValueError, match="ttft_s"):
        SLO(ttft_s=0.0)
    with pytest.raises(ValueError, match="percentile"):
        SLO(percentile=1.0)
    with pytest.raises(ValueError, match="min_replicas"):
        PoolBounds(5, 2)
    with pytest.raises(ValueError, match="gpu_budget"):
        plan(Demand(), budget=-1)
    with pytest.raises(ValueError, match="placement"):
        plan(Demand(), placement="sideways")  # type: ignore[arg-type]


def test_split_threshold_worked_example():
    # stall of a colocated prefill + one 45 ms step must fit the 150 ms ITL
    assert split_threshold_tokens() == pytest.approx((150 - 45 - 20) / 0.035)
    assert split_threshold_tokens(slo=SLO(itl_s=0.05)) == 0.0


def test_colocated_interference_and_conditional():
    col = plan(Demand(arrival_rps=2.0), placement="colocated")
    assert col.interference_ms == pytest.approx(230.0)
    assert set(col.pools) == {"encoder", "colocated"}
    assert col.pools["encoder"].replicas == 0  # no media, and the default encoder minimum is 0
    assert col.feasible and col.ttft_s <= 0.6 and col.itl_s <= 0.15
    short = plan(Demand(arrival_rps=2.0, prompt_tokens_mean=500), placement="conditional")
    assert short.placement == "conditional"
    assert short.split_threshold_tokens == pytest.approx(2428.57, abs=0.01)
    assert short.remote_fraction == 0.0
    long_ = plan(
        Demand(arrival_rps=2.0, prompt_tokens_mean=6000, prompt_tokens_std=1000), placement="conditional"
    )
    assert long_.remote_fraction > 0.99


def test_conditional_plans_prefill_and_decode_only():
    # The pools a conditional DisaggDeployment has: prefill and decode (and the encoder stage).
    for d in (
        Demand(arrival_rps=8.0, prompt_tokens_mean=6000),
        Demand(arrival_rps=8.0, prompt_tokens_mean=500),
        Demand(arrival_rps=8.0, prompt_tokens_mean=2000, prompt_tokens_std=1500),
    ):
        pl = plan(d, placement="conditional")
        assert set(pl.pools) == {"encoder", "prefill", "decode"}
        assert "colocated" not in pl.replicas
        assert pl.feasible and pl.ttft_s <= 0.6 + EPS and pl.itl_s <= 0.15 + EPS


def test_conditional_with_every_prompt_above_the_threshold_is_the_disaggregated_plan():
    d = Demand(arrival_rps=8.0, prompt_tokens_mean=6000)
    cond = plan(d, placement="conditional")
    assert cond.remote_fraction == 1.0
    assert cond.replicas == plan(d).replicas == {"encoder": 0, "prefill": 3, "decode": 6}


def test_conditional_grows_with_load():
    d = Demand(prompt_tokens_mean=2000, prompt_tokens_std=1500)
    sizes = [plan(replace(d, arrival_rps=r), placement="conditional").replicas for r in (1, 4, 16, 32)]
    for a, b in itertools.pairwise(sizes):
        assert b["prefill"] >= a["prefill"] and b["decode"] >= a["decode"]
    assert sizes[-1]["decode"] > sizes[0]["decode"] and sizes[-1]["prefill"] > sizes[0]["prefill"]


def test_conditional_short_prompts_load_the_decode_pool():
    # Below the threshold every prompt is prefilled on decode: the prefill pool idles at its
    # minimum and the decode pool carries the prefills, so it sits between the disaggregated
    # decode pool (no prefills) and the colocated pool (the same work on one pool).
    for rate in (4.0, 8.0, 16.0):
        d = Demand(arrival_rps=rate, prompt_tokens_mean=1500)
        cond, dis = plan(d, placement="conditional"), plan(d)
        col = plan(d, placement="colocated")
        assert cond.remote_fraction == 0.0
        assert cond.replicas["prefill"] == 1  # the minimum
        assert cond.pools["prefill"].arrival_rps == 0.0
        assert dis.replicas["decode"] <= cond.replicas["decode"] <= col.replicas["colocated"]
        assert cond.stages["local_prefill.decode_share"] > 0
    # the decode pool's load includes the local prefills: more of them, more decode workers
    light = plan(Demand(arrival_rps=16.0, prompt_tokens_mean=200), placement="conditional")
    heavy = plan(Demand(arrival_rps=16.0, prompt_tokens_mean=2000), placement="conditional")
    assert heavy.replicas["decode"] > light.replicas["decode"]


@pytest.mark.parametrize("statistic", ["max", "p99", "mean"])
def test_conditional_with_every_prompt_local_is_the_colocated_plan(statistic):
    # Below the threshold every prompt is prefilled on its decode worker, as on a colocated
    # one: the same local prefill queue, slot hold and stalls, so the same decode count and
    # predictions (the conditional plan keeps its idle prefill pool at its minimum on top).
    slo = SLO(itl_statistic=statistic)
    for rate, prompt, output in ((1.0, 500, 100), (8.0, 500, 100), (16.0, 1500, 400), (40.0, 2000, 50)):
        d = Demand(arrival_rps=rate, prompt_tokens_mean=prompt, output_tokens_mean=output)
        cond = plan(d, slo=slo, placement="conditional")
        col = plan(d, slo=slo, placement="colocated")
        assert cond.remote_fraction == 0.0
        assert cond.replicas["decode"] == col.replicas["colocated"]
        assert cond.ttft_s == pytest.approx(col.ttft_s, rel=1e-12)
        assert cond.itl_s == pytest.approx(col.itl_s, rel=1e-12)


def test_conditional_stall_is_at_most_the_threshold_prompts_prefill():
    # 3,000 +- 600-token prompts: the ~17 % below the 2,429-token threshold are prefilled on
    # decode, and the longest of them stalls a neighbour 20 + 0.035 x 2,429 = 105 ms, so a gap
    # is at most 45 + 105 = 150 ms, the target: the decode pool stays the disaggregated one's
    # (the percentile of the truncated prompt shape's normal approximation lies above the
    # threshold and, uncapped, asked for over a hundred decode workers to make stalls rare).
    d = Demand(arrival_rps=8.0, prompt_tokens_mean=3000, prompt_tokens_std=600, output_tokens_mean=200)
    cond = plan(d, placement="conditional")
    assert 0.8 < cond.remote_fraction < 0.9
    assert cond.feasible and cond.itl_s == pytest.approx(0.150)
    assert cond.replicas["decode"] == plan(d).replicas["decode"]


def test_conditional_threshold_from_the_caller():
    d = Demand(arrival_rps=8.0, prompt_tokens_mean=1500)
    # a threshold below every prompt sends them all remote: the disaggregated plan
    assert plan(d, placement="conditional", split_threshold=1000).replicas == plan(d).replicas
    assert plan(d, placement="conditional", split_threshold=1000).remote_fraction == 1.0
    with pytest.raises(ValueError, match="split_threshold"):
        plan(d, placement="conditional", split_threshold=-1)


def test_conditional_under_a_budget_sheds_load_within_it():
    d = Demand(arrival_rps=16.0, prompt_tokens_mean=2000, prompt_tokens_std=1500)
    full = plan(d, placement="conditional")
    tight = plan(d, placement="conditional", budget=full.total_gpus - 2)
    assert tight.total_gpus <= full.total_gpus - 2
    assert tight.budget_limited and 0 < tight.admitted_fraction < 1
    assert not tight.feasible


def test_colocated_keeps_the_encoder_pool_and_sizes_it_with_media():
    bounds = {"encoder": PoolBounds(1, 8, 1)}
    none = plan(Demand(arrival_rps=4.0, prompt_tokens_mean=1000), placement="colocated", bounds=bounds)
    assert none.replicas["encoder"] == 1  # its minimum: no media
    sizes = [
        plan(
            Demand(arrival_rps=r, prompt_tokens_mean=1000, media_fraction=1.0, items_per_request=4),
            placement="colocated",
            bounds=bounds,
        )
        for r in (4.0, 16.0)
    ]
    # 16 rps x 115 ms of encoding is 1.84 busy workers: at least two
    assert sizes[1].replicas["encoder"] >= 2
    assert sizes[1].replicas["encoder"] > sizes[0].replicas["encoder"]
    for pl in sizes:
        assert pl.feasible and pl.ttft_s <= 0.6 + EPS
        assert pl.total_gpus == pl.replicas["encoder"] + pl.replicas["colocated"]
        assert pl.pools["encoder"].arrival_rps == pytest.approx(pl.demand.arrival_rps)


@pytest.mark.parametrize("placement", ["colocated", "conditional", "disaggregated"])
def test_the_encoder_pool_reports_its_wait_at_the_replicas_planned(placement):
    """The plan's encoder figures are those of the count it plans, read at the percentile of
    its own requests that the SLO's p99 of all requests leaves (media on half: its p98)."""
    slo = SLO(ttft_s=0.6, percentile=0.99)
    for rate in (16.0, 24.0, 30.0):
        d = Demand(arrival_rps=rate, prompt_tokens_mean=1000, media_fraction=0.5, items_per_request=4)
        enc = plan(d, StageModels(), slo, bounds={"encoder": PoolBounds(1, 8, 1)}, placement=placement).pools[
            "encoder"
        ]
        assert enc.replicas > int(enc.arrival_rps * enc.service_s) + 1  # above its first stable count
        want = float(
            q.wait_percentile(0.98, enc.replicas, enc.arrival_rps, enc.service_s, planner.ENCODER_CS2)
        )
        assert enc.wait_p_s == pytest.approx(want, rel=1e-9, abs=1e-12), (rate, enc.replicas)


@pytest.mark.parametrize(
    ("rate", "media", "own_percentile"),
    [
        (5.0, 1.0, 0.99),  # every request visits the encoder: the SLO's own percentile
        (20.0, 0.2, 0.95),  # the 1 % of all requests the SLO lets miss is 5 % of the encoder's
        (600.0, 0.01, 0.5),  # media on 1 %: never below the median of its own requests
    ],
)
def test_the_encoder_wait_is_read_at_the_percentile_its_own_requests_leave(rate, media, own_percentile):
    """Only requests with media wait at the encoder; the SLO's p99 is over all requests."""
    m = StageModels()
    slo = SLO(ttft_s=30.0, percentile=0.99)
    d = Demand(arrival_rps=rate, prompt_tokens_mean=500, media_fraction=media, items_per_request=4)
    got = predict({"encoder": 1, "prefill": 50, "decode": 50}, d, m, slo)["encoder_wait_s"]
    enc_s = float(m.encoder.service_ms(4)) / 1000.0
    want = float(q.wait_percentile(own_percentile, 1, rate * media, enc_s, planner.ENCODER_CS2))
    assert want > 0  # a loaded encoder: the percentile matters
    assert got == pytest.approx(want, rel=1e-9)
    plain = float(q.wait_percentile(0.99, 1, rate * media, enc_s, planner.ENCODER_CS2))
    # read at its own requests' p99, it would wait longer whenever some requests carry no media
    assert (got < plain) == (media < 1.0)


def test_to_dict_is_json_and_stable():
    d1 = plan(Demand(arrival_rps=3.0)).to_dict()
    d2 = plan(Demand(arrival_rps=3.0)).to_dict()
    assert json.dumps(d1) == json.dumps(d2)
    for key in ("pools", "stages", "predicted", "ratio", "feasible", "budget", "gpus"):
        assert key in d1
    assert d1["pools"]["prefill"]["replicas"] >= 1


def test_plan_replicas_matches_plan():
    ds = [Demand(arrival_rps=r) for r in (0.0, 1.0, 5.0, 20.0)]
    fast = plan_replicas(ds)
    for d, (e, p, dd, ok) in zip(ds, fast, strict=True):
        full = plan(d)
        assert (e, p, dd) == (full.replicas["encoder"], full.replicas["prefill"], full.replicas["decode"])
        assert ok == full.feasible


# ---------------------------------------------------------------- properties


@PROPS
@given(d=demands, slo=slos, dm=decode_models, extra=st.floats(0.0, 30.0))
def test_more_load_never_needs_fewer_gpus(d, slo, dm, extra):
    m = StageModels(decode=dm)
    a = plan(d, m, slo)
    b = plan(Demand(**{**d.__dict__, "arrival_rps": d.arrival_rps + extra}), m, slo)
    assume(a.admitted_fraction == 1.0 and b.admitted_fraction == 1.0)
    assert b.total_gpus >= a.total_gpus
    assert sum(b.replicas.values()) >= sum(a.replicas.values()) - 1  # equal-GPU trades only


@PROPS
@given(d=demands, slo=slos, budget=st.integers(2, 40))
def test_budget_never_exceeded(d, slo, budget):
    p = plan(d, slo=slo, budget=budget)
    assert p.total_gpus <= budget
    if p.budget_limited:
        assert p.admitted_fraction < 1.0 and p.shed_rps > 0


@PROPS
@given(d=demands, slo=slos, dm=decode_models)
def test_feasible_plan_meets_targets(d, slo, dm):
    m = StageModels(decode=dm)
    p = plan(d, m, slo)
    if p.feasible:
        assert p.ttft_s <= slo.ttft_s + EPS
        assert p.itl_s <= slo.itl_s + EPS
        check = predict(p.replicas, d, m, slo)
        assert check["ttft_s"] <= slo.ttft_s + EPS
    else:
        assert p.reason != "ok"


@PROPS
@given(d=demands, slo=slos, dm=decode_models)
def test_minimality(d, slo, dm):
    m = StageModels(decode=dm)
    b = {"encoder": PoolBounds(0, 10_000), "prefill": PoolBounds(1, 10_000), "decode": PoolBounds(1, 10_000)}
    p = plan(d, m, slo, bounds=b)
    assume(p.feasible)
    for pool in ("encoder", "prefill", "decode"):
        fewer = dict(p.replicas)
        fewer[pool] -= 1
        if fewer[pool] < b[pool].min_replicas:
            continue  # a bound
        got = predict(fewer, d, m, slo)
        assert not (got["ttft_s"] <= slo.ttft_s + EPS and math.isfinite(got["ttft_s"])), (pool, fewer)


# ---------------------------------------------------------------- fast path vs brute force


def _brute_force_replicas(d: Demand, m: StageModels, slo: SLO, p: Plan) -> dict[str, int]:
    """Every (encoder, prefill, decode) triple over generous ranges, waits from disagg.queueing.

    Takes only the per-stage service figures from the plan (its setup); the
    tables and the joint search are redone here from scratch: fewest GPUs, then
    fewest replicas, then least summed wait, with summed percentile waits <= slack.
    The percentile is over all requests: the encoder, which only the requests with
    media visit, has its wait read at the percentile of its own requests that leaves
    as many of all requests beyond it (1 - (1 - p) / media), but never below the median.
    """
    st_ = p.stages
    enc_s = st_["encoder.service_ms"] / 1000.0
    pf_s = st_["prefill.service_ms"] / 1000.0
    k = int(st_["decode.batch_cap"])
    hold = st_["decode.slot_hold_s"]
    fixed = enc_s + pf_s + st_["transfer.used_ms"] / 1000.0 + float(m.decode.step_ms(1)) / 1000.0
    slack = max(slo.ttft_s - fixed, 0.0)
    lam = d.arrival_rps
    p = slo.percentile
    media = d.media_fraction
    p_enc = 1.0 - min((1.0 - p) / media, max(1.0 - p, 0.5)) if 0 < media < 1 else p
    pools = (
        (lam * media, enc_s, 1.0, 1, 0, p_enc),
        (lam, pf_s, st_["prefill.service_cv"] ** 2, 1, 1, p),
        (lam, hold, (d.output_tokens_std / d.output_tokens_mean) ** 2, k, 1, p),
    )
    ranges, waits = [], []
    for rate, svc, cs2, per, lo, pct in pools:
        if rate <= 0 or svc <= 0:
            ranges.append(np.array([lo]))
            waits.append(np.array([0.0]))
            continue
        a = rate * svc
        hi = int(a / per + 10 * math.sqrt(a) / per + 20)
        r = np.arange(lo, hi + 1)
        w = np.full(r.shape, np.inf)
        ok = r * per > a
        w[ok] = q.wait_percentile(pct, r[ok] * per, rate, svc, cs2)
        assert w[-1] == 0.0  # the range reaches a zero-wait count
        ranges.append(r)
        waits.append(w)
    re_, rp, rd = np.meshgrid(*ranges, indexing="ij")
    we, wp, wd = np.meshgrid(*waits, indexing="ij")
    total = we + wp + wd
    fits = total <= slack + 2e-12
    assert fits.any()
    reps = re_ + rp + rd  # 1 GPU per replica: cost == replicas
    order = np.lexsort((total[fits], reps[fits], reps[fits]))
    i = order[0]
    return {"encoder": int(re_[fits][i]), "prefill": int(rp[fits][i]), "decode": int(rd[fits][i])}


def test_fast_path_matches_brute_force_search():
    rng = random.Random(2024)
    checked = 0
    for _ in range(300):
        d = Demand(
            arrival_rps=rng.choice([0.0, rng.uniform(0, 5), rng.uniform(0, 60)]),
            prompt_tokens_mean=rng.uniform(100, 12000),
            prompt_tokens_std=rng.uniform(0, 3000),
            output_tokens_mean=rng.uniform(20, 1500),
            output_tokens_std=rng.uniform(0, 600),
            media_fraction=rng.choice([0.0, 0.0, 0.3, 1.0]),
            items_per_request=rng.uniform(0, 3),
        )
        m = StageModels(
            decode=DecodeModel(
                step_fixed_ms=rng.uniform(15, 60),
                step_ms_per_seq=rng.choice([0.0, 0.5]),
                slots=rng.choice([1, 8, 32, 64]),
            )
        )
        slo = SLO(
            ttft_s=rng.uniform(0.3, 3.0),
            itl_s=rng.uniform(0.07, 0.3),
            percentile=rng.choice([0.5, 0.9, 0.99]),
        )
        p = plan(d, m, slo)
        assert p.admitted_fraction == 1.0
        assert p.replicas == _brute_force_replicas(d, m, slo, p), (d, m, slo)
        fast = plan_replicas([d], m, slo)[0]
        assert fast[:3] == (p.replicas["encoder"], p.replicas["prefill"], p.replicas["decode"])
        checked += 1
    assert checked == 300


def test_fast_setup_is_bit_identical_to_model_methods():
    rng = random.Random(5)
    for _ in range(300):
        m = StageModels(
            encoder=EncoderModel(rng.uniform(0, 40), rng.uniform(0, 50)),
            prefill=PrefillModel(rng.uniform(0, 40), rng.uniform(0.001, 0.1), rng.choice([0.0, 2e-6])),
            transfer=TransferModel(
                rng.uniform(1e4, 1e6), rng.uniform(0, 30), rng.uniform(1, 100), rng.choice([0, 512, 2000])
            ),
            decode=DecodeModel(rng.uniform(5, 60), rng.choice([0.0, 1.0]), rng.randint(1, 128)),
        )
        slo = SLO(itl_s=rng.uniform(0.03, 0.3))
        key = (
            rng.choice([0.0, 1999.0, 2000.0, 6000.0, rng.uniform(0, 40000)]),
            rng.choice([0.0, rng.uniform(0, 4000)]),
            rng.uniform(1, 3000),
            rng.uniform(0, 800),
            rng.choice([0.0, 0.4]),
            rng.uniform(0, 4),
            rng.choice([0.0, rng.uniform(0, 0.95)]),
        )
        for chunked in (False, True):
            ctx = planner._Ctx(m, slo, chunked)
            assert ctx.fast
            assert planner._setup_fast(key, ctx) == planner._setup_reference(key, m, slo, chunked), key


def test_caches_and_model_subclasses():
    class SlowPrefill(PrefillModel):  # a subclass may override the formulas: takes the method path
        pass

    d = Demand(arrival_rps=7.0, prompt_tokens_std=800.0, output_tokens_std=100.0)
    base = plan(d, StageModels(), SLO(), chunked=True)
    same = plan(d, StageModels(), SLO(), chunked=True)  # equal, not identical, objects
    assert same == base
    sub = plan(d, StageModels(prefill=SlowPrefill()), SLO(), chunked=True)
    assert sub.replicas == base.replicas and sub.stages == base.stages and sub.ttft_s == base.ttft_s
    assert not planner._ctx(StageModels(prefill=SlowPrefill()), SLO(), False).fast
    other = plan(d, StageModels(decode=DecodeModel(slots=8)), SLO(), chunked=True)
    assert other.replicas["decode"] > base.replicas["decode"]  # not served from the cached setup
    planner._clear_caches()
    assert plan(d, StageModels(), SLO(), chunked=True) == base


def test_output_records_equal_regular_construction():
    # plan() builds Plan / PoolPlan without their generated __init__: same objects
    for pl in (plan(Demand(arrival_rps=5.0)), plan(Demand(arrival_rps=50.0), budget=9)):
        assert not hasattr(Plan, "__post_init__") and not hasattr(PoolPlan, "__post_init__")
        assert set(vars(pl)) == set(Plan.__dataclass_fields__)
        assert Plan(**vars(pl)) == pl
        for pool in pl.pools.values():
            assert set(vars(pool)) == set(PoolPlan.__dataclass_fields__)
            assert PoolPlan(**vars(pool)) == pool


@PROPS
@given(d=demands, slo=slos, dm=decode_models, budget=st.one_of(st.none(), st.integers(3, 40)))
def test_conditional_and_colocated_plans_meet_targets_within_the_budget(d, slo, dm, budget):
    m = StageModels(decode=dm)
    for placement in ("conditional", "colocated"):
        p = plan(d, m, slo, budget=budget, placement=placement)
        assert "encoder" in p.pools  # never dropped
        assert p.total_gpus == sum(pp.gpus for pp in p.pools.values())
        if budget is not None:
            assert p.total_gpus <= budget
        if p.feasible:
            assert p.ttft_s <= slo.ttft_s + EPS and p.itl_s <= slo.itl_s + EPS
        else:
            assert p.reason != "ok"
