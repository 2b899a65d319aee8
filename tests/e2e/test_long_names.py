"""The longest name the CRD admits autoscales: its pods' names are cut to 63 characters by
Kubernetes, and the PromQL selector still finds their series (issue 16, "Names")."""

from __future__ import annotations

import pytest
from e2e_stack import deployment_spec, planned

from disagg import api

pytestmark = [pytest.mark.cluster, pytest.mark.prometheus, pytest.mark.slow]

PROMPT, OUTPUT, RATE = 6000, 400, 6.0


def test_longest_allowed_name_reads_metrics_and_scales_up(stack):
    obj = deployment_spec(stack.prom.url)
    name = ("long-name-" + "x" * 60)[: api.MAX_NAME_LENGTH]
    obj["metadata"]["name"] = name
    stack.apply(obj)
    stack.start_operator()
    stack.wait_routable()
    pods = [p["metadata"]["name"] for p in stack.pods()]
    # Kubernetes cut the generated names: the old "<name>-<pool>-<hash>-<suffix>" selector missed these.
    assert pods and all(len(p) == 63 for p in pods), pods
    assert not any(p.startswith(f"{name}-decode-") for p in pods), pods  # cut inside "-decode-"
    stack.start_emulator(
        "--schedule", f"0:{RATE}", "--arrivals", "uniform", "--input-tokens", str(PROMPT),
        "--output-tokens", str(OUTPUT), "--duration", "90", "--seed", "7",
    )  # fmt: skip
    stack.cluster.wait_for(
        lambda: (stack.condition("MetricsAvailable") or {}).get("status") == "True",
        timeout=60,
        interval=1,
        what=f"metrics of a {len(name)}-character DisaggDeployment\n{stack.debug()}",
    )
    want = planned(obj, RATE, PROMPT, OUTPUT)
    stack.cluster.wait_for(
        lambda: all(stack.replicas().get(k, 0) >= v for k, v in want.items()),
        timeout=60,
        interval=1,
        what=f"pools at {want}\n{stack.debug()}",
    )
