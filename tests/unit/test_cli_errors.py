"""Every CLI mistake gets one clear line `disagg <command>: error: ...` and a non-zero exit.

Exit 2 for bad input, 1 for a run that could not do its job; the checks run before any long
work starts (no simulation, no emulator, no Kopf). A closed stdout pipe is not an error.
Most cases run `disagg.cli.main` in-process; the pipe and `python -m disagg.cli` cases use a
subprocess.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from disagg.cli import build_parser, main
from disagg.commands import checks

ROOT = Path(__file__).resolve().parents[2]
AZURE_CSV = "TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(
    f"2023-11-16 18:15:{10 + i:02d}.0,{300 + 10 * i},{20 + i}\n" for i in range(20)
)


def one_error_line(capsys, command: str) -> str:
    """stderr is exactly one `disagg <command>: error: ...` line; returns it."""
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith(f"disagg {command}: error: "), err[0]
    return err[0]


def cli_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT / "operator") + os.pathsep + env.get("PYTHONPATH", "")
    return env


# --- usage errors (exit 2), one per mistake -------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (
            ["emulate", "--standalone", "--spec", "/nonexistent.yaml"],
            "--spec /nonexistent.yaml: No such file",
        ),
        (["emulate", "--standalone", "--metrics-port", "99999"], "--metrics-port 99999: a port is 0..65535"),
        (["run", "--metrics-port", "-1"], "--metrics-port -1: a port is 0..65535"),
        (["dashboard", "--port", "70000"], "--port 70000"),
        (["simulate", "--requests", "-3"], "--requests must be >= 1, got -3"),
        (["simulate", "--requests", "0"], "--requests must be >= 1, got 0"),
        (["simulate", "--requests", "5", "--duration", "10"], "not both"),
        (["evaluate", "--trace", "t.csv", "--limit", "-1"], "--limit must be >= 2"),
        (["run", "--kubeconfig", "/nonexistent"], "--kubeconfig /nonexistent: no such file"),
        (["emulate", "--kubeconfig", "/nonexistent"], "--kubeconfig /nonexistent: no such file"),
        (["emulate", "--standalone", "--duration", "-1"], "--duration must be >= 0"),
        (["emulate", "--standalone", "--prefill", "0"], "needs at least one prefill and one decode pod"),
        (["emulate", "--standalone", "--decode", "-2"], "--decode must be >= 0"),
        (["emulate", "--prefill", "2"], "--prefill does not apply without --standalone"),
        (
            ["emulate", "--standalone", "--poll-interval", "1"],
            "--poll-interval does not apply with --standalone",
        ),
        (
            ["simulate", "--burst-duty", "0.5"],
            "--burst-duty applies to --workload burst, not mix (the default)",
        ),
        (
            ["simulate", "--workload", "poisson", "--long-tokens", "9000"],
            "applies to --workload burst or mix",
        ),
        (
            ["simulate", "--workload", "mix", "--prompt-tokens", "9"],
            "--prompt-tokens applies to --workload poisson",
        ),
        (
            ["simulate", "--prefix-cache-tokens", "100000"],
            "--prefix-cache-tokens needs a trace with prefix hash ids",
        ),
        (["simulate", "--workload", "burst", "--limit", "3"], "--limit applies to --workload trace"),
        (
            ["simulate", "--workload", "trace", "--rate", "3"],
            "--rate applies to --workload poisson, burst or mix",
        ),
        (["emulate", "--trace", "t.csv", "--rate", "3"], "--rate does not apply with --trace"),
        (["emulate", "--time-scale", "0.5"], "--time-scale does not apply without --trace"),
        (["emulate", "--rate", "3", "--schedule", "0:1,60:4"], "give --rate or --schedule, not both"),
        # sizes that would exhaust memory are refused by name, before anything is drawn
        (
            ["simulate", "--rate", "1e6"],
            "--rate 1e+06 req/s for --duration 300 s is about 300,000,000 requests",
        ),
        (["simulate", "--requests", "100000000"], "--requests 100,000,000 is over 20,000,000"),
        (
            ["simulate", "--workload", "burst", "--burst-rate", "1e7"],
            "--burst-rate 1e+07 req/s for --duration 300 s is about 3,000,000,000 requests",
        ),
        (["plan", "--input-tokens", "1e12"], "--input-tokens: prompt_tokens_mean must be <= 10,000,000"),
        # flags that would be ignored
        (
            ["simulate", "--placement", "disaggregated", "--sweep-threshold"],
            "--sweep-threshold applies to --placement conditional (or all), not disaggregated",
        ),
        (
            ["simulate", "--placement", "colocated", "--split-threshold", "100"],
            "--split-threshold applies to --placement conditional (or all), not colocated",
        ),
        (["simulate", "--admit-fraction", "0"], "--admit-fraction must be in (0, 1]"),
        (
            ["evaluate", "--trace", "t.csv", "--split-threshold", "100"],
            "--split-threshold applies to --placement conditional, not disaggregated",
        ),
        # a bad setting names the flag that set it, not an internal field
        (["evaluate", "--trace", "t.csv", "--decode-gpus-per-replica", "0"], "--decode-gpus-per-replica: "),
        (["evaluate", "--trace", "t.csv", "--interval", "1e9"], "--interval: "),
        (["evaluate", "--trace", "t.csv", "--percentile", "99"], "--percentile: percentile must be < 1"),
        (["evaluate", "--trace", "t.csv", "--ttft", "0"], "--ttft: ttft_s must be > 0"),
        (["evaluate", "--trace", "t.csv", "--ttft-per-1k", "-1"], "--ttft-per-1k: ttft_s_per_1k_tokens"),
        # a target no fleet meets: refused before the trace is read (every policy would score 0)
        (
            ["evaluate", "--trace", "t.csv", "--itl", "0.02"],
            "--itl: itl_s 0.02 s is below one decode step at batch 1 (0.045 s by the decode model)",
        ),
        (["plan", "--ttft", "-1"], "--ttft must be > 0, got -1.0"),
        (["plan", "--ttft-per-1k", "-1"], "--ttft-per-1k"),
    ],
)
def test_usage_errors_exit_2_with_one_line(capsys, argv, fragment):
    assert main(argv) == 2
    assert fragment in one_error_line(capsys, argv[0])


def test_a_trace_that_is_a_directory_or_too_large_a_scale_is_refused(capsys, tmp_path):
    assert main(["simulate", "--workload", "trace", "--trace", str(tmp_path)]) == 2
    assert f"cannot read {tmp_path}: Is a directory" in one_error_line(capsys, "simulate")
    trace = tmp_path / "t.csv"
    trace.write_text(AZURE_CSV)
    assert main(["evaluate", "--trace", str(trace), "--rate-scale", "2000000"]) == 2
    assert (
        "--rate-scale 2000000: 2000000 copies of 20 requests is about 40,000,000 requests"
        in one_error_line(capsys, "evaluate")
    )
    assert main(["evaluate", "--trace", str(trace), "--rate-scale", "2000000", "--workload", "diurnal"]) == 2
    assert "--rate-scale 2000000: that arrival process is about" in one_error_line(capsys, "evaluate")


def test_evaluate_refuses_a_ttft_target_no_request_can_meet(capsys, tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text(AZURE_CSV)  # prompts of 300-490 tokens: 0.09-0.1 s on an idle pipeline
    assert main(["evaluate", "--trace", str(trace), "--policy", "static", "--ttft", "0.09"]) == 2
    line = one_error_line(capsys, "evaluate")
    assert "--ttft / --ttft-per-1k: every one of the 20 requests misses the TTFT target (0.09 s)" in line
    # a target that some of them meet is evaluated (those out of reach are counted apart)
    argv = ["evaluate", "--trace", str(trace), "--policy", "static", "--no-best-static", "--ttft", "0.095"]
    assert main([*argv, "-o", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["policies"]["static"]["infeasible_requests"] == 13


def test_plot_with_a_wrong_extension_is_refused_before_simulating(capsys, tmp_path):
    out = tmp_path / "x.txt"
    # a workload that would take long to simulate: refused before it starts
    assert main(["simulate", "--requests", "2000000", "--quiet", "--plot", str(out)]) == 2
    assert "--plot writes a PNG" in one_error_line(capsys, "simulate")
    assert not out.exists()


def test_dashboard_refuses_a_json_file_that_is_no_result(capsys, tmp_path):
    junk = tmp_path / "junk.json"
    junk.write_text(json.dumps({"hello": [1, 2, 3]}))
    assert main(["dashboard", "--from", str(junk), "--port", "0"]) == 2
    assert "no pools to show" in one_error_line(capsys, "dashboard")
    notjson = tmp_path / "notjson.json"
    notjson.write_text("hello")
    assert main(["dashboard", "--from", str(notjson), "--port", "0"]) == 2
    assert "not JSON" in one_error_line(capsys, "dashboard")


def test_dashboard_check_accepts_a_simulate_result(capsys, tmp_path):
    assert (
        main(["simulate", "--requests", "20", "--placement", "disaggregated", "--output", "json", "--quiet"])
        == 0
    )
    result = tmp_path / "sim.json"
    result.write_text(capsys.readouterr().out)
    args = build_parser().parse_args(["dashboard", "--from", str(result)])
    checks.check("dashboard", args, {"from_file"})  # no UsageError


def test_prefix_cache_needs_the_traces_hash_ids(capsys, tmp_path):
    azure = tmp_path / "azure.csv"
    azure.write_text(AZURE_CSV)
    argv = ["simulate", "--workload", "trace", "--trace", str(azure), "--quiet"]
    assert main([*argv, "--prefix-cache-tokens", "100000"]) == 2
    assert "has none" in one_error_line(capsys, "simulate")
    mooncake = tmp_path / "mooncake.jsonl"
    mooncake.write_text(
        "".join(
            json.dumps({"timestamp": 500 * i, "input_length": 1024, "output_length": 8, "hash_ids": [0, i]})
            + "\n"
            for i in range(10)
        )
    )
    argv = ["simulate", "--workload", "trace", "--trace", str(mooncake), "--placement", "disaggregated"]
    assert main([*argv, "--quiet", "--prefix-cache-tokens", "100000"]) == 0


def test_workload_flags_are_accepted_where_they_apply():
    parser = build_parser()
    for argv in (
        ["simulate", "--workload", "burst", "--burst-duty", "0.5", "--long-tokens", "9000"],
        ["simulate", "--workload", "poisson", "--requests", "10", "--prompt-tokens", "9"],
        ["simulate", "--workload", "trace", "--trace", "t.csv", "--limit", "3", "--time-scale", "0.5"],
    ):
        sub = checks.given_options(parser._subparsers._group_actions[0].choices["simulate"], argv[1:])
        checks.check("simulate", parser.parse_args(argv), sub)  # no UsageError


def test_standalone_colocated_spec_needs_no_prefill(tmp_path):
    spec = tmp_path / "colocated.yaml"
    spec.write_text("spec:\n  placement: {mode: colocated}\n")
    argv = ["emulate", "--standalone", "--spec", str(spec), "--prefill", "0"]
    checks.check("emulate", build_parser().parse_args(argv), {"standalone", "spec", "prefill"})
    disagg_spec = tmp_path / "disaggregated.yaml"
    disagg_spec.write_text("spec:\n  placement: {mode: disaggregated}\n")
    argv = ["emulate", "--standalone", "--spec", str(disagg_spec), "--prefill", "0"]
    with pytest.raises(checks.UsageError, match="disaggregated fleet needs"):
        checks.check("emulate", build_parser().parse_args(argv), {"standalone", "spec", "prefill"})


def test_given_options_counts_typed_flags_not_defaults():
    sub = build_parser()._subparsers._group_actions[0].choices["simulate"]
    assert checks.given_options(sub, []) == set()
    assert checks.given_options(sub, ["--burst-duty=0.25"]) == {"burst_duty"}  # the default value, typed
    assert checks.given_options(sub, ["--burst-d", "0.3", "--quiet"]) == {
        "burst_duty",
        "quiet",
    }  # abbreviated
    run = build_parser()._subparsers._group_actions[0].choices["run"]
    assert checks.given_options(run, ["-n", "a", "-n", "b"]) == {"namespace"}  # append action


# --- failed runs (exit 1) ---------------------------------------------------------------------


def test_plan_exits_1_when_no_plan_meets_the_slo_and_says_why(capsys):
    assert main(["plan", "--ttft", "0.05"]) == 1
    captured = capsys.readouterr()
    assert "feasible NO" in captured.out  # the plan is still printed
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("disagg plan: error: no plan meets the SLO: ")
    assert "below the bare pipeline latency" in err[0]
    assert main(["plan", "--arrival-rate", "10", "--gpu-budget", "8", "--output", "json"]) == 1
    captured = capsys.readouterr()
    assert json.loads(captured.out)["feasible"] is False
    assert "gpu_budget 8 admits" in captured.err
    assert main(["plan"]) == 0  # the worked example is feasible


def test_run_with_an_unusable_kubeconfig_exits_1_before_kopf_starts(capsys, tmp_path):
    bad = tmp_path / "kubeconfig"
    bad.write_text("just a string\n")
    assert main(["run", "--kubeconfig", str(bad), "--metrics-port", "0", "--liveness-port", "0"]) == 1
    assert f"cannot load --kubeconfig {bad}: not a kubeconfig" in one_error_line(capsys, "run")


# --- through the interpreter: `python -m disagg.cli` -------------------------------------------


def test_module_entry_point_prints_usage_errors_as_one_line():
    proc = subprocess.run(
        [sys.executable, "-m", "disagg.cli", "simulate", "--requests", "-3"],
        capture_output=True,
        text=True,
        env=cli_env(),
        timeout=60,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip() == "disagg simulate: error: --requests must be >= 1, got -3"


def test_closed_pipe_is_not_an_error():
    """`disagg plan --sweep ... | head -1`: the reader leaves early; no traceback, exit 0."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "disagg.cli", "plan", "--sweep", "0.5:400:0.25"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=cli_env(),
    )
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.readline()  # like `head -1`
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 0, err
    assert err == ""


def test_no_command_prints_usage_to_stderr_and_exits_2(capsys):
    assert main([]) == 2
    out = capsys.readouterr()
    assert out.out == "" and "usage: disagg" in out.err


def test_simulate_json_names_the_colocated_workers_that_ran(capsys):
    """`colocated` 0 in the flags means prefill + decode workers; the report gives the count."""
    assert main(["simulate", "--requests", "20", "--prefill", "2", "--decode", "3", "-o", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert {r["placement"]: r["config"]["colocated"] for r in doc["results"]} == {
        "colocated": 5,
        "disaggregated": 5,
        "conditional": 5,
    }
