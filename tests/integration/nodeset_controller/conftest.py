"""The whole stack in one process: the simulator (Kubernetes API, kubelet, scheduler, Slurm
emulator), real NATS, k8s-watcher, slurm-syncer and nodeset-controller.

`stack` starts everything but the controller's work waits for `await stack.start_controller()`
so a test can also kill and restart it.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from bench._stack import InProcessStack, run_inprocess_stack
from clustersim.cluster.spec import ClusterSpec
from clustersim.runner import Simulator, SimulatorConfig
from nodeflow_bus import Bus
from nodeflow_runtime.natsd import NatsServerProcess
from nodeset_controller.config import NodeSetControllerConfig
from nodeset_controller.service import NodeSetController
from slurm_syncer.client import SlurmClient
from slurm_syncer.syncer import SyncerOptions
from tests.fixtures import stack as shared
from tests.fixtures.stack import ServiceSlot, sleep_job
from tests.fixtures.stack import condition as condition  # re-exported for the tests here

NS = "default"
CLUSTER = "sim"
NODESETS = "nodesets.nodeflow.dev"
SLICES = "nodeslices.nodeflow.dev"
SLURM_DELETE = "SlurmDelete"

FAST_BUS = shared.fast_bus("nodeset-it")


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


def is_ready(pod: dict[str, Any]) -> bool:
    ready = condition(pod, "Ready")
    return ready is not None and ready.get("status") == "True"


@dataclass
class Stack(InProcessStack):
    controllers: ServiceSlot[NodeSetController] = field(init=False)

    def __post_init__(self) -> None:
        self.controllers = ServiceSlot(self.nats_url, FAST_BUS, self._build_controller)

    # --- the controller ----------------------------------------------------------------------

    @property
    def controller(self) -> NodeSetController | None:
        return self.controllers.current

    def _build_controller(
        self, bus: Bus, generation: int, overrides: dict[str, Any]
    ) -> NodeSetController:
        settings: dict[str, Any] = {
            "nats_url": (self.nats_url,),
            "instance_id": f"it-{generation}",
            **shared.CONTROLLER_TIMINGS,
            # A new leader sends no create, claim or release until an earlier leader's
            # commands can no longer land (this plus the landing margin): short lives here.
            "command_lifetime_seconds": 2.0,
            **overrides,
        }
        return NodeSetController(bus, NodeSetControllerConfig(**settings))

    async def start_controller(self, **overrides: Any) -> NodeSetController:
        return await self.controllers.start(overrides)

    async def kill_controller(self) -> None:
        """Stop abruptly: no lease release, the connection just goes away."""
        await self.controllers.kill()

    async def stop_controller(self) -> None:
        await self.controllers.stop()

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
    return await shared.until(predicate, timeout, interval, what)


def simulator_slurm(sim: Simulator) -> dict[str, SlurmClient]:
    """The syncer's clients by default: the simulator's own Slurm emulator."""
    return shared.simulator_slurm(sim, CLUSTER)


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
    async with run_inprocess_stack(
        nats_url,
        config,
        Stack,
        watcher_settings={**shared.WATCHER_SETTINGS, "instance_id": "it-watcher"},
        bus_options=FAST_BUS,
        slurm_clients=slurm_clients,
        syncer_options=SyncerOptions(poll_interval=poll_interval, resend_after=3.0),
        prepare=prepare,
    ) as running:
        try:
            yield running
        finally:
            await running.stop_controller()


@pytest.fixture
async def stack(nats_server: NatsServerProcess) -> AsyncIterator[Stack]:
    async with run_stack(nats_server.url) as running:
        yield running
