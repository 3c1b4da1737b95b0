"""The placement stack in one process: the simulator (Kubernetes API emulator, kubelet,
default scheduler), real NATS, k8s-watcher and topology-placer.

`stack` starts everything but the placer, which a test starts with `await
stack.start_placer()` so it can also kill and restart it.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from bench._stack import InProcessStack, run_inprocess_stack
from clustersim.cluster.spec import ClusterSpec, TopologyShape
from clustersim.runner import SimulatorConfig
from nodeflow_bus import Bus
from nodeflow_runtime.natsd import NatsServerProcess
from tests.fixtures import stack as shared
from tests.fixtures.stack import ServiceSlot
from topology_placer.commands import COMMAND_LIFETIME_SECONDS
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

FAST_BUS = shared.fast_bus("placer-it")


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
                    "resources": {
                        "requests": {"cpu": "1", "nvidia.com/gpu": str(gpus)},
                        "limits": {"nvidia.com/gpu": str(gpus)},
                    },
                }
            ],
        },
    }


@dataclass
class Stack(InProcessStack):
    placers: ServiceSlot[TopologyPlacer] = field(init=False)

    def __post_init__(self) -> None:
        self.placers = ServiceSlot(self.nats_url, FAST_BUS, self._build_placer)

    @property
    def placer(self) -> TopologyPlacer | None:
        return self.placers.current

    def _build_placer(self, bus: Bus, generation: int, overrides: dict[str, Any]) -> TopologyPlacer:
        settings: dict[str, Any] = {
            "nats_url": (self.nats_url,),
            "instance_id": f"placer-it-{generation}",
            **shared.CONTROLLER_TIMINGS,
            # The placer refuses a hold shorter than its commands' life (config.py).
            "in_flight_timeout_seconds": COMMAND_LIFETIME_SECONDS,
            **overrides,
        }
        return TopologyPlacer(bus, TopologyPlacerConfig(**settings))

    async def start_placer(self, **overrides: Any) -> TopologyPlacer:
        return await self.placers.start(overrides)

    async def kill_placer(self) -> None:
        """Stop abruptly: no lease release, the connection just goes away."""
        await self.placers.kill()

    async def stop_placer(self) -> None:
        await self.placers.stop()

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
    return await shared.until(predicate, timeout, interval, what)


@contextlib.asynccontextmanager
async def run_stack(nats_url: str) -> AsyncIterator[Stack]:
    config = SimulatorConfig(
        cluster=ClusterSpec(topology=SHAPE),
        kubelet_delay=0.02,
        slurm_driver_interval=1.0,
        start_admin_server=False,
    )
    async with run_inprocess_stack(
        nats_url,
        config,
        Stack,
        watcher_settings={**shared.WATCHER_SETTINGS, "instance_id": "placer-it-watcher"},
        bus_options=FAST_BUS,
    ) as running:
        try:
            yield running
        finally:
            await running.stop_placer()


@pytest.fixture
async def stack(nats_server: NatsServerProcess) -> AsyncIterator[Stack]:
    async with run_stack(nats_server.url) as running:
        yield running
