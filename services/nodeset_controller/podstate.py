"""One NodeSet pod as the scale-down, rolling-update and deletion rules see it."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal

from nodeflow_contracts.pod_protocol import (
    POD_WAIT_CONDITION,
    REVISION_LABEL,
    SCALING_DELETE,
    SLURM_DELETE_CONDITION,
    SLURM_NOT_REGISTERED_REASON,
    slurm_state_condition,
)
from nodeflow_contracts.slurm import SlurmNodeState
from nodeflow_kube.fields import (
    annotations_of,
    condition,
    labels_of,
    mapping,
    meta,
    name_of,
    parse_time,
    resource_version_of,
    uid_of,
)
from nodeset_controller.objects import (
    pod_is_ready,
    pod_is_terminating,
    pod_node,
    pod_phase,
)

# Why Slurm runs no job on a pod's node although the node is not drained (see `runs_no_job`).
NoJobReason = Literal["SlurmNodeDown", "NodeNotRegistered"]

UNKNOWN_CONDITION = slurm_state_condition("Unknown")

# Scale-down hints a person or a tool sets on a pod, under the names Slinky's slurm-operator
# reads (so a team moving from it keeps them): within one scale-down rank the lower cost goes
# first (an int32, 0 when unset or malformed), then the earlier deadline (RFC 3339, by when
# the node's work should be done; unset or malformed counts as the earliest, as in Slinky).
POD_DELETION_COST_ANNOTATION = "nodeset.slinky.slurm.net/pod-deletion-cost"
POD_DEADLINE_ANNOTATION = "nodeset.slinky.slurm.net/pod-deadline"
_INT32 = re.compile(r"^(0|-?[1-9][0-9]*)$")
_INT32_RANGE = range(-(2**31), 2**31)

# SlurmDelete's lastTransitionTime has whole seconds: the condition may have been set up to
# this much after the time it names.
DELETE_TIME_RESOLUTION = 1.0


@dataclass(frozen=True)
class PodState:
    name: str
    uid: str
    resource_version: str
    node: str | None
    ready: bool
    # status.phase as written; "" when missing.
    phase: str
    created_at: float
    revision: str
    terminating: bool
    # Reason of SlurmDelete=True (see pod_protocol.DELETE_REASONS), or None.
    delete_reason: str | None
    # When the deletion was scheduled: the condition's lastTransitionTime.
    delete_since: float | None
    # The pod's Slurm node as slurm-syncer last read it, if that reading may be trusted (its
    # cluster's view is fresh); None when it has no entry or the view is stale.
    slurm: SlurmNodeState | None
    # Since when slurm-syncer has found the node absent from successful polls (the pod's
    # SlurmNodeStateUnknown condition with reason NodeNotRegistered); None otherwise.
    not_registered_since: float | None = None
    # Set when Slurm runs no job on the node although it is not drained (see runs_no_job).
    no_job: NoJobReason | None = None
    # spec.nodeName is set: a kubelet has the pod (`node` is also the pinned node before).
    bound: bool = True
    # The replica count a ScalingDeleteScheduled mark was made for (`scale_down_message`);
    # None for another mark, or one whose message does not say.
    delete_target: int | None = None
    # When the Slurm state in `slurm` (and the absence behind `no_job`) was last confirmed: the
    # last successful poll of its fresh cluster; None when the view is stale or unknown.
    slurm_read_at: float | None = None
    # POD_DELETION_COST_ANNOTATION and POD_DEADLINE_ANNOTATION, read (see there).
    deletion_cost: int = 0
    deadline: float | None = None
    # When the pod last turned Ready (its Ready condition's lastTransitionTime), while Ready.
    ready_since: float | None = None
    # Ready for less than the NodeSet's minReadySeconds (or since an unknown time): not yet
    # available. Set by the plan, which knows the clock (`with_availability`).
    not_yet_available: bool = False
    # The pod's POD_WAIT_CONDITION as written (reason, message) while True; None without one.
    wait: tuple[str, str] | None = None

    @property
    def slurm_known(self) -> bool:
        return self.slurm is not None and self.slurm.known

    @property
    def busy(self) -> bool:
        """Running Slurm work. An unknown state counts as busy (fail closed), unless Slurm has
        shown it runs no job there (DOWN, or not registered for the grace)."""
        if self.no_job is not None:
            return False
        return not self.slurm_known or bool(self.slurm and self.slurm.busy)

    @property
    def reported_busy(self) -> bool:
        """Slurm itself, read fresh, says the node runs work."""
        return self.slurm is not None and self.slurm.known and self.slurm.busy

    @property
    def drain(self) -> bool:
        """DRAIN is set in Slurm (drained or draining), from a known state only."""
        return self.slurm_known and bool(self.slurm and self.slurm.drain)

    @property
    def drained(self) -> bool:
        """Drained in the reference's sense (Drain and not Busy), from a known state only."""
        return self.slurm is not None and self.slurm.known and self.slurm.drained

    @property
    def drained_and_idle(self) -> bool:
        """Safe to delete: drained and idle, read from a *known* state (a failed lookup is
        never taken for drained)."""
        return self.drained and not self.reported_busy

    @property
    def runs_no_job(self) -> bool:
        """Deleting the pod ends no Slurm job: drained and idle, or Slurm has no job there
        (DOWN: slurmctld has already ended or requeued its jobs; or absent from every
        successful poll of a fresh, reachable cluster for longer than the grace)."""
        return self.drained_and_idle or self.no_job is not None

    @property
    def never_started(self) -> bool:
        """No Slurm work can run in the pod: no kubelet has it (not bound) and its phase says
        Pending (a missing phase proves nothing). A bound pod never qualifies: the kubelet
        reports Pending while any container waits (a sidecar whose image does not pull)
        though slurmd runs and is registered beside it, and an "idle" read within the
        freshness window says nothing of a job placed after that poll. A bound pod leaves
        only on Slurm's word read after its SlurmDelete was set (`read_since_delete`)."""
        if self.phase != "Pending" or self.ready or self.reported_busy:
            return False
        return not self.bound

    @property
    def read_since_delete(self) -> bool:
        """Slurm was read after SlurmDelete was set, so what it reports follows the drain the
        condition asks for: a state read before (a drain since undone by a scale back up, an
        idle node that took a job since) proves nothing. The condition's time has whole
        seconds, so the read must be a second past it; with no time, nothing is proven."""
        if self.delete_since is None or self.slurm_read_at is None:
            return False
        return self.slurm_read_at >= self.delete_since + DELETE_TIME_RESOLUTION

    @property
    def pending_deletion(self) -> bool:
        return self.delete_reason is not None or self.terminating

    @property
    def available(self) -> bool:
        """Ready for at least minReadySeconds (see `with_availability`)."""
        return self.ready and not self.not_yet_available

    @property
    def unavailable(self) -> bool:
        """Counts against maxUnavailable: not available, or on its way out."""
        return not self.available or self.pending_deletion


