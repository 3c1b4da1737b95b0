"""k8s-watcher mirrors the Kubernetes API into KV and events (emulator over HTTP, real NATS)."""

from __future__ import annotations

import asyncio

from tests.integration.k8s_watcher.conftest import Harness, node, pod, wait_until


async def test_initial_list_mirrors_objects_into_kv_per_kind_without_managed_fields(
    harness: Harness,
) -> None:
    harness.store.create("nodes", node("gpu-001", pool="a100"))
    created = harness.store.create("pods", pod("train-0", app="train"))
    harness.store.patch(
        "pods", "train-0", {"metadata": {"managedFields": [{"manager": "x"}]}}, namespace="default"
    )
    await harness.start_watcher()

    stored_node = await harness.kv_get("Node", "_.gpu-001")
    stored_pod = await harness.kv_get("Pod", "default.train-0")
    assert stored_node is not None and stored_node["metadata"]["labels"] == {"pool": "a100"}
    assert stored_pod is not None and stored_pod["metadata"]["uid"] == created["metadata"]["uid"]
    assert "managedFields" not in stored_pod["metadata"]
    assert stored_pod["kind"] == "Pod" and stored_pod["apiVersion"] == "v1"
    await wait_until(lambda: harness.event_types("Pod", "train-0", "default") == ["ADDED"])
    (event,) = harness.events_of("Pod", "train-0", "default")
    assert event.resource_version == stored_pod["metadata"]["resourceVersion"]
    assert event.msg_id == f"{event.uid}:{event.resource_version}:ADDED"


async def test_each_change_is_an_event_with_type_and_resource_version_and_delete_removes_key(
    harness: Harness,
) -> None:
    await harness.start_watcher()
    created = harness.store.create("pods", pod("web-0"))
    modified = harness.store.patch(
        "pods", "web-0", {"metadata": {"labels": {"v": "2"}}}, namespace="default"
    )
    await wait_until(lambda: len(harness.events_of("Pod", "web-0", "default")) == 2)
    stored = await harness.kv_get("Pod", "default.web-0")
    assert stored is not None and stored["metadata"]["labels"] == {"v": "2"}
    harness.store.delete("pods", "web-0", "default", grace_period_seconds=0)
    await wait_until(lambda: len(harness.events_of("Pod", "web-0", "default")) == 3)

    events = harness.events_of("Pod", "web-0", "default")
    assert [e.type for e in events] == ["ADDED", "MODIFIED", "DELETED"]
    assert events[0].resource_version == created["metadata"]["resourceVersion"]
    assert events[1].resource_version == modified["metadata"]["resourceVersion"]
    assert events[1].object["metadata"]["labels"] == {"v": "2"}
    assert {e.uid for e in events} == {created["metadata"]["uid"]}
    assert await harness.kv_get("Pod", "default.web-0") is None
    assert "default.web-0" not in await harness.kv_keys("Pod")


async def test_custom_resources_and_cluster_scoped_kinds_are_mirrored(harness: Harness) -> None:
    await harness.start_watcher()
    harness.store.create(
        "nodeslices",
        {
            "apiVersion": "nodeflow.dev/v1alpha1",
            "kind": "NodeSlice",
            "metadata": {"name": "gpu-0", "namespace": "default"},
            "spec": {"nodeSetName": "gpu", "nodes": ["gpu-001"]},
        },
    )
    harness.store.create("nodes", node("gpu-002"))
    await wait_until(lambda: harness.event_types("NodeSlice", "gpu-0", "default") == ["ADDED"])
    await wait_until(lambda: harness.event_types("Node", "gpu-002") == ["ADDED"])
    (event,) = harness.events_of("NodeSlice", "gpu-0", "default")
    assert event.subject == "k8s.v1.nodeslice.default.gpu-0"
    assert event.api_version == "nodeflow.dev/v1alpha1"
    assert harness.events_of("Node", "gpu-002")[0].subject == "k8s.v1.node._.gpu-002"
    assert await harness.kv_get("NodeSlice", "default.gpu-0") is not None


