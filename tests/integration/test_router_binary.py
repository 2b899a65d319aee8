"""The real P/D routers (vllm-router 0.1.17, sglang-router 0.3.2 from PyPI) in front of the emulated fleet.

No cluster: the emulator serves a fixed fleet (`disagg emulate --standalone --serve`) on
127.2.x.y addresses and the router gets the worker URLs on its command line. Clients are
the `openai` SDK. Checks: the router's P/D handshake works against the emulated engines
(vLLM kv_transfer_params, SGLang bootstrap rooms); every stream ends with its final
chunk and usage; client-side TTFT and ITL follow the service-time models; a worker taken
out with the router's removal API gets no new request while its in-flight streams finish.
Load is bounded (tens of requests); everything stays on loopback.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass

import openai
import pytest
from router_util import StandaloneFleet, StaticRouter, router_binary

from disagg import metrics
from disagg.emulator.fleet import DeploymentEmulator
from disagg.emulator.metrics import NAMES
from disagg.model import StageModels
from prereqs import missing_prerequisite

pytestmark = pytest.mark.timeout(300)

ENGINES = ["vllm", "sglang"]
FIRST_ADDRESS = {"vllm": "127.2.40.2", "sglang": "127.2.41.2"}
DRAIN_ADDRESS = {"vllm": "127.2.42.2", "sglang": "127.2.43.2"}
PENDING_ADDRESS = "127.2.44.2"
LATE_S = 0.15  # a token may come this much later than the model on a loaded 2-core machine
EARLY_S = 0.01


def needs(engine: str) -> None:
    if router_binary(engine) is None:
        missing_prerequisite(f"the {engine} router (hack/routers.sh installs the pinned one)")


def model_ttft(prompt: int) -> tuple[float, float]:
    """(TTFT, decode step) of the worked example's models for one request on idle pools."""
    d = DeploymentEmulator("x", "y", StageModels())
    return d.prefill_s(prompt) + d.setup_s + d.wire_s(prompt) + d.step_s[1], d.step_s[1]


async def stream(client: openai.AsyncOpenAI, prompt: int, out: int) -> dict:
    t0 = time.monotonic()
    s = await client.chat.completions.create(
        model="emulated",
        messages=[{"role": "user", "content": " ".join(["w"] * prompt)}],
        max_tokens=out,
        stream=True,
        stream_options={"include_usage": True},
    )
    times, finish, usage, text = [], None, None, ""
    async for chunk in s:
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            if c.delta.content:
                times.append(time.monotonic() - t0)
                text += c.delta.content
            if c.finish_reason:
                finish = c.finish_reason
    return {"times": times, "finish": finish, "usage": usage, "tokens": len(text.split())}


def complete(r: dict, prompt: int, out: int) -> bool:
    u = r["usage"]
    return (
        r["finish"] == "length"
        and u is not None
        and u.completion_tokens == out
        and u.prompt_tokens == prompt
        and r["tokens"] == out
    )


@dataclass
class RoutedFleet:
    """An emulated fleet behind a router; `summary` is the fleet's, read once the router stopped."""

    fleet: StandaloneFleet
    router: StaticRouter | None = None
    summary: dict | None = None

    async def client(self) -> openai.AsyncOpenAI:
        """An SDK client on the router, warmed up (its connections and the router's) by one request."""
        assert self.router is not None
        client = openai.AsyncOpenAI(base_url=f"{self.router.url}/v1", api_key="unused", max_retries=0)
        await stream(client, 8, 2)
        return client


@contextlib.contextmanager
def routed_fleet(tmp_path, engine: str, address: str, *, prefill: int, decode: int) -> Iterator[RoutedFleet]:
    """Start `prefill` + `decode` emulated workers on `address` and the engine's router in front of them."""
    run = RoutedFleet(StandaloneFleet(tmp_path, address, prefill=prefill, decode=decode, engine=engine))
    try:
        run.router = StaticRouter(tmp_path, engine, run.fleet.prefill_urls, run.fleet.decode_urls)
        yield run
    finally:
        if run.router is not None:
            run.router.stop()
        run.summary = run.fleet.summary()


