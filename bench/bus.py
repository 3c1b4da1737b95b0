"""Benchmark of libs/nodeflow_bus against raw nats-py on one local nats-server.

Prints one line per figure: acked publish throughput through `Bus.publish_batch` and through
raw `js.publish_async` (and their ratio, same run), consume throughput of `PullConsumer`, and
publish-to-handler latency p50/p99. Then the timings that are behaviour, each as a ratio to the
setting it derives from, measured in the same run: how long a dead leader's lease takes to be
taken over and a released one to be handed over (x TTL), how long a command held by a dead
executor takes to be redelivered (x ack wait), how long an outage takes to fail a batch
(x publish budget), and how long a KV view takes to load 50,000 keys.
Run: `.venv/bin/python -m bench bus` (about 40-60 s).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import statistics
import tempfile
import time
from pathlib import Path

import msgspec
import structlog

from nodeflow_bus import (
    BatchPublishError,
    Bus,
    BusOptions,
    ConsumerOptions,
    Delivery,
    KVView,
    LeaderLease,
    OutgoingMessage,
    PullConsumer,
    ensure_topology,
)
from nodeflow_bus.connection import publish_budget
from nodeflow_bus.lease import lease_margin
from nodeflow_contracts.topology import (
    CONSUMERS,
    KV_BUCKETS,
    LEASES_BUCKET,
    STREAMS,
    ConsumerSpec,
    KVSpec,
    StreamSpec,
)
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


LEASE_TTL = 1.5
KV_SNAPSHOT_KEYS = 50_000


async def lease_takeover_ratios(server: NatsServerProcess) -> tuple[float, float]:
    """(takeover of a dead leader, hand-over of a released lease), each in TTLs."""
    options = BusOptions(name="bench-lease", initial_connect_deadline=5.0)
    buses = [await Bus.connect(server.url, options=options) for _ in range(3)]
    await ensure_topology(
        buses[0].js,
        streams=[],
        kv_buckets=[KVSpec(bucket=LEASES_BUCKET, description="leases")],
        consumers=[],
    )
    leader, follower, third = (
        LeaderLease(bus, "bench", holder=f"r{n}", ttl=LEASE_TTL) for n, bus in enumerate(buses)
    )
    try:
        await leader.start()
        await leader.wait_until_leader(10)
        await follower.start()
        await asyncio.sleep(LEASE_TTL)
        # A crash: nothing released, the connection gone.
        await leader.stop(release=False)
        await buses[0].nc.close()
        died_at = time.perf_counter()
        await follower.wait_until_leader(LEASE_TTL * 10)
        takeover = (time.perf_counter() - died_at) / LEASE_TTL
        await third.start()
        await asyncio.sleep(LEASE_TTL / 2)
        released_at = time.perf_counter()
        await follower.stop()
        await third.wait_until_leader(LEASE_TTL * 10)
        handover = (time.perf_counter() - released_at) / LEASE_TTL
    finally:
        await third.stop()
        for bus in buses[1:]:
            await bus.close()
    return takeover, handover


async def redelivery_ratio(server: NatsServerProcess) -> tuple[float, float]:
    """(seconds from an executor's death to the redelivery of the command it held, the
    command consumer's ack wait)."""
    spec = CONSUMERS["k8s-watcher"][0]  # one per sender, all alike
    options = BusOptions(name="bench-executor", initial_connect_deadline=5.0)
    dying, successor_bus = [await Bus.connect(server.url, options=options) for _ in range(2)]
    await ensure_topology(dying.js, streams=STREAMS, kv_buckets=KV_BUCKETS, consumers=[spec])
    taken = asyncio.Event()
    redelivered = asyncio.Event()

    async def hang(_: bytes, delivery: Delivery) -> None:
        taken.set()
        await asyncio.Event().wait()

    async def record(_: bytes, delivery: Delivery) -> None:
        redelivered.set()

    doomed = PullConsumer(dying, spec, bytes, hang, ConsumerOptions(fetch_timeout=0.2))
    await doomed.start()
    (pattern,) = spec.filter_subjects
    await successor_bus.publish(pattern.replace(">", "bench.held"), b"{}")
    await asyncio.wait_for(taken.wait(), 30)
    # Dead: the connection drops with the command unsettled (the hand-back nak cannot be sent).
    await dying.nc.close()
    died_at = time.perf_counter()
    await doomed.stop(timeout=0)
    successor = PullConsumer(successor_bus, spec, bytes, record, ConsumerOptions())
    await successor.start()
    await asyncio.wait_for(redelivered.wait(), spec.ack_wait_seconds * 10)
    took = time.perf_counter() - died_at
    await successor.stop()
    await successor_bus.close()
    return took, spec.ack_wait_seconds


async def outage_failure_ratio(server: NatsServerProcess) -> float:
    """How long an outage takes to fail a batch of 20, in publish budgets (+ one ack wait)."""
    options = BusOptions(
        name="bench-outage",
        initial_connect_deadline=5.0,
        request_timeout=0.2,
        publish_attempts=3,
        reconnect_wait=0.1,
    )
    bus = await Bus.connect(server.url, options=options)
    await ensure_topology(bus.js, streams=[STREAM], kv_buckets=[], consumers=[])
    await server.kill()
    batch = [OutgoingMessage(subject=f"bench.outage.{n}", message=b"{}") for n in range(20)]
    started = time.perf_counter()
    with contextlib.suppress(BatchPublishError):
        await bus.publish_batch(batch)
    elapsed = time.perf_counter() - started
    await server.start()
    await bus.close()
    return elapsed / (options.request_timeout + publish_budget(3, 0.2, options.publish_backoff))


async def kv_snapshot_seconds(bus: Bus) -> float:
    await ensure_topology(
        bus.js,
        streams=[],
        kv_buckets=[KVSpec(bucket="bench_things", description="bench")],
        consumers=[],
    )
    value = msgspec.json.encode({"name": "n", "size": 1})
    await bus.publish_batch(
        [
            OutgoingMessage(subject=f"$KV.bench_things.k{n}", message=value)
            for n in range(KV_SNAPSHOT_KEYS)
        ],
        max_in_flight=1024,
    )
    view: KVView[bytes] = KVView(bus, "bench_things", bytes)
    started = time.perf_counter()
    await view.start()
    await view.wait_ready(120)
    elapsed = time.perf_counter() - started
    assert len(view) == KV_SNAPSHOT_KEYS
    await view.stop()
    return elapsed


async def recovery_figures(server: NatsServerProcess, bus: Bus) -> None:
    takeover, handover = await lease_takeover_ratios(server)
    bound = 1 + lease_margin(LEASE_TTL) / LEASE_TTL
    print(f"lease takeover after a dead leader: {takeover:.2f} x TTL (target <= {bound:.1f})")
    print(f"lease hand-over after a release: {handover:.2f} x TTL (target < 0.5)")
    took, ack_wait = await redelivery_ratio(server)
    print(
        f"command redelivery after its executor died: {took:.1f} s = {took / ack_wait:.2f} x "
        f"ack wait {ack_wait:.0f} s (target <= 1.2)"
    )
    seconds = await kv_snapshot_seconds(bus)
    print(f"KV view snapshot of {KV_SNAPSHOT_KEYS:,} keys: {seconds:.2f} s (target < 15)")


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
            await recovery_figures(server, bus)
            # Last: it kills the server (and starts it again).
            outage = await outage_failure_ratio(server)
            print(
                f"batch failed by an outage after {outage:.2f} x (ack wait + budget) (target < 1.5)"
            )
        finally:
            await bus.close()
            await server.stop()


if __name__ == "__main__":
    asyncio.run(main())
