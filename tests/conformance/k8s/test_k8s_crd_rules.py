"""CRD ``x-kubernetes-validations`` (CEL) rules: transition rules make fields immutable, plain
rules run on create and update, failures are 422 Invalid with the rule's field path, reason and
message (kube-apiserver 1.36 format), and the project's CRDs enforce their immutable fields."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conformance.k8s.conftest import Kube

CRD_DIR = Path(__file__).resolve().parents[3] / "k8s" / "crds"
CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"


def gadget_crd(group: str, extra_rules: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    spec_schema: dict[str, Any] = {
        "type": "object",
        "properties": {
            "owner": {
                "type": "string",
                "maxLength": 64,
                "x-kubernetes-validations": [
                    {"rule": "self == oldSelf", "message": "owner is immutable"}
                ],
            },
            "min": {"type": "integer"},
            "max": {"type": "integer"},
            "mode": {
                "type": "string",
                "maxLength": 64,
                "x-kubernetes-validations": [{"rule": "self == oldSelf"}],
            },
            "ports": {
                "type": "array",
                "x-kubernetes-list-type": "map",
                "x-kubernetes-list-map-keys": ["name"],
                # A real API server refuses rules whose estimated cost is unbounded: lists and
                # strings that rules read carry maxItems and maxLength.
                "maxItems": 16,
                "items": {
                    "type": "object",
                    "required": ["name"],
                    "properties": {
                        "name": {"type": "string", "maxLength": 64},
                        "protocol": {
                            "type": "string",
                            "maxLength": 16,
                            "x-kubernetes-validations": [
                                {
                                    "rule": "self == oldSelf",
                                    "message": "protocol is immutable",
                                    "reason": "FieldValueForbidden",
                                }
                            ],
                        },
                    },
                },
            },
        },
        "x-kubernetes-validations": [
            {
                "rule": "!has(self.min) || !has(self.max) || self.min <= self.max",
                # format(), not string concatenation: a real API server estimates the cost of
                # string(int) + ... as unbounded and refuses the CRD.
                "messageExpression": "'min %d exceeds max %d'.format([self.min, self.max])",
                "fieldPath": ".min",
            },
            *(extra_rules or []),
        ],
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"gadgets.{group}"},
        "spec": {
            "group": group,
            "scope": "Namespaced",
            "names": {"plural": "gadgets", "singular": "gadget", "kind": "Gadget"},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "properties": {
                                "spec": spec_schema,
                                "status": {
                                    "type": "object",
                                    "properties": {"phase": {"type": "string"}},
                                },
                            },
                        }
                    },
                }
            ],
        },
    }


async def _wait_served(kube: Kube, group: str, version: str) -> None:
    for _ in range(100):
        status, _ = await kube.request("GET", f"/apis/{group}/{version}")
        if status == 200:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"{group}/{version} never served")


@pytest.fixture
async def gadgets(kube: Kube) -> AsyncIterator[str]:
    group = f"g{uuid.uuid4().hex[:6]}.example.com"
    status, body = await kube.request("POST", CRDS, gadget_crd(group))
    assert status == 201, body
    await _wait_served(kube, group, "v1")
    try:
        yield f"/apis/{group}/v1/namespaces/{kube.namespace}/gadgets"
    finally:
        await kube.request("DELETE", f"{CRDS}/gadgets.{group}")


def gadget(base: str, name: str, spec: dict[str, Any]) -> dict[str, Any]:
    group = base.split("/")[2]
    return {
        "apiVersion": f"{group}/v1",
        "kind": "Gadget",
        "metadata": {"name": name},
        "spec": spec,
    }


def merge(spec: dict[str, Any]) -> dict[str, Any]:
    return {"spec": spec}


MERGE = "application/merge-patch+json"


async def test_changing_an_immutable_field_is_422_with_rule_message(
    kube: Kube, gadgets: str
) -> None:
    status, created = await kube.request(
        "POST", gadgets, gadget(gadgets, "a", {"owner": "alice", "mode": "fast"})
    )
    assert status == 201, created
    status, body = await kube.request(
        "PATCH", f"{gadgets}/a", merge({"owner": "bob"}), content_type=MERGE
    )
    assert status == 422, body
    assert body["reason"] == "Invalid"
    assert body["details"]["causes"] == [
        {
            "reason": "FieldValueInvalid",
            "message": 'Invalid value: "bob": owner is immutable',
            "field": "spec.owner",
        }
    ]
    assert body["message"].endswith(
        '"a" is invalid: spec.owner: Invalid value: "bob": owner is immutable'
    )
    assert body["message"].startswith("Gadget.")
    stored = await kube.request("GET", f"{gadgets}/a")
    assert stored[1]["spec"]["owner"] == "alice"


async def test_rule_without_message_reports_failed_rule(kube: Kube, gadgets: str) -> None:
    await kube.request("POST", gadgets, gadget(gadgets, "m", {"mode": "fast"}))
    status, body = await kube.request(
        "PATCH", f"{gadgets}/m", merge({"mode": "slow"}), content_type=MERGE
    )
    assert status == 422, body
    [cause] = body["details"]["causes"]
    assert cause["field"] == "spec.mode"
    assert cause["message"] == 'Invalid value: "slow": failed rule: self == oldSelf'


async def test_unchanged_update_and_other_fields_pass(kube: Kube, gadgets: str) -> None:
    status, created = await kube.request(
        "POST", gadgets, gadget(gadgets, "u", {"owner": "alice", "min": 1})
    )
    assert status == 201, created
    status, replaced = await kube.request("PUT", f"{gadgets}/u", created)
    assert status == 200, replaced
    status, patched = await kube.request(
        "PATCH", f"{gadgets}/u", merge({"owner": "alice", "min": 2}), content_type=MERGE
    )
    assert status == 200, patched
    assert patched["spec"] == {"owner": "alice", "min": 2}
    status, with_status = await kube.request(
        "PATCH", f"{gadgets}/u/status", {"status": {"phase": "Ready"}}, content_type=MERGE
    )
    assert status == 200, with_status


async def test_transition_rule_does_not_run_on_create_or_when_field_is_added(
    kube: Kube, gadgets: str
) -> None:
    status, body = await kube.request("POST", gadgets, gadget(gadgets, "c", {"min": 0}))
    assert status == 201, body
    # No old value to compare with: the transition rule is skipped when the field is added.
    status, body = await kube.request(
        "PATCH", f"{gadgets}/c", merge({"owner": "carol"}), content_type=MERGE
    )
    assert status == 200, body


async def test_plain_rule_runs_on_create_with_message_expression_and_field_path(
    kube: Kube, gadgets: str
) -> None:
    status, body = await kube.request("POST", gadgets, gadget(gadgets, "bad", {"min": 5, "max": 2}))
    assert status == 422, body
    assert body["details"]["causes"] == [
        {
            "reason": "FieldValueInvalid",
            # The failing value is the spec object: objects and lists are not printed.
            "message": "Invalid value: min 5 exceeds max 2",
            "field": "spec.min",
        }
    ]
    status, body = await kube.request("POST", gadgets, gadget(gadgets, "ok", {"min": 2, "max": 5}))
    assert status == 201, body
    status, body = await kube.request(
        "PATCH", f"{gadgets}/ok", merge({"max": 1}), content_type=MERGE
    )
    assert status == 422, body


async def test_transition_rule_in_map_list_items_correlates_by_key(
    kube: Kube, gadgets: str
) -> None:
    ports = [{"name": "http", "protocol": "TCP"}]
    status, body = await kube.request("POST", gadgets, gadget(gadgets, "p", {"ports": ports}))
    assert status == 201, body
    reordered = [{"name": "dns", "protocol": "UDP"}, {"name": "http", "protocol": "TCP"}]
    status, body = await kube.request(
        "PATCH", f"{gadgets}/p", merge({"ports": reordered}), content_type=MERGE
    )
    assert status == 200, body
    changed = [{"name": "dns", "protocol": "UDP"}, {"name": "http", "protocol": "SCTP"}]
    status, body = await kube.request(
        "PATCH", f"{gadgets}/p", merge({"ports": changed}), content_type=MERGE
    )
    assert status == 422, body
    assert body["details"]["causes"] == [
        {
            "reason": "FieldValueForbidden",
            "message": "Forbidden: protocol is immutable",
            "field": "spec.ports[1].protocol",
        }
    ]


async def test_crd_with_uncompilable_rule_is_refused(kube: Kube) -> None:
    group = f"g{uuid.uuid4().hex[:6]}.example.com"
    crd = gadget_crd(group, [{"rule": "self.min <"}])
    status, body = await kube.request("POST", CRDS, crd)
    assert status == 422, body
    fields = [c.get("field", "") for c in body["details"]["causes"]]
    assert any(
        # One version: its schema is the CRD's (the internal spec.validation) in the causes.
        f.startswith("spec.validation.openAPIV3Schema.properties[spec]")
        and "x-kubernetes-validations[1]" in f
        for f in fields
    ), fields


# --------------------------------------------------------------------------- project CRDs


def _project_crd(file_name: str) -> dict[str, Any]:
    doc = yaml.safe_load((CRD_DIR / file_name).read_text())
    assert doc["kind"] == "CustomResourceDefinition"
    return dict(doc)


async def _install(kube: Kube, crd: dict[str, Any]) -> None:
    status, body = await kube.request("POST", CRDS, crd)
    assert status in (201, 409), body  # 409: already installed on a shared cluster
    version = next(v["name"] for v in crd["spec"]["versions"] if v.get("storage"))
    await _wait_served(kube, crd["spec"]["group"], version)


async def test_project_crds_compile_every_rule(kube: Kube) -> None:
    for path in sorted(CRD_DIR.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if not doc or doc.get("kind") != "CustomResourceDefinition":
                continue
            status, body = await kube.request("POST", CRDS, doc, query=[("dryRun", "All")])
            assert status in (201, 409), (path.name, body)


async def test_node_maintenance_node_name_and_requestor_are_immutable(kube: Kube) -> None:
    await _install(kube, _project_crd("nodemaintenances.maintenance.nvidia.com.yaml"))
    base = f"/apis/maintenance.nvidia.com/v1alpha1/namespaces/{kube.namespace}/nodemaintenances"
    body = {
        "apiVersion": "maintenance.nvidia.com/v1alpha1",
        "kind": "NodeMaintenance",
        "metadata": {"name": "nm"},
        "spec": {"nodeName": "node-a", "requestorID": "nodeflow.dev"},
    }
    status, created = await kube.request("POST", base, body)
    assert status == 201, created
    for field, value in (("nodeName", "node-b"), ("requestorID", "other.dev")):
        status, refused = await kube.request(
            "PATCH", f"{base}/nm", merge({field: value}), content_type=MERGE
        )
        assert status == 422, refused
        assert refused["details"]["causes"] == [
            {
                "reason": "FieldValueInvalid",
                "message": f'Invalid value: "{value}": Value is immutable',
                "field": f"spec.{field}",
            }
        ]
    status, ok = await kube.request(
        "PATCH", f"{base}/nm", merge({"cordon": False}), content_type=MERGE
    )
    assert status == 200, ok
    assert ok["spec"]["nodeName"] == "node-a"


async def test_nodeset_and_nodeslice_immutable_fields(kube: Kube) -> None:
    nodeset_crd = _project_crd("nodesets.nodeflow.dev.yaml")
    nodeslice_crd = _project_crd("nodeslices.nodeflow.dev.yaml")
    await _install(kube, nodeset_crd)
    await _install(kube, nodeslice_crd)
    checks = [
        (nodeset_crd, "nodesets", ["slurmCluster", "podNamePrefix"]),
        (nodeslice_crd, "nodeslices", ["nodeSetName"]),
    ]
    for crd, plural, immutable in checks:
        version = next(v for v in crd["spec"]["versions"] if v.get("storage"))
        schema = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
        api_version = f"{crd['spec']['group']}/{version['name']}"
        base = f"/apis/{api_version}/namespaces/{kube.namespace}/{plural}"
        spec = _minimal_spec(schema)
        for field in immutable:
            spec.setdefault(field, "orig")
        body = {
            "apiVersion": api_version,
            "kind": crd["spec"]["names"]["kind"],
            "metadata": {"name": "imm"},
            "spec": spec,
        }
        status, created = await kube.request("POST", base, body)
        assert status == 201, (plural, created)
        for field in immutable:
            status, refused = await kube.request(
                "PATCH", f"{base}/imm", merge({field: "changed"}), content_type=MERGE
            )
            assert status == 422, (plural, field, refused)
            assert [c["field"] for c in refused["details"]["causes"]] == [f"spec.{field}"]
        status, same = await kube.request("PUT", f"{base}/imm", created)
        assert status == 200, (plural, same)


def _minimal_spec(schema: dict[str, Any]) -> dict[str, Any]:
    """Values for the required spec fields of a project CRD (strings, ints, objects)."""
    out: dict[str, Any] = {}
    props = schema.get("properties") or {}
    for name in schema.get("required") or []:
        sub = props.get(name) or {}
        kind = sub.get("type")
        if "enum" in sub:
            out[name] = sub["enum"][0]
        elif kind == "integer":
            out[name] = max(1, int(sub.get("minimum", 1)))
        elif kind == "object":
            out[name] = _minimal_spec(sub)
        elif kind == "array":
            item = sub.get("items") or {}
            out[name] = [_minimal_spec(item) if item.get("type") == "object" else "x"]
        elif kind == "boolean":
            out[name] = True
        else:
            out[name] = "orig"
    return out


async def test_type_errors_block_the_rules(kube: Kube, gadgets: str) -> None:
    status, body = await kube.request(
        "POST", gadgets, gadget(gadgets, "t", {"min": "five", "max": 2})
    )
    assert status == 422, body
    causes = body["details"]["causes"]
    assert causes[0]["field"] == "spec.min" and causes[0]["reason"] == "FieldValueTypeInvalid"
    assert any("some validation rules were not checked" in c["message"] for c in causes[1:])


# --------------------------------------------------------------------------- CEL errors


def probe_crd(group: str, spec_properties: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"probes.{group}"},
        "spec": {
            "group": group,
            "scope": "Namespaced",
            "names": {"plural": "probes", "singular": "probe", "kind": "Probe"},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "properties": {
                                "spec": {"type": "object", "properties": spec_properties}
                            },
                        }
                    },
                }
            ],
        },
    }


PROBE_SCHEMA = "spec.validation.openAPIV3Schema.properties[spec]"


async def test_rules_that_do_not_compile_or_are_not_bool_are_refused_with_the_rule(
    kube: Kube,
) -> None:
    name_rules = [
        {"rule": "size(self)"},
        {"rule": "self == 'a'", "messageExpression": "size(self)"},
        {"rule": "self.min <"},
    ]
    crd = probe_crd(
        f"p{uuid.uuid4().hex[:6]}.example.com",
        {
            "name": {"type": "string", "maxLength": 8, "x-kubernetes-validations": name_rules},
            "tags": {
                "type": "array",
                "maxItems": 4,
                "items": {
                    "type": "string",
                    "maxLength": 8,
                    "x-kubernetes-validations": [{"rule": "self == oldSelf"}],
                },
            },
        },
    )
    status, body = await kube.request("POST", CRDS, crd)
    assert status == 422, body
    causes = {c["field"]: (c["reason"], c["message"]) for c in body["details"]["causes"]}
    rules = f"{PROBE_SCHEMA}.properties[name].x-kubernetes-validations"
    empty = (
        '"Message":"","MessageExpression":"","Reason":null,"FieldPath":"","OptionalOldSelf":null'
    )
    assert causes[f"{rules}[0].rule"] == (
        "FieldValueInvalid",
        f'Invalid value: {{"Rule":"size(self)",{empty}}}: cel expression must evaluate to a bool',
    )
    assert causes[f"{rules}[1].messageExpression"] == (
        "FieldValueInvalid",
        'Invalid value: {"Rule":"self == \'a\'","Message":"","MessageExpression":"size(self)",'
        '"Reason":null,"FieldPath":"","OptionalOldSelf":null}: '
        "messageExpression must evaluate to a string",
    )
    _, message = causes[f"{rules}[2].rule"]
    assert message.startswith(
        f'Invalid value: {{"Rule":"self.min \\u003c",{empty}}}: compilation failed: '
        "ERROR: <input>:1:11: Syntax error: mismatched input '<EOF>' expecting"
    ), message

    # Structural errors come alone: with them, kube-apiserver does not compile the rules.
    crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"][
        "name"
    ]["x-kubernetes-validations"].append({"rule": "true", "reason": "Bogus"})
    status, body = await kube.request("POST", CRDS, crd)
    assert status == 422, body
    causes = {c["field"]: (c["reason"], c["message"]) for c in body["details"]["causes"]}
    tags = f"{PROBE_SCHEMA}.properties[tags]"
    assert sorted(causes) == [
        f"{rules}[3].reason",
        f"{tags}.items.x-kubernetes-validations[0].rule",
    ]
    assert causes[f"{rules}[3].reason"] == (
        "FieldValueNotSupported",
        'Unsupported value: "Bogus": supported values: "FieldValueDuplicate", '
        '"FieldValueForbidden", "FieldValueInvalid", "FieldValueRequired"',
    )
    assert causes[f"{tags}.items.x-kubernetes-validations[0].rule"] == (
        "FieldValueInvalid",
        'Invalid value: "self == oldSelf": oldSelf cannot be used on the uncorrelatable '
        f"portion of the schema within {tags}",
    )


async def test_runtime_error_and_number_values_in_rules(kube: Kube) -> None:
    group = f"p{uuid.uuid4().hex[:6]}.example.com"
    crd = probe_crd(
        group,
        {
            "labels": {
                "type": "object",
                "maxProperties": 8,
                "additionalProperties": {"type": "string", "maxLength": 8},
                "x-kubernetes-validations": [{"rule": "self['missing'] == 'x'"}],
            },
            # JSON's 1 is a double here: double + double applies.
            "ratio": {
                "type": "number",
                "x-kubernetes-validations": [{"rule": "self + 0.5 <= 1.5"}],
            },
        },
    )
    status, body = await kube.request("POST", CRDS, crd)
    assert status == 201, body
    await _wait_served(kube, group, "v1")
    base = f"/apis/{group}/v1/namespaces/{kube.namespace}/probes"
    try:

        async def create(spec: dict[str, Any]) -> tuple[int, Any]:
            probe = {"apiVersion": f"{group}/v1", "kind": "Probe", "spec": spec}
            probe["metadata"] = {"name": kube.unique("p")}
            return await kube.request("POST", base, probe)

        status, body = await create({"labels": {"a": "b"}})
        assert status == 422, body
        assert body["details"]["causes"] == [
            {
                "reason": "FieldValueInvalid",
                "message": 'Invalid value: "object": no such key: missing evaluating rule: '
                "self['missing'] == 'x'",
                "field": "spec.labels",
            }
        ]
        status, body = await create({"ratio": 1})
        assert status == 201, body
        status, body = await create({"ratio": 2})
        assert status == 422, body
        assert body["details"]["causes"] == [
            {
                "reason": "FieldValueInvalid",
                "message": "Invalid value: 2: failed rule: self + 0.5 <= 1.5",
                "field": "spec.ratio",
            }
        ]
    finally:
        await kube.request("DELETE", f"{CRDS}/probes.{group}")
