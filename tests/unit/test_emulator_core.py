"""The EMULATOR without a cluster: fidelity to the worked example, drains, lost work, metrics, pod watching."""

from __future__ import annotations

import asyncio
import json
import math
import re
import subprocess
import sys
import time
import urllib.request

import numpy as np
import pytest
from fakes import FakeClock, ListLoad, run_fake
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from disagg import metrics
from disagg.emulator.driver import PodWatcher, WallClockDriver
from disagg.emulator.fleet import DeploymentEmulator, Fleet
from disagg.emulator.load import LoadGenerator, TokenDraw, parse_schedule
from disagg.emulator.metrics import build_registry
from disagg.model import StageModels
from disagg.workload import Request

INF = math.inf


def fleet_with(prefill: int = 1, decode: int = 2, colocated: int = 0, engine: str = "vllm"):
    fleet = Fleet()
    dep = DeploymentEmulator(
        "ns", "dep", StageModels(), placement="colocated" if colocated else "disaggregated", engine=engine
    )
    fleet.add_deployment(dep, 0.0)
    pods = {}
    for pool, n in (("prefill", prefill), ("decode", decode), ("colocated", colocated)):
        for i in range(n):
            pods[f"{pool}-{i}"] = fleet.add_pod(dep, pool, f"{pool}-{i}", f"uid-{pool}-{i}", 0.0)
    return fleet, dep, pods


def scrape(fleet: Fleet, now: float) -> dict[tuple[str, tuple], float]:
    reg = build_registry(fleet, lambda: fleet.flush(now))
    out = {}
    for fam in text_string_to_metric_families(generate_latest(reg).decode()):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(samples: dict, name: str, **labels: str) -> float:
    total = 0.0
    found = False
    for (n, lv), v in samples.items():
        if n == name and all(dict(lv).get(k) == x for k, x in labels.items()):
            total += v
            found = True
    assert found, f"no sample {name} {labels}"
    return total


# ---------------------------------------------------------------------------- fidelity


def test_worked_example_ttft_serial_on_idle_pools_fake_clock():
    fleet, _dep, pods = fleet_with()
    clock = FakeClock()
    driver = WallClockDriver(fleet, ListLoad([Request(0.1, 6000, 400)]), clock=clock)
    run_fake(driver, clock, 0.6)
    st = sum((p.stats.ttft.count for p in pods.values()), 0)
    assert st == 1
    ttft = sum(p.stats.ttft.sum for p in pods.values())
    assert ttft == pytest.approx(0.370, rel=0.10)  # 230 prefill + 95 transfer + 45 step
    # by stage: prompt tokens on the prefill pod at admission, transfer and TTFT on the decode pod
    assert pods["prefill-0"].stats.prompt_tokens.count == 1
    assert pods["prefill-0"].stats.prompt_tokens.sum == 6000
    dec = [p for n, p in pods.items() if n.startswith("decode") and p.stats.ttft.count]
    assert len(dec) == 1
    # the prefill pod exports its prefill time (what calibrates the prefill model): 230 ms
    assert pods["prefill-0"].stats.prefill_time.count == 1
    assert pods["prefill-0"].stats.prefill_time.sum == pytest.approx(0.230, rel=1e-6)
    assert dec[0].stats.xfer_time.sum == pytest.approx(0.095, rel=0.05)
    assert dec[0].stats.xfer_bytes == 6000 * 327680
    # 400 tokens x 45 ms: done after ~0.1 + 0.37 + 399 * 0.045 s
    run_fake(driver, clock, 18.6, dt=0.05)
    d = dec[0].stats
    assert d.success == 1
    assert d.gen_tokens.sum == 400
    assert d.itl.count == 399
    assert d.itl.sum == pytest.approx(399 * 0.045, rel=1e-6)
    assert d.gen_total == 400
    assert d.e2e.sum == pytest.approx(0.370 + 399 * 0.045, rel=0.01)


