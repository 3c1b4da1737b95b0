"""NodeMaintenance rules that slips `make mutate` made in `reconcile` showed no test holding
(docs/testing.md): the counts a drain reads back from its status, the record of a first,
restarted or earlier release's drain, the drain's progress message and its decisions, the
cleanup's uncordon and finalizer conditions, and the garbage collector's edges."""

from __future__ import annotations

from typing import Any

import pytest

from maintenance_scheduler.actions import (
    Event,
    EvictPod,
    PatchRequest,
    SetStatus,
    UncordonNode,
)
from maintenance_scheduler.api import (
    INITIAL_STATE_ANNOTATION,
    READY_TIME_ANNOTATION,
    OperatorConfig,
    parse_node_maintenance,
)
from maintenance_scheduler.reconcile import (
    CORDON_REASON_PREFIX,
    NodeFacts,
    Step,
    garbage_collect,
    other_needs_cordon,
    reconcile_request,
)
from nodeflow_kube.fields import condition, rfc3339
from tests.unit.maintenance_scheduler.builders import T0, nm, nm_object, node_facts, pod
from tests.unit.maintenance_scheduler.test_reconcile import (
    CORDONED,
    NODE,
    OURS,
    drain_annotations,
    draining,
    only,
)

SPEC = {"force": True, "timeoutSeconds": 100}


def ready_message(step: Step) -> str:
    ready = condition({"status": only(step, SetStatus)[-1].status}, "Ready")
    assert ready is not None
    return str(ready["message"])


def kinds(step: Step) -> list[str]:
    return [d.kind for d in step.decisions]


def without_transition_time(raw: dict[str, Any]) -> Any:
    """The request as an object whose Ready condition has no lastTransitionTime."""
    for each in raw["status"]["conditions"]:
        each.pop("lastTransitionTime", None)
    request = parse_node_maintenance(raw)
    assert request.phase_since is None
    return request


# --- the counts a drain reads back from its status ---------------------------------------------


@pytest.mark.parametrize("odd", ["3", True, -1, 2.5, None, [2]])
def test_rule_a_drains_status_counts_that_are_no_positive_integer_read_zero(odd: Any) -> None:
    """totalPods and evictionPods are int32 >= 0 as written: anything else (a string, a bool,
    a negative or fractional number, nothing) is read as 0, never carried over as it is."""
    request = draining(status={"drain": {"totalPods": odd, "evictionPods": odd}})
    step = reconcile_request(request, CORDONED, [pod("a")], [], T0 + 1)
    drain = only(step, SetStatus)[0].status["drain"]
    assert (drain["totalPods"], drain["evictionPods"]) == (0, 0)


def test_rule_a_drains_status_count_of_one_is_read_as_one() -> None:
    request = draining(status={"drain": {"totalPods": 1, "evictionPods": 1, "drainProgress": 0}})
    step = reconcile_request(request, CORDONED, [pod("a")], [], T0 + 1)
    drain = only(step, SetStatus)[0].status["drain"]
    assert (drain["totalPods"], drain["evictionPods"]) == (1, 1)


# --- the drain's record: first, restarted, or started by an earlier release --------------------


def test_rule_a_first_drain_records_its_spec_once_starting_with_its_phase() -> None:
    """Recorded before the totals, in one patch, with the phase's start as the drain's start
    (a stable time: the record resent next round is the same command), not the round's."""
    request = nm("r", "n1", phase="Draining", finalizer=True, drainSpec=SPEC)
    step = reconcile_request(request, CORDONED, [pod("a")], [], T0 + 30)
    assert [p.annotations for p in only(step, PatchRequest)] == [drain_annotations(SPEC, T0)]
    assert only(step, SetStatus) == [] and only(step, EvictPod) == []


def test_rule_a_first_drain_without_a_phase_start_records_the_rounds_time() -> None:
    raw = nm_object("r", "n1", phase="Draining", finalizer=True, drainSpec=SPEC)
    step = reconcile_request(without_transition_time(raw), CORDONED, [pod("a")], [], T0 + 30)
    assert [p.annotations for p in only(step, PatchRequest)] == [drain_annotations(SPEC, T0 + 30)]


