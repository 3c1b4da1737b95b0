"""The syncer's pure decision core: pod facts + Slurm states + what was sent + now ->
pod commands and Slurm updates."""

from __future__ import annotations

import dataclasses
from typing import Any

import msgspec
from hypothesis import given
from hypothesis import strategies as st

from clustersim.kube.patch import strategic_merge_patch
from nodeflow_contracts.k8s import PatchObject
from nodeflow_contracts.pod_protocol import (
    POD_CORDON_ANNOTATION,
    POD_CORDON_SOURCE_ANNOTATION,
)
from nodeflow_contracts.slurm import SlurmNodeState
from slurm_syncer.nodestate import derive, unknown_state
from slurm_syncer.pods import PodFacts
from slurm_syncer.reconcile import (
    ClusterSnapshot,
    PodCommand,
    ReconcileOptions,
    SentRecord,
    reconcile_pods,
)
from tests.unit.slurm_syncer.test_conditions import written as conditions_written

NOW = 1_800_000_000.0
OPTIONS = ReconcileOptions(resend_after=30.0)


def facts(name: str = "gpu-1", **changes: Any) -> PodFacts:
    base = PodFacts(
        key=f"slurm.{name}",
        namespace="slurm",
        name=name,
        uid=f"uid-{name}",
        resource_version="1",
        cluster="a",
        node_name="node-1",
        node_known=True,
        node_unschedulable=False,
        node_cordon_reason=None,
        pod_cordoned=False,
        pod_cordon_from_node=False,
        delete_reason=None,
        terminating=False,
        conditions=(),
        running_seen_at=NOW - 60.0,
    )
    return dataclasses.replace(base, **changes)


def node(
    name: str = "gpu-1", base: Any = "Idle", flags: tuple[str, ...] = (), reason: str = ""
) -> SlurmNodeState:
    derived = derive(base, flags)
    return SlurmNodeState(
        cluster="a",
        name=name,
        known=True,
        base_state=base,
        flags=flags,
        reason=reason,
        busy=derived.busy,
        drain=derived.drain,
        drained=derived.drained,
        draining=derived.draining,
    )


def written(command: PodCommand) -> list[dict[str, Any]]:
    """The conditions a conditions command sets (its delete directives left out)."""
    operation = command.command.operation
    assert isinstance(operation, PatchObject)
    return conditions_written(operation.patch)


def cluster(*states: SlurmNodeState, reachable: bool = True, polled: bool = True) -> Any:
    return {
        "a": ClusterSnapshot(
            name="a",
            polled=polled,
            reachable=reachable,
            states={s.name: s for s in states},
            poll_started_at=NOW,
        )
    }


def test_rule_nothing_is_decided_before_the_first_poll_or_for_another_cluster() -> None:
    assert reconcile_pods([facts()], cluster(node(), polled=False), {}, NOW).pods == 0
    other = facts(cluster="b", node_unschedulable=True)
    result = reconcile_pods([other], cluster(node()), {}, NOW)
    assert result.pods == 0 and not result.pod_commands and not result.slurm_updates


def test_rule_the_same_pod_command_is_not_sent_twice_before_resend_after() -> None:
    first = reconcile_pods([facts()], cluster(node()), {}, NOW, options=OPTIONS)
    (command,) = first.pod_commands
    assert command.kind == "conditions" and len(first.sent) == 1
    soon = reconcile_pods([facts()], cluster(node()), first.sent, NOW + 10, options=OPTIONS)
    assert not soon.pod_commands and not soon.sent
    late = reconcile_pods([facts()], cluster(node()), first.sent, NOW + 31, options=OPTIONS)
    (again,) = late.pod_commands
    assert ":2:" in again.command.idempotency_key
    assert again.command.idempotency_key != command.command.idempotency_key
    # A new pod of the same name (another uid) gets its own patch at once.
    replacement = facts(uid="uid-other")
    assert reconcile_pods([replacement], cluster(node()), first.sent, NOW + 1).pod_commands


def as_view(pod: dict[str, Any], resource_version: int) -> PodFacts:
    """The syncer's view of `pod` (the conditions it shows)."""
    return facts(
        resource_version=str(resource_version), conditions=tuple(pod["status"]["conditions"])
    )


