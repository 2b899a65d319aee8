"""The autoscaler's executor (disagg.loop) and the status writer, on a fake Kubernetes and a
fake Prometheus: conditions, Events, drains, persisted scaler state, forgetting deleted objects."""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import json
from pathlib import Path

import pytest
import yaml
from fakes import FakeKube, FakePrometheus, deployment, disagg_deployment, pod, resync, watch_cache

from disagg import api, autoscaler, drain, loop, names, planner, reconcile, status

pytestmark = pytest.mark.usefixtures("fresh_loop_memory")

SAMPLE = Path(__file__).resolve().parents[2] / "config" / "samples" / "vllm-disaggregated-70b.yaml"
NS, NAME = "ns", "llm"
T0 = 1_800_000_000.0
SCRAPE = 15.0


def sample_spec(**autoscaling) -> dict:
    spec = yaml.safe_load(SAMPLE.read_text())["spec"]
    spec["autoscaling"] = {
        "intervalSeconds": 30,
        "scrapeIntervalSeconds": int(SCRAPE),
        "scaleDownStabilizationSeconds": 300,
        **autoscaling,
    }
    return spec


class World:
    """A DisaggDeployment with its pools and pods on a fake cluster, and its metrics."""

    def __init__(self, spec: dict | None = None, prefill: int = 1, decode: int = 2) -> None:
        self.kube = FakeKube()
        self.prom = FakePrometheus()
        self.opts = loop.LoopOptions(metrics_source=self.prom, cache=watch_cache(self.kube))
        self.kube.put(disagg_deployment(NAME, spec or sample_spec(), NS))
        self.sizes = {"prefill": prefill, "decode": decode}
        self.now = T0
        self.pods(prefill=prefill, decode=decode)
        self.load(2.0)

    def pods(self, **sizes: int) -> None:
        for pool, n in sizes.items():
            self.kube.put(deployment(NAME, pool, n))
            for i in range(n):
                self.kube.put(pod(NAME, pool, i, created=T0 - 600 - i, admitted=T0 - 540 - i))

    def load(self, rate: float, short: float | None = None, **work: float) -> None:
        self.prom.scalars = {"arrival_rps": rate, "prompt_tokens_mean": 6000.0, "output_tokens_mean": 400.0}
        if short is not None:
            self.prom.scalars["arrival_rps_short"] = short
        self.prom.per_pod = {}
        for (kind, _, name), obj in self.kube.objects.items():
            if kind == "Pod" and obj["status"]["phase"] == "Running":
                pool = obj["metadata"]["labels"][names.LABEL_POOL]
                self.prom.per_pod.setdefault(pool, {})[name] = (work.get(name, 1.0), 0.0)

    def body(self) -> dict:
        return self.kube.obj(api.KIND, NS, NAME)

    def step(self, dt: float = 30.0) -> autoscaler.Outcome | None:
        self.now += dt
        self.prom.now = self.now
        resync(self.kube, self.opts.cache)  # objects a test edited in place
        asyncio.run(loop.step(self.kube, self.body(), self.opts, self.now))
        tr = loop.TRACKERS.get((NS, NAME))
        return tr.last_outcome if tr else None

    def status(self) -> dict:
        return self.body().get("status") or {}

    def condition(self, ctype: str) -> dict:
        cond = self.kube.condition(NS, NAME, ctype)
        assert cond is not None, f"no {ctype} condition"
        return cond

    def replicas(self, pool: str) -> int:
        return self.kube.obj("Deployment", NS, f"{NAME}-{pool}")["spec"]["replicas"]


# ---------------------------------------------------------------------------- metrics conditions


def test_metrics_available_follows_the_snapshot():
    w = World()
    w.step()
    assert w.condition(names.COND_METRICS_AVAILABLE)["status"] == "True"
    w.prom.error = ConnectionError("prometheus down")
    w.step()
    cond = w.condition(names.COND_METRICS_AVAILABLE)
    assert cond["status"] == "False" and cond["reason"] == "MetricsMissing"
    assert "query failed: ConnectionError" in cond["message"]  # the failure's kind, never its text
    assert w.status()["lastDecision"]["reason"] == "HoldStaleMetrics"
    warn = [e for e in w.kube.events if e["type"] == "Warning"]
    assert warn and warn[-1]["reason"] == "HoldStaleMetrics"


def test_a_new_object_is_not_reported_stale_before_a_pod_serves():
    """No metrics can exist before a pod serves, nor before Prometheus has scraped it: no
    Warning, no status write until two scrape intervals after the first pod began to serve;
    then the missing metrics are reported."""
    w = World()
    for (kind, _, _), obj in w.kube.objects.items():
        if kind == "Pod":
            obj["status"] = {"phase": "Pending", "conditions": []}
    w.prom.error = ConnectionError("no target yet")
    writes = w.kube.calls[("patch", api.KIND)]
    w.step()
    assert w.kube.calls[("patch", api.KIND)] == writes and w.kube.events == []
    for (kind, _, name), obj in list(w.kube.objects.items()):
        if kind == "Pod":  # serving from the next decision on, no sample yet
            w.kube.put(
                pod(
                    NAME,
                    obj["metadata"]["labels"][names.LABEL_POOL],
                    int(name[-5:]),
                    created=w.now - 60,
                    admitted=w.now + 25,
                )
            )
    w.step()
    assert w.kube.calls[("patch", api.KIND)] == writes and w.kube.events == []
    w.step(dt=2 * SCRAPE)  # two scrape intervals after the first pod began to serve
    assert w.condition(names.COND_METRICS_AVAILABLE)["status"] == "False"
    assert [e["reason"] for e in w.kube.events] == ["HoldStaleMetrics"]


