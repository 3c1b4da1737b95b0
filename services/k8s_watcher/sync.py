"""Pure decisions of the mirror: which watch/list results are changes, and the NATS messages
(KV put or delete, plus an event) each change becomes. No I/O here."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

import msgspec

from k8s_watcher.kinds import KindInfo
from nodeflow_bus import OutgoingMessage
from nodeflow_bus.kv_writes import kv_delete, kv_put
from nodeflow_contracts import subjects
from nodeflow_contracts.k8s import K8sObjectEvent, WatchEventType

_encoder = msgspec.json.Encoder()


class Stamp(NamedTuple):
    """What identifies one state of one object: same stamp, same content."""

    uid: str
    resource_version: str


class _StampMeta(msgspec.Struct):
    uid: str = ""
    resourceVersion: str = ""  # the Kubernetes field name


class StoredObject(msgspec.Struct):
    """Decodes only the stamp of an object stored in KV (the rest is skipped, cheaply)."""

    metadata: _StampMeta = msgspec.field(default_factory=_StampMeta)

    @property
    def stamp(self) -> Stamp:
        return Stamp(self.metadata.uid, self.metadata.resourceVersion)


@dataclass(frozen=True)
class Change:
    type: WatchEventType
    key: str
    object: dict[str, Any]

    @property
    def stamp(self) -> Stamp:
        return stamp_of(self.object)


def stamp_of(obj: Mapping[str, Any]) -> Stamp:
    meta = obj.get("metadata") or {}
    return Stamp(str(meta.get("uid", "")), str(meta.get("resourceVersion", "")))


def key_of(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    return subjects.object_key(meta.get("namespace") or None, str(meta["name"]))


def normalize(kind: KindInfo, obj: dict[str, Any]) -> dict[str, Any]:
    """Drop managedFields and fill in apiVersion/kind (list items come without them)."""
    meta = obj.get("metadata")
    if isinstance(meta, dict):
        meta.pop("managedFields", None)
    obj.setdefault("apiVersion", kind.api_version)
    obj.setdefault("kind", kind.kind)
    return obj


def watch_changes(
    kind: KindInfo, known: Mapping[str, Stamp], events: Iterable[Mapping[str, Any]]
) -> tuple[list[Change], str | None]:
    """Changes in a batch of watch events, and the resourceVersion to resume from.

    An ADDED/MODIFIED whose stamp is already known is a replay and is dropped; a DELETED of
    an object never mirrored is dropped. BOOKMARK only moves the resourceVersion. ERROR
    events are not handled here (see `watch_error`).
    """
    changes: list[Change] = []
    seen = dict(known)
    last_rv: str | None = None
    for event in events:
        obj = event.get("object") or {}
        rv = (obj.get("metadata") or {}).get("resourceVersion")
        event_type = event.get("type")
        if event_type == "BOOKMARK":
            last_rv = rv or last_rv
            continue
        if event_type not in ("ADDED", "MODIFIED", "DELETED"):
            continue
        last_rv = rv or last_rv
        obj = normalize(kind, dict(obj))
        key = key_of(obj)
        stamp = stamp_of(obj)
        if event_type == "DELETED":
            if key not in seen:
                continue
            del seen[key]
            changes.append(Change("DELETED", key, obj))
            continue
        if seen.get(key) == stamp:
            continue
        seen[key] = stamp
        changes.append(Change(event_type, key, obj))
    return changes, last_rv


def watch_error(events: Iterable[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The Status of the first ERROR event in a batch, if any."""
    for event in events:
        if event.get("type") == "ERROR":
            status = event.get("object")
            return status if isinstance(status, Mapping) else {"code": 500, "message": ""}
    return None


def list_page_changes(
    kind: KindInfo, known: Mapping[str, Stamp], items: Iterable[dict[str, Any]]
) -> tuple[list[Change], list[str]]:
    """Changes among one page of a (re)list, and the keys it contained.

    Unknown key: ADDED. Same key, other resourceVersion: MODIFIED. Same key, other uid: the
    object was deleted and recreated while we were not watching, so its old incarnation gets
    a DELETED (with a placeholder object; the caller fills in the stored one) then ADDED.
    """
    changes: list[Change] = []
    keys: list[str] = []
    for raw in items:
        obj = normalize(kind, raw)
        key = key_of(obj)
        keys.append(key)
        stamp = stamp_of(obj)
        old = known.get(key)
        if old == stamp:
            continue
        if old is None:
            changes.append(Change("ADDED", key, obj))
        elif old.uid != stamp.uid:
            changes.append(Change("DELETED", key, placeholder(kind, key, old)))
            changes.append(Change("ADDED", key, obj))
        else:
            changes.append(Change("MODIFIED", key, obj))
    return changes, keys


def vanished_keys(known: Iterable[str], listed: set[str]) -> list[str]:
    """Keys mirrored before a relist that the relist no longer contains: deleted in the gap."""
    return sorted(key for key in known if key not in listed)


def placeholder(kind: KindInfo, key: str, stamp: Stamp) -> dict[str, Any]:
    """The least we can say about a deleted object whose stored copy is unavailable."""
    namespace, name = subjects.split_object_key(key)
    meta: dict[str, Any] = {
        "name": name,
        "uid": stamp.uid,
        "resourceVersion": stamp.resource_version,
    }
    if namespace:
        meta["namespace"] = namespace
    return {"apiVersion": kind.api_version, "kind": kind.kind, "metadata": meta}


def event_of(kind: KindInfo, change: Change) -> K8sObjectEvent:
    meta = change.object.get("metadata") or {}
    stamp = change.stamp
    return K8sObjectEvent(
        type=change.type,
        kind=kind.kind,
        api_version=str(change.object.get("apiVersion") or kind.api_version),
        name=str(meta["name"]),
        namespace=meta.get("namespace") or None,
        uid=stamp.uid,
        resource_version=stamp.resource_version,
        object=change.object,
    )


def messages_of(kind: KindInfo, bucket: str, changes: Iterable[Change]) -> list[OutgoingMessage]:
    """For each change: the KV write (put, or delete marker), then its event."""
    messages: list[OutgoingMessage] = []
    for change in changes:
        if change.type == "DELETED":
            messages.append(kv_delete(bucket, change.key))
        else:
            messages.append(kv_put(bucket, change.key, _encoder.encode(change.object)))
        event = event_of(kind, change)
        messages.append(OutgoingMessage(subject=event.subject, message=event, msg_id=event.msg_id))
    return messages


def apply_to_index(index: dict[str, Stamp], changes: Iterable[Change]) -> None:
    """Record published changes in the informer's index of mirrored objects."""
    for change in changes:
        if change.type == "DELETED":
            # A DELETED of an old incarnation is followed by the ADDED of the new one.
            index.pop(change.key, None)
        else:
            index[change.key] = change.stamp
