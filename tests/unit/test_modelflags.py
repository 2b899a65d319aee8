"""`disagg plan`, `simulate` and `evaluate` take their service-model flags from one table."""

from __future__ import annotations

import pytest

from disagg.cli import build_parser
from disagg.commands import evaluate as evaluate_cmd
from disagg.commands import modelflags
from disagg.commands import plan as plan_cmd


def test_plan_and_evaluate_defaults_come_from_the_table() -> None:
    table = modelflags.defaults()
    assert table["prefill_ms_per_token"] == 0.035 and table["decode_slots"] == 32  # the worked example
    assert {k: plan_cmd.DEFAULTS[k] for k in table} == table
    want = {k: table[k] for k in evaluate_cmd.MODEL_NAMES} | {"percentile": 0.99}
    assert want == evaluate_cmd.MODEL_DEFAULTS


@pytest.mark.parametrize("command", ["plan", "evaluate"])
def test_unset_flags_parse_to_none_so_files_and_defaults_can_fill_them(command: str) -> None:
    extra = ["--trace", "t.csv"] if command == "evaluate" else []
    args = build_parser().parse_args([command, *extra, "--decode-slots", "16"])
    assert args.decode_slots == 16 and args.prefill_fixed_ms is None and args.ttft is None


def test_simulate_takes_the_table_defaults() -> None:
    args = build_parser().parse_args(["simulate"])
    for name in modelflags.MODEL_FLAGS:
        assert getattr(args, name) == modelflags.FLAGS[name][1], name
    assert (args.ttft, args.itl) == (0.6, 0.15)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["simulate", "--decode-slots", "many"])
