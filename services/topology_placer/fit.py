"""Which nodes may take a gang's pods, and how many each (its offer slots).

Resources are counted in integer milli-units (the API server rounds every quantity up to
1m), so a slot count is one integer division per resource. A node's free resources are its
allocatable minus every pod bound to it and every pod nominated to it (a reservation another
gang holds), except the gang's own pods, which are being placed again. The filters are
nodeflow_kube's: taints and tolerations, nodeSelector and required node affinity; a cordoned
or not-Ready node takes nothing.

A GangGroup may mix pod shapes (a master and its workers): then each member is fitted with
its own request and its own filters (planner._GangFit, gather.gather_mixed), in placement
as in preemption's dry run; offer slots of one request serve the usual gang whose members
all ask alike. `largest_request` names every resource some member asks for.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from nodeflow_kube import (
    node_affinity_matches,
    node_allocatable,
    pod_requests,
    untolerated_taint,
)
from nodeflow_kube.projections import SharedCopies, items_key
from topology_placer.memo import FactsByVersion

Obj = Mapping[str, Any]
Milli = dict[str, int]


def to_milli(resources: Mapping[str, Fraction]) -> Milli:
    return {name: math.ceil(amount * 1000) for name, amount in resources.items()}


def add_milli(total: Milli, extra: Mapping[str, int], sign: int = 1) -> None:
    for name, amount in extra.items():
        total[name] = total.get(name, 0) + sign * amount


def largest_request(requests: Iterable[Mapping[str, int]]) -> Milli:
    """The component-wise maximum of several requests: a conservative representative pod."""
    largest: Milli = {}
    for request in requests:
        for name, amount in request.items():
            if amount > largest.get(name, 0):
                largest[name] = amount
    return largest


def _version_key(obj: Obj) -> tuple[str, str] | None:
    metadata = obj.get("metadata")
    if type(metadata) is not dict and not isinstance(metadata, Mapping):
        return None
    uid, version = metadata.get("uid"), metadata.get("resourceVersion")
    return (str(uid), str(version)) if uid and version else None


class _Memo:
    """Parsed quantities of one object version, keyed by (uid, resourceVersion): a version of
    an object never changes, so re-parsing it every pass would only cost time. Bounded: the
    whole memo is dropped when it grows past `limit` entries."""

    def __init__(self, limit: int = 400_000) -> None:
        self.limit = limit
        self.values: dict[tuple[str, str], Milli] = {}

    def get(self, obj: Obj, compute: Callable[[Obj], Milli]) -> Milli:
        key = _version_key(obj)
        if key is None:
            return compute(obj)
        found = self.values.get(key)
        if found is None:
            if len(self.values) >= self.limit:
                self.values.clear()
            found = self.values[key] = compute(obj)
        return found


# One dict of each distinct request: the pods of a job, and most of a cluster's, ask alike.
# (Each version's request is read once, into its pod facts: planner.pod_facts.)
_SHARED_REQUESTS: SharedCopies[Milli] = SharedCopies(key=items_key)


def pod_request_shared(pod: Obj) -> Mapping[str, int]:
    """What the pod charges a node, in milli-units: one dict shared by every pod asking the
    same, which readers must not change."""
    spec = pod.get("spec")
    request = to_milli(pod_requests(spec if isinstance(spec, Mapping) else {}))
    return _SHARED_REQUESTS.of(request)


def pod_request_milli(pod: Obj) -> Milli:
    """What the pod charges a node, in milli-units (a fresh dict the caller may change)."""
    return dict(pod_request_shared(pod))


_ALLOCATABLE_BY_CONTENT: dict[tuple[tuple[str, str], ...], Milli] = {}


_ALLOCATABLE = _Memo()


def node_allocatable_milli(node: Obj) -> Milli:
    """The node's allocatable in milli-units, parsed once per node version."""
    return dict(_ALLOCATABLE.get(node, _allocatable_by_content))


def _allocatable_by_content(node: Obj) -> Milli:
    """Nodes of one type report the same quantities: parsed once per distinct list, and the
    one parsed dict is shared by all of them (callers copy before changing it)."""
    status = node.get("status")
    raw = status.get("allocatable") if isinstance(status, Mapping) else None
    if not isinstance(raw, Mapping):
        return to_milli(node_allocatable(node))
    key = tuple(sorted((str(k), str(v)) for k, v in raw.items()))
    found = _ALLOCATABLE_BY_CONTENT.get(key)
    if found is None:
        if len(_ALLOCATABLE_BY_CONTENT) >= 10_000:
            _ALLOCATABLE_BY_CONTENT.clear()
        found = _ALLOCATABLE_BY_CONTENT[key] = to_milli(node_allocatable(node))
    return found


