"""The ordering-key scheduler keeps per-key order and the concurrency limit."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from hypothesis import given, settings
from hypothesis import strategies as st

from nodeflow_bus import KeyedScheduler


async def run_jobs(
    keys: list[str | None], limit: int, delays: list[int]
) -> tuple[dict[str | None, list[int]], int]:
    scheduler = KeyedScheduler(limit)
    finished: dict[str | None, list[int]] = {}
    running = {"now": 0, "peak": 0}
    active_keys: set[str] = set()

    def job(index: int, key: str | None, delay: int) -> Callable[[], Awaitable[None]]:
        async def run() -> None:
            assert key is None or key not in active_keys, "same key ran concurrently"
            if key is not None:
                active_keys.add(key)
            running["now"] += 1
            running["peak"] = max(running["peak"], running["now"])
            for _ in range(delay):
                await asyncio.sleep(0)
            running["now"] -= 1
            if key is not None:
                active_keys.discard(key)
            finished.setdefault(key, []).append(index)

        return run

    for index, (key, delay) in enumerate(zip(keys, delays, strict=True)):
        scheduler.submit(key, job(index, key, delay))
        if index % 3 == 0:
            await asyncio.sleep(0)
    assert await scheduler.join(5)
    return finished, running["peak"]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.sampled_from(["a", "b", "c", None]), min_size=1, max_size=40).flatmap(
        lambda keys: st.tuples(
            st.just(keys),
            st.integers(1, 5),
            st.lists(st.integers(0, 4), min_size=len(keys), max_size=len(keys)),
        )
    )
)
def test_per_key_order_and_limit(case: tuple[list[str | None], int, list[int]]) -> None:
    keys, limit, delays = case
    finished, peak = asyncio.run(run_jobs(keys, limit, delays))
    for key in {"a", "b", "c"}:
        submitted = [index for index, k in enumerate(keys) if k == key]
        assert finished.get(key, []) == submitted
    assert sorted(i for indexes in finished.values() for i in indexes) == list(range(len(keys)))
    assert peak <= limit


async def test_close_drops_queued_jobs_and_cancel_stops_running_ones() -> None:
    scheduler = KeyedScheduler(2)
    gate = asyncio.Event()
    ran: list[int] = []

    def job(n: int) -> Callable[[], Awaitable[None]]:
        async def run() -> None:
            ran.append(n)
            await gate.wait()

        return run

    for n in range(3):
        scheduler.submit("k", job(n))
    await asyncio.sleep(0.01)
    scheduler.close()
    assert not await scheduler.join(0.05)
    await scheduler.cancel()
    assert ran == [0]
    assert scheduler.active_lanes == 0
