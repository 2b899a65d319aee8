#!/usr/bin/env python3
"""Scale benchmark: one operator, N DisaggDeployments, on the local cluster (opt-in).

    hack/bench/bench_scale.py 100 300                # autoscaling disabled
    hack/bench/bench_scale.py --autoscaling 1 50     # real Prometheus + `disagg emulate`, 10 s interval
    hack/bench/bench_scale.py --autoscaling --emulators 4 500   # the fleet over four emulators
    hack/bench/bench_scale.py --direct 1000          # the same objects and children, no operator

Without a size it prints this help and exits (so `make bench` does not start a long run).
For each N it starts `disagg run` (this checkout's code) watching a fresh namespace, applies N
DisaggDeployments (two pools of one 1-GPU replica each, no router: 2 pods, 2 Services; --router
adds a third of each), and prints:

  * apply -> all Ready: from the first apply until every object has condition Ready=True
    (polled every READY_POLL_S), and how much of it `kubectl apply` itself took (the API
    server accepting the objects, before the operator has anything to do with them);
  * reconciles per object while converging, and their mean duration (the operator's own
    disagg_operator_reconcile_seconds);
  * the autoscaling loop's tick period p50 / max while converging and in steady state
    (disagg_operator_loop_tick_seconds; the target is 1 s);
  * API requests per minute in steady state, by verb and resource: the API server's own
    apiserver_request_total over --steady-seconds with the operator running, minus the same
    window with the operator stopped (the cluster's own components), counting only the kinds
    and verbs the operator sends (OPERATOR_REQUESTS), so the figures are the operator's;
    `writes` are POST/PUT/PATCH/APPLY/DELETE;
  * the operator's resident memory (RSS) and the cores it used in steady state;
  * with --autoscaling (Prometheus scraping every max(1, N/100) s, the objects' metric window
    4 scrapes, at least 10 s): the gap between two decisions of an object, p50 / p99
    (disagg_operator_decision_gap_seconds; the target is the 10 s interval), and the
    load step -> patched replicas latency: every object's own arrival stream (the emulators'
    `--rate-per deployment`: an object that serves early gets its own rate, not the share of
    the objects still starting) steps up at once, and the time until each object's decode
    Deployment has more replicas is reported (p50 / max over the objects), beside the time until each object's arrival rate, as the operator reads it from
    Prometheus, was halfway up the step (the emulators' and Prometheus' share of that latency),
    and how fresh the metrics stayed meanwhile (the longest and failed scrapes, the objects the
    operator held on stale metrics).

With --direct no operator runs: the N objects are stored, then the children the operator would
write (its builders; no owner reference, no routable readiness gate) are applied by kubectl, and
the time until every pool Deployment is available is printed: the cluster's own share of
apply -> Ready (close to a bound for any operator on the same cluster and machine; not a
strict one, as kubectl sends one write at a time).

Percentiles of histograms are interpolated within their buckets, and the max is the upper
bound of the highest bucket hit (docs/scale.md has the figures measured on the project
machine). The cluster is `hack/cluster.sh up` with DISAGG_* from the environment; the bench
sets a large Service range (DISAGG_SERVICE_CIDR, default 10.96.0.0/16) and enough nodes for
the pods when the cluster does not run yet. No pass/fail: figures only.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
import uuid
from collections import defaultdict
from pathlib import Path

from benchlib import (
    ROOT,
    code_env,
    cpu_seconds,
    disagg_deployment,
    free_port,
    kubectl,
    operator_cmd,
    rss_mib,
    sh,
    stop,
)
from prometheus_client.parser import text_string_to_metric_families

#: How often apply -> Ready polls the objects' conditions (the figure's resolution): one LIST of
#: every object, which at N=1,000 costs the shared machine's API server and kubectl a
#: noticeable share of a core when sent every 2 s.
READY_POLL_S = 5
WRITE_VERBS = ("POST", "PUT", "PATCH", "APPLY", "DELETE", "DELETECOLLECTION")
#: The (resource, verbs) the operator sends; the rest of apiserver_request_total is the cluster's
#: own controllers (the Endpoints controller's Event series, node heartbeats, bindings), whose
#: rates drift between the two windows and would only add noise.
OPERATOR_REQUESTS = {
    "disaggdeployments": ("GET", "LIST", "WATCH"),
    "disaggdeployments/status": ("PATCH", "APPLY", "PUT"),
    "deployments": ("GET", "LIST", "WATCH", "APPLY", "PATCH", "DELETE"),
    "services": ("LIST", "APPLY", "PATCH", "DELETE"),
    "poddisruptionbudgets": ("LIST", "APPLY", "PATCH", "DELETE"),
    "serviceaccounts": ("LIST", "APPLY", "PATCH", "DELETE"),
    "roles": ("LIST", "APPLY", "PATCH", "DELETE"),
    "rolebindings": ("LIST", "APPLY", "PATCH", "DELETE"),
    "pods": ("GET", "LIST", "WATCH", "PATCH"),
    "pods/status": ("PATCH",),
    "events": ("POST",),
    "leases": ("GET", "PATCH", "POST"),
}
#: Objects per `kubectl apply` (one call per chunk, applied back to back).
APPLY_CHUNK = 50
#: The decision interval of the autoscaling run.
INTERVAL_S = 10
#: Pods per object without its router (the nodes are sized for the router's pod too; a
#: simulated node admits 110 pods, hack/cluster.sh).
PODS_PER_OBJECT = 2


class Cluster:
    def __init__(self, n_max: int) -> None:
        env = dict(os.environ)
        env.setdefault("DISAGG_SERVICE_CIDR", "10.96.0.0/16")
        nodes = max(int(env.get("DISAGG_GPU_NODES", "4")), math.ceil(n_max * (PODS_PER_OBJECT + 1) / 100) + 1)
        env["DISAGG_GPU_NODES"] = str(nodes)
        env["DISAGG_GPUS_PER_NODE"] = str(max(int(env.get("DISAGG_GPUS_PER_NODE", "8")), 100))
        up = sh(str(ROOT / "hack/cluster.sh"), "up", env=env)
        self.kubeconfig = up.stdout.strip().splitlines()[-1]

    def kubectl(self, *args: str, input: str | None = None, check: bool = True):
        return kubectl(self.kubeconfig, *args, input=input, check=check, timeout=None)

    def wait_namespaces_gone(self, timeout: float = 300) -> None:
        """Wait until no namespace is being deleted: the namespace controller LISTs every kind
        while it empties one, which would count as steady-state traffic."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            items = self.get_json("namespaces")["items"]
            if not any(ns.get("status", {}).get("phase") == "Terminating" for ns in items):
                return
            time.sleep(2)
        print("warning: namespaces still terminating; steady figures include their deletion", file=sys.stderr)

    def get_json(self, *args: str) -> dict:
        return json.loads(self.kubectl("get", *args, "-o", "json").stdout)

    def apiserver_requests(self) -> dict[tuple[str, str], float]:
        """apiserver_request_total summed by (verb, resource[/subresource])."""
        text = self.kubectl("get", "--raw", "/metrics").stdout
        out: dict[tuple[str, str], float] = defaultdict(float)
        for fam in text_string_to_metric_families(text):
            if fam.name != "apiserver_request":
                continue
            for s in fam.samples:
                if not s.name.endswith("_total"):
                    continue
                res = s.labels.get("resource", "")
                if s.labels.get("subresource"):
                    res += "/" + s.labels["subresource"]
                out[(s.labels.get("verb", ""), res)] += s.value
        return dict(out)


