"""What Nodeflow reads and writes of slurmrestd, per Slurm release and data_parser version.

Reads the OpenAPI documents real slurmrestd serve (tests/conformance/slurm/openapi/<release>/
slurm-<release>-<version>.json.gz, captured by `tools/slurm/real_slurm.sh openapi`) and writes a
Markdown summary: for each version the node fields, the node enums (state and flags), the node
update body, the reservation create/delete operations, the number structures (`{set, infinite,
number}`), the error shape, and what changed from the version before.

    .venv/bin/python tools/slurm/openapi_summary.py tests/conformance/slurm/openapi \
        > tests/conformance/slurm/openapi/SUMMARY.md
    .venv/bin/python tools/slurm/openapi_summary.py --check tests/conformance/slurm/openapi
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

Schema = Mapping[str, Any]
DOCUMENT_NAME = re.compile(r"^slurm-(?P<release>[0-9.]+)-(?P<version>v[0-9.]+)\.json\.gz$")
METHODS = ("get", "post", "put", "patch", "delete")


@dataclass(frozen=True)
class Document:
    release: str
    version: str
    spec: Mapping[str, Any]

    @property
    def schemas(self) -> Mapping[str, Schema]:
        schemas: Mapping[str, Schema] = self.spec["components"]["schemas"]
        return schemas

    def resolve(self, schema: Schema) -> Schema:
        """The schema a `$ref` points at (following chains), or the schema itself."""
        seen: set[str] = set()
        while "$ref" in schema:
            ref = str(schema["$ref"])
            if ref in seen:
                raise ValueError(f"{self.version}: $ref cycle at {ref}")
            seen.add(ref)
            schema = self.schemas[ref.removeprefix("#/components/schemas/")]
        return schema

    def short(self, ref: str) -> str:
        """A schema's name without the path and its version prefix (v0.0.45_node -> node)."""
        return ref.removeprefix("#/components/schemas/").removeprefix(f"{self.version}_")

    def path(self, suffix: str) -> str | None:
        """The document's path for /slurm/<version>/<suffix>, with or without a final slash."""
        for candidate in (f"/slurm/{self.version}/{suffix}", f"/slurm/{self.version}/{suffix}/"):
            if candidate in self.spec["paths"]:
                return candidate
        return None

    def request_body(self, operation: Schema) -> Schema | None:
        body = operation.get("requestBody", {}).get("content", {}).get("application/json")
        return None if body is None else self.resolve(body["schema"])


def load_documents(directory: Path) -> list[Document]:
    documents = []
    for file in sorted(directory.glob("*/slurm-*.json.gz")):
        match = DOCUMENT_NAME.match(file.name)
        if match is None:
            raise ValueError(f"{file}: not named slurm-<release>-<version>.json.gz")
        with gzip.open(file, "rt", encoding="utf-8") as text:
            spec = json.load(text)
        documents.append(Document(match["release"], match["version"], spec))
    return sorted(documents, key=lambda d: (release_key(d.release), release_key(d.version[1:])))


def release_key(dotted: str) -> tuple[int, ...]:
    return tuple(int(part) for part in dotted.split("."))


def is_number_structure(schema: Schema) -> bool:
    """Slurm's number with flags: `{set, infinite, number}` (names vary by version)."""
    return {"set", "infinite", "number"} <= set(schema.get("properties", {}))


