"""A drain the operator resumes after a restart takes its pod out of routing again (disagg.loop).

The previous operator may have died between writing the drain record and setting the routable
gate, or between the gate and the call that removes the worker from a router that ignores Ready
(sglang-router; disagg.routerclient): the router would then go on sending the draining pod new
requests until it is deleted (seen in tests/e2e/test_endpoint.py's operator-kill case with SGLang).
"""

from __future__ import annotations

import pytest
from test_loop_executor import NS, T0, World, _draining

from disagg import drain, loop, names, status

pytestmark = pytest.mark.usefixtures("fresh_loop_memory")


@pytest.fixture
def router_calls(monkeypatch) -> list[tuple[str, bool]]:
    calls: list[tuple[str, bool]] = []

    async def record(kube, pod, routable: bool) -> int:
        calls.append((pod["metadata"]["name"], routable))
        return 1

    monkeypatch.setattr(loop.routerclient, "set_worker_routable", record)
    return calls


def test_a_resumed_drain_sets_the_gate_and_removes_the_worker_once(router_calls):
    w = World(prefill=1, decode=4)
    # Died after the record, before the gate: the pod is still routable.
    no_gate = _draining(w, "decode", 2, deadline=T0 + 600, on_timeout="readmit")
    # Died after the gate, before the router call.
    no_router = _draining(w, "decode", 3, deadline=T0 + 600, on_timeout="readmit")
    loop.OUT_OF_ROUTING.clear()  # begun by the operator that died
    for c in w.kube.obj("Pod", NS, no_router)["status"]["conditions"]:
        if c["type"] == names.READINESS_GATE:
            c["status"], c["reason"] = "False", names.GATE_DRAINING
    w.load(2.0, **{no_gate: 3.0, no_router: 3.0})  # both still busy: the drains go on
    w.step(1.0)
    assert sorted(router_calls) == sorted([(no_gate, False), (no_router, False)])
    assert status.pod_condition(w.kube.obj("Pod", NS, no_gate), names.READINESS_GATE) == "False"
    w.step(1.0)
    w.step(1.0)
    assert len(router_calls) == 2, router_calls  # once per drain, not every step
    # A restarted operator (its memory empty) takes them out once more.
    loop.OUT_OF_ROUTING.clear()
    w.step(1.0)
    assert len(router_calls) == 4, router_calls


def test_a_readmitted_pod_is_added_back_and_forgotten(router_calls):
    w = World(prefill=1, decode=4)
    name = _draining(w, "decode", 3, deadline=T0, on_timeout="readmit")  # past its deadline
    w.load(2.0, **{name: 3.0})
    w.step(1.0)
    assert router_calls[-1] == (name, True)
    assert not loop.OUT_OF_ROUTING


def test_a_resumed_drain_settles_from_when_it_left_routing_again(router_calls):
    """The record began long ago, but the restarted operator cannot know when routers last
    sent the pod work: only a sample taken ROUTING_SETTLE_S after it took the pod out of
    routing again ends the drain."""
    w = World(prefill=1, decode=4)
    name = _draining(w, "decode", 3, deadline=T0 + 600, on_timeout="readmit")  # began 100 s ago
    loop.OUT_OF_ROUTING.clear()  # by the operator that died
    w.load(2.0, **{name: 0.0})  # reads idle in the newest scrape
    w.step(1.0)
    assert router_calls == [(name, False)]
    assert w.replicas("decode") == 4
    assert names.EVENT_DRAIN_COMPLETED not in w.kube.reasons()
    w.step(drain.ROUTING_SETTLE_S)
    assert names.EVENT_DRAIN_COMPLETED in w.kube.reasons()
    assert w.replicas("decode") == 3
