"""The router of a DisaggDeployment: spec.router, its manifests, its command line (docs/router.md)."""

from __future__ import annotations

import copy
import subprocess
from pathlib import Path

import pytest
import yaml

from disagg import api, builders, names, routers
from prereqs import missing_prerequisite

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = yaml.safe_load((ROOT / "config/samples/vllm-disaggregated-70b.yaml").read_text())
OWNER = builders.Owner(name="llama", namespace="serving", uid="u-1")
ROUTERS_DIR = Path.home() / ".cache/disagg-operator/routers"


def spec(**router) -> api.DisaggDeploymentSpec:
    s = copy.deepcopy(SAMPLE["spec"])
    if router:
        s["router"] = router
    return api.parse_spec(s)


def objects(s: api.DisaggDeploymentSpec) -> dict[str, dict]:
    return {o["kind"]: o for o in builders.router_objects(OWNER, s)}


def test_router_is_on_by_default_with_five_objects_named_after_the_deployment():
    objs = builders.router_objects(OWNER, spec())
    assert [o["kind"] for o in objs] == list(builders.ROUTER_KINDS)
    for o in objs:
        assert o["metadata"]["name"] == "llama-router"
        assert o["metadata"]["namespace"] == "serving"
        assert o["metadata"]["ownerReferences"][0]["uid"] == "u-1"
        # not a pool: the pool logic, drains and the emulator select pods by disagg.dev/deployment
        assert names.LABEL_DEPLOYMENT not in o["metadata"]["labels"]
        assert o["metadata"]["labels"][names.LABEL_ROUTER] == "llama"


def test_disabled_router_has_no_objects():
    assert builders.router_objects(OWNER, spec(enabled=False)) == []


