"""The phase machine, cordon/uncordon, waiting, draining, deletion and garbage collection."""

from __future__ import annotations

from typing import Any

from maintenance_scheduler.actions import (
    CordonNode,
    Event,
    EvictPod,
    PatchRequest,
    SetStatus,
    UncordonNode,
)
from maintenance_scheduler.api import (
    DRAIN_SPEC_ANNOTATION,
    DRAIN_START_ANNOTATION,
    FINALIZER,
    INITIAL_STATE_ANNOTATION,
    READY_TIME_ANNOTATION,
    WAIT_START_ANNOTATION,
    OperatorConfig,
    drain_spec_fingerprint,
)
from maintenance_scheduler.reconcile import (
    CORDON_REASON_PREFIX,
    Step,
    garbage_collect,
    reconcile_request,
)
from nodeflow_kube.fields import (
    condition,
    rfc3339,
)
from tests.unit.maintenance_scheduler.builders import (
    T0,
    nm,
    node_facts,
    node_owner,
    pod,
    predecessor_owner,
)

NODE = node_facts("n1")
CORDONED = node_facts("n1", unschedulable=True, reason=CORDON_REASON_PREFIX + "x")


def only(step: Step, kind: type[Any]) -> list[Any]:
    return [a for a in step.actions if isinstance(a, kind)]


def new_phase(step: Step) -> str | None:
    writes = only(step, SetStatus)
    if not writes:
        return None
    ready = condition({"status": writes[-1].status}, "Ready")
    return None if ready is None else str(ready["reason"])


def test_rule_new_request_becomes_pending_with_event() -> None:
    step = reconcile_request(nm("r", "n1"), NODE, [], [], T0)
    assert new_phase(step) == "Pending"
    assert [e.reason for e in only(step, Event)] == ["ConditionChanged"]
    assert only(step, Event)[0].message == "Pending"


def test_rule_pending_on_missing_node_says_so_with_event() -> None:
    step = reconcile_request(nm("r", "ghost", phase="Pending"), None, [], [], T0)
    write = only(step, SetStatus)[0]
    ready = condition({"status": write.status}, "Ready")
    assert ready is not None and ready["reason"] == "Pending"
    assert ready["message"] == "node ghost does not exist"
    assert [e.reason for e in only(step, Event)] == ["NodeNotFound"]
    again = nm("r", "ghost", phase="Pending", message="node ghost does not exist")
    assert reconcile_request(again, None, [], [], T0).actions == []


def test_rule_scheduled_adds_finalizer_and_node_owner_then_moves_to_cordon() -> None:
    (patch,) = only(
        step := reconcile_request(nm("r", "n1", phase="Scheduled", owners=()), NODE, [], [], T0),
        PatchRequest,
    )
    assert patch.finalizers == (FINALIZER,)
    # The Node owns the request (not as controller): deleting the node deletes the request.
    assert patch.owner_references == (node_owner("n1"),)
    assert new_phase(step) is None
    done = nm("r", "n1", phase="Scheduled", finalizer=True, owners=(node_owner("n1"),))
    assert new_phase(reconcile_request(done, NODE, [], [], T0)) == "Cordon"


def test_rule_node_owner_keeps_other_owners_and_is_added_to_an_earlier_request() -> None:
    other = {"apiVersion": "example.com/v1", "kind": "Plan", "name": "p", "uid": "uid-p"}
    for phase in ("Scheduled", "Draining", "Ready"):
        # Draining or Ready: scheduled by a release that set no owner.
        earlier = nm("r", "n1", phase=phase, finalizer=True, owners=(other,))
        step = reconcile_request(earlier, NODE, [], [], T0)
        (patch,) = only(step, PatchRequest)
        assert patch.finalizers is None
        assert patch.owner_references == (other, node_owner("n1"))
        assert only(step, EvictPod) == [] and new_phase(step) is None


def test_rule_cordon_records_initial_state_before_cordoning() -> None:
    request = nm("r", "n1", phase="Cordon", finalizer=True)
    step = reconcile_request(request, NODE, [], [], T0)
    assert only(step, PatchRequest)[0].annotations == {INITIAL_STATE_ANNOTATION: "false"}
    assert only(step, CordonNode) == []
    recorded = nm(
        "r", "n1", phase="Cordon", finalizer=True, annotations={INITIAL_STATE_ANNOTATION: "false"}
    )
    step = reconcile_request(recorded, NODE, [], [], T0)
    cordon = only(step, CordonNode)[0]
    assert cordon.reason.startswith(CORDON_REASON_PREFIX) and "default/r" in cordon.reason
    step = reconcile_request(recorded, CORDONED, [], [], T0)
    assert new_phase(step) == "WaitForPodCompletion"