def test_worked_example_ttft_on_the_real_wall_clock():
    """Short real run: the first token shows up ~370 ms of wall time after the arrival."""
    fleet, _dep, pods = fleet_with()
    driver = WallClockDriver(fleet, ListLoad([Request(0.05, 6000, 400)]), duration_s=1.0)
    seen: list[float] = []

    async def watch() -> None:
        while not seen:
            fleet.flush(driver.now())
            if any(p.stats.ttft.count for p in pods.values()):
                seen.append(driver.now())
            await asyncio.sleep(0.005)

    async def main() -> None:
        w = asyncio.create_task(watch())
        await driver.run()
        await asyncio.wait_for(w, 1.0)

    cpu0 = time.process_time()
    asyncio.run(main())
    assert seen and seen[0] - 0.05 == pytest.approx(0.370, rel=0.10)
    ttft = sum(p.stats.ttft.sum for p in pods.values())
    assert ttft == pytest.approx(0.370, rel=0.10)
    assert time.process_time() - cpu0 < 0.9  # it sleeps, it does not spin


def test_colocated_idle_ttft_is_prefill_plus_one_step():
    fleet, _dep, pods = fleet_with(prefill=0, decode=0, colocated=1)
    clock = FakeClock()
    driver = WallClockDriver(fleet, ListLoad([Request(0.0, 6000, 10)]), clock=clock)
    run_fake(driver, clock, 1.0)
    p = pods["colocated-0"].stats
    assert p.prompt_tokens.count == 1 and p.ttft.count == 1
    assert p.ttft.sum == pytest.approx(0.230 + 0.045, rel=0.02)
    assert p.itl.count == 9 and p.success == 1


def test_token_accounting_matches_outputs_under_load():
    """Every request: one TTFT, output-1 gaps, output tokens; prompt tokens counted at admission."""
    fleet, dep, pods = fleet_with(prefill=2, decode=3)
    rng = np.random.default_rng(3)
    load = LoadGenerator(
        [(0.0, 20.0)], TokenDraw(1500, 600, rng), TokenDraw(60, 30, rng), duration_s=10.0, rng=rng
    )
    reqs = []
    while load.next_arrival() < INF:
        reqs.append(load.pop())
    clock = FakeClock()
    driver = WallClockDriver(fleet, ListLoad(reqs), clock=clock)
    run_fake(driver, clock, 40.0, dt=0.02)
    st = [p.stats for p in pods.values()]
    assert sum(s.success for s in st) == len(reqs) == dep.completed
    assert sum(s.ttft.count for s in st) == len(reqs)
    assert sum(s.itl.count for s in st) == sum(r.output_tokens - 1 for r in reqs)
    assert sum(s.gen_total for s in st) == sum(r.output_tokens for r in reqs)
    # every request is counted once where it is prefilled and once where its KV lands
    prefill = [pods[f"prefill-{i}"].stats for i in range(2)]
    decode = [pods[f"decode-{i}"].stats for i in range(3)]
    assert sum(s.prompt_tokens.count for s in prefill) == len(reqs)
    assert sum(s.prompt_tokens.count for s in decode) == len(reqs)
    assert sum(s.prompt_tokens.sum for s in decode) == sum(r.prompt_tokens for r in reqs)
    assert sum(s.prompt_total for s in st) == sum(r.prompt_tokens for r in reqs)
    # the histograms agree with the simulator's own per-request records
    assert sum(s.ttft.sum for s in st) == pytest.approx(sum(dep.r_ttft), rel=1e-9)
    assert sum(s.itl.sum for s in st) == pytest.approx(
        sum(i * (o - 1) for i, o in zip(dep.r_itl, [r.output_tokens for r in reqs], strict=False)), rel=0.2
    )


def test_prompt_tokens_recorded_at_arrival_not_completion():
    fleet, _dep, _pods = fleet_with(prefill=1, decode=1)
    clock = FakeClock()
    reqs = [Request(0.1 * i, 1000, 2000) for i in range(10)]  # long outputs: none completes soon
    driver = WallClockDriver(fleet, ListLoad(reqs), clock=clock)
    run_fake(driver, clock, 1.05)
    s = scrape(fleet, driver.now())
    assert value(s, "vllm:request_prompt_tokens_count", pod="prefill-0") == 10
    assert value(s, "vllm:request_prompt_tokens_sum", pod="prefill-0") == 10_000
    assert value(s, "vllm:request_success_total", pod="decode-0") == 0
    assert value(s, "vllm:num_requests_running", pod="decode-0") >= 8


# ---------------------------------------------------------------------------- drains and lost work