def test_rbac_is_least_privilege_for_pod_discovery_in_the_namespace():
    o = objects(spec())
    assert o["Role"]["rules"] == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}
    ]
    binding = o["RoleBinding"]
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": "llama-router",
    }
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "llama-router", "namespace": "serving"}]
    pod = o["Deployment"]["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "llama-router"
    # discovery is namespaced, so the Role (not a ClusterRole) is enough
    args = pod["containers"][0]["args"]
    assert args[args.index("--service-discovery-namespace") + 1] == "serving"


def test_vllm_router_args_select_the_pools_by_the_operator_labels():
    c = objects(spec())["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    args = c["args"]
    assert "--vllm-pd-disaggregation" in args and "--service-discovery" in args
    i = args.index("--prefill-selector")
    assert args[i + 1 : i + 3] == ["disagg.dev/deployment=llama", "disagg.dev/pool=prefill"]
    i = args.index("--decode-selector")
    assert args[i + 1 : i + 3] == ["disagg.dev/deployment=llama", "disagg.dev/pool=decode"]
    port = builders._ports(spec(), "decode")[0]["port"]
    assert args[args.index("--service-discovery-port") + 1] == str(port)
    assert c["command"][:2] == ["sh", "-c"] and "vllm-router==0.1.17" in c["command"][2]
    assert c["image"] == routers.DEFAULT_ROUTER_IMAGE
    assert {p["containerPort"] for p in c["ports"]} == {routers.ROUTER_HTTP_PORT, routers.ROUTER_METRICS_PORT}


def test_sglang_router_uses_launch_and_its_pd_flag():
    s = copy.deepcopy(SAMPLE["spec"])
    s["engine"] = "sglang"
    c = objects(api.parse_spec(s))["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    assert "exec sglang-router launch" in c["command"][2] and "sglang-router==0.3.2" in c["command"][2]
    assert "--pd-disaggregation" in c["args"] and "--vllm-pd-disaggregation" not in c["args"]


def test_colocated_placement_balances_over_the_colocated_pool():
    s = yaml.safe_load((ROOT / "config/samples/colocated.yaml").read_text())["spec"]
    args = builders.router_args(OWNER, api.parse_spec(s))
    i = args.index("--selector")
    assert args[i + 1 : i + 3] == ["disagg.dev/deployment=llama", "disagg.dev/pool=colocated"]
    assert not any("pd-disaggregation" in a for a in args)


def test_image_replicas_resources_and_extra_args_come_from_the_spec():
    res = {"requests": {"cpu": "500m"}, "limits": {"memory": "1Gi"}}
    o = objects(
        spec(image="registry.local/vllm-router:0.1.17", replicas=2, resources=res, extraArgs=["--x", "1"])
    )
    d = o["Deployment"]
    c = d["spec"]["template"]["spec"]["containers"][0]
    assert d["spec"]["replicas"] == 2
    assert c["image"] == "registry.local/vllm-router:0.1.17"
    assert c["resources"] == res
    assert c["args"][-2:] == ["--x", "1"]
    assert o["Service"]["spec"]["selector"] == {names.LABEL_ROUTER: "llama"}
    assert o["Service"]["spec"]["ports"][0]["port"] == routers.ROUTER_HTTP_PORT


def test_bad_router_fields_are_refused():
    for bad in ({"replicas": -1}, {"extraArgs": "--x"}, {"image": ""}, {"unknown": 1}):
        with pytest.raises(ValueError):
            spec(**bad)


def test_unknown_engine_and_empty_selector_are_refused():
    with pytest.raises(ValueError, match="no router for engine"):
        routers.preset("trtllm")
    with pytest.raises(ValueError, match="at least one label"):
        routers.router_args("vllm", namespace="n", engine_port=8000, worker_selector={})
    with pytest.raises(ValueError, match="engine port"):
        routers.router_args("vllm", namespace="n", engine_port=0, worker_selector={"a": "b"})


def startup_check_values(args: list[str]) -> list[str]:
    flag = routers.WORKER_STARTUP_CHECK_FLAG
    return [args[i + 1] for i, a in enumerate(args) if a == flag] + [
        a.split("=", 1)[1] for a in args if a.startswith(flag + "=")
    ]


@pytest.mark.parametrize("engine", sorted(routers.PRESETS))
def test_worker_startup_check_is_one_second_by_default_and_extra_args_come_after_it(engine: str):
    s = copy.deepcopy(SAMPLE["spec"])
    s["engine"] = engine
    args = builders.router_args(OWNER, api.parse_spec(s))
    assert startup_check_values(args) == ["1"]
    # The user's value comes after the default: the routers' argparse keeps the last one.
    s["router"] = {"extraArgs": ["--worker-startup-check-interval", "7", "--policy", "round_robin"]}
    args = builders.router_args(OWNER, api.parse_spec(s))
    assert startup_check_values(args) == ["1", "7"]
    assert args.index("7") > args.index("1") and args[-4:] == s["router"]["extraArgs"]


@pytest.mark.parametrize("engine", sorted(routers.PRESETS))
def test_the_pinned_router_parses_the_operator_args(engine: str):
    """Cross-check with the real router's own argument parser (skipped if hack/routers.sh has not run)."""
    p = routers.preset(engine)
    venv = ROUTERS_DIR / f"{p.package}-{p.version}"
    if not (venv / "bin" / p.binary).exists():
        missing_prerequisite(f"{p.package} {p.version} (hack/routers.sh installs it)")
    s = copy.deepcopy(SAMPLE["spec"])
    s["engine"] = engine
    args = builders.router_args(OWNER, api.parse_spec(s))
    module = "vllm_router" if engine == "vllm" else "sglang_router"
    code = (
        f"import argparse, sys; from {module}.router_args import RouterArgs; "
        "ap = argparse.ArgumentParser(); RouterArgs.add_cli_args(ap); "
        "a = RouterArgs.from_cli_args(ap.parse_args(sys.argv[1:])); "
        "print(a.service_discovery, a.service_discovery_namespace, a.service_discovery_port, "
        "a.worker_startup_check_interval, "
        "sorted(a.prefill_selector.items()), sorted(a.decode_selector.items()))"
    )

    def parse(args: list[str]) -> list[str]:
        return subprocess.run(
            [str(venv / "bin/python"), "-c", code, *args],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout.split(" ", 4)

    out = parse(args)
    assert out[:4] == ["True", "serving", str(builders.engine_port(api.parse_spec(s))), "1"]
    assert "'disagg.dev/pool', 'prefill'" in out[4] and "'disagg.dev/pool', 'decode'" in out[4]
    # A user's extraArgs override the operator's default start-up check interval.
    s["router"] = {"extraArgs": ["--worker-startup-check-interval", "9"]}
    assert parse(builders.router_args(OWNER, api.parse_spec(s)))[3] == "9"


def test_endpoint_is_the_router_service_url_and_absent_without_a_router():
    assert builders.router_endpoint(OWNER, spec()) == "http://llama-router.serving:8000/v1"
    assert builders.router_endpoint(OWNER, spec(enabled=False)) is None


def test_router_is_ready_only_once_its_readiness_endpoint_says_it_can_route():
    """Not a TCP probe: the routers listen before discovery adds a worker (and answer 503 until
    then), so a replaced router pod would take requests it cannot serve."""
    c = objects(spec())["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    probe = c["readinessProbe"]
    assert probe["httpGet"] == {"path": "/readiness", "port": "http"}
    assert "tcpSocket" not in probe
    assert {"name": "http", "containerPort": routers.ROUTER_HTTP_PORT, "protocol": "TCP"} in c["ports"]
