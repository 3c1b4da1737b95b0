"""slurm-syncer benchmark with 4,000 Slurm nodes and their 4,000 NodeSet pods.

* time of one poll cycle at steady state (read every node over HTTP, diff, publish, reconcile
  every pod), target well under the 5 s poll interval
* pod patches per poll cycle at steady state, target 0
* latency from a Kubernetes cordon (the node's KV entry turning unschedulable) to the Slurm
  drain being applied, p50 and p99

Real NATS (a nats-server child process) and the Slurm emulator over HTTP. The emulator runs in
this process, so a poll cycle also pays for the emulator rendering 4,000 nodes as JSON. A small
stand-in for k8s-watcher applies the syncer's pod patches to the pods in KV, as the API server
would, so the steady state is reached the way it is in a cluster.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from clustersim.kube.patch import merge_patch, strategic_merge_patch
from clustersim.slurm import ManualClock, run_slurm_emulator
from nodeflow_bus import Bus, BusOptions, OutgoingMessage, ensure_topology
from nodeflow_contracts import codec, subjects
from nodeflow_contracts.k8s import K8sCommand, PatchObject
from nodeflow_contracts.topology import CONSUMERS, KV_BUCKETS, STREAMS
from nodeflow_runtime.natsd import NatsServerProcess
from slurm_syncer.auth import SigningKeyTokens
from slurm_syncer.client import SlurmClient
from slurm_syncer.syncer import Syncer, SyncerOptions

NODES = 4_000
STEADY_POLLS = 5
CORDONS = 100
NAMESPACE = "slurm"
CLUSTER = "bench"
POLL_TARGET_SECONDS = 5.0


def pod(i: int) -> dict[str, Any]:
    return {
        "metadata": {
            "name": f"gpu-{i:05d}",
            "namespace": NAMESPACE,
            "uid": f"uid-{i}",
            "resourceVersion": "1",
            "labels": {"nodeflow.dev/nodeset": "gpu"},
            "annotations": {},
        },
        "spec": {"nodeName": f"node-{i:05d}"},
        "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]},
    }


def node(i: int, unschedulable: bool = False) -> dict[str, Any]:
    return {
        "metadata": {"name": f"node-{i:05d}", "annotations": {}},
        "spec": {"unschedulable": True} if unschedulable else {},
    }


class PodPatcher:
    """Applies the syncer's pod commands to the pods in KV and counts them."""

    def __init__(self, bus: Bus, pods: dict[str, dict[str, Any]]) -> None:
        self.bus = bus
        self.pods = pods
        self.received = 0
        self._task: asyncio.Task[None] | None = None
        self._subscription: Any = None

    async def start(self) -> None:
        self._subscription = await self.bus.js.pull_subscribe(
            subjects.K8S_COMMANDS, durable="bench-watcher", stream="K8S_COMMANDS"
        )
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        with contextlib.suppress(Exception):
            await self._subscription.unsubscribe()

    async def _run(self) -> None:
        while True:
            try:
                msgs = await self._subscription.fetch(batch=512, timeout=0.2)
            except Exception:
                continue
            updates: list[OutgoingMessage] = []
            for msg in msgs:
                command = codec.decode(K8sCommand, msg.data, subject=msg.subject)
                self.received += 1
                operation = command.operation
                assert isinstance(operation, PatchObject)
                key = subjects.object_key(command.target.namespace, command.target.name)
                current = self.pods[key]
                patch = strategic_merge_patch if operation.patch_type == "strategic" else None
                patched = (
                    patch(current, operation.patch)
                    if patch
                    else merge_patch(current, operation.patch)
                )
                meta = patched["metadata"]
                meta["resourceVersion"] = str(int(meta["resourceVersion"]) + 1)
                self.pods[key] = patched
                updates.append(
                    OutgoingMessage(subject=f"$KV.k8s_pods.{key}", message=json.dumps(patched))
                )
                await msg.ack()
            if updates:
                await self.bus.publish_batch(
                    [
                        OutgoingMessage(subject=u.subject, message=u.message.encode())
                        for u in updates
                    ]
                )


