"""PATCH flavours and the status-subresource split."""

from __future__ import annotations

from typing import Any

from tests.conformance.k8s.conftest import Kube

MERGE = "application/merge-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"


def pod(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"a": "1"}},
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "image": "busybox",
                    "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}],
                },
                {"name": "side", "image": "busybox"},
            ],
            "tolerations": [{"key": "x", "operator": "Exists"}],
        },
    }


async def test_merge_patch_merges_maps_and_null_deletes(kube: Kube) -> None:
    await kube.core.create_namespaced_config_map(
        kube.namespace, {"metadata": {"name": "m"}, "data": {"a": "1", "b": "2"}}
    )
    status, body = await kube.request(
        "PATCH",
        f"/api/v1/namespaces/{kube.namespace}/configmaps/m",
        {"data": {"a": None, "c": "3"}},
        content_type=MERGE,
    )
    assert status == 200
    assert body["data"] == {"b": "2", "c": "3"}


async def test_strategic_merge_patch_merges_containers_by_name(kube: Kube) -> None:
    await kube.core.create_namespaced_pod(kube.namespace, pod("smp"))
    status, body = await kube.request(
        "PATCH",
        f"/api/v1/namespaces/{kube.namespace}/pods/smp",
        {"spec": {"containers": [{"name": "side", "image": "alpine"}]}},
        content_type=STRATEGIC,
    )
    assert status == 200, body
    images = {c["name"]: c["image"] for c in body["spec"]["containers"]}
    assert images == {"main": "busybox", "side": "alpine"}
    assert body["spec"]["containers"][0]["env"][1] == {"name": "B", "value": "2"}


async def test_strategic_merge_patch_merges_conditions_by_type(kube: Kube) -> None:
    await kube.core.create_namespaced_pod(kube.namespace, pod("cond"))
    path = f"/api/v1/namespaces/{kube.namespace}/pods/cond/status"
    await kube.request(
        "PATCH",
        path,
        {
            "status": {
                "conditions": [
                    {"type": "Ready", "status": "False"},
                    {"type": "Initialized", "status": "True"},
                ]
            }
        },
        content_type=STRATEGIC,
    )
    status, body = await kube.request(
        "PATCH",
        path,
        {"status": {"conditions": [{"type": "Ready", "status": "True"}]}},
        content_type=STRATEGIC,
    )
    assert status == 200
    conditions = {c["type"]: c["status"] for c in body["status"]["conditions"]}
    assert conditions == {"Ready": "True", "Initialized": "True"}


async def test_strategic_merge_patch_delete_directive_removes_list_item(kube: Kube) -> None:
    await kube.core.create_namespaced_pod(kube.namespace, pod("del"))
    status, body = await kube.request(
        "PATCH",
        f"/api/v1/namespaces/{kube.namespace}/pods/del",
        {
            "metadata": {"labels": {"a": None, "b": "2"}},
            "spec": {
                "tolerations": [
                    {"key": "x", "operator": "Exists"},
                    {"key": "y", "operator": "Exists"},
                ]
            },
        },
        content_type=STRATEGIC,
    )
    assert status == 200, body
    assert body["metadata"]["labels"] == {"b": "2"}
    # The patch replaces the list (tolerations have no merge key); the DefaultTolerationSeconds
    # admission plugin then adds back the not-ready and unreachable tolerations.
    assert [t["key"] for t in body["spec"]["tolerations"]] == [
        "x",
        "y",
        "node.kubernetes.io/not-ready",
        "node.kubernetes.io/unreachable",
    ]


async def test_json_patch_operations_apply_in_order(kube: Kube) -> None:
    await kube.core.create_namespaced_config_map(
        kube.namespace, {"metadata": {"name": "jp"}, "data": {"a": "1"}}
    )
    status, body = await kube.request(
        "PATCH",
        f"/api/v1/namespaces/{kube.namespace}/configmaps/jp",
        [
            {"op": "test", "path": "/data/a", "value": "1"},
            {"op": "add", "path": "/data/b", "value": "2"},
            {"op": "replace", "path": "/data/a", "value": "9"},
            {"op": "copy", "from": "/data/b", "path": "/data/c"},
            {"op": "remove", "path": "/data/b"},
        ],
        content_type=JSON_PATCH,
    )
    assert status == 200
    assert body["data"] == {"a": "9", "c": "2"}


async def test_json_patch_failed_test_is_rejected(kube: Kube) -> None:
    await kube.core.create_namespaced_config_map(
        kube.namespace, {"metadata": {"name": "jt"}, "data": {"a": "1"}}
    )
    status, body = await kube.request(
        "PATCH",
        f"/api/v1/namespaces/{kube.namespace}/configmaps/jt",
        [{"op": "test", "path": "/data/a", "value": "2"}],
        content_type=JSON_PATCH,
    )
    assert status == 422
    assert body["kind"] == "Status"