def test_rule_a_condition_patch_past_its_lifetime_is_sent_again() -> None:
    """An expired patch can no longer land (k8s-watcher reports it expired): once its
    lifetime is over, a pod still short of the state gets it again, before resend_after."""
    first = reconcile_pods([facts()], cluster(node()), {}, NOW, options=OPTIONS)
    within = reconcile_pods([facts()], cluster(node()), first.sent, NOW + 14, options=OPTIONS)
    assert not within.pod_commands
    past = reconcile_pods([facts()], cluster(node()), first.sent, NOW + 16, options=OPTIONS)
    assert [c.kind for c in past.pod_commands] == ["conditions"]


def test_rule_a_state_that_flips_back_is_sent_again_as_a_new_command() -> None:
    """Idle, Allocated, Idle again while the view stands still: the third patch is a new
    command (a new key), not a repeat of the first that k8s-watcher and JetStream would
    drop as already applied -- which would leave the pod showing Allocated."""
    view = facts()
    keys = []
    sent: dict[tuple[str, str], SentRecord] = {}
    for offset, state in enumerate((node(), node(base="Allocated"), node())):
        result = reconcile_pods([view], cluster(state), sent, NOW + offset, options=OPTIONS)
        (command,) = result.pod_commands
        keys.append(command.command.idempotency_key)
        sent.update(result.sent)
    assert len(set(keys)) == 3


def test_rule_patches_from_a_lagging_view_leave_the_pod_at_the_last_state_sent() -> None:
    """Two patches computed from the same lagging view (Idle, then Allocated: the pod still
    shows NodeNotRegistered) land in the order sent, as k8s-watcher applies one object's
    commands: the pod shows Allocated alone, and neither the lagging view nor the landed
    pod sends anything more (a patch computed from a view would have left Idle behind and
    needed a third)."""
    not_registered = {"type": "SlurmNodeStateUnknown", "status": "True"}
    pod: dict[str, Any] = {"status": {"conditions": [dict(not_registered, reason="x")]}}
    lagging = as_view(pod, 1)
    first = reconcile_pods([lagging], cluster(node()), {}, NOW, options=OPTIONS)
    sent = dict(first.sent)
    busy = node(base="Allocated")
    second = reconcile_pods([lagging], cluster(busy), sent, NOW + 1, options=OPTIONS)
    sent.update(second.sent)
    for command in (*first.pod_commands, *second.pod_commands):
        operation = command.command.operation
        assert isinstance(operation, PatchObject)
        pod = strategic_merge_patch(pod, operation.patch)
    assert [c["type"] for c in pod["status"]["conditions"]] == ["SlurmNodeStateAllocated"]
    for view in (lagging, as_view(pod, 3)):
        assert not reconcile_pods([view], cluster(busy), sent, NOW + 2, options=OPTIONS).sent


def test_rule_a_cordoned_node_marks_its_pod_with_the_source_and_the_uncordon_unmarks() -> None:
    cordoned = reconcile_pods([facts(node_unschedulable=True)], cluster(node()), {}, NOW)
    marks = [c for c in cordoned.pod_commands if c.kind == "pod-cordon"]
    assert len(marks) == 1
    operation = marks[0].command.operation
    assert isinstance(operation, PatchObject) and operation.patch_type == "merge"
    assert operation.patch["metadata"]["annotations"] == {
        POD_CORDON_ANNOTATION: "true",
        POD_CORDON_SOURCE_ANNOTATION: "node",
    }
    assert [plan.action for _, plan in cordoned.slurm_updates] == ["drain"]

    marked = facts(pod_cordoned=True, pod_cordon_from_node=True)
    drained = node(flags=("Drain",), reason="slurm-operator: cordon: Kubernetes node node-1")
    uncordoned = reconcile_pods([marked], cluster(drained), cordoned.sent, NOW + 1)
    unmarks = [c for c in uncordoned.pod_commands if c.kind == "pod-uncordon"]
    assert len(unmarks) == 1
    operation = unmarks[0].command.operation
    assert isinstance(operation, PatchObject)
    assert operation.patch["metadata"]["annotations"] == {
        POD_CORDON_ANNOTATION: None,
        POD_CORDON_SOURCE_ANNOTATION: None,
    }
    assert [plan.action for _, plan in uncordoned.slurm_updates] == ["undrain"]


