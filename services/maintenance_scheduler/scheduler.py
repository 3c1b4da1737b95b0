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

A request whose node is not in the view is never a candidate (it stays Pending, and says why).
Nor is a request whose node was replaced by another of the same name (its Node ownerReference
names another uid): the node it was made for is gone, and neither holds a slot.

"Gone" is decided on evidence, never on one view that lacks the node: the k8s_nodes view can
lack a live node (k8s-watcher's label selector turns a node whose labels stop matching into a
KV delete). A request in progress whose node is absent keeps its slot and counts as
unavailable until the node has been absent for the grace (`absent_past_grace`, from the
service's NODE_GONE_GRACE_SECONDS); a node of another uid under the name is gone at once, and
a node read without a uid is no verdict (the request keeps its slot).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Literal

from maintenance_scheduler.api import PENDING, NodeMaintenance, OperatorConfig

SkipReason = Literal["no-slot", "unavailability-budget", "node-not-found", "node-busy"]


@dataclass(frozen=True)
class NodeInfo:
    name: str
    unschedulable: bool
    ready: bool
    # Required: a node read without one ("") is no evidence of which node holds the name.
    uid: str

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
    """The node the request was made for, if the view shows it as that node."""
    node = nodes.get(request.node_name)
    return node if node is not None and request.meant_for(node.uid) is True else None


def node_gone(
    request: NodeMaintenance, nodes: Mapping[str, NodeInfo], absent_past_grace: AbstractSet[str]
) -> bool:
    """Whether there is evidence that the node the request was made for is gone: another uid
    holds its name, or the name has been absent from the view for the whole grace. One view
    that lacks the node is not evidence (a label-filtered view drops live nodes)."""
    node = nodes.get(request.node_name)
    if node is None:
        return request.node_name in absent_past_grace
    return request.meant_for(node.uid) is False


def track_absences(
    absent_since: Mapping[str, float], named: Iterable[str], in_view: Iterable[str], now: float
) -> dict[str, float]:
    """When each node name that a request names was first seen absent from the view, kept
    while it stays absent; a name seen again (or no longer named) starts over."""
    present = set(in_view)
    return {name: absent_since.get(name, now) for name in set(named) if name not in present}


def names_absent_past_grace(
    absent_since: Mapping[str, float], now: float, grace_seconds: float
) -> frozenset[str]:
    """The node names absent from the view for at least the grace."""
    return frozenset(name for name, since in absent_since.items() if now - since >= grace_seconds)


def schedule(
    nodes: Mapping[str, NodeInfo],
    requests: Iterable[NodeMaintenance],
    config: OperatorConfig,
    *,
    absent_past_grace: AbstractSet[str] = frozenset(),
) -> ScheduleResult:
    """`absent_past_grace`: the node names absent from the view long enough to count as gone
    (none by default: an absence alone then frees no slot). The reference operator's steps:
    the slots maxParallelOperations leaves (1), what maxUnavailable lets become unavailable
    (2), the candidates (3, 4), ranked (5), admitted in rank order under both budgets (6)."""
    all_requests = list(requests)
    under_maintenance = {
        r.node_name
        for r in all_requests
        if r.in_progress and not node_gone(r, nodes, absent_past_grace)
    }
    pending_requests = [
        r for r in all_requests if r.phase == PENDING and not r.deleting and not r.problems
    ]
    total = len(nodes)
    parallel_limit = config.parallel_limit(total)
    slots = _free_slots(nodes, under_maintenance, parallel_limit)
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
    candidates = _candidates(pending_requests, nodes, under_maintenance, result)
    requestors_in_progress = {r.requestor_id for r in all_requests if r.in_progress}
    pending_count = Counter(r.requestor_id for r in pending_requests)
    ordered = rank_order(candidates, requestors_in_progress, pending_count)
    _admit(ordered, nodes, result, total=total)
    return result


def _free_slots(
    nodes: Mapping[str, NodeInfo], under_maintenance: AbstractSet[str], parallel_limit: int | None
) -> int:
    """Step 1: the requests maxParallelOperations lets start now."""
    if parallel_limit is None:
        # No limit: every node in view not under maintenance. A request in progress on a node
        # absent from the view holds that node, not one of these.
        return len(nodes.keys() - under_maintenance)
    return min(max(0, parallel_limit - len(under_maintenance)), len(nodes))


def _candidates(
    pending: Sequence[NodeMaintenance],
    nodes: Mapping[str, NodeInfo],
    under_maintenance: AbstractSet[str],
    result: ScheduleResult,
) -> list[NodeMaintenance]:
    """Steps 3 and 4: the Pending requests whose node exists and is under no other
    maintenance; the others are skipped, saying why."""
    candidates: list[NodeMaintenance] = []
    for request in pending:
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
    return candidates


def _admit(
    ordered: Sequence[NodeMaintenance],
    nodes: Mapping[str, NodeInfo],
    result: ScheduleResult,
    *,
    total: int,
) -> None:
    """Step 6: in rank order, one request per node, while a slot is free and, for a node
    still available, while the unavailability budget lasts."""
    budget = result.can_become_unavailable
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
        if len(result.scheduled) >= result.slots:
            in_progress = result.under_maintenance + len(result.scheduled)
            result.skipped.append(
                Skipped(
                    request,
                    "no-slot",
                    no_slot_message(in_progress, result.parallel_limit, total),
                )
            )
            continue
        if not nodes[request.node_name].unavailable:
            if budget <= 0:
                result.skipped.append(
                    Skipped(
                        request,
                        "unavailability-budget",
                        unavailability_budget_message(
                            request.node_name,
                            result.unavailable_nodes + result.can_become_unavailable - budget,
                            result.unavailable_limit,
                        ),
                    )
                )
                continue
            budget -= 1
        result.scheduled.append(request)


def no_slot_message(in_progress: int, parallel_limit: int | None, total_nodes: int) -> str:
    """Why a request waits for maxParallelOperations: the budget named, with its use (the
    Pending condition's message and the skip decision say the same)."""
    if parallel_limit is None:
        # Unset: every node may be under maintenance at once, and every one is.
        return (
            f"waiting for a slot: {in_progress} of {total_nodes} nodes under maintenance "
            "(maxParallelOperations unset)"
        )
    return (
        f"waiting for a slot: {in_progress} of {parallel_limit} maxParallelOperations in progress"
    )


def unavailability_budget_message(
    node_name: str, unavailable_nodes: int, unavailable_limit: int | None
) -> str:
    """Why a request waits for maxUnavailable: its node would add one unavailable node."""
    return (
        f"waiting for the unavailability budget: {unavailable_nodes} of "
        f"{_limit_text(unavailable_limit)} maxUnavailable nodes unavailable, and node "
        f"{node_name} would become unavailable"
    )


def pending_messages(result: ScheduleResult) -> dict[str, str]:
    """What holds each Pending request the scheduler skipped, by uid: the budget (slot or
    unavailability) or the other request on its node. A request skipped because its node is
    not in the view is left out: reconcile_request says that itself, with its evidence."""
    return {
        skipped.request.uid: skipped.message
        for skipped in result.skipped
        if skipped.reason != "node-not-found"
    }


def _limit_text(limit: int | None) -> str:
    return "unlimited" if limit is None else str(limit)
