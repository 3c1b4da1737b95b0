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

from typing import Final, Literal

NODESET_LABEL: Final = "nodeflow.dev/nodeset"
# On nodes (an annotation): `<namespace>.<name>` of the one NodeSet that may use the node.
CLAIM_ANNOTATION: Final = "nodeflow.dev/nodeset"
SLURM_CLUSTER_LABEL: Final = "nodeflow.dev/slurm-cluster"
REVISION_LABEL: Final = "controller-revision-hash"
# On a NodeSet pod whose Slurm node runs (or may run) a job, while the NodeSet's
# workloadDisruptionProtection is on: its NodeSet's PodDisruptionBudget (maxUnavailable 0)
# selects it, so the eviction API refuses to evict it. Written by nodeset-controller alone;
# Slinky's label (`LabelNodeSetPodProtect`), with its value "true".
POD_PROTECT_LABEL: Final = "nodeset.slinky.slurm.net/pod-protect"

SLURM_DELETE_CONDITION: Final = "SlurmDelete"
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
