"""Slurm node state -> pod conditions, and the status patch that gets a pod there.

One condition per state, type `SlurmNodeState<X>`, status True: exactly one base state plus
one per flag. Every message is the Slurm node reason (so the Drain condition carries the drain
reason); a node that cannot be read has only SlurmNodeStateUnknown, whose message says why.
Conditions of the prefix that no longer hold are removed with the strategic-merge `$patch:
delete` directive; when nothing differs there is no patch at all.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from nodeflow_contracts.slurm import SlurmNodeState

CONDITION_PREFIX = "SlurmNodeState"
TRUE = "True"


def condition_type(state: str) -> str:
    return CONDITION_PREFIX + state


def desired_conditions(state: SlurmNodeState | None, unreadable_because: str) -> dict[str, str]:
    """Condition type -> message for a pod whose Slurm node is `state` (None: not readable)."""
    if state is None or not state.known:
        return {condition_type("Unknown"): unreadable_because}
    conditions = {condition_type(state.base_state): state.reason}
    for flag in state.flags:
        conditions[condition_type(flag)] = state.reason
    return conditions


def rfc3339(now: float) -> str:
    return datetime.fromtimestamp(int(now), tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def current_conditions(pod_conditions: Iterable[Any]) -> dict[str, Mapping[str, Any]]:
    """The pod's conditions of our prefix, by type (malformed entries ignored)."""
    found: dict[str, Mapping[str, Any]] = {}
    for entry in pod_conditions:
        if isinstance(entry, Mapping):
            kind = entry.get("type")
            if isinstance(kind, str) and kind.startswith(CONDITION_PREFIX):
                found[kind] = entry
    return found


def conditions_patch(
    pod_conditions: Iterable[Any], desired: Mapping[str, str], now: float
) -> dict[str, Any] | None:
    """A strategic merge patch of `status.conditions`, or None when the pod already matches."""
    current = current_conditions(pod_conditions)
    entries: list[dict[str, Any]] = []
    for kind in sorted(desired):
        message = desired[kind]
        existing = current.get(kind)
        if (
            existing is not None
            and existing.get("status") == TRUE
            and (existing.get("message") or "") == message
        ):
            continue
        transition = (
            existing.get("lastTransitionTime")
            if existing is not None and existing.get("status") == TRUE
            else None
        )
        entries.append(
            {
                "type": kind,
                "status": TRUE,
                "message": message,
                "lastTransitionTime": transition or rfc3339(now),
            }
        )
    for kind in sorted(current):
        if kind not in desired:
            entries.append({"$patch": "delete", "type": kind})
    if not entries:
        return None
    return {"status": {"conditions": entries}}


def patch_digest(patch: Mapping[str, Any]) -> str:
    """Identifies what a patch changes, leaving out the timestamps it carries."""
    entries = patch.get("status", {}).get("conditions", [])
    stable = [{k: v for k, v in e.items() if k != "lastTransitionTime"} for e in entries]
    text = json.dumps(stable, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]
