"""Rule 6 (scale-down order) and rule 7 (rolling update selection under maxUnavailable)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nodeset_controller.podstate import (
    POD_DEADLINE_ANNOTATION,
    POD_DELETION_COST_ANNOTATION,
    PodState,
)
from nodeset_controller.ranking import (
    choose_rolling_replacements,
    count_unavailable,
    rank_reason,
    scale_down_order,
    scale_down_rank,
)
from tests.unit.nodeset_controller.builders import T0, pod, slurm, state

SCALING = "ScalingDeleteScheduled"


def ranked(name: str, **kwargs: object) -> PodState:
    slurm_kwargs = {k: kwargs.pop(k) for k in ("busy", "drain", "known") if k in kwargs}
    return state(pod(name, "n", **kwargs), slurm(name, **slurm_kwargs))  # type: ignore[arg-type]


def test_rule_scale_down_rank_1_not_ready() -> None:
    assert scale_down_rank(ranked("p", ready=False, busy=True)) == 1


def test_rule_scale_down_rank_2_idle_drained_with_delete_condition() -> None:
    pod_state = ranked("p", drain=True, delete_reason=SCALING)
    assert scale_down_rank(pod_state) == 2
    assert rank_reason(pod_state) == "rank 2: idle, drained, delete condition set"


def test_rule_scale_down_rank_3_idle_drained_without_delete_condition() -> None:
    assert scale_down_rank(ranked("p", drain=True)) == 3


def test_rule_scale_down_rank_4_idle_not_drained() -> None:
    assert scale_down_rank(ranked("p")) == 4


def test_rule_scale_down_rank_5_running_drained_with_delete_condition() -> None:
    assert scale_down_rank(ranked("p", busy=True, drain=True, delete_reason=SCALING)) == 5


def test_rule_scale_down_rank_6_running_drained_without_delete_condition() -> None:
    assert scale_down_rank(ranked("p", busy=True, drain=True)) == 6


def test_rule_scale_down_rank_7_running_not_drained() -> None:
    assert scale_down_rank(ranked("p", busy=True)) == 7


def test_rule_scale_down_rank_unknown_slurm_state_counts_as_running_not_drained() -> None:
    assert scale_down_rank(ranked("p", known=False)) == 7
    assert scale_down_rank(state(pod("p", "n"), None)) == 7


def test_rule_scale_down_order_lower_rank_first_ties_newest_then_name() -> None:
    pods = [
        ranked("r7", busy=True),
        ranked("r4-old", created=T0),
        ranked("r4-new", created=T0 + 60),
        ranked("r1", ready=False),
        ranked("r2", drain=True, delete_reason=SCALING),
        ranked("r4-new-b", created=T0 + 60),
    ]
    order = [p.name for p in scale_down_order(pods, priority_ordering=True)]
    assert order == ["r1", "r2", "r4-new", "r4-new-b", "r4-old", "r7"]


def test_rule_scale_down_order_option_off_newest_first() -> None:
    pods = [
        ranked("old-idle", created=T0),
        ranked("new-busy", created=T0 + 100, busy=True),
        ranked("mid-notready", created=T0 + 50, ready=False),
    ]
    order = [p.name for p in scale_down_order(pods, priority_ordering=False)]
    assert order == ["new-busy", "mid-notready", "old-idle"]


pod_states = st.builds(
    lambda name, ready, busy, drain, known, cond, created: ranked(
        name,
        ready=ready,
        busy=busy,
        drain=drain,
        known=known,
        delete_reason=SCALING if cond else None,
        created=T0 + created,
    ),
    st.text(alphabet="abcdef", min_size=1, max_size=5),
    st.booleans(),
    st.booleans(),
    st.booleans(),
    st.booleans(),
    st.booleans(),
    st.integers(min_value=0, max_value=3),
)
unique_pods = st.lists(pod_states, max_size=25, unique_by=lambda p: p.name)


@given(unique_pods, st.booleans())
def test_rule_scale_down_order_is_total_and_deterministic(pods: list[PodState], on: bool) -> None:
    forward = scale_down_order(pods, priority_ordering=on)
    backward = scale_down_order(list(reversed(pods)), priority_ordering=on)
    assert forward == backward
    assert sorted(p.name for p in forward) == sorted(p.name for p in pods)
    if on:
        ranks = [scale_down_rank(p) for p in forward]
        assert ranks == sorted(ranks)


# --- rolling update ----------------------------------------------------------------------


def rolling(name: str, revision: str = "old", **kwargs: object) -> PodState:
    return ranked(name, revision=revision, **kwargs)


def test_rule_rolling_update_order_non_ready_then_idle_then_rest() -> None:
    pods = [
        rolling("a-busy", busy=True),
        rolling("b-idle"),
        rolling("c-notready", ready=False),
        rolling("d-current", revision="new"),
    ]
    choice = choose_rolling_replacements(pods, "new", max_unavailable=3, missing=0)
    assert [p.name for p in choice.replace] == ["c-notready", "b-idle", "a-busy"]


def test_rule_rolling_update_counts_already_unavailable_and_pending_deletion() -> None:
    pods = [
        rolling("a", ready=False),  # already unavailable: replacing it costs nothing
        rolling("b", delete_reason="RollingDeleteScheduled"),  # pending deletion: counts
        rolling("c"),
        rolling("d"),
    ]
    choice = choose_rolling_replacements(pods, "new", max_unavailable=2, missing=0)
    assert choice.unavailable == 2
    assert [p.name for p in choice.replace] == ["a"]
    wider = choose_rolling_replacements(pods, "new", max_unavailable=3, missing=0)
    assert [p.name for p in wider.replace] == ["a", "c"]


def test_rule_rolling_update_missing_pods_count_as_unavailable() -> None:
    pods = [rolling("a"), rolling("b")]
    assert choose_rolling_replacements(pods, "new", max_unavailable=1, missing=1).replace == ()


def test_rule_rolling_update_pods_beyond_the_target_never_offset_unavailable_ones() -> None:
    """The planner passes `missing` = target - staying pods, negative when the NodeSet holds
    more pods than it can run (feasible nodes went away): a pod too many is no spare, so a
    not-Ready pod still takes the whole budget of 1 and no Ready pod is replaced beside it."""
    pods = [rolling("a", revision="new", ready=False), rolling("b"), rolling("c", revision="new")]
    assert count_unavailable(pods, missing=-1) == 1
    choice = choose_rolling_replacements(pods, "new", max_unavailable=1, missing=-1)
    assert choice.unavailable == 1
    assert choice.replace == ()
    wider = choose_rolling_replacements(pods, "new", max_unavailable=2, missing=-1)
    assert [p.name for p in wider.replace] == ["b"]


def test_rule_rolling_update_nothing_outdated_nothing_replaced() -> None:
    pods = [rolling("a", revision="new"), rolling("b", revision="new")]
    assert choose_rolling_replacements(pods, "new", 5, 0).replace == ()


rolling_pods = st.lists(
    st.builds(
        lambda name, ready, busy, outdated, pending: rolling(
            name,
            revision="old" if outdated else "new",
            ready=ready,
            busy=busy,
            delete_reason="RollingDeleteScheduled" if pending else None,
        ),
        st.text(alphabet="abcdefgh", min_size=1, max_size=4),
        st.booleans(),
        st.booleans(),
        st.booleans(),
        st.booleans(),
    ),
    max_size=30,
    unique_by=lambda p: p.name,
)


@given(rolling_pods, st.integers(min_value=1, max_value=10), st.integers(min_value=0, max_value=3))
def test_rule_rolling_update_unavailable_never_exceeds_max_unavailable(
    pods: list[PodState], budget: int, missing: int
) -> None:
    choice = choose_rolling_replacements(pods, "new", budget, missing)
    chosen = {p.name for p in choice.replace}
    after = [
        p if p.name not in chosen else rolling(p.name, delete_reason="RollingDeleteScheduled")
        for p in pods
    ]
    before = count_unavailable(pods, missing)
    after_count = count_unavailable(after, missing)
    # Never makes things worse than the budget (or than they already were).
    assert after_count <= max(budget, before)
    # Only outdated pods not already on their way out are chosen.
    assert all(p.revision == "old" and not p.pending_deletion for p in choice.replace)
    # Deterministic whatever the input order.
    assert choose_rolling_replacements(list(reversed(pods)), "new", budget, missing) == choice


# --- Slinky's deletion hints: tie-breakers inside a rank ------------------------------------


def hinted(
    name: str, cost: str | None = None, deadline: str | None = None, **kwargs: Any
) -> PodState:
    slurm_kwargs = {k: kwargs.pop(k) for k in ("busy", "drain", "known") if k in kwargs}
    raw = pod(name, "n", **kwargs)
    annotations = raw["metadata"].setdefault("annotations", {})
    if cost is not None:
        annotations[POD_DELETION_COST_ANNOTATION] = cost
    if deadline is not None:
        annotations[POD_DEADLINE_ANNOTATION] = deadline
    return state(raw, slurm(name, **slurm_kwargs))


def test_rule_scale_down_deletion_cost_then_deadline_break_ties_inside_a_rank() -> None:
    """Inside rank 4 (idle, not drained): lower cost first, then the earlier deadline (none
    is the earliest), then newest; the seven ranks stay first."""
    pods = [
        hinted("busy-cheap", cost="-100", busy=True),
        hinted("dear", cost="10", created=T0 + 90),
        hinted("cheap", cost="-5", created=T0),
        hinted("late", deadline="2026-12-01T00:00:00Z", created=T0 + 90),
        hinted("early", deadline="2026-11-29T00:00:00Z", created=T0 + 90),
        hinted("no-deadline", created=T0),
        hinted("not-ready-dear", cost="1000", ready=False),
    ]
    order = [p.name for p in scale_down_order(pods, priority_ordering=True)]
    assert order == [
        "not-ready-dear",
        "cheap",
        "no-deadline",
        "early",
        "late",
        "dear",
        "busy-cheap",
    ]
    # Priority ordering off: the hints are not read (newest first, as documented).
    off = [p.name for p in scale_down_order(pods[1:3], priority_ordering=False)]
    assert off == ["dear", "cheap"]


@pytest.mark.parametrize(
    ("raw", "cost"),
    [
        ("7", 7),
        ("-7", -7),
        ("0", 0),
        ("+7", 0),
        ("007", 0),
        ("1.5", 0),
        ("many", 0),
        (str(2**31), 0),
        (str(2**31 - 1), 2**31 - 1),
    ],
)
def test_rule_scale_down_deletion_cost_is_an_int32_as_slinky_reads_it(raw: str, cost: int) -> None:
    assert hinted("p", cost=raw).deletion_cost == cost


def test_rule_scale_down_malformed_deadline_counts_as_none() -> None:
    assert hinted("p", deadline="tomorrow").deadline is None
    assert hinted("p", deadline="2026-11-29T00:00:00Z").deadline is not None


hinted_pods = st.lists(
    st.builds(
        lambda name, ready, busy, drain, cost, day: hinted(
            name,
            cost=str(cost),
            deadline=None if day is None else f"2026-12-{day:02d}T00:00:00Z",
            ready=ready,
            busy=busy,
            drain=drain,
        ),
        st.text(alphabet="abcdef", min_size=1, max_size=5),
        st.booleans(),
        st.booleans(),
        st.booleans(),
        st.integers(min_value=-3, max_value=3),
        st.none() | st.integers(min_value=1, max_value=3),
    ),
    max_size=20,
    unique_by=lambda p: p.name,
)


@given(hinted_pods)
def test_rule_scale_down_hints_never_move_a_pod_across_ranks(pods: list[PodState]) -> None:
    """Whatever the hints say, a pod of a lower rank (idle before busy) goes first."""
    ranks = [scale_down_rank(p) for p in scale_down_order(pods, priority_ordering=True)]
    assert ranks == sorted(ranks)
