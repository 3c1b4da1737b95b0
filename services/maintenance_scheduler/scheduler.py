"""Which Pending NodeMaintenances start now: the reference scheduler's six steps (pure).

1. slots = maxParallelOperations - nodes under maintenance (a request past Pending whose node
   exists: upstream's preSchedule counts no request whose node is gone, so a decommissioned
   node's request never holds a slot).
2. canBecomeUnavailable = maxUnavailable - nodes unavailable (cordoned, not Ready, or under
   maintenance); no limit when maxUnavailable is unset.
3. candidate nodes = nodes targeted by a Pending request and not under maintenance.
4. candidate requests = the Pending requests on those nodes.
5. rank: (requestor already has a request in progress: +1000) + (100 - that requestor's
   pending count, floor 0); then older first, then node, requestor and namespace/name.
6. take the best request of each node, up to the slots; one that would make an available
   node unavailable needs canBecomeUnavailable > 0 and spends it, one whose node is already
   unavailable spends no budget. A request skipped for the budget does not use a slot.

A request whose node does not exist is never a candidate (it stays Pending, and says why).
Nor is a request whose node was replaced by another of the same name (its Node ownerReference
names another uid): the node it was made for is gone, and neither holds a slot.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from maintenance_scheduler.api import PENDING, NodeMaintenance, OperatorConfig

SkipReason = Literal["no-slot", "unavailability-budget", "node-not-found", "node-busy"]


@dataclass(frozen=True)
class NodeInfo:
    name: str
    unschedulable: bool
    ready: bool
    uid: str = ""

    @property
    def unavailable(self) -> bool:
        return self.unschedulable or not self.ready


@dataclass(frozen=True)
class Skipped:
    request: NodeMaintenance
    reason: SkipReason
    message: str


@dataclass
class ScheduleResult:
    slots: int
    can_become_unavailable: int
    # Limits as resolved against the node count (None: no limit).
    parallel_limit: int | None
    unavailable_limit: int | None
    under_maintenance: int
    unavailable_nodes: int
    scheduled: list[NodeMaintenance] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)


def rank(request: NodeMaintenance, requestors_in_progress: set[str], pending: Counter[str]) -> int:
    in_progress_bonus = 1000 if request.requestor_id in requestors_in_progress else 0
    return in_progress_bonus + max(0, 100 - pending[request.requestor_id])


def rank_order(
    requests: Iterable[NodeMaintenance], requestors_in_progress: set[str], pending: Counter[str]
) -> list[NodeMaintenance]:
    """Step 5: best first."""
    return sorted(
        requests,
        key=lambda r: (
            -rank(r, requestors_in_progress, pending),
            r.created_at,
            r.node_name,
            r.requestor_id,
            r.key,
        ),
    )


def node_of(request: NodeMaintenance, nodes: Mapping[str, NodeInfo]) -> NodeInfo | None:
    """The node the request was made for, if it still exists."""
    node = nodes.get(request.node_name)
    return node if node is not None and request.meant_for(node.uid) else None


def schedule(
    nodes: Mapping[str, NodeInfo],
    requests: Iterable[NodeMaintenance],
    config: OperatorConfig,
) -> ScheduleResult:
    all_requests = list(requests)
    under_maintenance = {
        r.node_name for r in all_requests if r.in_progress and node_of(r, nodes) is not None
    }
    pending_requests = [
        r for r in all_requests if r.phase == PENDING and not r.deleting and not r.problems
    ]
    total = len(nodes)

    # Step 1.
    parallel_limit = config.parallel_limit(total)
    if parallel_limit is None:
        slots = max(0, total - len(under_maintenance))
    else:
        slots = min(max(0, parallel_limit - len(under_maintenance)), total)

    # Step 2.
    unavailable = {name for name, node in nodes.items() if node.unavailable} | under_maintenance
    unavailable_limit = config.unavailable_limit(total)
    if unavailable_limit is None:
        can_become_unavailable = slots
    else:
        can_become_unavailable = max(0, unavailable_limit - len(unavailable))

    result = ScheduleResult(
        slots=slots,
        can_become_unavailable=can_become_unavailable,
        parallel_limit=parallel_limit,
        unavailable_limit=unavailable_limit,
        under_maintenance=len(under_maintenance),
        unavailable_nodes=len(unavailable),
    )

    # Steps 3 and 4.
    candidates: list[NodeMaintenance] = []
    for request in pending_requests:
        if node_of(request, nodes) is None:
            result.skipped.append(
                Skipped(request, "node-not-found", f"node {request.node_name} does not exist")
            )
        elif request.node_name in under_maintenance:
            result.skipped.append(
                Skipped(
                    request,
                    "node-busy",
                    f"node {request.node_name} is under another maintenance; one at a time",
                )
            )
        else:
            candidates.append(request)

    # Step 5.
    requestors_in_progress = {r.requestor_id for r in all_requests if r.in_progress}
    pending_count = Counter(r.requestor_id for r in pending_requests)
    ordered = rank_order(candidates, requestors_in_progress, pending_count)

    # Step 6.
    budget = can_become_unavailable
    seen_nodes: set[str] = set()
    for request in ordered:
        if request.node_name in seen_nodes:
            result.skipped.append(
                Skipped(
                    request,
                    "node-busy",
                    f"a higher-ranked request on node {request.node_name} goes first",
                )
            )
            continue
        seen_nodes.add(request.node_name)
        if len(result.scheduled) >= slots:
            result.skipped.append(
                Skipped(
                    request,
                    "no-slot",
                    f"no slot: {result.under_maintenance + len(result.scheduled)} of "
                    f"{_limit_text(parallel_limit)} parallel operations in use",
                )
            )
            continue
        node_unavailable = nodes[request.node_name].unavailable
        if not node_unavailable:
            if budget <= 0:
                result.skipped.append(
                    Skipped(
                        request,
                        "unavailability-budget",
                        f"node {request.node_name} would become unavailable: "
                        f"{len(unavailable) + can_become_unavailable - budget} nodes "
                        f"unavailable, maxUnavailable {_limit_text(unavailable_limit)}",
                    )
                )
                continue
            budget -= 1
        result.scheduled.append(request)
    return result


def _limit_text(limit: int | None) -> str:
    return "unlimited" if limit is None else str(limit)