def test_serving_pods_without_metrics_are_reported_at_the_first_decision():
    w = World()
    w.prom.error = ConnectionError("prometheus down")
    w.step()
    assert w.condition(names.COND_METRICS_AVAILABLE)["status"] == "False"
    assert [e["reason"] for e in w.kube.events] == ["HoldStaleMetrics"]


def test_no_decision_before_the_pools_exist():
    """A pool not created yet would read as 0 replicas and be "grown" to its minimum by a
    reconcile from the decision (with a write slot and the object's lock held, while the
    controller's own reconcile creates it): the decision waits for the pools instead."""
    w = World()
    w.kube.objects.pop(("Deployment", NS, f"{NAME}-decode"))
    resync(w.kube, w.opts.cache)
    w.kube.calls.clear()
    w.step()
    assert dict(w.kube.calls) == {} and w.kube.events == []
    assert loop.TRACKERS[(NS, NAME)].last_outcome is None
    w.kube.put(deployment(NAME, "decode", 2))
    assert w.step() is not None


def test_the_operator_asks_for_the_short_window_rate():
    w = World()
    w.step()
    assert "arrival_rps_short" in w.prom.asked


@pytest.mark.parametrize(("age_scrapes", "fresh"), [(1.9, True), (2.1, False), (3.0, False)])
def test_a_sample_older_than_two_scrapes_is_stale(age_scrapes: float, fresh: bool):
    w = World()
    w.prom.sample_age_s = age_scrapes * SCRAPE
    w.step()
    assert w.condition(names.COND_METRICS_AVAILABLE)["status"] == ("True" if fresh else "False")
    if not fresh:
        assert (
            f"no sample in the last {2 * SCRAPE:.0f} s"
            in w.condition(names.COND_METRICS_AVAILABLE)["message"]
        )
        assert w.status()["lastDecision"]["reason"] == "HoldStaleMetrics"


def test_stale_metrics_never_scale_down():
    w = World(prefill=4, decode=8)
    w.load(0.1)
    w.prom.sample_age_s = 5 * SCRAPE
    for _ in range(20):  # far past the stabilization window
        w.step()
    assert (w.replicas("prefill"), w.replicas("decode")) == (4, 8)
    assert not any(e["reason"] == names.EVENT_DRAIN_STARTED for e in w.kube.events)


# ---------------------------------------------------------------------------- apply, events, status


def test_scale_up_writes_replicas_a_human_event_and_one_ratio():
    w = World(prefill=1, decode=2)
    w.load(8.0, short=8.0)
    out = w.step()
    assert out is not None and out.reason == "ScaleUp"
    assert w.replicas("prefill") == out.next_step["prefill"] > 1
    assert w.replicas("decode") == out.next_step["decode"] > 2
    ev = next(e for e in w.kube.events if e["reason"] == "ScaleUp")
    want = (
        f"targets prefill {out.targets['prefill']}, decode {out.targets['decode']} (was prefill 1, decode 2)"
    )
    assert ev["message"].startswith(want)
    assert "{" not in ev["message"] and "'" not in ev["message"]
    st = w.status()
    assert st["lastDecision"] == out.record.to_status()
    assert st["lastDecision"]["outputs"]["targets"] == out.targets
    assert st["pools"]["decode"]["desiredReplicas"] == out.targets["decode"]
    assert st["ratio"] == api.format_ratio(out.targets)


def test_scale_down_drains_the_idlest_pod_first():
    w = World(spec=sample_spec(scaleDownStabilizationSeconds=0), prefill=2, decode=6)
    busy = {f"{NAME}-decode-5f7c9-{i:05d}": 5.0 for i in range(6)}
    idle = f"{NAME}-decode-5f7c9-00003"
    busy[idle] = 0.0
    w.load(1.0, **busy)
    out = w.step()
    assert out is not None and out.next_step["decode"] < 6
    drained = [o.pod for o in out.drains if o.pool == "decode"]
    assert drained[0] == idle
    victim = w.kube.obj("Pod", NS, idle)
    assert names.ANNOTATION_DRAIN in victim["metadata"]["annotations"]
    gate = next(c for c in victim["status"]["conditions"] if c["type"] == names.READINESS_GATE)
    assert gate["status"] == "False"
    assert w.replicas("decode") == 6  # not lowered before the drain completes
    assert names.EVENT_DRAIN_STARTED in w.kube.reasons()


def test_a_drain_ends_only_on_a_sample_taken_after_routers_stopped_sending_work():
    """The victim read idle at the decision, but routers could send it requests until its
    drain settled: a zero from a sample taken before then (fresh by age) must not remove it."""
    w = World(spec=sample_spec(scaleDownStabilizationSeconds=0), prefill=2, decode=6)
    idle = f"{NAME}-decode-5f7c9-00003"
    w.load(1.0, **{f"{NAME}-decode-5f7c9-{i:05d}": 5.0 for i in range(6)} | {idle: 0.0})
    out = w.step()
    assert out is not None and idle in [o.pod for o in out.drains]
    since = w.now
    # One second later the newest scrape is still the one from before the drain (10 s old:
    # fresh at a 15 s scrape interval) and reads it idle: that says nothing of what came since.
    w.prom.sample_age_s = 10.0
    w.step(1.0)
    assert w.replicas("decode") == 6
    assert names.EVENT_DRAIN_COMPLETED not in w.kube.reasons()
    # A scrape inside the settling time does not count either.
    w.prom.sample_age_s = 0.0
    w.now = since + drain.ROUTING_SETTLE_S - 2.0
    w.step(1.0)
    assert w.replicas("decode") == 6
    # The first scrape after the drain settled reads it idle: now it goes.
    w.step(1.0)
    assert names.EVENT_DRAIN_COMPLETED in w.kube.reasons()
    assert w.replicas("decode") == 5