def test_draining_pod_gets_no_new_work_and_finishes_in_flight():
    fleet, dep, pods = fleet_with(prefill=1, decode=2)
    clock = FakeClock()
    reqs = [Request(0.0, 1000, 100)] + [Request(1.0 + 0.1 * i, 1000, 100) for i in range(20)]
    driver = WallClockDriver(fleet, ListLoad(reqs), clock=clock)
    run_fake(driver, clock, 0.5)
    busy = [p for n, p in pods.items() if n.startswith("decode") and p.in_flight()]
    assert len(busy) == 1
    victim = busy[0]
    other = pods["decode-1"] if victim is pods["decode-0"] else pods["decode-0"]
    dep.set_pod_draining(victim, True, driver.now())
    s = scrape(fleet, driver.now())
    assert value(s, "disagg_emulator_draining", pod=victim.name) == 1
    assert value(s, "disagg_emulator_in_flight_requests", pod=victim.name) == 1
    run_fake(driver, clock, 12.0, dt=0.02)
    assert victim.stats.success == 1  # its in-flight request finished
    assert victim.stats.ttft.count == 1  # and nothing new came
    assert other.stats.success == 20
    assert victim.in_flight() == 0 and victim.pending_kv_sends() == 0
    assert fleet.lost == 0
    # re-admitted: gets work again
    dep.set_pod_draining(victim, False, driver.now())
    assert not victim.draining


def test_draining_prefill_pod_keeps_pending_kv_sends_until_delivered():
    fleet, dep, pods = fleet_with(prefill=2, decode=1)
    clock = FakeClock()
    driver = WallClockDriver(fleet, ListLoad([Request(0.0, 6000, 50)]), clock=clock)
    run_fake(driver, clock, 0.25)  # prefill (230 ms) done, KV on the link (95 ms)
    pf = next(p for n, p in pods.items() if n.startswith("prefill") and p.pending_kv_sends())
    dep.set_pod_draining(pf, True, driver.now())
    s = scrape(fleet, driver.now())
    assert value(s, "disagg_emulator_pending_kv_sends", pod=pf.name) == 1
    # As on vLLM: the prefill request is finished (not running) but its KV blocks stay held
    # until the decode pod has them, so the KV usage the vLLM preset reads is above 0.
    assert value(s, "vllm:num_requests_running", pod=pf.name) == 0
    assert value(s, "vllm:kv_cache_usage_perc", pod=pf.name) > 0
    run_fake(driver, clock, 0.5)
    assert pf.pending_kv_sends() == 0 and pf.in_flight() == 0
    assert value(scrape(fleet, driver.now()), "vllm:kv_cache_usage_perc", pod=pf.name) == 0
    assert fleet.lost == 0


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_kv_in_transit_shows_in_the_engines_own_gauges(engine):
    """While a KV transfer is on the link, both ends report it in the series the engine's preset
    reads for drains (metrics.Preset.pending_kv), never only in the emulator's own gauge."""
    fleet, _, pods = fleet_with(prefill=1, decode=1, engine=engine)
    clock = FakeClock()
    driver = WallClockDriver(fleet, ListLoad([Request(0.0, 6000, 50)]), clock=clock)
    run_fake(driver, clock, 0.25)  # prefill (230 ms) done, KV on the link (95 ms)
    pf, dec = pods["prefill-0"], pods["decode-0"]
    assert pf.pending_kv_sends() == 1 and dec.pending_kv_sends() == 1
    s = scrape(fleet, driver.now())
    if engine == "vllm":
        assert value(s, "vllm:num_requests_running", pod=pf.name) == 0
        assert value(s, "vllm:kv_cache_usage_perc", pod=pf.name) > 0  # blocks held until pulled
        assert value(s, "vllm:num_requests_waiting", pod=dec.name) == 1  # WAITING_FOR_REMOTE_KVS
    else:
        assert value(s, "sglang:num_running_reqs", pod=pf.name) == 0
        assert value(s, "sglang:num_prefill_inflight_queue_reqs", pod=pf.name) == 1
        assert value(s, "sglang:num_queue_reqs", pod=dec.name) == 0
        assert value(s, "sglang:num_decode_transfer_queue_reqs", pod=dec.name) == 1


