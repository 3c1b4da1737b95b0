"""The safety rules of the plan: rolling budget (in flight, percent base), nodes that run no
job (DOWN, never registered), stale Slurm state, marks that stay, misscheduled pods, pods
whose node is missing from the view, scale-down with a rollout, and the status counts."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from nodeflow_contracts.pod_protocol import (
    MISSCHEDULED_DELETE,
    ROLLING_DELETE,
    SCALING_DELETE,
)
from nodeflow_contracts.slurm import BaseState, SlurmNodeState
from nodeset_controller.deletion import decide_deletion
from nodeset_controller.planner import (
    CancelDelete,
    CreatePod,
    DeletePod,
    PodChangeSent,
    ScheduleDelete,
    plan,
)
from nodeset_controller.podstate import PodState, scale_down_message
from tests.unit.nodeset_controller.builders import (
    T0,
    cluster_status,
    node,
    nodeset,
    pod,
    slurm,
    state,
)
from tests.unit.nodeset_controller.test_planner import KEY, REV, full, nodes, of, view

GRACE = 300.0


def names(actions: list[Any]) -> list[str]:
    return sorted(a.pod.name for a in actions)


def scheduled(result: Any, reason: str) -> list[str]:
    return names([a for a in of(result, ScheduleDelete) if a.reason == reason])


def outdated(count: int, **kwargs: Any) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    return full(count, revision="old", **kwargs)


def busy_states(pods: list[dict[str, Any]], **kwargs: bool) -> dict[str, SlurmNodeState]:
    return {p["metadata"]["name"]: slurm(p["metadata"]["name"], **kwargs) for p in pods}


# --- item 1: the rolling budget counts changes in flight ---------------------------------------


def test_rule_rolling_budget_counts_slurm_delete_sent_but_not_yet_visible() -> None:
    node_map, pods = outdated(3)
    states = busy_states(pods, busy=True)
    spec = nodeset(replicas=3, max_unavailable=1)
    first = plan(view(spec, node_map, pods, states))
    assert len(of(first, ScheduleDelete)) == 1
    marked = of(first, ScheduleDelete)[0].pod.name
    # The mark is in flight; meanwhile another pod turns idle (a better pick).
    idle = next(p["metadata"]["name"] for p in pods if p["metadata"]["name"] != marked)
    states[idle] = slurm(idle)
    sent = {marked: PodChangeSent("schedule-delete", T0, ROLLING_DELETE)}
    second = plan(view(spec, node_map, pods, states, in_flight=sent))
    assert of(second, ScheduleDelete) == []


def test_rule_rolling_budget_counts_pod_delete_sent_but_not_yet_visible() -> None:
    node_map, pods = outdated(3)
    pods[0] = pod("gpu-001-001", "n0", revision="old", delete_reason=ROLLING_DELETE)
    states = busy_states(pods, busy=True)
    states["gpu-001-001"] = slurm("gpu-001-001", drain=True)
    spec = nodeset(replicas=3, max_unavailable=1)
    first = plan(view(spec, node_map, pods, states))
    assert names(of(first, DeletePod)) == ["gpu-001-001"]
    # The delete is in flight: the pod still looks marked, and nothing else may go.
    sent = {"gpu-001-001": PodChangeSent("delete", T0)}
    states["gpu-001-002"] = slurm("gpu-001-002")
    second = plan(view(spec, node_map, pods, states, in_flight=sent))
    assert of(second, ScheduleDelete) == []
    assert of(second, DeletePod) == []


# --- item 2: percent budget of the pods the NodeSet can really run ----------------------------


def test_rule_rolling_budget_percent_is_of_min_desired_and_feasible_rounded_up() -> None:
    node_map, pods = outdated(4)
    states = busy_states(pods)
    result = plan(view(nodeset(replicas=20, max_unavailable="25%"), node_map, pods, states))
    # 25% of min(20, 4) = 1, not 25% of 20 = 5.
    assert len(scheduled(result, ROLLING_DELETE)) == 1
    assert "of at most 1" in of(result, ScheduleDelete)[0].why
    # Rounded up: 10% of 4 is still one pod.
    small = plan(view(nodeset(replicas=20, max_unavailable="10%"), node_map, pods, states))
    assert len(scheduled(small, ROLLING_DELETE)) == 1


def test_rule_rolling_budget_counts_not_ready_and_pending_scaling_deletions() -> None:
    node_map, pods = outdated(4)
    pods[0] = pod("gpu-001-001", "n0", revision="old", ready=False)
    states = busy_states(pods)
    result = plan(view(nodeset(replicas=4, max_unavailable="50%"), node_map, pods, states))
    # Budget 2: the not-ready pod uses one (replacing it is free), one ready pod more.
    assert len(scheduled(result, ROLLING_DELETE)) == 2
    assert "gpu-001-001" in scheduled(result, ROLLING_DELETE)


# --- item 3: a node that runs no job ------------------------------------------------------------


def test_rule_down_slurm_node_runs_no_job_and_is_deleted_without_a_drain() -> None:
    node_map, pods = outdated(2)
    pods[0] = pod("gpu-001-001", "n0", revision="old", delete_reason=ROLLING_DELETE)
    states = busy_states(pods, busy=True)
    states["gpu-001-001"] = slurm("gpu-001-001", down=True)
    result = plan(view(nodeset(replicas=2), node_map, pods, states))
    (delete,) = of(result, DeletePod)
    assert delete.pod.name == "gpu-001-001" and delete.reason == "SlurmNodeDown"
    assert not delete.forced


def test_rule_down_slurm_node_is_picked_first_for_scale_down_and_deleted() -> None:
    node_map, pods = full(3)
    states = busy_states(pods, busy=True)
    states["gpu-001-002"] = slurm("gpu-001-002", down=True)
    first = plan(view(nodeset(replicas=2), node_map, pods, states))
    assert scheduled(first, SCALING_DELETE) == ["gpu-001-002"]
    pods[1] = pod("gpu-001-002", "n1", revision=REV, delete_reason=SCALING_DELETE)
    second = plan(view(nodeset(replicas=2), node_map, pods, states))
    assert [(d.pod.name, d.reason) for d in of(second, DeletePod)] == [
        ("gpu-001-002", "SlurmNodeDown")
    ]


def test_rule_node_absent_from_successful_polls_past_the_grace_runs_no_job() -> None:
    node_map, pods = full(2)
    pods[0] = pod(
        "gpu-001-001",
        "n0",
        revision=REV,
        delete_reason=SCALING_DELETE,
        not_registered_since=T0 - GRACE - 1,
    )
    states = busy_states(pods[1:], busy=True)  # gpu-001-001 has no Slurm entry
    spec = nodeset(replicas=1)
    result = plan(view(spec, node_map, pods, states))
    assert [(d.pod.name, d.reason) for d in of(result, DeletePod)] == [
        ("gpu-001-001", "NodeNotRegistered")
    ]


def test_rule_node_absent_for_less_than_the_grace_waits_and_wakes_at_its_end() -> None:
    node_map, pods = full(2)
    since = T0 - 100
    pods[0] = pod(
        "gpu-001-001", "n0", revision=REV, delete_reason=SCALING_DELETE, not_registered_since=since
    )
    states = busy_states(pods[1:], busy=True)
    result = plan(view(nodeset(replicas=1), node_map, pods, states))
    assert of(result, DeletePod) == []
    assert result.wake_at is not None and result.wake_at <= since + GRACE


def test_rule_node_absence_proves_nothing_when_the_cluster_is_unreachable_or_stale() -> None:
    node_map, pods = full(2)
    pods[0] = pod(
        "gpu-001-001",
        "n0",
        revision=REV,
        delete_reason=SCALING_DELETE,
        not_registered_since=T0 - 10 * GRACE,
    )
    states = busy_states(pods[1:], busy=True)
    spec = nodeset(replicas=1)
    unreachable = cluster_status(last_success_at=T0, reachable=False)
    stale = cluster_status(last_success_at=T0 - 1000)
    for status in (unreachable, stale, None):
        result = plan(view(spec, node_map, pods, states, status=status))
        assert of(result, DeletePod) == [], status


# --- item 9: stale Slurm state is unknown -------------------------------------------------------


def test_rule_stale_slurm_state_is_unknown() -> None:
    node_map, pods = full(2)
    pods[0] = pod("gpu-001-001", "n0", revision=REV, delete_reason=SCALING_DELETE)
    states = busy_states(pods, drain=True)
    spec = nodeset(replicas=1)
    fresh = plan(view(spec, node_map, pods, states))
    assert names(of(fresh, DeletePod)) == ["gpu-001-001"]
    # Last successful poll 41 s ago, polling every 10 s: older than 4 intervals.
    stale_status = cluster_status(last_success_at=T0 - 41, poll_interval=10)
    stale = plan(view(spec, node_map, pods, states, status=stale_status))
    assert of(stale, DeletePod) == []
    assert stale.status is not None and stale.status["numberDrain"] == 0
    # No status at all (slurm-syncer never wrote one): unknown too.
    assert of(plan(view(spec, node_map, pods, states, status=None)), DeletePod) == []


def test_rule_stale_slurm_state_max_age_is_a_setting() -> None:
    node_map, pods = full(2)
    pods[0] = pod("gpu-001-001", "n0", revision=REV, delete_reason=SCALING_DELETE)
    states = busy_states(pods, drain=True)
    status = cluster_status(last_success_at=T0 - 41, poll_interval=10)
    base = view(nodeset(replicas=1), node_map, pods, states, status=status)
    from dataclasses import replace

    assert names(of(plan(replace(base, slurm_max_age=60)), DeletePod)) == ["gpu-001-001"]
    assert of(plan(replace(base, slurm_max_age=30)), DeletePod) == []


def test_rule_stale_slurm_state_plan_wakes_when_the_state_goes_stale() -> None:
    node_map, pods = full(2)
    pods[0] = pod("gpu-001-001", "n0", revision=REV, delete_reason=SCALING_DELETE)
    states = busy_states(pods, busy=True)
    status = cluster_status(last_success_at=T0 - 5, poll_interval=10)
    result = plan(view(nodeset(replicas=1), node_map, pods, states, status=status))
    assert result.wake_at == T0 - 5 + 40


# --- item 4: once chosen, a pod stays chosen ----------------------------------------------------


def test_rule_once_chosen_a_pod_stays_chosen_without_re_ranking() -> None:
    node_map, pods = full(3)
    pods[2] = pod(
        "gpu-001-003", "n2", revision=REV, delete_reason=SCALING_DELETE, delete_since=T0 - 50
    )
    states = busy_states(pods, busy=True)
    # Another pod becomes a far better pick (idle and drained) with replicas unchanged.
    states["gpu-001-001"] = slurm("gpu-001-001", drain=True)
    result = plan(view(nodeset(replicas=2), node_map, pods, states))
    assert of(result, CancelDelete) == []
    assert of(result, ScheduleDelete) == []


def test_rule_once_chosen_a_pod_is_released_only_when_the_desired_count_rises() -> None:
    node_map, pods = full(3)
    pods[2] = pod("gpu-001-003", "n2", revision=REV, delete_reason=SCALING_DELETE)
    states = busy_states(pods, busy=True)
    rose = nodeset(replicas=3, status={"desiredNumberScheduled": 2})
    result = plan(view(rose, node_map, pods, states))
    assert names(of(result, CancelDelete)) == ["gpu-001-003"]


def test_rule_once_chosen_a_pod_stays_chosen_when_another_pod_is_lost() -> None:
    node_map, pods = full(3)
    pods[0] = pod("gpu-001-001", "n0", revision=REV, delete_reason=SCALING_DELETE)
    del pods[2]  # its node died and the pod went with it
    states = busy_states(pods, busy=True)
    spec = nodeset(replicas=2, status={"desiredNumberScheduled": 2})
    result = plan(view(spec, node_map, pods, states))
    assert of(result, CancelDelete) == []
    # The lost pod is replaced while the chosen one drains.
    assert [c.node for c in of(result, CreatePod)] == ["n2"]


# --- item 5: a node missing from the view; a missing phase ------------------------------------


def test_rule_node_missing_from_view_is_not_proof_the_node_is_gone() -> None:
    node_map, pods = full(2)
    del node_map["n1"]  # filtered out by a label selector, or relabelled away
    states = busy_states(pods, busy=True)
    result = plan(view(nodeset(replicas=2), node_map, pods, states))
    assert of(result, DeletePod) == []
    assert scheduled(result, MISSCHEDULED_DELETE) == ["gpu-001-002"]
    # Marked and still busy: it waits, however long, for Slurm to say it runs no job.
    pods[1] = pod("gpu-001-002", "n1", revision=REV, delete_reason=MISSCHEDULED_DELETE)
    later = plan(view(nodeset(replicas=2), node_map, pods, states, now=T0 + 10**6))
    assert of(later, DeletePod) == []
    # Slurm says DOWN: the node runs no job, the pod goes.
    states["gpu-001-002"] = slurm("gpu-001-002", down=True, busy=False)
    down = plan(view(nodeset(replicas=2), node_map, pods, states))
    assert [(d.pod.name, d.reason) for d in of(down, DeletePod)] == [
        ("gpu-001-002", "SlurmNodeDown")
    ]


def test_rule_missing_pod_phase_is_not_never_started() -> None:
    node_map, pods = outdated(1)
    pods[0] = pod(
        "gpu-001-001",
        "n0",
        revision="old",
        ready=False,
        phase_missing=True,
        delete_reason=ROLLING_DELETE,
    )
    states = busy_states(pods, busy=True)
    result = plan(view(nodeset(replicas=1), node_map, pods, states))
    assert of(result, DeletePod) == []


def test_rule_pending_pod_that_slurm_reports_busy_is_not_never_started() -> None:
    pending = state(
        pod("p", "n", ready=False, phase="Pending", delete_reason=ROLLING_DELETE),
        slurm("p", busy=True),
    )
    assert decide_deletion(pending, T0 + 10**6, 0, 0).verdict == "wait"


def test_rule_a_bound_pending_pod_proves_no_idle_node_while_slurm_is_unknown() -> None:
    """The kubelet reports Pending while any container waits (a sidecar whose image does
    not pull) even when slurmd runs beside it and has jobs: with Slurm's state stale, such a
    pod is not taken for one that never started (nor when fresh and idle: see
    test_rule_a_bound_pending_pod_never_counts_as_never_started). Never bound, it is."""
    pending = pod("p", "n", ready=False, phase="Pending", delete_reason=SCALING_DELETE)
    assert decide_deletion(state(pending, None), T0 + 10**6, 0, 0).verdict == "wait"
    unbound = pod("p", None, ready=False, phase="Pending", delete_reason=SCALING_DELETE)
    assert decide_deletion(state(unbound, None), T0, 0, 0).verdict == "delete"
    # The whole plan, its Slurm cluster last polled ten minutes ago: marked, not deleted.
    node_map = nodes(3, claim=KEY)
    pods = [pod(f"gpu-001-{i + 1:03d}", f"n{i}") for i in range(3)]
    pods[0] = pod("gpu-001-001", "n0", ready=False, phase="Pending", delete_reason=SCALING_DELETE)
    states = busy_states(pods, busy=True)
    stale = cluster_status(last_success_at=T0 - 600)
    result = plan(view(nodeset(replicas=2), node_map, pods, states, status=stale))
    assert of(result, DeletePod) == []


def test_rule_a_scale_down_mark_outgrown_by_the_replica_count_is_cancelled() -> None:
    """Scaled 5 -> 4 and back to 5 before the status recorded 4 (its write was refused: the
    NodeSet changed under it): the mark made for 4 must still be cancelled, or the forced
    timeout kills the job it drains though the user wants five pods. A mark made for the
    count that still holds stays (a pod lost meanwhile is replaced, the marked one goes)."""
    node_map, pods = full(5)
    marked = pod(
        "gpu-001-001",
        "n0",
        revision=REV,
        delete_reason=SCALING_DELETE,
        delete_since=T0,
        delete_message=scale_down_message(4, "idle"),
    )
    pods[0] = marked
    states = busy_states(pods, busy=True)
    states["gpu-001-001"] = slurm("gpu-001-001", busy=True, drain=True)
    forced = {"forceScalingDeleteKnownConditionTimeout": 60}
    spec = nodeset(replicas=5, status={"desiredNumberScheduled": 5}, extra=forced)
    result = plan(view(spec, node_map, pods, states, now=T0 + 120))
    assert [c.pod.name for c in of(result, CancelDelete)] == ["gpu-001-001"]
    assert of(result, DeletePod) == []
    # Four wanted, one of the other pods lost: the mark made for four stays.
    spec = nodeset(replicas=4, status={"desiredNumberScheduled": 4}, extra=forced)
    result = plan(view(spec, node_map, pods[:4], states, now=T0 + 10))
    assert of(result, CancelDelete) == []


@st.composite
def pod_states(draw: st.DrawFn) -> PodState:
    known = draw(st.booleans())
    base: BaseState = draw(st.sampled_from(["Allocated", "Mixed", "Idle", "Down", "Unknown"]))
    completing = draw(st.booleans())
    busy = base in ("Allocated", "Mixed") or completing
    drain = draw(st.booleans())
    slurm_state = (
        None
        if draw(st.booleans())
        else SlurmNodeState(
            cluster="a",
            name="p",
            known=known,
            base_state=base,
            flags=("Completing",) if completing else (),
            busy=busy,
            drain=drain,
            drained=drain and not busy,
            draining=drain and busy,
        )
    )
    raw = pod(
        "p",
        draw(st.sampled_from(["n", None])),
        ready=draw(st.booleans()),
        phase=draw(st.sampled_from(["Pending", "Running", "Unknown"])),
        phase_missing=draw(st.booleans()),
        delete_reason=draw(st.sampled_from([SCALING_DELETE, ROLLING_DELETE, MISSCHEDULED_DELETE])),
        delete_since=T0,
        not_registered_since=draw(st.sampled_from([None, T0 - 1000])),
    )
    return state(raw, slurm_state)


@given(
    pod_states(),
    st.floats(min_value=0, max_value=10**6),
    st.sampled_from([0.0, 5.0]),
    st.sampled_from([0.0, 5.0]),
)
def test_rule_only_a_forced_scale_down_timeout_deletes_a_pod_slurm_reports_busy(
    pod_state: PodState, elapsed: float, known_timeout: float, unknown_timeout: float
) -> None:
    decision = decide_deletion(pod_state, T0 + elapsed, known_timeout, unknown_timeout)
    reported_busy = pod_state.slurm is not None and pod_state.slurm.known and pod_state.slurm.busy
    if reported_busy or not pod_state.slurm_known:
        # Busy, or unknown (fail closed): only a proof of no job, or the forced timeout.
        assert decision.verdict != "delete" or not reported_busy
    if decision.verdict == "forced-delete":
        assert pod_state.delete_reason == SCALING_DELETE
    if decision.verdict == "delete" and not pod_state.slurm_known:
        # Unknown Slurm state: deleted only when the pod never started, or (DOWN and
        # absence need a known state or the plan's absence check) never here; and a pod
        # a kubelet has is never proven to have not started without Slurm's word.
        assert pod_state.never_started and not pod_state.bound


# --- item 6: forced deletion is for scale-down only ---------------------------------------------


def test_rule_misscheduled_pod_has_its_own_reason_and_is_never_forced() -> None:
    node_map = nodes(2, claim=KEY)
    node_map["n1"] = node("n1", "10.0.1.2", claim=KEY, labels={"pool": "other"})
    spec = nodeset(
        replicas=2,
        extra={"forceScalingDeleteKnownConditionTimeout": 1},
        template_spec={
            "nodeSelector": {"kubernetes.io/hostname": "n0"},
            "containers": [{"name": "slurmd", "image": "slurmd:24.11"}],
        },
    )
    pods = [pod("gpu-001-001", "n0", revision="x"), pod("gpu-001-002", "n1", revision="x")]
    states = busy_states(pods, busy=True)
    result = plan(view(spec, node_map, pods, states))
    assert scheduled(result, MISSCHEDULED_DELETE) == ["gpu-001-002"]
    pods[1] = pod(
        "gpu-001-002", "n1", revision="x", delete_reason=MISSCHEDULED_DELETE, delete_since=T0
    )
    later = plan(view(spec, node_map, pods, states, now=T0 + 10_000))
    assert of(later, DeletePod) == []
    # Drained and idle: deleted safely.
    states["gpu-001-002"] = slurm("gpu-001-002", drain=True)
    drained = plan(view(spec, node_map, pods, states, now=T0 + 10_000))
    assert [(d.pod.name, d.forced) for d in of(drained, DeletePod)] == [("gpu-001-002", False)]


def test_rule_misscheduled_mark_is_cancelled_when_the_pod_fits_its_node_again() -> None:
    node_map, pods = full(2)
    pods[1] = pod("gpu-001-002", "n1", revision=REV, delete_reason=MISSCHEDULED_DELETE)
    states = busy_states(pods, busy=True)
    result = plan(view(nodeset(replicas=2), node_map, pods, states))
    assert names(of(result, CancelDelete)) == ["gpu-001-002"]
    assert of(result, DeletePod) == []


def test_rule_rolling_mark_picked_for_scale_down_becomes_a_scale_down_with_its_timer() -> None:
    node_map, pods = outdated(3)
    pods[0] = pod(
        "gpu-001-001", "n0", revision="old", delete_reason=ROLLING_DELETE, delete_since=T0 - 999
    )
    states = busy_states(pods, busy=True)
    states["gpu-001-001"] = slurm("gpu-001-001", busy=True, drain=True)  # rank 5: first
    spec = nodeset(replicas=2, extra={"forceScalingDeleteKnownConditionTimeout": 60})
    result = plan(view(spec, node_map, pods, states))
    assert scheduled(result, SCALING_DELETE) == ["gpu-001-001"]
    assert of(result, DeletePod) == []  # a rolling mark is never forced
    # Once the reason is ScalingDeleteScheduled, its timer (from the re-mark) applies.
    pods[0] = pod(
        "gpu-001-001", "n0", revision="old", delete_reason=SCALING_DELETE, delete_since=T0
    )
    assert of(plan(view(spec, node_map, pods, states, now=T0 + 59)), DeletePod) == []
    forced = of(plan(view(spec, node_map, pods, states, now=T0 + 60)), DeletePod)
    assert [(d.pod.name, d.forced) for d in forced] == [("gpu-001-001", True)]


# --- item 7: scale-down and rollout together ----------------------------------------------------


def test_rule_scale_down_and_rollout_together_one_scaling_and_one_rolling() -> None:
    node_map, pods = outdated(4)
    states = busy_states(pods, busy=True)
    result = plan(view(nodeset(replicas=3, max_unavailable=1), node_map, pods, states))
    scaling, rolling = scheduled(result, SCALING_DELETE), scheduled(result, ROLLING_DELETE)
    assert len(scaling) == 1 and len(rolling) == 1 and scaling != rolling


def test_rule_pending_scale_down_deletion_counts_against_the_rolling_budget() -> None:
    # A scale-down mark on a pod that stays (fewer pods than marks, cancelled this round)
    # is still a pod pending deletion: the rollout waits for it.
    node_map, pods = outdated(3)
    pods[0] = pod("gpu-001-001", "n0", revision="old", delete_reason=SCALING_DELETE)
    states = busy_states(pods, busy=True)
    result = plan(view(nodeset(replicas=3, max_unavailable=1), node_map, pods, states))
    assert names(of(result, CancelDelete)) == ["gpu-001-001"]
    assert scheduled(result, ROLLING_DELETE) == []


# --- item 8: status counts ----------------------------------------------------------------------


def test_rule_status_drain_counts_drained_nodes_and_includes_misscheduled_pods() -> None:
    node_map = nodes(3, claim=KEY)
    node_map["n2"] = node("n2", "10.0.1.3", claim=KEY, labels={"pool": "other"})
    spec = nodeset(
        replicas=3,
        template_spec={
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {
                                "matchExpressions": [
                                    {"key": "pool", "operator": "DoesNotExist"},
                                ]
                            }
                        ]
                    }
                }
            },
            "containers": [{"name": "slurmd", "image": "slurmd:24.11"}],
        },
    )
    pods = [pod(f"gpu-001-00{i + 1}", f"n{i}") for i in range(3)]
    states = {
        "gpu-001-001": slurm("gpu-001-001", busy=True, drain=True),  # draining: not counted
        "gpu-001-002": slurm("gpu-001-002", drain=True),  # drained
        "gpu-001-003": slurm("gpu-001-003", drain=True),  # drained, misscheduled
    }
    states_busy_misscheduled = dict(states)
    result = plan(view(spec, node_map, pods, states))
    assert result.status is not None
    assert result.status["numberMisscheduled"] == 1
    assert result.status["numberDrain"] == 2
    assert result.status["numberRunning"] == 1
    states_busy_misscheduled["gpu-001-003"] = slurm("gpu-001-003", busy=True)
    busy = plan(view(spec, node_map, pods, states_busy_misscheduled))
    assert busy.status is not None and busy.status["numberRunning"] == 2


# --- item 16: the Terminating branch ------------------------------------------------------------


def test_rule_safe_deletion_terminating_pod_is_not_deleted_again() -> None:
    terminating = state(
        pod("p", "n", delete_reason=SCALING_DELETE, terminating=True), slurm("p", drain=True)
    )
    decision = decide_deletion(terminating, T0 + 10**6, 1, 1)
    assert decision.verdict == "wait" and decision.reason == "Terminating"
    node_map, pods = full(2)
    pods[1] = pod("gpu-001-002", "n1", revision=REV, delete_reason=SCALING_DELETE, terminating=True)
    result = plan(view(nodeset(replicas=1), node_map, pods, busy_states(pods, drain=True)))
    assert of(result, DeletePod) == []


@st.composite
def clusters(draw: st.DrawFn) -> tuple[Any, dict[str, SlurmNodeState], bool]:
    count = draw(st.integers(min_value=1, max_value=5))
    node_map = nodes(count, claim=KEY)
    pods: list[dict[str, Any]] = []
    states: dict[str, SlurmNodeState] = {}
    for i in range(count):
        name = f"gpu-001-{i + 1:03d}"
        if draw(st.booleans()) and f"n{i}" in node_map and i % 2:
            del node_map[f"n{i}"]  # missing from the view
        phase = draw(st.sampled_from(["Running", "Pending", "Succeeded", None]))
        pods.append(
            pod(
                name,
                f"n{i}",
                revision=draw(st.sampled_from([REV, "old"])),
                ready=draw(st.booleans()),
                phase=phase or "Running",
                phase_missing=phase is None,
                delete_reason=draw(
                    st.sampled_from([None, SCALING_DELETE, ROLLING_DELETE, MISSCHEDULED_DELETE])
                ),
                delete_since=T0 - draw(st.sampled_from([0, 10, 1000])),
                not_registered_since=draw(st.sampled_from([None, T0 - 1000])),
            )
        )
        kind = draw(st.sampled_from(["busy", "idle", "drained", "draining", "down", "unknown"]))
        if draw(st.booleans()):
            states[name] = slurm(
                name,
                busy=kind in ("busy", "draining"),
                drain=kind in ("drained", "draining"),
                down=kind == "down",
                known=kind != "unknown",
            )
    spec = nodeset(
        replicas=draw(st.integers(min_value=0, max_value=count + 1)),
        max_unavailable=draw(st.sampled_from([1, 2, "50%"])),
        extra={
            "forceScalingDeleteKnownConditionTimeout": draw(st.sampled_from([0, 5])),
            "forceScalingDeleteUnknownConditionTimeout": draw(st.sampled_from([0, 5])),
        },
    )
    fresh = draw(st.booleans())
    return (spec, node_map, pods), states, fresh


@given(clusters())
def test_rule_no_pod_slurm_may_be_running_is_deleted_unless_forced_for_scale_down(
    cluster: tuple[Any, dict[str, SlurmNodeState], bool],
) -> None:
    (spec, node_map, pods), states, fresh = cluster
    status = cluster_status(last_success_at=T0) if fresh else None
    result = plan(view(spec, node_map, pods, states, status=status))
    raw = {p["metadata"]["name"]: p for p in pods}
    for delete in of(result, DeletePod):
        name = delete.pod.name
        phase = raw[name]["status"].get("phase")
        if delete.forced:
            assert raw[name]["status"]["conditions"][-1]["reason"] in (SCALING_DELETE,)
            continue
        if phase in ("Succeeded", "Failed", "Pending"):
            continue  # finished, or never started
        slurm_state = states.get(name)
        assert fresh, (name, delete.reason)
        assert slurm_state is None or not slurm_state.busy, (name, delete.reason)
        # Without a known state, only a long absence from a fresh, reachable cluster.
        if slurm_state is None or not slurm_state.known:
            assert slurm_state is None and delete.reason == "NodeNotRegistered"
