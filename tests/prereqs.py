"""What the cluster, Prometheus and browser tests need outside Python, and what happens without it.

`make test` runs every test, so a missing prerequisite FAILS the tests that need it, with the
command that installs it (hack/prereqs.sh). Only with DISAGG_ALLOW_MISSING_PREREQS=1 (set by
`make test-unit`, for machines without them) are those tests skipped instead.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import NoReturn

import pytest

ALLOW_MISSING_ENV = "DISAGG_ALLOW_MISSING_PREREQS"
INSTALL_HINT = (
    "run hack/prereqs.sh (it installs what is missing with apt, or prints the command), "
    "or `make test-unit` for the pure tests only"
)


def missing_prerequisite(what: str) -> NoReturn:
    """Fail (or, with DISAGG_ALLOW_MISSING_PREREQS=1, skip) the current test: `what` is missing."""
    message = f"missing prerequisite: {what}; {INSTALL_HINT}"
    if os.environ.get(ALLOW_MISSING_ENV) == "1":
        pytest.skip(message)
    pytest.fail(message, pytrace=False)


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


def prometheus() -> str | None:
    return os.environ.get("DISAGG_PROMETHEUS_BIN") or shutil.which("prometheus")


def cluster_tools_missing(tools_bin: Path) -> str | None:
    """Why the local cluster cannot start, or None: its tools are built, or Go can build them."""
    if (tools_bin / "kwokctl").exists() and (tools_bin / "kube-apiserver").exists():
        return None
    if shutil.which("go") is None:
        return f"Go >= 1.24 (to build the local-cluster tools; they are not in {tools_bin})"
    return None