async def test_json_patch_remove_of_a_missing_path_is_rejected_as_invalid(kube: Kube) -> None:
    await kube.core.create_namespaced_config_map(
        kube.namespace, {"metadata": {"name": "jm"}, "data": {"a": "1"}}
    )
    status, body = await kube.request(
        "PATCH",
        f"/api/v1/namespaces/{kube.namespace}/configmaps/jm",
        [{"op": "add", "path": "/data/b", "value": "2"}, {"op": "remove", "path": "/data/x"}],
        content_type=JSON_PATCH,
    )
    assert status == 422, body
    assert body["kind"] == "Status"
    stored = await kube.core.read_namespaced_config_map("jm", kube.namespace)
    assert stored.data == {"a": "1"}  # nothing of a failed patch applies


async def test_json_patch_replace_of_a_missing_member_adds_it(kube: Kube) -> None:
    """Unlike RFC 6902, kube-apiserver's JSON patch sets an object member `replace` names."""
    await kube.core.create_namespaced_config_map(
        kube.namespace, {"metadata": {"name": "jr"}, "data": {"a": "1"}}
    )
    status, body = await kube.request(
        "PATCH",
        f"/api/v1/namespaces/{kube.namespace}/configmaps/jr",
        [{"op": "replace", "path": "/data/b", "value": "2"}],
        content_type=JSON_PATCH,
    )
    assert status == 200, body
    assert body["data"] == {"a": "1", "b": "2"}


async def test_json_patch_body_that_is_not_a_list_is_bad_request(kube: Kube) -> None:
    await kube.core.create_namespaced_config_map(
        kube.namespace, {"metadata": {"name": "jb"}, "data": {"a": "1"}}
    )
    status, body = await kube.request(
        "PATCH",
        f"/api/v1/namespaces/{kube.namespace}/configmaps/jb",
        {"op": "remove", "path": "/data/a"},
        content_type=JSON_PATCH,
    )
    assert status == 400, body
    assert body["reason"] == "BadRequest"


async def test_patch_with_stale_resource_version_is_conflict(kube: Kube) -> None:
    cm = await kube.core.create_namespaced_config_map(
        kube.namespace, {"metadata": {"name": "prv"}, "data": {"a": "1"}}
    )
    await kube.core.patch_namespaced_config_map("prv", kube.namespace, {"data": {"a": "2"}})
    status, body = await kube.request(
        "PATCH",
        f"/api/v1/namespaces/{kube.namespace}/configmaps/prv",
        {"metadata": {"resourceVersion": cm.metadata.resource_version}, "data": {"a": "3"}},
        content_type=MERGE,
    )
    assert status == 409
    assert body["reason"] == "Conflict"


async def test_status_subresource_ignores_spec_and_main_resource_ignores_status(
    kube: Kube,
) -> None:
    await kube.core.create_namespaced_pod(kube.namespace, pod("split"))
    status, body = await kube.request(
        "PATCH",
        f"/api/v1/namespaces/{kube.namespace}/pods/split/status",
        {"spec": {"activeDeadlineSeconds": 5}, "status": {"phase": "Running"}},
        content_type=MERGE,
    )
    assert status == 200
    assert body["status"]["phase"] == "Running"
    assert "activeDeadlineSeconds" not in body["spec"]
    status, body = await kube.request(
        "PATCH",
        f"/api/v1/namespaces/{kube.namespace}/pods/split",
        {"spec": {"activeDeadlineSeconds": 5}, "status": {"phase": "Failed"}},
        content_type=MERGE,
    )
    assert status == 200
    assert body["spec"]["activeDeadlineSeconds"] == 5
    assert body["status"]["phase"] == "Running"


async def test_patch_dry_run_does_not_persist(kube: Kube) -> None:
    await kube.core.create_namespaced_config_map(
        kube.namespace, {"metadata": {"name": "pdr"}, "data": {"a": "1"}}
    )
    status, body = await kube.request(
        "PATCH",
        f"/api/v1/namespaces/{kube.namespace}/configmaps/pdr",
        {"data": {"a": "2"}},
        content_type=MERGE,
        query=[("dryRun", "All")],
    )
    assert status == 200 and body["data"]["a"] == "2"
    stored = await kube.core.read_namespaced_config_map("pdr", kube.namespace)
    assert stored.data == {"a": "1"}


async def test_node_cordon_is_a_spec_unschedulable_patch(kube: Kube) -> None:
    name = kube.unique("node")
    await kube.core.create_node({"metadata": {"name": name}})
    try:
        node = await kube.core.patch_node(name, {"spec": {"unschedulable": True}})
        assert node.spec.unschedulable is True
        node = await kube.core.patch_node(name, {"spec": {"unschedulable": None}})
        assert not node.spec.unschedulable
    finally:
        await kube.core.delete_node(name)


async def test_server_side_apply_creates_then_updates(kube: Kube) -> None:
    path = f"/api/v1/namespaces/{kube.namespace}/configmaps/ssa"
    manifest = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "ssa"},
        "data": {"a": "1"},
    }
    status, body = await kube.request(
        "PATCH",
        path,
        manifest,
        content_type="application/apply-patch+yaml",
        query=[("fieldManager", "test")],
    )
    assert status in (200, 201)
    assert body["data"] == {"a": "1"}
    manifest["data"] = {"a": "2"}
    status, body = await kube.request(
        "PATCH",
        path,
        manifest,
        content_type="application/apply-patch+yaml",
        query=[("fieldManager", "test")],
    )
    assert status == 200
    assert body["data"] == {"a": "2"}
