"""Pure helpers of the autoscaling decision: lead time, demand, configuration from the spec, budget fit."""

from __future__ import annotations

from pathlib import Path

import yaml

from disagg import api, autoscaler, metrics, planner

SAMPLE = Path(__file__).resolve().parents[2] / "config" / "samples" / "vllm-disaggregated-70b.yaml"


def demand_from(snap: metrics.Snapshot, rate: float, shape: dict[str, float]) -> planner.Demand:
    """The demand the operator's decision plans for, from a snapshot's values (loop.observation)."""
    v = snap.values
    obs = autoscaler.Observation(
        now=snap.time,
        metrics_ok=True,
        pools={},
        prompt_tokens_mean=v.get("prompt_tokens_mean"),
        output_tokens_mean=v.get("output_tokens_mean"),
        media_fraction=metrics.media_fraction(v),
        media_items_per_request=metrics.media_items_per_request(v),
    )
    return autoscaler.demand_for(obs, rate, shape)


def plan_for(spec: api.DisaggDeploymentSpec, demand: planner.Demand) -> planner.Plan:
    return api.planner_inputs(spec).plan(demand)


def pooled(plan: planner.Plan, spec: api.DisaggDeploymentSpec) -> dict[str, int]:
    return autoscaler._pooled(plan, tuple(api.pools(spec)))


def admitted(name, created, admitted_at, reason="Admitted"):
    return {
        "metadata": {"name": name, "creationTimestamp": created},
        "status": {
            "conditions": [
                {
                    "type": "disagg.dev/routable",
                    "status": "True",
                    "reason": reason,
                    "lastTransitionTime": admitted_at,
                }
            ]
        },
    }


def test_lead_time_is_the_median_observed_startup():
    pods = [
        admitted("a", "2026-01-01T00:00:00Z", "2026-01-01T00:00:30Z"),
        admitted("b", "2026-01-01T00:00:00Z", "2026-01-01T00:01:30Z"),
        admitted("c", "2026-01-01T00:00:00Z", "2026-01-01T00:00:45Z"),
        admitted("readmitted", "2026-01-01T00:00:00Z", "2026-01-01T05:00:00Z", reason="Readmitted"),
    ]
    seen = autoscaler.startup_seconds(pods)
    assert seen == {"a": 30.0, "b": 90.0, "c": 45.0}  # a re-admission after a drain is not a start-up
    assert autoscaler.lead_time(list(seen.values())) == 45.0
    assert autoscaler.lead_time([]) == autoscaler.DEFAULT_LEAD_S
    assert autoscaler.lead_time([2000.0]) == 600.0


def test_policy_config_follows_the_spec():
    spec = api.parse_spec(yaml.safe_load(SAMPLE.read_text())["spec"])
    cfg = autoscaler.config_from_spec(spec).policy_config(lead_s=42.0)
    assert cfg.forecast_horizon_s == 42.0
    assert cfg.gpus_per_replica == {k: p.gpus_per_replica for k, p in api.pools(spec).items()}
    assert cfg.gpu_budget == spec.autoscaling.gpu_budget
    assert cfg.max_step_down == spec.autoscaling.max_scale_down_step
    assert cfg.headroom == 0.0  # no standing spare capacity unless the spec asks for it
    raw = yaml.safe_load(SAMPLE.read_text())["spec"]
    raw["autoscaling"]["headroom"] = 0.3
    assert autoscaler.config_from_spec(api.parse_spec(raw)).base_policy.headroom == 0.3
    # no step limits unless the spec sets them: a burst on a large pool needs all its workers at once
    for key in ("maxScaleUpStep", "maxScaleDownStep"):
        raw["autoscaling"].pop(key, None)
    unlimited = autoscaler.config_from_spec(api.parse_spec(raw)).base_policy
    assert unlimited.max_step_up is None and unlimited.max_step_down is None


