"""The trace flags the commands share: formats by their first line, a time window, failed requests."""

from __future__ import annotations

import json

import pytest

from disagg.cli import main

BURSTGPT = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n" + "".join(
    # one request a second for 10 minutes; every 50th failed (no response)
    f"{i},ChatGPT,{200 + i},{0 if i % 50 == 7 else 20},{220 + i},Conversation log\n"
    for i in range(600)
)


def simulated(capsys, argv: list[str]) -> tuple[dict, str]:
    assert main(["simulate", "--workload", "trace", *argv, "--output", "json"]) == 0
    out = capsys.readouterr()
    return json.loads(out.out), out.err


def test_simulate_reads_a_window_of_a_burstgpt_trace_and_says_what_it_left_out(capsys, tmp_path):
    trace = tmp_path / "BurstGPT_1.csv"
    trace.write_text(BURSTGPT)
    whole, err = simulated(capsys, ["--trace", str(trace)])
    assert whole["workload"]["requests"] == 600 - 12
    assert "left out 12 failed requests (no output tokens)" in err
    part, err = simulated(capsys, ["--trace", str(trace), "--trace-start", "2m", "--trace-duration", "180"])
    # seconds 120..299 of the trace: 180 rows, of which 157, 207 and 257 failed
    assert part["workload"]["requests"] == 177
    assert part["workload"]["duration_s"] == pytest.approx(179.0)
    assert "read 177 requests from 120 s to 300 s after the first" in err
    assert "left out 3 failed requests" in err


@pytest.mark.parametrize(
    ("extra", "fragment"),
    [
        (["--trace-start", "soon"], "--trace-start: not a duration: 'soon' (seconds, or e.g. 90m, 2h, 1d)"),
        (["--trace-duration=-5m"], "--trace-duration: a duration must be finite and >= 0"),
        (["--trace-duration", "0"], "--trace-duration must be > 0, got 0"),
        (["--format", "mooncake"], "cannot read trace: "),
    ],
)
def test_bad_trace_flags_are_refused_with_the_reason(capsys, tmp_path, extra, fragment):
    trace = tmp_path / "b.csv"
    trace.write_text(BURSTGPT)
    try:
        code = main(["simulate", "--workload", "trace", "--trace", str(trace), *extra])
    except SystemExit as exc:  # a value argparse's type check refuses: its usage line, then the error
        code = exc.code
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("disagg simulate: error: ") and fragment in err[-1], err


def test_window_flags_need_a_trace(capsys):
    assert main(["simulate", "--workload", "poisson", "--trace-start", "60"]) == 2
    assert "--trace-start applies to --workload trace" in capsys.readouterr().err
    assert main(["emulate", "--standalone", "--trace-duration", "1h"]) == 2
    assert "--trace-duration" in capsys.readouterr().err


def test_evaluate_refuses_a_malformed_trace_with_its_line(capsys, tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2024-05-10 00:00:00+00:00,5,5\nnonsense,1,1\n")
    assert main(["evaluate", "--trace", str(trace)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "t.csv:3: cannot parse" in err[0], err


def test_evaluate_runs_on_a_window_and_records_it(capsys, tmp_path):
    trace = tmp_path / "BurstGPT_1.csv"
    trace.write_text(BURSTGPT)
    argv = ["evaluate", "--trace", str(trace), "--trace-start", "2m", "--trace-duration", "3m"]
    assert main([*argv, "--policy", "static", "--no-best-static", "--output", "json"]) == 0
    out = capsys.readouterr()
    doc = json.loads(out.out)
    assert doc["workload"]["requests"] == 177
    assert (doc["settings"]["trace_start_s"], doc["settings"]["trace_duration_s"]) == (120.0, 180.0)
    assert "left out 3 failed requests" in out.err
