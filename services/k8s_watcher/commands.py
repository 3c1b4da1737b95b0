"""Pure part of the command executor: the API call each command becomes, and what an API
answer means as an outcome. The executor (executor.py) does the I/O."""

from __future__ import annotations

import copy
import hashlib
from dataclasses import dataclass
from typing import Any, Literal

from k8s_watcher.kinds import (
    CORE_EVENT,
    CREATABLE_KINDS,
    DELETABLE_KINDS,
    PATCHABLE_KINDS,
    STATUS_PATCHABLE_KINDS,
    resolve_kind,
)
from k8s_watcher.kube import JSON, JSON_PATCH, MERGE_PATCH, STRATEGIC_MERGE_PATCH
from nodeflow_contracts.k8s import (
    BindPod,
    CommandOperation,
    CordonNode,
    CreateObject,
    DeleteObject,
    EvictPod,
    K8sCommand,
    NominatePod,
    ObjectRef,
    Outcome,
    PatchObject,
    RecordEvent,
    UncordonNode,
    UpdateStatus,
)

# Stamped on every object a `create` command makes, so that a repeat after a crash (the
# object exists, the applied-key record does not) is recognised as already applied.
IDEMPOTENCY_ANNOTATION = "nodeflow.dev/idempotency-key"

PATCH_CONTENT_TYPES = {
    "merge": MERGE_PATCH,
    "strategic": STRATEGIC_MERGE_PATCH,
    "json": JSON_PATCH,
}


@dataclass(frozen=True)
class ApiCall:
    method: Literal["POST", "PATCH", "DELETE"]
    path: str
    body: Any
    content_type: str = JSON
    # For a create: where to look for an existing object on 409 AlreadyExists.
    created_object_path: str | None = None


@dataclass(frozen=True)
class Rejected:
    """Refused before any API call (unknown kind, wrong target)."""

    outcome: Outcome
    message: str


def plan_command(cmd: K8sCommand, *, now: str, reporting_instance: str) -> ApiCall | Rejected:
    """The one API call that carries out `cmd` (`now` is an RFC 3339 timestamp)."""
    operation = cmd.operation
    target = cmd.target
    if isinstance(operation, CreateObject):
        return _plan_create(cmd, operation)
    if isinstance(operation, RecordEvent):
        return _plan_record_event(cmd, operation, now, reporting_instance)
    kind = resolve_kind(target.api_version, target.kind)
    if kind is None:
        return Rejected(
            "invalid", f"k8s-watcher does not handle {target.api_version} {target.kind}"
        )
    if kind.read_only:
        return Rejected(
            "forbidden", f"k8s-watcher only reads {target.api_version} {target.kind} objects"
        )
    if kind.namespaced and not target.namespace:
        return Rejected("invalid", f"{target.kind} {target.name}: a namespace is required")
    path = kind.object_path(target.namespace, target.name)
    refusal = _outside_rbac(kind.kind, operation)
    if refusal is not None:
        return refusal
    if isinstance(operation, DeleteObject):
        options: dict[str, Any] = {"kind": "DeleteOptions", "apiVersion": "v1"}
        preconditions = _preconditions(target)
        if preconditions:
            options["preconditions"] = preconditions
        if operation.propagation_policy:
            options["propagationPolicy"] = operation.propagation_policy
        if operation.grace_period_seconds is not None:
            options["gracePeriodSeconds"] = operation.grace_period_seconds
        return ApiCall("DELETE", path, options)
    if isinstance(operation, PatchObject):
        patch = _with_preconditions(operation.patch_type, operation.patch, target)
        if isinstance(patch, Rejected):
            return patch
        sub_path = kind.object_path(target.namespace, target.name, operation.subresource)
        return ApiCall("PATCH", sub_path, patch, PATCH_CONTENT_TYPES[operation.patch_type])
    if isinstance(operation, CordonNode | UncordonNode):
        if kind.kind != "Node":
            return Rejected("invalid", f"{operation.__struct_config__.tag} needs a Node target")
        value = True if isinstance(operation, CordonNode) else None
        patch = _with_preconditions("strategic", {"spec": {"unschedulable": value}}, target)
        return ApiCall("PATCH", path, patch, STRATEGIC_MERGE_PATCH)
    if kind.kind != "Pod" and isinstance(operation, EvictPod | BindPod | NominatePod):
        return Rejected("invalid", f"{operation.__struct_config__.tag} needs a Pod target")
    if isinstance(operation, EvictPod):
        eviction: dict[str, Any] = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": target.name, "namespace": target.namespace},
        }
        delete_options: dict[str, Any] = {}
        if operation.grace_period_seconds is not None:
            delete_options["gracePeriodSeconds"] = operation.grace_period_seconds
        if _preconditions(target):
            delete_options["preconditions"] = _preconditions(target)
        if delete_options:
            eviction["deleteOptions"] = delete_options
        return ApiCall(
            "POST", kind.object_path(target.namespace, target.name, "eviction"), eviction
        )
    if isinstance(operation, BindPod):
        meta: dict[str, Any] = {"name": target.name, "namespace": target.namespace}
        if target.uid:
            meta["uid"] = target.uid
        binding = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": meta,
            "target": {"apiVersion": "v1", "kind": "Node", "name": operation.node_name},
        }
        return ApiCall("POST", kind.object_path(target.namespace, target.name, "binding"), binding)
    if isinstance(operation, NominatePod):
        nominated = operation.node_name or None
        patch = _with_preconditions("merge", {"status": {"nominatedNodeName": nominated}}, target)
        status_path = kind.object_path(target.namespace, target.name, "status")
        return ApiCall("PATCH", status_path, patch, MERGE_PATCH)
    if isinstance(operation, UpdateStatus):
        if not kind.group or kind.group in ("batch", "policy"):
            return Rejected("invalid", "update-status is for custom resources")
        ops = _with_preconditions(
            "json", [{"op": "add", "path": "/status", "value": operation.status}], target
        )
        status_path = kind.object_path(target.namespace, target.name, "status")
        return ApiCall("PATCH", status_path, ops, JSON_PATCH)
    raise AssertionError(f"unhandled operation {operation!r}")


