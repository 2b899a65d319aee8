"""Reconciliation against the real API server, with the operator running as a process."""

from __future__ import annotations

import json
import time

import pytest
from samples import SAMPLES, fixed, load

pytestmark = pytest.mark.cluster

VALID = sorted(p.name for p in SAMPLES.glob("*.yaml"))


def apply(cluster, ns: str, obj: dict) -> None:
    cluster.kubectl(
        "apply", "--server-side", "--field-manager=test-user", "-n", ns, "-f", "-", input=json.dumps(obj)
    )


def dd(cluster, ns: str, name: str) -> dict:
    return cluster.get_json("disaggdeployment", name, "-n", ns)


def cond(obj: dict, ctype: str) -> str | None:
    for c in (obj.get("status") or {}).get("conditions", []):
        if c["type"] == ctype:
            return c["status"]
    return None


def children(cluster, ns: str, name: str, kind: str) -> list[dict]:
    return cluster.get_json(kind, "-n", ns, "-l", f"disagg.dev/deployment={name}")["items"]


def wait_ready(cluster, ns: str, name: str, timeout: float = 90) -> dict:
    def ready():
        obj = dd(cluster, ns, name)
        return (
            cond(obj, "Ready") == "True"
            and obj["status"].get("observedGeneration") == obj["metadata"]["generation"]
            and obj
        )

    return cluster.wait_for(ready, timeout=timeout, what=f"{ns}/{name} Ready")


def delete_and_wait(cluster, ns: str, name: str) -> None:
    cluster.kubectl("delete", "disaggdeployment", name, "-n", ns, "--wait=false")
    cluster.wait_for(lambda: not children(cluster, ns, name, "pods"), timeout=90, what="pods gone")


def pools_of(obj: dict) -> dict:
    return {k: v for k, v in obj["spec"]["pools"].items() if v}


@pytest.mark.parametrize("sample", VALID)
def test_sample_creates_pools_with_gpu_requests_running_on_gpu_nodes(
    cluster, namespace, operator_factory, sample
):
    obj = load(sample)
    obj["spec"].setdefault("autoscaling", {})["enabled"] = False
    name = obj["metadata"]["name"]
    operator_factory([namespace])
    apply(cluster, namespace, obj)
    status = wait_ready(cluster, namespace, name)["status"]
    deployments = {
        d["metadata"]["labels"]["disagg.dev/pool"]: d
        for d in children(cluster, namespace, name, "deployments")
    }
    assert set(deployments) == set(pools_of(obj))
    for pool, spec in pools_of(obj).items():
        d = deployments[pool]
        want = spec.get("replicas", spec.get("minReplicas", 1))
        assert d["spec"]["replicas"] == want
        gpus = str(spec.get("gpusPerReplica", 1))
        container = d["spec"]["template"]["spec"]["containers"][0]
        assert container["resources"]["requests"]["nvidia.com/gpu"] == gpus
        assert d["metadata"]["ownerReferences"][0]["name"] == name
        assert status["pools"][pool]["readyReplicas"] == want
    pods = children(cluster, namespace, name, "pods")
    assert pods and all(p["status"]["phase"] == "Running" for p in pods)
    for p in pods:
        node = cluster.get_json("node", p["spec"]["nodeName"])
        assert node["metadata"]["labels"]["nvidia.com/gpu.present"] == "true"
    services = children(cluster, namespace, name, "services")
    pdbs = children(cluster, namespace, name, "poddisruptionbudgets")
    assert len(services) == len(pdbs) == len(deployments)
    delete_and_wait(cluster, namespace, name)


