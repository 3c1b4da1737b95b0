"""Drain decisions: the cordon-to-drain model, the drain for deletion, and drain commands.

Cordon model (slinky-style, Kubernetes to Slurm only), per NodeSet pod:
  skip the Slurm side when the drain reason is external or the node is not responding; else
  if the pod's Kubernetes node is unschedulable, mark the pod cordoned (with
  `POD_CORDON_SOURCE_ANNOTATION: node` beside the mark) and drain (reason from the node's
  cordon-reason annotation, or a default); else if the pod is marked cordoned by a person (no
  source, or another one), drain; else undrain what this model drained. Uncordoning reverses
  the cordon: once the node is schedulable again the mark that came from the node is removed
  and the node undrained; a mark a person set stays, with its drain, until they remove it. A
  node that is missing from the `k8s_nodes` view is not proof of an uncordon: its pod's mark
  stays.
Drain for deletion: SlurmDelete=True on the pod drains its node; once the condition is gone
  the model above undrains it.

Reason ownership (reasons.py): a reason without one of our prefixes is external and is never
changed or cleared. Among our reasons, `<prefix> cordon: ...` and `<prefix> delete: ...` belong
to this reconciliation, which may undrain them; other reasons of ours come from drain
commands (SlurmNodeCommand) and are only lifted by an undrain command. Nothing here ever
cordons a Kubernetes node. An unreadable Slurm node is never touched: fail closed.

A node whose slurmd died: slurmctld marks it DOWN+NOT_RESPONDING with the reason `Not
responding` (or appends ` : Not responding` to the reason it had). That reason is slurmctld's,
not external: it never blocks the model. While the node is not responding the Slurm side is
skipped and the pod is not marked, as the reference does: slurmctld has already ended or
requeued its jobs, so nodeset-controller may delete the pod without any drain (a DOWN node
runs no job), and a drain or undrain sent now would only race slurmctld. The node's pod mark
still goes with its uncordon. Once slurmd answers again the model runs as for any node: a
cordon or SlurmDelete drains it with our reason (replacing slurmctld's, so an administrator's
RESUME leaves it drained), and a drain of ours that outlived the outage is undrained when
nothing asks for it any more. So neither cordon nor uncordon waits on a reason that only
slurmctld would ever clear.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from nodeflow_contracts.pod_protocol import DELETE_REASONS
from nodeflow_contracts.slurm import SlurmNodeCommand, SlurmNodeState
from slurm_syncer.pods import PodFacts
from slurm_syncer.reasons import DEFAULT_DRAIN_REASONS, DrainReasons

SlurmAction = Literal["none", "drain", "undrain"]
Origin = Literal["cordon", "delete", "uncordon", "command"]
PodMark = Literal["keep", "mark", "unmark"]


def cordon_reason(
    node_name: str | None, annotation: str | None, reasons: DrainReasons = DEFAULT_DRAIN_REASONS
) -> str:
    if annotation:
        text = reasons.without_prefix(annotation)
        if text:
            return reasons.cordon_prefix + text
    return f"{reasons.cordon_prefix}Kubernetes node {node_name or '?'} is cordoned"


def pod_cordon_reason(facts: PodFacts, reasons: DrainReasons = DEFAULT_DRAIN_REASONS) -> str:
    if facts.node_cordon_reason:
        return cordon_reason(facts.node_name, facts.node_cordon_reason, reasons)
    return f"{reasons.cordon_prefix}pod {facts.namespace}/{facts.name} is marked cordoned"


def delete_reason(
    facts: PodFacts, condition_reason: str, reasons: DrainReasons = DEFAULT_DRAIN_REASONS
) -> str:
    why = DELETE_REASONS.get(condition_reason)
    because = f": {why}" if why else ""
    return (
        f"{reasons.delete_prefix}{condition_reason}: pod {facts.namespace}/{facts.name} "
        f"is scheduled for deletion{because}"
    )


@dataclass(frozen=True)
class DrainPlan:
    action: SlurmAction
    reason: str = ""
    origin: Origin | None = None
    # What to do with the pod's cordon mark: mark it (from the node), remove the node's mark.
    pod_mark: PodMark = "keep"
    # Why, in words, for the logs and tests.
    why: str = ""

    @property
    def mark_pod_cordoned(self) -> bool:
        return self.pod_mark == "mark"


def pod_mark(facts: PodFacts) -> PodMark:
    """The cordon mark the pod should carry, from its node alone (the Slurm state is not
    needed: a mark is a Kubernetes fact)."""
    if facts.node_unschedulable:
        return "keep" if facts.pod_cordoned else "mark"
    if facts.pod_cordoned and facts.pod_cordon_from_node and facts.node_known:
        return "unmark"
    return "keep"


def _drain_to(
    state: SlurmNodeState, reason: str, reasons: DrainReasons, *, same_kind: bool
) -> bool:
    """Does draining with `reason` change anything? No when already drained with that reason
    (or, when `same_kind`, with any reason of the same kind), or drained by a command."""
    if not state.drain:
        return True
    if state.reason == reason:
        return False
    if same_kind and (
        (reasons.is_delete(reason) and reasons.is_delete(state.reason))
        or (reasons.is_cordon(reason) and reasons.is_cordon(state.reason))
    ):
        return False
    # Drained with a command's reason: it stays as the command left it.
    return reasons.owned_by_reconcile(state.reason) or not state.reason


def decide_drain(
    facts: PodFacts,
    state: SlurmNodeState | None,
    reasons: DrainReasons = DEFAULT_DRAIN_REASONS,
) -> DrainPlan:
    """What the syncer does about one NodeSet pod's Slurm node, and its cordon mark."""
    mark = pod_mark(facts)
    # When the Slurm side is skipped the pod is not marked either (the reference skips the
    # pod entirely), but the node's own mark still goes with its uncordon.
    only_unmark: PodMark = "unmark" if mark == "unmark" else "keep"
    if state is None or not state.known:
        return DrainPlan(
            "none", pod_mark=only_unmark, why="Slurm node cannot be read: nothing is changed"
        )
    if reasons.is_external(state.reason):
        return DrainPlan(
            "none",
            pod_mark=only_unmark,
            why=f"external reason {state.reason!r} is left as it is",
        )
    if "NotResponding" in state.flags:
        return DrainPlan("none", pod_mark=only_unmark, why="Slurm node is not responding")
    if facts.delete_reason is not None:
        reason = delete_reason(facts, facts.delete_reason, reasons)
        if _drain_to(state, reason, reasons, same_kind=True):
            return DrainPlan("drain", reason, "delete", mark, "SlurmDelete is set")
        return DrainPlan("none", pod_mark=mark, why="already drained for deletion")
    if facts.node_unschedulable:
        reason = cordon_reason(facts.node_name, facts.node_cordon_reason, reasons)
        if _drain_to(state, reason, reasons, same_kind=False):
            return DrainPlan("drain", reason, "cordon", mark, "Kubernetes node is cordoned")
        return DrainPlan("none", pod_mark=mark, why="already drained for the cordon")
    if facts.pod_cordoned and mark != "unmark":
        reason = pod_cordon_reason(facts, reasons)
        if _drain_to(state, reason, reasons, same_kind=True):
            return DrainPlan("drain", reason, "cordon", why="pod is marked cordoned")
        return DrainPlan("none", why="already drained for the cordon")
    if facts.terminating:
        return DrainPlan("none", pod_mark=mark, why="pod is terminating: its node stays drained")
    if state.drain and reasons.owned_by_reconcile(state.reason):
        return DrainPlan(
            "undrain", origin="uncordon", pod_mark=mark, why="nothing asks for the drain any more"
        )
    return DrainPlan("none", pod_mark=mark, why="nothing to do")


