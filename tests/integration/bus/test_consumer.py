"""Publishing and the pull-consumer loop against a real nats-server."""

from __future__ import annotations

import asyncio

import pytest
from nats.aio.msg import Msg

from nodeflow_bus import (
    Backoff,
    Bus,
    ConsumerOptions,
    Delivery,
    OutgoingMessage,
    PermanentError,
    PullConsumer,
    RetryableError,
    dead_letter,
)
from nodeflow_bus.errors import PublishError
from nodeflow_runtime.natsd import NatsServerProcess
from tests.fixtures.waiting import eventually
from tests.integration.bus.conftest import Job, work_consumer

FAST = ConsumerOptions(
    concurrency=4,
    fetch_timeout=0.2,
    backoff=Backoff(initial=0.05, factor=2.0, maximum=0.2),
    stop_timeout=2.0,
)


async def dead_letters(bus: Bus, expected: int, timeout: float = 5.0) -> list[Msg]:
    sub = await bus.js.pull_subscribe("dlq.>", durable=None, stream="DEAD_LETTERS")
    collected: list[Msg] = []
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while len(collected) < expected and loop.time() < deadline:
        try:
            collected.extend(await sub.fetch(expected - len(collected), timeout=0.5))
        except TimeoutError:
            continue
    await sub.unsubscribe()
    return collected


async def test_publish_then_consume_acks_every_message(work_bus: Bus) -> None:
    seen: list[int] = []

    async def handler(job: Job, delivery: Delivery) -> None:
        assert delivery.subject == f"work.{job.target}"
        seen.append(job.number)

    consumer = PullConsumer(work_bus, work_consumer(), Job, handler, FAST)
    await consumer.start()
    for number in range(20):
        await work_bus.publish(f"work.t{number % 3}", Job(target=f"t{number % 3}", number=number))
    await eventually(lambda: len(seen) == 20)
    await consumer.stop()
    assert sorted(seen) == list(range(20))
    info = await work_bus.js.consumer_info("TEST_WORK", "workers")
    assert info.num_ack_pending == 0 and info.num_pending == 0


async def test_repeated_msg_id_is_stored_once(work_bus: Bus) -> None:
    first = await work_bus.publish("work.a", Job(target="a", number=1), msg_id="cmd-1")
    second = await work_bus.publish("work.a", Job(target="a", number=1), msg_id="cmd-1")
    assert second.duplicate and not first.duplicate
    assert second.seq == first.seq
    info = await work_bus.js.stream_info("TEST_WORK")
    assert info.state.messages == 1


async def test_publish_batch_returns_acks_in_order(work_bus: Bus) -> None:
    batch = [
        OutgoingMessage(subject="work.b", message=Job(target="b", number=n), msg_id=f"b-{n}")
        for n in range(600)
    ]
    acks = await work_bus.publish_batch(batch, max_in_flight=64)
    assert [ack.seq for ack in acks] == sorted(ack.seq for ack in acks)
    assert len({ack.seq for ack in acks}) == 600
    again = await work_bus.publish_batch(batch[:10])
    assert all(ack.duplicate for ack in again)


async def test_publish_to_subject_without_stream_raises_clear_error(work_bus: Bus) -> None:
    with pytest.raises(PublishError, match=r"nowhere\.x not acknowledged after 4 attempt"):
        await work_bus.publish("nowhere.x", b"{}")


async def test_nak_redelivers_until_success(work_bus: Bus) -> None:
    deliveries: list[int] = []

    async def flaky(job: Job, delivery: Delivery) -> None:
        deliveries.append(delivery.num_delivered)
        if delivery.num_delivered < 3:
            raise RetryableError("not yet")

    consumer = PullConsumer(work_bus, work_consumer(max_deliver=5), Job, flaky, FAST)
    await consumer.start()
    await work_bus.publish("work.c", Job(target="c", number=1))
    await eventually(lambda: deliveries == [1, 2, 3])
    await consumer.stop()
    assert await dead_letters(work_bus, 1, timeout=0.3) == []


