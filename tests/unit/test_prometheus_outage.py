"""Prometheus gone for several minutes, on virtual time: the operator's real loop (disagg.loop
over disagg.autoscaler.decide) on a fake cluster and a fake Prometheus, stepped 30 s at a time.

While the metrics are missing nothing scales (down or up), no drain starts, a drain past its
deadline is held, and the conditions say why; when they return, decisions resume.
"""

from __future__ import annotations

import pytest
from test_loop_executor import NS, World, _draining, sample_spec

from disagg import names

pytestmark = pytest.mark.usefixtures("fresh_loop_memory")

#: Virtual length of the outage: longer than the stabilization window (300 s), the drain's
#: deadline and several decision intervals, so none of them may end it by waiting.
OUTAGE_S = 600.0
STEP_S = 30.0


def kill(w: World, how: str) -> None:
    if how == "down":  # the server is gone: every query fails (connection refused)
        w.prom.error = ConnectionError("connection refused")
    else:  # restarted with an empty database: every query answers, with no series
        w.prom.scalars = {}
        w.prom.per_pod = {}


def sizes(w: World) -> tuple[int, int]:
    return w.replicas("prefill"), w.replicas("decode")


@pytest.mark.parametrize("how", ["down", "empty"])
def test_minutes_without_prometheus_scale_nothing_and_hold_drains_then_decisions_resume(how: str):
    w = World(spec=sample_spec(scaleDownStabilizationSeconds=300), prefill=4, decode=8)
    # A scale-down drain is under way: its pod still has work, its deadline falls in the outage.
    victim = _draining(w, "decode", 7, deadline=w.now + 120, on_timeout="proceed")
    w.load(0.2, **{victim: 3.0})  # little load: every pool would shrink once the window passes
    w.step()
    before = sizes(w)
    assert before == (4, 8)
    assert w.condition(names.COND_METRICS_AVAILABLE)["status"] == "True"

    kill(w, how)
    drains_before = w.kube.reasons().count(names.EVENT_DRAIN_STARTED)
    for _ in range(int(OUTAGE_S / STEP_S)):
        w.step(STEP_S)
        assert sizes(w) == before, f"a pool changed size {OUTAGE_S} s into an outage ({how})"
        assert names.ANNOTATION_DRAIN in w.kube.obj("Pod", NS, victim)["metadata"]["annotations"]
        metrics = w.condition(names.COND_METRICS_AVAILABLE)
        assert metrics["status"] == "False" and metrics["reason"] == "MetricsMissing"
        assert w.status()["lastDecision"]["reason"] == "HoldStaleMetrics"
    assert w.kube.reasons().count(names.EVENT_DRAIN_STARTED) == drains_before  # no new drain
    assert names.EVENT_DRAIN_COMPLETED not in w.kube.reasons()
    held = w.condition(names.COND_DRAIN_HELD)  # the deadline passed with the work unknown
    assert held["status"] == "True" and victim in held["message"]

    # The metrics return (the victim is idle now): the held drain ends, decisions resume.
    w.prom.error = None
    w.load(0.2, **{victim: 0.0})
    out = w.step(STEP_S)
    assert w.condition(names.COND_METRICS_AVAILABLE)["status"] == "True"
    assert w.condition(names.COND_DRAIN_HELD)["status"] == "False"
    assert w.replicas("decode") == before[1] - 1  # exactly the held pod; new drains wait their turn
    # The window's recommendations all predate the outage (as with the HPA, the outage's
    # unknown minutes count for nothing): the first decision on fresh metrics acts.
    assert out is not None and out.reason == "ScaleDown"
    assert w.status()["lastDecision"]["reason"] == "ScaleDown"
    assert out.drains and all(d.pod != victim for d in out.drains)


def test_an_outage_never_reads_as_zero_load_and_scales_nothing_up_either():
    w = World(prefill=1, decode=2)
    w.load(2.0)
    w.step()
    before = sizes(w)
    w.prom.error = ConnectionError("connection refused")
    for _ in range(int(OUTAGE_S / STEP_S)):
        out = w.step(STEP_S)
        assert out is not None and out.reason == "HoldStaleMetrics"
        assert sizes(w) == before
    assert sizes(w) == before
    w.prom.error = None
    w.load(8.0, short=8.0)  # the load that arrived meanwhile: scale-up follows at once
    out = w.step(STEP_S)
    assert out is not None and out.reason == "ScaleUp"
    assert w.replicas("prefill") > before[0] and w.replicas("decode") > before[1]
