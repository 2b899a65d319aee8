"""The operator's router, for real: vllm-router 0.1.17 with the operator's own flags, discovering the
pools through the Kubernetes API as the router's ServiceAccount (the operator's least-privilege Role),
in front of the HTTP emulated fleet on the pods' loopback IPs.

Needs the local cluster with its pod CIDR inside 127.0.0.0/8 (hack/cluster.sh sets 127.1.0.0/16);
skipped on a cluster made before that. The router runs as a process on this machine (KWOK pods run
nothing), with the arguments of the Deployment the operator built; only its listen addresses are
moved to 127.0.0.1.

Also shown here, at the client: a decode pod whose readiness gate turns False (not Ready) still gets
new requests from the router (docs/router.md: discovery only removes deleted pods); after the
router's removal API it gets none, and its streams finish.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import os
import re
import sys
import time
import urllib.request
from pathlib import Path

import openai
import pytest
import samples
from rbac_util import sa_kubeconfig
from router_util import Proc, free_port, http_json, router_binary, wait_until
from test_router_binary import complete, stream

from disagg import routers
from disagg.emulator.metrics import NAMES
from prereqs import missing_prerequisite

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(600)]


def pods_of(cluster, ns: str, name: str) -> list[dict]:
    return cluster.get_json("pods", "-n", ns, "-l", f"disagg.dev/deployment={name}")["items"]


def cond(pod: dict, ctype: str) -> str | None:
    return next((c["status"] for c in pod["status"].get("conditions", []) if c["type"] == ctype), None)


def e2e_count(url: str, engine: str) -> float:
    """Requests the emulated engine at `url` completed (its e2e latency histogram's count)."""
    name = re.escape(NAMES[engine]["e2e"] + "_count")
    text = urllib.request.urlopen(f"{url}/metrics", timeout=10).read().decode()
    return sum(
        float(m.group(1))
        for line in text.splitlines()
        if (m := re.match(rf"^{name}\{{[^}}]*\}} (\S+)$", line))
    )


SAMPLE = {"vllm": "vllm-disaggregated-70b.yaml", "sglang": "sglang-disaggregated.yaml"}


async def operator_drain(kubeconfig: str, pod: dict, draining: bool) -> None:
    """What the operator's drain does to a pod (disagg.loop.set_drain): gate, annotation, routers."""
    from disagg import drain, loop
    from disagg.kube import Kube

    kube = await Kube.connect(kubeconfig)
    try:
        now = time.time()
        rec = drain.DrainRecord(now, now + 300, "proceed") if draining else None
        await loop.set_drain(kube, pod, rec)
    finally:
        await kube.close()


@pytest.mark.parametrize(
    ("engine", "drain_by"),
    [("vllm", "gate"), ("sglang", "gate"), ("sglang", "operator")],
    ids=["vllm-gate", "sglang-gate", "sglang-operator-drain"],
)
def test_operator_router_discovers_the_pools_and_serves_through_them(
    engine, drain_by, cluster, namespace, operator_factory, tmp_path
):
    """drain_by "gate": only the readiness gate turns False; "operator": the operator's drain code
    (gate, annotation, and the router's removal API where the router needs it)."""
    if router_binary(engine) is None:
        missing_prerequisite(f"the {engine} router (hack/routers.sh installs the pinned one)")
    obj = samples.fixed(SAMPLE[engine], prefill=1, decode=2)
    name = obj["metadata"]["name"]
    op = operator_factory([namespace])
    cluster.kubectl("apply", "--server-side", "-n", namespace, "-f", "-", input=json.dumps(obj))

    def routable():
        return [
            p
            for p in pods_of(cluster, namespace, name)
            if p["status"].get("phase") == "Running" and cond(p, "disagg.dev/routable") == "True"
        ]

    cluster.wait_for(lambda: len(routable()) == 3, timeout=180, what="3 routable pods")
    ips = [p["status"]["podIP"] for p in routable()]
    if not all(ipaddress.ip_address(ip) in ipaddress.ip_network("127.0.0.0/8") for ip in ips):
        missing_prerequisite(f"a local cluster with loopback pod IPs, not {ips} (hack/cluster.sh down && up)")

    # The operator's router objects.
    rname = f"{name}-router"
    for kind in ("serviceaccount", "role", "rolebinding", "deployment", "service"):
        cluster.wait_for(
            lambda k=kind: cluster.kubectl("get", k, rname, "-n", namespace, check=False).returncode == 0,
            timeout=60,
            what=f"{kind}/{rname}",
        )
    dep = cluster.get_json("deployment", rname, "-n", namespace)
    args = list(dep["spec"]["template"]["spec"]["containers"][0]["args"])
    if drain_by == "operator":
        # The router listens on its own pod's IP (loopback), where the operator's drain reaches it.
        def router_pod_ip():
            rp = cluster.get_json("pods", "-n", namespace, "-l", f"disagg.dev/router={name}")["items"]
            return rp[0]["status"].get("podIP") if rp and rp[0]["status"].get("phase") == "Running" else None

        host = cluster.wait_for(router_pod_ip, timeout=60, what="the router pod's IP")
        port, metrics_port = routers.ROUTER_HTTP_PORT, routers.ROUTER_METRICS_PORT
    else:
        host, port, metrics_port = "127.0.0.1", free_port(), free_port()
    for flag, value in (
        ("--host", host),
        ("--port", str(port)),
        ("--prometheus-host", host),
        ("--prometheus-port", str(metrics_port)),
    ):
        args[args.index(flag) + 1] = value

    emu_log = tmp_path / "emulator.log"
    emu = Proc(
        [
            sys.executable, "-m", "disagg.cli", "emulate", "--kubeconfig", cluster.kubeconfig,
            "--namespace", namespace, "--serve", "--rate", "0", "--duration", "400", "--engine", "auto",
            "--metrics-port", "0", "--summary-json", str(tmp_path / "summary.json"),
        ],
        emu_log,
        env=cluster.env(),
    )  # fmt: skip
    router = None
    try:
        pods = {p["metadata"]["name"]: p for p in routable()}
        port_of = args[args.index("--service-discovery-port") + 1]
        url = {n: f"http://{p['status']['podIP']}:{port_of}" for n, p in pods.items()}
        for u in url.values():
            wait_until(lambda u=u: http_json(f"{u}/health", timeout=2)[0] == 200, 60, f"emulated engine {u}")

        # The router, as the operator configured it, authenticated as its own ServiceAccount.
        kubeconfig = sa_kubeconfig(cluster, namespace, rname, tmp_path)
        env = dict(os.environ, KUBECONFIG=kubeconfig)
        p = routers.preset(engine)
        router = Proc([str(router_binary(engine)), *p.subcommand, *args], tmp_path / "router.log", env=env)
        base = f"http://{host}:{port}"
        wait_until(
            lambda: len(http_json(f"{base}/workers", timeout=2)[1].get("workers", [])) == 3,
            90,
            "the router to discover 3 workers",
        )
        workers = {w["url"]: w["worker_type"] for w in http_json(f"{base}/workers")[1]["workers"]}
        for n, p in pods.items():
            assert workers[url[n]] == p["metadata"]["labels"]["disagg.dev/pool"]

        async def serve(n: int, out: int) -> list[dict]:
            client = openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)
            r = await asyncio.gather(*(stream(client, 200, out) for _ in range(n)))
            await client.close()
            return r

        assert all(complete(r, 200, 4) for r in asyncio.run(serve(6, 4)))

        # Drain as the operator starts one: the decode pod's routable gate False (the operator is
        # stopped first, so nothing else moves). KWOK then sets Ready False.
        op.stop()
        victim = sorted(n for n, p in pods.items() if p["metadata"]["labels"]["disagg.dev/pool"] == "decode")[
            0
        ]
        if drain_by == "operator":
            asyncio.run(
                operator_drain(cluster.kubeconfig, cluster.get_json("pod", victim, "-n", namespace), True)
            )
        else:
            cluster.kubectl(
                "patch", "pod", victim, "-n", namespace, "--subresource=status", "--type=strategic", "-p",
                json.dumps({"status": {"conditions": [{"type": "disagg.dev/routable", "status": "False"}]}}),
            )  # fmt: skip
        cluster.wait_for(
            lambda: cond(cluster.get_json("pod", victim, "-n", namespace), "Ready") == "False",
            timeout=30,
            what=f"{victim} not Ready",
        )
        time.sleep(3)  # the router sees the change through its pod watch
        before = e2e_count(url[victim], engine)
        assert all(complete(r, 200, 2) for r in asyncio.run(serve(8, 2)))
        not_ready_share = e2e_count(url[victim], engine) - before
        listed = {w["url"]: w for w in http_json(f"{base}/workers")[1]["workers"]}
        still_listed = url[victim] in listed

        # The removal API (needed where the router keeps a not-Ready pod): no new request after it.
        if still_listed:
            if engine == "vllm":
                assert http_json(f"{base}/remove_worker?url={url[victim]}", "POST")[0] == 200
            else:
                assert http_json(f"{base}/workers/{listed[url[victim]]['id']}", "DELETE")[0] in (
                    200,
                    202,
                    204,
                )
            wait_until(
                lambda: url[victim] not in {w["url"] for w in http_json(f"{base}/workers")[1]["workers"]},
                30,
                "the removal",
            )
        before = e2e_count(url[victim], engine)
        assert all(complete(r, 200, 2) for r in asyncio.run(serve(8, 2)))
        after_removal = e2e_count(url[victim], engine) - before
        readded = None
        if drain_by == "operator":  # cancel the drain: the operator re-adds the worker
            asyncio.run(
                operator_drain(cluster.kubeconfig, cluster.get_json("pod", victim, "-n", namespace), False)
            )
            readded = wait_until(
                lambda: url[victim] in {w["url"] for w in http_json(f"{base}/workers")[1]["workers"]},
                30,
                "the worker re-added",
            )
    finally:
        if router is not None:
            router.stop()
        emu.stop()
    # The API server's refusal of the router's pod watch says "forbidden" (status 403); a bare "403"
    # also occurs in latencies and timestamps, so it is not searched for on its own.
    forbidden = [ln for ln in Path(tmp_path / "router.log").read_text().splitlines() if "orbidden" in ln]
    assert not forbidden, forbidden[:3]
    print(f"{engine}/{drain_by}: a not-Ready decode pod got {not_ready_share:.0f} of 8 new requests")
    if drain_by == "operator":
        # the operator's drain removed it from the router: no new request at all
        assert not still_listed and not_ready_share == 0
        assert readded, "a cancelled drain gives the worker back to the router"
    elif engine == "vllm":
        # vllm-router 0.1.17 removes a pod whose Ready condition turns False (docs/router.md)
        assert not still_listed and not_ready_share == 0
    else:
        # sglang-router 0.3.2 keeps it until it is deleted (docs/router.md): the removal API is needed
        assert still_listed
    assert after_removal == 0


