"""The service's sending rules, without NATS: a pod's command holds the pod in the command
ledger while it may still land, so no second command on that pod goes out (in a later pass
or the same one), and a command refused before gets a new key when it is sent again
(JetStream would drop a repeat of the refused key as a duplicate)."""

from __future__ import annotations

import gc
from types import SimpleNamespace
from typing import Any, cast

from nodeflow_bus import BusOptions, OutgoingMessage
from nodeflow_contracts.k8s import CommandOutcome, K8sCommand
from nodeflow_contracts.ledger import CommandLedger, LedgerRecord
from topology_placer.commands import COMMAND_LIFETIME_SECONDS, SENDER
from topology_placer.config import TopologyPlacerConfig
from topology_placer.planner import Bind, MarkUnschedulable, Nominate
from topology_placer.pods import PodRef
from topology_placer.service import HEAP_REFREEZE_SECONDS, TopologyPlacer

NOW = 1_767_225_600.0


class RecordingBus:
    options = BusOptions()

    def __init__(self) -> None:
        self.sent: list[OutgoingMessage] = []
        self.records: list[LedgerRecord] = []

    async def publish(self, subject: str, message: Any, **_: Any) -> None:
        assert isinstance(message, LedgerRecord)
        self.records.append(message)

    async def publish_batch(self, messages: list[OutgoingMessage], **_: Any) -> list[Any]:
        self.sent.extend(messages)
        return []


def _placer(bus: RecordingBus, *, freeze_heap: bool = False) -> TopologyPlacer:
    placer = TopologyPlacer(
        bus,  # type: ignore[arg-type]
        TopologyPlacerConfig(instance_id="unit"),
        freeze_heap=freeze_heap,
    )
    placer.lease = cast(Any, SimpleNamespace(is_leader=True))  # the ledger asks it per send
    # As after a rebuild that found nothing held.
    placer.ledger.adopt(CommandLedger(SENDER, max_lifetime=COMMAND_LIFETIME_SECONDS))
    return placer


def _commands(bus: RecordingBus) -> list[K8sCommand]:
    return [m.message for m in bus.sent if isinstance(m.message, K8sCommand)]


def _outcome(command: K8sCommand, result: str) -> CommandOutcome:
    return CommandOutcome(
        idempotency_key=command.idempotency_key,
        op=command.op,
        sender=SENDER,
        target=command.target,
        outcome=result,  # type: ignore[arg-type]
        sent_at=command.sent_at,
        finished_at=command.sent_at + 0.1,
    )


POD = PodRef("default", "w-0", "uid", "1")


async def test_rule_a_pod_command_is_not_sent_again_while_it_may_still_land() -> None:
    bus = RecordingBus()
    placer = _placer(bus)
    await placer.send([Bind(POD, "n1")], NOW)
    # The record naming what it holds is stored before the command goes out.
    assert [e.slots for r in bus.records for e in r.entries] == [("pod:default/w-0",)]
    await placer.send([Bind(POD, "n1")], NOW + 1)
    # A command with no outcome may land until its deadline and the landing margin.
    await placer.send([Bind(POD, "n1")], NOW + COMMAND_LIFETIME_SECONDS + 39)
    assert len(_commands(bus)) == 1
    await placer.send([Bind(POD, "n1")], NOW + COMMAND_LIFETIME_SECONDS + 41)
    assert len(_commands(bus)) == 2


async def test_rule_a_nomination_waits_for_the_status_patch_of_its_pod_in_the_same_pass() -> None:
    # The nomination carries the pod's resourceVersion, which the patch is about to change:
    # sent together, the nomination would be refused with a conflict.
    bus = RecordingBus()
    placer = _placer(bus)
    mark = MarkUnschedulable(POD, "Unschedulable", "waiting", "2026-01-01T00:00:00Z")
    await placer.send([mark, Nominate(POD, "n1")], NOW)
    assert [c.op for c in _commands(bus)] == ["patch"]


async def test_a_refused_command_frees_its_pod_and_gets_a_new_key_when_sent_again() -> None:
    bus = RecordingBus()
    placer = _placer(bus)
    await placer.send([Bind(POD, "n1")], NOW)
    first = _commands(bus)[0]
    placer.ledger.settle(_outcome(first, "conflict"))
    await placer.send([Bind(POD, "n1")], NOW + 1)
    second = _commands(bus)[1]
    assert second.idempotency_key == f"{first.idempotency_key}~1"
    assert bus.sent[1].msg_id == second.msg_id


async def test_rule_the_service_freezes_its_long_lived_heap_after_a_pass() -> None:
    """The service's process (freeze_heap, as setup() makes it) moves its heap (the views,
    the memoised facts) out of the collector's reach after a pass, so a full collection does
    not walk the whole cluster view during every pass; it is collected whole and frozen again
    only after HEAP_REFREEZE_SECONDS."""
    gc.unfreeze()
    try:
        placer = _placer(RecordingBus(), freeze_heap=True)
        assert gc.get_freeze_count() == 0
        await placer.run_pass()
        assert gc.get_freeze_count() > 0
        frozen_at = placer.heap_frozen_at
        assert frozen_at is not None
        await placer.run_pass()
        assert placer.heap_frozen_at == frozen_at
        placer.heap_frozen_at = frozen_at - HEAP_REFREEZE_SECONDS
        await placer.run_pass()
        assert placer.heap_frozen_at is not None and placer.heap_frozen_at > frozen_at
    finally:
        gc.unfreeze()


async def test_a_placer_sharing_a_process_leaves_the_collector_alone() -> None:
    # Tests and the in-process benchmark stack run a placer beside everything else.
    gc.unfreeze()
    placer = _placer(RecordingBus())
    await placer.run_pass()
    assert gc.get_freeze_count() == 0
    assert placer.heap_frozen_at is None
