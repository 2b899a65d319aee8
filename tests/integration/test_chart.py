"""The Helm chart: lint, render, schema, install/uninstall, and least-privilege RBAC.

Render tests need only the helm binary (hack/tools.sh). Cluster tests install
the chart into a fresh namespace of the local cluster; the operator pod itself
is simulated by KWOK (it is scheduled and reported Running but never executes),
so the RBAC test runs `disagg run` locally with the chart ServiceAccount's
token instead: whatever the operator needs must be granted by the chart, and
nothing more.
"""

from __future__ import annotations

import copy
import json
import subprocess
import time
import uuid
from pathlib import Path

import pytest
import yaml
from rbac_util import forbidden_lines, kubectl_as, sa_kubeconfig, start_operator, stop_operator

from disagg import api
from prereqs import missing_prerequisite

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "disagg-operator"
ALL_ON = CHART / "ci" / "all-on-values.yaml"
CRD_FILE = CHART / "crds" / "disagg.dev_disaggdeployments.yaml"
SAMPLE = ROOT / "config" / "samples" / "sglang-disaggregated.yaml"

# The permissions the operator needs (see charts/disagg-operator/templates/_helpers.tpl).
EXPECTED_RULES = {
    ("disagg.dev", "disaggdeployments"): {"get", "list", "watch"},
    ("disagg.dev", "disaggdeployments/status"): {"patch"},
    ("apps", "deployments"): {"list", "watch", "create", "patch", "delete"},
    ("", "services"): {"list", "watch", "create", "patch", "delete"},
    ("policy", "poddisruptionbudgets"): {"list", "watch", "create", "patch", "delete"},
    ("", "pods"): {"get", "list", "watch", "patch"},
    ("", "pods/status"): {"patch"},
    ("", "events"): {"create"},
    # each DisaggDeployment's router: its ServiceAccount and a pods-only Role (docs/router.md)
    ("", "serviceaccounts"): {"list", "create", "patch", "delete"},
    ("rbac.authorization.k8s.io", "roles"): {"list", "create", "patch", "delete"},
    ("rbac.authorization.k8s.io", "rolebindings"): {"list", "create", "patch", "delete"},
    # each DisaggDeployment's PodMonitor (podMonitors.enabled, the default)
    ("monitoring.coreos.com", "podmonitors"): {"list", "create", "patch", "delete"},
}
#: Only with prometheus.allowedUrls (per-object Prometheus credentials).
SECRETS_RULE = {("", "secrets"): {"get"}}

