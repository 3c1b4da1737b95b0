"""Projection of Slurm state onto pod conditions, and the patch that gets a pod there."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from clustersim.kube.patch import strategic_merge_patch
from nodeflow_contracts.slurm import BASE_STATES, FLAGS, SlurmNodeState
from slurm_syncer.conditions import (
    conditions_patch,
    desired_conditions,
    patch_digest,
    rfc3339,
)
from slurm_syncer.nodestate import unknown_state

NOW = 1_800_000_000.0


def state(base: Any = "Idle", flags: tuple[str, ...] = (), reason: str = "") -> SlurmNodeState:
    return SlurmNodeState(
        cluster="a", name="n1", known=True, base_state=base, flags=flags, reason=reason
    )


def cond(
    kind: str, message: str = "", status: str = "True", at: str = "2020-01-01T00:00:00Z"
) -> dict[str, str]:
    return {"type": kind, "status": status, "message": message, "lastTransitionTime": at}


def test_exactly_one_base_condition_plus_one_per_flag_with_the_reason_as_message() -> None:
    desired = desired_conditions(state("Allocated", ("Drain", "Completing"), "nodeflow: x"), "")
    assert desired == {
        "SlurmNodeStateAllocated": "nodeflow: x",
        "SlurmNodeStateDrain": "nodeflow: x",
        "SlurmNodeStateCompleting": "nodeflow: x",
    }


def test_an_unreadable_node_is_unknown_never_idle() -> None:
    assert desired_conditions(None, "cluster a cannot be reached") == {
        "SlurmNodeStateUnknown": "cluster a cannot be reached"
    }
    assert desired_conditions(unknown_state("a", "n1", 0), "why") == {
        "SlurmNodeStateUnknown": "why"
    }


def test_no_patch_when_the_pod_already_matches() -> None:
    pod = [cond("Ready"), cond("SlurmNodeStateIdle")]
    assert conditions_patch(pod, {"SlurmNodeStateIdle": ""}, NOW) is None


def test_new_conditions_are_added_and_stale_ones_removed() -> None:
    pod = [cond("Ready"), cond("SlurmNodeStateIdle"), cond("SlurmNodeStateMaintenance")]
    patch = conditions_patch(pod, {"SlurmNodeStateAllocated": ""}, NOW)
    assert patch == {
        "status": {
            "conditions": [
                {
                    "type": "SlurmNodeStateAllocated",
                    "status": "True",
                    "message": "",
                    "lastTransitionTime": rfc3339(NOW),
                },
                {"$patch": "delete", "type": "SlurmNodeStateIdle"},
                {"$patch": "delete", "type": "SlurmNodeStateMaintenance"},
            ]
        }
    }


def test_a_changed_message_keeps_the_transition_time_and_a_false_status_is_replaced() -> None:
    pod = [cond("SlurmNodeStateDrain", "old"), cond("SlurmNodeStateIdle", status="False")]
    patch = conditions_patch(pod, {"SlurmNodeStateDrain": "new", "SlurmNodeStateIdle": ""}, NOW)
    assert patch is not None
    drain, idle = patch["status"]["conditions"]
    assert drain["message"] == "new" and drain["lastTransitionTime"] == "2020-01-01T00:00:00Z"
    assert idle["status"] == "True" and idle["lastTransitionTime"] == rfc3339(NOW)


def test_malformed_pod_conditions_are_ignored() -> None:
    patch = conditions_patch(["junk", {"type": 3}], {"SlurmNodeStateIdle": ""}, NOW)
    assert patch is not None and len(patch["status"]["conditions"]) == 1


def test_the_digest_ignores_timestamps() -> None:
    one = conditions_patch([], {"SlurmNodeStateIdle": ""}, NOW)
    two = conditions_patch([], {"SlurmNodeStateIdle": ""}, NOW + 100)
    other = conditions_patch([], {"SlurmNodeStateDown": ""}, NOW)
    assert one and two and other
    assert patch_digest(one) == patch_digest(two) != patch_digest(other)


states = st.builds(
    lambda base, flags, reason: state(base, tuple(sorted(flags)), reason),
    st.sampled_from(BASE_STATES),
    st.sets(st.sampled_from(FLAGS)),
    st.sampled_from(["", "nodeflow: cordon: a", "admin"]),
)


@given(before=states, after=states)
def test_the_patch_takes_any_pod_to_exactly_the_desired_conditions(
    before: SlurmNodeState, after: SlurmNodeState
) -> None:
    pod: dict[str, Any] = {"status": {"conditions": [cond("Ready")]}}
    for current in (before, after):
        desired = desired_conditions(current, "")
        patch = conditions_patch(pod["status"]["conditions"], desired, NOW)
        if patch is not None:
            pod = strategic_merge_patch(pod, patch)
        shown = {
            c["type"]: c["message"]
            for c in pod["status"]["conditions"]
            if c["type"].startswith("SlurmNodeState")
        }
        assert shown == desired
        assert conditions_patch(pod["status"]["conditions"], desired, NOW) is None
        assert any(c["type"] == "Ready" for c in pod["status"]["conditions"])
        bases = [k for k in shown if k.removeprefix("SlurmNodeState") in BASE_STATES]
        assert len(bases) == 1