def test_rule_an_earlier_releases_drain_without_a_phase_start_is_recorded_as_of_now() -> None:
    raw = nm_object(
        "r",
        "n1",
        phase="Draining",
        finalizer=True,
        drainSpec=SPEC,
        status={"drain": {"totalPods": 2, "evictionPods": 2, "drainProgress": 0}},
    )
    step = reconcile_request(without_transition_time(raw), CORDONED, [pod("a")], [], T0 + 30)
    assert [p.annotations for p in only(step, PatchRequest)] == [drain_annotations(SPEC, T0 + 30)]
    assert [e.pod.name for e in only(step, EvictPod)] == ["a"]


def test_rule_a_restarted_drain_records_its_new_spec_as_of_the_restart() -> None:
    """After a drainSpec change emptied status.drain: the new spec's record starts now, not
    with the phase (which began with the first drain)."""
    old_spec = {"force": True, "timeoutSeconds": 100}
    new_spec = {"force": True, "timeoutSeconds": 200}
    reset = draining(drainSpec=new_spec, annotations=drain_annotations(old_spec), status={})
    step = reconcile_request(reset, CORDONED, [pod("a")], [], T0 + 40)
    assert [p.annotations for p in only(step, PatchRequest)] == [
        drain_annotations(new_spec, T0 + 40)
    ]
    assert only(step, EvictPod) == []


# --- the drain's progress message and its decisions ------------------------------------------


def slurm_pods(count: int) -> list[Any]:
    return [pod(f"slurm-{i:02d}", slurm=("Allocated", "Drain")) for i in range(count)]


def slurm_why(name: str) -> str:
    return f"Slurm node {name}: state Allocated+Drain, a job may run"


def test_rule_a_drain_waiting_for_slurm_names_at_most_five_held_pods() -> None:
    step = reconcile_request(draining(), CORDONED, slurm_pods(7), [], T0 + 10)
    held = "; ".join(slurm_why(f"slurm-{i:02d}") for i in range(5))
    assert ready_message(step) == f"waiting for Slurm to drain before evicting: {held}"
    waits = [d for d in step.decisions if d.kind == "waiting-for-slurm"]
    assert [(d.reason, d.pod, d.node) for d in waits] == [
        ("WaitingForSlurm", f"default/slurm-{i:02d}", "n1") for i in range(7)
    ]
    assert "drain-blocked" not in kinds(step)
    assert only(step, EvictPod) == []


def test_rule_a_timed_out_drain_names_at_most_ten_jobs_and_says_so_first() -> None:
    step = reconcile_request(draining(), CORDONED, slurm_pods(12), [], T0 + 100)
    jobs = ", ".join(f"slurm-{i:02d}" for i in range(10))
    held = "; ".join(slurm_why(f"slurm-{i:02d}") for i in range(5))
    assert ready_message(step) == (
        f"drain timed out after 100s with 12 pods left; jobs still run on Slurm nodes {jobs}; "
        f"still retrying. waiting for Slurm to drain before evicting: {held}"
    )


def test_rule_a_timed_out_drain_without_slurm_jobs_names_none_and_is_told() -> None:
    step = reconcile_request(draining(), CORDONED, [pod("a")], [], T0 + 100)
    message = "drain timed out after 100s with 1 pods left; still retrying"
    assert ready_message(step) == message
    # The first timed-out message is told: a Warning Event and a decision.
    assert [(e.reason, e.type) for e in only(step, Event) if e.reason == "DrainTimeout"] == [
        ("DrainTimeout", "Warning")
    ]
    assert [(d.reason, d.message) for d in step.decisions if d.kind == "drain-timeout"] == [
        ("DrainTimeout", message)
    ]


def test_rule_a_timed_out_blocked_drain_says_the_timeout_before_what_blocks_it() -> None:
    spec = {"force": False, "timeoutSeconds": 100}
    request = draining(drainSpec=spec, annotations=drain_annotations(spec))
    step = reconcile_request(request, CORDONED, [pod("u", owner=None)], [], T0 + 100)
    assert ready_message(step) == (
        "drain timed out after 100s with 0 pods left; still retrying. "
        "drain blocked, nothing evicted: default/u has no controller (force is false)"
    )
    assert "drain-blocked" in kinds(step)


def test_rule_a_blocked_drain_before_its_timeout_warns_of_no_timeout() -> None:
    spec = {"force": False, "timeoutSeconds": 100}
    request = draining(drainSpec=spec, annotations=drain_annotations(spec))
    step = reconcile_request(request, CORDONED, [pod("u", owner=None)], [], T0 + 10)
    assert "drain-blocked" in kinds(step)
    assert "drain-timeout" not in kinds(step)
    assert "DrainTimeout" not in [e.reason for e in only(step, Event)]


