"""Request-size distributions (disagg.sizes) and the planner sizing over them."""

from __future__ import annotations

import math

import numpy as np
import pytest

from disagg import planner
from disagg import sizes as sizes_mod
from disagg.model import PrefillModel, StageModels
from disagg.planner import SLO, Demand, plan, plan_replicas, predict
from disagg.queueing import summed_wait_tail
from disagg.sim.engine import SimConfig, simulate
from disagg.sizes import (
    SizeDistribution,
    demand_with_sizes,
    output_moments,
    prefill_moments,
    ttft_covers,
)
from disagg.workload import mix

M = StageModels()


def one_class(prompt: float, output: float, prompt_std: float = 0.0) -> SizeDistribution:
    return SizeDistribution((prompt,), (prompt_std**2,), (1.0,), (output,), (0.0,), (1.0,))


# --------------------------------------------------------------------------- construction


def test_from_buckets_splits_finite_buckets_and_uses_the_sum_for_the_inf_bucket() -> None:
    # cumulative counts: 10 in (0, 100], 30 in (100, 1000], 10 above 1000
    prompt = [(100, 10), (1000, 40), (math.inf, 50)]
    output = [(10, 5), (100, 20)]
    finite = 10 * 50 + 30 * 550  # midpoint sums of the finite buckets
    d = SizeDistribution.from_buckets(prompt, output, prompt_sum=finite + 10 * 5000)
    assert math.isclose(sum(d.prompt_weight), 1.0)
    assert d.prompt_tokens[-1] == pytest.approx(5000)  # the +Inf bucket's mean from _sum
    assert d.prompt_weight[-1] == pytest.approx(0.2)
    mean, _ = d.prompt_mean_std
    assert mean == pytest.approx((finite + 10 * 5000) / 50)
    # uniform within (100, 1000]: sub-classes spread the bucket, their variances add its width
    inside = [t for t in d.prompt_tokens if 100 < t < 1000]
    assert len(inside) == 4 and min(inside) < 300 and max(inside) > 800
    om, _ = d.output_mean_std
    assert om == pytest.approx((5 * 5 + 15 * 55) / 20)


def test_from_buckets_without_sum_guesses_twice_the_last_edge() -> None:
    d = SizeDistribution.from_buckets([(100, 1), (math.inf, 2)], [(10, 1)])
    assert d.prompt_tokens[-1] == pytest.approx(200)


@pytest.mark.parametrize(
    ("buckets", "msg"),
    [([], "no buckets"), ([(10, 5), (20, 3)], "not cumulative"), ([(10, 0)], "no observations")],
)
def test_from_buckets_rejects_bad_histograms(buckets, msg) -> None:
    with pytest.raises(ValueError, match=msg):
        SizeDistribution.from_buckets(buckets, [(10, 1)])


def test_from_samples_keeps_the_mean_and_resolves_the_tail() -> None:
    rng = np.random.default_rng(0)
    p = rng.lognormal(7, 1.0, 20_000)
    o = rng.integers(10, 500, 20_000)
    d = SizeDistribution.from_samples(p, o)
    pm, ps = d.prompt_mean_std
    assert pm == pytest.approx(p.mean(), rel=1e-9)
    assert ps == pytest.approx(p.std(), rel=1e-9)  # within-class variances keep the total
    assert min(d.prompt_weight) <= 0.0011  # the top class is the last 0.1 %
    assert d.prompt_tokens[-1] > np.quantile(p, 0.999)


def test_from_mean_std_is_one_class_without_spread_and_lognormal_with() -> None:
    assert len(SizeDistribution.from_mean_std(6000, 0, 400, 0).prompt_tokens) == 1
    d = SizeDistribution.from_mean_std(2000, 3000, 400, 100)
    pm, ps = d.prompt_mean_std
    assert pm == pytest.approx(2000, rel=1e-9)
    assert ps == pytest.approx(3000, rel=0.05)


@pytest.mark.parametrize(
    "kw",
    [
        {"prompt_tokens": (), "prompt_var": (), "prompt_weight": ()},
        {"prompt_weight": (-1.0,)},
        {"prompt_tokens": (math.nan,)},
        {"output_tokens": (0.0,)},
    ],
)
def test_bad_distributions_are_rejected(kw) -> None:
    base = {
        "prompt_tokens": (100.0,),
        "prompt_var": (0.0,),
        "prompt_weight": (1.0,),
        "output_tokens": (10.0,),
        "output_var": (0.0,),
        "output_weight": (1.0,),
    }
    with pytest.raises(ValueError):
        SizeDistribution(**{**base, **kw})
    with pytest.raises(ValueError, match="sizes must be a SizeDistribution"):
        Demand(sizes="long")  # type: ignore[arg-type]