def test_rule_pre_cordoned_node_is_recorded_and_not_cordoned_again() -> None:
    request = nm("r", "n1", phase="Cordon", finalizer=True)
    cordoned_by_someone = node_facts("n1", unschedulable=True)
    step = reconcile_request(request, cordoned_by_someone, [], [], T0)
    assert only(step, PatchRequest)[0].annotations == {INITIAL_STATE_ANNOTATION: "true"}


def test_rule_cordon_false_skips_the_cordon() -> None:
    request = nm("r", "n1", phase="Cordon", finalizer=True, cordon=False)
    step = reconcile_request(request, NODE, [], [], T0)
    assert new_phase(step) == "WaitForPodCompletion"


def test_rule_wait_for_pod_completion_records_start_then_lists_pods() -> None:
    spec = {"waitForPodCompletion": {"podSelector": "app=important", "timeoutSeconds": 60}}
    request = nm("r", "n1", phase="WaitForPodCompletion", finalizer=True, **spec)
    step = reconcile_request(request, NODE, [], [], T0)
    assert only(step, PatchRequest)[0].annotations == {WAIT_START_ANNOTATION: rfc3339(T0)}
    started = nm(
        "r",
        "n1",
        phase="WaitForPodCompletion",
        finalizer=True,
        annotations={WAIT_START_ANNOTATION: rfc3339(T0)},
        **spec,
    )
    pods = [pod("imp", labels={"app": "important"}), pod("other")]
    step = reconcile_request(started, NODE, pods, [], T0 + 10)
    assert only(step, SetStatus)[0].status["waitForCompletion"] == ["default/imp"]
    assert step.wake_at == T0 + 60
    # Past the timeout (kept on the object, so a restart does not reset it): go on anyway.
    step = reconcile_request(started, NODE, pods, [], T0 + 61)
    assert new_phase(step) == "Draining"
    assert "WaitForPodCompletionTimeout" in [e.reason for e in only(step, Event)]


def test_rule_wait_for_pod_completion_zero_timeout_waits_forever() -> None:
    started = nm(
        "r",
        "n1",
        phase="WaitForPodCompletion",
        finalizer=True,
        annotations={WAIT_START_ANNOTATION: rfc3339(T0)},
        waitForPodCompletion={"podSelector": "app=x", "timeoutSeconds": 0},
    )
    step = reconcile_request(started, NODE, [pod("p", labels={"app": "x"})], [], T0 + 10**6)
    assert new_phase(step) in (None, "WaitForPodCompletion")


DRAIN_STATUS = {"drain": {"totalPods": 2, "evictionPods": 2, "drainProgress": 0}}


def drain_annotations(drain_spec: dict[str, Any], started: float = T0) -> dict[str, str]:
    """What the scheduler records on a request when its drain starts with `drain_spec`."""
    spec = nm("r", "n1", drainSpec=drain_spec).drain_spec
    assert spec is not None
    return {
        DRAIN_SPEC_ANNOTATION: drain_spec_fingerprint(spec),
        DRAIN_START_ANNOTATION: rfc3339(started),
    }


def draining(**kwargs: Any) -> Any:
    """A request whose drain is under way (started at T0 with its drainSpec)."""
    kwargs.setdefault("status", DRAIN_STATUS)
    kwargs.setdefault("drainSpec", {"force": True, "timeoutSeconds": 100})
    kwargs.setdefault("annotations", drain_annotations(kwargs["drainSpec"]))
    return nm("r", "n1", phase="Draining", finalizer=True, **kwargs)


def test_rule_drain_start_records_its_spec_then_fixes_totals_in_status() -> None:
    request = nm("r", "n1", phase="Draining", finalizer=True, drainSpec={"force": True})
    pods = [pod("a"), pod("b", owner="DaemonSet")]
    step = reconcile_request(request, CORDONED, pods, [], T0)
    assert only(step, SetStatus) == [] and only(step, EvictPod) == []
    assert only(step, PatchRequest)[0].annotations == drain_annotations({"force": True}, T0)
    recorded = nm(
        "r",
        "n1",
        phase="Draining",
        finalizer=True,
        drainSpec={"force": True},
        annotations=drain_annotations({"force": True}, T0),
    )
    step = reconcile_request(recorded, CORDONED, pods, [], T0 + 1)
    drain = only(step, SetStatus)[0].status["drain"]
    assert drain == {
        "totalPods": 2,
        "evictionPods": 1,
        "drainProgress": 0,
        "waitForEviction": ["default/a"],
    }
    assert only(step, EvictPod) == []