#: Where the operator uses each granted verb: (file under operator/disagg, code that does it).
#: "list"/"watch" of a kind are Kopf's watches (handlers.py) or the operator's own lists.
VERB_USES = {
    ("disaggdeployments", "get"): ("loop.py", "kube.get(api.KIND"),
    ("disaggdeployments", "list"): ("loop.py", "kube.list(api.KIND"),
    ("disaggdeployments", "watch"): ("handlers.py", "@kopf.on.event(api.GROUP, api.VERSION, api.PLURAL"),
    ("disaggdeployments/status", "patch"): ("reconcile.py", 'subresource="status"'),
    ("deployments", "list"): ("reconcile.py", "kube.list(k, namespace, sel)"),
    ("deployments", "watch"): ("handlers.py", '@kopf.on.event("apps", "v1", "deployments"'),
    ("deployments", "create"): ("reconcile.py", "await kube.apply(obj)"),
    ("deployments", "patch"): ("reconcile.py", "await kube.apply(obj)"),
    ("deployments", "delete"): ("reconcile.py", "await kube.delete(kind, ns"),
    ("services", "list"): ("loop.py", "cache.prime(kind, await kube.list(kind, ns, selector))"),
    ("services", "watch"): ("handlers.py", '@kopf.on.event("", "v1", "services"'),
    ("services", "create"): ("reconcile.py", "await kube.apply(obj)"),
    ("services", "patch"): ("reconcile.py", "await kube.apply(obj)"),
    ("services", "delete"): ("reconcile.py", "await kube.delete(kind, ns"),
    ("poddisruptionbudgets", "list"): ("loop.py", "cache.prime(kind, await kube.list(kind, ns, selector))"),
    ("poddisruptionbudgets", "watch"): ("handlers.py", '"policy", "v1", "poddisruptionbudgets", labels='),
    ("poddisruptionbudgets", "create"): ("reconcile.py", "await kube.apply(obj)"),
    ("poddisruptionbudgets", "patch"): ("reconcile.py", "await kube.apply(obj)"),
    ("poddisruptionbudgets", "delete"): ("reconcile.py", "await kube.delete(kind, ns"),
    ("pods", "get"): ("builders.py", '"resources": ["pods"], "verbs": ["get", "list", "watch"]'),
    ("pods", "list"): ("loop.py", 'kube.list("Pod"'),
    ("pods", "watch"): ("handlers.py", '@kopf.on.event("", "v1", "pods"'),
    ("pods", "patch"): ("loop.py", 'kube.patch("Pod"'),
    ("pods/status", "patch"): ("reconcile.py", 'subresource="status", patch_type="strategic"'),
    ("events", "create"): ("kube.py", 'resource_for("Event").path'),
    ("secrets", "get"): ("promclient.py", 'kube.get("Secret"'),
    ("serviceaccounts", "list"): ("reconcile.py", "kube.list(k, owner.namespace, sel)"),
    ("serviceaccounts", "create"): ("reconcile.py", "await kube.apply(obj)"),
    ("serviceaccounts", "patch"): ("reconcile.py", "await kube.apply(obj)"),
    ("serviceaccounts", "delete"): ("reconcile.py", "await kube.delete(kind, owner.namespace, name)"),
    ("roles", "list"): ("reconcile.py", "kube.list(k, owner.namespace, sel)"),
    ("roles", "create"): ("reconcile.py", "await kube.apply(obj)"),
    ("roles", "patch"): ("reconcile.py", "await kube.apply(obj)"),
    ("roles", "delete"): ("reconcile.py", "await kube.delete(kind, owner.namespace, name)"),
    ("rolebindings", "list"): ("reconcile.py", "kube.list(k, owner.namespace, sel)"),
    ("rolebindings", "create"): ("reconcile.py", "await kube.apply(obj)"),
    ("rolebindings", "patch"): ("reconcile.py", "await kube.apply(obj)"),
    ("rolebindings", "delete"): ("reconcile.py", "await kube.delete(kind, owner.namespace, name)"),
    ("podmonitors", "list"): ("reconcile.py", "kube.list(builders.POD_MONITOR_KIND"),
    ("podmonitors", "create"): ("reconcile.py", "await kube.apply(obj)"),
    ("podmonitors", "patch"): ("reconcile.py", "await kube.apply(obj)"),
    ("podmonitors", "delete"): ("reconcile.py", "await kube.delete(builders.POD_MONITOR_KIND"),
}


def tools_bin() -> Path:
    out = subprocess.run(
        [str(ROOT / "hack" / "tools.sh"), "--print"], capture_output=True, text=True, check=True
    )
    return Path(out.stdout.strip())


@pytest.fixture(scope="module")
def helm_bin() -> str:
    path = tools_bin() / "helm"
    if not path.exists():
        missing_prerequisite("helm (built by hack/tools.sh with the other cluster tools)")
    return str(path)


def helm(helm_bin: str, *args: str, env: dict | None = None, check: bool = True, timeout: float = 180):
    proc = subprocess.run([helm_bin, *args], capture_output=True, text=True, env=env, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr}")
    return proc


def render(helm_bin: str, *args: str, release: str = "rel", namespace: str = "ops") -> list[dict]:
    out = helm(helm_bin, "template", release, str(CHART), "--namespace", namespace, *args).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def by_kind(docs: list[dict], kind: str) -> list[dict]:
    """Objects of a kind, without the leader-election Role/RoleBinding (tested on their own)."""
    return [d for d in docs if d["kind"] == kind and not is_leader_election(d)]


