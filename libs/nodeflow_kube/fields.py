"""Tolerant readers for raw Kubernetes objects (decoded JSON dicts), the one set every service
and the simulator's scheduling use.

The objects come over the wire or out of a KV store; a missing or malformed field reads as
its empty default instead of raising, so one odd object cannot stop a whole scheduling or
reconcile pass.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

Obj = Mapping[str, Any]


def mapping(value: object) -> Obj:
    """`value` if it is a mapping, else an empty one."""
    # Objects decoded from JSON are dicts; the exact type check is much cheaper than the ABC's.
    if type(value) is dict:
        return value
    return value if isinstance(value, Mapping) else {}


def sequence(value: object) -> list[Any]:
    """`value` if it is a list, else an empty one."""
    return value if isinstance(value, list) else []


def text(value: object) -> str:
    """A string field; absent (None) reads as "" the way Go's zero value does."""
    return "" if value is None else str(value)


def meta(obj: Obj) -> Obj:
    return mapping(obj.get("metadata"))


def name_of(obj: Obj) -> str:
    return text(meta(obj).get("name"))


def namespace_of(obj: Obj) -> str:
    return text(meta(obj).get("namespace"))


def uid_of(obj: Obj) -> str:
    return text(meta(obj).get("uid"))


def resource_version_of(obj: Obj) -> str:
    return text(meta(obj).get("resourceVersion"))


def resource_version_reached(current: str, target: str) -> bool:
    """Has an object whose resourceVersion is `current` seen the write that produced
    `target`? resourceVersions are opaque; numeric ones (etcd, the emulator) compare."""
    if current == target:
        return True
    if current.isdigit() and target.isdigit():
        return int(current) >= int(target)
    return False


def labels_of(obj: Obj) -> Obj:
    return mapping(meta(obj).get("labels"))


def annotations_of(obj: Obj) -> Obj:
    return mapping(meta(obj).get("annotations"))


def condition(obj: Obj, kind: str) -> Obj | None:
    """The `status.conditions` entry of type `kind`, if any."""
    for entry in sequence(mapping(obj.get("status")).get("conditions")):
        if mapping(entry).get("type") == kind:
            return mapping(entry)
    return None


def parse_time(value: object) -> float | None:
    """Seconds since the epoch of an RFC 3339 timestamp (as the API server writes them); None
    when absent or malformed."""
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.timestamp()


def rfc3339(seconds: float) -> str:
    """An API server timestamp (whole seconds, UTC)."""
    return datetime.fromtimestamp(int(seconds), tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