def test_printer_columns_and_events_tell_the_state(cluster, namespace, operator_factory):
    obj = fixed("sglang-disaggregated.yaml")
    name = obj["metadata"]["name"]
    operator_factory([namespace])
    apply(cluster, namespace, obj)
    wait_ready(cluster, namespace, name)
    out = cluster.kubectl("get", "disaggdeployments", "-n", namespace).stdout.splitlines()
    header, row = out[0].split(), out[1].split()
    assert header[:6] == ["NAME", "PREFILL", "DECODE", "ENCODER", "RATIO", "READY"]
    p, d = obj["spec"]["pools"]["prefill"]["replicas"], obj["spec"]["pools"]["decode"]["replicas"]
    assert row[0] == name and row[1] == str(p) and row[2] == str(d)
    assert row[3].startswith("1:")  # encoder column empty: RATIO shifts left
    assert row[4] == "True"
    events = cluster.get_json("events", "-n", namespace, "--field-selector", f"involvedObject.name={name}")[
        "items"
    ]
    reasons = {e["reason"] for e in events}
    assert "PoolCreated" in reasons
    describe = cluster.kubectl("describe", "disaggdeployment", name, "-n", namespace).stdout
    assert "AllPoolsReady" in describe and "PoolCreated" in describe


def test_template_edit_rolls_only_that_pool(cluster, namespace, operator_factory):
    obj = fixed("sglang-disaggregated.yaml")
    name = obj["metadata"]["name"]
    operator_factory([namespace])
    apply(cluster, namespace, obj)
    wait_ready(cluster, namespace, name)
    rs_before = {r["metadata"]["name"] for r in children(cluster, namespace, name, "replicasets")}
    decode_rv = next(
        d
        for d in children(cluster, namespace, name, "deployments")
        if d["metadata"]["labels"]["disagg.dev/pool"] == "decode"
    )["metadata"]["resourceVersion"]
    container = obj["spec"]["pools"]["prefill"]["template"]["spec"]["containers"][0]
    container.setdefault("env", []).append({"name": "ROLLOUT_MARK", "value": "2"})
    apply(cluster, namespace, obj)

    def rolled():
        rs = children(cluster, namespace, name, "replicasets")
        new = [r for r in rs if r["metadata"]["name"] not in rs_before]
        return new and all(r["metadata"]["labels"]["disagg.dev/pool"] == "prefill" for r in new) and new

    new = cluster.wait_for(rolled, timeout=60, what="a new prefill ReplicaSet")
    env = new[0]["spec"]["template"]["spec"]["containers"][0]["env"]
    assert {"name": "ROLLOUT_MARK", "value": "2"} in env
    wait_ready(cluster, namespace, name)
    decode = next(
        d
        for d in children(cluster, namespace, name, "deployments")
        if d["metadata"]["labels"]["disagg.dev/pool"] == "decode"
    )
    assert decode["metadata"]["resourceVersion"] == decode_rv, "the decode pool was touched"


def test_replicas_follow_spec_when_autoscaling_is_off(cluster, namespace, operator_factory):
    obj = fixed("sglang-disaggregated.yaml")
    name = obj["metadata"]["name"]
    operator_factory([namespace])
    apply(cluster, namespace, obj)
    wait_ready(cluster, namespace, name)
    obj["spec"]["pools"]["decode"]["replicas"] = obj["spec"]["pools"]["decode"]["replicas"] + 1
    apply(cluster, namespace, obj)
    want = obj["spec"]["pools"]["decode"]["replicas"]
    cluster.wait_for(
        lambda: (
            dd(cluster, namespace, name)
            .get("status", {})
            .get("pools", {})
            .get("decode", {})
            .get("readyReplicas")
            == want
        ),
        timeout=60,
        what="decode pool at the new size",
    )


