"""Projection of Slurm state onto pod conditions, and the patch that gets a pod there."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from clustersim.kube.patch import strategic_merge_patch
from nodeflow_contracts.pod_protocol import (
    SLURM_CLUSTER_UNREACHABLE_REASON,
    SLURM_NODE_UNREADABLE_REASON,
    SLURM_NOT_REGISTERED_REASON,
)
from nodeflow_contracts.slurm import BASE_STATES, FLAGS, SlurmNodeState
from nodeflow_kube.fields import rfc3339
from slurm_syncer.conditions import (
    ALL_CONDITION_TYPES,
    Wanted,
    cluster_unreachable,
    conditions_patch,
    desired_conditions,
    node_not_registered,
    patch_digest,
    unknown_because,
)
from slurm_syncer.nodestate import unknown_state

NOW = 1_800_000_000.0
UNKNOWN = "SlurmNodeStateUnknown"


def state(base: Any = "Idle", flags: tuple[str, ...] = (), reason: str = "") -> SlurmNodeState:
    return SlurmNodeState(
        cluster="a", name="n1", known=True, base_state=base, flags=flags, reason=reason
    )


def cond(
    kind: str,
    message: str = "",
    status: str = "True",
    at: str = "2020-01-01T00:00:00Z",
    reason: str | None = None,
) -> dict[str, str]:
    entry = {"type": kind, "status": status, "message": message, "lastTransitionTime": at}
    if reason is not None:
        entry["reason"] = reason
    return entry


def written(patch: dict[str, Any]) -> list[dict[str, Any]]:
    """The conditions a patch sets (its delete directives left out)."""
    return [entry for entry in patch["status"]["conditions"] if "$patch" not in entry]


def plain(desired: dict[str, Wanted]) -> dict[str, str]:
    return {kind: wanted.message for kind, wanted in desired.items()}


def test_exactly_one_base_condition_plus_one_per_flag_with_the_reason_as_message() -> None:
    desired = desired_conditions(
        state("Allocated", ("Drain", "Completing"), "slurm-operator: x"), Wanted("")
    )
    assert plain(desired) == {
        "SlurmNodeStateAllocated": "slurm-operator: x",
        "SlurmNodeStateDrain": "slurm-operator: x",
        "SlurmNodeStateCompleting": "slurm-operator: x",
    }
    assert all(wanted.reason == "" for wanted in desired.values())


def test_rule_an_unreadable_node_is_unknown_with_the_reason_why_never_idle() -> None:
    unreachable = unknown_because("a", "n1", reachable=False, state=None)
    assert desired_conditions(None, unreachable) == {UNKNOWN: unreachable}
    assert unreachable.reason == SLURM_CLUSTER_UNREACHABLE_REASON
    assert "cannot be reached" in unreachable.message
    absent = unknown_because("a", "n1", reachable=True, state=None)
    assert absent.reason == SLURM_NOT_REGISTERED_REASON == "NodeNotRegistered"
    assert "not registered" in absent.message
    garbled = unknown_because("a", "n1", reachable=True, state=unknown_state("a", "n1", 0))
    assert garbled.reason == SLURM_NODE_UNREADABLE_REASON
    assert desired_conditions(unknown_state("a", "n1", 0), garbled) == {UNKNOWN: garbled}


def test_rule_node_not_registered_keeps_its_transition_time_while_the_absence_lasts() -> None:
    """The controller measures the absence grace from lastTransitionTime: later polls that
    find the node still absent write nothing, and nothing moves the time."""
    absent = {UNKNOWN: node_not_registered("a", "n1")}
    first = conditions_patch([cond("SlurmNodeStateIdle")], absent, NOW)
    assert first is not None
    pod: dict[str, Any] = strategic_merge_patch({"status": {"conditions": []}}, first)
    (entry,) = pod["status"]["conditions"]
    assert entry["reason"] == SLURM_NOT_REGISTERED_REASON
    assert entry["lastTransitionTime"] == rfc3339(NOW)
    for later in (NOW + 5, NOW + 600):
        assert conditions_patch(pod["status"]["conditions"], absent, later) is None


def test_rule_a_new_unknown_cause_restarts_the_transition_time() -> None:
    """Unreachable then absent: the absence starts when the cluster answered without the
    node, not when it stopped answering (the grace is never shortened)."""
    unreachable = cond(UNKNOWN, "x", reason=SLURM_CLUSTER_UNREACHABLE_REASON)
    patch = conditions_patch([unreachable], {UNKNOWN: node_not_registered("a", "n1")}, NOW)
    assert patch is not None
    (entry,) = written(patch)
    assert entry["reason"] == SLURM_NOT_REGISTERED_REASON
    assert entry["lastTransitionTime"] == rfc3339(NOW)
    # A condition without a reason (written by an earlier version) is replaced the same way.
    patch = conditions_patch([cond(UNKNOWN, "x")], {UNKNOWN: cluster_unreachable("a")}, NOW)
    assert patch is not None and written(patch)[0]["lastTransitionTime"] == rfc3339(NOW)


def test_rule_a_reason_no_longer_wanted_is_cleared_not_left_behind() -> None:
    """Slurm itself may report UNKNOWN: the condition then has no reason, and the merge must
    not keep the NodeNotRegistered of before (or the pod would be patched on every pass)."""
    pod: dict[str, Any] = {
        "status": {"conditions": [cond(UNKNOWN, "x", reason=SLURM_NOT_REGISTERED_REASON)]}
    }
    desired = desired_conditions(state("Unknown"), Wanted("unused"))
    patch = conditions_patch(pod["status"]["conditions"], desired, NOW)
    assert patch is not None
    pod = strategic_merge_patch(pod, patch)
    assert conditions_patch(pod["status"]["conditions"], desired, NOW + 1) is None


def test_no_patch_when_the_pod_already_matches() -> None:
    pod = [cond("Ready"), cond("SlurmNodeStateIdle")]
    assert conditions_patch(pod, {"SlurmNodeStateIdle": Wanted("")}, NOW) is None


def test_new_conditions_are_added_and_every_other_type_of_the_prefix_removed() -> None:
    pod = [cond("Ready"), cond("SlurmNodeStateIdle"), cond("SlurmNodeStateMaintenance")]
    patch = conditions_patch(pod, {"SlurmNodeStateAllocated": Wanted("")}, NOW)
    assert patch is not None
    (added, *removed) = patch["status"]["conditions"]
    assert added == {
        "type": "SlurmNodeStateAllocated",
        "status": "True",
        "message": "",
        "reason": "",
        "lastTransitionTime": rfc3339(NOW),
    }
    assert removed == [
        {"$patch": "delete", "type": kind}
        for kind in sorted(set(ALL_CONDITION_TYPES) - {"SlurmNodeStateAllocated"})
    ]
    assert {"$patch": "delete", "type": "SlurmNodeStateIdle"} in removed
    assert {"$patch": "delete", "type": "SlurmNodeStateMaintenance"} in removed


def test_a_changed_message_keeps_the_transition_time_and_a_false_status_is_replaced() -> None:
    pod = [cond("SlurmNodeStateDrain", "old"), cond("SlurmNodeStateIdle", status="False")]
    desired = {"SlurmNodeStateDrain": Wanted("new"), "SlurmNodeStateIdle": Wanted("")}
    patch = conditions_patch(pod, desired, NOW)
    assert patch is not None
    drain, idle = written(patch)
    assert drain["message"] == "new" and drain["lastTransitionTime"] == "2020-01-01T00:00:00Z"
    assert idle["status"] == "True" and idle["lastTransitionTime"] == rfc3339(NOW)


def test_malformed_pod_conditions_are_ignored() -> None:
    patch = conditions_patch(["junk", {"type": 3}], {"SlurmNodeStateIdle": Wanted("")}, NOW)
    assert patch is not None and [e["type"] for e in written(patch)] == ["SlurmNodeStateIdle"]


def test_the_digest_ignores_timestamps() -> None:
    one = conditions_patch([], {"SlurmNodeStateIdle": Wanted("")}, NOW)
    two = conditions_patch([], {"SlurmNodeStateIdle": Wanted("")}, NOW + 100)
    other = conditions_patch([], {"SlurmNodeStateDown": Wanted("")}, NOW)
    assert one and two and other
    assert patch_digest(one) == patch_digest(two) != patch_digest(other)


def shown_conditions(pod: dict[str, Any]) -> dict[str, Wanted]:
    return {
        c["type"]: Wanted(c["message"], c.get("reason") or "")
        for c in pod["status"]["conditions"]
        if c["type"].startswith("SlurmNodeState")
    }


known_states = st.builds(
    lambda base, flags, reason: state(base, tuple(sorted(flags)), reason),
    st.sampled_from(BASE_STATES),
    st.sets(st.sampled_from(FLAGS)),
    st.sampled_from(["", "slurm-operator: cordon: a", "admin"]),
)
# (state, reachable): None is a node the poll did not return.
readings = st.one_of(
    st.tuples(known_states, st.just(True)),
    st.tuples(st.sampled_from([None, unknown_state("a", "n1", 0)]), st.booleans()),
)


@given(history=st.lists(readings, min_size=1, max_size=4))
def test_the_patch_takes_any_pod_to_exactly_the_desired_conditions(
    history: list[tuple[SlurmNodeState | None, bool]],
) -> None:
    pod: dict[str, Any] = {"status": {"conditions": [cond("Ready")]}}
    for current, reachable in history:
        desired = desired_conditions(current, unknown_because("a", "n1", reachable, current))
        patch = conditions_patch(pod["status"]["conditions"], desired, NOW)
        if patch is not None:
            pod = strategic_merge_patch(pod, patch)
        shown = shown_conditions(pod)
        assert shown == desired
        assert conditions_patch(pod["status"]["conditions"], desired, NOW) is None
        assert any(c["type"] == "Ready" for c in pod["status"]["conditions"])
        bases = [k for k in shown if k.removeprefix("SlurmNodeState") in BASE_STATES]
        assert len(bases) == 1


def pod_showing(reading: tuple[SlurmNodeState | None, bool]) -> dict[str, Any]:
    """A pod whose conditions are what the syncer writes for `reading`, beside kubelet's."""
    current, reachable = reading
    desired = desired_conditions(current, unknown_because("a", "n1", reachable, current))
    patch = conditions_patch([], desired, NOW)
    assert patch is not None
    pod: dict[str, Any] = strategic_merge_patch({"status": {"conditions": [cond("Ready")]}}, patch)
    return pod


