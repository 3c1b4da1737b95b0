from __future__ import annotations

import asyncio

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
    await asyncio.wait_for(cancel_and_wait(task, retry_every=0.01), 2)
    assert swallowed == [True] and task.cancelled()
