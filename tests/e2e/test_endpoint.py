"""Closed loop through the endpoint: a real client (aiperf) sends streaming chat completions through
the operator's router (the real binary) to the HTTP emulated fleet, while the operator sizes the
pools from what a real Prometheus scrapes and drains pods before it removes them.

Checked at the client, for every request of the run (a router restart: of every request that
started once the new router was Ready): no failure (HTTP error, refused or reset
connection, timeout), no truncated stream (each ends with a usage chunk reporting exactly the
output tokens asked for); and the client's TTFT and inter-token latency percentiles against the
ones the emulated engines recorded. Checked at the cluster: the load step grows the pools to the
planner's sizes, the fall drains them, every drain ends (removed or re-admitted).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator

import pytest
from e2e_stack import planned
from endpoint_stack import (
    DRAIN_TIMEOUT_S,
    EndpointStack,
    LoadRun,
    endpoint_spec,
    needs_tools,
    retrying_openai_request,
)

from disagg import api, loop, metrics, names, promclient, routerclient, status

pytestmark = [pytest.mark.cluster, pytest.mark.prometheus, pytest.mark.slow, pytest.mark.timeout(480)]

PROMPT, OUTPUT = 6000, 150
LOW, HIGH = 1.0, 4.0
INTERVAL, WINDOW = 5, 10
#: aiperf's own start-up (its services, the synthetic dataset) before the first request, on a
#: loaded 2-core machine: the schedule's clock starts this much after the process.
LOADGEN_START_S = 60
#: What the router, the client and CPU contention add to the engines' TTFT on this shared 2-core
#: machine (aiperf, the router, the emulator, the operator, Prometheus and the API server share
#: it), and the ITL's noise. Measured (docs/router.md, "Closed loop through the endpoint").
TTFT_ADDED_MAX_S = 1.0
TTFT_TAIL_ADDED_MAX_S = 3.0
ITL_TOLERANCE_S = 0.015


#: Round robin: the prompts share no prefix, and the default cache_aware policy piles a load like
#: this on few workers (docs/router.md, Benchmark). (The worker start-up check every second, which
#: KWOK pods need since they turn Ready before the emulator listens, is the operator's default.)
ROUTER_ARGS = ["--policy", "round_robin"]


ENGINES = ["vllm", "sglang"]
#: What aiperf (aiohttp) records for a request it sends on a keep-alive connection that the
#: server closes at that moment, as a router does with its idle connections when its shutdown
#: begins: the request fails at once and never reaches an engine. The client sees the close
#: itself (ServerDisconnectedError) or, when its request reached the socket after the server
#: stopped reading, the reset the kernel answers unread data with (ClientOSError: ECONNRESET
#: on the read, EPIPE on a later write), or, when the close came while aiohttp was still
#: writing the request, its own refusal to write to a closing transport (ClientOSError with
#: no errno: "Can not write request body", from its "Cannot write to closing transport").
#: Error type -> texts one of which its message holds.
KEEPALIVE_RACE = {
    "ServerDisconnectedError": ("",),
    "ClientOSError": ("Connection reset by peer", "Broken pipe", "Can not write request body"),
}


def is_keepalive_race(error_type: str | None, message: str | None) -> bool:
    """Whether a failure aiperf recorded is the keep-alive race (KEEPALIVE_RACE)."""
    texts = KEEPALIVE_RACE.get(error_type or "", ())
    return any(t in (message or "") for t in texts)


#: The openai SDK's retries for the request sent while the router restarts: back-off from 0.5 s
#: doubling to 8 s (with up to 25 % jitter off), so 8 retries wait about 30 s in all at the least.
SDK_MAX_RETRIES = 8


@pytest.fixture
def endpoint_stack(
    cluster, namespace, tmp_path, prometheus_factory, operator_factory
) -> Iterator[EndpointStack]:
    s = EndpointStack(cluster, namespace, tmp_path, prometheus_factory, operator_factory)
    try:
        yield s
    finally:
        s.close()
        s.release()


def reached(stack, want: dict[str, int], run=None) -> bool:
    if run is not None:
        run.check()
    cur = stack.replicas()
    return all(cur.get(k, 0) >= v for k, v in want.items())


def start(
    stack: EndpointStack, engine: str, via_service: bool = False, router_replicas: int = 1, **autoscaling
) -> dict:
    needs_tools(engine)
    obj = endpoint_spec(stack.prom.url, engine, **autoscaling)
    obj["spec"]["router"] = {"extraArgs": ROUTER_ARGS, "replicas": router_replicas}
    stack.apply(obj)
    stack.start_operator()
    stack.wait_routable()
    stack.start_serving_emulator()
    stack.start_router(engine, via_service=via_service, replicas=router_replicas)
    stack.wait_router_workers(2)
    return obj


def send(stack: EndpointStack, **load) -> LoadRun:
    """aiperf through the endpoint: streamed chat completions of PROMPT tokens asking for OUTPUT."""
    return stack.start_load(prompt_tokens=PROMPT, output_tokens=OUTPUT, **load)


def wait_grown(stack: EndpointStack, run: LoadRun, want: dict[str, int], after_load_start_s: float) -> None:
    """The pools reach `want` within `after_load_start_s` of the load's clock (which starts once
    aiperf is up, LOADGEN_START_S after its process)."""
    stack.cluster.wait_for(
        lambda: reached(stack, want, run),
        timeout=LOADGEN_START_S + after_load_start_s,
        interval=1,
        what=f"pools at {want}\n{stack.debug()}\n{run.tail()}",
    )


def finish(stack: EndpointStack, run: LoadRun, load_s: float) -> tuple[dict, dict]:
    """The client's results once the load ends; then every drain ends (the pod removed, or
    re-admitted at its deadline) while the engines still report their in-flight work, and the
    emulator stops and writes what the engines recorded."""
    client = run.wait(timeout=LOADGEN_START_S + load_s + 120)
    stack.wait_settled(timeout=DRAIN_TIMEOUT_S + 30)
    return client, stack.stop_emulator()


def window_counts(windows: dict[str, dict]) -> dict[str, dict]:
    """The request counts of LoadRun.results_by_window, for the test's report."""
    return {k: {f: w[f] for f in ("requests", "ok", "failed", "truncated")} for k, w in windows.items()}


