"""The closed loop through the endpoint: the e2e Stack plus the HTTP emulated fleet, the operator's
router (the real binary) and the load generator (aiperf) as the client.

The router runs as a process here (KWOK pods run nothing) with the flags of the Deployment the
operator built, authenticated as the router's own ServiceAccount, listening on its pod's IP
(loopback, inside the cluster's pod CIDR) on the router port: where the operator's drain reaches
it for routers that need the removal API (SGLang; docs/router.md). The endpoint is
http://<router pod IP>:8000/v1. Everything binds and targets 127.0.0.0/8.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import itertools
import json
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from e2e_stack import DRAIN_TIMEOUT_S, Stack, deployment_spec, free_port

from disagg import loadgen, routers
from prereqs import missing_prerequisite

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))
from rbac_util import sa_kubeconfig
from router_util import Proc, http_json, router_binary, wait_until

LOOPBACK = ipaddress.ip_network("127.0.0.0/8")
#: The longest the emulated fleet runs (a bound; the tests stop it when they are done).
EMULATOR_BOUND_S = 900


def endpoint_spec(prom_url: str, engine: str, **autoscaling) -> dict:
    """deployment_spec for `engine` (vllm or sglang), every request served through the router."""
    obj = deployment_spec(prom_url, **autoscaling)
    obj["spec"]["engine"] = engine
    for pool in obj["spec"]["pools"].values():
        pool["template"]["spec"]["containers"][0]["name"] = engine
    return obj


def needs_tools(engine: str) -> None:
    if router_binary(engine) is None:
        missing_prerequisite(f"the {engine} router (hack/routers.sh installs the pinned one)")
    if not loadgen.installed():
        missing_prerequisite(f"the load generator {loadgen.PACKAGE} {loadgen.VERSION} (hack/loadgen.sh)")


class LoadRun:
    """aiperf as a subprocess, writing into `artifacts`; stopped by its own handle."""

    def __init__(self, load: loadgen.Load, log: Path) -> None:
        self.load = load
        self.log_path = log
        cmd = load.prepare()
        with open(log, "w") as fh:
            self.proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=load.environment())

    def wait(self, timeout: float) -> dict:
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.stop()
            raise AssertionError(f"aiperf still running after {timeout} s:\n{self.tail()}") from None
        assert rc == 0, f"aiperf exited {rc}:\n{self.tail()}"
        return loadgen.read_results(self.load.artifact_dir, self.load.output_tokens)

    def check(self) -> None:
        """Fail at once when aiperf has exited with an error (rather than at a later timeout)."""
        rc = self.proc.poll()
        if rc not in (None, 0):
            raise AssertionError(f"aiperf exited {rc}:\n{self.tail()}")

    def tail(self) -> str:
        return self.log_path.read_text(errors="replace")[-3000:]

    def results_by_window(self, kill_ns: int, ready_ns: int) -> dict[str, dict]:
        """The client's view (loadgen.read_results) of the requests by when they started against
        a router restart: `before` (ended before the kill), `in_flight` (started before the kill,
        ended after it), `outage` (started between the kill and the new router's readiness),
        `after` (started once the new router was Ready). Times are wall-clock nanoseconds, the
        clock of aiperf's records."""
        src = self.load.artifact_dir / loadgen.RECORDS_FILE
        windows: dict[str, list[str]] = {"before": [], "in_flight": [], "outage": [], "after": []}
        for line in src.read_text().splitlines():
            if not line.strip():
                continue
            meta = json.loads(line).get("metadata") or {}
            start = meta.get("request_start_ns") or meta.get("credit_issued_ns")
            end = meta.get("request_end_ns")
            if start is None:
                raise AssertionError(f"an aiperf record without a start time: {line[:300]}")
            if start >= ready_ns:
                key = "after"
            elif start >= kill_ns:
                key = "outage"
            elif end is not None and end < kill_ns:
                key = "before"
            else:
                key = "in_flight"
            windows[key].append(line)
        out = {}
        for key, lines in windows.items():
            d = self.load.artifact_dir / f"window-{key}"
            d.mkdir(exist_ok=True)
            (d / loadgen.RECORDS_FILE).write_text("\n".join(lines) + "\n")
            out[key] = loadgen.read_results(d, self.load.output_tokens)
        return out

    def failures(self) -> list[dict]:
        """The failed requests: the error's type and message, and when the request started
        (wall-clock ns)."""
        out = []
        for line in (self.load.artifact_dir / loadgen.RECORDS_FILE).read_text().splitlines():
            record = json.loads(line) if line.strip() else {}
            if record.get("error"):
                meta = record.get("metadata") or {}
                out.append(
                    {
                        "type": record["error"].get("type"),
                        "message": record["error"].get("message"),
                        "start_ns": meta.get("request_start_ns") or meta.get("credit_issued_ns"),
                    }
                )
        return out

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class ServiceProxy:
    """The router's Service, as a client reaches it, on loopback: one fixed address that forwards
    each new connection to one of the router pods that are Ready now, in turn (kube-proxy's job;
    the local cluster runs none, and a router pod's IP changes when the pod is replaced). With no
    Ready router a new connection is closed at once: the client sees a reset connection
    (kube-proxy would reject it, so a refused one). A connection keeps the router it was
    forwarded to, as with conntrack."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", free_port()))
        self.sock.listen(256)
        self.sock.settimeout(0.5)
        self.address = self.sock.getsockname()
        #: The Ready routers' addresses: the Service's endpoints.
        self.backends: list[tuple[str, int]] = []
        #: Connections forwarded, per router address.
        self.forwarded_to: dict[tuple[str, int], int] = {}
        self.closed_without_router = 0
        self._turn = itertools.count()
        self._count_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="service-proxy", daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://{self.address[0]}:{self.address[1]}"

    @property
    def forwarded(self) -> int:
        return sum(self.forwarded_to.values())

    def add_backend(self, address: tuple[str, int]) -> None:
        if address not in self.backends:
            self.backends = [*self.backends, address]

    def remove_backend(self, address: tuple[str, int]) -> None:
        self.backends = [b for b in self.backends if b != address]

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self._forward, args=(conn,), daemon=True).start()

    def _forward(self, conn: socket.socket) -> None:
        backends = self.backends  # replaced, never mutated: a consistent snapshot
        try:
            if not backends:
                raise OSError("no Ready router")
            backend = backends[next(self._turn) % len(backends)]
            upstream = socket.create_connection(backend, timeout=5)
        except OSError:
            self.closed_without_router += 1
            conn.close()
            return
        with self._count_lock:
            self.forwarded_to[backend] = self.forwarded_to.get(backend, 0) + 1
        upstream.settimeout(None)
        back = threading.Thread(target=self._pump, args=(upstream, conn), daemon=True)
        back.start()
        self._pump(conn, upstream)
        back.join()
        conn.close()
        upstream.close()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        try:
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    def close(self) -> None:
        self._stop.set()
        self.sock.close()
        self._thread.join(5)


def retrying_openai_request(endpoint: str, prompt_tokens: int, output_tokens: int, max_retries: int) -> dict:
    """One streaming chat completion with the openai SDK's own retries (connection errors, 408,
    409, 429 and 5xx before the response starts, with exponential back-off): what an SDK user
    sees. Returns {"ok", "completion_tokens", "error", "seconds"}."""
    import openai

    client = openai.OpenAI(base_url=endpoint, api_key="unused", max_retries=max_retries, timeout=120)
    t0 = time.monotonic()
    tokens = None
    try:
        stream = client.chat.completions.create(
            model="emulated",
            messages=[{"role": "user", "content": " ".join(["word"] * prompt_tokens)}],
            max_tokens=output_tokens,
            stream=True,
            stream_options={"include_usage": True},
        )
        for chunk in stream:
            if chunk.usage is not None:
                tokens = chunk.usage.completion_tokens
    except openai.OpenAIError as exc:
        return {
            "ok": False,
            "completion_tokens": tokens,
            "error": repr(exc)[:300],
            "seconds": time.monotonic() - t0,
        }
    ok = tokens == output_tokens
    return {"ok": ok, "completion_tokens": tokens, "error": None, "seconds": time.monotonic() - t0}


@dataclasses.dataclass
class RouterRun:
    """One router pod's process: the real binary with the Deployment's flags, listening on the
    pod's IP, authenticated as the router's ServiceAccount."""

    pod: str
    ip: str
    proc: Proc
    probe: dict

    @property
    def address(self) -> tuple[str, int]:
        return (self.ip, routers.ROUTER_HTTP_PORT)

    @property
    def url(self) -> str:
        return f"http://{self.ip}:{routers.ROUTER_HTTP_PORT}"

    def passes_probe(self) -> bool:
        """The pod's readinessProbe, as the kubelet would run it against the process."""
        if "httpGet" in self.probe:
            status, _ = http_json(f"{self.url}{self.probe['httpGet'].get('path', '/')}", timeout=2)
            return 200 <= status < 400
        try:
            socket.create_connection(self.address, timeout=2).close()
        except OSError:
            return False
        return True