def available_at(pod: PodState, min_ready_seconds: int) -> float | None:
    """When a Ready pod becomes available: `min_ready_seconds` after it turned Ready. None when
    that time is unknown (a Ready condition without lastTransitionTime: never available while
    minReadySeconds is set, as Kubernetes' IsPodAvailable, so the budget fails closed)."""
    if pod.ready_since is None:
        return None
    return pod.ready_since + min_ready_seconds


def with_availability(pod: PodState, min_ready_seconds: int, now: float) -> PodState:
    """The pod with `not_yet_available` set when it is Ready for less than
    `min_ready_seconds` at `now` (a DaemonSet's and Slinky's minReadySeconds)."""
    if min_ready_seconds <= 0 or not pod.ready:
        return pod
    at = available_at(pod, min_ready_seconds)
    if at is not None and now >= at:
        return pod
    return replace(pod, not_yet_available=True)


def not_registered_since(pod: Mapping[str, Any]) -> float | None:
    """When slurm-syncer first found the pod's Slurm node absent from a successful poll."""
    unknown = condition(pod, UNKNOWN_CONDITION)
    if (
        unknown is None
        or unknown.get("status") != "True"
        or unknown.get("reason") != SLURM_NOT_REGISTERED_REASON
    ):
        return None
    return parse_time(unknown.get("lastTransitionTime"))


# A scale-down mark's message starts with the replica count it was made for. Kept on the pod
# (durable, in the same write as the mark), so a later plan knows which marks the desired
# count has outgrown without relying on a status write that may have been refused.
_SCALE_DOWN_MESSAGE = re.compile(r"scale down to (\d+):")


def scale_down_message(desired: int, why: str) -> str:
    """The message of a ScalingDeleteScheduled mark made while scaling down to `desired`."""
    return f"scale down to {desired}: {why}"


def scale_down_target(message: object) -> int | None:
    """The replica count a mark's `scale_down_message` names, or None."""
    found = _SCALE_DOWN_MESSAGE.match(message) if isinstance(message, str) else None
    return int(found.group(1)) if found else None


def deletion_cost(pod: Mapping[str, Any]) -> int:
    """The pod's deletion cost: an int32 written without `+` or leading zeros (as Slinky and
    the ReplicaSet controller read it), else 0."""
    raw = annotations_of(pod).get(POD_DELETION_COST_ANNOTATION)
    if not isinstance(raw, str) or not _INT32.match(raw) or int(raw) not in _INT32_RANGE:
        return 0
    return int(raw)


def deadline(pod: Mapping[str, Any]) -> float | None:
    """The pod's deadline (seconds since the epoch), or None when unset or malformed."""
    return parse_time(annotations_of(pod).get(POD_DEADLINE_ANNOTATION))


def pod_state(pod: Mapping[str, Any], slurm: SlurmNodeState | None) -> PodState:
    """The pod with `slurm`, its Slurm node's state if it may be trusted (None otherwise).
    A DOWN node is marked as running no job here; absence needs the clock and the cluster's
    status, so the plan marks it (`with_absence`)."""
    delete = condition(pod, SLURM_DELETE_CONDITION)
    scheduled = delete is not None and delete.get("status") == "True"
    reason = str(delete.get("reason") or "DeleteScheduled") if delete and scheduled else None
    # DOWN: slurmctld has ended or requeued the node's jobs -- unless it still reports work
    # there (COMPLETING): only a forced timeout deletes a pod Slurm reports busy.
    down = slurm is not None and slurm.known and slurm.base_state == "Down" and not slurm.busy
    ready = condition(pod, "Ready")
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
        not_registered_since=not_registered_since(pod) if slurm is None else None,
        no_job="SlurmNodeDown" if down else None,
        bound=bool(mapping(pod.get("spec")).get("nodeName")),
        delete_target=(
            scale_down_target(delete.get("message"))
            if delete and scheduled and reason == SCALING_DELETE
            else None
        ),
        deletion_cost=deletion_cost(pod),
        deadline=deadline(pod),
        ready_since=(
            parse_time(ready.get("lastTransitionTime"))
            if ready is not None and ready.get("status") == "True"
            else None
        ),
        wait=written_wait(pod),
    )


def written_wait(pod: Mapping[str, Any]) -> tuple[str, str] | None:
    """The pod's wait condition as last written (reason, message), None without a True one."""
    wait = condition(pod, POD_WAIT_CONDITION)
    if wait is None or wait.get("status") != "True":
        return None
    return str(wait.get("reason") or ""), str(wait.get("message") or "")
