"""Decoding of Kubernetes protobuf request bodies (``application/vnd.kubernetes.protobuf``).

Since client-go 1.31 the typed clientsets send built-in kinds as protobuf by default, and a real
kube-apiserver always accepts that; ``kubectl create namespace`` or ``kubectl create configmap``
therefore send protobuf with no way for a server to ask for JSON instead (only the CBOR
encoding has a fall-back-after-415 mechanism).  So the emulator decodes the protobuf envelope
(``k8s\\x00`` + ``runtime.Unknown``) and the messages of the kinds kubectl's generators send,
field numbers as in ``k8s.io/api`` ``generated.proto``, into the JSON shape the store expects.

A kind not described here, or a described message carrying a field this table does not know
with a non-empty value, is refused (415 / 400 by the caller) rather than silently dropped.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

PROTOBUF = "application/vnd.kubernetes.protobuf"
MAGIC = b"k8s\x00"


class ProtobufError(ValueError):
    """The body is not a well-formed Kubernetes protobuf message."""


class UnsupportedKind(ValueError):
    """The body is well formed but names a kind (or field) this decoder does not describe."""


@dataclass(frozen=True)
class Field:
    name: str
    #: string, bytes, int, bool, time, message, map_string, map_bytes
    kind: str
    message: str | None = None
    repeated: bool = False
    #: Go pointer field: present on the wire means set, even to a zero value
    pointer: bool = False


def _f(name: str, kind: str = "string", **kwargs: Any) -> Field:
    return Field(name, kind, **kwargs)


MESSAGES: dict[str, dict[int, Field]] = {
    "Unknown": {
        1: _f("typeMeta", "message", message="TypeMeta"),
        2: _f("raw", "bytes"),
        3: _f("contentEncoding"),
        4: _f("contentType"),
    },
    "TypeMeta": {1: _f("apiVersion"), 2: _f("kind")},
    "ObjectMeta": {
        1: _f("name"),
        2: _f("generateName"),
        3: _f("namespace"),
        4: _f("selfLink"),
        5: _f("uid"),
        6: _f("resourceVersion"),
        7: _f("generation", "int"),
        8: _f("creationTimestamp", "time"),
        9: _f("deletionTimestamp", "time"),
        10: _f("deletionGracePeriodSeconds", "int", pointer=True),
        11: _f("labels", "map_string"),
        12: _f("annotations", "map_string"),
        13: _f("ownerReferences", "message", message="OwnerReference", repeated=True),
        14: _f("finalizers", repeated=True),
    },
    "OwnerReference": {
        1: _f("kind"),
        3: _f("name"),
        4: _f("uid"),
        5: _f("apiVersion"),
        6: _f("controller", "bool", pointer=True),
        7: _f("blockOwnerDeletion", "bool", pointer=True),
    },
    "Namespace": {
        1: _f("metadata", "message", message="ObjectMeta"),
        2: _f("spec", "message", message="NamespaceSpec"),
        3: _f("status", "message", message="NamespaceStatus"),
    },
    "NamespaceSpec": {1: _f("finalizers", repeated=True)},
    "NamespaceStatus": {1: _f("phase")},
    "ConfigMap": {
        1: _f("metadata", "message", message="ObjectMeta"),
        2: _f("data", "map_string"),
        3: _f("binaryData", "map_bytes"),
        4: _f("immutable", "bool", pointer=True),
    },
    "DeleteOptions": {
        1: _f("gracePeriodSeconds", "int", pointer=True),
        2: _f("preconditions", "message", message="Preconditions", pointer=True),
        3: _f("orphanDependents", "bool", pointer=True),
        4: _f("propagationPolicy", pointer=True),
        5: _f("dryRun", repeated=True),
    },
    "Preconditions": {1: _f("uid", pointer=True), 2: _f("resourceVersion", pointer=True)},
}

#: kind -> (message name, apiVersions it is accepted under)
KINDS: dict[str, tuple[str, tuple[str, ...]]] = {
    "Namespace": ("Namespace", ("v1",)),
    "ConfigMap": ("ConfigMap", ("v1",)),
    "DeleteOptions": ("DeleteOptions", ("v1", "meta.k8s.io/v1")),
}


# --------------------------------------------------------------------------- wire format


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    result = 0
    shift = 0
    while True:
        if pos >= len(data):
            raise ProtobufError("truncated varint")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise ProtobufError("varint too long")


def _fields(data: bytes) -> list[tuple[int, int, Any]]:
    """(field number, wire type, raw value) for every field of a message, in order."""
    out: list[tuple[int, int, Any]] = []
    pos = 0
    while pos < len(data):
        tag, pos = _varint(data, pos)
        number, wire = tag >> 3, tag & 7
        if number == 0:
            raise ProtobufError("field number 0")
        value: Any
        if wire == 0:
            value, pos = _varint(data, pos)
        elif wire == 2:
            length, pos = _varint(data, pos)
            if pos + length > len(data):
                raise ProtobufError("truncated length-delimited field")
            value = data[pos : pos + length]
            pos += length
        elif wire == 1:
            value = int.from_bytes(data[pos : pos + 8], "little")
            pos += 8
        elif wire == 5:
            value = int.from_bytes(data[pos : pos + 4], "little")
            pos += 4
        else:
            raise ProtobufError(f"unsupported wire type {wire}")
        if pos > len(data):
            raise ProtobufError("truncated fixed-width field")
        out.append((number, wire, value))
    return out


def _signed64(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def _is_zero(value: Any) -> bool:
    return value in (0, b"") or value is False


def _scalar(spec: Field, wire: int, value: Any, where: str) -> Any:
    if spec.kind in ("int", "bool"):
        if wire != 0:
            raise ProtobufError(f"{where}: expected a varint")
        return bool(value) if spec.kind == "bool" else _signed64(value)
    if wire != 2:
        raise ProtobufError(f"{where}: expected a length-delimited field")
    if spec.kind == "string":
        try:
            return value.decode()
        except UnicodeDecodeError as exc:
            raise ProtobufError(f"{where}: invalid UTF-8") from exc
    if spec.kind == "bytes":
        return base64.b64encode(value).decode()
    if spec.kind == "time":
        fields = {n: v for n, _, v in _fields(value)}
        if not fields.get(1) and not fields.get(2):
            return None
        moment = datetime.fromtimestamp(_signed64(fields.get(1, 0)), UTC)
        return moment.strftime("%Y-%m-%dT%H:%M:%SZ")
    raise ProtobufError(f"{where}: unknown field kind {spec.kind}")


def _map_entry(value: bytes, spec: Field, where: str) -> tuple[str, str]:
    key = ""
    item: Any = ""
    for number, wire, raw in _fields(value):
        if wire != 2:
            raise ProtobufError(f"{where}: map entries are length-delimited")
        if number == 1:
            key = raw.decode()
        elif number == 2:
            item = base64.b64encode(raw).decode() if spec.kind == "map_bytes" else raw.decode()
    return key, item


def decode_message(data: bytes, message: str, where: str = "") -> dict[str, Any]:
    """Decode ``data`` as ``message`` into JSON-shaped values (zero values dropped)."""
    layout = MESSAGES[message]
    out: dict[str, Any] = {}
    for number, wire, value in _fields(data):
        spec = layout.get(number)
        path = f"{where}.{spec.name}" if where and spec else (spec.name if spec else where)
        if spec is None:
            if _is_zero(value):
                continue  # an unset non-pointer field: the same as absent in JSON
            raise UnsupportedKind(
                f"field number {number} of {message} ({where or 'top level'}) is not supported "
                "by the emulator's protobuf decoder"
            )
        if spec.kind in ("map_string", "map_bytes"):
            key, item = _map_entry(value, spec, path)
            out.setdefault(spec.name, {})[key] = item
            continue
        if spec.kind == "message":
            assert spec.message is not None
            if wire != 2:
                raise ProtobufError(f"{path}: expected a message")
            decoded: Any = decode_message(value, spec.message, path)
            if not decoded and not spec.pointer and not spec.repeated:
                continue
        else:
            decoded = _scalar(spec, wire, value, path)
            if decoded is None:
                continue
            if not spec.pointer and not spec.repeated and (decoded == "" or _is_zero(decoded)):
                continue
        if spec.repeated:
            out.setdefault(spec.name, []).append(decoded)
        else:
            out[spec.name] = decoded
    return out


def decode_body(raw: bytes) -> dict[str, Any]:
    """A whole request body (magic + runtime.Unknown) as a JSON-shaped object."""
    if not raw.startswith(MAGIC):
        raise ProtobufError("missing the k8s protobuf magic prefix")
    envelope = _fields(raw[len(MAGIC) :])
    type_meta: dict[str, Any] = {}
    payload = b""
    for number, wire, value in envelope:
        if wire != 2:
            continue
        if number == 1:
            type_meta = decode_message(value, "TypeMeta", "typeMeta")
        elif number == 2:
            payload = value
        elif number == 3 and value:
            raise UnsupportedKind(f"content encoding {value.decode(errors='replace')!r}")
    api_version = type_meta.get("apiVersion", "")
    kind = type_meta.get("kind", "")
    described = KINDS.get(kind)
    if described is None or api_version not in described[1]:
        raise UnsupportedKind(
            f"protobuf bodies of {api_version or '?'}/{kind or '?'} are not supported by the "
            "emulator (send application/json)"
        )
    body = decode_message(payload, described[0])
    return {"apiVersion": api_version, "kind": kind, **body}
