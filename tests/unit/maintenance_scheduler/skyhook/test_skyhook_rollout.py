"""Rollout shaping: batch sizing, evaluation and stop rules, compartments and overlaps."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from maintenance_scheduler.skyhook.api import (
    DEFAULT_COMPARTMENT,
    Budget,
    Compartment,
    DeploymentPolicy,
    LabelSelector,
    Strategy,
)
from maintenance_scheduler.skyhook.rollout import (
    BLOCKED,
    COMPLETE,
    ERRORING,
    IN_PROGRESS,
    WAITING,
    BatchState,
    CompartmentPlan,
    RolloutNode,
    assign_compartments,
    batch_size,
    compartment_of,
    evaluate_batch,
    plan_compartment,
    progress_percent,
)

FIXED = Strategy(kind="fixed", initial_batch=3)
LINEAR = Strategy(kind="linear", initial_batch=1, delta=2)
EXPONENTIAL = Strategy(kind="exponential", initial_batch=1, growth_factor=2)


@pytest.mark.parametrize(
    ("strategy", "total", "state", "expected"),
    [
        # fixed: always initialBatch, clamped to what remains
        (FIXED, 10, BatchState(), 3),
        (FIXED, 10, BatchState(last_batch_size=3, completed_nodes=9), 1),
        # linear: initialBatch, then last + delta
        (LINEAR, 100, BatchState(), 1),
        (LINEAR, 100, BatchState(last_batch_size=1, completed_nodes=1), 3),
        (LINEAR, 100, BatchState(last_batch_size=3, completed_nodes=4), 5),
        # linear slows down by delta after a failed batch below safetyLimit (min 1)
        (LINEAR, 100, BatchState(last_batch_size=5, last_batch_failed=True, failed_nodes=5), 3),
        (LINEAR, 100, BatchState(last_batch_size=1, last_batch_failed=True, failed_nodes=1), 1),
        # ... but grows again at or past safetyLimit
        (
            LINEAR,
            10,
            BatchState(last_batch_size=3, last_batch_failed=True, completed_nodes=5),
            5,
        ),
        # exponential: 1, 2, 4, 8 ...
        (EXPONENTIAL, 100, BatchState(), 1),
        (EXPONENTIAL, 100, BatchState(last_batch_size=1, completed_nodes=1), 2),
        (EXPONENTIAL, 100, BatchState(last_batch_size=4, completed_nodes=7), 8),
        # exponential divides by growthFactor after a failed batch below safetyLimit
        (
            EXPONENTIAL,
            100,
            BatchState(
                last_batch_size=8, last_batch_failed=True, completed_nodes=7, failed_nodes=8
            ),
            4,
        ),
        # clamped to the remaining nodes
        (EXPONENTIAL, 16, BatchState(last_batch_size=8, completed_nodes=15), 1),
        (EXPONENTIAL, 16, BatchState(last_batch_size=4, completed_nodes=7), 8),
        # an empty compartment has no batch
        (EXPONENTIAL, 0, BatchState(), 0),
    ],
)
def test_batch_size_follows_the_strategy(
    strategy: Strategy, total: int, state: BatchState, expected: int
) -> None:
    assert batch_size(strategy, total, state) == expected


@pytest.mark.parametrize(
    ("strategy", "state", "batch", "succeeded", "total", "failed", "consecutive", "stop"),
    [
        # batchThreshold 100: any failure fails the batch
        (Strategy(), BatchState(), 4, 3, 100, True, 1, False),
        (Strategy(), BatchState(consecutive_failures=2), 4, 4, 100, False, 0, False),
        # batchThreshold 75: 3 of 4 is enough
        (Strategy(batch_threshold=75), BatchState(), 4, 3, 100, False, 0, False),
        # failureThreshold reached below safetyLimit: stop
        (
            Strategy(failure_threshold=2),
            BatchState(consecutive_failures=1, failed_nodes=2),
            1,
            0,
            100,
            True,
            2,
            True,
        ),
        # ... but not at or past safetyLimit
        (
            Strategy(failure_threshold=2),
            BatchState(consecutive_failures=1, completed_nodes=60, failed_nodes=2),
            1,
            0,
            100,
            True,
            2,
            False,
        ),
        # no failureThreshold: never stops
        (
            Strategy(),
            BatchState(consecutive_failures=50, failed_nodes=50),
            1,
            0,
            1000,
            True,
            51,
            False,
        ),
    ],
)
def test_batch_evaluation_counts_failures_and_should_stop(
    strategy: Strategy,
    state: BatchState,
    batch: int,
    succeeded: int,
    total: int,
    failed: bool,
    consecutive: int,
    stop: bool,
) -> None:
    after = evaluate_batch(strategy, state, batch, succeeded, total)
    assert after.last_batch_failed is failed
    assert after.consecutive_failures == consecutive
    assert after.should_stop is stop
    assert after.current_batch == state.current_batch + 1
    assert after.last_batch_size == batch


def nodes(count: int, labels: dict[str, str] | None = None, prefix: str = "n") -> list[RolloutNode]:
    return [
        RolloutNode(f"{prefix}{i:03d}", labels or {}, created=float(i), status=WAITING)
        for i in range(count)
    ]


def compartment(name: str, key: str, strategy: Strategy | None, budget: Budget) -> Compartment:
    return Compartment(name, LabelSelector(((key, "true"),)), budget, strategy)


def test_compartment_overlap_resolves_to_the_safer_strategy_then_smaller_ceiling_then_name() -> (
    None
):
    policy = DeploymentPolicy(
        name="p",
        compartments=(
            compartment("exp", "a", EXPONENTIAL, Budget(count=1)),
            compartment("lin", "b", LINEAR, Budget(count=5)),
            compartment("fix-big", "c", FIXED, Budget(count=9)),
            compartment("fix-small", "d", FIXED, Budget(count=2)),
            compartment("zz", "e", FIXED, Budget(count=2)),
        ),
    )
    members = [
        RolloutNode("ab", {"a": "true", "b": "true"}, 0, WAITING),
        RolloutNode("bc", {"b": "true", "c": "true"}, 0, WAITING),
        RolloutNode("cd", {"c": "true", "d": "true"}, 0, WAITING),
        RolloutNode("de", {"d": "true", "e": "true"}, 0, WAITING),
        RolloutNode("none", {}, 0, WAITING),
    ]
    result = {k: [n.name for n in v] for k, v in assign_compartments(policy, members).items()}
    assert result["lin"] == ["ab"]  # linear is safer than exponential
    assert result["fix-big"] == ["bc"]  # fixed is safer than linear
    assert result["fix-small"] == ["cd", "de"]  # smaller ceiling, then the name
    assert result[DEFAULT_COMPARTMENT] == ["none"]


def test_no_strategy_compartment_takes_its_ceiling_as_batch() -> None:
    decided = plan_compartment(
        Compartment(DEFAULT_COMPARTMENT, LabelSelector(), Budget(percent=25), None),
        nodes(8),
        BatchState(),
    )
    assert decided.ceiling == 2
    assert decided.batch == ("n000", "n001")


def test_in_progress_batch_continues_and_no_new_batch_starts() -> None:
    members = nodes(6)
    members[4] = replace(members[4], status=IN_PROGRESS)
    decided = plan_compartment(
        Compartment("c", LabelSelector(), Budget(count=6), EXPONENTIAL), members, BatchState()
    )
    assert decided.batch == ("n004",)
    assert not decided.evaluated


def test_finished_batch_is_evaluated_on_the_delta_since_the_checkpoint() -> None:
    members = nodes(8)
    members[0] = replace(members[0], status=COMPLETE)
    members[1] = replace(members[1], status=COMPLETE)
    members[2] = replace(members[2], status=ERRORING)
    state = BatchState(current_batch=2, completed_nodes=1, last_batch_size=1)
    strategy = Strategy(kind="exponential", failure_threshold=1)
    decided = plan_compartment(
        Compartment("c", LabelSelector(), Budget(count=8), strategy), members, state
    )
    assert decided.evaluated and decided.batch_failed
    assert decided.state.completed_nodes == 2 and decided.state.failed_nodes == 1
    assert decided.state.should_stop  # 3 of 8 processed: below safetyLimit 50
    assert decided.batch == ()


def test_paused_compartment_starts_no_new_batch_but_continues_the_current_one() -> None:
    members = nodes(4)
    members[1] = replace(members[1], status=IN_PROGRESS)
    comp = Compartment("c", LabelSelector(), Budget(count=4), FIXED)
    assert plan_compartment(comp, members, BatchState(), may_start=False).batch == ("n001",)
    assert plan_compartment(comp, nodes(4), BatchState(), may_start=False).batch == ()


def test_sticky_nodes_finish_before_new_ones_are_picked() -> None:
    members = nodes(4)
    members[3] = replace(members[3], sticky=True)
    comp = Compartment("c", LabelSelector(), Budget(count=4), FIXED)
    assert plan_compartment(comp, members, BatchState()).batch == ("n003",)


@settings(max_examples=300, deadline=None)
@given(
    kind=st.sampled_from(["fixed", "linear", "exponential"]),
    initial=st.integers(1, 50),
    delta=st.integers(1, 10),
    growth=st.integers(2, 5),
    total=st.integers(0, 500),
    completed=st.integers(0, 500),
    failed=st.integers(0, 500),
    last=st.integers(0, 100),
    last_failed=st.booleans(),
    safety=st.integers(1, 100),
)
def test_batch_size_never_exceeds_the_remaining_nodes_and_is_at_least_one(
    kind: str,
    initial: int,
    delta: int,
    growth: int,
    total: int,
    completed: int,
    failed: int,
    last: int,
    last_failed: bool,
    safety: int,
) -> None:
    strategy = Strategy(
        kind=kind,  # type: ignore[arg-type]
        initial_batch=initial,
        delta=delta,
        growth_factor=growth,
        safety_limit=safety,
    )
    completed = min(completed, total)
    failed = min(failed, total - completed)
    state = BatchState(
        completed_nodes=completed,
        failed_nodes=failed,
        last_batch_size=last,
        last_batch_failed=last_failed,
    )
    size = batch_size(strategy, total, state)
    if total == 0:
        assert size == 0
        return
    remaining = total - completed - failed
    assert size >= 1
    assert size <= max(1, remaining)
    if (
        last_failed
        and last > 0
        and kind != "fixed"
        and (completed + failed) * 100 // total < safety
    ):
        assert size <= last  # a failed batch below safetyLimit never grows the next one


@settings(max_examples=300, deadline=None)
@given(
    outcomes=st.lists(st.tuples(st.integers(1, 20), st.integers(0, 20)), min_size=1, max_size=30),
    threshold=st.one_of(st.none(), st.integers(1, 5)),
    batch_threshold=st.integers(1, 100),
)
def test_rollout_stops_only_after_failure_threshold_consecutive_failed_batches(
    outcomes: list[tuple[int, int]], threshold: int | None, batch_threshold: int
) -> None:
    strategy = Strategy(
        kind="linear",
        failure_threshold=threshold,
        batch_threshold=batch_threshold,
        safety_limit=100,
    )
    state = BatchState()
    run = 0
    total = 10_000
    for size, succeeded in outcomes:
        succeeded = min(size, succeeded)
        was_stopped = state.should_stop
        state = evaluate_batch(strategy, state, size, succeeded, total)
        run = run + 1 if succeeded * 100 // size < batch_threshold else 0
        assert state.consecutive_failures == run
        if threshold is None:
            assert not state.should_stop
        elif was_stopped:
            assert state.should_stop  # only a person resumes a stopped rollout
        else:
            assert state.should_stop == (run >= threshold)


@settings(max_examples=200, deadline=None)
@given(
    labels=st.lists(
        st.fixed_dictionaries(
            {}, optional={"a": st.just("true"), "b": st.just("true"), "c": st.just("true")}
        ),
        max_size=40,
    )
)
def test_every_node_lands_in_exactly_one_compartment(labels: list[dict[str, str]]) -> None:
    policy = DeploymentPolicy(
        name="p",
        compartments=(
            compartment("a", "a", EXPONENTIAL, Budget(percent=50)),
            compartment("b", "b", LINEAR, Budget(count=2)),
            compartment("c", "c", None, Budget(count=1)),
        ),
    )
    members = [RolloutNode(f"n{i}", lab, float(i), WAITING) for i, lab in enumerate(labels)]
    result = assign_compartments(policy, members)
    placed = [n.name for group in result.values() for n in group]
    assert sorted(placed) == sorted(n.name for n in members)
    for node in result[DEFAULT_COMPARTMENT]:
        assert not node.labels


FRESH_BATCH_STATUS = {
    "currentBatch": 1,
    "consecutiveFailures": 0,
    "completedNodes": 0,
    "failedNodes": 0,
    "shouldStop": False,
    "lastBatchSize": 0,
    "lastBatchFailed": False,
}


def test_a_fresh_rollout_is_at_batch_one_with_nothing_counted() -> None:
    assert BatchState().to_status() == FRESH_BATCH_STATUS
    assert BatchState.from_status(None) == BatchState()
    assert BatchState.from_status({}) == BatchState()


def test_batch_state_reads_back_what_it_wrote_and_refuses_what_is_not_a_count() -> None:
    state = BatchState(3, 2, 5, 1, True, 4, True)
    assert BatchState.from_status(state.to_status()) == state
    garbled = {
        "currentBatch": 0,
        "consecutiveFailures": -2,
        "completedNodes": True,
        "failedNodes": "3",
        "shouldStop": "true",
        "lastBatchSize": -1,
        "lastBatchFailed": 1,
    }
    assert BatchState.from_status(garbled) == BatchState()
    negative = {"completedNodes": -1, "failedNodes": -5, "lastBatchSize": -3}
    assert BatchState.from_status(negative) == BatchState()
    assert BatchState.from_status({"currentBatch": 2, "completedNodes": 1}) == BatchState(
        current_batch=2, completed_nodes=1
    )


def test_progress_counts_completed_and_failed_nodes_rounded_down() -> None:
    assert progress_percent(BatchState(completed_nodes=1), 3) == 33
    assert progress_percent(BatchState(completed_nodes=1, failed_nodes=1), 3) == 66
    assert progress_percent(BatchState(completed_nodes=3), 3) == 100
    assert progress_percent(BatchState(completed_nodes=1), 0) == 0
    assert progress_percent(BatchState(completed_nodes=1), 1) == 100


def test_a_fixed_strategy_keeps_its_size_whatever_the_last_batch_was() -> None:
    assert batch_size(FIXED, 100, BatchState(last_batch_size=7)) == 3
    after_failure = BatchState(last_batch_size=7, last_batch_failed=True)
    assert batch_size(FIXED, 100, after_failure) == 3


def test_a_batch_without_a_strategy_only_moves_the_counters() -> None:
    state = BatchState(current_batch=2, consecutive_failures=1)
    after = evaluate_batch(None, state, 3, 0, 10)
    assert after == replace(state, current_batch=3, last_batch_size=3)


def test_an_empty_batch_changes_nothing() -> None:
    state = BatchState(current_batch=2, completed_nodes=4)
    assert evaluate_batch(Strategy(kind="fixed", failure_threshold=1), state, 0, 0, 10) == state


def test_failures_stop_the_rollout_only_while_progress_is_below_the_safety_limit() -> None:
    strategy = Strategy(kind="fixed", failure_threshold=1, safety_limit=50)
    below = evaluate_batch(strategy, BatchState(completed_nodes=4), 1, 0, 10)
    assert below.last_batch_failed and below.should_stop
    at_limit = evaluate_batch(strategy, BatchState(completed_nodes=5), 1, 0, 10)
    assert at_limit.last_batch_failed and not at_limit.should_stop


def test_compartment_members_are_ordered_by_creation_then_name() -> None:
    policy = DeploymentPolicy(
        name="p", compartments=(compartment("gpu", "gpu", FIXED, Budget(count=1)),)
    )
    members = [
        RolloutNode("late", {"gpu": "true"}, 5, WAITING),
        RolloutNode("b-early", {"gpu": "true"}, 1, WAITING),
        RolloutNode("a-early", {"gpu": "true"}, 1, WAITING),
        RolloutNode("plain-late", {}, 9, WAITING),
        RolloutNode("plain", {}, 2, WAITING),
    ]
    result = {k: [n.name for n in v] for k, v in assign_compartments(policy, members).items()}
    assert result == {
        "gpu": ["a-early", "b-early", "late"],
        DEFAULT_COMPARTMENT: ["plain", "plain-late"],
    }


def test_compartment_of_finds_the_default_and_each_named_compartment() -> None:
    gpu = compartment("gpu", "gpu", FIXED, Budget(count=1))
    policy = DeploymentPolicy(name="p", compartments=(gpu,))
    assert compartment_of(policy, DEFAULT_COMPARTMENT) is policy.default
    assert compartment_of(policy, "gpu") is gpu
    with pytest.raises(KeyError):
        compartment_of(policy, "missing")


def test_a_compartments_progress_is_its_complete_share_rounded_down() -> None:
    def planned(completed: int, matched: int) -> CompartmentPlan:
        return CompartmentPlan("c", None, matched, 1, 0, completed, BatchState(), ())

    assert planned(1, 3).progress_percent == 33
    assert planned(3, 3).progress_percent == 100
    assert planned(0, 0).progress_percent == 0


@pytest.mark.parametrize(
    ("checkpoint", "now"),
    [
        ((3, 0), (2, 0)),  # a complete node left the compartment
        ((0, 2), (0, 1)),  # an erroring node was reset (its failed Job deleted: the retry)
        ((3, 0), (2, 3)),  # one left while three failed: the deltas mean nothing
        ((0, 2), (3, 1)),  # one reset while three completed: the same
    ],
)
def test_a_checkpoint_that_went_backwards_is_void_and_judges_no_batch(
    checkpoint: tuple[int, int], now: tuple[int, int]
) -> None:
    completed, failed = now
    members = nodes(8)
    for i in range(completed):
        members[i] = replace(members[i], status=COMPLETE)
    for i in range(completed, completed + failed):
        members[i] = replace(members[i], status=ERRORING)
    state = BatchState(
        current_batch=3,
        completed_nodes=checkpoint[0],
        failed_nodes=checkpoint[1],
        last_batch_size=2,
    )
    strategy = Strategy(kind="fixed", initial_batch=2, failure_threshold=1)
    decided = plan_compartment(
        Compartment("c", LabelSelector(), Budget(count=8), strategy), members, state
    )
    assert not decided.evaluated
    assert (decided.state.completed_nodes, decided.state.failed_nodes) == now
    assert decided.state.current_batch == 3 and not decided.state.should_stop
    # ... and the next batch starts from there.
    assert len(decided.batch) == 2


def test_a_blocked_node_alone_judges_no_batch() -> None:
    members = nodes(4)
    members[0] = replace(members[0], status=COMPLETE)
    members[1] = replace(members[1], status=BLOCKED)
    state = BatchState(current_batch=2, completed_nodes=1, last_batch_size=1)
    decided = plan_compartment(
        Compartment("c", LabelSelector(), Budget(count=4), FIXED), members, state
    )
    assert not decided.evaluated and not decided.batch_failed
    assert decided.state == state
    assert decided.batch  # the rollout goes on with a new batch


def test_a_stop_recorded_by_a_strategy_does_not_hold_a_compartment_without_one() -> None:
    # The policy lost its strategy: the old shouldStop belongs to rules no longer in force.
    stopped = BatchState(should_stop=True)
    decided = plan_compartment(
        Compartment("c", LabelSelector(), Budget(count=2), None), nodes(3), stopped
    )
    assert decided.batch == ("n000", "n001")
    held = plan_compartment(
        Compartment("c", LabelSelector(), Budget(count=2), FIXED), nodes(3), stopped
    )
    assert held.batch == ()


def test_an_overlap_goes_to_the_smaller_ceiling_counted_on_the_nodes_each_matches() -> None:
    # Both 50%: "a-wide" matches four nodes (ceiling 2), "b-narrow" two (ceiling 1). The node
    # in both goes to the smaller ceiling, b-narrow, though its name sorts second.
    policy = DeploymentPolicy(
        name="p",
        compartments=(
            compartment("a-wide", "wide", FIXED, Budget(percent=50)),
            compartment("b-narrow", "narrow", FIXED, Budget(percent=50)),
        ),
    )
    members = [
        RolloutNode("both", {"wide": "true", "narrow": "true"}, 0, WAITING),
        *[RolloutNode(f"w{i}", {"wide": "true"}, 1, WAITING) for i in range(3)],
        RolloutNode("n0", {"narrow": "true"}, 1, WAITING),
    ]
    result = {k: [n.name for n in v] for k, v in assign_compartments(policy, members).items()}
    assert result["b-narrow"] == ["both", "n0"]
    assert result["a-wide"] == ["w0", "w1", "w2"]
