"""Rule 4a: running jobs protected from eviction (Slinky's workloadDisruptionProtection).

A NodeSet pod whose Slurm node runs a job -- or whose Slurm state is unknown or stale (fail
closed) -- carries `nodeset.slinky.slurm.net/pod-protect: "true"`; the NodeSet's own
PodDisruptionBudget (an integer minAvailable never met, over that label) makes the eviction
API refuse it. Idle and drained nodes lose the label; `spec.workloadDisruptionProtection:
false` removes the labels and the budget. The commands are ones k8s-watcher lets
nodeset-controller send.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from k8s_watcher.policy import Allowed, Refused, authorize
from nodeflow_contracts.k8s import CreateObject, DeleteObject, PatchObject
from nodeflow_contracts.pod_protocol import NODESET_LABEL, POD_PROTECT_LABEL
from nodeflow_contracts.slurm import SlurmNodeState
from nodeset_controller.commands import to_outgoing
from nodeset_controller.config import NodeSetControllerConfig
from nodeset_controller.planner import ClusterView, CreatePod, Plan, WriteSlice, plan
from nodeset_controller.protection import (
    CreateDisruptionBudget,
    DeleteDisruptionBudget,
    ProtectPod,
    budget_name,
    budget_object,
)
from nodeset_controller.spec import parse
from tests.unit.nodeset_controller.builders import (
    CLUSTER,
    DEFAULTS,
    NS,
    T0,
    cluster_status,
    node,
    nodeset,
    pod,
    slurm,
)
from tests.unit.nodeset_controller.memory_cluster import MemoryCluster
from tests.unit.nodeset_controller.test_planner import KEY, REV, full, view
from tests.unit.plan_checks import expect_actions, expect_no_actions

NAMES = [f"gpu-001-{i + 1:03d}" for i in range(6)]


def labelled(raw: dict[str, Any], value: str = "true") -> dict[str, Any]:
    raw["metadata"]["labels"][POD_PROTECT_LABEL] = value
    return raw


def our_budget(obj: dict[str, Any], **spec: Any) -> dict[str, Any]:
    """The NodeSet's budget as the API server would hold it (a uid and resourceVersion)."""
    budget = budget_object(parse(obj, DEFAULTS))
    budget["metadata"].update(uid="uid-budget", resourceVersion="77")
    budget["spec"].update(spec)
    return budget


def planned(
    obj: dict[str, Any],
    pods: list[dict[str, Any]],
    states: dict[str, SlurmNodeState],
    *,
    budget: dict[str, Any] | None = None,
    held_poll_at: float | None = None,
    **kwargs: Any,
) -> Plan:
    node_map, _ = full(len(pods))
    base: ClusterView = view(obj, node_map, pods, states, **kwargs)
    return plan(
        dataclasses.replace(base, disruption_budget=budget, slurm_held_poll_at=held_poll_at)
    )


def protected(result: Plan, protect: bool) -> set[str]:
    return {
        a.pod.name for a in result.actions if isinstance(a, ProtectPod) and a.protect is protect
    }


def test_rule_busy_pods_get_the_protect_label_and_idle_or_drained_do_not() -> None:
    obj = nodeset(replicas=4)
    _, pods = full(4)
    states = {
        NAMES[0]: slurm(NAMES[0], busy=True),
        NAMES[1]: slurm(NAMES[1]),
        NAMES[2]: slurm(NAMES[2], drain=True),
        # Draining: DRAIN set while the job still runs -- still protected.
        NAMES[3]: slurm(NAMES[3], busy=True, drain=True),
    }
    result = planned(obj, pods, states, budget=our_budget(obj))
    actions = expect_actions(result.actions, ProtectPod, count=2, protect=True)
    assert {a.pod.name for a in actions} == {NAMES[0], NAMES[3]}
    assert "Allocated" in actions[0].why
    expect_no_actions(result.actions, ProtectPod, protect=False, while_it_has=ProtectPod)
    expect_no_actions(result.actions, CreateDisruptionBudget, while_it_has=ProtectPod)


