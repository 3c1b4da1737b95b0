"""What a reader needs to judge the syncer's Slurm view: SlurmClusterStatus in KV
`slurm_clusters` after every poll, and why a pod's node is unknown, since when."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from clustersim.slurm import ManualClock, RunningSlurm
from nodeflow_bus import Bus
from nodeflow_contracts import codec
from nodeflow_contracts.pod_protocol import (
    SLURM_CLUSTER_UNREACHABLE_REASON,
    SLURM_NOT_REGISTERED_REASON,
)
from nodeflow_contracts.slurm import SlurmClusterStatus
from nodeflow_contracts.subjects import slurm_node_key
from nodeflow_contracts.topology import SLURM_CLUSTERS_BUCKET, SLURM_NODES_BUCKET
from nodeflow_kube.fields import rfc3339
from slurm_syncer.syncer import Syncer, SyncerOptions
from tests.integration.slurm_syncer.conftest import (
    CLUSTER,
    FakeWatcher,
    KubeKV,
    eventually,
    make_node,
    make_nodeset,
    make_pod,
    slurm_client,
    slurm_conditions,
)

POLL_INTERVAL = 3600.0
# What a started pod's slurmd gets to register before its absence is written: the service's
# poll interval (these tests poll by hand, so POLL_INTERVAL only keeps the loop quiet).
REGISTRATION_WAIT = 5.0


@pytest.fixture
async def timed_syncer(
    topology: Bus, slurm: RunningSlurm, clock: ManualClock
) -> AsyncIterator[Syncer]:
    """A syncer on the emulator's manual clock: time moves only when the test says so."""
    client = slurm_client(slurm)
    running = Syncer(
        topology,
        {CLUSTER: client},
        SyncerOptions(poll_interval=POLL_INTERVAL, registration_wait=REGISTRATION_WAIT),
        clock=clock.now,
    )
    try:
        yield running
    finally:
        await running.stop()
        await client.close()


async def stored_status(bus: Bus) -> SlurmClusterStatus:
    kv = await bus.js.key_value(SLURM_CLUSTERS_BUCKET)
    entry = await kv.get(CLUSTER)
    return codec.decode(SlurmClusterStatus, entry.value or b"", subject="kv")


async def setup(slurm: RunningSlurm, kube: KubeKV) -> None:
    await kube.put_nodeset(make_nodeset())
    slurm.emulator.register_node("gpu-001", cpus=4, real_memory=8192)
    await kube.put_node(make_node("node-0"))
    await kube.put_pod(make_pod("gpu-001", "node-0"))


async def unreachable(slurm: RunningSlurm, syncer: Syncer) -> None:
    await slurm.go_down("refuse")
    # Pooled keep-alive connections would still be served: a real slurmrestd closes them.
    await syncer.clusters[CLUSTER].client.close()


async def test_rule_cluster_status_is_written_after_every_poll_and_kept_across_a_restart(
    topology: Bus,
    slurm: RunningSlurm,
    clock: ManualClock,
    kube: KubeKV,
    watcher: FakeWatcher,
    timed_syncer: Syncer,
) -> None:
    syncer = timed_syncer
    await setup(slurm, kube)
    await syncer.start()
    await eventually(lambda: syncer.clusters[CLUSTER].polled)
    clock.advance(10)
    ok = await syncer.poll_once(CLUSTER)
    status = await stored_status(topology)
    assert status.reachable and not status.error and status.syncer == "slurm-syncer"
    assert status.last_poll_at == status.last_success_at == ok.started_at == clock.now()
    assert status.poll_interval_seconds == POLL_INTERVAL
    assert status.fresh(clock.now())

    # A failed poll is written too, and keeps when the last one succeeded.
    await unreachable(slurm, syncer)
    clock.advance(10)
    failed = await syncer.poll_once(CLUSTER)
    assert not failed.ok
    status = await stored_status(topology)
    assert not status.reachable and status.error
    assert status.last_poll_at == clock.now() and status.last_success_at == ok.started_at

    # A new process, started while Slurm is still away: the success time is read back from
    # KV, not lost.
    await syncer.stop()
    clock.advance(10)
    client = slurm_client(slurm)
    successor = Syncer(
        topology, {CLUSTER: client}, SyncerOptions(poll_interval=POLL_INTERVAL), clock=clock.now
    )
    try:
        await successor.start()
        await eventually(lambda: successor.clusters[CLUSTER].polled)
        status = await stored_status(topology)
        assert status.last_poll_at == clock.now() and not status.reachable
        assert status.last_success_at == ok.started_at
        # Older than its maximum age, it is stale: a reader treats its states as unknown.
        assert not status.fresh(ok.started_at + 5 * POLL_INTERVAL)

        await slurm.come_back()
        clock.advance(10)
        again = await successor.poll_once(CLUSTER)
        assert again.ok
        assert (await stored_status(topology)).last_success_at == clock.now()
    finally:
        await successor.stop()
        await client.close()


