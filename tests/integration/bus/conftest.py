"""Helpers for the bus integration tests: a small work stream and its dead-letter stream."""

from __future__ import annotations

import msgspec
import pytest

from nodeflow_bus import Bus, ensure_topology
from nodeflow_contracts.topology import ConsumerSpec, StreamSpec

WORK_STREAM = StreamSpec(
    name="TEST_WORK",
    subjects=("work.>",),
    description="integration-test work queue",
    retention="workqueue",
    max_age_seconds=600.0,
)
DLQ_STREAM = StreamSpec(
    name="DEAD_LETTERS",
    subjects=("dlq.>",),
    description="dead letters",
    max_age_seconds=600.0,
)


class Job(msgspec.Struct, frozen=True, kw_only=True):
    target: str
    number: int


def work_consumer(
    durable: str = "workers", *, max_deliver: int = 3, ack_wait: float = 5.0
) -> ConsumerSpec:
    return ConsumerSpec(
        stream=WORK_STREAM.name,
        durable=durable,
        filter_subjects=("work.>",),
        description="test workers",
        ack_wait_seconds=ack_wait,
        max_deliver=max_deliver,
    )


@pytest.fixture
async def work_bus(bus: Bus) -> Bus:
    await ensure_topology(
        bus.js, streams=[WORK_STREAM, DLQ_STREAM], kv_buckets=[], consumers=[work_consumer()]
    )
    return bus
