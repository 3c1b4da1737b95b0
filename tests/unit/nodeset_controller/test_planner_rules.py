"""Rules of the planner that mutation testing (`make mutate`, issue 37) found no test held.

Each test names the rule it holds; each was seen failing with its rule broken (the mutant
named in docs/testing.md's figures).
"""

from __future__ import annotations

from dataclasses import fields, replace
from datetime import UTC, datetime
from fractions import Fraction
from typing import Any

import msgspec

from nodeflow_contracts.pod_protocol import (
    MISSCHEDULED_DELETE,
    POD_WAIT_CONDITION,
    ROLLING_DELETE,
    SCALING_DELETE,
)
from nodeflow_kube.fields import rfc3339
from nodeset_controller.deletion import AWAITING_SLURM_READ
from nodeset_controller.planner import (
    ClusterView,
    CreatePod,
    DeletePod,
    Notice,
    PlanMemo,
    PodChangeSent,
    ScheduleDelete,
    SetPodWait,
    WriteSlice,
    plan,
    slurm_trust,
)
from nodeset_controller.protection import CreateDisruptionBudget, budget_object
from nodeset_controller.spec import parse
from tests.unit.nodeset_controller.builders import (
    DEFAULTS,
    T0,
    TEMPLATE_SPEC,
    cluster_status,
    node,
    nodeset,
    pod,
    slurm,
)
from tests.unit.nodeset_controller.test_planner import KEY, REV, full, of, view
from tests.unit.plan_checks import expect_actions, expect_no_actions

GRACE = 300.0


def test_rule_a_stale_or_missing_cluster_status_is_neither_fresh_nor_reachable() -> None:
    """Fail closed: what slurm-syncer last said of a cluster whose view went stale (or that it
    never reported) is no evidence at all, its reachability included: a node absent from it
    is not taken for a node missing from Slurm."""
    reachable = cluster_status(last_success_at=T0, reachable=True)
    fresh = slurm_trust(reachable, T0 + 1, 0.0, GRACE, reachable.nodes_revision)
    assert (fresh.fresh, fresh.reachable) == (True, True)
    stale = slurm_trust(reachable, T0 + 3600, 0.0, GRACE, reachable.nodes_revision)
    missing = slurm_trust(None, T0, 0.0, GRACE, 1)
    for trust in (stale, missing):
        assert (trust.fresh, trust.reachable, trust.stale_at) == (False, False, None)
        assert (trust.read_at, trust.absence_read_until) == (None, None)


def test_rule_without_the_views_nodes_revision_the_poll_time_proves_nothing() -> None:
    """A caller that does not say which `slurm_nodes` revision its view has applied gets no
    evidence of when the states were read (the default is 0, nothing applied), though the
    status is fresh: a pod's deletion never waits on a read it cannot prove."""
    status = cluster_status(last_success_at=T0, nodes_revision=1)
    unsaid = slurm_trust(status, T0 + 1, 0.0, GRACE)
    assert unsaid.fresh
    assert (unsaid.read_at, unsaid.absence_read_until) == (None, None)
    # The same status read by a view that applied the poll's revision: evidence.
    said = slurm_trust(status, T0 + 1, 0.0, GRACE, 1)
    assert said.read_at == T0
    assert said.absence_read_until is not None


def test_rule_a_configured_slurm_max_age_of_one_second_sets_when_the_states_go_stale() -> None:
    """slurmStateMaxAge of any positive length replaces the default (4 poll intervals) for
    when the states go stale, as it does for whether they are fresh: a plan with a pod
    waiting for its deletion wakes then, not 40 s later."""
    status = cluster_status(last_success_at=T0, poll_interval=10.0)
    trust = slurm_trust(status, T0 + 0.5, 1.0, GRACE, status.nodes_revision)
    assert trust.fresh
    assert trust.stale_at == T0 + 1.0
    default = slurm_trust(status, T0 + 0.5, 0.0, GRACE, status.nodes_revision)
    assert default.stale_at == T0 + 40.0

    node_map, pods = full(3, delete_reason="ScalingDeleteScheduled")
    busy = {p["metadata"]["name"]: slurm(p["metadata"]["name"], busy=True) for p in pods}
    base = view(nodeset(replicas=0), node_map, pods, busy, now=T0 + 0.5, status=status)
    waiting = plan(replace(base, slurm_max_age=1.0))
    assert of(waiting, DeletePod) == []
    assert {w.pod for w in waiting.scale_down_waits} == {p["metadata"]["name"] for p in pods}
    assert waiting.wake_at == T0 + 1.0