@pytest.mark.parametrize("engine", ENGINES)
def test_router_serves_streams_from_the_emulated_pd_fleet(engine, tmp_path):
    needs(engine)
    with routed_fleet(tmp_path, engine, FIRST_ADDRESS[engine], prefill=1, decode=2) as run:

        async def main():
            client = await run.client()
            one_by_one = [await stream(client, 4000, 10) for _ in range(3)]
            together = await asyncio.gather(*(stream(client, 300 + 50 * i, 6) for i in range(12)))
            await client.close()
            return one_by_one, together

        one_by_one, together = asyncio.run(main())
    summary = run.summary
    ttft, step = model_ttft(4000)
    for r in one_by_one:
        assert complete(r, 4000, 10), r
        assert ttft - EARLY_S <= r["times"][0] <= ttft + LATE_S, (r["times"][0], ttft)
        itl = (r["times"][-1] - r["times"][0]) / (len(r["times"]) - 1)
        assert step - EARLY_S <= itl <= step + LATE_S / 3, (itl, step)
    assert all(complete(r, 300 + 50 * i, 6) for i, r in enumerate(together))
    req = summary["requests"]
    assert req["completed"] == 1 + 3 + 12 and req["lost"] == 0 and req["failed"] == 0
    http = summary["http"]
    assert http["errors"] == 0
    # every client request was a prefill request plus a decode request at the emulated pods
    assert http["requests"] == 2 * (1 + 3 + 12)


def pod_metric(url: str, name: str) -> float:
    text = urllib.request.urlopen(f"{url}/metrics", timeout=10).read().decode()
    total = 0.0
    for line in text.splitlines():
        m = re.match(rf"^{re.escape(name)}(\{{[^}}]*\}})? (\S+)$", line)
        if m:
            total += float(m.group(2))
    return total


@pytest.mark.parametrize("engine", ENGINES)
def test_a_worker_removed_from_the_router_gets_no_new_request_and_its_streams_finish(engine, tmp_path):
    """The drain mechanism for routers that ignore Ready=False (docs/router.md): the removal API."""
    needs(engine)
    e2e = NAMES[engine]["e2e"] + "_count"
    with routed_fleet(tmp_path, engine, DRAIN_ADDRESS[engine], prefill=1, decode=2) as run:
        fleet, router = run.fleet, run.router

        async def main():
            client = await run.client()
            long = [asyncio.create_task(stream(client, 200, 60)) for _ in range(4)]  # ~2.7 s each
            await asyncio.sleep(0.8)  # all four are decoding now
            held = {u: pod_metric(u, "disagg_emulator_in_flight_requests") for u in fleet.decode_urls}
            victim = max(held, key=held.get)
            before = pod_metric(victim, e2e)
            status = router.remove_worker(victim)
            listed = [w["url"] for w in router.workers()]
            short = await asyncio.gather(*(stream(client, 100, 3) for _ in range(10)))
            long_done = await asyncio.gather(*long)
            after = pod_metric(victim, e2e)
            await client.close()
            return held[victim], victim, status, listed, short, long_done, before, after

        held, victim, status, listed, short, long_done, before, after = asyncio.run(main())
    summary = run.summary
    assert held >= 1, "the victim held streams when it was removed"
    assert status in (200, 202, 204), status
    assert victim not in listed
    assert all(complete(r, 100, 3) for r in short), "new requests are served by the other decode pod"
    assert all(complete(r, 200, 60) for r in long_done), "in-flight streams on the removed pod finish"
    # the victim completed only what it held: nothing new reached it after the removal
    assert after - before == held, (before, after, held)
    assert summary["requests"]["lost"] == 0 and summary["http"]["errors"] == 0


def router_metric(router: StaticRouter, name: str, worker: str) -> float:
    """The router's gauge `name` for `worker`, summed over its label sets (0 when absent)."""
    args = router.p.args
    port = args[args.index("--prometheus-port") + 1]
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    total = 0.0
    for line in text.splitlines():
        m = re.match(rf"^{re.escape(name)}\{{([^}}]*)\}} (\S+)$", line)
        if m and f'worker="{worker}"' in m.group(1):
            total += float(m.group(2))
    return total


