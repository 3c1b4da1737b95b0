"""The NOT_RESPONDING confirmation rule (nodestate.settle_not_responding, apply_poll).

The reads below are what Slurm 24.11.5 showed through slurmrestd: after an UNDRAIN or RESUME
`["IDLE", "NOT_RESPONDING"]` for 0.2-0.8 s, then `["IDLE"]`; after slurmd stopped,
`["IDLE", "NOT_RESPONDING"]` about 20 s later, then `["DOWN", "NOT_RESPONDING"]` with the reason
"Not responding" at SlurmdTimeout.
"""

from __future__ import annotations

from typing import Any

from nodeflow_contracts.slurm import SlurmNodeState
from slurm_syncer.nodestate import (
    apply_poll,
    parse_node,
    settle_not_responding,
    unknown_state,
    with_unconfirmed_not_responding,
)

CONFIRM = 3.0


def read(at: float, *state: str, reason: str = "", name: str = "n1") -> SlurmNodeState:
    return parse_node("c", {"name": name, "state": list(state), "reason": reason}, at)


def raw(*state: str, reason: str = "", name: str = "n1") -> dict[str, Any]:
    return {"name": name, "state": list(state), "reason": reason}


def test_rule_a_first_sighting_of_not_responding_is_not_reported_yet() -> None:
    reported = read(0.0, "IDLE")
    settled = settle_not_responding(read(10.0, "IDLE", "NOT_RESPONDING"), reported, None, CONFIRM)
    assert settled.state.flags == ()
    assert settled.state.base_state == "Idle"
    assert settled.not_responding_since == 10.0


def test_rule_not_responding_gone_on_the_next_read_is_never_reported() -> None:
    """The UNDRAIN blip: flagged on the read right after the update, clear 0.3 s later."""
    first = settle_not_responding(
        read(10.0, "IDLE", "NOT_RESPONDING"), read(9.0, "IDLE", "DRAIN"), None, CONFIRM
    )
    second = settle_not_responding(
        read(10.3, "IDLE"), first.state, first.not_responding_since, CONFIRM
    )
    assert "NotResponding" not in first.state.flags
    assert second.state.flags == ()
    assert second.not_responding_since is None


def test_rule_not_responding_seen_for_the_confirmation_time_is_reported() -> None:
    first = settle_not_responding(
        read(10.0, "IDLE", "NOT_RESPONDING"), read(5.0, "IDLE"), None, CONFIRM
    )
    early = settle_not_responding(read(12.9, "IDLE", "NOT_RESPONDING"), first.state, 10.0, CONFIRM)
    confirmed = settle_not_responding(
        read(13.0, "IDLE", "NOT_RESPONDING"), early.state, 10.0, CONFIRM
    )
    assert early.state.flags == ()
    assert confirmed.state.flags == ("NotResponding",)
    assert confirmed.not_responding_since == 10.0


def test_rule_once_reported_not_responding_stays_reported_while_seen() -> None:
    """A restart loads the reported state from KV with no `since`: no flap back to Idle."""
    reported = read(0.0, "IDLE", "NOT_RESPONDING")
    settled = settle_not_responding(read(100.0, "IDLE", "NOT_RESPONDING"), reported, None, CONFIRM)
    assert settled.state.flags == ("NotResponding",)


def test_rule_a_read_without_the_flag_restarts_the_confirmation() -> None:
    first = settle_not_responding(read(10.0, "IDLE", "NOT_RESPONDING"), None, None, CONFIRM)
    clear = settle_not_responding(
        read(11.0, "IDLE"), first.state, first.not_responding_since, CONFIRM
    )
    again = settle_not_responding(
        read(14.0, "IDLE", "NOT_RESPONDING"), clear.state, clear.not_responding_since, CONFIRM
    )
    assert again.state.flags == ()
    assert again.not_responding_since == 14.0


def test_rule_down_drain_and_reason_are_reported_at_once_only_the_flag_waits() -> None:
    settled = settle_not_responding(
        read(10.0, "DOWN", "DRAIN", "NOT_RESPONDING", reason="nodeflow: x : Not responding"),
        read(9.0, "IDLE", "DRAIN", reason="nodeflow: x"),
        None,
        CONFIRM,
    )
    assert settled.state.base_state == "Down"
    assert settled.state.flags == ("Drain",)
    assert settled.state.reason == "nodeflow: x : Not responding"
    assert settled.state.drained


def test_rule_a_zero_confirmation_time_reports_at_once() -> None:
    settled = settle_not_responding(read(10.0, "IDLE", "NOT_RESPONDING"), None, None, 0.0)
    assert settled.state.flags == ("NotResponding",)


def test_apply_poll_holds_the_undrain_blip_back_and_reports_no_change_for_it() -> None:
    drained = {"n1": read(0.0, "IDLE", "DRAIN", reason="nodeflow: delete: x")}
    # The read-back after our UNDRAIN showed the flag: the syncer kept the state without it.
    blip = apply_poll("c", drained, [raw("IDLE", "NOT_RESPONDING")], 1.0, {}, CONFIRM)
    assert [s.flags for s in blip.changed] == [()]
    assert blip.not_responding_since == {"n1": 1.0}
    after = apply_poll("c", blip.states, [raw("IDLE")], 1.5, blip.not_responding_since, CONFIRM)
    assert after.changed == []
    assert after.not_responding_since == {}


def test_apply_poll_reports_a_node_that_really_stopped_responding() -> None:
    idle = {"n1": read(0.0, "IDLE")}
    first = apply_poll("c", idle, [raw("IDLE", "NOT_RESPONDING")], 20.0, {}, CONFIRM)
    assert first.changed == []
    second = apply_poll(
        "c",
        first.states,
        [raw("IDLE", "NOT_RESPONDING")],
        25.0,
        first.not_responding_since,
        CONFIRM,
    )
    assert [s.flags for s in second.changed] == [("NotResponding",)]
    down = apply_poll(
        "c",
        second.states,
        [raw("DOWN", "NOT_RESPONDING", reason="Not responding")],
        35.0,
        second.not_responding_since,
        CONFIRM,
    )
    assert [(s.base_state, s.flags) for s in down.changed] == [("Down", ("NotResponding",))]


def test_apply_poll_unknown_handling_is_unchanged_by_the_rule() -> None:
    failed = apply_poll("c", {"n1": read(0.0, "IDLE")}, None, 1.0, {"n1": 0.5}, CONFIRM)
    assert failed.states["n1"] == unknown_state("c", "n1", 1.0)
    assert failed.not_responding_since == {}


def test_drain_decisions_still_see_an_unconfirmed_not_responding() -> None:
    held_back = settle_not_responding(
        read(10.0, "IDLE", "DRAIN", "NOT_RESPONDING"), None, None, CONFIRM
    )
    as_read = with_unconfirmed_not_responding(held_back.state, seen_not_responding=True)
    assert as_read is not None and as_read.flags == ("Drain", "NotResponding")
    assert with_unconfirmed_not_responding(held_back.state, False) == held_back.state
    assert with_unconfirmed_not_responding(None, True) is None
