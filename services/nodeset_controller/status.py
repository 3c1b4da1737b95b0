"""Rule 8: the NodeSet status, recomputed from the cluster, written only when it differs."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal, get_args

from nodeflow_contracts.pod_protocol import POD_WAIT_CONDITION
from nodeflow_kube.fields import (
    mapping,
    sequence,
)

INVALID_SPEC = "InvalidSpec"
NAME_COLLISION = "NameCollision"
# True while the NodeSet's Slurm cluster has no fresh view: numberRunning and numberDrain
# then keep their last known values, and lastTransitionTime says since when.
SLURM_STATE_UNKNOWN = "SlurmStateUnknown"
# True while a PodDisruptionBudget of the NodeSet's budget name exists that the NodeSet does
# not own (rule 4a): its pods running jobs are then not protected from eviction. Present only
# then.
DISRUPTION_BUDGET_CONFLICT = "DisruptionBudgetConflict"
# updateStrategy ScheduledUpdate only: True while its window is open on a slurmrestd that holds
# it with a reservation (pods are then replaced as their nodes empty), False with the reason
# otherwise (WindowPending, WindowOver, ReservationsUnsupported, SlurmApiVersionUnknown).
SCHEDULED_UPDATE = "ScheduledUpdate"
# True while a scale-down (ScaleDownWaiting) or a rollout (RolloutWaiting) has pods it wants
# gone that it cannot remove yet: the reason is the most blocking cause (`WAIT_ORDER`), the
# message names up to `NAMED_WAITS` pods and why each waits. False (NoneWaiting) otherwise.
SCALE_DOWN_WAITING = "ScaleDownWaiting"
ROLLOUT_WAITING = "RolloutWaiting"

# Why a pod the NodeSet wants gone is not removed yet, as the planner finds it, most blocking
# first: what has to change before anything else can (an update window, a fresh Slurm view,
# jobs ending, the drain, the next poll), then what holds pods that are not even marked yet (a
# node that cannot take the replacement, the reservation, maxUnavailable: the budget frees
# itself as the pods ahead go).
WaitCause = Literal[
    "WindowClosed",
    "SlurmStateUnknown",
    "PodsBusy",
    "DrainPending",
    "AwaitingSlurmRead",
    "ReplacementUnplaceable",
    "ReservationPending",
    "BudgetExhausted",
]
WAIT_ORDER: tuple[WaitCause, ...] = get_args(WaitCause)
# How many waiting pods a message names (the others are counted): a condition message is
# read by a person, and a NodeSet of thousands must not write a huge status.
NAMED_WAITS = 5


@dataclass(frozen=True)
class PodWait:
    """One pod the NodeSet wants gone and cannot remove yet. `detail` says why in words that
    stay the same while the cause does (no clock, no counters that move by themselves), so
    an unchanged cluster gives an unchanged condition and no status write."""

    pod: str
    cause: WaitCause
    detail: str


# What each wait says on the waiting pod itself (`pod_wait_condition`): what it waits for and
# what ends it, in words that change only when the cause does. Each change is one API write per
# pod (issue 36), so the pod's words leave out what moves within one cause and is shown on the
# pod anyway: whether a busy node is draining yet (slurm-syncer's SlurmNodeStateDrain says so),
# and which step of the drain handshake it is at (`_HANDSHAKE`).
_POD_WAIT_WORDS: dict[WaitCause, str] = {
    "WindowClosed": "update window closed: replaced once it opens",
    "SlurmStateUnknown": (
        "Slurm state unknown: deleted only once Slurm is read fresh again (fail closed)"
    ),
    "PodsBusy": (
        "node busy with jobs: deleted once they end and Slurm reads the node drained and idle"
    ),
    "DrainPending": (
        "not read drained and idle since its SlurmDelete: deleted once a Slurm poll does"
    ),
    "ReservationPending": (
        "Slurm node not held by the update reservation: replaced once Slurm reads it there"
    ),
}
# The handshake's two steps, not drained yet and drained but not read since the mark, are one
# wait on the pod (DrainPending): what tells them apart is when Slurm's next poll lands, not a
# new cause, and telling it would cost a write on nearly every pod a scale-down removes.
_HANDSHAKE: tuple[WaitCause, ...] = ("DrainPending", "AwaitingSlurmRead")


def pod_wait_condition(wait: PodWait, max_unavailable: int | str) -> WantedCondition:
    """The waiting pod's own condition (POD_WAIT_CONDITION): True, the cause as reason (the
    handshake's two steps as DrainPending), and what it waits for as message; the budget is
    named by its setting, not by figures that move with every pod that comes back."""
    cause = "DrainPending" if wait.cause in _HANDSHAKE else wait.cause
    if cause == "BudgetExhausted":
        message = (
            f"held by maxUnavailable ({max_unavailable}): replaced as the pods ahead of it "
            "come back available"
        )
    elif cause == "ReplacementUnplaceable":
        message = f"{wait.detail}: replaced once its node can take it"
    else:
        message = _POD_WAIT_WORDS[cause]
    return WantedCondition(POD_WAIT_CONDITION, "True", cause, message)


def most_blocking(waits: Iterable[PodWait]) -> dict[str, PodWait]:
    """Each waiting pod's most blocking wait (`WAIT_ORDER`), by pod name."""
    found: dict[str, PodWait] = {}
    for wait in waits:
        held = found.get(wait.pod)
        if held is None or WAIT_ORDER.index(wait.cause) < WAIT_ORDER.index(held.cause):
            found[wait.pod] = wait
    return found


