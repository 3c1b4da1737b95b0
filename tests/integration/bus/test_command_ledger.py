"""The command ledger on a real nats-server (nodeflow_bus.ledger): a new leader rebuilds
from COMMAND_LEDGER and COMMAND_OUTCOMES every command an earlier leader sent that may
still land, and plans nothing while it cannot read them (fail closed)."""

from __future__ import annotations

import time

import msgspec

from nodeflow_bus import Bus, ensure_topology
from nodeflow_bus.ledger import LedgerNotReady, LedgerSender, Sending
from nodeflow_contracts.k8s import (
    CommandOutcome,
    K8sCommand,
    ObjectRef,
    PatchObject,
    deadline_after,
)
from nodeflow_contracts.ledger import LANDING_MARGIN_SECONDS
from nodeflow_runtime.natsd import NatsServerProcess
from tests.fixtures.nats import TEST_BUS_OPTIONS
from tests.fixtures.waiting import eventually

SENDER = "nodeset-controller"
LIFETIME = 20.0


def patch(name: str, now: float) -> K8sCommand:
    return K8sCommand(
        idempotency_key=f"mark-{name}",
        sender=SENDER,
        sent_at=now,
        expires_at=deadline_after(LIFETIME, now=now),
        target=ObjectRef(api_version="v1", kind="Pod", name=name, namespace="ns"),
        operation=PatchObject(patch_type="merge", patch={"metadata": {"labels": {"x": "y"}}}),
    )


def outcome_of(command: K8sCommand, result: str) -> CommandOutcome:
    return CommandOutcome(
        idempotency_key=command.idempotency_key,
        op=command.op,
        sender=command.sender,
        target=command.target,
        outcome=result,  # type: ignore[arg-type]
        sent_at=command.sent_at,
        finished_at=time.time(),
    )


def sender(bus: Bus) -> LedgerSender:
    return LedgerSender(bus, ledger=SENDER, sender=SENDER, max_lifetime=LIFETIME)


async def test_a_new_leader_knows_what_an_earlier_leader_sent_that_may_still_land(
    bus: Bus, nats_server: NatsServerProcess
) -> None:
    await ensure_topology(bus.js)
    old = sender(bus)
    old.on_leadership(True)
    await eventually(lambda: old.ready)
    now = time.time()
    pending, refused, unslotted = patch("a", now), patch("b", now), patch("c", now)
    await old.send(
        [
            Sending(pending, ("pod:ns/a", "nodeset-budget:ns/set")),
            Sending(refused, ("pod:ns/b", "nodeset-budget:ns/other")),
            Sending(unslotted),
        ]
    )
    # k8s-watcher refused one: it can never land. The other has no outcome yet.
    conflict = outcome_of(refused, "conflict")
    await bus.publish(conflict.subject, conflict, msg_id=conflict.msg_id)
    old.on_leadership(False)
    await old.stop()

    successor_bus = await Bus.connect(nats_server.url, options=TEST_BUS_OPTIONS)
    try:
        new = sender(successor_bus)
        assert not new.ready
        new.on_leadership(True)
        await eventually(lambda: new.ready)
        held = new.ledger.held(time.time())
        assert "nodeset-budget:ns/set" in held
        assert "pod:ns/a" in held
        assert "nodeset-budget:ns/other" not in held
        assert "pod:ns/b" not in held
        # An outcome arriving now settles the rebuilt entry.
        applied = outcome_of(pending, "failed")
        new.settle(applied)
        assert new.ledger.holds("nodeset-budget:ns/set", time.time())
        await new.stop()
    finally:
        await successor_bus.close()


async def test_rule_the_rebuild_window_covers_a_sender_with_a_longer_lifetime_than_the_reader(
    bus: Bus,
) -> None:
    """An upgrade that lowers the command lifetime: the new leader reads a fixed window, not
    one derived from its own lifetime, so it still holds what the older leader sent with a
    longer life."""
    await ensure_topology(bus.js)
    long_life = 600.0
    older = LedgerSender(bus, ledger=SENDER, sender=SENDER, max_lifetime=long_life)
    older.on_leadership(True)
    await eventually(lambda: older.ready)
    sent_at = time.time()
    command = msgspec.structs.replace(
        patch("long", sent_at), expires_at=deadline_after(long_life, now=sent_at)
    )
    await older.send([Sending(command, ("pod:ns/long",))])
    await older.stop()

    newer = sender(bus)  # lifetime LIFETIME, far below the earlier leader's
    # The new leader takes over well past its own lifetime plus margin, while the earlier
    # command may still land.
    later = sent_at + 5 * (LIFETIME + LANDING_MARGIN_SECONDS)
    assert later < sent_at + long_life
    await newer.rebuild(now=later)
    assert newer.ready
    assert "pod:ns/long" in newer.ledger.held(later)
    await newer.stop()


async def test_rule_a_new_leaders_resend_of_a_key_and_its_outcome_are_not_dropped_as_duplicates(
    bus: Bus, nats_server: NatsServerProcess
) -> None:
    """Within JetStream's duplicate window, a new leader sends a key again once the first send
    can never land; the resend and its outcome (the same outcome, same attempt) are stored."""
    await ensure_topology(bus.js)
    first_leader = sender(bus)
    first_leader.on_leadership(True)
    await eventually(lambda: first_leader.ready)
    first = patch("again", time.time())
    await first_leader.send([Sending(first, ("pod:ns/again",))])
    refused = outcome_of(first, "expired")  # expired before k8s-watcher sent it: never lands
    await bus.publish(refused.subject, refused, msg_id=refused.msg_id)
    await first_leader.stop()

    successor_bus = await Bus.connect(nats_server.url, options=TEST_BUS_OPTIONS)
    try:
        second_leader = sender(successor_bus)
        second_leader.on_leadership(True)
        await eventually(lambda: second_leader.ready)
        assert "pod:ns/again" not in second_leader.ledger.held(time.time())
        resend = patch("again", time.time())
        assert resend.idempotency_key == first.idempotency_key
        await second_leader.send([Sending(resend, ("pod:ns/again",))])
        again = outcome_of(resend, "expired")
        await successor_bus.publish(again.subject, again, msg_id=again.msg_id)
        await second_leader.stop()
    finally:
        await successor_bus.close()

    commands = await bus.js.stream_info("K8S_COMMANDS", subjects_filter=first.subject)
    assert (commands.state.subjects or {}).get(first.subject) == 2
    outcomes = await bus.js.stream_info("COMMAND_OUTCOMES", subjects_filter=refused.subject)
    assert (outcomes.state.subjects or {}).get(refused.subject) == 2


async def test_a_leader_that_cannot_read_its_ledger_sends_nothing_and_retries(
    bus: Bus, nats_server: NatsServerProcess
) -> None:
    await ensure_topology(bus.js)
    leader = sender(bus)
    try:
        await nats_server.kill()
        leader.on_leadership(True)
        before = int(metrics_failed())
        await eventually(lambda: metrics_failed() > before, timeout=30)
        assert not leader.ready
        try:
            await leader.send([Sending(patch("a", time.time()), ("pod:ns/a",))])
        except LedgerNotReady:
            pass
        else:
            raise AssertionError("a leader without its ledger sent a command")
        await nats_server.start()
        await eventually(lambda: leader.ready, timeout=60)
    finally:
        await leader.stop()


def metrics_failed() -> float:
    from nodeflow_bus import metrics

    return float(metrics.LEDGER_REBUILDS.labels(SENDER, "failed")._value.get())
