"""Rule 8b (issue 35 item 1): each pod the NodeSet wants gone and cannot remove yet says why on
itself, where `kubectl describe pod` looks: the condition `nodeflow.dev/DeleteWaiting`, True,
reason the cause (`WaitCause`), message what it waits for. Written only when the cause or its
words change (issue 36: no write that changes nothing), only on pods that wait (a pod deleted at
once gets none), in the mark's own patch for a pod marked now, and removed once the pod waits no
longer."""

from __future__ import annotations

from typing import Any

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from k8s_watcher.policy import Allowed, Refused, authorize
from nodeflow_contracts.pod_protocol import (
    POD_WAIT_CONDITION,
    ROLLING_DELETE,
    SCALING_DELETE,
    SLURM_DELETE_CONDITION,
)
from nodeflow_kube.fields import rfc3339
from nodeset_controller.commands import action_blockers, pod_slot, pod_wait_slot, to_outgoing
from nodeset_controller.objects import nodeset_pod_fields
from nodeset_controller.planner import (
    CancelDelete,
    DeletePod,
    Plan,
    ScheduleDelete,
    SetPodWait,
    plan,
)
from tests.unit.nodeset_controller.builders import (
    NS,
    T0,
    cluster_status,
    node,
    nodeset,
    pod,
    slurm,
)
from tests.unit.nodeset_controller.memory_cluster import _apply_condition_patch
from tests.unit.nodeset_controller.test_planner import KEY, REV, full, of, patch_of, view

BUSY = "node busy with jobs: deleted once they end and Slurm reads the node drained and idle"


def with_wait(pod_obj: dict[str, Any], reason: str, message: str) -> dict[str, Any]:
    """`pod_obj` carrying the wait condition as the controller writes it."""
    pod_obj["status"]["conditions"].append(
        {
            "type": POD_WAIT_CONDITION,
            "status": "True",
            "reason": reason,
            "message": message,
            "lastTransitionTime": rfc3339(T0 - 60),
        }
    )
    return pod_obj


def _waits_of(pods: list[dict[str, Any]]) -> dict[str, tuple[str, str]]:
    found = {}
    for p in pods:
        for c in p["status"]["conditions"]:
            if c["type"] == POD_WAIT_CONDITION:
                found[p["metadata"]["name"]] = (c["reason"], c["message"])
    return found


def _busy_marked() -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, Any]]:
    """Three pods, scaled down to two: gpu-001-003 is marked and its node runs jobs."""
    node_map, pods = full(3)
    pods[2] = pod("gpu-001-003", "n2", revision=REV, delete_reason=SCALING_DELETE)
    states = {p["metadata"]["name"]: slurm(p["metadata"]["name"]) for p in pods}
    states["gpu-001-003"] = slurm("gpu-001-003", busy=True, drain=True)
    return node_map, pods, states


def test_rule_8b_a_busy_pod_held_by_the_scale_down_gets_its_own_wait_condition() -> None:
    node_map, pods, states = _busy_marked()
    result = plan(view(nodeset(replicas=2), node_map, pods, states))
    (write,) = of(result, SetPodWait)
    assert write.pod.name == "gpu-001-003"
    assert result.nodeset is not None
    out = to_outgoing(result.nodeset, write, T0)
    assert out.command.target.uid == "uid-gpu-001-003"
    assert out.command.operation.subresource == "status"  # type: ignore[union-attr]
    assert patch_of(out.command.operation) == {
        "status": {
            "conditions": [
                {
                    "type": POD_WAIT_CONDITION,
                    "status": "True",
                    "reason": "PodsBusy",
                    "message": BUSY,
                    "lastTransitionTime": rfc3339(T0),
                }
            ]
        }
    }
    # It never races the pod's own mark, unmark or delete: it waits for them (and they for it).
    assert out.also_blocked_by == (pod_slot(NS, "gpu-001-003"),)
    assert out.slot == pod_wait_slot(NS, "gpu-001-003")