def test_rule_a_node_with_an_update_running_gets_no_second_one() -> None:
    pod = facts(node_unschedulable=True)
    result = reconcile_pods([pod], cluster(node()), {}, NOW, updating={("a", "gpu-1")})
    assert not result.slurm_updates


def test_rule_an_absent_node_of_a_reachable_cluster_is_not_registered() -> None:
    result = reconcile_pods([facts()], cluster(), {}, NOW)
    (command,) = result.pod_commands
    (entry,) = written(command)
    assert entry["type"] == "SlurmNodeStateUnknown" and entry["reason"] == "NodeNotRegistered"


pod_facts = st.builds(
    facts,
    name=st.sampled_from(["gpu-1", "gpu-2"]),
    node_known=st.booleans(),
    node_unschedulable=st.booleans(),
    pod_cordoned=st.booleans(),
    pod_cordon_from_node=st.booleans(),
    delete_reason=st.sampled_from([None, "ScalingDeleteScheduled", "RollingDeleteScheduled"]),
    terminating=st.booleans(),
)
slurm_reasons = st.sampled_from(
    [
        "",
        "slurm-operator: cordon: x",
        "nodeflow: delete: y",
        "slurm-operator: maintenance",
        "bad DIMM",
        "Not responding",
    ]
)
readable_states = st.builds(
    node,
    name=st.sampled_from(["gpu-1", "gpu-2"]),
    base=st.sampled_from(["Idle", "Allocated", "Mixed", "Down"]),
    flags=st.sets(st.sampled_from(["Drain", "Completing", "NotResponding", "Undrain"])).map(
        lambda flags: tuple(sorted(flags))
    ),
    reason=slurm_reasons,
)


readable_or_absent = st.one_of(st.none(), readable_states)
# One step of a pod's life as the syncer sees it: Slurm reads a new state (and a pass runs
# on the view as it is), k8s-watcher applies the oldest patch in flight, or the view catches
# up with the pod (and a pass runs).
lagging_steps = st.lists(
    st.one_of(
        st.tuples(st.just("state"), readable_or_absent),
        st.tuples(st.just("apply"), st.none()),
        st.tuples(st.just("view"), st.none()),
    ),
    max_size=14,
)


def slurm_types(pod: dict[str, Any]) -> set[str]:
    return {c["type"] for c in pod["status"]["conditions"] if c["type"].startswith("SlurmNode")}


@given(steps=lagging_steps)
def test_rule_one_condition_patch_per_state_change_whatever_the_view_lags(
    steps: list[tuple[str, SlurmNodeState | None]],
) -> None:
    """Minimal writes under lag (a pod's view trails the patches in flight by any number of
    them): no more condition patches are sent than the node's state changes, and once
    everything has landed and been seen the pod shows exactly its node's state with nothing
    left to send."""
    pod: dict[str, Any] = {"status": {"conditions": [{"type": "Ready", "status": "True"}]}}
    view = as_view(pod, 0)
    in_flight: list[PodCommand] = []
    sent: dict[tuple[str, str], SentRecord] = {}
    state: SlurmNodeState | None = node()
    now = NOW

    keys_seen: set[str] = set()

    def reconcile_pass() -> int:
        nonlocal now
        now += 0.01  # never past resend_after: only what the view shows decides
        result = reconcile_pods([view], cluster(*[state] if state else []), sent, now)
        for command in result.pod_commands:
            # JetStream and k8s-watcher drop a command whose key they have seen.
            if command.kind == "conditions" and command.command.idempotency_key not in keys_seen:
                keys_seen.add(command.command.idempotency_key)
                in_flight.append(command)
        sent.update(result.sent)
        return len(result.pod_commands)

    sends = reconcile_pass()
    changes = 1
    for version, (step, reading) in enumerate(steps, start=1):
        if step == "state":
            new_state = msgspec.structs.replace(reading, name="gpu-1") if reading else None
            changes += new_state != state
            state = new_state
            sends += reconcile_pass()
        elif step == "apply" and in_flight:
            operation = in_flight.pop(0).command.operation
            assert isinstance(operation, PatchObject)
            pod = strategic_merge_patch(pod, operation.patch)
        elif step == "view":
            view = as_view(pod, version)
            sends += reconcile_pass()
    assert sends <= changes
    for settle in range(3):  # everything lands and is seen: at most one more patch, then none
        for command in in_flight:
            operation = command.command.operation
            assert isinstance(operation, PatchObject)
            pod = strategic_merge_patch(pod, operation.patch)
        in_flight.clear()
        view = as_view(pod, len(steps) + 1 + settle)
        reconcile_pass()
    assert not in_flight
    names = ("Unknown",) if state is None else (state.base_state, *state.flags)
    assert slurm_types(pod) == {f"SlurmNodeState{name}" for name in names}


