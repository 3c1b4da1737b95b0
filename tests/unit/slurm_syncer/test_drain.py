"""Every branch of the cordon model, the drain for deletion, and drain commands."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from nodeflow_contracts.slurm import SlurmNodeCommand, SlurmNodeState
from slurm_syncer.drain import (
    cordon_reason,
    decide_command,
    decide_drain,
    delete_reason,
    owned_by_reconcile,
    pod_cordon_reason,
)
from slurm_syncer.nodestate import derive, unknown_state
from slurm_syncer.pods import PodFacts

CORDON = "nodeflow: cordon: Kubernetes node node-1 is cordoned"


def facts(**changes: Any) -> PodFacts:
    base = PodFacts(
        key="slurm.gpu-1",
        namespace="slurm",
        name="gpu-1",
        uid="u1",
        resource_version="1",
        cluster="a",
        node_name="node-1",
        node_unschedulable=False,
        node_cordon_reason=None,
        pod_cordoned=False,
        delete_reason=None,
        terminating=False,
        conditions=(),
    )
    return dataclasses.replace(base, **changes)


def node(base: Any = "Idle", flags: tuple[str, ...] = (), reason: str = "") -> SlurmNodeState:
    derived = derive(base, flags)
    return SlurmNodeState(
        cluster="a",
        name="gpu-1",
        known=True,
        base_state=base,
        flags=flags,
        reason=reason,
        reason_is_ours=reason.startswith("nodeflow:"),
        busy=derived.busy,
        drain=derived.drain,
        drained=derived.drained,
        draining=derived.draining,
    )


# --- skips -----------------------------------------------------------------------------------


@pytest.mark.parametrize("state", [None, unknown_state("a", "gpu-1", 0)])
def test_an_unreadable_node_is_never_touched(state: SlurmNodeState | None) -> None:
    for pod in (facts(node_unschedulable=True), facts(delete_reason="ScalingDeleteScheduled")):
        plan = decide_drain(pod, state)
        assert plan.action == "none" and not plan.mark_pod_cordoned


def test_an_external_reason_is_skipped_even_when_cordoned() -> None:
    external = node("Idle", ("Drain",), "bad DIMM")
    for pod in (
        facts(node_unschedulable=True),
        facts(pod_cordoned=True),
        facts(),
        facts(delete_reason="ScalingDeleteScheduled"),
    ):
        plan = decide_drain(pod, external)
        assert plan.action == "none" and not plan.mark_pod_cordoned
    # External reason on a down node, no drain: still never overwritten.
    assert decide_drain(facts(node_unschedulable=True), node("Down", (), "admin")).action == "none"


def test_a_node_that_is_not_responding_is_skipped() -> None:
    plan = decide_drain(facts(node_unschedulable=True), node("Idle", ("NotResponding",)))
    assert plan.action == "none" and not plan.mark_pod_cordoned


# --- Kubernetes node cordoned ----------------------------------------------------------------


def test_a_cordoned_node_marks_the_pod_and_drains_with_the_default_reason() -> None:
    plan = decide_drain(facts(node_unschedulable=True), node())
    assert (plan.action, plan.reason, plan.origin) == ("drain", CORDON, "cordon")
    assert plan.mark_pod_cordoned


def test_the_node_annotation_gives_the_reason_and_an_already_marked_pod_is_not_marked() -> None:
    pod = facts(node_unschedulable=True, node_cordon_reason="PSU swap", pod_cordoned=True)
    plan = decide_drain(pod, node("Allocated"))
    assert plan.action == "drain" and plan.reason == "nodeflow: cordon: PSU swap"
    assert not plan.mark_pod_cordoned


def test_already_drained_with_the_same_reason_is_a_noop_but_the_pod_is_still_marked() -> None:
    plan = decide_drain(facts(node_unschedulable=True), node("Idle", ("Drain",), CORDON))
    assert plan.action == "none" and plan.mark_pod_cordoned


def test_a_changed_cordon_annotation_updates_our_reason() -> None:
    pod = facts(node_unschedulable=True, node_cordon_reason="new", pod_cordoned=True)
    plan = decide_drain(pod, node("Idle", ("Drain",), CORDON))
    assert plan.action == "drain" and plan.reason == "nodeflow: cordon: new"


def test_a_drain_made_by_a_command_is_kept_as_is() -> None:
    by_command = node("Idle", ("Drain",), "nodeflow: maintenance 7")
    assert decide_drain(facts(node_unschedulable=True), by_command).action == "none"
    assert decide_drain(facts(pod_cordoned=True), by_command).action == "none"
    assert decide_drain(facts(), by_command).action == "none"  # never undrained by the model


# --- pod marked cordoned ---------------------------------------------------------------------


def test_a_marked_pod_drains_with_a_pod_reason_or_the_node_annotation() -> None:
    plan = decide_drain(facts(pod_cordoned=True), node())
    assert plan.action == "drain" and not plan.mark_pod_cordoned
    assert plan.reason == "nodeflow: cordon: pod slurm/gpu-1 is marked cordoned"
    annotated = decide_drain(facts(pod_cordoned=True, node_cordon_reason="rack move"), node())
    assert annotated.reason == "nodeflow: cordon: rack move"


def test_a_marked_pod_already_drained_for_a_cordon_is_a_noop() -> None:
    # After the node is uncordoned the reason stays the node's: no churn of the reason.
    assert decide_drain(facts(pod_cordoned=True), node("Idle", ("Drain",), CORDON)).action == "none"


# --- neither: undrain what we drained ----------------------------------------------------------


def test_undrain_only_what_the_model_drained() -> None:
    plan = decide_drain(facts(), node("Idle", ("Drain",), CORDON))
    assert plan.action == "undrain" and plan.origin == "uncordon"
    deleted = decide_drain(facts(), node("Mixed", ("Drain",), "nodeflow: delete: x"))
    assert deleted.action == "undrain"
    assert decide_drain(facts(), node()).action == "none"
    # Undrain already requested (DRAIN+UNDRAIN): not drained any more.
    assert decide_drain(facts(), node("Idle", ("Drain", "Undrain"), CORDON)).action == "none"


def test_a_terminating_pod_is_never_undrained() -> None:
    assert decide_drain(facts(terminating=True), node("Idle", ("Drain",), CORDON)).action == "none"


# --- SlurmDelete -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("condition_reason", "words"),
    [
        ("ScalingDeleteScheduled", "NodeSet scale-down"),
        ("RollingDeleteScheduled", "NodeSet rolling update"),
        ("Other", "scheduled for deletion"),
    ],
)
def test_slurm_delete_drains_with_a_reason_saying_why(condition_reason: str, words: str) -> None:
    plan = decide_drain(facts(delete_reason=condition_reason), node("Allocated"))
    assert plan.action == "drain" and plan.origin == "delete"
    assert plan.reason.startswith(f"nodeflow: delete: {condition_reason}") and words in plan.reason


def test_slurm_delete_wins_over_a_cordon_and_accepts_any_delete_drain() -> None:
    pod = facts(delete_reason="ScalingDeleteScheduled", node_unschedulable=True)
    plan = decide_drain(pod, node("Idle", ("Drain",), CORDON))
    assert plan.action == "drain" and plan.reason.startswith("nodeflow: delete:")
    assert plan.mark_pod_cordoned
    rolling = node("Idle", ("Drain",), delete_reason(facts(), "RollingDeleteScheduled"))
    assert decide_drain(facts(delete_reason="ScalingDeleteScheduled"), rolling).action == "none"
    by_command = node("Idle", ("Drain",), "nodeflow: maintenance")
    assert decide_drain(facts(delete_reason="Scaling"), by_command).action == "none"


def test_reasons_and_ownership() -> None:
    assert cordon_reason("n", "nodeflow: already prefixed") == "nodeflow: cordon: already prefixed"
    assert cordon_reason("n", "  ") == "nodeflow: cordon: Kubernetes node n is cordoned"
    assert pod_cordon_reason(facts(node_cordon_reason="x")) == "nodeflow: cordon: x"
    assert owned_by_reconcile(CORDON) and owned_by_reconcile("nodeflow: delete: y")
    assert not owned_by_reconcile("nodeflow: maintenance") and not owned_by_reconcile("admin")


# --- commands --------------------------------------------------------------------------------


def command(op: Any, reason: str = "") -> SlurmNodeCommand:
    return SlurmNodeCommand(
        idempotency_key="k", sender="s", sent_at=0, cluster="a", node="gpu-1", op=op, reason=reason
    )


@pytest.mark.parametrize(
    ("op", "reason", "state", "verdict"),
    [
        ("drain", "nodeflow: m", node(), "apply"),
        ("drain", "nodeflow: m", node("Idle", ("Drain",), "nodeflow: m"), "noop"),
        ("drain", "nodeflow: m", node("Idle", ("Drain",), CORDON), "apply"),
        ("drain", "nodeflow: m", node("Idle", ("Drain",), "admin"), "noop"),
        ("drain", "nodeflow: m", node("Down", (), "admin"), "refuse"),
        ("drain", "no prefix", node(), "refuse"),
        ("drain", "nodeflow:  ", node(), "refuse"),
        ("undrain", "", node("Idle", ("Drain",), "nodeflow: m"), "apply"),
        ("undrain", "", node("Idle", ("Drain",), CORDON), "apply"),
        ("undrain", "", node(), "noop"),
        ("undrain", "", node("Idle", ("Drain",), "admin"), "refuse"),
    ],
)
def test_commands(op: str, reason: str, state: SlurmNodeState, verdict: str) -> None:
    assert decide_command(command(op, reason), state).verdict == verdict