def test_rule_a_drainspec_change_restarts_the_drain_with_new_totals_and_timeout() -> None:
    """As the reference operator cancels and recreates a drain whose spec changed: the
    totals are counted again for the new spec and its timeout runs from the restart."""
    old_spec = {"force": True, "timeoutSeconds": 100}
    new_spec = {"force": True, "timeoutSeconds": 100, "podSelector": "app=a"}
    pods = [pod("a", labels={"app": "a"}), pod("b")]
    changed = draining(drainSpec=new_spec, annotations=drain_annotations(old_spec))
    step = reconcile_request(changed, CORDONED, pods, [], T0 + 150)
    assert only(step, EvictPod) == []
    assert "drain" not in only(step, SetStatus)[0].status
    assert "DrainRestarted" in [e.reason for e in only(step, Event)]
    assert "drain-restarted" in [d.kind for d in step.decisions]
    reset = draining(drainSpec=new_spec, annotations=drain_annotations(old_spec), status={})
    step = reconcile_request(reset, CORDONED, pods, [], T0 + 151)
    assert only(step, PatchRequest)[0].annotations == drain_annotations(new_spec, T0 + 151)
    restarted = draining(
        drainSpec=new_spec, annotations=drain_annotations(new_spec, T0 + 151), status={}
    )
    step = reconcile_request(restarted, CORDONED, pods, [], T0 + 152)
    assert only(step, SetStatus)[0].status["drain"]["evictionPods"] == 1
    running = draining(drainSpec=new_spec, annotations=drain_annotations(new_spec, T0 + 151))
    step = reconcile_request(running, CORDONED, pods, [], T0 + 200)
    # 250 s after the first start, 49 s after the restart: not timed out.
    assert not step.drain_timed_out
    assert [e.pod.name for e in only(step, EvictPod)] == ["a"]


def test_rule_a_drain_started_by_an_earlier_release_is_not_restarted() -> None:
    """A drain in progress without our record of its spec (an earlier release started it)
    gets the record, with its start as the phase's; nothing is counted again."""
    earlier = draining(annotations={})
    step = reconcile_request(earlier, CORDONED, [pod("a")], [], T0 + 10)
    spec = {"force": True, "timeoutSeconds": 100}
    assert only(step, PatchRequest)[0].annotations == drain_annotations(spec, T0)
    # It goes on meanwhile, with its totals (should an older k8s-watcher refuse the record).
    assert [e.pod.name for e in only(step, EvictPod)] == ["a"]
    assert "DrainRestarted" not in [e.reason for e in only(step, Event)]
    assert all(s.status["drain"]["evictionPods"] == 2 for s in only(step, SetStatus))


def test_rule_drain_evicts_and_reports_progress() -> None:
    step = reconcile_request(draining(), CORDONED, [pod("a")], [], T0 + 1)
    assert [e.pod.name for e in only(step, EvictPod)] == ["a"]
    assert only(step, SetStatus)[0].status["drain"]["drainProgress"] == 50


def test_rule_drain_no_second_eviction_of_a_terminating_pod() -> None:
    step = reconcile_request(draining(), CORDONED, [pod("a", terminating=True)], [], T0 + 1)
    assert only(step, EvictPod) == []


def test_rule_drain_done_goes_ready() -> None:
    step = reconcile_request(draining(), CORDONED, [], [], T0 + 1)
    assert new_phase(step) == "Ready"
    ready = condition({"status": only(step, SetStatus)[0].status}, "Ready")
    assert ready is not None and ready["status"] == "True"


def test_rule_no_drain_spec_goes_ready() -> None:
    request = nm("r", "n1", phase="Draining", finalizer=True)
    assert new_phase(reconcile_request(request, CORDONED, [pod("a")], [], T0)) == "Ready"


def test_rule_drain_timeout_is_reported_not_silently_retried() -> None:
    step = reconcile_request(draining(), CORDONED, [pod("a")], [], T0 + 101)
    assert step.drain_timed_out
    assert "DrainTimeout" in [e.reason for e in only(step, Event)]
    ready = condition({"status": only(step, SetStatus)[0].status}, "Ready")
    assert ready is not None and str(ready["message"]).startswith("drain timed out after 100s")
    # Still retrying: the eviction is sent again.
    assert [e.pod.name for e in only(step, EvictPod)] == ["a"]
    assert step.wake_at is not None


