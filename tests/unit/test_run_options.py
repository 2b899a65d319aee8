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


async def infinite_watch():
    """Named as Kopf's watch stream (kopf._cogs.clients.watching.infinite_watch)."""
    yield "event"


def _closing_error(gen: object, message: str = "generator didn't stop after athrow()") -> dict:
    """The context asyncio's shutdown_asyncgens hands the loop's handler for a stream it closed."""
    return {
        "message": f"an error occurred during closing of asynchronous generator {gen!r}",
        "exception": RuntimeError(message),
        "asyncgen": gen,
    }


def test_a_watch_stream_closed_while_the_operator_stops_logs_one_line_not_an_error(caplog):
    caplog.set_level("INFO")

    async def main() -> None:
        loop_ = asyncio.get_running_loop()
        stream = infinite_watch()
        runtime.quiet_watch_close_at_shutdown(loop_, _closing_error(stream))
        await stream.aclose()

    asyncio.run(main())
    assert not [r for r in caplog.records if r.levelname == "ERROR"]
    (line,) = [r.getMessage() for r in caplog.records if r.name == "disagg.runtime"]
    assert "watch stream of Kopf was closed while the operator stopped" in line


def test_other_generators_closing_errors_still_reach_the_default_handler(caplog):
    async def another_stream():
        yield "event"

    async def main() -> None:
        loop_ = asyncio.get_running_loop()
        for gen, message in (
            (another_stream(), "generator didn't stop after athrow()"),
            (infinite_watch(), "something else"),
        ):
            runtime.quiet_watch_close_at_shutdown(loop_, _closing_error(gen, message))
            await gen.aclose()

    asyncio.run(main())
    assert len([r for r in caplog.records if r.levelname == "ERROR"]) == 2


def test_other_loop_errors_still_reach_the_default_handler(caplog):
    async def main() -> None:
        loop_ = asyncio.get_running_loop()
        runtime.quiet_watch_close_at_shutdown(
            loop_, {"message": "Task exception was never retrieved", "exception": RuntimeError("boom")}
        )

    asyncio.run(main())
    assert [r.getMessage() for r in caplog.records if r.levelname == "ERROR"] == [
        "Task exception was never retrieved"
    ]
