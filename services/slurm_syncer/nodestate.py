"""Slurm node JSON -> SlurmNodeState, with the derived states of the reference.

Every API version we speak (v0.0.41 to v0.0.45, nodeflow_contracts.slurm_api) has the fields
read here in the same shapes (NODE_FIELDS_READ, checked against each version's OpenAPI
document); state words a version adds (EXTERNAL, BLOCKED, POWER_DOWN_ASAP...) are not the
reference's and are left out, and a node with none of the reference's base states (an
EXTERNAL node) is Unknown.

See docs/slurm-syncer.md: Busy = Allocated, Mixed or Completing; Drain = Drain and not
Undrain; Drained = Drain and not Busy; Draining = Drain and Busy. A node that cannot be read
is Unknown with every derived state False (fail closed: never reported drained).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import msgspec

from nodeflow_contracts.slurm import BASE_STATES, FLAGS, BaseState, SlurmNodeState
from slurm_syncer.jobs import carry_jobs, with_jobs
from slurm_syncer.reasons import DEFAULT_DRAIN_REASONS, DrainReasons

# Slurm's upper-case names -> the reference's names.
_BASE_BY_SLURM: dict[str, str] = {state.upper(): state for state in BASE_STATES}
_FLAG_BY_SLURM: dict[str, str] = {
    "COMPLETING": "Completing",
    "DRAIN": "Drain",
    "FAIL": "Fail",
    "INVALID": "Invalid",
    "INVALID_REG": "InvalidReg",
    "MAINTENANCE": "Maintenance",
    "NOT_RESPONDING": "NotResponding",
    "UNDRAIN": "Undrain",
}
_FLAG_ORDER = {flag: index for index, flag in enumerate(FLAGS)}


class MalformedNode(ValueError):
    """A node entry without the fields every node of every version has."""


def split_state(raw: Iterable[str]) -> tuple[BaseState, tuple[str, ...]]:
    """`["IDLE", "DRAIN", "DYNAMIC_NORM"]` -> ("Idle", ("Drain",)).

    The first recognised base state wins (slurmrestd lists it first); without one the node
    is Unknown. Flags outside the reference's list (DYNAMIC_NORM, CLOUD, ...) are not kept.
    """
    base = "Unknown"
    flags: set[str] = set()
    found_base = False
    for word in raw:
        upper = word.upper()
        if not found_base and upper in _BASE_BY_SLURM:
            base = _BASE_BY_SLURM[upper]
            found_base = True
        elif upper in _FLAG_BY_SLURM:
            flags.add(_FLAG_BY_SLURM[upper])
    return cast(BaseState, base), tuple(sorted(flags, key=_FLAG_ORDER.__getitem__))


@dataclass(frozen=True)
class Derived:
    busy: bool
    drain: bool
    drained: bool
    draining: bool


def derive(base: str, flags: Iterable[str]) -> Derived:
    flag_set = set(flags)
    busy = base in ("Allocated", "Mixed") or "Completing" in flag_set
    drain = "Drain" in flag_set and "Undrain" not in flag_set
    return Derived(busy=busy, drain=drain, drained=drain and not busy, draining=drain and busy)


def reason_applies(base: str, flags: Iterable[str]) -> bool:
    """Slurm keeps a node's reason after UNDRAIN/RESUME (24.11.5): only a drained, down or
    failed node's reason says anything. A leftover reason is read as no reason at all, so a
    stale external reason never blocks the cordon model and a stale one of ours is not shown."""
    flag_set = set(flags)
    return base in ("Down", "Error") or "Drain" in flag_set or "Fail" in flag_set


def _number(value: Any) -> float | None:
    """A plain number or a `*_no_val_struct` ({set, infinite, number}, in every version)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, Mapping) and value.get("set") and not value.get("infinite"):
        number = value.get("number")
        if isinstance(number, int | float) and not isinstance(number, bool):
            return float(number)
    return None


def _int(value: Any) -> int:
    number = _number(value)
    return int(number) if number is not None else 0


