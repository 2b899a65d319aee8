"""Prometheus access: no reply body reaches the status, and no object picks the URL or Secret freely."""

from __future__ import annotations

import asyncio
import base64
import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from disagg import api, metrics, names, promclient
from disagg.kube import NotFound

BODY = "<html>internal-hostname-10.1.2.3 ERROR token=abcdef</html>"


class Handler(BaseHTTPRequestHandler):
    status = 500
    seen_auth: list[str | None] = []

    def do_GET(self) -> None:
        Handler.seen_auth.append(self.headers.get("Authorization"))
        payload = (
            json.dumps({"status": "success", "data": {"resultType": "vector", "result": []}})
            if self.status == 200
            else BODY
        ).encode()
        self.send_response(self.status)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def server():
    srv = HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    Handler.seen_auth = []
    yield srv
    srv.shutdown()
    srv.server_close()


@pytest.mark.parametrize("status", [400, 401, 403, 404, 422, 500, 502, 503])
def test_non_200_reply_reports_status_and_fixed_reason_never_the_body(server, status):
    Handler.status = status
    client = promclient.PromClient(f"http://127.0.0.1:{server.server_port}")
    q = metrics.Query("arrival_rps", "up", "scalar")
    results = asyncio.run(client.run([q]))
    snap = metrics.build_snapshot([q], results, 0.0, 15.0, {})
    reason = snap.reason()
    assert f"HTTP {status}" in reason and promclient.status_reason(status) in reason
    assert "internal-hostname" not in reason and "token=" not in reason and "html" not in reason


def test_200_reply_is_parsed(server):
    Handler.status = 200
    client = promclient.PromClient(f"http://127.0.0.1:{server.server_port}", token="t0k")
    assert asyncio.run(client.query("up")) == []
    assert Handler.seen_auth == ["Bearer t0k"]


def test_unreachable_prometheus_is_reported_without_details():
    client = promclient.PromClient("http://127.0.0.1:9", timeout_s=1)
    with pytest.raises(metrics.QueryFailed, match="cannot reach Prometheus"):
        client._query("up")


def test_other_exceptions_show_only_their_type():
    q = metrics.Query("arrival_rps", "up", "scalar")
    snap = metrics.build_snapshot([q], {"arrival_rps": RuntimeError(BODY)}, 0.0, 15.0, {})
    assert "RuntimeError" in snap.reason() and "internal-hostname" not in snap.reason()


class SecretKube:
    def __init__(self, secrets: dict[tuple[str, str], dict]) -> None:
        self.secrets = secrets
        self.reads: list[tuple[str, str]] = []

    async def get(self, kind: str, namespace: str, name: str) -> dict:
        assert kind == "Secret"
        self.reads.append((namespace, name))
        if (namespace, name) not in self.secrets:
            raise NotFound(name)
        return self.secrets[(namespace, name)]


def secret(labels: dict[str, str] | None = None) -> dict:
    return {"metadata": {"labels": labels or {}}, "data": {"token": base64.b64encode(b"s3cret").decode()}}


def prom_cfg(url: str = "http://prom.team-a:9090", with_token: bool = True) -> api.PrometheusConfig:
    raw: dict = {"url": url}
    if with_token:
        raw["bearerTokenSecretRef"] = {"name": "prom-token", "key": "token"}
    return api.PrometheusConfig.model_validate(raw)


def client_for(kube, cfg, policy):
    promclient._cache.clear()
    return asyncio.run(promclient.client_for(kube, "team-a", cfg, "http://default:9090", policy))


def test_per_object_url_needs_the_admins_allow_list():
    kube = SecretKube({})
    with pytest.raises(metrics.QueryFailed, match="not in the operator's allowed Prometheus URLs"):
        client_for(kube, prom_cfg(with_token=False), promclient.AccessPolicy())
    with pytest.raises(metrics.QueryFailed, match="allowed Prometheus URLs"):  # prefix, not substring
        client_for(
            kube,
            prom_cfg("http://prom.team-a:9090.evil.example", with_token=False),
            promclient.AccessPolicy(("http://prom.team-a:9090",)),
        )
    ok = client_for(kube, prom_cfg(with_token=False), promclient.AccessPolicy(("http://prom.team-a:9090",)))
    assert ok.url == "http://prom.team-a:9090"


def test_unset_url_uses_the_operators_prometheus():
    assert client_for(SecretKube({}), None, promclient.AccessPolicy()).url == "http://default:9090"


def test_secret_needs_the_label_or_the_admins_allow_list():
    allowed_url = ("http://prom.team-a:9090",)
    unlabelled = SecretKube({("team-a", "prom-token"): secret()})
    with pytest.raises(metrics.QueryFailed, match="not allowed as Prometheus credentials"):
        client_for(unlabelled, prom_cfg(), promclient.AccessPolicy(allowed_url))
    labelled = SecretKube({("team-a", "prom-token"): secret({names.LABEL_PROMETHEUS_CREDENTIALS: "true"})})
    assert (
        client_for(labelled, prom_cfg(), promclient.AccessPolicy(allowed_url))._session.headers[
            "Authorization"
        ]
        == "Bearer s3cret"
    )
    named = promclient.AccessPolicy(allowed_url, frozenset({"team-a/prom-token"}))
    assert client_for(unlabelled, prom_cfg(), named)._session.headers["Authorization"] == "Bearer s3cret"


def test_no_secret_is_read_for_a_url_that_is_not_allowed():
    kube = SecretKube({("team-a", "prom-token"): secret({names.LABEL_PROMETHEUS_CREDENTIALS: "true"})})
    with pytest.raises(metrics.QueryFailed):
        client_for(
            kube, prom_cfg("http://attacker:9090"), promclient.AccessPolicy(("http://prom.team-a:9090",))
        )
    assert kube.reads == []


def test_operator_token_is_read_from_the_mounted_file(tmp_path, monkeypatch):
    token_file = tmp_path / "token"
    token_file.write_text("from-file\n")
    monkeypatch.delenv("DISAGG_PROMETHEUS_BEARER_TOKEN", raising=False)
    monkeypatch.setenv("DISAGG_PROMETHEUS_BEARER_TOKEN_FILE", str(token_file))
    promclient._cache.clear()
    c = promclient._default_client("http://default:9090")
    assert c._session.headers["Authorization"] == "Bearer from-file"