# --------------------------------------------------------------------------- moments


def test_one_class_moments_equal_the_mean_only_planner() -> None:
    models = StageModels(prefill=PrefillModel(fixed_ms=20, ms_per_token=0.035, ms_per_token_sq=1e-6))
    d = Demand(1.0, 6000, 1500, 400, 100)
    st = planner._setup(d, models, SLO(), False)
    s_ms, cs2 = prefill_moments(one_class(6000, 400, 1500), models)
    assert s_ms / 1000 == pytest.approx(st.prefill_s, rel=1e-12)
    assert cs2 == pytest.approx(st.prefill_cs2, rel=1e-12)


def test_mixture_moments_are_exact_across_classes() -> None:
    # two classes, linear model: S = 20 + 0.035 t; service times 37.5 and 370 ms, equal weights
    d = SizeDistribution((500.0, 10_000.0), (0.0, 0.0), (0.5, 0.5), (100.0, 900.0), (0.0, 0.0), (0.5, 0.5))
    s_ms, cs2 = prefill_moments(d, M)
    assert s_ms == pytest.approx((37.5 + 370) / 2)
    assert cs2 == pytest.approx(((37.5**2 + 370**2) / 2) / s_ms**2 - 1)
    om, ocs2 = output_moments(d)
    assert om == 500 and ocs2 == pytest.approx((400 / 500) ** 2)


# --------------------------------------------------------------------------- covers


def test_covers_count_idle_misses_apart_and_always_include_the_full_cover() -> None:
    # 5 % of prompts cannot meet 0.6 s even on an idle system (20,000 tokens: 720 ms prefill)
    d = SizeDistribution(
        (500.0, 6000.0, 20_000.0), (0.0, 0.0, 0.0), (0.80, 0.15, 0.05), (400.0,), (0.0,), (1.0,)
    )
    c = ttft_covers(d, M, 0.6, 0.9, extra_s=0.045)
    assert c.idle_miss_fraction == pytest.approx(0.05)
    assert c.covered[-1] == 1.0 and c.wait_percentile[-1] == pytest.approx(0.9)
    # the full cover's bare TTFT is the 6,000-token class: 230 + 95.23 + 45 ms (worked example)
    assert c.fixed_s[-1] == pytest.approx(0.37023, abs=1e-5)
    assert all(f > 0.9 for f in c.covered)
    for f, q in zip(c.covered, c.wait_percentile, strict=True):
        assert q == pytest.approx(0.9 / f)
    none = ttft_covers(d, M, 0.01, 0.9)
    assert none.fixed_s == () and none.idle_miss_fraction == 1.0


def test_a_short_tail_can_be_left_uncovered_when_that_is_cheaper() -> None:
    # 3 % very long prompts with almost no slack: covering them costs far more than
    # covering the 97 % short ones at a higher wait percentile (0.9 / 0.97)
    d = SizeDistribution((500.0, 14_000.0), (0.0, 0.0), (0.97, 0.03), (200.0,), (0.0,), (1.0,))
    pl = plan(demand_with_sizes(20.0, d), M, SLO(ttft_s=0.8))
    assert pl.stages["sizes.covered_fraction"] == pytest.approx(0.97)
    assert pl.stages["sizes.wait_percentile"] == pytest.approx(0.9 / 0.97)
    full = plan(demand_with_sizes(20.0, d), M, SLO(ttft_s=0.8, percentile=0.985))
    # 0.985 / 0.97 > 1: no cover leaves the long ones out; a relaxed candidate may, when the
    # exact mixture over both classes still meets 98.5 %
    st = full.stages
    assert st["sizes.covered_fraction"] == 1.0 or st["sizes.mixture_miss"] <= 0.015 + 1e-12
    assert full.total_gpus >= pl.total_gpus


def test_summed_wait_tail_inverts_the_sum_of_stage_percentiles() -> None:
    rng = np.random.default_rng(8)
    for _ in range(200):
        stages = [
            (float(rng.uniform(0, 1)), float(rng.uniform(0.1, 50)), float(rng.uniform(0.2, 3)))
            for _ in range(int(rng.integers(1, 4)))
        ]
        q = float(rng.uniform(0.5, 0.999))
        # the planner's summed percentile wait at q ...
        total = sum(f * math.log(pw / (1 - q)) / gap for pw, gap, f in stages if pw > 1 - q)
        # ... is the wait whose tail is 1 - q
        if total > 0:
            assert summed_wait_tail(total, stages) == pytest.approx(1 - q, rel=1e-9)
    one = [(0.4, 2.0, 1.5)]
    assert summed_wait_tail(0.3, one) == pytest.approx(0.4 * math.exp(-2.0 * 0.3 / 1.5))
    assert summed_wait_tail(0.3, [(0.4, -1.0, 1.0)]) == 1.0  # unstable
    assert summed_wait_tail(0.3, [(0.0, 2.0, 1.0)]) == 0.0  # never waits


