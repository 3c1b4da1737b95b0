"""maintenance-scheduler decisions, published for audit on
`maintenance.v1.nodemaintenance.<namespace>.<name>.decision` (the NodeMaintenance's namespace
and name) and `maintenance.v1.skyhook.<skyhook>.decision`."""

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
    "drain-restarted",
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
    # Human-readable explanation, e.g. "waiting for a slot: 2 of 2 maxParallelOperations in
    # progress".
    message: str
    decided_at: float
    requestor: str = ""
    node: str = ""
    pod: str = ""

    @property
    def subject(self) -> str:
        return subjects.maintenance_decision(self.namespace, self.name)


SkyhookDecisionKind = Literal[
    # A package stage on a node began, ended, failed or was retried.
    "stage",
    # A rollout batch of a compartment was judged (and maybe stopped the rollout).
    "batch",
    # The controller failed a Job itself (its image never pulled within the grace).
    "fail-job",
    # A NodeMaintenance was requested for an interrupt, or released after it.
    "maintenance",
]


class SkyhookDecision(msgspec.Struct, frozen=True, kw_only=True):
    """A decision of maintenance-scheduler's Skyhook controller, on
    `maintenance.v1.skyhook.<skyhook>.decision`, about the Skyhook (skyhook.nvidia.com) or
    the NodeWright (nodewright.nvidia.com) named `skyhook`: both kinds share the subject,
    `object_kind` tells them apart (absent in a message of an earlier release: a Skyhook)."""

    decision_id: str
    skyhook: str
    kind: SkyhookDecisionKind
    # Short machine-readable reason, e.g. `apply-complete`, `BackoffLimitExceeded`.
    reason: str
    message: str
    decided_at: float
    node: str = ""
    package: str = ""
    stage: str = ""
    compartment: str = ""
    object_kind: str = "Skyhook"

    @property
    def subject(self) -> str:
        return subjects.skyhook_decision(self.skyhook)
