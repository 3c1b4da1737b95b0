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


def test_rule_a_patch_writes_only_the_metadata_it_names() -> None:
    """PatchRequest's lists are written whole: a patch of annotations alone must not send an
    empty finalizers list (it would drop our finalizer, and the cleanup with it) nor empty
    ownerReferences; a finalizers patch sends no annotations."""
    [annotate] = commands_for(PatchRequest(REQUEST, annotations={"a": "b"}), T0)
    assert isinstance(annotate.operation, k8s.PatchObject)
    assert annotate.operation.patch["metadata"] == {"annotations": {"a": "b"}}
    [finalize] = commands_for(PatchRequest(REQUEST, finalizers=("x/y",)), T0)
    assert isinstance(finalize.operation, k8s.PatchObject)
    assert finalize.operation.patch["metadata"] == {"finalizers": ["x/y"]}


def test_rule_a_request_event_is_normal_unless_it_says_warning() -> None:
    """An Event about a request is Normal unless decided a Warning; a config Event is a
    Warning unless decided otherwise (it says a value is read otherwise than NVIDIA's
    controller reads it)."""
    [normal] = commands_for(Event(REQUEST, "DrainStarted", "draining"), T0)
    assert isinstance(normal.operation, k8s.RecordEvent) and normal.operation.type == "Normal"
    [warning] = commands_for(Event(REQUEST, "DrainBlocked", "blocked", "Warning"), T0)
    assert isinstance(warning.operation, k8s.RecordEvent) and warning.operation.type == "Warning"
    config = ConfigEvent("nodeflow-system", "default", "uid-c", "7", "Odd", "why")
    [command] = commands_for(config, T0)
    assert isinstance(command.operation, k8s.RecordEvent) and command.operation.type == "Warning"


def test_rule_a_request_level_decision_names_the_requests_node_and_no_pod() -> None:
    decision = decision_message(Decision(REQUEST, "cordon", "Cordon", "cordon n1"), T0)
    assert (decision.node, decision.pod) == ("n1", "")
    about_pod = Decision(REQUEST, "evict", "Evict", "evict default/a", pod="default/a", node="n1")
    assert decision_message(about_pod, T0).pod == "default/a"


def test_rule_a_status_write_names_a_phase_change_only_when_there_is_one() -> None:
    """The command's reason (k8s-watcher logs it with the write) says `phase A -> B` for a
    phase change, and just `status` for any other status write."""
    [plain] = commands_for(SetStatus(REQUEST, {"conditions": []}), T0)
    assert plain.reason == "status"
    [changed] = commands_for(SetStatus(REQUEST, {}, phase_change=("", "Pending")), T0)
    assert changed.reason == "phase new -> Pending"
