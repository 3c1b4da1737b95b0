"""topology-placer on the emulator stack: a restarted placer keeps the reservations a killed
one made (no double booking), a GangGroup of two PodGroups is bound in one decision, and a
high-priority gang preempts a low-priority job (DisruptionTarget, nominations, then binds)."""

from __future__ import annotations

import json
from typing import Any

from prometheus_client import REGISTRY

from tests.integration.topology_placer.conftest import (
    NS,
    PODGROUPS,
    TOPOLOGIES,
    Stack,
    eventually,
    gang_pod,
    pod_group_object,
    topology_object,
)

GROUPS_KEY = "gang.scheduling.koordinator.sh/groups"


def _bound(stack: Stack, group: str) -> dict[str, str]:
    return {
        p["metadata"]["name"]: p["spec"].get("nodeName", "")
        for p in stack.pods(group)
        if p["spec"].get("nodeName")
    }


def _gpus_by_node(stack: Stack) -> dict[str, int]:
    used: dict[str, int] = {}
    for pod in stack.sim.store.list("pods", namespace=NS).items:
        node = pod["spec"].get("nodeName")
        if not node or pod["metadata"].get("deletionTimestamp"):
            continue
        for container in pod["spec"]["containers"]:
            gpus = container.get("resources", {}).get("requests", {}).get("nvidia.com/gpu", "0")
            used[node] = used.get(node, 0) + int(gpus)
    return used


async def test_restarted_placer_keeps_the_killed_ones_reservations(stack: Stack) -> None:
    stack.sim.store.create(TOPOLOGIES, topology_object())
    first, second = sorted(n["metadata"]["name"] for n in stack.sim.store.list("nodes").items)[:2]
    # A placer nominated gang "a" to the first two nodes, then died before binding.
    stack.sim.store.create(PODGROUPS, pod_group_object("a", 2))
    for rank in range(2):
        stack.sim.store.create("pods", gang_pod(f"a-{rank}", "a", gpus=8))
        stack.sim.store.patch(
            "pods",
            f"a-{rank}",
            {"status": {"nominatedNodeName": (first, second)[rank]}},
            namespace=NS,
            subresource="status",
        )
    # Gang "b" arrives meanwhile; a fresh placer must not give it a's reserved nodes.
    stack.sim.store.create(PODGROUPS, pod_group_object("b", 6))
    for rank in range(6):
        stack.sim.store.create("pods", gang_pod(f"b-{rank}", "b", gpus=8))
    await stack.start_placer()

    a = await eventually(lambda: len(_bound(stack, "a")) == 2 and _bound(stack, "a"))
    b = await eventually(lambda: len(_bound(stack, "b")) == 6 and _bound(stack, "b"))
    assert a == {"a-0": first, "a-1": second}
    assert set(b.values()).isdisjoint({first, second})
    assert all(gpus <= 8 for gpus in _gpus_by_node(stack).values())


async def test_placer_killed_mid_gang_resumes_without_double_booking(stack: Stack) -> None:
    stack.sim.store.create(TOPOLOGIES, topology_object())
    stack.sim.store.create(PODGROUPS, pod_group_object("train", 4))
    await stack.start_placer()
    await stack.kill_placer()
    for rank in range(4):
        stack.sim.store.create("pods", gang_pod(f"train-{rank}", "train", gpus=8, index=rank))
    await stack.start_placer()
    bound = await eventually(lambda: len(_bound(stack, "train")) == 4 and _bound(stack, "train"))
    assert len(set(bound.values())) == 4
    assert all(gpus <= 8 for gpus in _gpus_by_node(stack).values())


async def test_gang_group_of_two_pod_groups_is_bound_together(stack: Stack) -> None:
    stack.sim.store.create(TOPOLOGIES, topology_object())
    members = json.dumps([f"{NS}/master", f"{NS}/worker"])
    for name, size in (("master", 1), ("worker", 3)):
        group: dict[str, Any] = pod_group_object(name, size)
        group["metadata"]["annotations"][GROUPS_KEY] = members
        stack.sim.store.create(PODGROUPS, group)
    stack.sim.store.create("pods", gang_pod("master-0", "master", gpus=8))
    for rank in range(2):
        stack.sim.store.create("pods", gang_pod(f"worker-{rank}", "worker", gpus=8))
    await stack.start_placer()
    # The worker PodGroup has 2 of its 3 pods: nothing of the GangGroup may be bound.
    await eventually(
        lambda: any(
            c.get("type") == "PodScheduled" and c.get("status") == "False"
            for p in stack.pods("master")
            for c in p.get("status", {}).get("conditions") or []
        ),
        what="the master waits for the worker PodGroup",
    )
    assert not _bound(stack, "master")
    assert not _bound(stack, "worker")
    stack.sim.store.create("pods", gang_pod("worker-2", "worker", gpus=8))
    await eventually(
        lambda: len(_bound(stack, "master")) == 1 and len(_bound(stack, "worker")) == 3,
        what="the whole GangGroup bound",
    )


