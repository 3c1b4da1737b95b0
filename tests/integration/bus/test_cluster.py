"""The project's streams and KV on a three-node JetStream cluster (replicas 3): commands keep
flowing and nothing is lost while the stream leader is killed."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from nats.errors import NoRespondersError
from nats.js.errors import ServiceUnavailableError
from nats.js.kv import KeyValue

from nodeflow_bus import Bus, BusOptions, ConsumerOptions, Delivery, PullConsumer, ensure_topology
from nodeflow_contracts.topology import (
    CONSUMERS,
    KV_BUCKETS,
    LEASES_BUCKET,
    STREAMS,
    replicated,
)
from nodeflow_runtime.natsd_cluster import NatsCluster
from tests.fixtures.waiting import eventually

REPLICAS = 3
COMMANDS = 300
CLUSTER_BUS_OPTIONS = BusOptions(
    name="pytest-cluster",
    connect_timeout=1.0,
    reconnect_wait=0.1,
    initial_connect_deadline=10.0,
    request_timeout=2.0,
    # Enough attempts to ride out a stream leader election.
    publish_attempts=10,
    ping_interval=1.0,
    max_outstanding_pings=2,
    drain_timeout=2.0,
)


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[NatsCluster]:
    async with NatsCluster(tmp_path / "cluster", size=3) as running:
        yield running


async def test_streams_and_kv_survive_the_loss_of_the_stream_leader_with_replicas_3(
    cluster: NatsCluster,
) -> None:
    bus = await Bus.connect(cluster.urls, options=CLUSTER_BUS_OPTIONS)
    spec = CONSUMERS["k8s-watcher"][0]
    await ensure_topology(
        bus.js,
        streams=replicated(STREAMS, REPLICAS),
        kv_buckets=replicated(KV_BUCKETS, REPLICAS),
        consumers=[spec],
    )
    for stream in STREAMS:
        assert (await bus.js.stream_info(stream.name)).config.num_replicas == REPLICAS
    kv = await bus.js.key_value(LEASES_BUCKET)
    assert (await bus.js.stream_info(f"KV_{LEASES_BUCKET}")).config.num_replicas == REPLICAS
    await kv.put("before-the-kill", b"kept")

    received: set[int] = set()

    async def apply(payload: bytes, delivery: Delivery) -> None:
        received.add(int(payload))

    consumer = PullConsumer(bus, spec, bytes, apply, ConsumerOptions(fetch_timeout=0.5))
    await consumer.start()
    (pattern,) = spec.filter_subjects
    subject = pattern.replace(">", "test.scale-out")
    info = await bus.js.stream_info(spec.stream)
    assert info.cluster is not None and info.cluster.leader
    leader = cluster.node(info.cluster.leader)
    try:
        for number in range(COMMANDS):
            if number == COMMANDS // 3:
                # Mid-flow: kill -9 the node that leads the command stream.
                await leader.kill()
            await bus.publish(subject, str(number).encode(), msg_id=f"command-{number}")
        await eventually(lambda: len(received) == COMMANDS, timeout=120)
        assert received == set(range(COMMANDS))
        await eventually(lambda: consumer.in_flight == 0, timeout=30)
        # The work queue empties: every command applied and its ack stored (acks are sent
        # without waiting for a reply, so the last one may land a moment after).
        for _ in range(300):
            after = await bus.js.stream_info(spec.stream)
            if after.state.messages == 0:
                break
            await asyncio.sleep(0.1)
        assert after.state.messages == 0, after.state
        # A new leader was elected among the survivors, and it kept everything.
        assert after.cluster is not None and after.cluster.leader != leader.server_name
        assert await read_when_led(kv, "before-the-kill") == b"kept"
    finally:
        await consumer.stop()
        await bus.close()


async def read_when_led(kv: KeyValue, key: str, timeout: float = 60.0) -> bytes | None:
    """The bucket's own stream elects its leader apart from the command stream's: a read that
    lands mid-election times out, and is tried again until a survivor leads the bucket."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        try:
            return (await kv.get(key)).value
        except (TimeoutError, NoRespondersError, ServiceUnavailableError):
            if asyncio.get_running_loop().time() > deadline:
                raise
            await asyncio.sleep(0.5)
