"""clustersim.bridge over HTTP against the Kubernetes API emulator (the real API server's
part is tests/realkube/test_slurm_bridge.py): the Slurm node of a Ready NodeSet pod registers,
a deleted pod's is lost, also when it went while the bridge's watch was expired (found on the
relist), and pods without the NodeSet label register nothing."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from clustersim.bridge import RunningBridge, run_slurm_bridge
from clustersim.kube.errors import Gone
from clustersim.runner import Simulator, SimulatorConfig, run_simulator
from tests.fixtures.waiting import eventually

NS = "default"


def pod(name: str, **labels: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "slurmd",
                    "image": "slurmd:24.11",
                    "resources": {"requests": {"cpu": "16", "memory": "64Gi"}},
                }
            ],
        },
    }


@pytest.fixture
async def sim(tmp_path: Path) -> AsyncIterator[Simulator]:
    async with run_simulator(SimulatorConfig(nodes=2, run_dir=tmp_path / "sim")) as running:
        yield running


@pytest.fixture
async def bridge(sim: Simulator, tmp_path: Path) -> AsyncIterator[RunningBridge]:
    """A second Slurm emulator that knows the cluster only through the emulator's HTTP API."""
    config = SimulatorConfig(run_dir=tmp_path / "bridge", slurm_driver_interval=0.05)
    async with run_slurm_bridge(config, sim.kubeconfig_path) as running:
        yield running


def states(bridge: RunningBridge) -> dict[str, list[str]]:
    cluster = bridge.slurm["sim"].emulator
    return {name: cluster.node_state(name) for name in cluster.cluster.nodes}


async def test_bridge_registers_a_ready_nodeset_pod_and_loses_it_when_the_pod_is_deleted(
    sim: Simulator, bridge: RunningBridge
) -> None:
    sim.store.create("pods", pod("gpu-0", **{"nodeflow.dev/nodeset": "gpu"}), NS)
    await eventually(lambda: "IDLE" in states(bridge).get("gpu-0", []), timeout=30)
    node = bridge.slurm["sim"].emulator.node_json("gpu-0")
    assert (node["cpus"], node["real_memory"]) == (16, 64 * 1024)
    sim.store.delete("pods", "gpu-0", NS, grace_period_seconds=0)
    await eventually(lambda: "NOT_RESPONDING" in states(bridge)["gpu-0"], timeout=30)


async def test_bridge_loses_a_pod_deleted_while_its_watch_was_expired(
    sim: Simulator, bridge: RunningBridge
) -> None:
    sim.store.create("pods", pod("gpu-1", **{"nodeflow.dev/nodeset": "gpu"}), NS)
    await eventually(lambda: "IDLE" in states(bridge).get("gpu-1", []), timeout=30)
    # One synchronous step: the watch ends with 410 and the pod goes before the bridge can
    # watch again, so only the new list can tell it is gone.
    sim.store.close_all_watches(Gone("too old resource version"))
    sim.store.delete("pods", "gpu-1", NS, grace_period_seconds=0)
    await eventually(lambda: "NOT_RESPONDING" in states(bridge)["gpu-1"], timeout=30)


async def test_bridge_registers_nothing_for_pods_without_the_nodeset_label(
    sim: Simulator, bridge: RunningBridge
) -> None:
    sim.store.create("pods", pod("plain"), NS)
    sim.store.create("pods", pod("gpu-2", **{"nodeflow.dev/nodeset": "gpu"}), NS)
    # Pods start in order on the emulator's kubelet: once gpu-2 registered, plain had its turn.
    await eventually(lambda: "IDLE" in states(bridge).get("gpu-2", []), timeout=30)
    assert "plain" not in states(bridge)
