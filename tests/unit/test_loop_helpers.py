"""Pure helpers of the autoscaling decision: lead time, demand, configuration from the spec, budget fit."""

from __future__ import annotations

from pathlib import Path

import yaml

from disagg import api, autoscaler

SAMPLE = Path(__file__).resolve().parents[2] / "config" / "samples" / "vllm-disaggregated-70b.yaml"


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
