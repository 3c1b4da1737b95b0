"""Rule 8b on the whole stack: a pod the scale-down cannot delete because its node runs a job
says so on itself, read through the Kubernetes API as kubectl reads it; scaled back up, the
condition goes with the mark."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from nodeflow_cli.main import Kube
from nodeflow_contracts.pod_protocol import POD_WAIT_CONDITION
from tests.integration.nodeset_controller.conftest import (
    NS,
    SLURM_DELETE,
    Stack,
    condition,
    eventually,
)


async def test_rule_8b_a_busy_pod_held_by_the_scale_down_says_why_through_the_api(
    stack: Stack,
) -> None:
    await stack.start_controller()
    stack.create_nodeset("gpu", 2)
    await eventually(lambda: len(stack.ready_pods("gpu")) == 2)
    await eventually(
        lambda: all(stack.slurm_node(p["metadata"]["name"]) for p in stack.pods("gpu"))
    )
    for pod in stack.pods("gpu"):
        stack.run_job(pod["metadata"]["name"])
    await eventually(lambda: stack.status("gpu").get("numberRunning") == 2, what="jobs running")
    stack.patch_nodeset("gpu", {"replicas": 1})
    marked = await eventually(
        lambda: next((p for p in stack.pods("gpu") if condition(p, SLURM_DELETE)), None),
        what="a pod marked",
    )
    name = marked["metadata"]["name"]
    kube = await Kube.connect(str(stack.sim.kubeconfig_path), "")
    path = f"/api/v1/namespaces/{NS}/pods/{name}"
    try:
        found = await read_until(
            kube,
            path,
            lambda pod: (
                (condition(pod, POD_WAIT_CONDITION) or {}).get("reason") == "PodsBusy"
                and (condition(pod, "SlurmNodeStateDrain") or {}).get("status") == "True"
            ),
            what="the pod's wait condition, and its node draining",
        )
        wait = condition(found, POD_WAIT_CONDITION)
        assert wait is not None and wait["status"] == "True"
        assert wait["message"] == (
            "node busy with jobs: deleted once they end and Slurm reads the node drained and idle"
        )
        # The pod the scale-down keeps waits for nothing and carries no such condition.
        (other,) = [p for p in stack.pods("gpu") if p["metadata"]["name"] != name]
        assert condition(other, POD_WAIT_CONDITION) is None

        stack.patch_nodeset("gpu", {"replicas": 2})
        await read_until(
            kube,
            path,
            lambda pod: (
                condition(pod, SLURM_DELETE) is None and condition(pod, POD_WAIT_CONDITION) is None
            ),
            what="mark and wait condition removed",
        )
    finally:
        await kube.close()


async def read_until(
    kube: Kube, path: str, wanted: Callable[[dict[str, Any]], bool], *, what: str
) -> dict[str, Any]:
    """The object at `path`, read through the API until `wanted` holds for it."""
    latest: dict[str, Any] = {}

    async def read() -> bool:
        found = await kube.get(path)
        assert found is not None, f"{path} is gone"
        latest.clear()
        latest.update(found)
        return wanted(latest)

    deadline = asyncio.get_running_loop().time() + 15.0
    while not await read():
        assert asyncio.get_running_loop().time() < deadline, f"not reached: {what}"
        await asyncio.sleep(0.05)
    return latest
