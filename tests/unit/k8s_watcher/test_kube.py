"""The API client: proxy settings resolved once, no per-request environment lookups."""

from __future__ import annotations

from pathlib import Path

import pytest

from k8s_watcher.kube import env_proxy_for, load_api_client

KUBECONFIG = """apiVersion: v1
kind: Config
clusters:
- name: c
  cluster: {server: "http://127.0.0.1:6443"}
users:
- name: u
  user: {token: t}
contexts:
- name: x
  context: {cluster: c, user: u}
current-context: x
"""


@pytest.fixture(autouse=True)
def no_proxy_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy"):
        monkeypatch.delenv(name, raising=False)


def test_env_proxy_applies_unless_no_proxy_names_the_host(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert env_proxy_for("https://api.example:6443") is None
    monkeypatch.setenv("HTTPS_PROXY", "http://user:pw@proxy.example:3128")
    proxy = env_proxy_for("https://api.example:6443")
    assert proxy is not None
    url, authorization = proxy
    assert url == "http://proxy.example:3128" and authorization.startswith("Basic ")
    monkeypatch.setenv("NO_PROXY", "api.example")
    assert env_proxy_for("https://api.example:6443") is None


async def test_client_session_does_not_consult_the_environment_per_request(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "kubeconfig"
    path.write_text(KUBECONFIG)
    api = await load_api_client(str(path))
    try:
        assert api.rest_client.pool_manager.trust_env is False
        assert not api.rest_client.proxy
    finally:
        await api.close()
    monkeypatch.setenv("HTTP_PROXY", "http://proxy.example:3128")
    api = await load_api_client(str(path))
    try:
        # The proxy environment still applies: resolved once, passed with every request.
        assert api.rest_client.proxy == "http://proxy.example:3128"
    finally:
        await api.close()
