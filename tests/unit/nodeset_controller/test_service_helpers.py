"""The in-memory helpers of the service: none of them may turn into a source of truth."""

from __future__ import annotations

from nodeflow_contracts.k8s import K8sCommand, ObjectRef, RecordEvent
from nodeflow_kube.fields import resource_version_reached as rv_reached
from nodeset_controller.service import ForeignNames, aggregate_events


def event(key: str, reason: str = "PodCreated", message: str = "m") -> K8sCommand:
    return K8sCommand(
        idempotency_key=key,
        sender="nodeset-controller",
        sent_at=0.0,
        target=ObjectRef(
            api_version="nodeflow.dev/v1alpha1", kind="NodeSet", name="gpu", namespace="ns"
        ),
        operation=RecordEvent(reason=reason, message=message, action="create"),
    )


def test_rv_reached_compares_numeric_versions_and_falls_back_to_equality() -> None:
    assert rv_reached("12", "12") and rv_reached("13", "12") and not rv_reached("11", "12")
    assert rv_reached("abc", "abc") and not rv_reached("abd", "abc")


def test_events_of_one_round_are_aggregated_per_reason_with_a_stable_key() -> None:
    merged = aggregate_events(
        [event("a", message="pod x"), event("b", message="pod y"), event("c", "PodDeleted")]
    )
    assert len(merged) == 2
    created = next(
        m
        for m in merged
        if isinstance(m.operation, RecordEvent) and m.operation.reason == "PodCreated"
    )
    assert isinstance(created.operation, RecordEvent)
    assert created.operation.message == "2 decisions: pod x; pod y"
    again = aggregate_events([event("b", message="pod y"), event("a", message="pod x")])
    assert again[0].idempotency_key == created.idempotency_key


def test_aggregated_event_message_is_bounded() -> None:
    merged = aggregate_events([event(str(i), message="x" * 100) for i in range(50)])
    (only,) = merged
    assert isinstance(only.operation, RecordEvent)
    assert len(only.operation.message) <= 1024 and "(50 in all)" in only.operation.message


def test_foreign_names_excludes_the_nodesets_own_pods() -> None:
    foreign = ForeignNames({"a", "b", "c"}, {"b": {}})
    assert "a" in foreign and "b" not in foreign and "z" not in foreign
    assert sorted(foreign) == ["a", "c"] and len(foreign) == 2
