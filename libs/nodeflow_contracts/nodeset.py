"""NodeSet controller decisions, published for audit on `nodeset.v1.<ns>.<name>.decision`, and
the scheduled-update window a NodeSet asks for (read by nodeset-controller and slurm-syncer)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

import msgspec

from nodeflow_contracts import subjects
from nodeflow_contracts.durations import go_duration_seconds

DecisionKind = Literal[
    "create",
    "delete-scheduled",
    "cancel",
    "delete",
    "forced-delete",
    "rolling-replace",
    "invalid-spec",
    "name-collision",
    # A PodDisruptionBudget of the NodeSet's budget name that it does not own: its pods running
    # jobs are not protected from eviction (rule 4a) until that budget is removed.
    "protection-disabled",
]


class NodeSetDecision(msgspec.Struct, frozen=True, kw_only=True):
    decision_id: str
    namespace: str
    nodeset: str
    kind: DecisionKind
    # Short machine-readable reason (a condition reason such as ScalingDeleteScheduled).
    reason: str
    # Human-readable explanation, e.g. "rank 2: idle, drained, delete condition set".
    message: str
    decided_at: float
    pod: str = ""
    node: str = ""

    @property
    def subject(self) -> str:
        return subjects.nodeset_decision(self.namespace, self.nodeset)


# --- updateStrategy.type ScheduledUpdate: the window and its Slurm reservation ---------------
#
# The contract between nodeset-controller and slurm-syncer for a NodeSet's scheduled update,
# stated whole here (both read the NodeSet; neither sends the other a message):
#   - `spec.updateStrategy.scheduledUpdate` (Slinky's fields): `startTime`, an RFC 3339
#     timestamp with its offset; `duration`, a Go duration (default 30m, whole minutes, as
#     slurmrestd takes them, at least one); `flags`, reservation flags added to MAINT.
#   - The window is [startTime, startTime + duration). slurm-syncer creates, on a slurmrestd
#     that can (`SlurmApiVersion.writes_reservations`), the reservation `reservation_name(...)`
#     with flags MAINT and IGNORE_JOBS (plus `flags`) over the NodeSet's Slurm nodes
#     (those its pod names name, registered when it is created) for the window, any time
#     before the window ends, and deletes it once the window is over or the NodeSet no longer
#     asks for it (another strategy, another startTime, the NodeSet gone). It never touches a
#     reservation whose name does not start with RESERVATION_PREFIX.
#   - While the reservation is active Slurm shows each of its nodes with the MAINTENANCE flag
#     and the reservation's name (`SlurmNodeState.reservation`). nodeset-controller replaces
#     an outdated pod (drain, idle, delete: never a pod running a job) only inside the window
#     and only when its Slurm node reads so: the reservation's presence in Slurm, not memory,
#     is the evidence, so either service may restart at any time.
#   - `SlurmClusterStatus.api_version` says which version slurm-syncer speaks: on one that
#     cannot create reservations the NodeSet reports it (reason RESERVATIONS_UNSUPPORTED) and
#     no pod is replaced by the schedule.

RESERVATION_PREFIX = "nodeflow-"
# The flags every scheduled-update reservation carries: MAINT (its nodes show MAINTENANCE
# while it is active) and IGNORE_JOBS (slurmctld would refuse a reservation that jobs already
# running may outlive; those jobs run on, and their pods wait for them to end).
ALWAYS_FLAGS: tuple[str, ...] = ("MAINT", "IGNORE_JOBS")
DEFAULT_WINDOW_MINUTES = 30
# Reservation flags that make Slurm repeat a reservation. A window here is one
# [startTime, startTime + duration) whose reservation is deleted after it, so a recurring flag
# would promise a repetition that never happens: the NodeSet refuses it (Slinky, which repeats
# its replacements, accepts it; migrate says so).
RECURRING_RESERVATION_FLAGS = frozenset({"HOURLY", "DAILY", "WEEKDAY", "WEEKEND", "WEEKLY"})
RESERVATIONS_UNSUPPORTED = "ReservationsUnsupported"


@dataclass(frozen=True)
class UpdateWindow:
    """One NodeSet's scheduled-update window and the reservation that holds it."""

    namespace: str
    nodeset: str
    start: int  # epoch seconds
    minutes: int
    flags: tuple[str, ...]  # upper case, ALWAYS_FLAGS first

    @property
    def end(self) -> int:
        return self.start + self.minutes * 60

    @property
    def reservation(self) -> str:
        return reservation_name(self.namespace, self.nodeset, self.start)

    def open_at(self, now: float) -> bool:
        return self.start <= now < self.end

    def over_at(self, now: float) -> bool:
        return now >= self.end


def reservation_name(namespace: str, nodeset: str, start: int) -> str:
    """`nodeflow-<namespace>-<nodeset>-<start, UTC, YYYYmmddTHHMMSSZ>`: the same for the same
    window whoever computes it, so a restarted service finds the reservation again, and a new
    startTime names a new one."""
    stamp = datetime.fromtimestamp(start, tz=UTC).strftime("%Y%m%dT%H%M%SZ")
    return f"{RESERVATION_PREFIX}{namespace}-{nodeset}-{stamp}"


def _rfc3339_seconds(value: object) -> int | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        return None
    if parsed.tzinfo is None:
        return None  # RFC 3339 needs the offset: a local time would be read differently
    return int(parsed.timestamp())


def update_window(namespace: str, nodeset: str, strategy: Mapping[str, Any]) -> UpdateWindow | str:
    """The window `updateStrategy` asks for (its `type` must be ScheduledUpdate), or what is
    wrong with it."""
    scheduled = strategy.get("scheduledUpdate")
    if not isinstance(scheduled, Mapping):
        return "scheduledUpdate.startTime is required"
    start = _rfc3339_seconds(scheduled.get("startTime"))
    if start is None:
        return (
            f"scheduledUpdate.startTime {scheduled.get('startTime')!r} is no RFC 3339 "
            "timestamp with an offset (e.g. 2026-12-01T02:00:00Z)"
        )
    raw_duration = scheduled.get("duration", f"{DEFAULT_WINDOW_MINUTES}m")
    try:
        seconds = go_duration_seconds(str(raw_duration)) if raw_duration is not None else 0.0
    except ValueError as exc:
        return f"scheduledUpdate.duration: {exc}"
    if seconds < 60 or seconds % 60:
        return f"scheduledUpdate.duration {raw_duration!r} is not a whole number of minutes >= 1m"
    raw_flags = scheduled.get("flags") or []
    if not isinstance(raw_flags, list) or not all(isinstance(f, str) and f for f in raw_flags):
        return "scheduledUpdate.flags must be a list of Slurm reservation flags"
    flags = list(ALWAYS_FLAGS)
    for flag in raw_flags:
        word = flag.strip().upper()
        if word not in flags:
            flags.append(word)
    return UpdateWindow(namespace, nodeset, start, int(seconds // 60), tuple(flags))
