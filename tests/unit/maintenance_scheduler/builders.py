"""Raw NodeMaintenance, Node and Pod objects for the maintenance-scheduler's unit tests."""

from __future__ import annotations

from typing import Any

from maintenance_scheduler.api import (
    API_VERSION,
    FINALIZER,
    NodeMaintenance,
    parse_node_maintenance,
)
from maintenance_scheduler.pods import PodFacts, pod_facts
from maintenance_scheduler.reconcile import NodeFacts
from maintenance_scheduler.scheduler import NodeInfo
from nodeflow_kube.fields import (
    rfc3339,
)

T0 = 1_800_000_000.0


def nm_object(
    name: str,
    node: str,
    *,
    requestor: str = "team.example.com",
    phase: str | None = None,
    created: float = T0,
    phase_since: float = T0,
    message: str = "",
    annotations: dict[str, str] | None = None,
    finalizer: bool = False,
    deleting: bool = False,
    rv: str = "10",
    status: dict[str, Any] | None = None,
    requestor_failed: bool = False,
    owners: tuple[dict[str, str], ...] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    metadata: dict[str, Any] = {
        "name": name,
        "namespace": "default",
        "uid": f"uid-{name}",
        "resourceVersion": rv,
        "generation": 1,
        "creationTimestamp": rfc3339(created),
        "annotations": dict(annotations or {}),
    }
    if finalizer:
        metadata["finalizers"] = [FINALIZER]
    # A request gets its node as owner at its first round (upstream sets it before anything
    # else): by default a request has it already; `owners=()` builds one that has not.
    if owners is None:
        owners = (node_owner(node),)
    if owners:
        metadata["ownerReferences"] = [dict(owner) for owner in owners]
    if deleting:
        metadata["deletionTimestamp"] = rfc3339(created + 1)
    body = dict(status or {})
    conditions: list[dict[str, Any]] = []
    if phase is not None:
        conditions.append(
            {
                "type": "Ready",
                "status": "True" if phase == "Ready" else "False",
                "reason": phase,
                "message": message,
                "lastTransitionTime": rfc3339(phase_since),
                "observedGeneration": 1,
            }
        )
    if requestor_failed:
        conditions.append(
            {
                "type": "RequestorFailed",
                "status": "True",
                "reason": "FailedMaintenance",
                "message": "",
                "lastTransitionTime": rfc3339(phase_since),
            }
        )
    if conditions:
        body["conditions"] = conditions
    return {
        "apiVersion": API_VERSION,
        "kind": "NodeMaintenance",
        "metadata": metadata,
        "spec": {"requestorID": requestor, "nodeName": node, **spec},
        "status": body,
    }


def node_owner(node: str) -> dict[str, str]:
    """The ownerReference a scheduled request gets to its node (see node_facts' uid)."""
    return {"apiVersion": "v1", "kind": "Node", "name": node, "uid": f"uid-{node}"}


def predecessor_owner(node: str) -> dict[str, str]:
    """The ownerReference of a request made for a node that another, of the same name and a
    new uid, has since replaced."""
    return {"apiVersion": "v1", "kind": "Node", "name": node, "uid": f"uid-{node}-before"}


def nm(name: str, node: str, **kwargs: Any) -> NodeMaintenance:
    return parse_node_maintenance(nm_object(name, node, **kwargs))


def node_info(name: str, *, unschedulable: bool = False, ready: bool = True) -> NodeInfo:
    return NodeInfo(name=name, unschedulable=unschedulable, ready=ready, uid=f"uid-{name}")


def node_facts(name: str, *, unschedulable: bool = False, reason: str = "") -> NodeFacts:
    return NodeFacts(
        name=name,
        uid=f"uid-{name}",
        resource_version="5",
        unschedulable=unschedulable,
        ready=True,
        cordon_reason=reason,
    )


def pod(
    name: str,
    node: str = "n1",
    *,
    labels: dict[str, str] | None = None,
    owner: str | None = "ReplicaSet",
    resources: tuple[str, ...] = ("cpu",),
    empty_dir: bool = False,
    mirror: bool = False,
    phase: str = "Running",
    terminating: bool = False,
    slurm: tuple[str, ...] | None = None,
) -> PodFacts:
    """`slurm`: the Slurm states/flags projected as SlurmNodeState* conditions (a NodeSet pod)."""
    metadata: dict[str, Any] = {
        "name": name,
        "namespace": "default",
        "uid": f"uid-{name}",
        "labels": dict(labels or {}),
        "annotations": {"kubernetes.io/config.mirror": "x"} if mirror else {},
    }
    if owner:
        metadata["ownerReferences"] = [{"kind": owner, "name": "o", "controller": True}]
    if terminating:
        metadata["deletionTimestamp"] = rfc3339(T0)
    conditions: list[dict[str, Any]] = []
    if slurm is not None:
        metadata["labels"]["nodeflow.dev/nodeset"] = "compute"
        conditions = [
            {"type": f"SlurmNodeState{s}", "status": "True", "message": ""} for s in slurm
        ]
    spec: dict[str, Any] = {
        "nodeName": node,
        "containers": [
            {"name": "c", "resources": {"requests": {r: "1" for r in resources}}},
        ],
    }
    if empty_dir:
        spec["volumes"] = [{"name": "scratch", "emptyDir": {}}]
    return pod_facts(
        {"metadata": metadata, "spec": spec, "status": {"phase": phase, "conditions": conditions}}
    )