def test_removed_pool_is_deleted_and_deleting_the_object_collects_everything(
    cluster, namespace, operator_factory
):
    obj = fixed("multimodal-epd.yaml")
    name = obj["metadata"]["name"]
    operator_factory([namespace])
    apply(cluster, namespace, obj)
    wait_ready(cluster, namespace, name)
    assert any(
        d["metadata"]["labels"]["disagg.dev/pool"] == "encoder"
        for d in children(cluster, namespace, name, "deployments")
    )
    del obj["spec"]["pools"]["encoder"]
    apply(cluster, namespace, obj)
    for kind in ("deployments", "services", "poddisruptionbudgets"):
        cluster.wait_for(
            lambda kind=kind: (
                not [
                    o
                    for o in children(cluster, namespace, name, kind)
                    if o["metadata"]["labels"]["disagg.dev/pool"] == "encoder"
                ]
            ),
            timeout=60,
            what=f"encoder {kind} deleted",
        )
    status = wait_ready(cluster, namespace, name)["status"]
    assert "encoder" not in status["pools"]

    cluster.kubectl("delete", "disaggdeployment", name, "-n", namespace, "--wait=false")
    for kind in ("deployments", "replicasets", "services", "poddisruptionbudgets", "pods"):
        cluster.wait_for(
            lambda kind=kind: not children(cluster, namespace, name, kind),
            timeout=90,
            what=f"{kind} garbage-collected",
        )


def snapshot_versions(cluster, ns: str, name: str) -> dict[str, str]:
    out = {"dd": dd(cluster, ns, name)["metadata"]["resourceVersion"]}
    for kind in ("deployments", "services", "poddisruptionbudgets", "pods"):
        for o in children(cluster, ns, name, kind):
            out[f"{kind}/{o['metadata']['name']}"] = o["metadata"]["resourceVersion"]
    return out


def test_restarting_the_operator_writes_nothing_and_duplicates_nothing(cluster, namespace, operator_factory):
    obj = fixed("sglang-disaggregated.yaml")
    name = obj["metadata"]["name"]
    op = operator_factory([namespace])
    apply(cluster, namespace, obj)
    wait_ready(cluster, namespace, name)
    time.sleep(3)  # let the last status write settle
    before = snapshot_versions(cluster, namespace, name)
    op.stop()
    op.start()
    time.sleep(8)  # the restarted operator lists and reconciles everything
    after = snapshot_versions(cluster, namespace, name)
    assert after == before, "a restart changed objects: " + ", ".join(
        k for k in set(before) | set(after) if before.get(k) != after.get(k)
    )
    assert "Traceback" not in op.log()


def test_two_namespaces_do_not_touch_each_others_children(cluster, operator_factory, request):
    import uuid

    nss = [f"t-iso-{uuid.uuid4().hex[:5]}" for _ in range(2)]
    for ns in nss:
        cluster.kubectl("create", "namespace", ns)
    request.addfinalizer(
        lambda: [cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False) for ns in nss]
    )
    obj = fixed("sglang-disaggregated.yaml")
    name = obj["metadata"]["name"]
    operator_factory(nss)
    for ns in nss:
        cluster.wait_for(
            lambda ns=ns: cluster.kubectl("get", "sa", "default", "-n", ns, check=False).returncode == 0
        )
        apply(cluster, ns, obj)
    for ns in nss:
        wait_ready(cluster, ns, name)
    uids = {ns: dd(cluster, ns, name)["metadata"]["uid"] for ns in nss}
    for ns in nss:
        for kind in ("deployments", "services", "poddisruptionbudgets"):
            for o in children(cluster, ns, name, kind):
                assert o["metadata"]["ownerReferences"][0]["uid"] == uids[ns]
    # Scaling one leaves the other alone.
    before = snapshot_versions(cluster, nss[1], name)
    obj["spec"]["pools"]["decode"]["replicas"] += 1
    apply(cluster, nss[0], obj)
    cluster.wait_for(
        lambda: (
            dd(cluster, nss[0], name)["status"]["pools"]["decode"]["readyReplicas"]
            == obj["spec"]["pools"]["decode"]["replicas"]
        ),
        timeout=60,
        what="scaled in ns 0",
    )
    after = snapshot_versions(cluster, nss[1], name)
    assert after == before
