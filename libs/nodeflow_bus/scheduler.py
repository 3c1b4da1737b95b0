"""Run jobs with bounded concurrency, one after another per ordering key.

Jobs submitted with the same key run strictly in submission order; jobs with different keys
(or with key None, meaning "no ordering") run concurrently, at most `limit` at a time.

A job may ask to be run again later by returning a delay in seconds (None: done). It keeps its
place at the head of its lane, so later jobs of the key still wait, but it gives its slot back
while it waits: a few keys backing off never starve the other keys.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Awaitable, Callable, Hashable

import structlog

from nodeflow_bus.tasks import cancel_and_wait

log = structlog.get_logger("nodeflow_bus")

# Returns None when finished, or the delay after which it must run again.
Job = Callable[[], Awaitable[float | None]]


class KeyedScheduler:
    def __init__(self, limit: int, *, on_demand_drop: Callable[[], None] | None = None) -> None:
        """`on_demand_drop` is called whenever `demand` decreases (a lane finished or started
        waiting), so a producer pausing on demand can resume."""
        if limit < 1:
            raise ValueError("limit must be at least 1")
        self._slots = asyncio.Semaphore(limit)
        self._lanes: dict[Hashable, deque[Job]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = asyncio.Event()
        self._unordered = 0
        self._demand = 0
        self._on_demand_drop = on_demand_drop

    @property
    def active_lanes(self) -> int:
        return len(self._tasks)

    @property
    def demand(self) -> int:
        """Lanes running a job or waiting for a slot (not those waiting to retry)."""
        return self._demand

    def submit(self, key: Hashable | None, job: Job) -> None:
        """Queue `job` behind earlier jobs of `key` (None: no ordering constraint)."""
        if self._closed.is_set():
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
        # Counted at once, not when the lane task first runs, so a producer reading `demand`
        # right after submitting sees it.
        self._demand += 1
        task = asyncio.create_task(self._run_lane(key))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run_lane(self, key: Hashable) -> None:
        lane = self._lanes[key]
        try:
            while lane and not self._closed.is_set():
                job = lane[0]
                async with self._slots:
                    if self._closed.is_set():
                        return
                    try:
                        retry_in = await job()
                    except Exception:
                        # A job settles its own message; an escape here is a bug, not a reason
                        # to stall the other jobs of this key.
                        log.exception("scheduler.job_failed")
                        retry_in = None
                if retry_in is None:
                    lane.popleft()
                    continue
                self._drop_demand()
                try:
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(retry_in):
                            await self._closed.wait()
                finally:
                    self._demand += 1
        finally:
            self._lanes.pop(key, None)
            self._drop_demand()

    def _drop_demand(self) -> None:
        self._demand -= 1
        if self._on_demand_drop is not None:
            self._on_demand_drop()

    def close(self) -> None:
        """Start no more jobs; queued jobs that have not started (or wait to retry) are
        dropped."""
        self._closed.set()

    async def join(self, timeout: float | None = None) -> bool:
        """Wait for running lanes to finish; True if all finished within `timeout`."""
        if not self._tasks:
            return True
        _, pending = await asyncio.wait(set(self._tasks), timeout=timeout)
        return not pending

    async def cancel(self) -> None:
        """Cancel the running jobs and wait until they have unwound."""
        await asyncio.gather(*(cancel_and_wait(task) for task in set(self._tasks)))
