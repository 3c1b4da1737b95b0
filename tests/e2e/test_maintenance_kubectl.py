"""`python -m maintenance_scheduler` as a real process on the whole stack, driven with kubectl
the way a user of NVIDIA's maintenance-operator would: the reference's example manifest goes
to Ready, the printer columns show it, the immutable fields are refused by the API server, and
deletion uncordons the node."""

from __future__ import annotations

import asyncio
import signal
import time
from typing import Any

import pytest
import yaml

from nodeflow_runtime.natsd import free_port
from tests.e2e import processes
from tests.integration.maintenance_scheduler import conftest as whole_stack
from tests.integration.maintenance_scheduler.conftest import Stack, eventually

pytestmark = pytest.mark.slow

stack = whole_stack.stack

# The reference README's example, verbatim but for the node name (its `wokrer-01` is a typo
# for a node that does not exist here).
REFERENCE_EXAMPLE = """
apiVersion: maintenance.nvidia.com/v1alpha1
kind: NodeMaintenance
metadata:
  name: my-maintenance-operation
  namespace: default
spec:
  requestorID: some.one.acme.com
  nodeName: wokrer-01
  cordon: true
  waitForPodCompletion:
    podSelector: "app=important"
    timeoutSeconds: 0
  drainSpec:
    force: true
    podSelector: ""
    timeoutSeconds: 0
    deleteEmptyDir: true
    podEvictionFilters:
    - byResourceNameRegex: nvidia.com/gpu-*
    - byResourceNameRegex: nvidia.com/rdma*
"""


@pytest.fixture(autouse=True)
def require_kubectl() -> None:
    if processes.KUBECTL is None:
        pytest.skip("kubectl not installed (apt-get install kubernetes-client)")


async def start_process(running: Stack, port: int, **settings: str) -> asyncio.subprocess.Process:
    return await processes.start_service(
        "maintenance_scheduler",
        running,
        port,
        "e2e-maintenance",
        OPERATOR_NAMESPACE="default",
        **settings,
    )


async def test_reference_example_manifest_goes_to_ready_with_kubectl(stack: Stack) -> None:
    node = stack.node_names()[0]
    stack.run_pod("cpu-only", node)  # no GPU/RDMA request: the filters leave it running
    await eventually(
        lambda: (stack.pod("cpu-only") or {}).get("status", {}).get("phase") == "Running"
    )
    port = free_port()
    process = await start_process(stack, port)
    try:
        await processes.wait_ready(port, "maintenance-scheduler process", timeout=30)
        manifest: dict[str, Any] = yaml.safe_load(REFERENCE_EXAMPLE)
        manifest["spec"]["nodeName"] = node
        await processes.kubectl(stack, "apply", "-f", "-", stdin=yaml.safe_dump(manifest))

        async def phase() -> str:
            return (
                await processes.kubectl(
                    stack,
                    "get",
                    "nodemaintenances.maintenance.nvidia.com",
                    "my-maintenance-operation",
                    "-n",
                    "default",
                    "-o",
                    "jsonpath={.status.conditions[?(@.type=='Ready')].reason}",
                )
            ).strip()

        deadline = time.monotonic() + 40
        while await phase() != "Ready":
            assert time.monotonic() < deadline, "the example never became Ready"
            await asyncio.sleep(0.3)
        table = await processes.kubectl(
            stack, "get", "nodemaintenances.maintenance.nvidia.com", "-A"
        )
        header, row = table.strip().splitlines()[:2]
        assert header.split()[:7] == [
            "NAMESPACE",
            "NAME",
            "NODE",
            "REQUESTOR",
            "READY",
            "PHASE",
            "FAILED",
        ]
        assert row.split()[:6] == [
            "default",
            "my-maintenance-operation",
            node,
            "some.one.acme.com",
            "True",
            "Ready",
        ]
        assert stack.unschedulable(node)
        assert stack.pod("cpu-only") is not None

        # The API server refuses a change of an immutable field (CEL rule in the CRD).
        refused = await processes.kubectl(
            stack,
            "patch",
            "nodemaintenances.maintenance.nvidia.com",
            "my-maintenance-operation",
            "-n",
            "default",
            "--type=merge",
            "-p",
            '{"spec": {"nodeName": "elsewhere"}}',
            check=False,
        )
        assert "Value is immutable" in refused

        await processes.kubectl(
            stack,
            "delete",
            "nodemaintenances.maintenance.nvidia.com",
            "my-maintenance-operation",
            "-n",
            "default",
            "--wait=true",
            "--timeout=40s",
        )
        await eventually(lambda: not stack.unschedulable(node), what="node uncordoned")
    finally:
        await processes.stop_processes(process)


PDB = """
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata:
  name: guard
  namespace: default
spec:
  minAvailable: 1
  selector:
    matchLabels:
      app: guarded
"""