def test_removing_a_pod_with_in_flight_requests_counts_them_lost():
    fleet, dep, pods = fleet_with(prefill=1, decode=2)
    clock = FakeClock()
    reqs = [Request(0.05 * i, 1000, 2000) for i in range(6)]
    driver = WallClockDriver(fleet, ListLoad(reqs), clock=clock)
    run_fake(driver, clock, 1.0)
    victim = pods["decode-0"]
    held = victim.in_flight()
    assert held >= 2
    lost = fleet.remove_pod(victim, driver.now())
    assert lost == held == fleet.lost == dep.lost
    s = scrape(fleet, driver.now())
    # only the lost counter of a gone pod is still exported; every other series is gone
    assert value(s, "disagg_emulator_lost_requests_total", pod="decode-0") == held
    assert not [k for k in s if dict(k[1]).get("pod") == "decode-0" and "lost" not in k[0]]
    assert value(s, "disagg_emulator_lost_requests_total", pod="decode-1") == 0
    summary = fleet.summary()
    assert summary["requests"]["lost"] == held
    assert summary["lost_by_pod"] == {"ns/decode-0": held}
    # the rest still completes
    run_fake(driver, clock, 95.0, dt=0.1)
    assert summary["requests"]["generated"] == 6
    assert dep.completed == 6 - held
    fleet.expire_gone(driver.now() + 10_000)
    assert not [k for k in scrape(fleet, driver.now()) if dict(k[1]).get("pod") == "decode-0"]


def test_removing_a_prefill_pod_loses_its_queue_and_pending_sends():
    fleet, dep, pods = fleet_with(prefill=1, decode=1)
    clock = FakeClock()
    driver = WallClockDriver(fleet, ListLoad([Request(0.0, 6000, 10) for _ in range(3)]), clock=clock)
    run_fake(driver, clock, 0.1)
    assert fleet.remove_pod(pods["prefill-0"], driver.now()) == 3
    assert pods["decode-0"].stats.lost == 0
    assert dep.leaked_reservations() == 0


def test_front_door_queue_waits_for_a_pod_and_is_bounded():
    fleet = Fleet(max_queue=5)
    dep = DeploymentEmulator("ns", "dep", StageModels(), max_queue=5)
    fleet.add_deployment(dep, 0.0)
    clock = FakeClock()
    driver = WallClockDriver(fleet, ListLoad([Request(0.01 * i, 500, 5) for i in range(8)]), clock=clock)
    run_fake(driver, clock, 0.2)
    assert dep.front_door() == 5 and fleet.rejected == 3
    s = scrape(fleet, driver.now())
    assert value(s, "disagg_emulator_front_door_queue", deployment="dep") == 5
    assert value(s, "disagg_emulator_rejected_requests_total", deployment="dep") == 3
    assert value(s, "disagg_front_door_rejected_requests_total", deployment="dep") == 3  # the operator's
    fleet.add_pod(dep, "prefill", "p", "u1", driver.now())
    run_fake(driver, clock, 0.5)
    assert dep.front_door() == 0  # prefilled; now waiting for a decode pod to send to
    fleet.add_pod(dep, "decode", "d", "u2", driver.now())
    run_fake(driver, clock, 3.0)
    assert dep.completed == 5
    assert fleet.summary()["requests"]["rejected"] == 3


# ---------------------------------------------------------------------------- metrics


def test_metric_names_and_labels_vllm_and_sglang():
    for engine, names in (
        (
            "vllm",
            [
                "vllm:num_requests_running",
                "vllm:num_requests_waiting",
                "vllm:kv_cache_usage_perc",
                "vllm:time_to_first_token_seconds_bucket",
                "vllm:inter_token_latency_seconds_bucket",
                "vllm:e2e_request_latency_seconds_count",
                "vllm:request_queue_time_seconds_sum",
                "vllm:request_prompt_tokens_count",
                "vllm:request_generation_tokens_sum",
                "vllm:prompt_tokens_total",
                "vllm:generation_tokens_total",
                "vllm:request_success_total",
                "vllm:nixl_xfer_time_seconds_bucket",
                "vllm:nixl_bytes_transferred_total",
                "vllm:nixl_num_failed_transfers_total",
            ],
        ),
        (
            "sglang",
            [
                "sglang:num_running_reqs",
                "sglang:num_queue_reqs",
                "sglang:token_usage",
                "sglang:time_to_first_token_seconds_bucket",
                "sglang:inter_token_latency_seconds_count",
                "sglang:e2e_request_latency_seconds_sum",
                "sglang:queue_time_seconds_count",
                "sglang:num_prefill_inflight_queue_reqs",
                "sglang:num_decode_transfer_queue_reqs",
                "sglang:kv_transfer_latency_ms_sum",
                "sglang:num_transfer_failed_reqs_total",
            ],
        ),
    ):
        fleet, _dep, _pods = fleet_with(engine=engine)
        clock = FakeClock()
        driver = WallClockDriver(fleet, ListLoad([Request(0.0, 6000, 20)]), clock=clock)
        run_fake(driver, clock, 2.0)
        s = scrape(fleet, driver.now())
        got = {k[0] for k in s}
        for n in [*names, "disagg_emulator_in_flight_requests", "disagg_emulator_pending_kv_sends"]:
            assert n in got, (engine, n)
        for (_n, lv), _v in s.items():
            d = dict(lv)
            if "pod" in d:
                assert {"namespace", "deployment", "pool", "pod", "model_name"} <= set(d)
        # TTFT buckets resolve the worked example's ~370 ms
        assert value(s, f"{engine}:time_to_first_token_seconds_bucket", le="0.35") == 0
        assert value(s, f"{engine}:time_to_first_token_seconds_bucket", le="0.4") == 1


