"""Skyhook's renamed release, driven with kubectl as its user would: `python -m
maintenance_scheduler` as a real process on the whole stack, the upstream-style NodeWright of
k8s/examples/nodewright.yaml applied beside a legacy Skyhook. Each completes, the nodes carry
each one's marks under its own group (nodewright.nvidia.com/* and skyhook.nvidia.com/*), the
stage Jobs are found by the NodeWright's labels, and deleting the NodeWright takes only its
marks off the nodes. Its DeploymentPolicy is of nodewright.nvidia.com, as upstream's rename
moves it."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest

from nodeflow_contracts.skyhook import NODEWRIGHT, SKYHOOK
from nodeflow_runtime.natsd import free_port
from tests.e2e import processes
from tests.e2e.processes import kubectl
from tests.e2e.test_maintenance_kubectl import require_kubectl
from tests.e2e.test_skyhook_kubectl import start_process
from tests.integration.maintenance_scheduler import conftest as whole_stack
from tests.integration.maintenance_scheduler.conftest import Stack

pytestmark = pytest.mark.slow

stack = whole_stack.stack
__all__ = ["require_kubectl", "stack"]

EXAMPLE = Path(__file__).resolve().parents[2] / "k8s" / "examples" / "nodewright.yaml"
RENAMED = "nodewright-sample"
POLICY = "quarter-at-a-time"
LEGACY = """
apiVersion: skyhook.nvidia.com/v1alpha1
kind: Skyhook
metadata:
  name: legacy
spec:
  packages:
    tuning:
      version: 1.0.0
      image: registry.local/tuning
"""

# Fields of the renamed operator's later releases (drainConfig, runtimeRequiredCordonAfter:
# docs/maintenance-scheduler.md S56, S57), on a NodeWright that selects no node.
UPSTREAM_FIELDS = """
apiVersion: nodewright.nvidia.com/v1alpha1
kind: NodeWright
metadata:
  name: drain-and-cordon
spec:
  nodeSelectors:
    matchLabels:
      nodeflow.dev/no-such-node: "true"
  runtimeRequired: true
  runtimeRequiredCordonAfter: true
  drainConfig:
    disableEviction: false
    deleteEmptyDirData: false
    force: true
    ignoreDaemonSets: true
    timeout: 10m
    gracePeriod: 30s
  packages:
    driver:
      version: 1.0.0
      image: registry.local/driver
      interrupt:
        type: reboot
