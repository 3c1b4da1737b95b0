"""The client-side rate limit is a token bucket: a burst at once, then `qps` per second."""

from __future__ import annotations

import time

import pytest

from k8s_watcher.ratelimit import TokenBucket


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_burst_is_free_then_requests_are_spaced_at_qps() -> None:
    clock = FakeClock()
    bucket = TokenBucket(qps=10.0, burst=3, clock=clock)
    assert [bucket.reserve() for _ in range(3)] == [0.0, 0.0, 0.0]
    # Reservations queue up: the 4th waits 0.1 s, the 5th 0.2 s.
    assert bucket.reserve() == pytest.approx(0.1)
    assert bucket.reserve() == pytest.approx(0.2)


def test_tokens_refill_with_time_but_never_beyond_burst() -> None:
    clock = FakeClock()
    bucket = TokenBucket(qps=2.0, burst=2, clock=clock)
    bucket.reserve()
    bucket.reserve()
    clock.now += 60.0
    assert [bucket.reserve() for _ in range(2)] == [0.0, 0.0]
    assert bucket.reserve() == pytest.approx(0.5)


def test_invalid_settings_are_refused() -> None:
    with pytest.raises(ValueError):
        TokenBucket(qps=0, burst=1)
    with pytest.raises(ValueError):
        TokenBucket(qps=1, burst=0)


async def test_acquire_sleeps_for_the_reserved_delay() -> None:
    bucket = TokenBucket(qps=50.0, burst=1)
    await bucket.acquire()
    started = time.monotonic()
    await bucket.acquire()
    await bucket.acquire()
    assert time.monotonic() - started >= 0.035
