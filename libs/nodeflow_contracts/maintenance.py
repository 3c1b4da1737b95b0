"""maintenance-scheduler decisions, published for audit on
`maintenance.v1.<namespace>.<name>.decision` (the NodeMaintenance's namespace and name)."""

from __future__ import annotations

from typing import Literal

import msgspec

from nodeflow_contracts import subjects

MaintenanceDecisionKind = Literal[
    "initialized",
    "scheduled",
    "skipped",
    "phase-changed",
    "cordon",
    "uncordon",
    "evict",
    "waiting-for-slurm",
    "drain-blocked",
    "drain-timeout",
    "wait-timeout",
    "node-not-found",
    "invalid-spec",
    "waiting-for-requestors",
    "finalizer-removed",
    "garbage-collect",
]


class MaintenanceDecision(msgspec.Struct, frozen=True, kw_only=True):
    decision_id: str
    namespace: str
    name: str
    kind: MaintenanceDecisionKind
    # Short machine-readable reason, e.g. a phase or `unavailability-budget`.
    reason: str
    # Human-readable explanation, e.g. "no slot: 2 of 2 parallel operations in use".
    message: str
    decided_at: float
    requestor: str = ""
    node: str = ""
    pod: str = ""

    @property
    def subject(self) -> str:
        return subjects.maintenance_decision(self.namespace, self.name)
