"""Running jobs protected from eviction: Slinky's `workloadDisruptionProtection` (pure).

While a NodeSet's `spec.workloadDisruptionProtection` is on (the default), each of its pods
whose Slurm node runs a job carries `POD_PROTECT_LABEL: "true"`, and one PodDisruptionBudget
per NodeSet (owned by it, so garbage collection removes it with the NodeSet) selects those
pods with an integer `minAvailable` never met (`PROTECTION_BUDGET_MIN_AVAILABLE`: the
disruption controller then expects the selected pods, not the NodeSet's replicas, so a
scale-down does not open the budget). The eviction API -- `kubectl drain`, a
cluster-autoscaler, a managed node upgrade, NodeMaintenance's drain -- then refuses (429) to
evict such a pod until the label is gone, that is until its job has ended. Our own safe
deletion deletes (it does not evict), so the budget never stands in its way.

Slinky labels a pod busy from the Slurm conditions on it and so drops the label when Slurm
cannot be read. Here the label follows the pod's Slurm state as the plan trusts it
(`PodState.busy`): Allocated, Mixed or Completing; and also an unknown, missing or stale
state (fail closed), unless Slurm has shown the node runs no job (DOWN, or absent from every
successful poll for the absence grace). Idle or drained (and idle) nodes lose it. A node
absent from a fresh poll the plan holds whole is not registered and runs no job either: an
unlabelled pod there (a new one) is not labelled, a labelled one keeps its label (see
`needs_protection`). A pod no kubelet has (unbound) runs nothing and is never labelled; a
terminating pod is left as it is.

Slinky keeps one budget per Slurm cluster (`slurm-workers-pdb-<cluster>`); ours is one per
NodeSet, named `slurm-workers-pdb-<nodeset>`, its selector the NodeSet's pods that carry the
label. A budget of that name not owned by the NodeSet is never touched. One of ours whose
spec was changed is deleted and made again in the next plan.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from nodeflow_contracts.pod_protocol import (
    NODESET_LABEL,
    POD_PROTECT_LABEL,
    POD_PROTECTED,
    protection_budget_spec,
)
from nodeflow_kube.fields import labels_of, mapping, meta, name_of, resource_version_of, uid_of
from nodeset_controller.objects import NODESET_KIND, owned_by_nodeset
from nodeset_controller.podstate import PodState
from nodeset_controller.spec import NodeSetSpec

Obj = Mapping[str, Any]

# The label's value on a protected pod (Slinky's).
PROTECTED = POD_PROTECTED
BUDGET_API_VERSION = "policy/v1"
BUDGET_KIND = "PodDisruptionBudget"
# Slinky's budget name, `slurm-workers-pdb-<cluster>`, keyed here by the NodeSet.
BUDGET_NAME_PREFIX = "slurm-workers-pdb-"
_MAX_NAME = 253


@dataclass(frozen=True)
class ProtectPod:
    """Set (`protect`) or remove the pod's protect label."""

    pod: PodState
    protect: bool
    why: str


@dataclass(frozen=True)
class CreateDisruptionBudget:
    """Create the NodeSet's PodDisruptionBudget (`budget_object`)."""

    name: str
    why: str


@dataclass(frozen=True)
class DeleteDisruptionBudget:
    """Delete the NodeSet's own PodDisruptionBudget (uid and resourceVersion preconditions)."""

    name: str
    uid: str
    resource_version: str
    why: str


ProtectionAction = ProtectPod | CreateDisruptionBudget | DeleteDisruptionBudget


def budget_name(nodeset_name: str) -> str:
    """`slurm-workers-pdb-<nodeset>`; a name too long for an object name keeps its start and
    a digest of the whole, so two NodeSets never share a budget."""
    name = BUDGET_NAME_PREFIX + nodeset_name
    if len(name) <= _MAX_NAME:
        return name
    digest = hashlib.sha256(nodeset_name.encode()).hexdigest()[:10]
    return f"{name[: _MAX_NAME - 11]}-{digest}"


def budget_object(spec: NodeSetSpec) -> dict[str, Any]:
    """The budget as created: owned by the NodeSet (garbage collection deletes it with it),
    labelled with it (k8s-watcher lets nodeset-controller create and delete only such)."""
    return {
        "apiVersion": BUDGET_API_VERSION,
        "kind": BUDGET_KIND,
        "metadata": {
            "name": budget_name(spec.name),
            "namespace": spec.namespace,
            "labels": {NODESET_LABEL: spec.name},
            "ownerReferences": owned_by_nodeset(spec.name, spec.uid),
        },
        "spec": protection_budget_spec(spec.name),
    }


def is_labelled(raw: Obj) -> bool:
    """The pod object carries the protect label."""
    return labels_of(raw).get(POD_PROTECT_LABEL) == PROTECTED