def _revision(w: World, pool: str, revisions: list[str]) -> None:
    """Label the pool's pods as the ReplicaSets of `revisions` own them, in turn."""
    pods = sorted(n for (k, _, n) in w.kube.objects if k == "Pod" and f"-{pool}-" in n)
    for i, name in enumerate(pods):
        w.kube.obj("Pod", NS, name)["metadata"]["labels"][names.LABEL_POD_TEMPLATE_HASH] = revisions[
            i % len(revisions)
        ]


def test_no_scale_down_drain_starts_or_completes_during_a_rollout():
    w = World(spec=sample_spec(scaleDownStabilizationSeconds=0), prefill=2, decode=6)
    _revision(w, "decode", ["old", "new"])  # two ReplicaSets: the Deployment is rolling out
    w.load(1.0)
    out = w.step()
    assert out is not None and out.targets["decode"] < 6
    assert not [o for o in out.drains if o.pool == "decode"]
    assert any("decode waits for its rollout" in n for n in out.notes)
    assert [o.pool for o in out.drains] == ["prefill"] * len(out.drains)
    # a drain begun before the rollout finishes its work but is not removed until it is over
    name = _draining(w, "decode", 5, deadline=w.now + 600, on_timeout="readmit")
    w.load(1.0, **{name: 0.0})
    w.step(1.0)
    assert w.replicas("decode") == 6
    _revision(w, "decode", ["new"])  # rollout done
    w.step(1.0)
    assert w.replicas("decode") == 5
    out = w.step()
    assert out is not None and [o for o in out.drains if o.pool == "decode"]


def _draining(w: World, pool: str, i: int, *, deadline: float, on_timeout: str) -> str:
    """A drain this process began 100 s ago (a restarted operator's drains: clear
    loop.OUT_OF_ROUTING after this)."""
    name = f"{NAME}-{pool}-5f7c9-{i:05d}"
    rec = drain.DrainRecord(w.now - 100, deadline, on_timeout)
    obj = w.kube.obj("Pod", NS, name)
    obj["metadata"]["annotations"][names.ANNOTATION_DRAIN] = rec.to_annotation()
    loop.OUT_OF_ROUTING[loop._pod_key(obj)] = rec.since
    return name


def test_a_drain_past_its_deadline_readmits_with_a_drain_timeout_event():
    w = World(prefill=1, decode=4)
    name = _draining(w, "decode", 3, deadline=T0, on_timeout="readmit")
    w.load(2.0, **{name: 3.0})  # still has work
    w.step(1.0)
    ev = [e for e in w.kube.events if e["reason"] == names.EVENT_DRAIN_TIMEOUT]
    assert ev and ev[0]["type"] == "Warning" and name in ev[0]["message"]
    pod_now = w.kube.obj("Pod", NS, name)
    assert names.ANNOTATION_DRAIN not in pod_now["metadata"]["annotations"]
    gate = next(c for c in pod_now["status"]["conditions"] if c["type"] == names.READINESS_GATE)
    assert gate["status"] == "True" and gate["reason"] == names.GATE_READMITTED
    assert w.replicas("decode") == 4


def test_a_drain_past_its_deadline_with_proceed_removes_the_pod_with_an_event():
    w = World(prefill=1, decode=4)
    name = _draining(w, "decode", 3, deadline=T0, on_timeout="proceed")
    w.load(2.0, **{name: 3.0})
    w.step(1.0)
    assert names.EVENT_DRAIN_TIMEOUT in w.kube.reasons()
    assert names.EVENT_DRAIN_COMPLETED in w.kube.reasons()
    assert w.replicas("decode") == 3


def test_a_timed_out_drain_with_unknown_work_is_held_not_removed():
    w = World(prefill=1, decode=4)
    name = _draining(w, "decode", 3, deadline=T0, on_timeout="proceed")
    w.load(2.0, **{name: 3.0})
    w.prom.error = ConnectionError("prometheus down")  # an outage: nobody knows its work
    for _ in range(3):
        w.step(1.0)
    assert w.replicas("decode") == 4  # nothing removed while the work is unknown
    assert names.ANNOTATION_DRAIN in w.kube.obj("Pod", NS, name)["metadata"]["annotations"]
    held = w.condition(names.COND_DRAIN_HELD)
    assert held["status"] == "True" and f"decode/{name}" in held["message"]
    assert w.kube.reasons().count(names.EVENT_DRAIN_HELD) == 1  # once, not every tick
    assert names.EVENT_DRAIN_COMPLETED not in w.kube.reasons()
    w.prom.error = None  # the metrics return: the timeout proceeds with the work they show
    w.step(1.0)
    assert w.replicas("decode") == 3
    assert names.EVENT_DRAIN_TIMEOUT in w.kube.reasons()
    assert w.condition(names.COND_DRAIN_HELD)["status"] == "False"


