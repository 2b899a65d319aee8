"""The loop's scheduling (disagg.loop.tick): state from the watch cache (no LIST per object per
tick), each object decided when it is due, spread over its interval, with bounded concurrency,
never behind a slow object."""

from __future__ import annotations

import asyncio
import itertools
import re
from pathlib import Path

import pytest
import yaml
from fakes import FakeKube, FakePrometheus, deployment, disagg_deployment, pod, watch_cache

from disagg import loop, metrics, opmetrics, reconcile

pytestmark = pytest.mark.usefixtures("fresh_loop_memory")

SAMPLE = Path(__file__).resolve().parents[2] / "config" / "samples" / "vllm-disaggregated-70b.yaml"
NS = "ns"
T0 = 1_800_000_000.0
INTERVAL = 30


def spec(enabled: bool = True) -> dict:
    s = yaml.safe_load(SAMPLE.read_text())["spec"]
    s["autoscaling"] = {"enabled": enabled, "intervalSeconds": INTERVAL, "scrapeIntervalSeconds": 15}
    return s


def fleet(
    n: int, enabled: bool = True, prom: loop.MetricsSource | None = None
) -> tuple[FakeKube, loop.LoopOptions]:
    kube = FakeKube()
    prom = prom or FakePrometheus()
    opts = loop.LoopOptions(metrics_source=prom, cache=watch_cache(kube))
    for i in range(n):
        name = f"llm-{i:04d}"
        kube.put(disagg_deployment(name, spec(enabled), NS))
        for pool in ("prefill", "decode"):
            kube.put(deployment(name, pool, 1))
            kube.put(pod(name, pool, 0, created=T0 - 600, admitted=T0 - 540))
    return kube, opts


def run_ticks(
    kube: FakeKube, opts: loop.LoopOptions, seconds: int, start: float = T0
) -> dict[str, list[float]]:
    """Tick once a (simulated) second; the decision times of each object."""
    decided: dict[str, list[float]] = {}

    async def main() -> None:
        for s in range(seconds):
            now = start + s
            for task in await loop.tick(kube, opts, now):
                await task
            for (_, name), tr in loop.TRACKERS.items():
                if tr.last_decision_at == now:
                    decided.setdefault(name, []).append(now)

    asyncio.run(main())
    return decided


@pytest.mark.parametrize("enabled", [True, False])
def test_steady_ticks_send_no_list_and_the_requests_do_not_grow_with_the_fleet(enabled: bool):
    lists, requests = {}, {}
    for n in (2, 12):
        loop.TRACKERS.clear()
        kube, opts = fleet(n, enabled)
        run_ticks(kube, opts, INTERVAL + 1)  # the first decisions set the targets (a reconcile each)
        kube.calls.clear()
        decided = run_ticks(kube, opts, 2 * INTERVAL, start=T0 + INTERVAL + 1)
        lists[n] = sum(v for (verb, _), v in kube.calls.items() if verb == "list")
        requests[n] = kube.api_requests()
        if enabled:
            assert len(decided) == n and all(len(t) == 2 for t in decided.values())
    assert lists == {2: 0, 12: 0}
    if not enabled:
        assert requests == {2: 0, 12: 0}  # nothing to do: no request at all


def test_without_the_cache_every_tick_lists_pods_per_object():
    """The contrast: the LIST path (no watch cache) costs requests per object per tick."""
    kube, opts = fleet(3)
    opts.cache = None
    run_ticks(kube, opts, 5)
    assert kube.calls[("list", "Pod")] >= 3 * 5


def test_objects_created_together_are_spread_over_the_interval():
    kube, opts = fleet(30)
    decided = run_ticks(kube, opts, INTERVAL + 1)
    firsts = sorted(t[0] - T0 for t in decided.values())
    assert len(firsts) == 30  # each decided once within its first interval
    per_second = max(firsts.count(s) for s in set(firsts))
    assert per_second <= 5, firsts  # not all in one tick
    assert firsts[-1] - firsts[0] >= INTERVAL / 2


def test_each_object_keeps_its_phase_decision_after_decision():
    kube, opts = fleet(3)
    decided = run_ticks(kube, opts, 4 * INTERVAL)
    for times in decided.values():
        assert [b - a for a, b in itertools.pairwise(times)] == [INTERVAL] * (len(times) - 1)