# --- drain commands (SlurmNodeCommand) --------------------------------------------------------


@dataclass(frozen=True)
class CommandDecision:
    verdict: Literal["apply", "noop", "refuse"]
    why: str


def decide_command(
    command: SlurmNodeCommand,
    state: SlurmNodeState,
    reasons: DrainReasons = DEFAULT_DRAIN_REASONS,
) -> CommandDecision:
    """What to do with a drain/undrain command, given the node as just read (known)."""
    if command.op == "drain":
        # New drains carry the configured prefix; the old one is only recognised on reasons
        # already in Slurm.
        if not reasons.is_written_prefix(command.reason):
            return CommandDecision(
                "refuse", f"a drain reason must start with {reasons.prefix!r} and say why"
            )
        if reasons.is_external(state.reason):
            if state.drain:
                return CommandDecision("noop", "already drained with an external reason")
            return CommandDecision("refuse", f"would overwrite external reason {state.reason!r}")
        if state.drain and state.reason == command.reason:
            return CommandDecision("noop", "already drained with this reason")
        return CommandDecision("apply", "drain")
    if reasons.is_external(state.reason):
        return CommandDecision("refuse", f"will not clear external reason {state.reason!r}")
    if not state.drain:
        return CommandDecision("noop", "not drained")
    return CommandDecision("apply", "undrain")