def test_a_finished_drain_lowers_replicas_by_exactly_the_victim():
    w = World(prefill=1, decode=4)
    name = _draining(w, "decode", 3, deadline=T0 + 600, on_timeout="readmit")
    w.load(2.0, **{name: 0.0})
    w.step(1.0)
    assert w.replicas("decode") == 3
    rec = drain.DrainRecord.from_pod(w.kube.obj("Pod", NS, name))
    assert rec is not None and rec.removing == w.now
    assert w.kube.obj("Pod", NS, name)["metadata"]["annotations"][names.ANNOTATION_DELETION_COST]


def test_a_late_watch_event_does_not_put_old_conditions_back():
    """Reconcile writes Ready; the watch then delivers the object's version from before that
    write, late (as under load). The next decision merges its own conditions into the status
    it reads: read from that old version, it wrote the old conditions back, and with nothing
    left to reconcile (a status-only change) the object reported its pools not ready for good."""
    w = World()
    for _ in range(3):  # steady: the decisions hold
        w.step()
    before = copy.deepcopy(w.body())
    ready = status.condition(
        names.COND_READY, True, "AllPoolsReady", "every pool has its desired replicas ready", 1
    )
    conds = status.merge_conditions(before["status"]["conditions"], [ready])
    asyncio.run(reconcile.write_status(loop.cached(w.kube, w.opts), before, {"conditions": conds}))
    w.opts.cache.observe(api.KIND, "MODIFIED", before)  # the watch, late
    w.prom.error = ConnectionError("prometheus down")  # a decision that writes a condition
    w.now += 30.0
    w.prom.now = w.now
    asyncio.run(loop.step(w.kube, w.body(), w.opts, w.now))
    assert w.condition(names.COND_METRICS_AVAILABLE)["status"] == "False"
    assert w.condition(names.COND_READY)["status"] == "True"


def test_reconcile_reports_an_invalid_spec_as_true_and_a_valid_one_as_false():
    kube = FakeKube()
    bad = sample_spec()
    bad["pools"]["decode"]["minReplicas"] = 20  # above maxReplicas
    kube.put(disagg_deployment(NAME, bad, NS))
    asyncio.run(reconcile.reconcile(kube, kube.obj(api.KIND, NS, NAME)))
    cond = kube.condition(NS, NAME, names.COND_INVALID_SPEC)
    assert cond is not None and cond["status"] == "True" and "minReplicas" in cond["message"]
    assert kube.condition(NS, NAME, names.COND_READY)["status"] == "False"
    assert names.EVENT_INVALID_SPEC in kube.reasons()
    assert not [k for k in kube.objects if k[0] == "Deployment"]  # nothing created
    kube.obj(api.KIND, NS, NAME)["spec"] = sample_spec()
    asyncio.run(reconcile.reconcile(kube, kube.obj(api.KIND, NS, NAME)))
    assert kube.condition(NS, NAME, names.COND_INVALID_SPEC)["status"] == "False"
    deployments = {k[2] for k in kube.objects if k[0] == "Deployment"}
    assert deployments == {f"{NAME}-prefill", f"{NAME}-decode", f"{NAME}-router"}  # pools and the router


# ---------------------------------------------------------------------------- state across restarts


def _restart() -> None:
    """A new operator process: nothing in memory."""
    loop.TRACKERS.clear()
    reconcile.DESIRED.clear()


def test_a_restart_inside_the_stabilization_window_neither_scales_down_early_nor_late():
    w = World(spec=sample_spec(scaleDownStabilizationSeconds=300), prefill=1, decode=2)
    w.load(8.0, short=8.0)
    high = w.step()  # t = 30: up
    assert high is not None and high.reason == "ScaleUp"
    grown = {p: w.replicas(p) for p in ("prefill", "decode")}
    w.pods(**grown)
    w.load(0.5)
    for _ in range(4):  # t = 60 .. 150: the load is gone, the window holds the pools
        out = w.step()
        assert out is not None and out.reason == "HoldStabilization"
    saved = w.status()["scalerState"]
    assert saved["policy"]["recommendations"]
    _restart()
    out = w.step()  # t = 180, after the restart: still inside the window begun at t = 30
    assert out is not None and out.reason == "HoldStabilization"
    assert {p: w.replicas(p) for p in grown} == grown
    assert loop.TRACKERS[(NS, NAME)].state.policy.first_seen == T0 + 30  # read back, not fresh
    for _ in range(5):  # t = 210 .. 330: the window still holds the recommendation of t = 30
        out = w.step()
        assert out is not None and out.reason == "HoldStabilization"
    out = w.step()  # t = 360: the window begun before the restart has passed (a fresh one would
    assert out is not None and out.reason == "ScaleDown"  # hold until t = 480)


def test_calibration_samples_survive_a_restart():
    w = World(prefill=1, decode=2)
    w.prom.scalars["itl_mean"] = 0.05
    for _ in range(6):
        w.load(2.0)
        w.prom.scalars["itl_mean"] = 0.05
        w.step()
    before = w.status()["calibration"]["decode"]["samples"]
    assert before == 6
    _restart()
    w.load(2.0)
    w.prom.scalars["itl_mean"] = 0.05
    w.step()
    assert w.status()["calibration"]["decode"]["samples"] == before + 1


def test_a_deleted_and_recreated_object_starts_fresh():
    w = World(prefill=1, decode=2)
    w.load(8.0, short=8.0)
    w.step()
    assert (NS, NAME) in loop.TRACKERS and (NS, NAME) in reconcile.DESIRED
    asyncio.run(reconcile.lock_for(NS, NAME).acquire())
    reconcile.lock_for(NS, NAME).release()
    w.kube.remove(api.KIND, NS, NAME)
    asyncio.run(loop.tick(w.kube, w.opts, w.now + 1))  # the loop sees it gone
    assert (NS, NAME) not in loop.TRACKERS
    assert (NS, NAME) not in reconcile.DESIRED
    assert (NS, NAME) not in reconcile._locks
    # recreated under the same name (a new uid, no status): nothing carries over
    w.kube.put(disagg_deployment(NAME, sample_spec(), NS))
    w.load(0.5)
    out = w.step()
    assert out is not None
    state = loop.TRACKERS[(NS, NAME)].state
    assert state.policy.first_seen == w.now  # a new stabilization window
    assert len(state.policy.recommendations) == 1


