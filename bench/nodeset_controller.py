"""nodeset-controller: scale a NodeSet on a 4,000-node simulated cluster, the whole stack.

NATS, the simulator (Kubernetes API emulator, kubelet, scheduler, Slurm emulator),
k8s-watcher, slurm-syncer and nodeset-controller all run in this process (2 cores shared).
Figures: 0 -> 1,000 and 0 -> 4,000 until every pod is Ready and the status says so, and
1,000 -> 0 and 4,000 -> 0 through safe deletion (SlurmDelete, drain, delete); seconds,
pods per second, and the ratio to the raw pod-create rate of the emulator in the same run
(POST /pods over HTTP, 32 at a time, nothing else). Target: 0 -> 4,000 under 60 s.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

from clustersim.cluster.spec import ClusterSpec
from clustersim.runner import Simulator, SimulatorConfig, run_simulator
from k8s_watcher.config import K8sWatcherConfig
from k8s_watcher.service import K8sWatcher
from nodeflow_bus import Backoff, Bus, BusOptions, ensure_topology
from nodeflow_contracts.topology import CONSUMERS, KV_BUCKETS, STREAMS
from nodeflow_runtime.logs import configure_logging
from nodeflow_runtime.natsd import NatsServerProcess
from nodeset_controller.config import NodeSetControllerConfig
from nodeset_controller.service import NodeSetController
from slurm_syncer.auth import token_source
from slurm_syncer.client import ClientOptions, SlurmClient
from slurm_syncer.settings import ClusterSettings
from slurm_syncer.syncer import Syncer, SyncerOptions

NODES = int(os.environ.get("BENCH_NODESET_NODES", "4000"))
SMALL = min(1000, NODES)
NS = "default"
CLUSTER = "sim"
NODESETS = "nodesets.nodeflow.dev"
RAW_PODS = 1000
TARGET_SECONDS = 60.0
TIMEOUT = 900.0

TEMPLATE: dict[str, Any] = {
    "metadata": {"labels": {"app": "slurmd"}},
    "spec": {
        "terminationGracePeriodSeconds": 0,
        "containers": [
            {"name": "slurmd", "image": "slurmd:24.11", "resources": {"requests": {"cpu": "1"}}}
        ],
    },
}


def ready(pod: dict[str, Any]) -> bool:
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in (pod.get("status") or {}).get("conditions") or []
    )


def nodeset_pods(sim: Simulator) -> list[dict[str, Any]]:
    return [
        p
        for p in sim.store.list("pods", namespace=NS).items
        if (p["metadata"].get("labels") or {}).get("nodeflow.dev/nodeset") == "bench"
    ]


def settled(sim: Simulator, replicas: int) -> bool:
    pods = nodeset_pods(sim)
    if len(pods) != replicas or sum(1 for p in pods if ready(p)) != replicas:
        return False
    status = sim.store.get(NODESETS, "bench", NS).get("status") or {}
    return (
        status.get("currentNumberScheduled") == replicas
        and status.get("numberReady") == replicas
        and status.get("desiredNumberScheduled") == replicas
        and status.get("updatedNumberScheduled") == replicas
    )


async def wait_for(predicate: Any, what: str, interval: float = 0.25, progress: Any = None) -> None:
    deadline = time.monotonic() + TIMEOUT
    next_report = time.monotonic() + 30.0
    while not predicate():
        now = time.monotonic()
        if now > deadline:
            raise TimeoutError(f"{what}: not reached within {TIMEOUT:.0f} s")
        if progress is not None and now > next_report:
            print(f"   ... {what}: {progress()}", flush=True)
            next_report = now + 30.0
        await asyncio.sleep(interval)


def progress_of(sim: Simulator) -> str:
    pods = nodeset_pods(sim)
    status = sim.store.get(NODESETS, "bench", NS).get("status") or {}
    shown = {k: v for k, v in status.items() if k not in ("conditions", "selector")}
    return f"{len(pods)} pods, {sum(1 for p in pods if ready(p))} ready, status {shown}"


async def raw_create_rate(sim: Simulator) -> float:
    """Pods per second the emulator accepts over HTTP with 32 requests in flight."""
    nodes = sim.node_names()
    url = f"{sim.kube_url}/api/v1/namespaces/{NS}/pods"

    def body(index: int) -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": f"raw-{index}", "namespace": NS, "labels": {"bench": "raw"}},
            "spec": {
                "nodeName": nodes[index % len(nodes)],
                "terminationGracePeriodSeconds": 0,
                "containers": [
                    {"name": "c", "image": "pause", "resources": {"requests": {"cpu": "10m"}}}
                ],
            },
        }

    queue: asyncio.Queue[int] = asyncio.Queue()
    for index in range(RAW_PODS):
        queue.put_nowait(index)
    async with aiohttp.ClientSession() as session:

        async def worker() -> None:
            while not queue.empty():
                index = queue.get_nowait()
                async with session.post(url, json=body(index)) as response:
                    if response.status != 201:
                        raise RuntimeError(f"raw create: HTTP {response.status}")

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(32)))
        seconds = time.perf_counter() - started
    for index in range(RAW_PODS):
        sim.store.delete("pods", f"raw-{index}", namespace=NS, grace_period_seconds=0)
    return RAW_PODS / seconds


async def scale(sim: Simulator, replicas: int) -> float:
    started = time.perf_counter()
    sim.store.patch(
        NODESETS,
        "bench",
        {"spec": {"replicas": replicas}},
        "application/merge-patch+json",
        namespace=NS,
    )
    await wait_for(
        lambda: settled(sim, replicas), f"scale to {replicas}", progress=lambda: progress_of(sim)
    )
    return time.perf_counter() - started


def report(label: str, pods: int, seconds: float, raw: float) -> None:
    rate = pods / seconds if seconds > 0 else float("inf")
    print(
        f"   {label:<22} {seconds:7.1f} s  {rate:7.1f} pods/s  {rate / raw:5.2f} x raw create rate",
        flush=True,
    )


async def main() -> None:
    configure_logging("bench-nodeset-controller", os.environ.get("BENCH_LOG_LEVEL", "error"))
    with tempfile.TemporaryDirectory(prefix="bench-nodeset-") as tmp:
        nats = NatsServerProcess(Path(tmp) / "nats")
        await nats.start()
        sim_config = SimulatorConfig(
            cluster=ClusterSpec(nodes=NODES),
            # Blocks of 250 nodes: one third octet each, so 4,000 nodes fit in 10.174.0.0/16.
            topology=f"spines=1,blocks_per_spine={-(-NODES // 250)},nodes_per_block=250",
            kubelet_delay=0.0,
            slurm_clusters=(CLUSTER,),
            slurm_driver_interval=0.5,
            start_admin_server=False,
        )
        try:
            async with run_simulator(sim_config) as sim:
                await run(sim, nats.url)
        finally:
            await nats.kill()


async def run(sim: Simulator, nats_url: str) -> None:
    options = BusOptions(name="bench-nodeset", request_timeout=10.0)
    bus = await Bus.connect(nats_url, options=options)
    await ensure_topology(bus.js, streams=STREAMS, kv_buckets=KV_BUCKETS)
    for service in ("k8s-watcher", "slurm-syncer"):
        await ensure_topology(bus.js, consumers=CONSUMERS[service])
    raw = await raw_create_rate(sim)
    print(
        f"   raw emulator pod create: {raw:.0f} pods/s ({RAW_PODS} pods, 32 in flight)", flush=True
    )
    watcher = await K8sWatcher.connect(
        K8sWatcherConfig(
            nats_url=(nats_url,),
            kubeconfig=str(sim.kubeconfig_path),
            instance_id="bench-watcher",
            kube_qps=20000.0,
            kube_burst=20000,
            command_concurrency=64,
        ),
        bus,
    )
    await watcher.start()
    await watcher.wait_synced()
    settings = ClusterSettings(
        name=CLUSTER, url=sim.slurm_url, user="slurm", jwt_key_file=sim.jwt_key_file
    )
    client = SlurmClient(
        CLUSTER,
        sim.slurm_url,
        token_source(settings, lifespan=3600, margin=60),
        ClientOptions(timeout_seconds=30.0, backoff=Backoff(initial=0.1, maximum=1.0)),
    )
    syncer = Syncer(
        bus, {CLUSTER: client}, SyncerOptions(poll_interval=1.0, max_concurrent_updates=64)
    )
    await syncer.start()
    controller_bus = await Bus.connect(nats_url, options=options)
    controller = NodeSetController(
        controller_bus,
        NodeSetControllerConfig(
            nats_url=(nats_url,), instance_id="bench", debounce_seconds=0.2, resync_seconds=5.0
        ),
    )
    await controller.start()
    await controller.lease.wait_until_leader(timeout=30)
    try:
        sim.store.create(
            NODESETS,
            {
                "apiVersion": "nodeflow.dev/v1alpha1",
                "kind": "NodeSet",
                "metadata": {"name": "bench", "namespace": NS},
                "spec": {"replicas": 0, "slurmCluster": CLUSTER, "template": TEMPLATE},
            },
        )
        await wait_for(lambda: settled(sim, 0), "empty NodeSet status")
        report(f"0 -> {SMALL}", SMALL, await scale(sim, SMALL), raw)
        report(f"{SMALL} -> 0", SMALL, await scale(sim, 0), raw)
        if NODES > SMALL:
            up = await scale(sim, NODES)
            report(f"0 -> {NODES}", NODES, up, raw)
            report(f"{NODES} -> 0", NODES, await scale(sim, 0), raw)
            verdict = "met" if up < TARGET_SECONDS else "NOT met"
            print(f"   target 0 -> {NODES} under {TARGET_SECONDS:.0f} s: {verdict}", flush=True)
        print(
            f"   controller: {controller.stats.plans} plans, {controller.stats.commands} messages, "
            f"outcomes {dict(sorted(controller.stats.outcomes.items()))}",
            flush=True,
        )
    finally:
        await controller.stop()
        await controller_bus.close()
        await syncer.stop()
        await client.close()
        await watcher.stop(grace=2.0)
        await bus.close()
