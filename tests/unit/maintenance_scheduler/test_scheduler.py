"""The scheduler's six steps (rule 1 of the maintenance-scheduler), its two worked examples,
and the safety property: never more than the slots or the unavailability budget, one
request per node."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from maintenance_scheduler.api import IntOrPercent, NodeMaintenance, OperatorConfig
from maintenance_scheduler.scheduler import (
    NodeInfo,
    pending_messages,
    rank,
    rank_order,
    schedule,
)
from tests.unit.maintenance_scheduler.builders import (
    T0,
    nm,
    node_info,
    node_owner,
    predecessor_owner,
)


def cluster(count: int, unavailable: int = 0) -> dict[str, NodeInfo]:
    return {f"n{i}": node_info(f"n{i}", unschedulable=i < unavailable) for i in range(count)}


def config(parallel: int | str = 1, unavailable: int | str | None = None) -> OperatorConfig:
    def limit(value: int | str) -> IntOrPercent:
        if isinstance(value, str):
            return IntOrPercent(int(value.rstrip("%")), percent=True)
        return IntOrPercent(value)

    return OperatorConfig(
        max_parallel_operations=limit(parallel),
        max_unavailable=None if unavailable is None else limit(unavailable),
    )


def test_rule_reference_example_1_parallel_operations_limit() -> None:
    nodes = cluster(10)
    pending = [nm(f"r{i}", f"n{i}", phase="Pending") for i in range(5)]
    result = schedule(nodes, pending, config(parallel=2, unavailable=5))
    assert len(result.scheduled) == 2
    assert result.slots == 2


def test_rule_reference_example_2_availability_limit() -> None:
    nodes = cluster(10, unavailable=2)
    pending = [nm(f"r{i}", f"n{i + 2}", phase="Pending") for i in range(3)]
    result = schedule(nodes, pending, config(parallel=5, unavailable=3))
    assert result.can_become_unavailable == 1
    assert len(result.scheduled) == 1
    assert {s.reason for s in result.skipped} == {"unavailability-budget"}


def test_rule_already_unavailable_node_spends_no_budget() -> None:
    nodes = cluster(10, unavailable=2)
    pending = [
        nm("a", "n0", phase="Pending"),
        nm("b", "n1", phase="Pending"),
        nm("c", "n5", phase="Pending"),
    ]
    result = schedule(nodes, pending, config(parallel=3, unavailable=3))
    assert result.can_become_unavailable == 1
    assert sorted(r.name for r in result.scheduled) == ["a", "b", "c"]


def test_rule_three_available_nodes_with_budget_one_schedules_one() -> None:
    pending = [nm(f"r{i}", f"n{i}", phase="Pending") for i in range(3)]
    result = schedule(cluster(10), pending, config(parallel=3, unavailable=1))
    assert len(result.scheduled) == 1


def test_rule_slots_subtract_nodes_under_maintenance() -> None:
    requests = [
        nm("busy", "n0", phase="Draining"),
        nm("a", "n1", phase="Pending"),
        nm("b", "n2", phase="Pending"),
    ]
    result = schedule(cluster(5), requests, config(parallel=2))
    assert result.slots == 1
    assert len(result.scheduled) == 1


def test_rule_max_parallel_operations_zero_means_no_limit() -> None:
    pending = [nm(f"r{i}", f"n{i}", phase="Pending") for i in range(4)]
    result = schedule(cluster(4), pending, config(parallel=0))
    assert result.parallel_limit is None
    assert len(result.scheduled) == 4


def test_rule_no_limit_lets_every_node_in_view_start_even_beside_an_absent_node() -> None:
    """maxParallelOperations 0 (no limit): every node in view that is not under maintenance
    may start. A request in progress on a node absent from the view (within the grace, so it
    still counts as under maintenance) holds its own node's slot, never one of the nodes in
    view: the slots were once the view's node count minus every node under maintenance."""
    requests = [nm("absent", "away", phase="Draining")]
    requests += [nm(f"r{i}", f"n{i}", phase="Pending") for i in range(3)]
    result = schedule(cluster(3), requests, config(parallel=0))
    assert result.under_maintenance == 1
    assert result.slots == 3
    assert sorted(r.name for r in result.scheduled) == ["r0", "r1", "r2"]


def test_rule_max_parallel_operations_percent_rounds_up() -> None:
    assert config(parallel="10%").parallel_limit(11) == 2
    pending = [nm(f"r{i}", f"n{i}", phase="Pending") for i in range(5)]
    assert len(schedule(cluster(11), pending, config(parallel="10%")).scheduled) == 2


def test_rule_max_unavailable_percent_rounds_down() -> None:
    assert config(unavailable="10%").unavailable_limit(19) == 1
    pending = [nm(f"r{i}", f"n{i}", phase="Pending") for i in range(5)]
    result = schedule(cluster(19), pending, config(parallel=5, unavailable="10%"))
    assert len(result.scheduled) == 1


