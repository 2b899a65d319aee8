"""What the cluster benchmarks share (bench_scale, bench_reconcile, bench_autoscaler): running
commands, the local cluster and its kubectl, loopback ports, the operator's command line and
process figures, and the DisaggDeployment they apply.

Imported by the scripts in this directory (run as `hack/bench/<name>.py`, so this directory is
on `sys.path`). Nothing here writes outside the repository, /tmp and the cluster's state
directory: kubectl's discovery cache goes next to the cluster's kubeconfig, never to ~/.kube.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT / "operator") not in sys.path:
    sys.path.insert(0, str(ROOT / "operator"))  # this checkout's `disagg`, not an installed one

# the benches' free_port; imported after the path above puts this checkout first
from disagg.devtools.prometheus import free_port  # noqa: E402, F401


def sh(
    *args: str,
    input: str | None = None,
    check: bool = True,
    timeout: float | None = None,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess:
    return subprocess.run(
        args, input=input, capture_output=True, text=True, check=check, timeout=timeout, env=env
    )


@functools.cache
def tools_bin() -> str:
    """The directory of the local cluster's tools (kubectl, kwokctl), built by hack/tools.sh."""
    return sh(str(ROOT / "hack/tools.sh"), "--print").stdout.strip()


def kubeconfig(env: dict[str, str] | None = None, timeout: float = 300) -> str:
    """The cluster's kubeconfig (DISAGG_CLUSTER_NAME and the rest from `env` or the
    environment); starts the cluster only when none runs, never restarts one."""
    cluster = str(ROOT / "hack/cluster.sh")
    if sh(cluster, "status", check=False, env=env).returncode == 0:
        return sh(cluster, "kubeconfig", env=env).stdout.strip()
    return sh(cluster, "up", timeout=timeout, env=env).stdout.strip().splitlines()[-1]


def kubectl(
    kc: str, *args: str, input: str | None = None, check: bool = True, timeout: float | None = 120
) -> subprocess.CompletedProcess:
    # kubectl's discovery cache goes next to the cluster's kubeconfig, never to ~/.kube
    env = {**os.environ, "KUBECACHEDIR": str(Path(kc).parent / "kube-cache")}
    return sh(
        f"{tools_bin()}/kubectl",
        f"--kubeconfig={kc}",
        *args,
        input=input,
        check=check,
        timeout=timeout,
        env=env,
    )


def code_env(kc: str) -> dict[str, str]:
    """The environment of a `python -m disagg.cli` child: this checkout's code, this cluster."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT / "operator") + os.pathsep + env.get("PYTHONPATH", "")
    env["KUBECONFIG"] = kc
    return env


def operator_cmd(kc: str, namespaces: list[str], metrics_port: int = 0, *extra: str) -> list[str]:
    """`disagg run` of this checkout watching `namespaces`, no dashboard, no liveness port."""
    cmd = [sys.executable, "-m", "disagg.cli", "run", "--kubeconfig", kc, "--metrics-port", str(metrics_port)]
    cmd += ["--dashboard-port", "0", "--liveness-port", "0"]
    for ns in namespaces:
        cmd += ["--namespace", ns]
    return [*cmd, *extra]


def rss_mib(pid: int) -> float:
    """Resident memory of a process (VmRSS), MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def cpu_seconds(pid: int) -> float:
    """CPU time a process has used so far (user + system, /proc/<pid>/stat), seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def stop(proc: subprocess.Popen | None, timeout: float = 15) -> None:
    """Stop one process this benchmark started, by its PID."""
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def disagg_deployment(
    name: str,
    pools: dict[str, dict[str, Any]],
    autoscaling: dict[str, Any] | None = None,
    model: str = "bench",
    slo: dict[str, Any] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    """A vLLM disaggregated DisaggDeployment; `spec` adds fields (router, ...)."""
    body: dict[str, Any] = {
        "engine": "vllm",
        "model": model,
        "placement": {"mode": "disaggregated"},
        "pools": pools,
    }
    if slo is not None:
        body["slo"] = slo
    body["autoscaling"] = autoscaling if autoscaling is not None else {"enabled": False}
    body.update(spec)
    return {
        "apiVersion": "disagg.dev/v1alpha1",
        "kind": "DisaggDeployment",
        "metadata": {"name": name},
        "spec": body,
    }