def test_rule_slurm_first_past_timeout_reports_jobs_instead_of_evicting() -> None:
    busy = pod("slurm-0", slurm=("Allocated", "Drain"))
    step = reconcile_request(draining(), CORDONED, [busy], [], T0 + 101)
    assert only(step, EvictPod) == []
    ready = condition({"status": only(step, SetStatus)[0].status}, "Ready")
    assert ready is not None and "jobs still run on Slurm nodes slurm-0" in str(ready["message"])
    assert "waiting-for-slurm" in [d.kind for d in step.decisions]


def test_rule_ready_sets_ready_time_once() -> None:
    request = nm("r", "n1", phase="Ready", finalizer=True)
    step = reconcile_request(request, CORDONED, [], [], T0)
    assert only(step, PatchRequest)[0].annotations == {READY_TIME_ANNOTATION: rfc3339(T0)}
    timed = nm(
        "r",
        "n1",
        phase="Ready",
        finalizer=True,
        annotations={READY_TIME_ANNOTATION: rfc3339(T0 - 5)},
    )
    assert reconcile_request(timed, CORDONED, [], [], T0).actions == []


def test_rule_requestor_failed_and_back_to_ready() -> None:
    failed = nm("r", "n1", phase="Ready", finalizer=True, requestor_failed=True)
    assert new_phase(reconcile_request(failed, CORDONED, [], [], T0)) == "RequestorFailed"
    cleared = nm("r", "n1", phase="RequestorFailed", finalizer=True)
    assert new_phase(reconcile_request(cleared, CORDONED, [], [], T0)) == "Ready"


# --- deletion -------------------------------------------------------------------------------

OURS = {INITIAL_STATE_ANNOTATION: "false"}


def test_rule_deletion_uncordons_only_if_we_cordoned() -> None:
    ours = nm("r", "n1", phase="Draining", finalizer=True, deleting=True, annotations=OURS)
    step = reconcile_request(ours, CORDONED, [], [], T0)
    uncordon = only(step, UncordonNode)[0]
    assert uncordon.clear_reason
    assert only(step, PatchRequest) == []  # the finalizer goes once the uncordon landed
    step = reconcile_request(ours, NODE, [], [], T0)
    assert only(step, PatchRequest)[0].finalizers == ()
    pre = nm(
        "r",
        "n1",
        phase="Ready",
        finalizer=True,
        deleting=True,
        annotations={INITIAL_STATE_ANNOTATION: "true"},
    )
    step = reconcile_request(pre, node_facts("n1", unschedulable=True), [], [], T0)
    assert only(step, UncordonNode) == []
    assert only(step, PatchRequest)[0].finalizers == ()


def test_rule_deletion_keeps_cordon_another_request_still_needs() -> None:
    ours = nm("r", "n1", phase="Ready", finalizer=True, deleting=True, annotations=OURS)
    other = nm("other", "n1", phase="Draining", finalizer=True)
    step = reconcile_request(ours, CORDONED, [], [other], T0)
    assert only(step, UncordonNode) == []
    assert only(step, PatchRequest)[0].finalizers == ()


def test_rule_deletion_of_scheduled_request_only_drops_finalizer() -> None:
    request = nm("r", "n1", phase="Scheduled", finalizer=True, deleting=True, annotations=OURS)
    step = reconcile_request(request, CORDONED, [], [], T0)
    assert only(step, UncordonNode) == []
    assert only(step, PatchRequest)[0].finalizers == ()


def test_rule_deletion_during_cordon_cancels_a_cordon_in_flight() -> None:
    request = nm("r", "n1", phase="Cordon", finalizer=True, deleting=True, annotations=OURS)
    step = reconcile_request(request, NODE, [], [], T0)
    assert len(only(step, UncordonNode)) == 1
    assert only(step, PatchRequest)[0].finalizers == ()


def test_rule_deletion_cancels_the_drain() -> None:
    request = draining(deleting=True, annotations=OURS)
    step = reconcile_request(request, CORDONED, [pod("a")], [], T0)
    assert only(step, EvictPod) == []


def test_rule_ready_request_with_additional_requestors_waits() -> None:
    request = nm(
        "r",
        "n1",
        phase="Ready",
        finalizer=True,
        deleting=True,
        annotations=OURS,
        additionalRequestors=["other.example.com"],
    )
    step = reconcile_request(request, CORDONED, [], [], T0)
    assert step.actions == []
    assert [d.kind for d in step.decisions] == ["waiting-for-requestors"]


