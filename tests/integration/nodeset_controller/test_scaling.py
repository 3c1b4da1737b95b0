"""NodeSet scaling on the whole stack: NATS, simulator, k8s-watcher, slurm-syncer, controller."""

from __future__ import annotations

import msgspec
from prometheus_client import REGISTRY

from nodeflow_contracts.nodeset import NodeSetDecision
from tests.integration.nodeset_controller.conftest import (
    SLURM_DELETE,
    Stack,
    condition,
    eventually,
)


def status_is(stack: Stack, name: str, **expected: int) -> bool:
    status = stack.status(name)
    return all(status.get(key) == value for key, value in expected.items())


async def decisions(stack: Stack) -> list[NodeSetDecision]:
    found: list[NodeSetDecision] = []
    sub = await stack.bus.js.subscribe("nodeset.v1.>", stream="DECISIONS", ordered_consumer=True)
    try:
        while True:
            try:
                msg = await sub.next_msg(timeout=0.3)
            except Exception:
                return found
            found.append(msgspec.json.decode(msg.data, type=NodeSetDecision))
    finally:
        await sub.unsubscribe()


async def test_scale_from_zero_to_n_pods_ready_status_slices_claims_events(stack: Stack) -> None:
    await stack.start_controller()
    stack.create_nodeset("gpu", 3)
    await eventually(lambda: len(stack.ready_pods("gpu")) == 3, what="3 pods ready")
    await eventually(
        lambda: status_is(
            stack,
            "gpu",
            currentNumberScheduled=3,
            desiredNumberScheduled=3,
            numberReady=3,
            numberFeasible=4,
            updatedNumberScheduled=3,
            numberUnavailable=0,
            numberMisscheduled=0,
        ),
        what="status",
    )
    pods = stack.pods("gpu")
    names = sorted(p["metadata"]["name"] for p in pods)
    for pod in pods:
        node = stack.sim.store.get("nodes", pod["spec"]["nodeName"])
        ip = next(a["address"] for a in node["status"]["addresses"] if a["type"] == "InternalIP")
        third, fourth = (int(octet) for octet in ip.split(".")[2:])
        assert pod["metadata"]["name"] == f"gpu-{third:03d}-{fourth:03d}"
    nodes = sorted(p["spec"]["nodeName"] for p in pods)
    assert stack.claims() == {node: "default.gpu" for node in nodes}
    await eventually(lambda: stack.slice_nodes("gpu") == nodes, what="slices")
    for pod in pods:
        assert pod["metadata"]["ownerReferences"][0]["kind"] == "NodeSet"
        assert {"key": "sunk.coreweave.com/lock", "operator": "Exists"} in pod["spec"][
            "tolerations"
        ]
    await eventually(lambda: stack.events("PodCreated"), what="Event recorded")
    made = [d for d in await decisions(stack) if d.kind == "create"]
    assert sorted(d.pod for d in made) == names
    # Slurm nodes registered by the pods are idle; the status reports them.
    await eventually(lambda: status_is(stack, "gpu", numberRunning=0, numberDrain=0))


async def test_scale_up_wider_than_the_in_flight_window_completes_step_by_step(
    stack: Stack,
) -> None:
    controller = await stack.start_controller(max_commands_in_flight=1)
    stack.create_nodeset("gpu", 3)
    await eventually(lambda: len(stack.ready_pods("gpu")) == 3, what="3 pods ready")
    await eventually(
        lambda: status_is(stack, "gpu", currentNumberScheduled=3, numberReady=3),
        what="status",
    )
    # Three claims and three creates, one at a time: the others waited for a later round.
    assert controller.stats.deferred > 0
    deferred = REGISTRY.get_sample_value("nodeflow_nodeset_controller_deferred_changes_total")
    assert deferred is not None and deferred >= controller.stats.deferred
    assert len(stack.claims()) == 3


async def test_pod_deleted_by_someone_else_is_recreated_on_its_still_claimed_node(
    stack: Stack,
) -> None:
    """The node keeps its claim (same resourceVersion), so the new pod has the old one's
    name, node and revision: its create must not be taken for the first pod's create (a
    repeated idempotency key is dropped by JetStream's duplicate window -- the create would
    never run and the in-flight window would wedge)."""
    await stack.start_controller()
    stack.create_nodeset("gpu", 1)
    await eventually(lambda: len(stack.ready_pods("gpu")) == 1, what="pod ready")
    (first,) = stack.pods("gpu")
    node_before = stack.sim.store.get("nodes", first["spec"]["nodeName"])
    stack.sim.store.delete(
        "pods", first["metadata"]["name"], namespace="default", grace_period_seconds=0
    )

    def replaced() -> bool:
        pods = stack.ready_pods("gpu")
        return len(pods) == 1 and pods[0]["metadata"]["uid"] != first["metadata"]["uid"]

    # Well within the controller's in-flight timeout (20 s): no expiry-and-retry needed.
    await eventually(replaced, timeout=10, what="pod re-created and Ready")
    (second,) = stack.pods("gpu")
    assert second["metadata"]["name"] == first["metadata"]["name"]
    assert second["spec"]["nodeName"] == first["spec"]["nodeName"]
    node_after = stack.sim.store.get("nodes", first["spec"]["nodeName"])
    assert node_after["metadata"]["resourceVersion"] == node_before["metadata"]["resourceVersion"]


