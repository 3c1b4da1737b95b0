"""Rules 4 and 5: safe deletion (drained and idle, from a known state) and forced deletion."""

from __future__ import annotations

from nodeset_controller.deletion import decide_deletion, forced_deadline
from nodeset_controller.podstate import PodState
from tests.unit.nodeset_controller.builders import T0, pod, slurm, state

SCALING = "ScalingDeleteScheduled"
ROLLING = "RollingDeleteScheduled"


def scheduled(reason: str = SCALING, **slurm_kwargs: bool) -> PodState:
    """A pod marked at T0 whose cluster was polled two seconds later."""
    return state(
        pod("p", "n", delete_reason=reason, delete_since=T0),
        slurm("p", **slurm_kwargs),
        read_at=T0 + 2,
    )


def test_rule_safe_deletion_deletes_only_when_drained_and_idle() -> None:
    assert decide_deletion(scheduled(drain=True), T0 + 1, 0, 0).verdict == "delete"
    assert decide_deletion(scheduled(drain=True, busy=True), T0 + 1, 0, 0).verdict == "wait"
    waiting = decide_deletion(scheduled(), T0 + 1, 0, 0)
    assert waiting.verdict == "wait" and waiting.reason == "NotDrained"


def test_rule_safe_deletion_failed_slurm_lookup_is_never_drained() -> None:
    unknown = state(pod("p", "n", delete_reason=SCALING, delete_since=T0), slurm("p", known=False))
    decision = decide_deletion(unknown, T0 + 10_000, 0, 0)
    assert decision.verdict == "wait" and decision.reason == "SlurmStateUnknown"
    missing = state(pod("p", "n", delete_reason=SCALING, delete_since=T0), None)
    assert decide_deletion(missing, T0 + 10_000, 0, 0).verdict == "wait"


def test_rule_safe_deletion_needs_the_condition() -> None:
    plain = state(pod("p", "n"), slurm("p", drain=True))
    assert decide_deletion(plain, T0, 0, 0).verdict == "wait"


def test_rule_safe_deletion_pod_that_never_started_has_nothing_to_drain() -> None:
    pending = state(
        pod("p", None, ready=False, phase="Pending", delete_reason=SCALING, delete_since=T0), None
    )
    assert decide_deletion(pending, T0, 0, 0).verdict == "delete"


def test_rule_forced_deletion_known_timeout_applies_to_known_state() -> None:
    busy = scheduled(busy=True)
    assert decide_deletion(busy, T0 + 9, 10, 0).verdict == "wait"
    forced = decide_deletion(busy, T0 + 10, 10, 0)
    assert forced.verdict == "forced-delete" and forced.reason == "ForcedDeleteKnown"
    # The unknown timeout does not apply to a known state.
    assert decide_deletion(busy, T0 + 100, 0, 5).verdict == "wait"


def test_rule_forced_deletion_unknown_timeout_applies_to_unknown_state() -> None:
    unknown = state(pod("p", "n", delete_reason=SCALING, delete_since=T0), slurm("p", known=False))
    assert decide_deletion(unknown, T0 + 100, 5, 0).verdict == "wait"
    forced = decide_deletion(unknown, T0 + 5, 0, 5)
    assert forced.verdict == "forced-delete" and forced.reason == "ForcedDeleteUnknown"


def test_rule_forced_deletion_both_zero_unknown_state_never_deleted() -> None:
    unknown = state(pod("p", "n", delete_reason=SCALING, delete_since=T0), slurm("p", known=False))
    assert decide_deletion(unknown, T0 + 10**9, 0, 0).verdict == "wait"
    assert forced_deadline(unknown, 0, 0) is None


def test_rule_forced_deletion_applies_to_scale_down_only() -> None:
    rolling = scheduled(ROLLING, busy=True)
    assert decide_deletion(rolling, T0 + 1000, 10, 10).verdict == "wait"
    assert forced_deadline(rolling, 10, 10) is None


def test_rule_forced_deletion_deadline_is_condition_time_plus_timeout() -> None:
    assert forced_deadline(scheduled(busy=True), 30, 0) == T0 + 30


def test_rule_forced_deletion_any_positive_timeout_applies() -> None:
    """Only 0 disables a timeout: the shortest one there is, one second, forces the
    deletion one second after SlurmDelete was set, and its deadline says so."""
    busy = scheduled(busy=True)
    assert decide_deletion(busy, T0 + 0.5, 1, 0).verdict == "wait"
    assert decide_deletion(busy, T0 + 1, 1, 0).verdict == "forced-delete"
    assert forced_deadline(busy, 1, 0) == T0 + 1


def test_rule_forced_deletion_says_how_long_ago_and_which_timeout() -> None:
    """The forced deletion's message (the decision log and its Event) names the
    time since SlurmDelete and the timeout that ran out, known or unknown."""
    known = decide_deletion(scheduled(busy=True), T0 + 40, 30, 0)
    assert known.message == "SlurmDelete set 40s ago, over the known-condition timeout of 30s"
    unknown_pod = state(
        pod("p", "n", delete_reason=SCALING, delete_since=T0), slurm("p", known=False)
    )
    unknown = decide_deletion(unknown_pod, T0 + 70, 0, 60)
    assert unknown.message == "SlurmDelete set 70s ago, over the unknown-condition timeout of 60s"


def test_rule_a_scale_down_mark_without_a_time_is_never_forced() -> None:
    """A SlurmDelete condition without lastTransitionTime gives no age to compare with a
    timeout: the pod waits for its drain (fail closed) and no forced deadline is set,
    where the timeouts force a pod marked with a time."""
    raw = pod("p", "n", delete_reason=SCALING, delete_since=T0)
    for condition in raw["status"]["conditions"]:
        condition.pop("lastTransitionTime", None)
    untimed = state(raw, slurm("p", busy=True), read_at=T0 + 2)
    assert untimed.delete_reason == SCALING and untimed.delete_since is None
    decision = decide_deletion(untimed, T0 + 10**6, 10, 10)
    assert decision.verdict == "wait" and decision.reason == "Busy"
    assert forced_deadline(untimed, 10, 10) is None
    assert decide_deletion(scheduled(busy=True), T0 + 10**6, 10, 10).verdict == "forced-delete"