def test_relaxed_candidates_are_cheaper_and_verified_by_the_mixture(monkeypatch) -> None:
    monkeypatch.setattr(sizes_mod, "RELAXED_SHARES", (0.5, 0.75, 0.9, 0.95, 0.99, 0.999))
    planner._clear_caches()
    # 8 % long prompts with little slack at p90: no cover can leave them out at a wait
    # percentile below 0.999 cheaply; sizing the short slice at p90, verified over both
    # classes, is cheaper than covering the long ones
    d = SizeDistribution((500.0, 12_000.0), (0.0, 0.0), (0.92, 0.08), (200.0,), (0.0,), (1.0,))
    pl = plan(demand_with_sizes(30.0, d), M, SLO(ttft_s=0.75))
    miss = pl.stages["sizes.mixture_miss"]
    assert miss == miss and miss <= 0.1  # a relaxed candidate (not NaN), within the target
    assert pl.stages["sizes.wait_percentile"] == 0.9 and pl.stages["sizes.covered_fraction"] < 1


# --------------------------------------------------------------------------- planner


@pytest.mark.parametrize("rate", [0.5, 3.0, 12.0, 40.0])
def test_one_class_without_spread_plans_like_the_mean_only_demand(rate) -> None:
    mean_only = plan(Demand(rate, 6000, 0, 400, 0))
    sized = plan(demand_with_sizes(rate, one_class(6000, 400)))
    assert sized.replicas == mean_only.replicas
    assert sized.ttft_s == pytest.approx(mean_only.ttft_s, rel=1e-9)
    assert sized.percentile == mean_only.percentile == 0.9
    assert plan_replicas([demand_with_sizes(rate, one_class(6000, 400))])[0][:3] == tuple(
        mean_only.replicas[k] for k in ("encoder", "prefill", "decode")
    )


def test_predict_with_sizes_uses_the_slowest_feasible_class() -> None:
    d = SizeDistribution((500.0, 6000.0), (0.0, 0.0), (0.5, 0.5), (400.0,), (0.0,), (1.0,))
    got = predict({"prefill": 3, "decode": 3}, demand_with_sizes(2.0, d))
    assert got["ttft_s"] >= 0.3702297  # at least the 6,000-token class's bare TTFT


def test_sizes_meet_the_percentile_in_the_simulator_where_the_mean_request_does_not() -> None:
    """A quarter of prompts are 13-14 k tokens with ~40 ms of slack at TTFT 0.8 s.

    Sized for the mean request, the pools let waits eat the long prompts' slack:
    the simulator's attainment falls below the 90 % target. Sized over the
    classes, it meets it.
    """
    slo = SLO(ttft_s=0.8)
    rate = 15.0
    w = mix(
        rate,
        600,
        short_tokens=(200, 800),
        long_tokens=(13_000, 14_000),
        long_fraction=0.25,
        output_tokens=(50, 300),
        seed=5,
    )
    p, o = w.prompt_tokens.astype(float), w.output_tokens.astype(float)
    mean_plan = plan(Demand(rate, p.mean(), p.std(), o.mean(), o.std()), M, slo)
    size_plan = plan(demand_with_sizes(rate, SizeDistribution.from_samples(p, o)), M, slo)

    def attainment(reps: dict[str, int]) -> float:
        cfg = SimConfig(prefill=reps["prefill"], decode=reps["decode"], ttft_ms=800.0, itl_ms=150.0)
        return simulate(w, M, cfg).slo_attainment

    assert attainment(mean_plan.replicas) < 0.9
    assert attainment(size_plan.replicas) >= 0.9


# --------------------------------------------------------------------------- TTFT that grows with the prompt