# ---------------------------------------------------------------------------- objects


#: The label that says which emulator process (`--emulators`) emulates an object's pods.
EMULATOR_LABEL = "bench.disagg.dev/emulator"


def metric_window_s(scrape_s: int) -> int:
    """The objects' metric window: four scrapes, at least 10 s."""
    return max(10, 4 * scrape_s)


def scrape_seconds(n: int, chosen: int = 0) -> int:
    """Prometheus' scrape interval (and timeout) for the emulators of an N-object run: `chosen`
    (--scrape-seconds) or, by default, one second per 100 objects: an emulator process serves
    the metrics of N/--emulators objects (about 50 samples per pod), and at N=500 over four
    processes it could not answer within 1 s while emulating its load; a target that times
    out leaves every object's metrics stale (the decisions then hold)."""
    return chosen or max(1, math.ceil(n / 100))


def dd(name: str, prom_url: str | None, router: bool = False, emulator: int = 0, scrape_s: int = 1) -> dict:
    container = {"name": "vllm", "image": "example.invalid/vllm:bench", "ports": [{"containerPort": 8000}]}
    pool = {
        "replicas": 1,
        "minReplicas": 1,
        "gpusPerReplica": 1,
        "template": {"spec": {"containers": [container]}},
    }
    autoscaling: dict = {"enabled": False}
    if prom_url:
        autoscaling = {
            "enabled": True,
            "intervalSeconds": INTERVAL_S,
            "scrapeIntervalSeconds": scrape_s,
            "metricWindowSeconds": metric_window_s(scrape_s),
            "prometheus": {"url": prom_url},
        }
    obj = disagg_deployment(
        name,
        {"prefill": {**pool, "maxReplicas": 4}, "decode": {**pool, "maxReplicas": 8}},
        autoscaling,
        slo={"ttftSeconds": 0.6, "itlSeconds": 0.15, "percentile": 0.9},
        # Off by default: two pods and two Services per object (with it: three of each).
        router={"enabled": router},
    )
    obj["metadata"].setdefault("labels", {})[EMULATOR_LABEL] = str(emulator)
    return obj


