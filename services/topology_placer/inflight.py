"""What the placer's command ledger holds, as the planner reads it (pure).

Every pod command the placer sends (nomination, bind, PodScheduled or DisruptionTarget
patch, delete) holds its pod's slot (`pod:<ns>/<name>`) until it can no longer land or KV
shows its effect (docs/protocols.md, "The command ledger"). A nomination or bind of a gang
member also holds its PodGroup's slot (`gang:<ns>/<name>`): a gang's nominations and binds
go out all together or not at all, so while any of them may still land the gang is left as
it is. A nomination to a node also holds `placer-nomination:<ns>/<name>=<node>`, so the
node's room stays charged with it before KV shows it -- across a leader change too, since a
new leader rebuilds the same slots from COMMAND_LEDGER. PodGroup and ClusterNetworkTopology
status writes, and a claim's selected-node annotation, hold `status:<kind>:<ns>/<name>`, so one
is not re-sent while on its way.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from nodeflow_contracts.k8s import K8sCommand, NominatePod
from nodeflow_contracts.ledger import HeldSlots, gang_slot, pod_slot
from topology_placer.gang import GroupKey

NOMINATION_PREFIX = "placer-nomination:"
STATUS_PREFIX = "status:"
POD_PREFIX = pod_slot("", "").removesuffix("/")
GANG_PREFIX = gang_slot("", "").removesuffix("/")

PodKey = tuple[str, str]


@dataclass(frozen=True)
class InFlight:
    """The placer's commands that may still land, at the start of a pass."""

    # Pods (namespace, name) with a command that may still land.
    pods: frozenset[PodKey] = frozenset()
    # PodGroups with a nomination or bind of a member that may still land.
    gangs: frozenset[GroupKey] = frozenset()
    # Pod -> the node a nomination that may still land reserves for it.
    nominations: Mapping[PodKey, str] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.pods or self.gangs)


def nomination_slot(namespace: str, name: str, node: str) -> str:
    return f"{NOMINATION_PREFIX}{namespace}/{name}={node}"


def status_slot(kind: str, namespace: str | None, name: str) -> str:
    return f"{STATUS_PREFIX}{kind}:{namespace or ''}/{name}"


def slots_of(command: K8sCommand, group: GroupKey | None) -> tuple[str, ...]:
    """The slots `command` holds; `group` is the PodGroup of the pod it targets, if any.
    An Event holds none."""
    target = command.target
    if command.op == "record-event":
        return ()
    if target.kind != "Pod":
        return (status_slot(target.kind, target.namespace, target.name),)
    namespace = target.namespace or ""
    slots = [pod_slot(namespace, target.name)]
    if command.op in ("nominate", "bind") and group is not None:
        slots.append(gang_slot(group.namespace, group.name))
    operation = command.operation
    if isinstance(operation, NominatePod) and operation.node_name:
        slots.append(nomination_slot(namespace, target.name, operation.node_name))
    return tuple(slots)


def _split(rest: str) -> PodKey:
    namespace, _, name = rest.partition("/")
    return namespace, name


def in_flight_of(held: HeldSlots) -> InFlight:
    """What the planner reads of the slots held."""
    pods: set[PodKey] = set()
    gangs: set[GroupKey] = set()
    nominations: dict[PodKey, str] = {}
    for slot in held:
        if slot.startswith(POD_PREFIX):
            pods.add(_split(slot[len(POD_PREFIX) :]))
        elif slot.startswith(GANG_PREFIX):
            gangs.add(GroupKey(*_split(slot[len(GANG_PREFIX) :])))
        elif slot.startswith(NOMINATION_PREFIX):
            pod, _, node = slot[len(NOMINATION_PREFIX) :].rpartition("=")
            nominations[_split(pod)] = node
    return InFlight(frozenset(pods), frozenset(gangs), nominations)
