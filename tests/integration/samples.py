"""The shipped sample DisaggDeployments, as the cluster tests apply them."""

from __future__ import annotations

from pathlib import Path

import yaml

SAMPLES = Path(__file__).resolve().parents[2] / "config" / "samples"


def load(name: str) -> dict:
    return yaml.safe_load((SAMPLES / name).read_text())


def fixed(name: str = "sglang-disaggregated.yaml", prefill: int = 1, decode: int = 2) -> dict:
    """A sample with autoscaling off and explicit pool sizes (bounds widened to admit them)."""
    obj = load(name)
    obj["spec"]["autoscaling"] = {"enabled": False}
    for pool, n in (("prefill", prefill), ("decode", decode)):
        spec = obj["spec"]["pools"][pool]
        spec["replicas"] = n
        spec["minReplicas"] = min(spec.get("minReplicas", 1), n)
        spec["maxReplicas"] = max(spec.get("maxReplicas", n), n + 2)
    return obj
