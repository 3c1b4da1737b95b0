"""Applies a plan's pod actions to raw objects, as k8s-watcher and the API server would, so a
test can run several passes of the placer over one evolving cluster."""

from __future__ import annotations

import copy
from typing import Any

from topology_placer.planner import Bind, ClusterState, Disrupt, Nominate, Plan, plan

SCHEDULERS = frozenset({"koord-scheduler", "nodeflow-placer"})


def state(
    nodes: list[dict[str, Any]],
    pods: list[dict[str, Any]],
    groups: list[dict[str, Any]] | None = None,
    *,
    topology: dict[str, Any] | None = None,
    budgets: list[dict[str, Any]] | None = None,
    claims: list[dict[str, Any]] | None = None,
    volumes: list[dict[str, Any]] | None = None,
    storage_classes: list[dict[str, Any]] | None = None,
    workload_groups: list[dict[str, Any]] | None = None,
    now: float = 1_767_225_600.0 + 60,
) -> ClusterState:
    return ClusterState(
        nodes=nodes,
        pods=pods,
        pod_groups=groups or [],
        topologies=[topology] if topology else [],
        budgets=budgets or [],
        claims=claims or [],
        volumes=volumes or [],
        storage_classes=storage_classes or [],
        workload_pod_groups=workload_groups or [],
        now=now,
        scheduler_names=SCHEDULERS,
    )


def apply(pods: list[dict[str, Any]], result: Plan) -> list[dict[str, Any]]:
    """The pods after the plan's nominations, bindings and evictions (evicted pods go)."""
    by_name = {(p["metadata"]["namespace"], p["metadata"]["name"]): copy.deepcopy(p) for p in pods}
    for action in result.actions:
        if isinstance(action, Nominate | Bind | Disrupt):
            key = (action.pod.namespace, action.pod.name)
            if key not in by_name:
                continue
            pod = by_name[key]
            # Every write gets a new resourceVersion, as from the API server (the placer
            # memoises what it reads of a pod by uid and resourceVersion).
            version = int(pod["metadata"].get("resourceVersion") or 0)
            pod["metadata"]["resourceVersion"] = str(version + 1)
            if isinstance(action, Nominate):
                pod["status"]["nominatedNodeName"] = action.node
            elif isinstance(action, Bind):
                pod["spec"]["nodeName"] = action.node
            else:
                del by_name[key]
    return list(by_name.values())


def run(
    nodes: list[dict[str, Any]],
    pods: list[dict[str, Any]],
    groups: list[dict[str, Any]] | None = None,
    **kwargs: Any,
) -> tuple[Plan, list[dict[str, Any]]]:
    result = plan(state(nodes, pods, groups, **kwargs))
    return result, apply(pods, result)
