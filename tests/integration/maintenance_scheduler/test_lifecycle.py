"""maintenance-scheduler on the emulator stack: a request through every phase to Ready and
back, the cordon rules, the budgets, PodDisruptionBudgets and a restart mid-drain."""

from __future__ import annotations

import pytest

from tests.integration.maintenance_scheduler.conftest import NS, Stack, condition, eventually

pytestmark = pytest.mark.slow

DRAIN = {"force": True, "deleteEmptyDir": True, "timeoutSeconds": 0}


async def test_rule_request_goes_to_ready_and_deletion_uncordons(stack: Stack) -> None:
    node = stack.node_names()[0]
    stack.run_pod("web", node)
    await eventually(lambda: (stack.pod("web") or {}).get("status", {}).get("phase") == "Running")
    await stack.start_scheduler()
    stack.request("m1", node, drainSpec=DRAIN)
    await eventually(lambda: stack.phase("m1") == "Ready", what="m1 Ready")
    request = stack.get_request("m1")
    assert request is not None
    ready = condition(request, "Ready")
    assert ready is not None and ready["status"] == "True"
    assert "maintenance.nvidia.com/finalizer" in request["metadata"]["finalizers"]
    annotations = request["metadata"]["annotations"]
    assert annotations["maintenance.nvidia.com/node-initial-state.unschedulable"] == "false"
    assert "maintenance.nvidia.com/ready-time" in annotations or await eventually(
        lambda: (
            "maintenance.nvidia.com/ready-time"
            in (stack.get_request("m1") or {})["metadata"].get("annotations", {})
        )
    )
    assert request["status"]["drain"]["drainProgress"] == 100
    assert stack.unschedulable(node)
    assert stack.pod("web") is None
    await eventually(lambda: len(stack.events("ConditionChanged")) >= 6, what="phase Events")
    messages = {e["message"] for e in stack.events("ConditionChanged")}
    assert {"Pending", "Scheduled", "Cordon", "WaitForPodCompletion", "Draining", "Ready"} <= (
        messages
    )
    await eventually(lambda: any(d.kind == "scheduled" for d in stack.decisions))
    assert any(d.kind == "evict" and d.pod == f"{NS}/web" for d in stack.decisions)

    stack.delete_request("m1")
    await eventually(lambda: stack.get_request("m1") is None, what="m1 gone")
    assert not stack.unschedulable(node)


async def test_rule_pre_cordoned_node_stays_cordoned_after_deletion(stack: Stack) -> None:
    node = stack.node_names()[1]
    stack.cordon(node)
    await stack.start_scheduler()
    stack.request("pre", node)
    await eventually(lambda: stack.phase("pre") == "Ready", what="pre Ready")
    annotations = (stack.get_request("pre") or {})["metadata"]["annotations"]
    assert annotations["maintenance.nvidia.com/node-initial-state.unschedulable"] == "true"
    stack.delete_request("pre")
    await eventually(lambda: stack.get_request("pre") is None, what="pre gone")
    assert stack.unschedulable(node)


async def test_rule_max_parallel_operations_serves_requests_in_turn(stack: Stack) -> None:
    first, second = stack.node_names()[:2]
    stack.set_config(maxParallelOperations=1)
    await stack.start_scheduler()
    stack.request("a", first)
    await eventually(lambda: stack.phase("a") == "Ready", what="a Ready")
    stack.request("b", second)
    await eventually(
        lambda: any(d.kind == "skipped" and d.name == "b" for d in stack.decisions),
        what="b skipped for want of a slot",
    )
    assert stack.phase("b") == "Pending"
    stack.delete_request("a")
    await eventually(lambda: stack.phase("b") == "Ready", what="b Ready after a is gone")


async def test_rule_a_deleted_node_takes_its_maintenance_with_it_and_frees_the_slot(
    stack: Stack,
) -> None:
    # The Node owns each request once scheduled: the garbage collector deletes the request
    # when its node is deleted, the cleanup drops the finalizer (nothing to uncordon), and
    # the parallel-operations slot it held goes to the next request, once the node has been
    # absent for NODE_GONE_GRACE_SECONDS (shortened here; the rule is unchanged).
    gone, other = stack.node_names()[:2]
    stack.set_config(maxParallelOperations=1)
    await stack.start_scheduler(node_gone_grace_seconds=1.0)
    stack.request("on-gone", gone)
    await eventually(lambda: stack.phase("on-gone") == "Ready", what="on-gone Ready")
    owners = (stack.get_request("on-gone") or {})["metadata"]["ownerReferences"]
    node = stack.node(gone)["metadata"]
    assert owners == [{"apiVersion": "v1", "kind": "Node", "name": gone, "uid": node["uid"]}]
    stack.request("next", other)
    await eventually(
        lambda: any(d.kind == "skipped" and d.name == "next" for d in stack.decisions),
        what="next skipped for want of a slot",
    )
    stack.sim.store.delete("nodes", gone)
    await eventually(lambda: stack.get_request("on-gone") is None, what="on-gone collected")
    await eventually(lambda: stack.phase("next") == "Ready", what="next Ready in the freed slot")


