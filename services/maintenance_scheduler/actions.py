"""What the decision core asks for; `commands` turns each into k8s-watcher commands."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from maintenance_scheduler.api import NodeMaintenance
from maintenance_scheduler.pods import PodFacts
from nodeflow_contracts.maintenance import MaintenanceDecisionKind


@dataclass(frozen=True)
class SetStatus:
    """Replace the request's status (resourceVersion precondition: a stale write conflicts)."""

    request: NodeMaintenance
    status: Mapping[str, Any]
    # (old phase, new phase) when the Ready reason changes: a ConditionChanged Event.
    phase_change: tuple[str, str] | None = None


@dataclass(frozen=True)
class PatchRequest:
    """Change the request's metadata: annotations (None removes one), finalizers and/or
    ownerReferences (each list written whole)."""

    request: NodeMaintenance
    annotations: Mapping[str, str | None] | None = None
    finalizers: tuple[str, ...] | None = None
    owner_references: tuple[Mapping[str, Any], ...] | None = None


@dataclass(frozen=True)
class CordonNode:
    request: NodeMaintenance
    node: str
    node_uid: str
    node_resource_version: str
    # Written to the node's cordon-reason annotation first: slurm-syncer drains the node's
    # Slurm node with it, so `scontrol show node` names the maintenance.
    reason: str


@dataclass(frozen=True)
class UncordonNode:
    request: NodeMaintenance
    node: str
    node_uid: str
    node_resource_version: str
    # Remove the cordon-reason annotation too (it is ours).
    clear_reason: bool


@dataclass(frozen=True)
class EvictPod:
    request: NodeMaintenance
    pod: PodFacts


@dataclass(frozen=True)
class DeleteRequest:
    """Garbage collection of a request Ready for longer than maxNodeMaintenanceTimeSeconds."""

    request: NodeMaintenance


@dataclass(frozen=True)
class Event:
    request: NodeMaintenance
    reason: str
    message: str
    type: Literal["Normal", "Warning"] = "Normal"
    # Distinguishes Events of the same reason on one request state (e.g. several pods).
    discriminator: str = ""


@dataclass(frozen=True)
class ConfigEvent:
    """An Event about the MaintenanceOperatorConfig, once per version of it (a value read
    here otherwise than NVIDIA's controller reads it)."""

    namespace: str
    name: str
    uid: str
    resource_version: str
    reason: str
    message: str
    type: Literal["Normal", "Warning"] = "Warning"


@dataclass(frozen=True)
class Decision:
    request: NodeMaintenance
    kind: MaintenanceDecisionKind
    reason: str
    message: str
    pod: str = ""
    node: str = ""


Action = (
    SetStatus
    | PatchRequest
    | CordonNode
    | UncordonNode
    | EvictPod
    | DeleteRequest
    | Event
    | ConfigEvent
)