def test_standalone_cli_serves_metrics_and_writes_a_summary(tmp_path):
    out = tmp_path / "summary.json"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "disagg.cli",
            "emulate",
            "--standalone",
            "--prefill",
            "1",
            "--decode",
            "1",
            "--rate",
            "3",
            "--arrivals",
            "uniform",
            "--output-tokens",
            "5",
            "--duration",
            "10",
            "--metrics-port",
            "0",
            "--summary-json",
            str(out),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    port = None
    deadline = time.monotonic() + 20
    while port is None and time.monotonic() < deadline:
        line = proc.stderr.readline()
        m = re.search(r"metrics on http://127\.0\.0\.1:(\d+)/metrics", line)
        if m:
            port = int(m.group(1))
    assert port, "no metrics line"
    # the first requests finish within about a second; poll while the 10 s run lasts (a busy
    # machine may be slow to get there)
    series = 'vllm:request_prompt_tokens_count{deployment="standalone"'
    body = ""
    while series not in body and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.5)
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    assert series in body
    stdout, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0
    assert "emulator summary: generated=30 completed=" in stdout
    summary = json.loads(out.read_text())
    assert summary["requests"]["generated"] == 30
    assert summary["pods_seen"]["prefill"] == 1 and summary["pods_seen"]["decode"] == 1


# ---------------------------------------------------------------------------- pod watching


def pod(name: str, pool: str, *, routable: str | None = "True", drain: bool = False, phase: str = "Running"):
    conds = [{"type": "Ready", "status": "True"}]
    if routable is not None:
        conds.append({"type": "disagg.dev/routable", "status": routable})
    return {
        "metadata": {
            "name": name,
            "namespace": "ns",
            "uid": f"uid-{name}",
            "labels": {"disagg.dev/deployment": "dd", "disagg.dev/pool": pool},
            "annotations": {"disagg.dev/drain": "scale-down"} if drain else {},
        },
        "status": {"phase": phase, "conditions": conds},
    }


SPEC = {
    "engine": "vllm",
    "model": "m",
    "pools": {
        "prefill": {"maxReplicas": 4, "template": {"spec": {"containers": [{"name": "e", "image": "x"}]}}},
        "decode": {
            "maxReplicas": 4,
            "serviceModel": {"stepFixedMs": 40, "slots": 8},
            "template": {"spec": {"containers": [{"name": "e", "image": "x"}]}},
        },
    },
}


