"""The simulated default scheduler: binds unbound default-scheduler pods to feasible nodes."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
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
)
from clustersim.kube.errors import Conflict, NotFound
from clustersim.kube.objects import now_rfc3339
from clustersim.kube.store import Store
from nodeflow_kube.quantity import ResourceList, add_resources, subtract_resources

log = structlog.get_logger("clustersim.scheduler")

SCHEDULE_ALL = "all"


def _pod_queue_key(pod: Obj) -> str:
    meta = pod["metadata"]
    return f"{meta.get('namespace', 'default')}/{meta['name']}"


def _queue_order(pod: Obj) -> tuple[int, str, str, str]:
    """Higher priority first, then oldest first (kube-scheduler's PrioritySort)."""
    meta = pod["metadata"]
    priority = int(pod.get("spec", {}).get("priority") or 0)
    return (-priority, str(meta.get("creationTimestamp", "")), meta["namespace"], meta["name"])


class InputCache:
    """`compute(obj)` by key, kept while the part of the object it reads (`read(obj)`) is the
    same: identical, or equal. A node's claim or a pod's status changes every few writes and
    leaves what a quantity parse reads alone; comparing that part costs far less than parsing
    its quantities again."""

    def __init__(
        self,
        compute: Callable[[Mapping[str, Any]], ResourceList],
        read: Callable[[Mapping[str, Any]], Any],
    ) -> None:
        self._compute = compute
        self._read = read
        self._entries: dict[str, tuple[Any, ResourceList]] = {}

    def get(self, key: str, obj: Mapping[str, Any]) -> ResourceList:
        part = self._read(obj)
        cached = self._entries.get(key)
        if cached is None or not (cached[0] is part or cached[0] == part):
            cached = (part, self._compute(obj))
            self._entries[key] = cached
        return cached[1]

    def forget(self, key: str) -> None:
        self._entries.pop(key, None)


def _allocatable_input(node: Mapping[str, Any]) -> Any:
    status = node.get("status") or {}
    return status.get("allocatable"), status.get("capacity")


class DefaultScheduler(Controller[str]):
    """Binds pending default-scheduler pods, one queue key per pod.

    What each node has requested is kept up to date from the store's events (one pod's change
    costs one update), and a pod pinned by required affinity to named nodes is checked against
    those nodes only, as kube-scheduler's NodeAffinity PreFilter does: a NodeSet pod costs O(1)
    however large the cluster. Only a pod that fits none of its candidates, or names none, looks
    at every node. A change that may make room (a node changed, a pod left its node) retries
    every pending pod.
    """

    name = "default-scheduler"
    watched = ("pods", "nodes")

    def __init__(self, store: Store) -> None:
        super().__init__(store)
        # Quantities are parsed once per node or pod version, not once per pod scheduled.
        self._allocatable = InputCache(node_allocatable, _allocatable_input)
        self._requests = InputCache(pod_requests, lambda pod: pod.get("spec"))
        # Pod uid -> (node, requests) of every pod that occupies a node, and the sums by node.
        self._occupying: dict[str, tuple[str, ResourceList]] = {}
        self._used: dict[str, ResourceList] = {}
        # Queue keys (namespace/name) of the pods waiting for a node.
        self._pending: dict[str, None] = {}

    def keys_for(self, resource: str, event: str, obj: Obj, old: Obj | None) -> Iterable[str]:
        if resource == "nodes":
            if event == "DELETED":
                self._allocatable.forget(obj["metadata"]["name"])
            return (SCHEDULE_ALL,) if self._pending else ()
        freed = self._track(obj, event)
        key = _pod_queue_key(obj)
        if event != "DELETED" and needs_scheduling(obj):
            self._pending[key] = None
            return (SCHEDULE_ALL, key) if freed else (key,)
        self._pending.pop(key, None)
        return (SCHEDULE_ALL,) if freed and self._pending else ()

    def initial_keys(self) -> Iterable[str]:
        self._occupying.clear()
        self._used.clear()
        self._pending.clear()
        for pod in self.store.list("pods").items:
            self._track(pod, "ADDED")
            if needs_scheduling(pod):
                self._pending[_pod_queue_key(pod)] = None
        return (SCHEDULE_ALL,)

    def _track(self, pod: Obj, event: str) -> bool:
        """Keep the per-node sums current; True when the change frees room on a node."""
        uid = pod["metadata"]["uid"]
        occupies = event != "DELETED" and pod_occupies_node(pod)
        requests = self._requests.get(uid, pod) if occupies else None
        before = self._occupying.get(uid)
        if before is not None and occupies and before == (pod["spec"]["nodeName"], requests):
            return False  # same node, same requests: the sums stand
        self._occupying.pop(uid, None)
        if before is not None:
            node, charged = before
            self._used[node] = subtract_resources(self._used.get(node, {}), charged)
        if requests is not None:
            node = pod["spec"]["nodeName"]
            self._occupying[uid] = (node, requests)
            self._used[node] = add_resources(self._used.get(node, {}), requests)
            return before is not None and before[0] != node
        self._requests.forget(uid)
        return before is not None

    def reconcile(self, key: str) -> float | None:
        if key == SCHEDULE_ALL:
            waiting = []
            for pending in list(self._pending):
                pod = self._peek_pod(pending)
                if pod is None or not needs_scheduling(pod):
                    self._pending.pop(pending, None)
                else:
                    waiting.append(pod)
            for pod in sorted(waiting, key=_queue_order):
                self._schedule_one(pod)
            return None
        pod = self._peek_pod(key)
        if pod is None or not needs_scheduling(pod):
            self._pending.pop(key, None)
            return None
        self._schedule_one(pod)
        return None

    def _peek_pod(self, key: str) -> Obj | None:
        namespace, _, name = key.partition("/")
        try:
            return self.store.peek("pods", name, namespace)
        except NotFound:
            return None

    def _allocatable_of(self, nodes: Iterable[Obj]) -> dict[str, ResourceList]:
        return {
            n["metadata"]["name"]: self._allocatable.get(n["metadata"]["name"], n) for n in nodes
        }

    def _candidates(self, pod: Obj) -> list[Obj] | None:
        named = named_nodes(pod)
        if named is None:
            return None
        found = []
        for name in sorted(named):
            try:
                found.append(self.store.peek("nodes", name))
            except NotFound:
                continue
        return found

    def _schedule_one(self, pod: Obj) -> None:
        meta = pod["metadata"]
        candidates = self._candidates(pod)
        node_name: str | None = None
        message = ""
        if candidates:
            node_name, message = choose_node(
                pod, candidates, self._used, self._allocatable_of(candidates)
            )
        if node_name is None:
            # Unpinned, or no candidate fits: every node, whose reasons the FitError names.
            nodes = self.store.list("nodes").items
            node_name, message = choose_node(pod, nodes, self._used, self._allocatable_of(nodes))
        try:
            if node_name is not None:
                # The bind's own store event updates the per-node sums.
                self.store.bind(meta["name"], meta["namespace"], node_name)
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