def check_client_against_engines(
    client: dict, summary: dict, other_requests: int = 0, keepalive_races: int = 0
) -> None:
    """Zero failed or truncated responses, and the client's latencies follow the engines'.
    `other_requests`: completed requests the test sent itself, beside the load generator's;
    `keepalive_races`: failures the caller has shown to be a deleted router closing a
    keep-alive connection (KEEPALIVE_RACE), which never reached an engine."""
    assert client["requests"] > 0
    assert client["failed"] == keepalive_races and client["truncated"] == 0, client
    for entry in client["error_summary"]:
        details = entry["error_details"]
        race = is_keepalive_race(details["type"], details.get("message"))
        assert keepalive_races and race, client["error_summary"]
    assert summary["requests"]["lost"] == 0 and summary["requests"]["failed"] == 0, summary["requests"]
    assert summary["http"]["errors"] == 0, summary["http"]
    # Every client request reached the engines as a completed request (and nothing else did).
    assert summary["requests"]["completed"] == client["ok"] + other_requests, (summary["requests"], client)
    c, e = client["ttft_s"], summary["ttft_s"]
    # The engines' TTFT starts when the prefill request arrives; the client's adds the router's
    # two hops and its own parsing: never less (beyond clock noise), at most TTFT_ADDED_MAX_S more.
    # The tail is where a loaded 2-core machine shows (the client and the router share it with
    # the emulator): p90 only has the lower bound and a loose upper one.
    assert e["p50"] - 0.02 <= c["p50"] <= e["p50"] + TTFT_ADDED_MAX_S, (c, e)
    assert e["p90"] - 0.02 <= c["p90"] <= e["p90"] + TTFT_TAIL_ADDED_MAX_S, (c, e)
    ci, ei = client["itl_s"], summary["itl_s"]
    assert abs(ci["p50"] - ei["p50"]) <= ITL_TOLERANCE_S, (ci, ei)
    assert abs(ci["p90"] - ei["p90"]) <= 2 * ITL_TOLERANCE_S, (ci, ei)


