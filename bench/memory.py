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
from nodeflow_bus import Bus, BusOptions, ensure_topology
from nodeflow_contracts.topology import KV_BUCKETS, STREAMS
from nodeflow_runtime.launcher import SERVICES
from nodeflow_runtime.logs import configure_logging
from nodeflow_runtime.natsd import NatsServerProcess

NODES = int(os.environ.get("BENCH_MEMORY_NODES", "10000"))
PODS = int(os.environ.get("BENCH_MEMORY_PODS", "50000"))
BUDGET = float(os.environ.get("BENCH_MEMORY_BUDGET", "1200"))
MEMORY_TARGET_MIB = stack.MEMORY_TARGET_MIB
# After the load is in KV: time for every service to read it and act on it.
SETTLE_SECONDS = 20.0
CREATE_IN_FLIGHT = 32


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
    """Create `count` bound pods, spread over `nodes`, CREATE_IN_FLIGHT at a time."""
    assert cluster.session is not None
    session, url = cluster.session, cluster.url + stack.PODS_PATH
    queue: asyncio.Queue[int] = asyncio.Queue()
    for index in range(count):
        queue.put_nowait(index)

    async def worker() -> None:
        while not queue.empty():
            index = queue.get_nowait()
            body = workload_pod(index, nodes[index % len(nodes)])
            async with session.post(url, json=body) as response:
                if response.status != 201:
                    raise RuntimeError(f"create {body['metadata']['name']}: HTTP {response.status}")

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(CREATE_IN_FLIGHT)))
    return time.perf_counter() - started


async def kv_keys(bus: Bus, bucket: str) -> int:
    """Values held by a KV bucket (history 1, nothing deleted in this run: one per key)."""
    info = await bus.js.stream_info(f"KV_{bucket}")
    return int(info.state.messages)


def report_memory(services: stack.Services, when: str) -> None:
    print(f"   {when}:", flush=True)
    for name, _ in services.names:
        now, peak = services.memory_mib(name)
        verdict = "met" if peak < MEMORY_TARGET_MIB else "NOT met"
        print(
            f"     {name:<22} RSS {now:6.1f} MiB, peak {peak:6.1f} MiB "
            f"(ratio {peak / MEMORY_TARGET_MIB:.2f} to the {MEMORY_TARGET_MIB:.0f} MiB target: "
            f"{verdict})",
            flush=True,
        )


async def run(cluster: stack.Cluster, nats_url: str, deadline: stack.Deadline) -> None:
    assert cluster.session is not None
    nodes = await cluster.node_names()
    slurmd_pods = min(NODES, PODS)
    bus = await Bus.connect(nats_url, options=BusOptions(name="bench-memory"))
    await ensure_topology(bus.js, streams=STREAMS, kv_buckets=KV_BUCKETS)
    env = {
        **os.environ,
        **cluster.env,
        "NATS_URL": nats_url,
        "LOG_LEVEL": os.environ.get("BENCH_LOG_LEVEL", "error"),
        "KUBE_QPS": str(stack.KUBE_QPS),
        "KUBE_BURST": str(int(2 * stack.KUBE_QPS)),
    }
    services = stack.Services(cluster.run_dir / "services", env, SERVICES)
    try:
        await services.start(cluster.session)
        await cluster.call(
            "POST",
            stack.NODESETS_PATH,
            {
                "apiVersion": "nodeflow.dev/v1alpha1",
                "kind": "NodeSet",
                "metadata": {"name": stack.NODESET, "namespace": stack.NS},
                "spec": {"replicas": 0, "slurmCluster": stack.CLUSTER, "template": stack.TEMPLATE},
            },
        )
        seconds = await stack.scale(cluster, slurmd_pods, deadline)
        print(f"   NodeSet 0 -> {slurmd_pods:,} slurmd pods Ready in {seconds:.1f} s", flush=True)
        seconds = await create_workload(cluster, nodes, PODS - slurmd_pods)
        print(f"   {PODS - slurmd_pods:,} workload pods created in {seconds:.1f} s", flush=True)

        async def all_pods_in_kv() -> bool:
            return await kv_keys(bus, "k8s_pods") >= PODS

        async def progress() -> str:
            return f"{await kv_keys(bus, 'k8s_pods'):,} of {PODS:,} pods in KV"

        await stack.wait_until(all_pods_in_kv, "every pod in KV", deadline, progress)
        await asyncio.sleep(SETTLE_SECONDS)
        report_memory(services, f"{len(nodes):,} nodes, {PODS:,} pods loaded while running")
        await services.stop()
        services.procs.clear()
        await services.start(cluster.session)
        await asyncio.sleep(SETTLE_SECONDS)
        report_memory(services, "every service restarted on the loaded cluster")
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
