"""Slurm node JSON -> SlurmNodeState, the derived states, and what a poll changes."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nodeflow_contracts.slurm import BASE_STATES, FLAGS
from slurm_syncer.nodestate import (
    MalformedNode,
    apply_poll,
    derive,
    parse_node,
    same_state,
    split_state,
    unknown_state,
)


def raw(name: str = "n1", state: Any = ("IDLE",), reason: str = "", **extra: Any) -> dict[str, Any]:
    return {"name": name, "state": list(state), "reason": reason, **extra}


@pytest.mark.parametrize(
    ("words", "base", "flags"),
    [
        (["IDLE"], "Idle", ()),
        (["ALLOCATED", "DRAIN"], "Allocated", ("Drain",)),
        (["MIXED", "COMPLETING", "DRAIN"], "Mixed", ("Completing", "Drain")),
        (["DOWN", "NOT_RESPONDING", "DYNAMIC_NORM"], "Down", ("NotResponding",)),
        (["IDLE", "DRAIN", "UNDRAIN"], "Idle", ("Drain", "Undrain")),
        (["future", "INVALID_REG", "MAINTENANCE", "FAIL", "INVALID"], "Future",
         ("Fail", "Invalid", "InvalidReg", "Maintenance")),
        (["ERROR"], "Error", ()),
        (["UNKNOWN"], "Unknown", ()),
        (["DRAIN"], "Unknown", ("Drain",)),
        ([], "Unknown", ()),
        (["PLANNED", "CLOUD"], "Unknown", ()),
    ],
)  # fmt: skip
def test_split_state_maps_slurm_words_to_the_reference_names(
    words: list[str], base: str, flags: tuple[str, ...]
) -> None:
    assert split_state(words) == (base, flags)


@given(st.sampled_from(BASE_STATES), st.sets(st.sampled_from(FLAGS)))
def test_derived_states_follow_the_reference_definitions(base: str, flags: set[str]) -> None:
    derived = derive(base, flags)
    assert derived.busy == (base in ("Allocated", "Mixed") or "Completing" in flags)
    assert derived.drain == ("Drain" in flags and "Undrain" not in flags)
    assert derived.drained == (derived.drain and not derived.busy)
    assert derived.draining == (derived.drain and derived.busy)
    assert not (derived.drained and derived.draining)


def test_parse_node_reads_numbers_reason_and_ownership() -> None:
    state = parse_node(
        "a",
        raw(
            state=["MIXED", "DRAIN"],
            reason="nodeflow: cordon: x",
            cpus=8,
            alloc_cpus=4,
            reason_set_by_user="slurm",
            reason_changed_at={"set": True, "infinite": False, "number": 1700000000},
        ),
        observed_at=5.0,
    )
    assert state.known and state.base_state == "Mixed" and state.flags == ("Drain",)
    assert (state.cpus, state.alloc_cpus) == (8, 4)
    assert state.reason_is_ours and state.reason_set_by == "slurm"
    assert state.reason_changed_at == 1700000000.0
    assert state.draining and not state.drained and state.busy and state.drain
    assert state.key == "a.n1"


def test_a_leftover_reason_after_undrain_counts_as_no_reason() -> None:
    # Slurm 24.11.5 keeps the reason after UNDRAIN/RESUME; only the flag counts.
    idle = parse_node("a", raw(state=["IDLE"], reason="admin: old", reason_set_by_user="root"), 0)
    assert idle.reason == "" and idle.reason_set_by == "" and not idle.reason_is_ours
    down = parse_node("a", raw(state=["DOWN", "NOT_RESPONDING"], reason="Not responding"), 0)
    assert down.reason == "Not responding"
    failed = parse_node("a", raw(state=["IDLE", "FAIL"], reason="gpu xid"), 0)
    assert failed.reason == "gpu xid"


@pytest.mark.parametrize(
    "entry",
    [
        {"state": ["IDLE"]},
        {"name": "", "state": ["IDLE"]},
        {"name": "n1", "state": ["IDLE", "DRAIN", 3]},
        {"name": "n1"},
        {"name": "n1", "state": ["IDLE"], "reason": 5},
    ],
)
def test_malformed_entries_are_refused(entry: dict[str, Any]) -> None:
    with pytest.raises(MalformedNode):
        parse_node("a", entry, 0)


def test_a_single_string_state_is_accepted() -> None:
    assert parse_node("a", {"name": "n1", "state": "IDLE"}, 0).base_state == "Idle"


def test_unknown_state_is_never_drained_or_busy() -> None:
    state = unknown_state("a", "n1", 3.0)
    assert not state.known and state.base_state == "Unknown"
    assert not (state.busy or state.drain or state.drained or state.draining)


def test_same_state_ignores_only_the_observation_time() -> None:
    a = parse_node("a", raw(), 1.0)
    assert same_state(a, parse_node("a", raw(), 2.0))
    assert not same_state(a, parse_node("a", raw(state=["ALLOCATED"]), 1.0))
    assert not same_state(a, None) and same_state(None, None)


def test_apply_poll_reports_changes_removals_and_nothing_at_steady_state() -> None:
    first = apply_poll("a", {}, [raw("n1"), raw("n2")], 1.0)
    assert [s.name for s in first.changed] == ["n1", "n2"] and first.removed == []
    steady = apply_poll("a", first.states, [raw("n1"), raw("n2")], 2.0)
    assert steady.changed == [] and steady.removed == []
    changed = apply_poll("a", steady.states, [raw("n1", state=["ALLOCATED"])], 3.0)
    assert [s.name for s in changed.changed] == ["n1"] and changed.removed == ["n2"]


def test_a_failed_poll_makes_every_node_unknown_and_forgets_none() -> None:
    known = apply_poll("a", {}, [raw("n1", state=["IDLE", "DRAIN"], reason="nodeflow: x")], 1.0)
    failed = apply_poll("a", known.states, None, 2.0)
    assert list(failed.states) == ["n1"] and failed.removed == []
    assert not failed.states["n1"].known and not failed.states["n1"].drained
    assert [s.name for s in failed.changed] == ["n1"]
    again = apply_poll("a", failed.states, None, 3.0)
    assert again.changed == []  # still unknown: nothing new to publish


def test_a_malformed_entry_makes_that_node_unknown_and_is_reported() -> None:
    outcome = apply_poll("a", {}, [raw("n1"), {"name": "n2", "state": 7}, {"x": 1}], 1.0)
    assert outcome.states["n1"].known and not outcome.states["n2"].known
    assert len(outcome.malformed) == 2


def test_rule_nodes_read_one_by_one_after_the_listing_was_sent_keep_that_newer_state() -> None:
    listed = apply_poll("a", {}, [raw("n1", state=["ALLOCATED"]), raw("n2"), raw("n3")], 1.0)
    drained = parse_node("a", raw("n1", state=["ALLOCATED", "DRAIN"], reason="nodeflow: x"), 2.0)
    previous = {**listed.states, "n1": drained}
    del previous["n3"]  # read back as gone from Slurm
    late = apply_poll(
        "a",
        previous,
        [raw("n1", state=["ALLOCATED"]), raw("n2", state=["ALLOCATED"]), raw("n3")],
        1.5,
        read_since_listing={"n1", "n3"},
    )
    assert late.states["n1"] is drained and "n3" not in late.states
    assert [s.name for s in late.changed] == ["n2"] and late.removed == []


def test_rule_an_entry_whose_name_is_not_a_string_is_malformed_even_beside_read_backs() -> None:
    outcome = apply_poll(
        "a", {}, [raw("n1"), {"name": ["x"], "state": ["IDLE"]}], 1.0, read_since_listing={"n2"}
    )
    assert outcome.states["n1"].known and len(outcome.malformed) == 1


class _Recording(dict[str, Any]):
    """A node entry that records which of its fields are read."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.read: set[str] = set()

    def get(self, key: str, default: Any = None) -> Any:
        self.read.add(key)
        return super().get(key, default)

    def __getitem__(self, key: str) -> Any:
        self.read.add(key)
        return super().__getitem__(key)


def test_rule_a_node_listing_keeps_every_field_the_state_is_read_from() -> None:
    """The client decodes of each listed node only the fields of `_ListedNode`; parse_node
    must read none other, or a listed node would lose what it says (a field added to one
    and not the other fails here)."""
    from slurm_syncer.client import _ListedNode

    whole = _Recording(
        name="n1",
        state=["IDLE", "DRAIN"],
        reason="nodeflow: test",
        reason_set_by_user="slurm",
        reason_changed_at={"set": True, "infinite": False, "number": 1700000000},
        cpus=64,
        alloc_cpus=0,
        reservation="nodeflow-ns-a-20261201T020000Z",
        architecture="x86_64",
        gres="gpu:8",
    )
    state = parse_node("a", whole, 1.0)
    assert state.reservation == "nodeflow-ns-a-20261201T020000Z"
    assert whole.read <= set(_ListedNode.__struct_fields__)
    listed = {key: whole[key] for key in _ListedNode.__struct_fields__}
    assert parse_node("a", listed, 1.0) == state
