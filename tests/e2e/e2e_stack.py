"""Helpers of the closed-loop tests: local cluster + `disagg run` + `disagg emulate` + a real Prometheus."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from disagg import api, planner
from disagg.devtools.prometheus import free_port

#: Drain deadline of the closed-loop deployments (then the pod is re-admitted).
DRAIN_TIMEOUT_S = 120


def deployment_spec(prom_url: str, **autoscaling: Any) -> dict:
    """A vLLM disaggregated deployment sized for the 4 x 8-GPU simulated cluster, with short loop times."""
    container = {"name": "vllm", "image": "example.invalid/vllm:emulated", "ports": [{"containerPort": 8000}]}
    pool = {
        "template": {"spec": {"containers": [container]}},
        "gpusPerReplica": 1,
        "drain": {"timeoutSeconds": DRAIN_TIMEOUT_S, "onTimeout": "readmit"},
    }
    a = {
        "enabled": True,
        "intervalSeconds": 5,
        "scrapeIntervalSeconds": 1,
        "metricWindowSeconds": 10,
        "scaleDownStabilizationSeconds": 10,
        "maxScaleUpStep": 8,
        "maxScaleDownStep": 8,
        "prometheus": {"url": prom_url},
    }
    a.update(autoscaling)
    return {
        "apiVersion": api.API_VERSION,
        "kind": api.KIND,
        "metadata": {"name": "llm"},
        "spec": {
            "engine": "vllm",
            "model": "emulated-70b",
            "placement": {"mode": "disaggregated"},
            "pools": {
                "prefill": {**pool, "replicas": 1, "minReplicas": 1, "maxReplicas": 8},
                "decode": {**pool, "replicas": 1, "minReplicas": 1, "maxReplicas": 16},
            },
            "slo": {"ttftSeconds": 0.6, "itlSeconds": 0.15, "percentile": 0.9},
            "autoscaling": a,
        },
    }


def planned(spec: dict, rate: float, prompt: int, output: int) -> dict[str, int]:
    """What the planner says for this load: the sizes the closed loop should reach."""
    s = api.parse_spec(spec["spec"])
    return (
        api.planner_inputs(s)
        .plan(planner.Demand(arrival_rps=rate, prompt_tokens_mean=prompt, output_tokens_mean=output))
        .replicas
    )


class Stack:
    def __init__(self, cluster, namespace: str, tmp: Path, prometheus_factory, operator_factory) -> None:
        self.cluster = cluster
        self.ns = namespace
        self.tmp = tmp
        self.emu_port = free_port()
        #: What the test's Prometheus scrapes (job -> addresses): the emulated fleet's one port.
        self.scrape_targets: dict[str, list[str]] = {"emulator": [f"127.0.0.1:{self.emu_port}"]}
        self.prom = prometheus_factory(self.scrape_targets, scrape_interval="1s")
        self.operator_factory = operator_factory
        self.operator = None
        self.emulator: subprocess.Popen | None = None
        self.summary = tmp / "emulator-summary.json"
        self.name = "llm"

    def apply(self, obj: dict) -> None:
        self.name = obj["metadata"]["name"]
        self.cluster.kubectl(
            "apply",
            "--server-side",
            "--field-manager=test-user",
            "-n",
            self.ns,
            "-f",
            "-",
            input=json.dumps(obj),
        )

    def start_operator(self):
        # The spec names this Prometheus itself (deployment_spec): the operator must allow it.
        self.operator = self.operator_factory([self.ns], ["--allow-prometheus-url", self.prom.url])
        return self.operator

    def start_emulator(self, *args: str) -> subprocess.Popen:
        cmd = [
            sys.executable,
            "-m",
            "disagg.cli",
            "emulate",
            "--kubeconfig",
            self.cluster.kubeconfig,
            "--namespace",
            self.ns,
            "--metrics-port",
            str(self.emu_port),
            "--summary-json",
            str(self.summary),
            *args,
        ]
        log = open(self.tmp / "emulator.log", "ab")  # noqa: SIM115
        self.emulator = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=self.cluster.env())
        log.close()
        return self.emulator

    def wait_emulator(self, timeout: float) -> dict:
        assert self.emulator is not None
        self.emulator.wait(timeout)
        assert self.summary.exists(), (self.tmp / "emulator.log").read_text()[-3000:]
        return json.loads(self.summary.read_text())

    def dd(self) -> dict:
        return self.cluster.get_json("disaggdeployment", self.name, "-n", self.ns)

    def condition(self, ctype: str) -> dict | None:
        for c in (self.dd().get("status") or {}).get("conditions", []):
            if c["type"] == ctype:
                return c
        return None

    def deployments(self) -> dict[str, dict]:
        items = self.cluster.get_json(
            "deployments", "-n", self.ns, "-l", f"disagg.dev/deployment={self.name}"
        )
        return {d["metadata"]["labels"]["disagg.dev/pool"]: d for d in items["items"]}

    def replicas(self) -> dict[str, int]:
        return {k: d["spec"]["replicas"] for k, d in self.deployments().items()}

    def pods(self, pool: str | None = None) -> list[dict]:
        sel = f"disagg.dev/deployment={self.name}" + (f",disagg.dev/pool={pool}" if pool else "")
        return self.cluster.get_json("pods", "-n", self.ns, "-l", sel)["items"]

    def gpus_in_use(self) -> int:
        total = 0
        for p in self.pods():
            if p["metadata"].get("deletionTimestamp"):
                continue
            for c in p["spec"]["containers"]:
                total += int((c.get("resources", {}).get("requests") or {}).get("nvidia.com/gpu", 0))
        return total

    def events(self) -> list[dict]:
        items = self.cluster.get_json(
            "events", "-n", self.ns, "--field-selector", f"involvedObject.name={self.name}"
        )["items"]
        return sorted(items, key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or "")

    def wait_routable(self, timeout: float = 60) -> None:
        def ok():
            pods = self.pods()
            return pods and all(
                any(
                    c["type"] == "disagg.dev/routable" and c["status"] == "True"
                    for c in p.get("status", {}).get("conditions", [])
                )
                for p in pods
            )

        self.cluster.wait_for(ok, timeout=timeout, what="all pods routable")

    def wait_settled(self, timeout: float) -> None:
        """Every pod that is not being deleted is routable and carries no drain record: each drain
        either removed its pod or, cancelled, left it routable again (never unroutable for good)."""

        def settled():
            for p in self.pods():
                if p["metadata"].get("deletionTimestamp"):
                    continue
                conds = {c["type"]: c["status"] for c in p.get("status", {}).get("conditions", [])}
                annotated = "disagg.dev/drain" in (p["metadata"].get("annotations") or {})
                if annotated or conds.get("disagg.dev/routable") != "True":
                    return False
            return True

        self.cluster.wait_for(settled, timeout=timeout, interval=1, what=f"pods settled\n{self.debug()}")

    def release(self) -> None:
        """After a test: stop the emulator, delete the DisaggDeployments and wait (at most a
        minute) until their pods are gone, freeing the simulated GPUs for the next test."""
        if self.emulator and self.emulator.poll() is None:
            self.emulator.terminate()
            try:
                self.emulator.wait(10)
            except subprocess.TimeoutExpired:
                self.emulator.kill()
        self.cluster.kubectl(
            "delete", "disaggdeployment", "--all", "-n", self.ns, "--wait=false", check=False
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and self.pods():
            time.sleep(0.5)

    def debug(self) -> str:
        out = [json.dumps(self.dd().get("status"), indent=1)[:4000]]
        if self.operator:
            out.append(self.operator.log()[-4000:])
        log = self.tmp / "emulator.log"
        if log.exists():
            out.append(log.read_text()[-2000:])
        return "\n----\n".join(out)
