"""Node admin operations, the Slurm node lifecycle wiring, and the CLI."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
from kubernetes_asyncio import client

from clustersim.runner import Simulator, SimulatorConfig, run_simulator

NS = "default"


def nodeset_pod(name: str, cluster: str | None = None) -> Any:
    labels = {"nodeflow.dev/nodeset": "gpu"}
    if cluster:
        labels["nodeflow.dev/slurm-cluster"] = cluster
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


async def slurm_node(sim: Simulator, name: str, cluster: str | None = None) -> Any:
    slurm = sim.slurm[cluster or sim.default_slurm_cluster]
    async with (
        aiohttp.ClientSession() as session,
        session.get(
            f"{slurm.url}{slurm.api_prefix}/node/{name}",
            headers=sim.slurm_headers(cluster=cluster),
        ) as response,
    ):
        if response.status != 200:
            return None
        body = await response.json()
        return body["nodes"][0] if body.get("nodes") else None


async def test_nodeset_pod_registers_and_loses_slurm_node(sim: Simulator) -> None:
    async with sim.api_client() as api:
        core = client.CoreV1Api(api)
        await core.create_namespaced_pod(NS, nodeset_pod("gpu-012-002"))

        async def registered() -> Any:
            node = await slurm_node(sim, "gpu-012-002")
            return node if node and "IDLE" in node["state"] else None

        node = None
        deadline = time.monotonic() + 5
        while node is None and time.monotonic() < deadline:
            node = await registered()
            await asyncio.sleep(0.05)
        assert node is not None, "slurm node never registered"
        assert node["cpus"] == 16 and node["real_memory"] == 65536
        assert node["gres"] == "gpu:8"  # not requested: taken from the node's capacity

        await core.delete_namespaced_pod("gpu-012-002", NS)
        deadline = time.monotonic() + 5
        state: list[str] = []
        while time.monotonic() < deadline:
            current = await slurm_node(sim, "gpu-012-002")
            state = current["state"] if current else []
            if "DOWN" in state:
                break
            await asyncio.sleep(0.05)
        assert set(state) >= {"DOWN", "NOT_RESPONDING"}


async def test_labelled_pod_goes_to_named_cluster() -> None:
    config = SimulatorConfig(nodes=2, slurm_clusters=("alpha", "beta"), kubelet_delay=0.02)
    async with run_simulator(config) as sim:
        sim.store.create("pods", nodeset_pod("b-node", cluster="beta"))
        sim.store.create("pods", nodeset_pod("a-node"))
        beta = sim.slurm["beta"].cluster
        alpha = sim.slurm["alpha"].cluster
        await sim.wait_for(lambda: "b-node" in beta.nodes and "a-node" in alpha.nodes)
        assert "b-node" not in alpha.nodes and "a-node" not in beta.nodes
        assert await slurm_node(sim, "b-node", cluster="beta") is not None
        env = sim.env_path.read_text()
        assert "SLURM_CLUSTERS=alpha,beta\n" in env
        assert f"SLURM_URL={sim.slurm['alpha'].url}\n" in env


def ready_status(sim: Simulator, pod: str) -> str:
    conditions = sim.store.get("pods", pod).get("status", {}).get("conditions") or []
    return next((c["status"] for c in conditions if c["type"] == "Ready"), "")


async def test_node_not_ready_makes_pods_not_ready_and_slurm_node_down(sim: Simulator) -> None:
    sim.store.create("pods", nodeset_pod("slurm-a"))
    await sim.wait_for(lambda: ready_status(sim, "slurm-a") == "True")
    node_name = sim.store.get("pods", "slurm-a")["spec"]["nodeName"]
    emulator = sim.slurm[sim.default_slurm_cluster].emulator
    await sim.wait_for(lambda: "slurm-a" in emulator.cluster.nodes)

    sim.make_node_not_ready(node_name)
    node = sim.store.get("nodes", node_name)
    assert {t["key"] for t in node["spec"]["taints"]} == {"node.kubernetes.io/unreachable"}
    assert ready_status(sim, "slurm-a") == "False"
    await sim.wait_for(lambda: "DOWN" in emulator.node_state("slurm-a"))

    # Nothing new lands on the NotReady node.
    for index in range(6):
        sim.store.create(
            "pods",
            {
                "metadata": {"name": f"w{index}"},
                "spec": {"containers": [{"name": "c", "image": "app"}]},
            },
        )
    await sim.wait_for(
        lambda: all(sim.store.get("pods", f"w{i}")["spec"].get("nodeName") for i in range(6))
    )
    assert all(sim.store.get("pods", f"w{i}")["spec"]["nodeName"] != node_name for i in range(6))

    sim.make_node_ready(node_name)
    await sim.wait_for(lambda: ready_status(sim, "slurm-a") == "True")
    await sim.wait_for(lambda: emulator.node_state("slurm-a") == ["IDLE"])


async def test_removed_node_loses_its_pods_and_added_node_takes_new_ones(sim: Simulator) -> None:
    sim.store.create(
        "pods",
        {"metadata": {"name": "doomed"}, "spec": {"containers": [{"name": "c", "image": "app"}]}},
    )
    await sim.wait_for(lambda: ready_status(sim, "doomed") == "True")
    node_name = sim.store.get("pods", "doomed")["spec"]["nodeName"]
    sim.remove_node(node_name)
    await sim.wait_for(
        lambda: not sim.store.list("pods", field_selector="metadata.name=doomed").items
    )

    added = sim.add_node()
    assert added["metadata"]["name"] == "node-004"
    address = added["status"]["addresses"][0]["address"]
    assert address not in {
        n["status"]["addresses"][0]["address"]
        for n in sim.store.list("nodes").items
        if n["metadata"]["name"] != "node-004"
    }
    for name in sim.node_names():
        if name != "node-004":
            sim.cordon_node(name)
    sim.store.create(
        "pods",
        {"metadata": {"name": "newcomer"}, "spec": {"containers": [{"name": "c", "image": "app"}]}},
    )
    await sim.wait_for(
        lambda: sim.store.get("pods", "newcomer")["spec"].get("nodeName") == "node-004"
    )


async def test_admin_http_api(sim: Simulator) -> None:
    name = sim.node_names()[0]
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{sim.admin_url}/nodes/{name}/not-ready") as response:
            assert response.status == 200
        async with session.get(f"{sim.admin_url}/nodes") as response:
            nodes = {n["name"]: n for n in (await response.json())["nodes"]}
        assert nodes[name]["ready"] is False
        async with session.post(f"{sim.admin_url}/nodes/{name}/ready") as response:
            assert response.status == 200
        async with session.post(f"{sim.admin_url}/nodes", json={"labels": {"x": "y"}}) as response:
            assert response.status == 201
            added = await response.json()
        assert added["metadata"]["labels"]["x"] == "y"
        async with session.delete(f"{sim.admin_url}/nodes/no-such-node") as response:
            assert response.status == 404


async def test_crds_are_served(sim: Simulator) -> None:
    assert "nodesets.nodeflow.dev" in sim.crds
    async with sim.api_client() as api:
        custom = client.CustomObjectsApi(api)
        listing = await custom.list_namespaced_custom_object(
            "nodeflow.dev", "v1alpha1", NS, "nodesets"
        )
        assert listing["items"] == []


async def test_cli_writes_env_answers_readyz_and_stops_on_sigterm(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "env").write_text("NATS_URL=nats://127.0.0.1:4222\nKUBECONFIG=/stale\n")
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "clustersim",
        "--nodes",
        "16",
        "--topology",
        "spines=2,blocks_per_spine=2,nodes_per_block=4",
        "--run-dir",
        str(run_dir),
        "--log-level",
        "warning",
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        env: dict[str, str] = {}
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            text = (run_dir / "env").read_text()
            env = dict(line.split("=", 1) for line in text.splitlines() if "=" in line)
            if "KUBE_API_URL" in env:
                break
            await asyncio.sleep(0.1)
        assert env["NATS_URL"] == "nats://127.0.0.1:4222"
        assert env["KUBECONFIG"] == str(run_dir.resolve() / "kubeconfig")
        assert env["SLURM_CLUSTERS"] == "sim"
        assert Path(env["SLURM_TOKEN_FILE"]).read_text().strip()
        for key in ("SLURM_URL", "SLURM_JWT_KEY_FILE", "SLURM_USER", "SIM_ADMIN_URL"):
            assert env[key]
        async with aiohttp.ClientSession() as session:
            async with session.get(f"{env['KUBE_API_URL']}/_sim/readyz") as response:
                assert response.status == 200
            async with session.get(f"{env['KUBE_API_URL']}/api/v1/nodes") as response:
                nodes = (await response.json())["items"]
        assert len(nodes) == 16
        blocks = {n["metadata"]["labels"]["network.topology.nvidia.com/block"] for n in nodes}
        assert len(blocks) == 4
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
        code = await asyncio.wait_for(process.wait(), timeout=10)
    assert code == 0, (await process.stderr.read()).decode() if process.stderr else code
