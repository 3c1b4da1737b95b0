"""The syncer end to end: emulated slurmrestd over HTTP, real NATS, pods and nodes in KV."""

from __future__ import annotations

import asyncio
import contextlib

import msgspec
import pytest

from clustersim.slurm import JobRequest, ManualClock, RunningSlurm
from nodeflow_bus import Bus, PullConsumer
from nodeflow_cli.main import slurm_node as cli_slurm_node
from nodeflow_cli.verdicts import why_pod
from nodeflow_contracts import codec
from nodeflow_contracts.pod_protocol import POD_CORDON_ANNOTATION as POD_CORDON
from nodeflow_contracts.pod_protocol import POD_CORDON_SOURCE_ANNOTATION as POD_CORDON_SOURCE
from nodeflow_contracts.slurm import (
    SlurmNodeChanged,
    SlurmNodeCommand,
    SlurmNodeState,
    SlurmPollResult,
)
from slurm_syncer.client import SlurmUnreachable
from slurm_syncer.reasons import DrainReasons
from slurm_syncer.syncer import Syncer, SyncerOptions
from tests.integration.slurm_syncer.conftest import (
    CLUSTER,
    FakeWatcher,
    KubeKV,
    eventually,
    make_node,
    make_nodeset,
    make_pod,
    send_command,
    slurm_client,
    slurm_conditions,
)

PODS = ["gpu-001", "gpu-002"]


async def setup_cluster(slurm: RunningSlurm, kube: KubeKV, names: list[str] = PODS) -> None:
    await kube.put_nodeset(make_nodeset())
    for index, name in enumerate(names):
        slurm.emulator.register_node(name, cpus=4, real_memory=8192)
        await kube.put_node(make_node(f"node-{index}"))
        await kube.put_pod(make_pod(name, f"node-{index}"))


def sleep_job(node: str, seconds: str = "infinity") -> JobRequest:
    return JobRequest(
        name="work",
        script=f"#!/bin/bash\nsleep {seconds}\n",
        partition=None,
        current_working_directory="/tmp",
        environment=("PATH=/bin",),
        time_limit_minutes=None,
        time_limit_infinite=True,
        required_nodes=(node,),
        minimum_nodes=1,
        cpus_per_node=4,
        exclusive=False,
    )


async def events(bus: Bus, subject: str) -> list[bytes]:
    """Every message stored on `subject` in SLURM_EVENTS so far."""
    found: list[bytes] = []
    subscription = await bus.js.subscribe(subject, stream="SLURM_EVENTS", ordered_consumer=True)
    try:
        while True:
            try:
                msg = await subscription.next_msg(timeout=0.3)
            except Exception:
                return found
            found.append(msg.data)
    finally:
        await subscription.unsubscribe()


async def test_projects_conditions_publishes_changes_and_patches_nothing_at_steady_state(
    topology: Bus, slurm: RunningSlurm, kube: KubeKV, watcher: FakeWatcher, syncer: Syncer
) -> None:
    await setup_cluster(slurm, kube)
    await syncer.start()
    await eventually(lambda: slurm_conditions(kube.pod("gpu-001")) == {"SlurmNodeStateIdle": ""})
    await eventually(lambda: slurm_conditions(kube.pod("gpu-002")) == {"SlurmNodeStateIdle": ""})

    kv = await topology.js.key_value("slurm_nodes")
    entry = await kv.get(f"{CLUSTER}.gpu-001")
    stored = codec.decode(SlurmNodeState, entry.value or b"", subject="kv")
    assert stored.known and stored.base_state == "Idle" and stored.cpus == 4

    # Steady state: more polls, no change, no pod command, no node event.
    patches_before = len(watcher.commands)
    node_events_before = len(await events(topology, "slurm.v1.a.node.>"))
    for _ in range(3):
        result = await syncer.poll_once(CLUSTER)
        assert result.ok and result.node_count == 2
    await asyncio.sleep(0.3)
    assert len(watcher.commands) == patches_before
    assert len(await events(topology, "slurm.v1.a.node.>")) == node_events_before
    polls = [
        codec.decode(SlurmPollResult, d, subject="p")
        for d in await events(topology, "slurm.v1.a.poll")
    ]
    assert len(polls) >= 4 and all(p.ok for p in polls)

    # A job makes the node Allocated: one event, one patch replacing Idle by Allocated.
    slurm.cluster.submit_job(sleep_job("gpu-001"), "alice")
    await syncer.poll_once(CLUSTER)
    await eventually(
        lambda: slurm_conditions(kube.pod("gpu-001")) == {"SlurmNodeStateAllocated": ""}
    )
    changes = [
        codec.decode(SlurmNodeChanged, d, subject="e")
        for d in await events(topology, "slurm.v1.a.node.gpu-001")
    ]
    assert changes[-1].state is not None and changes[-1].state.busy
    assert changes[-1].state.alloc_cpus == 4


