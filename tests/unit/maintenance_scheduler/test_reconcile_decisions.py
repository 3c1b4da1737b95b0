"""What a NodeMaintenance round tells on the decision stream (`kubectl nodeflow decisions`,
`why nodemaintenance`): each phase change, and why a request stopped or waits -- its node
not in the view, gone, or its spec invalid. Operators read these, not the code; each test
here was written for a decision `make mutate` found no test reading (docs/testing.md)."""

from __future__ import annotations

from typing import Any

from maintenance_scheduler.actions import PatchRequest
from maintenance_scheduler.api import FINALIZER
from maintenance_scheduler.reconcile import Step, reconcile_request
from tests.unit.maintenance_scheduler.builders import T0, nm, node_facts

NODE = node_facts("n1")


def decisions(step: Step) -> list[tuple[str, str, str, str]]:
    return [(d.kind, d.reason, d.message, d.node) for d in step.decisions]


def only(step: Step, kind: type[Any]) -> list[Any]:
    return [a for a in step.actions if isinstance(a, kind)]


def test_rule_a_phase_change_is_a_decision_naming_both_phases_and_the_message() -> None:
    step = reconcile_request(nm("r", "n1"), NODE, [], [], T0)
    assert decisions(step) == [("phase-changed", "Pending", "new -> Pending", "n1")]
    held = reconcile_request(
        nm("r", "n1", phase="Pending"), NODE, [], [], T0, waiting_for="no slot: 2 of 2"
    )
    # The message changed, not the phase: a status write, no phase-change decision.
    assert decisions(held) == []
    scheduled = nm("r", "n1", phase="Scheduled", finalizer=True)
    assert decisions(reconcile_request(scheduled, NODE, [], [], T0)) == [
        ("phase-changed", "Cordon", "Scheduled -> Cordon", "n1")
    ]


def test_rule_a_phase_change_with_a_message_carries_it() -> None:
    request = nm("r", "ghost", phase="Draining", finalizer=False)
    step = reconcile_request(request, None, [], [], T0, absent_past_grace=True)
    assert ("node-not-found", "NodeNotFound", "node ghost does not exist", "ghost") in decisions(
        step
    )
    # Its phase is kept: the status write says why it stopped, no phase change.
    assert [d for d in decisions(step) if d[0] == "phase-changed"] == []
    pending = reconcile_request(nm("r", "n1", requestor="x"), NODE, [], [], T0)
    (changed,) = [d for d in decisions(pending) if d[0] == "phase-changed"]
    assert changed[2].startswith("new -> Pending: invalid spec: ")


def test_rule_a_node_not_in_the_view_is_told_and_everything_kept() -> None:
    request = nm("r", "n1", phase="Draining", finalizer=True)
    step = reconcile_request(request, None, [], [], T0)
    assert step.actions == []
    ((kind, reason, message, node),) = decisions(step)
    assert (kind, reason, node) == ("node-not-found", "NodeNotInView", "n1")
    assert message == (
        "node n1 is not in the view (or has no uid there): cordon, slot and finalizer kept "
        "until it has been absent for the grace"
    )


def test_rule_a_gone_node_s_request_loses_its_finalizer_and_says_so() -> None:
    request = nm("r", "gone", phase="Draining", finalizer=True)
    step = reconcile_request(request, None, [], [], T0, absent_past_grace=True)
    (patch,) = only(step, PatchRequest)
    assert FINALIZER not in (patch.finalizers or ())
    assert decisions(step) == [
        (
            "finalizer-removed",
            "NodeNotFound",
            "node gone does not exist: nothing to clean up in phase Draining",
            "gone",
        )
    ]


def test_rule_an_invalid_spec_is_told_once_as_a_decision() -> None:
    step = reconcile_request(nm("r", "n1", requestor="x"), NODE, [], [], T0)
    invalid = [d for d in decisions(step) if d[0] == "invalid-spec"]
    assert len(invalid) == 1 and invalid[0][1] == "InvalidSpec"
    assert invalid[0][2].startswith("invalid spec: ")


def test_rule_an_invalid_pending_request_on_a_gone_node_says_its_spec_is_invalid() -> None:
    """The spec is judged before a Pending request's node: a gone node is told only to a
    request already in progress (which loses its finalizer first)."""
    request = nm("r", "gone", phase="Pending", requestor="x")
    step = reconcile_request(request, None, [], [], T0, absent_past_grace=True)
    assert [d[0] for d in decisions(step)] == ["invalid-spec"]


def test_rule_an_in_progress_request_without_a_finalizer_gets_one() -> None:
    """A request in progress from a release that set no finalizer, already owned by its
    node: the finalizer is added, so its cleanup (the uncordon) is never skipped."""
    request = nm("r", "n1", phase="Draining", finalizer=False)
    step = reconcile_request(request, NODE, [], [], T0)
    (patch,) = only(step, PatchRequest)
    assert patch.finalizers is not None and FINALIZER in patch.finalizers
    assert patch.owner_references is None


def test_rule_a_round_that_drains_nothing_has_no_drain_timeout() -> None:
    step = reconcile_request(nm("r", "n1", phase="Pending"), NODE, [], [], T0)
    assert step.drain_timed_out is False
    assert Step().drain_timed_out is False
