"""`disagg plan` through disagg.cli.main."""

from __future__ import annotations

import json

import pytest

from disagg.cli import main

TEMPLATE = {"spec": {"containers": [{"name": "engine", "image": "vllm/vllm-openai:latest"}]}}


def run_json(capsys, *argv: str) -> dict:
    rc = main(["plan", "--output", "json", *argv])
    doc = json.loads(capsys.readouterr().out)
    assert rc == (0 if doc.get("feasible", True) else 1)  # exit 1: no plan meets the SLO
    return doc


def test_json_keys_and_worked_example_values(capsys):
    d = run_json(capsys, "--arrival-rate", "4")
    for pool in ("prefill", "decode", "encoder"):
        for key in ("replicas", "capacity_rps", "utilization"):
            assert key in d["pools"][pool]
    assert d["pools"]["prefill"]["capacity_rps"] == pytest.approx(4.348, abs=1e-3)
    assert d["pools"]["decode"]["capacity_rps"] == pytest.approx(1.778, abs=1e-3)
    assert d["stages"]["prefill"]["service_ms"] == pytest.approx(230.0)
    assert d["stages"]["transfer"]["kv_bytes"] == 1_966_080_000
    assert d["stages"]["transfer"]["serial_ms"] == pytest.approx(95.23, abs=0.01)
    assert d["stages"]["transfer"]["chunked_ms"] == pytest.approx(39.74, abs=0.01)
    assert d["ratio"]["capacity_decode_per_prefill"] == pytest.approx(2.445, abs=1e-3)
    assert (
        d["ratio"]["decode_per_prefill"]
        == d["pools"]["decode"]["replicas"] / d["pools"]["prefill"]["replicas"]
    )
    assert d["predicted"]["ttft_s"] <= 0.6
    assert d["predicted"]["itl_s"] == pytest.approx(0.045)
    assert d["feasible"] is True
    assert d["schema"] == "disagg.plan/v1"


def test_table_output(capsys):
    assert main(["plan"]) == 0
    out = capsys.readouterr().out
    assert "prefill" in out and "decode" in out and "feasible yes" in out
    assert "230.0 ms" in out and "95.23 ms" in out


def test_chunked_flag_lowers_floor(capsys):
    d = run_json(capsys, "--chunked")
    assert d["best_achievable"]["ttft_s"] == pytest.approx(0.31474, abs=1e-4)


def test_budget_flag(capsys):
    d = run_json(capsys, "--arrival-rate", "10", "--gpu-budget", "8")
    assert d["gpus"]["total"] <= 8
    assert d["budget"]["limited"] is True
    assert d["feasible"] is False
    assert d["budget"]["shed_rps"] > 0


def test_infeasible_ttft(capsys):
    d = run_json(capsys, "--ttft", "0.3")
    assert d["feasible"] is False
    assert d["best_achievable"]["ttft_s"] == pytest.approx(0.37023, abs=1e-4)


def test_placement_conditional(capsys):
    d = run_json(capsys, "--placement", "conditional", "--input-tokens", "500", "--arrival-rate", "2")
    assert d["placement"] == "conditional"
    assert set(d["pools"]) == {"encoder", "prefill", "decode"}
    assert d["conditional"]["split_threshold_tokens"] == pytest.approx(2428.57, abs=0.01)


def test_pool_bound_flags(capsys):
    d = run_json(capsys, "--decode-min-replicas", "3", "--decode-gpus-per-replica", "2")
    assert d["pools"]["decode"]["replicas"] >= 3
    assert d["pools"]["decode"]["gpus"] == 2 * d["pools"]["decode"]["replicas"]