def test_a_per_token_ttft_target_is_the_mean_requests_target_without_sizes() -> None:
    with pytest.raises(ValueError, match="ttft_s_per_1k_tokens"):
        SLO(ttft_s_per_1k_tokens=-0.1)
    d = Demand(20.0, 6000, 1500, 400, 100)
    grown = plan(d, M, SLO(ttft_s=0.4, ttft_s_per_1k_tokens=0.05))
    same = plan(d, M, SLO(ttft_s=0.4 + 0.05 * 6))  # the mean prompt's target
    assert grown.replicas == same.replicas and grown.ttft_s == same.ttft_s
    assert grown.total_gpus < plan(d, M, SLO(ttft_s=0.4)).total_gpus
    assert grown.to_dict()["slo"]["ttft_s_per_1k_tokens"] == 0.05
    assert "ttft_s_per_1k_tokens" not in same.to_dict()["slo"]


def test_per_token_targets_rescue_long_prompts_from_idle_misses_and_reorder_the_classes() -> None:
    d = SizeDistribution(
        (500.0, 6000.0, 20_000.0), (0.0, 0.0, 0.0), (0.80, 0.15, 0.05), (400.0,), (0.0,), (1.0,)
    )
    flat = ttft_covers(d, M, 0.6, 0.9, extra_s=0.045)
    grown = ttft_covers(d, M, 0.6, 0.9, extra_s=0.045, target_s_per_1k_tokens=0.05)
    assert flat.idle_miss_fraction == pytest.approx(0.05)
    assert grown.idle_miss_fraction == 0.0  # 20 k tokens: target 1.6 s, bare ~1.08 s
    # slack with 50 ms per 1k tokens: 500 tokens 0.625 - 0.101 = 0.524 s, 6 k 0.9 - 0.370 = 0.530 s,
    # 20 k 1.6 - 1.054 = 0.546 s: now the short class binds the full cover (flat: the 6 k class)
    assert grown.target_s[-1] == pytest.approx(0.625)
    assert grown.target_s[-1] - grown.fixed_s[-1] == pytest.approx(0.524, abs=1e-3)
    assert flat.fixed_s[-1] == pytest.approx(0.37023, abs=1e-5)
    pl = plan(demand_with_sizes(10.0, d), M, SLO(ttft_s=0.6, ttft_s_per_1k_tokens=0.05))
    assert pl.feasible and pl.stages["sizes.idle_miss_fraction"] == 0.0


def test_tables_at_several_percentiles_equal_one_table_each() -> None:
    rng = np.random.default_rng(3)
    for _ in range(300):
        lam = float(rng.choice([0.0, rng.uniform(0.01, 5), rng.uniform(5, 400)]))
        svc = float(rng.uniform(0.01, 3))
        cs2, k = float(rng.uniform(0, 3)), int(rng.choice([1, 8, 32]))
        lo = int(rng.integers(0, 3))
        hi = lo + int(rng.integers(0, 400))
        ps = tuple(sorted(rng.uniform(0.5, 0.999, int(rng.integers(1, 6)))))
        share = float(rng.choice([1.0, rng.uniform(0.001, 1.0)]))  # the share of requests visiting
        raw = planner._erlang_pass(lam, svc, cs2, k, lo, hi, max(ps), share)
        assert [planner._table_at(raw, p) for p in ps] == [
            planner._table(lam, svc, cs2, k, lo, hi, p, share) for p in ps
        ]


def test_a_class_straddling_the_idle_limit_is_split_by_slices() -> None:
    # one class uniform on 5,000..7,000 tokens; 6,000 tokens is exactly the limit (0.37023 s bare)
    d = SizeDistribution((6000.0,), (1000.0**2 / 3,), (1.0,), (400.0,), (0.0,), (1.0,))
    edges, weights = d.prompt_slices
    assert edges.tolist() == pytest.approx([5500, 6000, 6500, 7000])
    assert weights.sum() == pytest.approx(1.0)
    c = ttft_covers(d, M, 0.3702298, 0.9, extra_s=0.045)
    assert c.idle_miss_fraction == pytest.approx(0.5)  # the upper half misses on an idle system
    assert c.fixed_s[-1] == pytest.approx(0.37023, abs=1e-5)  # the lower half is covered to its top


