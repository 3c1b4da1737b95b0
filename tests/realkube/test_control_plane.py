"""The real control plane holds the simulator's cluster: its KWOK nodes carry the simulator's
labels and capacities, kube-scheduler places a GPU pod on one by those capacities, KWOK runs it
and lets its deletion finish. Run by `make test-real-kube` after the conformance suite, once
the scheduler, the CRDs, the 16 GPU nodes and KWOK's pod stages are added."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from kubernetes_asyncio import client, config

from clustersim.cluster.spec import GPU_RESOURCE
from tests.realkube.conftest import KUBECONFIG_ENV
from tools.kube.fake_nodes import fake_nodes

pytestmark = pytest.mark.real_kube

GPU_NODES = 16
# Generous: a step is a scheduling cycle, a KWOK stage or a graceful deletion on a shared machine.
STEP_TIMEOUT = 60.0


@pytest.fixture
async def core() -> AsyncIterator[Any]:
    configuration = client.Configuration()
    await config.load_kube_config(
        config_file=os.environ[KUBECONFIG_ENV], client_configuration=configuration
    )
    async with client.ApiClient(configuration) as api:
        yield client.CoreV1Api(api)


async def until(check: Callable[[], Awaitable[bool]]) -> None:
    async with asyncio.timeout(STEP_TIMEOUT):
        for _ in range(int(STEP_TIMEOUT / 0.2) + 1):
            if await check():
                return
            await asyncio.sleep(0.2)
    raise AssertionError("condition not reached")


async def test_kwok_nodes_carry_the_simulators_labels_and_capacity_and_are_ready(
    core: Any,
) -> None:
    listed = await core.list_node(label_selector="nvidia.com/gpu.present=true")
    nodes = {n.metadata.name: n for n in listed.items}
    for want in fake_nodes(GPU_NODES, ""):
        got = nodes[want["metadata"]["name"]]
        for key, value in want["metadata"]["labels"].items():
            assert got.metadata.labels[key] == value
        assert got.status.capacity == want["status"]["capacity"]
        assert got.status.allocatable == want["status"]["allocatable"]
        ready = next(c for c in got.status.conditions if c.type == "Ready")
        assert ready.status == "True"


async def test_scheduler_places_a_gpu_pod_that_kwok_runs_and_deletion_finishes(
    core: Any,
) -> None:
    ns = (await core.create_namespace({"metadata": {"generateName": "realkube-"}})).metadata.name
    try:
        body = {
            "metadata": {"name": "gpu"},
            "spec": {
                "terminationGracePeriodSeconds": 5,
                "containers": [
                    {
                        "name": "main",
                        "image": "busybox",
                        "resources": {"limits": {GPU_RESOURCE: "8"}},
                    }
                ],
            },
        }
        for _ in range(50):  # the namespace's default service account comes a moment later
            try:
                await core.create_namespaced_pod(ns, body)
                break
            except client.ApiException as exc:
                if exc.status != 403 or "serviceaccount" not in str(exc.body):
                    raise
                await asyncio.sleep(0.2)

        async def running() -> bool:
            pod = await core.read_namespaced_pod("gpu", ns)
            return bool(pod.spec.node_name and pod.status.phase == "Running")

        await until(running)
        pod = await core.read_namespaced_pod("gpu", ns)
        node = await core.read_node(pod.spec.node_name)
        assert node.status.allocatable[GPU_RESOURCE] == "8"
        await core.delete_namespaced_pod("gpu", ns)

        async def gone() -> bool:
            try:
                await core.read_namespaced_pod("gpu", ns)
            except client.ApiException as exc:
                return bool(exc.status == 404)
            return False

        await until(gone)
    finally:
        await core.delete_namespace(ns)
