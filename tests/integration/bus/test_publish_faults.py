"""publish_batch when acks are lost or NATS is gone: no older value over a newer one, and an
outage fails a batch within one shared retry budget."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from nodeflow_bus import BatchPublishError, Bus, BusOptions, OutgoingMessage, ensure_topology
from nodeflow_contracts.topology import KVSpec
from nodeflow_runtime.natsd import NatsServerProcess
from tests.fixtures.nats import TEST_BUS_OPTIONS
from tests.integration.bus.conftest import DLQ_STREAM, WORK_STREAM


def lose_first_publish_of(bus: Bus, subject: str) -> list[str]:
    """The first frame to `subject` is lost on the wire: its ack never comes. (A lost ack
    cannot be produced with a real server deterministically, so this one call is faked.)"""
    real = bus.js.publish_async
    lost: list[str] = []

    async def lossy(subject_: str, payload: bytes = b"", **kwargs: Any) -> asyncio.Future[Any]:
        if subject_ == subject and not lost:
            lost.append(subject_)
            return asyncio.get_running_loop().create_future()
        return await real(subject_, payload, **kwargs)

    bus.js.publish_async = lossy  # type: ignore[method-assign,assignment]
    return lost


async def test_a_lost_kv_write_is_not_retried_over_a_newer_value(
    nats_server: NatsServerProcess,
) -> None:
    options = BusOptions(**{**TEST_BUS_OPTIONS.__dict__, "request_timeout": 0.3})
    bus = await Bus.connect(nats_server.url, options=options)
    await ensure_topology(
        bus.js, streams=[], kv_buckets=[KVSpec(bucket="objs", description="o")], consumers=[]
    )
    lost = lose_first_publish_of(bus, "$KV.objs.pod-a")
    acks = await bus.publish_batch(
        [
            OutgoingMessage(subject="$KV.objs.pod-a", message=b'{"rv":"1"}'),
            OutgoingMessage(subject="$KV.objs.pod-b", message=b'{"rv":"1"}'),
            OutgoingMessage(subject="$KV.objs.pod-a", message=b'{"rv":"2"}'),
        ]
    )
    assert lost and len(acks) == 3
    kv = await bus.js.key_value("objs")
    assert (await kv.get("pod-a")).value == b'{"rv":"2"}'
    assert (await kv.get("pod-b")).value == b'{"rv":"1"}'
    await bus.close()


async def test_a_lost_stream_message_is_retried_after_the_others(
    nats_server: NatsServerProcess,
) -> None:
    options = BusOptions(**{**TEST_BUS_OPTIONS.__dict__, "request_timeout": 0.3})
    bus = await Bus.connect(nats_server.url, options=options)
    await ensure_topology(bus.js, streams=[DLQ_STREAM], kv_buckets=[], consumers=[])
    lose_first_publish_of(bus, "dlq.a")
    batch = [OutgoingMessage(subject="dlq.a", message=f"m{n}".encode()) for n in range(3)]
    acks = await bus.publish_batch(batch)
    # Not lost, only late: a plain stream keeps every message.
    assert len({ack.seq for ack in acks}) == 3
    assert (await bus.js.stream_info(DLQ_STREAM.name)).state.messages == 3
    await bus.close()


async def test_an_outage_fails_a_batch_within_one_publish_budget(
    nats_server: NatsServerProcess,
) -> None:
    options = BusOptions(
        **{**TEST_BUS_OPTIONS.__dict__, "request_timeout": 0.2, "publish_attempts": 3}
    )
    bus = await Bus.connect(nats_server.url, options=options)
    await ensure_topology(bus.js, streams=[WORK_STREAM], kv_buckets=[], consumers=[])
    await nats_server.kill()
    await asyncio.sleep(0.1)
    batch = [OutgoingMessage(subject=f"work.o{n}", message=b"{}") for n in range(20)]
    real_publish = bus.js.publish
    retries: list[str] = []

    async def counted(subject: str, payload: bytes = b"", **kwargs: Any) -> Any:
        retries.append(subject)
        return await real_publish(subject, payload, **kwargs)

    # publish_batch sends the window with publish_async; only its retries go through publish.
    bus.js.publish = counted  # type: ignore[method-assign,assignment]
    with pytest.raises(BatchPublishError) as raised:
        await bus.publish_batch(batch)
    assert sorted(raised.value.failures) == list(range(20))
    # One shared retry budget for the batch: about one message's worth of attempts, not 3 for
    # each of the 20 (how long the failure takes is measured by `python -m bench bus`).
    assert 1 <= len(retries) <= options.publish_attempts + 1, retries
    await nats_server.start()
    await bus.close()
