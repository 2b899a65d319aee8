"""`disagg run` flags that reach the autoscaling loop: from the command line through the
operator's start-up options to the loop's own options."""

from __future__ import annotations

import asyncio
import types
from typing import Any

import pytest

from disagg import loop, names, runtime
from disagg.cli import main
from disagg.commands import checks


def started_loop_options(monkeypatch: pytest.MonkeyPatch, argv: list[str]) -> loop.LoopOptions:
    """Run `disagg run ARGV` up to Kopf (not started), then the operator's start-up with the
    options it left: the options the autoscaling loop would run with."""
    kopf = pytest.importorskip("kopf")
    from disagg import handlers

    monkeypatch.setattr(checks, "check_cluster_config", lambda _path: None)
    monkeypatch.setattr(kopf, "run", lambda **_: None)
    monkeypatch.setattr(handlers.State, "options", {})
    assert main(["run", "--metrics-port", "0", "--dashboard-port", "0", "--liveness-port", "0", *argv]) == 0
    seen: list[loop.LoopOptions] = []

    async def run_forever(_kube: Any, opts: loop.LoopOptions) -> None:
        seen.append(opts)

    monkeypatch.setattr(loop, "run_forever", run_forever)
    state = types.SimpleNamespace(options=handlers.State.options, kube=None, controller=None, tasks=[])

    async def start() -> None:
        await runtime.start(state)
        await asyncio.gather(*state.tasks)

    asyncio.run(start())
    assert len(seen) == 1
    return seen[0]


def test_decisions_at_once_reaches_the_loop(monkeypatch):
    assert started_loop_options(monkeypatch, []).concurrency == names.DECISIONS_AT_ONCE
    assert started_loop_options(monkeypatch, ["--decisions-at-once", "64"]).concurrency == 64


@pytest.mark.parametrize("value", ["0", "-3", str(names.DECISIONS_AT_ONCE_MAX + 1)])
def test_decisions_at_once_out_of_range_is_refused(capsys, value):
    assert main(["run", "--decisions-at-once", value]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        f"disagg run: error: --decisions-at-once must be between 1 and {names.DECISIONS_AT_ONCE_MAX}, "
        f"got {value}"
    )
