"""A running Exporter on a real NATS server, with its own registry and a settable clock."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable

import pytest
from prometheus_client import CollectorRegistry

from metrics_exporter import SERVICE
from metrics_exporter.exporter import Exporter
from nodeflow_bus import Bus, ConsumerOptions, ensure_topology
from nodeflow_contracts.topology import CONSUMERS


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


async def eventually(
    predicate: Callable[[], bool], timeout: float = 5.0, what: str = "condition"
) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


@pytest.fixture
def clock() -> Clock:
    return Clock(1_000_000.0)


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


@pytest.fixture
async def exporter(bus: Bus, registry: CollectorRegistry, clock: Clock) -> AsyncIterator[Exporter]:
    await ensure_topology(bus.js, consumers=CONSUMERS[SERVICE])
    running = Exporter(
        bus,
        registry,
        clock=clock,
        label_value_limit=20,
        consumer_options=ConsumerOptions(concurrency=4, fetch_timeout=0.2, stop_timeout=1.0),
    )
    await running.start()
    await running.wait_ready(5.0)
    try:
        yield running
    finally:
        await running.stop(2.0)
