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
    pod_cordon_reason,
)
from slurm_syncer.nodestate import derive, unknown_state
from slurm_syncer.pods import PodFacts
from slurm_syncer.reasons import DEFAULT_DRAIN_REASONS, DrainReasons

CORDON = "slurm-operator: cordon: Kubernetes node node-1 is cordoned"
# What the previous version wrote: still ours after an upgrade.
LEGACY_CORDON = "nodeflow: cordon: Kubernetes node node-1 is cordoned"


def facts(**changes: Any) -> PodFacts:
    base = PodFacts(
        key="slurm.gpu-1",
        namespace="slurm",
        name="gpu-1",
        uid="u1",
        resource_version="1",
        cluster="a",
        node_name="node-1",
        node_known=True,
        node_unschedulable=False,
        node_cordon_reason=None,
        pod_cordoned=False,
        pod_cordon_from_node=False,
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
        reason_is_ours=DEFAULT_DRAIN_REASONS.is_ours(reason),
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
    assert plan.action == "drain" and plan.reason == "slurm-operator: cordon: PSU swap"
    assert not plan.mark_pod_cordoned


def test_already_drained_with_the_same_reason_is_a_noop_but_the_pod_is_still_marked() -> None:
    plan = decide_drain(facts(node_unschedulable=True), node("Idle", ("Drain",), CORDON))
    assert plan.action == "none" and plan.mark_pod_cordoned


def test_a_changed_cordon_annotation_updates_our_reason() -> None:
    pod = facts(node_unschedulable=True, node_cordon_reason="new", pod_cordoned=True)
    plan = decide_drain(pod, node("Idle", ("Drain",), CORDON))
    assert plan.action == "drain" and plan.reason == "slurm-operator: cordon: new"


def test_a_drain_made_by_a_command_is_kept_as_is() -> None:
    by_command = node("Idle", ("Drain",), "nodeflow: maintenance 7")
    assert decide_drain(facts(node_unschedulable=True), by_command).action == "none"
    assert decide_drain(facts(pod_cordoned=True), by_command).action == "none"
    assert decide_drain(facts(), by_command).action == "none"  # never undrained by the model


# --- pod marked cordoned ---------------------------------------------------------------------


def test_a_marked_pod_drains_with_a_pod_reason_or_the_node_annotation() -> None:
    plan = decide_drain(facts(pod_cordoned=True), node())
    assert plan.action == "drain" and not plan.mark_pod_cordoned
    assert plan.reason == "slurm-operator: cordon: pod slurm/gpu-1 is marked cordoned"
    annotated = decide_drain(facts(pod_cordoned=True, node_cordon_reason="rack move"), node())
    assert annotated.reason == "slurm-operator: cordon: rack move"


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


# --- uncordon reverses the cordon (item 10) ---------------------------------------------------


def test_rule_uncordon_removes_the_pod_mark_that_came_from_the_node_and_undrains() -> None:
    cordoned = decide_drain(facts(node_unschedulable=True), node())
    assert cordoned.action == "drain" and cordoned.pod_mark == "mark"
    from_node = facts(pod_cordoned=True, pod_cordon_from_node=True)
    plan = decide_drain(from_node, node("Idle", ("Drain",), CORDON))
    assert (plan.action, plan.pod_mark) == ("undrain", "unmark")
    # Not drained (any more): the mark still goes.
    assert decide_drain(from_node, node()).pod_mark == "unmark"


def test_rule_a_pod_cordon_set_by_a_person_stays_after_the_uncordon() -> None:
    by_person = facts(pod_cordoned=True)
    plan = decide_drain(by_person, node("Idle", ("Drain",), CORDON))
    assert (plan.action, plan.pod_mark) == ("none", "keep")
    assert decide_drain(by_person, node()).action == "drain"


def test_rule_a_node_missing_from_the_view_is_not_an_uncordon() -> None:
    unseen = facts(pod_cordoned=True, pod_cordon_from_node=True, node_known=False)
    plan = decide_drain(unseen, node("Idle", ("Drain",), CORDON))
    assert (plan.action, plan.pod_mark) == ("none", "keep")


def test_rule_the_nodes_mark_goes_even_when_slurm_cannot_be_read_or_is_external() -> None:
    from_node = facts(pod_cordoned=True, pod_cordon_from_node=True)
    for state in (None, unknown_state("a", "gpu-1", 0), node("Idle", ("Drain",), "bad DIMM")):
        plan = decide_drain(from_node, state)
        assert (plan.action, plan.pod_mark) == ("none", "unmark")


# --- slurmctld's own "Not responding" (item 3) -------------------------------------------------


def test_rule_slurmctlds_not_responding_reason_is_not_external() -> None:
    reasons = DEFAULT_DRAIN_REASONS
    assert not reasons.is_external("Not responding") and not reasons.is_ours("Not responding")
    assert reasons.is_external("bad DIMM : Not responding")  # an admin's reason, kept
    assert reasons.is_ours(f"{CORDON} : Not responding")  # ours, slurmctld appended to it
    dead = node("Down", ("NotResponding",), "Not responding")
    # While slurmd is silent nothing is sent to Slurm (the controller needs no drain to delete
    # a DOWN node's pod), but the node's pod mark still goes with the uncordon.
    assert decide_drain(facts(node_unschedulable=True), dead).action == "none"
    from_node = facts(pod_cordoned=True, pod_cordon_from_node=True)
    assert decide_drain(from_node, dead).pod_mark == "unmark"
    # slurmd answers again but the node stays DOWN (ReturnToService=0): the cordon drains it.
    back = node("Down", (), "Not responding")
    plan = decide_drain(facts(node_unschedulable=True), back)
    assert plan.action == "drain" and plan.reason == CORDON
    assert decide_drain(facts(delete_reason="ScalingDeleteScheduled"), back).action == "drain"
    # Nothing asks for a drain: nothing to undrain, nothing wedged.
    assert decide_drain(facts(), back).action == "none"


def test_rule_our_drain_that_outlived_a_slurmd_outage_is_undrained_once_it_answers() -> None:
    reason = f"{CORDON} : Not responding"
    silent = node("Down", ("Drain", "NotResponding"), reason)
    assert decide_drain(facts(), silent).action == "none"
    answering = node("Idle", ("Drain",), reason)
    assert decide_drain(facts(), answering).action == "undrain"


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
    assert plan.reason.startswith(f"slurm-operator: delete: {condition_reason}")
    assert words in plan.reason


def test_slurm_delete_wins_over_a_cordon_and_accepts_any_delete_drain() -> None:
    pod = facts(delete_reason="ScalingDeleteScheduled", node_unschedulable=True)
    plan = decide_drain(pod, node("Idle", ("Drain",), CORDON))
    assert plan.action == "drain" and plan.reason.startswith("slurm-operator: delete:")
    assert plan.mark_pod_cordoned
    rolling = node("Idle", ("Drain",), delete_reason(facts(), "RollingDeleteScheduled"))
    assert decide_drain(facts(delete_reason="ScalingDeleteScheduled"), rolling).action == "none"
    by_command = node("Idle", ("Drain",), "nodeflow: maintenance")
    assert decide_drain(facts(delete_reason="Scaling"), by_command).action == "none"


def test_reasons_and_ownership() -> None:
    assert cordon_reason("n", "slurm-operator: prefixed") == "slurm-operator: cordon: prefixed"
    assert cordon_reason("n", "nodeflow: old prefix") == "slurm-operator: cordon: old prefix"
    assert cordon_reason("n", "  ") == "slurm-operator: cordon: Kubernetes node n is cordoned"
    assert pod_cordon_reason(facts(node_cordon_reason="x")) == "slurm-operator: cordon: x"
    reasons = DEFAULT_DRAIN_REASONS
    assert reasons.owned_by_reconcile(CORDON) and reasons.owned_by_reconcile(LEGACY_CORDON)
    assert reasons.owned_by_reconcile("slurm-operator: delete: y")
    assert not reasons.owned_by_reconcile("slurm-operator: maintenance")
    assert not reasons.owned_by_reconcile("admin")


def test_rule_drain_reasons_we_own_start_with_slurm_operator() -> None:
    """Item 11: the reference's prefix by default, for every reason the model writes."""
    assert decide_drain(facts(node_unschedulable=True), node()).reason.startswith(
        "slurm-operator: cordon: "
    )
    plan = decide_drain(facts(delete_reason="RollingDeleteScheduled"), node("Allocated"))
    assert plan.reason.startswith("slurm-operator: delete: RollingDeleteScheduled: ")
    assert not DEFAULT_DRAIN_REASONS.is_external(plan.reason)


def test_rule_the_drain_reason_prefix_is_a_setting_and_the_old_prefix_stays_ours() -> None:
    site = DrainReasons("acme-ops:")
    plan = decide_drain(facts(node_unschedulable=True), node(), site)
    assert plan.reason == "acme-ops: cordon: Kubernetes node node-1 is cordoned"
    # The reference's prefix is someone else's on this site: external, never touched.
    foreign = node("Idle", ("Drain",), CORDON)
    assert site.is_external(CORDON)
    assert decide_drain(facts(), foreign, site).action == "none"
    # What an earlier Nodeflow wrote is ours on any site: the upgrade undrains it.
    legacy = node("Idle", ("Drain",), LEGACY_CORDON)
    for reasons in (site, DEFAULT_DRAIN_REASONS):
        assert decide_drain(facts(), legacy, reasons).action == "undrain"
    # Commands are checked against the configured prefix.
    assert decide_command(command("drain", "acme-ops: firmware"), node(), site).verdict == "apply"
    refused = decide_command(command("drain", "slurm-operator: firmware"), node(), site)
    assert refused.verdict == "refuse"


# --- commands --------------------------------------------------------------------------------


def command(op: Any, reason: str = "") -> SlurmNodeCommand:
    return SlurmNodeCommand(
        idempotency_key="k", sender="s", sent_at=0, cluster="a", node="gpu-1", op=op, reason=reason
    )


@pytest.mark.parametrize(
    ("op", "reason", "state", "verdict"),
    [
        ("drain", "slurm-operator: m", node(), "apply"),
        ("drain", "nodeflow: m", node(), "refuse"),  # the old prefix is never written anew
        ("drain", "slurm-operator: m", node("Idle", ("Drain",), "slurm-operator: m"), "noop"),
        ("drain", "slurm-operator: m", node("Idle", ("Drain",), CORDON), "apply"),
        ("drain", "slurm-operator: m", node("Idle", ("Drain",), "admin"), "noop"),
        ("drain", "slurm-operator: m", node("Down", (), "admin"), "refuse"),
        ("drain", "slurm-operator: m", node("Down", ("NotResponding",), "Not responding"), "apply"),
        ("drain", "no prefix", node(), "refuse"),
        ("drain", "slurm-operator:  ", node(), "refuse"),
        ("undrain", "", node("Idle", ("Drain",), "nodeflow: m"), "apply"),
        ("undrain", "", node("Idle", ("Drain",), CORDON), "apply"),
        ("undrain", "", node(), "noop"),
        ("undrain", "", node("Idle", ("Drain",), "admin"), "refuse"),
    ],
)
def test_commands(op: str, reason: str, state: SlurmNodeState, verdict: str) -> None:
    assert decide_command(command(op, reason), state).verdict == verdict


# --- Slinky's drain reasons (migration from SchedMD's slurm-operator) ---------------------------

# What Slinky's slurm-operator writes (internal/controller/nodeset/nodeset_sync.go and the worker
# pod's preStop in internal/builder/workerbuilder/worker_app.go).
SLINKY_NODE_CORDON = (
    "slurm-operator: Node (node-1) was cordoned, Pod (slurm/slurm-worker-gpu-0) must be cordoned"
)
SLINKY_POD_CORDON = "slurm-operator: Pod (slurm/slurm-worker-gpu-0) was cordoned"
SLINKY_SCALE_IN = (
    "slurm-operator: Pod (slurm/slurm-worker-gpu-0) is pending termination for scale-in"
)


@pytest.mark.parametrize(
    "reason",
    [
        SLINKY_NODE_CORDON,
        SLINKY_POD_CORDON,
        SLINKY_SCALE_IN,
        SLINKY_POD_CORDON + " : Not responding",
    ],
)
@pytest.mark.parametrize("reasons", [DEFAULT_DRAIN_REASONS, DrainReasons("acme-ops:")])
def test_rule_slinky_drain_reasons_are_ours_and_lifted_once_their_cause_is_gone(
    reason: str, reasons: DrainReasons
) -> None:
    """A node Slinky drained before the switch comes back when nothing asks for the drain,
    whatever prefix this site writes."""
    assert reasons.is_ours(reason) and not reasons.is_external(reason)
    assert reasons.owned_by_reconcile(reason)
    plan = decide_drain(facts(), node("Idle", ("Drain",), reason), reasons)
    assert plan.action == "undrain" and plan.origin == "uncordon"
    # A cause that is still there keeps the node drained: the cordon takes our reason, a
    # deletion drain of Slinky's already is one.
    drained = node("Idle", ("Drain",), reason)
    cordoned = decide_drain(facts(node_unschedulable=True), drained, reasons)
    assert cordoned.action == "drain" and reasons.is_cordon(cordoned.reason)
    if reasons.is_delete(reason):
        deleting = facts(delete_reason="ScalingDeleteScheduled")
        assert decide_drain(deleting, node("Idle", ("Drain",), reason), reasons).action == "none"


def test_rule_slinky_terminating_pod_reason_is_ours_not_external() -> None:
    """The preStop's DOWN reason does not block our drains (an external one would)."""
    reason = "slurm-operator: Pod is terminating"
    assert DrainReasons("acme-ops:").is_delete(reason)
    plan = decide_drain(facts(node_unschedulable=True), node("Down", (), reason))
    assert plan.action == "drain"


@pytest.mark.parametrize(
    "reason",
    [
        # A person's words, even when they look like Slinky's.
        "Pod (slurm/slurm-worker-gpu-0) was cordoned",
        "slurm-operator: Pod (slurm/slurm-worker-gpu-0) was cordoned by bob for a DIMM swap",
        "slurm-operator:Pod (slurm/slurm-worker-gpu-0) was cordoned",
        "bad GPU; slurm-operator: Pod (slurm/slurm-worker-gpu-0) was cordoned",
    ],
)
def test_rule_a_humans_drain_is_never_lifted_even_if_it_looks_like_slinkys(reason: str) -> None:
    for reasons in (DEFAULT_DRAIN_REASONS, DrainReasons("acme-ops:")):
        assert not reasons.owned_by_reconcile(reason)
        assert decide_drain(facts(), node("Idle", ("Drain",), reason), reasons).action == "none"


def test_rule_a_cancelled_deletion_on_a_pod_marked_cordoned_takes_the_cordon_reason() -> None:
    """The SlurmDelete went (the scale-down was undone) but a person marked the pod cordoned:
    the node stays drained, and its reason becomes the cordon's, so Slurm no longer says the
    pod is being deleted. A drain that is already a cordon's is left as it is."""
    drained_for_delete = node("Idle", ("Drain",), delete_reason(facts(), "ScalingDeleteScheduled"))
    plan = decide_drain(facts(pod_cordoned=True), drained_for_delete)
    assert (plan.action, plan.origin) == ("drain", "cordon")
    assert plan.reason == "slurm-operator: cordon: pod slurm/gpu-1 is marked cordoned"
    kept = decide_drain(facts(pod_cordoned=True), node("Idle", ("Drain",), CORDON))
    assert kept.action == "none"


def test_rule_a_drain_without_a_reason_takes_ours_when_the_node_is_cordoned() -> None:
    """A DRAIN without a reason is no command's (a command always says why) and no one's
    external reason: the cordon drains it with our reason, so the uncordon lifts it later.
    A reason a command wrote stays."""
    plan = decide_drain(facts(node_unschedulable=True), node("Idle", ("Drain",), ""))
    assert (plan.action, plan.reason) == ("drain", CORDON)
    by_command = node("Idle", ("Drain",), "slurm-operator: maintenance 7")
    assert decide_drain(facts(node_unschedulable=True), by_command).action == "none"


def test_rule_a_drain_command_drains_again_a_node_whose_undrain_is_under_way() -> None:
    """A maintenance ends (undrain sent, Slurm shows DRAIN+UNDRAIN) and the next one asks for
    the same drain at once: the node is not drained any more, so the command applies, though
    the reason is already the command's. A node drained with it is left as it is."""
    same = "slurm-operator: maintenance 7"
    undraining = node("Idle", ("Drain", "Undrain"), same)
    assert decide_command(command("drain", same), undraining).verdict == "apply"
    drained = node("Idle", ("Drain",), same)
    assert decide_command(command("drain", same), drained).verdict == "noop"
