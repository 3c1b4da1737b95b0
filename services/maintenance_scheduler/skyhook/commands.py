"""Skyhook actions -> k8s-watcher commands, and decision notes -> SkyhookDecision (pure).

Idempotency keys come from the state the action was decided on, so a restarted controller
sending the same action again is deduplicated, never applied twice:
  create   Job              key: Job name + attempt (its name is deterministic)
  create+patch ConfigMap    node metadata and package configMap a Job's pod mounts (content key)
  delete   ConfigMap        one no longer wanted (skyhook/configmaps.py; uid precondition)
  patch    Job              spec.activeDeadlineSeconds, to fail a Job whose image never pulls;
                            spec.ttlSecondsAfterFinished removed from a failed Job
  patch    Node             nodeState_<skyhook> annotation, status_<skyhook> annotation+label,
                            version_<skyhook> and cordon_<skyhook> annotations
  create   NodeMaintenance  for an interrupt
  delete   NodeMaintenance  after post-interrupt (uid precondition)
  update-status  Skyhook    (resourceVersion precondition: a stale status is refused)
  patch    DeploymentPolicy its in-use finalizer (resourceVersion precondition)
  patch    Skyhook          its own finalizer (resourceVersion precondition)
  patch    Node             a deleted Skyhook's marks removed
  patch    Node             spec.taints: the runtime-required taint added or removed
                            (resourceVersion precondition: the other taints are kept as read)
  patch    Node status      its `skyhook.nvidia.com/<name>/NotReady` and `/Erroring`
                            conditions, strategic merge by type (the kubelet's untouched);
                            removed when the Skyhook is deleted
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Final

from maintenance_scheduler.commands import COMMAND_LIFETIME_SECONDS, SENDER, canonical, digest
from maintenance_scheduler.skyhook.api import (
    NODE_STATE_VERSION,
    POLICY_KIND,
    Skyhook,
)
from maintenance_scheduler.skyhook.configmaps import DeleteConfigMap
from maintenance_scheduler.skyhook.jobs import DEFAULT_POD_OPTIONS, build_job, build_maintenance
from maintenance_scheduler.skyhook.plan import (
    CreateJob,
    CreateMaintenance,
    DeleteMaintenance,
    DropRuntimeCordonMark,
    FailJob,
    ForgetNode,
    KeepFailedJob,
    NodeView,
    PatchNode,
    SetNodeConditions,
    SetPolicyFinalizer,
    SetRuntimeTaint,
    SetSkyhookFinalizer,
    SetSkyhookStatus,
    SkyhookAction,
    SkyhookDecisionNote,
    WriteNodeMetadata,
    WritePackageConfig,
)
from maintenance_scheduler.skyhook.pod import (
    PodOptions,
    node_metadata_config_map,
    package_config_map,
)
from nodeflow_contracts import k8s
from nodeflow_contracts.k8s import K8sCommand, ObjectRef, deadline_after
from nodeflow_contracts.maintenance import SkyhookDecision
from nodeflow_contracts.skyhook import CONFIG_MAP_MANAGED_BY, CONFIG_MAP_MANAGED_BY_LABEL

KEY_PREFIX: Final = "skyhook:"
# Ends a Job at once: its startTime is long past one second when the grace of a stuck image
# pull is over.
FAIL_DEADLINE_SECONDS: Final = 1


def _command(key: str, target: ObjectRef, operation: Any, reason: str, now: float) -> K8sCommand:
    return K8sCommand(
        idempotency_key=KEY_PREFIX + key,
        sender=SENDER,
        sent_at=now,
        expires_at=deadline_after(COMMAND_LIFETIME_SECONDS, now=now),
        target=target,
        operation=operation,
        reason=reason[:1024],
    )


def commands_for(
    action: SkyhookAction,
    now: float,
    *,
    namespace: str,
    default_stage_timeout_seconds: int,
    drain_timeout_seconds: int,
    options: PodOptions = DEFAULT_POD_OPTIONS,
) -> list[K8sCommand]:
    """A ConfigMap write is two commands, a create and a patch of its data, each keyed by
    the content: whichever finds the ConfigMap absent or present does the work, and the
    other is refused (conflict or not found) without harm. k8s-watcher has no upsert and
    mirrors only ConfigMaps labelled as ours, so this is how the content is made sure of."""
    if isinstance(action, WriteNodeMetadata | WritePackageConfig):
        if isinstance(action, WriteNodeMetadata):
            node = action.node
            body = node_metadata_config_map(
                options,
                action.skyhook,
                node.name,
                node.labels,
                node.annotations,
                namespace=namespace,
            )
            why = (
                f"{action.skyhook.names.kind} {action.skyhook.name}: metadata of node "
                f"{node.name} for its agent"
            )
        else:
            body = package_config_map(action.skyhook, action.package, namespace=namespace)
            why = (
                f"{action.skyhook.names.kind} {action.skyhook.name}: configMap of "
                f"{action.package.name} {action.package.version}"
            )
        name = str(body["metadata"]["name"])
        label = action.skyhook.names.name_label
        content = digest(canonical(body))
        target = ObjectRef(api_version="v1", kind="ConfigMap", name=name, namespace=namespace)
        return [
            _command(
                f"cm:{action.skyhook.uid}:{name}:{content}",
                target,
                k8s.CreateObject(object=body),
                why,
                now,
            ),
            _command(
                f"cm-data:{action.skyhook.uid}:{name}:{content}",
                target,
                k8s.PatchObject(
                    patch_type="json",
                    patch=[
                        # Only a ConfigMap of this object (its kind's label and its name).
                        {
                            "op": "test",
                            "path": "/metadata/labels/" + label.replace("/", "~1"),
                            "value": action.skyhook.name,
                        },
                        {"op": "add", "path": "/data", "value": body["data"]},
                        # One written before k8s-watcher mirrored them gets the mirror's label.
                        {
                            "op": "add",
                            "path": "/metadata/labels/"
                            + CONFIG_MAP_MANAGED_BY_LABEL.replace("/", "~1"),
                            "value": CONFIG_MAP_MANAGED_BY,
                        },
                    ],
                ),
                why,
                now,
            ),
        ]
    if isinstance(action, SetRuntimeTaint) and action.cordon and not action.node.unschedulable:
        # The taint goes only once the view shows the node cordoned (a later round): were the
        # cordon refused or lost, the taint would otherwise go without it.
        node = action.node
        return [
            _command(
                f"runtime-cordon:{node.uid}:{node.resource_version}",
                _node_ref(node),
                k8s.CordonNode(),
                "runtimeRequiredCordonAfter: cordoned before its runtime-required taint goes",
                now,
            )
        ]
    return [
        command_for(
            action,
            now,
            namespace=namespace,
            default_stage_timeout_seconds=default_stage_timeout_seconds,
            drain_timeout_seconds=drain_timeout_seconds,
            options=options,
        )
    ]


@dataclass(frozen=True)
class _Where:
    """The settings every command is built with."""

    namespace: str
    default_stage_timeout_seconds: int
    drain_timeout_seconds: int
    options: PodOptions


def command_for(
    action: SkyhookAction,
    now: float,
    *,
    namespace: str,
    default_stage_timeout_seconds: int,
    drain_timeout_seconds: int,
    options: PodOptions = DEFAULT_POD_OPTIONS,
) -> K8sCommand:
    """The one command of an action (one builder per action type below)."""
    assert not isinstance(action, WriteNodeMetadata | WritePackageConfig), "commands_for"
    where = _Where(namespace, default_stage_timeout_seconds, drain_timeout_seconds, options)
    return _command_of(action, now, where)


@functools.singledispatch
def _command_of(action: SkyhookAction, now: float, where: _Where) -> K8sCommand:
    raise TypeError(f"no command for {type(action).__name__}")


@_command_of.register
def _create_job(action: CreateJob, now: float, where: _Where) -> K8sCommand:
    body = build_job(
        action.skyhook,
        action.package,
        action.stage,
        action.node,
        namespace=where.namespace,
        default_stage_timeout_seconds=where.default_stage_timeout_seconds,
        run=action.run,
        config=action.config,
        node_uid=action.node_uid,
        options=where.options,
        node_order=action.node_order,
    )
    target = _job_ref(action.name, where)
    return _command(
        f"job:{action.skyhook.uid}:{action.name}:{action.attempt}",
        target,
        k8s.CreateObject(object=body),
        f"{action.package.name} {action.package.version} {action.stage} on {action.node}",
        now,
    )


@_command_of.register
def _fail_job(action: FailJob, now: float, where: _Where) -> K8sCommand:
    target = _job_ref(action.name, where)
    return _command(
        f"fail:{action.name}:{digest(action.message)}",
        target,
        k8s.PatchObject(
            patch_type="merge",
            patch={"spec": {"activeDeadlineSeconds": FAIL_DEADLINE_SECONDS}},
        ),
        action.message,
        now,
    )


@_command_of.register
def _keep_failed_job(action: KeepFailedJob, now: float, where: _Where) -> K8sCommand:
    target = _job_ref(action.name, where)
    return _command(
        f"keep:{action.name}:{action.attempt}",
        target,
        k8s.PatchObject(patch_type="merge", patch={"spec": {"ttlSecondsAfterFinished": None}}),
        "a failed stage Job stays for its logs until deleted",
        now,
    )


@_command_of.register
def _patch_node(action: PatchNode, now: float, where: _Where) -> K8sCommand:
    node, names = action.node, action.names
    annotations: dict[str, Any] = {
        names.node_state_annotation(action.skyhook): action.node_state or None,
        names.status_key(action.skyhook): action.status,
        # The schema of the state beside it; gone with the state.
        names.version_annotation(action.skyhook): (
            NODE_STATE_VERSION if action.node_state else None
        ),
        names.cordon_annotation(action.skyhook): "true" if action.cordon else None,
    }
    patch = {
        "metadata": {
            "annotations": annotations,
            "labels": {names.status_key(action.skyhook): action.status},
        }
    }
    return _command(
        f"node:{names.group}:{action.skyhook}:{node.uid}:{node.resource_version}:{digest(canonical(patch))}",
        _node_ref(node),
        k8s.PatchObject(patch_type="merge", patch=patch),
        f"{names.kind} {action.skyhook}: node {action.status}",
        now,
    )


@_command_of.register
def _set_node_conditions(action: SetNodeConditions, now: float, where: _Where) -> K8sCommand:
    node = action.node
    # Strategic merge: conditions merge by type, so only these entries change.
    entries = [dict(c) for c in action.conditions] + [
        {"type": kind, "$patch": "delete"} for kind in action.removed
    ]
    status_patch: dict[str, Any] = {"status": {"conditions": entries}}
    return _command(
        f"node-conditions:{action.names.group}:{action.skyhook}:{node.uid}:{node.resource_version}:"
        f"{digest(canonical(status_patch))}",
        _node_ref(node),
        k8s.PatchObject(patch_type="strategic", patch=status_patch, subresource="status"),
        (
            f"{action.names.kind} {action.skyhook}: node conditions "
            + ", ".join(f"{c['type']}={c['status']}" for c in action.conditions)
        )
        if action.conditions
        else f"{action.names.kind} {action.skyhook} deleted: its conditions leave the node",
        now,
    )


@_command_of.register
def _create_maintenance(action: CreateMaintenance, now: float, where: _Where) -> K8sCommand:
    body = build_maintenance(
        action.skyhook,
        action.node,
        namespace=where.namespace,
        drain_timeout_seconds=where.drain_timeout_seconds,
    )
    return _command(
        f"nm:{action.skyhook.uid}:{action.name}:{digest(action.purpose)}",
        _maintenance_ref(action.name, where),
        k8s.CreateObject(object=body),
        f"Skyhook {action.skyhook.name}: interrupt of {action.purpose} on {action.node}",
        now,
    )


@_command_of.register
def _delete_config_map(action: DeleteConfigMap, now: float, where: _Where) -> K8sCommand:
    return _command(
        f"cm-delete:{action.name}:{action.uid}",
        ObjectRef(
            api_version="v1",
            kind="ConfigMap",
            name=action.name,
            namespace=where.namespace,
            uid=action.uid or None,
        ),
        k8s.DeleteObject(),
        f"{action.names.kind} {action.skyhook}: its {action.purpose} ConfigMap is no longer wanted",
        now,
    )


@_command_of.register
def _delete_maintenance(action: DeleteMaintenance, now: float, where: _Where) -> K8sCommand:
    return _command(
        f"nm-delete:{action.name}:{action.uid}",
        _maintenance_ref(action.name, where, action.uid),
        k8s.DeleteObject(),
        f"Skyhook {action.skyhook}: interrupts on {action.node} done",
        now,
    )


@_command_of.register
def _set_skyhook_status(action: SetSkyhookStatus, now: float, where: _Where) -> K8sCommand:
    skyhook = action.skyhook
    return _command(
        f"status:{skyhook.uid}:{skyhook.resource_version}:{digest(canonical(action.status))}",
        _skyhook_as_seen(skyhook),
        k8s.UpdateStatus(status=dict(action.status)),
        f"status {action.status.get('status')}",
        now,
    )


@_command_of.register
def _forget_node(action: ForgetNode, now: float, where: _Where) -> K8sCommand:
    node, names = action.node, action.names
    patch = {
        "metadata": {
            "annotations": {
                names.node_state_annotation(action.skyhook): None,
                names.status_key(action.skyhook): None,
                names.version_annotation(action.skyhook): None,
                names.cordon_annotation(action.skyhook): None,
            },
            "labels": {names.status_key(action.skyhook): None},
        }
    }
    return _command(
        f"forget:{names.group}:{action.skyhook}:{node.uid}:{node.resource_version}",
        _node_ref(node),
        k8s.PatchObject(patch_type="merge", patch=patch),
        f"{names.kind} {action.skyhook} deleted: its marks leave the node",
        now,
    )


@_command_of.register
def _set_runtime_taint(action: SetRuntimeTaint, now: float, where: _Where) -> K8sCommand:
    node = action.node
    key, effect = action.taint.get("key"), action.taint.get("effect")
    untouched = [dict(t) for t in node.taints if (t.get("key"), t.get("effect")) != (key, effect)]
    taints = [*untouched, dict(action.taint)] if action.present else untouched
    taint_patch: dict[str, Any] = {"spec": {"taints": taints or None}}
    if action.present:
        taint_patch["metadata"] = {
            "annotations": {action.names.auto_taint_annotation(str(key)): "true"}
        }
    elif action.cordon:
        # The mark comes with the taint's removal, sent only once the view shows the node
        # cordoned (commands_for), at the resourceVersion that shows it (S57).
        taint_patch["metadata"] = {
            "annotations": {action.names.runtime_required_cordon_annotation: "true"}
        }
    return _command(
        f"runtime-taint:{key}:{node.uid}:{node.resource_version}:{action.present}"
        f"{':cordon' if action.cordon else ''}",
        _node_as_seen(node),
        k8s.PatchObject(patch_type="merge", patch=taint_patch),
        "runtime-required: a new node waits for its Skyhooks"
        if action.present
        else "runtime-required: every Skyhook is complete on the node"
        + (", cordoned until released (runtimeRequiredCordonAfter)" if action.cordon else ""),
        now,
    )


@_command_of.register
def _drop_runtime_cordon_mark(
    action: DropRuntimeCordonMark, now: float, where: _Where
) -> K8sCommand:
    node = action.node
    mark = action.names.runtime_required_cordon_annotation
    return _command(
        f"runtime-cordon-mark:{mark}:{node.uid}:{node.resource_version}",
        # At the version seen uncordoned: a cordon since then keeps its mark.
        _node_as_seen(node),
        k8s.PatchObject(patch_type="merge", patch={"metadata": {"annotations": {mark: None}}}),
        "runtimeRequiredCordon: the node was uncordoned, its stale mark goes",
        now,
    )


@_command_of.register
def _set_skyhook_finalizer(action: SetSkyhookFinalizer, now: float, where: _Where) -> K8sCommand:
    skyhook = action.skyhook
    finalizer = skyhook.names.finalizer
    kept = [f for f in skyhook.finalizers if f != finalizer]
    wanted = [*kept, finalizer] if action.present else kept
    return _command(
        f"finalizer:{skyhook.uid}:{skyhook.resource_version}:{action.present}",
        _skyhook_as_seen(skyhook),
        k8s.PatchObject(patch_type="merge", patch={"metadata": {"finalizers": wanted or None}}),
        "its node marks are cleaned up before it goes"
        if action.present
        else "deleted: nothing of it is left on any node",
        now,
    )


@_command_of.register
def _set_policy_finalizer(action: SetPolicyFinalizer, now: float, where: _Where) -> K8sCommand:
    policy = action.policy
    finalizer = policy.names.policy_finalizer
    others = [f for f in policy.finalizers if f != finalizer]
    finalizers = [*others, finalizer] if action.present else others
    return _command(
        f"policy:{policy.uid}:{policy.resource_version}:{action.present}",
        ObjectRef(
            api_version=policy.names.api_version,
            kind=POLICY_KIND,
            name=policy.name,
            uid=policy.uid or None,
            resource_version=policy.resource_version or None,
        ),
        k8s.PatchObject(patch_type="merge", patch={"metadata": {"finalizers": finalizers or None}}),
        f"in use by a {policy.names.kind}" if action.present else f"no {policy.names.kind} uses it",
        now,
    )


def decision_for(note: SkyhookDecisionNote, now: float, basis: str) -> SkyhookDecision:
    """`basis` is the state the note was decided on (so the same state yields the same id)."""
    decision_id = KEY_PREFIX + digest(
        note.object_kind,
        note.skyhook,
        note.kind,
        note.node,
        note.package,
        note.stage,
        note.message,
        basis,
    )
    return SkyhookDecision(
        decision_id=decision_id,
        skyhook=note.skyhook,
        kind=note.kind,
        reason=note.reason or note.kind,
        message=note.message[:2048],
        decided_at=now,
        node=note.node,
        package=note.package,
        stage=note.stage,
        compartment=note.compartment,
        object_kind=note.object_kind,
    )


def _job_ref(name: str, where: _Where) -> ObjectRef:
    return ObjectRef(api_version="batch/v1", kind="Job", name=name, namespace=where.namespace)


def _maintenance_ref(name: str, where: _Where, uid: str = "") -> ObjectRef:
    return ObjectRef(
        api_version="maintenance.nvidia.com/v1alpha1",
        kind="NodeMaintenance",
        name=name,
        namespace=where.namespace,
        uid=uid or None,
    )


def _skyhook_as_seen(skyhook: Skyhook) -> ObjectRef:
    """The Skyhook (or NodeWright) at the resourceVersion the plan read."""
    return ObjectRef(
        api_version=skyhook.names.api_version,
        kind=skyhook.names.kind,
        name=skyhook.name,
        uid=skyhook.uid or None,
        resource_version=skyhook.resource_version or None,
    )


def _node_ref(node: NodeView) -> ObjectRef:
    return ObjectRef(api_version="v1", kind="Node", name=node.name, uid=node.uid or None)


def _node_as_seen(node: NodeView) -> ObjectRef:
    """The node at the resourceVersion the plan read: a write that lands only on that node."""
    return ObjectRef(
        api_version="v1",
        kind="Node",
        name=node.name,
        uid=node.uid or None,
        resource_version=node.resource_version or None,
    )
