"""A decision says when the KV link, not the compute, sets the prefill pool's size."""

from __future__ import annotations

from dataclasses import replace

from disagg import autoscaler, evaluate, planner, policy
from disagg.autoscaler import Observation, PoolObservation, ScalerState

SETTINGS = evaluate.EvalSettings()  # the worked example's models: a 22 GiB/s link
T0 = 10_000.0


def _config(gibps: float | None = None, **sizing: bool) -> autoscaler.Config:
    s = SETTINGS
    if gibps is not None:
        m = s.models
        s = replace(s, models=replace(m, transfer=replace(m.transfer, bandwidth_gibps=gibps)))
    if sizing:
        s = replace(s, sizing=sizing)
    return autoscaler.config_from_spec(evaluate.spec_for(s, "disaggregated"))


def _decide(config: autoscaler.Config) -> autoscaler.Outcome:
    o = Observation(
        now=T0,
        metrics_ok=True,
        pools={"prefill": PoolObservation(2), "decode": PoolObservation(3)},
        arrival_rps=4.0,
        prompt_tokens_mean=2000.0,
        output_tokens_mean=200.0,
        ttft_observed_s=0.3,
    )
    st = ScalerState(policy=policy.PolicyState(first_seen=0.0, last_action=0.0))
    return autoscaler.decide(config, o, st)


def _link_notes(out: autoscaler.Outcome) -> list[str]:
    return [n for n in out.record.notes if n.startswith("the KV link sets the prefill pool's size")]


def test_a_link_slower_than_the_compute_is_named_with_its_figures_and_the_switch_that_helps() -> None:
    """At 1 GiB/s a 2,000-token prompt's 625 MiB of KV keeps its worker's link busy ~0.6 s, its
    prefill takes 0.09 s: the note gives both and points at spec.autoscaling.sizing.requestSizes."""
    out = _decide(_config(1.0))
    (note,) = _link_notes(out)
    plan = planner.plan(
        planner.Demand(arrival_rps=4.0, prompt_tokens_mean=2000.0, output_tokens_mean=200.0),
        _config(1.0).planning.models,
    )
    link_ms, compute_ms = plan.stages["transfer.link_busy_ms"], plan.stages["prefill.service_ms"]
    assert 550 < link_ms < 700 and compute_ms < 100  # 2,000 x 320 KiB at 1 GiB/s; 20 + 0.035 x 2,000
    assert f"{link_ms:.0f} ms of link per request against {compute_ms:.0f} ms of compute" in note
    assert "spec.kvTransfer.bandwidthGiBps" in note
    assert note.endswith("spec.autoscaling.sizing.requestSizes sizes for them")
    # with the size classes on, it only says what binds
    (sized,) = _link_notes(_decide(_config(1.0, requestSizes=True)))
    assert "requestSizes" not in sized


def test_the_models_own_link_says_nothing() -> None:
    """22 GiB/s carries a 2,000-token prompt's KV in ~28 ms, under its 90 ms of compute."""
    out = _decide(_config())
    assert out.record.planned and not _link_notes(out)  # a plan was made, and it names no link
    plan_stages = planner.plan(
        planner.Demand(arrival_rps=4.0, prompt_tokens_mean=2000.0, output_tokens_mean=200.0)
    ).stages
    assert 0 < plan_stages["transfer.link_busy_ms"] < plan_stages["prefill.service_ms"]
