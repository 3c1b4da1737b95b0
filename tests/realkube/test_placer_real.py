"""topology-placer on the real control plane: gangs (PodGroups, schedulerName nodeflow-placer)
on KWOK nodes carrying the simulator's topology labels, bound by topology-placer through
k8s-watcher while the real kube-scheduler leaves their pods alone. A gang that cannot fit its
block stays wholly unbound until a node joins that block; the chaos suite's recorder holds
all-or-nothing (no gang bound in part) throughout."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest

from tests.e2e.chaos_support import (
    NODES,
    POD_GROUPS,
    PODS,
    TOPOLOGIES,
    Recorder,
    Stack,
    condition,
    is_true,
    recording,
)
from tests.e2e.test_chaos_gang import BLOCK, member, pod_group, topology
from tests.realkube.stack import real_stack
from tests.realkube.support import STEP_TIMEOUT, until

pytestmark = [pytest.mark.real_kube, pytest.mark.timeout(600)]

EVENTS = "/api/v1/namespaces/default/events"


async def submit_gang(stack: Stack, group: str, members: int) -> None:
    await stack.kube.create(POD_GROUPS, pod_group(group, members))
    for rank in range(members):
        await stack.kube.create(PODS, member(group, rank))


def bound_blocks(recorder: Recorder, group: str) -> list[str]:
    """The block of each member's node, for the members that are bound."""
    return [
        recorder.nodes[p["spec"]["nodeName"]]["metadata"]["labels"][BLOCK]
        for p in recorder.gang_members(group)
        if (p.get("spec") or {}).get("nodeName")
    ]


async def placed_whole(recorder: Recorder, group: str, members: int) -> bool:
    pods = recorder.gang_members(group)
    nodes = {(p.get("spec") or {}).get("nodeName") for p in pods}
    phase = ((recorder.pod_groups.get(group) or {}).get("status") or {}).get("phase")
    return (
        len(pods) == members
        and all(nodes)
        and len(nodes) == members
        and len(set(bound_blocks(recorder, group))) == 1
        and all(p["status"].get("phase") == "Running" for p in pods)
        and phase in ("Scheduled", "Running")
    )


async def test_topology_placer_binds_gangs_whole_in_one_block_and_kube_scheduler_leaves_them_alone(
    tmp_path: Path,
) -> None:
    async with real_stack(tmp_path) as stack, recording(stack) as recorder:
        extra = "node-extra"
        try:
            await stack.kube.create(TOPOLOGIES, topology())
            # Five whole-node pods that must gather in one block of four nodes: nowhere to go.
            await submit_gang(stack, "wide", 5)

            async def reported_unschedulable() -> bool:
                pods = recorder.gang_members("wide")
                return len(pods) == 5 and all(
                    (condition(p, "PodScheduled") or {}).get("reason") == "Unschedulable"
                    for p in pods
                )

            await until(reported_unschedulable, "the gang of 5 reported Unschedulable")
            assert bound_blocks(recorder, "wide") == []
            # A fifth node joins the first block: the gang fits there and is bound whole.
            first_block = sorted(
                (name for name, node in recorder.nodes.items() if name.startswith("node-")),
            )[0]
            model = await stack.kube.call("GET", f"{NODES}/{first_block}")
            await stack.kube.create(
                NODES,
                {
                    "apiVersion": "v1",
                    "kind": "Node",
                    "metadata": {
                        "name": extra,
                        "labels": {
                            **model["metadata"]["labels"],
                            "kubernetes.io/hostname": extra,
                        },
                        "annotations": {"kwok.x-k8s.io/node": "fake"},
                    },
                    # Its capacity (8 GPUs) as the model's: KWOK keeps what the node is
                    # created with.
                    "status": {
                        "capacity": model["status"]["capacity"],
                        "allocatable": model["status"]["allocatable"],
                    },
                },
            )

            async def extra_ready() -> bool:
                node = recorder.nodes.get(extra)
                return node is not None and is_true(node, "Ready")

            await until(extra_ready, f"{extra} Ready (KWOK)")
            await until(lambda: placed_whole(recorder, "wide", 5), "the gang of 5 bound whole")
            assert set(bound_blocks(recorder, "wide")) == {model["metadata"]["labels"][BLOCK]}

            # A gang of four fits another block at once.
            await submit_gang(stack, "train", 4)
            await until(lambda: placed_whole(recorder, "train", 4), "the gang of 4 bound whole")
            assert set(bound_blocks(recorder, "train")).isdisjoint(bound_blocks(recorder, "wide"))

            # kube-scheduler never touched them: every Scheduled event came from us, none from
            # the default scheduler (which only takes pods whose schedulerName is its own).
            events = await stack.kube.items(EVENTS)
            members = {
                p["metadata"]["name"] for g in ("wide", "train") for p in recorder.gang_members(g)
            }
            from_default = [
                e
                for e in events
                if e["involvedObject"].get("name") in members
                and "default-scheduler"
                in (e.get("reportingComponent"), (e.get("source") or {}).get("component"))
            ]
            assert from_default == []
            recorder.assert_quiescent()
        finally:
            for group in ("wide", "train"):
                for pod in recorder.gang_members(group):
                    with contextlib.suppress(RuntimeError):
                        await stack.kube.delete(f"{PODS}/{pod['metadata']['name']}")
                with contextlib.suppress(RuntimeError):
                    await stack.kube.delete(f"{POD_GROUPS}/{group}")
            with contextlib.suppress(RuntimeError):
                await stack.kube.delete(f"{TOPOLOGIES}/default")

            async def gone() -> bool:
                return not recorder.gang_members("wide") and not recorder.gang_members("train")

            await until(gone, "every gang pod gone", STEP_TIMEOUT * 2)
            with contextlib.suppress(RuntimeError):
                await stack.kube.delete(f"{NODES}/{extra}")
