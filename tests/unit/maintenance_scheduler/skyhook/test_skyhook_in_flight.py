"""The slots the Skyhook controller's commands hold in its command ledger (skyhook/inflight.py)
and what a round reads of them: a status write or node-state patch holds its Skyhook (no
round while it may land), a node-state patch also its node (left alone), any other command
itself (not sent again)."""

from __future__ import annotations

from maintenance_scheduler.skyhook.api import parse_skyhook
from maintenance_scheduler.skyhook.commands import commands_for
from maintenance_scheduler.skyhook.inflight import settling_nodes, slots_of, waiting_skyhooks
from maintenance_scheduler.skyhook.observe import node_view
from maintenance_scheduler.skyhook.plan import (
    CreateMaintenance,
    PatchNode,
    SetNodeConditions,
    SetSkyhookStatus,
    SkyhookAction,
)
from nodeflow_contracts.k8s import ObjectRef
from nodeflow_contracts.ledger import HeldSlots, LedgerEntry

NOW = 1_767_225_600.0
SKYHOOK = parse_skyhook(
    {
        "apiVersion": "skyhook.nvidia.com/v1alpha1",
        "kind": "Skyhook",
        "metadata": {"name": "rebooter", "uid": "uid-s", "resourceVersion": "3"},
        "spec": {"packages": {"kernel": {"version": "1.0.0", "image": "registry.local/k"}}},
    }
)
NODE = node_view({"metadata": {"name": "n1", "uid": "uid-n1", "resourceVersion": "7"}})
NODE_REF = ObjectRef(api_version="v1", kind="Node", name="n1")


def _slots(action: SkyhookAction) -> tuple[str, ...]:
    (command,) = commands_for(
        action,
        NOW,
        namespace="skyhook",
        default_stage_timeout_seconds=600,
        drain_timeout_seconds=600,
    )
    return slots_of(action, command)


def test_rule_status_writes_and_node_patches_hold_their_skyhook_and_node() -> None:
    status = _slots(SetSkyhookStatus(SKYHOOK, {"status": "in_progress"}))
    patch = _slots(PatchNode("rebooter", NODE, "{}", "in_progress"))
    assert status == ("skyhook:rebooter",)
    assert patch == ("skyhook:rebooter", "node:n1")
    entry = LedgerEntry(
        idempotency_key="k",
        slots=patch,
        target=NODE_REF,
        op="patch",
        sent_at=NOW,
        expires_at=NOW + 60,
    )
    held = HeldSlots({slot: (entry,) for slot in patch})
    assert waiting_skyhooks(held) == {"rebooter"}
    assert settling_nodes(held) == {"n1"}


def test_rule_a_node_conditions_patch_holds_its_node_until_seen() -> None:
    """Rounds leave the node alone while its conditions may still land, so they are not
    decided again (and sent again) on a view without them."""
    condition = {"type": "skyhook.nvidia.com/rebooter/NotReady", "status": "True"}
    slots = _slots(SetNodeConditions("rebooter", NODE, (condition,)))
    assert slots == ("node:n1",)
    held = HeldSlots({slot: () for slot in slots})
    assert settling_nodes(held) == {"n1"} and waiting_skyhooks(held) == frozenset()


def test_any_other_command_holds_only_itself() -> None:
    slots = _slots(CreateMaintenance(SKYHOOK, "n1", "rebooter-n1", "kernel|1.0.0"))
    assert len(slots) == 1 and slots[0].startswith("command:skyhook:nm:")
    held = HeldSlots({slots[0]: ()})
    assert waiting_skyhooks(held) == frozenset()
    assert settling_nodes(held) == frozenset()
