"""Facts read out of slurmrestd's OpenAPI documents (`/openapi/v3`), one version at a time.

A document of a slurmrestd that loads several data_parser versions lists the paths of each
(`/slurm/v0.0.42/...`, `/slurm/v0.0.43/...`), each path pointing at its own version's schemas;
`facts(document, "v0.0.42")` follows the paths of that version only. The captured documents of
real Slurm releases live in tests/conformance/slurm/openapi/ (tools/slurm/real_slurm.sh).
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nodeflow_contracts.slurm_api import versions_in_openapi

CAPTURED = Path(__file__).parent / "openapi"
Json = Mapping[str, Any]


@dataclass(frozen=True)
class VersionFacts:
    name: str
    node_states: frozenset[str]
    node_fields: frozenset[str]
    node_update_fields: frozenset[str]
    node_update_states: frozenset[str]
    ping_fields: frozenset[str]
    job_fields: frozenset[str]
    job_desc_fields: frozenset[str]
    job_submit_fields: frozenset[str]
    nodes_answer_fields: frozenset[str]
    error_fields: frozenset[str]
    warning_fields: frozenset[str]
    meta_fields: frozenset[str]
    # Fields of the node entry whose schema is an object (a `*_no_val_struct`, referenced or,
    # in 24.11's v0.0.41, inlined) -> that object's fields.
    node_objects: Mapping[str, frozenset[str]]
    # `POST /reservation` body fields and `flags` words; empty without that path or without
    # `DELETE /reservation/{reservation_name}` (a version that cannot do both does neither).
    reservation_desc_fields: frozenset[str] = frozenset()
    reservation_flags: frozenset[str] = frozenset()


class _Spec:
    def __init__(self, document: Json, version: str) -> None:
        self.document = document
        self.prefix = f"/slurm/{version}/"

    def resolve(self, schema: Json) -> Json:
        while "$ref" in schema:
            name = str(schema["$ref"]).rsplit("/", 1)[-1]
            schema = self.document["components"]["schemas"][name]
        return schema

    def properties(self, schema: Json) -> Json:
        return dict(self.resolve(schema).get("properties", {}))

    def items(self, schema: Json) -> Json:
        return self.resolve(self.resolve(schema)["items"])

    def operation(self, tail: str, method: str) -> Json:
        for path, operations in self.document["paths"].items():
            if path.startswith(self.prefix) and path[len(self.prefix) :].rstrip("/") == tail:
                return dict(operations[method])
        raise KeyError(f"no {method.upper()} {self.prefix}{tail}")

    def answer(self, tail: str, method: str) -> Json:
        operation = self.operation(tail, method)
        return dict(operation["responses"]["200"]["content"]["application/json"]["schema"])

    def body(self, tail: str, method: str) -> Json:
        operation = self.operation(tail, method)
        return dict(operation["requestBody"]["content"]["application/json"]["schema"])


def facts(document: Json, version: str) -> VersionFacts:
    spec = _Spec(document, version)
    node_answer = spec.properties(spec.answer("node/{node_name}", "get"))
    node = spec.items(node_answer["nodes"])
    node_properties = spec.properties(node)
    update = spec.properties(spec.body("node/{node_name}", "post"))
    ping_answer = spec.properties(spec.answer("ping", "get"))
    job = spec.items(spec.properties(spec.answer("job/{job_id}", "get"))["jobs"])
    submit = spec.resolve(spec.body("job/submit", "post"))
    objects = {
        name: frozenset(spec.properties(schema))
        for name, schema in node_properties.items()
        if spec.resolve(schema).get("type") == "object"
    }
    return VersionFacts(
        name=version,
        node_states=frozenset(spec.items(node_properties["state"])["enum"]),
        node_fields=frozenset(node_properties),
        node_update_fields=frozenset(update),
        node_update_states=frozenset(spec.items(update["state"])["enum"]),
        ping_fields=frozenset(spec.properties(spec.items(ping_answer["pings"]))),
        job_fields=frozenset(spec.properties(job)),
        job_desc_fields=frozenset(spec.properties(submit["properties"]["job"])),
        job_submit_fields=frozenset(spec.properties(spec.answer("job/submit", "post"))),
        nodes_answer_fields=frozenset(spec.properties(spec.answer("nodes", "get"))),
        error_fields=frozenset(spec.properties(spec.items(ping_answer["errors"]))),
        warning_fields=frozenset(spec.properties(spec.items(ping_answer["warnings"]))),
        meta_fields=frozenset(spec.properties(ping_answer["meta"])),
        node_objects=objects,
        **_reservation_facts(spec),
    )


def _reservation_facts(spec: _Spec) -> dict[str, frozenset[str]]:
    try:
        desc = spec.properties(spec.body("reservation", "post"))
        spec.operation("reservation/{reservation_name}", "delete")
    except KeyError:
        return {}
    return {
        "reservation_desc_fields": frozenset(desc),
        "reservation_flags": frozenset(spec.items(desc["flags"])["enum"]),
    }


@dataclass(frozen=True)
class Captured:
    """One captured document: `<release>/slurm-<release>.<micro>-<version>.json.gz`."""

    path: Path
    release: str
    version: str
    document: Json


def captured_documents(directory: Path = CAPTURED) -> list[Captured]:
    """Every captured document of every release, one per (release, version) it holds."""
    found: list[Captured] = []
    for path in sorted([*directory.rglob("*.json.gz"), *directory.rglob("*.json")]):
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rt", encoding="utf-8") as handle:
            document = json.load(handle)
        if not isinstance(document, dict):
            continue
        release = path.parent.name  # 24.11, 26.05
        for version in sorted(versions_in_openapi(document)):
            found.append(Captured(path, release, version, document))
    return found
