"""serve(): the server always stops promptly, even with watches racing the shutdown."""

from __future__ import annotations

import asyncio
import time

import aiohttp

from clustersim.kube.server import Faults, serve
from clustersim.kube.store import Store

WATCH = "/api/v1/namespaces/default/configmaps?watch=true"


async def _drain(session: aiohttp.ClientSession, url: str) -> int:
    async with session.get(url) as response:
        async for _ in response.content:
            pass
        return response.status


async def test_watch_in_flight_during_shutdown_does_not_hold_the_server() -> None:
    # The injected latency holds the watch request inside its handler until after the
    # shutdown began: it registers its watch only then, which used to keep aiohttp waiting.
    async with aiohttp.ClientSession() as session:
        context = serve(Store(), faults=Faults(latency_ms=150))
        server = await context.__aenter__()
        watch = asyncio.create_task(_drain(session, server.url + WATCH))
        await asyncio.sleep(0.05)
        started = time.monotonic()
        await asyncio.wait_for(context.__aexit__(None, None, None), 10)
        elapsed = time.monotonic() - started
        assert elapsed < 1.0, f"shutdown took {elapsed:.2f}s"
        assert await asyncio.wait_for(watch, 5) == 200  # the watch ended cleanly


async def test_reconnecting_watchers_do_not_hold_the_server() -> None:
    stop = asyncio.Event()

    async def informer(session: aiohttp.ClientSession, url: str) -> None:
        while not stop.is_set():
            try:
                await _drain(session, url)
            except aiohttp.ClientError:
                await asyncio.sleep(0.01)

    async with aiohttp.ClientSession() as session:
        context = serve(Store())
        server = await context.__aenter__()
        tasks = [asyncio.create_task(informer(session, server.url + WATCH)) for _ in range(4)]
        await asyncio.sleep(0.2)
        started = time.monotonic()
        await asyncio.wait_for(context.__aexit__(None, None, None), 10)
        elapsed = time.monotonic() - started
        stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks), 5)
        assert elapsed < 1.0, f"shutdown took {elapsed:.2f}s"


async def test_open_watches_end_and_the_store_outlives_the_server() -> None:
    store = Store()
    async with aiohttp.ClientSession() as session:
        async with serve(store) as server:
            watch = asyncio.create_task(_drain(session, server.url + WATCH))
            await asyncio.sleep(0.1)
            assert not watch.done()
        assert await asyncio.wait_for(watch, 5) == 200
    store.create("configmaps", {"metadata": {"name": "after", "namespace": "default"}})
    async with (
        serve(store) as again,
        aiohttp.ClientSession() as session,
        session.get(f"{again.url}/api/v1/namespaces/default/configmaps/after") as response,
    ):
        assert response.status == 200