def is_leader_election(d: dict) -> bool:
    return (d["metadata"].get("labels") or {}).get("app.kubernetes.io/component") == "leader-election"


def rules_of(role: dict) -> dict[tuple[str, str], set[str]]:
    out: dict[tuple[str, str], set[str]] = {}
    for rule in role["rules"]:
        for group in rule["apiGroups"]:
            for res in rule["resources"]:
                out.setdefault((group, res), set()).update(rule["verbs"])
    return out


# ---------------------------------------------------------------------------
# lint, render, schema (helm only)


@pytest.mark.parametrize("values", [None, ALL_ON], ids=["default", "all-on"])
def test_lint(helm_bin: str, values: Path | None) -> None:
    args = ["lint", "--strict", str(CHART)] + (["-f", str(values)] if values else [])
    proc = helm(helm_bin, *args)
    assert "0 chart(s) failed" in proc.stdout


def test_render_default(helm_bin: str) -> None:
    docs = render(helm_bin)
    kinds = sorted(d["kind"] for d in docs if not is_leader_election(d))
    assert kinds == [
        "ClusterRole",
        "ClusterRoleBinding",
        "Deployment",
        "NetworkPolicy",
        "Service",
        "ServiceAccount",
    ]
    (dep,) = by_kind(docs, "Deployment")
    spec = dep["spec"]
    assert spec["replicas"] == 1
    assert spec["strategy"] == {"type": "Recreate"}
    pod = spec["template"]["spec"]
    (sa,) = by_kind(docs, "ServiceAccount")
    assert pod["serviceAccountName"] == sa["metadata"]["name"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    (c,) = pod["containers"]
    assert c["image"] == "ghcr.io/disagg-operator/disagg-operator:0.1.0"
    sc = c["securityContext"]
    assert sc["runAsUser"] == 65532 and sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"] == {"drop": ["ALL"]}
    assert c["resources"]["requests"] and c["resources"]["limits"]
    assert c["args"] == [
        "run",
        "--bind",
        "0.0.0.0",
        "--metrics-port",
        "8080",
        "--dashboard-port",
        "0",
        "--liveness-port",
        "8082",
        "--leader-election",
        "--leader-election-namespace",
        "ops",
        "--leader-election-id",
        "disagg-operator-leader",
    ]
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"metrics": 8080, "liveness": 8082}
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "liveness"}
    assert not any(e["name"].startswith("DISAGG_PROMETHEUS") for e in c["env"])
    (svc,) = by_kind(docs, "Service")
    assert {p["name"]: p["port"] for p in svc["spec"]["ports"]} == {"metrics": 8080}
    assert svc["spec"]["selector"] == dep["spec"]["selector"]["matchLabels"]
    # Cluster-scoped names carry release and namespace: releases never collide.
    (cr,) = by_kind(docs, "ClusterRole")
    (crb,) = by_kind(docs, "ClusterRoleBinding")
    assert "rel" in cr["metadata"]["name"] and "ops" in cr["metadata"]["name"]
    assert crb["roleRef"]["name"] == cr["metadata"]["name"]
    assert crb["subjects"] == [{"kind": "ServiceAccount", "name": sa["metadata"]["name"], "namespace": "ops"}]
    other = by_kind(render(helm_bin, release="other", namespace="ops2"), "ClusterRole")[0]
    assert other["metadata"]["name"] != cr["metadata"]["name"]


def test_rbac_is_least_privilege(helm_bin: str) -> None:
    (cr,) = by_kind(render(helm_bin), "ClusterRole")
    assert rules_of(cr) == EXPECTED_RULES  # no Secrets at all by default
    for rule in cr["rules"]:
        for field in ("apiGroups", "resources", "verbs"):
            assert "*" not in rule[field], rule
    allowed = render(helm_bin, "--set", "prometheus.allowedUrls={http://prom.team-a:9090}")
    (cr,) = by_kind(allowed, "ClusterRole")
    assert rules_of(cr) == EXPECTED_RULES | SECRETS_RULE
    (dep,) = by_kind(allowed, "Deployment")
    args = dep["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--allow-prometheus-url") + 1] == "http://prom.team-a:9090"


