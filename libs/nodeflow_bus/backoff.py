"""Retry delays: pure functions, so the schedule can be tested without a clock."""

from __future__ import annotations

import msgspec


class Backoff(msgspec.Struct, frozen=True, kw_only=True):
    """Exponential delay: `initial * factor**(attempt-1)`, capped at `maximum`."""

    initial: float = 0.5
    factor: float = 2.0
    maximum: float = 30.0

    def __post_init__(self) -> None:
        if self.initial <= 0 or self.factor < 1 or self.maximum < self.initial:
            raise ValueError(f"invalid backoff {self!r}")

    def delay(self, attempt: int) -> float:
        """Delay before retrying after failed attempt number `attempt` (1-based)."""
        if attempt < 1:
            raise ValueError("attempt numbers start at 1")
        # Cap the exponent so a huge attempt number cannot overflow a float.
        exponent = min(attempt - 1, 64)
        return min(self.maximum, self.initial * self.factor**exponent)


def redelivery_delay(policy: Backoff, num_delivered: int) -> float:
    """Nak delay for a message that failed on its `num_delivered`-th delivery."""
    return policy.delay(max(1, num_delivered))
