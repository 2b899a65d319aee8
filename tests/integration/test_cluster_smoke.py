"""Smoke tests: the local control plane is real, the GPU nodes are simulated by KWOK."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.cluster


def deployment(name: str, gpus: int, replicas: int = 1, readiness_gate: str | None = None) -> str:
    gates = f"      readinessGates:\n      - conditionType: {readiness_gate}\n" if readiness_gate else ""
    return f"""
apiVersion: apps/v1
kind: Deployment
metadata:
  name: {name}
spec:
  replicas: {replicas}
  selector:
    matchLabels: {{app: {name}}}
  template:
    metadata:
      labels: {{app: {name}}}
    spec:
{gates}      containers:
      - name: engine
        image: example.invalid/engine:emulated
        resources:
          requests: {{nvidia.com/gpu: "{gpus}"}}
          limits: {{nvidia.com/gpu: "{gpus}"}}
"""


def pods(cluster, ns: str, app: str) -> list[dict]:
    return cluster.get_json("pods", "-n", ns, "-l", f"app={app}")["items"]


def condition(pod: dict, ctype: str) -> dict | None:
    for c in pod.get("status", {}).get("conditions", []):
        if c["type"] == ctype:
            return c
    return None


def test_gpu_nodes_have_eight_allocatable_gpus(cluster):
    nodes = [
        n
        for n in cluster.get_json("nodes", "-l", "disagg.dev/simulated=true")["items"]
        if n["metadata"]["name"].startswith("gpu-node-")
    ]  # hack/cluster.sh's nodes (benchmarks add others)
    assert len(nodes) >= 4
    for n in nodes:
        assert n["status"]["allocatable"]["nvidia.com/gpu"] == "8"
        assert condition(n, "Ready")["status"] == "True"


def test_eight_gpu_pod_is_scheduled_and_running(cluster, namespace):
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=deployment("full-node", gpus=8))

    def running():
        items = pods(cluster, namespace, "full-node")
        return items and items[0]["status"].get("phase") == "Running" and items[0]

    pod = cluster.wait_for(running, timeout=60, what="8-GPU pod Running")
    node = cluster.get_json("node", pod["spec"]["nodeName"])
    assert node["metadata"]["labels"]["nvidia.com/gpu.present"] == "true"
    assert pod["spec"]["containers"][0]["resources"]["requests"]["nvidia.com/gpu"] == "8"
    assert condition(pod, "Ready")["status"] == "True"


def test_pod_larger_than_any_node_stays_pending_unschedulable(cluster, namespace):
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=deployment("too-big", gpus=9))

    def unschedulable():
        items = pods(cluster, namespace, "too-big")
        if not items:
            return None
        cond = condition(items[0], "PodScheduled")
        return cond and cond["status"] == "False" and cond.get("reason") == "Unschedulable" and items[0]

    pod = cluster.wait_for(unschedulable, timeout=60, what="Unschedulable condition")
    assert pod["status"]["phase"] == "Pending"
    assert "nvidia.com/gpu" in condition(pod, "PodScheduled")["message"]


def test_deleting_a_deployment_garbage_collects_replicaset_and_pods(cluster, namespace):
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=deployment("gc", gpus=1, replicas=2))
    cluster.wait_for(
        lambda: (
            len([p for p in pods(cluster, namespace, "gc") if p["status"].get("phase") == "Running"]) == 2
        ),
        what="2 pods Running",
    )
    assert cluster.get_json("replicasets", "-n", namespace, "-l", "app=gc")["items"]
    cluster.kubectl("delete", "deployment", "gc", "-n", namespace, "--wait=false")
    cluster.wait_for(
        lambda: (
            not cluster.get_json("replicasets", "-n", namespace, "-l", "app=gc")["items"]
            and not pods(cluster, namespace, "gc")
        ),
        timeout=60,
        what="ReplicaSet and pods garbage-collected",
    )


def test_readiness_gate_is_owned_by_its_controller_not_by_kwok(cluster, namespace):
    """KWOK must not set our readiness gate; Ready follows the gate both ways."""
    gate = "disagg.dev/routable"
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=deployment("gated", 1, readiness_gate=gate))
    pod = cluster.wait_for(
        lambda: (
            (p := pods(cluster, namespace, "gated")) and p[0]["status"].get("phase") == "Running" and p[0]
        ),
        what="gated pod Running",
    )
    name = pod["metadata"]["name"]
    assert condition(pod, gate) is None, "the simulated kubelet wrote a readiness gate it does not own"
    assert condition(pod, "Ready")["status"] == "False"

    def set_gate(status: str) -> None:
        patch = {"status": {"conditions": [{"type": gate, "status": status, "reason": "Test"}]}}
        cluster.kubectl(
            "patch",
            "pod",
            name,
            "-n",
            namespace,
            "--subresource=status",
            "--type=strategic",
            "-p",
            json.dumps(patch),
        )

    def ready_is(value: str):
        return lambda: condition(cluster.get_json("pod", name, "-n", namespace), "Ready")["status"] == value

    set_gate("True")
    cluster.wait_for(ready_is("True"), timeout=30, what="Ready=True after gate True")
    set_gate("False")
    cluster.wait_for(ready_is("False"), timeout=30, what="Ready=False after gate False")
    assert condition(cluster.get_json("pod", name, "-n", namespace), gate)["status"] == "False"


CRD = """
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.smoke.disagg.dev
spec:
  group: smoke.disagg.dev
  scope: Namespaced
  names: {plural: widgets, singular: widget, kind: Widget}
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            properties:
              min: {type: integer}
              max: {type: integer}
            x-kubernetes-validations:
            - rule: "self.min <= self.max"
              message: "spec.min must not exceed spec.max"
"""


def test_crd_cel_rule_rejects_invalid_object_with_its_message(cluster, namespace):
    cluster.kubectl("apply", "--server-side", "-f", "-", input=CRD)
    cluster.wait_established("widgets.smoke.disagg.dev", timeout=30)
    ok = "apiVersion: smoke.disagg.dev/v1\nkind: Widget\nmetadata: {name: ok}\nspec: {min: 1, max: 2}\n"
    bad = "apiVersion: smoke.disagg.dev/v1\nkind: Widget\nmetadata: {name: bad}\nspec: {min: 3, max: 2}\n"
    cluster.kubectl("apply", "--server-side", "-n", namespace, "-f", "-", input=ok)
    proc = cluster.kubectl("apply", "--server-side", "-n", namespace, "-f", "-", input=bad, check=False)
    assert proc.returncode != 0
    assert "spec.min must not exceed spec.max" in proc.stderr
