"""CustomResourceDefinitions: serving, discovery, schema validation/defaulting/pruning,
status and scale subresources, printer columns."""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conformance.k8s.conftest import Kube

CRD_DIR = Path(__file__).resolve().parents[3] / "k8s" / "crds"
TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"


@dataclass
class Widgets:
    group: str
    plural: str
    kind: str

    @property
    def api_version(self) -> str:
        return f"{self.group}/v1"


def widget_crd(group: str) -> dict[str, Any]:
    schema = {
        "type": "object",
        "properties": {
            "spec": {
                "type": "object",
                "required": ["size"],
                "properties": {
                    "size": {"type": "string", "enum": ["small", "large"]},
                    "replicas": {"type": "integer", "minimum": 0, "maximum": 10, "default": 1},
                    "name": {"type": "string", "pattern": "^[a-z]+$", "maxLength": 8},
                    "port": {"x-kubernetes-int-or-string": True},
                    "tags": {"type": "array", "items": {"type": "string"}},
                    "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                    "ratio": {"type": "number"},
                },
            },
            "status": {
                "type": "object",
                "properties": {
                    "replicas": {"type": "integer"},
                    "selector": {"type": "string"},
                    "phase": {"type": "string"},
                },
            },
        },
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"widgets.{group}"},
        "spec": {
            "group": group,
            "scope": "Namespaced",
            "names": {
                "plural": "widgets",
                "singular": "widget",
                "kind": "Widget",
                "shortNames": ["wdg"],
                "categories": ["gadgets"],
            },
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": schema},
                    "subresources": {
                        "status": {},
                        "scale": {
                            "specReplicasPath": ".spec.replicas",
                            "statusReplicasPath": ".status.replicas",
                            "labelSelectorPath": ".status.selector",
                        },
                    },
                    "additionalPrinterColumns": [
                        {"name": "Size", "type": "string", "jsonPath": ".spec.size"},
                        {"name": "Replicas", "type": "integer", "jsonPath": ".spec.replicas"},
                        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
                    ],
                }
            ],
        },
    }


@pytest.fixture
async def widgets(kube: Kube) -> AsyncIterator[Widgets]:
    group = f"w{uuid.uuid4().hex[:6]}.example.com"
    await kube.ext.create_custom_resource_definition(widget_crd(group))
    # Served once discovery lists the version and a list answers: a real API server answers
    # 429 "storage is (re)initializing" while the new resource's watch cache fills.
    for _ in range(100):
        status, _ = await kube.request("GET", f"/apis/{group}/v1")
        if status == 200:
            status, _ = await kube.request("GET", f"/apis/{group}/v1/widgets")
            if status == 200:
                break
        await asyncio.sleep(0.1)
    try:
        yield Widgets(group, "widgets", "Widget")
    finally:
        await kube.ext.delete_custom_resource_definition(f"widgets.{group}")


