#!/usr/bin/env python3
"""Autoscaler benchmark against the local cluster: decision latency, and operator CPU/RSS at scale.

Prints figures (medians), no pass/fail:

  1. Decision latency of the closed loop (`disagg run` + `disagg emulate` + a real Prometheus),
     for a load step 1 -> 8 req/s (6000 prompt / 400 output tokens) at t=30 s of the emulator's
     schedule, on a DisaggDeployment like tests/e2e/e2e_stack.py's (vLLM, prefill + decode of
     1 GPU each, autoscaling every 5 s, 1 s scrapes, 10 s metric window):
       (a) step -> Prometheus shows the new rate: sum(rate(vllm:request_prompt_tokens_count[10s])) > 4
       (b) step -> spec.replicas of the Deployment llm-prefill / llm-decode changes
     and the split: metric propagation (a) vs operator decision (b - a). The decision interval
     is 5 s, so (b - a) is bounded by about one interval plus one tick. --runs fresh namespaces.
  2. Operator CPU (CPU s per wall s, from /proc/PID/stat utime+stime over --seconds) and RSS
     (VmRSS) with --objects small DisaggDeployments (1 GPU prefill, 1 GPU decode, autoscaling
     every 10 s on the same Prometheus) under emulated load (one `disagg emulate` for the
     namespace, --rate req/s spread round robin over the deployments).

The shared cluster is not restarted: the bench adds its own tainted simulated GPU nodes
(bench-gpu-node-N, label disagg.dev/simulated=true), pins its pods to them with a nodeSelector
and a toleration, and deletes them at the end with its namespaces and processes.

    python hack/bench/bench_autoscaler.py [--runs 3] [--objects 50] [--seconds 60] [--rate 25]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
import uuid
from pathlib import Path

from benchlib import (
    ROOT,
    disagg_deployment,
    free_port,
    kubeconfig,
    kubectl,
    operator_cmd,
    rss_mib,
    stop,
    tools_bin,
)

BENCH_LABEL = "disagg.dev/bench-node"
TAINT_KEY = "disagg.dev/bench"
STEP_AT = 30.0
PROMPT, OUTPUT = 6000, 400
PROM_QUERY = "sum(rate(vllm:request_prompt_tokens_count[10s]))"
PROM_THRESHOLD = 4.0
FIRST_RISE = 1.5  # Prometheus' first visible rise above the pre-step 1 req/s


# --------------------------------------------------------------------------- helpers


class Kubectl:
    def __init__(self, kc: str) -> None:
        self.kc = kc

    def __call__(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 120
    ) -> subprocess.CompletedProcess:
        return kubectl(self.kc, *args, input=input, check=check, timeout=timeout)

    def json(self, *args: str) -> dict:
        return json.loads(self("get", "-o", "json", *args).stdout)


def wait_for(pred, timeout: float, what: str, interval: float = 0.5):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout:g} s waiting for {what}")


def wait_port(port: float, timeout: float = 30) -> float:
    """monotonic time at which 127.0.0.1:port first accepts a connection."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return time.monotonic()
        except OSError:
            time.sleep(0.02)
    raise TimeoutError(f"port {port} did not open within {timeout} s")


def med(xs: list[float]) -> float | None:
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def fmt(x: float | None, unit: str = "s") -> str:
    return "n/a" if x is None else f"{x:.2f} {unit}"


# --------------------------------------------------------------------------- cluster objects


def bench_nodes(n: int, gpus: int) -> list[dict]:
    """Simulated GPU nodes shaped like hack/cluster.sh's, tainted so only the bench's pods land there."""
    out = []
    for i in range(n):
        name = f"bench-gpu-node-{i}"
        res = {"cpu": "96", "memory": "1Ti", "pods": "110", "nvidia.com/gpu": str(gpus)}
        out.append(
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": name,
                    "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
                    "labels": {
                        "kubernetes.io/hostname": name,
                        "kubernetes.io/os": "linux",
                        "kubernetes.io/arch": "amd64",
                        "kubernetes.io/role": "agent",
                        "type": "kwok",
                        "nvidia.com/gpu.present": "true",
                        "nvidia.com/gpu.count": str(gpus),
                        "nvidia.com/gpu.product": "KWOK-Simulated-GPU",
                        "disagg.dev/simulated": "true",
                        BENCH_LABEL: "true",
                    },
                },
                "spec": {"taints": [{"key": TAINT_KEY, "value": "true", "effect": "NoSchedule"}]},
                "status": {"allocatable": res, "capacity": res},
            }
        )
    return out