class SlowFor(FakePrometheus):
    """Answers like FakePrometheus, but never for the queries of one object."""

    def __init__(self, slow: str) -> None:
        super().__init__()
        self.slow = slow
        self.blocked = asyncio.Event()

    async def run(self, queries: list[metrics.Query]) -> dict:
        if any(f'"{self.slow}' in q.promql or f"{self.slow}-" in q.promql for q in queries):
            await asyncio.Event().wait()  # hangs (a slow Prometheus, a slow API server)
        return await super().run(queries)


def test_a_slow_object_delays_no_other_and_is_not_started_twice():
    kube, opts = fleet(6, prom=SlowFor("llm-0000"))
    opts.concurrency = 3
    opts.fleet_queries = False  # each object asks its own: one of them never gets an answer

    async def main() -> tuple[set[str], int]:
        decided: set[str] = set()
        started = 0
        for s in range(2 * INTERVAL):
            now = T0 + s
            tasks = await loop.tick(kube, opts, now)
            started += sum(1 for t in tasks if t.get_name().endswith("/llm-0000"))
            await asyncio.sleep(0.01)
            decided |= {k[1] for k, tr in loop.TRACKERS.items() if tr.last_decision_at}
        for t in list(loop.INFLIGHT.values()):
            t.cancel()
        return decided, started

    decided, started = asyncio.run(main())
    assert decided == {f"llm-{i:04d}" for i in range(1, 6)}
    assert started == 1  # still in flight: never started again


class FleetProm:
    """Answers the fleet queries (one per series, grouped by namespace and pod) from per-pod
    values; records every query asked."""

    def __init__(self, kube: FakeKube, now: float) -> None:
        self.kube, self.now = kube, now
        self.calls: list[list[str]] = []
        self.answered_pods: list[set[str]] = []  # per call: the pods its answers hold

    async def run(self, queries: list[metrics.Query]) -> dict:
        self.calls.append([q.name for q in queries])
        out: dict = {}
        answered: set[str] = set()
        self.answered_pods.append(answered)
        for q in queries:
            role = q.name.removeprefix(metrics.FLEET_PREFIX)
            series = []
            if role.startswith(("front_door_shed", "shed_counts.")):  # per-object counters: none sheds here
                out[q.name] = series
                continue
            for p in self.pods(q.promql):
                answered.add(p["metadata"]["name"])
                labels = {"namespace": p["metadata"]["namespace"], "pod": p["metadata"]["name"]}
                value = (
                    self.now - 1 if role == "sample_time" else 2.0 if role.startswith("prompt_count") else 0.5
                )
                if role.startswith("arrival_counts."):  # a subquery: arrivals per step
                    step = float(role.rsplit(".", 1)[1])
                    series.append({"metric": labels, "values": [[self.now - step, "3"], [self.now, "5"]]})
                elif role.endswith("_bucket"):
                    series += [{"metric": {**labels, "le": "+Inf"}, "value": [self.now, str(value)]}]
                else:
                    series.append({"metric": labels, "value": [self.now, str(value)]})
            out[q.name] = series
        return out

    def pods(self, promql: str) -> list[dict]:
        """The pods a query selects, as Prometheus would by its `pod=~"..."` matcher (all without)."""
        pods = [o for (k, _, _), o in self.kube.objects.items() if k == "Pod"]
        found = re.search(r'pod=~"((?:[^"\\]|\\.)*)"', promql)
        if found is None:
            return pods
        pattern = metrics.promql_pattern(found.group(1))
        return [p for p in pods if pattern.fullmatch(p["metadata"]["name"])]


