"""metrics-exporter: /metrics scrape time and memory with 4,000 Slurm nodes and 50 NodeSets.

A local nats-server holds the KV buckets; the exporter loads them through its KV views and
serves /metrics over HTTP exactly as the service does (the process-wide registry, bus metrics
included). Target: a scrape under 200 ms.
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
from prometheus_client import REGISTRY, generate_latest

from metrics_exporter import SERVICE
from metrics_exporter.exporter import NODESETS_BUCKET, Exporter
from nodeflow_bus import Bus, BusOptions, OutgoingMessage, ensure_topology
from nodeflow_contracts import subjects
from nodeflow_contracts.slurm import BASE_STATES, SlurmNodeState
from nodeflow_contracts.topology import CONSUMERS, SLURM_NODES_BUCKET
from nodeflow_runtime.http import Health, build_app, start_http
from nodeflow_runtime.logs import configure_logging
from nodeflow_runtime.natsd import NatsServerProcess, free_port

SLURM_NODES = 4000
CLUSTERS = 4
NODESETS = 50
SCRAPES = 50
TARGET_MS = 200.0


def rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def slurm_node(index: int) -> SlurmNodeState:
    drained = index % 17 == 0
    draining = index % 23 == 0
    flags = ("Drain",) if drained or draining else ()
    return SlurmNodeState(
        cluster=f"cluster-{index % CLUSTERS}",
        name=f"gpu-{index:05d}",
        known=index % 101 != 0,
        base_state=BASE_STATES[index % len(BASE_STATES)],  # type: ignore[arg-type]
        flags=flags,
        reason="nodeflow: scale-in" if flags else "",
        reason_is_ours=bool(flags),
        cpus=128,
        alloc_cpus=64 if draining else 0,
        busy=draining,
        drain=bool(flags),
        drained=drained,
        draining=draining,
        observed_at=time.time(),
    )


def nodeset(index: int) -> dict[str, Any]:
    """A NodeSet about the size k8s-watcher stores (spec with a pod template, full status)."""
    replicas = 80
    return {
        "apiVersion": "nodeflow.dev/v1alpha1",
        "kind": "NodeSet",
        "metadata": {
            "namespace": f"team-{index % 5}",
            "name": f"pool-{index}",
            "uid": f"00000000-0000-0000-0000-{index:012d}",
            "resourceVersion": str(1000 + index),
            "generation": 3,
            "labels": {"app.kubernetes.io/part-of": "nodeflow"},
        },
        "spec": {
            "replicas": replicas,
            "slurmCluster": f"cluster-{index % CLUSTERS}",
            "template": {
                "metadata": {"labels": {"nodeset": f"pool-{index}"}},
                "spec": {
                    "containers": [
                        {
                            "name": "slurmd",
                            "image": "registry.example/slurmd:24.11",
                            "resources": {"limits": {"nvidia.com/gpu": 8}},
                        }
                    ]
                },
            },
        },
        "status": {
            "currentNumberScheduled": replicas,
            "numberMisscheduled": 0,
            "desiredNumberScheduled": replicas,
            "updatedNumberScheduled": replicas - 2,
            "numberFeasible": replicas + 4,
            "numberReady": replicas - 1,
            "numberUnavailable": 1,
            "numberRunning": replicas - 10,
            "numberDrain": 3,
            "conditions": [{"type": "Ready", "status": "True", "reason": "AllReady"}],
        },
    }


async def load(bus: Bus) -> None:
    await bus.publish_batch(
        [
            OutgoingMessage(
                subject=subjects.kv_entry(SLURM_NODES_BUCKET, state.key),
                message=state,
                msg_id=state.key,
            )
            for state in map(slurm_node, range(SLURM_NODES))
        ]
    )
    await bus.publish_batch(
        [
            OutgoingMessage(
                subject=f"$KV.{NODESETS_BUCKET}.{subjects.object_key(ns, name)}",
                message=obj,
            )
            for obj in map(nodeset, range(NODESETS))
            for ns, name in [(obj["metadata"]["namespace"], obj["metadata"]["name"])]
        ]
    )


async def wait_loaded(exporter: Exporter, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while len(exporter.slurm_nodes) < SLURM_NODES or len(exporter.nodesets) < NODESETS:
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"views hold {len(exporter.slurm_nodes)} nodes, {len(exporter.nodesets)} NodeSets"
            )
        await asyncio.sleep(0.05)


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


async def main() -> None:
    # Only problems: the figures are the output.
    configure_logging("bench-metrics-exporter", "warning")
    with tempfile.TemporaryDirectory(prefix="bench-metrics-exporter-") as store:
        async with NatsServerProcess(Path(store) / "nats") as server:
            bus = await Bus.connect(server.url, options=BusOptions(name="bench-metrics-exporter"))
            await ensure_topology(bus.js, consumers=CONSUMERS[SERVICE])
            rss_before = rss_mib()
            await load(bus)
            exporter = Exporter(bus, REGISTRY)
            port = free_port()
            runner = await start_http(build_app(SERVICE, Health(), REGISTRY), "127.0.0.1", port)
            try:
                started = time.perf_counter()
                await exporter.start()
                await exporter.wait_ready(30.0)
                await wait_loaded(exporter)
                load_seconds = time.perf_counter() - started
                rss_loaded = rss_mib()
                url = f"http://127.0.0.1:{port}/metrics"
                timings: list[float] = []
                body = b""
                async with aiohttp.ClientSession() as session:
                    for _ in range(SCRAPES):
                        began = time.perf_counter()
                        async with session.get(url) as response:
                            body = await response.read()
                        timings.append((time.perf_counter() - began) * 1000)
                renders: list[float] = []
                for _ in range(SCRAPES):
                    began = time.perf_counter()
                    generate_latest(REGISTRY)
                    renders.append((time.perf_counter() - began) * 1000)
                rss_after = rss_mib()
            finally:
                await exporter.stop(5.0)
                await runner.cleanup()
                await bus.close()
    p50, p99 = statistics.median(timings), percentile(timings, 0.99)
    verdict = "ok" if p99 < TARGET_MS else "OVER TARGET"
    series = sum(1 for line in body.decode().splitlines() if line and not line.startswith("#"))
    print(f"   views loaded ({SLURM_NODES} Slurm nodes, {NODESETS} NodeSets): {load_seconds:.2f} s")
    print(
        f"   /metrics scrape over HTTP ({SCRAPES} scrapes): p50 {p50:.1f} ms, p99 {p99:.1f} ms "
        f"(target < {TARGET_MS:.0f} ms: {verdict})"
    )
    print(
        f"   registry render only: p50 {statistics.median(renders):.1f} ms, "
        f"p99 {percentile(renders, 0.99):.1f} ms"
    )
    print(f"   /metrics size: {len(body) / 1024:.0f} KiB, {series} samples")
    print(
        f"   RSS: {rss_before:.0f} MiB before loading, {rss_loaded:.0f} MiB loaded, "
        f"{rss_after:.0f} MiB after scrapes (+{rss_loaded - rss_before:.0f} MiB for the views)"
    )
