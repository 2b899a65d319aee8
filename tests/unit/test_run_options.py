"""`disagg run` flags that reach the autoscaling loop: from the command line through the
operator's start-up options to the loop's own options."""

from __future__ import annotations

import asyncio
import contextlib
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


@contextlib.asynccontextmanager
async def _until_paused():
    """Kopf's streaming block, reduced: its cleanup cancels a task and awaits it."""
    waiter = asyncio.create_task(asyncio.sleep(3600))
    try:
        yield waiter
    finally:
        waiter.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await waiter


async def infinite_watch():
    async with _until_paused():
        while True:
            yield "event"


def _stop_with_a_watch_stream_suspended(handler: Any) -> None:
    async def main() -> None:
        if handler is not None:
            asyncio.get_running_loop().set_exception_handler(handler)
        stream = infinite_watch()
        await stream.__anext__()  # the watcher took one event and is cancelled elsewhere
        main.stream = stream  # kept alive: the loop's shutdown closes it

    asyncio.run(main())


def test_a_watch_stream_closed_while_the_operator_stops_logs_one_line_not_an_error(caplog):
    caplog.set_level("INFO")
    _stop_with_a_watch_stream_suspended(None)  # what Kopf alone prints
    assert any(r.levelname == "ERROR" and "asynchronous generator" in r.getMessage() for r in caplog.records)
    caplog.clear()
    _stop_with_a_watch_stream_suspended(runtime.quiet_watch_close_at_shutdown)
    assert not [r for r in caplog.records if r.levelname == "ERROR"]
    (line,) = [r.getMessage() for r in caplog.records if r.name == "disagg.runtime"]
    assert "watch stream of Kopf was closed while the operator stopped" in line


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
