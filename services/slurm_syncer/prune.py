"""Pruning Slurm node records (`pruneSlurmNodeRecords: NodeNotFound`, as Slinky's NodeSet).

A NodeSet pod's slurmd registers a dynamic Slurm node named after the pod. When the pod goes
(a scale-in, or its Kubernetes node is gone) the record stays in Slurm, DOWN or drained, and
`sinfo` fills with dead nodes. A NodeSet that asks for it gets those records deleted through
slurmrestd (`DELETE /slurm/v0.0.4x/node/{name}`). The default, `Never`, keeps them.

A record is deleted only when all of these hold (fail closed, decided on a fresh poll and again
on the node as read just before the delete):
  - exactly one NodeSet of the cluster could have named it (`<podNamePrefix>-<ddd>-<ddd>`), and
    that NodeSet asks for `NodeNotFound`;
  - no pod of that name exists in the NodeSet's namespace;
  - Slurm reads it, known, and it runs nothing (no ALLOCATED, MIXED or COMPLETING);
  - it is out of service: DOWN (slurmctld has ended or requeued its jobs), or drained with a
    deletion reason of ours (the drain the pod's deletion asked for);
  - its reason is not external: a node a person drained keeps its record and their reason;
  - it is a dynamic node (Slurm deletes no other; checked on the fresh read).
A pod recreated under the same name (a rolling update) registers its node again: slurmd -Z
creates the record anew, and a delete that would land after that registration is not sent,
since the node then reads IDLE and undrained.
"""

from __future__ import annotations

import re
from collections.abc import Container, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

from nodeflow_contracts.slurm import SlurmNodeState
from nodeflow_contracts.subjects import object_key
from slurm_syncer.reasons import DEFAULT_DRAIN_REASONS, DrainReasons

PRUNE_FIELD: Final = "pruneSlurmNodeRecords"
PruneMode = Literal["Never", "NodeNotFound"]
PRUNE_MODES: Final[tuple[PruneMode, ...]] = ("Never", "NodeNotFound")
# The Slurm state flag of a dynamic node (registered by `slurmd -Z`).
DYNAMIC_FLAG: Final = "DYNAMIC_NORM"


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def prune_mode(nodeset: Mapping[str, Any]) -> PruneMode:
    """The NodeSet's choice; anything but `NodeNotFound` keeps the records (`Never`)."""
    value = _mapping(nodeset.get("spec")).get(PRUNE_FIELD)
    return "NodeNotFound" if value == "NodeNotFound" else "Never"


@dataclass(frozen=True)
class NodeSetNames:
    """The pod names one NodeSet gives: `<prefix>-<ddd>-<ddd>` in its namespace."""

    namespace: str
    name: str
    cluster: str
    mode: PruneMode
    pattern: re.Pattern[str]

    def names(self, node: str) -> bool:
        return self.pattern.fullmatch(node) is not None


def nodeset_names(nodeset: Mapping[str, Any]) -> NodeSetNames | None:
    meta = _mapping(nodeset.get("metadata"))
    spec = _mapping(nodeset.get("spec"))
    name, cluster = meta.get("name"), spec.get("slurmCluster")
    if not isinstance(name, str) or not isinstance(cluster, str) or not name or not cluster:
        return None
    prefix = spec.get("podNamePrefix") or name
    if not isinstance(prefix, str):
        return None
    return NodeSetNames(
        namespace=str(meta.get("namespace") or "default"),
        name=name,
        cluster=cluster,
        mode=prune_mode(nodeset),
        pattern=re.compile(re.escape(prefix) + r"-\d{3}-\d{3}"),
    )


def owner_of(node: str, nodesets: Iterable[NodeSetNames]) -> NodeSetNames | None:
    """The one NodeSet whose pods could be named `node`; None when none or several could."""
    owners = [nodeset for nodeset in nodesets if nodeset.names(node)]
    return owners[0] if len(owners) == 1 else None


@dataclass(frozen=True)
class PruneDecision:
    prune: bool
    why: str


def decide_prune(
    state: SlurmNodeState | None,
    owner: NodeSetNames | None,
    pod_exists: bool,
    reasons: DrainReasons = DEFAULT_DRAIN_REASONS,
) -> PruneDecision:
    """Whether the record of one Slurm node may be deleted (see the module's list)."""
    if owner is None:
        return PruneDecision(False, "no single NodeSet names this node")
    if owner.mode != "NodeNotFound":
        return PruneDecision(False, f"NodeSet {owner.namespace}/{owner.name} keeps its records")
    if pod_exists:
        return PruneDecision(False, "its pod exists")
    if state is None or not state.known:
        return PruneDecision(False, "Slurm state unknown")
    if state.busy:
        return PruneDecision(False, "Slurm runs work on it")
    if reasons.is_external(state.reason):
        return PruneDecision(False, f"external reason {state.reason!r} is kept")
    if state.base_state == "Down":
        return PruneDecision(True, "pod gone, node DOWN")
    if state.drained and reasons.is_delete(state.reason):
        return PruneDecision(True, "pod gone, node drained for its deletion")
    return PruneDecision(False, "node still in service")


def plan_prunes(
    cluster: str,
    states: Mapping[str, SlurmNodeState],
    nodesets: Iterable[Mapping[str, Any]],
    pod_exists: Container[str],
    reasons: DrainReasons = DEFAULT_DRAIN_REASONS,
) -> list[str]:
    """The nodes of `cluster` whose records may go, by name. `pod_exists` holds the KV keys
    (`<namespace>.<name>`) of the NodeSet pods that exist."""
    of_cluster = [
        names
        for names in (nodeset_names(nodeset) for nodeset in nodesets)
        if names is not None and names.cluster == cluster
    ]
    if not any(names.mode == "NodeNotFound" for names in of_cluster):
        return []
    chosen = []
    for node, state in sorted(states.items()):
        owner = owner_of(node, of_cluster)
        exists = owner is not None and object_key(owner.namespace, node) in pod_exists
        if decide_prune(state, owner, exists, reasons).prune:
            chosen.append(node)
    return chosen


def is_dynamic(raw: Mapping[str, Any]) -> bool:
    """A node slurmd registered by itself (`slurmd -Z`): the only kind Slurm deletes."""
    state = raw.get("state")
    words = [state] if isinstance(state, str) else state if isinstance(state, list) else []
    return DYNAMIC_FLAG in words
