"""The placement stack in one process: the simulator (Kubernetes API emulator, kubelet,
default scheduler), real NATS, k8s-watcher and topology-placer.

`stack` starts everything but the placer, which a test starts with `await
stack.start_placer()` so it can also kill and restart it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from clustersim.cluster.spec import ClusterSpec, TopologyShape
from clustersim.runner import Simulator, SimulatorConfig, run_simulator
from k8s_watcher.config import K8sWatcherConfig
from k8s_watcher.service import K8sWatcher
from nodeflow_bus import Bus, BusOptions, ensure_topology
from nodeflow_contracts.topology import CONSUMERS, KV_BUCKETS, STREAMS
from nodeflow_runtime.natsd import NatsServerProcess
from topology_placer.config import TopologyPlacerConfig
from topology_placer.service import TopologyPlacer

NS = "default"
PODGROUPS = "podgroups.scheduling.sigs.k8s.io"
TOPOLOGIES = "clusternetworktopologies.scheduling.koordinator.sh"
POD_GROUP_LABEL = "pod-group.scheduling.sigs.k8s.io"
SPINE = "network.topology.nvidia.com/spine"
BLOCK = "network.topology.nvidia.com/block"
# 2 spines x 2 blocks x 2 nodes, 8 GPUs a node.
SHAPE = TopologyShape(spines=2, blocks_per_spine=2, nodes_per_block=2)

FAST_BUS = BusOptions(
    name="placer-it",
    connect_timeout=1.0,
    reconnect_wait=0.1,
    initial_connect_deadline=5.0,
    request_timeout=2.0,
)


def topology_object() -> dict[str, Any]:
    return {
        "apiVersion": "scheduling.koordinator.sh/v1alpha1",
        "kind": "ClusterNetworkTopology",
        "metadata": {"name": "default"},
        "spec": {
            "networkTopologySpec": [
                {"topologyLayer": "SpineLayer", "labelKey": [SPINE]},
                {
                    "topologyLayer": "BlockLayer",
                    "parentTopologyLayer": "SpineLayer",
                    "labelKey": [BLOCK],
                },
                {"topologyLayer": "NodeTopologyLayer", "parentTopologyLayer": "BlockLayer"},
            ]
        },
    }


def pod_group_object(name: str, min_member: int, gather: str | None = None) -> dict[str, Any]:
    annotations = {}
    if gather is not None:
        annotations["gang.scheduling.koordinator.sh/network-topology-spec"] = gather
    return {
        "apiVersion": "scheduling.sigs.k8s.io/v1alpha1",
        "kind": "PodGroup",
        "metadata": {"name": name, "namespace": NS, "annotations": annotations},
        "spec": {"minMember": min_member},
    }


def gang_pod(name: str, group: str, gpus: int, index: int | None = None) -> dict[str, Any]:
    annotations = {}
    if index is not None:
        annotations["gang.scheduling.koordinator.sh/network-topology-index"] = str(index)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": NS,
            "labels": {POD_GROUP_LABEL: group},
            "annotations": annotations,
        },
        "spec": {
            "schedulerName": "nodeflow-placer",
            "restartPolicy": "Always",
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "trainer",
                    "image": "trainer:0.1",
                    "resources": {"requests": {"cpu": "1", "nvidia.com/gpu": str(gpus)}},
                }
            ],
        },
    }


@dataclass
class Stack:
    sim: Simulator
    bus: Bus
    nats_url: str
    watcher: K8sWatcher
    placer: TopologyPlacer | None = None
    placer_buses: list[Bus] = field(default_factory=list)
    generation: int = 0

    async def start_placer(self, **overrides: Any) -> TopologyPlacer:
        self.generation += 1
        settings: dict[str, Any] = {
            "nats_url": (self.nats_url,),
            "instance_id": f"placer-it-{self.generation}",
            "leader_lease_ttl_seconds": 1.5,
            "resync_seconds": 0.5,
            "debounce_seconds": 0.02,
            "in_flight_timeout_seconds": 5.0,
            **overrides,
        }
        bus = await Bus.connect(self.nats_url, options=FAST_BUS)
        self.placer_buses.append(bus)
        placer = TopologyPlacer(bus, TopologyPlacerConfig(**settings))
        await placer.start()
        await placer.lease.wait_until_leader(timeout=10)
        self.placer = placer
        return placer

    async def kill_placer(self) -> None:
        """Stop abruptly: no lease release, the connection just goes away."""
        placer, self.placer = self.placer, None
        assert placer is not None
        if placer._task is not None:
            placer._task.cancel()
        await placer.lease.stop(release=False)
        await self.placer_buses.pop().nc.close()

    async def stop_placer(self) -> None:
        placer, self.placer = self.placer, None
        if placer is not None:
            await placer.stop()
        while self.placer_buses:
            await self.placer_buses.pop().close()

    def pods(self, group: str) -> list[dict[str, Any]]:
        return [
            p
            for p in self.sim.store.list("pods", namespace=NS).items
            if (p["metadata"].get("labels") or {}).get(POD_GROUP_LABEL) == group
        ]

    def node_labels(self, name: str) -> dict[str, str]:
        return dict(self.sim.store.get("nodes", name)["metadata"].get("labels") or {})

    def pod_group(self, name: str) -> dict[str, Any]:
        return self.sim.store.get(PODGROUPS, name, NS)

    def events(self, reason: str) -> list[dict[str, Any]]:
        return [
            e
            for e in self.sim.store.list("events", namespace=NS).items
            if e.get("reason") == reason
        ]


async def eventually(
    predicate: Callable[[], Any], timeout: float = 20.0, interval: float = 0.05, what: str = ""
) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not reached within {timeout}s: {what or predicate}")
        await asyncio.sleep(interval)


@contextlib.asynccontextmanager
async def run_stack(nats_url: str) -> AsyncIterator[Stack]:
    config = SimulatorConfig(
        cluster=ClusterSpec(topology=SHAPE),
        kubelet_delay=0.02,
        slurm_driver_interval=1.0,
        start_admin_server=False,
    )
    async with run_simulator(config) as sim:
        bus = await Bus.connect(nats_url, options=FAST_BUS)
        await ensure_topology(bus.js, streams=STREAMS, kv_buckets=KV_BUCKETS)
        await ensure_topology(bus.js, consumers=CONSUMERS["k8s-watcher"])
        watcher = await K8sWatcher.connect(
            K8sWatcherConfig(
                nats_url=(nats_url,),
                kubeconfig=str(sim.kubeconfig_path),
                instance_id="placer-it-watcher",
                kube_qps=2000.0,
                kube_burst=2000,
                command_concurrency=32,
                command_retry_initial_seconds=0.1,
                command_retry_max_seconds=1.0,
            ),
            bus,
        )
        await watcher.start()
        await watcher.wait_synced()
        running = Stack(sim=sim, bus=bus, nats_url=nats_url, watcher=watcher)
        try:
            yield running
        finally:
            await running.stop_placer()
            await watcher.stop(grace=2.0)
            await bus.close()


@pytest.fixture
async def stack(nats_server: NatsServerProcess) -> AsyncIterator[Stack]:
    async with run_stack(nats_server.url) as running:
        yield running
