"""One round of the service (`MaintenanceScheduler.round`) over in-memory views, its commands
caught instead of sent, and outcomes handed to it as k8s-watcher would publish them: what
the service keeps between rounds while a command is on its way.

The caught command ledger records stand for COMMAND_LEDGER: a new leader starts from the
ledger they rebuild (`rebuilt_ledger`, what `LedgerSender.rebuild` does with what it reads
from NATS: tests/integration/bus/test_command_ledger.py)."""

from __future__ import annotations

from collections.abc import Mapping
from types import SimpleNamespace
from typing import Any, cast

from nats.aio.msg import Msg

from maintenance_scheduler import SERVICE
from maintenance_scheduler.commands import COMMAND_LIFETIME_SECONDS, SENDER
from maintenance_scheduler.config import MaintenanceSchedulerConfig
from maintenance_scheduler.service import MaintenanceScheduler
from nodeflow_bus import Bus, BusOptions, OutgoingMessage
from nodeflow_contracts import codec
from nodeflow_contracts.k8s import CommandOutcome, K8sCommand, Outcome, UpdateStatus
from nodeflow_contracts.ledger import (
    LANDING_MARGIN_SECONDS,
    CommandLedger,
    LedgerRecord,
    rebuilt_ledger,
)
from tests.unit.maintenance_scheduler.builders import nm_object

T0 = 1_800_000_000.0


class DictView:
    """What the service reads of a KVView."""

    def __init__(self, values: Mapping[str, Any] | None = None) -> None:
        self.values = dict(values or {})

    def items(self) -> list[tuple[str, Any]]:
        return list(self.values.items())

    def get(self, key: str) -> Any:
        return self.values.get(key)

    def as_dict(self) -> dict[str, Any]:
        return dict(self.values)


class CaughtCommands:
    def __init__(self) -> None:
        # As a real bus: the service's LeaderLease reads its options.
        self.options = BusOptions()
        self.sent: list[OutgoingMessage] = []
        # The command ledger's records (COMMAND_LEDGER) and the outcomes told.
        self.records: list[LedgerRecord] = []
        self.outcomes: list[CommandOutcome] = []

    async def publish(self, subject: str, message: Any, *, msg_id: str | None = None) -> None:
        assert isinstance(message, LedgerRecord), subject
        self.records.append(message)

    async def publish_batch(self, messages: list[OutgoingMessage], **_: Any) -> list[Any]:
        self.sent.extend(messages)
        return []

    def scheduled(self) -> list[K8sCommand]:
        """The Scheduled status writes caught since the last call."""
        found = [
            m.message
            for m in self.sent
            if isinstance(m.message, K8sCommand)
            and m.message.op == "update-status"
            and "Scheduled" in m.message.reason
        ]
        self.sent.clear()
        return found


def node(name: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "uid": f"uid-{name}", "resourceVersion": "5"},
        "spec": {},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }


def leading(bus: CaughtCommands, *, since: float | None = None) -> MaintenanceScheduler:
    """A service that leads: with an empty ledger, or (`since`) one that took the lead at
    that time from whoever sent what `bus` caught."""
    service = MaintenanceScheduler(cast(Bus, bus), MaintenanceSchedulerConfig())
    service.lease = cast(Any, SimpleNamespace(is_leader=True))  # the ledger asks it per send
    if since is None:
        ledger = CommandLedger(SENDER, max_lifetime=COMMAND_LIFETIME_SECONDS)
    else:
        ledger = rebuilt_ledger(
            SENDER,
            SERVICE,
            bus.records,
            bus.outcomes,
            since,
            max_lifetime=COMMAND_LIFETIME_SECONDS,
        )
    service.ledger.adopt(ledger)
    return service


async def tell(
    service: MaintenanceScheduler, command: K8sCommand, outcome: Outcome, attempt: int = 1
) -> None:
    report = CommandOutcome(
        idempotency_key=command.idempotency_key,
        op=command.op,
        sender=command.sender,
        target=command.target,
        outcome=outcome,
        attempt=attempt,
        sent_at=command.sent_at,
        finished_at=command.sent_at + 1,
    )
    if isinstance(service.bus, CaughtCommands):
        service.bus.outcomes.append(report)
    message = SimpleNamespace(data=codec.encode(report), subject=report.subject)
    await service.ledger.handle_outcome(cast(Msg, message))