def _outside_rbac(kind: str, operation: CommandOperation) -> Rejected | None:
    if isinstance(operation, DeleteObject) and kind not in DELETABLE_KINDS:
        return Rejected("forbidden", f"k8s-watcher does not delete {kind} objects")
    if isinstance(operation, PatchObject):
        allowed = STATUS_PATCHABLE_KINDS if operation.subresource else PATCHABLE_KINDS
        if kind not in allowed:
            where = f"the {operation.subresource} of " if operation.subresource else ""
            return Rejected("forbidden", f"k8s-watcher does not patch {where}{kind} objects")
    return None


def _plan_create(cmd: K8sCommand, operation: CreateObject) -> ApiCall | Rejected:
    obj = copy.deepcopy(operation.object)
    api_version = str(obj.get("apiVersion") or cmd.target.api_version)
    kind_name = str(obj.get("kind") or cmd.target.kind)
    kind = resolve_kind(api_version, kind_name)
    if kind is None or kind.read_only or kind_name not in CREATABLE_KINDS:
        return Rejected(
            "forbidden", f"k8s-watcher does not create {api_version} {kind_name} objects"
        )
    obj["apiVersion"] = api_version
    obj["kind"] = kind_name
    meta = obj.setdefault("metadata", {})
    if not isinstance(meta, dict) or not (meta.get("name") or meta.get("generateName")):
        return Rejected("invalid", "the object to create needs metadata.name")
    if kind.namespaced:
        meta["namespace"] = meta.get("namespace") or cmd.target.namespace or "default"
    annotations = meta.setdefault("annotations", {})
    annotations[IDEMPOTENCY_ANNOTATION] = cmd.idempotency_key
    namespace = meta.get("namespace")
    existing = kind.object_path(namespace, meta["name"]) if meta.get("name") else None
    return ApiCall("POST", kind.collection_path(namespace), obj, created_object_path=existing)


def proves_itself(cmd: K8sCommand) -> bool:
    """Whether a repeat of `cmd` is recognisable from the API alone: a create of a named
    object (or an Event, whose name derives from the key) stamps the key on what it makes,
    and a repeat meets AlreadyExists with it. A generateName create would make a second
    object, so it relies on the applied-key record like every other operation.

    A Lease patch that first tests its holder (a leader's renewal or release of the Lease that
    mirrors its leadership, every few seconds) needs no record either: a repeat can only write
    that holder's own renewTime again, or fail its test. Recording each would fill the
    applied-key bucket with hundreds of thousands of keys over its TTL."""
    operation = cmd.operation
    if isinstance(operation, RecordEvent):
        return True
    if isinstance(operation, CreateObject):
        meta = operation.object.get("metadata")
        return isinstance(meta, dict) and bool(meta.get("name"))
    if isinstance(operation, PatchObject) and cmd.target.kind == "Lease":
        return _tests_the_holder_first(operation)
    return False


