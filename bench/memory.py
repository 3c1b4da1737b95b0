"""Every service's resident memory with 10,000 nodes and 50,000 pods loaded (issue #17).

The whole stack runs as it is deployed: the simulator (Kubernetes API emulator, scheduler,
kubelet, Slurm emulator) in a child process, a real nats-server, and the six services as one
process each with their service defaults. The load is what a large GPU cluster holds: a
NodeSet with one slurmd pod on each of the 10,000 nodes (so 10,000 Slurm nodes too) and 40,000
other pods bound to those nodes, all mirrored by k8s-watcher into KV and read by the services
that watch pods. Once k8s-watcher's KV holds every pod and the services had time to catch up,
each service's RSS (now) and peak are printed as a ratio to the 200 MiB target; then every
service is restarted and printed again, because a service restarted on a loaded cluster
reads everything at once and that peak is what its memory limit must allow.

BENCH_MEMORY_NODES and BENCH_MEMORY_PODS change the load (defaults 10000 and 50000);
BENCH_MEMORY_BUDGET is the time budget of the whole run in seconds (default 1200).
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

from bench import nodeset_controller as stack
from bench.k8s_watcher import kv_count
from nodeflow_bus import Bus, BusOptions, ensure_topology
from nodeflow_contracts.topology import KV_BUCKETS, STREAMS
from nodeflow_runtime.launcher import SERVICES
from nodeflow_runtime.logs import configure_logging
from nodeflow_runtime.natsd import NatsServerProcess

NODES = int(os.environ.get("BENCH_MEMORY_NODES", "10000"))
PODS = int(os.environ.get("BENCH_MEMORY_PODS", "50000"))
BUDGET = float(os.environ.get("BENCH_MEMORY_BUDGET", "1200"))
# After the load is in KV: time for every service to read it and act on it.
SETTLE_SECONDS = 20.0


def workload_pod(index: int, node: str) -> dict[str, Any]:
    """A job's pod already bound to `node`: what the cluster runs beside the slurmd pods."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"work-{index:06d}",
            "namespace": stack.NS,
            "labels": {"app": "training", "bench": "memory", "team": f"team-{index % 20}"},
        },
        "spec": {
            "nodeName": node,
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "trainer",
                    "image": "registry.example.com/trainer:1.0",
                    "resources": {"requests": {"cpu": "100m", "memory": "1Gi"}},
                }
            ],
        },
    }


async def create_workload(cluster: stack.Cluster, nodes: list[str], count: int) -> float:
    """Create `count` bound pods spread over `nodes`; the seconds it took."""
    return await stack.post_pods(
        cluster, [workload_pod(index, nodes[index % len(nodes)]) for index in range(count)]
    )


async def run(cluster: stack.Cluster, nats_url: str, deadline: stack.Deadline) -> None:
    assert cluster.session is not None
    nodes = await cluster.node_names()
    slurmd_pods = min(NODES, PODS)
    bus = await Bus.connect(nats_url, options=BusOptions(name="bench-memory"))
    await ensure_topology(bus.js, streams=STREAMS, kv_buckets=KV_BUCKETS)
    env = stack.service_env(cluster, nats_url)
    services = stack.Services(cluster.run_dir / "services", env, SERVICES)
    try:
        await services.start(cluster.session)
        await stack.create_nodeset(cluster)
        seconds = await stack.scale(cluster, slurmd_pods, deadline)
        print(f"   NodeSet 0 -> {slurmd_pods:,} slurmd pods Ready in {seconds:.1f} s", flush=True)
        seconds = await create_workload(cluster, nodes, PODS - slurmd_pods)
        print(f"   {PODS - slurmd_pods:,} workload pods created in {seconds:.1f} s", flush=True)

        async def all_pods_in_kv() -> bool:
            return await kv_count(bus, "Pod") >= PODS

        async def progress() -> str:
            return f"{await kv_count(bus, 'Pod'):,} of {PODS:,} pods in KV"

        await stack.wait_until(all_pods_in_kv, "every pod in KV", deadline, progress)
        await asyncio.sleep(SETTLE_SECONDS)
        print(f"   {len(nodes):,} nodes, {PODS:,} pods loaded while running:", flush=True)
        services.report_memory("     ")
        await services.stop()
        services.procs.clear()
        await services.start(cluster.session)
        await asyncio.sleep(SETTLE_SECONDS)
        print("   every service restarted on the loaded cluster:", flush=True)
        services.report_memory("     ")
    finally:
        await services.stop()
        await bus.close()


async def main() -> None:
    configure_logging("bench-memory", os.environ.get("BENCH_LOG_LEVEL", "error"))
    deadline = stack.Deadline(time.monotonic() + BUDGET)
    with tempfile.TemporaryDirectory(prefix="bench-memory-") as tmp:
        nats = NatsServerProcess(Path(tmp) / "nats")
        await nats.start()
        cluster = stack.Cluster(Path(tmp) / "sim", nodes=NODES)
        try:
            await cluster.start()
            await run(cluster, nats.url, deadline)
        except (stack.OutOfBudget, aiohttp.ClientError, RuntimeError) as exc:
            print(f"   stopped: {exc} (budget {BUDGET:.0f} s)", flush=True)
        finally:
            await cluster.stop()
            await nats.kill()