def test_rule_a_timed_out_drain_warns_once_even_when_its_message_changes() -> None:
    """The timeout's Warning Event goes with the first timed-out message; a later change of
    the message (a pod fewer left) is no second timeout."""
    told = draining(message="drain timed out after 100s with 2 pods left; still retrying")
    step = reconcile_request(told, CORDONED, [pod("a")], [], T0 + 200)
    assert ready_message(step) == "drain timed out after 100s with 1 pods left; still retrying"
    assert "DrainTimeout" not in [e.reason for e in only(step, Event)]
    assert "drain-timeout" not in kinds(step)


# --- deletion: the cleanup's uncordon and finalizer ------------------------------------------


def deleted(phase: str = "Ready", **kwargs: Any) -> Any:
    kwargs.setdefault("annotations", OURS)
    return nm("r", "n1", phase=phase, finalizer=True, deleting=True, **kwargs)


def uncordons(step: Step) -> bool:
    return bool(only(step, UncordonNode))


def test_rule_a_deleted_request_is_no_other_request_keeping_its_own_cordon() -> None:
    request = deleted()
    assert uncordons(reconcile_request(request, CORDONED, [], [request], T0))


def test_rule_a_request_is_never_the_other_request_needing_its_cordon() -> None:
    """Listed among the requests on its node, a request in progress that needs the cordon is
    no other one; a second such request is."""
    request = nm("r", "n1", phase="Draining", finalizer=True)
    assert not other_needs_cordon(request, [request], "uid-n1")
    assert other_needs_cordon(request, [request, nm("o", "n1", phase="Draining")], "uid-n1")


@pytest.mark.parametrize(
    ("other", "keeps"),
    [
        (nm("o", "n1", phase="Cordon"), True),
        (nm("o", "n1", phase="RequestorFailed"), True),
        # Made for another node (before its first round: no node owner yet).
        (nm("o", "n2", phase="Draining", owners=()), False),
        (nm("o", "n1", phase="Draining", deleting=True, finalizer=True), False),
        (nm("o", "n1", phase="Draining", cordon=False), False),
        (nm("o", "n1", phase="Pending"), False),
        (nm("o", "n1", phase="Scheduled"), False),
        (nm("o", "n1"), False),
    ],
)
def test_rule_only_another_live_cordoning_request_on_the_node_keeps_it_cordoned(
    other: Any, keeps: bool
) -> None:
    """Another request keeps the node cordoned only if it is on the same node, not being
    deleted, asks for the cordon and is in a phase that needs it (Cordon to RequestorFailed)."""
    step = reconcile_request(deleted(), CORDONED, [], [other], T0)
    assert uncordons(step) is not keeps
    assert [p.finalizers for p in only(step, PatchRequest)] == ([()] if keeps else [])


def test_rule_a_deleted_request_on_a_gone_node_says_which_phase_it_was_in() -> None:
    for phase, said in ((None, "new"), ("Draining", "Draining")):
        request = nm("r", "n1", phase=phase, finalizer=True, deleting=True)
        step = reconcile_request(request, None, [], [], T0, absent_past_grace=True)
        assert [p.finalizers for p in only(step, PatchRequest)] == [()]
        assert [(d.kind, d.message) for d in step.decisions] == [
            ("finalizer-removed", f"cleanup done in phase {said}: node n1 is gone")
        ]


def test_rule_a_requestor_failed_request_waits_for_its_additional_requestors_too() -> None:
    request = deleted("RequestorFailed", additionalRequestors=["other.example.com"])
    step = reconcile_request(request, CORDONED, [], [], T0)
    assert step.actions == []
    assert [(d.kind, d.message) for d in step.decisions] == [
        (
            "waiting-for-requestors",
            "deletion waits for additionalRequestors: other.example.com",
        )
    ]


def test_rule_a_request_deleted_before_ready_does_not_wait_for_additional_requestors() -> None:
    request = deleted("Draining", additionalRequestors=["other.example.com"])
    step = reconcile_request(request, CORDONED, [], [], T0)
    assert uncordons(step)
    assert "waiting-for-requestors" not in kinds(step)


def test_rule_a_request_without_cordon_never_uncordons_on_deletion() -> None:
    request = deleted("Draining", cordon=False)
    step = reconcile_request(request, CORDONED, [], [], T0)
    assert not uncordons(step)
    assert [p.finalizers for p in only(step, PatchRequest)] == [()]