def _tests_the_holder_first(operation: PatchObject) -> bool:
    patch = operation.patch
    if operation.patch_type != "json" or not isinstance(patch, list) or not patch:
        return False
    first = patch[0]
    return (
        isinstance(first, dict)
        and first.get("op") == "test"
        and first.get("path") == "/spec/holderIdentity"
    )


def event_name(target: ObjectRef, idempotency_key: str) -> str:
    """Deterministic, so a repeated record-event meets AlreadyExists instead of a duplicate."""
    digest = hashlib.sha256(idempotency_key.encode()).hexdigest()[:16]
    return f"{target.name[:200]}.{digest}"


def _plan_record_event(
    cmd: K8sCommand, operation: RecordEvent, now: str, reporting_instance: str
) -> ApiCall:
    target = cmd.target
    namespace = target.namespace or "default"
    involved: dict[str, Any] = {
        "apiVersion": target.api_version,
        "kind": target.kind,
        "name": target.name,
    }
    if target.namespace:
        involved["namespace"] = target.namespace
    if target.uid:
        involved["uid"] = target.uid
    if target.resource_version:
        involved["resourceVersion"] = target.resource_version
    component = operation.reporting_component or cmd.sender
    name = event_name(target, cmd.idempotency_key)
    event: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "annotations": {IDEMPOTENCY_ANNOTATION: cmd.idempotency_key},
        },
        "involvedObject": involved,
        "reason": operation.reason,
        "message": operation.message,
        "type": operation.type,
        "source": {"component": component},
        "reportingComponent": component,
        "reportingInstance": reporting_instance,
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }
    if operation.action:
        event["action"] = operation.action
    return ApiCall(
        "POST",
        CORE_EVENT.collection_path(namespace),
        event,
        created_object_path=CORE_EVENT.object_path(namespace, name),
    )


def _preconditions(target: ObjectRef) -> dict[str, str]:
    found: dict[str, str] = {}
    if target.uid:
        found["uid"] = target.uid
    if target.resource_version:
        found["resourceVersion"] = target.resource_version
    return found


def _with_preconditions(patch_type: str, patch: Any, target: ObjectRef) -> Any:
    """Carry uid/resourceVersion preconditions in the patch itself: the API server refuses
    (409) a patch whose result names another uid or an older resourceVersion."""
    preconditions = _preconditions(target)
    if patch_type == "json":
        if not isinstance(patch, list):
            return Rejected("invalid", "a JSON patch must be a list of operations")
        ops = [
            {"op": "replace", "path": f"/metadata/{field}", "value": value}
            for field, value in preconditions.items()
        ]
        return [*ops, *patch]
    if not isinstance(patch, dict):
        return Rejected("invalid", f"a {patch_type} patch must be an object")
    if not preconditions:
        return patch
    merged = dict(patch)
    meta = dict(merged.get("metadata") or {})
    for field, value in preconditions.items():
        meta.setdefault(field, value)
    merged["metadata"] = meta
    return merged


# --- answers -------------------------------------------------------------------------------


def is_retryable(status: int | None) -> bool:
    """No answer, 429 (throttled, or a PodDisruptionBudget refusing an eviction) and 5xx
    may pass; everything else is the final word on this command."""
    return status is None or status == 429 or status >= 500


def outcome_of(status: int) -> Outcome:
    """The final outcome of an answer that is not retryable."""
    if 200 <= status < 300:
        return "applied"
    if status == 409:
        return "conflict"
    if status in (404, 410):
        return "not-found"
    if status in (401, 403):
        return "forbidden"
    return "invalid"


def resource_version_of(body: Any) -> str | None:
    if isinstance(body, dict) and body.get("kind") != "Status":
        rv = (body.get("metadata") or {}).get("resourceVersion")
        return str(rv) if rv else None
    return None


def created_by(body: Any, idempotency_key: str) -> bool:
    """Whether an existing object was created by the command with this key."""
    if not isinstance(body, dict):
        return False
    annotations = (body.get("metadata") or {}).get("annotations") or {}
    return bool(annotations.get(IDEMPOTENCY_ANNOTATION) == idempotency_key)
