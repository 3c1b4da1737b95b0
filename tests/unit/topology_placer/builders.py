"""Raw Kubernetes objects for the topology-placer rule tests: nodes labelled with the
reference's spine/block layout, gang pods, PodGroups and the ClusterNetworkTopology."""

from __future__ import annotations

import itertools
import json
from typing import Any

from topology_placer.gang import NETWORK_TOPOLOGY_INDEX, NETWORK_TOPOLOGY_SPEC, POD_GROUP_LABEL

NS = "default"
SPINE = "network.topology.nvidia.com/spine"
BLOCK = "network.topology.nvidia.com/block"
SCHEDULER = "koord-scheduler"
# Every built pod is a new object: its own uid, as the API server would give it (the placer
# memoises parsed requests by uid and resourceVersion).
_SERIAL = itertools.count()

TOPOLOGY: dict[str, Any] = {
    "apiVersion": "scheduling.koordinator.sh/v1alpha1",
    "kind": "ClusterNetworkTopology",
    "metadata": {"name": "default"},
    "spec": {
        "networkTopologySpec": [
            {"labelKey": [SPINE], "topologyLayer": "SpineLayer"},
            {
                "labelKey": [BLOCK],
                "parentTopologyLayer": "SpineLayer",
                "topologyLayer": "BlockLayer",
            },
            {"parentTopologyLayer": "BlockLayer", "topologyLayer": "NodeTopologyLayer"},
        ]
    },
}


def node(
    name: str,
    spine: str | None,
    block: str | None,
    *,
    cpu: str = "8",
    gpus: int = 8,
    pods: int = 110,
    taints: list[dict[str, str]] | None = None,
    unschedulable: bool = False,
    ready: bool = True,
    labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    all_labels = {"kubernetes.io/hostname": name, **(labels or {})}
    if spine is not None:
        all_labels[SPINE] = spine
    if block is not None:
        all_labels[BLOCK] = block
    allocatable = {"cpu": cpu, "memory": "64Gi", "nvidia.com/gpu": str(gpus), "pods": str(pods)}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "uid": f"uid-{name}", "labels": all_labels},
        "spec": {"taints": taints or [], "unschedulable": unschedulable},
        "status": {
            "allocatable": allocatable,
            "capacity": allocatable,
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def reference_nodes(**kwargs: Any) -> list[dict[str, Any]]:
    """The reference's 8 nodes: spines s1 (b1, b2) and s2 (b3, b4), two nodes per block."""
    layout = [("s1", "b1"), ("s1", "b2"), ("s2", "b3"), ("s2", "b4")]
    nodes = []
    for block_index, (spine, block) in enumerate(layout):
        for slot in range(2):
            number = block_index * 2 + slot + 1
            nodes.append(node(f"node{number}", spine, block, **kwargs))
    return nodes


def pod(
    name: str,
    group: str | None = "gang",
    *,
    gpus: int = 8,
    cpu: str = "1",
    index: int | None = None,
    node_name: str = "",
    nominated: str = "",
    phase: str = "Pending",
    priority: int = 0,
    priority_class: str = "",
    preemption_policy: str | None = None,
    namespace: str = NS,
    scheduler: str = SCHEDULER,
    tolerations: list[dict[str, str]] | None = None,
    affinity: dict[str, Any] | None = None,
    deleting: bool = False,
    owner: str | None = None,
) -> dict[str, Any]:
    labels = {} if group is None else {POD_GROUP_LABEL: group}
    annotations = {} if index is None else {NETWORK_TOPOLOGY_INDEX: str(index)}
    metadata: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "uid": f"uid-{namespace}-{name}-{next(_SERIAL)}",
        "resourceVersion": "1",
        "labels": labels,
        "annotations": annotations,
    }
    if deleting:
        metadata["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    if owner is not None:
        metadata["ownerReferences"] = [{"kind": "Job", "name": owner, "uid": f"uid-{owner}"}]
    spec: dict[str, Any] = {
        "schedulerName": scheduler,
        "priority": priority,
        "containers": [
            {
                "name": "main",
                "image": "trainer",
                "resources": {
                    "requests": {"cpu": cpu, "nvidia.com/gpu": str(gpus)},
                    "limits": {"nvidia.com/gpu": str(gpus)},
                },
            }
        ],
    }
    if priority_class:
        spec["priorityClassName"] = priority_class
    if preemption_policy is not None:
        spec["preemptionPolicy"] = preemption_policy
    if tolerations is not None:
        spec["tolerations"] = tolerations
    if affinity is not None:
        spec["affinity"] = affinity
    if node_name:
        spec["nodeName"] = node_name
    status: dict[str, Any] = {"phase": phase}
    if nominated:
        status["nominatedNodeName"] = nominated
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec, "status": status}


def pod_group(
    name: str,
    min_member: int,
    *,
    namespace: str = NS,
    annotations: dict[str, str] | None = None,
    gather: list[dict[str, Any]] | None = None,
    timeout: int | None = None,
    status: dict[str, Any] | None = None,
) -> dict[str, Any]:
    all_annotations = dict(annotations or {})
    if gather is not None:
        all_annotations[NETWORK_TOPOLOGY_SPEC] = json.dumps({"gatherStrategy": gather})
    spec: dict[str, Any] = {"minMember": min_member}
    if timeout is not None:
        spec["scheduleTimeoutSeconds"] = timeout
    return {
        "apiVersion": "scheduling.sigs.k8s.io/v1alpha1",
        "kind": "PodGroup",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": f"uid-pg-{namespace}-{name}",
            "resourceVersion": "1",
            "annotations": all_annotations,
            "creationTimestamp": "2026-01-01T00:00:00Z",
        },
        "spec": spec,
        "status": status or {},
    }
