"""`nodeflow_bus_ledger_entries` counts what the ledger holds at each scrape, including after
the controller released (`release_seen`) or expired (`expire`) entries on the ledger itself,
which once left the gauge at its last value from a send or an outcome."""

from __future__ import annotations

from typing import cast

from prometheus_client import REGISTRY

from nodeflow_bus import Bus
from nodeflow_bus.ledger import LedgerSender
from nodeflow_contracts.k8s import CommandOutcome, ObjectRef
from nodeflow_contracts.ledger import CommandLedger, LedgerEntry

SENDER = "gauge-test"


def _entries() -> float | None:
    return REGISTRY.get_sample_value("nodeflow_bus_ledger_entries", {"ledger": SENDER})


def _entry(key: str, sent_at: float) -> LedgerEntry:
    return LedgerEntry(
        idempotency_key=key,
        slots=(f"pod:ns/{key}",),
        target=ObjectRef(api_version="v1", kind="Pod", name=key, namespace="ns"),
        op="patch",
        sent_at=sent_at,
        expires_at=sent_at + 10.0,
    )


def test_rule_the_ledger_entries_gauge_follows_release_seen_and_expire() -> None:
    sender = LedgerSender(cast(Bus, None), ledger=SENDER, sender=SENDER, max_lifetime=10.0)
    ledger = CommandLedger(SENDER, max_lifetime=10.0)
    applied, unanswered = _entry("a", 100.0), _entry("b", 100.0)
    ledger.record(applied)
    ledger.record(unanswered)
    sender.adopt(ledger)
    assert _entries() == 2
    sender.settle(
        CommandOutcome(
            idempotency_key="a",
            op="patch",
            sender=SENDER,
            target=applied.target,
            outcome="applied",
            sent_at=100.0,
            finished_at=101.0,
            resource_version="5",
        )
    )
    assert _entries() == 2  # applied, not yet seen: still held
    assert sender.ledger.release_seen(lambda entry, outcome, rv: True) == 1
    assert _entries() == 1
    sender.ledger.expire(now=1000.0)
    assert _entries() == 0
