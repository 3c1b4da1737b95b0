"""Parts of a pod that services keep in their KV views (their projections) when they hold
every pod of a large cluster: the bulk of a pod is what no control-plane decision reads (its
containers' command, env, probes and mounts, its volumes, kubelet's statuses, kubectl's
last-applied copy), and at 50,000 pods keeping it would be most of a service's memory.

Each service says which conditions and spec fields it reads; these helpers cut the rest the
same way everywhere.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Hashable, Mapping
from typing import Any, Generic, TypeVar

import msgspec

from nodeflow_kube.fields import Obj, mapping, sequence

LAST_APPLIED_ANNOTATION = "kubectl.kubernetes.io/last-applied-configuration"
# What a scheduling or resource decision reads of a container: its requests and limits, and
# restartPolicy (an init container with restartPolicy Always is a sidecar, charged like one).
CONTAINER_FIELDS = ("name", "resources", "restartPolicy")
# Never read by any decision, and large.
UNREAD_SPEC_FIELDS = frozenset({"volumes", "ephemeralContainers"})


def kept_metadata(metadata: Obj) -> dict[str, Any]:
    """All of metadata but kubectl's last-applied copy of the object (often its largest part)."""
    kept = dict(metadata)
    annotations = mapping(kept.get("annotations"))
    if LAST_APPLIED_ANNOTATION in annotations:
        kept["annotations"] = {
            key: value for key, value in annotations.items() if key != LAST_APPLIED_ANNOTATION
        }
    return kept


def kept_pod_spec(pod_spec: Obj, *, dropped: Collection[str] = ()) -> dict[str, Any]:
    """The pod spec but its volumes, the `dropped` fields, and of each container (init ones
    too) anything but its name, resources and restartPolicy."""
    kept = {
        key: value
        for key, value in pod_spec.items()
        if key not in UNREAD_SPEC_FIELDS
        and key not in dropped
        and key not in ("containers", "initContainers")
    }
    for key in ("containers", "initContainers"):
        containers = pod_spec.get(key)
        if isinstance(containers, list):
            kept[key] = [
                {field: entry[field] for field in CONTAINER_FIELDS if field in entry}
                for entry in map(mapping, containers)
            ]
    return kept


def kept_conditions(pod_status: Obj, read: Collection[str]) -> list[Any]:
    """The status conditions whose type is in `read`, the only ones its reader looks at."""
    return [
        entry
        for entry in sequence(pod_status.get("conditions"))
        if mapping(entry).get("type") in read
    ]


def kept_pod(
    pod: Obj,
    *,
    status_fields: Collection[str],
    conditions: Collection[str],
    dropped_spec: Collection[str] = (),
) -> dict[str, Any]:
    """A pod as a view keeps it: `kept_metadata`, `kept_pod_spec` (without `dropped_spec`),
    of status the `status_fields` and the `conditions` of those types, and its apiVersion
    and kind."""
    pod_status = mapping(pod.get("status"))
    kept_status = {key: pod_status[key] for key in status_fields if key in pod_status}
    if "conditions" in pod_status:
        kept_status["conditions"] = kept_conditions(pod_status, conditions)
    kept: dict[str, Any] = {
        "metadata": kept_metadata(mapping(pod.get("metadata"))),
        "spec": kept_pod_spec(mapping(pod.get("spec")), dropped=dropped_spec),
        "status": kept_status,
    }
    for key in ("apiVersion", "kind"):
        if key in pod:
            kept[key] = pod[key]
    return kept


def kept_node(node: Obj, status_fields: Collection[str]) -> dict[str, Any]:
    """A node as a view keeps it: metadata and spec whole (labels, annotations, taints,
    unschedulable), of status only `status_fields` (not its images list or system info)."""
    node_status = mapping(node.get("status"))
    kept = {key: value for key, value in node.items() if key != "status"}
    kept["status"] = {key: node_status[key] for key in status_fields if key in node_status}
    return kept


T = TypeVar("T")


def items_key(mapping: Mapping[Any, Any]) -> Hashable:
    """A mapping's content as a hashable key (its values must be hashable)."""
    return tuple(sorted(mapping.items()))


def json_key(value: Any) -> Hashable:
    """A decoded JSON value's content as a hashable key: its encoding. Equal values written in
    another key order get another key (they are then kept twice, never confused); the objects
    of one template list their fields alike."""
    return msgspec.json.encode(value)


class SharedCopies(Generic[T]):
    """One copy of each distinct value: what thousands of kept objects repeat (the same
    requests, the same set of resource names) is held once instead of once per object.
    Values are told apart by `key` (the value itself, if hashable, when not given). A shared
    copy is read by everyone holding it: nothing may change it. Bounded: past `limit`
    distinct values the table starts over (copies handed out stay valid)."""

    def __init__(self, key: Callable[[T], Hashable] | None = None, limit: int = 65_536) -> None:
        self._key = key
        self._limit = limit
        self._copies: dict[Hashable, T] = {}

    def of(self, value: T) -> T:
        """The shared copy equal to `value`; `value` itself becomes it when there is none."""
        content = value if self._key is None else self._key(value)
        found = self._copies.get(content)
        if found is None:
            if len(self._copies) >= self._limit:
                self._copies.clear()
            found = self._copies[content] = value
        return found


# What the pods of one template hold alike: their labels and owner (one job or NodeSet),
# their containers and node filters. Not what is each pod's own and would only churn the
# table: annotations (a created pod carries its create command's key), the affinity (a
# NodeSet pod's pins its node).
POD_TEMPLATE_PARTS: tuple[tuple[str, ...], ...] = (
    ("metadata", "labels"),
    ("metadata", "ownerReferences"),
    ("metadata", "finalizers"),
    ("spec", "containers"),
    ("spec", "initContainers"),
    ("spec", "overhead"),
    ("spec", "resources"),
    ("spec", "tolerations"),
    ("spec", "nodeSelector"),
)
# What the nodes of one pool hold alike.
NODE_POOL_PARTS: tuple[tuple[str, ...], ...] = (
    ("spec", "taints"),
    ("status", "allocatable"),
    ("status", "capacity"),
    ("status", "conditions"),
)

# The process's one table of shared parts (see share_parts). Bounded low: parts unique to
# one object (a pod's own labels) pass through it without keeping it large.
_SHARED_PARTS: SharedCopies[Any] = SharedCopies(key=json_key, limit=8192)


def share_parts(
    obj: dict[str, Any],
    paths: Collection[tuple[str, ...]],
    shared: SharedCopies[Any] = _SHARED_PARTS,
) -> dict[str, Any]:
    """`obj` (a kept object its caller owns) with the value at each path (keys from the top;
    an absent one is skipped) replaced by its copy in `shared`: what the objects of one
    template hold alike (a pod's labels, owner and containers, a node's allocatable) is then
    held once. Nothing may change a shared part afterwards."""
    for path in paths:
        parent: Any = obj
        for key in path[:-1]:
            parent = parent.get(key)
            if type(parent) is not dict:
                break
        else:
            value = parent.get(path[-1])
            if type(value) is dict or type(value) is list:
                parent[path[-1]] = shared.of(value)
    return obj
