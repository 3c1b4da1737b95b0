"""topology-placer on the real control plane for the gangs training jobs are (issue #31 items 1,
4 and 8), driven with kubectl: an MPI-style launcher (CPU only) with four whole-node workers
under MustGather lands in one block; a Running gang whose worker is deleted and recreated while
its block has no room keeps its other members and gets the replacement bound once room appears;
a gang preempting a 4-replica Deployment (real ReplicaSet controller, kube-scheduler) evicts
only the replicas on the nodes it takes. KWOK runs the pods; the chaos suite's recorder
watches, and holds all-or-nothing (no gang bound in part) throughout."""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e.chaos_support import (
    POD_GROUP_LABEL,
    Recorder,
    condition,
    recording,
    terminating,
)
from tests.e2e.test_chaos_gang import BLOCK, member, pod_group, topology
from tests.realkube.stack import real_stack
from tests.realkube.support import STEP_TIMEOUT, kubectl, until

pytestmark = [pytest.mark.real_kube, pytest.mark.timeout(900)]

# Generous: on the 2-core CI machine a placer step under load has taken more than 90 s.
WAIT = STEP_TIMEOUT * 3
# Seconds a recovering gang is watched while its replacement cannot be placed: five times its
# waiting time (scheduleTimeoutSeconds 1), so a timeout or an eviction would show.
RECOVERY_WINDOW = 5.0


async def apply(docs: list[dict[str, Any]]) -> None:
    await kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all(docs))


async def delete(*args: str) -> None:
    await kubectl("delete", "--ignore-not-found", "--wait=false", *args)


def node_of(pod: dict[str, Any]) -> str:
    return str((pod.get("spec") or {}).get("nodeName") or "")


def block_of(recorder: Recorder, node: str) -> str:
    return str(recorder.nodes[node]["metadata"]["labels"][BLOCK])


def bound(recorder: Recorder, group: str) -> dict[str, str]:
    """Each live member bound to a node: its node."""
    return {p["metadata"]["name"]: node_of(p) for p in recorder.gang_members(group) if node_of(p)}


async def running_whole(recorder: Recorder, group: str, members: int) -> dict[str, str] | None:
    """The members' nodes once all of them are bound and running, and their PodGroup too."""
    pods = recorder.gang_members(group)
    phase = ((recorder.pod_groups.get(group) or {}).get("status") or {}).get("phase")
    if (
        len(pods) == members
        and all(node_of(p) for p in pods)
        and all((p.get("status") or {}).get("phase") == "Running" for p in pods)
        and phase == "Running"
    ):
        return bound(recorder, group)
    return None


def live(recorder: Recorder, app: str) -> dict[str, dict[str, Any]]:
    return {
        name: p
        for name, p in recorder.pods.items()
        if (p["metadata"].get("labels") or {}).get("app") == app and not terminating(p)
    }


async def running(recorder: Recorder, app: str, count: int) -> dict[str, dict[str, Any]] | None:
    pods = live(recorder, app)
    if len(pods) == count and all(
        node_of(p) and (p.get("status") or {}).get("phase") == "Running" for p in pods.values()
    ):
        return pods
    return None


def untouched(pod: dict[str, Any] | None, uid: str, node: str) -> None:
    """The pod is the one that was there, on its node, neither marked nor being deleted."""
    assert pod is not None and pod["metadata"]["uid"] == uid, f"{uid} was evicted"
    assert node_of(pod) == node
    assert not terminating(pod)
    assert condition(pod, "DisruptionTarget") is None


async def remove_gangs(recorder: Recorder, *groups: str) -> None:
    for group in groups:
        await delete("pods", "-l", f"{POD_GROUP_LABEL}={group}")
        await delete(f"podgroups.scheduling.sigs.k8s.io/{group}")

    async def gone() -> bool:
        return not any(
            (p["metadata"].get("labels") or {}).get(POD_GROUP_LABEL) in groups
            for p in recorder.pods.values()
        )

    await until(gone, f"every pod of {groups} gone", WAIT)