def test_rule_max_unavailable_unset_is_no_limit() -> None:
    pending = [nm(f"r{i}", f"n{i}", phase="Pending") for i in range(5)]
    result = schedule(cluster(5, unavailable=5), pending, config(parallel=5))
    assert len(result.scheduled) == 5


def test_rule_max_unavailable_zero_keeps_available_nodes_available() -> None:
    pending = [nm("a", "n0", phase="Pending"), nm("b", "n3", phase="Pending")]
    result = schedule(cluster(5, unavailable=1), pending, config(parallel=5, unavailable=0))
    assert [r.name for r in result.scheduled] == ["a"]


def test_rule_not_ready_node_counts_as_unavailable() -> None:
    nodes = {"n0": node_info("n0", ready=False), "n1": node_info("n1")}
    result = schedule(nodes, [], config(parallel=2, unavailable=1))
    assert result.unavailable_nodes == 1
    assert result.can_become_unavailable == 0


def test_rule_node_under_maintenance_is_not_a_candidate() -> None:
    requests = [nm("busy", "n0", phase="Cordon"), nm("second", "n0", phase="Pending")]
    result = schedule(cluster(3), requests, config(parallel=3))
    assert result.scheduled == []
    assert [s.reason for s in result.skipped] == ["node-busy"]


def test_rule_one_request_per_node_highest_ranked_wins() -> None:
    requests = [
        nm("newer", "n0", phase="Pending", created=T0 + 10),
        nm("older", "n0", phase="Pending", created=T0),
    ]
    result = schedule(cluster(3), requests, config(parallel=3))
    assert [r.name for r in result.scheduled] == ["older"]


def test_rule_request_for_missing_node_is_not_scheduled() -> None:
    result = schedule(cluster(2), [nm("x", "ghost", phase="Pending")], config(parallel=2))
    assert result.scheduled == []
    assert result.skipped[0].reason == "node-not-found"


def test_rule_rank_prefers_requestor_with_request_in_progress() -> None:
    requests = [
        nm("running", "n0", requestor="a.example.com", phase="Draining"),
        nm("a2", "n1", requestor="a.example.com", phase="Pending", created=T0 + 50),
        nm("b1", "n2", requestor="b.example.com", phase="Pending", created=T0),
    ]
    result = schedule(cluster(5), requests, config(parallel=2))
    assert [r.name for r in result.scheduled] == ["a2"]


def test_rule_rank_prefers_requestor_with_fewer_pending() -> None:
    many = [nm(f"m{i}", f"n{i}", requestor="many.example.com", phase="Pending") for i in range(3)]
    few = nm("f", "n9", requestor="few.example.com", phase="Pending", created=T0 + 99)
    pending: Counter[str] = Counter({"many.example.com": 3, "few.example.com": 1})
    assert rank(few, set(), pending) == 99
    assert rank(many[0], set(), pending) == 97
    result = schedule(cluster(10), [*many, few], config(parallel=1))
    assert [r.name for r in result.scheduled] == ["f"]


def test_rule_rank_pending_count_floors_at_zero() -> None:
    request = nm("r", "n0", phase="Pending")
    assert rank(request, set(), Counter({request.requestor_id: 250})) == 0
    assert rank(request, {request.requestor_id}, Counter({request.requestor_id: 250})) == 1000


def test_rule_rank_ties_older_first_then_node_requestor_name() -> None:
    requests = [
        nm("z", "n2", phase="Pending", created=T0),
        nm("y", "n1", phase="Pending", created=T0),
        nm("old", "n9", phase="Pending", created=T0 - 1),
    ]
    ordered = rank_order(requests, set(), Counter({"team.example.com": 3}))
    assert [r.name for r in ordered] == ["old", "y", "z"]


def test_rule_skipped_request_does_not_use_a_slot() -> None:
    nodes = {"a": node_info("a"), "b": node_info("b"), "c": node_info("c", unschedulable=True)}
    requests = [
        nm("ra", "a", phase="Pending", created=T0),
        nm("rb", "b", phase="Pending", created=T0 + 1),
        nm("rc", "c", phase="Pending", created=T0 + 2),
    ]
    result = schedule(nodes, requests, config(parallel=2, unavailable=2))
    assert [r.name for r in result.scheduled] == ["ra", "rc"]


# --- the safety property --------------------------------------------------------------------

PHASES = ("Pending", "Pending", "Pending", "Scheduled", "Cordon", "Draining", "Ready")


@st.composite
def clusters(draw: st.DrawFn) -> tuple[dict[str, NodeInfo], list[NodeMaintenance], OperatorConfig]:
    count = draw(st.integers(min_value=1, max_value=30))
    nodes = {
        f"n{i}": node_info(f"n{i}", unschedulable=draw(st.booleans()), ready=draw(st.booleans()))
        for i in range(count)
    }
    names = [*nodes, "ghost"]
    requests = []
    for i in range(draw(st.integers(0, 40))):
        target = draw(st.sampled_from(names))
        requests.append(
            nm(
                f"r{i}",
                target,
                requestor=draw(st.sampled_from(["a.x.com", "b.x.com", "c.x.com"])),
                phase=draw(st.sampled_from(PHASES)),
                created=T0 + draw(st.integers(0, 100)),
                # Made for the node of that name, or for one it replaced (another uid).
                owners=(draw(st.sampled_from([node_owner(target), predecessor_owner(target)])),),
            )
        )
    parallel = draw(st.one_of(st.integers(0, 10), st.integers(0, 100).map(lambda p: f"{p}%")))
    unavailable = draw(
        st.one_of(st.none(), st.integers(0, 10), st.integers(0, 100).map(lambda p: f"{p}%"))
    )
    return nodes, requests, config(parallel, unavailable)


