"""disagg.loadgen: aiperf's command line, its rate schedule, and the client checks read from its records."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from disagg import loadgen


def test_a_step_schedule_becomes_a_piecewise_linear_rate_series_with_sharp_steps():
    pts = loadgen.rate_series("0:2,25:8,85:2", 170)["points"]
    assert [(p["time_s"], p["qps"]) for p in pts] == [
        (0, 2),
        (25 - loadgen.STEP_S, 2),
        (25, 8),
        (85 - loadgen.STEP_S, 8),
        (85, 2),
        (170, 2),
    ]
    times = [p["time_s"] for p in pts]
    assert times == sorted(set(times)), "aiperf needs strictly increasing times"
    # a constant rate is two points; steps past the duration are dropped
    assert loadgen.rate_series("0:5", 60)["points"] == [
        {"time_s": 0.0, "qps": 5.0},
        {"time_s": 60, "qps": 5.0},
    ]
    assert [p["qps"] for p in loadgen.rate_series("0:1,60:4", 30)["points"]] == [1, 1]


@pytest.mark.parametrize(
    ("schedule", "message"),
    [("5:1", "starts at 0"), ("0:1,0:2", "increase"), ("0:0", "rate > 0"), ("0-1", "SECONDS:RATE")],
)
def test_a_bad_schedule_is_refused_with_a_clear_message(schedule, message):
    with pytest.raises(ValueError, match=message):
        loadgen.parse_schedule(schedule)


def test_the_command_streams_chat_at_a_bounded_fixed_rate_with_the_local_tokenizer(tmp_path):
    load = loadgen.Load("http://127.0.0.1:8090/v1", tmp_path / "art", rate=4, request_count=20)
    cmd = load.prepare()
    assert cmd[:2] == [str(loadgen.binary()), "profile"]

    def arg(flag):
        return cmd[cmd.index(flag) + 1]

    assert arg("--url") == "http://127.0.0.1:8090"
    assert "--streaming" in cmd and arg("--endpoint-type") == "chat"
    assert arg("--request-rate") == "4" and arg("--arrival-pattern") == "constant"
    assert arg("--request-count") == "20"
    assert arg("--tokenizer") == str(loadgen.tokenizer_dir())
    assert "--use-server-token-count" in cmd and "--no-gpu-telemetry" in cmd
    assert "--request-rate-series" not in cmd

    sched = loadgen.Load("http://127.0.0.1:8090/v1", tmp_path / "s", schedule="0:1,10:3", duration_s=30)
    cmd = sched.prepare()
    series = json.loads(Path(cmd[cmd.index("--request-rate-series") + 1]).read_text())
    assert series == loadgen.rate_series("0:1,10:3", 30)
    assert "--request-rate" not in cmd, "aiperf refuses a rate beside a rate series"
    assert cmd[cmd.index("--benchmark-duration") + 1] == "30"


def test_the_run_writes_its_dataset_files_in_its_artifact_directory_not_the_system_tmp(tmp_path, monkeypatch):
    monkeypatch.setenv("DISAGG_LOADGEN_DIR", str(tmp_path / "tools"))
    load = loadgen.Load("http://127.0.0.1:8090/v1", tmp_path / "art", rate=4, request_count=20)
    load.prepare()
    env = load.environment({"PATH": "/usr/bin", "TMPDIR": "/tmp"})
    assert env["PATH"] == "/usr/bin" and env["TMPDIR"] == "/tmp"
    assert Path(env["AIPERF_DATASET_MMAP_BASE_PATH"]) == tmp_path / "art" / loadgen.MMAP_DIR
    assert Path(env["AIPERF_DATASET_MMAP_BASE_PATH"]).is_dir(), "prepare() creates it"
    # its caches stay in the project's cache directory (the tool's), never ~/.cache
    assert Path(env["AIPERF_DATASET_MMAP_CACHE_DIR"]).parent == tmp_path / "tools"
    assert Path(env["HF_HOME"]).parent == tmp_path / "tools"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"rate": 1}, "bound the load"),
        ({"request_count": 3}, "give a rate or a schedule"),
        ({"rate": 1, "schedule": "0:1", "duration_s": 3}, "give a rate or a schedule"),
        ({"schedule": "0:1", "request_count": 3}, "needs a duration"),
    ],
)
def test_an_unbounded_or_ambiguous_load_is_refused(tmp_path, kwargs, message):
    with pytest.raises(ValueError, match=message):
        loadgen.Load("http://127.0.0.1:1/v1", tmp_path, **kwargs).command()


def test_the_endpoint_must_be_the_v1_base_url(tmp_path):
    with pytest.raises(ValueError, match="ending in /v1"):
        loadgen.Load("http://127.0.0.1:1", tmp_path, rate=1, request_count=1).command()


def record(ttft_ms=None, itl_ms=None, usage_out=None, error=None, phase="profiling") -> dict:
    metrics = {}
    if ttft_ms is not None:
        metrics["time_to_first_token"] = {"value": ttft_ms, "unit": "ms"}
    if itl_ms is not None:
        metrics["inter_token_latency"] = {"value": itl_ms, "unit": "ms"}
    if usage_out is not None:
        metrics["usage_completion_tokens"] = {"value": usage_out, "unit": "tokens"}
    rec = {"metadata": {"benchmark_phase": phase}, "metrics": metrics}
    if error is not None:
        rec["error"] = error
    return rec


def write_records(path: Path, records: list[dict]) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / loadgen.RECORDS_FILE).write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_results_count_ok_failed_and_truncated_and_take_percentiles_of_the_ok_ones(tmp_path):
    art = write_records(
        tmp_path / "art",
        [
            *[record(ttft_ms=100 + 10 * i, itl_ms=45, usage_out=20) for i in range(11)],
            record(error={"code": 503, "type": "Service Unavailable", "message": "no workers"}),
            record(ttft_ms=90, itl_ms=45, usage_out=7),  # cut short: fewer tokens than asked
            record(ttft_ms=90, itl_ms=45),  # no usage chunk: the stream never ended
            record(ttft_ms=None, usage_out=20),  # no token at all
            record(ttft_ms=1, itl_ms=1, usage_out=20, phase="warmup"),  # not counted
        ],
    )
    r = loadgen.read_results(art, expected_output_tokens=20)
    assert (r["requests"], r["ok"], r["failed"], r["truncated"]) == (15, 11, 1, 3)
    assert r["ttft_s"]["p50"] == pytest.approx(0.150)
    assert r["ttft_s"]["p90"] == pytest.approx(0.190)
    assert r["itl_s"]["p99"] == pytest.approx(0.045)
    assert any("503" in d for d in r["details"])
    text = loadgen.format_results(r)
    assert "ok=11 failed=1 truncated=3" in text and "ttft p50/p90/p99=150ms/190ms" in text


def test_results_of_a_run_that_never_started_say_so(tmp_path):
    with pytest.raises(FileNotFoundError, match="no aiperf records"):
        loadgen.read_results(tmp_path)


def test_results_of_no_request_hold_no_percentile(tmp_path):
    r = loadgen.read_results(write_records(tmp_path, []))
    assert r["requests"] == 0 and r["ttft_s"] == {"p50": None, "p90": None, "p99": None}
