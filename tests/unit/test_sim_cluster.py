"""The clock-free Cluster API the emulator drives: membership, draining, removal, stepping by hand."""

from __future__ import annotations

import json

import pytest

from disagg.cli import main
from disagg.model import StageModels
from disagg.sim import DONE, INF, LOST, Cluster, SimConfig
from disagg.workload import Request

M = StageModels()


def run_until_idle(cl: Cluster) -> list:
    ended = []
    while (t := cl.next_event_time()) < INF:
        ended += cl.advance(t)
    return ended


def test_manual_stepping_reproduces_worked_example():
    cl = Cluster(M, SimConfig(prefill=1, decode=1))
    job = cl.submit(Request(0.0, 6000, 400), 0.0)
    assert cl.next_event_time() == pytest.approx(0.230)
    ended = run_until_idle(cl)
    assert ended == [job] and job.state == DONE
    assert job.t_first == pytest.approx(0.37023, abs=1e-4)
    assert cl.leaked_reservations() == 0


def test_advance_with_a_late_wall_clock_processes_events_at_their_times():
    cl = Cluster(M, SimConfig(prefill=1, decode=1))
    job = cl.submit(Request(0.0, 6000, 2), 0.0)
    ended = cl.advance(10.0)  # one late tick runs everything due
    assert ended == [job] and job.t_first == pytest.approx(0.37023, abs=1e-4)


def test_draining_worker_gets_no_new_work_and_finishes_in_flight():
    cl = Cluster(M, SimConfig(prefill=2, decode=2))
    p0, p1 = cl.pools["prefill"]
    d0, d1 = cl.pools["decode"]
    a = cl.submit(Request(0.0, 6000, 50), 0.0)
    assert a.pw is p0
    cl.set_draining(p0)
    cl.set_draining(d0)
    b = cl.submit(Request(0.0, 6000, 50), 0.0)
    assert b.pw is p1
    assert cl.in_flight(p0) == 1
    cl.advance(0.231)  # p0 finished prefill; its KV is on the link
    assert cl.in_flight(p0) == 0 and cl.pending_kv_sends(p0) == 1
    assert a.dst is d1 and b.dst is d1  # draining decode worker got no reservation
    run_until_idle(cl)
    assert cl.pending_kv_sends(p0) == 0 and cl.in_flight(d0) == 0
    assert a.state == DONE and b.state == DONE
    assert cl.remove_worker(p0) == [] and cl.remove_worker(d0) == []
    assert cl.leaked_reservations() == 0


def test_remove_worker_returns_lost_requests_and_releases_reservations():
    cl = Cluster(M, SimConfig(prefill=1, decode=1))
    d = cl.pools["decode"][0]
    jobs = [cl.submit(Request(0.0, 6000, 100), 0.0) for _ in range(3)]
    cl.advance(0.25)  # first prefill done, its KV in flight into d
    assert cl.pending_kv_sends(d) == 1
    lost = cl.remove_worker(d, 0.25)
    assert lost == [jobs[0]] and jobs[0].state == LOST
    assert cl.reservations == set()
    # No decode worker: later prefills wait unplaced; a new pod picks them up.
    cl.advance(1.0)
    assert cl.unplaced
    cl.add_worker("decode", 1.0)
    run_until_idle(cl)
    assert [j.state for j in jobs[1:]] == [DONE, DONE]
    assert cl.leaked_reservations() == 0


def test_removing_a_prefill_worker_loses_queue_and_sends():
    cl = Cluster(M, SimConfig(prefill=1, decode=1, chunked=True))
    p = cl.pools["prefill"][0]
    jobs = [cl.submit(Request(0.0, 6000, 10), 0.0) for _ in range(2)]
    cl.advance(0.1)  # first chunk of job 0 on the link, job 1 queued
    assert cl.pending_kv_sends(p) == 1
    lost = cl.remove_worker(p, 0.1)
    assert sorted(j.id for j in lost) == sorted(j.id for j in jobs)
    assert cl.reservations == set() and sum(w.incoming for w in cl.pools["decode"]) == 0
    assert cl.next_event_time() == INF


def test_cli_simulate_table_and_json(capsys):
    assert main(["simulate", "--duration", "60", "--rate", "1", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "colocated" in out and "disaggregated" in out and "conditional" in out
    assert (
        main(
            [
                "simulate",
                "--duration",
                "60",
                "--placement",
                "conditional",
                "--sweep-threshold",
                "--output",
                "json",
                "--quiet",
            ]
        )
        == 0
    )
    doc = json.loads(capsys.readouterr().out)
    assert doc["results"][0]["placement"] == "conditional"
    assert doc["threshold_sweep"]["best"] == doc["results"][0]["config"]["split_threshold"]


def test_cli_trace_and_plot(tmp_path, capsys):
    png = tmp_path / "q.png"
    rc = main(
        [
            "simulate",
            "--workload",
            "trace",
            "--trace",
            "/work/shared/traces/azure_llm_2023/AzureLLMInferenceTrace_conv.csv",
            "--limit",
            "500",
            "--placement",
            "disaggregated",
            "--plot",
            str(png),
            "--quiet",
            "--prefill",
            "2",
            "--decode",
            "4",
        ]
    )
    assert rc == 0 and png.stat().st_size > 1000


@pytest.mark.parametrize(
    "argv",
    [
        ["--link-gibps", "0"],
        ["--decode-slots", "0"],
        ["--workload", "trace"],
        ["--workload", "trace", "--trace", "/nonexistent.csv"],
        ["--failure-prob", "2"],
        ["--placement", "disaggregated", "--decode", "0"],
    ],
)
def test_cli_bad_input_exits_2(argv, capsys):
    assert main(["simulate", "--duration", "10", "--quiet", *argv]) == 2
    assert "error:" in capsys.readouterr().err


def test_cli_unknown_trace_format_exits_2(tmp_path, capsys):
    f = tmp_path / "x.dat"
    f.write_text("hello\n")
    assert main(["simulate", "--workload", "trace", "--trace", str(f), "--quiet"]) == 2
    assert "known formats" in capsys.readouterr().err


@pytest.mark.parametrize("seed", range(12))
def test_random_configurations_conserve_requests(seed):
    import random

    from disagg.sim import simulate
    from disagg.workload import mix

    rnd = random.Random(seed)
    w = mix(
        rnd.uniform(1.0, 8.0),
        60.0,
        long_fraction=rnd.random(),
        output_tokens=(1, 300),
        media_fraction=rnd.choice([0.0, 0.3]),
        seed=seed,
    )
    cfg = SimConfig(
        placement=rnd.choice(["disaggregated", "colocated", "conditional"]),
        prefill=rnd.randint(1, 3),
        decode=rnd.randint(1, 3),
        encoder=1,
        chunked=rnd.random() < 0.5,
        failure_prob=rnd.choice([0.0, 0.1, 0.5]),
        link_scope=rnd.choice(["worker", "shared"]),
        ttft_ms=rnd.choice([None, 300.0, 2000.0]),
        seed=seed,
    )
    r = simulate(w, M, cfg)
    assert r.completed + r.failed == len(w)
    assert r.failures["leaked_reservations"] == 0
    assert r.failures["reservations_released"] == r.failures["reprefills"] + r.failures["failed_requests"]
    for name, s in r.stages.items():
        if s["L"] > 1e-3:
            assert s["L"] == pytest.approx(s["lambda"] * s["W_ms"] / 1000.0, rel=1e-6), name