def type_of(document: Document, schema: Schema, depth: int = 0) -> str:
    """A schema as one short type: a named schema by its name (with what it is when it is
    a plain type or a list), arrays as array<...>, formats in brackets, enums counted. An
    object written out in place shows its fields' types at the top level (and always for a
    number structure), only their names below."""
    if "$ref" in schema:
        name = document.short(str(schema["$ref"]))
        target = document.resolve(schema)
        if target.get("type") == "object" or "properties" in target:
            return name
        return f"{name}={type_of(document, target, depth)}"
    kind = str(schema.get("type", "any"))
    if kind == "array":
        return f"array<{type_of(document, schema.get('items', {}), depth)}>"
    if kind == "object" and "properties" in schema:
        if depth == 0 or is_number_structure(schema):
            fields = ", ".join(
                f"{name}: {type_of(document, field, depth + 1)}"
                for name, field in schema["properties"].items()
            )
        else:
            fields = ", ".join(schema["properties"])
        return "{" + fields + "}"
    if kind == "object" and isinstance(schema.get("additionalProperties"), Mapping):
        return f"map<{type_of(document, schema['additionalProperties'], depth)}>"
    if "enum" in schema:
        return f"{kind} enum({len(schema['enum'])})"
    if "format" in schema:
        return f"{kind}({schema['format']})"
    return kind


def enum_of(document: Document, schema: Schema) -> list[str] | None:
    """The enum a field takes (itself or, for a list, its items'), if any."""
    schema = document.resolve(schema)
    if schema.get("type") == "array":
        schema = document.resolve(schema.get("items", {}))
    values = schema.get("enum")
    return None if values is None else [str(value) for value in values]


def properties(document: Document, schema: Schema) -> Mapping[str, Schema]:
    resolved: Mapping[str, Schema] = document.resolve(schema).get("properties", {})
    return resolved


def node_schema(document: Document) -> Schema:
    """One entry of GET /slurm/<version>/nodes' `nodes` list."""
    listing = document.path("nodes")
    if listing is None:
        raise ValueError(f"{document.version}: no /nodes path")
    answer = document.spec["paths"][listing]["get"]["responses"]["200"]["content"]
    nodes = properties(document, answer["application/json"]["schema"])["nodes"]
    return document.resolve(document.resolve(nodes)["items"])


def field_lines(document: Document, schema: Schema) -> Iterator[str]:
    for name, field in properties(document, schema).items():
        yield f"`{name}`: {type_of(document, field, depth=1)}"


def enum_lines(document: Document, schema: Schema) -> Iterator[str]:
    for name, field in properties(document, schema).items():
        values = enum_of(document, field)
        if values is not None:
            yield f"- `{name}` ({len(values)}): {', '.join(values)}"


def operations(document: Document, word: str) -> Iterator[tuple[str, str, Schema]]:
    for path, item in document.spec["paths"].items():
        if word in path:
            for method in METHODS:
                if method in item:
                    yield path, method.upper(), item[method]


def number_structures(document: Document) -> Iterator[str]:
    """The named number structures; a version that writes them out in place (24.11's
    v0.0.41) has none by name, and the fields show them."""
    for name, schema in document.schemas.items():
        if is_number_structure(schema):
            yield f"`{document.short(name)}` {type_of(document, schema)}"


def error_shape(document: Document) -> Iterator[str]:
    for name in ("openapi_error", "openapi_warning", "openapi_resp"):
        schema = document.schemas.get(f"{document.version}_{name}")
        if schema is not None:
            yield f"`{name}` {type_of(document, schema)}"


def node_update_body(document: Document) -> Schema | None:
    path = document.path("node/{node_name}")
    if path is None or "post" not in document.spec["paths"][path]:
        return None
    return document.request_body(document.spec["paths"][path]["post"])


def shape_of(document: Document, schema: Schema) -> str:
    """A schema's structure with every name resolved away, so the same structure compares
    equal whether a version names it (uint64_no_val_struct) or writes it out in place."""
    schema = document.resolve(schema)
    kind = str(schema.get("type", "any"))
    if kind == "array":
        return f"array<{shape_of(document, schema.get('items', {}))}>"
    if "properties" in schema:
        fields = ", ".join(
            f"{name}: {shape_of(document, field)}" for name, field in schema["properties"].items()
        )
        return "{" + fields + "}"
    if "enum" in schema:
        return f"{kind} enum"
    return f"{kind}({schema['format']})" if "format" in schema else kind


