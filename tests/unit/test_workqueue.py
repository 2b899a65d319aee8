"""The reconcile queue (disagg.workqueue) and what queues a reconcile (disagg.controller):
coalescing, bounded workers, backoff on failure, no reconcile for the operator's own status."""

from __future__ import annotations

import asyncio
import copy
import itertools
from collections.abc import Callable

import pytest
from fakes import FakeKube, disagg_deployment, pod, watch_cache

from disagg import api, cache, controller, names, opmetrics, workqueue
from disagg.kube import ApiError

pytestmark = pytest.mark.usefixtures("fresh_loop_memory")


async def until(cond: Callable[[], bool], timeout_s: float = 10.0) -> None:
    """Wait until `cond()` holds (the queue runs in the background)."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not cond():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached"
        await asyncio.sleep(0.005)


def test_backoff_doubles_up_to_its_cap():
    assert [workqueue.backoff(n, 1.0, 10.0) for n in (1, 2, 3, 4, 5)] == [1.0, 2.0, 4.0, 8.0, 10.0]


def test_requests_for_one_key_coalesce_and_a_request_while_running_runs_once_more():
    async def main() -> list[str]:
        runs: list[str] = []
        gate = asyncio.Event()

        async def work(key):
            runs.append(key)
            if len(runs) == 1:
                await gate.wait()

        q = workqueue.WorkQueue(work, concurrency=2)
        runner = asyncio.create_task(q.run())
        for _ in range(5):
            q.request("a")
        await until(lambda: runs == ["a"])
        for _ in range(5):  # while "a" runs: one more run afterwards, not five
            q.request("a")
        gate.set()
        await until(lambda: q.runs == 2 and q.pending() == 0)
        await asyncio.sleep(0.05)
        runner.cancel()
        return runs

    assert asyncio.run(main()) == ["a", "a"]


def test_a_slow_key_holds_one_worker_only():
    async def main() -> list[str]:
        done: list[str] = []
        slow = asyncio.Event()

        async def work(key):
            if key == "slow":
                await slow.wait()
            done.append(key)

        q = workqueue.WorkQueue(work, concurrency=2)
        runner = asyncio.create_task(q.run())
        q.request("slow")
        for k in ("b", "c", "d"):
            q.request(k)
        await until(lambda: len(done) == 3)
        slow.set()
        await until(lambda: len(done) == 4)
        runner.cancel()
        return done

    assert asyncio.run(main()) == ["b", "c", "d", "slow"]


def test_a_failing_key_is_retried_with_backoff_until_it_succeeds():
    async def main() -> tuple[list[float], int]:
        times: list[float] = []
        loop = asyncio.get_running_loop()

        async def work(key):
            times.append(loop.time())
            if len(times) < 4:
                raise ApiError(403, "exceeded quota")

        q = workqueue.WorkQueue(work, backoff_s=0.05, max_backoff_s=1.0)
        runner = asyncio.create_task(q.run())
        q.request("a")
        await until(lambda: len(times) == 4)
        failures = q.failures("a")
        await asyncio.sleep(0.3)  # succeeded: no more runs
        runner.cancel()
        return [b - a for a, b in itertools.pairwise(times)], failures + len(times) - 4

    gaps, after = asyncio.run(main())
    assert after == 0  # the count reset on success, and no run after it
    assert gaps[0] >= 0.05 and gaps[1] >= 0.1 and gaps[2] >= 0.2  # each wait doubles


# ---------------------------------------------------------------------------- the controller


def _controller(kube: FakeKube, **queue_options) -> controller.Controller:
    c = controller.Controller(lambda: kube, **queue_options)
    kube.watchers.append(
        lambda t, obj: (
            obj["kind"] in cache.KINDS and c.on_event(obj["kind"], t, obj)  # the kinds the operator watches
        )
    )
    return c


def test_own_status_writes_do_not_reconcile_and_spec_changes_do():
    spec = {"engine": "vllm", "model": "m", "pools": {}}
    kube = FakeKube()
    c = _controller(kube)
    obj = kube.put(disagg_deployment("x", spec))  # ADDED: one reconcile queued
    assert c.queue.pending() == 1
    c.reconciled[("ns", "x")] = controller.reconcile_key(obj)
    c.queue.forget(("ns", "x"))
    asyncio.run(kube.patch(api.KIND, "ns", "x", {"status": {"observedGeneration": 1}}, subresource="status"))
    assert c.queue.pending() == 0  # the operator's own status write
    changed = copy.deepcopy(kube.obj(api.KIND, "ns", "x"))
    changed["metadata"]["generation"] = 2
    kube.put(changed)
    assert c.queue.pending() == 1  # a spec change


def test_child_events_queue_only_their_owner():
    kube = FakeKube()
    c = _controller(kube)
    kube.put(pod("a", "decode", 0, created=0, admitted=None))
    kube.put(pod("a", "decode", 1, created=0, admitted=None))
    kube.put(pod("b", "decode", 0, created=0, admitted=None))
    assert sorted(c.queue._due) == [("ns", "a"), ("ns", "b")]


def test_a_pool_service_or_pdb_reconciles_its_owner_only_when_deleted():
    """Services and PodDisruptionBudgets feed the cache; their own changes (the operator's
    applies, the disruption controller's status) reconcile nothing; a deletion brings the owner's
    reconcile, which recreates the child."""
    kube = FakeKube()
    c = _controller(kube)
    for kind in ("Service", "PodDisruptionBudget"):
        child = {
            "apiVersion": "v1",
            "kind": kind,
            "metadata": {
                "name": f"a-decode-{kind.lower()}",
                "namespace": "ns",
                "labels": {names.LABEL_DEPLOYMENT: "a"},
            },
            "spec": {},
        }
        kube.put(child)  # ADDED
        kube.put({**child, "status": {"disruptionsAllowed": 1}})  # MODIFIED
        assert c.queue.pending() == 0, kind
        assert c.cache.children(kind, "ns", "a"), kind  # kept in the cache all the same
        kube.remove(kind, "ns", child["metadata"]["name"])
        assert sorted(c.queue._due) == [("ns", "a")], kind
        assert not c.cache.children(kind, "ns", "a"), kind
        c.queue.forget(("ns", "a"))


def _sample_spec() -> dict:
    from pathlib import Path

    import yaml

    sample = Path(__file__).resolve().parents[2] / "config" / "samples" / "vllm-disaggregated-70b.yaml"
    spec = yaml.safe_load(sample.read_text())["spec"]
    spec["autoscaling"] = {"enabled": False}
    return spec


def test_one_object_converges_in_a_handful_of_reconciles():
    """Creation, its children's events and the operator's own writes (children, status, pod
    admission): every one of them comes back as a watch event, yet few reconciles run."""

    async def main() -> tuple[int, dict]:
        kube = FakeKube()
        c = _controller(kube)
        runner = asyncio.create_task(c.queue.run())
        kube.put(disagg_deployment("llm", _sample_spec()))
        await until(lambda: c.queue.pending() == 0 and c.reconciles >= 1)
        await until(lambda: c.queue.pending() == 0 and not c.queue._running)
        await asyncio.sleep(controller.CHILD_EVENT_DELAY_S * 2)  # its own children's events
        await until(lambda: c.queue.pending() == 0 and not c.queue._running)
        # The cluster starts the pods of each pool Deployment, one event at a time, as a real
        # one does: each comes back to the controller, as do the operator's own writes.
        settled = lambda: c.queue.pending() == 0 and not c.queue._running  # noqa: E731
        for (kind, _, name), dep in list(kube.objects.items()):
            if kind != "Deployment" or names.LABEL_POOL not in dep["metadata"]["labels"]:
                continue
            pool, n = dep["metadata"]["labels"][names.LABEL_POOL], dep["spec"]["replicas"]
            for i in range(n):
                p = pod("llm", pool, i, created=0, admitted=None)
                p["metadata"]["name"] = f"{name}-{i}"
                kube.put(p)
            done = copy.deepcopy(kube.obj("Deployment", "ns", name))
            done["status"] = {"replicas": n, "readyReplicas": n, "updatedReplicas": n, "availableReplicas": n}
            done["status"]["observedGeneration"] = done["metadata"].get("generation", 1)
            kube.put(done)
            await asyncio.sleep(controller.CHILD_EVENT_DELAY_S * 2)
            await until(settled)
        runner.cancel()
        return c.reconciles, kube.obj(api.KIND, "ns", "llm").get("status") or {}

    def timed() -> float:
        return opmetrics.REGISTRY.get_sample_value("disagg_operator_reconcile_seconds_count") or 0.0

    before = timed()
    reconciles, st = asyncio.run(main())
    assert timed() - before == reconciles  # each reconcile is timed (bench_scale reads it)
    assert st.get("pools"), st
    # one for the object, one for its new children, then per pool one for its pods starting
    # and one for their admission (the operator's pod writes) -- not one per event
    assert reconciles <= 2 + 2 * len(st["pools"]), reconciles


def test_a_steady_reconcile_reads_the_cache_and_writes_nothing():
    """A converged object reconciled again (a child event, say): the object and its pools'
    children come from the watch cache, the router's kinds are not listed again
    when it has none, and nothing is written."""

    async def main() -> FakeKube:
        kube = FakeKube()
        spec = _sample_spec()
        spec["router"] = {"enabled": False}
        c = controller.Controller(lambda: kube, cache=watch_cache(kube))
        kube.watchers.append(lambda t, obj: obj["kind"] in cache.KINDS and c.on_event(obj["kind"], t, obj))
        runner = asyncio.create_task(c.queue.run())
        kube.put(disagg_deployment("llm", spec))
        settled = lambda: c.queue.pending() == 0 and not c.queue._running  # noqa: E731
        for _ in range(3):  # creation, then its children's events
            await asyncio.sleep(controller.CHILD_EVENT_DELAY_S * 2)
            await until(settled)
        assert c.reconciles >= 1
        kube.calls.clear()
        before = c.reconciles
        c.queue.request(("ns", "llm"))
        await until(lambda: c.reconciles == before + 1 and settled())
        runner.cancel()
        return kube

    kube = asyncio.run(main())
    assert not [k for k in kube.calls if k[0] in ("apply", "patch", "delete")], kube.calls  # no write
    assert kube.calls[("get", api.KIND)] == 0
    # every pool child (Deployments, Services, PodDisruptionBudgets, Pods) from the cache: no
    # request at all
    assert dict(kube.calls) == {}, kube.calls
