"""Slurm node state -> pod conditions, and the status patch that gets a pod there.

One condition per state, type `SlurmNodeState<X>`, status True: exactly one base state plus
one per flag. Every message is the Slurm node reason (so the Drain condition carries the drain
reason). A node that cannot be read has only SlurmNodeStateUnknown, whose reason says why
(`NodeNotRegistered`, `ClusterUnreachable`, `NodeUnreadable`) and whose message says it in
words. When nothing differs there is no patch at all (minimal writes: the messages carry
nothing that changes from poll to poll).

A patch is complete: it sets every wanted condition (reason included, "" clearing an old one)
and removes, with the strategic-merge `$patch: delete` directive, every other condition type
of the prefix, whether the pod shows it or not. So what a patch changes depends only on the
state it aims at, not on the pod as last seen: the view of a pod lags the patches in flight,
and two patches computed from two stale views toward one state are the same patch (sent once,
see reconcile.SentRecord); any such patch that lands leaves the pod exactly at its state.

lastTransitionTime is when the condition last began to hold for its reason: it is kept while
the condition stays True with the same reason, even when its message changes, and set afresh
when the reason changes. So the `NodeNotRegistered` time is when the node's absence started,
which nodeset-controller measures its absence grace from.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from nodeflow_contracts.pod_protocol import (
    SLURM_CLUSTER_UNREACHABLE_REASON,
    SLURM_NODE_UNREADABLE_REASON,
    SLURM_NOT_REGISTERED_REASON,
    SLURM_STATE_CONDITION_PREFIX,
    slurm_state_condition,
)
from nodeflow_contracts.slurm import BASE_STATES, FLAGS, SlurmNodeState
from nodeflow_kube.fields import rfc3339

TRUE = "True"


@dataclass(frozen=True)
class Wanted:
    """One condition as it should be: status True, this message and reason."""

    message: str
    reason: str = ""


def cluster_unreachable(cluster: str) -> Wanted:
    return Wanted(f"Slurm cluster {cluster} cannot be reached", SLURM_CLUSTER_UNREACHABLE_REASON)


def node_not_registered(cluster: str, node: str) -> Wanted:
    return Wanted(
        f"Slurm node {node} is not registered: Slurm cluster {cluster} answers without it",
        SLURM_NOT_REGISTERED_REASON,
    )


def node_unreadable(cluster: str, node: str) -> Wanted:
    return Wanted(
        f"Slurm node {node} of cluster {cluster} could not be read", SLURM_NODE_UNREADABLE_REASON
    )


def unknown_because(
    cluster: str, node: str, reachable: bool, state: SlurmNodeState | None
) -> Wanted:
    """Why a node's state is unknown: its cluster, its absence, or its entry."""
    if not reachable:
        return cluster_unreachable(cluster)
    if state is None:
        return node_not_registered(cluster, node)
    return node_unreadable(cluster, node)


def desired_conditions(state: SlurmNodeState | None, unknown: Wanted) -> dict[str, Wanted]:
    """Condition type -> wanted condition for a pod whose Slurm node is `state` (None or not
    known: unreadable, for the reason `unknown` gives)."""
    if state is None or not state.known:
        return {slurm_state_condition("Unknown"): unknown}
    conditions = {slurm_state_condition(state.base_state): Wanted(state.reason)}
    for flag in state.flags:
        conditions[slurm_state_condition(flag)] = Wanted(state.reason)
    return conditions


def current_conditions(pod_conditions: Iterable[Any]) -> dict[str, Mapping[str, Any]]:
    """The pod's conditions of our prefix, by type (malformed entries ignored)."""
    found: dict[str, Mapping[str, Any]] = {}
    for entry in pod_conditions:
        if isinstance(entry, Mapping):
            kind = entry.get("type")
            if isinstance(kind, str) and kind.startswith(SLURM_STATE_CONDITION_PREFIX):
                found[kind] = entry
    return found


def _text(entry: Mapping[str, Any], field: str) -> str:
    value = entry.get(field)
    return value if isinstance(value, str) else ""


# Every condition type the syncer writes: a complete patch removes all but the wanted ones.
ALL_CONDITION_TYPES: tuple[str, ...] = tuple(
    slurm_state_condition(name) for name in (*BASE_STATES, *FLAGS)
)


def _holds(existing: Mapping[str, Any] | None, wanted: Wanted) -> bool:
    """The pod shows the condition True for the wanted reason (its transition time stands)."""
    return (
        existing is not None
        and existing.get("status") == TRUE
        and _text(existing, "reason") == wanted.reason
    )


def _shown(existing: Mapping[str, Any] | None, wanted: Wanted) -> bool:
    return _holds(existing, wanted) and _text(existing or {}, "message") == wanted.message


def conditions_patch(
    pod_conditions: Iterable[Any], desired: Mapping[str, Wanted], now: float
) -> dict[str, Any] | None:
    """A complete strategic merge patch of `status.conditions` toward `desired`, or None when
    the pod already shows exactly `desired`."""
    current = current_conditions(pod_conditions)
    if current.keys() == desired.keys() and all(
        _shown(current.get(kind), wanted) for kind, wanted in desired.items()
    ):
        return None
    entries: list[dict[str, Any]] = []
    for kind in sorted(desired):
        wanted = desired[kind]
        existing = current.get(kind)
        transition = (
            existing.get("lastTransitionTime")
            if existing is not None and _holds(existing, wanted)
            else None
        )
        entries.append(
            {
                "type": kind,
                "status": TRUE,
                "message": wanted.message,
                # Always named: a merge keeps a field the patch leaves out, and the pod as
                # last seen may not show the reason a patch in flight is writing.
                "reason": wanted.reason,
                "lastTransitionTime": transition or rfc3339(now),
            }
        )
    for kind in sorted({*ALL_CONDITION_TYPES, *current} - desired.keys()):
        entries.append({"$patch": "delete", "type": kind})
    return {"status": {"conditions": entries}}


def patch_digest(patch: Mapping[str, Any]) -> str:
    """Identifies what a patch changes, leaving out the timestamps it carries."""
    entries = patch.get("status", {}).get("conditions", [])
    stable = [{k: v for k, v in e.items() if k != "lastTransitionTime"} for e in entries]
    text = json.dumps(stable, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]
