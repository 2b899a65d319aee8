"""The only module that talks to the Kubernetes API.

A thin asynchronous wrapper over kubernetes_asyncio's ApiClient that works on
plain dicts (the builders return dicts): server-side apply, get, list, patch,
delete and events, for the handful of kinds the operator touches. Every call is
awaited on Kopf's event loop; nothing here blocks it.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
from dataclasses import dataclass
from typing import Any

from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException

from disagg.api import GROUP, KIND, PLURAL, VERSION

log = logging.getLogger("disagg.kube")

FIELD_MANAGER = "disagg-operator"


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
}


def resource_for(obj_or_kind: dict | str) -> Resource:
    kind = obj_or_kind if isinstance(obj_or_kind, str) else obj_or_kind["kind"]
    try:
        return RESOURCES[kind]
    except KeyError:
        raise ValueError(f"disagg.kube does not handle kind {kind!r}") from None


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

    @classmethod
    async def connect(cls, kubeconfig: str | None = None, field_manager: str = FIELD_MANAGER) -> Kube:
        cfg = client.Configuration()
        if os.environ.get("KUBERNETES_SERVICE_HOST") and not (kubeconfig or os.environ.get("KUBECONFIG")):
            config.load_incluster_config(client_configuration=cfg)
        else:
            await config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
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
            )
        except ApiException as exc:
            if exc.status == 404:
                raise NotFound(path) from exc
            if exc.status == 409:
                raise Conflict(f"{path}: {exc.reason}") from exc
            raise
        raw = await resp.read()
        data = json.loads(raw) if raw else {}
        code = resp.status
        if not 200 <= code <= 299:
            message = data.get("message") if isinstance(data, dict) else str(raw[:500])
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