def test_rule_the_label_follows_slurm_busy_to_idle_and_drained() -> None:
    """The job ended (idle) or the node drained empty: the label comes off; a labelled pod
    still busy keeps it (no action)."""
    obj = nodeset(replicas=3)
    _, pods = full(3)
    pods = [labelled(p) for p in pods]
    states = {
        NAMES[0]: slurm(NAMES[0]),
        NAMES[1]: slurm(NAMES[1], drain=True),
        NAMES[2]: slurm(NAMES[2], busy=True),
    }
    result = planned(obj, pods, states, budget=our_budget(obj))
    assert protected(result, False) == {NAMES[0], NAMES[1]}
    assert protected(result, True) == set()


def test_rule_unknown_or_stale_slurm_state_keeps_protection() -> None:
    """Fail closed: a node Slurm could not read, one missing from a view that may not hold
    the last poll's states yet, and every node of a cluster whose view is stale may run a
    job: protected, and labelled ones stay so."""
    obj = nodeset(replicas=3)
    _, pods = full(3)
    states = {NAMES[0]: slurm(NAMES[0], known=False)}  # NAMES[1]: no entry at all
    states[NAMES[2]] = slurm(NAMES[2])
    # The poll's status arrived before its node states: NAMES[1] may be registered and busy.
    lagging = planned(obj, pods, states, budget=our_budget(obj), slurm_nodes_revision=0)
    assert protected(lagging, True) == {NAMES[0], NAMES[1]}
    # The last poll failed: its listing says nothing of who registered since.
    unreachable = planned(
        obj, pods, states, budget=our_budget(obj), status=cluster_status(reachable=False)
    )
    assert protected(unreachable, True) == {NAMES[0], NAMES[1]}

    # The syncer stopped: its last poll is ten minutes old; the idle node is protected too.
    stale = planned(
        obj,
        [labelled(p) for p in full(3)[1][:2]] + [full(3)[1][2]],
        states,
        budget=our_budget(obj),
        now=T0 + 600,
        status=cluster_status(last_success_at=T0),
    )
    assert protected(stale, True) == {NAMES[2]}
    assert protected(stale, False) == set()
    # No status at all from slurm-syncer: the same.
    unknown = planned(obj, full(3)[1], {}, budget=our_budget(obj), status=None)
    assert protected(unknown, True) == set(NAMES[:3])


def test_rule_an_unprotected_pod_is_protected_again_when_slurm_goes_stale_without_a_write() -> None:
    """An idle pod's label is off on a fresh view; the plan wakes up when that view goes
    stale (no poll, no write to react to), so the label goes back on then."""
    obj = nodeset(replicas=1)
    _, pods = full(1)
    result = planned(obj, pods, {NAMES[0]: slurm(NAMES[0])}, budget=our_budget(obj))
    status = cluster_status(last_success_at=T0)
    assert result.wake_at is not None
    assert result.wake_at <= T0 + 4 * status.poll_interval_seconds


def test_rule_a_pod_whose_node_is_not_registered_in_a_fresh_poll_is_not_labelled() -> None:
    """A node missing from a fresh, successful poll the plan holds whole is not registered:
    Slurm runs no job there, as on an idle node. A new pod is not labelled then (a label
    only to be taken off once it registers idle); a labelled pod keeps its label until Slurm
    reads its node (a node that vanished while running a job is not taken at its word), and
    the plan wakes when the view would go stale, to protect it then."""
    obj = nodeset(replicas=2)
    _, pods = full(2)
    pods[1] = labelled(pods[1])
    result = planned(obj, pods, {}, budget=our_budget(obj))
    expect_no_actions(result.actions, ProtectPod, while_it_has=WriteSlice)
    status = cluster_status(last_success_at=T0)
    assert result.wake_at is not None
    assert result.wake_at <= T0 + 4 * status.poll_interval_seconds
    # Once it registers idle, the labelled one loses its label; the other needs no write.
    idle = planned(obj, pods, {name: slurm(name) for name in NAMES[:2]}, budget=our_budget(obj))
    assert protected(idle, False) == {NAMES[1]}
    assert protected(idle, True) == set()
    # Registered with a job: protected.
    busy = planned(obj, pods, {NAMES[0]: slurm(NAMES[0], busy=True)}, budget=our_budget(obj))
    assert protected(busy, True) == {NAMES[0]}


