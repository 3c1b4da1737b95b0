"""Actions -> the commands, decisions and Events that carry them out (pure).

Every idempotency key is derived from what the decision was based on (the target's uid and
resourceVersion, the revision, the node's resourceVersion), so the same state always yields
the same key: a restarted controller re-sending a command it had already sent is dropped by
JetStream or reported `already-applied` by k8s-watcher, never applied twice. A decision made
from a newer state gets a new key. Every command carries preconditions (uid, and
resourceVersion where staleness matters), so a stale command is refused with a conflict.
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass
from typing import Any, Literal

import msgspec

from nodeflow_contracts.k8s import (
    CreateObject,
    DeleteObject,
    K8sCommand,
    ObjectRef,
    PatchObject,
    RecordEvent,
    UpdateStatus,
    deadline_after,
)
from nodeflow_contracts.nodeset import DecisionKind, NodeSetDecision
from nodeflow_contracts.pod_protocol import (
    CLAIM_ANNOTATION,
    NODESET_LABEL,
    POD_PROTECT_LABEL,
    POD_WAIT_CONDITION,
    SLURM_DELETE_CONDITION,
)
from nodeflow_kube.fields import (
    rfc3339,
)
from nodeset_controller.deletion import NEVER_STARTED
from nodeset_controller.history import (
    REVISION_API_VERSION,
    REVISION_KIND,
    CreateRevision,
    DeleteRevision,
    revision_object,
)
from nodeset_controller.objects import (
    NODESET_API_VERSION,
    NODESET_KIND,
    NODESLICE_KIND,
    owned_by_nodeset,
)
from nodeset_controller.planner import (
    Action,
    CancelDelete,
    Claim,
    CreatePod,
    DeletePod,
    Notice,
    PodChangeSent,
    Release,
    ScheduleDelete,
    SetPodWait,
    WriteSlice,
)
from nodeset_controller.podspec import canonical_json
from nodeset_controller.podstate import PodState
from nodeset_controller.protection import (
    BUDGET_API_VERSION,
    BUDGET_KIND,
    PROTECTED,
    CreateDisruptionBudget,
    DeleteDisruptionBudget,
    ProtectPod,
    budget_object,
)
from nodeset_controller.spec import NodeSetSpec
from nodeset_controller.status import WantedCondition

SENDER = "nodeset-controller"
REPORTING_COMPONENT = "nodeflow-nodeset-controller"


def stable_key(*parts: object) -> str:
    digest = hashlib.sha256("\x1f".join(str(p) for p in parts).encode()).hexdigest()[:32]
    return f"nodeset:{parts[0]}:{digest}"


@dataclass(frozen=True)
class Outgoing:
    """One command and what it explains.

    `slot` names the object the command changes: a tracked command holds it in the command
    ledger, and no other command for it is sent while it is held (until the command's outcome
    says it can never land, KV shows its applied effect, or it can no longer land: see
    `nodeflow_contracts.ledger`), so nothing can wedge on it. A notice's Event is not tracked.
    """

    slot: str
    command: K8sCommand
    decision: NodeSetDecision | None = None
    event: K8sCommand | None = None
    # Slots that must be free for this command (a release waits for a create to land).
    also_blocked_by: tuple[str, ...] = ()
    # A change of a pod or a node claim: these are limited in number in flight.
    windowed: bool = False
    # A SlurmDelete set or a pod delete: while in flight, the plan counts it as done.
    pod_change: PodChangeSent | None = None
    tracked: bool = True
    # A status write names the resourceVersion it was planned on: held by this leader only
    # (nodeflow_contracts.ledger.LedgerEntry.fenced), so a successor does not wait for it.
    fenced: bool = False


def pod_ref(namespace: str, name: str, uid: str | None = None) -> ObjectRef:
    return ObjectRef(api_version="v1", kind="Pod", name=name, namespace=namespace, uid=uid)


def node_ref(name: str, uid: str, rv: str) -> ObjectRef:
    return ObjectRef(
        api_version="v1", kind="Node", name=name, uid=uid or None, resource_version=rv or None
    )


def nodeset_ref(spec: NodeSetSpec, *, with_rv: bool) -> ObjectRef:
    return ObjectRef(
        api_version=NODESET_API_VERSION,
        kind=NODESET_KIND,
        name=spec.name,
        namespace=spec.namespace,
        uid=spec.uid or None,
        resource_version=(spec.resource_version or None) if with_rv else None,
    )


def action_slot(namespace: str, action: Action) -> str | None:
    """The slot of an action that changes a pod or a node claim -- the bulk of a scale-up,
    scale-down or rollout, limited in number in flight; None for the others. A protect label
    patch is not among them: a busy pod's label must not wait behind a scale-up's creates (its
    own slot still holds it while in flight, see `protect_slot`)."""
    if isinstance(action, Claim | Release):
        return node_slot(action.node)
    if isinstance(action, CreatePod):
        return pod_slot(namespace, action.name)
    if isinstance(action, ScheduleDelete | CancelDelete | DeletePod):
        return pod_slot(namespace, action.pod.name)
    if isinstance(action, SetPodWait):
        return pod_wait_slot(namespace, action.pod.name)
    return None


def action_blockers(namespace: str, action: Action) -> tuple[str, ...]:
    """Slots besides its own that must be free before `action` is sent.

    A release waits for a create of the pod it names to land. A create waits for every
    command on its node's slot -- a release of the claim still in flight (this NodeSet
    scaled down and back up fast), another NodeSet's claim: the create was planned on a
    claim that such a command may be removing, and landing after it, two NodeSets' slurmd
    pods would run on one node. Once the node's slot is free, the next plan reads the claim
    as it is and claims the node again (resourceVersion precondition) or leaves it.

    A pod's wait condition and its mark or unmark wait for each other: the one landing last
    must be the newer, or the pod would show a cause it no longer waits for."""
    if isinstance(action, Release):
        return (pod_slot(namespace, action.pod_name),) if action.pod_name else ()
    if isinstance(action, CreatePod):
        return (node_slot(action.node),)
    if isinstance(action, SetPodWait):
        return (pod_slot(namespace, action.pod.name),)
    if isinstance(action, ScheduleDelete | CancelDelete):
        return (pod_wait_slot(namespace, action.pod.name),)
    return ()


def pod_slot(namespace: str, name: str) -> str:
    return f"Pod/{namespace}/{name}"


def node_slot(name: str) -> str:
    return f"Node/{name}"


def pod_wait_slot(namespace: str, name: str) -> str:
    """A pod's wait condition: its own slot, so a write of it never holds back a mark or a
    delete of the pod; it waits for them instead (`to_outgoing`)."""
    return f"PodWait/{namespace}/{name}"


def pod_wait_entries(pod: PodState, wait: WantedCondition | None, now: float) -> list[Any]:
    """The strategic-merge entries of status.conditions that make the pod's wait condition
    `wait`: the condition, its removal when the pod has one and waits no longer, or none."""
    if wait is not None:
        return [
            {
                "type": POD_WAIT_CONDITION,
                "status": "True",
                "reason": wait.reason,
                "message": wait.message[:1024],
                "lastTransitionTime": rfc3339(now),
            }
        ]
    if pod.wait is not None:
        return [{"type": POD_WAIT_CONDITION, "$patch": "delete"}]
    return []


def protect_slot(namespace: str, name: str, protect: bool = True) -> str:
    """A pod's protect label: its own slot, so a label change never holds back a SlurmDelete
    or a delete of the pod (nor they it). Putting the label on and taking it off hold two
    slots: a held unlabel (its outcome lost) never holds back the label a busy pod needs, and
    cannot undo it either (it carries the pod's resourceVersion, which the label changes)."""
    return f"{'PodProtect' if protect else 'PodUnprotect'}/{namespace}/{name}"


def budget_slot(namespace: str, name: str) -> str:
    return f"{BUDGET_KIND}/{namespace}/{name}"


def revision_slot(namespace: str, name: str) -> str:
    return f"{REVISION_KIND}/{namespace}/{name}"


def revision_ref(
    namespace: str, name: str, uid: str | None = None, resource_version: str | None = None
) -> ObjectRef:
    return ObjectRef(
        api_version=REVISION_API_VERSION,
        kind=REVISION_KIND,
        name=name,
        namespace=namespace,
        uid=uid or None,
        resource_version=resource_version or None,
    )


# How long a command of ours is worth applying by default (the setting
# command_lifetime_seconds; the in-flight timeout's default). One held longer (a crashed
# k8s-watcher's) is reported expired instead of applied over a newer decision.
COMMAND_LIFETIME_SECONDS = 20.0


def _command(
    key: str,
    target: ObjectRef,
    operation: Any,
    reason: str,
    now: float,
    lifetime: float = COMMAND_LIFETIME_SECONDS,
) -> K8sCommand:
    return K8sCommand(
        idempotency_key=key,
        sender=SENDER,
        sent_at=now,
        expires_at=deadline_after(lifetime, now=now),
        target=target,
        operation=operation,
        reason=reason,
    )


EVENT_REASONS: dict[str, tuple[str, Literal["Normal", "Warning"]]] = {
    "create": ("PodCreated", "Normal"),
    "delete-scheduled": ("ScalingDeleteScheduled", "Normal"),
    "rolling-replace": ("RollingDeleteScheduled", "Normal"),
    "cancel": ("DeleteCancelled", "Normal"),
    "delete": ("PodDeleted", "Normal"),
    "forced-delete": ("PodForceDeleted", "Warning"),
    "name-collision": ("PodNameCollision", "Warning"),
    "invalid-spec": ("InvalidSpec", "Warning"),
    "protection-disabled": ("DisruptionBudgetNotOwned", "Warning"),
}


def decision_and_event(
    spec_ns: str,
    spec_name: str,
    target: ObjectRef,
    decision_id: str,
    kind: DecisionKind,
    reason: str,
    message: str,
    now: float,
    pod: str = "",
    node: str = "",
    event_reason: str | None = None,
) -> tuple[NodeSetDecision, K8sCommand]:
    decision = NodeSetDecision(
        decision_id=decision_id,
        namespace=spec_ns,
        nodeset=spec_name,
        kind=kind,
        reason=reason,
        message=message,
        decided_at=now,
        pod=pod,
        node=node,
    )
    default_reason, event_type = EVENT_REASONS[kind]
    event_reason = event_reason or default_reason
    subject = f"pod {pod}: " if pod else (f"node {node}: " if node else "")
    event = _command(
        f"event:{decision_id}",
        target,
        RecordEvent(
            reason=event_reason,
            message=f"{subject}{message}"[:1024],
            type=event_type,
            action=kind,
            reporting_component=REPORTING_COMPONENT,
        ),
        f"{kind}: {message}",
        now,
    )
    return decision, event


def _claim_outgoing(
    node: str,
    node_uid: str,
    node_rv: str,
    claim: str,
    held: bool,
    why: str,
    now: float,
    blocked: tuple[str, ...] = (),
    lifetime: float = COMMAND_LIFETIME_SECONDS,
) -> Outgoing:
    """Set (`held`) or remove the node's claim annotation `claim` (a NodeSet key), with the
    node's resourceVersion as precondition."""
    verb = "claim" if held else "release"
    key = stable_key(verb, node, node_uid, node_rv, claim)
    patch = {"metadata": {"annotations": {CLAIM_ANNOTATION: claim if held else None}}}
    command = _command(
        key,
        node_ref(node, node_uid, node_rv),
        PatchObject(patch_type="merge", patch=patch),
        f"{verb} node {'for' if held else 'from'} NodeSet {claim}: {why}",
        now,
        lifetime,
    )
    return Outgoing(node_slot(node), command, also_blocked_by=blocked, windowed=True)


def to_outgoing(
    spec: NodeSetSpec,
    action: Action,
    now: float,
    *,
    pod_deleted_revision: int = 0,
    lifetime: float = COMMAND_LIFETIME_SECONDS,
) -> Outgoing:
    """The command for `action`. `pod_deleted_revision` (creates only): the KV revision at
    which the last pod of that name was deleted, so each incarnation of a pod name gets its
    own idempotency key -- a re-create must not be dropped by JetStream's duplicate window
    or the applied-commands record as a repeat of the create of the pod it replaces."""
    ns = spec.namespace
    command_of = functools.partial(_command, lifetime=lifetime)
    patch: dict[str, Any]
    owner = nodeset_ref(spec, with_rv=False)

    def explained(
        slot: str,
        command: K8sCommand,
        kind: DecisionKind,
        reason: str,
        message: str,
        pod: str = "",
        node: str = "",
        event_reason: str | None = None,
        **extra: Any,
    ) -> Outgoing:
        decision, event = decision_and_event(
            ns,
            spec.name,
            owner,
            command.idempotency_key,
            kind,
            reason,
            message,
            now,
            pod,
            node,
            event_reason,
        )
        return Outgoing(slot, command, decision, event, **extra)

    def pod_change(
        pod: PodState,
        command: K8sCommand,
        kind: DecisionKind,
        reason: str,
        why: str,
        sent: PodChangeSent | None = None,
        event_reason: str | None = None,
    ) -> Outgoing:
        """A change of an existing pod: its slot, held until KV shows the change applied."""
        return explained(
            pod_slot(ns, pod.name),
            command,
            kind,
            reason,
            why,
            pod=pod.name,
            node=pod.node or "",
            event_reason=event_reason,
            windowed=True,
            pod_change=sent,
            also_blocked_by=action_blockers(ns, action),
        )

    if isinstance(action, Claim):
        return _claim_outgoing(
            action.node,
            action.node_uid,
            action.node_rv,
            spec.key,
            True,
            action.why,
            now,
            lifetime=lifetime,
        )
    if isinstance(action, Release):
        return _claim_outgoing(
            action.node,
            action.node_uid,
            action.node_rv,
            spec.key,
            False,
            action.why,
            now,
            action_blockers(ns, action),
            lifetime=lifetime,
        )
    if isinstance(action, CreatePod):
        key = stable_key(
            "create",
            ns,
            action.name,
            action.revision,
            action.node_uid,
            action.node_rv,
            str(pod_deleted_revision),
        )
        command = command_of(
            key, pod_ref(ns, action.name), CreateObject(object=action.pod), action.why, now
        )
        return explained(
            pod_slot(ns, action.name),
            command,
            "create",
            "PodCreated",
            f"{action.why}; revision {action.revision}",
            pod=action.name,
            node=action.node,
            windowed=True,
            also_blocked_by=action_blockers(ns, action),
        )
    if isinstance(action, ScheduleDelete):
        pod = action.pod
        key = stable_key("set-delete", pod.uid, pod.resource_version, action.reason)
        patch = {
            "status": {
                "conditions": [
                    {
                        "type": SLURM_DELETE_CONDITION,
                        "status": "True",
                        "reason": action.reason,
                        "message": action.why[:1024],
                        "lastTransitionTime": rfc3339(now),
                    },
                    *pod_wait_entries(pod, action.wait, now),
                ]
            }
        }
        command = command_of(
            key,
            pod_ref(ns, pod.name, pod.uid),
            PatchObject(patch_type="strategic", patch=patch, subresource="status"),
            action.why,
            now,
        )
        sent = PodChangeSent("schedule-delete", now, action.reason)
        return pod_change(
            pod, command, action.decision, action.reason, action.why, sent, action.reason
        )
    if isinstance(action, CancelDelete):
        pod = action.pod
        key = stable_key("cancel", pod.uid, pod.resource_version)
        patch = {
            "status": {
                "conditions": [
                    {"type": SLURM_DELETE_CONDITION, "$patch": "delete"},
                    *pod_wait_entries(pod, action.wait, now),
                ]
            }
        }
        command = command_of(
            key,
            pod_ref(ns, pod.name, pod.uid),
            PatchObject(patch_type="strategic", patch=patch, subresource="status"),
            action.why,
            now,
        )
        return pod_change(pod, command, "cancel", "DeleteCancelled", action.why)
    if isinstance(action, DeletePod):
        pod = action.pod
        key = stable_key("delete", pod.uid)
        target = pod_ref(ns, pod.name, pod.uid)
        if action.reason == NEVER_STARTED:
            # Proven only while no kubelet has the pod: a binding since changes its
            # resourceVersion, and the delete is refused.
            target = msgspec.structs.replace(target, resource_version=pod.resource_version or None)
        command = command_of(key, target, DeleteObject(), action.why, now)
        kind: DecisionKind = "forced-delete" if action.forced else "delete"
        return pod_change(
            pod, command, kind, action.reason, action.why, PodChangeSent("delete", now)
        )
    if isinstance(action, SetPodWait):
        pod = action.pod
        wait = action.wait
        key = stable_key(
            "pod-wait",
            pod.uid,
            pod.resource_version,
            wait.reason if wait else "",
            wait.message if wait else "",
        )
        why = f"waits: {wait.reason}: {wait.message}" if wait else "waits no longer"
        patch = {"status": {"conditions": pod_wait_entries(pod, wait, now)}}
        command = command_of(
            key,
            pod_ref(ns, pod.name, pod.uid),
            PatchObject(patch_type="strategic", patch=patch, subresource="status"),
            why,
            now,
        )
        # After any mark, unmark or delete of the pod still in flight: that change decides
        # what the pod waits for (or that it is gone), and a wait written before it lands
        # would be a write for nothing.
        return Outgoing(
            pod_wait_slot(ns, pod.name),
            command,
            also_blocked_by=action_blockers(ns, action),
            windowed=True,
        )
    if isinstance(action, ProtectPod):
        pod = action.pod
        value = PROTECTED if action.protect else None
        key = stable_key("protect", pod.uid, pod.resource_version, str(action.protect))
        target = pod_ref(ns, pod.name, pod.uid)
        if not action.protect:
            # Decided on the pod as read (its Slurm state idle): slurm-syncer's condition
            # patch when the node takes a job changes the resourceVersion, and a stale unlabel
            # is refused (409) instead of unprotecting a pod that now runs a job.
            target = msgspec.structs.replace(target, resource_version=pod.resource_version or None)
        command = command_of(
            key,
            target,
            PatchObject(
                patch_type="merge", patch={"metadata": {"labels": {POD_PROTECT_LABEL: value}}}
            ),
            action.why,
            now,
        )
        # Outside the in-flight window (`action_slot`): protection never waits for creates.
        return Outgoing(protect_slot(ns, pod.name, action.protect), command)
    if isinstance(action, CreateDisruptionBudget):
        # The generation: a budget deleted and wanted again (the option turned off and on)
        # is a new create, not a repeat of the first.
        key = stable_key("budget-create", ns, action.name, spec.uid, spec.generation)
        ref = ObjectRef(
            api_version=BUDGET_API_VERSION, kind=BUDGET_KIND, name=action.name, namespace=ns
        )
        command = command_of(key, ref, CreateObject(object=budget_object(spec)), action.why, now)
        return Outgoing(budget_slot(ns, action.name), command)
    if isinstance(action, DeleteDisruptionBudget):
        key = stable_key("budget-delete", ns, action.name, action.uid, action.resource_version)
        ref = ObjectRef(
            api_version=BUDGET_API_VERSION,
            kind=BUDGET_KIND,
            name=action.name,
            namespace=ns,
            uid=action.uid or None,
            resource_version=action.resource_version or None,
        )
        command = command_of(key, ref, DeleteObject(), action.why, now)
        return Outgoing(budget_slot(ns, action.name), command)
    if isinstance(action, CreateRevision):
        # The revision number: a revision pruned and wanted again (its template back after
        # the history dropped it) is a new create, not a repeat of the first.
        key = stable_key("revision-create", ns, action.name, spec.uid, action.revision)
        obj = revision_object(spec, action.hash, action.revision)
        command = command_of(
            key, revision_ref(ns, action.name), CreateObject(object=obj), action.why, now
        )
        return Outgoing(revision_slot(ns, action.name), command)
    if isinstance(action, DeleteRevision):
        key = stable_key("revision-delete", ns, action.name, action.uid, action.resource_version)
        command = command_of(
            key,
            revision_ref(ns, action.name, action.uid, action.resource_version),
            DeleteObject(),
            action.why,
            now,
        )
        return Outgoing(revision_slot(ns, action.name), command)
    if isinstance(action, WriteSlice):
        change = action.change
        slot = f"NodeSlice/{ns}/{change.name}"
        nodes = list(change.nodes)
        if change.create:
            key = stable_key(
                "slice-create", ns, change.name, spec.uid, canonical_json(nodes).decode()
            )
            obj = {
                "apiVersion": NODESET_API_VERSION,
                "kind": NODESLICE_KIND,
                "metadata": {
                    "name": change.name,
                    "namespace": ns,
                    "labels": {NODESET_LABEL: spec.name},
                    "ownerReferences": owned_by_nodeset(spec.name, spec.uid),
                },
                "spec": {"nodeSetName": spec.name, "nodes": nodes},
            }
            ref = ObjectRef(
                api_version=NODESET_API_VERSION, kind=NODESLICE_KIND, name=change.name, namespace=ns
            )
            command = command_of(key, ref, CreateObject(object=obj), "NodeSlice for new nodes", now)
            return Outgoing(slot, command)
        rv = action.resource_version or ""
        key = stable_key("slice-update", ns, change.name, action.uid, rv)
        ref = ObjectRef(
            api_version=NODESET_API_VERSION,
            kind=NODESLICE_KIND,
            name=change.name,
            namespace=ns,
            uid=action.uid,
            resource_version=action.resource_version,
        )
        command = command_of(
            key,
            ref,
            PatchObject(patch_type="merge", patch={"spec": {"nodes": nodes}}),
            "nodes joined or left",
            now,
        )
        return Outgoing(slot, command)
    assert isinstance(action, Notice)
    key = stable_key("notice", ns, spec.name, action.decision, action.node, action.pod, action.why)
    decision, event = decision_and_event(
        ns,
        spec.name,
        owner,
        key,
        action.decision,
        action.reason,
        action.why,
        now,
        action.pod,
        action.node,
    )
    return Outgoing(f"Notice/{key}", event, decision, None, tracked=False)


def status_outgoing(spec: NodeSetSpec, status: dict[str, Any], now: float) -> Outgoing:
    digest = hashlib.sha256(canonical_json(status)).hexdigest()[:16]
    key = stable_key("status", spec.namespace, spec.name, spec.uid, spec.resource_version, digest)
    command = _command(
        key, nodeset_ref(spec, with_rv=True), UpdateStatus(status=status), "status recomputed", now
    )
    fenced = bool(command.target.resource_version)
    return Outgoing(f"NodeSet/{spec.namespace}/{spec.name}", command, fenced=fenced)


def invalid_status_outgoing(
    namespace: str, name: str, uid: str, rv: str, status: dict[str, Any], now: float
) -> Outgoing:
    """The status of a NodeSet whose spec is invalid (no parsed spec exists)."""
    digest = hashlib.sha256(canonical_json(status)).hexdigest()[:16]
    key = stable_key("status", namespace, name, uid, rv, digest)
    ref = ObjectRef(
        api_version=NODESET_API_VERSION,
        kind=NODESET_KIND,
        name=name,
        namespace=namespace,
        uid=uid or None,
        resource_version=rv or None,
    )
    command = _command(key, ref, UpdateStatus(status=status), "status recomputed", now)
    return Outgoing(f"NodeSet/{namespace}/{name}", command, fenced=bool(rv))


def notice_outgoing(namespace: str, name: str, uid: str, notice: Notice, now: float) -> Outgoing:
    key = stable_key(
        "notice", namespace, name, notice.decision, notice.node, notice.pod, notice.why
    )
    owner = ObjectRef(
        api_version=NODESET_API_VERSION,
        kind=NODESET_KIND,
        name=name,
        namespace=namespace,
        uid=uid or None,
    )
    decision, event = decision_and_event(
        namespace,
        name,
        owner,
        key,
        notice.decision,
        notice.reason,
        notice.why,
        now,
        notice.pod,
        notice.node,
    )
    return Outgoing(f"Notice/{key}", event, decision, None, tracked=False)
