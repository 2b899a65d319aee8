"""Run things as a ServiceAccount of the local cluster (for least-privilege RBAC tests).

`sa_kubeconfig(cluster, ns, sa)` writes a kubeconfig that authenticates as
system:serviceaccount:<ns>:<sa> with a bound token from `kubectl create token`
and the cluster's server and CA. A bearer token works with every client
(kubectl, kubernetes_asyncio, Kopf). The kubeconfig `as:` impersonation field
is not used: kubectl honours it, but the kubeconfig loaders of
kubernetes_asyncio (36) and Kopf (1.45) ignore it.

Reuse: the autoscaler tests run `disagg run --kubeconfig <path>` with it to show
scale-up and drain work with exactly the chart's permissions.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

# Lines of an operator log that mean the API refused a request for lack of permission.
# A refused call: "403" as an HTTP status (not the milliseconds of a log timestamp such as
# "16:31:46,403") or the word Forbidden.
FORBIDDEN_LOG = re.compile(r"(?<![,.:\d])\b403\b(?![,.:]\d)|forbidden", re.IGNORECASE)


def sa_kubeconfig(
    cluster: Any, ns: str, sa: str, directory: str | Path | None = None, duration: str = "2h"
) -> str:
    """Write a kubeconfig for ServiceAccount `ns/sa` and return its path."""
    token = cluster.kubectl("create", "token", sa, "-n", ns, f"--duration={duration}").stdout.strip()
    assert token, f"no token for serviceaccount {ns}/{sa}"
    admin = json.loads(cluster.kubectl("config", "view", "--minify", "--raw", "-o", "json").stdout)
    server = admin["clusters"][0]["cluster"]
    cluster_entry = {"server": server["server"]}
    for key in ("certificate-authority-data", "certificate-authority", "insecure-skip-tls-verify"):
        if key in server:
            cluster_entry[key] = server[key]
    name = f"sa-{ns}-{sa}"
    cfg = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": name, "cluster": cluster_entry}],
        "users": [{"name": name, "user": {"token": token}}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": name, "namespace": ns}}],
        "current-context": name,
    }
    out_dir = Path(directory) if directory else Path(tempfile.mkdtemp(prefix="disagg-sa-"))
    path = out_dir / f"{name}.kubeconfig"
    path.write_text(yaml.safe_dump(cfg))
    path.chmod(0o600)
    return str(path)


def kubectl_as(
    cluster: Any, kubeconfig: str, *args: str, check: bool = False
) -> subprocess.CompletedProcess[str]:
    """kubectl with another kubeconfig (e.g. one from `sa_kubeconfig`)."""
    proc = subprocess.run(
        [str(cluster.bin / "kubectl"), f"--kubeconfig={kubeconfig}", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"kubectl {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr}")
    return proc


def start_operator(
    kubeconfig: str, namespaces: list[str], log_path: str | Path, *extra: str
) -> subprocess.Popen[bytes]:
    """Start `disagg run` with `kubeconfig`, endpoints disabled, logging to `log_path`.

    Stop it with `stop_operator`.
    """
    args = [sys.executable, "-m", "disagg.cli", "run", "--kubeconfig", kubeconfig]
    for ns in namespaces:
        args += ["--namespace", ns]
    args += ["--metrics-port", "0", "--dashboard-port", "0", "--liveness-port", "0", *extra]
    log = open(log_path, "wb")  # noqa: SIM115 - handed to the child, closed by stop_operator
    proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
    proc._disagg_log = log  # type: ignore[attr-defined]
    return proc


def stop_operator(proc: subprocess.Popen[bytes], timeout: float = 20) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
    log = getattr(proc, "_disagg_log", None)
    if log:
        log.close()


def forbidden_lines(log_text: str) -> list[str]:
    return [line for line in log_text.splitlines() if FORBIDDEN_LOG.search(line)]
