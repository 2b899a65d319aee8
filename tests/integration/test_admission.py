"""Admission of DisaggDeployments by the real API server.

The generated CRD is applied, then every sample in config/samples/ must be
accepted (`kubectl apply --server-side`) and every sample in
config/samples/invalid/ refused with the message of its `# expect:` line.
The children built by `disagg.builders` must pass server-side validation too.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from disagg import api, builders, crdgen

pytestmark = pytest.mark.cluster

ROOT = Path(__file__).resolve().parents[2]
CRD_FILE = ROOT / "crds" / crdgen.CRD_FILENAME
SAMPLES = sorted((ROOT / "config/samples").glob("*.yaml"))
INVALID = sorted((ROOT / "config/samples/invalid").glob("*.yaml"))


def expectation(path: Path) -> str:
    m = re.search(r"^# expect: (.+)$", path.read_text(), re.M)
    assert m, f"{path.name}: no '# expect:' line"
    return m.group(1).strip()


@pytest.fixture(scope="module")
def crd(cluster) -> str:
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD_FILE))
    cluster.wait_established(api.CRD_NAME)
    # Established can precede discovery by a moment; wait until the resource is served.
    cluster.wait_for(
        lambda: cluster.kubectl("get", api.PLURAL, "-A", check=False).returncode == 0,
        timeout=30,
        what="DisaggDeployment served",
    )
    return api.CRD_NAME


@pytest.fixture(scope="module")
def ns(cluster, crd) -> Iterator[str]:
    """One namespace for the whole module (samples have distinct names)."""
    name = f"t-admission-{uuid.uuid4().hex[:5]}"
    cluster.kubectl("create", "namespace", name)
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


def test_crd_established_with_names(cluster, crd):
    obj = cluster.get_json("crd", crd)
    conds = {c["type"]: c["status"] for c in obj["status"]["conditions"]}
    assert conds.get("Established") == "True"
    assert conds.get("NamesAccepted") == "True"
    assert "dd" in obj["status"]["acceptedNames"]["shortNames"]


@pytest.mark.parametrize("path", SAMPLES, ids=lambda p: p.name)
def test_valid_sample_accepted(cluster, ns, path: Path):
    proc = cluster.kubectl("apply", "--server-side", "-n", ns, "-f", str(path), check=False)
    assert proc.returncode == 0, f"{path.name} refused:\n{proc.stderr}"
    name = yaml.safe_load(path.read_text())["metadata"]["name"]
    stored = cluster.get_json(api.PLURAL, name, "-n", ns)
    spec = stored["spec"]
    # Server-side defaults are the model's defaults.
    assert spec["slo"]["percentile"] == pytest.approx(
        yaml.safe_load(path.read_text())["spec"].get("slo", {}).get("percentile", 0.9)
    )
    assert spec["autoscaling"]["intervalSeconds"] >= 5
    for pool in api.POOL_NAMES:
        if pool in spec["pools"]:
            assert "serviceModel" in spec["pools"][pool]
            assert spec["pools"][pool]["drain"]["timeoutSeconds"] >= 1
            assert spec["pools"][pool]["template"]["spec"]["containers"]  # not pruned
    # What the API server stored still validates with the models, unchanged by a round trip.
    parsed = api.parse_spec(spec)
    assert api.parse_spec(parsed.to_dict()) == parsed


@pytest.mark.parametrize("path", INVALID, ids=lambda p: p.name)
def test_invalid_sample_refused(cluster, ns, path: Path):
    expect = expectation(path)
    proc = cluster.kubectl("apply", "--server-side", "-n", ns, "-f", str(path), check=False)
    assert proc.returncode != 0, f"{path.name} was accepted"
    assert expect in proc.stderr, f"{path.name}: expected {expect!r} in:\n{proc.stderr}"


def test_status_subresource_and_printer_columns(cluster, ns):
    path = ROOT / "config/samples/multimodal-epd.yaml"
    cluster.kubectl("apply", "--server-side", "-n", ns, "-f", str(path))
    name = yaml.safe_load(path.read_text())["metadata"]["name"]
    status = {
        "status": {
            "observedGeneration": 1,
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "PoolsReady",
                    "message": "all pools ready",
                    "lastTransitionTime": "2026-01-01T00:00:00Z",
                    "observedGeneration": 1,
                }
            ],
            "pools": {
                "prefill": {"replicas": 2, "readyReplicas": 2, "desiredReplicas": 2},
                "decode": {"replicas": 5, "readyReplicas": 5, "desiredReplicas": 5, "drainingPods": []},
                "encoder": {"replicas": 1, "readyReplicas": 1, "desiredReplicas": 1},
            },
            "ratio": "1:2.5:0.5",
            "lastDecision": {
                "time": "2026-01-01T00:00:00Z",
                "reason": "ScaleUp",
                "inputs": {"arrivalRate": 4.2, "nested": {"list": [1, 2]}},
                "outputs": {"decode": 5},
            },
            "calibration": {"prefill": {"msPerToken": 0.031}},
        }
    }
    cluster.kubectl(
        "patch", api.PLURAL, name, "-n", ns, "--subresource=status", "--type=merge", "-p", json.dumps(status)
    )
    stored = cluster.get_json(api.PLURAL, name, "-n", ns)["status"]
    assert stored["lastDecision"]["inputs"]["nested"] == {"list": [1, 2]}  # free-form kept, not pruned
    assert stored["calibration"] == {"prefill": {"msPerToken": 0.031}}
    api.DisaggDeploymentStatus.model_validate(stored)
    table = cluster.kubectl("get", "dd", name, "-n", ns).stdout
    header, row = table.strip().splitlines()[:2]
    assert header.split()[:6] == ["NAME", "PREFILL", "DECODE", "ENCODER", "RATIO", "READY"]
    assert row.split()[:6] == [name, "2", "5", "1", "1:2.5:0.5", "True"]


def test_built_children_pass_server_validation(cluster, ns):
    """Deployments, Services and PDBs from disagg.builders are valid objects (server-side dry run)."""
    for path in SAMPLES:
        spec = api.parse_spec(yaml.safe_load(path.read_text())["spec"])
        owner = builders.Owner(name=path.stem[:40], namespace=ns, uid=str(uuid.uuid4()))
        objs = builders.all_objects(owner, spec)
        text = yaml.safe_dump_all(objs)
        proc = cluster.kubectl(
            "apply", "--server-side", "--dry-run=server", "-f", "-", input=text, check=False
        )
        assert proc.returncode == 0, f"{path.name}: children refused:\n{proc.stderr}"