def test_vectorised_slices_and_cover_choice_equal_the_loops() -> None:
    """prompt_slices and ttft_covers index the slices with numpy; the per-class loops they replace agree."""
    from disagg.sizes import MAX_WAIT_PERCENTILE, SUBCLASSES_PER_BUCKET, _evenly_spaced, ttft_covers

    rng = np.random.default_rng(5)
    models = StageModels()
    for _ in range(200):
        k = int(rng.integers(1, 30))
        t = rng.uniform(10, 12000, k)
        v = np.where(rng.random(k) < 0.3, 0.0, rng.uniform(0, 4e6, k))
        d = SizeDistribution(tuple(t), tuple(v), tuple(rng.uniform(0.1, 1, k)), (300.0,), (0.0,), (1.0,))
        tt, vv, _ = d.prompt_arrays
        n = np.where(vv > 0, SUBCLASSES_PER_BUCKET, 1)
        half = np.sqrt(3.0 * vv)
        lo, hi = np.repeat(np.maximum(tt - half, 0.0), n), np.repeat(tt + half, n)
        frac = np.concatenate([np.arange(1, m + 1) for m in n.tolist()]) / np.repeat(n, n)
        assert d.prompt_slices[0].tolist() == (lo + (hi - lo) * frac).tolist()
        p = float(rng.uniform(0.5, 0.99))
        cov = ttft_covers(d, models, float(rng.uniform(0.3, 3.0)), p, max_covers=int(rng.integers(1, 12)))
        if cov.slices is None:
            continue
        f_ok, t_ok, _, cum = cov.slices
        s_ok = t_ok - f_ok
        last = len(cum) - 1
        idx = [
            i
            for i in range(len(cum))
            if i == last or (p / cum[i] <= MAX_WAIT_PERCENTILE and s_ok[i + 1] < s_ok[i])
        ]
        if len(idx) > len(cov.fixed_s):
            m = len(cov.fixed_s)
            picks = np.linspace(0, len(idx) - 1, m).round().astype(int)
            assert _evenly_spaced(len(idx), m) == sorted(set(picks.tolist()))
            idx = [idx[j] for j in sorted(set(picks.tolist()))]
        assert cov.fixed_s == tuple(float(f_ok[i]) for i in idx)
        assert cov.covered == tuple(float(cum[i]) for i in idx)
        assert cov.wait_percentile == tuple(min(p / float(cum[i]), 1.0) for i in idx)


def _pick_reference(st, lam, bounds, gpus, p, ttft_s):
    """`planner._pick_cover`'s covers, searched one by one in index order (no cost floor)."""
    cov = st.covers
    specs = planner._specs(lam, st, bounds)
    per_cover = [planner._tables(specs, q) for q in cov.wait_percentile]  # one `_table` per pool and cover
    last = len(cov.fixed_s) - 1
    best, pick = None, (cov.fixed_s[last], p, cov.target_s[last], 1.0, per_cover[last])
    for i, fx in enumerate(cov.fixed_s):
        tabs = per_cover[i]
        idx = planner._search(tabs, gpus, max(0.0, cov.target_s[i] - fx))
        if idx is None:
            continue
        key = (planner._cost(tabs, gpus, idx), -cov.covered[i])
        if best is None or key < best:
            best, pick = key, (fx, cov.wait_percentile[i], cov.target_s[i], cov.covered[i], tabs)
    return pick


def test_cover_pick_with_cost_floor_equals_the_plain_search() -> None:
    rng = np.random.default_rng(11)
    models, slo = StageModels(), SLO(percentile=0.99)
    edges = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000]
    ctx = planner._ctx(models, slo, False)
    checked = 0
    for _ in range(300):

        def hist(scale: float) -> list[tuple[float, float]]:
            xs = rng.lognormal(np.log(scale), rng.uniform(0.3, 1.3), 200)
            return [(e, float((xs <= e).sum())) for e in edges] + [(math.inf, 200.0)]

        sizes = SizeDistribution.from_buckets(hist(rng.uniform(300, 6000)), hist(rng.uniform(50, 800)))
        d = sizes_mod.demand_with_sizes(
            float(rng.uniform(0, 60)), sizes, arrival_ca2=float(rng.uniform(0.8, 4))
        )
        st = planner._shape(ctx, d)
        if st.covers is None or not st.covers.fixed_s:
            continue
        gpus = tuple(int(g) for g in rng.choice([1, 2, 4], 3))
        lo = int(rng.integers(0, 3))
        bounds = {
            k: planner.PoolBounds(lo, lo + int(rng.integers(1, 300)), g)
            for k, g in zip(("encoder", "prefill", "decode"), gpus, strict=True)
        }
        got = planner._pick_cover(st, d.arrival_rps, bounds, gpus, slo.percentile, slo.ttft_s)
        fx, pct, target, covered, tabs = _pick_reference(
            st, d.arrival_rps, bounds, gpus, slo.percentile, slo.ttft_s
        )
        assert (got.st.fixed_s, got.percentile, got.target, got.covered, got.tabs) == (
            fx,
            pct,
            target,
            covered,
            tabs,
        )
        checked += 1
    assert checked > 200