@given(pods=st.lists(pod_facts, max_size=4), states=st.lists(readable_states, max_size=2))
def test_rule_fail_closed_nothing_is_sent_to_slurm_for_an_unreadable_node(
    pods: list[PodFacts], states: list[SlurmNodeState]
) -> None:
    """Safety: an unreachable cluster, a node Slurm did not return and a node whose entry
    could not be read are never drained or undrained."""
    unreachable = reconcile_pods(pods, cluster(*states, reachable=False), {}, NOW)
    assert not unreachable.slurm_updates
    unreadable = [unknown_state("a", "gpu-1", NOW)]
    result = reconcile_pods(pods, cluster(*unreadable), {}, NOW)
    assert not result.slurm_updates


@given(pods=st.lists(pod_facts, max_size=4), states=st.lists(readable_states, max_size=2))
def test_rule_an_external_reason_is_never_changed_and_a_command_drain_never_undrained(
    pods: list[PodFacts], states: list[SlurmNodeState]
) -> None:
    by_name = {state.name: state for state in states}
    result = reconcile_pods(pods, cluster(*by_name.values()), {}, NOW)
    for pod, plan in result.slurm_updates:
        state = by_name[pod.name]
        assert state.reason not in ("bad DIMM",), plan
        assert "NotResponding" not in state.flags, plan
        if plan.action == "undrain":
            assert state.reason.split(":")[1].strip() in ("cordon", "delete"), plan
        # Nothing is ever sent for a pod whose node changes nothing.
        assert plan.action in ("drain", "undrain")


@given(
    # One pass sees each pod once.
    pods=st.lists(pod_facts, max_size=4, unique_by=lambda pod: pod.key),
    states=st.lists(readable_states, max_size=2),
    reachable=st.booleans(),
)
def test_rule_only_the_nodes_own_mark_is_ever_removed_and_only_once_it_is_uncordoned(
    pods: list[PodFacts], states: list[SlurmNodeState], reachable: bool
) -> None:
    """Safety of the uncordon: a mark a person set is never removed, nor one whose node is
    still cordoned or missing from the view."""
    result = reconcile_pods(pods, cluster(*states, reachable=reachable), {}, NOW)
    by_key = {pod.key: pod for pod in pods}
    for pod_command in result.pod_commands:
        if pod_command.kind != "pod-uncordon":
            continue
        target = pod_command.command.target
        removed = [p for p in by_key.values() if p.name == target.name]
        assert removed and all(
            p.pod_cordoned and p.pod_cordon_from_node and p.node_known and not p.node_unschedulable
            for p in removed
        )


WAIT = ReconcileOptions().registration_wait


def test_rule_no_not_registered_condition_before_a_poll_after_the_pod_started() -> None:
    """Minimal writes: slurmd of a pod not yet past Pending, or started less than a poll
    interval before the last poll began, may still register -- its absence is not written
    (one patch when it registers)."""
    for starting in (
        facts(running_seen_at=None),
        facts(running_seen_at=NOW + 1.0),
        facts(running_seen_at=NOW - WAIT + 0.5),
    ):
        assert not reconcile_pods([starting], cluster(), {}, NOW).pod_commands
    started = facts(running_seen_at=NOW - WAIT)
    (command,) = reconcile_pods([started], cluster(), {}, NOW).pod_commands
    (entry,) = written(command)
    assert entry["reason"] == "NodeNotRegistered"


def test_rule_a_pod_whose_slurmd_registers_within_a_poll_gets_one_condition_patch() -> None:
    """Minimal writes, once per real Slurm state change: the pod is seen running a moment
    before a poll that misses its slurmd (it starts a moment after the pod), which registers
    by the next poll. The pod gets one patch (Idle), not NodeNotRegistered then Idle."""
    pod = facts(running_seen_at=NOW - 0.5)
    sent: dict[tuple[str, str], SentRecord] = {}
    patches: list[PodCommand] = []
    for polled_at, states in ((NOW, ()), (NOW + WAIT, (node(),))):
        snapshot = {"a": ClusterSnapshot("a", True, True, {s.name: s for s in states}, polled_at)}
        result = reconcile_pods([pod], snapshot, sent, polled_at, options=OPTIONS)
        sent.update(result.sent)
        patches += result.pod_commands
        for command in result.pod_commands:
            pod = dataclasses.replace(pod, conditions=tuple(written(command)))
    assert [entry["type"] for command in patches for entry in written(command)] == [
        "SlurmNodeStateIdle"
    ]