async def test_rule_a_request_is_owned_by_its_node_while_still_pending(stack: Stack) -> None:
    # Upstream sets the Node owner at the first reconcile, before the phase: a request that
    # waits for a slot is already bound to its node (and would go with it).
    busy, waiting = stack.node_names()[:2]
    stack.set_config(maxParallelOperations=1)
    await stack.start_scheduler()
    stack.request("first", busy)
    await eventually(lambda: stack.phase("first") == "Ready", what="first Ready")
    stack.request("waiting", waiting)
    await eventually(
        lambda: any(d.kind == "skipped" and d.name == "waiting" for d in stack.decisions),
        what="waiting skipped for want of a slot",
    )
    await eventually(
        lambda: (stack.get_request("waiting") or {})["metadata"].get("ownerReferences"),
        what="the owner set while Pending",
    )
    owners = (stack.get_request("waiting") or {})["metadata"]["ownerReferences"]
    uid = stack.node(waiting)["metadata"]["uid"]
    assert owners == [{"apiVersion": "v1", "kind": "Node", "name": waiting, "uid": uid}]
    assert stack.phase("waiting") == "Pending"


async def test_rule_a_request_made_for_a_replaced_node_is_never_started_on_the_newcomer(
    stack: Stack,
) -> None:
    # The request names, as its owner, a node of that name the garbage collector has not yet
    # caught up with (another uid): the node now of that name is another, nothing is done on it.
    node = stack.node_names()[1]
    await stack.start_scheduler()
    stack.sim.store.create(
        "nodemaintenances.maintenance.nvidia.com",
        {
            "apiVersion": "maintenance.nvidia.com/v1alpha1",
            "kind": "NodeMaintenance",
            "metadata": {
                "name": "for-the-predecessor",
                "namespace": NS,
                "ownerReferences": [
                    {"apiVersion": "v1", "kind": "Node", "name": node, "uid": "predecessor"}
                ],
            },
            "spec": {"requestorID": "it.nodeflow.dev", "nodeName": node},
        },
    )
    await eventually(
        lambda: (
            "is gone"
            in str(
                (condition(stack.get_request("for-the-predecessor") or {}, "Ready") or {}).get(
                    "message"
                )
            )
        ),
        what="NodeNotFound message",
    )
    await eventually(lambda: stack.events("NodeNotFound"), what="NodeNotFound Event")
    assert stack.phase("for-the-predecessor") == "Pending"
    assert not stack.unschedulable(node)
    assert not any(
        d.kind == "scheduled" and d.name == "for-the-predecessor" for d in stack.decisions
    )


async def test_rule_missing_node_stays_pending_with_message(stack: Stack) -> None:
    await stack.start_scheduler()
    stack.request("ghost", "no-such-node")
    await eventually(
        lambda: (
            (condition(stack.get_request("ghost") or {}, "Ready") or {}).get("message")
            == "node no-such-node does not exist"
        ),
        what="message",
    )
    assert stack.phase("ghost") == "Pending"
    await eventually(lambda: stack.events("NodeNotFound"), what="NodeNotFound Event")


async def test_rule_pdb_holds_drain_and_restart_evicts_once(stack: Stack) -> None:
    node = stack.node_names()[2]
    pod = stack.run_pod("guarded", node, labels={"app": "guarded"})
    await eventually(
        lambda: (stack.pod("guarded") or {}).get("status", {}).get("phase") == "Running"
    )
    stack.sim.store.create(
        "poddisruptionbudgets.policy",
        {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {"name": "guard", "namespace": NS},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "guarded"}}},
        },
    )
    await stack.start_scheduler()
    stack.request("held", node, drainSpec=DRAIN)
    await eventually(lambda: stack.phase("held") == "Draining", what="held Draining")
    await eventually(
        lambda: any(o.op == "evict" and o.outcome == "retrying" for o in stack.outcomes),
        what="eviction refused by the PodDisruptionBudget",
    )
    assert stack.pod("guarded") is not None
    # Killed mid-drain and started again: it resumes where the object says.
    await stack.kill_scheduler()
    await stack.start_scheduler()
    stack.sim.store.delete("poddisruptionbudgets.policy", "guard", namespace=NS)
    await eventually(lambda: stack.phase("held") == "Ready", timeout=40, what="held Ready")
    assert stack.pod("guarded") is None
    uid = pod["metadata"]["uid"]
    await eventually(lambda: stack.evictions_applied(uid), what="eviction outcome")
    assert len(stack.evictions_applied(uid)) == 1
