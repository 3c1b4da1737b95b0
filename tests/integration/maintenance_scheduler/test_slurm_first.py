"""Rule 7: maintenance drains Slurm before it evicts. The cordon drains the node's Slurm node
with a reason naming the maintenance; the NodeSet pod is evicted only once Slurm reports it
drained and idle; past drainSpec.timeoutSeconds the request says jobs still run."""

from __future__ import annotations

import pytest

from tests.integration.maintenance_scheduler.conftest import (
    CLUSTER,
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
        lambda: has_condition(stack, "slurm-a", "SlurmNodeStateAllocated")
        or has_condition(stack, "slurm-a", "SlurmNodeStateMixed"),
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
        lambda: "jobs still run on Slurm nodes slurm-a"
        in str((condition(stack.get_request("fw") or {}, "Ready") or {}).get("message")),
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
