"""The stack for maintenance-scheduler in one process: the simulator (Kubernetes API, kubelet,
scheduler, Slurm emulator), real NATS, k8s-watcher, slurm-syncer and maintenance-scheduler.

`stack.start_scheduler()` starts the service, so a test can also kill and restart it.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec
import pytest

from bench._stack import InProcessStack, run_inprocess_stack
from clustersim.cluster.spec import ClusterSpec
from clustersim.runner import Simulator, SimulatorConfig
from maintenance_scheduler.config import MaintenanceSchedulerConfig
from maintenance_scheduler.service import MaintenanceScheduler
from nodeflow_bus import Bus
from nodeflow_contracts.k8s import CommandOutcome
from nodeflow_contracts.maintenance import MaintenanceDecision
from nodeflow_contracts.subjects import MAINTENANCE_DECISIONS
from nodeflow_runtime.natsd import NatsServerProcess
from slurm_syncer.client import SlurmClient
from slurm_syncer.syncer import SyncerOptions
from tests.fixtures import stack as shared
from tests.fixtures.stack import ServiceSlot, sleep_job
from tests.fixtures.stack import condition as condition  # re-exported for the tests here

NS = "default"
CLUSTER = "sim"
NODE_MAINTENANCES = "nodemaintenances.maintenance.nvidia.com"
CONFIGS = "maintenanceoperatorconfigs.maintenance.nvidia.com"
API_VERSION = "maintenance.nvidia.com/v1alpha1"

FAST_BUS = shared.fast_bus("maintenance-it")


def phase_of(obj: dict[str, Any] | None) -> str:
    ready = condition(obj or {}, "Ready")
    return str(ready.get("reason") or "") if ready else ""


async def eventually(
    predicate: Callable[[], Any], timeout: float = 20.0, interval: float = 0.05, what: str = ""
) -> Any:
    return await shared.until(predicate, timeout, interval, what)


@dataclass
class Stack(InProcessStack):
    decisions: list[MaintenanceDecision] = field(default_factory=list)
    outcomes: list[CommandOutcome] = field(default_factory=list)
    schedulers: ServiceSlot[MaintenanceScheduler] = field(init=False)

    def __post_init__(self) -> None:
        self.schedulers = ServiceSlot(self.nats_url, FAST_BUS, self._build_scheduler)

    @property
    def scheduler(self) -> MaintenanceScheduler | None:
        return self.schedulers.current

    def _build_scheduler(
        self, bus: Bus, generation: int, overrides: dict[str, Any]
    ) -> MaintenanceScheduler:
        settings: dict[str, Any] = {
            "nats_url": (self.nats_url,),
            "instance_id": f"it-{generation}",
            "operator_namespace": NS,
            **shared.CONTROLLER_TIMINGS,
            "eviction_retry_initial_seconds": 0.2,
            "eviction_retry_max_seconds": 1.0,
            **overrides,
        }
        return MaintenanceScheduler(bus, MaintenanceSchedulerConfig(**settings))

    async def start_scheduler(self, **overrides: Any) -> MaintenanceScheduler:
        return await self.schedulers.start(overrides)

    async def kill_scheduler(self) -> None:
        """Stop abruptly: no lease release, the connection just goes away."""
        await self.schedulers.kill()

    async def stop_scheduler(self) -> None:
        await self.schedulers.stop()

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
    return shared.simulator_slurm(sim, CLUSTER)


@contextlib.asynccontextmanager
async def run_stack(
    nats_url: str, *, nodes: int = 4, watcher_settings: dict[str, Any] | None = None
) -> AsyncIterator[Stack]:
    """`watcher_settings`: k8s-watcher settings beside the shared ones (a LABEL_SELECTORS)."""
    config = SimulatorConfig(
        cluster=ClusterSpec(nodes=nodes),
        kubelet_delay=0.02,
        slurm_clusters=(CLUSTER,),
        slurm_driver_interval=0.1,
        start_admin_server=False,
    )
    async with run_inprocess_stack(
        nats_url,
        config,
        Stack,
        watcher_settings={
            **shared.WATCHER_SETTINGS,
            "instance_id": "it-watcher",
            "command_retry_max_seconds": 0.5,
            # The Skyhook tests put the controller's objects in NS (its SKYHOOK_NAMESPACE).
            "skyhook_namespace": NS,
            **(watcher_settings or {}),
        },
        bus_options=FAST_BUS,
        slurm_clients=simulator_slurm,
        syncer_options=SyncerOptions(poll_interval=0.2, resend_after=3.0),
    ) as running:

        async def on_decision(msg: Any) -> None:
            running.decisions.append(msgspec.json.decode(msg.data, type=MaintenanceDecision))

        async def on_outcome(msg: Any) -> None:
            outcome = msgspec.json.decode(msg.data, type=CommandOutcome)
            if outcome.sender == "maintenance-scheduler":
                running.outcomes.append(outcome)

        subscriptions = [
            await running.bus.nc.subscribe(MAINTENANCE_DECISIONS, cb=on_decision),
            await running.bus.nc.subscribe("outcome.k8s.v1.>", cb=on_outcome),
        ]
        try:
            yield running
        finally:
            for subscription in subscriptions:
                with contextlib.suppress(Exception):
                    await subscription.unsubscribe()
            await running.stop_scheduler()


@pytest.fixture
async def stack(nats_server: NatsServerProcess) -> AsyncIterator[Stack]:
    async with run_stack(nats_server.url) as running:
        yield running
