"""Planner actions -> the k8s-watcher commands and decision records that carry them out (pure).

The placer uses six operations, all as sender `topology-placer`:

| op            | target                  | what                                               |
|---------------|-------------------------|----------------------------------------------------|
| nominate      | Pod                     | status.nominatedNodeName (set, or "" to clear)      |
| bind          | Pod                     | the binding subresource                             |
| patch         | Pod status (strategic)  | condition PodScheduled=False, DisruptionTarget=True |
| patch         | PersistentVolumeClaim (merge) | annotation volume.kubernetes.io/selected-node |
| delete        | Pod                     | victims and broken gangs, after DisruptionTarget    |
| update-status | PodGroup, ClusterNetworkTopology | their status subresource                  |
| record-event  | PodGroup                | why a gang waits, failed or preempted               |

Every idempotency key derives from what the decision was based on (the target's uid and
resourceVersion, the node, the message), so a restarted placer re-sending a command it had
already sent is dropped as a duplicate, and a decision made from a newer state gets a new
key. Pod commands carry the pod's uid as a precondition; nominations and status updates also
its resourceVersion, so a stale plan is refused with a conflict and re-planned.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from nodeflow_contracts.k8s import (
    BindPod,
    CommandOperation,
    DeleteObject,
    K8sCommand,
    NominatePod,
    ObjectRef,
    PatchObject,
    RecordEvent,
    UpdateStatus,
    deadline_after,
)
from nodeflow_contracts.placement import PlacementDecision, PodAssignment
from topology_placer.planner import (
    Action,
    Bind,
    Decision,
    Disrupt,
    MarkUnschedulable,
    Nominate,
    Notice,
    SelectNode,
    UpdateGroupStatus,
    UpdateTopologyStatus,
)
from topology_placer.pods import DISRUPTION_TARGET, POD_SCHEDULED, PodRef
from topology_placer.volumes import SELECTED_NODE_ANNOTATION

SENDER = "topology-placer"
REPORTING_COMPONENT = "nodeflow-topology-placer"
POD_GROUP_API_VERSION = "scheduling.sigs.k8s.io/v1alpha1"
TOPOLOGY_API_VERSION = "scheduling.koordinator.sh/v1alpha1"


def stable_key(*parts: object) -> str:
    digest = hashlib.sha256("\x1f".join(str(p) for p in parts).encode()).hexdigest()[:32]
    return f"placer:{parts[0]}:{digest}"


@dataclass(frozen=True)
class Outgoing:
    """One command or decision. `command` None: a decision record only."""

    key: str
    command: K8sCommand | None = None
    decision: PlacementDecision | None = None


def pod_target(pod: PodRef, *, with_rv: bool) -> ObjectRef:
    return ObjectRef(
        api_version="v1",
        kind="Pod",
        name=pod.name,
        namespace=pod.namespace,
        uid=pod.uid or None,
        resource_version=(pod.resource_version or None) if with_rv else None,
    )


# How long a placement command is worth applying: a nomination or bind held longer (a crashed
# k8s-watcher's) may no longer fit what the cluster has become, so it is reported expired and
# the next pass decides again.
COMMAND_LIFETIME_SECONDS = 30.0


def _command(
    key: str, target: ObjectRef, operation: CommandOperation, reason: str, now: float
) -> Outgoing:
    return Outgoing(
        key=key,
        command=K8sCommand(
            idempotency_key=key,
            sender=SENDER,
            sent_at=now,
            expires_at=deadline_after(COMMAND_LIFETIME_SECONDS, now=now),
            target=target,
            operation=operation,
            reason=reason[:1024],
        ),
    )


def _condition_patch(kind: str, status: str, reason: str, message: str, at: str) -> PatchObject:
    condition = {
        "type": kind,
        "status": status,
        "reason": reason,
        "message": message[:1024],
        "lastTransitionTime": at,
        "lastProbeTime": None,
    }
    # Strategic merge keys pod conditions by type: only this one changes.
    return PatchObject(
        patch_type="strategic", patch={"status": {"conditions": [condition]}}, subresource="status"
    )


def to_outgoing(action: Action, now: float) -> list[Outgoing]:
    if isinstance(action, Nominate):
        key = stable_key("nominate", action.pod.uid, action.pod.resource_version, action.node)
        why = f"reserve {action.node}" if action.node else "clear the reservation"
        target = pod_target(action.pod, with_rv=True)
        return [_command(key, target, NominatePod(node_name=action.node), why, now)]
    if isinstance(action, Bind):
        key = stable_key("bind", action.pod.uid, action.node)
        target = pod_target(action.pod, with_rv=False)
        return [_command(key, target, BindPod(node_name=action.node), "gang placed", now)]
    if isinstance(action, SelectNode):
        key = stable_key(
            "select-node", action.uid, action.resource_version, action.claim, action.node
        )
        target = ObjectRef(
            api_version="v1",
            kind="PersistentVolumeClaim",
            name=action.claim,
            namespace=action.namespace,
            uid=action.uid or None,
        )
        patch = PatchObject(
            patch_type="merge",
            patch={"metadata": {"annotations": {SELECTED_NODE_ANNOTATION: action.node}}},
        )
        why = f"volume for the pod bound to {action.node}"
        return [_command(key, target, patch, why, now)]
    if isinstance(action, MarkUnschedulable):
        key = stable_key(
            "unschedulable",
            action.pod.uid,
            action.pod.resource_version,
            action.reason,
            action.message,
        )
        patch = _condition_patch(POD_SCHEDULED, "False", action.reason, action.message, action.at)
        return [_command(key, pod_target(action.pod, with_rv=False), patch, action.message, now)]
    if isinstance(action, Disrupt):
        target = pod_target(action.pod, with_rv=False)
        patch = _condition_patch(
            DISRUPTION_TARGET, "True", action.reason, action.message, action.at
        )
        return [
            _command(stable_key("disruption", action.pod.uid), target, patch, action.message, now),
            _command(
                stable_key("delete", action.pod.uid), target, DeleteObject(), action.message, now
            ),
        ]
    if isinstance(action, UpdateGroupStatus):
        digest = json.dumps(action.status, sort_keys=True)
        target = ObjectRef(
            api_version=POD_GROUP_API_VERSION,
            kind="PodGroup",
            name=action.group.name,
            namespace=action.group.namespace,
            uid=action.uid or None,
        )
        key = stable_key("podgroup-status", action.uid, digest)
        return [_command(key, target, UpdateStatus(status=action.status), "PodGroup status", now)]
    if isinstance(action, UpdateTopologyStatus):
        status: dict[str, Any] = {"detailStatus": action.detail_status}
        digest = json.dumps(status, sort_keys=True)
        target = ObjectRef(
            api_version=TOPOLOGY_API_VERSION,
            kind="ClusterNetworkTopology",
            name=action.name,
            uid=action.uid or None,
        )
        key = stable_key("topology-status", action.uid, digest)
        return [_command(key, target, UpdateStatus(status=status), "topology changed", now)]
    if isinstance(action, Notice):
        key = stable_key("event", action.uid, action.reason, action.message)
        target = ObjectRef(
            api_version=POD_GROUP_API_VERSION if action.kind == "PodGroup" else "v1",
            kind=action.kind,
            name=action.name,
            namespace=action.namespace,
            uid=action.uid or None,
        )
        event = RecordEvent(
            reason=action.reason,
            message=action.message[:1024],
            type="Warning" if action.warning else "Normal",
            action="Scheduling",
            reporting_component=REPORTING_COMPONENT,
        )
        return [_command(key, target, event, action.message, now)]
    return [decision_outgoing(action, now)]


def decision_outgoing(action: Decision, now: float) -> Outgoing:
    first = action.gang_group[0]
    key = stable_key(
        "decision", action.kind, action.message, *action.gang_group, *action.assignments
    )
    decision = PlacementDecision(
        decision_id=key,
        namespace=first.namespace,
        group=first.name,
        gang_group=tuple(str(k) for k in action.gang_group),
        kind=action.kind,
        reason=action.reason,
        message=action.message,
        decided_at=now,
        domain=action.domain,
        layer=action.layer,
        assignments=tuple(PodAssignment(pod=p, node=n) for p, n in action.assignments),
        victims=action.victims,
    )
    return Outgoing(key=key, decision=decision)
