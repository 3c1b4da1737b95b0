"""KV writes as messages of a batch publish: a put, or a delete marker.

A KV bucket is a stream whose subjects are `$KV.<bucket>.<key>`; a put is a publish there and
a delete is an empty publish with the `KV-Operation: DEL` header. Services that write KV
entries together with events in one `Bus.publish_batch` build those messages here, so the
subject form and the header live in one place (KVView reads the same header back).
"""

from __future__ import annotations

from typing import Any, Final

from nodeflow_bus.connection import OutgoingMessage
from nodeflow_bus.kv_view import KV_OPERATION
from nodeflow_contracts import subjects

KV_DELETE: Final = "DEL"


def kv_put(bucket: str, key: str, value: Any) -> OutgoingMessage:
    """Put `value` (a contract struct or raw bytes) under `key` in `bucket`."""
    return OutgoingMessage(subject=subjects.kv_entry(bucket, key), message=value)


def kv_delete(bucket: str, key: str) -> OutgoingMessage:
    """Delete `key` from `bucket` (a delete marker: watchers see the key go)."""
    return OutgoingMessage(
        subject=subjects.kv_entry(bucket, key),
        message=b"",
        headers={KV_OPERATION: KV_DELETE},
    )
