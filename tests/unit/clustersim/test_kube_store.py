"""The in-process store API used by the simulated kubelet/scheduler (no HTTP)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clustersim.kube.disruption import compute_pdb_status
from clustersim.kube.errors import AlreadyExists, Conflict, Gone, Invalid, NotFound
from clustersim.kube.patch import STRATEGIC_MERGE_PATCH
from clustersim.kube.store import Store


def pod(name: str, node: str | None = None, labels: dict[str, str] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "c", "image": "x"}]}
    if node:
        spec["nodeName"] = node
    return {"metadata": {"name": name, "labels": labels or {}}, "spec": spec}


def test_create_get_update_delete_round_trip() -> None:
    store = Store()
    created = store.create("pods", pod("a"))
    assert created["kind"] == "Pod" and created["apiVersion"] == "v1"
    assert store.get("pod", "a", "default")["metadata"]["uid"] == created["metadata"]["uid"]
    created["metadata"]["labels"] = {"x": "1"}
    updated = store.update("po", created)
    assert updated["metadata"]["labels"] == {"x": "1"}
    with pytest.raises(Conflict):
        store.update("pods", created)
    with pytest.raises(AlreadyExists):
        store.create("pods", pod("a"))
    assert store.delete("pods", "a").deleted
    with pytest.raises(NotFound):
        store.get("pods", "a")


def test_returned_objects_are_private_copies() -> None:
    store = Store()
    created = store.create("configmaps", {"metadata": {"name": "c"}, "data": {"k": "v"}})
    created["data"]["k"] = "mutated"
    assert store.get("configmaps", "c")["data"] == {"k": "v"}


def test_bound_pod_deletion_waits_for_grace_zero_delete() -> None:
    store = Store()
    store.create("pods", pod("p", node="n1"))
    first = store.delete("pods", "p", "default")
    assert not first.deleted
    assert first.object["metadata"]["deletionGracePeriodSeconds"] == 30
    assert store.delete("pods", "p", "default", grace_period_seconds=0).deleted


def test_bind_sets_node_once() -> None:
    store = Store()
    store.create("pods", pod("p"))
    bound = store.bind("p", "default", "n1")
    assert bound["spec"]["nodeName"] == "n1"
    with pytest.raises(Conflict):
        store.bind("p", "default", "n2")


def test_pod_spec_is_immutable_except_allowed_fields() -> None:
    store = Store()
    store.create("pods", pod("p"))
    with pytest.raises(Invalid):
        store.patch("pods", "p", {"spec": {"nodeName": "n1"}})
    patched = store.patch(
        "pods", "p", {"spec": {"containers": [{"name": "c", "image": "y"}]}}, STRATEGIC_MERGE_PATCH
    )
    assert patched["spec"]["containers"][0]["image"] == "y"


async def test_watch_registers_synchronously_and_streams_events() -> None:
    store = Store()
    watch = store.watch("pods", "default", resource_version=str(store.resource_version))
    store.create("pods", pod("w"))
    store.patch("pods", "w", {"status": {"phase": "Running"}}, subresource="status")
    store.delete("pods", "w")
    events = [await asyncio.wait_for(anext(watch), 1) for _ in range(3)]
    assert [e.type for e in events] == ["ADDED", "MODIFIED", "DELETED"]
    watch.close()
    with pytest.raises(StopAsyncIteration):
        await anext(watch)


async def test_watch_with_field_selector_by_node() -> None:
    store = Store()
    store.create("pods", pod("p1"))
    store.create("pods", pod("p2"))
    async with store.watch("pods", field_selector="spec.nodeName=n1") as watch:
        store.bind("p2", "default", "n1")
        event = await asyncio.wait_for(anext(watch), 1)
        assert (event.type, event.object["metadata"]["name"]) == ("ADDED", "p2")


async def test_bookmarks_are_sent_when_idle() -> None:
    store = Store()
    async with store.watch(
        "pods",
        resource_version=str(store.resource_version),
        allow_bookmarks=True,
        bookmark_interval=0.05,
    ) as watch:
        event = await asyncio.wait_for(anext(watch), 1)
    assert event.type == "BOOKMARK"
    assert event.object["metadata"]["resourceVersion"] == str(store.resource_version)


def test_watch_from_outside_history_window_is_gone() -> None:
    store = Store(history_size=5)
    start = store.resource_version
    for i in range(10):
        store.create("configmaps", {"metadata": {"name": f"c{i}"}})
    with pytest.raises(Gone):
        store.watch("configmaps", resource_version=str(start))
    store.watch("configmaps", resource_version=str(store.resource_version - 2)).close()


@settings(max_examples=30, deadline=None)
@given(st.lists(st.sampled_from(["create", "patch", "delete"]), min_size=1, max_size=30))
def test_resource_version_strictly_increases_with_every_write(ops: list[str]) -> None:
    store = Store()
    seen = [store.resource_version]
    existing: set[str] = set()
    for i, op in enumerate(ops):
        if op == "create" or not existing:
            name = f"c{i}"
            obj = store.create("configmaps", {"metadata": {"name": name}})
            existing.add(name)
        elif op == "patch":
            name = sorted(existing)[0]
            obj = store.patch("configmaps", name, {"data": {"i": str(i)}})
        else:
            name = existing.pop()
            obj = store.delete("configmaps", name).object
        rv = int(obj["metadata"]["resourceVersion"])
        assert rv > seen[-1]
        seen.append(rv)
    assert store.resource_version == seen[-1]


def test_no_op_update_keeps_resource_version() -> None:
    store = Store()
    created = store.create("configmaps", {"metadata": {"name": "c"}, "data": {"a": "1"}})
    same = store.patch("configmaps", "c", {"data": {"a": "1"}})
    assert same["metadata"]["resourceVersion"] == created["metadata"]["resourceVersion"]


def test_job_gets_selector_and_template_labels() -> None:
    store = Store()
    job = store.create(
        "jobs.batch",
        {
            "metadata": {"name": "j"},
            "spec": {
                "template": {
                    "spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "x"}]}
                }
            },
        },
    )
    uid = job["metadata"]["uid"]
    assert job["spec"]["selector"]["matchLabels"] == {"batch.kubernetes.io/controller-uid": uid}
    assert job["spec"]["template"]["metadata"]["labels"]["job-name"] == "j"
    assert job["spec"]["completions"] == 1 and job["spec"]["parallelism"] == 1


OWNER = {"apiVersion": "x/v1", "kind": "Replicator", "name": "r", "uid": "u1", "controller": True}


def _ready(name: str, owned: bool = True) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": "default",
            "labels": {"app": "a"},
            **({"ownerReferences": [OWNER]} if owned else {}),
        },
        "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]},
    }


def _three_replicas(ref: Mapping[str, Any], namespace: str) -> int | None:
    return 3 if ref["uid"] == "u1" else None


@pytest.mark.parametrize(
    ("spec", "allowed", "desired"),
    [
        ({"minAvailable": 2}, 1, 2),
        ({"minAvailable": "50%"}, 1, 2),
        ({"maxUnavailable": 1}, 1, 2),
        ({"maxUnavailable": "34%"}, 2, 1),
        ({"minAvailable": 3}, 0, 3),
    ],
)
def test_pdb_status_computation(spec: dict[str, Any], allowed: int, desired: int) -> None:
    pdb = {
        "metadata": {"name": "b", "generation": 1},
        "spec": {**spec, "selector": {"matchLabels": {"app": "a"}}},
    }
    status = compute_pdb_status(pdb, [_ready("p1"), _ready("p2"), _ready("p3")], _three_replicas)
    assert status is not None
    assert status["expectedPods"] == 3 and status["currentHealthy"] == 3
    assert status["desiredHealthy"] == desired
    assert status["disruptionsAllowed"] == allowed


@pytest.mark.parametrize("spec", [{"maxUnavailable": 1}, {"minAvailable": "50%"}])
def test_pdb_counting_controller_replicas_ignores_pods_without_controller(
    spec: dict[str, Any],
) -> None:
    pdb = {
        "metadata": {"name": "b", "generation": 1},
        "spec": {**spec, "selector": {"matchLabels": {"app": "a"}}},
    }
    orphans = [_ready("p1", owned=False), _ready("p2", owned=False)]
    status = compute_pdb_status(pdb, orphans, _three_replicas)
    assert status is not None
    assert (status["expectedPods"], status["currentHealthy"]) == (0, 2)
    assert status["disruptionsAllowed"] == 0
    # A controller without a scale subresource: no status can be computed (left as it was).
    assert compute_pdb_status(pdb, [_ready("p1")], lambda ref, ns: None) is None


def test_crd_creation_registers_resource_and_validates() -> None:
    store = Store()
    store.create(
        "customresourcedefinitions",
        {
            "metadata": {"name": "things.example.com"},
            "spec": {
                "group": "example.com",
                "scope": "Cluster",
                "names": {"plural": "things", "kind": "Thing"},
                "versions": [
                    {
                        "name": "v1",
                        "served": True,
                        "storage": True,
                        "schema": {
                            "openAPIV3Schema": {
                                "type": "object",
                                "properties": {
                                    "spec": {
                                        "type": "object",
                                        "properties": {"n": {"type": "integer", "default": 3}},
                                    }
                                },
                            }
                        },
                    }
                ],
            },
        },
    )
    thing = store.create(
        "things.example.com",
        {"apiVersion": "example.com/v1", "metadata": {"name": "t"}, "spec": {}},
    )
    assert thing["spec"] == {"n": 3}
    with pytest.raises(Invalid):
        store.create(
            "Thing", {"apiVersion": "example.com/v1", "metadata": {"name": "u"}, "spec": {"n": "x"}}
        )
    store.delete("crd", "things.example.com")
    with pytest.raises(NotFound):
        store.resolve("things.example.com")


def test_listing_pods_by_node_follows_binding_and_deletion() -> None:
    store = Store()
    store.create("pods", pod("a", node="n1"))
    store.create("pods", pod("b"))
    store.create("pods", pod("c", node="n2"))
    store.bind("b", "default", "n1")

    def on(node: str, selector: str = "") -> list[str]:
        return [
            p["metadata"]["name"]
            for p in store.list("pods", field_selector=f"spec.nodeName={node}{selector}").items
        ]

    assert on("n1") == ["a", "b"]
    assert on("n1", ",metadata.name=b") == ["b"]
    store.delete("pods", "a")
    assert on("n1") == ["a", "b"]  # graceful: still there with deletionTimestamp
    store.delete("pods", "a", grace_period_seconds=0)
    assert on("n1") == ["b"]
    assert on("n2") == ["c"] and on("n3") == []


def test_controller_revisions_are_served_with_immutable_data_and_a_mutable_revision() -> None:
    """apps/v1 ControllerRevision as kube-apiserver validates it: data mandatory and
    immutable, revision a non-negative integer that an update may raise (a rollback)."""
    store = Store()
    revision = {
        "metadata": {"name": "ns-abc", "labels": {"nodeflow.dev/nodeset": "ns"}},
        "data": {"spec": {"template": {"spec": {"containers": [{"name": "c"}]}}}},
        "revision": 1,
    }
    created = store.create("controllerrevisions.apps", revision)
    assert created["kind"] == "ControllerRevision" and created["apiVersion"] == "apps/v1"
    created["revision"] = 3
    raised = store.update("controllerrevisions.apps", created)
    assert raised["revision"] == 3
    raised["data"] = {"spec": {"template": {}}}
    with pytest.raises(Invalid, match="immutable"):
        store.update("controllerrevisions.apps", raised)
    with pytest.raises(Invalid, match="data is mandatory"):
        store.create("controllerrevisions.apps", {"metadata": {"name": "empty"}, "revision": 1})
    with pytest.raises(Invalid, match="greater than or equal to 0"):
        store.create(
            "controllerrevisions.apps", {"metadata": {"name": "neg"}, "data": {}, "revision": -1}
        )


def test_volumes_are_served_with_their_status_set_apart_as_kube_apiserver_does() -> None:
    """core/v1 PersistentVolumeClaim (namespaced) and PersistentVolume (cluster-scoped), as
    k8s-watcher mirrors them for topology-placer: a status given on create is dropped, and
    with no volume controller here a claim is bound by its spec.volumeName and a status write."""
    store = Store()
    volume = store.create(
        "pv",
        {
            "metadata": {"name": "data"},
            "spec": {
                "capacity": {"storage": "1Gi"},
                "accessModes": ["ReadWriteMany"],
                "nfs": {"server": "nfs", "path": "/data"},
                "claimRef": {"namespace": "default", "name": "shared"},
            },
            "status": {"phase": "Bound"},
        },
    )
    assert volume["kind"] == "PersistentVolume" and "namespace" not in volume["metadata"]
    assert volume.get("status", {}).get("phase") != "Bound"
    claim = store.create(
        "pvc",
        {
            "metadata": {"name": "shared"},
            "spec": {"accessModes": ["ReadWriteMany"], "volumeName": "data"},
            "status": {"phase": "Bound"},
        },
    )
    assert claim["kind"] == "PersistentVolumeClaim" and claim["metadata"]["namespace"] == "default"
    assert claim.get("status", {}).get("phase") != "Bound"
    store.patch(
        "pvc", "shared", {"status": {"phase": "Bound"}}, namespace="default", subresource="status"
    )
    assert store.get("persistentvolumeclaims", "shared", "default")["status"]["phase"] == "Bound"
    assert [v["metadata"]["name"] for v in store.list("persistentvolumes").items] == ["data"]


def test_storage_classes_are_served_cluster_scoped_as_kube_apiserver_does() -> None:
    """storage.k8s.io/v1 StorageClass, as k8s-watcher mirrors it for topology-placer (an
    unbound claim's binding mode and allowed topologies): cluster-scoped, short name sc."""
    store = Store()
    made = store.create(
        "sc",
        {
            "metadata": {"name": "local-fast"},
            "provisioner": "csi.example.com",
            "volumeBindingMode": "WaitForFirstConsumer",
        },
    )
    assert made["kind"] == "StorageClass" and made["apiVersion"] == "storage.k8s.io/v1"
    assert "namespace" not in made["metadata"]
    listed = store.list("storageclasses.storage.k8s.io").items
    assert [c["volumeBindingMode"] for c in listed] == ["WaitForFirstConsumer"]