class EndpointStack(Stack):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        #: The router processes that serve, in the order they started.
        self.routers: list[RouterRun] = []
        #: Routers whose pod was deleted (SIGTERM sent; close() reaps them).
        self.stopped_routers: list[RouterRun] = []
        self.engine = "vllm"
        self.endpoint = ""
        self.kubeconfig_router = ""
        self.service: ServiceProxy | None = None
        self.loads: list[LoadRun] = []
        #: Labels of the routers' scrape jobs (each router is scraped once it runs).
        self.scrape_labels: dict[str, dict[str, str]] = {}

    def start_serving_emulator(self) -> subprocess.Popen:
        """The HTTP fleet, no load of its own: every request comes through the endpoint. It runs
        until stop_emulator (EMULATOR_BOUND_S at most)."""
        return self.start_emulator(
            "--serve", "--rate", "0", "--engine", "auto", "--duration", str(EMULATOR_BOUND_S)
        )

    def stop_emulator(self) -> dict:
        """Stop the emulated fleet (SIGTERM) and return the summary it writes."""
        assert self.emulator is not None
        self.emulator.terminate()
        return self.wait_emulator(timeout=60)

    def router_pods(self) -> list[dict]:
        """The Running router pods with an IP that are not being deleted."""
        pods = self.cluster.get_json("pods", "-n", self.ns, "-l", f"disagg.dev/router={self.name}")["items"]
        return [
            p
            for p in pods
            if p["status"].get("phase") == "Running"
            and p["status"].get("podIP")
            and not p["metadata"].get("deletionTimestamp")
        ]

    def start_router(self, engine: str, via_service: bool = False, replicas: int = 1) -> str:
        """The operator's router for this deployment, as `replicas` processes (one per router pod);
        returns the endpoint (…/v1): the first router pod's own address, or with `via_service` the
        ServiceProxy's, which forwards to every Ready router pod across restarts."""
        self.engine = engine
        rname = f"{self.name}-router"
        for kind in ("serviceaccount", "role", "rolebinding", "deployment"):
            self.cluster.wait_for(
                lambda k=kind: (
                    self.cluster.kubectl("get", k, rname, "-n", self.ns, check=False).returncode == 0
                ),
                timeout=60,
                what=f"{kind}/{rname}",
            )
        pods = self.cluster.wait_for(
            lambda: (p := self.router_pods()) and len(p) >= replicas and p,
            timeout=60,
            what=f"{replicas} router pods with an IP",
        )
        self.kubeconfig_router = sa_kubeconfig(self.cluster, self.ns, rname, self.tmp)
        for pod in pods[:replicas]:
            self._launch_router(pod)
        if via_service:
            self.service = ServiceProxy()
            for run in self.routers:
                self.wait_router_ready(run)
            self.endpoint = f"{self.service.url}/v1"
        else:
            self.endpoint = f"{self.routers[0].url}/v1"
        return self.endpoint

    def _launch_router(self, pod: dict) -> RouterRun:
        """Run the router as `pod` would: the Deployment's flags, listening on the pod's IP."""
        ip = pod["status"]["podIP"]
        if ipaddress.ip_address(ip) not in LOOPBACK:
            missing_prerequisite(
                f"a local cluster with loopback pod IPs, not {ip} (hack/cluster.sh down && up)"
            )
        dep = self.cluster.get_json("deployment", f"{self.name}-router", "-n", self.ns)
        container = dep["spec"]["template"]["spec"]["containers"][0]
        args = list(container["args"])
        metrics_port = free_port()
        for flag, value in (
            ("--host", ip),
            ("--port", str(routers.ROUTER_HTTP_PORT)),
            ("--prometheus-host", ip),
            ("--prometheus-port", str(metrics_port)),
        ):
            args[args.index(flag) + 1] = value
        p = routers.preset(self.engine)
        env = dict(self.cluster.env(), KUBECONFIG=self.kubeconfig_router)
        n = len(list(self.tmp.glob("router*.log")))
        proc = Proc([str(router_binary(self.engine)), *p.subcommand, *args], self.tmp / f"router{n}.log", env)
        run = RouterRun(pod["metadata"]["name"], ip, proc, container.get("readinessProbe") or {})
        self.routers.append(run)
        self._scrape_router(run, metrics_port)
        return run

    def _scrape_router(self, run: RouterRun, metrics_port: int) -> None:
        """Have the test's Prometheus scrape the router's metrics port with the `namespace` and
        `pod` labels a PodMonitor's scrape gives them (the autoscaler's router queries select on
        both), beside the emulated fleet."""
        job = f"router-{run.pod}"
        self.scrape_targets[job] = [f"{run.ip}:{metrics_port}"]
        self.scrape_labels[job] = {"namespace": self.ns, "pod": run.pod}
        self.prom.set_targets(self.scrape_targets, self.scrape_labels)

    def wait_router_ready(self, run: RouterRun, timeout: float = 90) -> int:
        """Wait until `run` passes its readiness probe; then (with the ServiceProxy) the Service
        sends it new connections. Returns the wall-clock time (ns) it became Ready."""
        wait_until(run.passes_probe, timeout, f"router {run.pod} to pass its readiness probe")
        ready_ns = time.time_ns()
        if self.service is not None:
            self.service.add_backend(run.address)
        return ready_ns

    def delete_router_pod(self, run: RouterRun | None = None) -> int:
        """Delete a router pod (the first by default) mid-load, as a user or an eviction would: the
        Service stops sending it new connections and the kubelet sends its process SIGTERM.
        Returns the wall-clock time (ns) of the kill."""
        run = run or self.routers[0]
        kill_ns = time.time_ns()
        if self.service is not None:
            self.service.remove_backend(run.address)
        self.cluster.kubectl("delete", "pod", run.pod, "-n", self.ns, "--wait=false")
        # SIGTERM without waiting: the old router shuts down (finishing its in-flight requests)
        # while the Deployment's new pod starts, as on a node; close() reaps it.
        run.proc.p.terminate()
        self.routers.remove(run)
        self.stopped_routers.append(run)
        return kill_ns

    def replace_router(self, timeout: float = 120) -> int:
        """The router pod the Deployment creates in place of a deleted one: run it and wait until
        it is Ready. Returns the wall-clock time (ns) it became Ready."""
        known = {r.pod for r in [*self.routers, *self.stopped_routers]}
        pod = self.cluster.wait_for(
            lambda: next((p for p in self.router_pods() if p["metadata"]["name"] not in known), None),
            timeout=timeout,
            what="the replacement router pod",
        )
        return self.wait_router_ready(self._launch_router(pod), timeout)

    def router_workers(self, run: RouterRun | None = None) -> list[dict]:
        status, body = http_json(f"{(run or self.routers[0]).url}/workers", timeout=3)
        return body.get("workers", []) if status == 200 and isinstance(body, dict) else []

    def wait_router_workers(self, n: int, timeout: float = 90) -> None:
        """Every running router lists at least `n` workers."""
        wait_until(
            lambda: all(len(self.router_workers(r)) >= n for r in self.routers),
            timeout,
            f"the routers to list {n} workers",
        )

    def start_load(self, **kwargs) -> LoadRun:
        n = len(self.loads)
        art = self.tmp / f"aiperf{n}"
        run = LoadRun(loadgen.Load(self.endpoint, art, **kwargs), self.tmp / f"aiperf{n}.log")
        self.loads.append(run)
        return run

    def close(self) -> None:
        for run in self.loads:
            run.stop()
        for run in [*self.stopped_routers, *self.routers]:
            run.proc.stop()
        self.routers = []
        if self.service is not None:
            self.service.close()
            self.service = None

    def debug(self) -> str:
        out = [super().debug()]
        for log in sorted(self.tmp.glob("router*.log")):
            out.append(f"{log.name}: " + log.read_text(errors="replace")[-1500:])
        return "\n----\n".join(out)


__all__ = [
    "DRAIN_TIMEOUT_S",
    "EndpointStack",
    "LoadRun",
    "RouterRun",
    "ServiceProxy",
    "endpoint_spec",
    "needs_tools",
    "retrying_openai_request",
]
