"""slurm-syncer against a real Slurm 24.11 (CI: `make test-real-slurm`), else the emulator.

The syncer runs in-process on a real NATS as in the other integration tests; the NodeSet pods
are named after real Slurm nodes and carry the cluster label. Each step acts on Slurm (a job,
an operator's drain) or on Kubernetes (SlurmDelete, a cordon) and then checks three things:
Slurm itself as slurmrestd reports it, the node state the syncer keeps in KV, and the pod's
conditions as the syncer's status patches leave them. See real_slurm_support.py for how the
Slurm is chosen.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest

from nodeflow_bus import Bus
from nodeflow_contracts import codec, subjects
from nodeflow_contracts.slurm import SlurmNodeState
from slurm_syncer.syncer import Syncer, SyncerOptions
from tests.integration.slurm_syncer.conftest import (
    NAMESPACE,
    FakeWatcher,
    KubeKV,
    eventually,
    make_node,
    make_pod,
    slurm_conditions,
)
from tests.integration.slurm_syncer.real_slurm_support import (
    CLUSTER,
    SlurmUnderTest,
    slurm_under_test,
)

SLURM_CLUSTER_LABEL = "nodeflow.dev/slurm-cluster"
POD_CORDON = "nodeflow.dev/pod-cordon"
# How long Slurm may take to show a step: scheduling, job end and completion, a poll or two.
STEP_TIMEOUT = 20.0
Conditions = dict[str, str]

IDLE = "SlurmNodeStateIdle"
ALLOCATED = "SlurmNodeStateAllocated"
DRAIN = "SlurmNodeStateDrain"


class RecordingKube(KubeKV):
    """KubeKV that remembers every distinct set of Slurm conditions each pod went through,
    so a test can check the order of the steps, not only where they ended."""

    def __init__(self, bus: Bus) -> None:
        super().__init__(bus)
        self.history: dict[str, list[Conditions]] = {}

    async def put_pod(self, pod: dict[str, Any]) -> None:
        seen = self.history.setdefault(pod["metadata"]["name"], [])
        current = slurm_conditions(pod)
        if not seen or seen[-1] != current:
            seen.append(current)
        await super().put_pod(pod)


def went_through(history: Sequence[Conditions], steps: Sequence[Conditions]) -> bool:
    """`steps` appear in `history` in this order (other, passing states may come between)."""
    remaining = iter(history)
    return all(any(seen == step for seen in remaining) for step in steps)


@pytest.fixture
async def under_test() -> AsyncIterator[SlurmUnderTest]:
    async with slurm_under_test() as slurm:
        yield slurm


@pytest.fixture
def kube(topology: Bus) -> RecordingKube:
    return RecordingKube(topology)


@pytest.fixture
async def syncer(topology: Bus, under_test: SlurmUnderTest) -> AsyncIterator[Syncer]:
    """The syncer polling every half second, as deployed but faster."""
    client = under_test.syncer_client()
    running = Syncer(topology, {CLUSTER: client}, SyncerOptions(poll_interval=0.5))
    try:
        yield running
    finally:
        await running.stop()
        await client.close()


def nodeset_pod(slurm_node: str, kube_node: str) -> dict[str, Any]:
    """A NodeSet pod named after its Slurm node; the label names the Slurm cluster."""
    pod = make_pod(slurm_node, kube_node)
    pod["metadata"]["labels"][SLURM_CLUSTER_LABEL] = CLUSTER
    return pod


async def stored_state(bus: Bus, node: str) -> SlurmNodeState:
    kv = await bus.js.key_value("slurm_nodes")
    entry = await kv.get(subjects.slurm_node_key(CLUSTER, node))
    return codec.decode(SlurmNodeState, entry.value or b"", subject="kv")


async def slurm_state(slurm: SlurmUnderTest, node: str) -> list[str]:
    return list((await slurm.node(node))["state"])


async def test_job_then_drain_for_deletion_shows_draining_drained_and_undrains(
    topology: Bus,
    under_test: SlurmUnderTest,
    kube: RecordingKube,
    watcher: FakeWatcher,
    syncer: Syncer,
) -> None:
    slurm = under_test
    name = await slurm.take_free_node()
    await kube.put_node(make_node("k8s-1"))
    await kube.put_pod(nodeset_pod(name, "k8s-1"))
    await syncer.start()

    def conditions() -> Conditions:
        return slurm_conditions(kube.pod(name))

    await eventually(lambda: conditions() == {IDLE: ""}, STEP_TIMEOUT)

    # A job on the node: ALLOCATED, and the pod follows.
    job = await slurm.submit_sleep(name)
    await eventually(lambda: conditions() == {ALLOCATED: ""}, STEP_TIMEOUT)
    assert (await slurm.job_state(job))[:1] == ["RUNNING"]
    assert (await stored_state(topology, name)).busy

    # The NodeSet schedules the pod for deletion while the job runs: the syncer drains with a
    # reason of ours; ALLOCATED+DRAIN is Draining.
    scheduled = {"type": "SlurmDelete", "status": "True", "reason": "ScalingDeleteScheduled"}
    await kube.update_pod(name, lambda p: p["status"]["conditions"].append(scheduled))
    await eventually(lambda: DRAIN in conditions(), STEP_TIMEOUT)
    node = await slurm.node(name)
    reason = node["reason"]
    assert reason.startswith("nodeflow: delete: ScalingDeleteScheduled: ")
    assert f"pod {NAMESPACE}/{name}" in reason
    assert node["state"] == ["ALLOCATED", "DRAIN"]
    assert conditions() == {ALLOCATED: reason, DRAIN: reason}
    assert (await slurm.job_state(job))[:1] == ["RUNNING"], "the job ended before the drain"
    draining = await stored_state(topology, name)
    assert draining.draining and not draining.drained and draining.reason_is_ours

    # The job ends: IDLE+DRAIN, Drained, the reason kept.
    await eventually(lambda: conditions() == {IDLE: reason, DRAIN: reason}, STEP_TIMEOUT)
    assert await slurm_state(slurm, name) == ["IDLE", "DRAIN"]
    assert (await slurm.node(name))["reason"] == reason
    drained = await stored_state(topology, name)
    assert drained.drained and not drained.draining and drained.reason == reason

    # The NodeSet scales back up: SlurmDelete removed, the node undrained. (Real Slurm shows
    # IDLE+NOT_RESPONDING for up to a second after an UNDRAIN, until slurmctld has pinged the
    # node again; the pod may pass through that on its way back to Idle.)
    await kube.update_pod(
        name,
        lambda p: p["status"].update(
            conditions=[c for c in p["status"]["conditions"] if c["type"] != "SlurmDelete"]
        ),
    )
    await eventually(lambda: conditions() == {IDLE: ""}, STEP_TIMEOUT)
    assert await slurm_state(slurm, name) == ["IDLE"]
    assert not (await stored_state(topology, name)).drain

    steps = [
        {IDLE: ""},
        {ALLOCATED: ""},
        {ALLOCATED: reason, DRAIN: reason},
        {IDLE: reason, DRAIN: reason},
        {IDLE: ""},
    ]
    assert went_through(kube.history[name], steps), kube.history[name]
    # Drains for deletion never touch the Kubernetes node or mark the pod cordoned.
    assert not watcher.of_kind("pod-cordon")


async def test_cordon_drains_and_an_operators_drain_is_left_untouched(
    topology: Bus,
    under_test: SlurmUnderTest,
    kube: RecordingKube,
    watcher: FakeWatcher,
    syncer: Syncer,
) -> None:
    slurm = under_test
    ours, theirs = await slurm.take_free_node(), await slurm.take_free_node()
    external = f"bad DIMM, ticket {uuid.uuid4().hex[:8]} (operator)"
    await slurm.drain_as_admin(theirs, external)
    # Both pods on one Kubernetes node: one cordon reaches both in the same pass, so the drain
    # of `ours` shows that the syncer has seen the cordon of `theirs` too.
    await kube.put_node(make_node("k8s-1"))
    await kube.put_pod(nodeset_pod(ours, "k8s-1"))
    scheduled = {"type": "SlurmDelete", "status": "True", "reason": "RollingDeleteScheduled"}
    theirs_pod = nodeset_pod(theirs, "k8s-1")
    theirs_pod["status"]["conditions"].append(scheduled)
    await kube.put_pod(theirs_pod)
    await syncer.start()

    def of(node: str) -> Conditions:
        return slurm_conditions(kube.pod(node))

    await eventually(lambda: of(ours) == {IDLE: ""}, STEP_TIMEOUT)
    await eventually(lambda: of(theirs) == {IDLE: external, DRAIN: external}, STEP_TIMEOUT)
    before = await slurm.node(theirs)

    await kube.put_node(make_node("k8s-1", unschedulable=True, cordon_reason="disk failing"))
    reason = "nodeflow: cordon: disk failing"
    await eventually(lambda: of(ours) == {IDLE: reason, DRAIN: reason}, STEP_TIMEOUT)
    assert await slurm_state(slurm, ours) == ["IDLE", "DRAIN"]
    assert (await slurm.node(ours))["reason"] == reason
    await eventually(lambda: kube.pod(ours)["metadata"]["annotations"].get(POD_CORDON) == "true")
    # Two more full passes for good measure: the operator's drain is still exactly as set,
    # through the cordon and a SlurmDelete, and that pod is not even marked.
    for _ in range(2):
        assert (await syncer.poll_once(CLUSTER)).ok
    after = await slurm.node(theirs)
    for key in ("state", "reason", "reason_set_by_user", "reason_changed_at"):
        assert after[key] == before[key], key
    assert POD_CORDON not in kube.pod(theirs)["metadata"]["annotations"]
    assert of(theirs) == {IDLE: external, DRAIN: external}

    # Uncordoned: the pod's mark keeps our drain (the reference model) until it is removed.
    await kube.put_node(make_node("k8s-1"))
    await asyncio.sleep(0.3)
    assert (await syncer.poll_once(CLUSTER)).ok
    assert await slurm_state(slurm, ours) == ["IDLE", "DRAIN"]
    await kube.update_pod(ours, lambda p: p["metadata"]["annotations"].pop(POD_CORDON))
    await eventually(lambda: of(ours) == {IDLE: ""}, STEP_TIMEOUT)
    assert await slurm_state(slurm, ours) == ["IDLE"]
    assert went_through(
        kube.history[ours], [{IDLE: ""}, {IDLE: reason, DRAIN: reason}, {IDLE: ""}]
    ), kube.history[ours]

    assert (await syncer.poll_once(CLUSTER)).ok
    after = await slurm.node(theirs)
    for key in ("state", "reason", "reason_set_by_user", "reason_changed_at"):
        assert after[key] == before[key], key
    assert of(theirs) == {IDLE: external, DRAIN: external}
    assert len(watcher.of_kind("pod-cordon")) == 1