def test_rule_while_a_polls_states_arrive_the_poll_held_before_it_proves_absence() -> None:
    """A poll's status may come before its node states: the view then still holds the poll
    before it whole, and a node missing from the view was missing from that one -- evidence
    while it is fresh (the plan wakes when it goes stale). Without such a poll, or once it is
    stale, a missing node may be registered and busy: protected."""
    obj = nodeset(replicas=1)
    _, pods = full(1)
    status = cluster_status(last_success_at=T0, nodes_revision=9)
    limit = 4 * status.poll_interval_seconds
    held = planned(
        obj,
        pods,
        {},
        budget=our_budget(obj),
        status=status,
        slurm_nodes_revision=8,
        held_poll_at=T0 - 5,
    )
    expect_no_actions(held.actions, ProtectPod, while_it_has=WriteSlice)
    assert held.wake_at == T0 - 5 + limit
    for held_poll_at in (None, T0 - 5 - limit - 1):
        lagging = planned(
            obj,
            pods,
            {},
            budget=our_budget(obj),
            status=status,
            slurm_nodes_revision=8,
            held_poll_at=held_poll_at,
        )
        assert protected(lagging, True) == {NAMES[0]}, held_poll_at


def test_rule_the_service_proves_absence_by_the_poll_its_view_held_before_the_last() -> None:
    """At the service: the view of slurm_nodes held a poll whole (its status's sequence
    applied); the next poll's status arrives before its node states. A new pod whose node is
    in neither is not labelled, on the earlier poll's word. A controller that never saw its
    view hold a poll whole labels it (fail closed)."""
    loop = asyncio.new_event_loop()
    try:
        for saw_a_poll_whole in (True, False):
            cluster = MemoryCluster(NodeSetControllerConfig(nats_url=("nats://unused",)))
            cluster.slurm.put(
                f"{CLUSTER}.login-01",
                SlurmNodeState(cluster=CLUSTER, name="login-01", known=True, base_state="Idle"),
            )
            held = cluster.slurm.last_revision
            if saw_a_poll_whole:
                cluster.clusters.put(
                    CLUSTER, cluster_status(last_success_at=T0 - 5, nodes_revision=held)
                )
            cluster.clusters.put(
                CLUSTER, cluster_status(last_success_at=T0, nodes_revision=held + 1)
            )
            cluster.nodes.put("_.n0", node("n0", "10.0.1.1", claim=KEY))
            raw = pod(NAMES[0], "n0", revision=REV)
            raw["metadata"]["uid"] = cluster.next_uid()
            cluster.pods.put(f"{NS}.{NAMES[0]}", raw)
            cluster.nodesets.put(KEY, nodeset(replicas=1))
            commands = loop.run_until_complete(cluster.round(KEY, T0 + 1))
            labels = [
                c
                for c in commands
                if isinstance(c.operation, PatchObject)
                and POD_PROTECT_LABEL in c.operation.patch.get("metadata", {}).get("labels", {})
            ]
            assert bool(labels) is not saw_a_poll_whole, commands
    finally:
        loop.close()


def test_rule_a_poll_that_listed_no_node_proves_absence_before_any_state_is_written() -> None:
    """An empty Slurm cluster's first polls write no node state, so their status names no
    `slurm_nodes` sequence to hold; a poll that listed no node at all still proves every
    node not registered (the first scale-out's pods cost no label). A status that does not
    say what it listed proves nothing: the pod is protected."""
    obj = nodeset(replicas=1)
    _, pods = full(1)
    empty = msgspec.structs.replace(cluster_status(nodes_revision=0), nodes_listed=0)
    result = planned(obj, pods, {}, budget=our_budget(obj), status=empty)
    expect_no_actions(result.actions, ProtectPod, while_it_has=WriteSlice)
    unsaid = cluster_status(nodes_revision=0)
    assert protected(planned(obj, pods, {}, budget=our_budget(obj), status=unsaid), True) == {
        NAMES[0]
    }
    failed = msgspec.structs.replace(empty, reachable=False)
    assert protected(planned(obj, pods, {}, budget=our_budget(obj), status=failed), True) == {
        NAMES[0]
    }


