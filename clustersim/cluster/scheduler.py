"""The simulated default scheduler: binds unbound default-scheduler pods to feasible nodes."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import structlog

from clustersim.cluster.loop import Controller, Obj
from clustersim.cluster.podlife import merge_conditions, scheduled_condition
from clustersim.cluster.scheduling import (
    choose_node,
    named_nodes,
    needs_scheduling,
    node_allocatable,
    pod_occupies_node,
    pod_requests,
    requested_by_node,
)
from clustersim.kube.errors import Conflict, NotFound
from clustersim.kube.store import now_rfc3339
from nodeflow_kube.quantity import ResourceList, add_resources

log = structlog.get_logger("clustersim.scheduler")

SCHEDULE_ALL = "all"


def _queue_order(pod: Obj) -> tuple[int, str, str, str]:
    """Higher priority first, then oldest first (kube-scheduler's PrioritySort)."""
    meta = pod["metadata"]
    priority = int(pod.get("spec", {}).get("priority") or 0)
    return (-priority, str(meta.get("creationTimestamp", "")), meta["namespace"], meta["name"])


class DefaultScheduler(Controller[str]):
    """Every change that can make a pending pod schedulable triggers one scheduling pass."""

    name = "default-scheduler"
    watched = ("pods", "nodes")

    def keys_for(self, resource: str, event: str, obj: Obj, old: Obj | None) -> Iterable[str]:
        if resource == "nodes":
            return (SCHEDULE_ALL,)
        frees_room = (
            old is not None
            and pod_occupies_node(old)
            and (event == "DELETED" or not pod_occupies_node(obj))
        )
        if frees_room or (event != "DELETED" and needs_scheduling(obj)):
            return (SCHEDULE_ALL,)
        return ()

    def initial_keys(self) -> Iterable[str]:
        return (SCHEDULE_ALL,)

    def reconcile(self, key: str) -> float | None:
        pods = self.store.list("pods").items
        pending = sorted((p for p in pods if needs_scheduling(p)), key=_queue_order)
        if not pending:
            return None
        nodes = self.store.list("nodes").items
        used = requested_by_node(pods)
        allocatable = {n["metadata"]["name"]: node_allocatable(n) for n in nodes}
        by_name = {node["metadata"]["name"]: node for node in nodes}
        for pod in pending:
            self._schedule_one(pod, nodes, by_name, used, allocatable)
        return None

    def _schedule_one(
        self,
        pod: Obj,
        nodes: list[Obj],
        by_name: dict[str, Obj],
        used: dict[str, Any],
        allocatable: dict[str, ResourceList],
    ) -> None:
        meta = pod["metadata"]
        named = named_nodes(pod)
        if named is not None:
            candidates = [by_name[name] for name in sorted(named) if name in by_name]
            node_name, message = choose_node(pod, candidates, used, allocatable)
            if node_name is None:
                # The FitError names every node, as the scheduler's message does.
                node_name, message = choose_node(pod, nodes, used, allocatable)
        else:
            node_name, message = choose_node(pod, nodes, used, allocatable)
        try:
            if node_name is not None:
                self.store.bind(meta["name"], meta["namespace"], node_name)
                used[node_name] = add_resources(used.get(node_name, {}), pod_requests(pod))
                log.debug("bound", pod=f"{meta['namespace']}/{meta['name']}", node=node_name)
                return
            self._mark_unschedulable(pod, message)
        except (NotFound, Conflict) as exc:
            log.debug("scheduling skipped", pod=meta["name"], error=str(exc))

    def _mark_unschedulable(self, pod: Obj, message: str) -> None:
        status = pod.get("status") or {}
        for condition in status.get("conditions") or []:
            if (
                condition.get("type") == "PodScheduled"
                and condition.get("status") == "False"
                and condition.get("message") == message
            ):
                return  # unchanged: writing again would only wake every watcher
        conditions = merge_conditions(
            status.get("conditions") or [], [scheduled_condition(now_rfc3339(), message)]
        )
        meta = pod["metadata"]
        self.store.patch(
            "pods",
            meta["name"],
            {"metadata": {"uid": meta["uid"]}, "status": {"conditions": conditions}},
            namespace=meta["namespace"],
            subresource="status",
        )
