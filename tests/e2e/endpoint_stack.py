"""The closed loop through the endpoint: the e2e Stack plus the HTTP emulated fleet, the operator's
router (the real binary) and the load generator (aiperf) as the client.

The router runs as a process here (KWOK pods run nothing) with the flags of the Deployment the
operator built, authenticated as the router's own ServiceAccount, listening on its pod's IP
(loopback, inside the cluster's pod CIDR) on the router port: where the operator's drain reaches
it for routers that need the removal API (SGLang; docs/router.md). The endpoint is
http://<router pod IP>:8000/v1. Everything binds and targets 127.0.0.0/8.
"""

from __future__ import annotations

import ipaddress
import subprocess
import sys
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
            self.proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=loadgen.environment())

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

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class EndpointStack(Stack):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.router: Proc | None = None
        self.router_args: list[str] = []
        self.engine = "vllm"
        self.endpoint = ""
        self.loads: list[LoadRun] = []

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

    def router_pod_ip(self) -> str | None:
        pods = self.cluster.get_json("pods", "-n", self.ns, "-l", f"disagg.dev/router={self.name}")["items"]
        running = [p for p in pods if p["status"].get("phase") == "Running" and p["status"].get("podIP")]
        return running[0]["status"]["podIP"] if running else None

    def start_router(self, engine: str) -> str:
        """The operator's router for this deployment; returns the endpoint (…/v1)."""
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
        ip = self.cluster.wait_for(self.router_pod_ip, timeout=60, what="the router pod's IP")
        if ipaddress.ip_address(ip) not in LOOPBACK:
            missing_prerequisite(
                f"a local cluster with loopback pod IPs, not {ip} (hack/cluster.sh down && up)"
            )
        dep = self.cluster.get_json("deployment", rname, "-n", self.ns)
        args = list(dep["spec"]["template"]["spec"]["containers"][0]["args"])
        for flag, value in (
            ("--host", ip),
            ("--port", str(routers.ROUTER_HTTP_PORT)),
            ("--prometheus-host", ip),
            ("--prometheus-port", str(free_port())),
        ):
            args[args.index(flag) + 1] = value
        self.router_args = args
        self.kubeconfig_router = sa_kubeconfig(self.cluster, self.ns, rname, self.tmp)
        self.endpoint = f"http://{ip}:{routers.ROUTER_HTTP_PORT}/v1"
        self.restart_router()
        return self.endpoint

    def restart_router(self) -> None:
        if self.router is not None:
            self.router.stop()
        p = routers.preset(self.engine)
        env = dict(self.cluster.env(), KUBECONFIG=self.kubeconfig_router)
        n = len(list(self.tmp.glob("router*.log")))
        self.router = Proc(
            [str(router_binary(self.engine)), *p.subcommand, *self.router_args],
            self.tmp / f"router{n}.log",
            env,
        )

    def router_workers(self) -> list[dict]:
        status, body = http_json(f"{self.endpoint[: -len('/v1')]}/workers", timeout=3)
        return body.get("workers", []) if status == 200 and isinstance(body, dict) else []

    def wait_router_workers(self, n: int, timeout: float = 90) -> None:
        wait_until(lambda: len(self.router_workers()) >= n, timeout, f"the router to list {n} workers")

    def start_load(self, **kwargs) -> LoadRun:
        n = len(self.loads)
        art = self.tmp / f"aiperf{n}"
        run = LoadRun(loadgen.Load(self.endpoint, art, **kwargs), self.tmp / f"aiperf{n}.log")
        self.loads.append(run)
        return run

    def close(self) -> None:
        for run in self.loads:
            run.stop()
        if self.router is not None:
            self.router.stop()
            self.router = None

    def debug(self) -> str:
        out = [super().debug()]
        for log in sorted(self.tmp.glob("router*.log")):
            out.append(f"{log.name}: " + log.read_text(errors="replace")[-1500:])
        return "\n----\n".join(out)


__all__ = ["DRAIN_TIMEOUT_S", "EndpointStack", "LoadRun", "endpoint_spec", "needs_tools"]
