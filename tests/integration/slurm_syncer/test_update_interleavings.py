"""A drain that a command made stays, whatever the syncer does beside it.

Random interleavings of: the Kubernetes node cordoned and uncordoned (the reconciliation drains
and undrains for it, deciding on the last listing), maintenance drain and undrain commands (run
as the command consumer runs them, concurrently with everything else), polls, and random delays
inside the syncer's Slurm reads and updates. The Slurm emulator, NATS and the syncer are real.

The safety rule: a command's drain is lifted or renamed only by an undrain command -- never by
the cordon model, whose uncordon may have been decided before that drain was made. Were it
lifted, Slurm would schedule jobs on a node under maintenance. (An administrator's drain made
straight in Slurm races with any update in flight, ours or not -- Slurm has no compare-and-set;
test_syncer.py holds the case where the syncer can tell: an update decided before it.)
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import random
import time
from typing import Any, Literal

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clustersim.slurm import RunningSlurm
from nodeflow_bus import Bus, Delivery
from nodeflow_contracts.slurm import SlurmNodeCommand, SlurmOp
from slurm_syncer.syncer import Syncer
from tests.integration.slurm_syncer.conftest import (
    CLUSTER,
    FakeWatcher,
    KubeKV,
    eventually,
    make_node,
    make_nodeset,
    make_pod,
)

MAINTENANCE = "slurm-operator: maintenance: firmware"

Step = Literal["cordon", "uncordon", "command-drain", "command-undrain", "poll"]
steps = st.lists(
    st.sampled_from(["cordon", "uncordon", "command-drain", "command-undrain", "poll"]),
    min_size=2,
    max_size=10,
)
_names = itertools.count()


def command_drain_holds(history: list[Step]) -> bool:
    """Whether the last command was a drain: then the node must end drained for it."""
    ops = [step for step in history if step.startswith("command-")]
    return bool(ops) and ops[-1] == "command-drain"


def command(op: SlurmOp, node: str) -> SlurmNodeCommand:
    return SlurmNodeCommand(
        idempotency_key=f"test:{op}:{node}:{time.monotonic()}",
        sender="maintenance-scheduler",
        sent_at=time.time(),
        cluster=CLUSTER,
        node=node,
        op=op,
        reason=MAINTENANCE if op == "drain" else "",
    )


def delivery(cmd: SlurmNodeCommand) -> Delivery:
    return Delivery(
        subject=cmd.subject,
        headers={},
        stream="SLURM_COMMANDS",
        stream_sequence=1,
        num_delivered=1,
        msg_id=cmd.idempotency_key,
    )


@pytest.fixture
async def ready_syncer(topology: Bus, kube: KubeKV, watcher: FakeWatcher, syncer: Syncer) -> Syncer:
    await kube.put_nodeset(make_nodeset())
    await syncer.start()
    await eventually(lambda: syncer.clusters[CLUSTER].polled)
    return syncer


@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(history=steps, seed=st.integers(0, 2**16))
async def test_rule_a_command_drain_is_never_lifted_by_the_cordon_model(
    slurm: RunningSlurm,
    kube: KubeKV,
    ready_syncer: Syncer,
    monkeypatch: pytest.MonkeyPatch,
    history: list[Step],
    seed: int,
) -> None:
    syncer = ready_syncer
    chance = random.Random(seed)
    index = next(_names)
    name, k8s_node = f"gpu-p{index}", f"node-p{index}"
    slurm.emulator.register_node(name, cpus=4, real_memory=8192)
    await kube.put_node(make_node(k8s_node))
    await kube.put_pod(make_pod(name, k8s_node))
    await syncer.poll_once(CLUSTER)
    client = syncer.clusters[CLUSTER].client
    get_node, update_node = client.get_node, client.update_node

    async def slow_get(node: str) -> Any:
        await asyncio.sleep(chance.choice([0.0, 0.0, 0.01, 0.05]))
        return await get_node(node)

    async def slow_update(node: str, states: list[str], reason: str | None = None) -> None:
        await asyncio.sleep(chance.choice([0.0, 0.01, 0.05, 0.1]))
        await update_node(node, states, reason)

    monkeypatch.setattr(client, "get_node", slow_get)
    monkeypatch.setattr(client, "update_node", slow_update)
    commands: list[asyncio.Task[None]] = []
    try:
        for step in history:
            if step in ("cordon", "uncordon"):
                await kube.put_node(make_node(k8s_node, unschedulable=step == "cordon"))
            elif step in ("command-drain", "command-undrain"):
                cmd = command("drain" if step == "command-drain" else "undrain", name)
                # As the consumer runs it: beside whatever the syncer is doing.
                commands.append(asyncio.create_task(syncer.handle_command(cmd, delivery(cmd))))
            elif step == "poll":
                await syncer.poll_once(CLUSTER)
            await asyncio.sleep(chance.choice([0.0, 0.01, 0.03]))
        for task in commands:
            with contextlib.suppress(Exception):  # a refused command raises PermanentError
                await task
        # Let the reconciliation act on everything it has seen, then on a fresh listing.
        for _ in range(2):
            await asyncio.sleep(0.1)
            await eventually(lambda: syncer.updates_running == 0)
            await syncer.poll_once(CLUSTER)
        await asyncio.sleep(0.1)
        await eventually(lambda: syncer.updates_running == 0)
    finally:
        for task in commands:
            task.cancel()
        monkeypatch.undo()
    node = slurm.cluster.nodes[name]
    if command_drain_holds(history):
        assert node.drain and node.reason == MAINTENANCE, (history, node.reason, node.drain)