def router_counts(stack: EndpointStack, obj: dict) -> dict[str, dict[str, dict[str, float]]]:
    """The router's in-flight requests per worker as the operator reads them from Prometheus,
    through the loop's own code on both of its paths: the object's own queries
    (`loop.snapshot`), and the tick's fleet queries (`loop.FleetBatch`) split per object. Per
    path, per `router_in_flight_by_worker.<pool>` query: worker URL -> requests."""
    spec = api.parse_spec(obj["spec"])
    body = {"metadata": {"namespace": stack.ns, "name": stack.name}}
    opts = loop.LoopOptions(metrics_source=promclient.PromClient(stack.prom.url))

    async def read() -> dict[str, metrics.Snapshot]:
        own = await loop.snapshot(None, body, spec, [], opts, time.time())
        batch = loop.FleetBatch(loop.fleet_key(spec, stack.ns), spec.autoscaling.prometheus)
        shared = batch.add(spec, stack.ns, stack.name)
        await batch.run(None, opts)
        return {"own": own, "fleet": await loop.snapshot(None, body, spec, [], opts, time.time(), shared)}

    names = [
        q.name
        for q in loop.object_queries(spec, stack.ns, stack.name)
        if q.name.startswith("router_in_flight_by_worker.")
    ]
    assert names, "the router's per-worker queries are not asked"
    out = {}
    for path, snap in asyncio.run(read()).items():
        assert not snap.failed & set(names), (path, snap.failed)
        out[path] = {name: snap.by_worker.get(name, {}) for name in names}
    return out


def wait_router_counts(stack: EndpointStack, obj: dict, run: LoadRun) -> dict:
    """Under load, both query paths answer the router's counts for every pool it counts, named
    by worker URLs that are the deployment's own pods (routerclient.worker_url: the name the
    drain looks the count up by), and the pool's pods have requests in flight."""
    found: dict = {}

    def answered() -> bool:
        run.check()
        pods = stack.pods()
        urls = {routerclient.worker_url(p): p["metadata"]["labels"]["disagg.dev/pool"] for p in pods}
        found.clear()
        found.update(router_counts(stack, obj))
        for by_query in found.values():
            for name, by_worker in by_query.items():
                pool = name.split(".", 1)[1]
                assert set(by_worker) <= set(urls), (name, by_worker, urls)
                if sum(n for url, n in by_worker.items() if urls[url] == pool) <= 0:
                    return False
        return True

    stack.cluster.wait_for(
        answered, timeout=45, interval=2, what=f"the router's per-worker counts in Prometheus: {found}"
    )
    return found


@pytest.mark.parametrize("engine", ENGINES)
def test_load_step_through_the_endpoint_grows_then_drains_with_no_failed_response(endpoint_stack, engine):
    stack = endpoint_stack
    step_at, fall_at, load_s = 20, 80, 150
    # The step is this run's only burst: the automatic headroom would keep standing capacity
    # for it for an hour (tests/e2e/test_autoscaling.py checks that), and this test is about
    # the drains the fall brings, so it plans for the load alone.
    obj = start(stack, engine, sizing={"autoHeadroom": False})
    want_high = planned(obj, HIGH, PROMPT, OUTPUT)
    want_low = planned(obj, LOW, PROMPT, OUTPUT)
    assert want_high["prefill"] > want_low["prefill"] and want_high["decode"] > want_low["decode"]

    t0 = time.monotonic()
    run = send(stack, schedule=f"0:{LOW:g},{step_at}:{HIGH:g},{fall_at}:{LOW:g}", duration_s=load_s)
    # (a) the step: the pools reach the planner's sizes.
    wait_grown(stack, run, want_high, step_at + WINDOW + 3 * INTERVAL + 20)
    grown_at = time.monotonic() - t0
    # The router's own per-worker counts, which lengthen a drain, reach the autoscaler live.
    counts = wait_router_counts(stack, obj, run)
    # (b) the fall: pools drain back towards the low plan while the load goes on.
    stack.cluster.wait_for(
        lambda: (
            stack.replicas().get("prefill", 99) < want_high["prefill"]
            and stack.replicas().get("decode", 99) < want_high["decode"]
        ),
        timeout=LOADGEN_START_S + load_s,
        interval=2,
        what=f"both pools shrunk towards {want_low}\n{stack.debug()}\n{run.tail()}",
    )
    client, summary = finish(stack, run, load_s)
    reasons = [e["reason"] for e in stack.events()]
    print(
        f"{engine}: grown to {want_high} after {grown_at:.0f} s; client {client}; "
        f"engines ttft {summary['ttft_s']} itl {summary['itl_s']}; http {summary['http']}"
    )
    assert "DrainStarted" in reasons and "DrainCompleted" in reasons, reasons
    check_client_against_engines(client, summary)
    print(f"{engine}: the router's in-flight counts per worker at the high load: {counts}")


