"""The start and stop of a leader-elected controller's I/O around its decision loop.

The controllers (nodeset-controller, topology-placer, maintenance-scheduler) each read KV
views, listen to the outcomes of the commands they send, hold a leader lease and run one loop
task. `LeaderLoop` owns that shell, so each starts and stops it in the same order: views
first (the loop itself waits until they are loaded before it decides), then the outcome
subscription, the lease and the loop; on stop the loop first, so that no decision is taken
on a closing view, and the views last.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any

from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from nodeflow_bus.connection import Bus
from nodeflow_bus.kv_view import KVView
from nodeflow_bus.lease import LeaderLease
from nodeflow_bus.tasks import cancel_and_wait


class LeaderLoop:
    def __init__(
        self,
        bus: Bus,
        lease: LeaderLease,
        views: Sequence[KVView[Any]],
        *,
        outcomes_subject: str,
        on_outcome: Callable[[Msg], Awaitable[None]],
        on_leadership: Callable[[bool], None],
        loop: Callable[[], Coroutine[Any, Any, None]],
        name: str,
    ) -> None:
        self.bus = bus
        self.lease = lease
        self.views = tuple(views)
        self.outcomes_subject = outcomes_subject
        self.on_outcome = on_outcome
        self.on_leadership = on_leadership
        self.loop = loop
        self.name = name
        self.task: asyncio.Task[None] | None = None
        self._subscription: Subscription | None = None

    async def start(self) -> None:
        """Start the views (their listeners added beforehand by the caller), subscribe to the
        outcomes, take part in the lease election and start the loop."""
        for view in self.views:
            await view.start()
        self._subscription = await self.bus.nc.subscribe(self.outcomes_subject, cb=self.on_outcome)
        self.lease.add_listener(self.on_leadership)
        await self.lease.start()
        self.task = asyncio.create_task(self.loop(), name=self.name)

    async def stop(self) -> None:
        """Stop the loop, then the subscription, release the lease and stop the views."""
        if self.task is not None:
            # One cancel() can be swallowed by nats-py's wait_for on Python 3.11.
            await cancel_and_wait(self.task)
        if self._subscription is not None:
            with contextlib.suppress(Exception):
                await self._subscription.unsubscribe()
        await self.lease.stop()
        for view in reversed(self.views):
            await view.stop()