def direct_children(name: str, ns: str, router: bool) -> list[dict]:
    """The children the operator writes for object `name` (its builders, the same pools), to be
    applied without the operator: no owner reference (the garbage collector deletes the children
    of an owner it cannot find) and no routable readiness gate (only the operator opens it)."""
    from disagg import api, builders

    spec = api.parse_spec(dd(name, None, router)["spec"])
    owner = builders.Owner(name=name, namespace=ns, uid=str(uuid.uuid4()))
    objs = builders.all_objects(owner, spec) + builders.router_objects(owner, spec)
    for obj in objs:
        obj["metadata"].pop("ownerReferences", None)
        pod = obj.get("spec", {}).get("template", {}).get("spec")
        if pod is not None:
            pod.pop("readinessGates", None)
    return objs


def available_count(cluster: Cluster, ns: str) -> int:
    """Deployments of the namespace whose every replica is available."""
    items = cluster.get_json("deployments", "-n", ns)["items"]
    return sum(
        1 for d in items if (d.get("status") or {}).get("availableReplicas", 0) >= d["spec"]["replicas"]
    )


def ready_count(cluster: Cluster, ns: str) -> int:
    items = cluster.get_json("disaggdeployments", "-n", ns)["items"]
    return sum(
        1
        for o in items
        if any(
            c["type"] == "Ready" and c["status"] == "True"
            for c in (o.get("status") or {}).get("conditions", [])
        )
    )


# ---------------------------------------------------------------------------- operator metrics


