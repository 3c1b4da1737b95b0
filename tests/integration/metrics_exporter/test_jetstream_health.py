"""JetStream health as metrics-exporter reports it, read from real nats-server processes: a
single server, and a three-node JetStream cluster that loses one node, then its quorum."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from metrics_exporter.exporter import Exporter
from metrics_exporter.jetstream import JetStreamCollector, JetStreamProbe, probed_streams
from nodeflow_bus import Bus, ensure_topology
from nodeflow_contracts.topology import KV_BUCKETS, STREAMS, replicated
from nodeflow_runtime.natsd_cluster import NatsCluster
from tests.integration.bus.test_cluster import CLUSTER_BUS_OPTIONS
from tests.integration.metrics_exporter.conftest import eventually

REPLICAS = 3


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, labels)


async def test_rule_the_exporter_reports_every_stream_led_and_current_on_one_server(
    exporter: Exporter, registry: CollectorRegistry
) -> None:
    await exporter.jetstream.probe_once()
    assert sample(registry, "nodeflow_jetstream_api_up") == 1.0
    for stream in probed_streams():
        assert sample(registry, "nodeflow_jetstream_stream_leader", stream=stream) == 1.0
        assert sample(registry, "nodeflow_jetstream_stream_replicas_current", stream=stream) == 1.0
        assert sample(registry, "nodeflow_jetstream_stream_replicas_desired", stream=stream) == 1.0


async def test_rule_a_missing_stream_reads_as_without_leader(
    bus: Bus, registry: CollectorRegistry
) -> None:
    await ensure_topology(bus.js)
    probe = JetStreamProbe(bus, streams=("K8S_COMMANDS", "NOT_DECLARED"))
    registry.register(JetStreamCollector(probe))
    assert sample(registry, "nodeflow_jetstream_api_up") is None  # nothing before a probe
    await probe.probe_once()
    assert sample(registry, "nodeflow_jetstream_stream_leader", stream="K8S_COMMANDS") == 1.0
    assert sample(registry, "nodeflow_jetstream_stream_leader", stream="NOT_DECLARED") == 0.0


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[NatsCluster]:
    async with NatsCluster(tmp_path / "cluster", size=3) as running:
        yield running


async def probe_until(
    probe: JetStreamProbe, done: Callable[[], bool], timeout: float, what: str
) -> None:
    deadline = time.monotonic() + timeout
    while True:
        await probe.probe_once()
        if done():
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout}s; last {probe.streams}")
        await asyncio.sleep(0.5)


async def test_rule_a_lost_node_shows_replicas_behind_and_a_lost_quorum_shows_no_api_and_no_leader(
    cluster: NatsCluster,
) -> None:
    bus = await Bus.connect(cluster.urls, options=CLUSTER_BUS_OPTIONS)
    registry = CollectorRegistry()
    probe = JetStreamProbe(bus, timeout=1.0)
    registry.register(JetStreamCollector(probe))
    try:
        await ensure_topology(
            bus.js,
            streams=replicated(STREAMS, REPLICAS),
            kv_buckets=replicated(KV_BUCKETS, REPLICAS),
        )
        await probe_until(
            probe,
            lambda: all(h.has_leader and h.replicas_current == REPLICAS for h in probe.streams),
            60,
            "every stream led with three current replicas",
        )
        assert sample(registry, "nodeflow_jetstream_api_up") == 1.0
        assert (
            sample(registry, "nodeflow_jetstream_stream_replicas_desired", stream="DECISIONS") == 3
        )

        await cluster.nodes[2].kill()
        await probe_until(
            probe,
            lambda: all(h.has_leader and h.replicas_current == 2 for h in probe.streams),
            90,
            "every stream led by a survivor with two current replicas",
        )
        assert (
            sample(registry, "nodeflow_jetstream_stream_replicas_current", stream="DECISIONS") == 2
        )

        await cluster.nodes[1].kill()
        await probe_until(
            probe,
            lambda: probe.api_up is False and not any(h.has_leader for h in probe.streams),
            90,
            "no API and no stream leader without a quorum",
        )
        assert sample(registry, "nodeflow_jetstream_api_up") == 0.0
        assert sample(registry, "nodeflow_jetstream_stream_leader", stream="DECISIONS") == 0.0
    finally:
        await bus.close()


async def test_the_probe_runs_on_its_own_until_stopped(bus: Bus) -> None:
    await ensure_topology(bus.js)
    probe = JetStreamProbe(bus, streams=("DECISIONS",), interval=0.05)
    probe.start()
    try:
        await eventually(lambda: probe.api_up is True, what="a first probe")
        probe.streams = ()
        await eventually(lambda: bool(probe.streams), what="a second probe")
    finally:
        await probe.stop()
    await probe.stop()  # stopping twice is harmless