async def test_rule_a_scheduling_still_retried_holds_its_slot_until_its_command_expires() -> None:
    """maxParallelOperations 2, one request already Ready: request a is scheduled and its
    write keeps being retried by k8s-watcher (the API server answers 429) until the command's
    60 s deadline. Request c, arriving meanwhile, must not take a's slot while that write may
    still land (until the deadline plus the landing margin): both would be in maintenance,
    three against a limit of two."""
    bus = CaughtCommands()
    service = leading(bus)
    ready = nm_object("x", "n9", requestor="r3.example.com", phase="Ready", finalizer=True)
    first = nm_object("a", "n1", requestor="r1.example.com", phase="Pending")
    service.requests = DictView({"default.x": ready, "default.a": first})  # type: ignore[assignment]
    service.nodes = DictView({f"_.{n}": node(n) for n in ("n1", "n3", "n9")})  # type: ignore[assignment]
    service.configs = DictView(  # type: ignore[assignment]
        {
            "nodeflow-system.default": {
                "metadata": {"name": "default", "namespace": "nodeflow-system"},
                "spec": {"maxParallelOperations": 2},
            }
        }
    )
    service.clusters = DictView()  # type: ignore[assignment]
    await service.round(T0)
    (write,) = bus.scheduled()
    assert write.target.name == "a"
    service.requests.values["default.c"] = nm_object(  # type: ignore[attr-defined]
        "c", "n3", requestor="r2.example.com", phase="Pending"
    )
    last_landing = COMMAND_LIFETIME_SECONDS + LANDING_MARGIN_SECONDS
    for seconds in (10.0, 31.0, 59.0, 90.0, last_landing):
        if seconds < 60.0:
            await tell(service, write, "retrying")
        await service.round(T0 + seconds)
        assert bus.scheduled() == [], f"c took a's slot {seconds:.0f} s after a was scheduled"
    # The landing margin past the deadline the write can no longer land: the slot is free.
    await service.round(T0 + last_landing + 1.0)
    assert [w.target.name for w in bus.scheduled()] == ["a"]


async def test_rule_a_new_leader_keeps_the_slot_of_an_earlier_leaders_scheduling() -> None:
    """maxParallelOperations 2 across a handover, one slot taken by request x (Ready, of
    requestor r2): leader A schedules request a (r1) and stops (a helm upgrade) before its
    write lands; leader B takes over at once and request c of r2 arrives (r2 has a request
    in progress: c ranks before a). B's ledger, rebuilt from A's records, holds a's slot: c
    is not scheduled while a's write may land (x, a and c would be three against two), nor
    is a scheduled twice."""
    bus = CaughtCommands()
    first = leading(bus)
    views: dict[str, Any] = {
        "default.x": nm_object(
            "x", "n9", requestor="r2.example.com", phase="Ready", finalizer=True
        ),
        "default.a": nm_object("a", "n1", requestor="r1.example.com", phase="Pending"),
    }
    first.requests = DictView(views)  # type: ignore[assignment]
    first.nodes = DictView({f"_.{n}": node(n) for n in ("n1", "n3", "n9")})  # type: ignore[assignment]
    first.configs = DictView(  # type: ignore[assignment]
        {
            "nodeflow-system.default": {
                "metadata": {"name": "default", "namespace": "nodeflow-system"},
                "spec": {"maxParallelOperations": 2},
            }
        }
    )
    first.clusters = DictView()  # type: ignore[assignment]
    await first.round(T0)
    (write,) = bus.scheduled()
    assert write.target.name == "a"

    second = leading(bus, since=T0 + 1.0)
    views["default.c"] = nm_object("c", "n3", requestor="r2.example.com", phase="Pending")
    second.requests = DictView(views)  # type: ignore[assignment]
    second.nodes = first.nodes
    second.configs = first.configs
    second.clusters = first.clusters
    for seconds in (1.0, 5.0, 30.0):
        await second.round(T0 + seconds)
        assert [w.target.name for w in bus.scheduled()] == [], seconds


async def test_rule_a_scheduling_frees_its_slot_at_once_only_when_its_write_cannot_land() -> None:
    """Refused by the API server, or expired before it was ever sent: the slot is free for
    the next round. Failed after an unanswered attempt, or expired after one: the write may
    still land, so the slot stays held."""
    cases: tuple[tuple[Outcome, int, bool], ...] = (
        ("conflict", 1, True),
        ("expired", 1, True),
        ("failed", 3, False),
        ("expired", 2, False),
    )
    for outcome, attempt, freed in cases:
        bus = CaughtCommands()
        service = leading(bus)
        service.requests = DictView(  # type: ignore[assignment]
            {
                "default.a": nm_object("a", "n1", requestor="r1.example.com", phase="Pending"),
                "default.b": nm_object("b", "n2", requestor="r2.example.com", phase="Pending"),
            }
        )
        service.nodes = DictView({f"_.{n}": node(n) for n in ("n1", "n2")})  # type: ignore[assignment]
        service.configs = DictView()  # type: ignore[assignment]
        service.clusters = DictView()  # type: ignore[assignment]
        await service.round(T0)
        (write,) = bus.scheduled()
        await tell(service, write, outcome, attempt=attempt)
        await service.round(T0 + 2.0)
        assert bool(bus.scheduled()) == freed, (outcome, attempt)


