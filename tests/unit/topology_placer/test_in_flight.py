"""The placer's commands that may still land (its command ledger, inflight.py) as the plan
reads them: a gang with a command on its way is left as it is and its nominations on their
way keep their nodes; the slots each command holds read back as the same value."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from nodeflow_contracts.ledger import HeldSlots, LedgerEntry
from tests.unit.topology_placer.builders import TOPOLOGY, pod, pod_group, reference_nodes
from tests.unit.topology_placer.simulate import state
from topology_placer.commands import to_outgoing
from topology_placer.config import TopologyPlacerConfig
from topology_placer.gang import GroupKey
from topology_placer.inflight import InFlight, in_flight_of, slots_of
from topology_placer.planner import (
    Bind,
    MarkUnschedulable,
    Nominate,
    plan,
)
from topology_placer.pods import PodRef

NOW = 1_767_225_600.0


def _nominated(result: Any, group: str) -> dict[str, str]:
    return {
        a.pod.name: a.node
        for a in result.actions
        if isinstance(a, Nominate) and a.pod.name.startswith(f"{group}-")
    }


def test_rule_a_gang_with_a_command_in_flight_gets_no_new_nomination() -> None:
    # A MarkUnschedulable patch of a-0 may still land: nominating now would go out on a
    # resourceVersion the patch is about to change (a 409), or place the gang twice.
    gang = [pod(f"a-{i}", "a", gpus=8) for i in range(2)]
    groups = [pod_group("a", 2)]
    free = plan(state(reference_nodes(), gang, groups, topology=TOPOLOGY))
    assert len(_nominated(free, "a")) == 2
    held = InFlight(pods=frozenset({("default", "a-0")}))
    result = plan(
        replace(state(reference_nodes(), gang, groups, topology=TOPOLOGY), in_flight=held)
    )
    pod_actions = [a for a in result.actions if isinstance(a, Nominate | Bind | MarkUnschedulable)]
    assert pod_actions == []
    assert result.gang_states["default/a"] == "in-flight"


def test_rule_a_held_gang_slot_stops_the_whole_gang() -> None:
    gang = [pod(f"a-{i}", "a", gpus=8) for i in range(2)]
    held = InFlight(gangs=frozenset({GroupKey("default", "a")}))
    cluster = state(reference_nodes(), gang, [pod_group("a", 2)], topology=TOPOLOGY)
    result = plan(replace(cluster, in_flight=held))
    assert _nominated(result, "a") == {}


def test_rule_nominations_in_flight_keep_their_nodes_from_other_gangs() -> None:
    # Gang a's nominations to node1 and node2 are on their way (KV does not show them yet):
    # gang b must not be placed there.
    a = [pod(f"a-{i}", "a", gpus=8) for i in range(2)]
    b = [pod(f"b-{i}", "b", gpus=8) for i in range(2)]
    groups = [pod_group("a", 2), pod_group("b", 2)]
    blind = plan(state(reference_nodes(), a + b, groups, topology=TOPOLOGY))
    taken = set(_nominated(blind, "a").values())
    held = InFlight(
        pods=frozenset({("default", "a-0"), ("default", "a-1")}),
        gangs=frozenset({GroupKey("default", "a")}),
        nominations={("default", f"a-{i}"): node for i, node in enumerate(sorted(taken))},
    )
    result = plan(
        replace(state(reference_nodes(), a + b, groups, topology=TOPOLOGY), in_flight=held)
    )
    b_nodes = set(_nominated(result, "b").values())
    assert len(b_nodes) == 2
    assert b_nodes.isdisjoint(taken)
    assert _nominated(result, "a") == {}


def test_the_slots_a_command_holds_read_back_as_what_is_in_flight() -> None:
    ref = PodRef("default", "a-0", "uid-a-0", "7")
    (nomination,) = to_outgoing(Nominate(ref, "node3"), NOW)
    assert nomination.command is not None
    slots = slots_of(nomination.command, GroupKey("default", "a"))
    (bind,) = to_outgoing(Bind(PodRef("default", "b-0", "uid-b-0", "2"), "node4"), NOW)
    assert bind.command is not None
    bind_slots = slots_of(bind.command, None)
    entry = LedgerEntry.of(nomination.command, slots)
    held = HeldSlots({slot: (entry,) for slot in (*slots, *bind_slots)})
    in_flight = in_flight_of(held)
    assert in_flight.pods == {("default", "a-0"), ("default", "b-0")}
    assert in_flight.gangs == {GroupKey("default", "a")}
    assert in_flight.nominations == {("default", "a-0"): "node3"}


def test_rule_a_hold_shorter_than_the_command_lifetime_is_refused_at_start() -> None:
    with pytest.raises(ValueError, match="in_flight_timeout_seconds"):
        TopologyPlacerConfig(instance_id="unit", in_flight_timeout_seconds=20.0)
    TopologyPlacerConfig(instance_id="unit", in_flight_timeout_seconds=30.0)