async def put_all(bus: Bus, bucket: str, objects: dict[str, dict[str, Any]]) -> None:
    await bus.publish_batch(
        [
            OutgoingMessage(subject=f"$KV.{bucket}.{key}", message=json.dumps(obj).encode())
            for key, obj in objects.items()
        ]
    )


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


async def main() -> None:
    with tempfile.TemporaryDirectory(prefix="bench-slurm-syncer-") as tmp:
        nats = NatsServerProcess(Path(tmp) / "nats")
        await nats.start()
        bus = await Bus.connect(nats.url, options=BusOptions(name="bench", request_timeout=10))
        try:
            await run(bus)
        finally:
            await bus.close()
            await nats.kill()


async def run(bus: Bus) -> None:
    await ensure_topology(
        bus.js, streams=STREAMS, kv_buckets=KV_BUCKETS, consumers=CONSUMERS["slurm-syncer"]
    )
    clock = ManualClock()
    async with run_slurm_emulator(CLUSTER, clock=clock) as slurm:
        for i in range(NODES):
            slurm.emulator.register_node(f"gpu-{i:05d}", cpus=64, real_memory=512_000)
        pods = {subjects.object_key(NAMESPACE, f"gpu-{i:05d}"): pod(i) for i in range(NODES)}
        nodes = {subjects.object_key(None, f"node-{i:05d}"): node(i) for i in range(NODES)}
        await put_all(bus, "k8s_pods", pods)
        await put_all(bus, "k8s_nodes", nodes)
        await put_all(
            bus,
            "k8s_nodesets",
            {f"{NAMESPACE}.gpu": {"metadata": {"name": "gpu"}, "spec": {"slurmCluster": CLUSTER}}},
        )
        patcher = PodPatcher(bus, pods)
        await patcher.start()
        tokens = SigningKeyTokens("slurm", slurm.key_path, clock=clock.now)
        client = SlurmClient(CLUSTER, slurm.url, tokens)
        syncer = Syncer(bus, {CLUSTER: client}, SyncerOptions(poll_interval=3600.0))
        try:
            started = time.perf_counter()
            await syncer.start()
            # The patcher is a stand-in with no event to offer: poll its counter.
            while patcher.received < NODES:  # noqa: ASYNC110
                await asyncio.sleep(0.05)
            first = time.perf_counter() - started
            print(
                f"   first sync of {NODES} nodes (poll + {NODES} pod patches applied): "
                f"{first:.2f} s",
                flush=True,
            )
            await asyncio.sleep(1.0)  # let the patched pods flow back through KV

            durations: list[float] = []
            patches: list[int] = []
            for _ in range(STEADY_POLLS):
                before = patcher.received
                started = time.perf_counter()
                await syncer.poll_once(CLUSTER)
                durations.append(time.perf_counter() - started)
                await asyncio.sleep(0.3)
                patches.append(patcher.received - before)
            print(
                f"   poll cycle at steady state, {NODES} nodes: p50 "
                f"{statistics.median(durations) * 1000:.0f} ms, max {max(durations) * 1000:.0f} ms"
                f" (target < {POLL_TARGET_SECONDS:.0f} s poll interval)",
                flush=True,
            )
            print(
                f"   pod patches per poll cycle at steady state: max {max(patches)} "
                f"over {STEADY_POLLS} cycles (target 0)",
                flush=True,
            )

            latencies: list[float] = []
            for i in range(CORDONS):
                name = f"gpu-{i:05d}"
                started = time.perf_counter()
                await put_all(bus, "k8s_nodes", {f"_.node-{i:05d}": node(i, unschedulable=True)})
                # The emulator's model has no change event: look at it every 0.5 ms.
                while not slurm.cluster.nodes[name].drain:  # noqa: ASYNC110
                    await asyncio.sleep(0.0005)
                latencies.append(time.perf_counter() - started)
            print(
                f"   Kubernetes cordon -> Slurm drain ({CORDONS} cordons, one at a time): "
                f"p50 {percentile(latencies, 0.5) * 1000:.1f} ms, "
                f"p99 {percentile(latencies, 0.99) * 1000:.1f} ms (target p99 < 1 s)",
                flush=True,
            )
        finally:
            await syncer.stop()
            await patcher.stop()
            await client.close()


if __name__ == "__main__":
    asyncio.run(main())
