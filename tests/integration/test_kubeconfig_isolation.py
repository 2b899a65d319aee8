"""The local-cluster script and the operator leave the user's kubeconfig alone.

* `hack/cluster.sh up` / `down` of a second cluster (own name and state directory, beside
  the session's cluster) keep every credential in that state directory: a ~/.kube/config
  in a temporary HOME, whose current context is some other cluster, is byte-identical
  afterwards, and the cluster works while the first one runs.
* `disagg run --kubeconfig FILE` logs Kopf in with FILE's credentials, not with
  ~/.kube/config's: it works with HOME pointing at an empty directory, works when
  ~/.kube/config names another cluster, and does nothing when FILE's token is bad even
  though ~/.kube/config holds the local cluster's admin credentials.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import yaml
from samples import fixed

pytestmark = pytest.mark.cluster

ROOT = Path(__file__).resolve().parents[2]
HACK = ROOT / "hack"

OTHER_CLUSTER_KUBECONFIG = """\
apiVersion: v1
kind: Config
clusters:
- name: somewhere-else
  cluster:
    server: https://127.0.0.1:9
    insecure-skip-tls-verify: true
users:
- name: someone
  user:
    token: not-for-this-cluster
contexts:
- name: somewhere-else
  context:
    cluster: somewhere-else
    user: someone
current-context: somewhere-else
"""


def fake_home(tmp_path: Path, kubeconfig_text: str | None) -> Path:
    home = tmp_path / "home"
    home.mkdir()
    if kubeconfig_text is not None:
        (home / ".kube").mkdir()
        (home / ".kube" / "config").write_text(kubeconfig_text)
    return home


def env_with_home(home: Path, cluster) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    env["HOME"] = str(home)
    # The tools stay where they were built; only the user's files move to the fake HOME.
    env["DISAGG_TOOLS_CACHE"] = str(cluster.bin.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT / "operator"), env.get("PYTHONPATH")) if p)
    return env


def test_second_cluster_leaves_home_kubeconfig_byte_identical(cluster, tmp_path):
    home = fake_home(tmp_path, OTHER_CLUSTER_KUBECONFIG)
    before = (home / ".kube" / "config").read_bytes()
    env = env_with_home(home, cluster)
    # Even a $KUBECONFIG naming the user's file must not be written by the script.
    env["KUBECONFIG"] = str(home / ".kube" / "config")
    env["DISAGG_CLUSTER_NAME"] = f"iso-{uuid.uuid4().hex[:6]}"
    env["DISAGG_STATE_DIR"] = str(tmp_path / "state")
    env["DISAGG_GPU_NODES"] = "1"
    try:
        up = subprocess.run(
            [str(HACK / "cluster.sh"), "up"], env=env, capture_output=True, text=True, timeout=600
        )
        assert up.returncode == 0, up.stderr
        kubeconfig = up.stdout.strip().splitlines()[-1]
        assert Path(kubeconfig).parent == tmp_path / "state"
        nodes = subprocess.run(
            [str(cluster.bin / "kubectl"), f"--kubeconfig={kubeconfig}", "get", "nodes", "-o", "name"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert nodes.stdout.split() == ["node/gpu-node-0"], nodes.stderr
        # The session's cluster still serves beside it.
        cluster.kubectl("get", "--raw", "/readyz")
        assert (home / ".kube" / "config").read_bytes() == before
        assert sorted(p.name for p in home.iterdir()) == [".kube"]
    finally:
        down = subprocess.run(
            [str(HACK / "cluster.sh"), "down"], env=env, capture_output=True, text=True, timeout=300
        )
    assert down.returncode == 0, down.stderr
    assert (home / ".kube" / "config").read_bytes() == before
    assert sorted(p.name for p in (home / ".kube").iterdir()) == ["config"]


def start_operator(cluster, home: Path, kubeconfig: str, namespace: str, log: Path) -> subprocess.Popen:
    args = [
        sys.executable,
        "-m",
        "disagg.cli",
        "run",
        "--kubeconfig",
        kubeconfig,
        "--namespace",
        namespace,
        "--metrics-port",
        "0",
        "--dashboard-port",
        "0",
        "--liveness-port",
        "0",
        "--no-autoscaler",
    ]
    with open(log, "ab") as out:
        return subprocess.Popen(
            args, stdout=out, stderr=subprocess.STDOUT, env=env_with_home(home, cluster), cwd=home
        )


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def apply_sample(cluster, namespace: str, name: str) -> None:
    obj = fixed()
    obj["metadata"]["name"] = name
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(obj))


def children(cluster, namespace: str, name: str) -> list[str]:
    out = cluster.kubectl(
        "get", "deployments", "-n", namespace, "-l", f"disagg.dev/deployment={name}", "-o", "name"
    )
    return sorted(out.stdout.split())


@pytest.mark.parametrize("home_kubeconfig", ["none", "other-cluster"])
def test_operator_uses_only_its_kubeconfig(cluster, crd, namespace, tmp_path, home_kubeconfig):
    home = fake_home(tmp_path, None if home_kubeconfig == "none" else OTHER_CLUSTER_KUBECONFIG)
    before = sorted(p.name for p in home.rglob("*"))
    log = tmp_path / "operator.log"
    proc = start_operator(cluster, home, cluster.kubeconfig, namespace, log)
    try:
        apply_sample(cluster, namespace, "login")
        cluster.wait_for(
            lambda: (
                children(cluster, namespace, "login")
                == ["deployment.apps/login-decode", "deployment.apps/login-prefill"]
                or proc.poll() is not None
            ),
            timeout=90,
            what="the operator's children",
        )
        assert proc.poll() is None, log.read_text(errors="replace")
    finally:
        stop(proc)
    assert sorted(p.name for p in home.rglob("*")) == before
    if home_kubeconfig == "other-cluster":
        assert (home / ".kube" / "config").read_text() == OTHER_CLUSTER_KUBECONFIG


def test_bad_kubeconfig_is_not_replaced_by_home_admin(cluster, crd, namespace, tmp_path):
    """FILE with a wrong token, ~/.kube/config = the cluster's admin: nothing is watched or written."""
    home = fake_home(tmp_path, Path(cluster.kubeconfig).read_text())
    bad = yaml.safe_load(Path(cluster.kubeconfig).read_text())
    for user in bad["users"]:
        user["user"] = {"token": "invalid-token"}
    bad_path = tmp_path / "bad.kubeconfig"
    bad_path.write_text(yaml.safe_dump(bad))
    log = tmp_path / "operator.log"
    proc = start_operator(cluster, home, str(bad_path), namespace, log)
    try:
        apply_sample(cluster, namespace, "badlogin")
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.5)
        assert children(cluster, namespace, "badlogin") == [], log.read_text(errors="replace")
        text = log.read_text(errors="replace")
        assert "401" in text or "Unauthorized" in text or "LoginError" in text, text
        # Kopf's watches did not receive the object: they did not log in as ~/.kube/config's admin.
        assert "on_disaggdeployment" not in text, text
    finally:
        stop(proc)