def test_demand_uses_measured_shape_and_never_invents_tokens():
    def obs(prompt, output):
        return autoscaler.Observation(
            now=0.0,
            metrics_ok=True,
            pools={},
            prompt_tokens_mean=prompt,
            prompt_tokens_std=300.0,
            output_tokens_mean=output,
        )

    last: dict[str, float] = {}
    d = autoscaler.demand_for(obs(1200.0, float("nan")), 4.5, last)
    assert d.arrival_rps == 4.5 and d.prompt_tokens_mean == 1200.0 and d.prompt_tokens_std == 300.0
    assert d.output_tokens_mean == 1.0  # never measured: the smallest valid value, not a guess
    assert d.media_fraction == 0.0  # no media figure observed: no media
    autoscaler.demand_for(obs(1200.0, 400.0), 4.5, last)
    # no request finished in this window: the last measured mean holds
    assert autoscaler.demand_for(obs(1200.0, float("nan")), 4.5, last).output_tokens_mean == 400.0
    assert autoscaler.demand_for(obs(1200.0, None), 4.5, last).output_tokens_mean == 400.0


def test_growth_waits_while_draining_pods_still_hold_the_budget():
    spec = api.parse_spec(yaml.safe_load(SAMPLE.read_text())["spec"])
    spec.autoscaling.gpu_budget = 24
    gpr = {k: p.gpus_per_replica for k, p in api.pools(spec).items()}  # prefill 4, decode 2
    deps = {"prefill": {"spec": {"replicas": 2}}, "decode": {"spec": {"replicas": 6}}}

    def pods(pool, n):
        return [
            {
                "metadata": {"name": f"{pool}-{i}", "labels": {"disagg.dev/pool": pool}},
                "status": {"phase": "Running"},
            }
            for i in range(n)
        ]

    config = autoscaler.config_from_spec(spec)

    def observe(n_prefill, n_decode):
        return autoscaler.Observation(
            now=0.0,
            metrics_ok=True,
            pools={
                "prefill": autoscaler.pool_observation(deps["prefill"], pods("prefill", n_prefill)),
                "decode": autoscaler.pool_observation(deps["decode"], pods("decode", n_decode)),
            },
        )

    # 2x4 + 8x2 = 24 GPUs held: two decode pods are still draining although the policy
    # already counts them as gone, so a third prefill replica (4 GPUs) must wait.
    fits, deferred = autoscaler.fit_growth_in_budget(config, observe(2, 8), {"prefill": 3})
    assert fits == {} and deferred == {"prefill": 1}
    assert gpr["prefill"] * 2 + gpr["decode"] * 8 == 24
    # Once they are gone (6 decode pods: 20 GPUs), it fits.
    fits, deferred = autoscaler.fit_growth_in_budget(config, observe(2, 6), {"prefill": 3})
    assert fits == {"prefill": 3} and deferred == {}


def _conditional_spec(**placement):
    raw = yaml.safe_load(SAMPLE.read_text())["spec"]
    raw["placement"] = {"mode": "conditional", **placement}
    return api.parse_spec(raw)


def test_conditional_spec_gets_planned_sizes_for_its_own_pools():
    # 8 req/s of 6,000-token prompts on the vLLM sample in conditional placement: every prompt
    # is above the split threshold, so the plan is the disaggregated one, keyed by the spec's pools.
    spec = _conditional_spec()
    snap = metrics.Snapshot(time=0.0, values={"prompt_tokens_mean": 6000.0, "output_tokens_mean": 400.0})
    plan = plan_for(spec, demand_from(snap, 8.0, {}))
    planned = pooled(plan, spec)
    assert set(planned) == {"prefill", "decode"}
    raw = yaml.safe_load(SAMPLE.read_text())["spec"]
    disagg = plan_for(api.parse_spec(raw), demand_from(snap, 8.0, {}))
    assert planned == pooled(disagg, spec)
    assert planned["prefill"] > spec.pools.prefill.min_replicas  # a real plan, not the minimum


