"""The Skyhook controller across a leader handover, on the whole local stack with real NATS:
leader A starts a node's interrupt (the node marked in progress, its NodeMaintenance asked
for) under interruptionBudget count 1 and stops gracefully while those commands are still on
their way (k8s-watcher's command consumers are paused); leader B takes the lease at once,
rebuilds the command ledger and neither starts a second node nor writes the node's state or
the Skyhook's status again while A's writes may still land (a second, unconditioned patch of
the node could land first and be overwritten by A's older one). Once the commands are
applied, the rollout goes on one node at a time."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from nats.aio.msg import Msg

from maintenance_scheduler.skyhook.api import status_key
from nodeflow_contracts import codec
from nodeflow_contracts.k8s import CreateObject, K8sCommand, PatchObject
from nodeflow_runtime.natsd import NatsServerProcess
from tests.integration.maintenance_scheduler.conftest import eventually, run_stack
from tests.integration.maintenance_scheduler.test_skyhook import (
    API_VERSION,
    SKYHOOKS,
    SkyhookStack,
    node_maintenance_writes,
    rounds_pass,
)

REBOOT = {
    "kernel": {
        "version": "1.0.0",
        "image": "registry.local/kernel",
        "interrupt": {"type": "reboot"},
    }
}
STATUS = status_key("rebooter")
PAUSE = "skyhook.nvidia.com/pause"


@pytest.fixture
async def two_leaders(nats_server: NatsServerProcess) -> AsyncIterator[SkyhookStack]:
    async with run_stack(nats_server.url) as stack:
        running = SkyhookStack(stack)
        try:
            yield running
        finally:
            await running.stop()


def _started(seen: list[K8sCommand]) -> set[str]:
    """Nodes a command marked in progress, or asked a NodeMaintenance for."""
    nodes: set[str] = set()
    for command in seen:
        operation = command.operation
        if isinstance(operation, PatchObject) and command.target.kind == "Node":
            labels: Any = operation.patch.get("metadata", {}).get("labels", {})
            if labels.get(STATUS) == "in_progress":
                nodes.add(command.target.name)
        elif isinstance(operation, CreateObject) and command.target.kind == "NodeMaintenance":
            nodes.add(str(operation.object["spec"]["nodeName"]))
    return nodes


def _node_state_writes(seen: list[K8sCommand]) -> list[str]:
    """Node-state patches and Skyhook status writes, by target."""
    return [
        command.target.ordering_key
        for command in seen
        if command.target.kind in ("Node", "Skyhook") and command.op in ("patch", "update-status")
    ]


def _in_progress(sky: SkyhookStack) -> list[str]:
    return [
        n["metadata"]["name"]
        for n in sky.stack.sim.store.list("nodes").items
        if (n["metadata"].get("labels") or {}).get(STATUS) == "in_progress"
    ]


async def test_rule_a_new_leader_starts_no_second_interrupt_under_budget_one(
    two_leaders: SkyhookStack,
) -> None:
    sky = two_leaders
    stack = sky.stack
    seen: list[K8sCommand] = []

    async def record(msg: Msg) -> None:
        seen.append(codec.decode(K8sCommand, msg.data, subject=msg.subject))

    capture = await stack.bus.nc.subscribe("cmd.k8s.v1.maintenance-scheduler.>", cb=record)
    await stack.start_scheduler()
    async with node_maintenance_writes(sky):
        # Paused at first: A adds its finalizer and status with commands applied.
        stack.sim.store.create(
            SKYHOOKS,
            {
                "apiVersion": API_VERSION,
                "kind": "Skyhook",
                "metadata": {"name": "rebooter", "annotations": {PAUSE: "true"}},
                "spec": {"packages": REBOOT, "interruptionBudget": {"count": 1}},
            },
        )
        leader_a = await sky.start()
        await eventually(lambda: sky.status("rebooter") == "paused", what="paused")
        await rounds_pass(sky, 2)
        assert not _started(seen)
        # k8s-watcher keeps mirroring but applies no command: what is sent stays in flight.
        consumers, stack.watcher.consumers = stack.watcher.consumers, []
        await asyncio.gather(*(consumer.stop(timeout=2.0) for consumer in consumers))
        stack.sim.store.patch(
            SKYHOOKS,
            "rebooter",
            {"metadata": {"annotations": {PAUSE: None}}},
            "application/merge-patch+json",
        )
        started_by_a = await eventually(lambda: _started(seen), what="A starts a node")
        assert leader_a.ledger.ledger.holds("skyhook:rebooter", time.time())
        assert len(started_by_a) == 1
        (first,) = started_by_a
        # A helm upgrade: A stops gracefully, its lease released at once, its commands
        # still on their way.
        await sky.stop()
        sent_by_a = len(seen)

        leader_b = await sky.start()
        await eventually(lambda: leader_b.ledger.ready, what="B rebuilt its ledger")
        # B knows A's start may still land: it plans no round on a view without it.
        assert leader_b.world(time.time()) is None
        # Nor does it write the node's state again: a second patch of the same node, racing
        # A's without a precondition, could land first and be overwritten by A's older one.
        assert _node_state_writes(seen[sent_by_a:]) == []
        assert _started(seen[sent_by_a:]) <= {first}

        await stack.watcher.start_commands()
        await eventually(lambda: _in_progress(sky) == [first], what="A's start applied")
        for _ in range(5):
            await rounds_pass(sky, 1)
            assert len(_in_progress(sky)) <= 1, _in_progress(sky)
        assert _started(seen[sent_by_a:]) <= {first}
    await capture.unsubscribe()
