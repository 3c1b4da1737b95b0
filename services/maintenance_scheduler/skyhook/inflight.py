"""What the Skyhook controller's command ledger holds, as its rounds read it (pure).

Every command the controller sends holds slots in its ledger (`maintenance-scheduler-skyhook`,
docs/protocols.md "The command ledger") until its outcome says it never lands, or it applied
and the controller's view shows its effect, or its deadline plus the landing margin has
passed:

- a Skyhook status write (`SetSkyhookStatus`) and a node-state patch (`PatchNode`,
  `ForgetNode`) hold `skyhook:<name>`: while any of them may still land no round is planned.
  A plan on a view without them would write the node's state again (a patch with no
  precondition, which may land first and then be overwritten by the older one, rewinding the
  node's package state) or the status from before them, and would not count a node they
  start against the interruption budget. A new leader rebuilds these slots, so it waits for
  an earlier leader's writes the same way;
- a node-state patch also holds `node:<name>`: every Skyhook's round leaves that node alone
  (`World.settling`) until its patch is seen; so does a patch of the Skyhook's node
  conditions (`SetNodeConditions`, the node's status), so a round never decides them again
  on a view without them;
- every other command (a stage Job, a NodeMaintenance, a ConfigMap, a finalizer) holds
  `command:<idempotency key>`: it is not sent again while it may still land.
"""

from __future__ import annotations

from maintenance_scheduler.skyhook.plan import (
    ForgetNode,
    PatchNode,
    SetNodeConditions,
    SetSkyhookStatus,
    SkyhookAction,
)
from nodeflow_contracts.k8s import K8sCommand
from nodeflow_contracts.ledger import HeldSlots, node_slot

SKYHOOK_PREFIX = "skyhook:"
NODE_PREFIX = node_slot("")
COMMAND_PREFIX = "command:"


def skyhook_slot(name: str) -> str:
    return f"{SKYHOOK_PREFIX}{name}"


def slots_of(action: SkyhookAction, command: K8sCommand) -> tuple[str, ...]:
    """The slots `command`, sent for `action`, holds."""
    if isinstance(action, SetSkyhookStatus):
        return (skyhook_slot(action.skyhook.name),)
    if isinstance(action, PatchNode | ForgetNode):
        return (skyhook_slot(action.skyhook), node_slot(action.node.name))
    if isinstance(action, SetNodeConditions):
        return (node_slot(action.node.name),)
    return (f"{COMMAND_PREFIX}{command.idempotency_key}",)


def waiting_skyhooks(held: HeldSlots) -> frozenset[str]:
    """Skyhooks with a status write or node-state patch that may still land."""
    return frozenset(slot[len(SKYHOOK_PREFIX) :] for slot in held.with_prefix(SKYHOOK_PREFIX))


def settling_nodes(held: HeldSlots) -> frozenset[str]:
    """Nodes with a node-state patch that may still land."""
    return frozenset(slot[len(NODE_PREFIX) :] for slot in held.with_prefix(NODE_PREFIX))
