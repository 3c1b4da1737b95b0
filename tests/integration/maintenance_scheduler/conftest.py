"""The stack for maintenance-scheduler in one process: the simulator (Kubernetes API, kubelet,
scheduler, Slurm emulator), real NATS, k8s-watcher, slurm-syncer and maintenance-scheduler.

`stack.start_scheduler()` starts the service, so a test can also kill and restart it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec
import pytest

from clustersim.cluster.spec import ClusterSpec
from clustersim.runner import Simulator, SimulatorConfig, run_simulator
from clustersim.slurm import JobRequest
from k8s_watcher.config import K8sWatcherConfig
from k8s_watcher.service import K8sWatcher
from maintenance_scheduler.config import MaintenanceSchedulerConfig
from maintenance_scheduler.service import MaintenanceScheduler
from nodeflow_bus import Backoff, Bus, BusOptions, ensure_topology
from nodeflow_contracts.k8s import CommandOutcome
from nodeflow_contracts.maintenance import MaintenanceDecision
from nodeflow_contracts.topology import CONSUMERS, KV_BUCKETS, STREAMS
from nodeflow_runtime.natsd import NatsServerProcess
from slurm_syncer.auth import token_source
from slurm_syncer.client import ClientOptions, SlurmClient
from slurm_syncer.settings import ClusterSettings
from slurm_syncer.syncer import Syncer, SyncerOptions

NS = "default"
CLUSTER = "sim"
NODE_MAINTENANCES = "nodemaintenances.maintenance.nvidia.com"
CONFIGS = "maintenanceoperatorconfigs.maintenance.nvidia.com"
API_VERSION = "maintenance.nvidia.com/v1alpha1"

FAST_BUS = BusOptions(
    name="maintenance-it",
    connect_timeout=1.0,
    reconnect_wait=0.1,
    initial_connect_deadline=5.0,
    request_timeout=2.0,
)


def condition(obj: dict[str, Any], kind: str) -> dict[str, Any] | None:
    for entry in (obj.get("status") or {}).get("conditions") or []:
        if entry.get("type") == kind:
            return dict(entry)
    return None


def phase_of(obj: dict[str, Any] | None) -> str:
    ready = condition(obj or {}, "Ready")
    return str(ready.get("reason") or "") if ready else ""


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


def sleep_job(node: str) -> JobRequest:
    return JobRequest(
        name="work",
        script="#!/bin/bash\nsleep infinity\n",
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


@dataclass
class Stack:
    sim: Simulator
    bus: Bus
    nats_url: str
    watcher: K8sWatcher
    syncer: Syncer
    scheduler: MaintenanceScheduler | None = None
    scheduler_buses: list[Bus] = field(default_factory=list)
    generation: int = 0
    decisions: list[MaintenanceDecision] = field(default_factory=list)
    outcomes: list[CommandOutcome] = field(default_factory=list)

    async def start_scheduler(self, **overrides: Any) -> MaintenanceScheduler:
        self.generation += 1
        settings: dict[str, Any] = {
            "nats_url": (self.nats_url,),
            "instance_id": f"it-{self.generation}",
            "operator_namespace": NS,
            "leader_lease_ttl_seconds": 1.5,
            "resync_seconds": 0.5,
            "debounce_seconds": 0.02,
            "in_flight_timeout_seconds": 5.0,
            "eviction_retry_initial_seconds": 0.2,
            "eviction_retry_max_seconds": 1.0,
            **overrides,
        }
        bus = await Bus.connect(self.nats_url, options=FAST_BUS)
        self.scheduler_buses.append(bus)
        scheduler = MaintenanceScheduler(bus, MaintenanceSchedulerConfig(**settings))
        await scheduler.start()
        await scheduler.lease.wait_until_leader(timeout=10)
        self.scheduler = scheduler
        return scheduler

    async def kill_scheduler(self) -> None:
        """Stop abruptly: no lease release, the connection just goes away."""
        scheduler, self.scheduler = self.scheduler, None
        assert scheduler is not None
        if scheduler._task is not None:
            scheduler._task.cancel()
        await scheduler.lease.stop(release=False)
        await self.scheduler_buses.pop().nc.close()

    async def stop_scheduler(self) -> None:
        scheduler, self.scheduler = self.scheduler, None
        if scheduler is not None:
            await scheduler.stop()
        while self.scheduler_buses:
            await self.scheduler_buses.pop().close()

    # --- the cluster -------------------------------------------------------------------------

    def set_config(self, **spec: Any) -> None:
        body = {
            "apiVersion": API_VERSION,
            "kind": "MaintenanceOperatorConfig",
            "metadata": {"name": "default", "namespace": NS},
            "spec": spec,
        }
        try:
            self.sim.store.get(CONFIGS, "default", NS)
        except Exception:
            self.sim.store.create(CONFIGS, body)
            return
        self.sim.store.patch(
            CONFIGS, "default", {"spec": spec}, "application/merge-patch+json", namespace=NS
        )

    def request(self, name: str, node: str, **spec: Any) -> dict[str, Any]:
        body = {
            "apiVersion": API_VERSION,
            "kind": "NodeMaintenance",
            "metadata": {"name": name, "namespace": NS},
            "spec": {"requestorID": "it.nodeflow.dev", "nodeName": node, **spec},
        }
        return self.sim.store.create(NODE_MAINTENANCES, body)

    def get_request(self, name: str) -> dict[str, Any] | None:
        try:
            return self.sim.store.get(NODE_MAINTENANCES, name, NS)
        except Exception:
            return None

    def phase(self, name: str) -> str:
        return phase_of(self.get_request(name))

    def delete_request(self, name: str) -> None:
        self.sim.store.delete(NODE_MAINTENANCES, name, namespace=NS)

    def node(self, name: str) -> dict[str, Any]:
        return self.sim.store.get("nodes", name)

    def node_names(self) -> list[str]:
        return sorted(n["metadata"]["name"] for n in self.sim.store.list("nodes").items)

    def unschedulable(self, name: str) -> bool:
        return bool(self.node(name).get("spec", {}).get("unschedulable"))

    def cordon(self, name: str) -> None:
        self.sim.store.patch(
            "nodes", name, {"spec": {"unschedulable": True}}, "application/merge-patch+json"
        )

    def run_pod(
        self, name: str, node: str, labels: dict[str, str] | None = None, cpu: str = "100m"
    ) -> dict[str, Any]:
        return self.sim.store.create(
            "pods",
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": name, "namespace": NS, "labels": labels or {}},
                "spec": {
                    "nodeName": node,
                    "terminationGracePeriodSeconds": 0,
                    "containers": [
                        {"name": "c", "image": "x", "resources": {"requests": {"cpu": cpu}}}
                    ],
                },
            },
        )

    def pod(self, name: str) -> dict[str, Any] | None:
        try:
            return self.sim.store.get("pods", name, NS)
        except Exception:
            return None

    def events(self, reason: str) -> list[dict[str, Any]]:
        return [
            e
            for e in self.sim.store.list("events", namespace=NS).items
            if e.get("involvedObject", {}).get("kind") == "NodeMaintenance"
            and e.get("reason") == reason
        ]

    def evictions_applied(self, pod_uid: str) -> list[CommandOutcome]:
        return [
            o
            for o in self.outcomes
            if o.op == "evict" and o.target.uid == pod_uid and o.outcome == "applied"
        ]

    def slurm_node(self, name: str) -> Any:
        return self.sim.slurm[CLUSTER].cluster.nodes.get(name)

    def run_job(self, node: str) -> int:
        return self.sim.slurm[CLUSTER].cluster.submit_job(sleep_job(node), "alice")

    def cancel_job(self, job_id: int) -> None:
        self.sim.slurm[CLUSTER].cluster.cancel_job(job_id, "alice")


def simulator_slurm(sim: Simulator) -> dict[str, SlurmClient]:
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
async def run_stack(nats_url: str, *, nodes: int = 4) -> AsyncIterator[Stack]:
    config = SimulatorConfig(
        cluster=ClusterSpec(nodes=nodes),
        kubelet_delay=0.02,
        slurm_clusters=(CLUSTER,),
        slurm_driver_interval=0.1,
        start_admin_server=False,
    )
    async with run_simulator(config) as sim:
        bus = await Bus.connect(nats_url, options=FAST_BUS)
        await ensure_topology(bus.js, streams=STREAMS, kv_buckets=KV_BUCKETS)
        for service in ("k8s-watcher", "slurm-syncer"):
            await ensure_topology(bus.js, consumers=CONSUMERS[service])
        watcher = await K8sWatcher.connect(
            K8sWatcherConfig(
                nats_url=(nats_url,),
                kubeconfig=str(sim.kubeconfig_path),
                instance_id="it-watcher",
                kube_qps=2000.0,
                kube_burst=2000,
                command_concurrency=32,
                command_retry_initial_seconds=0.1,
                command_retry_max_seconds=0.5,
            ),
            bus,
        )
        await watcher.start()
        await watcher.wait_synced()
        clients = simulator_slurm(sim)
        syncer = Syncer(bus, clients, SyncerOptions(poll_interval=0.2, resend_after=3.0))
        await syncer.start()
        running = Stack(sim=sim, bus=bus, nats_url=nats_url, watcher=watcher, syncer=syncer)

        async def on_decision(msg: Any) -> None:
            running.decisions.append(msgspec.json.decode(msg.data, type=MaintenanceDecision))

        async def on_outcome(msg: Any) -> None:
            outcome = msgspec.json.decode(msg.data, type=CommandOutcome)
            if outcome.sender == "maintenance-scheduler":
                running.outcomes.append(outcome)

        subscriptions = [
            await bus.nc.subscribe("maintenance.v1.*.*.decision", cb=on_decision),
            await bus.nc.subscribe("outcome.k8s.v1.>", cb=on_outcome),
        ]
        try:
            yield running
        finally:
            for subscription in subscriptions:
                with contextlib.suppress(Exception):
                    await subscription.unsubscribe()
            await running.stop_scheduler()
            await syncer.stop()
            for client in clients.values():
                await client.close()
            await watcher.stop(grace=2.0)
            await bus.close()


@pytest.fixture
async def stack(nats_server: NatsServerProcess) -> AsyncIterator[Stack]:
    async with run_stack(nats_server.url) as running:
        yield running