async def test_dropped_watch_resumes_from_last_resource_version_without_relist_or_duplicates(
    harness: Harness,
) -> None:
    harness.store.create("pods", pod("a"))
    watcher = await harness.start_watcher(watched_kinds=("Pod",))
    (informer,) = watcher.informers
    await wait_until(lambda: harness.event_types("Pod", "a", "default") == ["ADDED"])
    # Refuse the reconnect for a while so that changes pile up behind the dropped watch.
    await harness.faults(error_count=3, verbs=["watch"], error_code=500)
    await harness.faults(drop_watches=True)
    harness.store.patch("pods", "a", {"metadata": {"labels": {"x": "1"}}}, namespace="default")
    harness.store.create("pods", pod("b"))
    await wait_until(lambda: harness.event_types("Pod", "b", "default") == ["ADDED"])
    await wait_until(lambda: harness.event_types("Pod", "a", "default") == ["ADDED", "MODIFIED"])
    assert informer.relists == 1
    assert informer.watches >= 2
    assert await harness.stored_event_count() == 3


async def test_410_relist_publishes_deleted_for_vanished_and_modified_only_for_changed(
    harness: Harness,
) -> None:
    for name in ("keep", "change", "vanish"):
        harness.store.create("pods", pod(name))
    watcher = await harness.start_watcher(watched_kinds=("Pod",))
    (informer,) = watcher.informers
    await wait_until(lambda: len(harness.events.items) == 3)
    # The watch cannot come back while the gap happens; then the history is compacted, so
    # resuming from the last resourceVersion is answered 410 Gone.
    await harness.faults(error_rate=1.0, verbs=["watch"], error_code=500)
    await harness.faults(drop_watches=True)
    harness.store.patch("pods", "change", {"metadata": {"labels": {"v": "2"}}}, namespace="default")
    harness.store.delete("pods", "vanish", "default", grace_period_seconds=0)
    harness.store.create("pods", pod("new"))
    harness.store.compact()
    await harness.clear_faults()

    await wait_until(lambda: informer.relists == 2)
    await wait_until(lambda: len(harness.events.items) == 6)
    assert harness.event_types("Pod", "keep", "default") == ["ADDED"]
    assert harness.event_types("Pod", "change", "default") == ["ADDED", "MODIFIED"]
    assert harness.event_types("Pod", "vanish", "default") == ["ADDED", "DELETED"]
    assert harness.event_types("Pod", "new", "default") == ["ADDED"]
    deleted = harness.events_of("Pod", "vanish", "default")[-1]
    assert deleted.object["metadata"]["name"] == "vanish" and deleted.object["spec"]
    assert await harness.kv_keys("Pod") == {"default.keep", "default.change", "default.new"}


async def test_forced_410_on_watch_relists_and_publishes_nothing_for_unchanged_objects(
    harness: Harness,
) -> None:
    harness.store.create("nodes", node("n1"))
    watcher = await harness.start_watcher(watched_kinds=("Node",))
    (informer,) = watcher.informers
    await wait_until(lambda: len(harness.events.items) == 1)
    await harness.faults(gone_next_watches=1)
    await harness.faults(drop_watches=True)
    await wait_until(lambda: informer.relists == 2)
    harness.store.create("nodes", node("n2"))
    await wait_until(lambda: harness.event_types("Node", "n2") == ["ADDED"])
    assert harness.event_types("Node", "n1") == ["ADDED"]
    assert await harness.stored_event_count() == 2


async def test_restart_with_unchanged_state_publishes_nothing_new(harness: Harness) -> None:
    for index in range(5):
        harness.store.create("pods", pod(f"p{index}"))
        harness.store.create("nodes", node(f"n{index}"))
    await harness.start_watcher()
    await wait_until(lambda: len(harness.events.items) == 10)
    before = await harness.stored_event_count()
    await harness.stop_watcher()

    watcher = await harness.start_watcher()
    assert all(informer.published_changes == 0 for informer in watcher.informers)
    assert await harness.stored_event_count() == before == 10
    assert len(await harness.kv_keys("Pod")) == 5


async def test_restart_publishes_only_what_changed_while_stopped(harness: Harness) -> None:
    for name in ("same", "edited", "removed"):
        harness.store.create("pods", pod(name))
    await harness.start_watcher(watched_kinds=("Pod",))
    await wait_until(lambda: len(harness.events.items) == 3)
    await harness.stop_watcher()
    harness.store.patch("pods", "edited", {"metadata": {"labels": {"v": "2"}}}, namespace="default")
    harness.store.delete("pods", "removed", "default", grace_period_seconds=0)

    await harness.start_watcher(watched_kinds=("Pod",))
    await wait_until(lambda: len(harness.events.items) == 5)
    assert harness.event_types("Pod", "same", "default") == ["ADDED"]
    assert harness.event_types("Pod", "edited", "default") == ["ADDED", "MODIFIED"]
    assert harness.event_types("Pod", "removed", "default") == ["ADDED", "DELETED"]
    assert await harness.kv_keys("Pod") == {"default.same", "default.edited"}


