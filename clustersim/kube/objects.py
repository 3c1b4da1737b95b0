"""What the object store and its collaborators (``gc``, ``disruption``, ``admission``) share
without importing one another: the JSON object type, copying, timestamps, dotted-path access and
the result of a delete."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar, cast

import msgspec

Obj = dict[str, Any]
_T = TypeVar("_T")

_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder()


def deep_copy(obj: _T) -> _T:
    """Fast deep copy of a JSON value."""
    return cast(_T, _decoder.decode(_encoder.encode(obj)))


_now_cache: tuple[int, str] = (0, "")


def now_rfc3339() -> str:
    """The current time at second precision (as metav1.Time serialises), cached per second:
    formatting it is a measurable part of a create."""
    global _now_cache
    second = int(time.time())
    if _now_cache[0] != second:
        stamp = datetime.fromtimestamp(second, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        _now_cache = (second, stamp)
    return _now_cache[1]


@dataclass
class DeleteResult:
    object: Obj
    deleted: bool  # False: still present with deletionTimestamp (finalizers / graceful)


def get_path(obj: Any, path: str) -> Any:
    current = obj
    for part in path.lstrip(".").split("."):
        if not isinstance(current, Mapping):
            return None
        current = current.get(part)
    return current


def set_path(obj: Obj, path: str, value: Any) -> None:
    parts = path.lstrip(".").split(".")
    current = obj
    for part in parts[:-1]:
        nxt = current.get(part)
        if not isinstance(nxt, dict):
            nxt = current[part] = {}
        current = nxt
    current[parts[-1]] = value
