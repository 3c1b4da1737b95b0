"""Benchmark of libs/nodeflow_bus against raw nats-py on one local nats-server.

Prints one line per figure: acked publish throughput through `Bus.publish_batch` and through
raw `js.publish_async` (and their ratio, same run), consume throughput of `PullConsumer`, and
publish-to-handler latency p50/p99. Run: `.venv/bin/python -m bench.bus` (about 15-30 s).
"""

from __future__ import annotations

import asyncio
import logging
import statistics
import tempfile
import time
from pathlib import Path

import msgspec
import structlog

from nodeflow_bus import (
    Bus,
    BusOptions,
    ConsumerOptions,
    Delivery,
    OutgoingMessage,
    PullConsumer,
    ensure_topology,
)
from nodeflow_contracts.topology import ConsumerSpec, StreamSpec
from nodeflow_runtime.natsd import NatsServerProcess

MESSAGES = 20_000
LATENCY_SAMPLES = 2_000
ROUNDS = 3

STREAM = StreamSpec(
    name="BENCH", subjects=("bench.>",), description="benchmark", max_age_seconds=3600.0
)


class Event(msgspec.Struct, frozen=True, kw_only=True):
    object_name: str
    namespace: str
    generation: int
    sent_at: float
    labels: dict[str, str]


def event(number: int) -> Event:
    return Event(
        object_name=f"node-{number % 512}",
        namespace="gpu-cluster",
        generation=number,
        sent_at=time.perf_counter(),
        labels={"nvidia.com/gpu.product": "H100", "topology.kubernetes.io/zone": "z1"},
    )


def percentile(samples: list[float], fraction: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


async def bus_publish_rate(bus: Bus, round_number: int) -> float:
    batch = [
        OutgoingMessage(
            subject=f"bench.bus.{n % 64}", message=event(n), msg_id=f"b{round_number}-{n}"
        )
        for n in range(MESSAGES)
    ]
    started = time.perf_counter()
    acks = await bus.publish_batch(batch, max_in_flight=256)
    elapsed = time.perf_counter() - started
    assert len(acks) == MESSAGES and not any(ack.duplicate for ack in acks)
    return MESSAGES / elapsed


async def raw_publish_rate(bus: Bus, round_number: int) -> float:
    js = bus.nc.jetstream()
    encoder = msgspec.json.Encoder()
    payloads = [encoder.encode(event(n)) for n in range(MESSAGES)]
    started = time.perf_counter()
    futures = [
        await js.publish_async(
            f"bench.raw.{n % 64}", payload, headers={"Nats-Msg-Id": f"r{round_number}-{n}"}
        )
        for n, payload in enumerate(payloads)
    ]
    acks = await asyncio.gather(*futures)
    elapsed = time.perf_counter() - started
    assert len(acks) == MESSAGES
    return MESSAGES / elapsed


async def consume_rate(bus: Bus) -> float:
    spec = ConsumerSpec(
        stream="BENCH", durable="bench-all", filter_subjects=("bench.>",), description="bench"
    )
    await ensure_topology(bus.js, streams=[], kv_buckets=[], consumers=[spec])
    total = (await bus.js.stream_info("BENCH")).state.messages
    done = asyncio.Event()
    count = 0

    async def handler(message: Event, delivery: Delivery) -> None:
        nonlocal count
        count += 1
        if count == total:
            done.set()

    consumer = PullConsumer(
        bus, spec, Event, handler, ConsumerOptions(concurrency=256, fetch_batch=256)
    )
    started = time.perf_counter()
    await consumer.start()
    await asyncio.wait_for(done.wait(), 120)
    elapsed = time.perf_counter() - started
    await consumer.stop()
    return total / elapsed


async def latencies(bus: Bus) -> list[float]:
    spec = ConsumerSpec(
        stream="BENCH",
        durable="bench-latency",
        filter_subjects=("bench.latency.>",),
        description="bench",
        deliver_policy="new",
    )
    await ensure_topology(bus.js, streams=[], kv_buckets=[], consumers=[spec])
    samples: list[float] = []
    done = asyncio.Event()

    async def handler(message: Event, delivery: Delivery) -> None:
        samples.append(time.perf_counter() - message.sent_at)
        if len(samples) == LATENCY_SAMPLES:
            done.set()

    consumer = PullConsumer(bus, spec, Event, handler, ConsumerOptions(concurrency=16))
    await consumer.start()
    # Paced publishing (one in flight) measures latency, not queueing behind a burst.
    for n in range(LATENCY_SAMPLES):
        await bus.publish(f"bench.latency.{n % 8}", event(n))
    await asyncio.wait_for(done.wait(), 60)
    await consumer.stop()
    return samples


async def main() -> None:
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    with tempfile.TemporaryDirectory(prefix="nodeflow-bench-") as store:
        server = NatsServerProcess(Path(store) / "nats")
        await server.start()
        bus = await Bus.connect(
            server.url, options=BusOptions(name="bench", initial_connect_deadline=5.0)
        )
        try:
            await ensure_topology(bus.js, streams=[STREAM], kv_buckets=[], consumers=[])
            # Interleave the two publishers so drift of the machine affects both alike.
            bus_rates: list[float] = []
            raw_rates: list[float] = []
            for round_number in range(ROUNDS):
                raw_rates.append(await raw_publish_rate(bus, round_number))
                bus_rates.append(await bus_publish_rate(bus, round_number))
            bus_rate = statistics.median(bus_rates)
            raw_rate = statistics.median(raw_rates)
            print(f"bus publish_batch acked throughput: {bus_rate:,.0f} msg/s")
            print(f"raw nats-py publish_async acked throughput: {raw_rate:,.0f} msg/s")
            print(f"bus/raw publish ratio: {bus_rate / raw_rate:.2f} (target >= 0.5)")
            print(f"bus consume throughput (ack per message): {await consume_rate(bus):,.0f} msg/s")
            samples = await latencies(bus)
            print(f"publish-to-handler latency p50: {percentile(samples, 0.50) * 1000:.2f} ms")
            print(f"publish-to-handler latency p99: {percentile(samples, 0.99) * 1000:.2f} ms")
        finally:
            await bus.close()
            await server.stop()


if __name__ == "__main__":
    asyncio.run(main())
