"""SlurmClusterStatus.fresh: when a reader may trust a cluster's Slurm node states."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from nodeflow_contracts.slurm import STALE_AFTER_POLLS, SlurmClusterStatus


def status(last_success_at: float, poll_interval: float = 5.0) -> SlurmClusterStatus:
    return SlurmClusterStatus(
        cluster="a",
        reachable=True,
        last_poll_at=last_success_at,
        last_success_at=last_success_at,
        poll_interval_seconds=poll_interval,
    )


def test_states_are_fresh_for_four_poll_intervals_by_default() -> None:
    assert STALE_AFTER_POLLS == 4
    assert status(100.0).fresh(now=120.0)
    assert not status(100.0).fresh(now=120.1)


def test_a_cluster_never_polled_successfully_is_never_fresh() -> None:
    assert not status(0.0).fresh(now=0.0)


def test_a_configured_maximum_age_replaces_the_default() -> None:
    assert status(100.0).fresh(now=102.0, max_age_seconds=3.0)
    assert not status(100.0).fresh(now=104.0, max_age_seconds=3.0)
    # 0 (or less) means the default, as SLURM_STATE_MAX_AGE_SECONDS=0 does.
    assert status(100.0).fresh(now=119.0, max_age_seconds=0.0)


@given(
    last=st.floats(min_value=1.0, max_value=1e9),
    age=st.floats(min_value=0.0, max_value=1e6),
    interval=st.floats(min_value=0.1, max_value=600.0),
)
def test_freshness_is_exactly_age_within_the_limit(
    last: float, age: float, interval: float
) -> None:
    now = last + age
    assert status(last, interval).fresh(now) == (now - last <= STALE_AFTER_POLLS * interval)