def needs_protection(pod: PodState, *, labelled: bool, absence_read: bool) -> bool:
    """The pod's Slurm node runs, or may run, a job (`PodState.busy`: unknown counts as busy)
    and a kubelet has the pod (an unbound pod runs nothing).

    `absence_read`: the plan's Slurm view is a fresh, successful poll that it holds whole
    (`SlurmTrust.read_at`), so a node missing from it was missing from Slurm's own listing.
    Such a node is not registered: slurmctld runs no job on it, which is what an idle read
    says too (a job placed after the poll is protected by the next one, as on an idle node).
    So an unlabelled pod whose node is not registered yet -- every new pod -- is not
    labelled only to be unlabelled once it registers idle. A labelled pod keeps its label
    until Slurm reads the node (idle, drained, DOWN) or the absence grace proves no job: a
    node that vanished from the listing while it ran a job (slurmctld restarted without its
    dynamic nodes) is not taken at its word.

    Slurm's word that a labelled pod's node runs no job lifts the label only with the same
    evidence: a view of the node states that may not hold a recent poll whole (its
    `slurm_nodes` consumer stuck behind the cluster status) may hold an idle read from long
    ago, so the label stays until the view catches up."""
    if not pod.bound:
        return False
    if not pod.busy:
        return labelled and not absence_read
    return not (absence_read and pod.slurm is None and not labelled)


def owned_by(budget: Obj, spec: NodeSetSpec) -> bool:
    return any(
        mapping(ref).get("kind") == NODESET_KIND and mapping(ref).get("uid") == spec.uid
        for ref in meta(budget).get("ownerReferences") or ()
    )


def budget_as_wanted(budget: Obj, spec: NodeSetSpec) -> bool:
    """`protection_budget_spec`: minAvailable never met (no maxUnavailable) over exactly the
    NodeSet's protected pods, so no selected pod is evictable whatever the replicas; and no
    `unhealthyPodEvictionPolicy: AlwaysAllow`, which would let a busy pod not Ready go."""
    wanted = protection_budget_spec(spec.name)
    budget_spec = mapping(budget.get("spec"))
    selector = mapping(budget_spec.get("selector"))
    return (
        budget_spec.get("minAvailable") == wanted["minAvailable"]
        and budget_spec.get("maxUnavailable") is None
        and dict(mapping(selector.get("matchLabels"))) == wanted["selector"]["matchLabels"]
        and not selector.get("matchExpressions")
        and budget_spec.get("unhealthyPodEvictionPolicy") in (None, "IfHealthyBudget")
    )


def plan_protection(
    spec: NodeSetSpec,
    pods: Iterable[tuple[PodState, Obj]],
    budget: Obj | None,
    absence_read: bool = False,
) -> list[ProtectionAction]:
    """The label changes for `pods` (each with the pod object its labels are read from) and
    the budget change, for the NodeSet's budget as it is (`budget`: None when absent).
    `absence_read`: see `needs_protection`."""
    actions: list[ProtectionAction] = []
    enabled = spec.workload_disruption_protection
    name = budget_name(spec.name)
    ours = budget is not None and owned_by(budget, spec)
    if enabled and budget is None:
        actions.append(
            CreateDisruptionBudget(
                name, "workloadDisruptionProtection: pods running Slurm jobs refuse eviction"
            )
        )
    elif budget is not None and ours and (not enabled or not budget_as_wanted(budget, spec)):
        why = (
            "workloadDisruptionProtection is off"
            if not enabled
            else "its spec is not the protection budget's (minAvailable never met over the "
            "protected pods): made again"
        )
        rv = resource_version_of(budget)
        actions.append(DeleteDisruptionBudget(name_of(budget), uid_of(budget), rv, why))
    unprotect: list[ProtectionAction] = []
    for pod, raw in pods:
        if pod.terminating:
            continue
        current = labels_of(raw).get(POD_PROTECT_LABEL)
        labelled = is_labelled(raw)
        wanted = enabled and needs_protection(pod, labelled=labelled, absence_read=absence_read)
        if wanted and not labelled:
            actions.append(ProtectPod(pod, True, _why_protected(pod)))
        elif not wanted and current is not None:
            unprotect.append(ProtectPod(pod, False, _why_unprotected(pod, enabled)))
    # Protection first: a label that guards a job is sent before one that lifts a guard.
    return actions + unprotect


def _why_protected(pod: PodState) -> str:
    if pod.reported_busy and pod.slurm is not None:
        flags = ",".join(pod.slurm.flags)
        state = pod.slurm.base_state + (f"+{flags}" if flags else "")
        return f"Slurm node runs a job ({state}): eviction refused"
    return "Slurm state unknown or stale, a job may run: eviction refused (fail closed)"


def _why_unprotected(pod: PodState, enabled: bool) -> str:
    if not enabled:
        return "workloadDisruptionProtection is off"
    if not pod.bound:
        return "no kubelet has the pod: it runs no job"
    if pod.no_job is not None:
        return f"Slurm runs no job there ({pod.no_job}): eviction allowed"
    if pod.slurm is None:
        return "Slurm node not registered in a fresh poll: it runs no job, eviction allowed"
    return "Slurm node runs no job: eviction allowed"
