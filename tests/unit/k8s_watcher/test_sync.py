"""Pure mirror decisions: what is a change, what each change publishes."""

from __future__ import annotations

from typing import Any

from k8s_watcher.kinds import watched_kind_infos
from k8s_watcher.sync import (
    Change,
    Stamp,
    apply_to_index,
    list_page_changes,
    messages_of,
    normalize,
    vanished_keys,
    watch_changes,
    watch_error,
)
from nodeflow_bus.kv_view import KV_OPERATION
from nodeflow_bus.kv_writes import KV_DELETE
from nodeflow_contracts.k8s import K8sObjectEvent

POD = next(info for info in watched_kind_infos() if info.kind == "Pod")
NODE = next(info for info in watched_kind_infos() if info.kind == "Node")


def obj(name: str, uid: str = "u1", rv: str = "1", namespace: str | None = "default") -> Any:
    meta: dict[str, Any] = {"name": name, "uid": uid, "resourceVersion": rv}
    if namespace:
        meta["namespace"] = namespace
    return {"metadata": meta}


def test_normalize_drops_managed_fields_and_fills_kind_of_list_items() -> None:
    item = obj("a")
    item["metadata"]["managedFields"] = [{"manager": "kubectl"}]
    normalized = normalize(POD, item)
    assert "managedFields" not in normalized["metadata"]
    assert (normalized["apiVersion"], normalized["kind"]) == ("v1", "Pod")


def test_watch_replay_of_a_known_state_is_dropped_and_bookmarks_only_move_the_version() -> None:
    known = {"default.a": Stamp("u1", "5")}
    events = [
        {"type": "MODIFIED", "object": obj("a", rv="5")},
        {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "9"}}},
    ]
    changes, rv = watch_changes(POD, known, events)
    assert changes == [] and rv == "9"


def test_watch_changes_keep_order_and_drop_deletes_of_unmirrored_objects() -> None:
    events = [
        {"type": "ADDED", "object": obj("a", rv="2")},
        {"type": "MODIFIED", "object": obj("a", rv="3")},
        {"type": "DELETED", "object": obj("a", rv="4")},
        {"type": "DELETED", "object": obj("never-seen", rv="5")},
    ]
    changes, rv = watch_changes(POD, {}, events)
    assert [(c.type, c.key) for c in changes] == [
        ("ADDED", "default.a"),
        ("MODIFIED", "default.a"),
        ("DELETED", "default.a"),
    ]
    assert rv == "5"


def test_watch_error_returns_the_status_of_an_error_event() -> None:
    status = {"kind": "Status", "code": 410, "reason": "Expired"}
    assert watch_error([{"type": "ADDED", "object": obj("a")}]) is None
    assert watch_error([{"type": "ERROR", "object": status}]) == status


def test_relist_publishes_added_modified_and_recreated_but_not_unchanged() -> None:
    known = {
        "default.same": Stamp("u1", "1"),
        "default.moved": Stamp("u2", "1"),
        "default.reborn": Stamp("u3", "1"),
    }
    items = [
        obj("same", "u1", "1"),
        obj("moved", "u2", "7"),
        obj("reborn", "u9", "8"),
        obj("fresh", "u4", "9"),
    ]
    changes, keys = list_page_changes(POD, known, items)
    assert [(c.type, c.key, c.stamp) for c in changes] == [
        ("MODIFIED", "default.moved", Stamp("u2", "7")),
        ("DELETED", "default.reborn", Stamp("u3", "1")),
        ("ADDED", "default.reborn", Stamp("u9", "8")),
        ("ADDED", "default.fresh", Stamp("u4", "9")),
    ]
    assert keys == ["default.same", "default.moved", "default.reborn", "default.fresh"]


def test_keys_missing_from_a_relist_vanished_in_the_gap() -> None:
    assert vanished_keys(["default.a", "default.b", "_.n"], {"default.a"}) == ["_.n", "default.b"]


def test_each_change_is_a_kv_write_then_an_event_with_a_uid_rv_msg_id() -> None:
    added = Change("ADDED", "_.n1", normalize(NODE, obj("n1", "u1", "3", namespace=None)))
    deleted = Change("DELETED", "_.n1", normalize(NODE, obj("n1", "u1", "4", namespace=None)))
    messages = messages_of(NODE, "k8s_nodes", [added, deleted])
    assert [m.subject for m in messages] == [
        "$KV.k8s_nodes._.n1",
        "k8s.v1.node._.n1",
        "$KV.k8s_nodes._.n1",
        "k8s.v1.node._.n1",
    ]
    assert messages[0].headers is None and b'"uid":"u1"' in messages[0].message
    assert messages[2].headers == {KV_OPERATION: KV_DELETE} and messages[2].message == b""
    event = messages[3].message
    assert isinstance(event, K8sObjectEvent)
    assert (event.type, event.resource_version, event.namespace) == ("DELETED", "4", None)
    assert messages[3].msg_id == "u1:4:DELETED"


def test_index_follows_published_changes() -> None:
    index = {"default.a": Stamp("u1", "1")}
    apply_to_index(
        index,
        [
            Change("DELETED", "default.a", obj("a", "u1", "1")),
            Change("ADDED", "default.a", obj("a", "u2", "2")),
            Change("ADDED", "default.b", obj("b", "u3", "3")),
            Change("DELETED", "default.b", obj("b", "u3", "4")),
        ],
    )
    assert index == {"default.a": Stamp("u2", "2")}
