"""The KV materialized view: snapshot, live changes, and recovery after a NATS crash."""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
import pytest
from nats.js.kv import KeyValue

from nodeflow_bus import (
    Bus,
    Change,
    ChangesOverflowError,
    KVView,
    OutgoingMessage,
    ensure_topology,
)
from nodeflow_contracts import codec
from nodeflow_contracts.topology import KVSpec
from nodeflow_runtime.natsd import NatsServerProcess
from tests.fixtures.nats import TEST_BUS_OPTIONS
from tests.fixtures.waiting import eventually

BUCKET = KVSpec(bucket="things", description="test objects")


class Thing(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    size: int


async def things(bus: Bus) -> KeyValue:
    await ensure_topology(bus.js, streams=[], kv_buckets=[BUCKET], consumers=[])
    return await bus.js.key_value("things")


async def test_snapshot_then_live_changes(bus: Bus) -> None:
    kv = await things(bus)
    await kv.put("a", codec.encode(Thing(name="a", size=1)))
    await kv.put("b", codec.encode(Thing(name="b", size=2)))
    await kv.put("gone", codec.encode(Thing(name="gone", size=0)))
    await kv.delete("gone")

    view = KVView(bus, "things", Thing)
    heard: list[tuple[str, Thing | None, Thing | None]] = []
    view.add_listener(lambda key, old, new: heard.append((key, old, new)))
    await view.start()
    await view.wait_ready(5)
    assert view.as_dict() == {"a": Thing(name="a", size=1), "b": Thing(name="b", size=2)}
    assert sorted(key for key, old, _ in heard if old is None) == ["a", "b"]

    changes = view.changes()
    next_change = asyncio.ensure_future(anext(changes))
    await asyncio.sleep(0)
    await kv.put("a", codec.encode(Thing(name="a", size=10)))
    first = await asyncio.wait_for(next_change, 5)
    assert first == Change("a", Thing(name="a", size=1), Thing(name="a", size=10))
    await kv.delete("b")
    second = await asyncio.wait_for(anext(changes), 5)
    assert second == Change("b", Thing(name="b", size=2), None)
    assert len(view) == 1 and view.get("b") is None and "a" in view
    await view.stop()
    assert [change async for change in changes] == []


async def test_raw_dict_values_and_undecodable_values(bus: Bus) -> None:
    kv = await things(bus)
    await kv.put("ok", codec.encode(Thing(name="ok", size=1)))
    await kv.put("broken", b'{"name": "broken", "size": "huge"}')
    typed = KVView(bus, "things", Thing)
    raw = KVView(bus, "things", dict)
    await typed.start()
    await raw.start()
    await typed.wait_ready(5)
    await raw.wait_ready(5)
    assert list(typed) == ["ok"]
    assert raw.get("broken") == {"name": "broken", "size": "huge"}
    await typed.stop()
    await raw.stop()


async def test_empty_bucket_is_ready_and_filters_keys(bus: Bus) -> None:
    kv = await things(bus)
    view = KVView(bus, "things", Thing, keys="ns1.*")
    await view.start()
    await view.wait_ready(5)
    assert len(view) == 0
    await kv.put("ns1.x", codec.encode(Thing(name="x", size=1)))
    await kv.put("ns2.y", codec.encode(Thing(name="y", size=1)))
    await eventually(lambda: "ns1.x" in view)
    await asyncio.sleep(0.1)
    assert list(view) == ["ns1.x"]
    await view.stop()


async def test_view_is_correct_after_nats_is_killed_and_restarted(
    nats_server: NatsServerProcess,
) -> None:
    # The view's connection reconnects slowly, the writer's quickly, so the writer's changes
    # right after the restart happen while the view is still disconnected.
    slow = TEST_BUS_OPTIONS.__class__(**{**TEST_BUS_OPTIONS.__dict__, "reconnect_wait": 1.0})
    view_bus = await Bus.connect(nats_server.url, options=slow)
    writer = await Bus.connect(nats_server.url, options=TEST_BUS_OPTIONS)
    kv = await things(writer)
    for name in ("keep", "drop", "change"):
        await kv.put(name, codec.encode(Thing(name=name, size=1)))
    view = KVView(view_bus, "things", Thing)
    changes: list[tuple[str, Thing | None, Thing | None]] = []
    view.add_listener(lambda key, old, new: changes.append((key, old, new)))
    await view.start()
    await view.wait_ready(5)
    assert sorted(view) == ["change", "drop", "keep"]
    changes.clear()

    await nats_server.restart(graceful=False)
    await eventually(lambda: writer.is_connected, timeout=10)
    kv = await writer.js.key_value("things")
    await kv.delete("drop")
    await kv.put("change", codec.encode(Thing(name="change", size=2)))
    await kv.put("new", codec.encode(Thing(name="new", size=3)))

    await eventually(lambda: view_bus.is_connected and view.resyncs >= 1, timeout=10)
    await eventually(lambda: "drop" not in view and "new" in view, timeout=10)
    assert view.as_dict() == {
        "keep": Thing(name="keep", size=1),
        "change": Thing(name="change", size=2),
        "new": Thing(name="new", size=3),
    }
    assert ("drop", Thing(name="drop", size=1), None) in changes
    assert not any(key == "keep" for key, _, _ in changes)

    # And live updates keep flowing on the new watch.
    await kv.put("later", codec.encode(Thing(name="later", size=4)))
    await eventually(lambda: view.get("later") == Thing(name="later", size=4))
    await view.stop()
    await view_bus.close()
    await writer.close()


async def test_snapshot_of_50000_keys(bus: Bus) -> None:
    await things(bus)
    value = codec.encode(Thing(name="n", size=1))
    await bus.publish_batch(
        [OutgoingMessage(subject=f"$KV.things.k{i}", message=value) for i in range(50_000)],
        max_in_flight=1024,
    )
    view = KVView(bus, "things", Thing)
    await view.start()
    # Generous: how fast the snapshot loads is measured by `python -m bench bus`.
    await view.wait_ready(120)
    assert len(view) == 50_000
    assert view.get("k49999") == Thing(name="n", size=1)
    await view.stop()


async def test_views_of_one_connection_load_their_snapshots_one_at_a_time(
    bus: Bus, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Several first snapshots pushed at once on one connection outran the client at
    10,000 nodes and 50,000 pods: the server cut it as a slow consumer, every view started
    over, and a restarted service never became ready. They load one after another."""
    await things(bus)
    value = codec.encode(Thing(name="n", size=1))
    await bus.publish_batch(
        [OutgoingMessage(subject=f"$KV.things.k{i}", message=value) for i in range(2_000)],
        max_in_flight=1024,
    )
    loading = 0
    most = 0
    load = KVView._load_snapshot_now

    async def counted(view: KVView[Any]) -> None:
        nonlocal loading, most
        loading += 1
        most = max(most, loading)
        try:
            await load(view)
        finally:
            loading -= 1

    monkeypatch.setattr(KVView, "_load_snapshot_now", counted)
    views = [KVView(bus, "things", Thing) for _ in range(4)]
    for view in views:
        await view.start()
    for view in views:
        await view.wait_ready(60)
        assert len(view) == 2_000
    assert most == 1
    # Live changes reach every view once the snapshots are in.
    kv = await bus.js.key_value("things")
    await kv.put("k0", codec.encode(Thing(name="n", size=2)))
    await eventually(lambda: all(v.get("k0") == Thing(name="n", size=2) for v in views))
    for view in views:
        await view.stop()


async def test_stop_right_after_ready_returns(bus: Bus) -> None:
    kv = await things(bus)
    for index in range(20):
        await kv.put(f"k{index}", codec.encode(Thing(name="k", size=index)))
    for _ in range(10):
        view = KVView(bus, "things", Thing)
        await view.start()
        await view.wait_ready(5)
        await asyncio.wait_for(view.stop(), 3)


async def test_a_reader_falling_behind_on_changes_is_told_not_left_growing(bus: Bus) -> None:
    kv = await things(bus)
    view = KVView(bus, "things", Thing)
    await view.start()
    await view.wait_ready(5)
    changes = view.changes(max_pending=3)
    first = asyncio.ensure_future(anext(changes))
    await asyncio.sleep(0)
    for index in range(10):
        await kv.put(f"k{index}", codec.encode(Thing(name="k", size=index)))
    await eventually(lambda: len(view) == 10)
    assert (await first).key == "k0"
    with pytest.raises(ChangesOverflowError):
        await anext(changes)
    await view.stop()


async def test_live_changes_during_an_empty_resync_reach_listeners_after_its_diff(
    bus: Bus,
) -> None:
    kv = await things(bus)
    for key in ("k1", "k2"):
        await kv.put(key, codec.encode(Thing(name=key, size=1)))
    view = KVView(bus, "things", Thing)
    await view.start()
    await view.wait_ready(5)
    heard: dict[str, Thing | None] = {}
    wrote = asyncio.Event()

    async def listener(key: str, old: Thing | None, new: Thing | None) -> None:
        heard[key] = new
        if new is None and not wrote.is_set():
            # While the resync's deletes are being delivered, k2 is written again.
            wrote.set()
            await kv.put("k2", codec.encode(Thing(name="k2", size=2)))
            await asyncio.sleep(0.2)

    view.add_listener(listener)
    # Emptied behind the view's back (a purge delivers nothing to a watch), then resynced.
    await bus.js.purge_stream("KV_things")
    view.request_resync()
    await eventually(lambda: view.resyncs == 1 and "k2" in view)
    await eventually(lambda: heard.get("k2") is not None)
    await asyncio.sleep(0.4)  # past the listener's pause: every change has been delivered
    assert view.as_dict() == {"k2": Thing(name="k2", size=2)}
    assert {key: value for key, value in heard.items() if value is not None} == view.as_dict()
    await view.stop()


async def test_deleted_revision_tells_incarnations_of_a_key_apart(bus: Bus) -> None:
    kv = await things(bus)
    await kv.put("a", codec.encode(Thing(name="a", size=1)))
    await kv.delete("a")
    view = KVView(bus, "things", Thing, track_deletes=True)
    await view.start()
    await view.wait_ready(5)
    # Read from the snapshot: the delete marker is the key's last message.
    loaded = view.deleted_revision("a")
    assert loaded is not None and loaded > 0

    await kv.put("a", codec.encode(Thing(name="a", size=2)))
    await eventually(lambda: view.get("a") is not None)
    assert view.deleted_revision("a") is None  # it exists again
    await kv.delete("a")
    await eventually(lambda: view.get("a") is None)
    again = view.deleted_revision("a")
    assert again is not None and again > loaded
    assert view.deleted_revision("never") is None
    await view.stop()

    untracked = KVView(bus, "things", Thing)
    with pytest.raises(RuntimeError, match="does not track deletes"):
        untracked.deleted_revision("a")


async def test_rule_a_projection_keeps_what_it_returns_and_leaves_out_what_it_drops(
    bus: Bus,
) -> None:
    """Values are projected before the view keeps them; a value the projection drops is
    absent, and one that stops matching reaches listeners as a deletion."""
    kv = await things(bus)
    await kv.put("small", codec.encode(Thing(name="small", size=1)))
    await kv.put("large", codec.encode(Thing(name="large", size=100)))

    def small_names(value: dict[str, object]) -> dict[str, object] | None:
        size = value.get("size")
        return {"name": value["name"]} if isinstance(size, int) and size < 10 else None

    view: KVView[dict[str, object]] = KVView(bus, "things", dict, project=small_names)
    heard: list[tuple[str, object, object]] = []
    view.add_listener(lambda key, old, new: heard.append((key, old, new)))
    await view.start()
    await view.wait_ready(5)
    assert view.as_dict() == {"small": {"name": "small"}}
    await kv.put("small", codec.encode(Thing(name="small", size=50)))
    await eventually(lambda: "small" not in view)
    assert heard[-1] == ("small", {"name": "small"}, None)
    await kv.put("large", codec.encode(Thing(name="large", size=2)))
    await eventually(lambda: view.get("large") == {"name": "large"})
    await view.stop()


async def test_rule_a_value_the_projection_fails_on_is_left_out_and_the_view_goes_on(
    bus: Bus,
) -> None:
    kv = await things(bus)
    await kv.put("good", codec.encode(Thing(name="good", size=1)))
    await kv.put("bad", codec.encode(Thing(name="bad", size=-1)))

    def picky(value: dict[str, object]) -> dict[str, object]:
        if value.get("size") == -1:
            raise TypeError("a size this reader cannot read")
        return value

    view: KVView[dict[str, object]] = KVView(bus, "things", dict, project=picky)
    await view.start()
    await view.wait_ready(5)
    assert list(view) == ["good"]
    await kv.put("bad", codec.encode(Thing(name="bad", size=3)))
    await eventually(lambda: "bad" in view)
    await view.stop()


async def test_rule_json_values_share_one_copy_of_each_short_string(bus: Bus) -> None:
    """Memory at scale: the same short value in many objects (a phase, a condition status, a
    label) is one string in the view, not one per object; long ones are left as they are,
    and every value reads as it was written."""
    kv = await things(bus)
    long_text = "x" * 200
    for index in range(3):
        value = {"phase": "Running", "labels": {"team": "team-1"}, "notes": [long_text, index]}
        await kv.put(f"pod-{index}", msgspec.json.encode(value))
    view: KVView[dict[str, Any]] = KVView(bus, "things", dict)
    await view.start()
    await view.wait_ready(5)
    pods = [view.get(f"pod-{index}") for index in range(3)]
    assert [pod["notes"][1] for pod in pods if pod] == [0, 1, 2]
    phases = {id(pod["phase"]) for pod in pods if pod}
    teams = {id(pod["labels"]["team"]) for pod in pods if pod}
    assert len(phases) == 1 and len(teams) == 1
    assert len({id(pod["notes"][0]) for pod in pods if pod}) == 3
    assert all(pod and pod["notes"][0] == long_text for pod in pods)
    await view.stop()
