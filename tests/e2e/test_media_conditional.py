"""Closed loop for the encoder pool and conditional placement: the operator sizes the multimodal
sample's encoder pool from the media its pods take, and resizes a conditional deployment's prefill
and decode pools, from what a real Prometheus scrapes off the emulated fleet."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml
from e2e_stack import deployment_spec

from disagg import api, loop, planner

pytestmark = [pytest.mark.cluster, pytest.mark.prometheus, pytest.mark.slow]

SAMPLES = Path(__file__).resolve().parents[2] / "config" / "samples"
INTERVAL, WINDOW = 5, 10
SHORT_LOOP = {
    "enabled": True,
    "intervalSeconds": INTERVAL,
    "scrapeIntervalSeconds": 1,
    "metricWindowSeconds": WINDOW,
    "scaleDownStabilizationSeconds": 10,
    "maxScaleUpStep": 8,
    "maxScaleDownStep": 8,
}


def emulator_load(schedule: str, duration: int, prompt: int, output: int, *media: str) -> list[str]:
    return [
        "--schedule",
        schedule,
        "--arrivals",
        "uniform",
        "--input-tokens",
        str(prompt),
        "--output-tokens",
        str(output),
        "--duration",
        str(duration),
        "--seed",
        "7",
        *media,
    ]


def planned_sizes(obj: dict, demand: planner.Demand) -> dict[str, int]:
    """The planner's sizes for this load, for the pools the spec has."""
    spec = api.parse_spec(obj["spec"])
    return {k: v for k, v in api.planner_inputs(spec).plan(demand).replicas.items() if k in api.pools(spec)}


def reached(stack, want: dict[str, int]) -> bool:
    cur = stack.replicas()
    return all(cur.get(k, 0) >= v for k, v in want.items())


def multimodal(prom_url: str) -> dict:
    """The multimodal sample (encoder, prefill and decode pools) with the closed-loop test's timings."""
    obj = yaml.safe_load((SAMPLES / "multimodal-epd.yaml").read_text())
    obj["metadata"] = {"name": "llm"}
    # Automatic burst headroom would add spare encoders after the start-up ramp; this test checks
    # that the encoder pool follows the media demand the planner sizes for, so it is off here.
    obj["spec"]["autoscaling"] = {
        **SHORT_LOOP,
        "prometheus": {"url": prom_url},
        "sizing": {"autoHeadroom": False},
    }
    for pool in obj["spec"]["pools"].values():
        pool["drain"] = {"timeoutSeconds": 120, "onTimeout": "readmit"}
    return obj


def test_media_load_step_grows_the_encoder_pool_and_prefill_with_it(stack):
    prompt, output, items = 3000, 200, 4
    obj = multimodal(stack.prom.url)
    stack.apply(obj)
    stack.start_operator()
    stack.wait_routable()
    # every request carries four images: the step at step_at multiplies the encoder's work by six
    step_at = 40
    started = time.monotonic()
    media = ("--media-fraction", "1", "--media-items", str(items))
    stack.start_emulator(*emulator_load(f"0:2,{step_at}:12", step_at + 80, prompt, output, *media))

    def demand(rate: float) -> planner.Demand:
        return planner.Demand(rate, prompt, 0, output, 0, media_fraction=1.0, items_per_request=items)

    low, high = planned_sizes(obj, demand(2.0)), planned_sizes(obj, demand(12.0))
    assert high["encoder"] > low["encoder"] and high["prefill"] > low["prefill"], (low, high)
    assert low["encoder"] == 1

    # Before the step the encoder pool takes the media and settles at the low-load size. The
    # windowed rate climbs for one window after the load starts, and the trend forecast may
    # grow the pools for that climb; the stabilization window then brings them back.
    def settled_low() -> bool:
        decision = stack.dd()["status"].get("lastDecision") or {}
        planned = (decision.get("outputs") or {}).get("planned") or {}
        return (
            (decision.get("inputs") or {}).get("metricsOk") is True
            and planned.get("encoder") == low["encoder"]
            and stack.replicas().get("encoder") == low["encoder"]
        )

    stack.cluster.wait_for(
        settled_low,
        timeout=max(1.0, started + step_at - 2 - time.monotonic()),
        interval=1,
        what=f"encoder pool settled at {low['encoder']} before the step\n{stack.debug()}",
    )
    time.sleep(max(0.0, started + step_at - time.monotonic()))
    t_step = time.monotonic()
    stack.cluster.wait_for(
        lambda: reached(stack, high),
        timeout=WINDOW + 4 * INTERVAL + 15,
        interval=1,
        what=f"pools at {high}\n{stack.debug()}",
    )
    grown_after = time.monotonic() - t_step
    assert grown_after <= WINDOW + 4 * INTERVAL + 15
    # The decision's record lands in status just after the replicas it applied.
    stack.cluster.wait_for(
        lambda: stack.dd()["status"]["lastDecision"]["outputs"]["planned"]["encoder"] >= high["encoder"],
        timeout=10,
        what=f"the decision that grew the encoder pool recorded in status\n{stack.debug()}",
    )
    summary = stack.wait_emulator(timeout=90)
    assert summary["requests"]["lost"] == 0, summary
    assert summary["pods_seen"].get("encoder", 0) >= high["encoder"], summary