def test_a_recreated_object_is_told_apart_even_before_the_loop_prunes():
    w = World()
    w.step()
    old = loop.TRACKERS[(NS, NAME)]
    w.kube.remove(api.KIND, NS, NAME)
    w.kube.put(disagg_deployment(NAME, sample_spec(), NS))  # same name, new uid
    w.step()
    assert loop.TRACKERS[(NS, NAME)] is not old
    assert len(loop.TRACKERS[(NS, NAME)].state.policy.recommendations) == 1


def test_the_persisted_state_is_bounded():
    w = World(spec=sample_spec(scaleDownStabilizationSeconds=3600), prefill=2, decode=4)
    for i in range(40):
        for j in range(2):  # new pods keep arriving: start-up figures accumulate
            w.kube.put(pod(NAME, "decode", 100 + 2 * i + j, created=w.now - 90, admitted=w.now - 30))
        w.load(2.0 + (i % 7))
        w.prom.scalars["itl_mean"] = 0.04 + 0.001 * (i % 5)
        w.step()
    state = w.status()["scalerState"]
    assert len(state["startups"]) == autoscaler.MAX_STARTUP_SAMPLES
    assert len(state["calibration"]["decode"]) == 40
    assert autoscaler.ScalerState.from_dict(state).to_dict() == state
    # at the limits (a long stabilization window, full calibration), it stays small
    cap = autoscaler.MAX_CALIBRATION_SAMPLES
    full = autoscaler.ScalerState.from_dict(
        {
            **state,
            "calibration": {
                "decode": [[8.0, 45.5]] * (cap + 100),
                "prefill": [[6000.0, 230.5]] * (cap + 100),
            },
        }
    )
    assert len(full.decode_samples) == len(full.prefill_samples) == cap
    out = w.step()
    assert out is not None
    loop.TRACKERS[(NS, NAME)].state = full
    out = w.step()
    assert out is not None and len(out.state.decode_samples) == cap
    assert len(json.dumps(w.status()["scalerState"])) < 40_000


def test_damaged_state_starts_fresh():
    assert autoscaler.ScalerState.from_dict({"policy": "x", "calibration": 3, "startups": [1]}) == (
        autoscaler.ScalerState()
    )


def test_paused_autoscaling_holds_and_writes_a_typed_decision_record_once():
    spec = sample_spec(paused=True)
    w = World(spec=spec, prefill=1, decode=2)
    w.load(8.0, short=8.0)
    w.step()
    w.step()
    assert (w.replicas("prefill"), w.replicas("decode")) == (1, 2)
    rec = w.status()["lastDecision"]
    # the shape of every other decision record (status.lastDecision), without figures it did not read
    assert set(rec) == {"time", "reason", "inputs", "outputs"} and rec["reason"] == names.EVENT_PAUSED
    assert rec["outputs"]["targets"] == {} and rec["outputs"]["notes"] == [
        "autoscaling paused: holding every pool"
    ]
    assert "metricsOk" not in rec["inputs"]
    assert (
        rec
        == autoscaler.DecisionRecord.without_decision(
            w.now - 30.0, names.EVENT_PAUSED, rec["outputs"]["notes"][0]
        ).to_status()
    )
    assert [e["reason"] for e in w.kube.events].count(names.EVENT_PAUSED) == 1


# ---------------------------------------------------------------------------- steady state: few requests


def _status_writes(kube) -> int:
    return kube.calls[("patch", api.KIND)]


def test_a_steady_decision_sends_no_request_and_writes_nothing():
    """The object, its pools and pods come from the watch cache; a decision that changes
    nothing a user or a restart needs writes nothing (scalerState included)."""
    w = World(prefill=1, decode=2)
    w.load(2.0)
    for _ in range(3):  # the first decisions record the window's start and the recommendation
        w.step()
    saved = w.status()["scalerState"]
    before = len(loop.TRACKERS[(NS, NAME)].state.policy.recommendations)
    w.kube.calls.clear()
    for _ in range(4):
        out = w.step()
        assert out is not None and not out.changed
    assert dict(w.kube.calls) == {}, w.kube.calls  # no GET, no LIST, no write
    assert w.status()["scalerState"] == saved
    # the decisions went on in memory
    assert len(loop.TRACKERS[(NS, NAME)].state.policy.recommendations) == before + 4


def test_the_scaler_state_is_written_when_the_recommendation_changes_and_refreshed_at_most_every_interval(
    monkeypatch,
):
    monkeypatch.setattr(loop, "SCALER_STATE_REFRESH_S", 120.0)
    w = World(prefill=1, decode=2)
    w.load(2.0)
    for _ in range(3):
        w.step()
    w.kube.calls.clear()
    for _ in range(8):  # 240 s of the same load: two refreshes
        w.step()
    assert _status_writes(w.kube) == 2
    w.kube.calls.clear()
    w.load(8.0, short=8.0)
    out = w.step()  # a new recommendation (and targets)
    assert out is not None and out.changed
    rec = w.status()["scalerState"]["policy"]["recommendations"][-1]
    assert rec["t"] == w.now