def test_rule_the_absence_evidence_lasts_as_long_as_the_states_are_fresh_edge_included() -> None:
    """A poll held whole is evidence that a node missing from the view is missing from Slurm
    for as long as the states are fresh, its last instant included (freshness itself counts
    `now - last_success_at <= limit`): the two never disagree at the edge."""
    status = cluster_status(last_success_at=T0, poll_interval=10.0, nodes_revision=1)
    edge = slurm_trust(status, T0 + 40.0, 0.0, GRACE, 1)
    assert edge.fresh
    assert edge.absence_read_until == T0 + 40.0
    past = slurm_trust(status, T0 + 40.5, 0.0, GRACE, 1)
    assert (past.fresh, past.absence_read_until) == (False, None)


def test_rule_a_view_that_does_not_say_its_nodes_revision_proves_no_read_after_a_mark() -> None:
    """A ClusterView built without `slurm_nodes_revision` has applied nothing as far as the
    plan knows: a pod marked before the last poll, drained and idle in the view, waits for
    a read it can prove instead of being deleted on a state that may predate the poll."""
    node_map, pods = full(2)
    pods[0] = pod("gpu-001-001", "n0", delete_reason=SCALING_DELETE)
    states = {p["metadata"]["name"]: slurm(p["metadata"]["name"]) for p in pods}
    states["gpu-001-001"] = slurm("gpu-001-001", drain=True)
    said = view(nodeset(replicas=1), node_map, pods, states, slurm_nodes_revision=1)
    expect_actions(plan(said).actions, DeletePod, pod__name="gpu-001-001")
    unsaid = ClusterView(
        **{f.name: getattr(said, f.name) for f in fields(said) if f.name != "slurm_nodes_revision"}
    )
    waiting = plan(unsaid)
    expect_no_actions(waiting.actions, DeletePod, while_it_has=SetPodWait)
    assert [(w.pod, w.cause) for w in waiting.scale_down_waits] == [
        ("gpu-001-001", AWAITING_SLURM_READ)
    ]


def _outdated_on_a_tight_node(foreign_memory: int) -> ClusterView:
    """One Ready pod of an old revision on n0 (cpu 4, memory 4, 110 pods), itself requesting
    cpu 2; the template asks cpu 2 and memory 2; other pods on n0 request `foreign_memory`
    of memory."""
    template = {
        "containers": [
            {
                "name": "slurmd",
                "image": "slurmd:25.05",
                "resources": {"requests": {"cpu": "2", "memory": "2"}},
            }
        ]
    }
    tight = {
        "n0": node(
            "n0", "10.0.1.1", claim=KEY, allocatable={"cpu": "4", "memory": "4", "pods": "110"}
        )
    }
    outdated = pod("gpu-001-001", "n0", revision="old")
    base = view(
        nodeset(replicas=1, template_spec=template),
        tight,
        [outdated],
        {"gpu-001-001": slurm("gpu-001-001")},
    )
    requested: dict[str, Any] = {"n0": {"cpu": Fraction(2), "memory": Fraction(foreign_memory)}}
    return replace(base, requested=requested)


def test_rule_a_replacement_fits_where_its_own_pod_gives_back_only_what_it_requests() -> None:
    """Whether a node can take a pod's replacement counts what the node's other pods request
    and gives back exactly the pod's own requests: its cpu is freed; memory it never asked
    for is not (nothing is taken off a resource it does not request). So the replacement
    fits beside 2 of foreign memory (a rolling mark), and does not beside 3."""
    fits = plan(_outdated_on_a_tight_node(2))
    expect_actions(fits.actions, ScheduleDelete, reason=ROLLING_DELETE, pod__name="gpu-001-001")
    unfit = plan(_outdated_on_a_tight_node(3))
    expect_no_actions(unfit.actions, ScheduleDelete, while_it_has=SetPodWait)
    assert [(w.pod, w.cause) for w in unfit.rollout_waits] == [
        ("gpu-001-001", "ReplacementUnplaceable")
    ]


