"""Declaring the topology table is idempotent and updates changed settings in place."""

from __future__ import annotations

import asyncio

import msgspec
import nats.js.errors
import pytest

from nodeflow_bus import Bus, ConsumerOptions, Delivery, PullConsumer, ensure_topology
from nodeflow_bus.declare import consumer_config
from nodeflow_contracts import subjects, topology
from nodeflow_contracts.topology import ADMIN_USER, ConsumerSpec, KVSpec, StreamSpec


async def test_the_project_table_declares_then_is_a_no_op(bus: Bus) -> None:
    first = await ensure_topology(bus.js)
    assert {item.action for item in first.items} == {"created"}
    declared_streams = {item.name for item in first.items if item.kind == "stream"}
    assert declared_streams == {stream.name for stream in topology.STREAMS}
    assert len(first.by_action("created")) == (
        len(topology.STREAMS)
        + len(topology.KV_BUCKETS)
        + sum(len(specs) for specs in topology.CONSUMERS.values())
    )
    second = await ensure_topology(bus.js)
    assert [item.action for item in second.items] == ["unchanged"] * len(first.items)


async def test_changed_settings_are_updated_in_place(bus: Bus) -> None:
    stream = StreamSpec(name="T", subjects=("t.>",), description="d", max_age_seconds=600.0)
    bucket = KVSpec(bucket="tkv", description="kv", history=1)
    consumer = ConsumerSpec(
        stream="T", durable="tc", filter_subjects=("t.>",), description="c", ack_wait_seconds=30.0
    )
    await ensure_topology(bus.js, streams=[stream], kv_buckets=[bucket], consumers=[consumer])
    await bus.publish("t.x", b"{}")

    report = await ensure_topology(
        bus.js,
        streams=[
            StreamSpec(name="T", subjects=("t.>", "u.>"), description="d", max_age_seconds=1200.0)
        ],
        kv_buckets=[KVSpec(bucket="tkv", description="kv", history=5)],
        consumers=[
            ConsumerSpec(
                stream="T",
                durable="tc",
                filter_subjects=("t.>",),
                description="c",
                ack_wait_seconds=45.0,
            )
        ],
    )
    assert [(item.kind, item.action, item.changed) for item in report.items] == [
        ("stream", "updated", ("subjects", "max_age")),
        ("kv", "updated", ("max_msgs_per_subject",)),
        ("consumer", "updated", ("ack_wait",)),
    ]
    info = await bus.js.stream_info("T")
    assert info.config.max_age == 1200.0
    assert info.state.messages == 1  # updated, not recreated
    assert (await bus.js.stream_info("KV_tkv")).config.max_msgs_per_subject == 5
    assert (await bus.js.consumer_info("T", "tc")).config.ack_wait == 45.0
    streams = await bus.js.streams_info()
    assert sorted(str(s.config.name) for s in streams) == ["KV_tkv", "T"]


async def test_an_immutable_change_is_reported_not_applied(bus: Bus) -> None:
    await ensure_topology(
        bus.js,
        streams=[StreamSpec(name="W", subjects=("w.>",), description="d")],
        kv_buckets=[],
        consumers=[],
    )
    report = await ensure_topology(
        bus.js,
        streams=[StreamSpec(name="W", subjects=("w.>",), description="d", retention="workqueue")],
        kv_buckets=[],
        consumers=[],
    )
    assert [(item.action, item.changed) for item in report.conflicts] == [
        ("conflict", ("retention",))
    ]
    retention = (await bus.js.stream_info("W")).config.retention
    assert getattr(retention, "value", retention) == "limits"


async def test_the_delivery_limit_is_left_to_the_client_and_old_durables_are_migrated(
    bus: Bus,
) -> None:
    stream = StreamSpec(name="M", subjects=("m.>",), description="d", retention="workqueue")
    spec = ConsumerSpec(
        stream="M", durable="mc", filter_subjects=("m.>",), description="c", max_deliver=4
    )
    await ensure_topology(bus.js, streams=[stream], kv_buckets=[], consumers=[])
    # A durable declared by an older version, with the limit enforced by the server.
    await bus.js.add_consumer("M", consumer_config(spec).evolve(max_deliver=4))
    report = await ensure_topology(bus.js, streams=[], kv_buckets=[], consumers=[spec])
    assert [(item.action, item.changed) for item in report.items] == [("updated", ("max_deliver",))]
    assert (await bus.js.consumer_info("M", "mc")).config.max_deliver == -1


