"""Chaos on NodeMaintenance drains, the whole stack as `make run` starts it (8 nodes): three
requests under a MaintenanceOperatorConfig of maxParallelOperations 1 and maxUnavailable 1,
each node running a pod to drain, while maintenance-scheduler, k8s-watcher and nats-server are
killed with kill -9 at seeded random points (CHAOS_SEED=<seed> replays a run); the recorder
holds the budgets, and every request reaches Ready and releases its node. Each request names an
additional requestor; the first to be Ready has its node decommissioned (the Node deleted) while
that requestor is still listed: the request must go with its node, drop its finalizer and leave
its slot to the next (the recorder's `maintenance-gone-node-slot`)."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from typing import Any, cast

import pytest

from tests.e2e.chaos_support import (
    CHAOS_ENV,
    NATS,
    NODE_MAINTENANCES,
    NODES,
    OPERATOR_CONFIGS,
    OPERATOR_NAMESPACE,
    PODS,
    Kube,
    Monkey,
    Recorder,
    Slurm,
    Stack,
    chaos_seed,
    condition,
    launched_stack,
    recording,
    summary,
    wait_until,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

TOPOLOGY = "spines=1,blocks_per_spine=2,nodes_per_block=4"
REQUESTOR = "chaos.nodeflow.dev"


def workload(name: str, node: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "labels": {"app": "workload"}},
        "spec": {
            "nodeName": node,
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "work",
                    "image": "work:1",
                    "resources": {
                        "requests": {"cpu": "1", "nvidia.com/gpu": "8"},
                        "limits": {"nvidia.com/gpu": "8"},
                    },
                }
            ],
        },
    }


def maintenance(name: str, node: str) -> dict[str, Any]:
    return {
        "apiVersion": "maintenance.nvidia.com/v1alpha1",
        "kind": "NodeMaintenance",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "requestorID": REQUESTOR,
            "nodeName": node,
            "cordon": True,
            "additionalRequestors": ["chaos.other.nodeflow.dev"],
            "drainSpec": {"force": True, "timeoutSeconds": 0, "deleteEmptyDir": True},
        },
    }


async def operator_config(stack: Stack) -> None:
    await stack.kube.create(
        OPERATOR_CONFIGS,
        {
            "apiVersion": "maintenance.nvidia.com/v1alpha1",
            "kind": "MaintenanceOperatorConfig",
            "metadata": {"name": "default", "namespace": OPERATOR_NAMESPACE},
            "spec": {"maxParallelOperations": 1, "maxUnavailable": 1},
        },
    )


def phase(recorder: Recorder, name: str) -> str:
    obj = recorder.maintenances.get(name)
    return str((condition(obj, "Ready") or {}).get("reason") or "") if obj else "gone"


# The decommissioned node counts as gone once absent this long (default 300 s): shortened so the
# run converges within its bound, the rule unchanged (each restart of the killed
# maintenance-scheduler starts the grace again).
CHAOS_MAINTENANCE_ENV = {**CHAOS_ENV, "NODE_GONE_GRACE_SECONDS": "3"}


async def test_chaos_node_maintenance_drain_keeps_the_budgets(tmp_path: Path) -> None:
    rng = random.Random(chaos_seed())
    async with (
        launched_stack(tmp_path / "run", 8, TOPOLOGY, CHAOS_MAINTENANCE_ENV) as stack,
        recording(stack) as recorder,
    ):
        await operator_config(stack)

        async def config_seen() -> bool:
            return recorder.operator_config is not None

        await wait_until(config_seen, 30, "the MaintenanceOperatorConfig watched")
        targets = rng.sample(sorted(recorder.nodes), 3)
        for index, node in enumerate(targets):
            await stack.kube.create(PODS, workload(f"work-{index}", node))

        async def workloads_running() -> bool:
            return all(
                (recorder.pods.get(f"work-{i}") or {}).get("status", {}).get("phase") == "Running"
                for i in range(len(targets))
            )

        await wait_until(workloads_running, 60, "the workloads Running")
        requests = [f"upgrade-{index}" for index in range(len(targets))]
        for name, node in zip(requests, targets, strict=True):
            await stack.kube.create(NODE_MAINTENANCES, maintenance(name, node))
        monkey = Monkey(stack, rng)
        chaos = asyncio.create_task(
            monkey.run(["maintenance-scheduler", "k8s-watcher", NATS], pause=(0.3, 2.5))
        )

        # The requestors' side: the first request that reaches Ready has its node
        # decommissioned; each other one is done with (its additional requestor removes
        # itself) and deleted, which lets the next one start.
        finished: list[str] = []
        decommissioned: str | None = None
        while len(finished) < len(requests):

            async def one_ready() -> bool:
                return any(phase(recorder, n) == "Ready" for n in requests if n not in finished)

            await wait_until(one_ready, 120, f"a NodeMaintenance Ready after {finished}")
            done = next(n for n in requests if n not in finished and phase(recorder, n) == "Ready")
            if decommissioned is None:
                decommissioned = targets[requests.index(done)]
                await stack.kube.delete(f"{NODES}/{decommissioned}")
            else:
                await stack.kube.merge_patch(
                    f"{NODE_MAINTENANCES}/{done}", {"spec": {"additionalRequestors": None}}
                )
                await stack.kube.delete(f"{NODE_MAINTENANCES}/{done}")
            finished.append(done)
        kills = await chaos

        def released() -> bool:
            return (
                not recorder.maintenances
                and not recorder.unavailable_nodes()
                and not any(recorder.pods.get(f"work-{i}") for i in range(len(targets)))
            )

        took = await recorder.converged(released, monkey.last_kill, "every node maintained")
        assert decommissioned is not None and decommissioned not in recorder.nodes
        print(
            f"maintenance converged {took:.1f} s after the last kill (order {finished}, node "
            f"{decommissioned} decommissioned, at most "
            f"{recorder.most_in_maintenance} in maintenance and {recorder.most_unavailable_nodes} "
            f"unavailable); {summary(kills)}"
        )
        assert recorder.most_in_maintenance == 1
        recorder.assert_quiescent()


def node_object(name: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "uid": f"uid-{name}"},
        "spec": {},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }


def request_object(
    name: str, node: str, phase: str, *, owner_uid: str | None = None, deleting: bool = False
) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, "namespace": "default"}
    if phase != "Pending":
        metadata["finalizers"] = ["maintenance.nvidia.com/finalizer"]
    metadata["ownerReferences"] = [
        {"apiVersion": "v1", "kind": "Node", "name": node, "uid": owner_uid or f"uid-{node}"}
    ]
    if deleting:
        metadata["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {
        "metadata": metadata,
        "spec": {"requestorID": REQUESTOR, "nodeName": node},
        "status": {"conditions": [{"type": "Ready", "status": "False", "reason": phase}]},
    }


def test_recorder_counts_no_slot_for_a_gone_node_and_catches_one_that_blocks() -> None:
    """The recorder's rules as the NodeMaintenance stream shows them, without a stack: with
    maxParallelOperations 1, a request in progress on a deleted node and one on a live node
    are one operation, not two (`maintenance-parallel` stays quiet); a Pending request
    waiting with the slot free while the gone node's request is in progress, or that request
    deleted and still holding its finalizer, is `maintenance-gone-node-slot` at quiescence."""
    recorder = Recorder(cast(Kube, None), cast(Slurm, None))
    recorder._on_operator_config(
        "ADDED",
        {"metadata": {"name": "default"}, "spec": {"maxParallelOperations": 1}},
    )
    for name in ("n1", "n2", "n3"):
        recorder._on_node("ADDED", node_object(name))
    recorder._on_maintenance("ADDED", request_object("on-n1", "n1", "Ready"))
    recorder._on_node("DELETED", node_object("n1"))
    recorder._on_maintenance("MODIFIED", request_object("on-n2", "n2", "Draining"))
    # A node n3 that replaced the one a request was made for: that request holds nothing.
    recorder._on_maintenance(
        "ADDED", request_object("on-old-n3", "n3", "Draining", owner_uid="uid-n3-before")
    )
    assert recorder.in_maintenance() == {"n2"}
    recorder.assert_quiescent()

    recorder._on_maintenance("DELETED", request_object("on-n2", "n2", "Draining"))
    recorder._on_maintenance("ADDED", request_object("waiting", "n3", "Pending"))
    with pytest.raises(AssertionError, match="maintenance-gone-node-slot"):
        recorder.assert_quiescent()
    assert any("waits with a slot free" in v.detail for v in recorder.violations)

    stuck = Recorder(cast(Kube, None), cast(Slurm, None))
    stuck._on_maintenance("ADDED", request_object("on-n1", "n1", "Ready", deleting=True))
    with pytest.raises(AssertionError, match="still holds its finalizer while deleted"):
        stuck.assert_quiescent()
