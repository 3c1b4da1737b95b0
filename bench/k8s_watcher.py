"""k8s-watcher benchmark: one line per figure, each with its target.

* initial sync of 10,000 nodes and 50,000 pods into KV (seconds, target < 30 s), and the
  restart over the same state (seconds, and how many events it published: target 0);
* steady-state latency from an API change to its NATS event (p50, p99; target p99 < 100 ms),
  measured from just before the PATCH is sent until the event arrives on NATS;
* pod-create commands/s through NATS and k8s-watcher against a bare kubernetes-asyncio client
  on the same emulator, same run (ratio, target >= 0.7).

The emulator runs in a child process (bench.kube_api.ServerProcess) and NATS is a real
nats-server; k8s-watcher runs in this process. `python -m bench k8s_watcher` runs it.
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import structlog
from kubernetes_asyncio import client

from bench.kube_api import ServerProcess, api_client, pod_manifest
from k8s_watcher.config import K8sWatcherConfig
from k8s_watcher.service import K8sWatcher
from nodeflow_bus import Bus, OutgoingMessage, ensure_topology
from nodeflow_contracts import subjects
from nodeflow_contracts.k8s import CreateObject, K8sCommand, ObjectRef
from nodeflow_contracts.permissions import ADMIN_USER
from nodeflow_contracts.topology import CONSUMERS, KV_BUCKETS, STREAMS
from nodeflow_runtime.logs import configure_logging
from nodeflow_runtime.natsd import NatsServerProcess

SYNC_NODES = 10_000
SYNC_PODS = 50_000
SYNC_TARGET_S = 30.0
LATENCY_CHANGES = 400
LATENCY_INTERVAL_S = 0.01
LATENCY_TARGET_P99_MS = 100.0
CREATES = 3_000
CONCURRENCY = 64
# k8s-watcher hides its own NATS round trips (applied-key check, record, outcome) behind more
# commands in flight; the bare client is already server-bound at 64.
COMMAND_CONCURRENCY = 128
RATIO_TARGET = 0.7


def watcher_config(kubeconfig: Path, **overrides: Any) -> K8sWatcherConfig:
    settings: dict[str, Any] = {
        "kubeconfig": str(kubeconfig),
        "instance_id": "bench",
        "watched_kinds": ("Node", "Pod"),
    }
    settings.update(overrides)
    return K8sWatcherConfig(**settings)


async def kv_count(bus: Bus, kind: str) -> int:
    info = await bus.js.stream_info(f"KV_{subjects.k8s_bucket(kind)}")
    return int(info.state.messages)


async def events_stored(bus: Bus) -> int:
    info = await bus.js.stream_info("K8S_EVENTS")
    return int(info.state.messages)


async def timed_sync(config: K8sWatcherConfig, bus: Bus) -> tuple[K8sWatcher, float]:
    started = time.perf_counter()
    watcher = await K8sWatcher.connect(config, bus)
    await watcher.start()
    await watcher.wait_synced()
    return watcher, time.perf_counter() - started


async def bench_sync_and_latency(bus: Bus) -> None:
    async with ServerProcess(nodes=SYNC_NODES, pods=SYNC_PODS) as kubeconfig:
        config = watcher_config(kubeconfig)
        watcher, seconds = await timed_sync(config, bus)
        nodes, pods = await kv_count(bus, "Node"), await kv_count(bus, "Pod")
        print(
            f"k8s_watcher initial sync of {nodes:,} nodes + {pods:,} pods into KV: "
            f"{seconds:.1f} s (target < {SYNC_TARGET_S:.0f} s)",
            flush=True,
        )
        await watcher.stop()
        before = await events_stored(bus)
        watcher, seconds = await timed_sync(config, bus)
        published = await events_stored(bus) - before
        print(
            f"k8s_watcher restart over unchanged state: {seconds:.1f} s, {published} events "
            f"published (target 0)",
            flush=True,
        )
        await measure_latency(bus, kubeconfig)
        await watcher.stop()


async def measure_latency(
    bus: Bus, kubeconfig: Path, nodes: list[str] | None = None, label: str = "emulator"
) -> None:
    """Patch each node once (by default LATENCY_CHANGES of the emulator's gpu-node-NNNNN) and
    time each change until its event is on NATS."""
    names = nodes or [f"gpu-node-{i:05d}" for i in range(LATENCY_CHANGES)]
    sent: dict[str, float] = {}
    arrived: dict[str, float] = {}
    all_arrived = asyncio.Event()

    async def on_event(msg: Any) -> None:
        arrived[msg.subject] = time.perf_counter()
        if len(arrived.keys() & sent.keys()) == len(names):
            all_arrived.set()

    subscription = await bus.nc.subscribe(subjects.k8s_kind_events("Node"), cb=on_event)
    api = await api_client(kubeconfig)
    core: Any = client.CoreV1Api(api)
    for i, name in enumerate(names):
        patch = {"metadata": {"labels": {"bench/seq": str(i)}}}
        sent[subjects.k8s_object_event("Node", None, name)] = time.perf_counter()
        await core.patch_node(name, patch, _preload_content=False)
        await asyncio.sleep(LATENCY_INTERVAL_S)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(all_arrived.wait(), 10)
    await subscription.unsubscribe()
    await api.close()
    latencies = sorted((arrived[s] - t) * 1000 for s, t in sent.items() if s in arrived)
    if not latencies:
        print(
            f"k8s_watcher ({label}) API change -> NATS event latency: no event arrived", flush=True
        )
        return
    p50 = statistics.median(latencies)
    p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))]
    print(
        f"k8s_watcher ({label}) API change -> NATS event latency over {len(latencies)} node "
        "patches: "
        f"p50 {p50:.1f} ms, p99 {p99:.1f} ms (target p99 < {LATENCY_TARGET_P99_MS:.0f} ms; "
        f"missing {len(sent) - len(latencies)})",
        flush=True,
    )


async def raw_creates(kubeconfig: Path) -> float:
    api = await api_client(kubeconfig)
    core: Any = client.CoreV1Api(api)
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(CREATES):
        queue.put_nowait(i)

    async def worker() -> None:
        while not queue.empty():
            i = queue.get_nowait()
            await core.create_namespaced_pod("default", pod_manifest(i), _preload_content=False)

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
    elapsed = time.perf_counter() - started
    await api.close()
    return CREATES / elapsed


async def command_creates(bus: Bus, kubeconfig: Path) -> tuple[float, int]:
    # The client-side rate limit is lifted so that both sides are limited by the same server.
    config = watcher_config(
        kubeconfig, kube_qps=1e6, kube_burst=1_000_000, command_concurrency=COMMAND_CONCURRENCY
    )
    watcher, _ = await timed_sync(config, bus)
    applied = 0
    done = asyncio.Event()

    async def on_outcome(msg: Any) -> None:
        nonlocal applied
        if b'"outcome":"applied"' in msg.data:
            applied += 1
            if applied >= CREATES:
                done.set()

    subscription = await bus.nc.subscribe(subjects.K8S_OUTCOMES, cb=on_outcome)
    run = uuid.uuid4().hex[:6]
    commands = []
    for i in range(CREATES):
        manifest = pod_manifest(i)
        manifest["metadata"]["name"] = f"cmd-{run}-{i:06d}"
        cmd = K8sCommand(
            idempotency_key=f"bench-{run}-{i}",
            # The operators' sender: k8s-watcher's policy allows it any command.
            sender=ADMIN_USER,
            sent_at=time.time(),
            target=ObjectRef(
                api_version="v1", kind="Pod", name=manifest["metadata"]["name"], namespace="default"
            ),
            operation=CreateObject(object=manifest),
        )
        commands.append(
            OutgoingMessage(subject=cmd.subject, message=cmd, msg_id=cmd.idempotency_key)
        )
    started = time.perf_counter()
    await bus.publish_batch(commands)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(done.wait(), 120)
    elapsed = time.perf_counter() - started
    await subscription.unsubscribe()
    await watcher.stop()
    return applied / elapsed, applied


async def bench_commands(bus: Bus) -> None:
    async with ServerProcess() as kubeconfig:
        raw = await raw_creates(kubeconfig)
        through_nats, applied = await command_creates(bus, kubeconfig)
    print(
        f"k8s_watcher pod-create commands/s: {through_nats:,.0f}/s ({applied:,} applied, "
        f"{COMMAND_CONCURRENCY} in flight, also mirroring nodes+pods) vs bare "
        f"kubernetes-asyncio {raw:,.0f}/s ({CONCURRENCY} in flight): ratio "
        f"{through_nats / raw:.2f} (target >= {RATIO_TARGET})",
        flush=True,
    )


async def main() -> None:
    configure_logging("bench", "warning")
    structlog.get_logger("bench").info("bench.start")
    with tempfile.TemporaryDirectory(prefix="bench-k8s-watcher-") as tmp:
        nats = NatsServerProcess(Path(tmp) / "nats")
        await nats.start()
        try:
            bus = await Bus.connect(nats.url)
            await ensure_topology(
                bus.js, streams=STREAMS, kv_buckets=KV_BUCKETS, consumers=CONSUMERS["k8s-watcher"]
            )
            await bench_sync_and_latency(bus)
            await bench_commands(bus)
            await bus.close()
        finally:
            await nats.kill()


if __name__ == "__main__":
    asyncio.run(main())