def parse_node(
    cluster: str,
    raw: Mapping[str, Any],
    observed_at: float,
    reasons: DrainReasons = DEFAULT_DRAIN_REASONS,
) -> SlurmNodeState:
    """One entry of `nodes[]`; MalformedNode when name or state are missing or mistyped."""
    name = raw.get("name")
    if not isinstance(name, str) or not name:
        raise MalformedNode("node entry without a name")
    state = raw.get("state")
    if isinstance(state, str):
        state = [state]
    if not isinstance(state, list) or not all(isinstance(word, str) for word in state):
        raise MalformedNode(f"node {name}: `state` is not a list of strings")
    reason = raw.get("reason") or ""
    if not isinstance(reason, str):
        raise MalformedNode(f"node {name}: `reason` is not a string")
    base, flags = split_state(state)
    derived = derive(base, flags)
    if not reason_applies(base, flags):
        reason = ""
    set_by = raw.get("reason_set_by_user")
    reservation = raw.get("reservation")
    return SlurmNodeState(
        cluster=cluster,
        name=name,
        known=True,
        base_state=base,
        flags=flags,
        reason=reason,
        reason_is_ours=reasons.is_ours(reason),
        reason_set_by=set_by if isinstance(set_by, str) and reason else "",
        reason_changed_at=_number(raw.get("reason_changed_at")) if reason else None,
        cpus=_int(raw.get("cpus")),
        alloc_cpus=_int(raw.get("alloc_cpus")),
        reservation=reservation if isinstance(reservation, str) else "",
        busy=derived.busy,
        drain=derived.drain,
        drained=derived.drained,
        draining=derived.draining,
        observed_at=observed_at,
    )


def unknown_state(cluster: str, name: str, observed_at: float) -> SlurmNodeState:
    """The state of a node that cannot be read: Unknown, nothing drained, nothing busy."""
    return SlurmNodeState(
        cluster=cluster, name=name, known=False, base_state="Unknown", observed_at=observed_at
    )


def _without_jobs(state: SlurmNodeState) -> SlurmNodeState:
    return msgspec.structs.replace(state, observed_at=0.0, jobs=(), jobs_total=0, jobs_read_at=0.0)


def same_state(a: SlurmNodeState | None, b: SlurmNodeState | None) -> bool:
    """Equal apart from when they were observed and which jobs run on them: what is worth
    publishing (a KV write and an event).

    The jobs are information for people, never a safety input (`busy` is the node's own
    word), and on a busy node shared by short jobs they change at every poll: publishing each
    change would multiply the writes. So a state that differs only in its jobs is the same
    state, but for a busy node whose jobs become known or all go (at most two writes a busy
    spell, and none when the poll that sees the node busy reads its jobs too): a stored busy
    node then never names no job while some hold it, nor names jobs once all have ended.
    """
    if a is None or b is None:
        return a is b
    if _without_jobs(a) != _without_jobs(b):
        return False
    return not (b.busy and bool(a.jobs) != bool(b.jobs))


# How long NOT_RESPONDING is seen before it is reported (SLURM_NOT_RESPONDING_CONFIRM_SECONDS).
DEFAULT_NOT_RESPONDING_CONFIRM_SECONDS = 3.0


@dataclass(frozen=True)
class Settled:
    """A node state as reported, and since when its NOT_RESPONDING has been seen (None: not
    seen in the last read)."""

    state: SlurmNodeState
    not_responding_since: float | None


def settle_not_responding(
    read: SlurmNodeState,
    reported: SlurmNodeState | None,
    seen_since: float | None,
    confirm_after: float,
) -> Settled:
    """NOT_RESPONDING is reported only once it is confirmed: seen on reads at least
    `confirm_after` seconds apart with no read without it between them, or already reported.

    Why: slurmctld marks a node NOT_RESPONDING the moment an admin UNDRAINs or RESUMEs it (it
    zeroes boot_time and pings the node afresh) and clears it on slurmd's answer, 0.2-0.8 s
    later on Slurm 24.11.5; a node whose slurmd really stopped is marked only after a failed
    ping (about 20 s) and stays marked until it goes DOWN (SlurmdTimeout). Until confirmed,
    the flag is left out and everything else of the read is reported: the base state (Down
    included), the drain flags and the reason are never held back.
    """
    if "NotResponding" not in read.flags:
        return Settled(read, None)
    since = read.observed_at if seen_since is None else min(seen_since, read.observed_at)
    already_reported = reported is not None and "NotResponding" in reported.flags
    if already_reported or read.observed_at - since >= confirm_after:
        return Settled(read, since)
    flags = tuple(flag for flag in read.flags if flag != "NotResponding")
    return Settled(msgspec.structs.replace(read, flags=flags), since)


def with_unconfirmed_not_responding(
    state: SlurmNodeState | None, seen_not_responding: bool
) -> SlurmNodeState | None:
    """The state as last read, for drain decisions: a NOT_RESPONDING not yet reported still
    holds drains and undrains back (drain.decide_drain leaves a silent node alone)."""
    if state is None or not seen_not_responding or "NotResponding" in state.flags:
        return state
    flags = sorted((*state.flags, "NotResponding"), key=_FLAG_ORDER.__getitem__)
    return msgspec.structs.replace(state, flags=tuple(flags))


