"""Probe endpoints: alive from the start, ready only on the replica that acts."""

from __future__ import annotations

import asyncio

import aiohttp

from disagg import health
from disagg.devtools.prometheus import free_port


def test_standby_is_alive_but_not_ready_until_it_leads():
    async def main() -> list[tuple[str, int]]:
        state = health.Health()
        runner = await health.serve(state, "127.0.0.1", 0)
        host, port = runner.addresses[0][:2]
        out = []
        try:
            async with aiohttp.ClientSession() as s:
                for leading in (False, True):
                    state.leading = leading
                    for path in ("/healthz", "/readyz"):
                        async with s.get(f"http://{host}:{port}{path}") as r:
                            out.append((f"{path} leading={leading}", r.status))
        finally:
            await runner.cleanup()
        return out

    assert asyncio.run(main()) == [
        ("/healthz leading=False", 200),
        ("/readyz leading=False", 503),
        ("/healthz leading=True", 200),
        ("/readyz leading=True", 200),
    ]


def test_startup_serves_probes_before_waiting_for_the_lease(monkeypatch):
    """The start-up handler opens the probe port before it blocks on the Lease."""
    from disagg import handlers

    seen: dict[str, object] = {}

    class BlockedElector:
        def __init__(self, *a, **k) -> None:
            pass

        async def acquire(self) -> None:
            seen["runner_while_waiting"] = handlers.State.health_runner
            seen["leading_while_waiting"] = handlers.State.health.leading
            raise RuntimeError("stop here")

    class FakeKube:
        async def close(self) -> None:
            pass

    async def connect(*a, **k):
        return FakeKube()

    class Settings:
        class _NS:
            pass

        peering = _NS()
        scanning = _NS()
        posting = _NS()
        watching = _NS()
        networking = _NS()

    monkeypatch.setattr(handlers, "LeaderElector", BlockedElector)
    monkeypatch.setattr(handlers.Kube, "connect", staticmethod(connect))
    monkeypatch.setattr(
        handlers.State,
        "options",
        {"health_port": free_port(), "bind": "127.0.0.1", "leader_election": ("ns", "l")},
    )

    async def main() -> None:
        try:
            await handlers.startup(settings=Settings())
        except RuntimeError:
            pass
        await handlers.cleanup()

    asyncio.run(main())
    assert seen["runner_while_waiting"] is not None
    assert seen["leading_while_waiting"] is False
