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
