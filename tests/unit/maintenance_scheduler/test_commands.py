"""Actions -> k8s-watcher commands: keys from state, preconditions, order, only allowed ops."""

from __future__ import annotations

from k8s_watcher.policy import Allowed, authorize
from maintenance_scheduler.actions import (
    Action,
    ConfigEvent,
    CordonNode,
    Decision,
    DeleteRequest,
    Event,
    EvictPod,
    PatchRequest,
    SetStatus,
    UncordonNode,
)
from maintenance_scheduler.api import DRAIN_START_ANNOTATION
from maintenance_scheduler.commands import SENDER, commands_for, decision_message
from nodeflow_contracts import k8s
from nodeflow_contracts.pod_protocol import NODE_CORDON_REASON_ANNOTATION
from tests.unit.maintenance_scheduler.builders import T0, nm, pod

REQUEST = nm("r", "n1", phase="Draining", finalizer=True, rv="42")


def test_rule_same_state_same_idempotency_key() -> None:
    action = SetStatus(REQUEST, {"conditions": []})
    first = commands_for(action, T0)[0]
    again = commands_for(action, T0 + 100)[0]
    assert first.idempotency_key == again.idempotency_key
    newer = nm("r", "n1", phase="Draining", finalizer=True, rv="43")
    assert commands_for(SetStatus(newer, {"conditions": []}), T0)[0].idempotency_key != (
        first.idempotency_key
    )


def test_rule_a_time_recorded_again_on_the_same_version_is_the_same_command() -> None:
    """A start time not yet on the object is decided again each round, a moment later: one
    command per version of the object, not one per round (a refused record resent for ever)."""
    first = PatchRequest(REQUEST, annotations={DRAIN_START_ANNOTATION: "2026-01-01T00:00:00Z"})
    later = PatchRequest(REQUEST, annotations={DRAIN_START_ANNOTATION: "2026-01-01T00:00:07Z"})
    [one], [two] = commands_for(first, T0), commands_for(later, T0 + 7)
    assert one.idempotency_key == two.idempotency_key
    assert isinstance(two.operation, k8s.PatchObject)
    assert two.operation.patch["metadata"]["annotations"][DRAIN_START_ANNOTATION].endswith("07Z")
    other = PatchRequest(REQUEST, annotations={"a": "b"})
    assert commands_for(other, T0)[0].idempotency_key != one.idempotency_key


def test_rule_request_writes_carry_uid_and_resource_version() -> None:
    for action in (
        SetStatus(REQUEST, {}),
        PatchRequest(REQUEST, annotations={"a": "b"}),
    ):
        [command] = commands_for(action, T0)
        assert command.target.uid == "uid-r"
        assert command.target.resource_version == "42"
        assert command.sender == SENDER


def test_rule_cordon_names_the_maintenance_before_cordoning() -> None:
    action = CordonNode(REQUEST, "n1", "uid-n1", "7", "NodeMaintenance default/r (requestor x)")
    annotate, cordon = commands_for(action, T0)
    assert isinstance(annotate.operation, k8s.PatchObject)
    assert annotate.operation.patch == {
        "metadata": {"annotations": {NODE_CORDON_REASON_ANNOTATION: action.reason}}
    }
    assert isinstance(cordon.operation, k8s.CordonNode)
    # One node's commands apply in the order sent.
    assert annotate.target.ordering_key == cordon.target.ordering_key


def test_rule_uncordon_clears_only_our_reason() -> None:
    ours = commands_for(UncordonNode(REQUEST, "n1", "uid-n1", "7", clear_reason=True), T0)
    assert [c.op for c in ours] == ["uncordon", "patch"]
    theirs = commands_for(UncordonNode(REQUEST, "n1", "uid-n1", "7", clear_reason=False), T0)
    assert [c.op for c in theirs] == ["uncordon"]


def test_rule_eviction_key_is_the_pod_and_attempt() -> None:
    action = EvictPod(REQUEST, pod("a"))
    [first] = commands_for(action, T0)
    assert first.idempotency_key == "maint:evict:uid-a:0"
    assert first.target.uid == "uid-a"
    [retry] = commands_for(action, T0, eviction_attempt=1)
    assert retry.idempotency_key != first.idempotency_key


def test_rule_only_the_policy_ops_are_used() -> None:
    actions: list[Action] = [
        SetStatus(REQUEST, {}),
        PatchRequest(REQUEST, finalizers=()),
        CordonNode(REQUEST, "n1", "u", "1", "why"),
        UncordonNode(REQUEST, "n1", "u", "1", clear_reason=True),
        EvictPod(REQUEST, pod("a")),
        Event(REQUEST, "ConditionChanged", "Ready"),
        DeleteRequest(REQUEST),
    ]
    ops = {c.op for a in actions for c in commands_for(a, T0)}
    allowed = {"update-status", "patch", "cordon", "uncordon", "evict", "record-event", "delete"}
    assert ops == allowed
    assert all(c.subject.startswith("cmd.k8s.v1.") for a in actions for c in commands_for(a, T0))


def test_rule_decision_subject_names_the_request() -> None:
    decision = decision_message(Decision(REQUEST, "evict", "Evict", "evict pod default/a"), T0)
    assert decision.subject == "maintenance.v1.nodemaintenance.default.r.decision"
    assert decision.requestor == REQUEST.requestor_id


def test_rule_the_config_warning_is_one_event_per_config_version_the_policy_allows() -> None:
    warning = ConfigEvent(
        "nodeflow-system", "default", "uid-c", "7", "UnlimitedParallelOperations", "why", "Warning"
    )
    (command,) = commands_for(warning, T0)
    assert command.op == "record-event"
    assert (command.target.kind, command.target.name) == ("MaintenanceOperatorConfig", "default")
    assert isinstance(command.operation, k8s.RecordEvent)
    assert command.operation.type == "Warning"
    assert commands_for(warning, T0 + 60)[0].idempotency_key == command.idempotency_key
    newer = ConfigEvent(
        "nodeflow-system", "default", "uid-c", "8", "UnlimitedParallelOperations", "why"
    )
    assert commands_for(newer, T0)[0].idempotency_key != command.idempotency_key
    # k8s-watcher's executor lets maintenance-scheduler send it.
    assert isinstance(authorize(command, command.subject), Allowed)
