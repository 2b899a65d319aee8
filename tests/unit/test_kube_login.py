"""Kopf's login and the operator's client take their credentials from the same place."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from disagg import kube


def write_kubeconfig(path: Path, server: str, token: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        f"""apiVersion: v1
kind: Config
clusters:
- name: c
  cluster: {{server: "{server}", insecure-skip-tls-verify: true}}
users:
- name: u
  user: {{token: "{token}"}}
contexts:
- name: ctx
  context: {{cluster: c, user: u}}
current-context: ctx
"""
    )
    return path


def test_login_uses_the_given_file_not_home(tmp_path, monkeypatch):
    home = tmp_path / "home"
    write_kubeconfig(home / ".kube" / "config", "https://127.0.0.1:9", "home-token")
    given = write_kubeconfig(tmp_path / "given.kubeconfig", "https://127.0.0.1:6443", "given-token")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    info = asyncio.run(kube.login_settings(str(given)))
    assert info["server"] == "https://127.0.0.1:6443"
    assert (info["scheme"], info["token"]) == ("Bearer", "given-token")
    assert info["insecure"] is True


def test_missing_credentials_say_where_they_were_looked_for(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(RuntimeError, match="--kubeconfig"):
        asyncio.run(kube.login_settings(str(tmp_path / "absent.kubeconfig")))


def test_login_handler_replaces_kopfs_default_login():
    import kopf

    from disagg import handlers

    registry = kopf.get_default_registry()
    ids = [h.id for h in registry._activities.get_all_handlers()]
    assert any(i.endswith("login") for i in ids), ids
    assert handlers.login is not None