def test_pod_monitors_off_grants_nothing_on_them_and_tells_the_operator(helm_bin: str) -> None:
    docs = render(helm_bin, "--set", "podMonitors.enabled=false")
    (cr,) = by_kind(docs, "ClusterRole")
    assert ("monitoring.coreos.com", "podmonitors") not in rules_of(cr)
    (dep,) = by_kind(docs, "Deployment")
    assert "--no-pod-monitors" in dep["spec"]["template"]["spec"]["containers"][0]["args"]
    (dep,) = by_kind(render(helm_bin), "Deployment")
    assert "--no-pod-monitors" not in dep["spec"]["template"]["spec"]["containers"][0]["args"]


def test_every_granted_verb_is_used_by_the_operator(helm_bin: str) -> None:
    """Each (resource, verb) the chart grants has a call site in the operator that needs it."""
    (cr,) = by_kind(render(helm_bin, "--set", "prometheus.allowedUrls={http://p:9090}"), "ClusterRole")
    granted = {(res, verb) for (_, res), verbs in rules_of(cr).items() for verb in verbs}
    assert granted == set(VERB_USES), granted ^ set(VERB_USES)
    for (res, verb), (module, code) in VERB_USES.items():
        text = (ROOT / "operator" / "disagg" / module).read_text()
        assert code in text, f"{res} {verb}: {module} no longer has {code!r}; drop the verb or fix the map"


def test_exposure_defaults(helm_bin: str) -> None:
    """Only /metrics (and the probe port) are served beyond loopback by default; a NetworkPolicy
    admits only the configured peers; the image can be pinned by digest."""
    docs = render(helm_bin)
    (dep,) = by_kind(docs, "Deployment")
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    args = c["args"]
    assert args[args.index("--dashboard-port") + 1] == "0"  # the dashboard is off
    assert {p["name"] for p in c["ports"]} == {"metrics", "liveness"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "liveness"}
    (svc,) = by_kind(docs, "Service")
    assert [p["name"] for p in svc["spec"]["ports"]] == ["metrics"]
    (np,) = by_kind(docs, "NetworkPolicy")
    assert np["spec"]["podSelector"]["matchLabels"] == dep["spec"]["selector"]["matchLabels"]
    assert np["spec"]["policyTypes"] == ["Ingress"]
    ports = [[p["port"] for p in rule["ports"]] for rule in np["spec"]["ingress"]]
    assert ports == [["metrics"], ["liveness"]]
    assert np["spec"]["ingress"][0]["from"]  # metrics only from the listed peers
    assert not by_kind(render(helm_bin, "--set", "networkPolicy.enabled=false"), "NetworkPolicy")
    digest = "sha256:" + "a" * 64
    (dep,) = by_kind(render(helm_bin, "--set", f"image.digest={digest}"), "Deployment")
    assert dep["spec"]["template"]["spec"]["containers"][0]["image"] == (
        f"ghcr.io/disagg-operator/disagg-operator@{digest}"
    )


