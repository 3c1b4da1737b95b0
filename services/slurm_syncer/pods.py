"""What the syncer needs to know about a NodeSet pod, read from the raw Kubernetes objects
that k8s-watcher keeps in the `k8s_pods`, `k8s_nodes` and `k8s_nodesets` KV buckets."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from nodeflow_contracts import subjects
from nodeflow_contracts.pod_protocol import (
    NODE_CORDON_REASON_ANNOTATION,
    NODESET_LABEL,
    POD_CORDON_ANNOTATION,
    POD_CORDON_FROM_NODE,
    POD_CORDON_SOURCE_ANNOTATION,
    SLURM_CLUSTER_LABEL,
    SLURM_DELETE_CONDITION,
)
from nodeflow_kube.fields import mapping

Obj = Mapping[str, Any]


class ObjectLookup(Protocol):
    """Objects by KV key: a dict, or a live KVView (read without copying it per pod)."""

    def get(self, key: str, /) -> Any: ...


@dataclass(frozen=True)
class PodFacts:
    """One NodeSet pod as the drain and condition decisions see it."""

    key: str  # k8s_pods KV key, <namespace>.<name>
    namespace: str
    name: str  # also the Slurm node name
    uid: str
    resource_version: str
    cluster: str
    node_name: str | None
    # The pod's Kubernetes node is in the k8s_nodes view (a missing one proves nothing).
    node_known: bool
    node_unschedulable: bool
    node_cordon_reason: str | None
    pod_cordoned: bool
    # The cordon mark was written because the node was cordoned (not by a person).
    pod_cordon_from_node: bool
    # Reason of the SlurmDelete=True condition, None when the condition is absent or not True.
    delete_reason: str | None
    terminating: bool
    conditions: tuple[Any, ...]
    # When the syncer first saw the pod past Pending (its containers may run, so slurmd may
    # register); None while it has not (the pod is Pending, or just appeared).
    running_seen_at: float | None = None


def nodeset_of(pod: Obj) -> str | None:
    label = mapping(mapping(pod.get("metadata")).get("labels")).get(NODESET_LABEL)
    return label if isinstance(label, str) and label else None


def cluster_of(pod: Obj, nodesets: ObjectLookup) -> str | None:
    """The Slurm cluster of a NodeSet pod: its NodeSet's spec.slurmCluster, else its label."""
    metadata = mapping(pod.get("metadata"))
    nodeset = nodeset_of(pod)
    namespace = metadata.get("namespace")
    if nodeset and isinstance(namespace, str):
        owner = nodesets.get(f"{namespace}.{nodeset}")
        if owner is not None:
            cluster = mapping(owner.get("spec")).get("slurmCluster")
            if isinstance(cluster, str) and cluster:
                return cluster
    label = mapping(metadata.get("labels")).get(SLURM_CLUSTER_LABEL)
    return label if isinstance(label, str) and label else None


def slurm_delete_reason(conditions: tuple[Any, ...]) -> str | None:
    for entry in conditions:
        if isinstance(entry, Mapping) and entry.get("type") == SLURM_DELETE_CONDITION:
            if entry.get("status") == "True":
                reason = entry.get("reason")
                return reason if isinstance(reason, str) and reason else "DeleteScheduled"
            return None
    return None


def node_key(node_name: str) -> str:
    return subjects.object_key(None, node_name)


def pod_facts(
    pod: Obj,
    nodes: ObjectLookup,
    nodesets: ObjectLookup,
    *,
    running_seen_at: float | None = None,
) -> PodFacts | None:
    """Facts of a NodeSet pod; None for any other pod or one whose cluster is not known.
    `running_seen_at` is when the syncer first saw the pod past Pending (`is_past_pending`)."""
    if nodeset_of(pod) is None:
        return None
    metadata = mapping(pod.get("metadata"))
    namespace, name = metadata.get("namespace"), metadata.get("name")
    if not isinstance(namespace, str) or not isinstance(name, str) or not name:
        return None
    cluster = cluster_of(pod, nodesets)
    if cluster is None:
        return None
    node_name = mapping(pod.get("spec")).get("nodeName")
    node_name = node_name if isinstance(node_name, str) and node_name else None
    node = nodes.get(node_key(node_name)) if node_name else None
    node_annotations = mapping(mapping(mapping(node).get("metadata")).get("annotations"))
    cordon_reason = node_annotations.get(NODE_CORDON_REASON_ANNOTATION)
    annotations = mapping(metadata.get("annotations"))
    raw_conditions = mapping(pod.get("status")).get("conditions")
    conditions = tuple(raw_conditions) if isinstance(raw_conditions, list) else ()
    return PodFacts(
        key=subjects.object_key(namespace, name),
        namespace=namespace,
        name=name,
        uid=str(metadata.get("uid") or ""),
        resource_version=str(metadata.get("resourceVersion") or ""),
        cluster=cluster,
        node_name=node_name,
        node_known=node is not None,
        node_unschedulable=bool(mapping(mapping(node).get("spec")).get("unschedulable")),
        node_cordon_reason=cordon_reason.strip()
        if isinstance(cordon_reason, str) and cordon_reason.strip()
        else None,
        pod_cordoned=str(annotations.get(POD_CORDON_ANNOTATION, "")).lower() == "true",
        pod_cordon_from_node=annotations.get(POD_CORDON_SOURCE_ANNOTATION) == POD_CORDON_FROM_NODE,
        delete_reason=slurm_delete_reason(conditions),
        terminating=bool(metadata.get("deletionTimestamp")),
        conditions=conditions,
        running_seen_at=running_seen_at,
    )


def only_nodeset_pods(pod: dict[str, Any]) -> dict[str, Any] | None:
    """What the syncer keeps of a pod in its view (its KVView projection): of a NodeSet pod
    what `pod_facts` and the listeners read (metadata, the node, phase and conditions), no
    other pod at all (they are most of a large cluster's pods and never read here)."""
    if nodeset_of(pod) is None:
        return None
    metadata = mapping(pod.get("metadata"))
    status = mapping(pod.get("status"))
    return {
        "metadata": {
            key: metadata[key]
            for key in (
                "namespace",
                "name",
                "uid",
                "resourceVersion",
                "labels",
                "annotations",
                "deletionTimestamp",
            )
            if key in metadata
        },
        "spec": {"nodeName": mapping(pod.get("spec")).get("nodeName")},
        "status": {key: status[key] for key in ("phase", "conditions") if key in status},
    }


def node_cordon_facts(node: dict[str, Any]) -> dict[str, Any]:
    """What the syncer keeps of a Kubernetes node (its KVView projection): the name, whether
    it is unschedulable and its cordon reason, all `pod_facts` and the cordon model read."""
    metadata = mapping(node.get("metadata"))
    reason = mapping(metadata.get("annotations")).get(NODE_CORDON_REASON_ANNOTATION)
    kept: dict[str, Any] = {
        "metadata": {
            "name": metadata.get("name"),
            "resourceVersion": metadata.get("resourceVersion"),
            "annotations": {} if reason is None else {NODE_CORDON_REASON_ANNOTATION: reason},
        },
        "spec": {"unschedulable": bool(mapping(node.get("spec")).get("unschedulable"))},
    }
    return kept


def is_past_pending(pod: Obj) -> bool:
    """Its containers may have started: any phase but Pending (a missing phase proves
    nothing, so it counts as started)."""
    return mapping(pod.get("status")).get("phase") != "Pending"