def test_a_growing_decision_writes_the_status_once_with_its_pools_and_its_record():
    """The reconcile that grows the pools leaves its status to the decision, which writes it
    with its own record in one patch: one status write (and one fewer request waiting on the
    API server) per growing decision."""
    w = World(prefill=1, decode=2)
    w.load(2.0)
    for _ in range(3):
        w.step()
    w.kube.calls.clear()
    w.load(8.0, short=8.0)
    out = w.step()
    assert out is not None and out.grow, out
    assert _status_writes(w.kube) == 1, w.kube.calls
    st = w.status()
    assert st["lastDecision"]["outputs"]["targets"] == out.targets
    for pool, n in out.grow.items():
        assert w.replicas(pool) == n
        assert st["pools"][pool]["desiredReplicas"] == out.targets[pool]
    assert st["ratio"] == status.ratio(st["pools"])
    types = {c["type"] for c in st["conditions"]}
    # the reconcile's conditions and the decision's, side by side
    assert {names.COND_READY, names.COND_METRICS_AVAILABLE, names.COND_BUDGET_LIMITED} <= types


def test_a_growing_decision_gives_its_write_slot_back_before_its_report():
    """A step holds one of the loop's write slots while it carries out its decision (the pools'
    Deployments) and asks for one anew for its report (status, Event): after a load step, a step
    already waiting to grow its pools writes before this one's report."""
    w = World(prefill=1, decode=2)
    w.load(2.0)
    for _ in range(3):
        w.step()
    w.load(8.0, short=8.0)
    w.now += 30.0
    w.prom.now = w.now
    order: list[str] = []

    class Recording:
        def __init__(self, kube: object) -> None:
            self.kube = kube

        def __getattr__(self, name: str) -> object:
            attr = getattr(self.kube, name)
            if name not in loop.WriteGated.WRITES:
                return attr

            async def recorded(*args: object, **kwargs: object) -> object:
                first = args[0]
                order.append(f"{name} {first['kind'] if isinstance(first, dict) else first}")
                return await attr(*args, **kwargs)

            return recorded

    async def main() -> autoscaler.Outcome | None:
        slots = asyncio.Semaphore(1)
        await slots.acquire()  # another object's step holds the only slot
        kube = loop.WriteGated(Recording(loop.cached(w.kube, w.opts)), loop.WriteSlot(slots))
        stepping = asyncio.create_task(loop.step(kube, w.body(), w.opts, w.now))
        await asyncio.sleep(0.05)  # decided; waits for the slot at its first write

        async def other_step() -> None:  # queued behind it, to carry out its own decision
            async with slots:
                order.append("other step")

        other = asyncio.create_task(other_step())
        await asyncio.sleep(0.01)
        slots.release()
        await stepping
        kube.slot.release()  # what _step_in_task does when the step ends
        await other
        return loop.TRACKERS[(NS, NAME)].last_outcome

    out = asyncio.run(main())
    assert out is not None and out.grow, out
    grown = [i for i, o in enumerate(order) if o == "apply Deployment"]
    report = order.index(f"patch {api.KIND}")
    assert grown and max(grown) < order.index("other step") < report, order


def test_a_report_waits_for_its_slot_without_the_objects_lock():
    """While many objects start, a decision's report (status, Event) may wait long for a write
    slot: the object's reconciles must not wait behind it. The report is then made from the
    object as the reconcile left it: its conditions stay."""
    w = World()
    for _ in range(3):  # steady: the decisions hold
        w.step()
    w.prom.error = ConnectionError("prometheus down")  # the next decision reports
    w.now += 30.0
    w.prom.now = w.now
    ready = status.condition(
        names.COND_READY, True, "AllPoolsReady", "every pool has its desired replicas ready", 1
    )

    async def main() -> None:
        slots = asyncio.Semaphore(1)
        await slots.acquire()  # another object's step holds the only slot
        lock = reconcile.lock_for(NS, NAME)
        await lock.acquire()  # as _step_in_task holds it
        kube = loop.WriteGated(loop.cached(w.kube, w.opts), loop.WriteSlot(slots), lock)
        stepping = asyncio.create_task(loop.step(kube, w.body(), w.opts, w.now))
        await asyncio.sleep(0.05)  # decided; its report waits for the slot
        assert not lock.locked()
        async with lock:  # a reconcile runs meanwhile
            body = w.opts.cache.get(api.KIND, NS, NAME)
            conds = status.merge_conditions(body["status"]["conditions"], [ready])
            await reconcile.write_status(loop.cached(w.kube, w.opts), body, {"conditions": conds})
        slots.release()
        await stepping
        assert lock.locked()  # held again for the caller to release
        kube.slot.release()
        lock.release()

    asyncio.run(main())
    assert w.condition(names.COND_METRICS_AVAILABLE)["status"] == "False"
    assert w.condition(names.COND_READY)["status"] == "True"
    assert [e["reason"] for e in w.kube.events][-1] == "HoldStaleMetrics"