async def test_scale_in_while_jobs_run_pods_stay_until_jobs_end(stack: Stack) -> None:
    await stack.start_controller()
    stack.create_nodeset("gpu", 3)
    await eventually(lambda: len(stack.ready_pods("gpu")) == 3)
    await eventually(
        lambda: all(stack.slurm_node(p["metadata"]["name"]) for p in stack.pods("gpu"))
    )
    jobs = [stack.run_job(pod["metadata"]["name"]) for pod in stack.pods("gpu")]
    await eventually(lambda: status_is(stack, "gpu", numberRunning=3), what="jobs running")
    stack.patch_nodeset("gpu", {"replicas": 1})
    marked = await eventually(
        lambda: (
            [p for p in stack.pods("gpu") if condition(p, SLURM_DELETE)]
            if len([p for p in stack.pods("gpu") if condition(p, SLURM_DELETE)]) == 2
            else None
        ),
        what="two pods scheduled for deletion",
    )
    for pod in marked:
        assert condition(pod, SLURM_DELETE)["reason"] == "ScalingDeleteScheduled"  # type: ignore[index]
    # Draining in Slurm while the jobs run, and not deleted.
    names = [p["metadata"]["name"] for p in marked]
    await eventually(lambda: all(stack.slurm_node(n).drain for n in names), what="draining")
    assert len(stack.live_pods("gpu")) == 3
    for job in jobs:
        stack.sim.slurm["sim"].cluster.cancel_job(job, "alice")
    # Jobs end -> drained and idle -> deleted, claims released, slices updated.
    await eventually(lambda: len(stack.pods("gpu")) == 1, timeout=20, what="scaled in")
    (kept,) = stack.pods("gpu")
    await eventually(lambda: stack.claims() == {kept["spec"]["nodeName"]: "default.gpu"})
    await eventually(lambda: stack.slice_nodes("gpu") == [kept["spec"]["nodeName"]])
    await eventually(lambda: status_is(stack, "gpu", currentNumberScheduled=1, numberReady=1))


async def test_scale_down_then_up_before_deletion_cancels_and_undrains(stack: Stack) -> None:
    await stack.start_controller()
    stack.create_nodeset("gpu", 2)
    await eventually(lambda: len(stack.ready_pods("gpu")) == 2)
    await eventually(
        lambda: all(stack.slurm_node(p["metadata"]["name"]) for p in stack.pods("gpu"))
    )
    for pod in stack.pods("gpu"):
        stack.run_job(pod["metadata"]["name"])
    await eventually(lambda: status_is(stack, "gpu", numberRunning=2))
    stack.patch_nodeset("gpu", {"replicas": 1})
    marked = await eventually(
        lambda: next((p for p in stack.pods("gpu") if condition(p, SLURM_DELETE)), None)
    )
    name = marked["metadata"]["name"]
    await eventually(lambda: stack.slurm_node(name).drain, what="drained in Slurm")
    stack.patch_nodeset("gpu", {"replicas": 2})
    await eventually(
        lambda: not any(condition(p, SLURM_DELETE) for p in stack.pods("gpu")), what="cancelled"
    )
    await eventually(lambda: not stack.slurm_node(name).drain, what="undrained")
    assert len(stack.live_pods("gpu")) == 2
    assert stack.events("DeleteCancelled")


async def test_rule_other_pods_requests_keep_a_node_infeasible_until_they_are_gone(
    stack: Stack,
) -> None:
    """What other pods request on a node counts against it, as the controller's view keeps
    those pods (OtherPod records, not objects): a NodeSet pod is placed only where its
    request still fits, and a node becomes feasible again once the other pod is deleted."""
    names = sorted(n["metadata"]["name"] for n in stack.sim.store.list("nodes").items)
    full = names[:2]
    for index, node in enumerate(full):
        stack.sim.store.create(
            "pods",
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": f"train-{index}", "namespace": "default"},
                "spec": {
                    "nodeName": node,
                    "containers": [
                        {"name": "t", "image": "t", "resources": {"requests": {"cpu": "63500m"}}}
                    ],
                },
            },
        )
    await stack.start_controller()
    stack.create_nodeset("gpu", 4)
    await eventually(
        lambda: status_is(stack, "gpu", numberFeasible=2, currentNumberScheduled=2),
        what="only the two free nodes feasible",
    )
    assert not {p["spec"]["nodeName"] for p in stack.pods("gpu")} & set(full)
    stack.sim.store.delete("pods", "train-0", namespace="default")
    await eventually(
        lambda: status_is(stack, "gpu", numberFeasible=3, currentNumberScheduled=3),
        what="the freed node feasible again",
    )
    assert full[0] in {p["spec"]["nodeName"] for p in stack.pods("gpu")}