async def test_rule_a_launcher_and_four_workers_under_must_gather_land_in_one_block(
    tmp_path: Path,
) -> None:
    async with real_stack(tmp_path) as stack, recording(stack) as recorder:
        try:
            # Sized by its largest request the gang would need five whole nodes of a
            # block's four; placed pod by pod, the workers take the block's four nodes and
            # the CPU-only launcher a CPU beside one of them.
            launcher = member("mpi", 0)
            launcher["metadata"]["name"] = "mpi-launcher"
            launcher["metadata"]["annotations"] = {}
            launcher["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "2"}}
            workers = [member("mpi", rank) for rank in range(4)]
            await apply([topology(), pod_group("mpi", 5), launcher, *workers])
            placed: dict[str, str] = await until(
                lambda: running_whole(recorder, "mpi", 5),
                "the launcher and its four workers bound and Running",
                WAIT,
            )
            assert len({block_of(recorder, node) for node in placed.values()}) == 1
            worker_nodes = {n for name, n in placed.items() if name != "mpi-launcher"}
            assert len(worker_nodes) == 4
            assert placed["mpi-launcher"] in worker_nodes
            _, shown, _ = await kubectl("get", "pods", "-l", f"{POD_GROUP_LABEL}=mpi", "-o", "json")
            assert {
                p["metadata"]["name"]: p["spec"]["nodeName"] for p in json.loads(shown)["items"]
            } == placed
            recorder.assert_quiescent()
        finally:
            await remove_gangs(recorder, "mpi")
            await delete("clusternetworktopologies.scheduling.koordinator.sh/default")


async def test_rule_a_recreated_worker_of_a_running_gang_is_replaced_without_evicting_the_others(
    tmp_path: Path,
) -> None:
    async with real_stack(tmp_path) as stack, recording(stack) as recorder:
        try:
            group = pod_group("train", 4)
            # A short wait: a gang that never reached minMember would be past it, and
            # evicted, at once.
            group["spec"]["scheduleTimeoutSeconds"] = 1
            await apply([topology(), group, *(member("train", rank) for rank in range(4))])
            placed: dict[str, str] = await until(
                lambda: running_whole(recorder, "train", 4),
                "the gang bound and Running",
                WAIT,
            )
            uids = {
                p["metadata"]["name"]: p["metadata"]["uid"] for p in recorder.gang_members("train")
            }
            lost_node = placed["train-3"]
            await kubectl("delete", "pod", "train-3", "--wait=true")
            # Its room is taken before the replacement arrives: the block has none left.
            squatter = member("squatter", 0)
            squatter["metadata"] = {"name": "squatter", "labels": {"app": "squatter"}}
            squatter["spec"]["schedulerName"] = "default-scheduler"
            squatter["spec"]["nodeName"] = lost_node
            await apply([squatter])
            await until(lambda: running(recorder, "squatter", 1), "the squatter Running", WAIT)
            await apply([member("train", 3)])

            async def waiting_reason() -> str:
                pod = recorder.pods.get("train-3")
                if pod is None or node_of(pod) or pod["metadata"]["uid"] == uids["train-3"]:
                    return ""
                return str((condition(pod, "PodScheduled") or {}).get("reason") or "")

            assert await until(waiting_reason, "the replacement reported waiting", WAIT) == (
                "Unschedulable"
            )
            # Several times the gang's waiting time goes by: a recovering gang neither times
            # out nor loses its other members meanwhile.
            await asyncio.sleep(RECOVERY_WINDOW)
            assert await waiting_reason() == "Unschedulable"
            for name in ("train-0", "train-1", "train-2"):
                untouched(recorder.pods.get(name), uids[name], placed[name])
            await kubectl("delete", "pod", "squatter", "--wait=true")

            async def replaced() -> bool:
                return bound(recorder, "train").get("train-3") == lost_node

            await until(replaced, "the replacement bound where the lost worker was", WAIT)
            for name in ("train-0", "train-1", "train-2"):
                untouched(recorder.pods.get(name), uids[name], placed[name])
            recorder.assert_quiescent()
        finally:
            await delete("pod", "squatter")
            await remove_gangs(recorder, "train")
            await delete("clusternetworktopologies.scheduling.koordinator.sh/default")


POOL = "nodeflow.dev/test-pool"
GANG_POOL = "nodeflow.dev/test-gang-pool"


def priority_classes() -> list[dict[str, Any]]:
    """The victims' (batch-low) and the preempting gang's (training-high) PriorityClasses."""
    return [
        {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": name},
            "value": value,
        }
        for name, value in (("batch-low", 1), ("training-high", 1000))
    ]


def deployment(name: str, replicas: int, priority_class: str) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "priorityClassName": priority_class,
                    "nodeSelector": {POOL: name},
                    "terminationGracePeriodSeconds": 1,
                    "containers": [
                        {
                            "name": "server",
                            "image": "server:0.1",
                            "resources": {
                                "requests": {"cpu": "1", "nvidia.com/gpu": "8"},
                                "limits": {"nvidia.com/gpu": "8"},
                            },
                        }
                    ],
                },
            },
        },
    }


