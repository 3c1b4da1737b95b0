"""Command, outcome, decision and dead-letter counters: values and bounded labels."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from metrics_exporter.control_plane import ControlPlaneMetrics, DecisionSummary
from nodeflow_bus import dead_letter
from nodeflow_contracts.k8s import CommandOutcome, ObjectRef
from nodeflow_contracts.nodeset import NodeSetDecision

POD = ObjectRef(api_version="v1", kind="Pod", name="worker-0", namespace="default")


def outcome(op: str, result: str, sent_at: float, finished_at: float) -> CommandOutcome:
    return CommandOutcome(
        idempotency_key=f"{op}-{sent_at}",
        op=op,
        sender="nodeset-controller",
        target=POD,
        outcome=result,  # type: ignore[arg-type]
        message='pods "worker-0" not found',
        sent_at=sent_at,
        finished_at=finished_at,
    )


def decision(kind: str, reason: str) -> NodeSetDecision:
    return NodeSetDecision(
        decision_id="d-1",
        namespace="default",
        nodeset="gpus",
        kind=kind,  # type: ignore[arg-type]
        reason=reason,
        message="rank 2: idle, drained, delete condition set",
        decided_at=1.0,
        pod="worker-0",
        node="gpu-0",
    )


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


def test_commands_are_counted_by_op_once_per_msg_id(registry: CollectorRegistry) -> None:
    metrics = ControlPlaneMetrics(registry)
    metrics.on_command("cmd.k8s.v1.nodeset-controller.delete", "key-1")
    metrics.on_command("cmd.k8s.v1.nodeset-controller.delete", "key-1")
    metrics.on_command("cmd.k8s.v1.nodeset-controller.delete", "key-2")
    metrics.on_command("cmd.k8s.v1.topology-placer.bind", None)
    value = registry.get_sample_value
    assert value("nodeflow_k8s_commands_sent_total", {"op": "delete"}) == 2
    assert value("nodeflow_k8s_commands_sent_total", {"op": "bind"}) == 1


def test_outcomes_by_op_and_outcome_and_latency_of_final_outcomes(
    registry: CollectorRegistry,
) -> None:
    metrics = ControlPlaneMetrics(registry)
    metrics.on_outcome(outcome("delete", "retrying", 10.0, 10.2))
    metrics.on_outcome(outcome("delete", "applied", 10.0, 10.7))
    metrics.on_outcome(outcome("evict", "conflict", 20.0, 20.03))
    metrics.on_outcome(outcome("evict", "applied", 30.0, 29.5))  # clock skew: latency 0
    value = registry.get_sample_value
    assert (
        value("nodeflow_k8s_command_outcomes_total", {"op": "delete", "outcome": "retrying"}) == 1
    )
    assert value("nodeflow_k8s_command_outcomes_total", {"op": "delete", "outcome": "applied"}) == 1
    assert value("nodeflow_k8s_command_outcomes_total", {"op": "evict", "outcome": "conflict"}) == 1
    assert value("nodeflow_k8s_command_latency_seconds_count", {"op": "delete"}) == 1
    assert value("nodeflow_k8s_command_latency_seconds_sum", {"op": "delete"}) == pytest.approx(0.7)
    assert value("nodeflow_k8s_command_latency_seconds_bucket", {"op": "delete", "le": "0.5"}) == 0
    assert value("nodeflow_k8s_command_latency_seconds_bucket", {"op": "delete", "le": "1.0"}) == 1
    assert value("nodeflow_k8s_command_latency_seconds_count", {"op": "evict"}) == 2
    assert value("nodeflow_k8s_command_latency_seconds_sum", {"op": "evict"}) == pytest.approx(0.03)
    assert value("nodeflow_k8s_command_latency_seconds_bucket", {"op": "evict", "le": "0.01"}) == 1


def test_an_unknown_op_is_counted_as_other(registry: CollectorRegistry) -> None:
    ControlPlaneMetrics(registry).on_outcome(outcome("pod-worker-0", "applied", 1.0, 2.0))
    assert (
        registry.get_sample_value(
            "nodeflow_k8s_command_outcomes_total", {"op": "other", "outcome": "applied"}
        )
        == 1
    )


def test_decisions_by_kind_and_machine_reason_never_the_message(
    registry: CollectorRegistry,
) -> None:
    metrics = ControlPlaneMetrics(registry, label_value_limit=2)
    metrics.on_nodeset_decision(decision("delete-scheduled", "ScalingDeleteScheduled"))
    metrics.on_nodeset_decision(decision("delete-scheduled", "ScalingDeleteScheduled"))
    metrics.on_nodeset_decision(decision("create", "rank 3 is missing"))
    metrics.on_nodeset_decision(decision("delete", "ScalingDeleted"))
    metrics.on_nodeset_decision(decision("cancel", "ScaleOutCancelled"))  # third reason: other
    metrics.on_decision_summary(
        "maintenance.v1.ns.m.decision", DecisionSummary(kind="cordon", reason="Cordoned")
    )
    value = registry.get_sample_value
    labels = {"source": "nodeset", "kind": "delete-scheduled", "reason": "ScalingDeleteScheduled"}
    assert value("nodeflow_decisions_total", labels) == 2
    assert (
        value(
            "nodeflow_decisions_total", {"source": "nodeset", "kind": "create", "reason": "other"}
        )
        == 1
    )
    assert (
        value(
            "nodeflow_decisions_total",
            {"source": "nodeset", "kind": "delete", "reason": "ScalingDeleted"},
        )
        == 1
    )
    assert (
        value(
            "nodeflow_decisions_total", {"source": "nodeset", "kind": "cancel", "reason": "other"}
        )
        == 1
    )
    # A kind from a source without a closed contract is capped too; its reason is the third.
    assert (
        value(
            "nodeflow_decisions_total",
            {"source": "maintenance", "kind": "cordon", "reason": "other"},
        )
        == 1
    )
    exposed = {
        sample.labels.get("reason")
        for family in registry.collect()
        for sample in family.samples
        if family.name == "nodeflow_decisions"
    }
    assert exposed == {"ScalingDeleteScheduled", "ScalingDeleted", "other"}


def test_dead_letters_by_subject_family_and_error_kind(registry: CollectorRegistry) -> None:
    metrics = ControlPlaneMetrics(registry)
    metrics.on_dead_letter(
        "dlq.cmd.k8s.v1.nodeset-controller.delete",
        {
            dead_letter.SUBJECT: "cmd.k8s.v1.nodeset-controller.delete",
            dead_letter.ERROR_KIND: "decode",
        },
    )
    # Headers missing (a copy made by another tool): the subject tells the original.
    metrics.on_dead_letter("dlq.k8s.v1.pod.default.worker-7", {})
    value = registry.get_sample_value
    assert (
        value(
            "nodeflow_dead_letters_total", {"subject": "cmd.k8s.v1.delete", "error_kind": "decode"}
        )
        == 1
    )
    assert (
        value("nodeflow_dead_letters_total", {"subject": "k8s.v1.pod", "error_kind": "other"}) == 1
    )
