"""topology-placer across a leader handover, on the emulator stack with real NATS: leader A
nominates a gang and stops gracefully while its nominations are still on their way (k8s-
watcher's command consumers are paused); leader B takes the lease at once, rebuilds the
command ledger, and neither nominates A's gang again nor places another gang on the nodes
A's nominations are about to reserve. Once the commands are applied every pod binds, no node
over its GPUs."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from nats.aio.msg import Msg

from nodeflow_contracts import codec, subjects
from nodeflow_contracts.k8s import K8sCommand, NominatePod
from tests.integration.topology_placer.conftest import (
    NS,
    PODGROUPS,
    Stack,
    eventually,
    gang_pod,
    pod_group_object,
)
from topology_placer.commands import SENDER

HIGH = "training-high"


async def _pause_commands(stack: Stack) -> None:
    """k8s-watcher keeps mirroring but applies no command: what is sent stays in flight."""
    consumers, stack.watcher.consumers = stack.watcher.consumers, []
    await asyncio.gather(*(consumer.stop(timeout=2.0) for consumer in consumers))


async def _in_kv(stack: Stack, names: list[str]) -> None:
    kv = await stack.bus.js.key_value("k8s_pods")

    async def present() -> bool:
        for name in names:
            try:
                await kv.get(subjects.object_key(NS, name))
            except Exception:
                return False
        return True

    for _ in range(400):
        if await present():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"pods {names} not mirrored into KV")


def _nominations_seen(seen: list[K8sCommand]) -> Callable[[str], dict[str, list[str]]]:
    def of(prefix: str) -> dict[str, list[str]]:
        found: dict[str, list[str]] = {}
        for command in seen:
            operation = command.operation
            if isinstance(operation, NominatePod) and command.target.name.startswith(prefix):
                found.setdefault(command.target.name, []).append(operation.node_name)
        return found

    return of


def _gpus_by_node(stack: Stack) -> dict[str, int]:
    used: dict[str, int] = {}
    for pod in stack.sim.store.list("pods", namespace=NS).items:
        node = pod["spec"].get("nodeName")
        if node:
            gpus = pod["spec"]["containers"][0]["resources"]["requests"]["nvidia.com/gpu"]
            used[node] = used.get(node, 0) + int(gpus)
    return used


async def test_rule_a_new_leader_leaves_a_gang_whose_nominations_are_in_flight_alone(
    stack: Stack,
) -> None:
    stack.sim.store.create(
        "priorityclasses",
        {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": HIGH},
            "value": 1000,
        },
    )
    # Every command the placers publish, as k8s-watcher would receive it.
    seen: list[K8sCommand] = []

    async def record(msg: Msg) -> None:
        seen.append(codec.decode(K8sCommand, msg.data, subject=msg.subject))

    capture = await stack.bus.nc.subscribe(subjects.k8s_sender_commands(SENDER), cb=record)
    nominations = _nominations_seen(seen)
    await _pause_commands(stack)
    # Gang a: four 8-GPU pods, half of the cluster's eight 8-GPU nodes.
    stack.sim.store.create(PODGROUPS, pod_group_object("a", 4))
    for rank in range(4):
        stack.sim.store.create("pods", gang_pod(f"a-{rank}", "a", gpus=8))
    await _in_kv(stack, [f"a-{rank}" for rank in range(4)])

    leader_a = await stack.start_placer()
    a_nodes = await eventually(lambda: len(nominations("a-")) == 4 and nominations("a-"))
    assert leader_a.ledger.ledger.holds("gang:default/a", time.time())
    # A helm upgrade: A stops gracefully (its lease released at once), its nominations
    # still on their way.
    await stack.stop_placer()
    sent_by_a = len(seen)

    # Gang b, of a higher priority (placed first), arrives; B leads at once.
    stack.sim.store.create(PODGROUPS, pod_group_object("b", 4))
    for rank in range(4):
        body = gang_pod(f"b-{rank}", "b", gpus=8)
        body["spec"]["priorityClassName"] = HIGH
        stack.sim.store.create("pods", body)
    await _in_kv(stack, [f"b-{rank}" for rank in range(4)])
    leader_b = await stack.start_placer()
    b_nodes = await eventually(lambda: len(nominations("b-")) == 4 and nominations("b-"))
    passes = leader_b.passes
    await eventually(lambda: leader_b.passes >= passes + 2)

    by_b = _nominations_seen(seen[sent_by_a:])
    # B sent nothing for A's gang: no second nomination of any of its pods.
    assert by_b("a-") == {}
    # Nor did it give gang b a node A's nominations are about to reserve.
    reserved = {node for nodes in a_nodes.values() for node in nodes}
    assert reserved.isdisjoint(node for nodes in b_nodes.values() for node in nodes)

    await stack.watcher.start_commands()
    bound = await eventually(
        lambda: (
            sum(
                1
                for p in stack.sim.store.list("pods", namespace=NS).items
                if p["spec"].get("nodeName")
            )
            == 8
        ),
        timeout=60,
    )
    assert bound
    assert all(gpus <= 8 for gpus in _gpus_by_node(stack).values())
    for name, nodes in a_nodes.items():
        assert stack.sim.store.get("pods", name, NS)["spec"]["nodeName"] == nodes[0]
    await capture.unsubscribe()
