"""Discovery documents and server-side tables for built-in kinds."""

from __future__ import annotations

from tests.conformance.k8s.conftest import Kube

TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"


async def test_version_endpoint(kube: Kube) -> None:
    status, body = await kube.request("GET", "/version")
    assert status == 200
    assert body["major"] == "1" and body["gitVersion"].startswith("v1.")


async def test_core_discovery_lists_resources_and_subresources(kube: Kube) -> None:
    status, body = await kube.request("GET", "/api")
    assert status == 200 and "v1" in body["versions"]
    status, body = await kube.request("GET", "/api/v1")
    resources = {r["name"]: r for r in body["resources"]}
    for name in ("pods", "nodes", "namespaces", "events", "configmaps"):
        assert name in resources
    assert resources["pods"]["namespaced"] is True
    assert resources["nodes"]["namespaced"] is False
    assert "po" in resources["pods"]["shortNames"]
    assert resources["pods"]["singularName"] == "pod"
    assert {"create", "get", "list", "watch", "patch"} <= set(resources["pods"]["verbs"])
    eviction = resources["pods/eviction"]
    assert (eviction["group"], eviction["version"], eviction["kind"]) == (
        "policy",
        "v1",
        "Eviction",
    )
    assert "pods/status" in resources and "pods/binding" in resources


async def test_group_discovery(kube: Kube) -> None:
    status, body = await kube.request("GET", "/apis")
    groups = {g["name"]: g for g in body["groups"]}
    for group in ("batch", "policy", "coordination.k8s.io", "apiextensions.k8s.io"):
        assert group in groups
        assert groups[group]["preferredVersion"]["version"] == "v1"
    status, body = await kube.request("GET", "/apis/batch")
    assert status == 200 and body["name"] == "batch"
    status, body = await kube.request("GET", "/apis/policy/v1")
    assert "poddisruptionbudgets" in {r["name"] for r in body["resources"]}
    status, body = await kube.request("GET", "/apis/coordination.k8s.io/v1")
    assert "leases" in {r["name"] for r in body["resources"]}


async def test_unknown_resource_is_404(kube: Kube) -> None:
    status, body = await kube.request("GET", "/api/v1/nopes")
    assert status == 404
    assert body["kind"] == "Status"
    assert body["reason"] == "NotFound"
    status, body = await kube.request("GET", "/apis/batch/v1/nopes")
    assert (status, body["kind"]) == (404, "Status")


async def test_unknown_group_is_a_plain_404(kube: Kube) -> None:
    # No API handler serves the group: the server's mux answers in text, not with a Status.
    for path in ("/apis/nope.example.com/v1/things", "/apis/nope.example.com/v1"):
        status, body = await kube.request("GET", path)
        assert status == 404
        assert body == "404 page not found\n"


async def test_pod_list_as_table_has_status_columns(kube: Kube) -> None:
    await kube.core.create_namespaced_pod(
        kube.namespace,
        {"metadata": {"name": "tbl"}, "spec": {"containers": [{"name": "c", "image": "x"}]}},
    )
    status, table = await kube.request(
        "GET", f"/api/v1/namespaces/{kube.namespace}/pods", accept=TABLE
    )
    assert status == 200
    assert table["kind"] == "Table"
    columns = [c["name"] for c in table["columnDefinitions"]]
    assert columns[:5] == ["Name", "Ready", "Status", "Restarts", "Age"]
    row = table["rows"][0]
    assert row["cells"][:3] == ["tbl", "0/1", "Pending"]
    assert row["object"]["metadata"]["name"] == "tbl"


async def test_node_table_shows_scheduling_disabled(kube: Kube) -> None:
    name = kube.unique("tnode")
    await kube.core.create_node({"metadata": {"name": name}, "spec": {"unschedulable": True}})
    try:
        status, table = await kube.request("GET", f"/api/v1/nodes/{name}", accept=TABLE)
        assert status == 200
        assert [c["name"] for c in table["columnDefinitions"]][:2] == ["Name", "Status"]
        assert "SchedulingDisabled" in table["rows"][0]["cells"][1]
    finally:
        await kube.core.delete_node(name)
