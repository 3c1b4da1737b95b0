"""Forced deletion, rolling update under an invariant checker, node churn, competing NodeSets,
bad input and a controller killed mid-scale-in, on the whole stack."""

from __future__ import annotations

import asyncio
from typing import Any

from tests.integration.nodeset_controller.conftest import (
    SLURM_DELETE,
    Stack,
    condition,
    eventually,
    is_ready,
    template,
)


def status_is(stack: Stack, name: str, **expected: int) -> bool:
    status = stack.status(name)
    return all(status.get(key) == value for key, value in expected.items())


async def busy_nodeset(stack: Stack, name: str, replicas: int, **spec: Any) -> None:
    stack.create_nodeset(name, replicas, **spec)
    await eventually(lambda: len(stack.ready_pods(name)) == replicas)
    await eventually(lambda: all(stack.slurm_node(p["metadata"]["name"]) for p in stack.pods(name)))
    for pod in stack.pods(name):
        stack.run_job(pod["metadata"]["name"])
    await eventually(lambda: status_is(stack, name, numberRunning=replicas), what="busy")


async def test_forced_deletion_after_known_timeout_even_if_busy(stack: Stack) -> None:
    await stack.start_controller()
    await busy_nodeset(stack, "gpu", 2, forceScalingDeleteKnownConditionTimeout=1)
    stack.patch_nodeset("gpu", {"replicas": 1})
    await eventually(lambda: len(stack.live_pods("gpu")) == 1, timeout=10, what="forced delete")
    # The Event is sent after the batch's object changes (the delete, the status that says no
    # pod waits any more): it may land just after the pod is gone.
    await eventually(lambda: bool(stack.events("PodForceDeleted")), what="PodForceDeleted event")


async def test_forced_deletion_after_unknown_timeout_and_never_with_both_zero(stack: Stack) -> None:
    await stack.start_controller()
    await busy_nodeset(stack, "gpu", 2)
    # Slurm forgets one node: its state becomes unknown (no entry in slurm_nodes).
    victim = sorted(p["metadata"]["name"] for p in stack.pods("gpu"))[0]
    stack.sim.slurm["sim"].cluster.remove_node(victim)
    await eventually(
        lambda: condition(stack.sim.store.get("pods", victim, "default"), "SlurmNodeStateUnknown")
    )
    stack.patch_nodeset("gpu", {"replicas": 1})
    await eventually(
        lambda: condition(stack.sim.store.get("pods", victim, "default"), SLURM_DELETE),
        what="unknown-state pod scheduled first (the other is busy and known)",
    )
    # Both timeouts 0: an unknown-state pod is never deleted.
    await asyncio.sleep(2.0)
    assert len(stack.live_pods("gpu")) == 2
    stack.patch_nodeset("gpu", {"forceScalingDeleteUnknownConditionTimeout": 1})
    await eventually(lambda: len(stack.live_pods("gpu")) == 1, timeout=10, what="forced unknown")
    remaining = stack.live_pods("gpu")[0]["metadata"]["name"]
    assert remaining != victim


async def test_rolling_update_never_exceeds_max_unavailable(stack: Stack) -> None:
    await stack.start_controller()
    stack.create_nodeset(
        "gpu",
        None,
        updateStrategy={"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}},
    )
    await eventually(lambda: len(stack.ready_pods("gpu")) == 4)
    await eventually(lambda: status_is(stack, "gpu", numberReady=4, updatedNumberScheduled=4))
    old_revision = stack.pods("gpu")[0]["metadata"]["labels"]["controller-revision-hash"]
    worst = {"unavailable": 0, "checks": 0}

    def check(resource: str, event: str, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
        if resource != "pods":
            return
        available = [
            p
            for p in stack.pods("gpu")
            if is_ready(p)
            and not p["metadata"].get("deletionTimestamp")
            and not condition(p, SLURM_DELETE)
        ]
        worst["unavailable"] = max(worst["unavailable"], 4 - len(available))
        worst["checks"] += 1

    stack.sim.store.add_listener(check)
    stack.patch_nodeset("gpu", {"template": template(env="v2")})
    await eventually(
        lambda: (
            len(stack.ready_pods("gpu")) == 4
            and all(
                p["metadata"]["labels"]["controller-revision-hash"] != old_revision
                for p in stack.pods("gpu")
            )
        ),
        timeout=40,
        what="rolled out",
    )
    await eventually(lambda: status_is(stack, "gpu", updatedNumberScheduled=4, numberReady=4))
    assert worst["checks"] > 10
    assert worst["unavailable"] == 1
    # Same nodes as before: replaced pods come back where they were.
    assert len(stack.claims()) == 4
    assert stack.events("RollingDeleteScheduled")


async def test_nodes_added_removed_and_not_ready(stack: Stack) -> None:
    await stack.start_controller()
    stack.create_nodeset("gpu", None)
    await eventually(lambda: len(stack.ready_pods("gpu")) == 4)
    added = stack.sim.add_node()["metadata"]["name"]
    await eventually(lambda: len(stack.ready_pods("gpu")) == 5, what="pod on the new node")
    await eventually(lambda: status_is(stack, "gpu", numberFeasible=5, desiredNumberScheduled=5))
    assert any(p["spec"]["nodeName"] == added for p in stack.pods("gpu"))
    stack.sim.make_node_not_ready("node-001")
    await eventually(
        lambda: status_is(
            stack, "gpu", numberReady=4, numberUnavailable=1, currentNumberScheduled=5
        ),
        what="not-ready node counted unavailable",
    )
    stack.sim.remove_node("node-002")
    await eventually(lambda: len(stack.pods("gpu")) == 4, what="pod of the removed node gone")
    await eventually(lambda: status_is(stack, "gpu", numberFeasible=4, currentNumberScheduled=4))
    await eventually(lambda: "node-002" not in stack.slice_nodes("gpu"))


async def test_two_nodesets_competing_for_the_same_nodes(stack: Stack) -> None:
    await stack.start_controller()
    stack.create_nodeset("alpha", None)
    stack.create_nodeset("beta", None)
    await eventually(
        lambda: len(stack.ready_pods("alpha")) + len(stack.ready_pods("beta")) == 4, timeout=20
    )
    await asyncio.sleep(1.0)  # no late duplicate
    nodes = [p["spec"]["nodeName"] for name in ("alpha", "beta") for p in stack.pods(name)]
    assert len(nodes) == len(set(nodes)) == 4
    claims = stack.claims()
    for name in ("alpha", "beta"):
        for pod in stack.pods(name):
            assert claims[pod["spec"]["nodeName"]] == f"default.{name}"
    alpha, beta = stack.status("alpha"), stack.status("beta")
    assert alpha["numberFeasible"] + beta["numberFeasible"] == 4


async def test_invalid_spec_gets_condition_and_touches_no_pod(stack: Stack) -> None:
    await stack.start_controller()
    stack.create_nodeset("gpu", 2)
    await eventually(lambda: len(stack.ready_pods("gpu")) == 2)
    pods_before = {p["metadata"]["uid"] for p in stack.pods("gpu")}
    stack.patch_nodeset(
        "gpu",
        {
            "replicas": 0,
            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": -1}},
        },
    )
    invalid = await eventually(lambda: condition(stack.nodeset("gpu"), "InvalidSpec"))
    await eventually(
        lambda: (condition(stack.nodeset("gpu"), "InvalidSpec") or {}).get("status") == "True"
    )
    invalid = condition(stack.nodeset("gpu"), "InvalidSpec")
    assert invalid is not None and invalid["reason"] == "NegativeMaxUnavailable"
    assert "maxUnavailable" in invalid["message"]
    await asyncio.sleep(1.0)
    assert {p["metadata"]["uid"] for p in stack.live_pods("gpu")} == pods_before
    assert not any(condition(p, SLURM_DELETE) for p in stack.pods("gpu"))
    assert stack.events("InvalidSpec")


async def test_controller_killed_mid_scale_in_resumes_without_duplicates(stack: Stack) -> None:
    await stack.start_controller()
    stack.create_nodeset("gpu", 4)
    await eventually(lambda: len(stack.ready_pods("gpu")) == 4)
    await eventually(
        lambda: all(stack.slurm_node(p["metadata"]["name"]) for p in stack.pods("gpu"))
    )
    for index, pod in enumerate(sorted(stack.pods("gpu"), key=lambda p: p["metadata"]["name"])):
        stack.run_job(pod["metadata"]["name"], str(1 + index))
    await eventually(lambda: status_is(stack, "gpu", numberRunning=4))
    created: list[str] = []
    stack.sim.store.add_listener(
        lambda resource, event, obj, old: (
            created.append(obj["metadata"]["name"])
            if resource == "pods" and event == "ADDED"
            else None
        )
    )
    stack.patch_nodeset("gpu", {"replicas": 1})
    await eventually(lambda: sum(1 for p in stack.pods("gpu") if condition(p, SLURM_DELETE)) == 3)
    await stack.kill_controller()
    await asyncio.sleep(0.5)
    # A new replica takes over once the old lease expires, from KV state alone.
    await stack.start_controller()
    await eventually(
        lambda: len(stack.pods("gpu")) == 1, timeout=25, what="scaled in after restart"
    )
    await asyncio.sleep(1.0)
    assert created == []
    assert len(stack.pods("gpu")) == 1
    await eventually(
        lambda: status_is(stack, "gpu", currentNumberScheduled=1, desiredNumberScheduled=1)
    )