def test_pod_watcher_gate_drain_and_deletion():
    fleet = Fleet()
    clock = FakeClock()
    driver = WallClockDriver(fleet, ListLoad([]), clock=clock)
    w = PodWatcher(None, fleet, driver.now)
    specs = {("ns", "dd"): {"metadata": {"name": "dd", "namespace": "ns", "generation": 1}, "spec": SPEC}}
    w.apply(specs, [pod("p0", "prefill"), pod("d0", "decode"), pod("d1", "decode", routable=None)], 0.0)
    assert sorted(p.name for p in fleet.live_pods()) == ["d0", "p0"]  # d1 not admitted yet
    dep = fleet.deployment("ns", "dd")
    assert dep.step_s[1] == pytest.approx(0.040) and dep.slots == 8 and dep.model_name == "m"
    # load some long requests
    driver.load = ListLoad([Request(0.1 * i, 1000, 3000) for i in range(1, 5)])
    run_fake(driver, clock, 1.0)
    d0 = fleet.pods[("ns", "d0", "uid-d0")]
    assert d0.in_flight() == 4
    # drain annotation -> draining; a newly routable pod gets the new work
    w.apply(specs, [pod("p0", "prefill"), pod("d0", "decode", drain=True), pod("d1", "decode")], driver.now())
    assert d0.draining
    driver.load = ListLoad([Request(driver.now() + 0.1, 1000, 10)])
    run_fake(driver, clock, 2.0)
    d1 = fleet.pods[("ns", "d1", "uid-d1")]
    assert d1.stats.success == 1 and d0.in_flight() == 4
    # routable False also drains
    w.apply(
        specs,
        [pod("p0", "prefill", routable="False"), pod("d0", "decode", drain=True), pod("d1", "decode")],
        2.0,
    )
    assert fleet.pods[("ns", "p0", "uid-p0")].draining
    # d0 deleted while holding 4 requests: lost
    w.apply(specs, [pod("p0", "prefill"), pod("d1", "decode")], driver.now())
    assert fleet.lost == 4 and ("ns", "d0", "uid-d0") not in fleet.pods
    assert not fleet.pods[("ns", "p0", "uid-p0")].draining  # re-admitted
    assert fleet.summary()["lost_by_pod"] == {"ns/d0": 4}


def test_emulators_split_a_fleet_by_label_selector():
    """Two emulator processes, each given a selector, emulate disjoint objects: each only the
    pods of the DisaggDeployments its selector matches."""
    from fakes import FakeKube

    kube = FakeKube()
    for name, part in (("a", "one"), ("b", "two"), ("c", "one")):
        kube.put(
            {
                "apiVersion": "disagg.dev/v1alpha1",
                "kind": "DisaggDeployment",
                "metadata": {"name": name, "namespace": "ns", "generation": 1, "labels": {"part": part}},
                "spec": SPEC,
            }
        )
        for p in (pod(f"{name}-p0", "prefill"), pod(f"{name}-d0", "decode")):
            p["metadata"]["labels"]["disagg.dev/deployment"] = name
            kube.put({"kind": "Pod", **p})
    emulated = {}
    for part in ("one", "two"):
        fleet = Fleet()
        asyncio.run(PodWatcher(kube, fleet, lambda: 0.0, namespace="ns", selector=f"part={part}").sync())
        emulated[part] = sorted(p.name for p in fleet.live_pods())
    assert emulated == {"one": ["a-d0", "a-p0", "c-d0", "c-p0"], "two": ["b-d0", "b-p0"]}


def test_failed_listing_removes_nothing():
    class Broken:
        async def list(self, *a, **k):
            raise RuntimeError("apiserver down")

    fleet, _dep, _pods = fleet_with()
    w = PodWatcher(Broken(), fleet, lambda: 0.0)

    async def main() -> None:
        stop = asyncio.Event()
        t = asyncio.create_task(w.run(0.01, stop))
        await asyncio.sleep(0.05)
        stop.set()
        await t

    asyncio.run(main())
    assert w.errors >= 2 and len(fleet.live_pods()) == 3 and fleet.lost == 0


# ---------------------------------------------------------------------------- load


def test_schedule_and_uniform_arrivals():
    assert parse_schedule("0:2,60:8,180:2") == [(0.0, 2.0), (60.0, 8.0), (180.0, 2.0)]
    assert parse_schedule("10:1") == [(0.0, 0.0), (10.0, 1.0)]
    with pytest.raises(ValueError):
        parse_schedule("5:1,2:3")
    rng = np.random.default_rng(0)
    g = LoadGenerator(
        parse_schedule("0:4,10:0,20:2"),
        TokenDraw(1000, 0, rng),
        TokenDraw(100, 0, rng),
        arrivals="uniform",
        duration_s=30,
        rng=rng,
    )
    ts = []
    while g.next_arrival() < INF:
        r = g.pop()
        assert r.prompt_tokens == 1000 and r.output_tokens == 100
        ts.append(r.arrival_s)
    assert len(ts) == 40 + 20
    assert all(t < 10 or t >= 20 for t in ts)
    assert np.allclose(np.diff(ts[:40]), 0.25)