def test_rule_an_invalid_spec_is_announced_once_whatever_other_conditions_are_true() -> None:
    """The invalid-spec Notice goes out when the InvalidSpec condition's message changes:
    the message read back is that of the InvalidSpec condition that is True, not that of
    another True condition listed before it (which would announce it again every round)."""
    node_map, pods = full(2)
    first = plan(view(nodeset(replicas=0, max_unavailable="150%"), node_map, pods))
    expect_actions(first.actions, Notice, decision="invalid-spec")
    assert first.status is not None
    conditions = first.status["conditions"]
    true_before = {
        "type": "SlurmStateUnknown",
        "status": "True",
        "reason": "SlurmStateStale",
        "message": "another condition's words",
    }
    written = {**first.status, "conditions": [true_before, *conditions]}
    obj = nodeset(replicas=0, max_unavailable="150%", status=written)
    again = plan(view(obj, node_map, pods))
    expect_no_actions(
        again.actions, Notice, decision="invalid-spec", while_it_has=CreateDisruptionBudget
    )


def test_rule_the_invalid_spec_condition_takes_the_first_problems_reason() -> None:
    """With several problems, InvalidSpec's reason is the first one's (spec order: replicas
    before the update strategy), and so is its Notice's; the message lists them all."""
    node_map, pods = full(1)
    result = plan(view(nodeset(replicas=-1, max_unavailable="150%"), node_map, pods))
    assert result.status is not None
    (invalid,) = [c for c in result.status["conditions"] if c["type"] == "InvalidSpec"]
    assert (invalid["status"], invalid["reason"]) == ("True", "NegativeReplicas")
    assert "spec.replicas" in invalid["message"]
    assert "maxUnavailable" in invalid["message"]
    expect_actions(
        result.actions, Notice, count=1, decision="invalid-spec", reason="NegativeReplicas"
    )


def test_rule_name_collisions_are_listed_by_node_name() -> None:
    """NameCollision's message lists the collisions in node-name order (b before c), so the
    same collisions always read the same."""
    node_map = {
        "a": node("a", "10.1.3.4"),
        "b": node("b", "10.2.3.4"),
        "c": node("c", "10.3.3.4"),
    }
    result = plan(view(nodeset(replicas=3), node_map))
    assert result.status is not None
    (collision,) = [c for c in result.status["conditions"] if c["type"] == "NameCollision"]
    assert collision["message"] == (
        "node b would get pod name gpu-003-004, already used for a; "
        "node c would get pod name gpu-003-004, already used for a"
    )


def test_rule_observed_generation_is_zero_when_the_nodeset_has_no_generation() -> None:
    """observedGeneration copies metadata.generation, and is 0 (no generation observed) when
    the object carries none or one that is not an integer."""
    node_map, pods = full(1)
    for generation in (None, "7"):
        obj = nodeset(replicas=1)
        if generation is None:
            del obj["metadata"]["generation"]
        else:
            obj["metadata"]["generation"] = generation
        result = plan(view(obj, node_map, pods))
        assert result.wanted_status["observedGeneration"] == 0
    assert (
        plan(view(nodeset(replicas=1, generation=4), node_map, pods)).wanted_status[
            "observedGeneration"
        ]
        == 4
    )


def test_rule_the_memo_never_serves_a_pods_state_read_from_an_older_slurm_state() -> None:
    """Fail closed through the memo: a pod whose object is unchanged but whose Slurm node went
    from drained and idle to running a job (still draining) is not deleted on the state the
    memo kept from the round before."""
    memo = PlanMemo()
    node_map, pods = full(2)
    pods[0] = pod("gpu-001-001", "n0", delete_reason=SCALING_DELETE)
    states = {p["metadata"]["name"]: slurm(p["metadata"]["name"]) for p in pods}
    states["gpu-001-001"] = slurm("gpu-001-001", drain=True)
    idle = replace(view(nodeset(replicas=1), node_map, pods, states), memo=memo)
    expect_actions(plan(idle).actions, DeletePod, pod__name="gpu-001-001")
    states["gpu-001-001"] = slurm("gpu-001-001", drain=True, busy=True)
    busy = replace(view(nodeset(replicas=1), node_map, pods, states), memo=memo)
    running = plan(busy)
    expect_no_actions(running.actions, DeletePod, while_it_has=SetPodWait)
    assert [(w.pod, w.cause) for w in running.scale_down_waits] == [("gpu-001-001", "PodsBusy")]


