"""Rule 7: maintenance drains Slurm before it evicts. The cordon drains the node's Slurm node
with a reason naming the maintenance; the NodeSet pod is evicted only once Slurm reports it
drained and idle; past drainSpec.timeoutSeconds the request says jobs still run."""

from __future__ import annotations

from typing import Any

import pytest

from nodeset_controller.config import NodeSetControllerConfig
from nodeset_controller.service import NodeSetController
from tests.integration.maintenance_scheduler.conftest import (
    CLUSTER,
    NS,
    Stack,
    condition,
    eventually,
)

pytestmark = pytest.mark.slow

SLURM_LABELS = {"nodeflow.dev/nodeset": "compute", "nodeflow.dev/slurm-cluster": CLUSTER}


def has_condition(stack: Stack, pod: str, kind: str) -> bool:
    found = condition(stack.pod(pod) or {}, kind)
    return found is not None and found.get("status") == "True"


async def test_rule_slurm_first_eviction_waits_for_the_running_job(stack: Stack) -> None:
    node = stack.node_names()[0]
    stack.run_pod("slurm-a", node, labels=SLURM_LABELS, cpu="1")
    await eventually(
        lambda: has_condition(stack, "slurm-a", "SlurmNodeStateIdle"), what="Slurm node idle"
    )
    job = stack.run_job("slurm-a")
    await eventually(
        lambda: (
            has_condition(stack, "slurm-a", "SlurmNodeStateAllocated")
            or has_condition(stack, "slurm-a", "SlurmNodeStateMixed")
        ),
        what="job running on the Slurm node",
    )
    await stack.start_scheduler()
    stack.request("fw", node, drainSpec={"force": True, "timeoutSeconds": 1})
    await eventually(lambda: stack.phase("fw") == "Draining", what="Draining")
    # The cordon drained the Slurm node, with a reason naming the maintenance.
    await eventually(
        lambda: "NodeMaintenance default/fw" in (stack.slurm_node("slurm-a").reason or ""),
        what="Slurm drain reason names the maintenance",
    )
    await eventually(
        lambda: (
            "jobs still run on Slurm nodes slurm-a"
            in str((condition(stack.get_request("fw") or {}, "Ready") or {}).get("message"))
        ),
        what="timeout message",
    )
    await eventually(lambda: stack.events("DrainTimeout"), what="DrainTimeout Event")
    assert stack.pod("slurm-a") is not None
    assert not (stack.pod("slurm-a") or {})["metadata"].get("deletionTimestamp")
    assert not any(o.op == "evict" for o in stack.outcomes)
    assert any(d.kind == "waiting-for-slurm" for d in stack.decisions)

    stack.cancel_job(job)
    await eventually(lambda: stack.phase("fw") == "Ready", timeout=30, what="Ready after job")
    assert stack.pod("slurm-a") is None


async def test_rule_nodeset_pod_stays_off_the_node_until_maintenance_ends(stack: Stack) -> None:
    """With nodeset-controller running: the NodeSet pod of the node under maintenance is
    evicted once Slurm drained it, no new pod goes there while the request lasts, and after
    its deletion the pod comes back and the Slurm node is undrained."""
    controller = NodeSetController(
        stack.bus,
        NodeSetControllerConfig(
            nats_url=(stack.nats_url,),
            instance_id="it-nodeset",
            leader_lease_ttl_seconds=1.5,
            resync_seconds=0.5,
            debounce_seconds=0.02,
            in_flight_timeout_seconds=5.0,
            # The in-flight hold may not be shorter than a command's life.
            command_lifetime_seconds=5.0,
        ),
    )
    await controller.start()
    try:
        await controller.lease.wait_until_leader(timeout=10)
        stack.sim.store.create(
            "nodesets.nodeflow.dev",
            {
                "apiVersion": "nodeflow.dev/v1alpha1",
                "kind": "NodeSet",
                "metadata": {"name": "compute", "namespace": NS},
                "spec": {
                    "slurmCluster": CLUSTER,
                    "template": {
                        "metadata": {"labels": {"app": "slurmd"}},
                        "spec": {
                            "terminationGracePeriodSeconds": 1,
                            "containers": [
                                {
                                    "name": "slurmd",
                                    "image": "slurmd:24.11",
                                    "resources": {"requests": {"cpu": "1"}},
                                }
                            ],
                        },
                    },
                },
            },
        )
        nodes = stack.node_names()

        def nodeset_pods_on(node: str) -> list[dict[str, Any]]:
            return [
                p
                for p in stack.sim.store.list("pods", namespace=NS).items
                if p["metadata"].get("labels", {}).get("nodeflow.dev/nodeset") == "compute"
                and p["spec"].get("nodeName") == node
                and not p["metadata"].get("deletionTimestamp")
            ]

        await eventually(
            lambda: all(
                any(
                    has_condition(stack, p["metadata"]["name"], "SlurmNodeStateIdle")
                    for p in nodeset_pods_on(n)
                )
                for n in nodes
            ),
            timeout=30,
            what="a NodeSet pod with an idle Slurm node on every node",
        )
        node = nodes[0]
        slurm_name = nodeset_pods_on(node)[0]["metadata"]["name"]
        await stack.start_scheduler()
        stack.request("swap", node, drainSpec={"force": True})
        await eventually(lambda: stack.phase("swap") == "Ready", timeout=30, what="Ready")
        assert nodeset_pods_on(node) == []
        assert stack.slurm_node(slurm_name).drain
        # Several planning rounds later, still no NodeSet pod on the node under maintenance.
        plans = controller.stats.plans
        await eventually(lambda: controller.stats.plans >= plans + 5, what="controller rounds")
        assert nodeset_pods_on(node) == []

        stack.delete_request("swap")
        await eventually(lambda: stack.get_request("swap") is None, what="request gone")
        await eventually(
            lambda: any(
                has_condition(stack, p["metadata"]["name"], "SlurmNodeStateIdle")
                for p in nodeset_pods_on(node)
            ),
            timeout=30,
            what="the NodeSet pod back on the node",
        )
        await eventually(
            lambda: not stack.slurm_node(nodeset_pods_on(node)[0]["metadata"]["name"]).drain,
            timeout=30,
            what="Slurm node undrained",
        )
    finally:
        await controller.stop()
