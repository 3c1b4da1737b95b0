"""The emulator's /_sim/ fault-injection API (emulator only)."""

from __future__ import annotations

import asyncio

import pytest

from tests.conformance.k8s.conftest import Kube

pytestmark = pytest.mark.emulator_only


async def test_readyz(kube: Kube) -> None:
    status, _ = await kube.request("GET", "/_sim/faults")
    assert status == 200
    response = await kube.api.rest_client.pool_manager.get(f"{kube.emulator_url}/_sim/readyz")
    assert response.status == 200 and await response.text() == "ok"


async def test_error_count_fails_next_matching_requests_only(kube: Kube) -> None:
    await kube.request(
        "POST",
        "/_sim/faults",
        {"error_count": 2, "error_code": 500, "verbs": ["list"], "resources": ["configmaps"]},
    )
    path = f"/api/v1/namespaces/{kube.namespace}/configmaps"
    status, _ = await kube.request("GET", f"/api/v1/namespaces/{kube.namespace}/pods")
    assert status == 200
    assert (await kube.request("GET", path))[0] == 500
    assert (await kube.request("GET", path))[0] == 500
    assert (await kube.request("GET", path))[0] == 200


async def test_error_rate_one_with_429_and_clear(kube: Kube) -> None:
    await kube.request(
        "POST", "/_sim/faults", {"error_rate": 1.0, "error_code": 429, "verbs": ["get"]}
    )
    status, body = await kube.request("GET", "/api/v1/namespaces/default/configmaps/x")
    assert status == 429 and body["reason"] == "TooManyRequests"
    await kube.request("DELETE", "/_sim/faults")
    status, _ = await kube.request("GET", "/api/v1/namespaces/default/configmaps/x")
    assert status == 404


async def test_gone_next_watch_sends_410_error_event(kube: Kube) -> None:
    await kube.request("POST", "/_sim/faults", {"gone_next_watches": 1})
    path = f"/api/v1/namespaces/{kube.namespace}/configmaps"
    events = await kube.watch(path, [], count=1)
    assert events[0]["type"] == "ERROR" and events[0]["object"]["code"] == 410
    listed = await kube.core.list_namespaced_config_map(kube.namespace)
    events = await kube.watch(
        path,
        [("resourceVersion", listed.metadata.resource_version), ("timeoutSeconds", "1")],
        count=1,
    )
    assert events == []


async def test_drop_watches_ends_open_streams(kube: Kube) -> None:
    listed = await kube.core.list_namespaced_config_map(kube.namespace)
    path = f"/api/v1/namespaces/{kube.namespace}/configmaps"
    task = asyncio.create_task(
        kube.watch(
            path, [("resourceVersion", listed.metadata.resource_version)], count=1, timeout=10
        )
    )
    await asyncio.sleep(0.2)
    status, body = await kube.request("POST", "/_sim/faults", {"drop_watches": True})
    assert status == 200 and body["dropped_watches"] >= 1
    events = await asyncio.wait_for(task, 5)
    assert events == []


async def test_latency_is_added(kube: Kube) -> None:
    await kube.request("POST", "/_sim/faults", {"latency_ms": 200})
    loop = asyncio.get_running_loop()
    start = loop.time()
    await kube.core.list_namespaced_config_map(kube.namespace)
    assert loop.time() - start >= 0.2
