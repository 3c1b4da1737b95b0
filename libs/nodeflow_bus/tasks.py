"""Cancelling background tasks reliably."""

from __future__ import annotations

import asyncio
from typing import Any


async def cancel_and_wait(task: asyncio.Task[Any], *, retry_every: float = 0.2) -> None:
    """Cancel `task` and wait until it is done.

    A single cancel() is not enough on Python 3.11: asyncio.wait_for (used by nats-py for
    every request) can swallow a cancellation that races with its inner result, and the task
    then carries on. So cancel again until it really ends.
    """
    while not task.done():
        task.cancel()
        await asyncio.wait({task}, timeout=retry_every)
    if not task.cancelled() and task.exception() is not None:
        # Retrieve it so asyncio does not log "exception was never retrieved".
        task.exception()
