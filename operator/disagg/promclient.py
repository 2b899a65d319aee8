"""Prometheus access for the autoscaler (I/O side of disagg.metrics).

Uses prometheus-api-client (a synchronous `requests` client) in a worker
thread, so Kopf's event loop never blocks. Every query's failure is returned as
an exception object in the result map: disagg.metrics turns it into a
"missing" value, never a zero.
"""

from __future__ import annotations

import asyncio
import base64
import os
import tempfile
from collections.abc import Sequence
from typing import Any

from prometheus_api_client import PrometheusConnect
from urllib3.util.retry import Retry

from disagg import api
from disagg.kube import Kube
from disagg.metrics import Query


class PromClient:
    def __init__(
        self,
        url: str,
        token: str | None = None,
        insecure: bool = False,
        ca_file: str | None = None,
        timeout_s: float = 5.0,
    ) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else None
        self.url = url
        self.timeout_s = timeout_s
        # No retries inside the client: the loop retries next interval, and holds meanwhile.
        self._conn = PrometheusConnect(
            url=url, headers=headers, disable_ssl=insecure, timeout=timeout_s, retry=Retry(total=0)
        )
        if ca_file and not insecure:
            self._conn._session.verify = ca_file

    def _query(self, promql: str) -> list[dict[str, Any]]:
        return self._conn.custom_query(promql)

    async def query(self, promql: str) -> list[dict[str, Any]]:
        return await asyncio.to_thread(self._query, promql)

    async def run(self, queries: Sequence[Query]) -> dict[str, list[dict[str, Any]] | Exception]:
        """All queries concurrently; a failing query yields its exception."""

        async def one(q: Query) -> tuple[str, list[dict[str, Any]] | Exception]:
            try:
                return q.name, await asyncio.wait_for(self.query(q.promql), self.timeout_s + 1)
            except Exception as exc:
                return q.name, exc

        return dict(await asyncio.gather(*(one(q) for q in queries)))


_cache: dict[tuple, PromClient] = {}


async def _secret_value(kube: Kube, namespace: str, ref: api.SecretKeyRef) -> str:
    secret = await kube.get("Secret", namespace, ref.name)
    data = (secret.get("data") or {}).get(ref.key)
    if data is None:
        raise KeyError(f"Secret {namespace}/{ref.name} has no key {ref.key!r}")
    return base64.b64decode(data).decode()


async def client_for(
    kube: Kube, namespace: str, cfg: api.PrometheusConfig | None, default_url: str | None
) -> PromClient:
    """A client configured from the spec (URL, bearer token Secret, TLS), cached by its settings."""
    if cfg is None:
        if not default_url:
            raise ValueError(
                "no Prometheus URL: set spec.autoscaling.prometheus.url or the operator's --prometheus-url"
            )
        # The operator-wide Prometheus (the chart passes its credentials as environment).
        token = os.environ.get("DISAGG_PROMETHEUS_BEARER_TOKEN") or None
        insecure = os.environ.get("DISAGG_PROMETHEUS_INSECURE_SKIP_VERIFY", "").lower() in (
            "1",
            "true",
            "yes",
        )
        key: tuple = (default_url, token, insecure, None)
        if key not in _cache:
            _cache[key] = PromClient(default_url, token=token, insecure=insecure)
        return _cache[key]
    token = (
        await _secret_value(kube, namespace, cfg.bearer_token_secret_ref)
        if cfg.bearer_token_secret_ref
        else None
    )
    insecure = bool(cfg.tls and cfg.tls.insecure_skip_verify)
    ca = (
        await _secret_value(kube, namespace, cfg.tls.ca_secret_ref)
        if cfg.tls and cfg.tls.ca_secret_ref
        else None
    )
    key = (cfg.url, token, insecure, ca)
    if key not in _cache:
        ca_file = None
        if ca:
            with tempfile.NamedTemporaryFile("w", suffix=".pem", delete=False) as f:
                f.write(ca)
                ca_file = f.name
        _cache[key] = PromClient(cfg.url, token=token, insecure=insecure, ca_file=ca_file)
    return _cache[key]