@pytest.mark.parametrize(
    ("urls", "batches_expected"),
    [
        ([None], 1),  # the operator's Prometheus
        (["http://127.0.0.1:9090"], 1),  # the spec's, the same for every object of the namespace
        (["http://127.0.0.1:9090", "http://127.0.0.2:9090"], 2),  # two Prometheus: two batches
    ],
)
def test_one_query_per_metric_per_tick_for_every_due_object(
    urls: list[str | None], batches_expected: int, monkeypatch: pytest.MonkeyPatch
):
    readings: dict[str, loop.SizingReadings] = {}
    read_sizing = loop.read_sizing

    async def recorded(kube, body, *args, **kwargs) -> loop.SizingReadings:
        readings[body["metadata"]["name"]] = got = await read_sizing(kube, body, *args, **kwargs)
        return got

    monkeypatch.setattr(loop, "read_sizing", recorded)
    kube = FakeKube()
    prom = FleetProm(kube, T0)
    _, opts = fleet(0)
    opts.metrics_source, opts.cache = prom, watch_cache(kube)
    for i in range(8):
        name = f"llm-{i:04d}"
        s = spec()
        url = urls[i % len(urls)]
        if url is not None:
            s["autoscaling"]["prometheus"] = {"url": url}
        kube.put(disagg_deployment(name, s, NS))
        for pool in ("prefill", "decode"):
            kube.put(deployment(name, pool, 1))
            kube.put(pod(name, pool, 0, created=T0 - 600, admitted=T0 - 540))
    for tr_name in [f"llm-{i:04d}" for i in range(8)]:  # all due in the same tick
        loop.TRACKERS.pop((NS, tr_name), None)

    async def main() -> None:
        for body in opts.cache.disagg_deployments():
            loop.tracker(body).next_due = T0
        for task in await loop.tick(kube, opts, T0):
            await task

    asyncio.run(main())
    # The decision's metrics, sizing inputs included: one batch per Prometheus for the eight
    # objects, each series once, and nothing asked per object.
    assert len(prom.calls) == batches_expected
    for batch in prom.calls:
        assert len(batch) == len(set(batch)) and all(n.startswith(metrics.FLEET_PREFIX) for n in batch)
        assert any(n.startswith(f"{metrics.FLEET_PREFIX}arrival_counts.") for n in batch)
    for i in range(8):
        snap = loop.TRACKERS[(NS, f"llm-{i:04d}")].last_snapshot
        assert snap is not None and snap.ok, snap and snap.reason()
        assert snap.values["arrival_rps"] == 2.0  # its own prefill pod's rate, not the fleet's
        # its own prefill pod's arrivals per step (the burstiness and headroom input)
        assert readings[f"llm-{i:04d}"].arrival_counts == (3.0, 5.0)


def put_object(kube: FakeKube, name: str) -> None:
    kube.put(disagg_deployment(name, spec(), NS))
    for pool in ("prefill", "decode"):
        kube.put(deployment(name, pool, 1))
        kube.put(pod(name, pool, 0, created=T0 - 600, admitted=T0 - 540))


def tick_fleet(names: list[str], due: set[str]) -> FleetProm:
    """One tick at T0 over objects `names`, those in `due` due then (the others 10 s later), their
    fleet queries answered by a FleetProm; returns it."""
    kube = FakeKube()
    prom = FleetProm(kube, T0)
    _, opts = fleet(0)
    opts.metrics_source, opts.cache = prom, watch_cache(kube)
    for name in names:
        put_object(kube, name)

    async def main() -> None:
        for body in opts.cache.disagg_deployments():
            loop.tracker(body).next_due = T0 if body["metadata"]["name"] in due else T0 + 10
        for task in await loop.tick(kube, opts, T0):
            await task

    asyncio.run(main())
    return prom


def test_a_tick_asks_only_for_the_pods_of_the_objects_due_in_it():
    names = [f"llm-{i:04d}" for i in range(6)]
    # llm-0000-b: its pods begin like llm-0000's, so they are asked for, but never split in
    prom = tick_fleet([*names, "llm-0000-b"], set(names[:2]))
    assert len(prom.calls) == 1
    owners = {p.rsplit("-", 3)[0] for p in prom.answered_pods[0]}
    assert owners == {"llm-0000", "llm-0001", "llm-0000-b"}
    for name in names[:2]:
        snap = loop.TRACKERS[(NS, name)].last_snapshot
        assert snap is not None and snap.ok, snap and snap.reason()
        assert snap.values["arrival_rps"] == 2.0  # its own prefill pod only, not llm-0000-b's too
    for name in names[2:]:
        assert loop.TRACKERS[(NS, name)].last_snapshot is None  # not due: nothing read


