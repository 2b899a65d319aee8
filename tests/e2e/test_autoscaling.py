"""Closed-loop autoscaling: the operator sizes pools from what a real Prometheus scrapes off
the emulated fleet, and drains before it shrinks. Intervals are short (5 s decisions, 1 s
scrapes) so the suite stays within its time budget."""

from __future__ import annotations

import threading
import time

import pytest
from e2e_stack import DRAIN_TIMEOUT_S, deployment_spec, planned

pytestmark = [pytest.mark.cluster, pytest.mark.prometheus, pytest.mark.slow]

PROMPT, OUTPUT = 6000, 400
INTERVAL, WINDOW = 5, 10


def load_args(schedule: str, duration: int) -> list[str]:
    return [
        "--schedule",
        schedule,
        "--arrivals",
        "uniform",
        "--input-tokens",
        str(PROMPT),
        "--output-tokens",
        str(OUTPUT),
        "--duration",
        str(duration),
        "--seed",
        "7",
    ]


def reached(stack, want: dict[str, int]) -> bool:
    cur = stack.replicas()
    return all(cur.get(k, 0) >= v for k, v in want.items())


def test_load_step_grows_then_shrinks_through_drains_without_loss(stack):
    # The step is this run's only burst: the automatic headroom reads its 4x rise and fall as a
    # burst that may recur and would stand ready for its return (the burst floor) for an hour,
    # so it is off here and the pools shrink to the 2 rps plan.
    obj = deployment_spec(stack.prom.url, sizing={"autoHeadroom": False})
    stack.apply(obj)
    stack.start_operator()
    stack.wait_routable()
    stack.start_emulator(*load_args("0:2,25:8,85:2", 170))
    want_high = planned(obj, 8.0, PROMPT, OUTPUT)
    want_low = planned(obj, 2.0, PROMPT, OUTPUT)
    assert want_high["prefill"] > want_low["prefill"] and want_high["decode"] > want_low["decode"]

    # (a) the step to 8 rps: the pools reach the planner's sizes within three intervals once
    # the rate window has filled (the window starts when the step happens at t=25 s).
    time.sleep(25)
    t_step = time.monotonic()
    stack.cluster.wait_for(
        lambda: reached(stack, want_high),
        timeout=WINDOW + 3 * INTERVAL + 10,
        interval=1,
        what=f"pools at {want_high}\n{stack.debug()}",
    )
    grown_after = time.monotonic() - t_step
    # The decision's record lands in status just after the replicas it applied.
    stack.cluster.wait_for(
        lambda: stack.dd()["status"]["lastDecision"]["outputs"]["planned"]["decode"] >= want_high["decode"],
        timeout=10,
        what=f"the decision that grew the pools recorded in status\n{stack.debug()}",
    )
    assert grown_after <= WINDOW + 3 * INTERVAL + 10
    # Online calibration: samples from the engines' metrics back the fitted stage models.
    cal = stack.dd()["status"].get("calibration") or {}
    assert cal.get("prefill", {}).get("samples", 0) >= 1 and cal.get("decode", {}).get("samples", 0) >= 1, cal
    if cal["prefill"]["fitted"]:
        assert cal["prefill"]["fixedMs"] + cal["prefill"]["msPerToken"] * PROMPT == pytest.approx(
            230, rel=0.1
        )
    if cal["decode"]["fitted"]:
        assert cal["decode"]["stepFixedMs"] == pytest.approx(45, rel=0.1)

    # (b) back to 2 rps: shrink through drains to the 2 rps plan, and nothing is lost.
    peak_decode = stack.replicas()["decode"]

    def shrunk() -> bool:
        decode = stack.replicas().get("decode", 99)
        return decode < peak_decode and decode <= want_low["decode"] + 1

    stack.cluster.wait_for(
        shrunk,
        timeout=150,
        interval=2,
        what=f"decode pool shrunk from {peak_decode} towards {want_low}\n{stack.debug()}",
    )
    summary = stack.wait_emulator(timeout=120)
    assert summary["requests"]["lost"] == 0, summary
    assert summary["requests"]["completed"] > 0
    reasons = [e["reason"] for e in stack.events()]
    assert "DrainStarted" in reasons and "DrainCompleted" in reasons, reasons
    # The error budget counted the engines' first tokens off Prometheus' TTFT histogram (the
    # decisions' windows, not every request: at least some of those served, never more than all)
    budget = (stack.dd()["status"].get("scalerState") or {}).get("errorBudget") or {}
    assert 0 < budget.get("judged", 0) <= 1.5 * summary["requests"]["completed"], (budget, summary)
    assert 0 <= budget.get("missed", -1) <= budget["judged"], budget
    # Every pod left is routable: no drain was abandoned half-way. A drain that started just
    # before the load generator stopped loses its pod's metrics with it: its work is unknown,
    # so it ends only at its deadline (120 s, then readmit), never by reading the gap as zero.
    stack.wait_settled(timeout=DRAIN_TIMEOUT_S + 30)


