"""What nodeset-controller reads of raw Kubernetes objects (the dicts k8s-watcher keeps in KV)
beyond the generic tolerant readers of nodeflow_kube.fields: claims, addresses, pod phases."""

from __future__ import annotations

import ipaddress
import sys
from dataclasses import dataclass
from typing import Any

from nodeflow_contracts.pod_protocol import (
    CLAIM_ANNOTATION,
    NODESET_LABEL,
    POD_WAIT_CONDITION,
    SLURM_DELETE_CONDITION,
    slurm_state_condition,
)
from nodeflow_kube.fields import (
    Obj,
    annotations_of,
    condition,
    mapping,
    meta,
    sequence,
)
from nodeflow_kube.projections import (
    NODE_POOL_PARTS,
    POD_TEMPLATE_PARTS,
    SharedCopies,
    items_key,
    kept_node,
    kept_pod,
    share_parts,
)
from nodeflow_kube.quantity import ResourceList
from nodeflow_kube.resources import node_allocatable as node_allocatable
from nodeflow_kube.resources import pod_requests as pod_requests

NODESET_API_VERSION = "nodeflow.dev/v1alpha1"
NODESET_KIND = "NodeSet"
NODESLICE_KIND = "NodeSlice"


def owned_by_nodeset(name: str, uid: str) -> list[dict[str, Any]]:
    """The ownerReferences of an object a NodeSet controls (its pods, NodeSlices and
    PodDisruptionBudget): deleting the NodeSet deletes them, and foreground deletion waits."""
    return [
        {
            "apiVersion": NODESET_API_VERSION,
            "kind": NODESET_KIND,
            "name": name,
            "uid": uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]


def nodeset_key(namespace: str, name: str) -> str:
    return f"{namespace}.{name}"


def claim_of(node: Obj) -> str | None:
    value = annotations_of(node).get(CLAIM_ANNOTATION)
    return value if isinstance(value, str) and value else None


def internal_ipv4(node: Obj) -> ipaddress.IPv4Address | None:
    """The node's first IPv4 InternalIP (an IPv6 InternalIP does not count)."""
    for address in sequence(mapping(node.get("status")).get("addresses")):
        entry = mapping(address)
        if entry.get("type") != "InternalIP":
            continue
        try:
            parsed = ipaddress.ip_address(str(entry.get("address") or ""))
        except ValueError:
            continue
        if isinstance(parsed, ipaddress.IPv4Address):
            return parsed
    return None


def pod_is_ready(pod: Obj) -> bool:
    ready = condition(pod, "Ready")
    return ready is not None and ready.get("status") == "True"


def pod_phase(pod: Obj) -> str:
    """The pod's status.phase as written, "" when missing (not a guess: a pod whose phase is
    missing may well be running)."""
    return str(mapping(pod.get("status")).get("phase") or "")


def pod_is_terminating(pod: Obj) -> bool:
    return bool(meta(pod).get("deletionTimestamp"))


def pod_is_terminal(pod: Obj) -> bool:
    return pod_phase(pod) in ("Succeeded", "Failed")


def pod_node(pod: Obj) -> str | None:
    """The node a pod runs on, or, before it is bound, the node its required affinity names
    (a NodeSet pod is pinned with matchFields metadata.name In [node])."""
    bound = mapping(pod.get("spec")).get("nodeName")
    if isinstance(bound, str) and bound:
        return bound
    affinity = mapping(mapping(mapping(pod.get("spec")).get("affinity")).get("nodeAffinity"))
    required = mapping(affinity.get("requiredDuringSchedulingIgnoredDuringExecution"))
    for term in sequence(required.get("nodeSelectorTerms")):
        for field in sequence(mapping(term).get("matchFields")):
            entry = mapping(field)
            values = sequence(entry.get("values"))
            pinned = entry.get("key") == "metadata.name" and entry.get("operator") == "In"
            if pinned and len(values) == 1 and isinstance(values[0], str):
                return values[0]
    return None


def pod_occupies_node(pod: Obj) -> bool:
    """A pod counts against its node's resources until it reaches a terminal phase."""
    return pod_node(pod) is not None and not pod_is_terminal(pod)


def owned_by(obj: Obj, owner_uid: str) -> bool:
    return any(
        mapping(ref).get("uid") == owner_uid for ref in sequence(meta(obj).get("ownerReferences"))
    )


def controller_uid(obj: Obj) -> str | None:
    for ref in sequence(meta(obj).get("ownerReferences")):
        entry = mapping(ref)
        if entry.get("controller") is True:
            uid = entry.get("uid")
            return str(uid) if uid else None
    return None


# The pod conditions the controller reads: readiness, its own deletion mark and wait cause
# (written only when it changes), and the syncer's NodeNotRegistered (the absence grace).
_READ_CONDITIONS = frozenset(
    {"Ready", SLURM_DELETE_CONDITION, POD_WAIT_CONDITION, slurm_state_condition("Unknown")}
)


def nodeset_pod_fields(pod: dict[str, Any]) -> dict[str, Any]:
    """A NodeSet pod as the controller keeps it: all of metadata (labels, annotations, owner,
    deletion) but kubectl's last-applied copy; the spec but its volumes and, of each
    container, all but name, resources and restartPolicy (feasibility reads the node
    filters and requests); of status the phase and the conditions it reads. What the pods of
    one NodeSet hold alike (labels, owner, containers, tolerations) is held once."""
    kept = kept_pod(pod, status_fields=("phase",), conditions=_READ_CONDITIONS)
    return share_parts(kept, POD_TEMPLATE_PARTS)


@dataclass(frozen=True, slots=True)
class OtherPod:
    """A pod of no NodeSet as the controller keeps it (`keep_in_view`): only what it reads of
    such a pod. Its name (a NodeSet pod may not take it), the node it occupies and what it
    requests there (feasibility: what is left of the node), its resourceVersion."""

    namespace: str
    name: str
    resource_version: str
    # pod_node: where it runs, or the node it is pinned to before it is bound.
    node: str | None
    terminal: bool
    # pod_requests; pods requesting the same share one copy, which nothing may change.
    requests: ResourceList

    @property
    def occupies_node(self) -> bool:
        """As `pod_occupies_node`: it counts against its node until it is terminal."""
        return self.node is not None and not self.terminal


# One copy of each distinct request set: a cluster's workloads repeat a few shapes.
_SHARED_REQUESTS: SharedCopies[ResourceList] = SharedCopies(key=items_key)


def keep_in_view(pod: dict[str, Any]) -> dict[str, Any] | OtherPod:
    """What the controller keeps of a pod in its view (its KVView projection): a NodeSet pod
    (labelled with its NodeSet) as `nodeset_pod_fields`, any other as an `OtherPod` record.
    At 50,000 pods the other pods' whole objects were most of the controller's memory, and
    as projected dicts 1.6 KB each."""
    metadata = meta(pod)
    if NODESET_LABEL in mapping(metadata.get("labels")):
        return nodeset_pod_fields(pod)
    return OtherPod(
        namespace=sys.intern(str(metadata.get("namespace") or "")),
        name=str(metadata.get("name") or ""),
        resource_version=str(metadata.get("resourceVersion") or ""),
        node=None if (node := pod_node(pod)) is None else sys.intern(node),
        terminal=pod_is_terminal(pod),
        requests=_SHARED_REQUESTS.of(pod_requests(mapping(pod.get("spec")))),
    )


def keep_node_in_view(node: dict[str, Any]) -> dict[str, Any]:
    """What the controller keeps of a node (its KVView projection): metadata and spec whole
    (labels, annotations, taints, unschedulable), of status what feasibility and naming read
    (addresses, allocatable, capacity), not its conditions (a node's readiness reaches
    feasibility as the node lifecycle controller's taints), images or system info. What the
    nodes of one pool hold alike (allocatable, capacity, taints) is held once."""
    return share_parts(kept_node(node, ("addresses", "allocatable", "capacity")), NODE_POOL_PARTS)
