"""Errors a handler raises to tell the consumer what to do with a message, and bus errors."""

from __future__ import annotations


class BusError(Exception):
    """Base of the errors raised by nodeflow_bus itself."""


class RetryableError(Exception):
    """The handler failed for a reason that may pass (a timeout, a conflict): redeliver later.

    Any unexpected exception is treated the same way.
    """


class PermanentError(Exception):
    """The message can never succeed (invalid, refused for good): dead-letter it at once."""


class PublishError(BusError):
    """A publish was not acknowledged by JetStream after every retry."""

    def __init__(self, subject: str, attempts: int, cause: BaseException) -> None:
        self.subject = subject
        self.attempts = attempts
        self.cause = cause
        super().__init__(
            f"publish to {subject} not acknowledged after {attempts} attempt(s): "
            f"{type(cause).__name__}: {cause}"
        )


class BatchPublishError(BusError):
    """Some messages of a batch were not acknowledged; `failures` maps index -> error."""

    def __init__(self, failures: dict[int, BaseException], total: int) -> None:
        self.failures = failures
        self.total = total
        first_index = min(failures)
        first = failures[first_index]
        super().__init__(
            f"{len(failures)} of {total} batch publishes failed; first (#{first_index}): "
            f"{type(first).__name__}: {first}"
        )


class NotConnectedError(BusError):
    """The bus is used before `connect()` or after `close()`."""
