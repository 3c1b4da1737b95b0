"""Fixtures for the Kubernetes API conformance suite.

The suite talks to a server through kubernetes-asyncio only.  With
``NODEFLOW_CONFORMANCE_KUBECONFIG`` set it runs against that server (for example a real
kube-apiserver); otherwise every test gets a fresh in-process emulator.  Tests create their
objects in a fresh namespace and use unique names for cluster-scoped objects, so they also pass
on a shared real cluster.  Tests marked ``emulator_only`` use the emulator's /_sim/ admin API.
"""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client, config

from clustersim.kube.server import serve
from clustersim.kube.store import ROOT_CA_CONFIGMAP, Store

KUBECONFIG_ENV = "NODEFLOW_CONFORMANCE_KUBECONFIG"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "emulator_only: uses the emulator's /_sim/ admin API")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Against an external server the emulator-only tests do not apply: deselect them (a skip
    would fail under CI=true, and these are not missing, they are not this target's)."""
    if not os.environ.get(KUBECONFIG_ENV):
        return
    deselected = [item for item in items if "emulator_only" in item.keywords]
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = [item for item in items if "emulator_only" not in item.keywords]


def created_by_tests(names: list[str]) -> list[str]:
    """Names without the ConfigMap kube-controller-manager publishes in every namespace (the
    emulator publishes it too): a test asserting on a collection asserts on its own objects."""
    return [name for name in names if name != ROOT_CA_CONFIGMAP]


async def _settled(kube: Kube) -> None:
    """A new namespace on a real cluster gets the root CA ConfigMap a moment after it exists;
    tests start once it is there, so no controller writes into their namespace mid-test."""
    for _ in range(200):
        try:
            await kube.core.read_namespaced_config_map(ROOT_CA_CONFIGMAP, kube.namespace)
            return
        except client.ApiException as exc:
            if exc.status != 404:
                raise
        await asyncio.sleep(0.05)
    raise AssertionError(f"{ROOT_CA_CONFIGMAP} never published in {kube.namespace}")


@dataclass
class Kube:
    """A connected API server: kubernetes-asyncio clients plus raw helpers.

    The typed API classes are exposed as ``Any`` because the tests pass plain manifest dicts,
    which kubernetes-asyncio serialises as they are (its stubs only name the model classes).
    """

    api: client.ApiClient
    kubeconfig: Path
    namespace: str
    emulator_url: str | None

    @property
    def core(self) -> Any:
        return client.CoreV1Api(self.api)

    @property
    def batch(self) -> Any:
        return client.BatchV1Api(self.api)

    @property
    def policy(self) -> Any:
        return client.PolicyV1Api(self.api)

    @property
    def coordination(self) -> Any:
        return client.CoordinationV1Api(self.api)

    @property
    def custom(self) -> Any:
        return client.CustomObjectsApi(self.api)

    @property
    def ext(self) -> Any:
        return client.ApiextensionsV1Api(self.api)

    def unique(self, prefix: str) -> str:
        return f"{prefix}-{uuid.uuid4().hex[:8]}"

    async def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        query: list[tuple[str, Any]] | None = None,
        content_type: str = "application/json",
        accept: str = "application/json",
    ) -> tuple[int, Any]:
        """A raw API call through the ApiClient; returns (HTTP status, decoded JSON body), or
        the body as text where it is not JSON (a real API server answers a path outside every
        API group with a plain `404 page not found`)."""
        try:
            response = await self.api.call_api(
                path,
                method,
                query_params=query or [],
                header_params={"Content-Type": content_type, "Accept": accept},
                body=body,
                _preload_content=False,
                auth_settings=["BearerToken"],
            )
        except client.ApiException as exc:
            return exc.status, _decoded(exc.body)
        raw = await response.read()
        status = response.status
        return status, _decoded(raw)

    async def watch(
        self,
        path: str,
        query: list[tuple[str, Any]],
        *,
        count: int,
        timeout: float = 5.0,
        accept: str = "application/json",
    ) -> list[dict[str, Any]]:
        """Open a watch and collect ``count`` events (or fewer if the stream ends)."""
        response = await self.api.call_api(
            path,
            "GET",
            query_params=[("watch", "true"), *query],
            header_params={"Accept": accept},
            _preload_content=False,
            auth_settings=["BearerToken"],
        )
        events: list[dict[str, Any]] = []
        try:
            async with asyncio.timeout(timeout):
                while len(events) < count:
                    line = await response.content.readline()
                    if not line:
                        break
                    if line.strip():
                        events.append(json.loads(line))
        except TimeoutError:
            pass  # callers assert on what arrived in time
        finally:
            response.close()
        return events


def _decoded(body: str | bytes | None) -> Any:
    if not body:
        return None
    try:
        return json.loads(body)
    except ValueError:
        return body.decode() if isinstance(body, bytes) else body


async def _client_for(kubeconfig: Path) -> client.ApiClient:
    configuration = client.Configuration()
    await config.load_kube_config(config_file=str(kubeconfig), client_configuration=configuration)
    return client.ApiClient(configuration)


@pytest.fixture
async def kube(tmp_path: Path) -> AsyncIterator[Kube]:
    external = os.environ.get(KUBECONFIG_ENV)
    if external:
        api = await _client_for(Path(external))
        kube = Kube(api, Path(external), "", None)
        ns = await kube.core.create_namespace({"metadata": {"generateName": "conformance-"}})
        kube.namespace = ns.metadata.name
        await _settled(kube)
        try:
            yield kube
        finally:
            await kube.core.delete_namespace(kube.namespace)
            await api.close()
        return
    async with serve(Store(bookmark_interval=0.5), kubeconfig_path=tmp_path / "kubeconfig") as srv:
        api = await _client_for(srv.kubeconfig_path)
        kube = Kube(api, srv.kubeconfig_path, "", srv.url)
        ns = await kube.core.create_namespace({"metadata": {"generateName": "conformance-"}})
        kube.namespace = ns.metadata.name
        try:
            yield kube
        finally:
            await api.close()