def test_rule_8b_no_write_while_the_pod_already_says_why_it_waits() -> None:
    """Ten minutes on, the pod still busy and already carrying its cause: nothing to write."""
    node_map, pods, states = _busy_marked()
    with_wait(pods[2], "PodsBusy", BUSY)
    result = plan(view(nodeset(replicas=2), node_map, pods, states, now=T0 + 600))
    assert of(result, SetPodWait) == []
    # The cause changes (the Slurm state can no longer be read): one write, with the new one.
    states["gpu-001-003"] = slurm("gpu-001-003", known=False)
    (write,) = of(plan(view(nodeset(replicas=2), node_map, pods, states)), SetPodWait)
    assert write.wait is not None and write.wait.reason == "SlurmStateUnknown"
    assert "Slurm state unknown" in write.wait.message


def test_rule_8b_a_pod_marked_by_this_plan_gets_its_wait_in_the_marks_own_patch() -> None:
    """A busy pod chosen for the scale-down now: one patch sets SlurmDelete and its wait; no
    second write."""
    node_map, pods = full(3)
    states = {p["metadata"]["name"]: slurm(p["metadata"]["name"], busy=True) for p in pods}
    result = plan(view(nodeset(replicas=2), node_map, pods, states))
    assert of(result, SetPodWait) == []
    (mark,) = of(result, ScheduleDelete)
    assert result.nodeset is not None
    conditions = patch_of(to_outgoing(result.nodeset, mark, T0).command.operation)["status"][  # type: ignore[index]
        "conditions"
    ]
    assert [c["type"] for c in conditions] == [SLURM_DELETE_CONDITION, POD_WAIT_CONDITION]
    assert (conditions[1]["reason"], conditions[1]["message"]) == ("PodsBusy", BUSY)
    # The mark waits for a wait write still in flight, so the newer one lands last.
    assert action_blockers(NS, mark) == (pod_wait_slot(NS, mark.pod.name),)


def test_rule_8b_the_drain_handshake_costs_no_write_of_its_own_issue_36() -> None:
    """An idle pod scaled down: its mark says DrainPending. slurm-syncer drains it and the
    node state arrives before a Slurm poll read after the mark (AwaitingSlurmRead on the
    NodeSet): the pod's wait is the same and nothing is written; the next poll deletes it.
    A busy pod whose node starts draining keeps its words too (SlurmNodeStateDrain says it)."""
    node_map, pods = full(2)
    states = {p["metadata"]["name"]: slurm(p["metadata"]["name"]) for p in pods}
    (mark,) = of(plan(view(nodeset(replicas=1), node_map, pods, states)), ScheduleDelete)
    assert mark.wait is not None and mark.wait.reason == "DrainPending"
    name = mark.pod.name
    index = [p["metadata"]["name"] for p in pods].index(name)
    marked = pod(name, f"n{index}", revision=REV, delete_reason=SCALING_DELETE, delete_since=T0)
    pods[index] = with_wait(marked, mark.wait.reason, mark.wait.message)
    states[name] = slurm(name, drain=True)
    # The last poll was read before the mark: the drain seen proves nothing yet.
    before_mark = cluster_status(last_success_at=T0 - 1)
    waiting = plan(view(nodeset(replicas=1), node_map, pods, states, status=before_mark))
    assert [(w.pod, w.cause) for w in waiting.scale_down_waits] == [(name, "AwaitingSlurmRead")]
    assert of(waiting, SetPodWait) == []
    later = plan(view(nodeset(replicas=1), node_map, pods, states, now=T0 + 5))
    assert [a.pod.name for a in of(later, DeletePod)] == [name]
    # Busy, then draining: the same words on the pod.
    node_map, pods, states = _busy_marked()
    states["gpu-001-003"] = slurm("gpu-001-003", busy=True)
    with_wait(pods[2], "PodsBusy", BUSY)
    assert of(plan(view(nodeset(replicas=2), node_map, pods, states)), SetPodWait) == []


def test_rule_8b_a_pod_deleted_at_once_gets_no_wait_condition() -> None:
    node_map, pods = full(2)
    pods[1] = pod(
        "gpu-001-002", "n1", revision=REV, delete_reason=SCALING_DELETE, delete_since=T0 - 30
    )
    states = {
        "gpu-001-001": slurm("gpu-001-001"),
        "gpu-001-002": slurm("gpu-001-002", drain=True),
    }
    result = plan(view(nodeset(replicas=1), node_map, pods, states))
    (delete,) = of(result, DeletePod)
    assert delete.pod.name == "gpu-001-002"
    assert of(result, SetPodWait) == []


