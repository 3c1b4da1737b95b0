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


async def test_a_job_waiting_to_retry_gives_its_slot_to_other_keys() -> None:
    dropped: list[int] = []
    scheduler = KeyedScheduler(1, on_demand_drop=lambda: dropped.append(scheduler.demand))
    ran: list[str] = []

    async def retry_once() -> float | None:
        ran.append("slow")
        return 0.3 if ran.count("slow") == 1 else None

    async def quick() -> None:
        ran.append("quick")

    scheduler.submit("slow", retry_once)
    scheduler.submit("slow", quick)  # same key: waits behind the retrying job
    scheduler.submit("other", quick)
    assert scheduler.demand == 2
    await asyncio.sleep(0.1)
    # The other key ran while the slow one waited, with the only slot.
    assert ran == ["slow", "quick"]
    assert scheduler.demand == 0 and dropped
    assert await scheduler.join(2)
    assert ran == ["slow", "quick", "slow", "quick"]


async def test_close_wakes_jobs_waiting_to_retry() -> None:
    scheduler = KeyedScheduler(1)

    async def forever_retrying() -> float:
        return 60.0

    scheduler.submit("k", forever_retrying)
    await asyncio.sleep(0.01)
    scheduler.close()
    assert await scheduler.join(1)
