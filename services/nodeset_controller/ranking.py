"""Rule 6 (scale-down order) and rule 7 (rolling update selection under maxUnavailable).

Both are total, deterministic orders: ties fall back to newer-first and then the pod name,
which is unique, so the same cluster state always gives the same choice (a restarted or
a second replica decides exactly as the first did).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass

from nodeset_controller.podstate import PodState

RANK_TEXT = {
    1: "not ready",
    2: "idle, drained, delete condition set",
    3: "idle, drained, no delete condition",
    4: "idle, not drained",
    5: "running jobs, drained, delete condition set",
    6: "running jobs, drained, no delete condition",
    7: "running jobs, not drained",
}


def scale_down_rank(pod: PodState) -> int:
    """The reference's seven tiers; lower is deleted first. A pod whose Slurm state is not
    known is treated as running jobs and not drained (rank 7 when ready): fail closed."""
    if not pod.ready:
        return 1
    has_condition = pod.delete_reason is not None
    if not pod.busy:
        if pod.drain:
            return 2 if has_condition else 3
        return 4
    if pod.drain:
        return 5 if has_condition else 6
    return 7


def rank_reason(pod: PodState) -> str:
    rank = scale_down_rank(pod)
    return f"rank {rank}: {RANK_TEXT[rank]}"


def deletion_hints(pod: PodState) -> tuple[int, float]:
    """Within a rank: the lower deletion cost first, then the earlier deadline (none counts
    as the earliest, as in Slinky). Hints never move a pod across ranks: a busy pod with a
    low cost still goes after every idle one."""
    return (pod.deletion_cost, -math.inf if pod.deadline is None else pod.deadline)


def scale_down_order(pods: Iterable[PodState], *, priority_ordering: bool) -> list[PodState]:
    """Pods in the order they are removed. With priority ordering: by rank, then the pods'
    deletion hints, then newer first, then name. Without: newer first, then name."""
    if priority_ordering:
        return sorted(
            pods, key=lambda p: (scale_down_rank(p), *deletion_hints(p), -p.created_at, p.name)
        )
    return sorted(pods, key=lambda p: (-p.created_at, p.name))


def scale_down_reason(pod: PodState, *, priority_ordering: bool) -> str:
    if priority_ordering:
        return rank_reason(pod)
    return "newest pod first (priority ordering off)"


def rolling_tier(pod: PodState) -> int:
    """Rolling update order: 0 non-ready, 1 idle (no Slurm work), 2 the rest."""
    if not pod.ready:
        return 0
    if not pod.busy:
        return 1
    return 2


ROLLING_TEXT = {0: "outdated and not ready", 1: "outdated and idle", 2: "outdated"}


@dataclass(frozen=True)
class RollingChoice:
    replace: tuple[PodState, ...]
    unavailable: int
    budget: int


def count_unavailable(pods: Iterable[PodState], missing: int) -> int:
    """Unavailable pods: not available (not Ready, or Ready for less than minReadySeconds),
    pending deletion (SlurmDelete or terminating), plus the pods that should exist but do
    not (e.g. a replaced pod not yet recreated)."""
    return sum(1 for pod in pods if pod.unavailable) + max(0, missing)


def choose_rolling_replacements(
    pods: Sequence[PodState],
    revision: str,
    max_unavailable: int,
    missing: int,
    unfit: Collection[str] = (),
) -> RollingChoice:
    """Outdated pods to schedule for deletion now, never letting the unavailable count go
    over `max_unavailable`. A pod that is already unavailable costs nothing to replace (it
    is counted already); an available one takes one unit of what is left. Pods named in
    `unfit` (their node cannot take the replacement) are not replaced."""
    unavailable = count_unavailable(pods, missing)
    left = max_unavailable - unavailable
    candidates = sorted(
        (
            p
            for p in pods
            if p.revision != revision and not p.pending_deletion and p.name not in unfit
        ),
        key=lambda p: (rolling_tier(p), p.name),
    )
    chosen: list[PodState] = []
    for pod in candidates:
        if pod.unavailable:
            chosen.append(pod)
        elif left > 0:
            chosen.append(pod)
            left -= 1
    return RollingChoice(tuple(chosen), unavailable, max_unavailable)
