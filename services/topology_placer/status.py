"""PodGroup status, derived from its member pods the way the PodGroup controller of the
scheduler-plugins does it (Koordinator reuses it).

Pending while fewer than minMember pods exist; PreScheduling once they do and none has a
node or a nomination; Scheduling while fewer than minMember are bound; Scheduled once
minMember are bound, and kept while a group that was Scheduled or Running has lost a member
but still has one on a node or nominated (it is recovering, see pod_group_status); Running
once minMember run or have succeeded; Failed when a member failed and failed+running+succeeded reach
minMember; Finished when minMember succeeded.
`occupiedBy` names the owners of the members. `scheduleStartTime` is set on entering
Scheduling and kept; it is set again when the gang times out, as it marks when its wait
began (the placer's timeouts count from it).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from nodeflow_kube import fields
from topology_placer import pods as podfacts

Obj = Mapping[str, Any]

PHASES = ("Pending", "PreScheduling", "Scheduling", "Scheduled", "Running", "Finished", "Failed")
RECOVERING_FROM = frozenset({"Scheduled", "Running"})


def pod_group_status(
    min_member: int, members: Sequence[Obj], previous: Obj, now: float, *, restart: bool = False
) -> dict[str, Any]:
    """The status; `restart`: the gang timed out, its wait (scheduleStartTime) starts now."""
    live = [pod for pod in members if not podfacts.is_deleting(pod)]
    scheduled = sum(1 for pod in live if podfacts.node_name_of(pod))
    running = sum(1 for pod in live if podfacts.phase_of(pod) == "Running")
    succeeded = sum(1 for pod in live if podfacts.phase_of(pod) == "Succeeded")
    failed = sum(1 for pod in live if podfacts.phase_of(pod) == "Failed")
    nominated = any(podfacts.nominated_node_of(pod) for pod in live)
    # A group that reached minMember and still has a member on a node is recovering a lost
    # member, not scheduling anew: it stays Scheduled. The placer keeps no memory, so this
    # phase is its durable record that the gang was satisfied once (Koordinator keeps that
    # flag in its scheduler's cache; its controller would show Scheduling here). A nominated
    # member keeps the record too: a group that lost every bound member is regrowing, and the
    # pod the placer nominated (then binds) as a satisfied gang's must not, once bound alone,
    # be read as a partial bind of a gang that never reached minMember.
    recovering = previous.get("phase") in RECOVERING_FROM and (scheduled > 0 or nominated)
    if not live:
        phase = "Pending"
    elif succeeded >= min_member:
        phase = "Finished"
    elif failed > 0 and failed + running + succeeded >= min_member:
        phase = "Failed"
    elif scheduled >= min_member and running + succeeded >= min_member:
        phase = "Running"
    elif scheduled >= min_member or recovering:
        phase = "Scheduled"
    elif len(live) < min_member:
        phase = "Pending"
    elif scheduled == 0 and not nominated:
        phase = "PreScheduling"
    else:
        phase = "Scheduling"
    status: dict[str, Any] = {
        "phase": phase,
        "scheduled": scheduled,
        "running": running,
        "succeeded": succeeded,
        "failed": failed,
    }
    owners = sorted({f"{fields.namespace_of(p)}/{podfacts.owner_name(p)}" for p in live})
    if owners:
        status["occupiedBy"] = ",".join(owners)
    start = previous.get("scheduleStartTime")
    if restart or (phase == "Scheduling" and not isinstance(start, str)):
        status["scheduleStartTime"] = fields.rfc3339(now)
    elif isinstance(start, str):
        status["scheduleStartTime"] = start
    return status


def status_differs(wanted: Obj, current: Obj) -> bool:
    return any(current.get(key) != value for key, value in wanted.items()) or any(
        key not in wanted for key in current if key in _OWNED
    )


_OWNED = frozenset(
    {"phase", "scheduled", "running", "succeeded", "failed", "occupiedBy", "scheduleStartTime"}
)
