"""Token-level ITL: every inter-token gap is recorded; a request's ITL verdict uses the SLO's statistic."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest

from disagg.cli import main
from disagg.commands.modelflags import ITL_STATISTIC_CHOICES
from disagg.evaluate import EvalSettings, run_policy
from disagg.model import ITL_STATISTICS, DecodeModel, StageModels
from disagg.planner import SLO
from disagg.sim import SimConfig, simulate
from disagg.sim.core import GapHistogram, gap_summary
from disagg.workload import Workload, mix, poisson

M = StageModels()
ROOT = Path(__file__).resolve().parents[2]
STALL_MS = 230.0 + 45.0  # the chapter's 6,000-token prefill, then the decode step that emits the token


def stall_run(output: int, statistic: str):
    """Eight sequences decoding on one colocated worker; a 6,000-token prompt arrives at t = 1 s."""
    w = Workload([0.0] * 8 + [1.0], [100] * 8 + [6000], [output] * 8 + [10])
    return simulate(w, M, SimConfig(placement="colocated", colocated=1, itl_statistic=statistic))


def by_id(report) -> dict[str, np.ndarray]:
    order = np.argsort(report.samples["id"])
    return {k: v[order] for k, v in report.samples.items()}


@pytest.mark.parametrize("statistic", ["max", "p99"])
def test_the_chapters_stall_is_eight_itl_breaches(statistic):
    r = stall_run(100, statistic)
    s = by_id(r)
    assert r.itl_breaches == 8
    assert np.allclose(s["itl_max_s"][:8] * 1000, STALL_MS)
    assert np.all(s["itl_stat_s"][:8] * 1000 == pytest.approx(STALL_MS))  # 99 gaps: p99 is the max
    assert s["itl_max_s"][8] * 1000 == pytest.approx(45.0)  # the long prompt itself decodes undisturbed
    assert r.slo_attainment == pytest.approx(1 / 9)
    assert r.gap_ms["max"] == pytest.approx(STALL_MS)
    # The per-request mean hides it: 230 ms spread over 99 gaps.
    assert np.all(s["itl_s"][:8] * 1000 < 150.0)


def test_a_long_output_passes_under_mean_and_p99_but_not_max():
    for statistic, breaches in (("mean", 0), ("p99", 0), ("max", 8)):
        r = stall_run(1000, statistic)
        assert r.itl_breaches == breaches, statistic
        assert r.slo_attainment == pytest.approx(1.0 if breaches == 0 else 1 / 9), statistic
    mean = by_id(stall_run(100, "mean"))
    assert np.array_equal(mean["itl_stat_s"], mean["itl_s"])


def test_disaggregated_decode_sees_only_decode_steps():
    w = mix(3.0, 120.0, output_tokens=(2, 300), seed=2)
    r = simulate(w, M, SimConfig(prefill=2, decode=2))
    assert r.itl_breaches == 0
    assert r.gap_ms["p50"] == pytest.approx(45.0) and r.gap_ms["max"] == pytest.approx(45.0)
    assert r.itl_ms["p99"] == pytest.approx(45.0)


@pytest.mark.parametrize("seed", range(6))
def test_gaps_are_conserved(seed):
    """Each finished request has output - 1 gaps summing to its decode time, whatever the placement."""
    rnd = random.Random(seed)
    w = mix(rnd.uniform(2.0, 8.0), 40.0, long_fraction=rnd.random(), output_tokens=(1, 400), seed=seed)
    models = StageModels(decode=DecodeModel(30.0, rnd.choice([0.0, 1.5]), rnd.choice([4, 32])))
    cfg = SimConfig(
        placement=rnd.choice(["disaggregated", "colocated", "conditional"]),
        prefill=rnd.randint(1, 3),
        decode=rnd.randint(1, 3),
        chunked=rnd.random() < 0.5,
        seed=seed,
    )
    r = simulate(w, models, cfg)
    assert r.completed == len(w)
    out = w.output_tokens[r.samples["id"]].astype(float)
    gaps = np.maximum(out - 1, 0)
    s = r.samples
    # the histogram holds every gap once; their sum is each request's time from first to last token
    assert r.gap_ms["mean"] == pytest.approx(1000 * float((s["itl_s"] * gaps).sum() / gaps.sum()), rel=1e-9)
    assert np.all(s["itl_max_s"] >= s["itl_p99_s"] - 1e-12)
    assert np.all(s["itl_max_s"] >= s["itl_s"] - 1e-9)
    assert np.all((s["itl_max_s"] > 0) == (out > 1))


def test_gap_summary_nearest_rank():
    assert gap_summary([(0.045, 99), (0.275, 1)]) == (100, pytest.approx(99 * 0.045 + 0.275), 0.045, 0.275)
    assert gap_summary([(0.045, 98), (0.275, 1)])[2] == 0.275  # 99 gaps: rank 99 is the largest
    assert gap_summary([(0.3, 1), (0.1, 300), (0.2, 2)])[2] == 0.1  # runs in any order
    assert gap_summary(None) == (0, 0.0, 0.0, 0.0)


def test_gap_histogram_percentiles():
    h = GapHistogram()
    h.add(0.045, 990)
    h.add(0.3, 10)
    assert h.percentile(0.99) == pytest.approx(0.045)
    assert h.percentile(0.995) == pytest.approx(0.3)
    assert h.summary_ms()["max"] == pytest.approx(300.0)
    h.add(0.0451)  # same 1 % bin: the bin's mean, within 1 %
    assert h.percentile(0.5) == pytest.approx(0.045, rel=0.01)
    assert np.isnan(GapHistogram().percentile(0.5))


def test_evaluate_attainment_uses_the_statistic():
    w = poisson(3.0, 300.0, prompt_tokens=(200, 800), output_tokens=(20, 200), seed=3)
    models = StageModels(decode=DecodeModel(40.0, 3.0, 32))  # gaps grow with the batch
    out = {}
    for statistic in ("mean", "max"):
        s = EvalSettings(models=models, slo=SLO(0.6, 0.07, 0.99, statistic), startup_s=30.0)
        out[statistic] = run_policy("static", w, s).metrics
    assert out["max"]["itl_p50_s"] > out["mean"]["itl_p50_s"]
    assert out["max"]["gpu_hours"] == out["mean"]["gpu_hours"]  # same fleet: only the verdict differs


def test_flag_and_choices(capsys):
    assert tuple(sorted(ITL_STATISTIC_CHOICES)) == tuple(sorted(ITL_STATISTICS))
    argv = ["simulate", "--duration", "20", "--placement", "colocated", "--output", "json", "--quiet"]
    assert main([*argv, "--itl-statistic", "mean"]) == 0
    res = json.loads(capsys.readouterr().out)["results"][0]
    assert res["itl_statistic"] == "mean" and res["config"]["itl_statistic"] == "mean"
    assert set(res["gap_ms"]) >= {"p50", "p99", "max"}
    with pytest.raises(SystemExit):
        main([*argv, "--itl-statistic", "median"])
    with pytest.raises(ValueError, match="ITL statistic"):
        SimConfig(itl_statistic="median").validate()
    with pytest.raises(ValueError, match="ITL statistic"):
        SLO(itl_statistic="p50")


def test_plan_cli_takes_the_statistic_from_flag_and_spec(tmp_path, capsys):
    argv = ["plan", "--arrival-rate", "4", "--placement", "colocated", "--output", "json"]
    replicas = {}
    for statistic in ("mean", "max"):
        assert main([*argv, "--itl-statistic", statistic]) == 0
        doc = json.loads(capsys.readouterr().out)
        assert doc["slo"]["itl_statistic"] == statistic
        replicas[statistic] = doc["pools"]["colocated"]["replicas"]
    assert replicas["mean"] <= 5 < 100 < replicas["max"]  # one 230 ms stall per request breaches under max
    sample = (ROOT / "config/samples/vllm-disaggregated-70b.yaml").read_text()
    assert "    itlSeconds: 0.15\n" in sample
    spec = tmp_path / "dd.yaml"
    spec.write_text(
        sample.replace("    itlSeconds: 0.15\n", "    itlSeconds: 0.15\n    itlStatistic: mean\n")
    )
    from_file = {}
    for extra in ([], ["--itl-statistic", "max"]):
        code = main([*argv, "--from", str(spec), *extra])
        doc = json.loads(capsys.readouterr().out)
        assert code == (0 if doc["feasible"] else 1)  # the sample's maxReplicas cannot meet max
        from_file[doc["slo"]["itl_statistic"]] = doc["pools"]["colocated"]["replicas"]
    assert set(from_file) == {"mean", "max"} and from_file["mean"] < from_file["max"]  # the flag wins


def test_trimming_the_gap_log_changes_nothing(monkeypatch):
    """The per-worker gap log is trimmed to the oldest running sequence: same gaps, bounded memory."""
    from disagg.sim.workers import ServeWorker

    w = mix(6.0, 60.0, long_fraction=0.3, output_tokens=(1, 400), seed=3)
    models = StageModels(decode=DecodeModel(30.0, 1.5, 16))
    cfg = SimConfig(placement="colocated", colocated=2)
    full = simulate(w, models, cfg)
    longest = {}
    real_trim = ServeWorker._trim_log

    def trim(self):
        real_trim(self)
        longest[self.name] = max(longest.get(self.name, 0), len(self.log_k))

    monkeypatch.setattr(ServeWorker, "LOG_TRIM", 8)
    monkeypatch.setattr(ServeWorker, "_trim_log", trim)
    small = simulate(w, models, cfg)
    assert longest  # it did trim
    for k in ("itl_s", "itl_p99_s", "itl_max_s"):
        assert np.array_equal(full.samples[k], small.samples[k]), k
    assert full.gap_ms == small.gap_ms
