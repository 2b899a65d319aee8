"""A Kubernetes policy scanner (checkov) on the rendered chart: every finding is justified.

checkov is not a dependency of the package (it pins many packages of its own): hack/checkov.sh
installs the version pinned in hack/checkov-constraints.txt into a cached virtual environment
(`hack/prereqs.sh test`, so `make test` and CI, do so first), and the test runs that one, or $DISAGG_CHECKOV when set.
Without it the test FAILS, naming the command that installs it; only `make test-unit`
(DISAGG_ALLOW_MISSING_PREREQS=1) skips it (tests/prereqs.py).
It runs with --skip-download and, where possible, in a network namespace of its own
(`unshare -n`), so the scanner sends nothing anywhere.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from prereqs import missing_prerequisite

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "disagg-operator"
README = CHART / "README.md"

#: Findings the chart keeps on purpose; each id must be explained in the chart README.
JUSTIFIED = {
    "CKV_K8S_38": "the operator talks to the API server: it needs its ServiceAccount token",
    "CKV_K8S_43": "image.digest pins the image; the chart cannot know the digest of a future build",
    "CKV_K8S_15": "IfNotPresent is exact with a digest; set pullPolicy Always with a moving tag",
}


def checkov() -> str:
    """The pinned checkov (hack/checkov.sh), or $DISAGG_CHECKOV; missing: fail (or skip, see above)."""
    path = (
        os.environ.get("DISAGG_CHECKOV")
        or subprocess.run(
            [str(ROOT / "hack" / "checkov.sh"), "--print"], capture_output=True, text=True, check=True
        ).stdout.strip()
    )
    if not (path and os.access(path, os.X_OK)):
        missing_prerequisite(
            f"checkov at {path} (the chart's policy scanner: run hack/checkov.sh or `make checkov`)"
        )
    return path


def tools_bin() -> Path:
    out = subprocess.run([str(ROOT / "hack" / "tools.sh"), "--print"], capture_output=True, text=True)
    return Path(out.stdout.strip())


def findings(rendered_dir: Path) -> list[tuple[str, str]]:
    cmd = [
        checkov(),
        "-d",
        str(rendered_dir),
        "--framework",
        "kubernetes",
        "--skip-download",
        "--quiet",
        "--compact",
        "-o",
        "json",
    ]
    if shutil.which("unshare") and subprocess.run(["unshare", "-n", "true"]).returncode == 0:
        cmd = ["unshare", "-n", *cmd]
    env = {**os.environ, "BC_SKIP_MAPPING": "TRUE"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    report = json.loads(proc.stdout)
    reports = report if isinstance(report, list) else [report]
    out = []
    for r in reports:
        assert r["summary"]["parsing_errors"] == 0, r["summary"]
        assert r["summary"]["passed"] > 50  # the scanner really checked the manifests
        out += [(f["check_id"], f["resource"]) for f in r["results"]["failed_checks"]]
    return out


@pytest.mark.parametrize(
    "values",
    [[], ["-f", str(CHART / "ci" / "all-on-values.yaml")], ["--set", "image.digest=sha256:" + "0" * 64]],
    ids=["default", "all-on", "digest"],
)
def test_every_policy_finding_is_justified(tmp_path, values):
    helm = tools_bin() / "helm"
    if not helm.exists():
        missing_prerequisite("helm (built by hack/tools.sh with the other cluster tools)")
    rendered = subprocess.run(
        [str(helm), "template", "rel", str(CHART), "--namespace", "ops", *values],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    (tmp_path / "chart.yaml").write_text(rendered)
    found = findings(tmp_path)
    unexplained = [f for f in found if f[0] not in JUSTIFIED]
    assert not unexplained, unexplained
    if "--set" in values:  # pinned by digest: that finding is gone
        assert "CKV_K8S_43" not in {c for c, _ in found}


def test_justifications_are_in_the_chart_readme():
    text = README.read_text()
    for check_id in JUSTIFIED:
        assert check_id in text, f"{check_id} is not explained in {README.name}"
