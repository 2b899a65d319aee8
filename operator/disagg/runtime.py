"""Background services of `disagg run`: the operator's metrics endpoint, the dashboard and the
autoscaling loop. Started from the Kopf startup handler, stopped by its cleanup handler."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from prometheus_client import start_http_server

from disagg import loop, opmetrics

log = logging.getLogger("disagg.runtime")


def quiet_watch_close_at_shutdown(loop_: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """The event loop's exception handler: one line, not a traceback, for Kopf's watch stream
    closed by the loop while the operator stops.

    When Kopf stops while its watcher waits on a busy worker queue, the watch stream (an async
    generator, `infinite_watch`) is left suspended and the loop closes it later; its cleanup
    (which awaits the cancelled pause waiter) does not end as that close requires ("generator
    didn't stop after athrow()"). The stream was ending anyway: no event is lost that the next operator's
    initial LIST does not deliver again. Every other error goes to the default handler."""
    exc, gen = context.get("exception"), context.get("asyncgen")
    if (
        isinstance(exc, RuntimeError)
        and "didn't stop after athrow()" in str(exc)
        and getattr(gen, "__qualname__", "") == "infinite_watch"
    ):
        log.info("a watch stream of Kopf was closed while the operator stopped (%s)", exc)
        return
    loop_.default_exception_handler(context)


async def start(state: Any) -> None:
    asyncio.get_running_loop().set_exception_handler(quiet_watch_close_at_shutdown)
    opts = state.options
    bind = opts.get("bind", "127.0.0.1")
    namespaces = tuple(opts.get("namespaces") or ())
    if opts.get("metrics_port"):
        start_http_server(opts["metrics_port"], addr=bind, registry=opmetrics.REGISTRY)
        log.info("operator metrics on http://%s:%s/metrics", bind, opts["metrics_port"])
    if opts.get("dashboard_port"):
        from disagg.dashboard.server import ClusterSource, bound_url, serve

        source = ClusterSource(
            state.kube, namespace=namespaces[0] if len(namespaces) == 1 else None, interval=2.0
        )
        runner = await serve(source, host=bind, port=opts["dashboard_port"])
        log.info("dashboard on %s", bound_url(runner))

        async def keep() -> None:
            try:
                await asyncio.Event().wait()
            finally:
                await source.close()
                await runner.cleanup()

        state.tasks.append(asyncio.create_task(keep(), name="disagg-dashboard"))
    if opts.get("autoscaler", True):
        lo = loop.LoopOptions(
            tick_s=float(opts.get("tick_s", 1.0)),
            prometheus_url=opts.get("prometheus_url"),
            namespaces=namespaces,
            # The watches' cache: the loop reads pools and pods from it, never LISTs them per tick.
            cache=state.controller.cache if state.controller is not None else None,
            shard_selector=opts.get("shard_selector"),
            concurrency=int(opts.get("decisions_at_once", loop.DEFAULT_CONCURRENCY)),
        )
        state.tasks.append(asyncio.create_task(loop.run_forever(state.kube, lo), name="disagg-autoscaler"))
