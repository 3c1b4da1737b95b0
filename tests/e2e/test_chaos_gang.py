"""Chaos on gang placement, the whole stack as `make run` starts it (8 nodes of 8 GPUs, two
blocks of four): two PodGroups of 4 whole-node pods (schedulerName nodeflow-placer,
MustGather in a block), the second created halfway through the kills, while topology-placer,
k8s-watcher and nats-server are killed with kill -9 at seeded random points (CHAOS_SEED=<seed>
replays a run). No gang stays bound in part, and each ends bound whole inside one block."""

from __future__ import annotations

import asyncio
import json
import random
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.chaos_support import (
    NATS,
    POD_GROUP_LABEL,
    POD_GROUPS,
    PODS,
    TOPOLOGIES,
    Monkey,
    Recorder,
    Stack,
    chaos_seed,
    launched_stack,
    recording,
    summary,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

TOPOLOGY = "spines=1,blocks_per_spine=2,nodes_per_block=4"
SPINE = "network.topology.nvidia.com/spine"
BLOCK = "network.topology.nvidia.com/block"
MEMBERS = 4
BLOCK_MUST = json.dumps({"gatherStrategy": [{"layer": "BlockLayer", "strategy": "MustGather"}]})


def topology() -> dict[str, Any]:
    return {
        "apiVersion": "scheduling.koordinator.sh/v1alpha1",
        "kind": "ClusterNetworkTopology",
        "metadata": {"name": "default"},
        "spec": {
            "networkTopologySpec": [
                {"topologyLayer": "SpineLayer", "labelKey": [SPINE]},
                {
                    "topologyLayer": "BlockLayer",
                    "parentTopologyLayer": "SpineLayer",
                    "labelKey": [BLOCK],
                },
                {"topologyLayer": "NodeTopologyLayer", "parentTopologyLayer": "BlockLayer"},
            ]
        },
    }


def pod_group(name: str, members: int = MEMBERS) -> dict[str, Any]:
    return {
        "apiVersion": "scheduling.sigs.k8s.io/v1alpha1",
        "kind": "PodGroup",
        "metadata": {
            "name": name,
            "namespace": "default",
            "annotations": {"gang.scheduling.koordinator.sh/network-topology-spec": BLOCK_MUST},
        },
        "spec": {"minMember": members},
    }


def member(group: str, rank: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{group}-{rank}",
            "namespace": "default",
            "labels": {POD_GROUP_LABEL: group},
            "annotations": {"gang.scheduling.koordinator.sh/network-topology-index": str(rank)},
        },
        "spec": {
            "schedulerName": "nodeflow-placer",
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "trainer",
                    "image": "trainer:0.1",
                    "resources": {
                        "requests": {"cpu": "1", "nvidia.com/gpu": "8"},
                        "limits": {"nvidia.com/gpu": "8"},
                    },
                }
            ],
        },
    }


async def submit_gang(stack: Stack, group: str) -> None:
    await stack.kube.create(POD_GROUPS, pod_group(group))
    for rank in range(MEMBERS):
        await stack.kube.create(PODS, member(group, rank))


def placed_whole(recorder: Recorder, group: str) -> bool:
    members = recorder.gang_members(group)
    nodes = [(p.get("spec") or {}).get("nodeName") for p in members]
    if len(members) != MEMBERS or not all(nodes):
        return False
    blocks = {recorder.nodes[str(node)]["metadata"]["labels"][BLOCK] for node in nodes}
    phase = (recorder.pod_groups.get(group) or {}).get("status", {}).get("phase")
    return len(blocks) == 1 and len(set(nodes)) == MEMBERS and phase in ("Scheduled", "Running")


async def test_chaos_gang_placement_never_leaves_a_gang_bound_in_part(tmp_path: Path) -> None:
    rng = random.Random(chaos_seed())
    async with (
        launched_stack(tmp_path / "run", 8, TOPOLOGY) as stack,
        recording(stack) as recorder,
    ):
        await stack.kube.create(TOPOLOGIES, topology())
        monkey = Monkey(stack, rng)
        chaos = asyncio.create_task(
            monkey.run(["topology-placer", "k8s-watcher", NATS], pause=(0.0, 1.5))
        )
        await submit_gang(stack, "train-a")
        await asyncio.wait_for(monkey.half_done.wait(), 300)
        await submit_gang(stack, "train-b")
        kills = await chaos

        def both_placed() -> bool:
            return placed_whole(recorder, "train-a") and placed_whole(recorder, "train-b")

        took = await recorder.converged(both_placed, monkey.last_kill, "both gangs bound whole")
        print(f"gangs placed {took:.1f} s after the last kill; {summary(kills)}")
        recorder.assert_quiescent()
