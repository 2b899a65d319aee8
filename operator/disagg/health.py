"""The operator's probe endpoints, served from the first moment of start-up.

* `/healthz` (liveness): 200 whenever the event loop answers. Served before the Lease is
  acquired, so a standby replica is alive, not crash-looped by its liveness probe.
* `/readyz` (readiness): 200 only on the replica that acts (it holds the Lease, or leader
  election is off) once start-up is done; 503 on a standby.

Served by the operator's own event loop (aiohttp), so a blocked loop fails the probe.
"""

from __future__ import annotations

from dataclasses import dataclass

from aiohttp import web


@dataclass
class Health:
    """What the probes report; the start-up handler flips `leading` once this replica acts."""

    leading: bool = False


def make_app(health: Health) -> web.Application:
    async def healthz(_: web.Request) -> web.Response:
        return web.json_response({"alive": True})

    async def readyz(_: web.Request) -> web.Response:
        if health.leading:
            return web.json_response({"ready": True, "leading": True})
        return web.json_response({"ready": False, "leading": False, "reason": "standby"}, status=503)

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    return app


async def serve(health: Health, host: str, port: int) -> web.AppRunner:
    """Start the probe server in the running loop; `await runner.cleanup()` stops it."""
    runner = web.AppRunner(make_app(health), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner
