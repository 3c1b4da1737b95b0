"""The whole stack under churn: a rollout while Slurm states change, watched by an invariant
checker on the Kubernetes API; a node killed under a NodeSet pod during a rollout and during
a scale-down (the pod is replaced; the DOWN Slurm node lets its pod go without a drain)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from kubernetes_asyncio import client, watch

from clustersim.runner import Simulator
from nodeflow_runtime.natsd import NatsServerProcess
from tests.integration.nodeset_controller.conftest import (
    NS,
    SLURM_DELETE,
    Stack,
    condition,
    eventually,
    is_ready,
    run_stack,
    template,
)

REVISION = "controller-revision-hash"


@dataclass
class Unavailability:
    """What the checker saw: unavailable pods (of `target`) after every pod event."""

    target: int
    seen: list[int] = field(default_factory=list)
    pods: dict[str, dict[str, Any]] = field(default_factory=dict)

    def record(self) -> None:
        available = sum(
            1
            for p in self.pods.values()
            if is_ready(p)
            and not p["metadata"].get("deletionTimestamp")
            and (condition(p, SLURM_DELETE) or {}).get("status") != "True"
        )
        self.seen.append(max(0, self.target - available))


async def check_unavailable(sim: Simulator, nodeset: str, checker: Unavailability) -> None:
    """The invariant checker: lists, then watches, the NodeSet's pods through the emulator's
    Kubernetes API, recording how many are unavailable after each change."""
    selector = f"nodeflow.dev/nodeset={nodeset}"
    async with sim.api_client() as api:
        core = client.CoreV1Api(api)
        listed = await core.list_namespaced_pod(NS, label_selector=selector)
        for item in listed.items:
            raw = api.sanitize_for_serialization(item)
            checker.pods[raw["metadata"]["name"]] = raw
        checker.record()
        version = listed.metadata.resource_version
        while True:
            stream = watch.Watch().stream(
                core.list_namespaced_pod,
                NS,
                label_selector=selector,
                resource_version=version,
                timeout_seconds=30,
            )
            async for event in stream:
                raw = event["raw_object"]
                version = raw["metadata"].get("resourceVersion", version)
                if event["type"] == "DELETED":
                    checker.pods.pop(raw["metadata"]["name"], None)
                else:
                    checker.pods[raw["metadata"]["name"]] = raw
                checker.record()


@contextlib.asynccontextmanager
async def checking(stack: Stack, nodeset: str, target: int) -> AsyncIterator[Unavailability]:
    checker = Unavailability(target)
    task = asyncio.create_task(check_unavailable(stack.sim, nodeset, checker))
    await eventually(lambda: checker.seen, what="checker listening")
    try:
        yield checker
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def names(stack: Stack, nodeset: str) -> list[str]:
    return sorted(p["metadata"]["name"] for p in stack.pods(nodeset))


def marked(stack: Stack, nodeset: str, reason: str) -> list[str]:
    return sorted(
        p["metadata"]["name"]
        for p in stack.pods(nodeset)
        if (condition(p, SLURM_DELETE) or {}).get("reason") == reason
    )


def rolled_out(stack: Stack, nodeset: str, count: int, old: str) -> bool:
    pods = stack.live_pods(nodeset)
    return len(pods) == count and all(
        is_ready(p) and p["metadata"]["labels"][REVISION] != old for p in pods
    )


async def busy_pods(stack: Stack, nodeset: str, count: int) -> dict[str, int]:
    await eventually(lambda: len(stack.ready_pods(nodeset)) == count, timeout=30)
    await eventually(lambda: all(stack.slurm_node(n) for n in names(stack, nodeset)))
    return {name: stack.run_job(name) for name in names(stack, nodeset)}


def cancel(stack: Stack, job: int) -> None:
    stack.sim.slurm["sim"].cluster.cancel_job(job, "alice")


async def test_rule_rolling_budget_holds_on_the_whole_stack_while_slurm_states_change(
    nats_server: NatsServerProcess,
) -> None:
    async with run_stack(nats_server.url, nodes=4) as stack:
        await stack.start_controller()
        stack.create_nodeset("gpu", None, updateStrategy={"rollingUpdate": {"maxUnavailable": 1}})
        jobs = await busy_pods(stack, "gpu", 4)
        old = stack.pods("gpu")[0]["metadata"]["labels"][REVISION]
        async with checking(stack, "gpu", 4) as checker:
            stack.patch_nodeset("gpu", {"template": template(env="v2")})
            first = await eventually(
                lambda: marked(stack, "gpu", "RollingDeleteScheduled"), what="first pick"
            )
            # Mid-rollout: another pod turns idle (a better pick while the first is busy),
            # and a third one's slurmd dies (DOWN: it runs no job and may go undrained).
            others = [n for n in sorted(jobs) if n not in first]
            cancel(stack, jobs.pop(others[0]))
            stack.sim.slurm["sim"].cluster.mark_lost(others[1])
            jobs.pop(others[1])
            await asyncio.sleep(1.0)  # let the controller see and act on both
            assert max(checker.seen) <= 1, checker.seen
            # The remaining jobs end one by one; the rollout finishes.
            for name in sorted(jobs):
                cancel(stack, jobs[name])
            await eventually(lambda: rolled_out(stack, "gpu", 4, old), timeout=60, what="done")
        assert len(checker.seen) > 10
        assert max(checker.seen) <= 1, checker.seen


async def test_rule_node_killed_during_a_rollout_gets_its_pod_replaced(
    nats_server: NatsServerProcess,
) -> None:
    async with run_stack(nats_server.url, nodes=5) as stack:
        await stack.start_controller()
        stack.create_nodeset("gpu", 4, updateStrategy={"rollingUpdate": {"maxUnavailable": 1}})
        jobs = await busy_pods(stack, "gpu", 4)
        old = stack.pods("gpu")[0]["metadata"]["labels"][REVISION]
        stack.patch_nodeset("gpu", {"template": template(env="v2")})
        first = await eventually(
            lambda: marked(stack, "gpu", "RollingDeleteScheduled"), what="first pick"
        )
        victim = next(p for p in stack.pods("gpu") if p["metadata"]["name"] not in first)
        victim_name, victim_node = victim["metadata"]["name"], victim["spec"]["nodeName"]
        # The node dies: its pod is not ready (replacing it costs no budget) and its Slurm
        # node goes DOWN, so the pod may go at once; its jobs are already gone (its kubelet
        # is dead: the delete hangs).
        stack.sim.make_node_not_ready(victim_node)
        await eventually(
            lambda: stack.sim.store.get("pods", victim_name, NS)["metadata"].get(
                "deletionTimestamp"
            ),
            what="pod on the dead node deleted without a drain",
        )
        # The node is removed: the pod goes, and is replaced on the spare node.
        stack.sim.remove_node(victim_node)
        for name in sorted(jobs):
            cancel(stack, jobs[name])
        await eventually(lambda: rolled_out(stack, "gpu", 4, old), timeout=60, what="done")
        assert victim_node not in {p["spec"].get("nodeName") for p in stack.pods("gpu")}


async def test_rule_node_killed_during_a_scale_down_gets_its_pod_replaced(
    nats_server: NatsServerProcess,
) -> None:
    async with run_stack(nats_server.url, nodes=5) as stack:
        await stack.start_controller()
        stack.create_nodeset("gpu", 4)
        jobs = await busy_pods(stack, "gpu", 4)
        stack.patch_nodeset("gpu", {"replicas": 3})
        (chosen,) = await eventually(
            lambda: marked(stack, "gpu", "ScalingDeleteScheduled"), what="scale-down pick"
        )
        victim = next(p for p in stack.pods("gpu") if p["metadata"]["name"] != chosen)
        victim_node = victim["spec"]["nodeName"]
        stack.sim.make_node_not_ready(victim_node)
        stack.sim.remove_node(victim_node)
        spare = next(
            n
            for n in stack.sim.node_names()
            if n not in {p["spec"].get("nodeName") for p in stack.pods("gpu")}
        )
        # The lost pod is replaced on the spare node while the chosen one keeps its job and
        # its mark (once chosen, a pod stays chosen: the desired count did not rise).
        await eventually(
            # A replacement is listed before the scheduler binds it (no nodeName yet).
            lambda: any(
                p["spec"].get("nodeName") == spare and is_ready(p) for p in stack.pods("gpu")
            ),
            timeout=30,
            what="replacement on the spare node",
        )
        assert marked(stack, "gpu", "ScalingDeleteScheduled") == [chosen]
        assert chosen in names(stack, "gpu")
        cancel(stack, jobs[chosen])
        await eventually(lambda: chosen not in names(stack, "gpu"), timeout=30, what="drained")
        await eventually(lambda: len(stack.ready_pods("gpu")) == 3 == len(stack.pods("gpu")))
