"""Run jobs with bounded concurrency, one after another per ordering key.

Jobs submitted with the same key run strictly in submission order; jobs with different keys
(or with key None, meaning "no ordering") run concurrently, at most `limit` at a time.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable, Hashable

import structlog

from nodeflow_bus.tasks import cancel_and_wait

log = structlog.get_logger("nodeflow_bus")

Job = Callable[[], Awaitable[None]]


class KeyedScheduler:
    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError("limit must be at least 1")
        self._slots = asyncio.Semaphore(limit)
        self._lanes: dict[Hashable, deque[Job]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False
        self._unordered = 0

    @property
    def active_lanes(self) -> int:
        return len(self._tasks)

    def submit(self, key: Hashable | None, job: Job) -> None:
        """Queue `job` behind earlier jobs of `key` (None: no ordering constraint)."""
        if self._closed:
            raise RuntimeError("the scheduler is closed")
        if key is None:
            # A fresh private lane: nothing to wait for but a slot.
            self._unordered += 1
            key = ("__unordered__", self._unordered)
        lane = self._lanes.get(key)
        if lane is not None:
            lane.append(job)
            return
        self._lanes[key] = deque([job])
        task = asyncio.create_task(self._run_lane(key))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run_lane(self, key: Hashable) -> None:
        lane = self._lanes[key]
        try:
            while lane and not self._closed:
                job = lane[0]
                async with self._slots:
                    if self._closed:
                        return
                    try:
                        await job()
                    except Exception:
                        # A job settles its own message; an escape here is a bug, not a reason
                        # to stall the other jobs of this key.
                        log.exception("scheduler.job_failed")
                lane.popleft()
        finally:
            self._lanes.pop(key, None)

    def close(self) -> None:
        """Start no more jobs; queued jobs that have not started are dropped."""
        self._closed = True

    async def join(self, timeout: float | None = None) -> bool:
        """Wait for running lanes to finish; True if all finished within `timeout`."""
        if not self._tasks:
            return True
        _, pending = await asyncio.wait(set(self._tasks), timeout=timeout)
        return not pending

    async def cancel(self) -> None:
        """Cancel the running jobs and wait until they have unwound."""
        await asyncio.gather(*(cancel_and_wait(task) for task in set(self._tasks)))
