"""KV `slurm_nodes` ends on the newest node state, whatever order the syncer's writers run in.

Two writers publish node states: the poll (every node, one batch) and a command's read-back
(one node). nodeset-controller deletes a pod only once KV shows its node drained, so a state
that KV loses stalls scale-in for good: the next poll sees no change and publishes nothing.
These tests hold the writers at the exact points where one could overtake the other (a gate on
the poll's listing or on its publish) and a publish that JetStream does not acknowledge; the
Slurm emulator, NATS and the command consumer are real.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

import pytest

from clustersim.slurm import RunningSlurm
from nodeflow_bus import (
    BatchPublishError,
    Bus,
    OutgoingMessage,
    PublishError,
    PullConsumer,
)
from nodeflow_contracts import codec
from nodeflow_contracts.slurm import SlurmClusterStatus, SlurmNodeCommand, SlurmNodeState
from slurm_syncer.syncer import Syncer
from tests.integration.slurm_syncer.conftest import CLUSTER, eventually, send_command
from tests.integration.slurm_syncer.test_syncer import sleep_job

NODE = "gpu-001"


async def send_drain(bus: Bus) -> None:
    await send_command(bus, "drain", NODE, "slurm-operator: scale-in", sender="nodeset-controller")


async def stored(bus: Bus) -> SlurmNodeState:
    kv = await bus.js.key_value("slurm_nodes")
    entry = await kv.get(f"{CLUSTER}.{NODE}")
    return codec.decode(SlurmNodeState, entry.value or b"", subject="kv")


async def stored_is(bus: Bus, predicate: Any) -> bool:
    return bool(predicate(await stored(bus)))


async def wait_stored(bus: Bus, predicate: Any, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not await stored_is(bus, predicate):
        assert time.monotonic() < deadline, f"KV holds {await stored(bus)}"
        await asyncio.sleep(0.02)


def carries_busy_undrained_state(messages: Sequence[OutgoingMessage]) -> bool:
    """The poll's batch of node states: the node busy and not (yet) drained."""
    return any(
        isinstance(m.message, SlurmNodeState) and m.message.busy and not m.message.drain
        for m in messages
    )


async def stored_cluster_status(bus: Bus) -> SlurmClusterStatus:
    kv = await bus.js.key_value("slurm_clusters")
    entry = await kv.get(CLUSTER)
    return codec.decode(SlurmClusterStatus, entry.value or b"", subject="kv")


async def started_with_a_running_job(bus: Bus, slurm: RunningSlurm, syncer: Syncer) -> None:
    slurm.emulator.register_node(NODE, cpus=4, real_memory=8192)
    await syncer.start()
    await eventually(lambda: syncer.clusters[CLUSTER].polled)
    await wait_stored(bus, lambda s: s.base_state == "Idle")
    slurm.cluster.submit_job(sleep_job(NODE), "alice")


async def test_rule_kv_ends_on_the_drained_state_when_an_older_poll_batch_lands_after_it(
    topology: Bus,
    slurm: RunningSlurm,
    syncer: Syncer,
    consumer: PullConsumer[SlurmNodeCommand],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The poll's batch (node busy, not drained) is held on its way to NATS while a drain
    command reads the node back as draining: KV must end on draining, not on the poll's."""
    await started_with_a_running_job(topology, slurm, syncer)
    held, release = asyncio.Event(), asyncio.Event()
    publish_batch = topology.publish_batch

    async def slow_poll_batch(messages: Sequence[OutgoingMessage], **kwargs: Any) -> Any:
        if carries_busy_undrained_state(messages) and not held.is_set():
            held.set()
            await release.wait()
        return await publish_batch(messages, **kwargs)

    monkeypatch.setattr(topology, "publish_batch", slow_poll_batch)
    poll = asyncio.create_task(syncer.poll_once(CLUSTER))
    await asyncio.wait_for(held.wait(), 5)
    await send_drain(topology)
    await eventually(lambda: syncer.clusters[CLUSTER].states[NODE].draining)
    # Give the read-back's publish every chance to go out ahead of the held batch.
    await asyncio.sleep(0.3)
    release.set()
    await poll
    await wait_stored(topology, lambda s: s.draining)


async def test_rule_a_poll_listing_sent_before_a_drain_does_not_undo_its_read_back(
    topology: Bus,
    slurm: RunningSlurm,
    syncer: Syncer,
    consumer: PullConsumer[SlurmNodeCommand],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A listing that left before the drain and answers after its read-back shows the node
    not drained; the newer read-back is kept, in memory and in KV."""
    await started_with_a_running_job(topology, slurm, syncer)
    await syncer.poll_once(CLUSTER)
    await wait_stored(topology, lambda s: s.busy and not s.drain)
    client = syncer.clusters[CLUSTER].client
    list_nodes = client.list_nodes
    answered, release = asyncio.Event(), asyncio.Event()

    async def late_listing() -> Any:
        nodes = await list_nodes()
        answered.set()
        await release.wait()
        return nodes

    monkeypatch.setattr(client, "list_nodes", late_listing)
    poll = asyncio.create_task(syncer.poll_once(CLUSTER))
    await asyncio.wait_for(answered.wait(), 5)
    await send_drain(topology)
    await wait_stored(topology, lambda s: s.draining)
    release.set()
    await poll
    assert syncer.clusters[CLUSTER].states[NODE].draining
    assert (await stored(topology)).draining
    # The next listing sees the drain itself.
    monkeypatch.setattr(client, "list_nodes", list_nodes)
    await syncer.poll_once(CLUSTER)
    assert (await stored(topology)).draining


async def test_rule_a_state_whose_publish_failed_is_published_by_the_next_poll_not_a_fresh_status(
    topology: Bus, slurm: RunningSlurm, syncer: Syncer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """JetStream does not acknowledge the batch that carries a change; the next poll sees no
    change in Slurm but still owes KV that state, and publishes it."""
    await started_with_a_running_job(topology, slurm, syncer)
    publish_batch = topology.publish_batch
    failed: list[int] = []

    async def unacknowledged_once(messages: Sequence[OutgoingMessage], **kwargs: Any) -> Any:
        """The KV_slurm_nodes stream does not answer once; every other message of the batch
        (events, and the cluster status if it rode along) is taken."""
        if not carries_busy_undrained_state(messages) or failed:
            return await publish_batch(messages, **kwargs)
        node_puts = [i for i, m in enumerate(messages) if isinstance(m.message, SlurmNodeState)]
        failed.extend(node_puts)
        others = [m for i, m in enumerate(messages) if i not in node_puts]
        if others:
            await publish_batch(others, **kwargs)
        raise BatchPublishError(
            {i: PublishError("$KV.slurm_nodes", 3, TimeoutError("no ack")) for i in node_puts},
            len(messages),
        )

    monkeypatch.setattr(topology, "publish_batch", unacknowledged_once)
    before = await stored_cluster_status(topology)
    await syncer.poll_once(CLUSTER)
    assert failed and (await stored(topology)).base_state == "Idle"
    # The poll's freshness record did not go out beside the states KV did not take: the
    # old state must not look fresh.
    assert (await stored_cluster_status(topology)).last_success_at == before.last_success_at
    await syncer.poll_once(CLUSTER)
    await wait_stored(topology, lambda s: s.busy)
    assert (await stored_cluster_status(topology)).last_success_at > before.last_success_at
