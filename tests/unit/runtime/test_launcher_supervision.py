"""The launcher's restart schedule: exponential backoff per crash in a row, reset by a stable
run."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from nodeflow_runtime.launcher import (
    RESTART_BACKOFF,
    STABLE_RUN_SECONDS,
    crash_count,
    restart_delay,
)


def test_a_crashing_service_restarts_with_exponential_backoff_up_to_a_cap() -> None:
    crashes = 0
    delays = []
    for _ in range(8):
        crashes = crash_count(crashes, ran_for=0.5)
        delays.append(restart_delay(crashes))
    assert delays == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0]


@given(
    previous=st.integers(min_value=0, max_value=1000),
    ran_for=st.floats(min_value=0, max_value=10 * STABLE_RUN_SECONDS),
)
def test_a_stable_run_resets_the_backoff(previous: int, ran_for: float) -> None:
    crashes = crash_count(previous, ran_for)
    if ran_for >= STABLE_RUN_SECONDS:
        assert crashes == 1 and restart_delay(crashes) == RESTART_BACKOFF.initial
    else:
        assert crashes == previous + 1
    assert RESTART_BACKOFF.initial <= restart_delay(crashes) <= RESTART_BACKOFF.maximum