def test_prometheus_outage_holds_sizes_and_recovers(stack):
    obj = deployment_spec(stack.prom.url)
    stack.apply(obj)
    stack.start_operator()
    stack.wait_routable()
    stack.start_emulator(*load_args("0:6", 120))
    want = planned(obj, 6.0, PROMPT, OUTPUT)
    stack.cluster.wait_for(lambda: reached(stack, want), timeout=60, interval=1, what=f"grown to {want}")
    stack.cluster.wait_for(
        lambda: (stack.condition("MetricsAvailable") or {}).get("status") == "True",
        timeout=30,
        what="MetricsAvailable=True",
    )
    before = stack.replicas()

    stack.prom.stop()
    deadline = time.monotonic() + 4 * INTERVAL
    while time.monotonic() < deadline:
        assert stack.replicas() == before, "sizes changed while Prometheus was down"
        time.sleep(1)
    cond = stack.condition("MetricsAvailable")
    assert cond["status"] == "False" and cond["reason"] == "MetricsMissing"
    assert stack.dd()["status"]["lastDecision"]["reason"] == "HoldStaleMetrics"

    stack.prom.start()
    stack.cluster.wait_for(
        lambda: (stack.condition("MetricsAvailable") or {}).get("status") == "True",
        timeout=40,
        what="MetricsAvailable=True again",
    )
    assert min(stack.replicas().values()) >= 1


def test_operator_killed_mid_drain_resumes_it_without_loss(stack):
    obj = deployment_spec(stack.prom.url)
    stack.apply(obj)
    op = stack.start_operator()
    stack.wait_routable()
    stack.start_emulator(*load_args("0:8,40:1", 130))
    want = planned(obj, 8.0, PROMPT, OUTPUT)
    stack.cluster.wait_for(lambda: reached(stack, want), timeout=60, interval=1, what=f"grown to {want}")

    def draining():
        return [p for p in stack.pods() if "disagg.dev/drain" in (p["metadata"].get("annotations") or {})]

    stack.cluster.wait_for(draining, timeout=90, interval=0.5, what=f"a drain to start\n{stack.debug()}")
    op.kill()
    victims = {p["metadata"]["name"] for p in draining()}
    time.sleep(5)
    op.start()
    # The restarted operator finishes what the dead one started: the victims go away.
    stack.cluster.wait_for(
        lambda: not victims & {p["metadata"]["name"] for p in stack.pods()},
        timeout=120,
        interval=1,
        what=f"drained pods {victims} removed\n{stack.debug()}",
    )
    summary = stack.wait_emulator(timeout=120)
    assert summary["requests"]["lost"] == 0, summary
    # Drains still open end within their timeout (then readmit): removed or routable again.
    stack.wait_settled(timeout=DRAIN_TIMEOUT_S + 30)


def test_gpu_budget_below_the_plan_is_never_exceeded(stack):
    budget = 6
    obj = deployment_spec(stack.prom.url, gpuBudget=budget)
    unlimited = planned(deployment_spec(stack.prom.url), 8.0, PROMPT, OUTPUT)
    assert sum(unlimited.values()) > budget, "the test needs a load the budget cannot cover"
    stack.apply(obj)
    stack.start_operator()
    stack.wait_routable()

    peak = [0]
    stop = threading.Event()

    def watch():
        while not stop.is_set():
            try:
                peak[0] = max(peak[0], stack.gpus_in_use())
            except AssertionError:
                pass
            time.sleep(0.5)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        stack.start_emulator(*load_args("0:8", 70))
        stack.cluster.wait_for(
            lambda: (stack.condition("BudgetLimited") or {}).get("status") == "True",
            timeout=60,
            what=f"BudgetLimited=True\n{stack.debug()}",
        )
        time.sleep(3 * INTERVAL)
    finally:
        stop.set()
        watcher.join()
    assert peak[0] <= budget, f"{peak[0]} GPUs requested with a budget of {budget}"
    cond = stack.condition("BudgetLimited")
    assert cond["reason"] == "GpuBudgetShort" and cond["message"]
    # The split follows the planner's goodput allocation under the budget, not a proportional squeeze.
    budgeted = planned(obj, 8.0, PROMPT, OUTPUT)
    assert sum(budgeted.values()) <= budget
    decision = stack.dd()["status"]["lastDecision"]
    assert decision["outputs"]["budgetLimited"] is True
    assert sum(decision["outputs"]["targets"].values()) <= budget


def test_burst_while_gpus_run_out_requests_no_runaway_capacity(stack):
    # Decode workers take a whole 8-GPU node: at most 4 fit on the simulated cluster, fewer
    # once prefill pods sit on some nodes.
    obj = deployment_spec(stack.prom.url)
    obj["spec"]["pools"]["decode"]["gpusPerReplica"] = 8
    want = planned(obj, 10.0, PROMPT, OUTPUT)
    assert want["decode"] > 4, "the test needs a plan larger than the cluster"
    stack.apply(obj)
    stack.start_operator()
    stack.wait_routable()
    stack.start_emulator(*load_args("0:10", 80))

    def pending_decode():
        return [p for p in stack.pods("decode") if p["status"].get("phase") == "Pending"]

    stack.cluster.wait_for(
        pending_decode, timeout=60, interval=1, what=f"unschedulable decode pods\n{stack.debug()}"
    )
    stack.cluster.wait_for(
        lambda: "unschedulable" in ((stack.condition("Degraded") or {}).get("message") or ""),
        timeout=30,
        what="Degraded names the unschedulable pods",
    )
    # While pods are pending, the requested replicas do not keep growing.
    first = stack.replicas()["decode"]
    samples = []
    for _ in range(3 * INTERVAL):
        samples.append(stack.replicas()["decode"])
        time.sleep(1)
    assert max(samples) <= max(first, want["decode"]), (first, samples, want)
    assert max(samples) - first <= 8, "runaway scale-up while pods cannot be scheduled"
    assert samples[-1] == samples[0], f"replicas kept moving while pods were pending: {samples}"
    assert stack.condition("Degraded")["status"] == "True"