def _apply_labels(result: Plan, pods: list[dict[str, Any]]) -> int:
    """Apply the plan's label changes to `pods` (as the API server would); how many."""
    writes = 0
    for action in result.actions:
        if isinstance(action, ProtectPod):
            (target,) = [p for p in pods if p["metadata"]["name"] == action.pod.name]
            labels = target["metadata"]["labels"]
            if action.protect:
                labels[POD_PROTECT_LABEL] = "true"
            else:
                labels.pop(POD_PROTECT_LABEL, None)
            writes += 1
    return writes


def test_rule_scale_up_costs_no_label_write_for_a_pod_that_registers_idle() -> None:
    """The writes a scale-up's pod costs in protect labels: none while it comes up, is seen
    before its slurmd registers (fresh polls without it) and registers idle. Protection
    cost two (label while unregistered, unlabel once idle) before."""
    obj = nodeset(replicas=4)
    _, pods = full(4)
    writes = 0
    for states in (
        {},  # the pods are created; no slurmd has registered
        {NAMES[0]: slurm(NAMES[0]), NAMES[1]: slurm(NAMES[1])},  # two register idle
        {name: slurm(name) for name in NAMES[:4]},  # all of them
    ):
        writes += _apply_labels(planned(obj, pods, states, budget=our_budget(obj)), pods)
    assert writes == 0


def test_rule_slurm_proof_of_no_job_and_unbound_pods_are_not_protected() -> None:
    """DOWN (slurmctld ended or requeued its jobs) and a pod no kubelet has run no job."""
    obj = nodeset(replicas=2)
    _, pods = full(2)
    pods[1]["spec"]["nodeName"] = None
    pods[1]["status"]["phase"] = "Pending"
    pods = [labelled(p) for p in pods]
    states = {NAMES[0]: slurm(NAMES[0], down=True)}
    result = planned(obj, pods, states, budget=our_budget(obj))
    assert protected(result, False) == {NAMES[0], NAMES[1]}