async def node_revision(bus: Bus, node: str) -> int:
    """The `slurm_nodes` stream sequence of the node's state in KV."""
    kv = await bus.js.key_value(SLURM_NODES_BUCKET)
    entry = await kv.get(slurm_node_key(CLUSTER, node))
    assert entry.revision is not None
    return entry.revision


async def test_rule_cluster_status_names_the_slurm_nodes_sequence_of_its_polls_states(
    topology: Bus,
    slurm: RunningSlurm,
    clock: ManualClock,
    kube: KubeKV,
    watcher: FakeWatcher,
    timed_syncer: Syncer,
) -> None:
    """A reader may see the status before the node states written just before it (two
    buckets, two consumers). The status names the `slurm_nodes` sequence by which every
    node state of its poll was written, so a reader whose view has applied it knows it holds
    that poll's states: after a poll that changed a node, one that changed none, and the
    first poll of a new process (which wrote nothing new)."""
    syncer = timed_syncer
    await setup(slurm, kube)
    await syncer.start()
    await eventually(lambda: syncer.clusters[CLUSTER].polled)
    first = await stored_status(topology)
    assert first.nodes_revision >= await node_revision(topology, "gpu-001") > 0

    slurm.emulator.register_node("gpu-002", cpus=4, real_memory=8192)
    clock.advance(10)
    await syncer.poll_once(CLUSTER)
    changed = await stored_status(topology)
    newest = await node_revision(topology, "gpu-002")
    assert changed.nodes_revision >= newest > first.nodes_revision

    clock.advance(10)
    await syncer.poll_once(CLUSTER)
    unchanged = await stored_status(topology)
    assert unchanged.last_success_at == clock.now()
    assert unchanged.nodes_revision >= newest

    await syncer.stop()
    clock.advance(10)
    client = slurm_client(slurm)
    successor = Syncer(
        topology, {CLUSTER: client}, SyncerOptions(poll_interval=POLL_INTERVAL), clock=clock.now
    )
    try:
        await successor.start()
        await eventually(lambda: successor.clusters[CLUSTER].polled)
        restarted = await stored_status(topology)
        assert restarted.last_success_at == clock.now()
        assert restarted.nodes_revision >= newest
    finally:
        await successor.stop()
        await client.close()


async def test_rule_cluster_status_says_how_many_nodes_its_poll_listed(
    topology: Bus, slurm: RunningSlurm, clock: ManualClock, timed_syncer: Syncer
) -> None:
    """An empty cluster's poll writes no node state (its status names no `slurm_nodes`
    sequence); the status says the listing held no node, which proves every node not
    registered to a reader. A failed poll says nothing."""
    syncer = timed_syncer
    await syncer.start()
    await eventually(lambda: syncer.clusters[CLUSTER].polled)
    empty = await stored_status(topology)
    assert (empty.nodes_listed, empty.nodes_revision) == (0, 0)
    assert empty.absence_read_at(0) == empty.last_success_at

    slurm.emulator.register_node("gpu-001", cpus=4, real_memory=8192)
    clock.advance(10)
    assert (await syncer.poll_once(CLUSTER)).ok
    listed = await stored_status(topology)
    assert listed.nodes_listed == 1 and listed.absence_read_at(0) is None

    await unreachable(slurm, syncer)
    clock.advance(10)
    assert not (await syncer.poll_once(CLUSTER)).ok
    assert (await stored_status(topology)).nodes_listed == -1


def unknown_condition(pod: dict[str, Any]) -> dict[str, Any] | None:
    for condition in pod.get("status", {}).get("conditions", []):
        if condition["type"] == "SlurmNodeStateUnknown":
            return dict(condition)
    return None


async def test_rule_a_node_absent_from_a_reachable_cluster_is_not_registered_since_it_went(
    topology: Bus,
    slurm: RunningSlurm,
    clock: ManualClock,
    kube: KubeKV,
    watcher: FakeWatcher,
    timed_syncer: Syncer,
) -> None:
    syncer = timed_syncer
    await setup(slurm, kube)
    await kube.put_pod(make_pod("gpu-009", "node-0"))  # its slurmd never registered
    await syncer.start()
    await eventually(lambda: syncer.clusters[CLUSTER].polled)
    clock.advance(REGISTRATION_WAIT)
    assert (await syncer.poll_once(CLUSTER)).ok
    absent = await eventually(lambda: unknown_condition(kube.pod("gpu-009")))
    assert absent["reason"] == SLURM_NOT_REGISTERED_REASON
    assert "not registered" in absent["message"]
    began = absent["lastTransitionTime"]
    assert began == rfc3339(clock.now())

    # Still absent on later polls: nothing is written, the start of the absence stays.
    patches = len(watcher.of_kind("conditions"))
    for _ in range(3):
        clock.advance(120)
        assert (await syncer.poll_once(CLUSTER)).ok
    await syncer.reconcile(None)
    assert unknown_condition(kube.pod("gpu-009")) == absent
    assert len(watcher.of_kind("conditions")) == patches

    # The cluster cannot be read: another cause, and the absence is no longer known.
    await unreachable(slurm, syncer)
    clock.advance(120)
    assert not (await syncer.poll_once(CLUSTER)).ok
    await eventually(
        lambda: (
            (unknown_condition(kube.pod("gpu-009")) or {}).get("reason")
            == SLURM_CLUSTER_UNREACHABLE_REASON
        )
    )
    # Back: the absence starts again from this poll (the grace is never shortened).
    await slurm.come_back()
    clock.advance(120)
    assert (await syncer.poll_once(CLUSTER)).ok
    again = await eventually(
        lambda: (
            (c := unknown_condition(kube.pod("gpu-009")))
            and c.get("reason") == SLURM_NOT_REGISTERED_REASON
            and c
        )
    )
    assert again["lastTransitionTime"] == rfc3339(clock.now()) != began

    # slurmd registers: the pod shows the node's real state.
    slurm.emulator.register_node("gpu-009", cpus=4, real_memory=8192)
    assert (await syncer.poll_once(CLUSTER)).ok
    await eventually(lambda: unknown_condition(kube.pod("gpu-009")) is None)


