"""Clocks for the Slurm emulator: the wall clock for the live stack, a manual one for tests."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Seconds since the epoch, as a float."""
        ...


class SystemClock:
    """The real wall clock; paired with a driver task that ticks the emulator."""

    def now(self) -> float:
        return time.time()


class ManualClock:
    """A clock that only moves when a test says so, so tests never sleep."""

    def __init__(self, start: float = 1_750_000_000.0) -> None:
        self._now = start

    def now(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("a clock cannot go backwards")
        self._now += seconds