def test_media_load_generator_and_cli_flags():
    rng = np.random.default_rng(1)
    g = LoadGenerator(
        [(0.0, 50.0)],
        TokenDraw(1000, 0, rng),
        TokenDraw(100, 0, rng),
        duration_s=40,
        rng=rng,
        media_fraction=0.3,
        media_items=4,
    )
    reqs = []
    while g.next_arrival() < INF:
        reqs.append(g.pop())
    media = [r.media_items for r in reqs]
    assert set(media) == {0, 4}
    assert sum(1 for x in media if x) / len(media) == pytest.approx(0.3, abs=0.03)
    with pytest.raises(ValueError, match="media fraction"):
        LoadGenerator([(0.0, 1.0)], TokenDraw(1, 0, rng), TokenDraw(1, 0, rng), media_fraction=1.5)
    from disagg.cli import build_parser
    from disagg.commands.emulate import build_load

    args = build_parser().parse_args(
        ["emulate", "--standalone", "--media-fraction", "1", "--media-items", "3"]
    )
    load = build_load(args)
    assert load.pop().media_items == 3
    bad = build_parser().parse_args(["emulate", "--standalone", "--media-fraction", "2"])
    with pytest.raises(Exception, match="--media-fraction"):
        build_load(bad)


def test_a_stream_per_deployment_gives_each_its_own_rate_whoever_else_serves():
    """`--rate-per deployment`: a deployment alone gets its own rate, not the fleet's whole
    load, one that joins later gets a stream from then on, a schedule's step comes at once
    for both (the driver's clock), and a deployment whose pods cannot serve keeps its
    requests (at its front door) rather than passing them to the others."""
    from disagg.cli import build_parser
    from disagg.commands.emulate import build_load

    def flags(*extra: str) -> list[str]:
        return ["emulate", "--schedule", "0:2,40:6", "--arrivals", "uniform", "--duration", "60", *extra]

    def deployment(fleet: Fleet, name: str, now: float) -> DeploymentEmulator:
        dep = fleet.add_deployment(DeploymentEmulator("ns", name, StageModels()), now)
        for pool in ("prefill", "decode"):
            fleet.add_pod(dep, pool, f"{name}-{pool}", f"uid-{name}-{pool}", now)
        return dep

    def stop_serving(dep: DeploymentEmulator, now: float) -> None:
        for pod in list(dep.pod_of.values()):
            dep.set_pod_draining(pod, True, now)

    def offered(dep: DeploymentEmulator) -> int:
        return dep.submitted + dep.rejected

    fleet = Fleet()
    a = deployment(fleet, "a", 0.0)
    clock = FakeClock()
    driver = WallClockDriver(
        fleet, build_load(build_parser().parse_args(flags("--rate-per", "deployment"))), clock=clock
    )
    run_fake(driver, clock, 30.0)
    assert offered(a) == 60  # 2/s for 30 s
    b = deployment(fleet, "b", driver.now())
    run_fake(driver, clock, 50.0)
    stop_serving(b, driver.now())
    c = deployment(fleet, "c", driver.now())
    run_fake(driver, clock, 60.0)
    assert offered(a) == 80 + 120  # 2/s to 40 s, then 6/s to 60 s
    assert offered(b) == 20 + 120  # from 30 s on, the same schedule
    assert offered(c) == 60  # joined after the step: 6/s from 50 s
    assert fleet.generated == offered(a) + offered(b) + offered(c)
    with pytest.raises(Exception, match="a trace is one stream"):
        build_load(build_parser().parse_args(flags("--rate-per", "deployment", "--trace", "t.csv")))


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_encoder_pods_export_media_requests_and_items(engine):
    fleet = Fleet()
    dep = DeploymentEmulator("ns", "dep", StageModels(), engine=engine)
    fleet.add_deployment(dep, 0.0)
    for pool in ("encoder", "prefill", "decode"):
        fleet.add_pod(dep, pool, f"{pool}-0", f"uid-{pool}", 0.0)
    clock = FakeClock()
    reqs = [Request(0.1 * i, 500, 3, 2 if i % 2 else 0) for i in range(10)]  # 5 with 2 images each
    driver = WallClockDriver(fleet, ListLoad(reqs), clock=clock)
    run_fake(driver, clock, 3.0)
    s = scrape(fleet, driver.now())
    p = metrics.preset(engine)
    requests, items = p.media_requests, p.media_items
    assert value(s, requests, pod="encoder-0") == 5
    assert value(s, items, pod="encoder-0") == 10
    if engine == "vllm":  # the same histogram on prefill counts every request, media or not
        assert value(s, requests, pod="prefill-0") == 10
    assert dep.completed == 10  # every request went through, media ones via the encoder
