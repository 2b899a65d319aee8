"""The only module that talks to the Kubernetes API.

A thin asynchronous wrapper over kubernetes_asyncio's ApiClient that works on
plain dicts (the builders return dicts): server-side apply, get, list, patch,
delete and events, for the handful of kinds the operator touches. Every call is
awaited on Kopf's event loop; nothing here blocks it.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import logging
import os
from dataclasses import dataclass
from typing import Any

import aiohttp
from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException

from disagg.api import GROUP, KIND, PLURAL, VERSION

log = logging.getLogger("disagg.kube")

FIELD_MANAGER = "disagg-operator"

#: Longest wait for one API call (connect + answer): a black-holed API server cannot hold a
#: reconcile, the autoscaler or the dashboard for longer.
REQUEST_TIMEOUT_S = 10.0
#: Lease calls answer within this or fail, so renewing leadership is never starved (the
#: elector renews every few seconds and gives up before its Lease could expire).
LEASE_REQUEST_TIMEOUT_S = 2.0
#: Attempts of an idempotent call (GET, PATCH, DELETE) on a timeout, a dropped connection or
#: a 429/5xx, waiting RETRY_BACKOFF_S, then twice that, between attempts. POST is never repeated.
ATTEMPTS = 3
RETRY_BACKOFF_S = 0.5
RETRYABLE_STATUS = frozenset({429, 500, 502, 503, 504})
IDEMPOTENT_METHODS = frozenset({"GET", "PATCH", "DELETE"})


@dataclass(frozen=True)
class Resource:
    api_version: str
    kind: str
    plural: str
    namespaced: bool = True

    def path(
        self, namespace: str | None = None, name: str | None = None, subresource: str | None = None
    ) -> str:
        base = "/api/v1" if self.api_version == "v1" else f"/apis/{self.api_version}"
        if self.namespaced and namespace:
            base += f"/namespaces/{namespace}"
        base += f"/{self.plural}"
        if name:
            base += f"/{name}"
        if subresource:
            base += f"/{subresource}"
        return base


RESOURCES = {
    "Deployment": Resource("apps/v1", "Deployment", "deployments"),
    "ReplicaSet": Resource("apps/v1", "ReplicaSet", "replicasets"),
    "Service": Resource("v1", "Service", "services"),
    "Pod": Resource("v1", "Pod", "pods"),
    "Secret": Resource("v1", "Secret", "secrets"),
    "Event": Resource("v1", "Event", "events"),
    "PodDisruptionBudget": Resource("policy/v1", "PodDisruptionBudget", "poddisruptionbudgets"),
    "Lease": Resource("coordination.k8s.io/v1", "Lease", "leases"),
    "ServiceAccount": Resource("v1", "ServiceAccount", "serviceaccounts"),
    "Role": Resource("rbac.authorization.k8s.io/v1", "Role", "roles"),
    "RoleBinding": Resource("rbac.authorization.k8s.io/v1", "RoleBinding", "rolebindings"),
    KIND: Resource(f"{GROUP}/{VERSION}", KIND, PLURAL),
    # The Prometheus Operator's, when its CRDs are installed (Kube.served tells).
    "PodMonitor": Resource("monitoring.coreos.com/v1", "PodMonitor", "podmonitors"),
}


def resource_for(obj_or_kind: dict | str) -> Resource:
    kind = obj_or_kind if isinstance(obj_or_kind, str) else obj_or_kind["kind"]
    try:
        return RESOURCES[kind]
    except KeyError:
        raise ValueError(f"disagg.kube does not handle kind {kind!r}") from None


async def load_configuration(kubeconfig: str | None = None) -> client.Configuration:
    """The one place the operator's credentials come from (its own client and Kopf's login alike).

    `kubeconfig` if given; else the in-cluster service account when running in a pod
    without $KUBECONFIG; else $KUBECONFIG or ~/.kube/config (current context).
    """
    cfg = client.Configuration()
    if os.environ.get("KUBERNETES_SERVICE_HOST") and not (kubeconfig or os.environ.get("KUBECONFIG")):
        config.load_incluster_config(client_configuration=cfg)
    else:
        try:
            await config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
        except (config.ConfigException, OSError) as exc:
            where = kubeconfig or os.environ.get("KUBECONFIG") or "~/.kube/config"
            raise RuntimeError(
                f"cannot load Kubernetes credentials from {where}: {exc}. "
                "Pass --kubeconfig FILE, set $KUBECONFIG, or run in a pod with a service account."
            ) from exc
    return cfg


async def login_settings(kubeconfig: str | None = None) -> dict[str, Any]:
    """Keyword arguments of `kopf.ConnectionInfo` for the same credentials as `Kube.connect`.

    Kopf's own login would read ~/.kube/config by itself, so its watches could use another
    cluster or identity than the operator's writes; the handler in disagg.handlers uses this.
    """
    cfg = await load_configuration(kubeconfig)
    if cfg.refresh_api_key_hook is not None:  # in-cluster: re-read a rotated token
        cfg.refresh_api_key_hook(cfg)
    auth = cfg.api_key.get("BearerToken")
    scheme, _, credential = (auth or "").partition(" ")
    return {
        "server": cfg.host,
        "ca_path": cfg.ssl_ca_cert or None,
        "insecure": not cfg.verify_ssl,
        "scheme": scheme or None,
        "token": credential or None,
        "certificate_path": cfg.cert_file or None,
        "private_key_path": cfg.key_file or None,
    }


class NotFound(Exception):
    pass


class Conflict(Exception):
    pass


class ApiError(Exception):
    """Any other non-2xx answer of the API server."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class Kube:
    """Async Kubernetes access on dicts. Create with `await Kube.connect()`."""

    def __init__(self, api: client.ApiClient, field_manager: str = FIELD_MANAGER) -> None:
        self.api = api
        self.field_manager = field_manager
        self.writes = 0  # count of mutating calls, for benchmarks and tests
        self.retries = 0  # repeated attempts after a timeout, dropped connection or 429/5xx
        self.request_timeout_s = REQUEST_TIMEOUT_S

    @classmethod
    async def connect(cls, kubeconfig: str | None = None, field_manager: str = FIELD_MANAGER) -> Kube:
        cfg = await load_configuration(kubeconfig)
        return cls(client.ApiClient(configuration=cfg), field_manager=field_manager)

    async def close(self) -> None:
        await self.api.close()

    async def _call(
        self,
        method: str,
        path: str,
        body: Any = None,
        query: list[tuple[str, str]] | None = None,
        content_type: str = "application/json",
    ) -> dict:
        headers = {"Accept": "application/json", "Content-Type": content_type}
        if method != "GET":
            self.writes += 1
        is_lease = "/leases" in path
        timeout = LEASE_REQUEST_TIMEOUT_S if is_lease else self.request_timeout_s
        attempts = ATTEMPTS if method in IDEMPOTENT_METHODS and not is_lease else 1
        for attempt in range(1, attempts + 1):
            try:
                resp = await self.api.call_api(
                    path,
                    method,
                    query_params=query or [],
                    header_params=headers,
                    body=body,
                    auth_settings=["BearerToken"],
                    _preload_content=False,
                    _return_http_data_only=True,
                    _request_timeout=timeout,
                )
                raw = await asyncio.wait_for(resp.read(), timeout)
                if resp.status not in RETRYABLE_STATUS or attempt == attempts:
                    break
                why = f"HTTP {resp.status}"
            except ApiException as exc:
                if exc.status == 404:
                    raise NotFound(path) from exc
                if exc.status == 409:
                    raise Conflict(f"{path}: {exc.reason}") from exc
                if exc.status not in RETRYABLE_STATUS or attempt == attempts:
                    raise
                why = f"{exc.status} {exc.reason}"
            except (TimeoutError, aiohttp.ClientError) as exc:
                why = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
                if attempt == attempts:
                    raise ApiError(
                        0,
                        f"{method} {path}: no answer from the API server ({why}) after {attempts} attempt(s)",
                    ) from exc
            self.retries += 1
            log.warning("%s %s failed (%s); attempt %d of %d", method, path, why, attempt + 1, attempts)
            await asyncio.sleep(RETRY_BACKOFF_S * 2 ** (attempt - 1))
        try:
            data = json.loads(raw) if raw else {}
        except ValueError:  # a proxy's HTML error page, say
            data = {}
        code = resp.status
        if not 200 <= code <= 299:
            message = (
                data.get("message") if isinstance(data, dict) and data else raw[:200].decode(errors="replace")
            )
            if code == 404:
                raise NotFound(f"{path}: {message}")
            if code == 409:
                raise Conflict(f"{path}: {message}")
            raise ApiError(code, f"{method} {path}: {code} {message}")
        return data

    # -- reads ---------------------------------------------------------------
    async def get(self, kind: str, namespace: str | None, name: str) -> dict:
        return await self._call("GET", resource_for(kind).path(namespace, name))

    async def get_or_none(self, kind: str, namespace: str | None, name: str) -> dict | None:
        try:
            return await self.get(kind, namespace, name)
        except NotFound:
            return None

    async def list(self, kind: str, namespace: str | None = None, selector: str | None = None) -> list[dict]:
        query = [("labelSelector", selector)] if selector else []
        res = resource_for(kind)
        out = await self._call("GET", res.path(namespace), query=query)
        items = out.get("items", [])
        for item in items:  # list items come without their kind
            item.setdefault("apiVersion", res.api_version)
            item.setdefault("kind", res.kind)
        return items

    async def served(self, kind: str) -> bool:
        """Does the API server serve `kind` (e.g. a CRD's kind)? From API discovery, which every
        authenticated client may read: GET /apis/<group>/<version> lists its resources."""
        res = resource_for(kind)
        base = "/api/v1" if res.api_version == "v1" else f"/apis/{res.api_version}"
        try:
            found = await self._call("GET", base)
        except NotFound:
            return False
        return any(r.get("name") == res.plural for r in found.get("resources") or [])

    # -- writes --------------------------------------------------------------
    async def apply(self, obj: dict, subresource: str | None = None, force: bool = True) -> dict:
        """Server-side apply of a whole object (or its status) as this operator's field manager."""
        res = resource_for(obj)
        meta = obj["metadata"]
        query = [("fieldManager", self.field_manager), ("force", "true" if force else "false")]
        return await self._call(
            "PATCH",
            res.path(meta.get("namespace"), meta["name"], subresource),
            body=obj,
            query=query,
            content_type="application/apply-patch+yaml",
        )

    async def create(self, obj: dict) -> dict:
        meta = obj["metadata"]
        return await self._call("POST", resource_for(obj).path(meta.get("namespace")), body=obj)

    async def patch(
        self,
        kind: str,
        namespace: str | None,
        name: str,
        patch: dict,
        subresource: str | None = None,
        patch_type: str = "merge",
    ) -> dict:
        ctype = {
            "merge": "application/merge-patch+json",
            "strategic": "application/strategic-merge-patch+json",
            "json": "application/json-patch+json",
        }[patch_type]
        return await self._call(
            "PATCH",
            resource_for(kind).path(namespace, name, subresource),
            body=patch,
            content_type=ctype,
        )

    async def delete(self, kind: str, namespace: str | None, name: str, uid: str | None = None) -> bool:
        body = {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Background"}
        if uid:
            body["preconditions"] = {"uid": uid}
        try:
            await self._call("DELETE", resource_for(kind).path(namespace, name), body=body)
            return True
        except NotFound:
            return False

    async def event(
        self, owner: dict, reason: str, message: str, type_: str = "Normal", action: str = "Reconcile"
    ) -> None:
        """Record a core/v1 Event on the owner (shown by `kubectl describe`)."""
        meta = owner["metadata"]
        now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        ev = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
            "involvedObject": {
                "apiVersion": owner.get("apiVersion", f"{GROUP}/{VERSION}"),
                "kind": owner.get("kind", KIND),
                "name": meta["name"],
                "namespace": meta["namespace"],
                "uid": meta.get("uid"),
            },
            "reason": reason,
            "message": message[:1024],
            "type": type_,
            "action": action,
            "source": {"component": FIELD_MANAGER},
            "reportingComponent": FIELD_MANAGER,
            "reportingInstance": os.environ.get("HOSTNAME", "local"),
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            await self._call("POST", resource_for("Event").path(meta["namespace"]), body=ev)
        except (ApiException, ApiError) as exc:  # events are best effort
            log.warning("could not record event %s on %s: %s", reason, meta["name"], exc)