def test_rule_the_pods_are_decided_in_name_order_whatever_order_the_view_lists_them() -> None:
    """classify_pods reads the pods by name: the marks of pods that must leave come out in
    pod-name order (so do their commands), not in the view's order nor reversed."""
    node_map, pods = full(1)
    gone = [pod("gpu-009-002", "lost-2", revision=REV), pod("gpu-009-001", "lost-1", revision=REV)]
    result = plan(view(nodeset(replicas=1), node_map, [*gone, *pods]))
    marks = expect_actions(result.actions, ScheduleDelete, count=2, reason=MISSCHEDULED_DELETE)
    assert [mark.pod.name for mark in marks] == ["gpu-009-001", "gpu-009-002"]


def _absent_marked(not_registered_for: float) -> ClusterView:
    """gpu-001-001, marked for a scale-down a minute ago, whose Slurm node has been missing
    from every successful poll (NodeNotRegistered) for `not_registered_for` seconds; the
    cluster was read fresh and reachable at T0, after the mark."""
    node_map, pods = full(2)
    pods[0] = pod(
        "gpu-001-001",
        "n0",
        revision=REV,
        delete_reason=SCALING_DELETE,
        not_registered_since=T0 - not_registered_for,
    )
    states = {"gpu-001-002": slurm("gpu-001-002")}
    return view(nodeset(replicas=1), node_map, pods, states, absence_grace=GRACE)


def test_rule_a_node_absent_for_exactly_the_grace_runs_no_job_and_the_plan_wakes_then() -> None:
    """Absence from Slurm proves a node runs no job once it has lasted the absence grace,
    its last second included; before, the pod waits and the plan wakes when the grace runs
    out (nothing in the cluster changes then)."""
    gone = plan(_absent_marked(GRACE))
    expect_actions(gone.actions, DeletePod, pod__name="gpu-001-001", reason="NodeNotRegistered")
    waiting = plan(_absent_marked(GRACE - 1))
    expect_no_actions(waiting.actions, DeletePod, while_it_has=SetPodWait)
    assert waiting.wake_at == T0 + 1


def test_rule_a_terminating_pod_is_replaced_in_place_only_where_its_node_still_keeps_it() -> None:
    """A terminating pod counts as replaced where it is only while its node may keep a pod
    (here: an untolerated NoExecute taint says it may not): otherwise the scale-up puts its
    replacement on another feasible node now, rather than waiting for a node that cannot
    take it."""
    taint = {"key": "gpu", "value": "broken", "effect": "NoExecute"}
    node_map = {
        "n0": node("n0", "10.0.1.1", claim=KEY),
        "n1": node("n1", "10.0.1.2", claim=KEY, taints=[taint]),
        "n2": node("n2", "10.0.1.3", claim=KEY),
    }
    pods = [
        pod("gpu-001-001", "n0", revision=REV),
        pod("gpu-001-002", "n1", revision=REV, terminating=True),
    ]
    result = plan(view(nodeset(replicas=2), node_map, pods))
    expect_actions(result.actions, CreatePod, count=1, node="n2")
    # The same pod terminating on a node that keeps it: replaced there, nothing created.
    node_map["n1"] = node("n1", "10.0.1.2", claim=KEY)
    in_place = plan(view(nodeset(replicas=2), node_map, pods))
    expect_no_actions(in_place.actions, CreatePod, while_it_has=CreateDisruptionBudget)


def test_rule_a_terminating_pod_on_a_node_missing_from_the_view_is_not_replaced_in_place() -> None:
    """A terminating pod whose node the view does not hold is replaced on a feasible node:
    its own node cannot be shown to keep it."""
    node_map = {"n0": node("n0", "10.0.1.1", claim=KEY), "n2": node("n2", "10.0.1.3", claim=KEY)}
    pods = [
        pod("gpu-001-001", "n0", revision=REV),
        pod("gpu-001-002", "n1", revision=REV, terminating=True),
    ]
    result = plan(view(nodeset(replicas=2), node_map, pods))
    expect_actions(result.actions, CreatePod, count=1, node="n2")


