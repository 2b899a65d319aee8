"""Closed-loop evaluation harness: drains lose nothing, oracle bound, baselines, JSON shape, CLI errors."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from disagg.cli import main
from disagg.commands.evaluate import missed_minutes, where_missed, workload_label
from disagg.evaluate import (
    POLICIES,
    EvalSettings,
    HpaPolicy,
    Obs,
    _Prefix,
    diurnal,
    evaluate,
    misses_by_minute,
    rate_scaled,
    run_policy,
)
from disagg.workload import Workload, burst, poisson, thinned, with_coarse_timestamps

SHORT = EvalSettings(startup_s=30.0, stabilization_s=120.0, timeline_points=50)


@pytest.fixture(scope="module")
def wave() -> Workload:
    # square wave 2 <-> 14 rps, 1,000-token prompts, 150-token outputs: pools of a few workers
    return burst(2.0, 14.0, 600.0, 1500.0, prompt_tokens=(200, 1800), output_tokens=(50, 250), seed=3)


@pytest.fixture(scope="module")
def doc(wave: Workload) -> dict:
    return evaluate(wave, POLICIES, SHORT)


def test_json_shape(doc: dict) -> None:
    assert set(doc) >= {"trace", "settings", "policies", "workload"}
    assert list(doc["policies"]) == list(POLICIES)
    for m in doc["policies"].values():
        for k in (
            "slo_attainment",
            "ttft_p50_s",
            "ttft_p90_s",
            "ttft_p99_s",
            "itl_p50_s",
            "itl_p90_s",
            "itl_p99_s",
            "gpu_hours",
            "gpu_hours_vs_oracle",
            "scaling_actions",
            "drains",
            "lost_requests",
            "infeasible_requests",
            "timeline",
        ):
            assert k in m
        tl = m["timeline"]
        assert 0 < len(tl) <= 50
        assert set(tl[0]) >= {"t", "arrival_rps", "replicas"}
        assert set(tl[0]["replicas"]) == {"prefill", "decode"}
    json.dumps(doc)


def test_draining_policies_lose_nothing(doc: dict, wave: Workload) -> None:
    for name in ("disagg", "static", "oracle"):
        m = doc["policies"][name]
        assert m["lost_requests"] == 0, name
        assert m["completed"] == len(wave), name
    assert doc["policies"]["oracle"]["drains"] > 0
    assert doc["policies"]["disagg"]["drains"] > 0


def test_oracle_is_the_gpu_hour_floor(doc: dict) -> None:
    o = doc["policies"]["oracle"]["gpu_hours"]
    for name in ("disagg", "static"):
        assert doc["policies"][name]["gpu_hours"] >= o - 1e-9, name
    assert doc["policies"]["oracle"]["gpu_hours_vs_oracle"] == pytest.approx(1.0)


def test_disagg_beats_reactive_baselines_and_scales(doc: dict) -> None:
    # a 7x square wave defeats every reactive policy for the first minute of each step;
    # disagg still recovers far better than the per-pool baselines
    d = doc["policies"]["disagg"]
    assert d["slo_attainment"] > 0.8
    for name in ("hpa", "throughput"):
        assert d["slo_attainment"] > doc["policies"][name]["slo_attainment"] + 0.2, name
    sizes = {x["replicas"]["decode"] for x in d["timeline"]}
    assert len(sizes) > 1


def test_headroom_buys_attainment_with_gpus() -> None:
    # standing spare capacity absorbs the steps of a square wave that start-up cannot catch:
    # 4 <-> 8 rps steps are 2x, so a 100 % headroom covers a whole step from its first
    # second. The automatic burst headroom is off here (it learns the same steps from the
    # ones already seen; test_burstiness): the spec's floor alone is what is measured.
    wave2 = burst(4.0, 8.0, 600.0, 1500.0, prompt_tokens=(200, 1800), output_tokens=(50, 250), seed=3)
    floor_only = replace(SHORT, sizing={"autoHeadroom": False})
    base = run_policy("disagg", wave2, floor_only).metrics
    spare = run_policy("disagg", wave2, replace(floor_only, headroom=1.0)).metrics
    assert spare["gpu_hours"] > base["gpu_hours"] * 1.1
    assert spare["slo_attainment"] > base["slo_attainment"]
    assert spare["slo_attainment"] >= 0.999
    assert spare["lost_requests"] == 0


def test_misses_by_minute_place_every_miss_at_its_arrival_minute(doc: dict, wave: Workload) -> None:
    minutes = int(wave.arrival_s.max() // 60) + 1
    per_minute = np.bincount((wave.arrival_s // 60).astype(int), minlength=minutes)
    for name, m in doc["policies"].items():
        by = m["misses_by_minute"]
        assert len(by["feasible"]) == len(by["missed"]) == minutes, name
        feasible = m["requests"] - m["infeasible_requests"]
        assert sum(by["feasible"]) == feasible, name
        # the attainment's own misses, each counted once, at most the minute's feasible requests
        assert sum(by["missed"]) == round(feasible * (1.0 - m["slo_attainment"])), name
        assert all(0 <= x <= f for x, f in zip(by["missed"], by["feasible"], strict=True)), name
        assert all(f <= c for f, c in zip(by["feasible"], per_minute, strict=True)), name
    # the square wave is at 14 rps in minutes 0-4, 10-14 and 20-24 and at 2 rps between: a
    # policy that lags its steps (hpa) misses in the high halves, hardly ever in the low ones
    hpa = doc["policies"]["hpa"]["misses_by_minute"]["missed"]
    high = sum(c for minute, c in enumerate(hpa) if minute % 10 < 5)
    assert sum(hpa) > 1000 and high >= 0.95 * sum(hpa)


def test_misses_by_minute_leave_out_requests_out_of_reach() -> None:
    arrival = np.array([0.0, 30.0, 59.9, 61.0, 130.0, 150.0])
    feasible = np.array([True, False, True, True, True, False])
    good = np.array([False, False, True, True, False, False])
    assert misses_by_minute(arrival, feasible, good) == {"feasible": [2, 1, 1], "missed": [1, 0, 1]}


def test_where_missed_says_when_a_runs_misses_happened() -> None:
    cold = {"missed": [30, 12, 0, 0, 2] + [0] * 15, "feasible": [100, 90, 80, 80, 80] + [80] * 15}
    assert where_missed(cold) == (
        "44 missed in 3 of 20 minutes; half of them in 1 minute (worst: minute 0, 30 of 100); "
        "100 % in the first 10 minutes"
    )
    steady = {"missed": [1] * 20, "feasible": [50] * 20}
    assert where_missed(steady) == (
        "20 missed in 20 of 20 minutes; half of them in 10 minutes (worst: minute 0, 1 of 50); "
        "50 % in the first 10 minutes"
    )
    assert where_missed({"missed": [0, 0], "feasible": [3, 4]}) == "none missed in 2 minutes"
    # the plot shades the minutes where over 1 % missed: 0 (30 %), 1 (13 %) and 4 (2.5 %); a minute
    # with 0.5 % missed is not, nor one without requests
    assert missed_minutes(cold) == [(0, 0.3), (1, 12 / 90), (4, 2 / 80)]
    assert missed_minutes({"missed": [1, 0], "feasible": [200, 0]}) == [] and missed_minutes(None) == []


def test_static_never_scales(doc: dict) -> None:
    s = doc["policies"]["static"]
    assert s["scaling_actions"] == 0 and s["drains"] == 0
    assert len({tuple(sorted(x["replicas"].items())) for x in s["timeline"]}) == 1


def test_baselines_without_drain_lose_requests_when_scaling_down() -> None:
    w = burst(1.0, 20.0, 400.0, 1000.0, prompt_tokens=1000, output_tokens=(100, 400), seed=1)
    r = run_policy("throughput", w, SHORT)
    assert r.metrics["drains"] == 0
    assert r.metrics["lost_requests"] > 0
    r2 = run_policy("throughput", w, EvalSettings(startup_s=30.0, baseline_drain=True))
    assert r2.metrics["lost_requests"] == 0


def _obs(now: float, util: float, n: int) -> Obs:
    return Obs(
        now=now,
        rate=1.0,
        count=60,
        prompt_mean=1000.0,
        prompt_std=0.0,
        output_mean=100.0,
        output_std=0.0,
        util={"prefill": util, "decode": util},
        ready={"prefill": n, "decode": n},
        requested={"prefill": n, "decode": n},
        pending={"prefill": 0, "decode": 0},
        ttft_p=None,
    )


def test_hpa_rule_tolerance_and_stabilization() -> None:
    w = poisson(1.0, 60.0, seed=0)
    s = EvalSettings(stabilization_s=300.0)
    hpa = HpaPolicy(s, w, _Prefix(w))
    assert hpa.decide(_obs(0.0, 0.75, 4))[0]["decode"] == 4  # within 10 % of 0.7
    assert hpa.decide(_obs(30.0, 0.9, 4))[0]["decode"] == 6  # ceil(4 x 0.9 / 0.7)
    n = 6
    for t in range(60, 600, 30):
        n_new = hpa.decide(_obs(float(t), 0.1, n))[0]["decode"]
        if t < 30 + 300:
            assert n_new == n, t  # the 30 s recommendation of 6 is still in the window
        n = n_new
    assert n == 1


def test_rate_scale_and_diurnal_preserve_mix() -> None:
    w = poisson(2.0, 300.0, prompt_tokens=(100, 3000), output_tokens=(10, 500), seed=5)
    w3 = rate_scaled(w, 3, seed=1)
    assert len(w3) == 3 * len(w)
    assert w3.duration_s <= w.duration_s + 300.0 / len(w) + 1e-6
    assert sorted(w3.prompt_tokens.tolist()) == sorted(np.tile(w.prompt_tokens, 3).tolist())
    d = diurnal(w, 2, seed=0)
    assert set(d.prompt_tokens.tolist()) <= set(w.prompt_tokens.tolist())
    assert d.mean_rate == pytest.approx(2 * w.mean_rate, rel=0.25)
    assert d.duration_s == pytest.approx(7200.0, abs=60.0)
    with pytest.raises(ValueError):
        rate_scaled(w, 0)


def test_unknown_policy_value_error() -> None:
    with pytest.raises(ValueError, match="unknown policy"):
        run_policy("nope", poisson(1.0, 10.0), SHORT)


@pytest.fixture
def small_trace(tmp_path):
    p = tmp_path / "t.jsonl"
    rng = np.random.default_rng(0)
    ts = np.cumsum(rng.exponential(250.0, size=400)).astype(int)
    with p.open("w") as fh:
        for t in ts:
            fh.write(
                json.dumps({"timestamp": int(t), "input_length": 800, "output_length": 60, "hash_ids": [1]})
                + "\n"
            )
    return str(p)


def test_cli_json(small_trace: str, capsys) -> None:
    rc = main(
        [
            "evaluate",
            "--trace",
            small_trace,
            "--policy",
            "disagg",
            "--output",
            "json",
            "--startup-seconds",
            "30",
        ]
    )
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert list(out["policies"]) == ["disagg"]
    assert out["policies"]["disagg"]["lost_requests"] == 0


@pytest.mark.parametrize(
    ("extra", "msg"),
    [
        (["--policy", "bogus"], "unknown policy"),
        (["--format", "parquet"], "unknown trace format"),
        (["--workload", "weekly"], "unknown workload"),
        (["--rate-scale", "0"], "--rate-scale"),
        (["--headroom", "-0.2"], "--headroom"),
        (["--coarse-timestamps", "0"], "--coarse-timestamps"),
        (["--thin", "0"], "--thin keeps one request in K"),
        (["--thin", "100000"], "leaves"),
    ],
)
def test_cli_bad_input_exit_2(small_trace: str, capsys, extra: list[str], msg: str) -> None:
    rc = main(["evaluate", "--trace", small_trace, *extra])
    assert rc == 2
    assert msg in capsys.readouterr().err


def test_coarse_timestamps_replay_each_quantums_requests_together() -> None:
    w = poisson(4.0, 60.0, prompt_tokens=500, output_tokens=50, seed=3)
    c = with_coarse_timestamps(w, 3.0)
    assert len(c) == len(w) and np.array_equal(c.prompt_tokens, w.prompt_tokens)
    assert set(np.unique(c.arrival_s)) <= {3.0 * k for k in range(21)}  # on the 3 s grid
    assert np.all(
        (w.arrival_s - c.arrival_s >= 0) & (w.arrival_s - c.arrival_s < 3.0)
    )  # floored, never later
    assert len(np.unique(c.arrival_s)) < len(w) / 5  # about 12 requests at each instant
    with pytest.raises(ValueError, match="quantum_s"):
        with_coarse_timestamps(w, 0.0)


def test_thinning_keeps_a_seeded_kth_of_the_requests_where_they_were() -> None:
    # bursts of 40 requests within a second, every 30 s: thinned, the bursts stay where they
    # were with a tenth of their requests, and nothing arrives between them
    w = burst(0.0, 40.0, 30.0, 600.0, duty=1 / 30, seed=2)
    t = thinned(w, 10, seed=4)
    assert 0.06 * len(w) < len(t) < 0.14 * len(w)
    kept = np.isin(w.arrival_s, t.arrival_s)
    assert kept.sum() == len(t)  # a subset of the requests, each with its own lengths
    assert np.array_equal(t.prompt_tokens, w.prompt_tokens[kept])
    assert np.array_equal(t.output_tokens, w.output_tokens[kept])
    assert np.all(np.diff(t.arrival_s) >= 0)
    assert np.all(t.arrival_s % 30.0 < 1.0)  # inside the bursts only
    assert np.array_equal(thinned(w, 10, seed=4).arrival_s, t.arrival_s)  # seeded
    assert not np.array_equal(thinned(w, 10, seed=5).arrival_s, t.arrival_s)
    assert thinned(w, 1) is w
    # a trace's prefix hash ids follow their requests
    hashed = Workload(w.arrival_s, w.prompt_tokens, w.output_tokens, hash_ids=[(i,) for i in range(len(w))])
    h = thinned(hashed, 10, seed=4)
    assert h.hash_ids == [(i,) for i in np.flatnonzero(kept).tolist()]
    with pytest.raises(ValueError, match="whole number >= 1"):
        thinned(w, 0)
    with pytest.raises(ValueError, match="whole number >= 1"):
        thinned(w, 2.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="leaves"):
        thinned(w.head(3), 1000)


def test_cli_thin_replays_a_kth_of_the_trace(small_trace: str, capsys) -> None:
    args = ["evaluate", "--trace", small_trace, "--policy", "disagg", "--output", "json"]
    assert main(args) == 0
    whole = json.loads(capsys.readouterr().out)
    assert main([*args, "--thin", "2", "--seed", "3"]) == 0
    half = json.loads(capsys.readouterr().out)
    assert half["settings"]["thin"] == 2 and whole["settings"]["thin"] == 1
    n, m = whole["workload"]["requests"], half["workload"]["requests"]
    assert 0.25 * n < m < 0.75 * n
    assert workload_label(half["settings"]) == "trace x1, one request in 2"  # the figures' titles
    assert workload_label(whole["settings"]) == "trace x1"


def test_cli_missing_file(capsys) -> None:
    assert main(["evaluate", "--trace", "/nonexistent/trace.csv"]) == 2
    assert "error" in capsys.readouterr().err


def test_cli_plot_writes_a_png_per_run(small_trace: str, tmp_path, capsys) -> None:
    png = tmp_path / "run.png"
    args = ["evaluate", "--trace", small_trace, "--policy", "disagg", "--policy", "hpa", "--plot", str(png)]
    assert main(args) == 0
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000  # a rendered figure, not a stub
    out = capsys.readouterr().out
    assert "disagg" in out  # the table is still printed
    assert "where the misses were" in out and "  hpa: " in out
    assert main(["evaluate", "--trace", small_trace, "--plot", str(tmp_path / "run.svg")]) == 2
    assert "--plot writes a PNG" in capsys.readouterr().err


# --------------------------------------------------------------------------- media and conditional


@pytest.fixture(scope="module")
def media_step() -> Workload:
    # 2 rps of text, then 10 rps of which 60 % carry four images each: the encoder pool must grow
    low = poisson(2.0, 300.0, prompt_tokens=1000, output_tokens=100, seed=1)
    high = poisson(
        10.0, 300.0, prompt_tokens=1000, output_tokens=100, media_fraction=0.6, media_items=4, seed=2
    )
    return Workload(
        np.concatenate([low.arrival_s, high.arrival_s + 300.0]),
        np.concatenate([low.prompt_tokens, high.prompt_tokens]),
        np.concatenate([low.output_tokens, high.output_tokens]),
        np.concatenate([low.media_items, high.media_items]),
        name="media step",
    )


def test_media_workload_sizes_the_encoder_pool(media_step: Workload) -> None:
    doc = evaluate(media_step, ("disagg", "static", "oracle"), SHORT)
    for name in ("disagg", "static", "oracle"):
        m = doc["policies"][name]
        assert m["lost_requests"] == 0 and m["completed"] == len(media_step), name
        assert set(m["timeline"][0]["replicas"]) == {"encoder", "prefill", "decode"}
    tl = doc["policies"]["disagg"]["timeline"]
    before = [x["replicas"] for x in tl if x["t"] < 290]
    after = [x["replicas"] for x in tl if x["t"] > 420]
    assert max(r["encoder"] for r in before) == 1  # text only: the encoder pool at its minimum
    # 10 rps x 60 % x (15 + 4 x 25) ms = 0.69 busy encoders at the mean, more at the p99 wait
    assert max(r["encoder"] for r in after) >= 2
    assert max(r["prefill"] for r in after) > max(r["prefill"] for r in before)
    assert doc["workload"]["media_fraction"] == pytest.approx(
        float((media_step.media_items > 0).mean()), rel=1e-9
    )


def test_conditional_placement_prefills_short_prompts_on_decode() -> None:
    # 1,500-token prompts, below the 2,429-token threshold: conditional placement prefills them
    # on decode, the prefill pool idles at its minimum and the decode pool carries the prefills
    w = poisson(12.0, 400.0, prompt_tokens=1500, output_tokens=100, seed=4)
    dis = run_policy("disagg", w, SHORT)
    cond = run_policy("disagg", w, replace(SHORT, placement="conditional"))
    for r in (dis, cond):
        assert r.metrics["lost_requests"] == 0 and r.metrics["completed"] == len(w)
        assert set(r.timeline[0]["replicas"]) == {"prefill", "decode"}
        assert r.metrics["slo_attainment"] > 0.9

    def peak(r, pool):
        return max(x["replicas"][pool] for x in r.timeline)

    assert peak(dis, "prefill") >= 2
    assert peak(cond, "prefill") == 1
    assert peak(cond, "decode") > peak(dis, "decode")
    # a threshold below every prompt sends them all to the prefill pool again
    remote = run_policy("disagg", w, replace(SHORT, placement="conditional", split_threshold=1000))
    assert peak(remote, "prefill") == peak(dis, "prefill")


def test_infeasible_requests_follow_the_placement() -> None:
    from disagg.evaluate import infeasible_mask

    w = Workload([0.0, 1.0, 2.0], [2000, 2000, 14000], [10, 10, 10], [0, 40, 0])
    s = replace(SHORT)
    # 2,000 tokens: 90 ms prefill + 233 ms transfer (serial) + 45 ms: feasible either way;
    # 40 images add 1,015 ms of encoding: not; 14,000 tokens: 510 + 556 ms: not
    assert infeasible_mask(w, s).tolist() == [False, True, True]
    assert infeasible_mask(w, replace(s, placement="conditional")).tolist() == [False, True, True]
    with pytest.raises(ValueError, match="placement"):
        EvalSettings(placement="colocated")


def test_cli_media_and_conditional(small_trace: str, capsys) -> None:
    args = ["evaluate", "--trace", small_trace, "--policy", "disagg", "--output", "json"]
    assert main([*args, "--media-fraction", "0.5", "--media-items", "2", "--placement", "conditional"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["settings"]["placement"] == "conditional"
    assert out["settings"]["split_threshold_tokens"] == pytest.approx(2428.57, abs=0.01)
    assert out["settings"]["media_fraction"] == 0.5
    assert out["workload"]["media_fraction"] == pytest.approx(0.5, abs=0.1)
    tl = out["policies"]["disagg"]["timeline"]
    assert set(tl[0]["replicas"]) == {"encoder", "prefill", "decode"}
    assert out["policies"]["disagg"]["lost_requests"] == 0


@pytest.mark.parametrize(
    ("extra", "msg"),
    [
        (["--placement", "colocated"], "unknown placement"),
        (["--media-fraction", "1.5"], "--media-fraction"),
        (["--media-fraction", "0.5", "--media-items", "0"], "--media-items"),
        (["--placement", "conditional", "--split-threshold", "0"], "--split-threshold"),
    ],
)
def test_cli_bad_media_or_placement_exit_2(small_trace: str, capsys, extra: list[str], msg: str) -> None:
    assert main(["evaluate", "--trace", small_trace, *extra]) == 2
    assert msg in capsys.readouterr().err