def facts(document: Document) -> dict[str, dict[str, str]]:
    """What the changes between two versions are counted on: name -> structure."""
    node = node_schema(document)
    update = node_update_body(document)

    def shapes(schema: Schema | None) -> dict[str, str]:
        if schema is None:
            return {}
        return {n: shape_of(document, f) for n, f in properties(document, schema).items()}

    found = {
        "paths": {
            f"{method} {path.split('/', 3)[3]}": "" for path, method, _ in operations(document, "")
        },
        "node fields": shapes(node),
        "node update fields": shapes(update),
    }
    for name, field in properties(document, node).items():
        values = enum_of(document, field)
        if values is not None:
            found[f"node `{name}` values"] = dict.fromkeys(values, "")
    return found


def changes(before: Document, after: Document) -> Iterator[str]:
    old, new = facts(before), facts(after)
    for key in sorted(old.keys() | new.keys()):
        was, now = old.get(key, {}), new.get(key, {})
        added = [name for name in now if name not in was]
        removed = [name for name in was if name not in now]
        changed = [name for name in now if name in was and now[name] != was[name]]
        if added:
            yield f"- {key}, added: {', '.join(added)}"
        if removed:
            yield f"- {key}, removed: {', '.join(removed)}"
        for name in changed:
            yield f"- {key}, `{name}` was {was[name]}, now {now[name]}"


def summarize(document: Document, previous: Document | None) -> Iterator[str]:
    yield f"## Slurm {document.release}, data_parser {document.version}"
    yield ""
    yield "Paths: " + "; ".join(f"{m} {p}" for p, m, _ in operations(document, ""))
    yield ""
    node = node_schema(document)
    yield "Node fields (GET nodes, `nodes[]`): " + "; ".join(field_lines(document, node))
    yield ""
    yield "Node enums:"
    yield from enum_lines(document, node)
    yield ""
    update = node_update_body(document)
    if update is None:
        yield "Node update (POST node/{node_name}): none"
    else:
        yield "Node update body (POST node/{node_name}): " + "; ".join(
            field_lines(document, update)
        )
        yield ""
        yield "Node update enums:"
        yield from enum_lines(document, update)
    yield ""
    yield "Reservations:"
    for path, method, operation in operations(document, "reservation"):
        body = document.request_body(operation)
        line = f"- {method} `{path}`"
        if body is not None:
            line += ", body: " + "; ".join(field_lines(document, body))
        yield line
        if body is not None:
            yield from (f"  {enum}" for enum in enum_lines(document, body))
    yield ""
    yield "Number structures: " + ("; ".join(number_structures(document)) or "none by name")
    yield ""
    yield "Errors and warnings: " + "; ".join(error_shape(document))
    yield ""
    if previous is not None:
        yield f"Changes from Slurm {previous.release} {previous.version}:"
        yield from list(changes(previous, document)) or ["- none"]
        yield ""


def summary(documents: list[Document]) -> str:
    lines = [
        "# slurmrestd per data_parser version (generated)",
        "",
        "Generated from the documents beside this file by `tools/slurm/openapi_summary.py`; "
        "do not edit. Types: a named schema by its name (`=` what it is when it is not an "
        "object), `enum(n)` for n values (listed under the enums). A node's `state` holds its "
        "base state and its flags in one list, so its enum has both.",
        "",
    ]
    previous: Document | None = None
    for document in documents:
        lines.extend(summarize(document, previous))
        previous = document
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory", type=Path, help="tests/conformance/slurm/openapi")
    parser.add_argument(
        "--check", action="store_true", help="exit 1 if SUMMARY.md there is not up to date"
    )
    args = parser.parse_args(argv)
    text = summary(load_documents(args.directory))
    if args.check:
        written = args.directory / "SUMMARY.md"
        if not written.exists() or written.read_text(encoding="utf-8") != text:
            print(f"{written} is not generated from the documents beside it", file=sys.stderr)
            return 1
        return 0
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
