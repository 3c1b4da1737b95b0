"""Commands held by a dead executor come back within seconds; a live one keeps them however
long it works; a deliberate resend is stored, not dropped as a duplicate. How long a
redelivery takes is measured by `python -m bench bus`."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import pytest

from nodeflow_bus import (
    Bus,
    ConsumerOptions,
    Delivery,
    PullConsumer,
    attempt_msg_id,
    ensure_topology,
)
from nodeflow_contracts.topology import CONSUMERS, KV_BUCKETS, STREAMS, ConsumerSpec
from nodeflow_runtime.natsd import NatsServerProcess
from tests.fixtures.waiting import eventually
from tests.integration.bus.command_holder import MARK

REPO = Path(__file__).resolve().parents[3]
EXECUTORS = ("k8s-watcher", "slurm-syncer")
# "A few seconds": what a crashed executor may cost a command before another replica has it.
SHORT_ACK_WAIT_SECONDS = 10.0


def command_consumer(service: str) -> ConsumerSpec:
    """The service's (first) command consumer: k8s-watcher has one per sender, all alike."""
    return CONSUMERS[service][0]


def command_subject(spec: ConsumerSpec, name: str) -> str:
    """A subject the command durable receives: its filter with the wildcard filled in."""
    (pattern,) = spec.filter_subjects
    return pattern.replace(">", f"test.{name}").replace("*", "test")


async def declare(bus: Bus, service: str) -> ConsumerSpec:
    spec = command_consumer(service)
    await ensure_topology(bus.js, streams=STREAMS, kv_buckets=KV_BUCKETS, consumers=[spec])
    return spec


@pytest.mark.parametrize("service", EXECUTORS)
def test_command_consumers_have_a_short_ack_wait(service: str) -> None:
    for spec in CONSUMERS[service]:
        assert spec.ack_wait_seconds <= SHORT_ACK_WAIT_SECONDS
        # The default keepalive (a third of the ack wait) leaves two heartbeats of slack.
        assert spec.ack_wait_seconds / 3 >= 1.0


@pytest.mark.parametrize("service", EXECUTORS)
async def test_a_command_held_by_a_killed_executor_is_redelivered_within_a_few_ack_waits(
    nats_server: NatsServerProcess, bus: Bus, service: str
) -> None:
    spec = await declare(bus, service)
    holder = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.integration.bus.command_holder",
        nats_server.url,
        service,
        cwd=REPO,
        env={**os.environ, "LOG_LEVEL": "warning", "PYTHONUNBUFFERED": "1"},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        ack = await bus.publish(command_subject(spec, "held"), b"{}")
        assert holder.stdout is not None
        line = b""
        while not line.startswith(MARK.encode()):
            line = await asyncio.wait_for(holder.stdout.readline(), 60)
            assert line, "the holder exited before taking the command"
        assert line.decode().strip() == f"{MARK}holding {ack.seq}"
    finally:
        holder.kill()
        await holder.wait()

    deliveries: list[Delivery] = []

    async def record(_: bytes, delivery: Delivery) -> None:
        deliveries.append(delivery)

    successor = PullConsumer(bus, spec, bytes, record, ConsumerOptions(fetch_timeout=0.2))
    await successor.start()
    try:
        # Within two short ack waits (the old 60 s one would miss it), plus time to notice.
        await eventually(lambda: bool(deliveries), timeout=2 * SHORT_ACK_WAIT_SECONDS + 5)
    finally:
        await successor.stop()
    assert [(d.stream_sequence, d.num_delivered) for d in deliveries] == [(ack.seq, 2)]


async def test_a_command_handled_for_longer_than_the_ack_wait_is_not_redelivered(
    bus: Bus,
) -> None:
    spec = await declare(bus, "k8s-watcher")
    deliveries: list[Delivery] = []
    finished = asyncio.Event()

    async def long_api_call(_payload: bytes, delivery: Delivery) -> None:
        deliveries.append(delivery)
        # Longer than the ack wait: only the consumer's in-progress heartbeats keep it held.
        for _ in range(3):
            await asyncio.sleep(spec.ack_wait_seconds)
        finished.set()

    options = ConsumerOptions(fetch_timeout=0.2)
    first = PullConsumer(bus, spec, bytes, long_api_call, options)
    other: list[Delivery] = []

    async def record(_: bytes, delivery: Delivery) -> None:
        other.append(delivery)

    # A second replica on the same durable would get the command if it were redelivered.
    second = PullConsumer(bus, spec, bytes, record, options)
    await first.start()
    await second.start()
    try:
        ack = await bus.publish(command_subject(spec, "long"), b"{}")
        await asyncio.wait_for(finished.wait(), 3 * spec.ack_wait_seconds + 30)
        await eventually(lambda: first.in_flight == 0)
    finally:
        await first.stop()
        await second.stop()
    assert [(d.stream_sequence, d.num_delivered) for d in deliveries] == [(ack.seq, 1)]
    assert other == []


async def test_a_deliberate_resend_is_not_dropped_as_a_duplicate(bus: Bus) -> None:
    spec = await declare(bus, "k8s-watcher")
    subject = command_subject(spec, "resent")
    first = await bus.publish(subject, b"{}", msg_id=attempt_msg_id("cmd-7", 1))
    retry_of_first = await bus.publish(subject, b"{}", msg_id=attempt_msg_id("cmd-7", 1))
    resend = await bus.publish(subject, b"{}", msg_id=attempt_msg_id("cmd-7", 2))
    # A retried publish of one attempt is still deduplicated; the next attempt is stored.
    assert not first.duplicate and retry_of_first.duplicate
    assert not resend.duplicate and resend.seq > first.seq
