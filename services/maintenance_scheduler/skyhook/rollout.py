"""Rollout shaping under a DeploymentPolicy, as the Skyhook operator computes it (pure).

Nodes fall into compartments by selector; each compartment rolls out in batches whose size
its strategy sets (fixed, linear, exponential), slowing down after a failed batch and
stopping (`should_stop`) after too many consecutive failed batches early in the rollout.
The batch state lives in the Skyhook's status (compartmentStatuses[*].batchState), so a
restarted controller continues where it was.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from maintenance_scheduler.skyhook.api import (
    DEFAULT_COMPARTMENT,
    STRATEGY_SAFETY,
    Compartment,
    DeploymentPolicy,
    Strategy,
)

# Node statuses, as the anchor names them.
COMPLETE = "complete"
IN_PROGRESS = "in_progress"
ERRORING = "erroring"
WAITING = "waiting"
BLOCKED = "blocked"
UNKNOWN = "unknown"
PAUSED = "paused"
DISABLED = "disabled"
# Which nodes a new batch takes, first to last. Unlike the anchor, an erroring node is not
# picked again: it stays erroring (its failed Job kept for its logs) until a person deletes
# that Job, which is the retry; picking it would fill every batch with nodes that cannot move.
PICK_ORDER = (WAITING, UNKNOWN, BLOCKED)


@dataclass(frozen=True)
class BatchState:
    """compartmentStatuses[*].batchState; completed/failed nodes are the checkpoint of the last
    evaluated batch (the next one is judged on what changed since)."""

    current_batch: int = 1
    consecutive_failures: int = 0
    completed_nodes: int = 0
    failed_nodes: int = 0
    should_stop: bool = False
    last_batch_size: int = 0
    last_batch_failed: bool = False

    def to_status(self) -> dict[str, Any]:
        return {
            "currentBatch": self.current_batch,
            "consecutiveFailures": self.consecutive_failures,
            "completedNodes": self.completed_nodes,
            "failedNodes": self.failed_nodes,
            "shouldStop": self.should_stop,
            "lastBatchSize": self.last_batch_size,
            "lastBatchFailed": self.last_batch_failed,
        }

    @classmethod
    def from_status(cls, raw: object) -> BatchState:
        data = raw if isinstance(raw, Mapping) else {}

        def number(name: str, default: int = 0) -> int:
            value = data.get(name)
            return value if isinstance(value, int) and not isinstance(value, bool) else default

        return cls(
            current_batch=max(1, number("currentBatch", 1)),
            consecutive_failures=max(0, number("consecutiveFailures")),
            completed_nodes=max(0, number("completedNodes")),
            failed_nodes=max(0, number("failedNodes")),
            should_stop=data.get("shouldStop") is True,
            last_batch_size=max(0, number("lastBatchSize")),
            last_batch_failed=data.get("lastBatchFailed") is True,
        )


def progress_percent(state: BatchState, total: int) -> int:
    if total <= 0:
        return 0
    return (state.completed_nodes + state.failed_nodes) * 100 // total


def batch_size(strategy: Strategy, total: int, state: BatchState) -> int:
    """The next batch's size: fixed = initialBatch; linear = last + delta; exponential =
    last x growthFactor (capped at total); after a failed batch while progress is below
    safetyLimit, linear shrinks by delta and exponential divides by growthFactor (min 1).
    Clamped to the nodes not yet processed, at least 1; 0 for an empty compartment."""
    if total <= 0:
        return 0
    if strategy.kind == "fixed" or state.last_batch_size <= 0:
        size = strategy.initial_batch
    else:
        slow_down = (
            state.last_batch_failed and progress_percent(state, total) < strategy.safety_limit
        )
        if strategy.kind == "linear":
            if slow_down:
                size = max(1, state.last_batch_size - strategy.delta)
            else:
                size = state.last_batch_size + strategy.delta
        else:
            if slow_down:
                size = max(1, state.last_batch_size // strategy.growth_factor)
            else:
                size = state.last_batch_size * strategy.growth_factor
            size = min(size, total)
    remaining = total - (state.completed_nodes + state.failed_nodes)
    return max(1, min(size, remaining))


def evaluate_batch(
    strategy: Strategy | None, state: BatchState, batch: int, succeeded: int, total: int
) -> BatchState:
    """Record a finished batch: it failed when succeeded x 100 / batch < batchThreshold;
    consecutive failures reaching failureThreshold while progress is below safetyLimit set
    should_stop. Without a strategy only the counters move."""
    if strategy is None:
        return replace(state, current_batch=state.current_batch + 1, last_batch_size=batch)
    if batch <= 0:
        return state
    failed = succeeded * 100 // batch < strategy.batch_threshold
    consecutive = state.consecutive_failures + 1 if failed else 0
    should_stop = state.should_stop or (
        failed
        and strategy.failure_threshold is not None
        and progress_percent(state, total) < strategy.safety_limit
        and consecutive >= strategy.failure_threshold
    )
    return replace(
        state,
        current_batch=state.current_batch + 1,
        consecutive_failures=consecutive,
        should_stop=should_stop,
        last_batch_size=batch,
        last_batch_failed=failed,
    )


# Not frozen: thousands are made every round, and a frozen dataclass's __init__ is slow.
@dataclass(slots=True)
class RolloutNode:
    name: str
    labels: Mapping[str, str]
    created: float
    status: str
    # Picked into a batch earlier (status.nodePriority) and not complete: it continues.
    sticky: bool = False
    # Its rank in status.nodePriority (picked later ranks higher); -1 when not picked.
    picked: int = -1
    # Holds a NodeMaintenance of this object (drained or draining).
    drained: bool = False


def _strategy_rank(strategy: Strategy | None) -> int:
    return STRATEGY_SAFETY[strategy.kind] if strategy is not None else len(STRATEGY_SAFETY)


def assign_compartments(
    policy: DeploymentPolicy, nodes: Sequence[RolloutNode]
) -> dict[str, list[RolloutNode]]:
    """Compartment name -> its nodes (ordered by creation time, then name). A node matching
    several compartments goes to the safest strategy, then the smallest ceiling, then the
    first name; a node matching none goes to the default compartment."""
    if not policy.compartments:
        return {DEFAULT_COMPARTMENT: sorted(nodes, key=lambda n: (n.created, n.name))}
    matched: dict[str, list[RolloutNode]] = {c.name: [] for c in policy.compartments}
    candidates: list[list[Compartment]] = []
    # Bound once: called for every node and compartment.
    matchers = [(c, c.selector.matches) for c in policy.compartments]
    for node in nodes:
        labels = node.labels
        hits = [c for c, matches in matchers if matches(labels)]
        candidates.append(hits)
        for compartment in hits:
            matched[compartment.name].append(node)
    ceilings = {c.name: c.budget.ceiling(len(matched[c.name])) for c in policy.compartments}
    rank = {
        c.name: (_strategy_rank(c.strategy), ceilings[c.name], c.name) for c in policy.compartments
    }
    result: dict[str, list[RolloutNode]] = {c.name: [] for c in policy.compartments}
    default = result[DEFAULT_COMPARTMENT] = []
    for node, hits in zip(nodes, candidates, strict=True):
        if not hits:
            default.append(node)
        elif len(hits) == 1:
            result[hits[0].name].append(node)
        else:
            result[min(hits, key=lambda c: rank[c.name]).name].append(node)
    for members in result.values():
        members.sort(key=lambda n: (n.created, n.name))
    return result


def compartment_of(policy: DeploymentPolicy, name: str) -> Compartment:
    if name == DEFAULT_COMPARTMENT:
        return policy.default
    for compartment in policy.compartments:
        if compartment.name == name:
            return compartment
    raise KeyError(name)


@dataclass(frozen=True)
class CompartmentPlan:
    name: str
    strategy: Strategy | None
    matched: int
    ceiling: int
    in_progress: int
    completed: int
    state: BatchState
    # Nodes that may run stages this round: the batch in progress, or a new one.
    batch: tuple[str, ...]
    # The batch was evaluated this round (a decision is worth publishing).
    evaluated: bool = False
    batch_failed: bool = False

    @property
    def progress_percent(self) -> int:
        return self.completed * 100 // self.matched if self.matched else 0


def plan_compartment(
    compartment: Compartment,
    nodes: Sequence[RolloutNode],
    state: BatchState,
    *,
    may_start: bool = True,
    fresh: bool = False,
    drained_elsewhere: int = 0,
) -> CompartmentPlan:
    """Evaluate the finished batch (when no node is in progress; not when `fresh`, the batch
    state just made), then pick the nodes to work
    on: those in progress, else the sticky ones, else a new batch in PICK_ORDER -- no new one
    when the rollout stopped or `may_start` is False (paused).

    Never more nodes work at once than a batch holds, counting `drained_elsewhere`: nodes
    that hold a NodeMaintenance of this object without being in progress or erroring here
    (an ignored node whose Job still runs, one that left the selector, ...)."""
    strategy = compartment.strategy
    total = len(nodes)
    ceiling = compartment.budget.ceiling(total)
    in_progress = [n.name for n in nodes if n.status == IN_PROGRESS]
    completed = sum(1 for n in nodes if n.status == COMPLETE)
    failed = sum(1 for n in nodes if n.status == ERRORING)
    blocked = sum(1 for n in nodes if n.status == BLOCKED)
    evaluated = batch_failed = False
    if fresh:
        # No batch state yet (a new rollout, or a person cleared it to resume a stopped one):
        # what is already done is the checkpoint, not a batch to judge.
        state = replace(state, completed_nodes=completed, failed_nodes=failed)
    elif not in_progress:
        delta_completed = completed - state.completed_nodes
        delta_failed = failed - state.failed_nodes
        if delta_completed < 0 or delta_failed < 0:
            # Nodes left the compartment (or were reset): the checkpoint is void.
            state = replace(state, completed_nodes=completed, failed_nodes=failed)
        elif delta_completed or delta_failed or blocked:
            size = delta_completed + delta_failed
            state = replace(state, completed_nodes=completed, failed_nodes=failed)
            if size > 0:
                state = evaluate_batch(strategy, state, size, delta_completed, total)
                evaluated = True
                batch_failed = state.last_batch_failed
    base = CompartmentPlan(
        name=compartment.name,
        strategy=strategy,
        matched=total,
        ceiling=ceiling,
        in_progress=len(in_progress),
        completed=completed,
        state=state,
        batch=(),
        evaluated=evaluated,
        batch_failed=batch_failed,
    )
    if strategy is not None and state.should_stop:
        return base
    size = batch_size(strategy, total, state) if strategy is not None else ceiling
    slots = max(0, size - drained_elsewhere)
    if in_progress:
        # Nodes can be in progress outside the batch (an erroring node whose failed entry an
        # edit made stale while another of its stages still ran): never more of them work at
        # once than a batch holds: drained ones first (they are draining already), then the
        # most recently picked, so an erroring node holding its drain waits for the batch
        # under way instead of draining beside it.
        working = sorted(
            (n for n in nodes if n.status == IN_PROGRESS),
            key=lambda n: (not n.drained, -n.picked),
        )
        return replace(base, batch=tuple(n.name for n in working[:slots]))
    # An erroring node was counted as failed when its batch was judged: it no longer holds one.
    sticky = [n.name for n in nodes if n.sticky and n.status not in (COMPLETE, ERRORING)]
    if sticky:
        return replace(base, batch=tuple(sticky[:slots]))
    if not may_start:
        return base
    picked: list[str] = []
    for status in PICK_ORDER:
        for node in nodes:
            if len(picked) >= slots:
                break
            if node.status == status:
                picked.append(node.name)
    return replace(base, batch=tuple(picked))