def test_a_growing_decision_posts_one_event_naming_its_pools_sent_with_its_status():
    """The pools' PoolUpdated Event is folded into the decision's own Event, which goes out
    beside the status patch (one round trip after the Deployment write, not three)."""
    w = World(prefill=1, decode=2)
    w.load(2.0)
    for _ in range(3):
        w.step()
    w.kube.events.clear()
    inflight, peak = 0, 0

    def overlapping(call):
        async def counted(*args, **kwargs):
            nonlocal inflight, peak
            inflight += 1
            peak = max(peak, inflight)
            try:
                await asyncio.sleep(0)  # the API server's round trip: other writes may start
                return await call(*args, **kwargs)
            finally:
                inflight -= 1

        return counted

    w.kube.patch = overlapping(w.kube.patch)
    w.kube.event = overlapping(w.kube.event)
    w.load(8.0, short=8.0)
    out = w.step()
    assert out is not None and out.grow, out
    assert len(w.kube.events) == 1, w.kube.events
    (ev,) = w.kube.events
    assert ev["reason"] == out.reason and ev["action"] == "Autoscale"
    for pool, n in out.grow.items():
        assert f"Deployment {NAME}-{pool} (replicas {n})" in ev["message"], ev["message"]
    assert names.EVENT_POOL_UPDATED not in w.kube.reasons()
    assert peak == 2, "the status patch and the Event were sent one after the other"


def test_a_failed_growth_still_tells_what_it_wrote():
    """A reconcile that fails part-way returns nothing to the decision: the pool Event for what
    it did write is posted by the reconcile itself."""
    w = World(prefill=1, decode=2)
    kube = w.kube
    body = w.body()
    refused = f"{NAME}-prefill"
    real_apply = kube.apply

    async def apply(obj, *args, **kwargs):
        if obj["metadata"]["name"] == refused:
            raise reconcile.ApiError(403, "forbidden by a webhook")
        return await real_apply(obj, *args, **kwargs)

    kube.apply = apply
    with pytest.raises(reconcile.ApiError):
        asyncio.run(reconcile.reconcile(kube, body, replicas={"prefill": 3, "decode": 5}, defer_status=True))
    updated = [e for e in kube.events if e["reason"] == names.EVENT_POOL_UPDATED]
    assert len(updated) == 1 and f"Deployment {NAME}-decode (replicas 5)" in updated[0]["message"], (
        kube.events
    )


def test_a_rate_moving_within_its_sampling_noise_writes_nothing():
    """A rate measured over a window moves by more than 10 % from one decision to the next
    under a steady Poisson load; with the reason, plan and targets unchanged that is noise, and
    no decision writes the status."""
    w = World(prefill=1, decode=2)
    w.load(2.0)
    for _ in range(3):
        w.step()
    first = w.status()["lastDecision"]
    window = w.body()["spec"]["autoscaling"].get("metricWindowSeconds", 60)
    w.kube.calls.clear()
    # +-15 % (0.6 requests/s apart) for 180 s, less than the scalerState refresh
    rates = [2.0 * (1.15 if i % 2 else 0.85) for i in range(6)]
    assert loop.RATE_NOISE_SIGMAS * (4.0 / window) ** 0.5 > 0.6  # within 3 sigma at this window
    for rate in rates:
        w.load(rate)
        out = w.step()
        assert out is not None and out.reason == first["reason"]
        assert out.targets == first["outputs"]["targets"]
    assert _status_writes(w.kube) == 0, w.kube.calls
    assert w.status()["lastDecision"]["time"] == first["time"]


@pytest.mark.parametrize(
    ("was", "now", "window_s", "dispersion", "moved"),
    [
        (2.0, 2.6, 60, None, False),  # +30 %, within 3 sigma of a 60 s window (0.8 requests/s)
        (2.0, 2.6, 600, None, True),  # the same move over a 10-minute window: beyond its noise
        (2.0, 4.0, 60, None, True),  # doubled
        (2.0, 4.0, 60, 9.0, False),  # bursty arrivals (index of dispersion 9): noise three times as wide
        (100.0, 105.0, 60, None, False),  # beyond 3 sigma (3.9) but within 10 %
        (100.0, 115.0, 60, None, True),
        (None, 2.0, 60, None, True),  # the metrics came back
        (2.0, None, 60, None, True),  # the metrics went
    ],
)
def test_the_rate_written_moves_beyond_ten_percent_and_its_sampling_noise(
    was, now, window_s, dispersion, moved
):
    assert loop.rate_moved(was, now, window_s, dispersion) is moved


def test_other_targets_rewrite_the_last_decision_at_once():
    w = World(prefill=1, decode=2)
    w.load(2.0)
    for _ in range(3):
        w.step(dt=10.0)
    w.load(8.0, short=8.0)
    out = w.step(dt=10.0)
    assert out is not None and out.changed
    assert w.status()["lastDecision"]["outputs"]["targets"] == out.targets


def test_an_outage_writes_the_condition_once_though_the_samples_age():
    """A stale sample is older at every decision; the condition shows the problem without
    its age, so a held outage writes the status once, not every decision."""
    w = World(prefill=1, decode=2)
    w.step()
    w.kube.calls.clear()
    for i in range(6):
        w.prom.sample_age_s = (3 + i) * SCRAPE  # the last scrape grows older
        out = w.step()
        assert out is not None and out.reason == "HoldStaleMetrics"
    assert _status_writes(w.kube) == 1, w.kube.calls
    cond = w.condition(names.COND_METRICS_AVAILABLE)
    assert cond["status"] == "False"
    assert "no sample in the last" in cond["message"] and "s old" not in cond["message"]
    # the decision record has the detail, as of the outage's first decision
    assert "s old (max" in w.status()["lastDecision"]["inputs"]["metricsProblem"]