def test_render_all_on(helm_bin: str) -> None:
    docs = render(helm_bin, "-f", str(ALL_ON))
    kinds = sorted(d["kind"] for d in docs if not is_leader_election(d))
    assert kinds == [
        "ConfigMap",
        "Deployment",
        "NetworkPolicy",
        "Role",
        "Role",
        "RoleBinding",
        "RoleBinding",
        "Service",
        "ServiceAccount",
        "ServiceMonitor",
    ]
    values = yaml.safe_load(ALL_ON.read_text())
    watched = values["watchNamespaces"]
    assert sorted(r["metadata"]["namespace"] for r in by_kind(docs, "Role")) == sorted(watched)
    for role in by_kind(docs, "Role"):
        assert rules_of(role) == EXPECTED_RULES | SECRETS_RULE
    for rb in by_kind(docs, "RoleBinding"):
        assert rb["roleRef"]["kind"] == "Role"
        assert rb["subjects"] == [{"kind": "ServiceAccount", "name": "disagg-op", "namespace": "ops"}]
    (dep,) = by_kind(docs, "Deployment")
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    assert c["image"] == "registry.example.com/disagg/disagg-operator:0.1.0-test"
    assert c["imagePullPolicy"] == "Always"
    args = c["args"]
    for ns in watched:
        i = args.index(ns)
        assert args[i - 1] == "--namespace"
    assert args[args.index("--metrics-port") + 1] == "9090"
    assert args[args.index("--liveness-port") + 1] == "9092"
    assert "--verbose" in args
    env = {e["name"]: e for e in c["env"]}
    assert env["DISAGG_PROMETHEUS_URL"]["value"] == values["prometheus"]["url"]
    token_file = env["DISAGG_PROMETHEUS_BEARER_TOKEN_FILE"]["value"]
    (vol,) = [v for v in dep["spec"]["template"]["spec"]["volumes"] if "secret" in v]
    assert vol["secret"]["secretName"] == "prometheus-token"
    assert vol["secret"]["items"] == [{"key": "token", "path": "token"}]
    (mount,) = [m for m in c["volumeMounts"] if m["name"] == vol["name"]]
    assert token_file == mount["mountPath"] + "/token" and mount["readOnly"] is True
    assert c["livenessProbe"]["httpGet"]["port"] == "liveness"
    assert {p["name"]: p["containerPort"] for p in c["ports"]}["liveness"] == 9092
    (sm,) = by_kind(docs, "ServiceMonitor")
    assert sm["apiVersion"] == "monitoring.coreos.com/v1"
    assert sm["spec"]["endpoints"][0]["port"] == "metrics"
    assert sm["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    (cm,) = by_kind(docs, "ConfigMap")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["metadata"]["namespace"] == "monitoring"
    embedded = json.loads(cm["data"]["disagg-operator.json"])
    assert embedded == json.loads((CHART / "dashboards" / "disagg-operator.json").read_text())


def test_leader_election_role_grants_only_its_own_lease(helm_bin: str) -> None:
    docs = render(helm_bin)
    (role,) = [d for d in docs if d["kind"] == "Role" and is_leader_election(d)]
    (rb,) = [d for d in docs if d["kind"] == "RoleBinding" and is_leader_election(d)]
    assert role["metadata"]["namespace"] == rb["metadata"]["namespace"]
    by_verbs = {tuple(r["verbs"]): r for r in role["rules"]}
    # list (no names): the shards read each other's recorded scopes (disagg.leader.ShardOverlapCheck)
    assert set(by_verbs) == {("create", "list"), ("get", "patch")}
    assert by_verbs[("get", "patch")]["resourceNames"] == ["disagg-operator-leader"]
    assert all(
        r["resources"] == ["leases"] and r["apiGroups"] == ["coordination.k8s.io"] for r in role["rules"]
    )
    (dep,) = by_kind(docs, "Deployment")
    args = dep["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--leader-election" in args
    assert args[args.index("--leader-election-namespace") + 1] == role["metadata"]["namespace"]
    off = render(helm_bin, "--set", "leaderElection.enabled=false")
    assert not [d for d in off if is_leader_election(d)]
    (dep,) = by_kind(off, "Deployment")
    assert "--leader-election" not in dep["spec"]["template"]["spec"]["containers"][0]["args"]


def test_a_shard_release_owns_its_selector_and_its_own_lease(helm_bin: str) -> None:
    from disagg import shard

    docs = render(helm_bin, "--set", "shard.name=a", "--set", "shard.selector=disagg.dev/shard=a")
    (role,) = [d for d in docs if d["kind"] == "Role" and is_leader_election(d)]
    (dep,) = by_kind(docs, "Deployment")
    args = dep["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--shard-selector") + 1] == "disagg.dev/shard=a"
    assert args[args.index("--shard-name") + 1] == "a"
    # The Role grants the very Lease the operator will hold (base name + shard).
    lease = shard.lease_name(args[args.index("--leader-election-id") + 1], "a")
    granted = [r for r in role["rules"] if r.get("resourceNames")]
    assert granted[0]["resourceNames"] == [lease] == ["disagg-operator-leader-a"]
    proc = helm(helm_bin, "template", "rel", str(CHART), "--set", "shard.selector=x=y", check=False)
    assert proc.returncode != 0 and "shard.name is required with shard.selector" in proc.stderr


def test_values_schema_is_strict() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    assert schema["additionalProperties"] is False
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())
    assert set(defaults) <= set(schema["properties"]), set(defaults) - set(schema["properties"])
    assert set(schema["properties"]) - set(defaults) <= {"global"}


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ({"replicaCount": "two"}, "at '/replicaCount': got string, want integer"),
        ({"replicaCount": 4}, "at '/replicaCount': maximum: got 4, want 3"),
        (
            {"replicaCount": 2, "leaderElection": {"enabled": False}},
            "at '/replicaCount': maximum: got 2, want 1",
        ),
        ({"leaderElection": {"leaseName": "Bad_Name"}}, "at '/leaderElection/leaseName'"),
        ({"replicas": 1}, "additional properties 'replicas' not allowed"),
        ({"image": {"pullPolicy": "Sometimes"}}, "at '/image/pullPolicy': value must be one of"),
        ({"ports": {"metrics": 0}}, "at '/ports/metrics': minimum: got 0, want 1"),
        ({"watchNamespaces": ["Not_A_Namespace"]}, "at '/watchNamespaces/0'"),
        ({"shard": {"name": "Shard_A"}}, "at '/shard/name'"),
        ({"crds": {"keep": "yes"}}, "at '/crds/keep': got string, want boolean"),
        ({"prometheus": {"url": "prometheus:9090"}}, "at '/prometheus/url'"),
        ({"prometheus": {"token": "x"}}, "additional properties 'token' not allowed"),
        ({"serviceMonitor": {"enabled": "true"}}, "at '/serviceMonitor/enabled': got string, want boolean"),
    ],
)
def test_schema_refuses_bad_values(helm_bin: str, tmp_path: Path, bad: dict, message: str) -> None:
    f = tmp_path / "bad.yaml"
    f.write_text(yaml.safe_dump(bad))
    proc = helm(helm_bin, "template", "rel", str(CHART), "-f", str(f), check=False)
    assert proc.returncode != 0, f"accepted {bad}"
    assert "values don't meet the specifications of the schema" in proc.stderr
    assert message in proc.stderr, proc.stderr