async def test_drain_while_busy_shows_draining_then_drained_with_reason(
    topology: Bus,
    slurm: RunningSlurm,
    clock: ManualClock,
    kube: KubeKV,
    watcher: FakeWatcher,
    syncer: Syncer,
) -> None:
    await setup_cluster(slurm, kube)
    job = slurm.cluster.submit_job(sleep_job("gpu-001", "60"), "alice")
    await syncer.start()
    await eventually(
        lambda: slurm_conditions(kube.pod("gpu-001")) == {"SlurmNodeStateAllocated": ""}
    )
    await kube.put_node(make_node("node-0", unschedulable=True, cordon_reason="disk failing"))
    reason = "slurm-operator: cordon: disk failing"
    await eventually(
        lambda: (
            slurm_conditions(kube.pod("gpu-001"))
            == {"SlurmNodeStateAllocated": reason, "SlurmNodeStateDrain": reason}
        )
    )
    assert kube.pod("gpu-001")["metadata"]["annotations"]["nodeflow.dev/pod-cordon"] == "true"
    assert slurm.emulator.node_state("gpu-001") == ["ALLOCATED", "DRAIN"]
    draining = await stored_state(topology, "gpu-001")
    assert draining.draining and not draining.drained and draining.busy
    # The job keeping the node is named, through the drain's read-back, in `why pod`.
    assert draining.jobs == (str(job),) and draining.jobs_total == 1
    verdict = why_pod(
        kube.pod("gpu-001"), await cli_slurm_node(topology, CLUSTER, "gpu-001"), CLUSTER, []
    )
    assert f"4 of 4 CPUs allocated to jobs {job} as of " in verdict, verdict
    # The job ends: IDLE+DRAIN, Drained.
    clock.advance(61)
    slurm.cluster.tick()
    clock.advance(2)
    slurm.cluster.tick()
    assert slurm.cluster.jobs[job].state == "COMPLETED"
    await syncer.poll_once(CLUSTER)
    await eventually(
        lambda: (
            slurm_conditions(kube.pod("gpu-001"))
            == {"SlurmNodeStateIdle": reason, "SlurmNodeStateDrain": reason}
        )
    )
    drained = await stored_state(topology, "gpu-001")
    assert drained.drained and not drained.draining and drained.reason_is_ours
    assert drained.jobs == ()
    assert not any(c.op == "cordon" for c in watcher.commands)
    assert slurm.emulator.node_state("gpu-002") == ["IDLE"]


async def stored_state(bus: Bus, node: str) -> SlurmNodeState:
    kv = await bus.js.key_value("slurm_nodes")
    entry = await kv.get(f"{CLUSTER}.{node}")
    return codec.decode(SlurmNodeState, entry.value or b"", subject="kv")


async def test_external_drain_is_left_untouched_through_cordon_and_uncordon(
    topology: Bus, slurm: RunningSlurm, kube: KubeKV, watcher: FakeWatcher, syncer: Syncer
) -> None:
    await setup_cluster(slurm, kube)
    slurm.cluster.update_node("gpu-001", "root", ["DRAIN"], "bad DIMM (admin)", None)
    await syncer.start()
    external = {"SlurmNodeStateIdle": "bad DIMM (admin)", "SlurmNodeStateDrain": "bad DIMM (admin)"}
    await eventually(lambda: slurm_conditions(kube.pod("gpu-001")) == external)
    requests = slurm.emulator.requests_served

    await kube.put_node(make_node("node-0", unschedulable=True))
    await asyncio.sleep(0.3)
    await syncer.poll_once(CLUSTER)
    # Skipped entirely: no update sent, reason unchanged, pod not even marked.
    assert slurm.cluster.nodes["gpu-001"].reason == "bad DIMM (admin)"
    assert "nodeflow.dev/pod-cordon" not in kube.pod("gpu-001")["metadata"]["annotations"]
    # The poll only: its node listing and its job listing.
    assert slurm.emulator.requests_served == requests + 2

    await kube.put_node(make_node("node-0"))
    await kube.update_pod(
        "gpu-001", lambda p: p["metadata"]["annotations"].pop("nodeflow.dev/pod-cordon", None)
    )
    await asyncio.sleep(0.3)
    await syncer.poll_once(CLUSTER)
    assert slurm.emulator.node_state("gpu-001") == ["IDLE", "DRAIN"]
    assert slurm.cluster.nodes["gpu-001"].reason == "bad DIMM (admin)"
    assert slurm_conditions(kube.pod("gpu-001")) == external