def test_rule_a_mark_that_landed_keeps_its_own_time_while_its_send_is_still_recorded() -> None:
    """A SlurmDelete mark visible on the pod with the reason that was sent is the mark: its
    own lastTransitionTime stays the time a Slurm read must follow, not the send's (the
    record of the send outlives the landing for a while). Drained and idle, read after the
    mark landed, the pod goes."""
    node_map, pods = full(2)
    pods[0] = pod("gpu-001-001", "n0", revision=REV, delete_reason=SCALING_DELETE)
    states = {p["metadata"]["name"]: slurm(p["metadata"]["name"]) for p in pods}
    states["gpu-001-001"] = slurm("gpu-001-001", drain=True)
    sent = {"gpu-001-001": PodChangeSent("schedule-delete", T0 - 10, SCALING_DELETE)}
    read_after_the_mark = cluster_status(last_success_at=T0 - 30)
    result = plan(
        view(
            nodeset(replicas=1),
            node_map,
            pods,
            states,
            status=read_after_the_mark,
            in_flight=sent,
        )
    )
    expect_actions(result.actions, DeletePod, pod__name="gpu-001-001")


def test_rule_a_recorded_send_that_names_no_reason_leaves_the_pods_mark_as_it_is() -> None:
    """A SlurmDelete send held without a reason (a ledger slot that named none) says nothing
    of which mark: the pod's own visible mark stands, and a drained, idle pod read after it
    goes."""
    node_map, pods = full(2)
    pods[0] = pod("gpu-001-001", "n0", revision=REV, delete_reason=SCALING_DELETE)
    states = {p["metadata"]["name"]: slurm(p["metadata"]["name"]) for p in pods}
    states["gpu-001-001"] = slurm("gpu-001-001", drain=True)
    sent = {"gpu-001-001": PodChangeSent("schedule-delete", T0 - 30, None)}
    result = plan(view(nodeset(replicas=1), node_map, pods, states, in_flight=sent))
    expect_actions(result.actions, DeletePod, pod__name="gpu-001-001", reason="DrainedAndIdle")


def test_rule_a_pod_whose_node_is_missing_from_the_view_leaves_and_is_not_misscheduled() -> None:
    """A pod on a node the view does not hold leaves (marked, saying the node is missing),
    but it is not counted misscheduled: the reference's misscheduled are pods on nodes of
    the view that no longer fit them."""
    node_map, pods = full(1)
    lost = pod("gpu-009-001", "lost", revision=REV)
    result = plan(view(nodeset(replicas=1), node_map, [*pods, lost]))
    (mark,) = expect_actions(result.actions, ScheduleDelete, pod__name="gpu-009-001")
    assert mark.why == "misscheduled: node lost is missing from the view"
    assert result.wanted_status["numberMisscheduled"] == 0


def test_rule_the_staleness_wake_is_asked_only_for_marks_the_plan_already_sees() -> None:
    """The plan wakes when the Slurm states go stale because that changes what it decides for
    pods marked for deletion; pods it only marks now (a scale-down, a pod whose node is
    gone) have no deletion decision to change until their mark is seen, and the mark's
    landing re-plans: no wake is asked for them (each wake is a plan over every node). Once
    the marks are seen, the wake is asked."""
    off = {"workloadDisruptionProtection": False}
    node_map, pods = full(2)
    lost = pod("gpu-009-001", "lost", revision=REV)
    states = {p["metadata"]["name"]: slurm(p["metadata"]["name"], busy=True) for p in pods}
    marking = plan(view(nodeset(replicas=1, extra=off), node_map, [*pods, lost], states))
    marks = expect_actions(marking.actions, ScheduleDelete, count=2)
    assert {m.pod.name for m in marks} == {"gpu-001-001", "gpu-009-001"}
    assert marking.wake_at is None
    pods[0] = pod("gpu-001-001", "n0", revision=REV, delete_reason=SCALING_DELETE)
    lost = pod("gpu-009-001", "lost", revision=REV, delete_reason=MISSCHEDULED_DELETE)
    for seen in ([*pods, lost], [*pods]):
        marked = plan(view(nodeset(replicas=1, extra=off), node_map, seen, states))
        assert marked.wake_at == T0 + 40.0
    only_lost = [pod("gpu-001-002", "n1", revision=REV), lost]
    assert plan(view(nodeset(replicas=1, extra=off), node_map, only_lost, states)).wake_at == (
        T0 + 40.0
    )