@pytest.mark.parametrize("engine", ENGINES)
def test_operator_killed_mid_drain_through_the_endpoint_loses_no_response(endpoint_stack, engine):
    """The operator dies while a pod drains under live traffic; the restarted one finishes the drain."""
    stack = endpoint_stack
    fall_at, load_s = 40, 110
    obj = start(stack, engine)
    want = planned(obj, HIGH, PROMPT, OUTPUT)
    run = send(stack, schedule=f"0:{HIGH:g},{fall_at}:{LOW:g}", duration_s=load_s)
    wait_grown(stack, run, want, WINDOW + 3 * INTERVAL + 20)

    def draining():
        run.check()
        return [p for p in stack.pods() if "disagg.dev/drain" in (p["metadata"].get("annotations") or {})]

    def out_of_routing():
        # Killed between writing the drain record and taking the pod out of routing, the operator
        # leaves the pod routable until its restart (tests/unit/test_drain_resume_routing.py): the
        # requests of that outage are not the restart's doing. Killed once the gate is False (the
        # router call follows within milliseconds), the restart must finish the drain without
        # bringing the pod back to the routers.
        pods = draining()
        return pods and all(status.pod_condition(p, names.READINESS_GATE) == "False" for p in pods)

    stack.cluster.wait_for(
        out_of_routing,
        timeout=LOADGEN_START_S + load_s,
        interval=0.5,
        what=f"a drain to start and take its pod out of routing\n{stack.debug()}",
    )
    assert stack.operator is not None
    stack.operator.kill()
    victims = {p["metadata"]["name"] for p in draining()}
    time.sleep(5)
    stack.operator.start()
    stack.cluster.wait_for(
        lambda: not victims & {p["metadata"]["name"] for p in stack.pods()},
        timeout=DRAIN_TIMEOUT_S,
        interval=1,
        what=f"drained pods {victims} removed by the restarted operator\n{stack.debug()}",
    )
    client, summary = finish(stack, run, load_s)
    drains = sum(e.get("count") or 1 for e in stack.events() if e["reason"] == "DrainStarted")
    print(
        f"{engine} operator restart: victims {victims}; {drains} drains; client {client}; "
        f"engines http {summary['http']}"
    )
    check_client_against_engines(client, summary)
    # The restarted operator took the drained pods out of routing: at most the race of one client
    # request (two engine requests: prefill and decode) per drain between its gate turning False
    # and the router dropping the pod (an SGLang drain the restart did not take out of the router
    # reached 43 engine requests).
    assert summary["http"]["while_draining"] <= 2 * drains, (summary["http"], drains)


