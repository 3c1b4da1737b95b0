"""Rules of the maintenance scheduler that mutation testing (`make mutate`, issue 37) found no
test held. Each was seen failing with its rule broken (the mutant named in docs/testing.md's
figures)."""

from __future__ import annotations

from maintenance_scheduler.api import IntOrPercent, OperatorConfig
from maintenance_scheduler.scheduler import NodeInfo, pending_messages, schedule
from tests.unit.maintenance_scheduler.builders import nm, node_info

UNLIMITED = OperatorConfig(max_parallel_operations=IntOrPercent(0), max_unavailable=None)


def _nodes(count: int) -> dict[str, NodeInfo]:
    return {f"n{i}": node_info(f"n{i}") for i in range(count)}


def test_rule_a_pending_request_being_deleted_or_invalid_is_never_scheduled() -> None:
    """Only a Pending request that is neither being deleted nor invalid is a candidate: the
    two others on free nodes stay where they are, the valid one beside them starts."""
    requests = [
        nm("deleting", "n0", phase="Pending", deleting=True, finalizer=True),
        nm("invalid", "n1", phase="Pending", requestorID=""),
        nm("valid", "n2", phase="Pending"),
    ]
    assert requests[1].problems
    result = schedule(_nodes(3), requests, UNLIMITED)
    assert [r.name for r in result.scheduled] == ["valid"]


def test_rule_unlimited_parallel_operations_leave_one_slot_per_node_not_under_maintenance() -> None:
    """With maxParallelOperations unset (0), the slots are the nodes not under maintenance:
    three nodes, one under maintenance, two slots; every node under maintenance, none (never
    fewer: a request in progress on a node the view lacks still counts as under
    maintenance)."""
    one_busy = schedule(_nodes(3), [nm("a", "n0", phase="Scheduled")], UNLIMITED)
    assert one_busy.slots == 2
    all_busy = [
        nm("a", "n0", phase="Scheduled"),
        nm("b", "n1", phase="Scheduled"),
        nm("c", "absent", phase="Scheduled"),
    ]
    result = schedule(_nodes(2), all_busy, UNLIMITED)
    assert (result.under_maintenance, result.slots) == (3, 0)


def _limit(parallel: int) -> OperatorConfig:
    return OperatorConfig(max_parallel_operations=IntOrPercent(parallel), max_unavailable=None)


def test_rule_the_lower_ranked_request_on_a_node_says_which_goes_first() -> None:
    """Two Pending requests on one node: the older starts, the newer is skipped as node-busy
    and its Pending message says a higher-ranked request on the node goes first."""
    older = nm("older", "n0", phase="Pending", created=1.0)
    newer = nm("newer", "n0", phase="Pending", created=2.0)
    result = schedule(_nodes(3), [newer, older], _limit(3))
    assert [r.name for r in result.scheduled] == ["older"]
    assert pending_messages(result) == {newer.uid: "a higher-ranked request on node n0 goes first"}


def test_rule_a_request_waiting_for_a_slot_counts_those_started_this_round() -> None:
    """Two slots, one node under maintenance: the first Pending request takes the free slot
    this round, and the next one says both are in use (2 of 2), counting the one just
    started."""
    busy = nm("busy", "n0", phase="Draining", finalizer=True)
    first = nm("first", "n1", phase="Pending", created=1.0)
    second = nm("second", "n2", phase="Pending", created=2.0)
    result = schedule(_nodes(4), [busy, first, second], _limit(2))
    assert [r.name for r in result.scheduled] == ["first"]
    assert pending_messages(result) == {
        second.uid: "waiting for a slot: 2 of 2 maxParallelOperations in progress"
    }


def test_rule_a_request_waiting_for_the_budget_counts_the_node_made_unavailable_this_round() -> (
    None
):
    """maxUnavailable 1, no node unavailable: the first request's node takes the budget this
    round, and the next one's message counts it (1 of 1 unavailable)."""
    config = OperatorConfig(
        max_parallel_operations=IntOrPercent(3), max_unavailable=IntOrPercent(1)
    )
    first = nm("first", "n0", phase="Pending", created=1.0)
    second = nm("second", "n1", phase="Pending", created=2.0)
    result = schedule(_nodes(4), [first, second], config)
    assert [r.name for r in result.scheduled] == ["first"]
    assert pending_messages(result) == {
        second.uid: "waiting for the unavailability budget: 1 of 1 maxUnavailable nodes "
        "unavailable, and node n1 would become unavailable"
    }
