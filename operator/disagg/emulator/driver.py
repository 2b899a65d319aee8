"""The emulator's wall-clock driver, pod watcher and metrics server (asyncio, one thread).

`WallClockDriver` runs the clock-free fleet on ``time.monotonic``: it sleeps
until the earliest of the next emulated event and the next arrival, then
advances every emulated deployment to that instant. Arrivals are submitted at
their own scheduled time (events due before them are run first), so the
emulated timeline is exact and only its wall-clock visibility lags by the
loop's latency. The pod watcher (a list poll) and the metrics handler run on
the same loop: they advance the fleet to "now" before they touch it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from collections.abc import Callable
from typing import Any

from disagg.emulator.fleet import (
    POOLS,
    DeploymentEmulator,
    Fleet,
    admitted_fraction,
    format_summary,
    from_spec,
)
from disagg.names import ANNOTATION_DRAIN, LABEL_DEPLOYMENT, LABEL_POOL, READINESS_GATE

log = logging.getLogger("disagg.emulator")

INF = math.inf


class WallClockDriver:
    """Advances a `Fleet` on the wall clock and feeds it arrivals from a load source."""

    def __init__(
        self,
        fleet: Fleet,
        load: Any,
        *,
        duration_s: float = INF,
        clock: Callable[[], float] = time.monotonic,
        max_sleep_s: float = 0.05,
    ) -> None:
        self.fleet = fleet
        self.load = load
        self.duration_s = duration_s
        self.clock = clock
        self.max_sleep_s = max_sleep_s
        self.t0 = clock()
        self.stop = asyncio.Event()
        self.wakeups = 0
        if hasattr(load, "attach"):  # a stream per deployment (`PerDeploymentLoad`)
            load.attach(fleet, 0.0)

    def now(self) -> float:
        """Emulated time: seconds since the driver started."""
        return self.clock() - self.t0

    def step(self, now: float) -> None:
        """Submit every arrival due by `now` (each at its own time), then run events due by `now`."""
        load = self.load
        fleet = self.fleet
        routed = getattr(load, "submit", None)  # a load that picks each request's deployment
        t = load.next_arrival()
        while t <= now:
            fleet.advance(t)
            if routed is not None:
                routed(fleet, t)
            else:
                fleet.offer(load.pop(), t)
            t = load.next_arrival()
        fleet.advance(now)

    async def run(self) -> None:
        end = self.duration_s
        while not self.stop.is_set():
            now = self.now()
            self.step(min(now, end))
            if now >= end:
                break
            nxt = min(self.fleet.next_event_time(), self.load.next_arrival(), end)
            delay = min(max(0.0, nxt - self.now()), self.max_sleep_s)
            self.wakeups += 1
            await asyncio.sleep(delay)


# --------------------------------------------------------------------------- pods


def _cond(pod: dict, ctype: str) -> str | None:
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c.get("type") == ctype:
            return c.get("status")
    return None


def pod_address(pod: dict, default_port: int = 8000) -> tuple[str, int] | None:
    """(pod IP, engine HTTP port: the first container port not named "metrics"), None without an IP."""
    ip = (pod.get("status") or {}).get("podIP")
    if not ip:
        return None
    for c in (pod.get("spec") or {}).get("containers") or []:
        for port in c.get("ports") or []:
            if port.get("name") != "metrics" and port.get("containerPort"):
                return ip, int(port["containerPort"])
    return ip, default_port


def owner_key(pod: dict) -> tuple[str, str]:
    """(namespace, DisaggDeployment name) of a pool pod, from its labels."""
    meta = pod.get("metadata") or {}
    return meta.get("namespace", ""), (meta.get("labels") or {}).get(LABEL_DEPLOYMENT, "")


def pod_routable(pod: dict) -> bool:
    """Running, gate `disagg.dev/routable` True, not terminating, no drain annotation."""
    meta = pod.get("metadata") or {}
    if meta.get("deletionTimestamp") or ANNOTATION_DRAIN in (meta.get("annotations") or {}):
        return False
    return (pod.get("status") or {}).get("phase") == "Running" and _cond(pod, READINESS_GATE) == "True"


class PodWatcher:
    """Polls the pods of DisaggDeployments and keeps the fleet's emulated pods in step.

    * a Running pod whose gate ``disagg.dev/routable`` is True and that has no
      ``disagg.dev/drain`` annotation gets an emulated engine of its pool;
    * an emulated pod that stops being routable (gate False, drain annotation,
      terminating) is draining: no new work, in-flight work finishes; it is
      re-admitted if it becomes routable again;
    * an emulated pod missing from a successful list is gone: what it held is lost.
    """

    def __init__(
        self,
        kube: Any,
        fleet: Fleet,
        now: Callable[[], float],
        *,
        namespace: str | None = None,
        deployment: str | None = None,
        selector: str | None = None,
        engine: str | None = None,
        chunked: bool | None = None,
        failure_prob: float = 0.0,
        seed: int = 0,
    ) -> None:
        self.kube = kube
        self.fleet = fleet
        self.now = now
        self.namespace = namespace
        self.deployment = deployment
        self.selector = selector  # a label selector on DisaggDeployments (None: all)
        self.engine = engine
        self.chunked = chunked
        self.failure_prob = failure_prob
        self.seed = seed
        self.generations: dict = {}
        self.warned: set = set()
        self.errors = 0

    async def sync(self) -> None:
        from disagg.api import KIND

        dds = await self.kube.list(KIND, self.namespace, self.selector)
        selector = f"{LABEL_DEPLOYMENT}={self.deployment}" if self.deployment else LABEL_DEPLOYMENT
        pods = await self.kube.list("Pod", self.namespace, selector)
        specs = {}
        for dd in dds:
            m = dd["metadata"]
            if self.deployment and m["name"] != self.deployment:
                continue
            specs[(m["namespace"], m["name"])] = dd
        if self.selector:  # the pods of the selected objects only: others are another emulator's
            pods = [p for p in pods if owner_key(p) in specs]
        self.apply(specs, pods, self.now())

    def _deployment(self, key: tuple[str, str], dd: dict | None, now: float) -> DeploymentEmulator | None:
        fleet = self.fleet
        dep = fleet.deployment(*key)
        if dd is None:
            return dep
        gen = dd["metadata"].get("generation")
        if dep is None:
            try:
                dep = from_spec(
                    key[0],
                    key[1],
                    dd.get("spec") or {},
                    engine=self.engine,
                    chunked=self.chunked,
                    failure_prob=self.failure_prob,
                    max_queue=fleet.max_queue,
                    seed=self.seed,
                    now=now,
                )
            except ValueError as exc:
                if key not in self.warned:
                    self.warned.add(key)
                    log.warning("emulator: skipping DisaggDeployment %s/%s: invalid spec: %s", *key, exc)
                return None
            fleet.add_deployment(dep, now)
            self.generations[key] = gen
            log.info(
                "emulator: emulating DisaggDeployment %s/%s (%s, %s names)", *key, dep.placement, dep.engine
            )
        elif gen != self.generations.get(key):
            self.generations[key] = gen
            log.warning(
                "emulator: DisaggDeployment %s/%s changed (generation %s); service models of the running "
                "emulator are kept",
                *key,
                gen,
            )
        return dep

    def apply(self, specs: dict, pods: list[dict], now: float) -> None:
        """Reconcile the fleet with one consistent listing of DisaggDeployments and pods."""
        fleet = self.fleet
        for key, dd in specs.items():  # admission control: shed what the operator's plan does not admit
            dep = fleet.deployment(*key)
            if dep is not None:
                dep.set_admission(admitted_fraction(dd))
        seen = set()
        for pod in pods:
            meta = pod.get("metadata") or {}
            labels = meta.get("labels") or {}
            pool = labels.get(LABEL_POOL)
            dname = labels.get(LABEL_DEPLOYMENT)
            if pool not in POOLS or not dname:
                continue
            ns = meta.get("namespace", "")
            key = (ns, meta.get("name", ""), meta.get("uid", ""))
            emu = fleet.pods.get(key)
            routable = pod_routable(pod)
            fleet.addresses[key] = pod_address(pod)
            if emu is not None:
                seen.add(key)
                if emu.draining == routable:  # changed
                    emu.owner.set_pod_draining(emu, not routable, max(now, emu.owner.now))
                    log.info(
                        "emulator: pod %s/%s %s (in flight %d, pending KV sends %d)",
                        ns,
                        key[1],
                        "re-admitted" if routable else "draining",
                        emu.in_flight(),
                        emu.pending_kv_sends(),
                    )
                continue
            if not routable:
                continue
            dep = self._deployment((ns, dname), specs.get((ns, dname)), now)
            if dep is None:
                continue
            fleet.add_pod(dep, pool, key[1], key[2], max(now, dep.now))
            seen.add(key)
            log.info("emulator: pod %s/%s: emulated %s engine added", ns, key[1], pool)
        listed = {
            (
                (p.get("metadata") or {}).get("namespace", ""),
                p["metadata"].get("name", ""),
                p["metadata"].get("uid", ""),
            )
            for p in pods
            if p.get("metadata")
        }
        for key in [k for k in fleet.addresses if k not in listed]:
            del fleet.addresses[key]
        for key, emu in list(fleet.pods.items()):
            if key not in seen:
                held = emu.in_flight() + emu.pending_kv_sends()
                lost = fleet.remove_pod(emu, max(now, emu.owner.now))
                log.log(
                    logging.WARNING if lost else logging.INFO,
                    "emulator: pod %s/%s gone (%s); %d requests lost",
                    key[0],
                    key[1],
                    "held work" if held else "idle",
                    lost,
                )

    async def run(self, interval_s: float, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await self.sync()
            except Exception as exc:  # keep emulating; a failed list removes nothing
                self.errors += 1
                log.warning("emulator: listing pods failed (%s); keeping the current fleet", exc)
            try:
                await asyncio.wait_for(stop.wait(), interval_s)
            except TimeoutError:
                pass


# --------------------------------------------------------------------------- metrics server


async def serve_metrics(registry: Any, host: str, port: int, summary: Callable[[], dict] | None = None):
    """Serve /metrics (and /summary) with aiohttp on the running loop; returns (runner, port)."""
    from aiohttp import web
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    async def metrics(_request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def summ(_request: web.Request) -> web.Response:
        return web.json_response(summary() if summary else {})

    async def health(_request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/summary", summ)
    app.router.add_get("/healthz", health)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = port
    server = getattr(site, "_server", None)
    if server is not None and server.sockets:
        bound = server.sockets[0].getsockname()[1]
    return runner, bound


# --------------------------------------------------------------------------- the whole run


async def emulate(
    fleet: Fleet,
    load: Any,
    *,
    duration_s: float,
    metrics_host: str = "127.0.0.1",
    metrics_port: int = 9400,
    watcher_factory: Callable[[Callable[[], float]], PodWatcher] | None = None,
    poll_interval_s: float = 0.5,
    grace_s: float = 0.0,
    on_ready: Callable[[int], None] | None = None,
    serve: Callable[[Callable[[], float], Callable[[], bytes]], Any] | None = None,
) -> dict:
    """Run the emulator until `duration_s` (or a signal); returns the summary dict."""
    import signal

    from disagg.emulator.metrics import build_registry

    driver = WallClockDriver(fleet, load, duration_s=duration_s)
    cpu0 = time.process_time()

    def before_collect() -> None:
        fleet.flush(driver.now())

    registry = build_registry(fleet, before_collect)
    runner = None
    port = metrics_port
    if metrics_port >= 0:
        runner, port = await serve_metrics(registry, metrics_host, metrics_port, fleet.summary)
        log.info("emulator: metrics on http://%s:%d/metrics", metrics_host, port)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, driver.stop.set)
        except (NotImplementedError, RuntimeError):  # pragma: no cover - not on the main thread
            pass
    tasks = []
    watcher = None
    if watcher_factory is not None:
        watcher = watcher_factory(driver.now)
        try:
            await watcher.sync()  # first listing before any arrival
        except Exception as exc:
            log.warning("emulator: first pod listing failed: %s", exc)
        tasks.append(asyncio.create_task(watcher.run(poll_interval_s, driver.stop)))
    server = None
    if serve is not None:  # the pods' OpenAI-compatible servers (disagg.emulator.http)
        from prometheus_client import generate_latest

        server = serve(driver.now, lambda: generate_latest(registry))
        await server.sync()
        tasks.append(asyncio.create_task(server.run(poll_interval_s, driver.stop)))
    if on_ready is not None:
        on_ready(port)
    try:
        await driver.run()
        if grace_s > 0 and not driver.stop.is_set():
            # Arrivals have stopped; let in-flight work finish (bounded).
            driver.load = _NoLoad()
            driver.duration_s = driver.now() + grace_s
            await driver.run()
        fleet.flush(driver.now())
    finally:
        driver.stop.set()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if server is not None:
            await server.close()
        if runner is not None:
            await runner.cleanup()
    out = fleet.summary()
    if server is not None:
        out["http"] = server.summary()
    wall = driver.now()
    out["wall_s"] = wall
    out["cpu_s"] = time.process_time() - cpu0
    out["cpu_per_wall_s"] = out["cpu_s"] / wall if wall > 0 else None
    out["deployments"] = [f"{d.namespace}/{d.name}" for d in fleet.deployments.values()]
    if watcher is not None:
        out["list_errors"] = watcher.errors
    return out


class _NoLoad:
    def next_arrival(self) -> float:
        return INF

    def pop(self):  # pragma: no cover - never called
        raise IndexError


def write_summary(summary: dict, path: str | None) -> None:
    print(format_summary(summary), flush=True)
    if path:
        with open(path, "w") as fh:
            json.dump(summary, fh, indent=2, sort_keys=True)
            fh.write("\n")