@given(seen=readings, actual=readings, target=readings)
def test_rule_a_patch_depends_on_the_state_it_aims_at_not_on_the_view_it_came_from(
    seen: tuple[SlurmNodeState | None, bool],
    actual: tuple[SlurmNodeState | None, bool],
    target: tuple[SlurmNodeState | None, bool],
) -> None:
    """Minimal writes under lag: the syncer's view of a pod trails the patches in flight.
    A patch computed from a stale view (`seen`) lands on a pod that shows something else
    (`actual`) and still leaves it exactly at the state aimed at; and patches toward one
    state from different views are one change (one digest: sent once)."""
    state, reachable = target
    desired = desired_conditions(state, unknown_because("a", "n1", reachable, state))
    from_stale = conditions_patch(pod_showing(seen)["status"]["conditions"], desired, NOW)
    from_actual = conditions_patch(pod_showing(actual)["status"]["conditions"], desired, NOW)
    from_empty = conditions_patch([], desired, NOW)
    assert from_empty is not None
    if from_stale is not None:
        landed = strategic_merge_patch(pod_showing(actual), from_stale)
        assert shown_conditions(landed) == desired
        assert any(c["type"] == "Ready" for c in landed["status"]["conditions"])
        assert patch_digest(from_stale) == patch_digest(from_empty)
    if from_actual is not None:
        assert patch_digest(from_actual) == patch_digest(from_empty)