async def test_rule_uncordon_reverses_the_drain_and_removes_the_pod_mark_from_the_node(
    topology: Bus, slurm: RunningSlurm, kube: KubeKV, watcher: FakeWatcher, syncer: Syncer
) -> None:
    await setup_cluster(slurm, kube)
    await syncer.start()
    await eventually(lambda: slurm_conditions(kube.pod("gpu-001")) == {"SlurmNodeStateIdle": ""})
    await kube.put_node(make_node("node-0", unschedulable=True))
    default = "slurm-operator: cordon: Kubernetes node node-0 is cordoned"
    await eventually(lambda: slurm.cluster.nodes["gpu-001"].reason == default)
    await eventually(lambda: kube.pod("gpu-001")["metadata"]["annotations"].get(POD_CORDON))
    annotations = kube.pod("gpu-001")["metadata"]["annotations"]
    assert annotations[POD_CORDON] == "true" and annotations[POD_CORDON_SOURCE] == "node"
    # Uncordoning the node removes the mark that came from it and undrains.
    await kube.put_node(make_node("node-0"))
    await eventually(lambda: slurm.emulator.node_state("gpu-001") == ["IDLE"])
    await eventually(lambda: POD_CORDON not in kube.pod("gpu-001")["metadata"]["annotations"])
    assert POD_CORDON_SOURCE not in kube.pod("gpu-001")["metadata"]["annotations"]
    await eventually(lambda: slurm_conditions(kube.pod("gpu-001")) == {"SlurmNodeStateIdle": ""})
    assert len(watcher.of_kind("pod-cordon")) == 1
    assert len(watcher.of_kind("pod-uncordon")) == 1


async def drained_for_a_cordon(slurm: RunningSlurm, kube: KubeKV, syncer: Syncer) -> None:
    """gpu-001's node cordoned, and the syncer's last read of it drained for that cordon."""
    await setup_cluster(slurm, kube)
    await syncer.start()
    await eventually(lambda: slurm_conditions(kube.pod("gpu-001")) == {"SlurmNodeStateIdle": ""})
    await kube.put_node(make_node("node-0", unschedulable=True))
    cordon = "slurm-operator: cordon: Kubernetes node node-0 is cordoned"
    await eventually(lambda: syncer.clusters[CLUSTER].states["gpu-001"].reason == cordon)


async def test_rule_an_undrain_decided_on_an_old_listing_leaves_a_drain_made_since(
    topology: Bus, slurm: RunningSlurm, kube: KubeKV, watcher: FakeWatcher, syncer: Syncer
) -> None:
    """The last listing shows the node drained for a cordon; an administrator drains it for
    maintenance after that listing; then the node is uncordoned. The undrain was decided on
    the listing, so it reads the node again first: the maintenance drain stays."""
    await drained_for_a_cordon(slurm, kube, syncer)
    slurm.cluster.update_node("gpu-001", "root", ["DRAIN"], "bad DIMM (admin)", None)
    await kube.put_node(make_node("node-0"))
    await eventually(lambda: POD_CORDON not in kube.pod("gpu-001")["metadata"]["annotations"])
    await eventually(lambda: syncer.updates_running == 0)
    assert slurm.emulator.node_state("gpu-001") == ["IDLE", "DRAIN"]
    assert slurm.cluster.nodes["gpu-001"].reason == "bad DIMM (admin)"
    # What the undrain read is kept: the pod shows the administrator's drain.
    await eventually(
        lambda: (
            slurm_conditions(kube.pod("gpu-001"))
            == {"SlurmNodeStateIdle": "bad DIMM (admin)", "SlurmNodeStateDrain": "bad DIMM (admin)"}
        )
    )


