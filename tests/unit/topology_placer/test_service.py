"""The service's sending rules, without NATS: a command is not re-published while its effect
is on its way, and a command refused before gets a new key when it is sent again (JetStream
would drop a repeat of the refused key as a duplicate)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from nodeflow_bus import OutgoingMessage
from nodeflow_contracts import codec
from nodeflow_contracts.k8s import CommandOutcome, K8sCommand
from topology_placer.commands import to_outgoing
from topology_placer.config import TopologyPlacerConfig
from topology_placer.planner import Bind
from topology_placer.pods import PodRef
from topology_placer.service import TopologyPlacer

NOW = 1_767_225_600.0


class RecordingBus:
    def __init__(self) -> None:
        self.sent: list[OutgoingMessage] = []

    async def publish_batch(self, messages: list[OutgoingMessage], **_: Any) -> list[Any]:
        self.sent.extend(messages)
        return []


@dataclass
class FakeMsg:
    data: bytes
    subject: str


def _placer(bus: RecordingBus) -> TopologyPlacer:
    config = TopologyPlacerConfig(instance_id="unit", in_flight_timeout_seconds=20.0)
    return TopologyPlacer(bus, config)  # type: ignore[arg-type]


async def test_a_command_is_not_republished_while_in_flight_and_is_after_the_timeout() -> None:
    bus = RecordingBus()
    placer = _placer(bus)
    outgoing = to_outgoing(Bind(PodRef("default", "w-0", "uid", "1"), "n1"), NOW)
    await placer.send(outgoing, NOW)
    await placer.send(outgoing, NOW + 1)
    assert len(bus.sent) == 1
    await placer.send(outgoing, NOW + 21)
    assert len(bus.sent) == 2


async def test_a_refused_command_gets_a_new_key_when_sent_again() -> None:
    bus = RecordingBus()
    placer = _placer(bus)
    outgoing = to_outgoing(Bind(PodRef("default", "w-0", "uid", "1"), "n1"), NOW)
    await placer.send(outgoing, NOW)
    first = bus.sent[0].message
    assert isinstance(first, K8sCommand)
    refused = CommandOutcome(
        idempotency_key=first.idempotency_key,
        op="bind",
        sender="topology-placer",
        target=first.target,
        outcome="conflict",
        sent_at=NOW,
        finished_at=NOW + 0.1,
    )
    await placer._on_outcome(FakeMsg(codec.encode(refused), refused.subject))  # type: ignore[arg-type]
    await placer.send(outgoing, NOW + 1)
    second = bus.sent[1].message
    assert isinstance(second, K8sCommand)
    assert second.idempotency_key == f"{first.idempotency_key}~1"
    assert bus.sent[1].msg_id == second.idempotency_key
