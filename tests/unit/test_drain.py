"""Drain logic (pure): victim choice, per-pod actions, and when removal is safe."""

from __future__ import annotations

from disagg.drain import ROUTING_SETTLE_S, DrainRecord, choose_victims, next_action, pending_companions
from disagg.status import ANNOTATION_DRAIN


def pod(name, phase="Running", ready=True, routable=True, draining=None, created="2026-01-01T00:00:00Z"):
    conds = [{"type": "Ready", "status": "True" if ready else "False"}]
    if routable is not None:
        conds.append({"type": "disagg.dev/routable", "status": "True" if routable else "False"})
    ann = {ANNOTATION_DRAIN: draining.to_annotation()} if draining else {}
    return {
        "metadata": {"name": name, "annotations": ann, "creationTimestamp": created},
        "status": {"phase": phase, "conditions": conds},
    }


def test_victims_are_idle_pods_first_then_least_in_flight():
    pods = [
        pod("busy"),
        pod("light"),
        pod("pending", phase="Pending", ready=False, routable=None),
        pod("unknown"),
    ]
    in_flight = {"busy": 9, "light": 1}
    assert choose_victims(pods, in_flight, 1) == ["pending"]
    assert choose_victims(pods, in_flight, 2) == ["pending", "light"]
    # A pod without a fresh in-flight figure is never taken before one known to be lighter.
    assert choose_victims(pods, in_flight, 3) == ["pending", "light", "busy"]


def test_already_draining_or_deleting_pods_are_not_chosen_again():
    rec = DrainRecord(0, 100, "readmit")
    gone = pod("gone")
    gone["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:01Z"
    pods = [pod("a", draining=rec), gone, pod("b")]
    assert choose_victims(pods, {"a": 0, "b": 5}, 2) == ["b"]


def test_ties_go_to_the_youngest_pod():
    pods = [pod("old", created="2026-01-01T00:00:00Z"), pod("young", created="2026-01-02T00:00:00Z")]
    assert choose_victims(pods, {"old": 0, "young": 0}, 1) == ["young"]


def test_record_round_trips_and_a_damaged_record_readmits():
    rec = DrainRecord(10.0, 70.0, "proceed", removing=None, idle=True)
    assert DrainRecord.from_pod(pod("p", draining=rec)) == rec
    broken = pod("p")
    broken["metadata"]["annotations"][ANNOTATION_DRAIN] = "{not json"
    assert DrainRecord.from_pod(broken).on_timeout == "readmit"
    assert DrainRecord.from_pod(pod("q")) is None


def test_actions_wait_for_zero_work_and_never_read_missing_as_zero():
    rec = DrainRecord(0.0, 100.0, "readmit")
    p = pod("p", routable=False, draining=rec)
    assert next_action(p, rec, 3, now=10, sampled_at=10).action == "wait"
    assert next_action(p, rec, None, now=10, sampled_at=None).action == "wait"  # unknown is not zero
    assert next_action(p, rec, 0, now=10, sampled_at=10).action == "remove"


def test_zero_work_counts_only_from_a_sample_taken_after_routing_settled():
    """A pod's count of zero from a sample taken while routers could still send it work (before
    the drain began, or within ROUTING_SETTLE_S of it) misses the requests sent since: removing
    the pod on it would lose them."""
    since = 1000.0
    rec = DrainRecord(since, since + 300, "proceed")
    p = pod("p", routable=False, draining=rec)
    before = next_action(p, rec, 0, now=since + 1, sampled_at=since - 3)  # scraped before the drain
    assert before.action == "wait" and "before routing settled" in before.detail
    early = next_action(p, rec, 0, now=since + 6, sampled_at=since + ROUTING_SETTLE_S - 0.5)
    assert early.action == "wait"
    assert next_action(p, rec, 0, now=since + 6, sampled_at=since + ROUTING_SETTLE_S).action == "remove"
    # a count without a sample time is not known to be late enough
    assert next_action(p, rec, 0, now=since + 60, sampled_at=None).action == "wait"
    # at the deadline the policy decides, as for any other count
    late = next_action(p, rec, 0, now=since + 300, sampled_at=since - 3)
    assert late.action == "timeout_proceed"
    readmit = DrainRecord(since, since + 300, "readmit")
    assert next_action(p, readmit, 0, now=since + 300, sampled_at=since - 3).action == "readmit"


def test_timeouts_follow_the_policy():
    p = pod("p", routable=False)
    assert next_action(p, DrainRecord(0, 100, "readmit"), 2, now=101, sampled_at=101).action == "readmit"
    assert (
        next_action(p, DrainRecord(0, 100, "proceed"), 2, now=101, sampled_at=101).action == "timeout_proceed"
    )
    # unknown work (no fresh metrics) is never removed: held; re-admitting is always safe
    held = next_action(p, DrainRecord(0, 100, "proceed"), None, now=101, sampled_at=None)
    assert held.action == "hold" and "unknown" in held.detail
    assert next_action(p, DrainRecord(0, 100, "readmit"), None, now=101, sampled_at=None).action == "readmit"


def test_idle_or_pending_victims_are_removed_at_once_and_removing_is_verified():
    assert (
        next_action(pod("p"), DrainRecord(0, 100, "readmit", idle=True), None, now=1, sampled_at=None).action
        == "remove"
    )
    pending = pod("p", phase="Pending", ready=False, routable=None)
    assert (
        next_action(pending, DrainRecord(0, 100, "readmit"), None, now=1, sampled_at=None).action == "remove"
    )
    assert (
        next_action(pod("p"), DrainRecord(0, 100, "readmit", removing=5), 0, now=6, sampled_at=6).action
        == "verify"
    )


def test_pending_pods_are_removed_along_with_the_victims():
    victims = {"v"}
    pool = [pod("v", ready=False, routable=False), pod("a"), pod("starting", ready=False, routable=None)]
    assert pending_companions(pool, victims) == []  # a running victim goes before running pods
    pool.append(pod("pending", phase="Pending", ready=False, routable=None))
    assert pending_companions(pool, victims) == ["pending"]
