"""Prometheus access for the autoscaler (I/O side of disagg.metrics).

A synchronous `requests` session in a worker thread, so Kopf's event loop never blocks.
Every query's failure is returned as a `metrics.QueryFailed` in the result map:
disagg.metrics turns it into a "missing" value, never a zero.

Two rules keep a DisaggDeployment from turning the operator into a confused deputy:

* a per-object `spec.autoscaling.prometheus.url` is used only when it starts with one of the
  URL prefixes the cluster admin allowed (`disagg run --allow-prometheus-url`, the chart's
  `prometheus.allowedUrls`); otherwise the operator-wide Prometheus is the only one;
* a Secret named by `bearerTokenSecretRef` / `caSecretRef` is used only when the admin allowed
  its name (`--allow-prometheus-secret NAMESPACE/NAME`) or it carries the label
  `disagg.dev/prometheus-credentials: "true"` (its owner opted in), and always from the
  DisaggDeployment's own namespace.

A reply that is not 200 is reported by its status code and a fixed reason, never its body.
"""

from __future__ import annotations

import asyncio
import base64
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import requests

from disagg import api
from disagg.kube import Kube, NotFound
from disagg.metrics import Query, QueryFailed
from disagg.names import LABEL_PROMETHEUS_CREDENTIALS

#: Fixed reasons by HTTP status: what is shown instead of the reply's body.
STATUS_REASONS = {
    400: "bad query",
    401: "unauthorized (check the bearer token)",
    403: "forbidden (check the bearer token's permissions)",
    404: "not found (check the URL)",
    422: "query could not be executed",
    429: "too many requests",
    503: "unavailable",
}


def status_reason(code: int) -> str:
    return STATUS_REASONS.get(code, "server error" if code >= 500 else "unexpected reply")


@dataclass
class AccessPolicy:
    """What the cluster admin allows DisaggDeployments to point the operator at."""

    allowed_url_prefixes: tuple[str, ...] = ()
    allowed_secrets: frozenset[str] = field(default_factory=frozenset)  # "namespace/name"

    def url_allowed(self, url: str) -> bool:
        return any(url == p or url.startswith(p.rstrip("/") + "/") for p in self.allowed_url_prefixes)


#: Set by `disagg run` from its flags.
POLICY = AccessPolicy()


class PromClient:
    def __init__(
        self,
        url: str,
        token: str | None = None,
        insecure: bool = False,
        ca_file: str | None = None,
        timeout_s: float = 5.0,
    ) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        # No retries inside the client: the loop retries next interval, and holds meanwhile.
        self._session = requests.Session()
        if token:
            self._session.headers["Authorization"] = f"Bearer {token}"
        self._session.verify = False if insecure else (ca_file or True)

    def _query(self, promql: str) -> list[dict[str, Any]]:
        try:
            resp = self._session.get(
                f"{self.url}/api/v1/query", params={"query": promql}, timeout=self.timeout_s
            )
        except requests.Timeout:
            raise QueryFailed(f"Prometheus did not answer within {self.timeout_s:g} s") from None
        except requests.RequestException as exc:
            raise QueryFailed(f"cannot reach Prometheus ({type(exc).__name__})") from None
        if resp.status_code != 200:
            raise QueryFailed(
                f"Prometheus answered HTTP {resp.status_code}: {status_reason(resp.status_code)}"
            )
        try:
            body = resp.json()
            if body.get("status") != "success":
                raise ValueError
            result = body["data"]["result"]
        except (ValueError, KeyError, TypeError, AttributeError):
            raise QueryFailed("Prometheus answered 200 with no query result") from None
        if not isinstance(result, list):
            raise QueryFailed("Prometheus answered 200 with a non-vector result")
        return result

    async def query(self, promql: str) -> list[dict[str, Any]]:
        return await asyncio.to_thread(self._query, promql)

    async def run(self, queries: Sequence[Query]) -> dict[str, list[dict[str, Any]] | Exception]:
        """All queries concurrently; a failing query yields its exception."""

        async def one(q: Query) -> tuple[str, list[dict[str, Any]] | Exception]:
            try:
                return q.name, await asyncio.wait_for(self.query(q.promql), self.timeout_s + 1)
            except TimeoutError:
                return q.name, QueryFailed(f"Prometheus did not answer within {self.timeout_s:g} s")
            except Exception as exc:
                return q.name, exc

        return dict(await asyncio.gather(*(one(q) for q in queries)))


_cache: dict[tuple, PromClient] = {}


async def _secret_value(kube: Kube, namespace: str, ref: api.SecretKeyRef, policy: AccessPolicy) -> str:
    try:
        secret = await kube.get("Secret", namespace, ref.name)
    except NotFound:
        raise QueryFailed(f"Secret {namespace}/{ref.name} not found") from None
    labels = (secret.get("metadata") or {}).get("labels") or {}
    if (
        f"{namespace}/{ref.name}" not in policy.allowed_secrets
        and labels.get(LABEL_PROMETHEUS_CREDENTIALS) != "true"
    ):
        raise QueryFailed(
            f"Secret {namespace}/{ref.name} is not allowed as Prometheus credentials: label it "
            f'{LABEL_PROMETHEUS_CREDENTIALS}="true" or ask the cluster admin to allow it'
        )
    data = (secret.get("data") or {}).get(ref.key)
    if data is None:
        raise QueryFailed(f"Secret {namespace}/{ref.name} has no key {ref.key!r}")
    return base64.b64decode(data).decode()


def _default_client(default_url: str | None) -> PromClient:
    if not default_url:
        raise QueryFailed("no Prometheus URL: the operator has no --prometheus-url")
    # The operator-wide Prometheus. The chart mounts its token Secret as a file (re-read here,
    # so a rotated token takes effect); $DISAGG_PROMETHEUS_BEARER_TOKEN also works.
    token = os.environ.get("DISAGG_PROMETHEUS_BEARER_TOKEN") or None
    token_file = os.environ.get("DISAGG_PROMETHEUS_BEARER_TOKEN_FILE")
    if token_file:
        try:
            with open(token_file) as f:
                token = f.read().strip() or None
        except OSError as exc:
            raise QueryFailed(f"cannot read the Prometheus token file ({type(exc).__name__})") from None
    insecure = os.environ.get("DISAGG_PROMETHEUS_INSECURE_SKIP_VERIFY", "").lower() in ("1", "true", "yes")
    key: tuple = (default_url, token, insecure, None)
    if key not in _cache:
        _cache[key] = PromClient(default_url, token=token, insecure=insecure)
    return _cache[key]


async def client_for(
    kube: Kube,
    namespace: str,
    cfg: api.PrometheusConfig | None,
    default_url: str | None,
    policy: AccessPolicy | None = None,
) -> PromClient:
    """A client configured from the spec (URL, bearer token Secret, TLS), cached by its settings."""
    policy = POLICY if policy is None else policy
    if cfg is None:
        return _default_client(default_url)
    if not policy.url_allowed(cfg.url):
        raise QueryFailed(
            "spec.autoscaling.prometheus.url is not in the operator's allowed Prometheus URLs "
            "(chart value prometheus.allowedUrls); remove it to use the operator's Prometheus"
        )
    token = (
        await _secret_value(kube, namespace, cfg.bearer_token_secret_ref, policy)
        if cfg.bearer_token_secret_ref
        else None
    )
    insecure = bool(cfg.tls and cfg.tls.insecure_skip_verify)
    ca = (
        await _secret_value(kube, namespace, cfg.tls.ca_secret_ref, policy)
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
