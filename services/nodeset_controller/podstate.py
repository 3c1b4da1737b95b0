"""One NodeSet pod as the scale-down, rolling-update and deletion rules see it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from nodeflow_contracts.slurm import SlurmNodeState
from nodeset_controller.objects import (
    REVISION_LABEL,
    SLURM_DELETE,
    condition,
    labels_of,
    meta,
    name_of,
    parse_time,
    pod_is_ready,
    pod_is_terminating,
    pod_node,
    pod_phase,
    resource_version_of,
    uid_of,
)


@dataclass(frozen=True)
class PodState:
    name: str
    uid: str
    resource_version: str
    node: str | None
    ready: bool
    phase: str
    created_at: float
    revision: str
    terminating: bool
    # Reason of SlurmDelete=True (ScalingDeleteScheduled / RollingDeleteScheduled), or None.
    delete_reason: str | None
    # When the deletion was scheduled: the condition's lastTransitionTime.
    delete_since: float | None
    # The pod's Slurm node as slurm-syncer last read it; None when it has no entry.
    slurm: SlurmNodeState | None

    @property
    def slurm_known(self) -> bool:
        return self.slurm is not None and self.slurm.known

    @property
    def busy(self) -> bool:
        """Running Slurm work. An unknown state counts as busy: fail closed."""
        return not self.slurm_known or bool(self.slurm and self.slurm.busy)

    @property
    def drain(self) -> bool:
        """DRAIN is set in Slurm (drained or draining), from a known state only."""
        return self.slurm_known and bool(self.slurm and self.slurm.drain)

    @property
    def drained_and_idle(self) -> bool:
        """Safe to delete: drained and idle, read from a *known* state (a failed lookup is
        never taken for drained)."""
        return (
            self.slurm is not None
            and self.slurm.known
            and self.slurm.drained
            and not self.slurm.busy
        )

    @property
    def never_started(self) -> bool:
        """No container ever ran (Pending, not bound or still creating): no slurmd, no job."""
        return self.phase == "Pending" and not self.ready

    @property
    def pending_deletion(self) -> bool:
        return self.delete_reason is not None or self.terminating

    @property
    def unavailable(self) -> bool:
        """Counts against maxUnavailable: not ready, or on its way out."""
        return not self.ready or self.pending_deletion


def pod_state(pod: Mapping[str, Any], slurm: SlurmNodeState | None) -> PodState:
    delete = condition(pod, SLURM_DELETE)
    scheduled = delete is not None and delete.get("status") == "True"
    reason = str(delete.get("reason") or "DeleteScheduled") if delete and scheduled else None
    return PodState(
        name=name_of(pod),
        uid=uid_of(pod),
        resource_version=resource_version_of(pod),
        node=pod_node(pod),
        ready=pod_is_ready(pod),
        phase=pod_phase(pod),
        created_at=parse_time(meta(pod).get("creationTimestamp")) or 0.0,
        revision=str(labels_of(pod).get(REVISION_LABEL) or ""),
        terminating=pod_is_terminating(pod),
        delete_reason=reason,
        delete_since=parse_time(delete.get("lastTransitionTime")) if delete and scheduled else None,
        slurm=slurm,
    )
