"""`python -m topology_placer` as a real process on the placement stack, driven by kubectl,
for the gangs training jobs are: an MPI-style launcher (CPU only) with four 4-GPU workers
under MustGather lands whole in one block, each pod with its own request; and a Running gang
whose worker is deleted and recreated, while its block has no room for it, keeps its other
members (no GangIncomplete eviction) and gets the replacement bound as soon as room appears;
a gang preempting the four replicas of a Deployment evicts only those on the nodes it takes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from nodeflow_runtime.natsd import free_port
from tests.e2e import processes
from tests.e2e.test_placement_process import (
    BLOCK_MUST,
    KubectlWatch,
    apply,
    disruption_target,
    kubectl,
    start_placer,
)
from tests.integration.topology_placer import conftest as placement_stack
from tests.integration.topology_placer.conftest import (
    BLOCK,
    Stack,
    eventually,
    gang_pod,
    pod_group_object,
    topology_object,
)

stack = placement_stack.stack


@pytest.fixture(autouse=True)
def require_kubectl() -> None:
    if processes.KUBECTL is None:
        pytest.skip("kubectl not installed (apt-get install kubernetes-client)")


def _bound(running: Stack, group: str) -> dict[str, str]:
    return {
        p["metadata"]["name"]: p["spec"]["nodeName"]
        for p in running.pods(group)
        if p["spec"].get("nodeName") and not p["metadata"].get("deletionTimestamp")
    }


async def test_launcher_and_four_workers_applied_with_kubectl_land_in_one_block(
    stack: Stack, tmp_path: Path
) -> None:
    # Sized by its largest request (1 CPU and 4 GPUs) the gang would need 5 slots of a
    # block's 4; placed pod by pod, the workers fill the block's GPUs and the launcher takes
    # a CPU beside them.
    launcher = gang_pod("mpi-launcher", "mpi", gpus=0)
    launcher["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "2"}}
    workers = [gang_pod(f"mpi-worker-{rank}", "mpi", gpus=4, index=rank) for rank in range(4)]
    docs = [topology_object(), pod_group_object("mpi", 5, BLOCK_MUST), launcher, *workers]
    await apply(stack, tmp_path, docs)
    process = await start_placer(stack, free_port(), "e2e-placer-hetero")
    try:
        placed = await eventually(
            lambda: len(_bound(stack, "mpi")) == 5 and _bound(stack, "mpi"),
            timeout=30,
            what="the launcher and its four workers bound",
        )
        assert len({stack.node_labels(node)[BLOCK] for node in placed.values()}) == 1
        gpus: dict[str, int] = {}
        for name, node in placed.items():
            if name.startswith("mpi-worker-"):
                gpus[node] = gpus.get(node, 0) + 4
        assert sorted(gpus.values()) == [8, 8]
        shown = await kubectl(
            stack, "get", "pods", "-l", "pod-group.scheduling.sigs.k8s.io=mpi", "-o", "json"
        )
        assert {p["spec"]["nodeName"] for p in json.loads(shown)["items"]} == set(placed.values())
    finally:
        await processes.stop_processes(process, grace=20)


def _pinned(name: str, node: str, gpus: int) -> dict[str, Any]:
    """A pod of another scheduler already on `node` (nodeName set): it takes the room."""
    squatter = gang_pod(name, "other", gpus=gpus)
    squatter["metadata"]["labels"] = {"app": "squatter"}
    squatter["spec"]["schedulerName"] = "default-scheduler"
    squatter["spec"]["nodeName"] = node
    return squatter


async def test_recreated_worker_of_a_running_gang_is_replaced_without_evicting_the_others(
    stack: Stack, tmp_path: Path
) -> None:
    group = pod_group_object("train", 4, BLOCK_MUST)
    # A short wait: a gang that was never satisfied would be past it, and evicted, at once.
    group["spec"]["scheduleTimeoutSeconds"] = 1
    workers = [gang_pod(f"train-{rank}", "train", gpus=4, index=rank) for rank in range(4)]
    await apply(stack, tmp_path, [topology_object(), group, *workers])
    process = await start_placer(stack, free_port(), "e2e-placer-recover")
    try:
        placed = await eventually(
            lambda: len(_bound(stack, "train")) == 4 and _bound(stack, "train"),
            timeout=30,
            what="the gang bound",
        )
        await eventually(
            lambda: stack.pod_group("train").get("status", {}).get("phase") == "Running",
            timeout=30,
            what="the PodGroup Running",
        )
        uids = {p["metadata"]["name"]: p["metadata"]["uid"] for p in stack.pods("train")}
        lost_node = placed["train-3"]
        async with KubectlWatch(stack, "pod-group.scheduling.sigs.k8s.io=train") as watch:
            await kubectl(stack, "delete", "pod", "train-3", "--wait=true")
            # Its room is taken before the replacement arrives: the block has none left.
            await apply(stack, tmp_path, [_pinned("squatter", lost_node, 4)])
            await apply(stack, tmp_path, [gang_pod("train-3", "train", gpus=4, index=3)])

            def waiting_reason() -> str:
                for pod in stack.pods("train"):
                    if pod["metadata"]["name"] != "train-3" or pod["spec"].get("nodeName"):
                        continue
                    for condition in pod.get("status", {}).get("conditions") or []:
                        if condition.get("type") == "PodScheduled":
                            return str(condition.get("reason") or "")
                return ""

            reason = await eventually(waiting_reason, what="the replacement reported waiting")
            assert reason == "Unschedulable"
            # Room appears: the replacement is bound where the lost worker was.
            await kubectl(stack, "delete", "pod", "squatter", "--wait=true")
            await eventually(
                lambda: _bound(stack, "train").get("train-3") == lost_node,
                timeout=30,
                what="the replacement bound in the gang's block",
            )
            # The watch has seen every version up to the replacement's binding.
            await eventually(
                lambda: any(v["spec"].get("nodeName") for v in watch.history("train-3")),
                what="kubectl's watch shows the replacement bound",
            )
        survivors = {p["metadata"]["name"]: p["metadata"]["uid"] for p in stack.pods("train")}
        for name in ("train-0", "train-1", "train-2"):
            assert survivors[name] == uids[name]
            assert all(disruption_target(v) is None for v in watch.history(name))
            assert all(not v["metadata"].get("deletionTimestamp") for v in watch.history(name))
        assert _bound(stack, "train") == placed
    finally:
        await processes.stop_processes(process, grace=20)


def _replica(name: str, owner: str, priority_class: str) -> dict[str, Any]:
    """A Deployment's replica as its ReplicaSet creates it (the emulator runs no Deployment
    controller): owned by the ReplicaSet, bound by the default scheduler, a whole node's GPUs."""
    pod = gang_pod(name, "other", gpus=8)
    pod["metadata"]["labels"] = {"app": owner}
    pod["metadata"]["ownerReferences"] = [
        {
            "apiVersion": "apps/v1",
            "kind": "ReplicaSet",
            "name": f"{owner}-5d8c7b9f4",
            "uid": f"00000000-0000-4000-8000-{len(owner):012d}",
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    pod["spec"]["schedulerName"] = "default-scheduler"
    pod["spec"]["priorityClassName"] = priority_class
    return pod


async def test_rule_a_gang_preempting_a_deployment_evicts_only_the_replicas_on_its_chosen_nodes(
    stack: Stack, tmp_path: Path
) -> None:
    classes: list[dict[str, Any]] = [
        {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": name},
            "value": value,
        }
        for name, value in (("batch-low", 1), ("training-high", 1000), ("serving-top", 2000))
    ]
    # Half the nodes held by pods the gang may not preempt (higher priority), the other half by
    # the four replicas of a low-priority Deployment: the gang of two must take two of them.
    steady = [_replica(f"steady-{index}", "steady", "serving-top") for index in range(4)]
    await apply(stack, tmp_path, [topology_object(), *classes, *steady])

    def bound(app: str) -> dict[str, str]:
        return {
            p["metadata"]["name"]: p["spec"]["nodeName"]
            for p in stack.sim.store.list("pods", namespace="default").items
            if (p["metadata"].get("labels") or {}).get("app") == app and p["spec"].get("nodeName")
        }

    await eventually(lambda: len(bound("steady")) == 4, what="the steady pods bound")
    web = [_replica(f"web-{index}", "web", "batch-low") for index in range(4)]
    await apply(stack, tmp_path, web)
    replicas = await eventually(
        lambda: len(bound("web")) == 4 and bound("web"), what="the Deployment's replicas bound"
    )
    uids = {
        p["metadata"]["name"]: p["metadata"]["uid"]
        for p in stack.sim.store.list("pods", namespace="default").items
    }
    high = [gang_pod(f"hello-job-{rank}", "hello-job", gpus=8) for rank in (0, 1)]
    for pod in high:
        pod["spec"]["priorityClassName"] = "training-high"
    process = await start_placer(stack, free_port(), "e2e-placer-replicas")
    try:
        async with KubectlWatch(stack, "app=web") as victims:
            await apply(stack, tmp_path, [pod_group_object("hello-job", 2), *high])
            placed = await eventually(
                lambda: len(_bound(stack, "hello-job")) == 2 and _bound(stack, "hello-job"),
                timeout=30,
                what="the gang bound",
            )
            chosen = set(placed.values())
            spared = sorted(name for name, node in replicas.items() if node not in chosen)
            # The watch has caught up with every pod still there.
            await eventually(
                lambda: all(victims.history(name) for name in spared),
                what="kubectl's watch shows the spared replicas",
            )
        marked = {
            v["metadata"]["name"]: v["spec"]["nodeName"]
            for v in victims.versions
            if disruption_target(v) is not None
        }
        # Only the replicas on the two nodes the gang took were marked and deleted.
        assert sorted(marked) == sorted(n for n, node in replicas.items() if node in chosen)
        assert set(marked.values()) == chosen
        assert len(spared) == 2
        shown = await kubectl(stack, "get", "pods", "-l", "app=web", "-o", "json")
        live = {
            p["metadata"]["name"]: p
            for p in json.loads(shown)["items"]
            if not p["metadata"].get("deletionTimestamp")
        }
        assert sorted(live) == spared
        for name in spared:
            assert live[name]["metadata"]["uid"] == uids[name]
            assert live[name]["spec"]["nodeName"] == replicas[name]
            assert all(disruption_target(v) is None for v in victims.history(name))
        steady_now = await kubectl(stack, "get", "pods", "-l", "app=steady", "-o", "json")
        assert {p["metadata"]["uid"] for p in json.loads(steady_now)["items"]} == {
            uids[f"steady-{index}"] for index in range(4)
        }
    finally:
        await processes.stop_processes(process, grace=20)