async def test_process_killed_mid_drain_resumes_without_a_second_eviction(stack: Stack) -> None:
    node = stack.node_names()[1]
    guarded = stack.run_pod("guarded", node, labels={"app": "guarded"})
    await eventually(
        lambda: (stack.pod("guarded") or {}).get("status", {}).get("phase") == "Running"
    )
    await processes.kubectl(stack, "apply", "-f", "-", stdin=PDB)
    port = free_port()
    process = await start_process(stack, port)
    second: asyncio.subprocess.Process | None = None
    try:
        await processes.wait_ready(port, "maintenance-scheduler process", timeout=30)
        manifest = {
            "apiVersion": "maintenance.nvidia.com/v1alpha1",
            "kind": "NodeMaintenance",
            "metadata": {"name": "held", "namespace": "default"},
            "spec": {
                "requestorID": "e2e.nodeflow.dev",
                "nodeName": node,
                "drainSpec": {"force": True, "timeoutSeconds": 0},
            },
        }
        await processes.kubectl(stack, "apply", "-f", "-", stdin=yaml.safe_dump(manifest))
        # The PodDisruptionBudget holds the drain: k8s-watcher reports the 429 as retrying.
        await eventually(
            lambda: any(o.op == "evict" and o.outcome == "retrying" for o in stack.outcomes),
            timeout=40,
            what="eviction held by the PodDisruptionBudget",
        )
        assert stack.phase("held") == "Draining"
        process.send_signal(signal.SIGKILL)
        await process.wait()
        second = await start_process(stack, port)
        await processes.wait_ready(port, "maintenance-scheduler process", timeout=30)
        await processes.kubectl(stack, "delete", "poddisruptionbudget", "guard", "-n", "default")
        await eventually(lambda: stack.phase("held") == "Ready", timeout=60, what="Ready")
        assert stack.pod("guarded") is None
        uid = guarded["metadata"]["uid"]
        await eventually(lambda: stack.evictions_applied(uid), what="eviction outcome")
        assert len(stack.evictions_applied(uid)) == 1
    finally:
        await processes.stop_processes(process, second)


def request_manifest(name: str, node: str, **spec: Any) -> str:
    return yaml.safe_dump(
        {
            "apiVersion": "maintenance.nvidia.com/v1alpha1",
            "kind": "NodeMaintenance",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"requestorID": "e2e.nodeflow.dev", "nodeName": node, **spec},
        }
    )


async def test_a_deleted_node_frees_its_slot_for_a_request_on_another_node(stack: Stack) -> None:
    """Issue 28, item 6: with the default maxParallelOperations of 1, a request Ready on a node
    and kept by an additional requestor holds the one slot; a request for another node waits.
    The node is deleted with kubectl: its request (owned by the node from its first round)
    goes with it, loses its finalizer though additionalRequestors remain, and the waiting
    request is scheduled and goes to Ready."""
    decommissioned, other = stack.node_names()[2:4]
    port = free_port()
    # A node absent from the view counts as gone after NODE_GONE_GRACE_SECONDS (default 300 s):
    # shortened here, the rule unchanged.
    process = await start_process(stack, port, NODE_GONE_GRACE_SECONDS="2")
    try:
        await processes.wait_ready(port, "maintenance-scheduler process", timeout=30)
        await processes.kubectl(
            stack,
            "apply",
            "-f",
            "-",
            stdin=request_manifest(
                "decommission", decommissioned, additionalRequestors=["other.example.com"]
            ),
        )
        await eventually(lambda: stack.phase("decommission") == "Ready", timeout=40, what="Ready")
        owners = await processes.kubectl(
            stack,
            "get",
            "nodemaintenances.maintenance.nvidia.com",
            "decommission",
            "-n",
            "default",
            "-o",
            "jsonpath={.metadata.ownerReferences[?(@.kind=='Node')].uid}",
        )
        assert owners.strip() == stack.node(decommissioned)["metadata"]["uid"]

        await processes.kubectl(stack, "apply", "-f", "-", stdin=request_manifest("next", other))
        await eventually(
            lambda: any(
                d.name == "next" and d.kind == "skipped" and d.reason == "no-slot"
                for d in stack.decisions
            ),
            timeout=40,
            what="the second request waiting for the one slot",
        )
        assert stack.phase("next") == "Pending"

        await processes.kubectl(stack, "delete", "node", decommissioned, "--wait=false")
        await eventually(
            lambda: stack.phase("next") == "Ready",
            timeout=40,
            what="the request on another node scheduled once the node is gone",
        )
        await eventually(
            lambda: stack.get_request("decommission") is None,
            timeout=40,
            what="the deleted node's request gone, its finalizer dropped",
        )
        gone = await processes.kubectl(
            stack,
            "get",
            "nodemaintenances.maintenance.nvidia.com",
            "decommission",
            "-n",
            "default",
            check=False,
        )
        assert "NotFound" in gone
    finally:
        await processes.stop_processes(process)
