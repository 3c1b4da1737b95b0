"""`python -m maintenance_scheduler` as a real process on the whole stack, its Skyhook
controller driven with kubectl the way a Skyhook user would: apply a DeploymentPolicy and a
Skyhook, watch the printer columns reach complete, find the stage Jobs by label, read a
stage's logs through its Job, and see the policy held by its finalizer while in use."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest
import yaml

from nodeflow_runtime.natsd import free_port
from tests.e2e import processes
from tests.e2e.processes import kubectl
from tests.e2e.test_maintenance_kubectl import require_kubectl
from tests.integration.maintenance_scheduler import conftest as whole_stack
from tests.integration.maintenance_scheduler.conftest import Stack

pytestmark = pytest.mark.slow

stack = whole_stack.stack
__all__ = ["require_kubectl", "stack"]

MANIFESTS = """
apiVersion: skyhook.nvidia.com/v1alpha1
kind: DeploymentPolicy
metadata:
  name: doubling
spec:
  default:
    budget:
      percent: 100
    strategy:
      exponential:
        initialBatch: 1
        growthFactor: 2
---
apiVersion: skyhook.nvidia.com/v1alpha1
kind: Skyhook
metadata:
  name: gpu-init
spec:
  deploymentPolicy: doubling
  priority: 100
  packages:
    driver:
      version: 1.0.0
      image: registry.local/driver
    tuning:
      version: 2.0.0
      image: registry.local/tuning
      dependsOn:
        driver: 1.0.0