def dd_spec(
    name: str, prom_url: str, *, interval: int, prefill: tuple[int, int, int], decode: tuple[int, int, int]
) -> dict:
    """Like tests/e2e/e2e_stack.py's deployment_spec, pinned to the bench nodes. (replicas, min, max)."""
    container = {"name": "vllm", "image": "example.invalid/vllm:emulated", "ports": [{"containerPort": 8000}]}
    tmpl = {
        "spec": {
            "containers": [container],
            "nodeSelector": {BENCH_LABEL: "true"},
            "tolerations": [{"key": TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}],
        }
    }
    pool = {"template": tmpl, "gpusPerReplica": 1, "drain": {"timeoutSeconds": 120, "onTimeout": "readmit"}}

    def sized(r: tuple[int, int, int]) -> dict:
        return {**pool, "replicas": r[0], "minReplicas": r[1], "maxReplicas": r[2]}

    return disagg_deployment(
        name,
        {"prefill": sized(prefill), "decode": sized(decode)},
        {
            "enabled": True,
            "intervalSeconds": interval,
            "scrapeIntervalSeconds": 1,
            "metricWindowSeconds": 10,
            "scaleDownStabilizationSeconds": 10,
            "maxScaleUpStep": 8,
            "maxScaleDownStep": 8,
            "prometheus": {"url": prom_url},
        },
        model="emulated-70b",
        slo={"ttftSeconds": 0.6, "itlSeconds": 0.15, "percentile": 0.9},
    )


class Bench:
    def __init__(self, kc: str, tmp: Path) -> None:
        self.kc = kc
        self.k = Kubectl(kc)
        self.tmp = tmp
        self.env = {**os.environ, "KUBECONFIG": kc, "PATH": f"{tools_bin()}:{os.environ.get('PATH', '')}"}
        self.namespaces: list[str] = []
        self.procs: list[subprocess.Popen] = []
        self.nodes: list[str] = []

    # -- lifecycle
    def add_nodes(self, n: int, gpus: int) -> None:
        nodes = bench_nodes(n, gpus)
        self.nodes = [x["metadata"]["name"] for x in nodes]
        self.k(
            "apply",
            "--server-side",
            "--force-conflicts",
            "--field-manager=disagg-bench",
            "-f",
            "-",
            input=json.dumps({"apiVersion": "v1", "kind": "List", "items": nodes}),
        )

        def ready() -> bool:
            items = self.k.json("nodes", "-l", f"{BENCH_LABEL}=true")["items"]
            ok = [
                n
                for n in items
                if any(
                    c["type"] == "Ready" and c["status"] == "True" for c in n["status"].get("conditions", [])
                )
            ]
            return len(ok) >= len(self.nodes)

        wait_for(ready, 60, "bench nodes Ready")

    def namespace(self, prefix: str) -> str:
        ns = f"{prefix}-{uuid.uuid4().hex[:5]}"
        self.k("create", "namespace", ns)
        self.namespaces.append(ns)
        wait_for(
            lambda: self.k("get", "serviceaccount", "default", "-n", ns, check=False).returncode == 0,
            30,
            f"default service account in {ns}",
        )
        return ns

    def apply(self, ns: str, objs: list[dict]) -> None:
        self.k(
            "apply",
            "--server-side",
            "--field-manager=disagg-bench",
            "-n",
            ns,
            "-f",
            "-",
            input=json.dumps({"apiVersion": "v1", "kind": "List", "items": objs}),
        )

    def popen(self, args: list[str], log_name: str) -> subprocess.Popen:
        log = open(self.tmp / log_name, "ab")  # noqa: SIM115 - owned by the child
        p = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=self.env)
        log.close()
        self.procs.append(p)
        return p

    def operator(self, ns: str, log_name: str) -> subprocess.Popen:
        return self.popen(
            operator_cmd(self.kc, [ns]),
            log_name,
        )

    def emulator(self, ns: str, port: int, log_name: str, *load: str) -> subprocess.Popen:
        return self.popen(
            [
                sys.executable,
                "-m",
                "disagg.cli",
                "emulate",
                "--kubeconfig",
                self.kc,
                "--namespace",
                ns,
                "--metrics-port",
                str(port),
                "--summary-json",
                str(self.tmp / f"{log_name}.summary.json"),
                *load,
            ],
            log_name,
        )

    def routable_pods(self, ns: str) -> int:
        pods = self.k.json("pods", "-n", ns)["items"]
        return sum(
            1
            for p in pods
            if not p["metadata"].get("deletionTimestamp")
            and any(
                c["type"] == "disagg.dev/routable" and c["status"] == "True"
                for c in p.get("status", {}).get("conditions", [])
            )
        )

    def drop_namespace(self, ns: str) -> None:
        self.k("delete", "namespace", ns, "--wait=false", check=False)

    def cleanup(self) -> None:
        for p in reversed(self.procs):
            stop(p)
        for ns in self.namespaces:
            self.drop_namespace(ns)
        if self.nodes:
            # Let the namespaces' pods go before their nodes do.
            try:
                wait_for(
                    lambda: all(
                        self.k("get", "namespace", ns, check=False).returncode != 0 for ns in self.namespaces
                    ),
                    120,
                    "bench namespaces deleted",
                    interval=1,
                )
            except TimeoutError as e:
                print(f"  warning: {e}", file=sys.stderr)
            self.k("delete", "node", *self.nodes, "--wait=false", check=False)