def test_router_objects_follow_spec_router_and_the_status_shows_the_endpoint(
    cluster, namespace, operator_factory
):
    obj = samples.fixed(SAMPLE["vllm"], prefill=1, decode=1)
    name = obj["metadata"]["name"]
    operator_factory([namespace])
    cluster.kubectl("apply", "--server-side", "-n", namespace, "-f", "-", input=json.dumps(obj))
    kinds = ("serviceaccount", "role", "rolebinding", "deployment", "service")
    selector = f"disagg.dev/router={name}"

    def router_objects():
        return cluster.kubectl(
            "get", ",".join(kinds), "-n", namespace, "-l", selector, "-o", "name"
        ).stdout.split()

    cluster.wait_for(lambda: len(router_objects()) == 5, timeout=90, what="the 5 router objects")
    endpoint = cluster.wait_for(
        lambda: cluster.get_json("dd", name, "-n", namespace).get("status", {}).get("endpoint"),
        timeout=60,
        what="status.endpoint",
    )
    assert endpoint == f"http://{name}-router.{namespace}:8000/v1"
    printed = cluster.kubectl("get", "dd", name, "-n", namespace).stdout
    assert "ENDPOINT" in printed and endpoint in printed

    cluster.kubectl(
        "patch",
        "dd",
        name,
        "-n",
        namespace,
        "--type=merge",
        "-p",
        json.dumps({"spec": {"router": {"enabled": False}}}),
    )
    cluster.wait_for(lambda: router_objects() == [], timeout=90, what="the router objects deleted")
    cluster.wait_for(
        lambda: "endpoint" not in cluster.get_json("dd", name, "-n", namespace).get("status", {}),
        timeout=60,
        what="status.endpoint removed",
    )
    # the pools are untouched
    assert len(pods_of(cluster, namespace, name)) == 2