"""


async def start_process(running: Stack, port: int) -> asyncio.subprocess.Process:
    return await processes.start_service(
        "maintenance_scheduler",
        running,
        port,
        "e2e-skyhook",
        OPERATOR_NAMESPACE="default",
        SKYHOOK_NAMESPACE="default",
    )


async def test_skyhook_rollout_with_kubectl(stack: Stack) -> None:
    port = free_port()
    process = await start_process(stack, port)
    try:
        await processes.wait_ready(port, "maintenance-scheduler process", timeout=30)
        documents: list[dict[str, Any]] = list(yaml.safe_load_all(MANIFESTS))
        await kubectl(stack, "apply", "-f", "-", stdin=yaml.safe_dump_all(documents))

        async def status() -> str:
            return (
                await kubectl(
                    stack, "get", "skyhooks", "gpu-init", "-o", "jsonpath={.status.status}"
                )
            ).strip()

        deadline = time.monotonic() + 90
        while await status() != "complete":
            assert time.monotonic() < deadline, "the Skyhook never completed"
            await asyncio.sleep(0.3)
        nodes = len(stack.node_names())
        table = await kubectl(stack, "get", "skyhooks")
        header, row = table.strip().splitlines()[:2]
        assert header.split()[:3] == ["NAME", "STATUS", "PRIORITY"]
        assert row.split()[:3] == ["gpu-init", "complete", "100"]
        assert f"{nodes}/{nodes}" in row
        assert "driver:1.0.0,tuning:2.0.0" in row and "doubling" in row

        jobs = await kubectl(
            stack,
            "get",
            "jobs",
            "-n",
            "default",
            "-l",
            "skyhook.nvidia.com/name=gpu-init",
            "-o",
            "name",
        )
        names = jobs.split()
        assert len(names) == 2 * 2 * nodes
        node = stack.node_names()[0]
        on_node = await kubectl(
            stack,
            "get",
            "jobs",
            "-n",
            "default",
            "-o",
            "name",
            "-l",
            f"skyhook.nvidia.com/node={node},skyhook.nvidia.com/package=tuning,"
            "skyhook.nvidia.com/stage=config",
        )
        (config_job,) = on_node.split()
        # The package pod contract: the package image copied its files to the host copy dir,
        # then the agent ran the stage and its check there (the init containers' logs), apply
        # then apply-check, config then config-check.
        generation = await kubectl(
            stack, "get", "skyhooks", "gpu-init", "-o", "jsonpath={.metadata.generation}"
        )
        sky_uid = await kubectl(
            stack, "get", "skyhooks", "gpu-init", "-o", "jsonpath={.metadata.uid}"
        )
        copy_dir = f"/var/lib/skyhook/gpu-init/tuning-2.0.0-{sky_uid.strip()}-{generation.strip()}"
        for stage in ("apply", "config"):
            (job,) = (
                await kubectl(
                    stack,
                    "get",
                    "jobs",
                    "-n",
                    "default",
                    "-o",
                    "name",
                    "-l",
                    f"skyhook.nvidia.com/node={node},skyhook.nvidia.com/package=tuning,"
                    f"skyhook.nvidia.com/stage={stage}",
                )
            ).split()
            logs = {
                container: await kubectl(stack, "logs", "-n", "default", job, "-c", container)
                for container in ("tuning-init", f"tuning-{stage}", f"tuning-{stage}check")
            }
            assert all("exited with code 0" in text for text in logs.values()), logs
            assert "registry.local/tuning:2.0.0 started on" in logs["tuning-init"]
            assert f"SKYHOOK_DIR={copy_dir}" in logs["tuning-init"]
            first_line = {name: text.splitlines()[0] for name, text in logs.items()}
            assert "nvcr.io/nvidia/skyhook/agent:" in first_line[f"tuning-{stage}"]
            assert first_line[f"tuning-{stage}"].endswith(f": {stage} /root {copy_dir}")
            assert first_line[f"tuning-{stage}check"].endswith(f": {stage}-check /root {copy_dir}")

        # The Job records what it ran, durable in Kubernetes: the Skyhook's and the node's uid,
        # the version, the run and the config hash.
        uid = await kubectl(stack, "get", "skyhooks", "gpu-init", "-o", "jsonpath={.metadata.uid}")
        node_uid = await kubectl(stack, "get", "node", node, "-o", "jsonpath={.metadata.uid}")
        identity = json.loads(
            await kubectl(
                stack,
                "get",
                "-n",
                "default",
                config_job,
                "-o",
                r"jsonpath={.metadata.annotations.skyhook\.nvidia\.com/identity}",
            )
        )
        assert (identity["skyhook"], identity["node"]) == (uid.strip(), node_uid.strip())
        assert identity["version"] == "2.0.0" and identity["run"] and identity["config"]

        # An edited configMap runs config again on every node: its earlier Complete config
        # Jobs (still there within their TTL) prove nothing for the new config.
        edit = {"spec": {"packages": {"tuning": {"configMap": {"mode": "fast"}}}}}
        await kubectl(
            stack, "patch", "skyhooks", "gpu-init", "--type=merge", "-p", json.dumps(edit)
        )

        async def tuning_config_jobs() -> int:
            found = await kubectl(
                stack,
                "get",
                "jobs",
                "-n",
                "default",
                "-o",
                "name",
                "-l",
                "skyhook.nvidia.com/package=tuning,skyhook.nvidia.com/stage=config",
            )
            return len(found.split())

        deadline = time.monotonic() + 90
        while await tuning_config_jobs() < 2 * nodes or await status() != "complete":
            assert time.monotonic() < deadline, "config never ran again after the edit"
            await asyncio.sleep(0.3)
        assert await tuning_config_jobs() == 2 * nodes
        every = await kubectl(
            stack, "get", "jobs", "-n", "default", "-o", "name", "-l", "skyhook.nvidia.com/name"
        )
        assert len(every.split()) == 2 * 2 * nodes + nodes  # only config ran again

        # The policy is in use: its deletion waits on the finalizer.
        # (Qualified: plain `deploymentpolicies` is nodewright.nvidia.com's, the group kubectl
        # prefers of the two serving the kind.)
        policies = "deploymentpolicies.skyhook.nvidia.com"
        await kubectl(stack, "delete", policies, "doubling", "--wait=false")
        policy = await kubectl(stack, "get", policies, "doubling", "-o", "yaml")
        assert "skyhook.nvidia.com/deploymentpolicy-in-use" in policy
        assert "deletionTimestamp" in policy
        await kubectl(stack, "delete", "skyhooks", "gpu-init")
        await kubectl(stack, "wait", "--for=delete", f"{policies}/doubling", "--timeout=40s")
    finally:
        await processes.stop_processes(process)