@pytest.mark.parametrize("engine", ENGINES)
def test_gpu_budget_below_the_plan_holds_while_every_response_completes(endpoint_stack, engine):
    """The planner's split under a GPU budget smaller than the plan: never more GPUs than the
    budget, the pools rebalanced within it, and every response through the endpoint completes."""
    stack = endpoint_stack
    budget, load_s = 3, 90
    unlimited = planned(endpoint_spec("http://x", engine), HIGH, PROMPT, OUTPUT)
    assert sum(unlimited.values()) > budget, "the test needs a load the budget cannot cover"
    obj = start(stack, engine, gpuBudget=budget)
    run = send(stack, rate=HIGH, duration_s=load_s)
    peak = 0

    def limited():
        nonlocal peak
        run.check()
        peak = max(peak, stack.gpus_in_use())
        return (stack.condition("BudgetLimited") or {}).get("status") == "True"

    stack.cluster.wait_for(
        limited, timeout=LOADGEN_START_S + load_s, interval=1, what=f"BudgetLimited=True\n{stack.debug()}"
    )
    # The decision that limited the pools (read while the load lasts; once it falls, the next
    # decisions fit the budget).
    decision = stack.cluster.wait_for(
        lambda: (d := stack.dd()["status"]["lastDecision"])["outputs"]["budgetLimited"] and d,
        timeout=3 * INTERVAL,
        what="the budget-limited decision in status",
    )
    while run.proc.poll() is None:
        peak = max(peak, stack.gpus_in_use())
        time.sleep(1)
    client, summary = finish(stack, run, load_s)
    print(
        f"{engine} budget {budget}: peak {peak} GPUs; targets {decision['outputs']['targets']}; client {client}"
    )
    assert peak <= budget, f"{peak} GPUs requested with a budget of {budget}"
    assert decision["outputs"]["budgetLimited"] is True
    assert sum(decision["outputs"]["targets"].values()) <= budget
    assert sum(planned(obj, HIGH, PROMPT, OUTPUT).values()) <= budget
    check_client_against_engines(client, summary)


@pytest.mark.parametrize("engine", ENGINES)
def test_router_restart_mid_load_fails_no_request_started_once_the_new_router_is_ready(
    endpoint_stack, engine
):
    """The router pod is deleted under load; the Deployment's new pod takes over behind the Service.

    What a client sees, counted and reported per window: requests in flight through the old
    router at the kill (it gets SIGTERM; whether it finishes them or cuts them is the router's
    shutdown behaviour, reported); requests started while no router is Ready find no endpoint
    behind the Service, and aiperf retries none of them (each is one failed record). Asserted:
    zero failed or truncated responses among the requests started once the new router passes its
    readiness probe, none among those that ended before the kill, and a client that retries (the
    openai SDK with max_retries, sending right at the kill) gets a complete response.
    """
    stack = endpoint_stack
    rate, load_s, kill_after_s = 2.0, 90, 20
    start(stack, engine, via_service=True)
    assert stack.service is not None
    run = send(stack, rate=rate, duration_s=load_s)
    # aiperf is sending once connections come through the Service; kill the router kill_after_s later.
    stack.cluster.wait_for(
        lambda: run.check() or stack.service.forwarded > 0,
        timeout=LOADGEN_START_S + 30,
        interval=0.5,
        what=f"the first request through the Service\n{run.tail()}",
    )
    time.sleep(kill_after_s)
    run.check()
    old = stack.routers[0]
    kill_ns = stack.delete_router_pod(old)
    sdk: dict = {}
    sdk_thread = threading.Thread(
        target=lambda: sdk.update(retrying_openai_request(stack.endpoint, 200, 20, SDK_MAX_RETRIES)),
        daemon=True,
    )
    sdk_thread.start()
    ready_ns = stack.replace_router()
    outage_s = (ready_ns - kill_ns) / 1e9
    old_router_exit = old.proc.p.poll()  # None: still finishing its responses
    sdk_thread.join(timeout=180)
    client, summary = finish(stack, run, load_s)
    windows = run.results_by_window(kill_ns, ready_ns)
    report = window_counts(windows)
    print(
        f"{engine} router restart: pod {old.pod} -> {stack.routers[0].pod}; outage {outage_s:.1f} s; "
        f"old router exit status when the new one was Ready: {old_router_exit}; "
        f"client {report}; closed without a router {stack.service.closed_without_router}; "
        f"openai SDK (max_retries={SDK_MAX_RETRIES}) {sdk}; engines {summary['requests']} http {summary['http']}"
    )
    assert stack.routers[0].pod != old.pod
    assert sum(w["requests"] for w in windows.values()) == client["requests"]
    after = windows["after"]
    assert after["requests"] >= rate * (load_s - kill_after_s - outage_s) / 2, (report, outage_s)
    assert after["failed"] == 0 and after["truncated"] == 0, after
    # Requests that ended before the kill were untouched by it.
    assert windows["before"]["failed"] == 0 and windows["before"]["truncated"] == 0, windows["before"]
    assert sdk.get("ok"), f"the retrying openai client: {sdk} (outage {outage_s:.1f} s)"


