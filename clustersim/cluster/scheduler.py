"""The simulated default scheduler: binds unbound default-scheduler pods to feasible nodes."""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping
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
from clustersim.kube.store import Store, now_rfc3339
from nodeflow_kube.quantity import ResourceList, add_resources

log = structlog.get_logger("clustersim.scheduler")

SCHEDULE_ALL = "all"


def _queue_order(pod: Obj) -> tuple[int, str, str, str]:
    """Higher priority first, then oldest first (kube-scheduler's PrioritySort)."""
    meta = pod["metadata"]
    priority = int(pod.get("spec", {}).get("priority") or 0)
    return (-priority, str(meta.get("creationTimestamp", "")), meta["namespace"], meta["name"])


class IdentityCache:
    """`compute(obj)` by key, kept while the key maps to the very same object: the store
    hands out one shared object per version, so identity proves the result still holds."""

    def __init__(self, compute: Callable[[Mapping[str, Any]], ResourceList]) -> None:
        self._compute = compute
        self._entries: dict[str, tuple[Mapping[str, Any], ResourceList]] = {}

    def get(self, key: str, obj: Mapping[str, Any]) -> ResourceList:
        cached = self._entries.get(key)
        if cached is None or cached[0] is not obj:
            cached = (obj, self._compute(obj))
            self._entries[key] = cached
        return cached[1]

    def keep_only(self, keys: Collection[str]) -> None:
        for key in [key for key in self._entries if key not in keys]:
            del self._entries[key]

    def __len__(self) -> int:
        return len(self._entries)


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

    def __init__(self, store: Store) -> None:
        super().__init__(store)
        # Quantities are parsed once per node or pod version, not once per scheduling pass (a
        # pass over 4,000 nodes otherwise costs ~0.3 s of Fraction maths).
        self._allocatable = IdentityCache(node_allocatable)
        self._requests = IdentityCache(pod_requests)

    def _node_allocatable(self, node: Obj) -> ResourceList:
        return self._allocatable.get(node["metadata"]["name"], node)

    def _pod_requests(self, pod: Mapping[str, Any]) -> ResourceList:
        return self._requests.get(pod["metadata"]["uid"], pod)

    def reconcile(self, key: str) -> float | None:
        pods = self.store.list("pods").items
        pending = sorted((p for p in pods if needs_scheduling(p)), key=_queue_order)
        if not pending:
            self._forget_absent(pods, None)
            return None
        nodes = self.store.list("nodes").items
        used = requested_by_node(pods, self._pod_requests)
        allocatable = {n["metadata"]["name"]: self._node_allocatable(n) for n in nodes}
        by_name = {node["metadata"]["name"]: node for node in nodes}
        self._forget_absent(pods, by_name)
        for pod in pending:
            self._schedule_one(pod, nodes, by_name, used, allocatable)
        return None

    def _forget_absent(self, pods: list[Obj], nodes: dict[str, Obj] | None) -> None:
        """Bound the caches: drop entries of pods and nodes that are gone."""
        if len(self._requests) > len(pods):
            self._requests.keep_only({pod["metadata"]["uid"] for pod in pods})
        if nodes is not None and len(self._allocatable) > len(nodes):
            self._allocatable.keep_only(nodes)

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
                used[node_name] = add_resources(used.get(node_name, {}), self._pod_requests(pod))
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