def scrape(port: int) -> dict[str, dict]:
    """Histograms of the operator: name -> {"buckets": {le: count}, "count": c, "sum": s}; a
    labelled series as name{label=value,...} (disagg_operator_decision_wait_seconds{wait=slot}).
    Also "decisions by object": (namespace, deployment, reason) -> disagg_decisions_total."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    out: dict[str, dict] = {}
    reasons: dict[tuple[str, str, str], float] = {}
    for fam in text_string_to_metric_families(text):
        if fam.name == "disagg_decisions":
            for s in fam.samples:
                if s.name.endswith("_total"):
                    reasons[(s.labels["namespace"], s.labels["deployment"], s.labels["reason"])] = s.value
            continue
        if fam.type != "histogram":
            continue
        for s in fam.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()) if k != "le")
            h = out.setdefault(
                f"{fam.name}{{{labels}}}" if labels else fam.name, {"buckets": {}, "count": 0.0, "sum": 0.0}
            )
            if s.name.endswith("_bucket"):
                h["buckets"][float(s.labels["le"])] = s.value
            elif s.name.endswith("_count"):
                h["count"] = s.value
            elif s.name.endswith("_sum"):
                h["sum"] = s.value
    out["decisions by object"] = reasons  # type: ignore[assignment]
    return out


def delta(after: dict, before: dict, name: str) -> dict:
    a, b = after.get(name), before.get(name)
    if a is None:
        return {"buckets": {}, "count": 0.0, "sum": 0.0}
    b = b or {"buckets": {}, "count": 0.0, "sum": 0.0}
    return {
        "buckets": {le: v - b["buckets"].get(le, 0.0) for le, v in a["buckets"].items()},
        "count": a["count"] - b["count"],
        "sum": a["sum"] - b["sum"],
    }


def quantile(h: dict, q: float) -> float:
    """Linear interpolation inside the bucket holding the q-quantile; nan without samples."""
    total = h["count"]
    if total <= 0:
        return float("nan")
    want, prev_le, prev_c = q * total, 0.0, 0.0
    for le in sorted(h["buckets"]):
        c = h["buckets"][le]
        if c >= want:
            if math.isinf(le):
                return prev_le
            return prev_le + (le - prev_le) * ((want - prev_c) / (c - prev_c) if c > prev_c else 1.0)
        prev_le, prev_c = le, c
    return prev_le


def max_bound(h: dict) -> float:
    """Upper bound of the highest bucket with a sample (inf: above the last bucket)."""
    if h["count"] <= 0:
        return float("nan")
    for le in sorted(h["buckets"]):
        if h["buckets"][le] >= h["count"]:
            return le
    return float("inf")


# ---------------------------------------------------------------------------- one run


class Run:
    def __init__(self, cluster: Cluster, n: int, args: argparse.Namespace, tmp: Path) -> None:
        self.cluster, self.n, self.args, self.tmp = cluster, n, args, tmp
        self.ns = f"bench-scale-{n}-{uuid.uuid4().hex[:5]}"
        self.port = free_port()
        self.op: subprocess.Popen | None = None
        self.emulators: list[subprocess.Popen] = []
        self.prom = None
        self.figures: dict[str, object] = {"N": n}
        # Autoscaling: the rate steps up after convergence and the steady window (apply -> Ready
        # took up to 0.72 s per object on the project machine with the emulators running)
        # unless --step-after says when.
        self.step_after = args.step_after or int(60 + 1.0 * n + args.settle_seconds + args.steady_seconds)

    def start_operator(self) -> None:
        extra = ["--allow-prometheus-url", self.prom.url] if self.prom is not None else []
        if self.args.decisions_at_once:
            extra += ["--decisions-at-once", str(self.args.decisions_at_once)]
        cmd = operator_cmd(self.cluster.kubeconfig, [self.ns], self.port, *extra)
        log = open(self.tmp / f"operator-{self.n}.log", "ab")  # noqa: SIM115 - owned by the child
        self.op = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, env=code_env(self.cluster.kubeconfig)
        )
        log.close()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                scrape(self.port)
                return
            except OSError:
                time.sleep(0.5)
        raise RuntimeError(f"the operator did not serve metrics; see {self.tmp}/operator-{self.n}.log")

    def stop_operator(self) -> None:
        stop(self.op, 20)

    def start_autoscaling_stack(self, rate: float) -> None:
        from disagg.devtools.prometheus import PrometheusServer

        # One emulator process per part of the fleet (objects round-robin, by EMULATOR_LABEL),
        # each with its own metrics port, all scraped by the one Prometheus.
        parts = self.args.emulators
        ports = [free_port() for _ in range(parts)]
        self.prom = PrometheusServer(
            targets={"emulator": [f"127.0.0.1:{port}" for port in ports]},
            scrape_interval=f"{scrape_seconds(self.n, self.args.scrape_seconds)}s",
            workdir=self.tmp / f"prom-{self.n}",
        ).start()
        step_at = self.step_after
        for k, port in enumerate(ports):
            # the same load either way: per object, or the part's objects' sum for its stream
            objects = 1 if self.args.rate_per == "deployment" else len(range(k, self.n, parts))
            low, high = rate * objects, rate * self.args.step_factor * objects
            cmd = [sys.executable, "-m", "disagg.cli", "emulate", "--kubeconfig", self.cluster.kubeconfig]
            cmd += ["--namespace", self.ns, "--selector", f"{EMULATOR_LABEL}={k}"]
            cmd += ["--metrics-port", str(port), "--rate-per", self.args.rate_per]
            cmd += ["--schedule", f"0:{low:g},{step_at}:{high:g}"]
            cmd += ["--duration", str(step_at + self.args.step_watch + 60)]
            log = open(self.tmp / f"emulator-{self.n}-{k}.log", "ab")  # noqa: SIM115
            self.emulators.append(
                subprocess.Popen(
                    cmd, stdout=log, stderr=subprocess.STDOUT, env=code_env(self.cluster.kubeconfig)
                )
            )
            log.close()
        self.emulator_started = time.monotonic()

    def close(self) -> None:
        self.stop_operator()
        for emulator in self.emulators:
            stop(emulator, 15)
        if self.prom is not None:
            self.prom.close()
        self.cluster.kubectl("delete", "namespace", self.ns, "--wait=false", check=False)
        self.cluster.wait_namespaces_gone()

    def apply(self, docs: list[str], chunk: int) -> None:
        """Server-side apply of JSON documents into the run's namespace, `chunk` per kubectl call."""
        for i in range(0, len(docs), chunk):
            self.cluster.kubectl(
                "apply", "--server-side", "-n", self.ns, "-f", "-", input="\n---\n".join(docs[i : i + chunk])
            )

    def converge(self) -> None:
        prom_url = self.prom.url if self.prom is not None else None
        m0 = scrape(self.port)
        docs = [
            json.dumps(
                dd(
                    f"o{i:04d}",
                    prom_url,
                    self.args.router,
                    i % self.args.emulators,
                    scrape_seconds(self.n, self.args.scrape_seconds),
                )
            )
            for i in range(self.n)
        ]
        t0 = time.monotonic()
        self.apply(docs, APPLY_CHUNK)
        # The API server's own share: accepting the objects (schema and CEL validation, storage),
        # before any of them is reconciled or Ready.
        self.figures["apply, kubectl until every object is stored (s)"] = time.monotonic() - t0
        ready = 0
        while time.monotonic() - t0 < self.args.ready_timeout:
            ready = ready_count(self.cluster, self.ns)
            if ready >= self.n:
                break
            time.sleep(READY_POLL_S)
        t_ready = time.monotonic() - t0
        m1 = scrape(self.port)
        rec = delta(m1, m0, "disagg_operator_reconcile_seconds")
        tick = delta(m1, m0, "disagg_operator_loop_tick_seconds")
        self.figures["apply -> all Ready (s)"] = (
            t_ready if ready >= self.n else f">{t_ready:.0f} ({ready} Ready)"
        )
        self.figures["reconciles per object (converging)"] = rec["count"] / self.n
        self.figures["mean reconcile (s)"] = rec["sum"] / rec["count"] if rec["count"] else float("nan")
        self.figures["loop tick p50 / p99 / max (s), converging"] = (
            quantile(tick, 0.5),
            quantile(tick, 0.99),
            max_bound(tick),
        )

    def direct(self) -> None:
        """The cluster's own work for the same objects, without the operator: the N
        DisaggDeployments stored, then the children the operator would write applied by kubectl,
        until every pool Deployment is available. Close to a bound on apply -> all Ready for any
        operator on this cluster and machine."""
        docs = [json.dumps(dd(f"o{i:04d}", None, self.args.router)) for i in range(self.n)]
        objs = [obj for i in range(self.n) for obj in direct_children(f"o{i:04d}", self.ns, self.args.router)]
        children = [json.dumps(obj) for obj in objs]
        want = sum(1 for obj in objs if obj["kind"] == "Deployment")
        per_object = len(children) // self.n
        t0 = time.monotonic()
        self.apply(docs, APPLY_CHUNK)
        self.figures["direct: DisaggDeployments stored (s)"] = time.monotonic() - t0
        t1 = time.monotonic()
        self.apply(children, APPLY_CHUNK * per_object)
        self.figures["direct: children stored (s)"] = time.monotonic() - t1
        available = 0
        while time.monotonic() - t0 < self.args.ready_timeout:
            available = available_count(self.cluster, self.ns)
            if available >= want:
                break
            time.sleep(READY_POLL_S)
        took = time.monotonic() - t0
        self.figures["direct: apply -> all pools available (s)"] = (
            took if available >= want else f">{took:.0f} ({available}/{want} available)"
        )

    def steady(self) -> None:
        time.sleep(self.args.settle_seconds)
        self.cluster.wait_namespaces_gone()
        s = self.args.steady_seconds
        # A pass of the loop that began while objects converged is observed when the next one
        # starts: wait for two passes that began after this point, so it is not counted.
        fresh = scrape(self.port)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and (
            delta(scrape(self.port), fresh, "disagg_operator_loop_tick_seconds")["count"] < 2
        ):
            time.sleep(1)
        assert self.op is not None
        m0, a0 = scrape(self.port), self.cluster.apiserver_requests()
        w0, c0 = time.time(), cpu_seconds(self.op.pid)
        time.sleep(s)
        m1, a1 = scrape(self.port), self.cluster.apiserver_requests()
        w1, c1 = time.time(), cpu_seconds(self.op.pid)
        self.figures["steady RSS (MiB)"] = rss_mib(self.op.pid)
        # Cores the operator process used: above ~0.9 it is CPU-bound (one Python process).
        self.figures["operator CPU, steady (cores)"] = (c1 - c0) / (w1 - w0)
        tick = delta(m1, m0, "disagg_operator_loop_tick_seconds")
        self.figures["loop tick p50 / p99 / max (s), steady"] = (
            quantile(tick, 0.5),
            quantile(tick, 0.99),
            max_bound(tick),
        )
        if self.prom is not None:
            gap = delta(m1, m0, "disagg_operator_decision_gap_seconds")
            self.figures["decision gap p50 / p99 (s)"] = (quantile(gap, 0.5), quantile(gap, 0.99))
            self.load_step()
        self.stop_operator()
        time.sleep(2)
        b0 = self.cluster.apiserver_requests()
        time.sleep(s)
        b1 = self.cluster.apiserver_requests()
        per_min: dict[tuple[str, str], float] = {}
        for key in a1.keys() | b1.keys():
            with_op = a1.get(key, 0.0) - a0.get(key, 0.0)
            without = b1.get(key, 0.0) - b0.get(key, 0.0)
            v = (with_op - without) * 60 / s
            if abs(v) >= 0.5 and key[0] in OPERATOR_REQUESTS.get(key[1], ()):
                per_min[key] = v
        # POST events is shared with the cluster's controllers (the Endpoints controller's
        # FailedToCreateEndpoint for the simulated pods' loopback IPs follows the Services the
        # operator created, so it does not cancel out): count the operator's own Events instead.
        per_min.pop(("POST", "events"), None)
        own = self.operator_events(w0, w1) * 60 / s
        if own >= 0.5:
            per_min[("POST", "events (the operator's)")] = own
        self.figures["API requests/min (operator)"] = sum(per_min.values())
        self.figures["API writes/min (operator)"] = sum(
            v for (verb, _), v in per_min.items() if verb in WRITE_VERBS
        )
        self.figures["_requests"] = per_min

    def operator_events(self, t0: float, t1: float) -> int:
        """Events the operator recorded in the bench namespace between wall times t0 and t1."""
        from disagg.status import parse_time

        n = 0
        for e in self.cluster.get_json("events", "-n", self.ns)["items"]:
            if (e.get("source") or {}).get("component") != "disagg-operator":
                continue
            stamp = e.get("firstTimestamp") or e.get("eventTime")
            when = parse_time(stamp) if stamp else None
            if when is not None and t0 <= when < t1:
                n += int(e.get("count") or 1)
        return n

    def load_step(self) -> None:
        """Wait for the emulator's rate step, then time each object's decode scale-up."""

        def decode_replicas() -> dict[str, int]:
            items = self.cluster.get_json("deployments", "-n", self.ns, "-l", "disagg.dev/pool=decode")[
                "items"
            ]
            return {d["metadata"]["labels"]["disagg.dev/deployment"]: d["spec"]["replicas"] for d in items}

        step_at = self.emulator_started + self.step_after
        if time.monotonic() > step_at:
            self.figures["load step -> patched replicas p50 / max (s)"] = "step passed before steady state"
            return
        time.sleep(max(0.0, step_at - time.monotonic() - 1))
        before = decode_replicas()
        assert self.op is not None
        m0, c0, w0 = scrape(self.port), cpu_seconds(self.op.pid), time.monotonic()
        while time.monotonic() < step_at:
            time.sleep(0.1)
        grew: dict[str, float] = {}
        while time.monotonic() - step_at < self.args.step_watch and len(grew) < self.n:
            now = decode_replicas()
            for name, r in now.items():
                if name not in grew and r > before.get(name, r):
                    grew[name] = time.monotonic() - step_at
            time.sleep(0.5)
        m1, c1 = scrape(self.port), cpu_seconds(self.op.pid)
        step_wall = time.time() - (time.monotonic() - step_at)
        self.step_decisions(m0, m1, (c1 - c0) / (time.monotonic() - w0), set(grew))
        self.figures["load step -> arrival rate halfway up in Prometheus p50 / max (s)"] = (
            self.arrival_signal(step_wall)
        )
        self.figures[
            "after the load step: emulator scrape max (s) / failed scrapes / objects held on stale metrics"
        ] = self.step_freshness(step_wall)
        lat = sorted(grew.values())
        if not lat:
            self.figures["load step -> patched replicas p50 / max (s)"] = (
                f"none within {self.args.step_watch} s"
            )
            return
        self.figures["load step -> patched replicas p50 / max (s)"] = (
            lat[len(lat) // 2],
            lat[-1],
            f"{len(lat)}/{self.n} grew",
        )

    def step_decisions(self, m0: dict, m1: dict, cores: float, grew: set[str]) -> None:
        """What the operator did while the step was watched: the cores it used, how its due steps
        waited (for the tick's metrics, a slot, the object's lock) and how long its decisions took,
        and what the objects that did not grow decided meanwhile (their decisions by reason): a
        decision that ran and held points at the sizing, one that never ran at the loop."""
        self.figures["after the load step: operator CPU (cores)"] = cores
        gap = delta(m1, m0, "disagg_operator_decision_gap_seconds")
        self.figures["after the load step: decision gap p50 / p99 (s)"] = (
            quantile(gap, 0.5),
            quantile(gap, 0.99),
        )
        rec = delta(m1, m0, "disagg_operator_reconcile_seconds")
        self.figures["after the load step: reconciles, count / mean (s)"] = (
            int(rec["count"]),
            rec["sum"] / rec["count"] if rec["count"] else math.nan,
        )
        for wait in ("metrics", "slot", "lock"):
            h = delta(m1, m0, f"disagg_operator_decision_wait_seconds{{wait={wait}}}")
            self.figures[f"after the load step: wait for {wait} p50 / p99 (s)"] = (
                quantile(h, 0.5),
                quantile(h, 0.99),
            )
        for outcome in ("changed", "unchanged"):
            h = delta(m1, m0, f"disagg_operator_decision_seconds{{outcome={outcome}}}")
            self.figures[f"after the load step: {outcome} decisions, count / p50 / p99 (s)"] = (
                int(h["count"]),
                quantile(h, 0.5),
                quantile(h, 0.99),
            )
        r0, r1 = m0["decisions by object"], m1["decisions by object"]
        held: dict[str, float] = defaultdict(float)
        decided: set[str] = set()
        not_grown = {obj for ns, obj, _ in r1 if ns == self.ns} - grew
        for (ns, obj, reason), v in r1.items():
            made = v - r0.get((ns, obj, reason), 0.0)
            if ns == self.ns and obj in not_grown and made > 0:
                held[reason] += made
                decided.add(obj)
        silent = not_grown - decided
        self.figures["after the load step: objects not grown, their decisions by reason"] = (
            ", ".join(f"{reason} {int(v)}" for reason, v in sorted(held.items(), key=lambda kv: -kv[1]))
            or "none"
        ) + f" ({len(silent)} objects decided nothing)"

    def step_freshness(self, step_wall: float) -> object:
        """How fresh the metrics stayed while the emulators served the step: the longest scrape
        and the failed ones (Prometheus' own `scrape_duration_seconds` and `up`), and how many
        objects the operator held on stale metrics (its `HoldStaleMetrics` Events). A decision
        on stale metrics holds by design, so a step the emulators cannot be scraped through is
        a step the operator sees late."""
        assert self.prom is not None
        at = min(time.time(), step_wall + self.args.step_watch)  # the watch ends early once all grew
        watch = max(1, math.ceil(at - step_wall))
        answers: list[float] = []
        for promql in (
            f"max(max_over_time(scrape_duration_seconds[{watch}s]))",
            f"sum(count_over_time(up[{watch}s])) - sum(sum_over_time(up[{watch}s]))",
        ):
            query = urllib.parse.urlencode({"query": promql, "time": at})
            try:
                with urllib.request.urlopen(f"{self.prom.url}/api/v1/query?{query}", timeout=60) as r:
                    result = json.load(r)["data"]["result"]
            except OSError as exc:
                return f"not measured ({exc})"
            answers.append(float(result[0]["value"][1]) if result else math.nan)
        from disagg.status import parse_time

        held: set[str] = set()
        for e in self.cluster.get_json("events", "-n", self.ns)["items"]:
            stamp = e.get("firstTimestamp") or e.get("eventTime")
            when = parse_time(stamp) if stamp else None
            if e.get("reason") == "HoldStaleMetrics" and when is not None and step_wall <= when < at:
                held.add((e.get("involvedObject") or {}).get("name", ""))
        return (
            answers[0],
            int(answers[1]) if answers[1] == answers[1] else math.nan,
            f"{len(held)}/{self.n}",
        )

    def arrival_signal(self, step_wall: float) -> object:
        """When each object's arrival rate, as the operator reads it (its prefill pods' prompt
        count over the objects' metric window), was halfway up the step in Prometheus: the
        emulators' and Prometheus' share of the load step's latency, apart from the operator's."""
        assert self.prom is not None
        window = metric_window_s(scrape_seconds(self.n, self.args.scrape_seconds))
        promql = f'sum by (pod) (rate(vllm:request_prompt_tokens_count{{pod=~".*-prefill-.*"}}[{window}s]))'
        query = urllib.parse.urlencode(
            {"query": promql, "start": step_wall - 60, "end": step_wall + self.args.step_watch, "step": 1}
        )
        try:
            with urllib.request.urlopen(f"{self.prom.url}/api/v1/query_range?{query}", timeout=60) as r:
                series = json.load(r)["data"]["result"]
        except OSError as exc:
            return f"not measured ({exc})"
        rates: dict[str, dict[float, float]] = defaultdict(lambda: defaultdict(float))
        for s in series:
            owner = s["metric"].get("pod", "").split("-prefill-")[0]
            for t, v in s["values"]:
                rates[owner][float(t)] += float(v)
        halfway = 1.0 + (self.args.step_factor - 1.0) / 2.0
        lat: list[float] = []
        for points in rates.values():
            before = [v for t, v in points.items() if t < step_wall]
            if not before:
                continue
            level = halfway * sum(before) / len(before)
            lat.append(
                next(
                    (t - step_wall for t in sorted(points) if t >= step_wall and points[t] >= level), math.inf
                )
            )
        if not lat:
            return "no arrival series"
        lat.sort()
        reached = [x for x in lat if x < math.inf]
        return (
            lat[len(lat) // 2],
            reached[-1] if reached else math.inf,
            f"{len(reached)}/{len(lat)} reached",
        )

    def run(self) -> dict[str, object]:
        load_start = os.getloadavg()[0]
        self.cluster.kubectl("create", "namespace", self.ns)
        try:
            if self.args.direct:
                self.direct()
            else:
                if self.args.autoscaling:
                    self.start_autoscaling_stack(self.args.rate_per_object)
                self.start_operator()
                self.converge()
                self.steady()
            # The figures before the namespace's deletion (minutes at a large N) in close().
            print(
                f"N={self.n} measured: {json.dumps({k: fmt(v) for k, v in self.figures.items() if not k.startswith('_')})}",
                file=sys.stderr,
                flush=True,
            )
        finally:
            self.close()
        # The machine is shared: its load while this run went on (1-minute averages).
        self.figures["load average, start / end"] = (load_start, os.getloadavg()[0])
        return self.figures


# ---------------------------------------------------------------------------- report


def fmt(v: object) -> str:
    if isinstance(v, float):
        return "n/a" if math.isnan(v) else ("inf" if math.isinf(v) else f"{v:.2f}" if v < 100 else f"{v:.0f}")
    if isinstance(v, tuple):
        return " / ".join(fmt(x) for x in v)
    return str(v)


def report(results: list[dict[str, object]]) -> None:
    rows = [k for k in results[0] if not k.startswith("_")]
    width = max(len(r) for r in rows)
    cols = [[fmt(r.get(k, "")) for k in rows] for r in results]
    colw = [max(len(c) for c in col) for col in cols]
    for i, k in enumerate(rows):
        print(f"{k:<{width}}  " + "  ".join(f"{col[i]:>{w}}" for col, w in zip(cols, colw, strict=True)))
    for r in results:
        if "_requests" not in r:
            continue
        reqs = r["_requests"]
        top = sorted(reqs.items(), key=lambda kv: -kv[1])[:8]  # type: ignore[union-attr]
        detail = ", ".join(f"{verb} {res or '-'} {v:.0f}" for (verb, res), v in top)
        print(f"N={r['N']}: operator requests/min by verb and resource: {detail or 'none'}")
        writes = sorted(((k, v) for k, v in reqs.items() if k[0] in WRITE_VERBS), key=lambda kv: -kv[1])  # type: ignore[union-attr]
        detail = ", ".join(f"{verb} {res or '-'} {v:.0f}" for (verb, res), v in writes)
        print(f"N={r['N']}: operator writes/min: {detail or 'none'}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("sizes", nargs="*", type=int, help="numbers of DisaggDeployments, one run each")
    ap.add_argument("--autoscaling", action="store_true", help="autoscaling on: Prometheus + disagg emulate")
    ap.add_argument("--steady-seconds", type=int, default=60, help="steady-state window (default 60)")
    ap.add_argument("--settle-seconds", type=int, default=15, help="wait after all Ready (default 15)")
    ap.add_argument(
        "--ready-timeout", type=int, default=900, help="give up waiting for Ready (default 900 s)"
    )
    ap.add_argument("--rate-per-object", type=float, default=0.5, help="autoscaling: req/s per object")
    ap.add_argument("--step-factor", type=float, default=8.0, help="autoscaling: the load step's factor")
    ap.add_argument(
        "--rate-per",
        choices=("deployment", "fleet"),
        default="deployment",
        help="autoscaling: each object's own arrival stream (default), or one per emulator spread "
        "round robin over the objects that serve (`disagg emulate --rate-per`)",
    )
    ap.add_argument(
        "--step-after",
        type=int,
        default=0,
        help="autoscaling: seconds after the emulator starts (default: auto)",
    )
    ap.add_argument(
        "--router", action="store_true", help="give each object its router (a third pod and Service)"
    )
    ap.add_argument("--logs", type=Path, help="keep the operator's (and emulator's) logs in this directory")
    ap.add_argument("--step-watch", type=int, default=90, help="autoscaling: how long to watch the step")
    ap.add_argument(
        "--scrape-seconds",
        type=int,
        default=0,
        help="autoscaling: Prometheus' scrape interval (default: max(1, N/100)); the same at two N "
        "compares their load steps on equal metrics",
    )
    ap.add_argument(
        "--direct",
        action="store_true",
        help="no operator: store the objects, apply the children it would write, time until they are "
        "available (the cluster's own share of apply -> Ready)",
    )
    ap.add_argument(
        "--decisions-at-once",
        type=int,
        default=0,
        help="the operator's `disagg run --decisions-at-once` (default: its own default)",
    )
    ap.add_argument(
        "--emulators",
        type=int,
        default=1,
        help="autoscaling: emulator processes sharing the fleet (`disagg emulate --selector`; default 1)",
    )
    args = ap.parse_args()
    if not args.sizes:
        ap.print_help()
        return 0
    if any(n < 1 for n in args.sizes):
        ap.error("sizes must be positive")
    if args.direct and args.autoscaling:
        ap.error("--direct measures the cluster without the operator: no --autoscaling")
    if args.emulators < 1:
        ap.error("--emulators must be at least 1")
    cluster = Cluster(max(args.sizes))
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(ROOT / "crds"))
    cluster.kubectl("wait", "--for=condition=Established", "crd/disaggdeployments.disagg.dev")
    cluster.wait_namespaces_gone()
    results = []
    with tempfile.TemporaryDirectory(prefix="bench-scale-") as d:
        if args.logs:
            args.logs.mkdir(parents=True, exist_ok=True)
            d = str(args.logs)
        for n in args.sizes:
            print(f"== N={n}{' (autoscaling)' if args.autoscaling else ''} ...", file=sys.stderr, flush=True)
            results.append(Run(cluster, n, args, Path(d)).run())
            if len(args.sizes) > 1:
                report(results[-1:])  # each size as soon as it is measured; all together below
                print(flush=True)
    report(results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