def test_rule_8b_a_scale_back_up_removes_the_wait_in_the_unmark_patch() -> None:
    node_map, pods, states = _busy_marked()
    with_wait(pods[2], "PodsBusy", BUSY)
    result = plan(view(nodeset(replicas=3), node_map, pods, states))
    (cancel,) = of(result, CancelDelete)
    assert of(result, SetPodWait) == []
    assert result.nodeset is not None
    assert patch_of(to_outgoing(result.nodeset, cancel, T0).command.operation) == {
        "status": {
            "conditions": [
                {"type": SLURM_DELETE_CONDITION, "$patch": "delete"},
                {"type": POD_WAIT_CONDITION, "$patch": "delete"},
            ]
        }
    }


def test_rule_8b_a_pod_that_waits_no_longer_has_its_condition_removed() -> None:
    """A pod held by maxUnavailable whose template is back (a rollback): it is up to date and
    waits for nothing, so its condition goes."""
    node_map, pods = full(2)
    with_wait(pods[1], "BudgetExhausted", "held by maxUnavailable (1): ...")
    states = {p["metadata"]["name"]: slurm(p["metadata"]["name"]) for p in pods}
    result = plan(view(nodeset(replicas=2), node_map, pods, states))
    (write,) = of(result, SetPodWait)
    assert write.pod.name == "gpu-001-002" and write.wait is None
    assert result.nodeset is not None
    assert patch_of(to_outgoing(result.nodeset, write, T0).command.operation) == {
        "status": {"conditions": [{"type": POD_WAIT_CONDITION, "$patch": "delete"}]}
    }


def test_rule_8b_pods_held_by_max_unavailable_name_the_budget() -> None:
    node_map, pods = full(3, revision="old")
    pods[0] = pod("gpu-001-001", "n0", revision=REV, ready=False)
    states = {p["metadata"]["name"]: slurm(p["metadata"]["name"]) for p in pods}
    result = plan(view(nodeset(replicas=3, max_unavailable=1), node_map, pods, states))
    writes = {w.pod.name: w.wait for w in of(result, SetPodWait)}
    assert set(writes) == {"gpu-001-002", "gpu-001-003"}
    for wait in writes.values():
        assert wait is not None and wait.reason == "BudgetExhausted"
        assert wait.message == (
            "held by maxUnavailable (1): replaced as the pods ahead of it come back available"
        )


def test_rule_8b_a_misscheduled_pod_waiting_for_its_drain_says_so() -> None:
    """Named by neither NodeSet condition (rule 8a covers scale-down and rollout), the pod
    that must leave its node still says what it waits for."""
    node_map, pods = full(2)
    node_map["n1"] = node(
        "n1", "10.0.1.2", claim=KEY, taints=[{"key": "broken", "effect": "NoExecute"}]
    )
    pods[1] = pod(
        "gpu-001-002",
        "n1",
        revision=REV,
        delete_reason="MisscheduledDeleteScheduled",
        delete_since=T0 - 30,
    )
    states = {
        "gpu-001-001": slurm("gpu-001-001"),
        "gpu-001-002": slurm("gpu-001-002", busy=True, drain=True),
    }
    (write,) = of(plan(view(nodeset(replicas=2), node_map, pods, states)), SetPodWait)
    assert write.wait is not None and (write.wait.reason, write.wait.message) == (
        "PodsBusy",
        BUSY,
    )