def test_vllm_router_counts_requests_bound_for_a_decode_worker_while_their_prefill_runs(tmp_path):
    """vllm-router picks a request's decode worker when the request arrives, and sends it there
    only after the prefill stage: meanwhile the decode engine does not count it, the router
    counts it as pending on that worker. A drain that read only the engine (and the router's
    open streams) could remove a decode pod with requests on their way to it; the operator's
    router query adds the pending gauge (disagg.metrics.VLLM.router_in_flight)."""
    needs("vllm")
    operator_reads = dict(metrics.VLLM.router_in_flight)["decode"]  # the gauges the drain sums
    with routed_fleet(tmp_path, "vllm", PENDING_ADDRESS, prefill=1, decode=1) as run:
        router, decode = run.router, run.fleet.decode_urls[0]

        async def main():
            client = await run.client()
            # eight long prompts at once: one prefill worker takes them one after another (~1.3 s)
            tasks = [asyncio.create_task(stream(client, 4000, 3)) for _ in range(8)]
            unseen = pending_max = 0.0
            deadline = time.monotonic() + 10
            while not all(t.done() for t in tasks) and time.monotonic() < deadline:
                pending = router_metric(router, "vllm_router_pd_pending_decode_requests", decode)
                counted = sum(router_metric(router, name, decode) for name in operator_reads)
                engine = pod_metric(decode, "vllm:num_requests_running") + pod_metric(
                    decode, "vllm:num_requests_waiting"
                )
                pending_max = max(pending_max, pending)
                unseen = max(unseen, counted - engine)
                await asyncio.sleep(0.05)
            done = await asyncio.gather(*tasks)
            await client.close()
            return done, pending_max, unseen

        done, pending_max, unseen = asyncio.run(main())
        assert router_metric(router, "vllm_router_pd_pending_decode_requests", decode) == 0
    summary = run.summary
    assert all(complete(r, 4000, 3) for r in done)
    assert pending_max >= 4, pending_max  # several requests bound for the decode pod at once
    assert unseen >= 4, unseen  # ... that its engine did not count yet, and the operator's query does
    assert summary["requests"]["lost"] == 0 and summary["http"]["errors"] == 0


def test_vllm_router_still_sends_a_removed_decode_worker_the_requests_bound_for_it(tmp_path):
    """Taking a decode worker out of the router (its removal API; the pod turning not Ready does
    the same with service discovery) stops new requests, not the ones bound for it whose prefill
    stage runs: they still go to it. So a drain must wait for them (the pending gauge)."""
    needs("vllm")
    e2e = NAMES["vllm"]["e2e"] + "_count"
    with routed_fleet(tmp_path, "vllm", PENDING_ADDRESS, prefill=1, decode=2) as run:
        fleet, router = run.fleet, run.router

        async def main():
            client = await run.client()
            tasks = [asyncio.create_task(stream(client, 4000, 3)) for _ in range(8)]
            bound: dict[str, float] = {}
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline and not any(v >= 2 for v in bound.values()):
                await asyncio.sleep(0.05)
                bound = {
                    u: router_metric(router, "vllm_router_pd_pending_decode_requests", u)
                    for u in fleet.decode_urls
                }
            victim = max(bound, key=bound.get)
            before = pod_metric(victim, e2e)
            status = router.remove_worker(victim)
            done = await asyncio.gather(*tasks)
            after = pod_metric(victim, e2e)
            await client.close()
            return bound[victim], status, done, after - before

        pending, status, done, served_after = asyncio.run(main())
    summary = run.summary
    assert pending >= 2 and status == 200, (pending, status)
    assert all(complete(r, 4000, 3) for r in done)
    assert served_after >= pending, (served_after, pending)  # the bound requests went to it anyway
    assert summary["requests"]["lost"] == 0 and summary["http"]["errors"] == 0