def test_rule_one_budget_per_nodeset_owned_by_it_with_min_available_never_met() -> None:
    obj = nodeset(replicas=1)
    _, pods = full(1)
    result = planned(obj, pods, {NAMES[0]: slurm(NAMES[0], busy=True)})
    (create,) = expect_actions(result.actions, CreateDisruptionBudget, count=1)
    assert create.name == budget_name("gpu") == "slurm-workers-pdb-gpu"
    spec = parse(obj, DEFAULTS)
    outgoing = to_outgoing(spec, create, T0)
    operation = outgoing.command.operation
    assert isinstance(operation, CreateObject)
    made = operation.object
    assert made["kind"] == "PodDisruptionBudget" and made["apiVersion"] == "policy/v1"
    assert made["metadata"]["namespace"] == "slurm"
    assert made["spec"] == {
        "minAvailable": 2147483647,
        "selector": {"matchLabels": {NODESET_LABEL: "gpu", POD_PROTECT_LABEL: "true"}},
    }
    (owner,) = made["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["uid"], owner["controller"]) == ("NodeSet", spec.uid, True)
    subject = f"cmd.k8s.v1.nodeset-controller.{outgoing.command.op}"
    assert authorize(outgoing.command, subject) == Allowed()


def test_rule_the_label_patch_touches_only_the_label_and_is_allowed() -> None:
    obj = nodeset(replicas=1)
    _, pods = full(1)
    result = planned(obj, pods, {NAMES[0]: slurm(NAMES[0], busy=True)})
    (action,) = expect_actions(result.actions, ProtectPod, count=1, protect=True)
    outgoing = to_outgoing(parse(obj, DEFAULTS), action, T0)
    operation = outgoing.command.operation
    assert isinstance(operation, PatchObject) and operation.subresource == ""
    assert operation.patch == {"metadata": {"labels": {POD_PROTECT_LABEL: "true"}}}
    assert outgoing.command.target.uid == f"uid-{NAMES[0]}"
    # Its own slot: a SlurmDelete or delete of the pod is not held back by it.
    assert outgoing.slot != f"Pod/slurm/{NAMES[0]}" and not outgoing.windowed
    verdict = authorize(outgoing.command, f"cmd.k8s.v1.nodeset-controller.{outgoing.command.op}")
    assert verdict == Allowed(required_label=NODESET_LABEL)


def test_rule_protection_off_removes_labels_and_deletes_the_budget() -> None:
    obj = nodeset(replicas=2, extra={"workloadDisruptionProtection": False})
    _, pods = full(2)
    pods = [labelled(pods[0]), pods[1]]
    states = {name: slurm(name, busy=True) for name in NAMES[:2]}
    result = planned(obj, pods, states, budget=our_budget(obj))
    assert protected(result, False) == {NAMES[0]}
    assert protected(result, True) == set()
    (delete,) = expect_actions(result.actions, DeleteDisruptionBudget, count=1)
    assert (delete.name, delete.uid, delete.resource_version) == (
        "slurm-workers-pdb-gpu",
        "uid-budget",
        "77",
    )
    command = to_outgoing(parse(obj, DEFAULTS), delete, T0).command
    assert isinstance(command.operation, DeleteObject)
    assert (command.target.uid, command.target.resource_version) == ("uid-budget", "77")
    assert authorize(command, "cmd.k8s.v1.nodeset-controller.delete") == Allowed(
        required_label=NODESET_LABEL
    )
    # Off and no budget: nothing is created.
    gone = planned(obj, pods[1:], states)
    expect_no_actions(gone.actions, CreateDisruptionBudget, while_it_has=CreatePod)


def test_rule_a_budget_not_ours_is_never_touched_and_a_changed_one_is_made_again() -> None:
    obj = nodeset(replicas=1)
    _, pods = full(1)
    states = {NAMES[0]: slurm(NAMES[0], busy=True)}
    foreign = our_budget(obj)
    foreign["metadata"]["ownerReferences"] = []
    result = planned(obj, pods, states, budget=foreign)
    expect_no_actions(result.actions, CreateDisruptionBudget, while_it_has=ProtectPod)
    expect_no_actions(result.actions, DeleteDisruptionBudget, while_it_has=ProtectPod)
    loosened = planned(obj, pods, states, budget=our_budget(obj, minAvailable=1))
    expect_actions(loosened.actions, DeleteDisruptionBudget, count=1, uid="uid-budget")


def test_rule_terminating_pods_are_left_alone() -> None:
    obj = nodeset(replicas=1)
    terminating = labelled(pod(NAMES[0], "n0", terminating=True))
    result = planned(obj, [terminating], {NAMES[0]: slurm(NAMES[0])}, budget=our_budget(obj))
    expect_no_actions(result.actions, ProtectPod, while_it_has=WriteSlice)


# --- property: a pod that may run a job is never left unprotected ---------------------------

SLURM_STATES = st.sampled_from(
    ["idle", "busy", "drained", "draining", "unknown", "missing", "down", "mixed-completing"]
)


def _state(name: str, kind: str) -> SlurmNodeState | None:
    if kind == "missing":
        return None
    if kind == "mixed-completing":
        return SlurmNodeState(
            cluster="a",
            name=name,
            known=True,
            base_state="Mixed",
            flags=("Completing",),
            busy=True,
        )
    return slurm(
        name,
        busy=kind in ("busy", "draining"),
        drain=kind in ("drained", "draining"),
        known=kind != "unknown",
        down=kind == "down",
    )


@settings(max_examples=150, deadline=None)
@given(
    rounds=st.lists(
        st.tuples(
            st.lists(SLURM_STATES, min_size=4, max_size=4),
            st.booleans(),
            st.sampled_from(["last", "earlier", "stale", "none"]),
            st.booleans(),
        ),
        min_size=1,
        max_size=6,
    )
)
def test_property_a_pod_that_may_run_a_job_is_protected_after_every_plan(
    rounds: list[tuple[list[str], bool, str, bool]],
) -> None:
    """Over random sequences of Slurm states (and freshness, whether the view holds the last
    poll's node states whole or an earlier fresh or stale poll's or none, and the option turned
    on or off), with each plan's label changes and
    budget change applied: while the option is on, every pod whose node Slurm reports busy,
    or whose state is unknown or stale, or missing from a view that is not a fresh poll held
    whole, carries the label and the budget exists; a node missing from a fresh poll held
    whole (not registered: no job) is labelled only if it was before. While the option is
    off, no pod carries the label and no budget exists."""
    _, pods = full(4)
    budget: dict[str, Any] | None = None
    for kinds, fresh, holds_poll, enabled in rounds:
        obj = nodeset(replicas=4, extra={"workloadDisruptionProtection": enabled})
        states = {
            name: state
            for name, kind in zip(NAMES, kinds, strict=False)
            if (state := _state(name, kind)) is not None
        }
        before = {p["metadata"]["name"]: POD_PROTECT_LABEL in p["metadata"]["labels"] for p in pods}
        now = T0 if fresh else T0 + 600
        result = planned(
            obj,
            pods,
            states,
            budget=budget,
            now=now,
            status=cluster_status(last_success_at=T0),
            slurm_nodes_revision=None if holds_poll == "last" else 0,
            held_poll_at={"earlier": T0 - 5, "stale": T0 - 60}.get(holds_poll),
        )
        _apply_labels(result, pods)
        for action in result.actions:
            if isinstance(action, CreateDisruptionBudget):
                budget = our_budget(obj)
            elif isinstance(action, DeleteDisruptionBudget):
                budget = None
        absence_read = fresh and holds_poll in ("last", "earlier")
        for name, kind, raw in zip(NAMES, kinds, pods, strict=False):
            has = raw["metadata"]["labels"].get(POD_PROTECT_LABEL) == "true"
            not_registered = kind == "missing" and absence_read
            may_run_a_job = not fresh or (
                kind not in ("idle", "drained", "down") and not not_registered
            )
            # Slurm's word of no job from a view that may not hold a recent poll whole lifts
            # no label (and puts none on).
            unproven_no_job = fresh and kind in ("idle", "drained", "down") and not absence_read
            if not enabled:
                assert not has, (name, kind)
            elif not_registered or unproven_no_job:
                assert has == before[name], (name, kind, fresh, holds_poll)
            else:
                assert has == may_run_a_job, (name, kind, fresh, holds_poll)
        assert (budget is not None) == enabled


def test_rule_nodeset_controller_may_touch_only_the_protect_label_and_its_budgets() -> None:
    """Least privilege: another label of a pod, or a budget not labelled with a NodeSet, is
    refused (k8s-watcher's policy), so the protection grants open nothing else."""
    obj = nodeset(replicas=1)
    spec = parse(obj, DEFAULTS)
    _, pods = full(1)
    result = planned(obj, pods, {NAMES[0]: slurm(NAMES[0], busy=True)})
    (protect,) = expect_actions(result.actions, ProtectPod, count=1)
    (create,) = expect_actions(result.actions, CreateDisruptionBudget, count=1)
    label = to_outgoing(spec, protect, T0).command
    other_label = msgspec.structs.replace(
        label,
        operation=PatchObject(patch_type="merge", patch={"metadata": {"labels": {"app": "x"}}}),
    )
    assert isinstance(authorize(other_label, "cmd.k8s.v1.nodeset-controller.patch"), Refused)
    made = to_outgoing(spec, create, T0).command
    assert isinstance(made.operation, CreateObject)
    unlabelled = dict(made.operation.object)
    unlabelled["metadata"] = {**unlabelled["metadata"], "labels": {}}
    foreign = msgspec.structs.replace(made, operation=CreateObject(object=unlabelled))
    assert isinstance(authorize(foreign, "cmd.k8s.v1.nodeset-controller.create"), Refused)