async def test_high_priority_gang_preempts_a_low_priority_job(stack: Stack) -> None:
    stack.sim.store.create(TOPOLOGIES, topology_object())
    # Priorities come from PriorityClasses, resolved by the API server's admission.
    for name, value in (("batch-low", 1), ("training-high", 1000)):
        stack.sim.store.create(
            "priorityclasses",
            {
                "apiVersion": "scheduling.k8s.io/v1",
                "kind": "PriorityClass",
                "metadata": {"name": name},
                "value": value,
            },
        )
    # Every node is taken by a long-running low-priority pod (placed by the default scheduler).
    for index in range(8):
        low = gang_pod(f"low-{index}", "low", gpus=8)
        low["metadata"]["labels"] = {"app": "low"}
        low["spec"]["schedulerName"] = "default-scheduler"
        low["spec"]["priorityClassName"] = "batch-low"
        stack.sim.store.create("pods", low)
    await eventually(
        lambda: all(
            p["spec"].get("nodeName")
            for p in stack.sim.store.list("pods", namespace=NS).items
            if p["metadata"]["name"].startswith("low-")
        ),
        what="low-priority pods bound",
    )
    low_nodes = {
        p["metadata"]["name"]: p["spec"]["nodeName"]
        for p in stack.sim.store.list("pods", namespace=NS).items
    }
    preemptions = REGISTRY.get_sample_value("nodeflow_topology_placer_preemptions_total") or 0.0
    victims = REGISTRY.get_sample_value("nodeflow_topology_placer_preemption_victims_total") or 0.0
    stack.sim.store.create(PODGROUPS, pod_group_object("hello-job", 2))
    for rank in (1, 2):
        high = gang_pod(f"preemptor-pod-{rank}", "hello-job", gpus=8)
        high["spec"]["priorityClassName"] = "training-high"
        stack.sim.store.create("pods", high)
    conditions: dict[str, dict[str, Any]] = {}

    def record_and_bound() -> dict[str, str] | bool:
        # The victims' conditions are kept as seen: the evicted pods go away.
        for pod in stack.sim.store.list("pods", namespace=NS).items:
            for condition in pod.get("status", {}).get("conditions") or []:
                if condition.get("type") == "DisruptionTarget":
                    conditions[pod["metadata"]["name"]] = condition
        return len(_bound(stack, "hello-job")) == 2 and _bound(stack, "hello-job")

    await stack.start_placer()
    bound = await eventually(
        record_and_bound,
        timeout=30.0,
        what="the preemptor gang bound",
    )
    assert len(conditions) == 2
    condition = next(iter(conditions.values()))
    assert condition["reason"] == "PreemptionByScheduler"
    assert condition["message"] == (
        "nodeflow-placer: preempting to accommodate higher priority pods, preemptor: "
        "default/hello-job, triggerpod: default/preemptor-pod-1"
    )
    live_low = [
        p
        for p in stack.sim.store.list("pods", namespace=NS).items
        if p["metadata"]["name"].startswith("low-") and not p["metadata"].get("deletionTimestamp")
    ]
    assert len(live_low) == 6
    assert set(bound.values()).isdisjoint({p["spec"]["nodeName"] for p in live_low})
    # The evicted victims were exactly the pods on the nodes the gang now holds.
    assert set(bound.values()) == {low_nodes[victim] for victim in conditions}
    assert all(gpus <= 8 for gpus in _gpus_by_node(stack).values())
    after = REGISTRY.get_sample_value("nodeflow_topology_placer_preemptions_total") or 0.0
    assert after == preemptions + 1
    evicted = REGISTRY.get_sample_value("nodeflow_topology_placer_preemption_victims_total") or 0.0
    assert evicted == victims + 2
