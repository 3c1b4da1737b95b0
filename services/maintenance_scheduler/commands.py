"""Actions and decisions -> k8s-watcher commands and decision messages (pure).

Every idempotency key is derived from the state the decision was made on (the request's uid
and resourceVersion, the node's resourceVersion, the pod's uid and eviction attempt), so the
same state always yields the same key: a restarted service re-sending a command is dropped
by JetStream or answered `already-applied` by k8s-watcher, never applied twice -- an
eviction above all. Writes to a NodeMaintenance carry its uid and resourceVersion, so a
decision made on a stale object is refused with a conflict and made again.

The commands this service sends (sender "maintenance-scheduler"):
  update-status  NodeMaintenance status
  patch          NodeMaintenance metadata (finalizers, annotations); Node annotations
                 (`nodeflow.dev/node-cordon-reason`)
  cordon, uncordon  Node
  evict          Pod
  record-event   about a NodeMaintenance; about the MaintenanceOperatorConfig (a value read
                 otherwise than NVIDIA's controller reads it)
  delete         NodeMaintenance (garbage collection only)
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Final, Literal

from maintenance_scheduler.actions import (
    Action,
    ConfigEvent,
    CordonNode,
    Decision,
    DeleteRequest,
    Event,
    EvictPod,
    PatchRequest,
    SetStatus,
    UncordonNode,
)
from maintenance_scheduler.api import (
    API_VERSION,
    CONFIG_KIND,
    DRAIN_START_ANNOTATION,
    NODE_MAINTENANCE_KIND,
    READY_TIME_ANNOTATION,
    WAIT_START_ANNOTATION,
    NodeMaintenance,
)
from nodeflow_contracts import k8s
from nodeflow_contracts.k8s import K8sCommand, ObjectRef, deadline_after
from nodeflow_contracts.maintenance import MaintenanceDecision
from nodeflow_contracts.pod_protocol import NODE_CORDON_REASON_ANNOTATION

SENDER: Final = "maintenance-scheduler"
REPORTING_COMPONENT: Final = "nodeflow-maintenance-scheduler"


def digest(*parts: object) -> str:
    return hashlib.sha256("\x1f".join(str(p) for p in parts).encode()).hexdigest()[:24]


def canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


def request_ref(request: NodeMaintenance, *, with_rv: bool = True) -> ObjectRef:
    return ObjectRef(
        api_version=API_VERSION,
        kind=NODE_MAINTENANCE_KIND,
        name=request.name,
        namespace=request.namespace,
        uid=request.uid or None,
        resource_version=(request.resource_version or None) if with_rv else None,
    )


def node_ref(name: str, uid: str) -> ObjectRef:
    return ObjectRef(api_version="v1", kind="Node", name=name, uid=uid or None)


# How long a command is worth applying: past it, a held command (a crashed k8s-watcher's) is
# reported expired and the next round decides again from what is then true. (How long after
# it a command may still land is the command ledger's one margin,
# nodeflow_contracts.ledger.LANDING_MARGIN_SECONDS.)
COMMAND_LIFETIME_SECONDS = 60.0


# Annotations that record when something began: their value is the moment it was decided.
TIME_ANNOTATIONS: Final = frozenset(
    {READY_TIME_ANNOTATION, WAIT_START_ANNOTATION, DRAIN_START_ANNOTATION}
)


def _command(key: str, target: ObjectRef, operation: Any, reason: str, now: float) -> K8sCommand:
    return K8sCommand(
        idempotency_key=key,
        sender=SENDER,
        sent_at=now,
        expires_at=deadline_after(COMMAND_LIFETIME_SECONDS, now=now),
        target=target,
        operation=operation,
        reason=reason[:1024],
    )


def eviction_key(pod_uid: str, attempt: int) -> str:
    return f"maint:evict:{pod_uid}:{attempt}"


def commands_for(action: Action, now: float, *, eviction_attempt: int = 0) -> list[K8sCommand]:
    """The commands that carry out `action`, in the order they must apply."""
    if isinstance(action, SetStatus):
        request = action.request
        key = f"maint:status:{request.uid}:{request.resource_version}:"
        key += digest(canonical(action.status))
        why = "status"
        if action.phase_change is not None:
            why = f"phase {action.phase_change[0] or 'new'} -> {action.phase_change[1]}"
        return [
            _command(
                key, request_ref(request), k8s.UpdateStatus(status=dict(action.status)), why, now
            )
        ]
    if isinstance(action, PatchRequest):
        request = action.request
        metadata: dict[str, Any] = {}
        if action.annotations is not None:
            metadata["annotations"] = dict(action.annotations)
        if action.finalizers is not None:
            metadata["finalizers"] = list(action.finalizers)
        if action.owner_references is not None:
            metadata["ownerReferences"] = [dict(ref) for ref in action.owner_references]
        # A time recorded on the object is decided once per version of it: the same record
        # decided again a second later is the same command, not a new one each round.
        keyed = dict(metadata)
        if action.annotations is not None:
            keyed["annotations"] = {
                name: "<time>" if name in TIME_ANNOTATIONS else value
                for name, value in action.annotations.items()
            }
        key = f"maint:patch:{request.uid}:{request.resource_version}:{digest(canonical(keyed))}"
        return [
            _command(
                key,
                request_ref(request),
                k8s.PatchObject(patch_type="merge", patch={"metadata": metadata}),
                "metadata: " + ", ".join(sorted(metadata)),
                now,
            )
        ]
    if isinstance(action, CordonNode):
        base = f"{action.request.uid}:{action.node_resource_version}"
        target = node_ref(action.node, action.node_uid)
        annotate = k8s.PatchObject(
            patch_type="merge",
            patch={"metadata": {"annotations": {NODE_CORDON_REASON_ANNOTATION: action.reason}}},
        )
        return [
            _command(f"maint:cordon-reason:{base}", target, annotate, action.reason, now),
            _command(f"maint:cordon:{base}", target, k8s.CordonNode(), action.reason, now),
        ]
    if isinstance(action, UncordonNode):
        base = f"{action.request.uid}:{action.node_resource_version}"
        target = node_ref(action.node, action.node_uid)
        why = f"NodeMaintenance {action.request.key} deleted"
        commands = [_command(f"maint:uncordon:{base}", target, k8s.UncordonNode(), why, now)]
        if action.clear_reason:
            clear = k8s.PatchObject(
                patch_type="merge",
                patch={"metadata": {"annotations": {NODE_CORDON_REASON_ANNOTATION: None}}},
            )
            commands.append(_command(f"maint:uncordon-reason:{base}", target, clear, why, now))
        return commands
    if isinstance(action, EvictPod):
        pod = action.pod
        target = ObjectRef(
            api_version="v1", kind="Pod", name=pod.name, namespace=pod.namespace, uid=pod.uid
        )
        why = f"drain of node {action.request.node_name} for NodeMaintenance {action.request.key}"
        return [_command(eviction_key(pod.uid, eviction_attempt), target, k8s.EvictPod(), why, now)]
    if isinstance(action, DeleteRequest):
        request = action.request
        return [
            _command(
                f"maint:gc:{request.uid}",
                request_ref(request),
                k8s.DeleteObject(),
                "Ready for longer than maxNodeMaintenanceTimeSeconds",
                now,
            )
        ]
    if isinstance(action, ConfigEvent):
        target = ObjectRef(
            api_version=API_VERSION,
            kind=CONFIG_KIND,
            name=action.name,
            namespace=action.namespace,
            uid=action.uid or None,
        )
        # Once per version of the config: a leader that sees it again sends the same key.
        key = f"maint:config-event:{action.uid}:{action.resource_version}:{action.reason}"
        return [_event_command(key, target, action.reason, action.message, action.type, now)]
    assert isinstance(action, Event)
    request = action.request
    key = f"maint:event:{request.uid}:{request.resource_version}:{action.reason}:"
    key += digest(action.discriminator, action.message)
    target = request_ref(request, with_rv=False)
    return [_event_command(key, target, action.reason, action.message, action.type, now)]


def _event_command(
    key: str,
    target: ObjectRef,
    reason: str,
    message: str,
    event_type: Literal["Normal", "Warning"],
    now: float,
) -> K8sCommand:
    """An Event on `target`; its action names the reason, as our Events always do."""
    event = k8s.RecordEvent(
        reason=reason,
        message=message[:1024],
        type=event_type,
        action=reason,
        reporting_component=REPORTING_COMPONENT,
    )
    return _command(key, target, event, message, now)


def decision_message(decision: Decision, now: float, basis: str = "") -> MaintenanceDecision:
    """`basis` distinguishes decisions of one kind on one request state (a skip reason)."""
    request = decision.request
    decision_id = "maint:" + digest(
        request.uid, request.resource_version, decision.kind, decision.pod, basis
    )
    return MaintenanceDecision(
        decision_id=decision_id,
        namespace=request.namespace,
        name=request.name,
        kind=decision.kind,
        reason=decision.reason,
        message=decision.message[:2048],
        decided_at=now,
        requestor=request.requestor_id,
        node=decision.node or request.node_name,
        pod=decision.pod,
    )