def test_rule_the_memo_never_keeps_a_pod_on_a_verdict_made_for_another_template() -> None:
    """Whether a pod may stay on its node is re-decided when the template changes, though the
    node object is the same: a nodeSelector the node does not match makes its pod leave
    (misscheduled), with the memo as without it."""
    memo = PlanMemo()
    node_map, pods = full(1)
    kept = plan(replace(view(nodeset(replicas=1), node_map, pods), memo=memo))
    expect_no_actions(kept.actions, ScheduleDelete, while_it_has=CreateDisruptionBudget)
    selective = {**TEMPLATE_SPEC, "nodeSelector": {"pool": "a100"}}
    changed = nodeset(replicas=1, template_spec=selective)
    moved = plan(replace(view(changed, node_map, pods), memo=memo))
    expect_actions(
        moved.actions, ScheduleDelete, reason=MISSCHEDULED_DELETE, pod__name="gpu-001-001"
    )


def test_rule_the_update_window_holds_back_only_rolling_replacements() -> None:
    """Under ScheduledUpdate, inside the window, a pod marked for another reason than the
    rollout (here a SlurmDelete without a reason, read as DeleteScheduled) is not held for
    the window's reservation: drained and idle, read after its mark, it goes though its
    Slurm node is not in the reservation."""
    start = int(T0) - 60
    stamp = datetime.fromtimestamp(start, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    obj = nodeset(replicas=2, strategy="ScheduledUpdate")
    obj["spec"]["updateStrategy"]["scheduledUpdate"] = {"startTime": stamp, "duration": "30m"}
    node_map, pods = full(2)
    pods[0] = pod("gpu-001-001", "n0", revision=REV, delete_reason="DeleteScheduled")
    states = {p["metadata"]["name"]: slurm(p["metadata"]["name"]) for p in pods}
    states["gpu-001-001"] = slurm("gpu-001-001", drain=True)
    speaking = msgspec.structs.replace(cluster_status(last_success_at=T0), api_version="v0.0.45")
    result = plan(view(obj, node_map, pods, states, status=speaking))
    expect_actions(result.actions, DeletePod, pod__name="gpu-001-001", reason="DrainedAndIdle")
    (window,) = [c for c in result.wanted_status["conditions"] if c["type"] == "ScheduledUpdate"]
    assert window["reason"] == "WindowOpen"


def test_rule_a_mark_without_a_time_never_sets_when_a_slurm_read_is_awaited() -> None:
    """The plan names the earliest mark time a Slurm read must follow; a SlurmDelete without
    lastTransitionTime proves no read ever (it waits for a forced timeout or for the mark to
    be written again) and names none: the time is the other mark's."""
    node_map, pods = full(2)
    pods[0] = pod("gpu-001-001", "n0", revision=REV, delete_reason=SCALING_DELETE, delete_since=T0)
    untimed = pod("gpu-009-001", "lost", revision=REV, delete_reason=MISSCHEDULED_DELETE)
    for entry in untimed["status"]["conditions"]:
        entry.pop("lastTransitionTime", None)
    states = {p["metadata"]["name"]: slurm(p["metadata"]["name"]) for p in pods}
    states["gpu-001-001"] = slurm("gpu-001-001", drain=True)
    states["gpu-009-001"] = slurm("gpu-009-001", drain=True)
    polled_before = cluster_status(last_success_at=T0 - 5)
    result = plan(
        view(nodeset(replicas=1), node_map, [*pods, untimed], states, status=polled_before)
    )
    expect_no_actions(result.actions, DeletePod, while_it_has=SetPodWait)
    waits = {(w.pod, w.cause) for w in [*result.scale_down_waits, *result.other_waits]}
    assert waits == {("gpu-001-001", AWAITING_SLURM_READ), ("gpu-009-001", AWAITING_SLURM_READ)}
    assert result.awaits_slurm_read_after == T0


def test_rule_the_awaited_slurm_read_is_the_one_after_the_earliest_mark() -> None:
    """Two pods wait for a Slurm read after their marks: the plan names the earlier mark's
    time, so the first poll that proves one of them re-plans (the later mark's would keep
    the first pod waiting a poll longer)."""
    node_map, pods = full(3)
    for index, since in ((0, T0 - 3), (1, T0)):
        name = f"gpu-001-00{index + 1}"
        pods[index] = pod(
            name, f"n{index}", revision=REV, delete_reason=SCALING_DELETE, delete_since=since
        )
    states = {p["metadata"]["name"]: slurm(p["metadata"]["name"], drain=True) for p in pods}
    polled_before = cluster_status(last_success_at=T0 - 5)
    result = plan(view(nodeset(replicas=1), node_map, pods, states, status=polled_before))
    expect_no_actions(result.actions, DeletePod, while_it_has=SetPodWait)
    assert result.awaits_slurm_read_after == T0 - 3


def test_rule_a_wake_is_asked_only_for_a_time_still_to_come() -> None:
    """The plan asks to be woken only for a moment after now: an update window that opens
    this very second is already open in this plan (WindowOpen), and asks no wake at now."""
    now = float(int(T0))
    stamp = datetime.fromtimestamp(now, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    obj = nodeset(replicas=1, strategy="ScheduledUpdate")
    obj["spec"]["updateStrategy"]["scheduledUpdate"] = {"startTime": stamp, "duration": "30m"}
    node_map, pods = full(1)
    speaking = msgspec.structs.replace(cluster_status(last_success_at=now), api_version="v0.0.45")
    result = plan(view(obj, node_map, pods, {}, now=now, status=speaking))
    (window,) = [c for c in result.wanted_status["conditions"] if c["type"] == "ScheduledUpdate"]
    assert window["reason"] == "WindowOpen"
    assert result.wake_at is not None and result.wake_at > now


def test_rule_an_invalid_spec_keeps_a_condition_without_a_status_as_unknown() -> None:
    """While the spec is invalid the controller does not look at Slurm: the conditions it
    keeps are written back as they were; one written without a status is kept as Unknown (a
    condition's status is True, False or Unknown), without a reason as Unknown, without a
    message with an empty one, never "None"."""
    node_map, pods = full(1)
    unknown = {"type": "SlurmStateUnknown", "reason": "SlurmStateStale", "message": "stale"}
    bare = {"type": "ScaleDownWaiting", "status": "False"}
    obj = nodeset(replicas=-1, status={"conditions": [unknown, bare]})
    result = plan(view(obj, node_map, pods))
    kept = {c["type"]: c for c in result.wanted_status["conditions"]}
    slurm_unknown, scale_down = kept["SlurmStateUnknown"], kept["ScaleDownWaiting"]
    assert (slurm_unknown["status"], slurm_unknown["reason"], slurm_unknown["message"]) == (
        "Unknown",
        "SlurmStateStale",
        "stale",
    )
    # Nor a reason or a message "None": Unknown and empty.
    assert (scale_down["status"], scale_down["reason"], scale_down["message"]) == (
        "False",
        "Unknown",
        "",
    )


def test_rule_a_misscheduled_mark_carries_the_wait_its_pod_will_have_once_marked() -> None:
    """A pod that must leave (its node is gone from the view) and runs a job is marked with
    its wait condition in the same patch: busy, not drained yet (rule 8b, no write of its
    own)."""
    node_map, pods = full(1)
    lost = pod("gpu-009-001", "lost", revision=REV)
    states = {"gpu-001-001": slurm("gpu-001-001"), "gpu-009-001": slurm("gpu-009-001", busy=True)}
    result = plan(view(nodeset(replicas=1), node_map, [*pods, lost], states))
    (mark,) = expect_actions(result.actions, ScheduleDelete, pod__name="gpu-009-001")
    assert mark.wait is not None and mark.wait.reason == "PodsBusy"


def test_rule_a_wait_condition_stays_while_its_pod_terminates_or_a_change_is_in_flight() -> None:
    """A wait condition no longer wanted is removed from the pod, but not from a terminating
    pod (it is going) nor from a pod whose mark or delete is still in flight (that patch
    lands first); the pod beside them that waits for nothing loses its condition."""
    node_map, pods = full(3)
    for raw in pods:
        raw["status"]["conditions"].append(
            {
                "type": POD_WAIT_CONDITION,
                "status": "True",
                "reason": "PodsBusy",
                "message": "node busy with jobs",
                "lastTransitionTime": rfc3339(T0 - 60),
            }
        )
    pods[0]["metadata"]["deletionTimestamp"] = rfc3339(T0)
    states = {p["metadata"]["name"]: slurm(p["metadata"]["name"]) for p in pods}
    sent = {"gpu-001-002": PodChangeSent("schedule-delete", T0, SCALING_DELETE)}
    result = plan(view(nodeset(replicas=1), node_map, pods, states, in_flight=sent))
    (removed,) = expect_actions(result.actions, SetPodWait, count=1)
    assert (removed.pod.name, removed.wait) == ("gpu-001-003", None)


def test_rule_a_budget_not_ours_is_reported_only_while_protection_is_on() -> None:
    """A PodDisruptionBudget of our budget's name that the NodeSet does not own leaves it
    unprotected: reported (condition and Notice) while workloadDisruptionProtection is on;
    with the option off there is nothing to protect, and nothing is reported."""
    node_map, pods = full(1)
    states = {"gpu-001-001": slurm("gpu-001-001", busy=True)}
    for enabled in (True, False):
        obj = nodeset(replicas=1, extra={"workloadDisruptionProtection": enabled})
        foreign = budget_object(parse(obj, DEFAULTS))
        foreign["metadata"].update(uid="uid-budget", resourceVersion="77", ownerReferences=[])
        base = view(obj, node_map, pods, states)
        result = plan(replace(base, disruption_budget=foreign))
        conflicts = [
            c for c in result.wanted_status["conditions"] if c["type"] == "DisruptionBudgetConflict"
        ]
        if enabled:
            expect_actions(result.actions, Notice, decision="protection-disabled")
            assert [c["status"] for c in conflicts] == ["True"]
        else:
            expect_no_actions(
                result.actions, Notice, decision="protection-disabled", while_it_has=WriteSlice
            )
            assert [c["status"] for c in conflicts] in ([], ["False"])


def test_rule_a_finished_pod_is_deleted_to_be_replaced() -> None:
    """A NodeSet pod whose phase is Succeeded or Failed runs nothing any more: it is deleted
    (not forced, PodFinished) and a new pod takes its node."""
    node_map, pods = full(2)
    for phase in ("Succeeded", "Failed"):
        pods[1] = pod("gpu-001-002", "n1", revision=REV, phase=phase)
        result = plan(view(nodeset(replicas=2), node_map, pods))
        (gone,) = expect_actions(result.actions, DeletePod, reason="PodFinished")
        assert (gone.pod.name, gone.forced) == ("gpu-001-002", False)
        assert gone.why == f"pod {phase}: replaced by a new pod"


def test_rule_a_terminating_pod_asks_no_protection_wake() -> None:
    """The plan wakes when the Slurm view goes stale to protect the pods it left
    unprotected; a terminating pod is left as it is (never labelled again), so it asks for
    no such wake, while a pod that runs on unprotected does."""
    node_map, pods = full(2)
    pods[1] = pod("gpu-001-002", "n1", revision=REV, terminating=True)
    states = {
        "gpu-001-001": slurm("gpu-001-001", busy=True),
        "gpu-001-002": slurm("gpu-001-002"),
    }
    going = plan(view(nodeset(replicas=2), node_map, pods, states))
    assert going.wake_at is None
    pods[1] = pod("gpu-001-002", "n1", revision=REV)
    idle = plan(view(nodeset(replicas=2), node_map, pods, states))
    assert idle.wake_at == T0 + 40.0


def test_rule_a_pod_with_no_node_at_all_leaves_saying_its_node_is_unknown() -> None:
    """A NodeSet pod neither bound nor pinned to a node leaves like one whose node is missing,
    and its mark says the node is unknown ("?"), not "None"."""
    node_map, pods = full(1)
    nowhere = pod("gpu-009-001", None, revision=REV)
    result = plan(view(nodeset(replicas=1), node_map, [*pods, nowhere]))
    (mark,) = expect_actions(result.actions, ScheduleDelete, pod__name="gpu-009-001")
    assert mark.why == "misscheduled: node ? is missing from the view"