def test_conditional_spec_threshold_moves_short_prompts_to_decode():
    snap = metrics.Snapshot(time=0.0, values={"prompt_tokens_mean": 1500.0, "output_tokens_mean": 400.0})
    demand = demand_from(snap, 16.0, {})
    local = plan_for(_conditional_spec(splitThresholdTokens=4000), demand)
    remote = plan_for(_conditional_spec(splitThresholdTokens=1000), demand)
    assert local.remote_fraction == 0.0 and remote.remote_fraction == 1.0
    assert local.split_threshold_tokens == 4000 and remote.split_threshold_tokens == 1000
    assert local.replicas["prefill"] < remote.replicas["prefill"]
    assert local.replicas["decode"] > remote.replicas["decode"]


def media_snapshot(arrival_rps: float, media_rps: float, media_items_rps: float) -> metrics.Snapshot:
    """A snapshot of 1,000-token prompts and 200-token outputs with this arrival and media mix."""
    return metrics.Snapshot(
        time=0.0,
        values={
            "arrival_rps": arrival_rps,
            "prompt_tokens_mean": 1000.0,
            "output_tokens_mean": 200.0,
            "media_rps": media_rps,
            "media_items_rps": media_items_rps,
        },
    )


def test_demand_takes_the_media_mix_from_the_encoder_metrics():
    snap = media_snapshot(8.0, 2.0, 6.0)
    last: dict[str, float] = {}
    d = demand_from(snap, 10.0, last)
    assert d.arrival_rps == 10.0 and d.media_fraction == 0.25 and d.items_per_request == 3.0
    del snap.values["media_rps"], snap.values["media_items_rps"]  # encoder pods not reporting
    d = demand_from(snap, 10.0, last)
    assert d.media_fraction == 0.25 and d.items_per_request == 3.0


def test_multimodal_sample_plans_the_encoder_with_the_media_load():
    sample = SAMPLE.parent / "multimodal-epd.yaml"
    spec = api.parse_spec(yaml.safe_load(sample.read_text())["spec"])

    def planned(rate: float, media_rps: float) -> dict[str, int]:
        snap = media_snapshot(rate, media_rps, 4 * media_rps)
        return pooled(plan_for(spec, demand_from(snap, rate, {})), spec)

    text = planned(8.0, 0.0)
    media = planned(8.0, 8.0)
    assert set(media) == {"encoder", "prefill", "decode"}
    assert text["encoder"] == spec.pools.encoder.min_replicas
    assert media["encoder"] > text["encoder"]  # 8 req/s x 4 images x 35 ms: more than one encoder


def test_colocated_spec_keeps_its_encoder_pool_in_the_plan():
    raw = yaml.safe_load((SAMPLE.parent / "colocated.yaml").read_text())["spec"]
    encoder = yaml.safe_load((SAMPLE.parent / "multimodal-epd.yaml").read_text())["spec"]["pools"]["encoder"]
    raw["pools"]["encoder"] = encoder
    spec = api.parse_spec(raw)
    snap = media_snapshot(8.0, 8.0, 32.0)
    planned = pooled(plan_for(spec, demand_from(snap, 8.0, {})), spec)
    assert set(planned) == {"encoder", "colocated"}
    assert planned["encoder"] > spec.pools.encoder.min_replicas  # 8 req/s x 4 images x 35 ms


def test_a_decision_looks_ahead_to_when_the_next_decisions_workers_serve():
    raw = yaml.safe_load(SAMPLE.read_text())["spec"]
    raw.setdefault("autoscaling", {}).update({"intervalSeconds": 20, "scrapeIntervalSeconds": 10})
    config = autoscaler.config_from_spec(api.parse_spec(raw))
    # observation up to a scrape old + start-up + one interval until the next decision's workers
    assert config.decision_lead(45.0) == 45.0 + 20.0 + 10.0
    obs = autoscaler.Observation(now=100.0, metrics_ok=False, pools={}, startups={"a": 45.0})
    out = autoscaler.decide(config, obs, autoscaler.ScalerState())
    assert out.record.lead_time_s == 75.0