async def test_rule_a_gang_preempting_a_deployment_evicts_only_the_replicas_on_its_chosen_nodes(
    tmp_path: Path,
) -> None:
    classes = priority_classes()
    async with real_stack(tmp_path) as stack, recording(stack) as recorder:
        pool = sorted(n for n in recorder.nodes if n.startswith("node-") and n[5:].isdigit())
        pool = pool[:4]
        try:
            # Four whole nodes the Deployment's replicas and the gang both may use.
            for node in pool:
                await kubectl("label", "node", node, f"{POOL}=web", f"{GANG_POOL}=yes")
            await apply([*classes, deployment("web", 4, "batch-low")])
            replicas: dict[str, dict[str, Any]] = await until(
                lambda: running(recorder, "web", 4),
                "the Deployment's four replicas Running",
                WAIT,
            )
            assert {node_of(p) for p in replicas.values()} == set(pool)
            uids = {name: p["metadata"]["uid"] for name, p in replicas.items()}
            # The replicas the ReplicaSet makes for the ones evicted find no node (the
            # pool label goes; the running ones stay, as with any IgnoredDuringExecution
            # selector): kube-scheduler never sees the placer's nominations, so a
            # replacement could otherwise take a freed node before the gang is bound.
            for node in pool:
                await kubectl("label", "node", node, f"{POOL}-")
            gang: dict[str, Any] = {
                "apiVersion": "scheduling.sigs.k8s.io/v1alpha1",
                "kind": "PodGroup",
                "metadata": {"name": "hello-job", "namespace": "default"},
                "spec": {"minMember": 2},
            }
            members = [member("hello-job", rank) for rank in range(2)]
            for pod in members:
                pod["spec"]["priorityClassName"] = "training-high"
                pod["spec"]["nodeSelector"] = {GANG_POOL: "yes"}
            await apply([gang, *members])
            placed: dict[str, str] = await until(
                lambda: running_whole(recorder, "hello-job", 2),
                "the gang bound and Running",
                WAIT,
            )
            chosen = set(placed.values())
            assert len(chosen) == 2 and chosen <= set(pool)
            spared = {name for name, p in replicas.items() if node_of(p) not in chosen}
            assert len(spared) == 2
            now = live(recorder, "web")
            # The replicas on the other two nodes were never touched.
            for name in spared:
                untouched(now.get(name), uids[name], node_of(replicas[name]))
            # The two on the chosen nodes are gone; their replacements wait for a node.
            assert not (set(replicas) - spared) & set(now)
            _, shown, _ = await kubectl("get", "pods", "-l", "app=web", "-o", "json")
            on_nodes = {
                p["metadata"]["uid"]
                for p in json.loads(shown)["items"]
                if p["spec"].get("nodeName") and not p["metadata"].get("deletionTimestamp")
            }
            assert on_nodes == {uids[name] for name in spared}
            recorder.assert_quiescent()
        finally:
            await delete("deployment", "web")
            await remove_gangs(recorder, "hello-job")

            async def web_gone() -> bool:
                return not any(
                    (p["metadata"].get("labels") or {}).get("app") == "web"
                    for p in recorder.pods.values()
                )

            await until(web_gone, "every replica gone", WAIT)
            for node in pool:
                with contextlib.suppress(AssertionError):
                    await kubectl("label", "node", node, f"{POOL}-", f"{GANG_POOL}-")
            for item in classes:
                await delete(f"priorityclass/{item['metadata']['name']}")


