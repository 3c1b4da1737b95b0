"""Event -> action latencies of the NodeSet pipeline on the whole stack, as a user sees them.

The simulator (its own process), a real nats-server, and k8s-watcher, slurm-syncer and
nodeset-controller as one process each with their service defaults (slurm-syncer polls every
`SLURM_POLL_INTERVAL_SECONDS`, 5 s), on BENCH_LATENCY_NODES nodes (default 40, one sample per
node). The NodeSet's pods keep Kubernetes' default 30 s termination grace, as a user's do. Each
figure is p50 and p99 over its samples, and the ratio of p50 (or p99) to its target:

* Slurm job ends -> its pod, pending deletion, is deleted. Target: p50 under one Slurm poll
  interval + 2 s (the syncer must see the job end, the controller delete, the kubelet stop).
* Kubernetes node cordoned -> its Slurm node DRAIN. Target: p50 under one poll interval + 2 s.
* replicas lowered -> the first SlurmDelete condition. Target: p99 under 1 s.
* NodeSet created -> its first pod created. Target: p99 under 1 s.

Times are read by polling the APIs every 20 ms, so each sample carries up to that much error.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from bench import nodeset_controller as stack
from clustersim.chaos import Slurm
from nodeflow_bus import Bus, BusOptions, ensure_topology
from nodeflow_contracts.pod_protocol import SLURM_DELETE_CONDITION
from nodeflow_contracts.topology import KV_BUCKETS, STREAMS
from nodeflow_runtime.logs import configure_logging
from nodeflow_runtime.natsd import NatsServerProcess
from slurm_syncer.settings import SlurmSyncerConfig

SAMPLES = int(os.environ.get("BENCH_LATENCY_NODES", "40"))
NS = stack.NS
NODESET = "latency"
NODESETS_PATH = stack.NODESETS_PATH
PODS_PATH = stack.PODS_PATH
TICK = 0.02
# A user's pod: Kubernetes' default grace (slurmd exits on SIGTERM well before it ends).
TEMPLATE: dict[str, Any] = {
    "metadata": {"labels": {"app": "slurmd"}},
    "spec": {
        "containers": [
            {"name": "slurmd", "image": "slurmd:24.11", "resources": {"requests": {"cpu": "1"}}}
        ]
    },
}


def has_condition(pod: dict[str, Any], kind: str) -> bool:
    return any(
        c.get("type") == kind and c.get("status") == "True"
        for c in (pod.get("status") or {}).get("conditions") or []
    )


async def poll(check: Callable[[], Awaitable[bool]], what: str, timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: not within {timeout:.0f} s")
        await asyncio.sleep(TICK)


def report(label: str, samples: list[float], target: float, which: str) -> None:
    ordered = sorted(samples)
    p50 = statistics.median(ordered)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    judged = p50 if which == "p50" else p99
    verdict = "met" if judged < target else "NOT met"
    print(
        f"   {label}: p50 {p50:.2f} s, p99 {p99:.2f} s over {len(ordered)} samples; "
        f"{which} {judged / target:.2f} x the {target:.1f} s target ({verdict})",
        flush=True,
    )


async def set_replicas(cluster: stack.Cluster, name: str, replicas: int) -> None:
    await cluster.call(
        "PATCH",
        f"{NODESETS_PATH}/{name}",
        {"spec": {"replicas": replicas}},
        content_type="application/merge-patch+json",
    )


async def nodeset_pods(cluster: stack.Cluster, name: str) -> list[dict[str, Any]]:
    return await cluster.pods(f"nodeflow.dev/nodeset={name}")


async def settle_ready(cluster: stack.Cluster, slurm: Slurm, name: str, count: int) -> list[str]:
    """Wait until `count` pods are Ready and their Slurm nodes registered and idle."""

    async def ready() -> bool:
        pods = await nodeset_pods(cluster, name)
        if len(pods) != count or not all(stack.ready(p) for p in pods):
            return False
        states = await slurm.nodes()
        return all(
            p["metadata"]["name"] in states
            and "IDLE" in states[p["metadata"]["name"]]
            and "DRAIN" not in states[p["metadata"]["name"]]
            for p in pods
        )

    await poll(ready, f"{count} pods Ready and idle in Slurm")
    return sorted(p["metadata"]["name"] for p in await nodeset_pods(cluster, name))


async def job_end_to_pod_deleted(cluster: stack.Cluster, slurm: Slurm) -> list[float]:
    names = await settle_ready(cluster, slurm, NODESET, SAMPLES)
    jobs = {name: await slurm.run_job(name) for name in names}

    async def all_busy() -> bool:
        states = await slurm.nodes()
        return all("ALLOCATED" in states.get(name, []) for name in names)

    await poll(all_busy, "every node running its job")
    await set_replicas(cluster, NODESET, 0)

    async def all_draining() -> bool:
        states = await slurm.nodes()
        return all("DRAIN" in states.get(name, []) for name in names)

    await poll(all_draining, "every busy node draining")
    ended: dict[str, float] = {}
    gone: dict[str, float] = {}

    async def watch() -> None:
        while len(gone) < len(names):
            present = {p["metadata"]["name"] for p in await nodeset_pods(cluster, NODESET)}
            now = time.monotonic()
            for name in ended:
                if name not in present and name not in gone:
                    gone[name] = now
            await asyncio.sleep(TICK)

    watcher = asyncio.create_task(watch())
    try:
        for name in names:  # staggered, so that each end lands at a different point of a poll
            await slurm.end_job(jobs[name])
            ended[name] = time.monotonic()
            await asyncio.sleep(0.25)
        await asyncio.wait_for(watcher, 300)
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
    return [gone[name] - ended[name] for name in names]


async def cordon_to_drain(cluster: stack.Cluster, slurm: Slurm) -> list[float]:
    await set_replicas(cluster, NODESET, SAMPLES)
    names = await settle_ready(cluster, slurm, NODESET, SAMPLES)
    pods = {p["metadata"]["name"]: p for p in await nodeset_pods(cluster, NODESET)}
    nodes = {name: pods[name]["spec"]["nodeName"] for name in names}
    cordoned: dict[str, float] = {}
    drained: dict[str, float] = {}

    async def watch() -> None:
        while len(drained) < len(names):
            states = await slurm.nodes()
            now = time.monotonic()
            for name in cordoned:
                if name not in drained and "DRAIN" in states.get(name, []):
                    drained[name] = now
            await asyncio.sleep(TICK)

    watcher = asyncio.create_task(watch())
    try:
        for name in names:
            await cluster.call(
                "PATCH",
                f"/api/v1/nodes/{nodes[name]}",
                {"spec": {"unschedulable": True}},
                content_type="application/merge-patch+json",
            )
            cordoned[name] = time.monotonic()
            await asyncio.sleep(0.25)
        await asyncio.wait_for(watcher, 300)
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
    for name in names:
        await cluster.call(
            "PATCH",
            f"/api/v1/nodes/{nodes[name]}",
            {"spec": {"unschedulable": False}},
            content_type="application/merge-patch+json",
        )
    return [drained[name] - cordoned[name] for name in names]


async def scale_to_first_slurm_delete(cluster: stack.Cluster, slurm: Slurm) -> list[float]:
    names = await settle_ready(cluster, slurm, NODESET, SAMPLES)
    samples: list[float] = []
    for replicas in range(len(names) - 1, max(-1, len(names) - 21), -1):
        marked_before = {
            p["metadata"]["name"]
            for p in await nodeset_pods(cluster, NODESET)
            if has_condition(p, SLURM_DELETE_CONDITION)
        }
        await set_replicas(cluster, NODESET, replicas)
        started = time.monotonic()

        async def newly_marked(before: set[str] = marked_before) -> bool:
            return any(
                has_condition(p, SLURM_DELETE_CONDITION) and p["metadata"]["name"] not in before
                for p in await nodeset_pods(cluster, NODESET)
            )

        await poll(newly_marked, f"a SlurmDelete after scaling to {replicas}")
        samples.append(time.monotonic() - started)
    return samples


async def create_to_first_pod(cluster: stack.Cluster) -> list[float]:
    samples: list[float] = []
    for index in range(20):
        name = f"probe-{index}"
        started = time.monotonic()
        await stack.create_nodeset(cluster, name, 1, TEMPLATE, podNamePrefix=f"p{index}")

        async def created(name: str = name) -> bool:
            return bool(await nodeset_pods(cluster, name))

        await poll(created, f"the first pod of NodeSet {name}")
        samples.append(time.monotonic() - started)
        await cluster.call("DELETE", f"{NODESETS_PATH}/{name}")
    return samples


async def main() -> None:
    configure_logging("bench-nodeset-latency", os.environ.get("BENCH_LOG_LEVEL", "error"))
    stack.NODES = SAMPLES + 2  # a free node or two for the NodeSet-created probes
    poll_interval = SlurmSyncerConfig().slurm_poll_interval_seconds
    with tempfile.TemporaryDirectory(prefix="bench-latency-") as tmp:
        nats = NatsServerProcess(Path(tmp) / "nats")
        await nats.start()
        cluster = stack.Cluster(Path(tmp) / "sim")
        services: stack.Services | None = None
        try:
            await cluster.start()
            bus = await Bus.connect(nats.url, options=BusOptions(name="bench-latency"))
            await ensure_topology(bus.js, streams=STREAMS, kv_buckets=KV_BUCKETS)
            await bus.close()
            env = stack.service_env(cluster, nats.url, raise_kube_qps=False)
            services = stack.Services(cluster.run_dir / "services", env)
            assert cluster.session is not None
            await services.start(cluster.session)
            slurm = Slurm(cluster.session, cluster.env, stack.CLUSTER)
            print(
                f"   {SAMPLES} NodeSet pods; slurm-syncer polls every {poll_interval:g} s "
                "(service defaults throughout)",
                flush=True,
            )
            await stack.create_nodeset(cluster, NODESET, SAMPLES, TEMPLATE)
            report(
                "Slurm job end -> pod deleted",
                await job_end_to_pod_deleted(cluster, slurm),
                poll_interval + 2.0,
                "p50",
            )
            report(
                "node cordon -> Slurm DRAIN",
                await cordon_to_drain(cluster, slurm),
                poll_interval + 2.0,
                "p50",
            )
            report(
                "replicas lowered -> first SlurmDelete",
                await scale_to_first_slurm_delete(cluster, slurm),
                1.0,
                "p99",
            )
            await set_replicas(cluster, NODESET, 0)

            async def emptied() -> bool:
                return not await nodeset_pods(cluster, NODESET)

            await poll(emptied, "the NodeSet emptied")
            report("NodeSet created -> first pod", await create_to_first_pod(cluster), 1.0, "p99")
        finally:
            if services is not None:
                await services.stop()
            await cluster.stop()
            await nats.kill()
