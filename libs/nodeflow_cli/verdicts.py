"""Pure: the answers of `kubectl nodeflow` -- state in, text out.

Each `why_*` joins what Kubernetes shows of an object (its conditions and status, where the
services write their reasons) with what the bus knows (the controllers' latest decisions
about it, a pod's Slurm node as slurm-syncer last read it) into one verdict. The I/O (the API
server, NATS) lives in `nodeflow_cli.main`; nothing here reads a clock or a socket.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from nodeflow_contracts.pod_protocol import (
    NODESET_LABEL,
    POD_WAIT_CONDITION,
    SLURM_DELETE_CONDITION,
    SLURM_STATE_CONDITION_PREFIX,
)
from nodeflow_contracts.skyhook import SKYHOOK, flavor_of

Obj = Mapping[str, Any]

# Decision subjects' first token -> the service that publishes them (docs/subjects.md).
DECISION_SERVICES = {
    "nodeset": "nodeset-controller",
    "maintenance": "maintenance-scheduler",
    "placement": "topology-placer",
}
LATEST_DECISIONS = 5
# Pod conditions that say why a pod waits or goes.
NOTABLE_POD_CONDITIONS = {
    ("PodScheduled", "False"),
    ("Ready", "False"),
    ("DisruptionTarget", "True"),
}


@dataclass(frozen=True)
class Decision:
    """One controller decision, from any of the decision subjects."""

    decided_at: float
    service: str
    # "NodeMaintenance default/m1", "NodeSet slurm/gpu", "PodGroup default/train", "Skyhook s",
    # "NodeWright s".
    about: str
    reason: str
    message: str
    node: str = ""
    pod: str = ""


def decision_of(subject: str, payload: Obj) -> Decision | None:
    """A decision message as a Decision (None: not a decision subject)."""
    parts = subject.split(".")
    if len(parts) < 4 or parts[-1] != "decision" or parts[0] not in DECISION_SERVICES:
        return None
    if parts[0] == "nodeset":
        about = f"NodeSet {payload.get('namespace')}/{payload.get('nodeset')}"
    elif parts[0] == "placement":
        about = f"PodGroup {payload.get('namespace')}/{payload.get('group')}"
    elif parts[2] == "skyhook":
        about = f"{payload.get('object_kind') or SKYHOOK.kind} {payload.get('skyhook')}"
    else:
        about = f"NodeMaintenance {payload.get('namespace')}/{payload.get('name')}"
    return Decision(
        decided_at=float(payload.get("decided_at") or 0.0),
        service=DECISION_SERVICES[parts[0]],
        about=about,
        reason=str(payload.get("reason") or ""),
        message=str(payload.get("message") or ""),
        node=str(payload.get("node") or ""),
        pod=str(payload.get("pod") or ""),
    )


def _time(epoch: float) -> str:
    moment = datetime.datetime.fromtimestamp(epoch, tz=datetime.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def format_decision(decision: Decision) -> str:
    """One line: when, who, about what, why."""
    where = ", ".join(
        part
        for part in (
            f"node {decision.node}" if decision.node else "",
            f"pod {decision.pod}" if decision.pod else "",
        )
        if part
    )
    about = f"{decision.about} ({where})" if where else decision.about
    return (
        f"{_time(decision.decided_at)}  {decision.service:<21}  {about}  "
        f"{decision.reason}: {decision.message}"
    )


def decision_matches(decision: Decision, *, service: str = "", about: str = "") -> bool:
    """`--service` names the service; `--object` a substring of what it is about (kind and
    name, `ns/name`, or just the name), or its node or pod."""
    if service and decision.service != service:
        return False
    if about:
        return about in decision.about or about in (decision.node, decision.pod)
    return True


def decisions_about(decisions: Iterable[Decision], about: str) -> list[Decision]:
    """The decisions about exactly one object ("Kind ns/name"), oldest first."""
    return sorted((d for d in decisions if d.about == about), key=lambda d: d.decided_at)


# --- Kubernetes objects ---------------------------------------------------------------------


def conditions(obj: Obj) -> list[Obj]:
    return [c for c in (obj.get("status") or {}).get("conditions") or () if isinstance(c, dict)]


def condition(obj: Obj, kind: str) -> Obj | None:
    return next((c for c in conditions(obj) if c.get("type") == kind), None)


def _condition_line(entry: Obj) -> str:
    text = f"{entry.get('type')}={entry.get('status')}"
    if entry.get("reason"):
        text += f" {entry.get('reason')}"
    if entry.get("message"):
        text += f": {entry.get('message')}"
    return text


def _key(obj: Obj) -> str:
    metadata = obj.get("metadata") or {}
    namespace = metadata.get("namespace")
    return f"{namespace}/{metadata.get('name')}" if namespace else str(metadata.get("name"))


def _with_decisions(lines: list[str], decisions: Sequence[Decision]) -> str:
    latest = list(decisions)[-LATEST_DECISIONS:]
    if latest:
        lines.append("latest decisions:")
        lines.extend(f"  {format_decision(d)}" for d in latest)
    else:
        lines.append("latest decisions: none on the bus (or NATS not reached)")
    return "\n".join(lines)


def why_nodemaintenance(obj: Obj, decisions: Sequence[Decision]) -> str:
    """Why a NodeMaintenance is where it is: its Ready condition (reason = the phase, message
    = what holds it: the budget of a Pending request), the drain's progress, the pods it waits
    for, and the latest decisions."""
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    node = spec.get("nodeName", "?")
    head = f"NodeMaintenance {_key(obj)} (node {node}, requestor {spec.get('requestorID', '?')})"
    ready = condition(obj, "Ready")
    lines: list[str] = []
    if (obj.get("metadata") or {}).get("deletionTimestamp"):
        lines.append(f"{head}: being deleted; the node is uncordoned once the cleanup is done")
    elif ready is None:
        lines.append(f"{head}: not yet seen by maintenance-scheduler (no Ready condition)")
    else:
        phase = str(ready.get("reason") or "")
        message = str(ready.get("message") or "")
        if phase == "Ready":
            lines.append(f"{head}: Ready: node {node} is cordoned and drained")
        elif phase == "Pending":
            lines.append(f"{head}: Pending: {message or 'waiting to be scheduled'}")
        else:
            lines.append(f"{head}: {phase}" + (f": {message}" if message else ""))
    drain = status.get("drain") or {}
    if drain:
        lines.append(
            f"drain: {drain.get('drainProgress', 0)}% "
            f"({drain.get('evictionPods', 0)} of {drain.get('totalPods', 0)} pods to evict left)"
        )
        waiting = drain.get("waitForEviction") or ()
        if waiting:
            lines.append("waiting for eviction: " + ", ".join(map(str, waiting)))
    completion = status.get("waitForCompletion") or ()
    if completion:
        lines.append("waiting for pods to complete: " + ", ".join(map(str, completion)))
    return _with_decisions(lines, decisions)


def why_pod(
    pod: Obj, slurm_node: Obj | None, slurm_cluster: str, decisions: Sequence[Decision]
) -> str:
    """Why a pod is (not) going: its deletion state, the Slurm protocol's conditions, how
    Slurm sees its node (fail closed: an unknown state never lets a pod with a job go), and
    the latest decisions of its NodeSet about it."""
    metadata = pod.get("metadata") or {}
    name = str(metadata.get("name"))
    status = pod.get("status") or {}
    node = (pod.get("spec") or {}).get("nodeName") or ""
    head = f"Pod {_key(pod)} ({status.get('phase', '?')}" + (f", on {node})" if node else ")")
    lines = [head]
    if metadata.get("deletionTimestamp"):
        lines.append("being deleted")
    nodeset = (metadata.get("labels") or {}).get(NODESET_LABEL)
    delete = condition(pod, SLURM_DELETE_CONDITION)
    if delete is not None:
        lines.append("marked for deletion: " + _condition_line(delete))
    wait = condition(pod, POD_WAIT_CONDITION)
    if wait is not None and wait.get("status") == "True":
        # nodeset-controller's own word on what the pod waits for (its rule 8b).
        lines.append("waits: " + _condition_line(wait))
    for entry in conditions(pod):
        kind = str(entry.get("type"))
        if kind.startswith(SLURM_STATE_CONDITION_PREFIX) and entry.get("status") == "True":
            lines.append("Slurm says: " + _condition_line(entry))
        elif (kind, entry.get("status")) in NOTABLE_POD_CONDITIONS:
            lines.append(_condition_line(entry))
    if nodeset:
        lines.append(f"NodeSet: {metadata.get('namespace')}/{nodeset}")
        lines.append(_slurm_line(name, slurm_node, slurm_cluster))
    return _with_decisions(lines, [d for d in decisions if d.pod in ("", name)])


def _slurm_line(name: str, slurm_node: Obj | None, cluster: str) -> str:
    where = f"Slurm node {cluster}/{name}" if cluster else f"Slurm node {name}"
    if slurm_node is None:
        return f"{where}: not known (fail closed: a pod whose node's state is unknown is kept)"
    if not slurm_node.get("known", False):
        return f"{where}: state unknown (fail closed: the pod is kept until Slurm is read)"
    flags = ",".join(slurm_node.get("flags") or ())
    state = str(slurm_node.get("base_state", "?")) + (f"+{flags}" if flags else "")
    facts = []
    if slurm_node.get("busy"):
        facts.append(
            f"busy: {slurm_node.get('alloc_cpus', 0)} of {slurm_node.get('cpus', 0)} CPUs "
            f"allocated to jobs{_jobs_named(slurm_node)} (not deleted while it runs a job)"
        )
    if slurm_node.get("drained"):
        facts.append("drained and idle: may go")
    elif slurm_node.get("draining"):
        facts.append("draining: waits for its jobs to end")
    reason = slurm_node.get("reason")
    if reason:
        facts.append(f"reason {reason!r}")
    return f"{where}: {state}" + (f"; {'; '.join(facts)}" if facts else "")


def _jobs_named(slurm_node: Obj) -> str:
    """The jobs slurm-syncer read on a busy node, as ` 4211, 4212 as of <time>`. They are
    stored only with a change of the node's state (not at every job that starts or ends on
    it), hence when they were read; "" when they were never read or none was seen."""
    jobs = [str(job) for job in slurm_node.get("jobs") or ()]
    read_at = slurm_node.get("jobs_read_at") or 0
    if not jobs or not read_at or not isinstance(read_at, int | float):
        return ""
    total = slurm_node.get("jobs_total") or len(jobs)
    more = f" and {total - len(jobs)} more" if isinstance(total, int) and total > len(jobs) else ""
    return f" {', '.join(jobs)}{more} as of {_time(read_at)}"


def why_nodeset(obj: Obj, decisions: Sequence[Decision]) -> str:
    """A NodeSet: its replicas against what is ready, its conditions and latest decisions."""
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    # Pods, not replicas: a scale-in keeps the pods it waits for, so there may be more.
    lines = [
        f"NodeSet {_key(obj)}: {spec.get('replicas', '?')} replicas wanted; "
        f"{status.get('currentNumberScheduled', 0)} pods, {status.get('numberReady', 0)} ready, "
        f"{status.get('updatedNumberScheduled', 0)} updated, "
        f"{status.get('numberDrain', 0)} draining, "
        f"{status.get('numberUnavailable', 0)} unavailable"
    ]
    lines.extend(_condition_line(c) for c in conditions(obj))
    return _with_decisions(lines, decisions)


def why_gang(obj: Obj, decisions: Sequence[Decision]) -> str:
    """A gang (PodGroup): its phase and members against minMember, its conditions, and the
    placer's latest decisions (the domain it could not find, in numbers)."""
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    lines = [
        f"PodGroup {_key(obj)}: {status.get('phase', 'no phase yet')}; "
        f"{status.get('scheduled', 0)} scheduled, {status.get('running', 0)} running of "
        f"minMember {spec.get('minMember', '?')}"
    ]
    lines.extend(_condition_line(c) for c in conditions(obj))
    return _with_decisions(lines, decisions)


def why_skyhook(obj: Obj, decisions: Sequence[Decision]) -> str:
    """A Skyhook or NodeWright: its status, paused or disabled as the controller reads it
    (its group's `pause`/`disable` annotation set to "true", as upstream since v0.8), its
    conditions and the latest stage and batch decisions (the node it waits on)."""
    names = flavor_of(str(obj.get("apiVersion") or ""), str(obj.get("kind") or "")) or SKYHOOK
    annotations = (obj.get("metadata") or {}).get("annotations") or {}
    status = obj.get("status") or {}
    state = status.get("status", "unknown")
    if str(annotations.get(names.pause_annotation, "")).lower() == "true":
        state = f"{state} (paused)"
    if str(annotations.get(names.disable_annotation, "")).lower() == "true":
        state = f"{state} (disabled)"
    lines = [
        f"{names.kind} {_key(obj)}: {state}; "
        f"{status.get('nodesInProgress', 0)} nodes in progress, "
        f"{status.get('completeNodes', '?')} complete"
    ]
    lines.extend(_condition_line(c) for c in conditions(obj))
    return _with_decisions(lines, decisions)