async def test_rule_a_drain_command_and_an_undrain_of_the_same_node_never_interleave(
    topology: Bus,
    slurm: RunningSlurm,
    kube: KubeKV,
    watcher: FakeWatcher,
    syncer: Syncer,
    consumer: PullConsumer[SlurmNodeCommand],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The uncordon's undrain has read the node (still drained for the cordon) and its UNDRAIN
    is held while a maintenance drain command arrives for the same node. Interleaved, the
    command's DRAIN would land between that read and the UNDRAIN, which would lift it; one
    after the other, the node ends drained for maintenance."""
    await drained_for_a_cordon(slurm, kube, syncer)
    maintenance = "slurm-operator: maintenance: firmware"
    client = syncer.clusters[CLUSTER].client
    update_node = client.update_node
    undrain_held = asyncio.Event()

    async def held_undrain(name: str, states: list[str], reason: str | None = None) -> None:
        if "UNDRAIN" in states and not undrain_held.is_set():
            undrain_held.set()
            # Held until the command is through (no lock), or for 1 s (it waits for the lock).
            with contextlib.suppress(AssertionError):
                await eventually(
                    lambda: slurm.cluster.nodes[name].reason == maintenance, timeout=1.0
                )
        await update_node(name, states, reason)

    monkeypatch.setattr(client, "update_node", held_undrain)
    await kube.put_node(make_node("node-0"))
    await asyncio.wait_for(undrain_held.wait(), 5)
    await send_command(topology, "drain", "gpu-001", maintenance)
    await eventually(
        lambda: (
            syncer.updates_running == 0
            and slurm.cluster.nodes["gpu-001"].reason == maintenance
            and slurm.emulator.node_state("gpu-001") == ["IDLE", "DRAIN"]
        )
    )
    await asyncio.sleep(0.3)  # nothing undrains it afterwards either
    assert slurm.emulator.node_state("gpu-001") == ["IDLE", "DRAIN"]


async def test_rule_a_pod_cordon_set_by_a_person_stays_after_the_uncordon(
    topology: Bus, slurm: RunningSlurm, kube: KubeKV, watcher: FakeWatcher, syncer: Syncer
) -> None:
    await setup_cluster(slurm, kube)
    await syncer.start()
    await eventually(lambda: slurm_conditions(kube.pod("gpu-002")) == {"SlurmNodeStateIdle": ""})
    # Marked by hand: drained with the pod's reason.
    await kube.update_pod(
        "gpu-002", lambda p: p["metadata"]["annotations"].update({POD_CORDON: "true"})
    )
    await eventually(lambda: slurm.emulator.node_state("gpu-002") == ["IDLE", "DRAIN"])
    assert slurm.cluster.nodes["gpu-002"].reason == (
        "slurm-operator: cordon: pod slurm/gpu-002 is marked cordoned"
    )
    # A cordon and uncordon of its node leave the person's mark, and the drain, in place.
    await kube.put_node(make_node("node-1", unschedulable=True))
    await eventually(
        lambda: (
            slurm.cluster.nodes["gpu-002"].reason
            == "slurm-operator: cordon: Kubernetes node node-1 is cordoned"
        )
    )
    await kube.put_node(make_node("node-1"))
    await syncer.reconcile(None)
    await syncer.poll_once(CLUSTER)
    assert slurm.emulator.node_state("gpu-002") == ["IDLE", "DRAIN"]
    assert kube.pod("gpu-002")["metadata"]["annotations"] == {POD_CORDON: "true"}
    assert not watcher.of_kind("pod-cordon") and not watcher.of_kind("pod-uncordon")
    # The person removes their mark: undrained.
    await kube.update_pod("gpu-002", lambda p: p["metadata"]["annotations"].pop(POD_CORDON))
    await eventually(lambda: slurm.emulator.node_state("gpu-002") == ["IDLE"])


async def test_slurm_delete_drains_and_removing_it_undrains(
    topology: Bus, slurm: RunningSlurm, kube: KubeKV, watcher: FakeWatcher, syncer: Syncer
) -> None:
    await setup_cluster(slurm, kube)
    await syncer.start()
    await eventually(lambda: slurm_conditions(kube.pod("gpu-002")) == {"SlurmNodeStateIdle": ""})
    delete = {"type": "SlurmDelete", "status": "True", "reason": "ScalingDeleteScheduled"}
    await kube.update_pod("gpu-002", lambda p: p["status"]["conditions"].append(delete))
    await eventually(lambda: slurm.emulator.node_state("gpu-002") == ["IDLE", "DRAIN"])
    reason = slurm.cluster.nodes["gpu-002"].reason
    assert reason.startswith("slurm-operator: delete: ScalingDeleteScheduled")
    await eventually(lambda: "SlurmNodeStateDrain" in slurm_conditions(kube.pod("gpu-002")))
    assert (await stored_state(topology, "gpu-002")).drained
    # The NodeSet scaled back up: the condition is removed, the node is undrained.
    await kube.update_pod(
        "gpu-002",
        lambda p: p["status"].update(
            conditions=[c for c in p["status"]["conditions"] if c["type"] != "SlurmDelete"]
        ),
    )
    await eventually(lambda: slurm.emulator.node_state("gpu-002") == ["IDLE"])
    await eventually(lambda: slurm_conditions(kube.pod("gpu-002")) == {"SlurmNodeStateIdle": ""})
    assert not (await stored_state(topology, "gpu-002")).drain


async def test_slurm_down_is_unknown_never_drained_and_recovers(
    topology: Bus, slurm: RunningSlurm, kube: KubeKV, watcher: FakeWatcher, syncer: Syncer
) -> None:
    await setup_cluster(slurm, kube)
    slurm.cluster.update_node("gpu-001", "root", ["DRAIN"], "nodeflow: maintenance x", None)
    await syncer.start()
    await eventually(lambda: "SlurmNodeStateDrain" in slurm_conditions(kube.pod("gpu-001")))
    assert (await stored_state(topology, "gpu-001")).drained

    for mode in ("refuse", "503", "controller"):
        await slurm.go_down(mode)
        # A stopped listener leaves open keep-alive connections serving; a real slurmrestd
        # going away closes them, so drop the client's pooled connections as it would.
        await syncer.clusters[CLUSTER].client.close()
        result = await syncer.poll_once(CLUSTER)
        assert not result.ok and result.error
        unknown = await stored_state(topology, "gpu-001")
        assert not unknown.known and not unknown.drained and not unknown.drain
        assert unknown.base_state == "Unknown"
        await eventually(
            lambda: list(slurm_conditions(kube.pod("gpu-001"))) == ["SlurmNodeStateUnknown"]
        )
        assert "cannot be reached" in slurm_conditions(kube.pod("gpu-001"))["SlurmNodeStateUnknown"]
        # With Slurm unreachable nothing is drained or undrained either.
        await kube.update_pod(
            "gpu-002",
            lambda p: p["metadata"]["annotations"].update({"nodeflow.dev/pod-cordon": "true"}),
        )
        await asyncio.sleep(0.2)
        await slurm.come_back()
        assert slurm.emulator.node_state("gpu-002") == ["IDLE"]
        await kube.update_pod(
            "gpu-002", lambda p: p["metadata"]["annotations"].pop("nodeflow.dev/pod-cordon")
        )
        result = await syncer.poll_once(CLUSTER)
        assert result.ok
        await eventually(
            lambda: (
                slurm_conditions(kube.pod("gpu-001"))
                == {
                    "SlurmNodeStateIdle": "nodeflow: maintenance x",
                    "SlurmNodeStateDrain": "nodeflow: maintenance x",
                }
            )
        )
        assert (await stored_state(topology, "gpu-001")).drained


async def test_pod_without_slurm_node_is_unknown_and_removed_nodes_are_reported(
    topology: Bus, slurm: RunningSlurm, kube: KubeKV, watcher: FakeWatcher, syncer: Syncer
) -> None:
    await setup_cluster(slurm, kube)
    await kube.put_pod(make_pod("gpu-009", "node-9"))
    await syncer.start()
    await eventually(
        lambda: list(slurm_conditions(kube.pod("gpu-009"))) == ["SlurmNodeStateUnknown"]
    )
    slurm.cluster.remove_node("gpu-002")
    await syncer.poll_once(CLUSTER)
    await eventually(
        lambda: list(slurm_conditions(kube.pod("gpu-002"))) == ["SlurmNodeStateUnknown"]
    )
    kv = await topology.js.key_value("slurm_nodes")
    assert f"{CLUSTER}.gpu-002" not in await kv.keys()
    removed = [
        codec.decode(SlurmNodeChanged, d, subject="e")
        for d in await events(topology, "slurm.v1.a.node.gpu-002")
    ]
    assert removed[-1].change == "removed"


async def test_error_carrying_answers_are_reported_and_polling_goes_on(
    topology: Bus, slurm: RunningSlurm, kube: KubeKV, watcher: FakeWatcher, syncer: Syncer
) -> None:
    await setup_cluster(slurm, kube)
    await syncer.start()
    await eventually(lambda: slurm_conditions(kube.pod("gpu-001")) == {"SlurmNodeStateIdle": ""})
    slurm.emulator.set_faults(errors_in_200_rate=1.0)
    result = await syncer.poll_once(CLUSTER)
    assert not result.ok and "Simulated failure answered with HTTP 200" in result.error
    slurm.emulator.set_faults(errors_in_200_rate=0.0, error_rate=1.0)
    result = await syncer.poll_once(CLUSTER)
    assert not result.ok and "HTTP 500" in result.error
    slurm.emulator.clear_faults()
    result = await syncer.poll_once(CLUSTER)
    assert result.ok
    await eventually(lambda: slurm_conditions(kube.pod("gpu-001")) == {"SlurmNodeStateIdle": ""})


async def test_a_restarted_syncer_resumes_from_kv_without_republishing(
    topology: Bus, slurm: RunningSlurm, kube: KubeKV, watcher: FakeWatcher, syncer: Syncer
) -> None:
    await setup_cluster(slurm, kube)
    await syncer.start()
    await eventually(lambda: slurm_conditions(kube.pod("gpu-002")) == {"SlurmNodeStateIdle": ""})
    await syncer.stop()
    events_before = len(await events(topology, "slurm.v1.a.node.>"))
    commands_before = len(watcher.commands)
    # Lost and regained the lease: the same object starts again, from KV.
    await syncer.start()
    await eventually(lambda: syncer.clusters[CLUSTER].polled)
    await syncer.poll_once(CLUSTER)
    await asyncio.sleep(0.3)
    assert len(await events(topology, "slurm.v1.a.node.>")) == events_before
    assert len(watcher.commands) == commands_before
    slurm.cluster.update_node("gpu-002", "root", ["DRAIN"], "admin: fan", None)
    await syncer.poll_once(CLUSTER)
    await eventually(lambda: "SlurmNodeStateDrain" in slurm_conditions(kube.pod("gpu-002")))


async def test_a_regained_term_starts_from_kv_not_from_what_the_replica_knew(
    topology: Bus, slurm: RunningSlurm, kube: KubeKV, watcher: FakeWatcher, syncer: Syncer
) -> None:
    """While another replica led, a node left Slurm (its state left KV) and another was
    drained: this replica's old memory of both must not come back with its new term."""
    await setup_cluster(slurm, kube)
    await syncer.start()
    await eventually(lambda: slurm_conditions(kube.pod("gpu-002")) == {"SlurmNodeStateIdle": ""})
    await syncer.stop()
    kv = await topology.js.key_value("slurm_nodes")
    await kv.delete(f"{CLUSTER}.gpu-001")
    drained = msgspec.structs.replace(
        await stored_state(topology, "gpu-002"), flags=("Drain",), drain=True, reason="x"
    )
    await kv.put(f"{CLUSTER}.gpu-002", codec.encode(drained))
    # Lost and regained the lease: the same object starts again.
    await syncer.start()
    states = syncer.clusters[CLUSTER].states
    assert "gpu-001" not in states
    assert states["gpu-002"].drain and states["gpu-002"].reason == "x"


async def test_a_pending_patch_is_not_sent_again_when_the_pod_changes_meanwhile(
    topology: Bus, slurm: RunningSlurm, kube: KubeKV, watcher: FakeWatcher, syncer: Syncer
) -> None:
    """A starting pod changes several times (bound, running, ready) before the syncer's
    condition patch lands: one patch, not one per pod version. A new pod of the same name
    (another uid) gets its own patch at once."""
    watcher.apply = False  # the patch stays in flight
    await setup_cluster(slurm, kube, ["gpu-001"])
    await syncer.start()
    await eventually(lambda: len(watcher.commands) == 1)
    pod = make_pod("gpu-001", "node-0")
    for version in range(2, 6):
        pod["metadata"]["resourceVersion"] = str(version)
        pod["metadata"]["annotations"] = {"touched": str(version)}
        await kube.put_pod(pod)
    await syncer.poll_once(CLUSTER)
    await asyncio.sleep(0.5)
    assert len(watcher.commands) == 1

    replacement = make_pod("gpu-001", "node-0")
    replacement["metadata"]["uid"] = "uid-gpu-001-second"
    await kube.put_pod(replacement)
    await eventually(lambda: len(watcher.commands) == 2)
    assert watcher.commands[1].target.uid == "uid-gpu-001-second"


async def test_rule_a_job_end_is_in_kv_when_the_poll_that_sees_it_returns(
    topology: Bus,
    slurm: RunningSlurm,
    clock: ManualClock,
    kube: KubeKV,
    watcher: FakeWatcher,
    syncer: Syncer,
) -> None:
    """The syncer's share of job-end -> pod-deleted is at most one poll: the drained+idle
    state is published in the poll's own batch, with no timer between (nodeset-controller
    deletes on that KV change)."""
    await setup_cluster(slurm, kube)
    job = slurm.cluster.submit_job(sleep_job("gpu-001", "60"), "alice")
    delete = {"type": "SlurmDelete", "status": "True", "reason": "ScalingDeleteScheduled"}
    pod = make_pod("gpu-001", "node-0", conditions=[delete])
    await kube.put_pod(pod)
    await syncer.start()
    await eventually(lambda: slurm.emulator.node_state("gpu-001") == ["ALLOCATED", "DRAIN"])
    await syncer.poll_once(CLUSTER)
    assert (await stored_state(topology, "gpu-001")).draining
    clock.advance(61)
    slurm.cluster.tick()
    clock.advance(2)
    slurm.cluster.tick()
    assert slurm.cluster.jobs[job].state == "COMPLETED"
    assert (await syncer.poll_once(CLUSTER)).ok
    # No waiting: the state is there as soon as the poll returns.
    state = await stored_state(topology, "gpu-001")
    assert state.drained and not state.busy


async def test_rule_drains_of_an_earlier_version_are_still_ours_after_the_upgrade(
    topology: Bus, slurm: RunningSlurm, kube: KubeKV, watcher: FakeWatcher, syncer: Syncer
) -> None:
    """Nodes drained as `nodeflow: ...` before the prefix became `slurm-operator:` are lifted
    once nothing asks for them, and a cordon drain is written with the new prefix."""
    await setup_cluster(slurm, kube)
    slurm.cluster.update_node(
        "gpu-001", "slurm", ["DRAIN"], "nodeflow: cordon: Kubernetes node node-0 is cordoned", None
    )
    await syncer.start()
    await eventually(lambda: slurm.emulator.node_state("gpu-001") == ["IDLE"])
    await kube.put_node(make_node("node-1", unschedulable=True))
    await eventually(
        lambda: (
            slurm.cluster.nodes["gpu-002"].reason
            == "slurm-operator: cordon: Kubernetes node node-1 is cordoned"
        )
    )


async def test_rule_slinky_drains_are_lifted_after_the_switch_and_a_humans_stays(
    topology: Bus, slurm: RunningSlurm, kube: KubeKV, watcher: FakeWatcher, syncer: Syncer
) -> None:
    """Nodes Slinky's slurm-operator drained (a pod cordon, a scale-in) come back once nothing
    asks for the drain; a person's drain in Slinky's words plus more stays."""
    await setup_cluster(slurm, kube)
    slurm.cluster.update_node(
        "gpu-001", "slurm", ["DRAIN"], "slurm-operator: Pod (slurm/worker-0) was cordoned", None
    )
    human = "slurm-operator: Pod (slurm/worker-1) was cordoned by bob, bad DIMM"
    slurm.cluster.update_node("gpu-002", "root", ["DRAIN"], human, None)
    await syncer.start()
    await eventually(lambda: slurm.emulator.node_state("gpu-001") == ["IDLE"])
    assert "DRAIN" in slurm.emulator.node_state("gpu-002")
    assert slurm.cluster.nodes["gpu-002"].reason == human


async def test_rule_the_drain_reason_prefix_is_a_setting(
    topology: Bus, slurm: RunningSlurm, kube: KubeKV, watcher: FakeWatcher
) -> None:
    client = slurm_client(slurm)
    syncer = Syncer(
        topology,
        {CLUSTER: client},
        SyncerOptions(poll_interval=3600.0, drain_reasons=DrainReasons("acme-ops:")),
    )
    try:
        await setup_cluster(slurm, kube)
        # Another operator's reason with the reference prefix: external on this site.
        foreign = "slurm-operator: cordon: theirs"
        slurm.cluster.update_node("gpu-002", "root", ["DRAIN"], foreign, None)
        await syncer.start()
        await kube.put_node(make_node("node-0", unschedulable=True))
        await eventually(
            lambda: (
                slurm.cluster.nodes["gpu-001"].reason
                == "acme-ops: cordon: Kubernetes node node-0 is cordoned"
            )
        )
        await syncer.poll_once(CLUSTER)
        assert slurm.emulator.node_state("gpu-002") == ["IDLE", "DRAIN"]
        assert slurm.cluster.nodes["gpu-002"].reason == foreign
    finally:
        await syncer.stop()
        await client.close()


async def test_rule_slurmctlds_not_responding_is_not_an_external_reason(
    topology: Bus, slurm: RunningSlurm, kube: KubeKV, watcher: FakeWatcher, syncer: Syncer
) -> None:
    """A dead slurmd's node is DOWN with slurmctld's `Not responding`: while it is silent the
    syncer leaves it alone (nodeset-controller may delete a DOWN node's pod without a drain);
    once slurmd answers but the node is still held DOWN, a cordon drains it with our reason
    instead of waiting for ever on a reason nobody but slurmctld would clear."""
    await setup_cluster(slurm, kube)
    await syncer.start()
    await eventually(lambda: slurm_conditions(kube.pod("gpu-001")) == {"SlurmNodeStateIdle": ""})
    slurm.emulator.mark_lost("gpu-001")
    await syncer.poll_once(CLUSTER)
    await eventually(
        lambda: slurm_conditions(kube.pod("gpu-001")).get("SlurmNodeStateDown") == "Not responding"
    )
    await kube.put_node(make_node("node-0", unschedulable=True))
    await syncer.reconcile(None)
    await syncer.poll_once(CLUSTER)
    assert "DRAIN" not in slurm.emulator.node_state("gpu-001")
    assert slurm.cluster.nodes["gpu-001"].reason == "Not responding"

    # slurmd answers again but the node stays DOWN (ReturnToService=0): the reason is still
    # slurmctld's, and the cordon now drains it.
    slurm.cluster.update_node("gpu-002", "slurm", ["DOWN"], "Not responding", None)
    await syncer.poll_once(CLUSTER)
    await kube.put_node(make_node("node-1", unschedulable=True))
    await eventually(lambda: slurm.emulator.node_state("gpu-002") == ["DOWN", "DRAIN"])
    assert slurm.cluster.nodes["gpu-002"].reason == (
        "slurm-operator: cordon: Kubernetes node node-1 is cordoned"
    )
    # And the uncordon undoes it.
    await kube.put_node(make_node("node-1"))
    await eventually(lambda: slurm.emulator.node_state("gpu-002") == ["DOWN"])


async def test_rule_a_failed_job_listing_keeps_the_node_busy_and_its_jobs_as_last_read(
    topology: Bus,
    slurm: RunningSlurm,
    kube: KubeKV,
    watcher: FakeWatcher,
    syncer: Syncer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The job listing is one more request of each poll, read for `why pod` only: when it
    fails the poll still succeeds and the node stays as busy as its own state says."""
    await setup_cluster(slurm, kube)
    job = slurm.cluster.submit_job(sleep_job("gpu-001"), "alice")
    await syncer.start()
    await eventually(
        lambda: slurm_conditions(kube.pod("gpu-001")) == {"SlurmNodeStateAllocated": ""}
    )
    named = await stored_state(topology, "gpu-001")
    assert named.busy and named.jobs == (str(job),)

    async def refused(**_: object) -> list[dict[str, object]]:
        raise SlurmUnreachable(CLUSTER, "list jobs: connection refused")

    monkeypatch.setattr(syncer.clusters[CLUSTER].client, "list_jobs", refused)
    slurm.cluster.update_node("gpu-001", "root", ["DRAIN"], "bad DIMM (admin)", None)
    assert (await syncer.poll_once(CLUSTER)).ok
    kept = await stored_state(topology, "gpu-001")
    assert kept.busy and kept.draining and not kept.drained
    assert (kept.jobs, kept.jobs_read_at) == (named.jobs, named.jobs_read_at)
