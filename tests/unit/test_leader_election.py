"""Leader election (disagg.leader) on a fake Lease: one holder, takeover after expiry, and a
leader that cannot renew steps down before the Lease can expire for the others."""

from __future__ import annotations

import asyncio
import datetime as dt
import time

import pytest
from fakes import FakeKube

from disagg.kube import ApiError
from disagg.leader import LeaderElector

NS = "ops"


def elector(kube: FakeKube, who: str, lease_s: int = 2, renew_s: float = 0.2) -> LeaderElector:
    return LeaderElector(kube, NS, identity=who, lease_s=lease_s, renew_s=renew_s)


def holder(kube: FakeKube) -> str | None:
    return kube.obj("Lease", NS, "disagg-operator-leader")["spec"]["holderIdentity"]


def test_one_holder_at_a_time_and_takeover_after_expiry():
    kube = FakeKube()
    a, b = elector(kube, "a"), elector(kube, "b")
    assert asyncio.run(a.try_acquire())
    assert not asyncio.run(b.try_acquire())  # held and fresh
    assert asyncio.run(a.try_acquire())  # renewing our own
    assert holder(kube) == "a"
    lease = kube.obj("Lease", NS, "disagg-operator-leader")
    old = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=10)
    lease["spec"]["renewTime"] = old.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    assert asyncio.run(b.try_acquire())  # expired: taken over
    assert holder(kube) == "b"
    assert kube.obj("Lease", NS, "disagg-operator-leader")["spec"]["leaseTransitions"] == 1
    assert not asyncio.run(a.try_acquire())


def test_a_stale_read_loses_the_race():
    kube = FakeKube()
    a = elector(kube, "a")
    assert asyncio.run(a.try_acquire())
    real_get = kube.get

    async def get_then_someone_writes(kind, ns, name):
        lease = await real_get(kind, ns, name)
        kube.obj(kind, ns, name)["metadata"]["resourceVersion"] = "999"  # another writer in between
        return lease

    kube.get = get_then_someone_writes  # type: ignore[method-assign]
    assert not asyncio.run(a.try_acquire())  # the optimistic-concurrency update conflicts


def test_a_leader_that_cannot_renew_steps_down_before_the_lease_expires():
    kube = FakeKube()
    a = elector(kube, "a", lease_s=1, renew_s=0.2)
    assert asyncio.run(a.try_acquire())
    kube.fail_patch = lambda kind, name: ApiError(503, "apiserver unavailable")
    lost: list[float] = []
    started = time.monotonic()

    async def run() -> None:
        await asyncio.wait_for(a.hold(lambda: lost.append(time.monotonic())), timeout=3.0)

    asyncio.run(run())
    assert lost, "the leader never stepped down"
    # it gives up one renew period before the Lease could expire for the others
    assert lost[0] - started <= a.lease_s


def test_a_leader_that_renews_keeps_leading():
    kube = FakeKube()
    a = elector(kube, "a", lease_s=1, renew_s=0.2)
    assert asyncio.run(a.try_acquire())
    lost: list[bool] = []

    async def run() -> None:
        task = asyncio.create_task(a.hold(lambda: lost.append(True)))
        await asyncio.sleep(1.5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(run())
    assert not lost and holder(kube) == "a"


def test_renew_period_must_leave_room_before_expiry():
    with pytest.raises(ValueError, match="renew_s"):
        LeaderElector(FakeKube(), NS, lease_s=10, renew_s=5)
