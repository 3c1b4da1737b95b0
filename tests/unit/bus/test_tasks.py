from __future__ import annotations

import asyncio
import contextlib

from nodeflow_bus.tasks import cancel_and_wait


async def test_a_task_that_swallows_one_cancel_is_still_stopped() -> None:
    swallowed: list[bool] = []

    async def stubborn() -> None:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            # What asyncio.wait_for can do on Python 3.11 when a result races the cancel.
            swallowed.append(True)
        await asyncio.sleep(10)

    task = asyncio.create_task(stubborn())
    await asyncio.sleep(0)
    assert await asyncio.wait_for(cancel_and_wait(task, retry_every=0.01), 2)
    assert swallowed == [True] and task.cancelled()


async def test_a_task_that_never_stops_is_abandoned_after_the_deadline() -> None:
    let_go = asyncio.Event()

    async def stubborn_until_let_go() -> None:
        while not let_go.is_set():
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.sleep(10)

    task = asyncio.create_task(stubborn_until_let_go())
    await asyncio.sleep(0)
    # Returns (wait_for would raise otherwise), reporting that the task did not end.
    ended = await asyncio.wait_for(cancel_and_wait(task, retry_every=0.01, deadline=0.2), 30)
    assert not ended and not task.done()
    let_go.set()
    assert await cancel_and_wait(task)
