"""Pure helpers of the service: node facts, and when an eviction may be sent again."""

from __future__ import annotations

from maintenance_scheduler.service import Eviction, next_eviction_attempt, node_facts

T0 = 1_800_000_000.0


def test_rule_node_without_ready_condition_counts_as_ready() -> None:
    facts = node_facts({"metadata": {"name": "n1"}, "spec": {}, "status": {}})
    assert facts.ready and not facts.unschedulable
    not_ready = node_facts(
        {
            "metadata": {"name": "n1"},
            "spec": {"unschedulable": True},
            "status": {"conditions": [{"type": "Ready", "status": "Unknown"}]},
        }
    )
    assert not not_ready.ready and not_ready.unschedulable


def test_rule_no_second_eviction_while_one_is_in_flight() -> None:
    assert next_eviction_attempt(None, T0, 30) == 0
    in_flight = Eviction(attempt=0, sent_at=T0, key="k")
    assert next_eviction_attempt(in_flight, T0 + 10, 30) is None
    applied = Eviction(attempt=0, sent_at=T0, key="k", outcome="applied")
    assert next_eviction_attempt(applied, T0 + 10, 30) is None
    # Applied long ago and the pod still there: send again, with a new key.
    assert next_eviction_attempt(applied, T0 + 31, 30) == 1


def test_rule_refused_eviction_is_retried_after_backoff() -> None:
    refused = Eviction(attempt=2, sent_at=T0, key="k", outcome="failed", retry_at=T0 + 20)
    assert next_eviction_attempt(refused, T0 + 5, 30) is None
    assert next_eviction_attempt(refused, T0 + 20, 30) == 3
