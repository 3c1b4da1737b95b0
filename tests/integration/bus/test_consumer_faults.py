"""The pull consumer under faults: an unwritable dead-letter stream, keys that keep failing, a
crashing ordering-key function, a deleted durable, a cancelled stop."""

from __future__ import annotations

import asyncio

import pytest

from nodeflow_bus import (
    Backoff,
    Bus,
    ConsumerOptions,
    Delivery,
    PermanentError,
    PullConsumer,
    RetryableError,
    dead_letter,
    ensure_topology,
)
from nodeflow_contracts.topology import ConsumerSpec, StreamSpec
from tests.fixtures.waiting import eventually
from tests.integration.bus.conftest import DLQ_STREAM, WORK_STREAM, Job, work_consumer
from tests.integration.bus.test_consumer import FAST, dead_letters


async def messages_in(bus: Bus, stream: str) -> int:
    return (await bus.js.stream_info(stream)).state.messages


async def drained(bus: Bus, stream: str, timeout: float = 30.0) -> None:
    """Wait until the work-queue stream is empty: the consumer's ack is a publish the server
    applies after the client has already counted the message done."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while (left := await messages_in(bus, stream)) != 0:
        assert loop.time() < deadline, f"{left} message(s) still in {stream}"
        await asyncio.sleep(0.05)


async def test_a_dead_letter_copy_failing_on_the_last_delivery_is_retried_until_it_lands(
    bus: Bus,
) -> None:
    spec = work_consumer(max_deliver=2)
    # No dead-letter stream yet: every copy fails.
    await ensure_topology(bus.js, streams=[WORK_STREAM], kv_buckets=[], consumers=[spec])
    calls: list[int] = []

    async def failing(job: Job, delivery: Delivery) -> None:
        calls.append(delivery.num_delivered)
        raise RetryableError("always")

    consumer = PullConsumer(bus, spec, Job, failing, FAST)
    await consumer.start()
    await bus.publish("work.d", Job(target="d", number=1))
    # Generous timeouts: the machine may be busy; nothing here is about speed.
    await eventually(lambda: calls == [1, 2], timeout=30)
    await asyncio.sleep(1.0)  # at least one failed copy (4 publish attempts) on the last delivery
    assert consumer.in_flight == 1

    await ensure_topology(bus.js, streams=[DLQ_STREAM], kv_buckets=[], consumers=[])
    letters = await dead_letters(bus, 1, timeout=30)
    assert [letter.subject for letter in letters] == ["dlq.work.d"]
    assert (letters[0].headers or {})[dead_letter.ERROR_KIND] == "max_deliveries"
    await eventually(lambda: consumer.in_flight == 0, timeout=30)
    await drained(bus, WORK_STREAM.name)
    assert calls == [1, 2]
    await consumer.stop()


async def test_a_message_whose_copy_failed_before_a_stop_is_dead_lettered_by_the_next_replica(
    bus: Bus,
) -> None:
    spec = work_consumer(max_deliver=2)
    await ensure_topology(bus.js, streams=[WORK_STREAM], kv_buckets=[], consumers=[spec])
    calls: list[int] = []

    async def failing(job: Job, delivery: Delivery) -> None:
        calls.append(delivery.num_delivered)
        raise RetryableError("always")

    first = PullConsumer(bus, spec, Job, failing, FAST)
    await first.start()
    await bus.publish("work.e", Job(target="e", number=1))
    await eventually(lambda: calls == [1, 2])
    await asyncio.sleep(0.3)
    await first.stop()

    await ensure_topology(bus.js, streams=[DLQ_STREAM], kv_buckets=[], consumers=[])
    second = PullConsumer(bus, spec, Job, failing, FAST)
    await second.start()
    letters = await dead_letters(bus, 1)
    await eventually(lambda: second.in_flight == 0)
    await second.stop()
    # Past its limit: dead-lettered without running the handler again.
    assert calls == [1, 2]
    assert [letter.subject for letter in letters] == ["dlq.work.e"]
    assert (letters[0].headers or {})[dead_letter.ERROR_KIND] == "max_deliveries"
    await drained(bus, WORK_STREAM.name)


async def test_keys_backing_off_do_not_stall_the_other_keys(work_bus: Bus) -> None:
    handled: list[str] = []

    async def handler(job: Job, delivery: Delivery) -> None:
        if job.target.startswith("bad"):
            raise RetryableError("this key keeps failing")
        handled.append(job.target)

    options = ConsumerOptions(
        concurrency=2,
        fetch_timeout=0.2,
        backoff=Backoff(initial=1.0, maximum=1.0),
        ordering_key=lambda job: job.target,
        stop_timeout=1.0,
    )
    consumer = PullConsumer(work_bus, work_consumer(max_deliver=5), Job, handler, options)
    await consumer.start()
    for bad in ("bad1", "bad2"):
        await work_bus.publish(f"work.{bad}", Job(target=bad, number=0))
    await eventually(lambda: consumer.in_flight == 2)
    for number in range(10):
        await work_bus.publish(f"work.g{number}", Job(target=f"g{number}", number=number))
    # The failing keys retry for 4 s (4 x 1 s backoff); the others must not wait for that.
    await eventually(lambda: len(handled) == 10, timeout=2.0)
    await consumer.stop()


async def test_messages_held_behind_a_failing_key_are_bounded(work_bus: Bus) -> None:
    peak = {"held": 0}
    consumer: PullConsumer[Job]

    async def handler(job: Job, delivery: Delivery) -> None:
        peak["held"] = max(peak["held"], consumer.in_flight)
        raise RetryableError("stuck")

    options = ConsumerOptions(
        concurrency=1,
        max_held=3,
        fetch_timeout=0.2,
        backoff=Backoff(initial=0.05, maximum=0.05),
        ordering_key=lambda job: job.target,
    )
    consumer = PullConsumer(work_bus, work_consumer(max_deliver=50), Job, handler, options)
    await consumer.start()
    for number in range(10):
        await work_bus.publish("work.same", Job(target="same", number=number))
    await asyncio.sleep(0.6)
    assert consumer.in_flight == 3 and peak["held"] == 3
    await consumer.stop()


async def test_an_ordering_key_function_that_raises_dead_letters_the_message(
    work_bus: Bus,
) -> None:
    handled: list[int] = []

    async def handler(job: Job, delivery: Delivery) -> None:
        handled.append(job.number)

    def key(job: Job) -> str:
        if job.number == 0:
            raise ValueError("no key for job 0")
        return job.target

    options = ConsumerOptions(concurrency=2, fetch_timeout=0.2, ordering_key=key)
    consumer = PullConsumer(work_bus, work_consumer(), Job, handler, options)
    await consumer.start()
    await work_bus.publish("work.k", Job(target="k", number=0))
    await work_bus.publish("work.k", Job(target="k", number=1))
    letters = await dead_letters(work_bus, 1)
    await eventually(lambda: handled == [1])
    assert consumer.running and not consumer.failed
    assert consumer.not_ready_reason() is None
    await consumer.stop()
    assert [letter.subject for letter in letters] == ["dlq.work.k"]
    headers = letters[0].headers or {}
    assert headers[dead_letter.ERROR_KIND] == "permanent"
    assert "no key for job 0" in headers[dead_letter.ERROR]


async def test_a_crashed_fetch_loop_is_reported_and_stop_still_hands_messages_back(
    work_bus: Bus,
) -> None:
    consumer = PullConsumer(work_bus, work_consumer(), Job, lambda job, delivery: asyncio.sleep(0))

    def broken_dispatch(msg: object) -> None:
        raise RuntimeError("bug in dispatch")

    consumer._dispatch = broken_dispatch  # type: ignore[method-assign]
    await consumer.start()
    assert consumer.not_ready_reason() is None
    await work_bus.publish("work.c", Job(target="c", number=1))
    await eventually(lambda: consumer.failed)
    assert "fetch loop crashed: RuntimeError: bug in dispatch" in (
        consumer.not_ready_reason() or ""
    )
    await consumer.stop(timeout=0.5)  # does not raise the loop's error

    received: list[int] = []

    async def handler(job: Job, delivery: Delivery) -> None:
        received.append(job.number)

    second = PullConsumer(work_bus, work_consumer(), Job, handler, FAST)
    await second.start()
    await eventually(lambda: received == [1], timeout=2.0)  # handed back, not after ack_wait
    await second.stop()


async def test_cancelling_stop_cancels_the_caller(work_bus: Bus) -> None:
    consumer = PullConsumer(
        work_bus, work_consumer(), Job, lambda job, delivery: asyncio.sleep(0), FAST
    )
    await consumer.start()
    await asyncio.sleep(0.05)  # a fetch is waiting for messages
    stopping = asyncio.create_task(consumer.stop())
    await asyncio.sleep(0.02)
    stopping.cancel()
    with pytest.raises(asyncio.CancelledError):
        await stopping
    await consumer.stop()


async def test_two_durables_dead_lettering_one_message_both_keep_their_copy(bus: Bus) -> None:
    fanout = StreamSpec(name="FANOUT", subjects=("fan.>",), description="two readers")
    specs = [
        ConsumerSpec(stream="FANOUT", durable=name, filter_subjects=("fan.>",), description="r")
        for name in ("reader-a", "reader-b")
    ]
    await ensure_topology(bus.js, streams=[fanout, DLQ_STREAM], kv_buckets=[], consumers=specs)

    async def refuse(payload: bytes, delivery: Delivery) -> None:
        raise PermanentError("refused")

    consumers = [PullConsumer(bus, spec, bytes, refuse, FAST) for spec in specs]
    for consumer in consumers:
        await consumer.start()
    await bus.publish("fan.x", b"payload")
    letters = await dead_letters(bus, 2)
    for consumer in consumers:
        await consumer.stop()
    assert sorted((letter.headers or {})[dead_letter.CONSUMER] for letter in letters) == [
        "reader-a",
        "reader-b",
    ]


async def test_a_deleted_durable_is_reported_and_recreated(work_bus: Bus) -> None:
    handled: list[int] = []
    reasons: list[str] = []

    async def handler(job: Job, delivery: Delivery) -> None:
        handled.append(job.number)

    consumer = PullConsumer(work_bus, work_consumer(), Job, handler, FAST)
    await consumer.start()

    async def watch_readiness() -> None:
        while True:
            reason = consumer.not_ready_reason()
            if reason is not None:
                reasons.append(reason)
            await asyncio.sleep(0.005)

    watcher = asyncio.create_task(watch_readiness())
    await work_bus.js.delete_consumer(WORK_STREAM.name, "workers")
    await eventually(lambda: bool(reasons), timeout=3.0)
    await work_bus.publish("work.n", Job(target="n", number=5))
    await eventually(lambda: handled == [5], timeout=5.0)
    await eventually(lambda: consumer.not_ready_reason() is None)
    watcher.cancel()
    await consumer.stop()
    assert "fetch failing" in reasons[0]