@settings(max_examples=200, deadline=None)
@given(clusters())
def test_rule_property_scheduled_set_respects_slots_budget_and_one_per_node(
    case: tuple[dict[str, NodeInfo], list[NodeMaintenance], OperatorConfig],
) -> None:
    nodes, requests, cfg = case
    result = schedule(nodes, requests, cfg)
    scheduled_nodes = [r.node_name for r in result.scheduled]
    assert len(result.scheduled) <= result.slots
    became_unavailable = [n for n in scheduled_nodes if not nodes[n].unavailable]
    assert len(became_unavailable) <= result.can_become_unavailable
    assert len(set(scheduled_nodes)) == len(scheduled_nodes)
    # Only a request whose node (the one it was made for) exists holds a slot.
    in_progress = {
        r.node_name
        for r in requests
        if r.in_progress and r.node_name in nodes and r.meant_for(nodes[r.node_name].uid)
    }
    assert not in_progress & set(scheduled_nodes)
    assert all(r.meant_for(nodes[r.node_name].uid) for r in result.scheduled)
    assert all(r.phase == "Pending" for r in result.scheduled)
    limit = cfg.parallel_limit(len(nodes))
    if limit is not None:
        assert len(in_progress) + len(result.scheduled) <= max(limit, len(in_progress))
    cap = cfg.unavailable_limit(len(nodes))
    if cap is not None and became_unavailable:
        unavailable_after = {n for n, info in nodes.items() if info.unavailable} | (
            in_progress & nodes.keys()
        )
        assert len(unavailable_after) + len(became_unavailable) <= cap


def test_rule_request_on_a_deleted_node_holds_no_slot() -> None:
    """With the default maxParallelOperations 1, a Ready request whose node was deleted (kept by
    its additionalRequestors, say) must not stop every new maintenance: upstream's preSchedule
    counts only requests whose node exists (here: absent from the view for the grace)."""
    requests = [
        nm("decommissioned", "gone", phase="Ready", finalizer=True, deleting=True),
        nm("next", "n1", phase="Pending"),
    ]
    result = schedule(cluster(2), requests, config(parallel=1), absent_past_grace={"gone"})
    assert [r.name for r in result.scheduled] == ["next"]
    assert result.under_maintenance == 0


def test_rule_request_made_for_a_replaced_node_is_not_scheduled_and_holds_no_slot() -> None:
    """Node n0 was replaced by a new n0 (another uid): a request made for the old one neither
    starts on the newcomer nor holds a slot."""
    before = (predecessor_owner("n0"),)
    requests = [
        nm("old-draining", "n0", phase="Draining", finalizer=True, owners=before),
        nm("old-pending", "n0", phase="Pending", owners=before, created=T0 - 10),
        nm("other", "n1", phase="Pending"),
    ]
    result = schedule(cluster(2), requests, config(parallel=1))
    assert [r.name for r in result.scheduled] == ["other"]
    assert [(s.request.name, s.reason) for s in result.skipped] == [
        ("old-pending", "node-not-found")
    ]


# --- Issue #35: the Pending message names the budget that holds the request ----------------


def test_rule_pending_message_names_the_max_parallel_operations_budget() -> None:
    """Two slots, both in use: the third request waits, and says for which budget."""
    nodes = cluster(5)
    busy = [nm(f"b{i}", f"n{i}", phase="Draining", finalizer=True) for i in range(2)]
    waiting = nm("w", "n3", phase="Pending")
    result = schedule(nodes, [*busy, waiting], config(parallel=2))
    assert result.scheduled == []
    assert pending_messages(result) == {
        waiting.uid: "waiting for a slot: 2 of 2 maxParallelOperations in progress"
    }


def test_rule_pending_message_names_the_max_unavailable_budget() -> None:
    nodes = cluster(10, unavailable=3)
    waiting = nm("w", "n5", phase="Pending")
    result = schedule(nodes, [waiting], config(parallel=5, unavailable=3))
    assert pending_messages(result) == {
        waiting.uid: "waiting for the unavailability budget: 3 of 3 maxUnavailable nodes "
        "unavailable, and node n5 would become unavailable"
    }


def test_rule_pending_message_leaves_a_missing_node_to_reconcile() -> None:
    result = schedule(cluster(2), [nm("w", "ghost", phase="Pending")], config(parallel=2))
    assert [s.reason for s in result.skipped] == ["node-not-found"]
    assert pending_messages(result) == {}
