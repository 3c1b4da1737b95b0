"""The whole stack in one process: the simulator (Kubernetes API, kubelet, scheduler, Slurm
emulator), real NATS, k8s-watcher, slurm-syncer and nodeset-controller.

`stack` starts everything but the controller's work waits for `await stack.start_controller()`
so a test can also kill and restart it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from clustersim.cluster.spec import ClusterSpec
from clustersim.runner import Simulator, SimulatorConfig, run_simulator
from clustersim.slurm import JobRequest
from k8s_watcher.config import K8sWatcherConfig
from k8s_watcher.service import K8sWatcher
from nodeflow_bus import Backoff, Bus, BusOptions, ensure_topology
from nodeflow_contracts.topology import (
    CONSUMERS,
    KV_BUCKETS,
    STREAMS,
)
from nodeflow_runtime.natsd import NatsServerProcess
from nodeset_controller.config import NodeSetControllerConfig
from nodeset_controller.service import NodeSetController
from slurm_syncer.auth import token_source
from slurm_syncer.client import ClientOptions, SlurmClient
from slurm_syncer.settings import ClusterSettings
from slurm_syncer.syncer import Syncer, SyncerOptions

NS = "default"
CLUSTER = "sim"
NODESETS = "nodesets.nodeflow.dev"
SLICES = "nodeslices.nodeflow.dev"
SLURM_DELETE = "SlurmDelete"

FAST_BUS = BusOptions(
    name="nodeset-it",
    connect_timeout=1.0,
    reconnect_wait=0.1,
    initial_connect_deadline=5.0,
    request_timeout=2.0,
)


def template(env: str = "v1", cpu: str = "1") -> dict[str, Any]:
    return {
        "metadata": {"labels": {"app": "slurmd"}},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "slurmd",
                    "image": "slurmd:24.11",
                    "env": [{"name": "VERSION", "value": env}],
                    "resources": {"requests": {"cpu": cpu}},
                }
            ],
        },
    }


def nodeset_object(name: str, replicas: int | None, **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"slurmCluster": CLUSTER, "template": template(), **spec}
    if replicas is not None:
        body["replicas"] = replicas
    return {
        "apiVersion": "nodeflow.dev/v1alpha1",
        "kind": "NodeSet",
        "metadata": {"name": name, "namespace": NS},
        "spec": body,
    }


def sleep_job(node: str, seconds: str = "infinity") -> JobRequest:
    return JobRequest(
        name="work",
        script=f"#!/bin/bash\nsleep {seconds}\n",
        partition=None,
        current_working_directory="/tmp",
        environment=("PATH=/bin",),
        time_limit_minutes=None,
        time_limit_infinite=True,
        required_nodes=(node,),
        minimum_nodes=1,
        cpus_per_node=1,
        exclusive=False,
    )


def condition(obj: dict[str, Any], kind: str) -> dict[str, Any] | None:
    for entry in (obj.get("status") or {}).get("conditions") or []:
        if entry.get("type") == kind:
            return dict(entry)
    return None


def is_ready(pod: dict[str, Any]) -> bool:
    ready = condition(pod, "Ready")
    return ready is not None and ready.get("status") == "True"


@dataclass
class Stack:
    sim: Simulator
    bus: Bus
    nats_url: str
    watcher: K8sWatcher
    syncer: Syncer
    controller: NodeSetController | None = None
    controller_buses: list[Bus] = field(default_factory=list)
    generation: int = 0

    # --- the controller ----------------------------------------------------------------------

    async def start_controller(self, **overrides: Any) -> NodeSetController:
        self.generation += 1
        settings: dict[str, Any] = {
            "nats_url": (self.nats_url,),
            "instance_id": f"it-{self.generation}",
            "leader_lease_ttl_seconds": 1.5,
            "resync_seconds": 0.5,
            "debounce_seconds": 0.02,
            "in_flight_timeout_seconds": 5.0,
            **overrides,
        }
        config = NodeSetControllerConfig(**settings)
        bus = await Bus.connect(self.nats_url, options=FAST_BUS)
        self.controller_buses.append(bus)
        controller = NodeSetController(bus, config)
        await controller.start()
        await controller.lease.wait_until_leader(timeout=10)
        self.controller = controller
        return controller

    async def kill_controller(self) -> None:
        """Stop abruptly: no lease release, the connection just goes away."""
        controller, self.controller = self.controller, None
        assert controller is not None
        if controller._task is not None:
            controller._task.cancel()
        await controller.lease.stop(release=False)
        bus = self.controller_buses.pop()
        await bus.nc.close()

    async def stop_controller(self) -> None:
        controller, self.controller = self.controller, None
        if controller is not None:
            await controller.stop()
        while self.controller_buses:
            await self.controller_buses.pop().close()

    # --- the cluster -------------------------------------------------------------------------

    def create_nodeset(self, name: str, replicas: int | None, **spec: Any) -> dict[str, Any]:
        return self.sim.store.create(NODESETS, nodeset_object(name, replicas, **spec))

    def patch_nodeset(self, name: str, spec: dict[str, Any]) -> dict[str, Any]:
        return self.sim.store.patch(
            NODESETS, name, {"spec": spec}, "application/merge-patch+json", namespace=NS
        )

    def nodeset(self, name: str) -> dict[str, Any]:
        return self.sim.store.get(NODESETS, name, NS)

    def status(self, name: str) -> dict[str, Any]:
        return dict(self.nodeset(name).get("status") or {})

    def pods(self, nodeset: str) -> list[dict[str, Any]]:
        return [
            p
            for p in self.sim.store.list("pods", namespace=NS).items
            if (p["metadata"].get("labels") or {}).get("nodeflow.dev/nodeset") == nodeset
        ]

    def ready_pods(self, nodeset: str) -> list[dict[str, Any]]:
        return [p for p in self.pods(nodeset) if is_ready(p)]

    def live_pods(self, nodeset: str) -> list[dict[str, Any]]:
        return [p for p in self.pods(nodeset) if not p["metadata"].get("deletionTimestamp")]

    def slice_nodes(self, nodeset: str) -> list[str]:
        found: list[str] = []
        for obj in self.sim.store.list(SLICES, namespace=NS).items:
            if obj["spec"].get("nodeSetName") == nodeset:
                found.extend(obj["spec"].get("nodes") or [])
        return sorted(found)

    def claims(self) -> dict[str, str]:
        return {
            n["metadata"]["name"]: n["metadata"].get("annotations", {}).get("nodeflow.dev/nodeset")
            for n in self.sim.store.list("nodes").items
            if (n["metadata"].get("annotations") or {}).get("nodeflow.dev/nodeset")
        }

    def events(self, reason: str | None = None) -> list[dict[str, Any]]:
        return [
            e
            for e in self.sim.store.list("events", namespace=NS).items
            if e.get("involvedObject", {}).get("kind") == "NodeSet"
            and (reason is None or e.get("reason") == reason)
        ]

    def slurm_node(self, name: str) -> Any:
        return self.sim.slurm[CLUSTER].cluster.nodes.get(name)

    def run_job(self, node: str, seconds: str = "infinity") -> int:
        return self.sim.slurm[CLUSTER].cluster.submit_job(sleep_job(node, seconds), "alice")


async def eventually(
    predicate: Callable[[], Any], timeout: float = 15.0, interval: float = 0.05, what: str = ""
) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not reached within {timeout}s: {what or predicate}")
        await asyncio.sleep(interval)


def simulator_slurm(sim: Simulator) -> dict[str, SlurmClient]:
    """The syncer's clients by default: the simulator's own Slurm emulator."""
    settings = ClusterSettings(
        name=CLUSTER, url=sim.slurm_url, user="slurm", jwt_key_file=sim.jwt_key_file
    )
    client = SlurmClient(
        CLUSTER,
        sim.slurm_url,
        token_source(settings, lifespan=3600, margin=60),
        ClientOptions(timeout_seconds=5.0, attempts=2, backoff=Backoff(initial=0.05, maximum=0.2)),
    )
    return {CLUSTER: client}


@contextlib.asynccontextmanager
async def run_stack(
    nats_url: str,
    *,
    nodes: int = 4,
    slurm_clients: Callable[[Simulator], dict[str, SlurmClient]] = simulator_slurm,
    prepare: Callable[[Simulator], None] | None = None,
    poll_interval: float = 0.2,
) -> AsyncIterator[Stack]:
    """The stack on `nodes` Kubernetes nodes. `slurm_clients` chooses the Slurm clusters the
    syncer polls; `prepare` edits the simulated cluster before k8s-watcher first lists it."""
    config = SimulatorConfig(
        cluster=ClusterSpec(nodes=nodes),
        kubelet_delay=0.02,
        slurm_clusters=(CLUSTER,),
        slurm_driver_interval=0.1,
        start_admin_server=False,
    )
    async with run_simulator(config) as sim:
        if prepare is not None:
            prepare(sim)
        bus = await Bus.connect(nats_url, options=FAST_BUS)
        await ensure_topology(bus.js, streams=STREAMS, kv_buckets=KV_BUCKETS)
        for service in ("k8s-watcher", "slurm-syncer"):
            await ensure_topology(bus.js, consumers=CONSUMERS[service])
        watcher_config = K8sWatcherConfig(
            nats_url=(nats_url,),
            kubeconfig=str(sim.kubeconfig_path),
            instance_id="it-watcher",
            kube_qps=2000.0,
            kube_burst=2000,
            command_concurrency=32,
            command_retry_initial_seconds=0.1,
            command_retry_max_seconds=1.0,
        )
        watcher = await K8sWatcher.connect(watcher_config, bus)
        await watcher.start()
        await watcher.wait_synced()
        clients = slurm_clients(sim)
        syncer = Syncer(bus, clients, SyncerOptions(poll_interval=poll_interval, resend_after=3.0))
        await syncer.start()
        running = Stack(sim=sim, bus=bus, nats_url=nats_url, watcher=watcher, syncer=syncer)
        try:
            yield running
        finally:
            await running.stop_controller()
            await syncer.stop()
            for client in clients.values():
                await client.close()
            await watcher.stop(grace=2.0)
            await bus.close()


@pytest.fixture
async def stack(nats_server: NatsServerProcess) -> AsyncIterator[Stack]:
    async with run_stack(nats_server.url) as running:
        yield running