async def test_rule_a_starting_pod_gets_one_condition_patch_when_slurmd_first_registers(
    topology: Bus,
    slurm: RunningSlurm,
    clock: ManualClock,
    kube: KubeKV,
    watcher: FakeWatcher,
    timed_syncer: Syncer,
) -> None:
    """Minimal writes: a NodeSet pod that starts and registers is patched once, with its
    node's state -- not NodeNotRegistered while Pending and the state after."""
    syncer = timed_syncer
    await kube.put_nodeset(make_nodeset())
    await kube.put_node(make_node("node-0"))
    pending = make_pod("gpu-001", "node-0")
    pending["status"]["phase"] = "Pending"
    await kube.put_pod(pending)
    await syncer.start()
    # The first poll (the syncer's own) is over before the clock moves.
    await eventually(lambda: syncer.clusters[CLUSTER].polled)
    assert (await syncer.poll_once(CLUSTER)).ok
    await syncer.reconcile(None)
    clock.advance(5)

    # The container starts and slurmd registers; the syncer sees the pod running first.
    await kube.update_pod("gpu-001", lambda pod: pod["status"].update(phase="Running"))
    slurm.emulator.register_node("gpu-001", cpus=4, real_memory=8192)
    key = "slurm.gpu-001"
    await eventually(
        lambda: (syncer._pods.get(key) or {}).get("status", {}).get("phase") == "Running"
    )
    clock.advance(5)
    assert (await syncer.poll_once(CLUSTER)).ok
    await eventually(lambda: slurm_conditions(kube.pod("gpu-001")))

    await syncer.reconcile(None)
    patches = [c for c in watcher.of_kind("conditions") if c.target.name == "gpu-001"]
    assert len(patches) == 1
    assert set(slurm_conditions(kube.pod("gpu-001"))) == {"SlurmNodeStateIdle"}, kube.pod(
        "gpu-001"
    )["status"]


async def test_rule_a_running_pods_absence_is_written_from_the_first_poll_after_it_started(
    topology: Bus,
    slurm: RunningSlurm,
    clock: ManualClock,
    kube: KubeKV,
    watcher: FakeWatcher,
    timed_syncer: Syncer,
) -> None:
    """A pod whose slurmd never registers still gets NodeNotRegistered (the absence grace
    must start): once a poll began a poll interval (the registration wait) or more after the
    pod was seen past Pending; a poll before then writes nothing (its slurmd may register
    by the next one: one patch, not NodeNotRegistered then its state)."""
    syncer = timed_syncer
    await kube.put_nodeset(make_nodeset())
    await kube.put_node(make_node("node-0"))
    pending = make_pod("gpu-002", "node-0")
    pending["status"]["phase"] = "Pending"
    await kube.put_pod(pending)
    await syncer.start()
    # The first poll (the syncer's own) is over before the clock moves.
    await eventually(lambda: syncer.clusters[CLUSTER].polled)
    assert (await syncer.poll_once(CLUSTER)).ok
    await syncer.reconcile(None)
    assert unknown_condition(kube.pod("gpu-002")) is None
    clock.advance(5)

    await kube.update_pod("gpu-002", lambda pod: pod["status"].update(phase="Running"))
    key = "slurm.gpu-002"
    await eventually(
        lambda: (syncer._pods.get(key) or {}).get("status", {}).get("phase") == "Running"
    )
    clock.advance(REGISTRATION_WAIT - 1)
    assert (await syncer.poll_once(CLUSTER)).ok
    await syncer.reconcile(None)
    assert not [c for c in watcher.of_kind("conditions") if c.target.name == "gpu-002"]
    clock.advance(1)
    assert (await syncer.poll_once(CLUSTER)).ok
    absent = await eventually(lambda: unknown_condition(kube.pod("gpu-002")))
    assert absent["reason"] == SLURM_NOT_REGISTERED_REASON
    assert absent["lastTransitionTime"] == rfc3339(clock.now())
