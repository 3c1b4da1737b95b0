"""The Slurm emulator following a real API server (clustersim.bridge): a Running, Ready
NodeSet pod that kube-scheduler placed and KWOK runs registers its Slurm node (seen through
the Slurm REST API), and deleting the pod marks it lost, as slurmd going away does."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import pytest

from clustersim.bridge import RunningBridge, run_slurm_bridge
from clustersim.runner import SimulatorConfig
from nodeflow_runtime.envfile import read_env_file
from tests.realkube.support import admin_kubeconfig, kubectl, until

pytestmark = pytest.mark.real_kube


def nodeset_pod(name: str, namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {"nodeflow.dev/nodeset": "bridged"},
        },
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "nodeSelector": {"nvidia.com/gpu.present": "true"},
            "containers": [
                {
                    "name": "slurmd",
                    "image": "busybox",
                    "resources": {
                        "requests": {"cpu": "4", "memory": "8Gi", "nvidia.com/gpu": "2"},
                        "limits": {"nvidia.com/gpu": "2"},
                    },
                }
            ],
        },
    }


@pytest.fixture
async def bridge(tmp_path: Path) -> AsyncIterator[RunningBridge]:
    async with run_slurm_bridge(SimulatorConfig(run_dir=tmp_path), admin_kubeconfig()) as running:
        yield running


@pytest.fixture
async def namespace() -> AsyncIterator[str]:
    name = f"rk-bridge-{uuid.uuid4().hex[:8]}"
    await kubectl("create", "namespace", name)
    try:
        yield name
    finally:
        await kubectl("delete", "namespace", name, "--wait=false")


async def slurm_node(bridge: RunningBridge, name: str) -> dict[str, Any] | None:
    sim = bridge.slurm["sim"]
    async with (
        aiohttp.ClientSession() as session,
        session.get(
            f"{sim.url}{sim.api_prefix}/node/{name}", headers=sim.headers("slurm")
        ) as response,
    ):
        if response.status != 200:
            return None
        nodes = (await response.json()).get("nodes") or []
        found: dict[str, Any] | None = nodes[0] if nodes else None
        return found


async def test_a_ready_nodeset_pod_registers_its_slurm_node_and_its_deletion_loses_it(
    bridge: RunningBridge, namespace: str
) -> None:
    name = f"bridged-{uuid.uuid4().hex[:6]}"
    await kubectl(
        "create", "-f", "-", stdin=msgspec.json.encode(nodeset_pod(name, namespace)).decode()
    )

    async def registered() -> dict[str, Any] | None:
        node = await slurm_node(bridge, name)
        return node if node is not None and "IDLE" in node["state"] else None

    node = await until(registered, f"Slurm node {name} IDLE")
    # What slurmd in the pod reports: the pod's requests, and the pod's IP from KWOK.
    assert node["cpus"] == 4
    assert node["real_memory"] == 8 * 1024
    assert node["gres"] == "gpu:2"
    _, pod_ip, _ = await kubectl(
        "-n", namespace, "get", "pod", name, "-o", "jsonpath={.status.podIP}"
    )
    assert node["address"] == pod_ip

    await kubectl("-n", namespace, "delete", "pod", name, "--wait=true")

    async def lost() -> bool:
        node = await slurm_node(bridge, name)
        return node is not None and "NOT_RESPONDING" in node["state"]

    await until(lost, f"Slurm node {name} NOT_RESPONDING")


async def test_the_bridge_writes_the_env_the_services_read(bridge: RunningBridge) -> None:
    env = read_env_file(bridge.env_path)
    assert env["KUBECONFIG"] == str(admin_kubeconfig().resolve())
    assert env["KUBE_API_URL"] == bridge.kube_url
    assert env["SLURM_CLUSTERS"] == "sim"
    assert env["SLURM_SIM_URL"] == bridge.slurm["sim"].url
    assert Path(env["SLURM_TOKEN_FILE"]).stat().st_mode & 0o077 == 0