def service_with(
    requests: Mapping[str, Any], nodes: tuple[str, ...], spec: Mapping[str, Any] | None = None
) -> tuple[MaintenanceScheduler, CaughtCommands]:
    bus = CaughtCommands()
    service = leading(bus)
    service.requests = DictView(requests)  # type: ignore[assignment]
    service.nodes = DictView({f"_.{n}": node(n) for n in nodes})  # type: ignore[assignment]
    configs = {}
    if spec is not None:
        configs["nodeflow-system.default"] = {
            "metadata": {
                "name": "default",
                "namespace": "nodeflow-system",
                "uid": "uid-config",
                "resourceVersion": "3",
            },
            "spec": dict(spec),
        }
    service.configs = DictView(configs)  # type: ignore[assignment]
    service.clusters = DictView()  # type: ignore[assignment]
    return service, bus


async def test_rule_a_request_on_a_deleted_node_frees_its_slot_and_its_finalizer() -> None:
    """Default config (one operation at a time): node n9 of a Ready request kept by its
    additionalRequestors was deleted, and so was the request. The request loses its
    finalizer and the next request, on n1, is scheduled in the round that finds n9 absent for
    NODE_GONE_GRACE_SECONDS; before that, the request keeps both."""
    stuck = nm_object(
        "x",
        "n9",
        phase="Ready",
        finalizer=True,
        deleting=True,
        additionalRequestors=["other.example.com"],
    )
    waiting = nm_object("a", "n1", requestor="r1.example.com", phase="Pending")
    service, bus = service_with({"default.x": stuck, "default.a": waiting}, ("n1",))
    await service.round(T0)
    assert not [
        m for m in bus.sent if isinstance(m.message, K8sCommand) and m.message.op == "patch"
    ]
    assert bus.scheduled() == []
    await service.round(T0 + service.config.node_gone_grace_seconds)
    commands = [m.message for m in bus.sent if isinstance(m.message, K8sCommand)]
    scheduled = [c for c in commands if c.op == "update-status" and "Scheduled" in c.reason]
    assert [c.target.name for c in scheduled] == ["a"]
    assert any(
        c.target.name == "x" and c.op == "patch" and "finalizers" in c.reason for c in commands
    )


async def test_rule_max_parallel_operations_zero_warns_on_the_config_once() -> None:
    requests = {
        f"default.r{i}": nm_object(f"r{i}", f"n{i}", requestor=f"r{i}.example.com", phase="Pending")
        for i in range(3)
    }
    service, bus = service_with(requests, ("n0", "n1", "n2"), {"maxParallelOperations": 0})
    await service.round(T0)
    events = [
        m.message
        for m in bus.sent
        if isinstance(m.message, K8sCommand)
        and m.message.target.kind == "MaintenanceOperatorConfig"
    ]
    (event,) = events
    assert event.op == "record-event" and "schedules nothing" in event.reason
    # 0 keeps its documented meaning: no limit.
    assert len(bus.scheduled()) == 3
    await service.round(T0 + 1)
    assert not [
        m
        for m in bus.sent
        if isinstance(m.message, K8sCommand)
        and m.message.target.kind == "MaintenanceOperatorConfig"
    ]


async def test_rule_pending_message_names_the_budget_in_the_status_written() -> None:
    """Issue #35: a request the scheduler skips gets the budget that holds it as its Ready
    condition's message, through the service's round (the scheduler's skip -> reconcile)."""
    bus = CaughtCommands()
    service = leading(bus)
    busy = nm_object("x", "n9", requestor="r3.example.com", phase="Draining", finalizer=True)
    waiting = nm_object("a", "n1", requestor="r1.example.com", phase="Pending")
    service.requests = DictView({"default.x": busy, "default.a": waiting})  # type: ignore[assignment]
    service.nodes = DictView({f"_.{n}": node(n) for n in ("n1", "n9")})  # type: ignore[assignment]
    service.configs = DictView(  # type: ignore[assignment]
        {
            "nodeflow-system.default": {
                "metadata": {"name": "default", "namespace": "nodeflow-system"},
                "spec": {"maxParallelOperations": 1},
            }
        }
    )
    service.clusters = DictView()  # type: ignore[assignment]
    await service.round(T0)
    writes = [
        m.message
        for m in bus.sent
        if isinstance(m.message, K8sCommand)
        and m.message.op == "update-status"
        and m.message.target.name == "a"
    ]
    (write,) = writes
    assert isinstance(write.operation, UpdateStatus)
    (ready,) = [c for c in write.operation.status["conditions"] if c["type"] == "Ready"]
    assert ready["reason"] == "Pending"
    assert ready["message"] == "waiting for a slot: 1 of 1 maxParallelOperations in progress"