def test_many_due_objects_are_asked_for_in_batches_of_a_bounded_filter(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(loop, "FLEET_FILTER_MAX_CHARS", 24)  # full at two names of 10 characters (+2 each)
    names = [f"llm-{i:06d}" for i in range(5)]
    prom = tick_fleet(names, set(names))
    assert len(prom.calls) == 3  # 2 + 2 + 1 objects
    owners = [{p.rsplit("-", 3)[0] for p in answered} for answered in prom.answered_pods]
    assert sorted(len(o) for o in owners) == [1, 2, 2]
    assert set().union(*owners) == set(names) and sum(len(o) for o in owners) == len(names)
    for name in names:
        snap = loop.TRACKERS[(NS, name)].last_snapshot
        assert snap is not None and snap.ok, snap and snap.reason()
        assert snap.values["arrival_rps"] == 2.0


class HangsFor(FleetProm):
    """A FleetProm that never answers a batch asking for the pods of `prefix` objects."""

    def __init__(self, kube: FakeKube, now: float, prefix: str) -> None:
        super().__init__(kube, now)
        self.prefix = prefix

    async def run(self, queries: list[metrics.Query]) -> dict:
        if any(self.prefix in q.promql for q in queries):
            await asyncio.Event().wait()
        return await super().run(queries)


def test_a_prometheus_that_does_not_answer_holds_no_slot_from_objects_reading_another():
    """Objects wait for their tick's shared metrics before they take one of the loop's slots:
    the slots bound the work on the API server, and a Prometheus that hangs (objects of one
    namespace, one URL) must not keep objects on another Prometheus from being decided."""
    kube = FakeKube()
    prom = HangsFor(kube, T0, "hang-")
    _, opts = fleet(0)
    opts.metrics_source, opts.cache = prom, watch_cache(kube)
    opts.concurrency = 2
    hung = [f"hang-{i}" for i in range(4)]  # more than the slots, and first in the tick
    for name in [*hung, "llm-0000", "llm-0001"]:
        s = spec()
        if name in hung:
            s["autoscaling"]["prometheus"] = {"url": "http://127.0.0.2:9090"}
        kube.put(disagg_deployment(name, s, NS))
        for pool in ("prefill", "decode"):
            kube.put(deployment(name, pool, 1))
            kube.put(pod(name, pool, 0, created=T0 - 600, admitted=T0 - 540))

    async def main() -> None:
        bodies = opts.cache.disagg_deployments()
        assert [b["metadata"]["name"] for b in bodies][:4] == hung
        for body in bodies:
            loop.tracker(body).next_due = T0
        await loop.tick(kube, opts, T0)
        for _ in range(200):
            await asyncio.sleep(0.005)
        for t in list(loop.INFLIGHT.values()):
            t.cancel()

    asyncio.run(main())
    for name in ("llm-0000", "llm-0001"):
        snap = loop.TRACKERS[(NS, name)].last_snapshot
        assert snap is not None and snap.ok, snap and snap.reason()
    assert all(loop.TRACKERS[(NS, name)].last_snapshot is None for name in hung)


def test_stopping_the_loop_between_ticks_ends_the_steps_still_in_flight(caplog: pytest.LogCaptureFixture):
    """The operator stops the loop (mostly while it sleeps between ticks) and then closes the
    API client: a step still waiting on Prometheus must end with the loop, not write through a
    closed client afterwards."""
    kube, opts = fleet(2, prom=SlowFor("llm-0000"))
    opts.fleet_queries = False  # llm-0000 asks its own queries, which never get an answer
    opts.tick_s = 0.05

    async def main() -> None:
        for body in opts.cache.disagg_deployments():
            loop.tracker(body).next_due = 0.0  # due at the first tick
        runner = asyncio.create_task(loop.run_forever(kube, opts))
        for _ in range(200):
            await asyncio.sleep(0.01)
            if (NS, "llm-0000") in loop.INFLIGHT:
                break
        stuck = loop.INFLIGHT[(NS, "llm-0000")]
        await asyncio.sleep(0.02)  # the loop is between ticks
        runner.cancel()
        with pytest.raises(asyncio.CancelledError):
            await runner
        # checked here: asyncio.run would cancel what is left when main returns
        assert stuck.done() and stuck.cancelled()
        assert not loop.INFLIGHT

    asyncio.run(main())
    assert not [r for r in caplog.records if "failed" in r.getMessage()]


def test_a_step_held_behind_a_reconcile_of_its_object_reports_that_wait_and_its_decision():
    """The operator's own histograms say where a due step spent its time: a reconcile of the same
    object holding its lock shows as wait=lock (not as a slot or metrics wait), and the decision
    that follows is counted with its duration."""

    def sample(name: str, **labels: str) -> float:
        return opmetrics.REGISTRY.get_sample_value(name, labels) or 0.0

    kube, opts = fleet(1)
    before = {
        w: sample("disagg_operator_decision_wait_seconds_sum", wait=w) for w in ("metrics", "slot", "lock")
    }
    decided = sum(
        sample("disagg_operator_decision_seconds_count", outcome=o) for o in ("changed", "unchanged")
    )

    async def main() -> None:
        (body,) = opts.cache.disagg_deployments()
        loop.tracker(body).next_due = T0
        lock = reconcile.lock_for(NS, "llm-0000")
        await lock.acquire()  # a reconcile of the object is running
        (task,) = [t for t in await loop.tick(kube, opts, T0) if t.get_name().startswith("disagg-step")]
        await asyncio.sleep(0.5)  # the lock wait starts once the tick's metrics are in: >= 0.3 s
        assert not task.done()
        lock.release()
        await task

    asyncio.run(main())
    waited = {
        w: sample("disagg_operator_decision_wait_seconds_sum", wait=w) - before[w]
        for w in ("metrics", "slot", "lock")
    }
    assert waited["lock"] >= 0.3
    assert waited["slot"] < 0.1 and waited["metrics"] < 0.1
    assert loop.TRACKERS[(NS, "llm-0000")].last_decision_at >= T0
    assert (
        sum(sample("disagg_operator_decision_seconds_count", outcome=o) for o in ("changed", "unchanged"))
        == decided + 1
    )


class WritesHangFor(FakeKube):
    """A FakeKube whose writes to one object (and its children) do not return until released."""

    def __init__(self, owner: str) -> None:
        super().__init__()
        self.owner = owner
        self.release = asyncio.Event()
        self.hanging = 0

    async def _hold(self, name: str | None) -> None:
        if name is not None and name.startswith(self.owner):
            self.hanging += 1
            await self.release.wait()

    async def patch(self, kind: str, namespace: str | None, name: str, *args, **kwargs) -> dict:
        await self._hold(name)
        return await super().patch(kind, namespace, name, *args, **kwargs)

    async def apply(self, obj: dict, *args, **kwargs) -> dict:
        await self._hold(obj["metadata"]["name"])
        return await super().apply(obj, *args, **kwargs)


def test_objects_decide_on_their_tick_while_every_write_slot_is_held():
    """Only writes to the API server take one of the loop's slots: while one object's writes hold
    the only slot (a slow API server after a load step), another due object still decides at its
    tick, on that tick's metrics; its own writes then wait for the slot, and are counted as the
    slot wait."""

    def slot_waits() -> tuple[float, float]:
        labels = {"wait": "slot"}
        return (
            opmetrics.REGISTRY.get_sample_value("disagg_operator_decision_wait_seconds_count", labels) or 0.0,
            opmetrics.REGISTRY.get_sample_value("disagg_operator_decision_wait_seconds_sum", labels) or 0.0,
        )

    kube = WritesHangFor("llm-0000")
    _, opts = fleet(0)
    opts.cache = watch_cache(kube)
    opts.concurrency = 1
    for name in ("llm-0000", "llm-0001"):
        kube.put(disagg_deployment(name, spec(), NS))
        for pool in ("prefill", "decode"):
            kube.put(deployment(name, pool, 1))
            kube.put(pod(name, pool, 0, created=T0 - 600, admitted=T0 - 540))
    count0, sum0 = slot_waits()

    async def main() -> None:
        bodies = {b["metadata"]["name"]: b for b in opts.cache.disagg_deployments()}
        loop.tracker(bodies["llm-0000"]).next_due = T0
        loop.tracker(bodies["llm-0001"]).next_due = T0 + 1
        first = {t.get_name(): t for t in await loop.tick(kube, opts, T0)}
        for _ in range(100):
            await asyncio.sleep(0.005)
            if kube.hanging:
                break
        assert kube.hanging, "the first object's decision writes (its first status)"
        (second,) = [t for t in await loop.tick(kube, opts, T0 + 1) if t.get_name().startswith("disagg-step")]
        for _ in range(100):
            await asyncio.sleep(0.005)
            if loop.TRACKERS[(NS, "llm-0001")].last_decision_at:
                break
        # decided at its own tick although the only slot is held ...
        assert loop.TRACKERS[(NS, "llm-0001")].last_decision_at == T0 + 1
        # ... and its writes wait for the slot
        await asyncio.sleep(0.2)
        assert not second.done()
        kube.release.set()
        # a status patch and an Event sent at once share the step's slot (no deadlock on it)
        _, pending = await asyncio.wait([second, *first.values()], timeout=5)
        assert not pending

    asyncio.run(main())
    count1, sum1 = slot_waits()
    assert count1 - count0 >= 2  # each object's writes asked for the slot
    assert sum1 - sum0 >= 0.2  # the second one waited for the first one's writes