def test_sweep_table_json_and_plot(capsys, tmp_path):
    assert main(["plan", "--sweep", "0:10:5"]) == 0
    out = capsys.readouterr().out
    assert len([ln for ln in out.splitlines() if ln.strip()]) == 4
    d = run_json(capsys, "--sweep", "0:10:5")
    assert [p["demand"]["arrival_rps"] for p in d["points"]] == [0.0, 5.0, 10.0]
    png = tmp_path / "sweep.png"
    assert main(["plan", "--sweep", "0:20:2", "--plot", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    "argv,fragment",
    [
        (["--arrival-rate", "-1"], "--arrival-rate"),
        (["--link-gibps", "0"], "--link-gibps"),
        (["--decode-slots", "0"], "--decode-slots"),
        (["--percentile", "1.5"], "--percentile"),
        (["--sweep", "5:1:1"], "--sweep"),
        (["--sweep", "a:b:c"], "--sweep"),
        (["--plot", "x.png"], "--plot needs --sweep"),
        (["--gpu-budget", "0"], "--gpu-budget"),
        (["--prefill-min-replicas", "5", "--prefill-max-replicas", "2"], "min_replicas"),
        (["--from", "/nonexistent/file.yaml"], "--from"),
    ],
)
def test_bad_input_one_line_exit_2(capsys, argv, fragment):
    rc = main(["plan", *argv])
    err = capsys.readouterr().err
    assert rc == 2
    assert fragment in err
    assert len(err.strip().splitlines()) == 1


def write_yaml(tmp_path, spec: dict) -> str:
    import yaml

    doc = {
        "apiVersion": "disagg.dev/v1alpha1",
        "kind": "DisaggDeployment",
        "metadata": {"name": "x"},
        "spec": spec,
    }
    path = tmp_path / "dd.yaml"
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def test_from_file(capsys, tmp_path):
    spec = {
        "engine": "vllm",
        "model": "atlas",
        "pools": {
            "prefill": {
                "minReplicas": 2,
                "maxReplicas": 8,
                "gpusPerReplica": 2,
                "template": TEMPLATE,
                "serviceModel": {"fixedMs": 20, "msPerToken": 0.035},
            },
            "decode": {
                "minReplicas": 1,
                "maxReplicas": 16,
                "template": TEMPLATE,
                "serviceModel": {"stepFixedMs": 45, "slots": 32},
            },
        },
        "kvTransfer": {"bytesPerToken": 327680, "linkSetupMs": 12, "bandwidthGiBps": 22, "chunkTokens": 2000},
        "slo": {"ttftSeconds": 0.6, "itlSeconds": 0.15, "percentile": 0.9},
        "autoscaling": {"gpuBudget": 40},
    }
    path = write_yaml(tmp_path, spec)
    d = run_json(capsys, "--from", path, "--arrival-rate", "4")
    assert d["pools"]["prefill"]["replicas"] >= 2
    assert d["pools"]["prefill"]["gpus"] == 2 * d["pools"]["prefill"]["replicas"]
    assert d["gpus"]["budget"] == 40
    assert d["stages"]["transfer"]["serial_ms"] == pytest.approx(95.23, abs=0.01)
    # explicit flags override the file
    d2 = run_json(capsys, "--from", path, "--prefill-gpus-per-replica", "1")
    assert d2["pools"]["prefill"]["gpus_per_replica"] == 1


def test_from_file_invalid(capsys, tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("spec: [1, 2\n")
    assert main(["plan", "--from", str(path)]) == 2
    assert "--from" in capsys.readouterr().err


def test_a_colocated_plan_made_large_by_prefill_stalls_says_so_and_offers_the_disaggregated_one(capsys):
    """At the max-gap ITL statistic every prefill on a colocated worker (230 ms) breaches the
    0.15 s target for the requests decoding there, so the plan is huge; the text says why and
    what the disaggregated pools would take."""
    disaggregated = run_json(capsys, "--arrival-rate", "8")["gpus"]["total"]
    assert main(["plan", "--arrival-rate", "8", "--placement", "colocated"]) == 0
    text = capsys.readouterr().out
    assert "no KV transfer (colocated)" in text and "GiB" not in text
    assert "each prefill stalls the decodes running on its colocated worker for 230 ms" in text
    assert f"Disaggregated pools need {disaggregated} GPUs (--placement disaggregated)" in text
    assert main(["plan", "--arrival-rate", "8", "--placement", "colocated", "--itl-statistic", "mean"]) == 0
    assert "note:" not in capsys.readouterr().out  # the mean gap absorbs the stall: no note


# --------------------------------------------------------------------------- --trace

# 72 requests of 400 prompt tokens and 8 of 30,000, whose own prefill (20 + 0.035 x 30,000 ms)
# is longer than the 0.6 s TTFT target: they miss even on an idle system. One request a second
# for a minute, then 20 in ten seconds two minutes in: the busiest 60 s hold 60 requests, the
# trace's mean rate is 80 / 129.5 s.
LONG_PROMPT = 30_000


def write_trace(tmp_path) -> str:
    times = [float(i) for i in range(60)] + [120.0 + 0.5 * i for i in range(20)]
    prompts = [LONG_PROMPT if i % 10 == 9 else 400 for i in range(80)]
    rows = "".join(
        f"2023-11-16 18:{int(t // 60):02d}:{t % 60:09.6f},{p},{50 + i % 7}\n"
        for i, (t, p) in enumerate(zip(times, prompts, strict=True))
    )
    path = tmp_path / "trace.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + rows)
    return str(path)


def test_trace_plans_over_the_requests_sizes_at_the_busiest_minute(capsys, tmp_path):
    trace = write_trace(tmp_path)
    d = run_json(capsys, "--trace", trace)
    tr = d["trace"]
    assert tr["requests"] == 80
    assert tr["busiest_rps"] == pytest.approx(1.0)  # 60 requests in the busiest 60 s
    assert tr["mean_rps"] == pytest.approx(80 / 129.5)
    assert tr["rate_from"] == "busiest window"
    assert d["demand"]["arrival_rps"] == pytest.approx(1.0)
    assert d["demand"]["prompt_tokens_mean"] == pytest.approx((72 * 400 + 8 * LONG_PROMPT) / 80)
    # the long prompts are a size class of their own: a tenth of the requests, out of reach
    assert d["stages"]["sizes"]["idle_miss_fraction"] == pytest.approx(0.1)
    # the same mean and spread as flags describe one request shape: no class is out of reach
    mean_only = run_json(
        capsys,
        "--arrival-rate",
        "1",
        "--input-tokens",
        str(d["demand"]["prompt_tokens_mean"]),
        "--input-tokens-std",
        str(d["demand"]["prompt_tokens_std"]),
    )
    assert "sizes" not in mean_only["stages"]


def test_trace_rate_flag_sweep_and_table(capsys, tmp_path):
    trace = write_trace(tmp_path)
    d = run_json(capsys, "--trace", trace, "--arrival-rate", "3")
    assert d["demand"]["arrival_rps"] == 3.0
    assert d["trace"]["rate_from"] == "arrival-rate"
    assert main(["plan", "--trace", trace, "--output", "json", "--sweep", "1:3:1"]) in (0, 1)
    doc = json.loads(capsys.readouterr().out)
    assert [p["demand"]["arrival_rps"] for p in doc["points"]] == [1.0, 2.0, 3.0]
    assert all(p["stages"]["sizes"]["idle_miss_fraction"] == pytest.approx(0.1) for p in doc["points"])
    assert doc["trace"]["requests"] == 80
    main(["plan", "--trace", trace])
    out = capsys.readouterr().out
    assert "80 requests over 130 s" in out and "busiest 60 s 1 rps" in out
    assert "planned over the requests' sizes at 1 rps, the busiest 60 s" in out
    assert "10.00 % miss even on an idle system" in out


@pytest.mark.parametrize(
    ("extra", "fragment"),
    [
        (["--input-tokens", "500"], "--input-tokens does not apply with --trace"),
        (["--output-tokens-std", "5"], "--output-tokens-std does not apply with --trace"),
    ],
)
def test_trace_refuses_the_shape_flags_it_replaces(capsys, tmp_path, extra, fragment):
    assert main(["plan", "--trace", write_trace(tmp_path), *extra]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and fragment in err[0]


def test_trace_flags_without_a_trace_and_too_short_a_trace(capsys, tmp_path):
    assert main(["plan", "--trace-start", "1h"]) == 2
    assert "--trace-start does not apply without --trace" in capsys.readouterr().err
    short = tmp_path / "short.csv"
    short.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        + "".join(f"2023-11-16 18:15:{10 + i:02d}.0,300,20\n" for i in range(5))
    )
    assert main(["plan", "--trace", str(short)]) == 2
    err = capsys.readouterr().err
    assert "5 requests; a size distribution needs at least 20" in err
    assert len(err.strip().splitlines()) == 1
