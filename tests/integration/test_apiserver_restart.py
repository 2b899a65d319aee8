"""The API server restarts under a running operator: it re-watches and keeps reconciling."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from samples import fixed

pytestmark = pytest.mark.cluster


def cluster_bin_dir() -> Path:
    """Where kwokctl links the binaries of the cluster the tests use (hack/cluster.sh's settings),
    so that a second local cluster running beside it is never touched."""
    state = os.environ.get("DISAGG_STATE_DIR") or str(Path.home() / ".cache/disagg-operator/state")
    name = os.environ.get("DISAGG_CLUSTER_NAME") or "disagg"
    return Path(state) / "kwok" / "clusters" / name / "bin"


def component_pid(component: str) -> int | None:
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            argv0 = (d / "cmdline").read_bytes().split(b"\0")[0].decode()
        except OSError:
            continue
        if argv0 == str(cluster_bin_dir() / component):  # kwokctl's link to the cached binary
            return int(d.name)
    return None


def restart_apiserver(log: Path) -> None:
    """Stop the running kube-apiserver and start it again with the same command line."""
    pid = component_pid("kube-apiserver")
    assert pid, "no kube-apiserver process of the local cluster found"
    args = Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0").split(b"\0")
    cwd = os.readlink(f"/proc/{pid}/cwd")
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and Path(f"/proc/{pid}").exists():
        time.sleep(0.2)
    with open(log, "ab") as out:
        subprocess.Popen(
            [a.decode() for a in args], cwd=cwd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )


def test_operator_survives_an_api_server_restart(cluster, namespace, operator_factory, tmp_path):
    op = operator_factory([namespace])
    obj = fixed(decode=1)
    name = obj["metadata"]["name"]
    cluster.kubectl("apply", "--server-side", "-n", namespace, "-f", "-", input=json.dumps(obj))
    cluster.wait_for(
        lambda: len(cluster.get_json("deployments", "-n", namespace, "-l", "disagg.dev/pool")["items"]) == 2,
        timeout=30,
        what="pools",
    )

    restart_apiserver(tmp_path / "apiserver.log")
    cluster.wait_for(
        lambda: cluster.kubectl("get", "--raw", "/readyz", check=False).returncode == 0,
        timeout=60,
        what="the API server back",
    )

    # The rest of the control plane rode it out (hack/cluster.sh runs them without leader
    # election, which would make them exit when the API server goes away).
    for component in ("kube-controller-manager", "kube-scheduler", "kwok-controller", "etcd"):
        assert component_pid(component), f"{component} exited during the API-server restart"

    # A change made after the restart is applied: the operator's watches reconnected.
    obj["spec"]["pools"]["decode"]["replicas"] = 2
    cluster.kubectl("apply", "--server-side", "-n", namespace, "-f", "-", input=json.dumps(obj))
    cluster.wait_for(
        lambda: cluster.get_json("deployment", f"{name}-decode", "-n", namespace)["spec"]["replicas"] == 2,
        timeout=90,
        what=f"the decode pool follows a spec change after the restart\n{op.log()[-3000:]}",
    )
    assert op.proc is not None and op.proc.poll() is None, "the operator died with the API server"