@dataclass(frozen=True)
class Counts:
    current_number_scheduled: int
    number_misscheduled: int
    desired_number_scheduled: int
    updated_number_scheduled: int
    number_feasible: int
    number_ready: int
    number_unavailable: int
    number_running: int
    number_drain: int

    def as_status(self) -> dict[str, int]:
        return {
            "currentNumberScheduled": self.current_number_scheduled,
            "numberMisscheduled": self.number_misscheduled,
            "desiredNumberScheduled": self.desired_number_scheduled,
            "updatedNumberScheduled": self.updated_number_scheduled,
            "numberFeasible": self.number_feasible,
            "numberReady": self.number_ready,
            "numberUnavailable": self.number_unavailable,
            "numberRunning": self.number_running,
            "numberDrain": self.number_drain,
        }


@dataclass(frozen=True)
class WantedCondition:
    type: str
    status: str
    reason: str
    message: str


def waiting_condition(
    kind: str, waits: Sequence[PodWait], *, idle: str, context: str = ""
) -> WantedCondition:
    """ScaleDownWaiting or RolloutWaiting from the planner's waits: True with the most
    blocking cause as reason and the pods named in that order (then by name), False with
    `idle` as message when nothing waits. `context` (e.g. the budget's figures) ends the
    message."""
    if not waits:
        return WantedCondition(kind, "False", "NoneWaiting", idle)
    ordered = sorted(waits, key=lambda w: (WAIT_ORDER.index(w.cause), w.pod))
    named = ", ".join(f"{w.pod} ({w.detail})" for w in ordered[:NAMED_WAITS])
    more = len(ordered) - NAMED_WAITS
    if more > 0:
        named += f" and {more} more"
    count = "1 pod waits" if len(ordered) == 1 else f"{len(ordered)} pods wait"
    message = f"{count}: {named}"
    if context:
        message += f"; {context}"
    return WantedCondition(kind, "True", ordered[0].cause, message)


def merge_conditions(
    existing: Iterable[Any],
    wanted: Iterable[WantedCondition],
    now: str,
    observed_generation: int = 0,
) -> list[dict[str, Any]]:
    """The conditions to write, sorted by type: lastTransitionTime is kept while the status
    does not change, so an unchanged condition is byte-for-byte unchanged. Each carries the
    generation it was computed from (metav1.Condition's observedGeneration)."""
    old = {str(mapping(c).get("type")): mapping(c) for c in existing if mapping(c).get("type")}
    result = []
    for condition in sorted(wanted, key=lambda c: c.type):
        previous = old.get(condition.type)
        since = now
        if previous is not None and previous.get("status") == condition.status:
            since = str(previous.get("lastTransitionTime") or now)
        result.append(
            {
                "type": condition.type,
                "status": condition.status,
                "reason": condition.reason,
                "message": condition.message,
                "lastTransitionTime": since,
                "observedGeneration": observed_generation,
            }
        )
    return result


# The revision fields of the status (`history`), written after the counts.
REVISION_FIELDS = ("currentRevision", "updateRevision")


def build_status(
    existing: Mapping[str, Any],
    *,
    counts: Counts | None,
    observed_generation: int,
    selector: str,
    conditions: Iterable[WantedCondition],
    now: str,
) -> dict[str, Any]:
    """The full status. With `counts` None (an invalid spec) the counts are kept as they
    were: the controller did not look at the pods, so it reports nothing new about them."""
    status: dict[str, Any] = {}
    if counts is None:
        for key in Counts.__dataclass_fields__:
            camel = _camel(key)
            if camel in existing:
                status[camel] = existing[camel]
        # Nor about its revisions (`history`: the plan of a valid spec reports them).
        for camel in REVISION_FIELDS:
            if camel in existing:
                status[camel] = existing[camel]
    else:
        status.update(counts.as_status())
    status["observedGeneration"] = observed_generation
    status["selector"] = selector
    status["conditions"] = merge_conditions(
        sequence(existing.get("conditions")), conditions, now, observed_generation
    )
    return status


def last_known_slurm_counts(counts: Counts, existing: Mapping[str, Any], on_nodes: int) -> Counts:
    """`counts` with numberRunning and numberDrain as the stored status last had them: what
    the controller reads of Slurm is stale, and zeros would tell dashboards and autoscalers
    that nodes which may run jobs are idle. The status in Kubernetes is the durable store,
    so a restarted controller keeps them too. A count without a stored value keeps the one
    computed (no Slurm state counts: zero). A node is either running or drained (numberDrain
    counts Drain and not Busy), so together they claim at most the pods still on nodes:
    running first (a node that may run jobs matters most), drained within what is left."""
    running = _stored_count(existing, "number_running")
    drain = _stored_count(existing, "number_drain")
    if running is None:
        running = counts.number_running
    if drain is None:
        drain = counts.number_drain
    running = min(running, on_nodes)
    return replace(counts, number_running=running, number_drain=min(drain, on_nodes - running))


def _stored_count(existing: Mapping[str, Any], key: str) -> int | None:
    stored = existing.get(_camel(key))
    if isinstance(stored, int) and not isinstance(stored, bool) and stored >= 0:
        return stored
    return None


def _camel(snake: str) -> str:
    head, *rest = snake.split("_")
    return head + "".join(part.title() for part in rest)


def status_differs(existing: Mapping[str, Any], wanted: Mapping[str, Any]) -> bool:
    return dict(existing) != dict(wanted)