# ---------------------------------------------------------------------------
# cluster


@pytest.fixture(scope="module")
def crd(cluster) -> None:
    """The CRD is cluster-scoped and may already exist: apply it, then install with --skip-crds."""
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD_FILE))
    cluster.wait_established(api.CRD_NAME)


def release_name() -> str:
    return f"dop-{uuid.uuid4().hex[:6]}"


def install(cluster, helm_bin: str, release: str, namespace: str, *args: str) -> None:
    helm(
        helm_bin,
        "install",
        release,
        str(CHART),
        "--namespace",
        namespace,
        "--skip-crds",
        "--wait",
        "--timeout",
        "120s",
        *args,
        env=cluster.env(),
    )


def uninstall(cluster, helm_bin: str, release: str, namespace: str) -> None:
    helm(
        helm_bin,
        "uninstall",
        release,
        "--namespace",
        namespace,
        "--wait",
        "--timeout",
        "120s",
        env=cluster.env(),
        check=False,
    )


@pytest.mark.cluster
def test_install_and_uninstall(cluster, crd, helm_bin: str, namespace: str) -> None:
    rel = release_name()
    full = f"{rel}-disagg-operator"
    cluster_name = f"{full}-{namespace}"[:63].rstrip("-")
    install(cluster, helm_bin, rel, namespace)
    try:
        dep = cluster.get_json("deployment", full, "-n", namespace)
        assert dep["spec"]["strategy"]["type"] == "Recreate"
        cluster.get_json("serviceaccount", full, "-n", namespace)
        svc = cluster.get_json("service", full, "-n", namespace)
        assert {p["name"] for p in svc["spec"]["ports"]} == {"metrics"}  # the dashboard is off by default
        cluster.get_json("networkpolicy", full, "-n", namespace)
        cr = cluster.get_json("clusterrole", cluster_name)
        assert rel in cr["metadata"]["name"]
        crb = cluster.get_json("clusterrolebinding", cluster_name)
        assert crb["subjects"][0] == {"kind": "ServiceAccount", "name": full, "namespace": namespace}
        # Cluster-wide mode: the only namespaced Role is the leader-election one.
        roles = cluster.kubectl("get", "role", "-n", namespace, "-o", "name").stdout.split()
        assert roles == [f"role.rbac.authorization.k8s.io/{full}-leader-election"]

        # The operator pod lands on a (fake, KWOK) node and is reported Running.
        def scheduled() -> dict | None:
            pods = cluster.get_json("pods", "-n", namespace, "-l", f"app.kubernetes.io/instance={rel}")
            for p in pods["items"]:
                if p["spec"].get("nodeName") and p["status"].get("phase") == "Running":
                    return p
            return None

        pod = cluster.wait_for(scheduled, timeout=90, what="operator pod scheduled and Running")
        node = cluster.get_json("node", pod["spec"]["nodeName"])
        assert node["metadata"].get("annotations", {}).get("kwok.x-k8s.io/node") == "fake" or (
            node["status"]["nodeInfo"]["kubeletVersion"].startswith("kwok")
        )
        sa = cluster.kubectl(
            "auth", "can-i", "list", "disaggdeployments.disagg.dev", "-n", "default",
            f"--as=system:serviceaccount:{namespace}:{full}", check=False,
        )  # fmt: skip
        assert sa.stdout.strip() == "yes", "cluster-wide install grants every namespace"
    finally:
        uninstall(cluster, helm_bin, rel, namespace)
    gone = cluster.kubectl("get", "clusterrole", cluster_name, check=False)
    assert gone.returncode != 0 and "NotFound" in gone.stderr
    assert cluster.kubectl("get", "clusterrolebinding", cluster_name, check=False).returncode != 0
    assert cluster.kubectl("get", "deployment", full, "-n", namespace, check=False).returncode != 0
    assert cluster.kubectl("get", "serviceaccount", full, "-n", namespace, check=False).returncode != 0
    # The CRD is never removed by an uninstall.
    cluster.get_json("crd", api.CRD_NAME)


