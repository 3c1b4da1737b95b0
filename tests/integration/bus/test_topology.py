"""Declaring the topology table is idempotent and updates changed settings in place."""

from __future__ import annotations

import msgspec
import nats.js.errors
import pytest

from nodeflow_bus import Bus, ensure_topology
from nodeflow_bus.declare import consumer_config
from nodeflow_contracts import topology
from nodeflow_contracts.topology import ConsumerSpec, KVSpec, StreamSpec


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


async def test_retired_consumer_is_deleted_and_its_unacknowledged_commands_go_to_the_new_consumers(
    bus: Bus,
) -> None:
    """An upgrade from the single command consumer: k8s-watcher's start deletes it (a
    work-queue stream refuses the per-sender consumers beside it), narrows the stream to the
    senders' prefixes and declares a consumer per sender. A command the old consumer was
    delivered and never acknowledged is delivered again, by its sender's consumer."""
    old_stream = msgspec.structs.replace(
        topology.stream_for_subject("cmd.k8s.v1.nodeset-controller.create"),
        subjects=("cmd.k8s.v1.>",),
    )
    [(stream_name, old_durable)] = topology.RETIRED_CONSUMERS["k8s-watcher"]
    old_consumer = msgspec.structs.replace(
        topology.CONSUMERS["k8s-watcher"][0], durable=old_durable, filter_subjects=("cmd.k8s.v1.>",)
    )
    await ensure_topology(bus.js, streams=[old_stream], kv_buckets=[], consumers=[old_consumer])
    await bus.publish("cmd.k8s.v1.nodeset-controller.create", b'{"held": true}')
    await bus.publish("cmd.k8s.v1.slurm-syncer.patch", b'{"queued": true}')
    held = await bus.js.pull_subscribe_bind(durable=old_durable, stream=stream_name)
    [delivered] = await held.fetch(1, timeout=2)
    assert delivered.data == b'{"held": true}'  # and never acknowledged

    report = await ensure_topology(
        bus.js,
        streams=topology.STREAMS,
        kv_buckets=[],
        consumers=topology.CONSUMERS["k8s-watcher"],
        retired=topology.RETIRED_CONSUMERS["k8s-watcher"],
    )
    assert ("consumer", old_durable, "deleted") in [
        (item.kind, item.name, item.action) for item in report.items
    ]
    assert {item.name for item in report.by_action("created")} >= {
        spec.durable for spec in topology.K8S_COMMANDS_CONSUMERS
    }
    names = {str(c.name) for c in await bus.js.consumers_info(stream_name)}
    assert names == {spec.durable for spec in topology.K8S_COMMANDS_CONSUMERS}
    for sender, payload in (
        ("nodeset-controller", b'{"held": true}'),
        ("slurm-syncer", b'{"queued": true}'),
    ):
        sub = await bus.js.pull_subscribe_bind(
            durable=topology.k8s_commands_durable(sender), stream=stream_name
        )
        [message] = await sub.fetch(1, timeout=2)
        assert message.data == payload
        await message.ack()
    # Under a prefix no sender has, nothing stores a command: the publisher hears so at once.
    with pytest.raises(nats.js.errors.NoStreamResponseError):
        await bus.js.publish("cmd.k8s.v1.stranger.create", b"{}", timeout=2)
    # A second start finds nothing to retire.
    again = await ensure_topology(
        bus.js,
        streams=topology.STREAMS,
        kv_buckets=[],
        consumers=topology.CONSUMERS["k8s-watcher"],
        retired=topology.RETIRED_CONSUMERS["k8s-watcher"],
    )
    assert not again.by_action("deleted")
