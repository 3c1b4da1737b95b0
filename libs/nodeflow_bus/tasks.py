"""Cancelling background tasks reliably, without ever hanging a shutdown."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import structlog

log = structlog.get_logger("nodeflow_bus")


async def cancel_and_wait(
    task: asyncio.Task[Any], *, retry_every: float = 0.2, deadline: float = 5.0
) -> bool:
    """Cancel `task` and wait until it is done, for at most `deadline` seconds.

    A single cancel() is not enough on Python 3.11: asyncio.wait_for (used by nats-py for
    every request) can swallow a cancellation that races with its inner result, and the task
    then carries on. So cancel again until it really ends. A task that keeps swallowing
    cancellation is logged and abandoned after `deadline`: a shutdown must not hang on it.

    Returns True if the task ended. Cancelling the caller still cancels the caller.
    """
    give_up_at = time.monotonic() + deadline
    while not task.done():
        remaining = give_up_at - time.monotonic()
        if remaining <= 0:
            log.error("task.cancel_ignored", task=task.get_name(), waited=deadline)
            return False
        task.cancel()
        await asyncio.wait({task}, timeout=min(retry_every, remaining))
    if not task.cancelled():
        # Retrieve it so asyncio does not log "exception was never retrieved".
        task.exception()
    return True