def recorded_rate_is(stack, rate: float) -> bool:
    """Whether status.lastDecision records an arrival rate that the operator could not tell from
    `rate` over its WINDOW: it rewrites the record only for a move beyond that window's sampling
    noise (loop.rate_moved), so a rate recorded while the window still climbed may stay."""
    recorded = stack.dd()["status"]["lastDecision"]["inputs"].get("arrivalRps")
    return recorded is not None and not loop.rate_moved(rate, recorded, WINDOW, None)


def test_conditional_placement_scales_its_prefill_and_decode_pools(stack):
    # The vLLM deployment in conditional placement: 6,000-token prompts are above the split
    # threshold (~2,429 tokens), so every one is prefilled remotely; the loop must plan and apply
    # the spec's own prefill and decode pools (it used to plan a colocated pool and hold forever).
    prompt, output = 6000, 400
    obj = deployment_spec(stack.prom.url)
    obj["spec"]["placement"] = {"mode": "conditional"}
    stack.apply(obj)
    stack.start_operator()
    stack.wait_routable()
    stack.start_emulator(*emulator_load("0:2,20:8", 90, prompt, output))
    high = planned_sizes(obj, planner.Demand(8.0, prompt, 0, output))
    low = planned_sizes(obj, planner.Demand(2.0, prompt, 0, output))
    assert set(high) == {"prefill", "decode"}
    assert high["prefill"] > low["prefill"] and high["decode"] > low["decode"]
    time.sleep(20)
    t_step = time.monotonic()
    stack.cluster.wait_for(
        lambda: reached(stack, high),
        timeout=WINDOW + 4 * INTERVAL + 15,
        interval=1,
        what=f"pools at {high}\n{stack.debug()}",
    )
    assert time.monotonic() - t_step <= WINDOW + 4 * INTERVAL + 15
    decision = stack.dd()["status"]["lastDecision"]
    assert set(decision["outputs"]["planned"]) == {"prefill", "decode"}, decision
    # arrivals are counted on the decode pods (where every request of a conditional deployment
    # goes); the pools may have grown on the short window before the main one caught up
    stack.cluster.wait_for(
        lambda: recorded_rate_is(stack, 8.0),
        timeout=3 * INTERVAL + 5,
        interval=1,
        what=f"the measured arrival rate at 8 req/s\n{stack.debug()}",
    )
    summary = stack.wait_emulator(timeout=90)
    assert summary["requests"]["lost"] == 0, summary


def test_conditional_placement_prefills_short_prompts_on_decode(stack):
    # 1,500-token prompts, below the split threshold: the emulated decode pods prefill them, count
    # them as they admit them, and the loop grows decode while prefill stays at its minimum.
    prompt, output = 1500, 200
    obj = deployment_spec(stack.prom.url)
    obj["spec"]["placement"] = {"mode": "conditional"}
    stack.apply(obj)
    stack.start_operator()
    stack.wait_routable()
    stack.start_emulator(*emulator_load("0:2,15:12", 70, prompt, output))
    high = planned_sizes(obj, planner.Demand(12.0, prompt, 0, output))
    disaggregated = planned_sizes(deployment_spec(stack.prom.url), planner.Demand(12.0, prompt, 0, output))
    assert high["prefill"] == 1 and high["decode"] > disaggregated["decode"], (high, disaggregated)
    time.sleep(15)
    stack.cluster.wait_for(
        lambda: reached(stack, high),
        timeout=WINDOW + 4 * INTERVAL + 15,
        interval=1,
        what=f"pools at {high}\n{stack.debug()}",
    )
    # the decode pods count every request, the locally prefilled ones included
    stack.cluster.wait_for(
        lambda: recorded_rate_is(stack, 12.0),
        timeout=3 * INTERVAL + 5,
        interval=1,
        what=f"the measured arrival rate at 12 req/s\n{stack.debug()}",
    )
    assert stack.replicas()["prefill"] == 1, stack.debug()
    summary = stack.wait_emulator(timeout=90)
    assert summary["requests"]["lost"] == 0, summary