def _steady_high_then_drop(restart_at: int | None) -> float:
    """Up at t = 30, the same load until t = 150 (steady decisions: no scalerState written),
    then the load is gone; a restart (no memory) before decision number `restart_at`. Returns
    the time of the scale-down."""
    _restart()
    w = World(spec=sample_spec(scaleDownStabilizationSeconds=300), prefill=1, decode=2)
    w.load(8.0, short=8.0)
    out = w.step()
    assert out is not None and out.reason == "ScaleUp"
    w.pods(**{p: w.replicas(p) for p in ("prefill", "decode")})
    for i in range(2, 60):
        if i == restart_at:
            _restart()
        w.load(8.0, short=8.0) if i <= 5 else w.load(0.5)
        saved = w.status()["scalerState"]
        out = w.step()
        assert out is not None
        if 3 <= i <= 5 and i != restart_at:
            assert out.reason == "Hold" and w.status()["scalerState"] == saved  # steady: unwritten
        if out.reason == "ScaleDown":
            return w.now - T0
    raise AssertionError("never scaled down")


def test_a_restart_after_unwritten_steady_decisions_does_not_scale_down_early():
    """The steady decisions of t = 90 .. 150 wrote no scalerState; a restart reads back the
    recommendation of t = 60 and extends it to the restart, so the stabilization window holds
    as long as without the restart (at most one interval longer), never shorter."""
    continuous = _steady_high_then_drop(None)
    for restart_at in (5, 6, 8):
        restarted = _steady_high_then_drop(restart_at)
        assert continuous <= restarted <= continuous + 30, (restart_at, continuous, restarted)


# ---------------------------------------------------------------------------- SloReachable


def _slo_spec(**slo: float) -> dict:
    spec = sample_spec()
    spec["slo"] = {**spec["slo"], **slo}
    return spec


def _warnings(w: World, reason: str) -> list[dict[str, str]]:
    return [e for e in w.kube.events if e["reason"] == reason and e["type"] == "Warning"]


def test_an_itl_target_below_one_decode_step_is_reported_once_and_names_the_field():
    w = World(spec=_slo_spec(itlSeconds=0.03))  # the sample's decode step is 45 ms at any batch
    w.step()
    cond = w.condition(names.COND_SLO_REACHABLE)
    assert cond["status"] == "False" and cond["reason"] == "ItlBelowOneStep"
    assert "spec.slo.itlSeconds 0.03 s" in cond["message"]
    [event] = _warnings(w, "ItlBelowOneStep")
    assert "0.045 s" in event["message"]  # the Event carries the step itself
    for _ in range(3):  # the first decisions record the window's start and the recommendation
        w.step()
    w.kube.calls.clear()
    for _ in range(3):
        w.step()
    assert len(_warnings(w, "ItlBelowOneStep")) == 1  # once per cause, not once per decision
    assert _status_writes(w.kube) == 0, w.kube.calls  # the condition's message does not move


def test_requests_out_of_reach_turn_the_condition_false_and_a_reachable_target_clears_it():
    # 6,000-token prompts: their prefill alone takes over 0.2 s on an idle worker
    w = World(spec=_slo_spec(ttftSeconds=0.15))
    w.step()
    cond = w.condition(names.COND_SLO_REACHABLE)
    assert cond["status"] == "False" and cond["reason"] == "RequestsOutOfReach"
    assert "spec.slo.ttftSeconds 0.15 s" in cond["message"]
    assert w.status()["lastDecision"]["outputs"]["outOfReachFraction"] == 1.0
    assert len(_warnings(w, "RequestsOutOfReach")) == 1
    body = w.body()
    body["spec"]["slo"]["ttftSeconds"] = 0.6
    body["metadata"]["generation"] = body["metadata"].get("generation", 1) + 1
    w.step()
    cond = w.condition(names.COND_SLO_REACHABLE)
    assert cond["status"] == "True" and cond["reason"] == "Reachable"
    assert w.status()["lastDecision"]["outputs"]["outOfReachFraction"] == 0.0
    assert len(_warnings(w, "RequestsOutOfReach")) == 1


def test_the_sample_at_its_own_slo_is_reachable_and_a_decision_without_metrics_keeps_the_condition():
    w = World()
    w.step()
    assert w.condition(names.COND_SLO_REACHABLE)["reason"] == "Reachable"
    w.prom.error = ConnectionError("prometheus down")
    w.step()
    assert w.status()["lastDecision"]["reason"] == "HoldStaleMetrics"
    assert w.condition(names.COND_SLO_REACHABLE)["reason"] == "Reachable"
    assert not [e for e in w.kube.events if e["type"] == "Warning" and "Reach" in e["reason"]]


@pytest.mark.parametrize(
    ("share", "was", "reachable"),
    [
        (0.0095, None, True),  # within the 1 % p99 lets miss
        (0.0120, None, False),
        (0.0090, "RequestsOutOfReach", False),  # above 80 % of the allowance: still out of reach
        (0.0070, "RequestsOutOfReach", True),  # clears below it
    ],
)
def test_the_out_of_reach_condition_clears_only_well_inside_the_allowance(share, was, reachable):
    spec = api.DisaggDeploymentSpec.model_validate(_slo_spec(percentile=0.99))
    config = autoscaler.config_from_spec(spec)
    plan = config.planning.plan(planner.Demand(arrival_rps=2.0, prompt_tokens_mean=6000.0))
    record = autoscaler.DecisionRecord.without_decision(T0, "Hold", "")
    record = dataclasses.replace(record, out_of_reach=share)
    got = autoscaler.slo_reach(config, record, plan, was)
    assert got is not None and got.reachable is reachable
    assert got.reason == ("Reachable" if reachable else "RequestsOutOfReach")
    assert autoscaler.slo_reach(config, record, None, was) is None