def test_rule_an_uncordoned_node_of_a_ready_request_only_loses_the_finalizer() -> None:
    step = reconcile_request(deleted("Ready"), NODE, [], [], T0)
    assert not uncordons(step)
    assert [p.finalizers for p in only(step, PatchRequest)] == [()]
    assert [(d.kind, d.message) for d in step.decisions] == [
        ("finalizer-removed", "cleanup done in phase Ready")
    ]


def test_rule_an_uncordon_clears_only_a_cordon_reason_we_wrote() -> None:
    foreign = node_facts("n1", unschedulable=True, reason="kernel upgrade")
    (uncordon,) = only(reconcile_request(deleted(), foreign, [], [], T0), UncordonNode)
    assert not uncordon.clear_reason
    step = reconcile_request(deleted(), CORDONED, [], [], T0)
    (uncordon,) = only(step, UncordonNode)
    assert uncordon.clear_reason
    assert [(d.kind, d.reason, d.message, d.node) for d in step.decisions] == [
        ("uncordon", "Uncordon", "uncordon node n1", "n1")
    ]


def test_rule_a_new_request_deleted_says_it_was_new() -> None:
    request = nm("r", "n1", finalizer=True, deleting=True)
    step = reconcile_request(request, NODE, [], [], T0)
    assert [p.finalizers for p in only(step, PatchRequest)] == [()]
    assert [(d.kind, d.message) for d in step.decisions] == [
        ("finalizer-removed", "cleanup done in phase new")
    ]


def runtime_cordoned(unschedulable: bool = True) -> NodeFacts:
    return NodeFacts(
        name="n1",
        uid="uid-n1",
        resource_version="5",
        unschedulable=unschedulable,
        ready=True,
        cordon_reason=CORDON_REASON_PREFIX + "x",
        runtime_required_cordon=True,
    )


def test_rule_a_runtime_required_cordon_stays_when_our_request_is_deleted() -> None:
    """Our cordon became the runtime-required one (its mark is on the node): whoever releases
    that mark uncordons; the request goes without uncordoning."""
    for phase in ("Cordon", "Draining", "Ready"):
        step = reconcile_request(deleted(phase), runtime_cordoned(), [], [], T0)
        assert not uncordons(step)
        assert [p.finalizers for p in only(step, PatchRequest)] == [()]
        assert [d.message for d in step.decisions] == [
            f"cleanup done in phase {phase}; node n1 stays cordoned (runtimeRequiredCordon)"
        ]


def test_rule_a_runtime_required_cordon_is_not_ours_to_keep_or_name_before_we_cordoned() -> None:
    """Not cordoned by us (cordon false, the node was cordoned before, or the request never
    started): the mark is no concern of this request's cleanup."""
    cases = [
        deleted("Draining", cordon=False),
        deleted("Draining", annotations={INITIAL_STATE_ANNOTATION: "true"}),
        deleted("Pending"),
    ]
    for request in cases:
        step = reconcile_request(request, runtime_cordoned(), [], [], T0)
        assert not uncordons(step)
        assert [d.message for d in step.decisions] == [f"cleanup done in phase {request.phase}"]


# --- garbage collection --------------------------------------------------------------------


def ready_since(name: str, at: float, **kwargs: Any) -> Any:
    return nm(name, "n1", phase="Ready", annotations={READY_TIME_ANNOTATION: rfc3339(at)}, **kwargs)


def test_rule_gc_deletes_a_request_at_the_very_second_it_expires() -> None:
    cfg = OperatorConfig(max_node_maintenance_time_seconds=100)
    due, next_due = garbage_collect([ready_since("r", T0)], cfg, T0 + 100)
    assert [d.request.name for d in due] == ["r"]
    assert next_due is None


def test_rule_gc_wakes_for_the_earliest_expiry() -> None:
    cfg = OperatorConfig(max_node_maintenance_time_seconds=100)
    later, earlier, latest = (
        ready_since("a", T0 + 50),
        ready_since("b", T0),
        ready_since("c", T0 + 80),
    )
    due, next_due = garbage_collect([later, earlier, latest], cfg, T0 + 10)
    assert due == []
    assert next_due == T0 + 100


def test_rule_gc_leaves_a_request_being_deleted_or_without_a_ready_time() -> None:
    cfg = OperatorConfig(max_node_maintenance_time_seconds=1)
    going = ready_since("going", T0, finalizer=True, deleting=True)
    untimed = nm("untimed", "n1", phase="Ready")
    assert garbage_collect([going, untimed], cfg, T0 + 10**6) == ([], None)