async def test_object_recreated_while_stopped_gets_deleted_then_added(harness: Harness) -> None:
    first = harness.store.create("pods", pod("phoenix"))
    await harness.start_watcher(watched_kinds=("Pod",))
    await harness.stop_watcher()
    harness.store.delete("pods", "phoenix", "default", grace_period_seconds=0)
    second = harness.store.create("pods", pod("phoenix"))

    await harness.start_watcher(watched_kinds=("Pod",))
    await wait_until(lambda: len(harness.events_of("Pod", "phoenix", "default")) == 3)
    events = harness.events_of("Pod", "phoenix", "default")
    assert [(e.type, e.uid) for e in events] == [
        ("ADDED", first["metadata"]["uid"]),
        ("DELETED", first["metadata"]["uid"]),
        ("ADDED", second["metadata"]["uid"]),
    ]


async def test_list_and_watch_errors_500_and_429_are_retried_until_synced(
    harness: Harness,
) -> None:
    harness.store.create("nodes", node("n1"))
    await harness.faults(error_count=2, verbs=["list"], error_code=500)
    watcher = await harness.start_watcher(watched_kinds=("Node",))
    await harness.faults(error_count=3, verbs=["watch"], error_code=429)
    await harness.faults(drop_watches=True)
    harness.store.create("nodes", node("n2"))
    await wait_until(lambda: harness.event_types("Node", "n2") == ["ADDED"])
    assert watcher.not_ready_reason() is None
    assert harness.event_types("Node", "n1") == ["ADDED"]


async def test_only_configured_namespaces_and_label_selectors_are_mirrored(
    harness: Harness,
) -> None:
    harness.store.create("namespaces", {"metadata": {"name": "team-a"}})
    harness.store.create("namespaces", {"metadata": {"name": "team-b"}})
    harness.store.create("pods", pod("a-gpu", "team-a", tier="gpu"))
    harness.store.create("pods", pod("a-cpu", "team-a", tier="cpu"))
    harness.store.create("pods", pod("b-gpu", "team-b", tier="gpu"))
    harness.store.create("nodes", node("n-gpu", tier="gpu"))
    harness.store.create("nodes", node("n-cpu", tier="cpu"))
    watcher = await harness.start_watcher(
        watched_kinds=("Pod", "Node"),
        watched_namespaces=("team-a", "default"),
        label_selectors={"Pod": "tier=gpu;tier!=none", "Node": "tier in (gpu)"},
    )
    assert len(watcher.informers) == 3  # Pod in two namespaces, Node cluster-wide
    assert await harness.kv_keys("Pod") == {"team-a.a-gpu"}
    assert await harness.kv_keys("Node") == {"_.n-gpu"}
    harness.store.create("pods", pod("a-gpu-2", "team-a", tier="gpu"))
    harness.store.create("pods", pod("b-gpu-2", "team-b", tier="gpu"))
    await wait_until(lambda: harness.event_types("Pod", "a-gpu-2", "team-a") == ["ADDED"])
    assert harness.events_of("Pod", "b-gpu-2", "team-b") == []


async def test_api_server_down_reports_not_ready_and_no_change_is_lost_once_back(
    harness: Harness,
) -> None:
    harness.store.create("pods", pod("before"))
    watcher = await harness.start_watcher(watched_kinds=("Pod",))
    assert watcher.not_ready_reason() is None
    await harness.api_down()
    await wait_until(lambda: watcher.not_ready_reason() is not None)
    assert "Kubernetes API" in (watcher.not_ready_reason() or "")
    harness.store.patch("pods", "before", {"metadata": {"labels": {"v": "2"}}}, namespace="default")
    harness.store.create("pods", pod("during"))
    await asyncio.sleep(0.3)
    await harness.api_up()
    await wait_until(lambda: harness.event_types("Pod", "during", "default") == ["ADDED"])
    await wait_until(
        lambda: harness.event_types("Pod", "before", "default") == ["ADDED", "MODIFIED"]
    )
    await wait_until(lambda: watcher.not_ready_reason() is None)