def test_rule_a_starting_pod_gets_no_condition_from_an_earlier_slurmd_that_is_gone() -> None:
    """A pod recreated on the node of one deleted by a scale-in finds the old slurmd's
    DOWN+DRAIN+NOT_RESPONDING: not its own state, so nothing is written until a poll after the
    pod started (one patch, its own state, instead of the old one first)."""
    gone = node(base="Down", flags=("Drain", "NotResponding"), reason="nodeflow: delete")
    for starting in (facts(running_seen_at=None), facts(running_seen_at=NOW + 1.0)):
        assert not reconcile_pods([starting], cluster(gone), {}, NOW).pod_commands
    started = facts(running_seen_at=NOW - WAIT)
    (command,) = reconcile_pods([started], cluster(gone), {}, NOW).pod_commands
    kinds = {entry["type"] for entry in written(command)}
    assert "SlurmNodeStateDown" in kinds and "SlurmNodeStateNotResponding" in kinds


def test_rule_an_old_slurmds_not_responding_still_unconfirmed_writes_nothing_either() -> None:
    """The NOT_RESPONDING of a slurmd that went away a moment ago is not reported until it is
    confirmed (nodestate.settle_not_responding): its node reads DOWN+DRAIN. A pod recreated
    on it before then still waits for its own slurmd, like one whose NOT_RESPONDING shows."""
    reported = node(base="Down", flags=("Drain",), reason="nodeflow: delete")
    read_silent = ClusterSnapshot(
        name="a",
        polled=True,
        reachable=True,
        states={reported.name: reported},
        poll_started_at=NOW,
        not_responding={reported.name},
    )
    for starting in (facts(running_seen_at=None), facts(running_seen_at=NOW + 1.0)):
        assert not reconcile_pods([starting], {"a": read_silent}, {}, NOW).pod_commands
    # Without the unconfirmed flag the node's DOWN+DRAIN is its pod's state.
    assert reconcile_pods([facts(running_seen_at=None)], cluster(reported), {}, NOW).pod_commands


def test_rule_a_starting_pod_still_gets_its_registered_state_and_an_unreachable_cluster() -> None:
    starting = facts(running_seen_at=None)
    (registered,) = reconcile_pods([starting], cluster(node()), {}, NOW).pod_commands
    (entry,) = written(registered)
    assert entry["type"] == "SlurmNodeStateIdle"
    (unreachable,) = reconcile_pods([starting], cluster(reachable=False), {}, NOW).pod_commands
    (entry,) = written(unreachable)
    assert entry["reason"] == "ClusterUnreachable"


@given(
    pods=st.lists(pod_facts, max_size=4),
    seen=st.lists(st.one_of(st.none(), st.floats(NOW - 100, NOW + 100)), min_size=4, max_size=4),
)
def test_rule_fail_closed_a_pod_whose_slurmd_may_still_register_is_never_marked_absent(
    pods: list[PodFacts], seen: list[float | None]
) -> None:
    """Safety: NodeNotRegistered starts the absence grace after which nodeset-controller may
    delete the pod; it is never written for a pod whose slurmd had no poll interval to
    register in."""
    by_name = {p.name: p for p in pods}  # one pod per name: commands are told apart by it
    pods = [
        dataclasses.replace(p, running_seen_at=s)
        for p, s in zip(by_name.values(), seen, strict=False)
    ]
    result = reconcile_pods(pods, cluster(), {}, NOW)
    starting = {p.name for p in pods if p.running_seen_at is None or p.running_seen_at + WAIT > NOW}
    for command in result.pod_commands:
        operation = command.command.operation
        assert isinstance(operation, PatchObject)
        reasons = {e.get("reason") for e in operation.patch.get("status", {}).get("conditions", [])}
        if command.command.target.name in starting:
            assert "NodeNotRegistered" not in reasons