"""


async def status_of(running: Stack, plural: str, name: str) -> str:
    got = await kubectl(running, "get", plural, name, "-o", "jsonpath={.status.status}")
    return got.strip()


async def node_object(running: Stack, node: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(await kubectl(running, "get", "node", node, "-o", "json"))
    return loaded


async def test_an_upstream_nodewright_completes_beside_a_skyhook_each_with_its_own_keys(
    stack: Stack,
) -> None:
    port = free_port()
    process = await start_process(stack, port)
    try:
        await processes.wait_ready(port, "maintenance-scheduler process", timeout=30)
        # A manifest using upstream's drainConfig and runtimeRequiredCordonAfter applies and
        # keeps them (our CRD types them: nothing is pruned).
        await kubectl(stack, "apply", "-f", "-", stdin=UPSTREAM_FIELDS)
        stored = json.loads(
            await kubectl(stack, "get", "nodewrights", "drain-and-cordon", "-o", "json")
        )
        assert stored["spec"]["runtimeRequiredCordonAfter"] is True
        assert stored["spec"]["drainConfig"] == {
            "disableEviction": False,
            "deleteEmptyDirData": False,
            "force": True,
            "ignoreDaemonSets": True,
            "timeout": "10m",
            "gracePeriod": "30s",
        }
        await kubectl(stack, "delete", "nodewrights", "drain-and-cordon", "--wait=false")
        await kubectl(stack, "apply", "-f", str(EXAMPLE))
        await kubectl(stack, "apply", "-f", "-", stdin=LEGACY)

        deadline = time.monotonic() + 120
        while (
            await status_of(stack, "nodewrights", RENAMED) != "complete"
            or await status_of(stack, "skyhooks", "legacy") != "complete"
        ):
            assert time.monotonic() < deadline, "the NodeWright or the Skyhook never completed"
            await asyncio.sleep(0.3)
        nodes = stack.node_names()
        table = await kubectl(stack, "get", "nodewrights")
        header, row = table.strip().splitlines()[:2]
        assert header.split()[:2] == ["NAME", "STATUS"]
        assert row.split()[:2] == [RENAMED, "complete"] and f"{len(nodes)}/{len(nodes)}" in row

        for node in nodes:
            obj = await node_object(stack, node)
            labels, annotations = obj["metadata"]["labels"], obj["metadata"]["annotations"]
            assert labels[NODEWRIGHT.status_key(RENAMED)] == "complete"
            assert labels[SKYHOOK.status_key("legacy")] == "complete"
            assert NODEWRIGHT.node_state_annotation(RENAMED) in annotations
            assert NODEWRIGHT.version_annotation(RENAMED) in annotations
            # Neither writes under the other's group.
            assert SKYHOOK.status_key(RENAMED) not in labels
            assert NODEWRIGHT.status_key("legacy") not in labels
            conditions = {c["type"]: c["status"] for c in obj["status"]["conditions"]}
            assert conditions[NODEWRIGHT.not_ready_condition(RENAMED)] == "False"
            assert conditions[SKYHOOK.not_ready_condition("legacy")] == "False"

        jobs = await kubectl(
            stack, "get", "jobs", "-n", "default", "-o", "json", "-l",
            f"{NODEWRIGHT.name_label}={RENAMED}",
        )  # fmt: skip
        items = json.loads(jobs)["items"]
        # One package, apply then config, on every node.
        assert len(items) == 2 * len(nodes)
        for job in items:
            (owner,) = job["metadata"]["ownerReferences"]
            assert (owner["apiVersion"], owner["kind"]) == (NODEWRIGHT.api_version, "NodeWright")
            assert not any(k.startswith(SKYHOOK.prefix) for k in job["metadata"]["labels"])
            # stageTimeout "15m" (a Go duration, as NodeWright's CRD types it).
            assert job["spec"]["activeDeadlineSeconds"] == 900
        finalizers = await kubectl(
            stack, "get", "nodewrights", RENAMED, "-o", "jsonpath={.metadata.finalizers}"
        )
        assert json.loads(finalizers) == [NODEWRIGHT.finalizer]
        # Its DeploymentPolicy is of its own group (mirrored apart from skyhook.nvidia.com's),
        # held in use by that group's finalizer.
        policy = f"deploymentpolicies.{NODEWRIGHT.group}/{POLICY}"
        held = await kubectl(stack, "get", policy, "-o", "jsonpath={.metadata.finalizers}")
        assert json.loads(held) == [NODEWRIGHT.policy_finalizer]

        # Deleted, the NodeWright removes its own marks from every node, then goes; the
        # Skyhook's stay.
        await kubectl(stack, "delete", "nodewrights", RENAMED, "--wait=false")
        await kubectl(stack, "wait", "--for=delete", f"nodewrights/{RENAMED}", "--timeout=60s")
        for node in nodes:
            obj = await node_object(stack, node)
            keys = {*obj["metadata"]["labels"], *obj["metadata"]["annotations"]}
            keys |= {c["type"] for c in obj["status"]["conditions"]}
            assert not any(key.startswith(NODEWRIGHT.prefix) for key in keys), keys
            assert obj["metadata"]["labels"][SKYHOOK.status_key("legacy")] == "complete"
        # No NodeWright names the policy any more: its finalizer goes, so it can be deleted.
        await kubectl(stack, "delete", policy, "--wait=false")
        await kubectl(stack, "wait", "--for=delete", policy, "--timeout=30s")
    finally:
        await processes.stop_processes(process)