def widget(w: Widgets, name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": w.api_version, "kind": "Widget", "metadata": {"name": name}, "spec": spec}


async def create(kube: Kube, w: Widgets, body: dict[str, Any]) -> tuple[int, Any]:
    return await kube.request(
        "POST", f"/apis/{w.group}/v1/namespaces/{kube.namespace}/widgets", body
    )


async def test_created_crd_is_established_and_in_discovery(kube: Kube, widgets: Widgets) -> None:
    crd = await kube.ext.read_custom_resource_definition(f"widgets.{widgets.group}")
    conditions = {c.type: c.status for c in crd.status.conditions}
    assert conditions.get("Established") == "True"
    status, listing = await kube.request("GET", f"/apis/{widgets.group}/v1")
    assert status == 200
    by_name = {r["name"]: r for r in listing["resources"]}
    assert by_name["widgets"]["kind"] == "Widget"
    assert by_name["widgets"]["namespaced"] is True
    assert by_name["widgets"]["shortNames"] == ["wdg"]
    assert "gadgets" in by_name["widgets"]["categories"]
    assert {"widgets/status", "widgets/scale"} <= set(by_name)
    status, groups = await kube.request("GET", "/apis")
    assert widgets.group in {g["name"] for g in groups["groups"]}


async def test_custom_object_defaults_are_applied(kube: Kube, widgets: Widgets) -> None:
    status, body = await create(kube, widgets, widget(widgets, "d", {"size": "small"}))
    assert status == 201, body
    assert body["spec"]["replicas"] == 1


async def test_unknown_fields_are_pruned(kube: Kube, widgets: Widgets) -> None:
    body = widget(widgets, "p", {"size": "small", "bogus": 1, "free": {"any": {"thing": 1}}})
    body["extra"] = "top-level"
    status, created = await create(kube, widgets, body)
    assert status == 201
    assert "bogus" not in created["spec"]
    assert "extra" not in created
    assert created["spec"]["free"] == {"any": {"thing": 1}}


@pytest.mark.parametrize(
    ("spec", "field", "reason"),
    [
        ({}, "spec.size", "FieldValueRequired"),
        ({"size": "medium"}, "spec.size", "FieldValueNotSupported"),
        ({"size": "small", "replicas": "two"}, "spec.replicas", "FieldValueTypeInvalid"),
        ({"size": "small", "replicas": 11}, "spec.replicas", "FieldValueInvalid"),
        ({"size": "small", "replicas": -1}, "spec.replicas", "FieldValueInvalid"),
        ({"size": "small", "name": "ABC"}, "spec.name", "FieldValueInvalid"),
        ({"size": "small", "name": "abcdefghij"}, "spec.name", "FieldValueTooLong"),
        ({"size": "small", "port": 1.5}, "spec.port", "FieldValueTypeInvalid"),
        ({"size": "small", "tags": ["a", 3]}, "spec.tags[1]", "FieldValueTypeInvalid"),
    ],
)
async def test_schema_violations_are_422_invalid_with_field_paths(
    kube: Kube, widgets: Widgets, spec: dict[str, Any], field: str, reason: str
) -> None:
    status, body = await create(kube, widgets, widget(widgets, "bad", spec))
    assert status == 422, body
    assert body["reason"] == "Invalid"
    causes = body["details"]["causes"]
    assert any(c["field"] == field and c["reason"] == reason for c in causes), causes


async def test_int_or_string_accepts_both(kube: Kube, widgets: Widgets) -> None:
    for i, port in enumerate((8080, "http")):
        status, body = await create(
            kube, widgets, widget(widgets, f"port{i}", {"size": "large", "port": port})
        )
        assert status == 201, body
        assert body["spec"]["port"] == port


async def test_custom_status_subresource_splits_spec_and_status(
    kube: Kube, widgets: Widgets
) -> None:
    body = widget(widgets, "s", {"size": "small"})
    body["status"] = {"phase": "ignored-on-create"}
    status, created = await create(kube, widgets, body)
    assert "status" not in created or created["status"].get("phase") != "ignored-on-create"
    base = f"/apis/{widgets.group}/v1/namespaces/{kube.namespace}/widgets/s"
    status, patched = await kube.request(
        "PATCH",
        f"{base}/status",
        {"status": {"phase": "Ready"}, "spec": {"size": "large"}},
        content_type="application/merge-patch+json",
    )
    assert status == 200
    assert patched["status"]["phase"] == "Ready" and patched["spec"]["size"] == "small"
    assert patched["metadata"]["generation"] == 1
    status, patched = await kube.request(
        "PATCH",
        base,
        {"spec": {"size": "large"}, "status": {"phase": "Lost"}},
        content_type="application/merge-patch+json",
    )
    assert patched["status"]["phase"] == "Ready" and patched["spec"]["size"] == "large"
    assert patched["metadata"]["generation"] == 2


async def test_strategic_merge_patch_on_custom_object_is_415(kube: Kube, widgets: Widgets) -> None:
    await create(kube, widgets, widget(widgets, "smp", {"size": "small"}))
    status, body = await kube.request(
        "PATCH",
        f"/apis/{widgets.group}/v1/namespaces/{kube.namespace}/widgets/smp",
        {"spec": {"size": "large"}},
        content_type="application/strategic-merge-patch+json",
    )
    assert status == 415
    assert body["reason"] == "UnsupportedMediaType"


async def test_scale_subresource_reads_and_writes_replicas(kube: Kube, widgets: Widgets) -> None:
    await create(kube, widgets, widget(widgets, "sc", {"size": "small", "replicas": 2}))
    base = f"/apis/{widgets.group}/v1/namespaces/{kube.namespace}/widgets/sc"
    await kube.request(
        "PATCH",
        f"{base}/status",
        {"status": {"replicas": 2, "selector": "app=sc"}},
        content_type="application/merge-patch+json",
    )
    status, scale = await kube.request("GET", f"{base}/scale")
    assert status == 200
    assert scale["kind"] == "Scale" and scale["apiVersion"] == "autoscaling/v1"
    assert scale["spec"]["replicas"] == 2
    assert scale["status"] == {"replicas": 2, "selector": "app=sc"}
    scale["spec"]["replicas"] = 5
    status, updated = await kube.request("PUT", f"{base}/scale", scale)
    assert status == 200 and updated["spec"]["replicas"] == 5
    status, patched = await kube.request(
        "PATCH",
        f"{base}/scale",
        {"spec": {"replicas": 3}},
        content_type="application/merge-patch+json",
    )
    assert status == 200 and patched["spec"]["replicas"] == 3
    obj = await kube.custom.get_namespaced_custom_object(
        widgets.group, "v1", kube.namespace, "widgets", "sc"
    )
    assert obj["spec"]["replicas"] == 3


async def test_custom_objects_api_crud_and_watch(kube: Kube, widgets: Widgets) -> None:
    before = await kube.custom.list_namespaced_custom_object(
        widgets.group, "v1", kube.namespace, "widgets"
    )
    await kube.custom.create_namespaced_custom_object(
        widgets.group, "v1", kube.namespace, "widgets", widget(widgets, "c", {"size": "small"})
    )
    listed = await kube.custom.list_namespaced_custom_object(
        widgets.group, "v1", kube.namespace, "widgets"
    )
    assert [o["metadata"]["name"] for o in listed["items"]] == ["c"]
    assert listed["kind"] == "WidgetList"
    events = await kube.watch(
        f"/apis/{widgets.group}/v1/namespaces/{kube.namespace}/widgets",
        [("resourceVersion", before["metadata"]["resourceVersion"])],
        count=1,
    )
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [("ADDED", "c")]
    assert events[0]["object"]["apiVersion"] == widgets.api_version
    await kube.custom.delete_namespaced_custom_object(
        widgets.group, "v1", kube.namespace, "widgets", "c"
    )
    listed = await kube.custom.list_namespaced_custom_object(
        widgets.group, "v1", kube.namespace, "widgets"
    )
    assert listed["items"] == []


async def test_printer_columns_served_as_table(kube: Kube, widgets: Widgets) -> None:
    await create(kube, widgets, widget(widgets, "t", {"size": "large", "replicas": 4}))
    status, table = await kube.request(
        "GET", f"/apis/{widgets.group}/v1/namespaces/{kube.namespace}/widgets", accept=TABLE
    )
    assert status == 200
    assert table["kind"] == "Table"
    names = [c["name"] for c in table["columnDefinitions"]]
    assert names[:4] == ["Name", "Size", "Replicas", "Age"]
    assert table["columnDefinitions"][3]["type"] == "date"
    assert table["rows"][0]["cells"][:3] == ["t", "large", 4]
    # date columns are served as human durations since the timestamp ("5s", "3m12s")
    assert re.fullmatch(r"\d+s", table["rows"][0]["cells"][3]), table["rows"][0]


async def test_project_crds_install_and_serve(kube: Kube) -> None:
    files = sorted(CRD_DIR.glob("*.yaml"))
    crds = [
        d
        for f in files
        for d in yaml.safe_load_all(f.read_text())
        if d and d.get("kind") == "CustomResourceDefinition"
    ]
    assert len(crds) >= 6, f"expected the project's CRDs in {CRD_DIR}"
    for crd in crds:
        status, body = await kube.request(
            "POST",
            "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
            crd,
            query=[("dryRun", "All")],
        )
        assert status == 201, body