def _apply(result: Plan, pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The pods once every pod change of `result` landed (the memory cluster's merge)."""
    assert result.nodeset is not None
    deleted = {a.pod.name for a in of(result, DeletePod)}
    by_name = {p["metadata"]["name"]: p for p in pods if p["metadata"]["name"] not in deleted}
    for action in result.actions:
        if isinstance(action, ScheduleDelete | CancelDelete | SetPodWait) and (
            action.pod.name in by_name
        ):
            out = to_outgoing(result.nodeset, action, T0)
            target = by_name[action.pod.name]
            _apply_condition_patch(target, patch_of(out.command.operation))
            target["metadata"]["resourceVersion"] += "1"
    return list(by_name.values())


@settings(max_examples=60, deadline=None)
@given(
    replicas=st.integers(min_value=0, max_value=4),
    outdated=st.lists(st.booleans(), min_size=4, max_size=4),
    marked=st.lists(
        st.sampled_from([None, SCALING_DELETE, ROLLING_DELETE]), min_size=4, max_size=4
    ),
    slurm_kinds=st.lists(
        st.sampled_from(["idle", "busy", "drained", "draining", "unknown"]), min_size=4, max_size=4
    ),
)
def test_rule_8b_waits_are_written_once_and_only_on_pods_that_wait(
    replicas: int,
    outdated: list[bool],
    marked: list[str | None],
    slurm_kinds: list[str],
) -> None:
    """Whatever the pods: a wait is written only where it changes the pod, never on a pod
    deleted in the same plan; once the plan's pod changes land, planning again at the same
    time writes nothing more, and every pod the NodeSet conditions name carries its cause."""
    node_map, pods = full(4)
    shapes: dict[str, dict[str, bool]] = {
        "idle": {},
        "busy": {"busy": True},
        "drained": {"drain": True},
        "draining": {"busy": True, "drain": True},
        "unknown": {"known": False},
    }
    states = {}
    for index in range(4):
        name = f"gpu-001-{index + 1:03d}"
        pods[index] = pod(
            name,
            f"n{index}",
            revision="old" if outdated[index] else REV,
            delete_reason=marked[index],
            delete_since=T0 - 30 if marked[index] else None,
        )
        states[name] = slurm(name, **shapes[slurm_kinds[index]])
    spec = nodeset(replicas=replicas, max_unavailable=1)
    first = plan(view(spec, node_map, pods, states))
    deleted = {a.pod.name for a in of(first, DeletePod)}
    before = _waits_of(pods)
    for action in first.actions:
        if isinstance(action, ScheduleDelete | CancelDelete) and action.pod.name in deleted:
            assert action.wait is None
    for write in of(first, SetPodWait):
        assert write.pod.name not in deleted
        wanted = None if write.wait is None else (write.wait.reason, write.wait.message)
        assert before.get(write.pod.name) != wanted
    landed = _apply(first, pods)
    again = plan(view(spec, node_map, landed, states))
    assert of(again, SetPodWait) == []
    named = {w.pod for w in [*again.scale_down_waits, *again.rollout_waits]}
    assert named <= set(_waits_of(landed))


def test_rule_8b_the_view_keeps_the_wait_condition_so_a_written_cause_is_not_rewritten() -> None:
    """The controller's view of a NodeSet pod keeps the wait condition: without it every plan
    would find the cause missing and write it again."""
    node_map, pods, states = _busy_marked()
    with_wait(pods[2], "PodsBusy", BUSY)
    kept = [nodeset_pod_fields(p) for p in pods]
    assert _waits_of(kept) == {"gpu-001-003": ("PodsBusy", BUSY)}
    assert of(plan(view(nodeset(replicas=2), node_map, kept, states)), SetPodWait) == []


def test_rule_8b_k8s_watcher_lets_the_controller_alone_write_the_wait_condition() -> None:
    """The commands the plan makes pass k8s-watcher's policy (a mark carrying the wait, the
    wait alone, its removal); slurm-syncer may not write it."""
    node_map, pods, states = _busy_marked()
    result = plan(view(nodeset(replicas=2), node_map, pods, states))
    assert result.nodeset is not None
    (write,) = of(result, SetPodWait)
    command = to_outgoing(result.nodeset, write, T0).command
    assert authorize(command, command.subject) == Allowed()
    node_map, pods = full(3)
    busy = {p["metadata"]["name"]: slurm(p["metadata"]["name"], busy=True) for p in pods}
    (mark,) = of(plan(view(nodeset(replicas=2), node_map, pods, busy)), ScheduleDelete)
    command = to_outgoing(result.nodeset, mark, T0).command
    assert authorize(command, command.subject) == Allowed()
    by_syncer = msgspec.structs.replace(
        to_outgoing(result.nodeset, write, T0).command, sender="slurm-syncer"
    )
    assert isinstance(authorize(by_syncer, by_syncer.subject), Refused)