async def test_poison_message_is_dead_lettered_and_the_queue_keeps_flowing(work_bus: Bus) -> None:
    handled: list[int] = []

    async def handler(job: Job, delivery: Delivery) -> None:
        if job.number == 0:
            raise RuntimeError("boom on poison")
        handled.append(job.number)

    consumer = PullConsumer(work_bus, work_consumer(), Job, handler, FAST)
    await consumer.start()
    await work_bus.publish("work.p", Job(target="p", number=0), headers={"Trace": "t-1"})
    for number in range(1, 11):
        await work_bus.publish("work.q", Job(target="q", number=number))
    await eventually(lambda: len(handled) == 10)
    letters = await dead_letters(work_bus, 1)
    await consumer.stop()
    assert len(letters) == 1
    letter = letters[0]
    letter_headers = letter.headers or {}
    assert letter.subject == "dlq.work.p"
    assert letter_headers[dead_letter.ERROR_KIND] == "max_deliveries"
    assert "boom on poison" in letter_headers[dead_letter.ERROR]
    assert letter_headers[dead_letter.DELIVERIES] == "3"
    assert letter_headers[dead_letter.STREAM] == "TEST_WORK"
    assert letter_headers[dead_letter.STREAM_SEQUENCE] == "1"
    assert letter_headers["Trace"] == "t-1"
    assert "Nodeflow-Original-Nats-Msg-Id" in letter_headers
    info = await work_bus.js.consumer_info("TEST_WORK", "workers")
    assert info.num_ack_pending == 0


async def test_permanent_error_dead_letters_at_once(work_bus: Bus) -> None:
    calls: list[int] = []

    async def handler(job: Job, delivery: Delivery) -> None:
        calls.append(delivery.num_delivered)
        raise PermanentError("refused for good")

    consumer = PullConsumer(work_bus, work_consumer(), Job, handler, FAST)
    await consumer.start()
    await work_bus.publish("work.r", Job(target="r", number=1))
    letters = await dead_letters(work_bus, 1)
    await consumer.stop()
    assert calls == [1]
    assert [letter.subject for letter in letters] == ["dlq.work.r"]
    assert (letters[0].headers or {})[dead_letter.ERROR_KIND] == "permanent"


async def test_undecodable_payload_is_dead_lettered_naming_the_field(work_bus: Bus) -> None:
    handled: list[int] = []

    async def handler(job: Job, delivery: Delivery) -> None:
        handled.append(job.number)

    consumer = PullConsumer(work_bus, work_consumer(), Job, handler, FAST)
    await consumer.start()
    await work_bus.publish("work.bad", b'{"target": "x", "number": "not-a-number"}')
    await work_bus.publish("work.good", Job(target="g", number=7))
    letters = await dead_letters(work_bus, 1)
    await eventually(lambda: handled == [7])
    assert consumer.running
    await consumer.stop()
    headers = letters[0].headers or {}
    assert letters[0].subject == "dlq.work.bad"
    assert headers[dead_letter.ERROR_KIND] == "decode"
    assert "$.number" in headers[dead_letter.ERROR]
    assert "work.bad" in headers[dead_letter.ERROR]
    assert letters[0].data == b'{"target": "x", "number": "not-a-number"}'


async def test_per_key_order_is_kept_while_keys_run_concurrently(work_bus: Bus) -> None:
    order: dict[str, list[int]] = {}
    running: set[str] = set()
    overlap = {"same_key": False, "other_keys": 0}

    async def handler(job: Job, delivery: Delivery) -> None:
        if job.target in running:
            overlap["same_key"] = True
        running.add(job.target)
        overlap["other_keys"] = max(overlap["other_keys"], len(running))
        await asyncio.sleep(0.01)
        if job.number % 4 == 1 and delivery.num_delivered == 1:
            running.discard(job.target)
            raise RetryableError("retry once, in place")
        order.setdefault(job.target, []).append(job.number)
        running.discard(job.target)

    options = ConsumerOptions(
        concurrency=8,
        fetch_timeout=0.2,
        backoff=Backoff(initial=0.02, maximum=0.05),
        ordering_key=lambda job: job.target,
    )
    consumer = PullConsumer(work_bus, work_consumer(max_deliver=5), Job, handler, options)
    await consumer.start()
    batch = [
        OutgoingMessage(subject=f"work.{key}", message=Job(target=key, number=n))
        for n in range(12)
        for key in ("k1", "k2", "k3")
    ]
    await work_bus.publish_batch(batch)
    await eventually(lambda: sum(len(v) for v in order.values()) == 36, timeout=10)
    await consumer.stop()
    assert all(order[key] == list(range(12)) for key in ("k1", "k2", "k3"))
    assert not overlap["same_key"]
    assert overlap["other_keys"] > 1