# --- garbage collection -----------------------------------------------------------------------


def test_rule_gc_deletes_requests_ready_longer_than_max_time() -> None:
    cfg = OperatorConfig(max_node_maintenance_time_seconds=100)
    old = nm("old", "n1", phase="Ready", annotations={READY_TIME_ANNOTATION: rfc3339(T0)})
    due, next_due = garbage_collect([old], cfg, T0 + 99)
    assert due == [] and next_due == T0 + 100
    due, _ = garbage_collect([old], cfg, T0 + 101)
    assert [d.request.name for d in due] == ["old"]


def test_rule_gc_never_deletes_requestor_failed_or_ignored() -> None:
    cfg = OperatorConfig(max_node_maintenance_time_seconds=1)
    ready_at = {READY_TIME_ANNOTATION: rfc3339(T0)}
    failed = nm("f", "n1", phase="RequestorFailed", annotations=ready_at)
    ignored = nm(
        "i",
        "n2",
        phase="Ready",
        annotations={**ready_at, "maintenance.nvidia.com/garbage-collector.ignore": "true"},
    )
    due, _ = garbage_collect([failed, ignored], cfg, T0 + 10**6)
    assert due == []


def test_rule_invalid_request_stays_pending_with_message_and_event() -> None:
    step = reconcile_request(nm("r", "n1", requestor="x"), NODE, [], [], T0)
    assert new_phase(step) == "Pending"
    ready = condition({"status": only(step, SetStatus)[0].status}, "Ready")
    assert ready is not None and str(ready["message"]).startswith("invalid spec: ")
    assert [e.reason for e in only(step, Event)] == ["InvalidSpec", "ConditionChanged"]


def test_rule_invalid_request_in_progress_keeps_its_phase() -> None:
    request = nm("r", "n1", phase="Draining", finalizer=True, drainSpec={"timeoutSeconds": -1})
    step = reconcile_request(request, CORDONED, [pod("a")], [], T0)
    assert new_phase(step) == "Draining"
    assert only(step, EvictPod) == []


def test_rule_slurm_first_without_cordon_says_nothing_drains_slurm() -> None:
    request = draining(cordon=False)
    step = reconcile_request(request, NODE, [pod("slurm-0", slurm=("Idle",))], [], T0 + 1)
    assert only(step, EvictPod) == []
    ready = condition({"status": only(step, SetStatus)[0].status}, "Ready")
    assert ready is not None and "spec.cordon is false" in str(ready["message"])


# --- the node a request was made for (issue 28, items 6 and 7) ---------------------------------


def test_rule_a_new_request_gets_its_node_as_owner_before_anything_else() -> None:
    """As upstream's first reconcile: the ownerReference binds the request to this node (and
    has the garbage collector delete it with the node) before it is even Pending."""
    for phase in (None, "Pending"):
        step = reconcile_request(nm("r", "n1", phase=phase, owners=()), NODE, [], [], T0)
        (patch,) = only(step, PatchRequest)
        assert patch.owner_references == (node_owner("n1"),)
        # The finalizer comes with Scheduled, as upstream's.
        assert patch.finalizers is None
        assert new_phase(step) is None
    owned = nm("r", "n1", owners=(node_owner("n1"),))
    assert new_phase(reconcile_request(owned, NODE, [], [], T0)) == "Pending"


def test_rule_ready_request_with_additional_requestors_on_a_deleted_node_loses_its_finalizer() -> (
    None
):
    """Upstream drops the finalizer on NotFound in any phase: waiting for additionalRequestors
    of a node that is gone would hold the request, and its slot, for ever."""
    request = nm(
        "r",
        "n1",
        phase="Ready",
        finalizer=True,
        deleting=True,
        annotations=OURS,
        additionalRequestors=["other.example.com"],
    )
    step = reconcile_request(request, None, [], [], T0, absent_past_grace=True)
    (patch,) = only(step, PatchRequest)
    assert patch.finalizers == ()
    assert only(step, UncordonNode) == []


def test_rule_request_in_progress_on_a_deleted_node_drops_its_finalizer_then_says_so() -> None:
    request = draining()
    step = reconcile_request(request, None, [pod("a")], [], T0, absent_past_grace=True)
    (patch,) = only(step, PatchRequest)
    assert patch.finalizers == ()
    assert only(step, EvictPod) == [] and only(step, SetStatus) == []
    released = nm("r", "n1", phase="Draining", drainSpec={"force": True}, status=DRAIN_STATUS)
    step = reconcile_request(released, None, [], [], T0, absent_past_grace=True)
    assert new_phase(step) == "Draining"
    ready = condition({"status": only(step, SetStatus)[0].status}, "Ready")
    assert ready is not None and ready["message"] == "node n1 does not exist"
    assert [e.reason for e in only(step, Event)] == ["NodeNotFound"]


