"""The pure core imports neither Kopf, nor a Kubernetes client, nor an HTTP library.

Each pure module is imported in a fresh interpreter and the set of loaded
modules is checked, so transitive imports count too. A static scan of the
source files catches imports hidden inside functions.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[2] / "operator" / "disagg"

# The pure core: models, queueing, planner, policy, builders, metrics parsing, simulator.
PURE = [
    "disagg.api",
    "disagg.model",
    "disagg.queueing",
    "disagg.planner",
    "disagg.policy",
    "disagg.builders",
    "disagg.metrics",
    "disagg.drain",
    "disagg.sim",
    "disagg.workload",
    "disagg.crdgen",
    "disagg.status",
    "disagg.calibration",
    "disagg.evaluate",
    "disagg.yardstick",
    "disagg.baselines",
    "disagg.forecast",
    "disagg.dashboard.history",
    "disagg.autoscaler",
    "disagg.names",
    "disagg.scrapeconfig",
    "disagg.sizes",
    "disagg.burstiness",
    "disagg.routers",
    "disagg.worked_example",
    "disagg.cache",
    "disagg.workqueue",
    "disagg.shard",
    "disagg.monotone",
]
# Modules that must exist for the contract to mean something.
REQUIRED = {
    "disagg.api",
    "disagg.model",
    "disagg.queueing",
    "disagg.planner",
    "disagg.policy",
    "disagg.builders",
    "disagg.metrics",
    "disagg.drain",
    "disagg.sim",
    "disagg.workload",
    "disagg.status",
    "disagg.autoscaler",
    "disagg.names",
    "disagg.scrapeconfig",
}
FORBIDDEN = (
    "kopf",
    "kubernetes",
    "kubernetes_asyncio",
    "aiohttp",
    "requests",
    "urllib3",
    "httpx",
    "prometheus_api_client",
    "http.client",
)


def module_files(name: str) -> list[Path]:
    rel = Path(*name.split(".")[1:])
    pkg = PKG / rel
    if pkg.is_dir():
        return sorted(pkg.rglob("*.py"))
    f = PKG / rel.with_suffix(".py")
    return [f] if f.exists() else []


PRESENT = [m for m in PURE if module_files(m)]


def test_required_pure_modules_exist():
    assert set(PRESENT) >= REQUIRED, f"missing pure modules: {REQUIRED - set(PRESENT)}"


@pytest.mark.parametrize("module", PRESENT)
def test_pure_module_loads_no_adapter_library(module):
    code = (
        "import importlib, json, sys\n"
        f"importlib.import_module({module!r})\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = json.loads(out.stdout)
    bad = sorted(m for m in loaded if any(m == f or m.startswith(f + ".") for f in FORBIDDEN))
    assert not bad, f"{module} loads {bad}"


@pytest.mark.parametrize("module", PRESENT)
def test_pure_module_source_has_no_adapter_import(module):
    for path in module_files(module):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            for n in names:
                assert not any(n == f or n.startswith(f + ".") for f in FORBIDDEN), (
                    f"{path.name}:{node.lineno} imports {n}"
                )