def sample_without_autoscaling() -> dict:
    obj = copy.deepcopy(yaml.safe_load(SAMPLE.read_text()))
    spec = obj["spec"]
    spec.setdefault("autoscaling", {})["enabled"] = False
    spec["autoscaling"].pop("gpuBudget", None)
    for pool in spec["pools"].values():
        pool["gpusPerReplica"] = 1  # small footprint on the shared 4 x 8 GPU cluster
    return obj


def resource_rows(can_i_list: str) -> list[list[str]]:
    """Rows of `kubectl auth can-i --list` that grant resources (not non-resource URLs)."""
    rows = []
    for line in can_i_list.splitlines()[1:]:
        if not line.strip() or line.startswith(" "):
            continue  # non-resource URL rows start with blanks
        rows.append(line.split())
    return rows


@pytest.mark.cluster
def test_operator_runs_with_exactly_the_chart_rbac(
    cluster, crd, helm_bin: str, namespace: str, tmp_path: Path
) -> None:
    rel = release_name()
    sa = f"{rel}-disagg-operator"
    install(cluster, helm_bin, rel, namespace, "--set", f"watchNamespaces={{{namespace}}}")
    try:
        role = cluster.get_json("role", sa, "-n", namespace)
        assert rules_of(role) == EXPECTED_RULES
        assert cluster.kubectl("get", "clusterrole", f"{sa}-{namespace}", check=False).returncode != 0
        kc = sa_kubeconfig(cluster, namespace, sa, directory=tmp_path)

        who = kubectl_as(cluster, kc, "auth", "whoami", "-o", "json", check=True)
        assert json.loads(who.stdout)["status"]["userInfo"]["username"] == (
            f"system:serviceaccount:{namespace}:{sa}"
        )
        # Refused: anything outside the chart's Role.
        assert kubectl_as(cluster, kc, "auth", "can-i", "delete", "nodes").stdout.strip() == "no"
        assert (
            kubectl_as(cluster, kc, "auth", "can-i", "list", "secrets", "-n", namespace).stdout.strip()
            == "no"
        )
        assert kubectl_as(cluster, kc, "auth", "can-i", "list", "disaggdeployments", "-n", "default").stdout.strip() == "no"  # fmt: skip
        secrets = kubectl_as(cluster, kc, "get", "secrets", "-n", "kube-system")
        assert secrets.returncode != 0 and "Forbidden" in secrets.stderr, secrets.stderr
        listing = kubectl_as(cluster, kc, "auth", "can-i", "--list", "-n", namespace, check=True).stdout
        rows = resource_rows(listing)
        assert rows, listing
        for row in rows:
            assert "*" not in row[0] and not any("*" in v for v in row[-1].strip("[]").split()), row

        log_path = tmp_path / "operator.log"
        proc = start_operator(kc, [namespace], log_path)
        try:
            obj = sample_without_autoscaling()
            name = obj["metadata"]["name"]
            cluster.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(obj))

            def ready() -> bool:
                assert proc.poll() is None, f"operator exited:\n{log_path.read_text()}"
                dd = cluster.get_json(api.PLURAL, name, "-n", namespace)
                conds = {c["type"]: c["status"] for c in dd.get("status", {}).get("conditions", [])}
                return conds.get("Ready") == "True"

            cluster.wait_for(ready, timeout=120, interval=1, what="DisaggDeployment Ready")
            for pool in ("prefill", "decode"):
                cluster.get_json("deployment", f"{name}-{pool}", "-n", namespace)

            cluster.kubectl(
                "patch", api.PLURAL, name, "-n", namespace, "--type=merge",
                "-p", json.dumps({"spec": {"pools": {"prefill": {"replicas": 3}}}}),
            )  # fmt: skip

            def scaled() -> bool:
                d = cluster.get_json("deployment", f"{name}-prefill", "-n", namespace)
                return d["spec"].get("replicas") == 3 and d.get("status", {}).get("readyReplicas") == 3

            cluster.wait_for(scaled, timeout=120, interval=1, what="prefill Deployment at 3 ready replicas")
            cluster.wait_for(
                lambda: (
                    ready()
                    and cluster.get_json(api.PLURAL, name, "-n", namespace)["status"]["pools"]["prefill"].get(
                        "readyReplicas"
                    )
                    == 3
                ),
                timeout=60,
                interval=1,
                what="status reports prefill 3 ready",
            )
            time.sleep(2)  # let any late request fail visibly in the log
            assert proc.poll() is None, f"operator exited:\n{log_path.read_text()}"
        finally:
            stop_operator(proc)
        text = log_path.read_text()
        assert "Handler 'on_disaggdeployment' succeeded" in text, text[-4000:]
        assert not forbidden_lines(text), "\n".join(forbidden_lines(text))
    finally:
        cluster.kubectl("delete", api.PLURAL, "--all", "-n", namespace, "--wait=false", check=False)
        uninstall(cluster, helm_bin, rel, namespace)
