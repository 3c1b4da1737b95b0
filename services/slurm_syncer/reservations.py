"""The Slurm reservations of NodeSets with `updateStrategy.type: ScheduledUpdate`.

slurm-syncer is the only service that talks to slurmrestd, so it holds each NodeSet's update
window in Slurm: the contract is nodeflow_contracts.nodeset (window, reservation name, flags).
Decided on every poll of a cluster, from the NodeSets, the last node listing and the
reservations Slurm lists (state in Slurm and Kubernetes only: a restarted syncer finds its
reservations by name):
  - a NodeSet of the cluster whose window has not ended gets its reservation, MAINT and
    IGNORE_JOBS plus its `flags`, over its registered Slurm nodes (the pod names it gives),
    once it has any; created ahead of the window, so that slurmctld starts no job there that
    would run into it;
  - a reservation of ours (RESERVATION_PREFIX) that no NodeSet of the cluster wants any
    longer (its window is over, the strategy or startTime changed, the NodeSet is gone) is
    deleted; any other reservation is never touched;
  - on a slurmrestd that cannot write reservations (before v0.0.43) nothing is sent: the
    NodeSet reports it (nodeset-controller reads `SlurmClusterStatus.api_version`), and no
    pod is replaced by the schedule.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from nodeflow_contracts.nodeset import RESERVATION_PREFIX, UpdateWindow, update_window
from nodeflow_contracts.slurm_api import RESERVATIONS_SINCE, SlurmApiVersion
from slurm_syncer.prune import nodeset_names

SCHEDULED_UPDATE = "ScheduledUpdate"


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


@dataclass(frozen=True)
class ScheduledNodeSet:
    """A NodeSet of one cluster that asks for a scheduled update, and its window (or what is
    wrong with it)."""

    key: str  # <namespace>/<name>
    window: UpdateWindow | None
    problem: str
    nodes: tuple[str, ...]  # its registered Slurm nodes


@dataclass(frozen=True)
class NewReservation:
    """A reservation to create: the window's, from `start` for `minutes`. Inside the window
    it starts now, for what is left of it (slurmctld refuses a start more than ten minutes
    past, MAX_RESV_DELAY), under the window's name all the same."""

    window: UpdateWindow
    nodes: tuple[str, ...]
    start: int
    minutes: int


@dataclass
class ReservationPlan:
    create: list[NewReservation] = field(default_factory=list)
    delete: list[str] = field(default_factory=list)
    # (NodeSet key, why nothing is created for it), for the log.
    held: list[tuple[str, str]] = field(default_factory=list)


def scheduled_nodesets(
    cluster: str, nodesets: Iterable[Mapping[str, Any]], registered: Collection[str]
) -> list[ScheduledNodeSet]:
    """The NodeSets of `cluster` whose update strategy is ScheduledUpdate."""
    found = []
    for nodeset in nodesets:
        spec = _mapping(nodeset.get("spec"))
        strategy = _mapping(spec.get("updateStrategy"))
        if strategy.get("type") != SCHEDULED_UPDATE:
            continue
        names = nodeset_names(nodeset)
        if names is None or names.cluster != cluster:
            continue
        window = update_window(names.namespace, names.name, strategy)
        nodes = tuple(sorted(node for node in registered if names.names(node)))
        key = f"{names.namespace}/{names.name}"
        if isinstance(window, str):
            found.append(ScheduledNodeSet(key, None, window, nodes))
        else:
            found.append(ScheduledNodeSet(key, window, "", nodes))
    return found


def plan_reservations(
    cluster: str,
    now: float,
    nodesets: Iterable[Mapping[str, Any]],
    registered: Collection[str],
    existing: Collection[str],
    version: SlurmApiVersion | None,
) -> ReservationPlan:
    """What to create and delete in `cluster` at `now` (see the module's rules). `registered`:
    the Slurm nodes of the last listing; `existing`: the reservation names Slurm lists."""
    plan = ReservationPlan()
    scheduled = scheduled_nodesets(cluster, nodesets, registered)
    if version is None or not version.writes_reservations:
        spoken = version.name if version is not None else "not negotiated"
        why = (
            f"slurmrestd {spoken} cannot create reservations "
            f"(data_parser {RESERVATIONS_SINCE} or newer, Slurm 25.05+)"
        )
        plan.held = [(entry.key, why) for entry in scheduled]
        return plan
    wanted: set[str] = set()
    for entry in scheduled:
        window = entry.window
        if window is None:
            plan.held.append((entry.key, entry.problem))
            continue
        if window.over_at(now):
            continue
        wanted.add(window.reservation)
        if window.reservation in existing:
            continue
        unknown = [flag for flag in window.flags if flag not in version.reservation_flags]
        if unknown:
            plan.held.append(
                (entry.key, f"slurmrestd {version.name} has no reservation flag {unknown}")
            )
        elif not entry.nodes:
            plan.held.append((entry.key, "none of its Slurm nodes is registered yet"))
        else:
            start = max(window.start, int(now))
            minutes = math.ceil((window.end - start) / 60)
            plan.create.append(NewReservation(window, entry.nodes, start, minutes))
    plan.delete = sorted(
        name for name in existing if name.startswith(RESERVATION_PREFIX) and name not in wanted
    )
    return plan


def reservation_names(listed: Iterable[Mapping[str, Any]]) -> set[str]:
    """The names of a `GET /reservations` listing."""
    return {str(entry["name"]) for entry in listed if isinstance(entry.get("name"), str)}