class DeploymentWatch:
    """`kubectl get deployments -w` in the background: (monotonic time, name, spec.replicas) per event."""

    def __init__(self, k: Kubectl, ns: str) -> None:
        self.events: list[tuple[float, str, int]] = []
        self.proc = subprocess.Popen(
            [
                f"{tools_bin()}/kubectl",
                f"--kubeconfig={k.kc}",
                "get",
                "deployments",
                "-n",
                ns,
                "-w",
                "--no-headers",
                "-o",
                "custom-columns=NAME:.metadata.name,REPLICAS:.spec.replicas",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            t = time.monotonic()
            parts = line.split()
            if len(parts) == 2 and parts[1].isdigit():
                self.events.append((t, parts[0], int(parts[1])))

    def replicas(self, name: str) -> int | None:
        for _, n, r in reversed(self.events):
            if n == name:
                return r
        return None

    def first_change_after(self, name: str, t: float, base: int) -> float | None:
        for te, n, r in self.events:
            if n == name and te >= t and r != base:
                return te
        return None

    def close(self) -> None:
        stop(self.proc, timeout=5)


def prom_value(url: str, q: str) -> float | None:
    try:
        with urllib.request.urlopen(
            f"{url}/api/v1/query?" + urllib.parse.urlencode({"query": q}), timeout=2
        ) as r:
            res = json.loads(r.read())["data"]["result"]
    except Exception:
        return None
    return float(res[0]["value"][1]) if res else None


# --------------------------------------------------------------------------- 1. decision latency


def latency_run(b: Bench, i: int, timeout_after_step: float) -> dict:
    from disagg.devtools.prometheus import PrometheusServer

    ns = b.namespace(f"bench-as-lat{i}")
    port = free_port()
    prom = PrometheusServer(targets={"emulator": [f"127.0.0.1:{port}"]}, scrape_interval="1s").start()
    watch = None
    op = emu = None
    try:
        b.apply(ns, [dd_spec("llm", prom.url, interval=5, prefill=(1, 1, 8), decode=(1, 1, 16))])
        op = b.operator(ns, f"lat{i}-operator.log")
        watch = DeploymentWatch(b.k, ns)
        wait_for(lambda: b.routable_pods(ns) >= 2, 90, f"2 routable pods in {ns}")
        emu = b.emulator(
            ns,
            port,
            f"lat{i}-emulator.log",
            "--schedule",
            f"0:1,{STEP_AT:g}:8",
            "--arrivals",
            "uniform",
            "--input-tokens",
            str(PROMPT),
            "--output-tokens",
            str(OUTPUT),
            "--duration",
            "90",
        )
        # The emulator's clock starts just before its metrics port opens (t0 is at most a few ms early).
        t0 = wait_port(port)
        t_step = t0 + STEP_AT
        names = ("llm-prefill", "llm-decode")
        while time.monotonic() < t_step - 0.5:
            time.sleep(0.25)
        base = {n: watch.replicas(n) for n in names}
        pre = prom_value(prom.url, PROM_QUERY)
        t_prom = t_rise = None
        deadline = t_step + timeout_after_step
        while time.monotonic() < deadline:
            now = time.monotonic()
            if t_prom is None and now >= t_step:
                v = prom_value(prom.url, PROM_QUERY)
                if v is not None and v > FIRST_RISE and t_rise is None:
                    t_rise = time.monotonic()
                if v is not None and v > PROM_THRESHOLD:
                    t_prom = time.monotonic()
            changed = {n: watch.first_change_after(n, t_step, base[n]) for n in names}
            if t_prom is not None and all(changed.values()):
                break
            time.sleep(0.1)
        changed = {n: watch.first_change_after(n, t_step, base[n]) for n in names}
        time.sleep(1.0)
        a = None if t_prom is None else t_prom - t_step
        rise = None if t_rise is None else t_rise - t_step
        out = {"namespace": ns, "rate_before_step": pre, "prom_s": a, "rise_s": rise, "base": base}
        for n in names:
            key = n.split("-")[1]
            bt = changed[n]
            out[f"{key}_s"] = None if bt is None else bt - t_step
            out[f"{key}_decision_s"] = None if bt is None or a is None else bt - t_step - a
            out[f"{key}_replicas"] = watch.replicas(n)
        return out
    finally:
        stop(emu)
        if watch:
            watch.close()
        stop(op)
        prom.close()
        b.drop_namespace(ns)


def bench_latency(b: Bench, runs: int) -> None:
    print(f"== 1. decision latency: load step 1 -> 8 req/s at t={STEP_AT:g} s, {runs} runs")
    rows = []
    for i in range(runs):
        r = latency_run(b, i, timeout_after_step=45)
        rows.append(r)
        print(
            f"  run {i + 1}: rate before step {fmt(r['rate_before_step'], 'req/s')}; "
            f"Prometheus > {FIRST_RISE:g}: {fmt(r['rise_s'])}, (a) > {PROM_THRESHOLD:g}: {fmt(r['prom_s'])}; "
            f"(b) prefill {r['base']['llm-prefill']}->{r['prefill_replicas']} at {fmt(r['prefill_s'])}, "
            f"decode {r['base']['llm-decode']}->{r['decode_replicas']} at {fmt(r['decode_s'])}",
            flush=True,
        )
    a = med([r["prom_s"] for r in rows])
    print(
        f"  median step -> Prometheus first shows a rise (> {FIRST_RISE:g}): {fmt(med([r['rise_s'] for r in rows]))}"
    )
    print(
        f"  median step -> Prometheus shows new rate (> {PROM_THRESHOLD:g}; metric propagation, a): {fmt(a)}"
    )
    for key in ("prefill", "decode"):
        print(
            f"  median step -> llm-{key} replicas patched (b): {fmt(med([r[f'{key}_s'] for r in rows]))}; "
            f"operator decision (b - a): {fmt(med([r[f'{key}_decision_s'] for r in rows]))}"
        )
    print("  (autoscaling intervalSeconds 5: b - a is bounded by about one interval plus one tick)")


# --------------------------------------------------------------------------- 2. operator CPU / RSS


def proc_cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    # fields[0] is field 3 (state): utime is field 14, stime field 15
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def bench_scale(b: Bench, objects: int, seconds: float, rate: float, warmup: float) -> None:
    from disagg.devtools.prometheus import PrometheusServer

    print(
        f"== 2. operator CPU and RSS: {objects} DisaggDeployments (1+1 GPU, autoscaling every 10 s), "
        f"{rate:g} req/s emulated, {seconds:g} s window",
        flush=True,
    )
    ns = b.namespace("bench-as-scale")
    port = free_port()
    prom = PrometheusServer(targets={"emulator": [f"127.0.0.1:{port}"]}, scrape_interval="1s").start()
    op = emu = None
    try:
        objs = [
            dd_spec(f"bench-{j:03d}", prom.url, interval=10, prefill=(1, 1, 2), decode=(1, 1, 2))
            for j in range(objects)
        ]
        op = b.operator(ns, "scale-operator.log")
        t = time.monotonic()
        b.apply(ns, objs)
        wait_for(lambda: b.routable_pods(ns) >= 2 * objects, 300, f"{2 * objects} routable pods", interval=2)
        print(f"  {2 * objects} pods routable {time.monotonic() - t:.1f} s after applying", flush=True)
        rss_idle = rss_mib(op.pid)
        emu = b.emulator(
            ns,
            port,
            "scale-emulator.log",
            "--rate",
            f"{rate:g}",
            "--arrivals",
            "poisson",
            "--input-tokens",
            "1000",
            "--output-tokens",
            "200",
            "--duration",
            f"{warmup + seconds + 15:g}",
        )
        wait_port(port)
        time.sleep(warmup)
        cpu0, w0 = proc_cpu_s(op.pid), time.monotonic()
        rss = []
        while time.monotonic() - w0 < seconds:
            rss.append(rss_mib(op.pid))
            time.sleep(1.0)
        cpu1, w1 = proc_cpu_s(op.pid), time.monotonic()
        rss.append(rss_mib(op.pid))
        metrics_ok = decided = 0
        for d in b.k.json("disaggdeployments", "-n", ns)["items"]:
            st = d.get("status") or {}
            decided += bool(st.get("lastDecision"))
            metrics_ok += any(
                c["type"] == "MetricsAvailable" and c["status"] == "True" for c in st.get("conditions", [])
            )
        stop(emu)
        emu = None
        summ = b.tmp / "scale-emulator.log.summary.json"
        emu_line = ""
        if summ.exists():
            s = json.loads(summ.read_text())
            req = s.get("requests", {})
            emu_line = (
                f"; emulator: {req.get('generated')} requests generated, {req.get('completed')} completed, "
                f"{len(s.get('deployments', []))} deployments loaded"
            )
        print(
            f"  operator CPU: {cpu1 - cpu0:.2f} CPU s over {w1 - w0:.1f} s wall = "
            f"{(cpu1 - cpu0) / (w1 - w0):.3f} CPU s per wall s"
        )
        print(
            f"  operator RSS: median {statistics.median(rss):.1f} MiB, max {max(rss):.1f} MiB "
            f"(before load {rss_idle:.1f} MiB)"
        )
        print(
            f"  DisaggDeployments with a lastDecision: {decided}/{objects}; MetricsAvailable=True: {metrics_ok}{emu_line}"
        )
    finally:
        stop(emu)
        stop(op)
        prom.close()
        b.drop_namespace(ns)


# --------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3, help="decision-latency runs (0 skips part 1)")
    ap.add_argument("--objects", type=int, default=50, help="DisaggDeployments for part 2 (0 skips it)")
    ap.add_argument("--seconds", type=float, default=60.0, help="CPU/RSS measurement window")
    ap.add_argument("--rate", type=float, default=25.0, help="part 2: total req/s over all deployments")
    ap.add_argument("--warmup", type=float, default=15.0, help="part 2: seconds of load before the window")
    ap.add_argument("--keep-logs", action="store_true", help="keep the logs directory")
    a = ap.parse_args(argv)

    kc = kubeconfig()
    k = Kubectl(kc)
    k("apply", "--server-side", "--force-conflicts", "-f", str(ROOT / "crds"))
    k("wait", "--for=condition=Established", "crd/disaggdeployments.disagg.dev", "--timeout=60s")
    tmp = Path(tempfile.mkdtemp(prefix="disagg-bench-autoscaler-"))
    b = Bench(kc, tmp)
    gpus_per_node = 64
    need = max(24, 4 * a.objects)  # every pool at its maxReplicas (part 1: 8 + 16; part 2: 2 + 2 each)
    t0 = time.monotonic()
    ok = False
    try:
        b.add_nodes(max(1, -(-need // gpus_per_node)), gpus_per_node)
        if a.runs > 0:
            bench_latency(b, a.runs)
        if a.objects > 0:
            bench_scale(b, a.objects, a.seconds, a.rate, a.warmup)
        ok = True
    finally:
        b.cleanup()
        kept = a.keep_logs or not ok
        print(f"(bench took {time.monotonic() - t0:.0f} s" + (f"; logs in {tmp})" if kept else ")"))
        if not kept:
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
