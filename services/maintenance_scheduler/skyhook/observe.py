"""Raw Kubernetes objects (as k8s-watcher mirrors them into KV) -> the facts the plan reads.

Pure. A Job's Complete/Failed condition is the truth of its stage; its pods only add what the
Job does not say: a container OOM-killed (the reason shown instead of BackoffLimitExceeded),
and an image that does not pull (which no Job condition ever reports).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from maintenance_scheduler.skyhook.api import owner_key
from maintenance_scheduler.skyhook.plan import NodeView
from maintenance_scheduler.skyhook.stages import JobFacts
from nodeflow_contracts.skyhook import SKYHOOK, SkyhookNames, is_node_condition, owner_in
from nodeflow_kube.fields import (
    condition,
    mapping,
    meta,
    parse_time,
)
from nodeflow_kube.taints import node_taints

PULL_FAILURES = frozenset({"ErrImagePull", "ImagePullBackOff", "InvalidImageName"})

Obj = Mapping[str, Any]


def _true(obj: Obj, kind: str) -> Obj | None:
    found = condition(obj, kind)
    return found if found is not None and found.get("status") == "True" else None


def _container_statuses(pod: Obj) -> list[Obj]:
    status = mapping(pod.get("status"))
    return [
        mapping(c)
        for c in [
            *(status.get("initContainerStatuses") or ()),
            *(status.get("containerStatuses") or ()),
        ]
    ]


def oom_killed(pods: Sequence[Obj]) -> bool:
    for pod in pods:
        for container in _container_statuses(pod):
            terminated = mapping(mapping(container.get("state")).get("terminated"))
            last = mapping(mapping(container.get("lastState")).get("terminated"))
            if "OOMKilled" in (terminated.get("reason"), last.get("reason")):
                return True
    return False


def pull_stuck(pods: Sequence[Obj]) -> tuple[float, str] | None:
    """(since when, image) for the oldest live pod whose container cannot pull its image."""
    found: tuple[float, str] | None = None
    for pod in pods:
        if meta(pod).get("deletionTimestamp"):
            continue
        if mapping(pod.get("status")).get("phase") not in (None, "Pending"):
            continue
        created = parse_time(meta(pod).get("creationTimestamp"))
        if created is None:
            continue
        for container in _container_statuses(pod):
            waiting = mapping(mapping(container.get("state")).get("waiting"))
            if waiting.get("reason") in PULL_FAILURES and (found is None or created < found[0]):
                found = (created, str(container.get("image") or ""))
    return found


def _names_of(job: Obj) -> SkyhookNames:
    """The kind whose labels the Job carries (a Skyhook's or a NodeWright's)."""
    owner = owner_in(mapping(meta(job).get("labels")))
    return owner[0] if owner is not None else SKYHOOK


def job_identity_of(job: Obj) -> Mapping[str, str] | None:
    """The Job's identity annotation (`<group>/identity`, jobs.IDENTITY_ANNOTATION for a
    Skyhook's); an unreadable one is an identity nothing matches."""
    raw = mapping(meta(job).get("annotations")).get(_names_of(job).identity_annotation)
    if raw is None:
        return None
    try:
        data = json.loads(str(raw))
    except ValueError:
        return {"unreadable": str(raw)}
    if not isinstance(data, Mapping):
        return {"unreadable": str(raw)}
    return {str(k): str(v) for k, v in data.items()}


def job_slot(job: Obj) -> tuple[str, str, str] | None:
    """(owner_key of its Skyhook or NodeWright, package, node), from the Job's labels."""
    labels = mapping(meta(job).get("labels"))
    names = _names_of(job)
    parts = (
        labels.get(names.name_label),
        labels.get(names.package_label),
        labels.get(names.node_label),
    )
    if not all(isinstance(p, str) and p for p in parts):
        return None
    return (owner_key(str(parts[0]), names), str(parts[1]), str(parts[2]))


def job_facts(job: Obj, pods: Sequence[Obj]) -> JobFacts:
    name = str(meta(job).get("name") or "")
    identity = job_identity_of(job)
    slot = job_slot(job)
    stage = str(mapping(meta(job).get("labels")).get(_names_of(job).stage_label) or "")
    failed = _true(job, "Failed")
    if failed is not None:
        reason = "OOMKilled" if oom_killed(pods) else str(failed.get("reason") or "Failed")
        ttl = mapping(job.get("spec")).get("ttlSecondsAfterFinished")
        return JobFacts(
            name,
            "failed",
            reason=reason,
            message=str(failed.get("message") or ""),
            ttl_seconds=ttl if isinstance(ttl, int) else None,
            identity=identity,
            slot=slot,
            stage=stage,
        )
    if _true(job, "Complete") is not None:
        return JobFacts(name, "complete", identity=identity, slot=slot, stage=stage)
    stuck = pull_stuck(pods)
    if stuck is None:
        return JobFacts(name, "running", identity=identity, slot=slot, stage=stage)
    return JobFacts(
        name,
        "running",
        pull_stuck_since=stuck[0],
        pull_image=stuck[1],
        identity=identity,
        slot=slot,
        stage=stage,
    )


def node_view(node: Obj) -> NodeView:
    metadata = meta(node)
    return NodeView(
        name=str(metadata.get("name") or ""),
        uid=str(metadata.get("uid") or ""),
        resource_version=str(metadata.get("resourceVersion") or ""),
        labels={str(k): str(v) for k, v in mapping(metadata.get("labels")).items()},
        annotations={str(k): str(v) for k, v in mapping(metadata.get("annotations")).items()},
        created=parse_time(metadata.get("creationTimestamp")) or 0.0,
        taints=tuple(dict(t) for t in node_taints(node)),
        conditions=skyhook_conditions(node),
        unschedulable=mapping(node.get("spec")).get("unschedulable") is True,
    )


def skyhook_conditions(node: Obj) -> dict[str, Obj]:
    """The node's Skyhook and NodeWright conditions by type (the kubelet's are not the
    controller's)."""
    found: dict[str, Obj] = {}
    for entry in mapping(node.get("status")).get("conditions") or ():
        kind = entry.get("type") if isinstance(entry, dict) else None
        if isinstance(kind, str) and is_node_condition(kind):
            found[kind] = dict(entry)
    return found


def maintenance_phase(request: Obj) -> str:
    """The Ready condition's reason (the request's phase); "Pending" before it has one."""
    ready = condition(request, "Ready")
    return str(ready.get("reason") or "Pending") if ready is not None else "Pending"


class NodeViews:
    """node_view of each Node, kept while its resourceVersion does not change: a round reads
    only the nodes that changed since the last one."""

    def __init__(self) -> None:
        self._views: dict[str, tuple[str, NodeView]] = {}

    def read(self, nodes: Mapping[str, Obj]) -> list[NodeView]:
        views: dict[str, tuple[str, NodeView]] = {}
        for key, node in nodes.items():
            metadata = node.get("metadata")
            if not isinstance(metadata, dict):
                metadata = meta(node)
            rv = str(metadata.get("resourceVersion") or "")
            cached = self._views.get(key)
            view = cached[1] if cached is not None and cached[0] == rv and rv else node_view(node)
            views[key] = (rv, view)
        self._views = views
        return [view for _, view in views.values()]