async def test_an_upgrade_narrows_the_single_command_consumer_in_place_while_an_old_replica_uses_it(
    bus: Bus,
) -> None:
    """An upgrade from the single command consumer of every sender: k8s-watcher's start
    narrows it (by name, the admin's queue) to the admin's prefix, then declares the other
    senders' consumers beside it; an old replica still fetching from it goes on working (it
    would recreate a deleted one with its old filter and block the new consumers). A command
    the old consumer holds unacknowledged is not lost."""
    old_stream = msgspec.structs.replace(
        topology.stream_for_subject("cmd.k8s.v1.nodeset-controller.create"),
        subjects=("cmd.k8s.v1.>",),
    )
    legacy = topology.LEGACY_K8S_COMMANDS_DURABLE
    old_consumer = msgspec.structs.replace(
        topology.K8S_COMMANDS_CONSUMERS[0], durable=legacy, filter_subjects=("cmd.k8s.v1.>",)
    )
    await ensure_topology(bus.js, streams=[old_stream], kv_buckets=[], consumers=[old_consumer])
    held_subject = "cmd.k8s.v1.nodeset-controller.create"
    await bus.publish(held_subject, b'{"held": true}')
    held_by_old = await bus.js.pull_subscribe_bind(durable=legacy, stream=old_stream.name)
    [held] = await held_by_old.fetch(1, timeout=2)
    assert held.data == b'{"held": true}'  # and never acknowledged: the old replica dies

    received: list[tuple[str, bytes]] = []
    got_one = asyncio.Event()

    async def old_replica(payload: bytes, delivery: Delivery) -> None:
        received.append((delivery.subject, payload))
        got_one.set()

    still_running = PullConsumer(
        bus, old_consumer, bytes, old_replica, ConsumerOptions(fetch_timeout=0.2)
    )
    await still_running.start()
    try:
        report = await ensure_topology(
            bus.js,
            streams=topology.STREAMS,
            kv_buckets=[],
            consumers=topology.CONSUMERS["k8s-watcher"],
        )
        assert ("consumer", legacy, "updated") in [
            (item.kind, item.name, item.action) for item in report.items
        ]
        infos = {str(c.name): c.config for c in await bus.js.consumers_info(old_stream.name)}
        assert set(infos) == {spec.durable for spec in topology.K8S_COMMANDS_CONSUMERS}
        assert infos[legacy].filter_subject == subjects.k8s_sender_commands(ADMIN_USER)
        # The old replica's fetches go on: it now gets the admin's commands only.
        await bus.publish(subjects.k8s_command(ADMIN_USER, "patch"), b'{"admin": true}')
        await bus.publish("cmd.k8s.v1.slurm-syncer.patch", b'{"syncer": true}')
        await asyncio.wait_for(got_one.wait(), 5)
        await asyncio.sleep(0.5)  # time for a wrong delivery to arrive too
        assert received == [(subjects.k8s_command(ADMIN_USER, "patch"), b'{"admin": true}')]
        assert not still_running.failed and still_running.not_ready_reason() is None
    finally:
        await still_running.stop()
    syncer = await bus.js.pull_subscribe_bind(
        durable=topology.k8s_commands_durable("slurm-syncer"), stream=old_stream.name
    )
    [message] = await syncer.fetch(1, timeout=2)
    assert message.data == b'{"syncer": true}'
    await message.ack()
    # The command the old consumer held, out of its filter now, goes to its sender's consumer
    # (a second delivery if the old replica were still working on it: commands are idempotent).
    controller = await bus.js.pull_subscribe_bind(
        durable=topology.k8s_commands_durable("nodeset-controller"), stream=old_stream.name
    )
    [redelivered] = await controller.fetch(1, timeout=3 * old_consumer.ack_wait_seconds + 5)
    assert redelivered.data == b'{"held": true}'
    # Under a prefix no sender has, nothing stores a command: the publisher hears so at once.
    with pytest.raises(nats.js.errors.NoStreamResponseError):
        await bus.js.publish("cmd.k8s.v1.stranger.create", b"{}", timeout=2)