@pytest.mark.parametrize("engine", ENGINES)
def test_router_restart_with_two_replicas_refuses_no_connection_and_cuts_no_stream(endpoint_stack, engine):
    """`spec.router.replicas: 2`: one router pod is deleted under load while the other serves.

    The Service stops sending the deleted pod new connections at once (its endpoint goes when
    the pod terminates), the old router finishes its in-flight responses on SIGTERM, and every
    new connection meanwhile goes to the other replica: no connection refused, no response
    failed or cut, at a client that retries nothing (aiperf, and the openai SDK with
    max_retries=0 sending right at the kill), and the client's latencies follow the engines'.

    The one failure left is HTTP/1.1's: a request aiperf sends on a keep-alive connection it
    already had to the deleted router, just as that router closes its idle connections on
    SIGTERM, fails at once (KEEPALIVE_RACE) without reaching any engine (1 of 180 requests in
    one of six runs). Such failures are counted and bounded (at most one per connection the
    deleted router had), never anything else; a client that retries connection errors (the
    openai SDK does by default) does not see them.
    """
    stack = endpoint_stack
    rate, load_s, kill_after_s = 2.0, 90, 20
    start(stack, engine, via_service=True, router_replicas=2)
    assert stack.service is not None and len(stack.routers) == 2
    run = send(stack, rate=rate, duration_s=load_s)
    victim, survivor = stack.routers
    # Both replicas serve before the kill (the Service alternates new connections between them).
    stack.cluster.wait_for(
        lambda: run.check() or all(stack.service.forwarded_to.get(r.address) for r in (victim, survivor)),
        timeout=LOADGEN_START_S + 30,
        interval=0.5,
        what=f"requests through both router replicas\n{run.tail()}",
    )
    time.sleep(kill_after_s)
    run.check()
    kill_ns = stack.delete_router_pod(victim)
    sdk = retrying_openai_request(stack.endpoint, 200, 20, max_retries=0)
    ready_ns = stack.replace_router()
    victim_exit = victim.proc.p.poll()  # None: still finishing its responses
    client, summary = finish(stack, run, load_s)
    windows = run.results_by_window(kill_ns, ready_ns)
    report = window_counts(windows)
    print(
        f"{engine} router restart, 2 replicas: pod {victim.pod} -> {stack.routers[-1].pod} "
        f"(one replica down {(ready_ns - kill_ns) / 1e9:.1f} s); victim's exit status when its "
        f"replacement was Ready: {victim_exit}; client {report}; forwarded "
        f"{stack.service.forwarded_to}; openai SDK (max_retries=0) {sdk}; "
        f"engines {summary['requests']} http {summary['http']}"
    )
    assert stack.routers[-1].pod not in (victim.pod, survivor.pod)
    # The kill hit live traffic: requests were in flight through the routers, and requests
    # started while only the survivor was Ready.
    assert windows["in_flight"]["requests"] > 0 and windows["outage"]["requests"] > 0, report
    assert stack.service.closed_without_router == 0
    assert sdk["ok"], f"the openai SDK without retries, sent at the kill: {sdk}"
    races = run.failures()
    for failure in races:
        assert is_keepalive_race(failure["type"], failure["message"]), races
        assert failure["start_ns"] >= kill_ns, races
    assert len(races) <= stack.service.forwarded_to[victim.address], (races, stack.service.forwarded_to)
    for key in ("before", "in_flight", "after"):
        assert windows[key]["failed"] == 0 and windows[key]["truncated"] == 0, report
    check_client_against_engines(client, summary, other_requests=1, keepalive_races=len(races))