async def test_graceful_stop_during_handling_loses_nothing(work_bus: Bus) -> None:
    started = asyncio.Event()
    release = asyncio.Event()
    acked: list[int] = []

    async def slow(job: Job, delivery: Delivery) -> None:
        started.set()
        await release.wait()
        acked.append(job.number)

    consumer = PullConsumer(work_bus, work_consumer(), Job, slow, FAST)
    await consumer.start()
    for number in range(3):
        await work_bus.publish("work.s", Job(target="s", number=number))
    await started.wait()
    # The handlers never finish within the grace period: stop must hand the messages back.
    await consumer.stop(timeout=0.2)
    assert acked == []
    release.set()

    received: list[int] = []

    async def fast(job: Job, delivery: Delivery) -> None:
        received.append(job.number)

    second = PullConsumer(work_bus, work_consumer(), Job, fast, FAST)
    await second.start()
    await eventually(lambda: sorted(received) == [0, 1, 2])
    await second.stop()


async def test_long_handler_keeps_its_ack_deadline(work_bus: Bus) -> None:
    from nodeflow_bus import ensure_topology

    spec = work_consumer("slow-workers", ack_wait=0.5)
    # A work-queue stream allows one consumer per subject: replace the default one.
    await work_bus.js.delete_consumer("TEST_WORK", "workers")
    await ensure_topology(work_bus.js, streams=[], kv_buckets=[], consumers=[spec])
    deliveries: list[int] = []

    async def slow(job: Job, delivery: Delivery) -> None:
        deliveries.append(delivery.num_delivered)
        await asyncio.sleep(1.5)

    options = ConsumerOptions(concurrency=2, fetch_timeout=0.2, keepalive_interval=0.1)
    consumer = PullConsumer(work_bus, spec, Job, slow, options)
    await consumer.start()
    await work_bus.publish("work.l", Job(target="l", number=1))
    await eventually(lambda: deliveries == [1])
    await asyncio.sleep(1.8)
    await consumer.stop()
    assert deliveries == [1]


async def test_consumer_resumes_after_nats_is_killed_and_restarted(
    work_bus: Bus, nats_server: NatsServerProcess
) -> None:
    seen: list[int] = []

    async def handler(job: Job, delivery: Delivery) -> None:
        seen.append(job.number)

    consumer = PullConsumer(work_bus, work_consumer(), Job, handler, FAST)
    await consumer.start()
    await work_bus.publish("work.z", Job(target="z", number=1))
    await eventually(lambda: seen == [1])
    await nats_server.restart(graceful=False)
    await eventually(lambda: work_bus.is_connected, timeout=10)
    await work_bus.publish("work.z", Job(target="z", number=2))
    await eventually(lambda: seen == [1, 2], timeout=10)
    assert consumer.running
    await consumer.stop()


async def test_a_failing_dead_letter_consumer_does_not_loop(work_bus: Bus) -> None:
    from nodeflow_bus import ensure_topology
    from nodeflow_contracts.topology import ConsumerSpec

    spec = ConsumerSpec(
        stream="DEAD_LETTERS",
        durable="dlq-reader",
        filter_subjects=("dlq.>",),
        description="reads dead letters",
        max_deliver=2,
    )
    await ensure_topology(work_bus.js, streams=[], kv_buckets=[], consumers=[spec])
    calls: list[str] = []

    async def broken(payload: bytes, delivery: Delivery) -> None:
        calls.append(delivery.subject)
        raise PermanentError("cannot read")

    consumer = PullConsumer(work_bus, spec, bytes, broken, FAST)
    await consumer.start()
    await work_bus.publish("dlq.work.x", b"raw")
    await eventually(lambda: calls == ["dlq.work.x"])
    await asyncio.sleep(0.3)
    await consumer.stop()
    assert calls == ["dlq.work.x"]
    assert (await work_bus.js.stream_info("DEAD_LETTERS")).state.messages == 1
