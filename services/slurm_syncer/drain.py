"""Drain decisions: the cordon-to-drain model, the drain for deletion, and drain commands.

Cordon model (slinky-nodeset-controller.txt), per NodeSet pod:
  skip when the drain reason is external or the node is not responding; else if the pod's
  Kubernetes node is unschedulable, mark the pod cordoned and drain (reason from the node's
  `nodeflow.dev/node-cordon-reason` annotation, or a default); else if the pod is marked
  cordoned, drain; else undrain what this model drained.
Drain for deletion (sunk-nodeset.txt): SlurmDelete=True on the pod drains its node; once the
  condition is gone the model above undrains it.

Reason ownership: a reason without the `nodeflow:` prefix is external and is never changed or
cleared. Among our reasons, `nodeflow: cordon: ...` and `nodeflow: delete: ...` belong to this
reconciliation, which may undrain them; other `nodeflow:` reasons come from drain commands
(SlurmNodeCommand) and are only lifted by an undrain command. Nothing here ever cordons a
Kubernetes node. An unreadable Slurm node is never touched: fail closed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from nodeflow_contracts.slurm import REASON_PREFIX, SlurmNodeCommand, SlurmNodeState
from slurm_syncer.nodestate import reason_is_external, reason_is_ours
from slurm_syncer.pods import PodFacts

CORDON_REASON_PREFIX = f"{REASON_PREFIX} cordon: "
DELETE_REASON_PREFIX = f"{REASON_PREFIX} delete: "
RECONCILED_REASON_PREFIXES = (CORDON_REASON_PREFIX, DELETE_REASON_PREFIX)

_DELETE_EXPLANATIONS = {
    "ScalingDeleteScheduled": "NodeSet scale-down",
    "RollingDeleteScheduled": "NodeSet rolling update",
}

SlurmAction = Literal["none", "drain", "undrain"]
Origin = Literal["cordon", "delete", "uncordon", "command"]


def owned_by_reconcile(reason: str) -> bool:
    return reason.startswith(RECONCILED_REASON_PREFIXES)


def cordon_reason(node_name: str | None, annotation: str | None) -> str:
    if annotation:
        text = annotation.removeprefix(REASON_PREFIX).strip()
        if text:
            return CORDON_REASON_PREFIX + text
    return f"{CORDON_REASON_PREFIX}Kubernetes node {node_name or '?'} is cordoned"


def pod_cordon_reason(facts: PodFacts) -> str:
    if facts.node_cordon_reason:
        return cordon_reason(facts.node_name, facts.node_cordon_reason)
    return f"{CORDON_REASON_PREFIX}pod {facts.namespace}/{facts.name} is marked cordoned"


def delete_reason(facts: PodFacts, condition_reason: str) -> str:
    why = _DELETE_EXPLANATIONS.get(condition_reason)
    by = f" by a {why}" if why else ""
    return (
        f"{DELETE_REASON_PREFIX}{condition_reason}: pod {facts.namespace}/{facts.name} "
        f"is scheduled for deletion{by}"
    )


@dataclass(frozen=True)
class DrainPlan:
    action: SlurmAction
    reason: str = ""
    origin: Origin | None = None
    mark_pod_cordoned: bool = False
    # Why, in words, for the logs and tests.
    why: str = ""


def _drain_to(state: SlurmNodeState, reason: str, *, same_kind_prefix: str | None) -> bool:
    """Does draining with `reason` change anything? No when already drained with that reason
    (or, for `same_kind_prefix`, with any reason of that kind), or drained by a command."""
    if not state.drain:
        return True
    if state.reason == reason:
        return False
    if same_kind_prefix is not None and state.reason.startswith(same_kind_prefix):
        return False
    # Drained with a command's reason: it stays as the command left it.
    return owned_by_reconcile(state.reason) or not state.reason


def decide_drain(facts: PodFacts, state: SlurmNodeState | None) -> DrainPlan:
    """What the syncer does about one NodeSet pod's Slurm node."""
    if state is None or not state.known:
        return DrainPlan("none", why="Slurm node cannot be read: nothing is changed")
    if reason_is_external(state.reason):
        return DrainPlan("none", why=f"external reason {state.reason!r} is left as it is")
    if "NotResponding" in state.flags:
        return DrainPlan("none", why="Slurm node is not responding")
    mark = facts.node_unschedulable and not facts.pod_cordoned
    if facts.delete_reason is not None:
        reason = delete_reason(facts, facts.delete_reason)
        if _drain_to(state, reason, same_kind_prefix=DELETE_REASON_PREFIX):
            return DrainPlan("drain", reason, "delete", mark, "SlurmDelete is set")
        return DrainPlan("none", mark_pod_cordoned=mark, why="already drained for deletion")
    if facts.node_unschedulable:
        reason = cordon_reason(facts.node_name, facts.node_cordon_reason)
        if _drain_to(state, reason, same_kind_prefix=None):
            return DrainPlan("drain", reason, "cordon", mark, "Kubernetes node is cordoned")
        return DrainPlan("none", mark_pod_cordoned=mark, why="already drained for the cordon")
    if facts.pod_cordoned:
        reason = pod_cordon_reason(facts)
        if _drain_to(state, reason, same_kind_prefix=CORDON_REASON_PREFIX):
            return DrainPlan("drain", reason, "cordon", why="pod is marked cordoned")
        return DrainPlan("none", why="already drained for the cordon")
    if facts.terminating:
        return DrainPlan("none", why="pod is terminating: its node is not undrained")
    if state.drain and owned_by_reconcile(state.reason):
        return DrainPlan("undrain", origin="uncordon", why="nothing asks for the drain any more")
    return DrainPlan("none", why="nothing to do")


# --- drain commands (SlurmNodeCommand) --------------------------------------------------------


@dataclass(frozen=True)
class CommandDecision:
    verdict: Literal["apply", "noop", "refuse"]
    why: str


def decide_command(command: SlurmNodeCommand, state: SlurmNodeState) -> CommandDecision:
    """What to do with a drain/undrain command, given the node as just read (known)."""
    if command.op == "drain":
        if not reason_is_ours(command.reason) or not command.reason[len(REASON_PREFIX) :].strip():
            return CommandDecision("refuse", f"a drain reason must start with {REASON_PREFIX!r}")
        if reason_is_external(state.reason):
            if state.drain:
                return CommandDecision("noop", "already drained with an external reason")
            return CommandDecision("refuse", f"would overwrite external reason {state.reason!r}")
        if state.drain and state.reason == command.reason:
            return CommandDecision("noop", "already drained with this reason")
        return CommandDecision("apply", "drain")
    if reason_is_external(state.reason):
        return CommandDecision("refuse", f"will not clear external reason {state.reason!r}")
    if not state.drain:
        return CommandDecision("noop", "not drained")
    return CommandDecision("apply", "undrain")
