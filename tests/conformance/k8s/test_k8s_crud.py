"""CRUD semantics: status codes, Status bodies, metadata bookkeeping, optimistic concurrency."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes_asyncio.client import ApiException

from tests.conformance.k8s.conftest import Kube, created_by_tests


def pod(name: str, labels: dict[str, str] | None = None, node: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "main", "image": "busybox"}]}
    if node:
        spec["nodeName"] = node
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels or {}},
        "spec": spec,
    }


async def test_create_returns_201_with_uid_timestamp_generation_and_resource_version(
    kube: Kube,
) -> None:
    status, body = await kube.request(
        "POST",
        f"/api/v1/namespaces/{kube.namespace}/configmaps",
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm"}, "data": {"a": "1"}},
    )
    assert status == 201
    meta = body["metadata"]
    assert meta["uid"] and meta["creationTimestamp"].endswith("Z")
    assert int(meta["resourceVersion"]) > 0
    assert meta["namespace"] == kube.namespace


async def test_create_existing_name_is_409_already_exists(kube: Kube) -> None:
    cm = {"metadata": {"name": "dup"}, "data": {}}
    await kube.core.create_namespaced_config_map(kube.namespace, cm)
    status, body = await kube.request(
        "POST",
        f"/api/v1/namespaces/{kube.namespace}/configmaps",
        {"apiVersion": "v1", "kind": "ConfigMap", **cm},
    )
    assert status == 409
    assert body["kind"] == "Status"
    assert body["reason"] == "AlreadyExists"
    assert body["details"]["name"] == "dup"


async def test_get_missing_object_is_404_not_found_status(kube: Kube) -> None:
    status, body = await kube.request("GET", f"/api/v1/namespaces/{kube.namespace}/configmaps/nope")
    assert status == 404
    assert body["reason"] == "NotFound"
    assert body["code"] == 404
    assert body["details"]["name"] == "nope"


async def test_generate_name_appends_random_suffix(kube: Kube) -> None:
    created = await kube.core.create_namespaced_config_map(
        kube.namespace, {"metadata": {"generateName": "gen-"}}
    )
    assert created.metadata.name.startswith("gen-")
    assert len(created.metadata.name) > len("gen-")


async def test_update_with_stale_resource_version_is_conflict(kube: Kube) -> None:
    cm = await kube.core.create_namespaced_config_map(
        kube.namespace, {"metadata": {"name": "occ"}, "data": {"v": "1"}}
    )
    stale = cm.metadata.resource_version
    cm.data = {"v": "2"}
    updated = await kube.core.replace_namespaced_config_map("occ", kube.namespace, cm)
    assert updated.metadata.resource_version != stale
    cm.data = {"v": "3"}
    cm.metadata.resource_version = stale
    with pytest.raises(ApiException) as err:
        await kube.core.replace_namespaced_config_map("occ", kube.namespace, cm)
    assert err.value.status == 409
    assert '"reason":"Conflict"' in str(err.value.body).replace(" ", "")


async def test_resource_versions_increase_across_writes(kube: Kube) -> None:
    versions = []
    for i in range(5):
        cm = await kube.core.create_namespaced_config_map(
            kube.namespace, {"metadata": {"name": f"rv-{i}"}}
        )
        versions.append(int(cm.metadata.resource_version))
    assert versions == sorted(versions) and len(set(versions)) == 5
    listed = await kube.core.list_namespaced_config_map(kube.namespace)
    assert int(listed.metadata.resource_version) >= versions[-1]


async def test_generation_bumps_on_spec_change_only(kube: Kube) -> None:
    job = {
        "metadata": {"name": "gen-job"},
        "spec": {
            "suspend": True,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [{"name": "c", "image": "busybox"}],
                }
            },
        },
    }
    created = await kube.batch.create_namespaced_job(kube.namespace, job)
    assert created.metadata.generation == 1
    labelled = await kube.batch.patch_namespaced_job(
        "gen-job", kube.namespace, {"metadata": {"labels": {"x": "y"}}}
    )
    assert labelled.metadata.generation == 1
    status = await kube.batch.patch_namespaced_job_status(
        "gen-job", kube.namespace, {"status": {"active": 0}}
    )
    assert status.metadata.generation == 1
    resumed = await kube.batch.patch_namespaced_job(
        "gen-job", kube.namespace, {"spec": {"suspend": False}}
    )
    assert resumed.metadata.generation == 2


async def test_namespaced_create_in_missing_namespace_is_404(kube: Kube) -> None:
    status, body = await kube.request(
        "POST",
        "/api/v1/namespaces/does-not-exist-ns/configmaps",
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}},
    )
    assert status == 404
    assert body["reason"] == "NotFound"


async def test_default_namespaces_exist(kube: Kube) -> None:
    names = {ns.metadata.name for ns in (await kube.core.list_namespace()).items}
    assert {"default", "kube-system", "kube-public", "kube-node-lease"} <= names


async def test_invalid_name_is_422_with_field_path(kube: Kube) -> None:
    status, body = await kube.request(
        "POST",
        f"/api/v1/namespaces/{kube.namespace}/configmaps",
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "Not_Valid"}},
    )
    assert status == 422
    assert body["reason"] == "Invalid"
    assert any(c["field"] == "metadata.name" for c in body["details"]["causes"])


async def test_pod_without_containers_is_invalid(kube: Kube) -> None:
    status, body = await kube.request(
        "POST",
        f"/api/v1/namespaces/{kube.namespace}/pods",
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "empty"}, "spec": {}},
    )
    assert status == 422
    assert any(c.get("field") == "spec.containers" for c in body["details"]["causes"])


def gpu_pod(name: str, resources: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"containers": [{"name": "main", "image": "busybox", "resources": resources}]},
    }


async def test_extended_resources_need_a_limit_equal_to_their_request(kube: Kube) -> None:
    # nvidia.com/gpu cannot be overcommitted: a request needs a limit, and the same one.
    pods = f"/api/v1/namespaces/{kube.namespace}/pods"
    status, body = await kube.request(
        "POST", pods, gpu_pod("no-limit", {"requests": {"nvidia.com/gpu": 8}})
    )
    assert status == 422, body
    assert {
        "reason": "FieldValueRequired",
        "message": "Required value: Limit must be set for non overcommitable resources",
        "field": "spec.containers[0].resources.limits",
    } in body["details"]["causes"]
    status, body = await kube.request(
        "POST",
        pods,
        gpu_pod("unequal", {"requests": {"nvidia.com/gpu": 4}, "limits": {"nvidia.com/gpu": 8}}),
    )
    assert status == 422, body
    (cause,) = body["details"]["causes"]
    assert cause["field"] == "spec.containers[0].resources.requests"
    assert "must be equal to nvidia.com/gpu limit of 8" in cause["message"]
    # cpu may be requested below its limit; a limit alone sets the request.
    status, body = await kube.request(
        "POST",
        pods,
        gpu_pod(
            "limits-only",
            {"requests": {"cpu": "1"}, "limits": {"cpu": "2", "nvidia.com/gpu": "8"}},
        ),
    )
    assert status == 201, body
    resources = body["spec"]["containers"][0]["resources"]
    assert resources["requests"] == {"cpu": "1", "nvidia.com/gpu": "8"}


async def test_create_dry_run_does_not_persist(kube: Kube) -> None:
    status, body = await kube.request(
        "POST",
        f"/api/v1/namespaces/{kube.namespace}/configmaps",
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "dry"}},
        query=[("dryRun", "All")],
    )
    assert status == 201
    assert body["metadata"]["name"] == "dry"
    status, _ = await kube.request("GET", f"/api/v1/namespaces/{kube.namespace}/configmaps/dry")
    assert status == 404


async def test_delete_with_failed_uid_precondition_is_conflict(kube: Kube) -> None:
    await kube.core.create_namespaced_config_map(kube.namespace, {"metadata": {"name": "pre"}})
    status, body = await kube.request(
        "DELETE",
        f"/api/v1/namespaces/{kube.namespace}/configmaps/pre",
        {
            "kind": "DeleteOptions",
            "apiVersion": "v1",
            "preconditions": {"uid": "00000000-0000-0000-0000-000000000000"},
        },
    )
    assert status == 409
    assert body["reason"] == "Conflict"
    status, body = await kube.request(
        "DELETE",
        f"/api/v1/namespaces/{kube.namespace}/configmaps/pre",
        {"kind": "DeleteOptions", "apiVersion": "v1", "preconditions": {"resourceVersion": "1"}},
    )
    assert status == 409


async def test_delete_removes_object(kube: Kube) -> None:
    await kube.core.create_namespaced_config_map(kube.namespace, {"metadata": {"name": "gone"}})
    await kube.core.delete_namespaced_config_map("gone", kube.namespace)
    with pytest.raises(ApiException) as err:
        await kube.core.read_namespaced_config_map("gone", kube.namespace)
    assert err.value.status == 404


async def test_list_with_limit_paginates_with_continue(kube: Kube) -> None:
    for i in range(5):
        await kube.core.create_namespaced_config_map(
            kube.namespace, {"metadata": {"name": f"p{i}"}}
        )
    first = await kube.core.list_namespaced_config_map(kube.namespace, limit=2)
    assert len(first.items) == 2 and first.metadata._continue
    names = [c.metadata.name for c in first.items]
    token = first.metadata._continue
    while token:
        page = await kube.core.list_namespaced_config_map(kube.namespace, limit=2, _continue=token)
        names += [c.metadata.name for c in page.items]
        token = page.metadata._continue
    assert sorted(created_by_tests(names)) == [f"p{i}" for i in range(5)]


async def test_label_selectors_filter_lists(kube: Kube) -> None:
    for name, labels in {
        "a": {"tier": "web", "env": "prod"},
        "b": {"tier": "db", "env": "prod"},
        "c": {"tier": "web"},
    }.items():
        await kube.core.create_namespaced_config_map(
            kube.namespace, {"metadata": {"name": name, "labels": labels}}
        )

    async def names(selector: str) -> list[str]:
        listed = await kube.core.list_namespaced_config_map(kube.namespace, label_selector=selector)
        return sorted(created_by_tests([c.metadata.name for c in listed.items]))

    assert await names("tier=web") == ["a", "c"]
    assert await names("tier==web") == ["a", "c"]
    assert await names("tier!=web") == ["b"]
    assert await names("tier in (web,db),env=prod") == ["a", "b"]
    assert await names("tier notin (web)") == ["b"]
    assert await names("env") == ["a", "b"]
    assert await names("!env") == ["c"]


async def test_field_selectors_filter_pods(kube: Kube) -> None:
    core = kube.core
    await core.create_namespaced_pod(kube.namespace, pod("on-n1"))
    await core.create_namespaced_pod(kube.namespace, pod("unbound"))
    await core.create_namespaced_pod_binding(
        "on-n1",
        kube.namespace,
        {"metadata": {"name": "on-n1"}, "target": {"kind": "Node", "name": "n1"}},
        _preload_content=False,  # the server answers with a Status, not a Binding
    )
    by_node = await core.list_namespaced_pod(kube.namespace, field_selector="spec.nodeName=n1")
    assert [p.metadata.name for p in by_node.items] == ["on-n1"]
    not_node = await core.list_namespaced_pod(kube.namespace, field_selector="spec.nodeName!=n1")
    assert [p.metadata.name for p in not_node.items] == ["unbound"]
    by_name = await core.list_pod_for_all_namespaces(
        field_selector=f"metadata.name=unbound,metadata.namespace={kube.namespace}"
    )
    assert [p.metadata.name for p in by_name.items] == ["unbound"]
    pending = await core.list_namespaced_pod(kube.namespace, field_selector="status.phase=Pending")
    assert len(pending.items) == 2


async def test_update_of_missing_object_is_404(kube: Kube) -> None:
    status, body = await kube.request(
        "PUT",
        f"/api/v1/namespaces/{kube.namespace}/configmaps/missing",
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "missing"}},
    )
    assert status == 404
    assert body["reason"] == "NotFound"


async def test_leases_and_events_round_trip(kube: Kube) -> None:
    lease = await kube.coordination.create_namespaced_lease(
        kube.namespace,
        {
            "metadata": {"name": "leader"},
            "spec": {"holderIdentity": "me", "leaseDurationSeconds": 15},
        },
    )
    assert lease.spec.holder_identity == "me"
    event = await kube.core.create_namespaced_event(
        kube.namespace,
        {
            "metadata": {"name": "ev1"},
            "involvedObject": {"kind": "Pod", "name": "x", "namespace": kube.namespace},
            "reason": "Tested",
            "message": "hello",
            "type": "Normal",
        },
    )
    assert event.reason == "Tested"


async def test_namespace_deletion_removes_its_objects(kube: Kube) -> None:
    ns = (await kube.core.create_namespace({"metadata": {"generateName": "doomed-"}})).metadata.name
    await kube.core.create_namespaced_config_map(ns, {"metadata": {"name": "inside"}})
    await kube.core.delete_namespace(ns)
    status, _ = await kube.request(
        "POST",
        f"/api/v1/namespaces/{ns}/configmaps",
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "late"}},
    )
    assert status in (403, 404)


async def test_delete_collection_removes_selected_objects_only(kube: Kube) -> None:
    for name, team in (("x1", "a"), ("x2", "a"), ("x3", "b")):
        await kube.core.create_namespaced_config_map(
            kube.namespace, {"metadata": {"name": name, "labels": {"team": team}}}
        )
    await kube.core.delete_collection_namespaced_config_map(kube.namespace, label_selector="team=a")
    left = await kube.core.list_namespaced_config_map(kube.namespace, label_selector="team")
    assert [c.metadata.name for c in left.items] == ["x3"]