def test_rule_a_node_that_took_the_name_is_not_the_requests_node() -> None:
    """The request was made for node n1 of uid `uid-n1-before`; a new n1 (`uid-n1`) replaced it.
    Nothing is cordoned, drained or uncordoned on the newcomer, the owner is not moved to it,
    and a Pending request says NodeNotFound."""
    before = (predecessor_owner("n1"),)
    step = reconcile_request(draining(owners=before), CORDONED, [pod("a")], [], T0)
    assert only(step, EvictPod) == []
    assert [p.finalizers for p in only(step, PatchRequest)] == [()]
    assert all(p.owner_references is None for p in only(step, PatchRequest))
    cordon = nm("r", "n1", phase="Cordon", finalizer=True, annotations=OURS, owners=before)
    step = reconcile_request(cordon, NODE, [], [], T0)
    assert only(step, CordonNode) == []
    gone = nm(
        "r", "n1", phase="Cordon", deleting=True, finalizer=True, annotations=OURS, owners=before
    )
    step = reconcile_request(gone, CORDONED, [], [], T0)
    assert only(step, UncordonNode) == []
    assert [p.finalizers for p in only(step, PatchRequest)] == [()]
    pending = nm("r", "n1", phase="Pending", owners=before)
    step = reconcile_request(pending, NODE, [], [], T0)
    assert only(step, PatchRequest) == []
    ready = condition({"status": only(step, SetStatus)[0].status}, "Ready")
    assert ready is not None and ready["reason"] == "Pending"
    assert "uid-n1-before" in str(ready["message"]) and "is gone" in str(ready["message"])
    assert [e.reason for e in only(step, Event)] == ["NodeNotFound"]


def test_rule_a_request_for_a_replaced_node_does_not_keep_the_newcomer_cordoned() -> None:
    predecessor_request = nm(
        "old", "n1", phase="Draining", finalizer=True, owners=(predecessor_owner("n1"),)
    )
    request = nm("r", "n1", phase="Ready", finalizer=True, deleting=True, annotations=OURS)
    step = reconcile_request(request, CORDONED, [], [predecessor_request, request], T0)
    assert len(only(step, UncordonNode)) == 1


def test_rule_an_eviction_filter_without_regex_stops_the_drain_with_invalid_spec() -> None:
    """`podEvictionFilters: [{}]` read as no filter would evict every pod on the node."""
    spec = {"force": True, "podEvictionFilters": [{}]}
    request = draining(drainSpec=spec)
    step = reconcile_request(request, CORDONED, [pod("a")], [], T0)
    assert only(step, EvictPod) == []
    assert new_phase(step) == "Draining"
    ready = condition({"status": only(step, SetStatus)[0].status}, "Ready")
    assert ready is not None
    assert "podEvictionFilters[0].byResourceNameRegex is required" in str(ready["message"])
    assert [e.reason for e in only(step, Event)] == ["InvalidSpec"]


def test_rule_pending_message_says_what_holds_the_request() -> None:
    """Issue #35: `kubectl get nodemaintenance` shows why a request is Pending: the budget
    the scheduler named (its message), written only when it changes, cleared once free."""
    held = "waiting for a slot: 2 of 2 maxParallelOperations in progress"
    step = reconcile_request(nm("r", "n1", phase="Pending"), NODE, [], [], T0, waiting_for=held)
    write = only(step, SetStatus)[0]
    ready = condition({"status": write.status}, "Ready")
    assert ready is not None
    assert (ready["status"], ready["reason"], ready["message"]) == ("False", "Pending", held)
    # Still Pending: no Event, no phase-change decision.
    assert only(step, Event) == [] and step.decisions == []
    waiting = nm("r", "n1", phase="Pending", message=held)
    assert reconcile_request(waiting, NODE, [], [], T0, waiting_for=held).actions == []
    # The budget freed (scheduled elsewhere this round, or no longer held): message cleared.
    cleared = only(reconcile_request(waiting, NODE, [], [], T0), SetStatus)[0]
    ready = condition({"status": cleared.status}, "Ready")
    assert ready is not None and ready["message"] == ""
