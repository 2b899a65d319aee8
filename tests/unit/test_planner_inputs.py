"""One translation of a spec into planner inputs (api.planner_inputs), used by the autoscaler,
the emulator and `disagg plan --from`: the three agree on every sample."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import yaml

from disagg import api, autoscaler, planner
from disagg.commands import plan as plan_cmd
from disagg.emulator import fleet

SAMPLES = sorted((Path(__file__).resolve().parents[2] / "config" / "samples").glob("*.yaml"))


@pytest.mark.parametrize("path", SAMPLES, ids=[p.stem for p in SAMPLES])
def test_operator_emulator_and_plan_cli_read_a_spec_alike(path: Path) -> None:
    _check_read_alike(path)


def test_a_ttft_target_growing_with_the_prompt_reaches_every_reader(tmp_path: Path) -> None:
    doc = yaml.safe_load((SAMPLES[-1]).read_text())
    doc["spec"]["slo"]["ttftSecondsPerThousandTokens"] = 0.05
    path = tmp_path / "growing.yaml"
    path.write_text(yaml.safe_dump(doc))
    inputs = _check_read_alike(path)
    assert inputs.slo.ttft_s_per_1k_tokens == 0.05


def _check_read_alike(path: Path) -> api.PlannerInputs:
    raw = yaml.safe_load(path.read_text())["spec"]
    spec = api.parse_spec(raw)
    inputs = api.planner_inputs(spec)
    assert autoscaler.config_from_spec(spec).planning == inputs
    emu = fleet.from_spec("ns", "x", raw)
    assert emu.models == inputs.models
    assert emu.cfg.split_threshold == min(inputs.split_threshold_tokens(), 10_000_000)

    args = argparse.Namespace(**{k: None for k in plan_cmd.DEFAULTS}, from_file=str(path))
    for pool in plan_cmd.POOL_NAMES:
        for what in ("min_replicas", "max_replicas", "gpus_per_replica"):
            setattr(args, f"{pool}_{what}", None)
    vals = plan_cmd._resolve(args)
    _demand, models, slo, bounds, budget = plan_cmd._build(vals)
    m, want = models, inputs.models
    assert (m.encoder, m.transfer, m.decode) == (want.encoder, want.transfer, want.decode)
    # the CLI has no prefill chunk flag (the planner does not read it): the rest must agree
    p, q = m.prefill, want.prefill
    assert (p.fixed_ms, p.ms_per_token, p.ms_per_token_sq) == (q.fixed_ms, q.ms_per_token, q.ms_per_token_sq)
    assert (slo, budget, vals["placement"], vals["chunked"]) == (
        inputs.slo,
        inputs.budget,
        inputs.placement,
        inputs.chunked,
    )
    assert {k: b for k, b in bounds.items() if k in inputs.bounds} == inputs.bounds
    d = planner.Demand(arrival_rps=3.0, prompt_tokens_mean=2000, output_tokens_mean=200)
    cli_plan = planner.plan(d, models, slo, bounds, budget, vals["placement"], chunked=vals["chunked"])
    assert cli_plan.replicas == inputs.plan(d).replicas
    return inputs