@dataclass
class PollOutcome:
    """What one poll of one cluster changes, computed without I/O."""

    states: dict[str, SlurmNodeState]
    changed: list[SlurmNodeState] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    malformed: list[str] = field(default_factory=list)
    # Nodes seen NOT_RESPONDING in this poll -> since when (see settle_not_responding).
    not_responding_since: dict[str, float] = field(default_factory=dict)


def apply_poll(
    cluster: str,
    previous: Mapping[str, SlurmNodeState],
    raw_nodes: list[dict[str, Any]] | None,
    observed_at: float,
    not_responding_since: Mapping[str, float] | None = None,
    confirm_not_responding_after: float = DEFAULT_NOT_RESPONDING_CONFIRM_SECONDS,
    reasons: DrainReasons = DEFAULT_DRAIN_REASONS,
    read_since_listing: Collection[str] = (),
    node_jobs: Mapping[str, Sequence[str]] | None = None,
) -> PollOutcome:
    """The new states of a cluster after a poll (`raw_nodes` None: the poll failed).

    A failed poll turns every known node Unknown (fail closed) and forgets none of them. A
    malformed entry makes that node Unknown when its name is readable. Nodes missing from a
    successful poll are removed. NOT_RESPONDING is reported once confirmed
    (settle_not_responding), given when each node was first seen so (`not_responding_since`).

    Nodes in `read_since_listing` were read one by one (a command's read-back) after the
    listing was sent: their `previous` state is newer than the listing's and is kept as it
    is (present or absent), so a slow listing never undoes a drain it did not see.

    `node_jobs` (jobs.jobs_by_node) names the jobs on each node, read in the same poll; None
    (the job listing failed) keeps the jobs each node was last read with (jobs.carry_jobs).
    The jobs never change `busy` or any other derived state.
    """
    seen_since = not_responding_since or {}
    states: dict[str, SlurmNodeState] = {}
    outcome = PollOutcome(states=states)
    if raw_nodes is None:
        for name, old in previous.items():
            states[name] = old if not old.known else unknown_state(cluster, name, observed_at)
    else:
        for raw in raw_nodes:
            listed_name = raw.get("name")
            if isinstance(listed_name, str) and listed_name in read_since_listing:
                continue
            try:
                state = parse_node(cluster, raw, observed_at, reasons)
            except MalformedNode as exc:
                outcome.malformed.append(str(exc))
                raw_name = raw.get("name")
                if isinstance(raw_name, str) and raw_name:
                    states[raw_name] = unknown_state(cluster, raw_name, observed_at)
                continue
            settled = settle_not_responding(
                state,
                previous.get(state.name),
                seen_since.get(state.name),
                confirm_not_responding_after,
            )
            if node_jobs is None:
                states[state.name] = carry_jobs(settled.state, previous.get(state.name))
            else:
                states[state.name] = with_jobs(
                    settled.state, node_jobs.get(state.name, ()), observed_at
                )
            if settled.not_responding_since is not None:
                outcome.not_responding_since[state.name] = settled.not_responding_since
        for name in read_since_listing:
            if name in previous:
                states[name] = previous[name]
                if name in seen_since:
                    outcome.not_responding_since[name] = seen_since[name]
        outcome.removed = sorted(name for name in previous if name not in states)
    for name, state in states.items():
        if not same_state(previous.get(name), state):
            outcome.changed.append(state)
    return outcome


@dataclass
class JobsOutcome:
    """The states of a cluster once a job listing is read into them, and the nodes whose
    state became worth publishing (same_state)."""

    states: dict[str, SlurmNodeState]
    changed: list[str] = field(default_factory=list)


def apply_jobs(
    states: Mapping[str, SlurmNodeState],
    node_jobs: Mapping[str, Sequence[str]],
    read_at: float,
) -> JobsOutcome:
    """`states` naming the jobs of `node_jobs` (jobs.jobs_by_node, a listing sent at
    `read_at`): every node gets them, so a later publish carries the newest jobs, but only
    the nodes whose state changed by same_state's measure (a busy node whose jobs became
    known or all went) are named in `changed`. Nothing else of a state moves: the jobs never
    change `busy` or any derived state."""
    outcome = JobsOutcome(states={})
    for name, state in states.items():
        named = with_jobs(state, node_jobs.get(name, ()), read_at)
        outcome.states[name] = named
        if not same_state(state, named):
            outcome.changed.append(name)
    return outcome
