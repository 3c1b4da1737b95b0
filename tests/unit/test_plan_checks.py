"""The plan assertions themselves: none of them can be satisfied by an empty plan."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from tests.unit.plan_checks import expect_actions, expect_no_actions


@dataclass(frozen=True)
class Evict:
    pod: str


@dataclass(frozen=True)
class Bind:
    pod: str


def test_rule_expect_actions_fails_on_an_empty_plan() -> None:
    with pytest.raises(AssertionError, match="no action at all"):
        expect_actions([], Evict)
    assert expect_actions([Evict("a"), Bind("b")], Evict, pod="a") == [Evict("a")]


def test_rule_expect_actions_refuses_count_zero() -> None:
    with pytest.raises(ValueError, match="expect_no_actions"):
        expect_actions([], Evict, count=0)


def test_rule_expect_no_actions_needs_the_plan_to_hold_something_else() -> None:
    with pytest.raises(AssertionError, match="proves nothing"):
        expect_no_actions([], Evict, while_it_has=Bind)
    with pytest.raises(AssertionError, match="expected no Evict"):
        expect_no_actions([Evict("a"), Bind("b")], Evict, while_it_has=Bind)
    expect_no_actions([Bind("b")], Evict, while_it_has=Bind)