def node_is_ready(node: Obj) -> bool:
    """A node whose Ready condition is False or Unknown takes no new pods (fail closed); a
    node that reports no conditions at all is taken as Ready, as a fresh node is."""
    status = node.get("status")
    conditions = status.get("conditions") if isinstance(status, Mapping) else None
    if not isinstance(conditions, list):
        return True
    for condition in conditions:
        if isinstance(condition, Mapping) and condition.get("type") == "Ready":
            return condition.get("status") == "True"
    return True


def node_is_cordoned(node: Obj) -> bool:
    spec = node.get("spec")
    return bool(spec.get("unschedulable")) if isinstance(spec, Mapping) else False


def filter_reason(pod_spec: Obj, node: Obj) -> str | None:
    """Why a node cannot take a pod of this spec regardless of resources, or None."""
    if node_is_cordoned(node):
        return "cordoned"
    if not node_is_ready(node):
        return "not ready"
    # The nodeflow_kube filters answer trivially for a node without taints and a pod without
    # a node selector or affinity; skipping the calls then keeps a pass over 16k nodes fast.
    node_spec = node.get("spec")
    if isinstance(node_spec, Mapping) and node_spec.get("taints"):
        taint = untolerated_taint(pod_spec, node)
        if taint is not None:
            return f"untolerated taint {taint.get('key')}"
    if (pod_spec.get("nodeSelector") or pod_spec.get("affinity")) and not node_affinity_matches(
        pod_spec, node
    ):
        return "node affinity"
    return None


@dataclass
class NodeCapacity:
    """A node, what it offers and what is already charged to it."""

    name: str
    node: Obj
    allocatable: Milli
    used: Milli

    def free(self, resource: str) -> int:
        return self.allocatable.get(resource, 0) - self.used.get(resource, 0)

    def slots(self, request: Mapping[str, int]) -> int:
        """How many pods of `request` fit in what is free (0 when any resource is short)."""
        return slots_in(self.allocatable, self.used, request)


def slots_in(
    allocatable: Mapping[str, int], used: Mapping[str, int], request: Mapping[str, int]
) -> int:
    """How many pods of `request` fit in `allocatable` minus `used` (0 when any resource is
    short, or when the request asks for nothing)."""
    fitting: int | None = None
    for resource, amount in request.items():
        if amount <= 0:
            continue
        free = allocatable.get(resource, 0) - used.get(resource, 0)
        count = free // amount if free > 0 else 0
        fitting = count if fitting is None or count < fitting else fitting
    return 0 if fitting is None else fitting


def capacity_of(node: Obj, charged: Iterable[Mapping[str, int]]) -> NodeCapacity:
    metadata = node.get("metadata")
    name = str(metadata.get("name")) if isinstance(metadata, Mapping) else ""
    used: Milli = {}
    for request in charged:
        add_milli(used, request)
    return NodeCapacity(name=name, node=node, allocatable=node_allocatable_milli(node), used=used)


def offer_slots(
    capacities: Mapping[str, NodeCapacity], usable: Iterable[str], request: Mapping[str, int]
) -> dict[str, int]:
    """Offer slots of the usable nodes (those that pass the filters) that can take at least
    one pod of `request`."""
    slots: dict[str, int] = {}
    for name in usable:
        capacity = capacities.get(name)
        if capacity is None:
            continue
        count = capacity.slots(request)
        if count > 0:
            slots[name] = count
    return slots


@dataclass(frozen=True)
class NodeFacts:
    """What one version of a node tells the placer, read once: a node's labels, taints,
    readiness and allocatable change only with its resourceVersion."""

    name: str
    # The node object this was read from (a later object of the same version is equal).
    node: Obj = field(compare=False, repr=False)
    labels: Obj
    # Shared between nodes of one type: never changed in place.
    allocatable: Milli
    # Neither cordoned nor reporting Ready other than True.
    schedulable: bool
    tainted: bool


def _read_node_facts(node: Obj) -> NodeFacts:
    metadata = node.get("metadata")
    metadata = metadata if isinstance(metadata, Mapping) else {}
    labels = metadata.get("labels")
    spec = node.get("spec")
    return NodeFacts(
        name=str(metadata.get("name") or ""),
        node=node,
        labels=labels if isinstance(labels, Mapping) else {},
        allocatable=_allocatable_by_content(node),
        schedulable=not node_is_cordoned(node) and node_is_ready(node),
        tainted=isinstance(spec, Mapping) and bool(spec.get("taints")),
    )


# The facts of each node version (see memo.py): a pass reads only the nodes that changed.
_NODE_FACTS: FactsByVersion[NodeFacts] = FactsByVersion(_read_node_facts, limit=200_000)
node_facts = _NODE_FACTS.of
facts_of_nodes = _NODE_FACTS.of_all
