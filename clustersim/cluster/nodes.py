"""Node registration and the admin operations tests use to break and mend nodes.

Making a node NotReady does what the node lifecycle controller does on a real cluster: the
Ready condition goes Unknown (or False), the `node.kubernetes.io/unreachable` (or `not-ready`)
NoSchedule taint is added, and every pod on the node gets Ready=False. Taint-based eviction
(NoExecute after tolerationSeconds) is not simulated: pods stay bound until deleted.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import structlog

from clustersim.cluster.podlife import node_lost_status
from clustersim.cluster.spec import (
    ClusterSpec,
    NodeSpec,
    build_node_specs,
    node_conditions,
    node_object,
    resolved_node_count,
)
from clustersim.kube.errors import NotFound
from clustersim.kube.objects import now_rfc3339
from clustersim.kube.patch import STRATEGIC_MERGE_PATCH
from clustersim.kube.store import Store

log = structlog.get_logger("clustersim.nodes")

UNREACHABLE_TAINT = "node.kubernetes.io/unreachable"
NOT_READY_TAINT = "node.kubernetes.io/not-ready"
Obj = dict[str, Any]


class NodeAdmin:
    """Creates the spec's nodes and changes them later."""

    def __init__(self, store: Store, spec: ClusterSpec) -> None:
        self.store = store
        self.spec = spec
        self._next_index = 0

    def register_all(self) -> list[NodeSpec]:
        nodes = build_node_specs(self.spec)
        for node in nodes:
            self._create(node)
        self._next_index = len(nodes)
        return nodes

    def _create(self, node: NodeSpec) -> Obj:
        return self.store.create("nodes", node_object(node, now_rfc3339()))

    def next_node_spec(self, **changes: Any) -> NodeSpec:
        """The node the spec would have next (name, IP and topology continue the sequence)."""
        count = max(self._next_index + 1, resolved_node_count(self.spec))
        if self.spec.names and count > len(self.spec.names):
            spec = dataclasses.replace(self.spec, names=(), nodes=count)
        else:
            spec = dataclasses.replace(self.spec, nodes=count)
        node = build_node_specs(spec)[self._next_index]
        return dataclasses.replace(node, **changes) if changes else node

    def add_node(self, node: NodeSpec | None = None, **changes: Any) -> Obj:
        """Register one more node (the next in the spec's sequence unless given)."""
        spec = node or self.next_node_spec(**changes)
        created = self._create(spec)
        self._next_index += 1
        log.info("node added", node=spec.name, ip=spec.internal_ip)
        return created

    def remove_node(self, name: str) -> None:
        """Delete the Node object; the pod GC then fails and removes its pods."""
        self.store.delete("nodes", name)
        log.info("node removed", node=name)

    def set_ready(self, name: str, ready: bool, *, unknown: bool = True) -> Obj:
        """Flip the node's Ready condition (Unknown = kubelet lost, False = kubelet says so)."""
        return set_node_ready(self.store, name, ready, unknown=unknown)

    def cordon(self, name: str, unschedulable: bool = True) -> Obj:
        return self.store.patch(
            "nodes", name, {"spec": {"unschedulable": True if unschedulable else None}}
        )


def set_node_ready(store: Store, name: str, ready: bool, *, unknown: bool = True) -> Obj:
    """What the node lifecycle controller (Unknown) or the kubelet itself (False) writes."""
    node = store.get("nodes", name)
    now = now_rfc3339()
    taint_key = UNREACHABLE_TAINT if unknown else NOT_READY_TAINT
    reason = "" if unknown else "KubeletNotReady"
    status = node.setdefault("status", {})
    previous = {c["type"]: c for c in status.get("conditions") or []}
    conditions = node_conditions(ready, now, reason)
    for condition in conditions:
        old = previous.get(condition["type"])
        if old is not None and old.get("status") == condition["status"]:
            condition["lastTransitionTime"] = old.get("lastTransitionTime", now)
    # A strategic merge, as the kubelet patches its node status: conditions merge by type, so
    # those others write (a Skyhook's `skyhook.nvidia.com/<name>/NotReady`) are kept.
    updated = store.patch(
        "nodes",
        name,
        {"status": {"conditions": conditions}},
        STRATEGIC_MERGE_PATCH,
        subresource="status",
    )
    taints = [
        t
        for t in node.get("spec", {}).get("taints") or []
        if t.get("key") not in (UNREACHABLE_TAINT, NOT_READY_TAINT)
    ]
    if not ready:
        taints.append({"key": taint_key, "effect": "NoSchedule", "timeAdded": now})
    updated = store.patch("nodes", name, {"spec": {"taints": taints or None}})
    if not ready:
        _mark_pods_not_ready(store, name)
    log.info("node readiness changed", node=name, ready=ready)
    return updated


def _mark_pods_not_ready(store: Store, node_name: str) -> None:
    pods = store.list("pods", field_selector=f"spec.nodeName={node_name}").items
    for pod in list(pods):
        if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue
        meta = pod["metadata"]
        try:
            store.patch(
                "pods",
                meta["name"],
                {"status": node_lost_status(pod, now_rfc3339())},
                namespace=meta["namespace"],
                subresource="status",
            )
        except NotFound:
            continue
