"""Watch semantics: event types, resourceVersion replay, bookmarks, 410 Gone."""

from __future__ import annotations

import asyncio

import pytest

from tests.conformance.k8s.conftest import Kube, created_by_tests


async def test_watch_from_list_version_streams_added_modified_deleted(kube: Kube) -> None:
    listed = await kube.core.list_namespaced_config_map(kube.namespace)
    rv = listed.metadata.resource_version
    path = f"/api/v1/namespaces/{kube.namespace}/configmaps"
    await kube.core.create_namespaced_config_map(kube.namespace, {"metadata": {"name": "w"}})
    await kube.core.patch_namespaced_config_map("w", kube.namespace, {"data": {"k": "v"}})
    await kube.core.delete_namespaced_config_map("w", kube.namespace)
    events = await kube.watch(path, [("resourceVersion", rv)], count=3)
    assert [e["type"] for e in events] == ["ADDED", "MODIFIED", "DELETED"]
    versions = [int(e["object"]["metadata"]["resourceVersion"]) for e in events]
    assert versions == sorted(versions) and versions[0] > int(rv)
    assert events[1]["object"]["data"] == {"k": "v"}


async def test_watch_without_resource_version_starts_with_current_objects(kube: Kube) -> None:
    await kube.core.create_namespaced_config_map(kube.namespace, {"metadata": {"name": "pre"}})
    # Two objects exist: the test's and the namespace's root CA ConfigMap.
    events = await kube.watch(f"/api/v1/namespaces/{kube.namespace}/configmaps", [], count=2)
    assert [e["type"] for e in events] == ["ADDED", "ADDED"]
    assert created_by_tests([e["object"]["metadata"]["name"] for e in events]) == ["pre"]


async def test_watch_delivers_live_events(kube: Kube) -> None:
    listed = await kube.core.list_namespaced_config_map(kube.namespace)
    path = f"/api/v1/namespaces/{kube.namespace}/configmaps"
    task = asyncio.create_task(
        kube.watch(path, [("resourceVersion", listed.metadata.resource_version)], count=1)
    )
    await asyncio.sleep(0.2)
    await kube.core.create_namespaced_config_map(kube.namespace, {"metadata": {"name": "live"}})
    events = await task
    assert events[0]["type"] == "ADDED"
    assert events[0]["object"]["metadata"]["name"] == "live"


async def test_watch_with_label_selector_reports_objects_leaving_the_selection(kube: Kube) -> None:
    listed = await kube.core.list_namespaced_config_map(kube.namespace)
    rv = listed.metadata.resource_version
    await kube.core.create_namespaced_config_map(
        kube.namespace, {"metadata": {"name": "sel", "labels": {"team": "a"}}}
    )
    await kube.core.patch_namespaced_config_map(
        "sel", kube.namespace, {"metadata": {"labels": {"team": "b"}}}
    )
    events = await kube.watch(
        f"/api/v1/namespaces/{kube.namespace}/configmaps",
        [("resourceVersion", rv), ("labelSelector", "team=a")],
        count=2,
    )
    assert [e["type"] for e in events] == ["ADDED", "DELETED"]


async def test_watch_with_bookmarks_sends_bookmark_events(kube: Kube) -> None:
    listed = await kube.core.list_namespaced_config_map(kube.namespace)
    events = await kube.watch(
        f"/api/v1/namespaces/{kube.namespace}/configmaps",
        [("resourceVersion", listed.metadata.resource_version), ("allowWatchBookmarks", "true")],
        count=1,
        timeout=75,
    )
    assert events[0]["type"] == "BOOKMARK"
    assert int(events[0]["object"]["metadata"]["resourceVersion"]) >= int(
        listed.metadata.resource_version
    )


async def test_watch_timeout_seconds_ends_the_stream(kube: Kube) -> None:
    listed = await kube.core.list_namespaced_config_map(kube.namespace)
    events = await kube.watch(
        f"/api/v1/namespaces/{kube.namespace}/configmaps",
        [("resourceVersion", listed.metadata.resource_version), ("timeoutSeconds", "1")],
        count=1,
        timeout=5,
    )
    assert events == []


@pytest.mark.emulator_only
async def test_watch_from_compacted_version_gets_410_error_event(kube: Kube) -> None:
    listed = await kube.core.list_namespaced_config_map(kube.namespace)
    old = listed.metadata.resource_version
    await kube.core.create_namespaced_config_map(kube.namespace, {"metadata": {"name": "c"}})
    status, _ = await kube.request("POST", "/_sim/faults", {"compact": True})
    assert status == 200
    events = await kube.watch(
        f"/api/v1/namespaces/{kube.namespace}/configmaps", [("resourceVersion", old)], count=1
    )
    assert events[0]["type"] == "ERROR"
    assert events[0]["object"]["code"] == 410
    assert events[0]["object"]["reason"] == "Expired"


@pytest.mark.emulator_only
async def test_list_with_expired_continue_token_is_410(kube: Kube) -> None:
    for i in range(3):
        await kube.core.create_namespaced_config_map(
            kube.namespace, {"metadata": {"name": f"e{i}"}}
        )
    first = await kube.core.list_namespaced_config_map(kube.namespace, limit=1)
    await kube.core.create_namespaced_config_map(kube.namespace, {"metadata": {"name": "later"}})
    await kube.request("POST", "/_sim/faults", {"compact": True})
    status, body = await kube.request(
        "GET",
        f"/api/v1/namespaces/{kube.namespace}/configmaps",
        query=[("limit", "1"), ("continue", first.metadata._continue)],
    )
    assert status == 410
    assert body["reason"] == "Expired"


async def test_watch_single_object_by_name(kube: Kube) -> None:
    listed = await kube.core.list_namespaced_config_map(kube.namespace)
    rv = listed.metadata.resource_version
    await kube.core.create_namespaced_config_map(kube.namespace, {"metadata": {"name": "one"}})
    await kube.core.create_namespaced_config_map(kube.namespace, {"metadata": {"name": "two"}})
    events = await kube.watch(
        f"/api/v1/namespaces/{kube.namespace}/configmaps",
        [("resourceVersion", rv), ("fieldSelector", "metadata.name=two")],
        count=1,
    )
    assert events[0]["object"]["metadata"]["name"] == "two"
