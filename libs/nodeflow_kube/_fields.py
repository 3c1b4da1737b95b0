"""Tolerant readers for raw Kubernetes objects (decoded JSON dicts).

The predicates run on objects that came over the wire or out of a KV store; a missing or
malformed field reads as its empty default instead of raising, so one odd object cannot stop
a whole scheduling or reconcile pass.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

Obj = Mapping[str, Any]


def mapping(value: object) -> Obj:
    """`value` if it is a mapping, else an empty one."""
    return value if isinstance(value, Mapping) else {}


def sequence(value: object) -> list[Any]:
    """`value` if it is a list, else an empty one."""
    return value if isinstance(value, list) else []


def text(value: object) -> str:
    """A string field; absent (None) reads as "" the way Go's zero value does."""
    return "" if value is None else str(value)


def labels_of(obj: Obj) -> Obj:
    return mapping(mapping(obj.get("metadata")).get("labels"))


def name_of(obj: Obj) -> str:
    return text(mapping(obj.get("metadata")).get("name"))
