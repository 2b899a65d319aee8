"""Tell a DisaggDeployment's router that a worker is drained or back (for routers that ignore Ready).

`vllm-router` 0.1.17 drops a pod from its workers as soon as the pod turns not
Ready, so the readiness gate is enough. `sglang-router` 0.3.2 keeps a pod that
turns not Ready until it is deleted (docs/router.md, measured by
tests/integration/test_router_discovery.py), so a drain has to remove the
worker through the router's API, on every router pod: ``GET /workers`` gives
the worker's id, ``DELETE /workers/<id>`` removes it, ``POST /workers`` adds it
back when the drain is cancelled.

Best effort: a router that cannot be reached is logged and skipped. The drain
still waits for the pod's in-flight work, so a missed removal costs time (new
requests keep the pod busy until the drain timeout), never a lost request.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from disagg import builders, names, routers

log = logging.getLogger("disagg.routerclient")

#: Engines whose router ignores a pod's Ready condition once it uses the pod.
NEEDS_REMOVAL_API = frozenset({"sglang"})
REQUEST_TIMEOUT_S = 5.0


def worker_url(pod: Mapping[str, Any]) -> str | None:
    """How the router names the pod: http://<pod IP>:<engine port> (the first non-metrics port)."""
    ip = (pod.get("status") or {}).get("podIP")
    if not ip:
        return None
    port = builders.DEFAULT_HTTP_PORT
    for c in (pod.get("spec") or {}).get("containers") or []:
        named = [p for p in c.get("ports") or [] if p.get("containerPort") and p.get("name") != "metrics"]
        if named:
            port = int(named[0]["containerPort"])
            break
    return f"http://{ip}:{port}"


async def set_worker_routable(kube: Any, pod: Mapping[str, Any], routable: bool) -> int:
    """Remove (routable False) or re-add (True) `pod` on every router pod of its DisaggDeployment.

    Only for engines in NEEDS_REMOVAL_API; returns how many routers were changed.
    """
    labels = (pod.get("metadata") or {}).get("labels") or {}
    engine = labels.get("app.kubernetes.io/name")
    owner = labels.get(names.LABEL_DEPLOYMENT)
    pool = labels.get(names.LABEL_POOL)
    url = worker_url(pod)
    if engine not in NEEDS_REMOVAL_API or not owner or not url:
        return 0
    ns = pod["metadata"]["namespace"]
    router_pods = await kube.list("Pod", ns, f"{names.LABEL_ROUTER}={owner}")
    bases = [
        f"http://{p['status']['podIP']}:{routers.ROUTER_HTTP_PORT}"
        for p in router_pods
        if (p.get("status") or {}).get("podIP") and (p.get("status") or {}).get("phase") == "Running"
    ]
    if not bases:
        return 0
    import aiohttp

    changed = 0
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        for base in bases:
            try:
                changed += await _update(session, base, url, pool, routable)
            except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
                log.warning(
                    "router %s: could not %s worker %s: %s", base, "add" if routable else "remove", url, exc
                )
    return changed


async def _update(session: Any, base: str, url: str, pool: str | None, routable: bool) -> int:
    async with session.get(f"{base}/workers") as r:
        r.raise_for_status()
        workers = (await r.json()).get("workers") or []
    ids = [w.get("id") for w in workers if w.get("url") == url]
    if not routable:
        for wid in ids:
            async with session.delete(f"{base}/workers/{wid}") as r:
                r.raise_for_status()
        if ids:
            log.info("router %s: removed drained worker %s", base, url)
        return 1 if ids else 0
    if ids:
        return 0
    body = (
        {"url": url, "worker_type": pool} if pool in (names.POOL_PREFILL, names.POOL_DECODE) else {"url": url}
    )
    async with session.post(f"{base}/workers", json=body) as r:
        r.raise_for_status()
    log.info("router %s: re-added worker %s", base, url)
    return 1