def workload_member(group: str, rank: int, priority_class: str) -> dict[str, Any]:
    """A pod of the Workload API's PodGroup `group` (spec.schedulingGroup), placed by
    kube-scheduler on a whole node of the pool. (Named apart from every gang of the suite: the
    Events of its scheduling outlive it, and other tests read who scheduled their pods.)"""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"{group}-{rank}", "namespace": "default", "labels": {"app": group}},
        "spec": {
            "schedulingGroup": {"podGroupName": group},
            "priorityClassName": priority_class,
            "nodeSelector": {POOL: group},
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


async def test_rule_a_gang_preempting_a_workload_pod_group_in_mode_pod_group_evicts_all_of_it(
    tmp_path: Path,
) -> None:
    """KEP-4671 on Kubernetes 1.36's alpha Workload API (served by `make test-real-kube`'s
    control plane): a PodGroup of scheduling.k8s.io/v1alpha2 in disruptionMode PodGroup loses
    all four of its pods, though the gang needs one node, and none of them is left running."""
    classes = priority_classes()
    workload_group = {
        "apiVersion": "scheduling.k8s.io/v1alpha2",
        "kind": "PodGroup",
        "metadata": {"name": "offline-eval", "namespace": "default"},
        "spec": {"schedulingPolicy": {"gang": {"minCount": 4}}, "disruptionMode": "PodGroup"},
    }
    async with real_stack(tmp_path) as stack, recording(stack) as recorder:
        pool = sorted(n for n in recorder.nodes if n.startswith("node-") and n[5:].isdigit())
        pool = pool[:4]
        try:
            for node in pool:
                await kubectl("label", "node", node, f"{POOL}=offline-eval", f"{GANG_POOL}=yes")
            await apply([*classes, workload_group])
            await apply([workload_member("offline-eval", rank, "batch-low") for rank in range(4)])
            trainers: dict[str, dict[str, Any]] = await until(
                lambda: running(recorder, "offline-eval", 4), "its four pods Running", WAIT
            )
            assert {node_of(p) for p in trainers.values()} == set(pool)
            gang: dict[str, Any] = {
                "apiVersion": "scheduling.sigs.k8s.io/v1alpha1",
                "kind": "PodGroup",
                "metadata": {"name": "hello-job", "namespace": "default"},
                "spec": {"minMember": 1},
            }
            preemptor = member("hello-job", 0)
            preemptor["spec"]["priorityClassName"] = "training-high"
            preemptor["spec"]["nodeSelector"] = {GANG_POOL: "yes"}
            await apply([gang, preemptor])
            placed: dict[str, str] = await until(
                lambda: running_whole(recorder, "hello-job", 1), "the gang bound and Running", WAIT
            )
            assert set(placed.values()) <= set(pool)

            async def all_of_it_gone() -> bool:
                return not live(recorder, "offline-eval")

            # Every pod of the group goes, not only the one on the node the gang took.
            await until(all_of_it_gone, "every pod of the PodGroup evicted", WAIT)
            recorder.assert_quiescent()
        finally:
            await delete("pods", "-l", "app=offline-eval")
            await delete("podgroups.scheduling.k8s.io/offline-eval")
            await remove_gangs(recorder, "hello-job")
            for node in pool:
                with contextlib.suppress(AssertionError):
                    await kubectl("label", "node", node, f"{POOL}-", f"{GANG_POOL}-")
            for item in classes:
                await delete(f"priorityclass/{item['metadata']['name']}")
