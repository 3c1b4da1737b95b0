"""The NodeSet pod protocol: how nodeset-controller and slurm-syncer agree, through the pod
and its node alone, on when a Slurm node may go away. Both services import every name below
from here and nowhere else; neither ever calls the other.

The objects
  - A NodeSet pod carries the label `NODESET_LABEL` (`nodeflow.dev/nodeset: <nodeset>`) and,
    optionally, `SLURM_CLUSTER_LABEL`; its name is its Slurm node's name.
  - Its Slurm state is projected onto it as `SlurmNodeState<State>` conditions
    (`slurm_state_condition`), written by slurm-syncer alone.
  - `SLURM_DELETE_CONDITION` (`SlurmDelete`) is written by nodeset-controller alone. Its
    reason says why the pod is to go (`DELETE_REASONS`); its lastTransitionTime starts the
    forced-deletion clock.
  - `POD_CORDON_ANNOTATION` on a pod and `Node.spec.unschedulable` (with the optional
    `NODE_CORDON_REASON_ANNOTATION`) are the cordon signals. When slurm-syncer marks a pod
    cordoned because its node was cordoned, it also writes `POD_CORDON_SOURCE_ANNOTATION:
    node`, so the mark can be told apart from one a person set.

The handshake, from start to end
  1. Set: the controller decides a pod must go (scale-down, rolling update, misscheduled) and
     sets SlurmDelete=True with the reason. Once set for a pod, it stays set until the pod is
     deleted or the reason for it is gone (the desired count really rose; the template
     matches again).
  2. Drain: slurm-syncer sees SlurmDelete=True and drains the Slurm node with a reason that
     starts with the drain-reason prefix (`DEFAULT_DRAIN_REASON_PREFIX` plus `delete: `).
     Slurm then lets running jobs finish and starts no new one.
  3. Delete: the controller deletes the pod once its Slurm state, read fresh and known, is
     drained and idle; or the Slurm node is DOWN (slurmctld has already ended or requeued its
     jobs); or the node has been absent from every successful poll of its cluster for the
     absence grace; or (scale-down only) the forced-deletion timeout has passed. Nothing else
     deletes a pod that Slurm may report busy: an unknown or stale state is busy (fail
     closed), and a Kubernetes object missing from a view is not proof that it is gone.
  4. Cancel: if the controller clears SlurmDelete before the delete, slurm-syncer undrains the
     node (only a drain whose reason carries our prefix; an external reason is never touched).
  5. Cordon: a cordoned Kubernetes node (or a pod marked cordoned) drains the Slurm node with
     a `cordon: ` reason. Uncordon reverses it: the node's uncordon removes a pod mark that
     came from the node and undrains; a mark a person set stays until they remove it.

Names
  The toleration key and the drain-reason prefix are those the reference operators use
  (`sunk.coreweave.com/lock`, `slurm-operator:`), so a cluster that ran them keeps working;
  each service takes another through its settings for those who need one.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, Literal

NODESET_LABEL: Final = "nodeflow.dev/nodeset"
# On nodes (an annotation): `<namespace>.<name>` of the one NodeSet that may use the node.
CLAIM_ANNOTATION: Final = "nodeflow.dev/nodeset"
SLURM_CLUSTER_LABEL: Final = "nodeflow.dev/slurm-cluster"
REVISION_LABEL: Final = "controller-revision-hash"
# On a NodeSet pod whose Slurm node runs (or may run) a job, while the NodeSet's
# workloadDisruptionProtection is on: its NodeSet's PodDisruptionBudget
# (`protection_budget_problem`) selects it, so the eviction API refuses to evict it. Written by
# nodeset-controller alone; Slinky's label (`LabelNodeSetPodProtect`), with its value "true".
POD_PROTECT_LABEL: Final = "nodeset.slinky.slurm.net/pod-protect"
POD_PROTECTED: Final = "true"
# The protection budget's integer `minAvailable` (the largest int32 the API server accepts).
# An integer minAvailable makes the disruption controller expect exactly the pods the budget
# selects and want this many healthy: never met, so no selected pod may be evicted whatever
# the NodeSet's replicas. (`maxUnavailable: 0` would take the expected count from the
# NodeSet's scale subresource, `.spec.replicas`: after a scale-down 10 -> 2 with 10 busy pods
# it would allow 8 evictions.)
PROTECTION_BUDGET_MIN_AVAILABLE: Final = 2147483647

SLURM_DELETE_CONDITION: Final = "SlurmDelete"
# Why a pod the NodeSet wants gone (scale-down, rolling update, misscheduled) is not removed
# yet: True with the cause as reason (nodeset_controller.status.WaitCause) and what it waits
# for as message; absent while the pod does not wait. Written by nodeset-controller alone,
# only when the cause or its words change. Neither anchor has such a condition: the type is
# ours, domain-qualified as custom pod condition types are.
POD_WAIT_CONDITION: Final = "nodeflow.dev/DeleteWaiting"
SCALING_DELETE: Final = "ScalingDeleteScheduled"
ROLLING_DELETE: Final = "RollingDeleteScheduled"
MISSCHEDULED_DELETE: Final = "MisscheduledDeleteScheduled"
DeleteReason = Literal[
    "ScalingDeleteScheduled", "RollingDeleteScheduled", "MisscheduledDeleteScheduled"
]
DELETE_REASONS: Final[dict[str, str]] = {
    SCALING_DELETE: "NodeSet scale-down",
    ROLLING_DELETE: "NodeSet rolling update",
    MISSCHEDULED_DELETE: "pod no longer fits its node",
}

POD_CORDON_ANNOTATION: Final = "nodeflow.dev/pod-cordon"
# Set beside POD_CORDON_ANNOTATION when the mark came from the node's cordon.
POD_CORDON_SOURCE_ANNOTATION: Final = "nodeflow.dev/pod-cordon-source"
POD_CORDON_FROM_NODE: Final = "node"
NODE_CORDON_REASON_ANNOTATION: Final = "nodeflow.dev/node-cordon-reason"

DEFAULT_LOCK_TOLERATION_KEY: Final = "sunk.coreweave.com/lock"
DEFAULT_DRAIN_REASON_PREFIX: Final = "slurm-operator:"
CORDON_REASON_KIND: Final = "cordon: "
DELETE_REASON_KIND: Final = "delete: "

SLURM_STATE_CONDITION_PREFIX: Final = "SlurmNodeState"
# Reasons of SlurmNodeStateUnknown, the condition of a pod whose Slurm node cannot be read.
# Not registered: its cluster answered a poll without the node; the condition's
# lastTransitionTime is when that absence started (kept while it lasts), so a reader can
# measure the absence grace from it.
SLURM_NOT_REGISTERED_REASON: Final = "NodeNotRegistered"
# The cluster's last poll failed: nothing is known of the node (fail closed).
SLURM_CLUSTER_UNREACHABLE_REASON: Final = "ClusterUnreachable"
# The cluster answered but the node's entry could not be read.
SLURM_NODE_UNREADABLE_REASON: Final = "NodeUnreadable"


def slurm_state_condition(state_or_flag: str) -> str:
    """The pod condition type of a Slurm base state or flag, e.g. `SlurmNodeStateIdle`."""
    return SLURM_STATE_CONDITION_PREFIX + state_or_flag


def protection_budget_spec(nodeset: str) -> dict[str, Any]:
    """The spec of NodeSet `nodeset`'s protection PodDisruptionBudget: its pods that carry the
    protect label, none of them evictable (`PROTECTION_BUDGET_MIN_AVAILABLE`)."""
    return {
        "minAvailable": PROTECTION_BUDGET_MIN_AVAILABLE,
        "selector": {"matchLabels": {NODESET_LABEL: nodeset, POD_PROTECT_LABEL: POD_PROTECTED}},
    }


def protection_budget_problem(budget: Mapping[str, Any]) -> str | None:
    """Why `budget` is not a NodeSet's protection budget (None: it is one): labelled with its
    NodeSet, and its spec exactly `protection_budget_spec` of that NodeSet -- so it can refuse
    the eviction of no pod but that NodeSet's protected ones (a budget over other pods would
    block drains of the whole namespace)."""
    metadata = budget.get("metadata")
    labels = metadata.get("labels") if isinstance(metadata, Mapping) else None
    nodeset = labels.get(NODESET_LABEL) if isinstance(labels, Mapping) else None
    if not isinstance(nodeset, str) or not nodeset:
        return f"a protection budget is labelled {NODESET_LABEL} with its NodeSet"
    if budget.get("spec") != protection_budget_spec(nodeset):
        return (
            f"a protection budget's spec is minAvailable {PROTECTION_BUDGET_MIN_AVAILABLE} over "
            f"the pods labelled {NODESET_LABEL}={nodeset} and {POD_PROTECT_LABEL}={POD_PROTECTED}"
        )
    return None
