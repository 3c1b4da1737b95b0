"""The start and stop of a leader-elected controller's I/O around its decision loop.

The controllers (nodeset-controller, topology-placer, maintenance-scheduler) each read KV
views, listen to the outcomes of the commands they send, hold a leader lease and run one loop
task. `LeaderLoop` owns that shell, so each starts and stops it in the same order: views
first (the loop itself waits until they are loaded before it decides), then the outcome
subscription, the lease and the loop; on stop the loop first, so that no decision is taken
on a closing view, and the views last.

The loop must run until `stop()`: one round's exception is caught (`run_round`), and if the
loop task ends anyway, `watch()` raises, so the process exits (`ServiceContext.spawn`)
instead of holding the lease and deciding nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any

import structlog
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from nodeflow_bus.connection import Bus
from nodeflow_bus.kv_view import KVView
from nodeflow_bus.lease import LeaderLease
from nodeflow_bus.ledger import LedgerNotReady
from nodeflow_bus.tasks import cancel_and_wait

log = structlog.get_logger("nodeflow_bus.leader_loop")

# How long a loop waits after a failed round before the next.
ROUND_RETRY_SECONDS = 1.0


async def run_round(
    round_: Callable[[], Awaitable[object]],
    *,
    event: str,
    retry_after: float = ROUND_RETRY_SECONDS,
    **context: Any,
) -> bool:
    """Run one decision round of a leader's loop; True if it completed.

    An exception must not end the loop: the lease keeps being renewed by its own task, so a
    dead loop would keep the lead and decide nothing. `LedgerNotReady` (the lease lapsed
    between the loop's leadership check and the send) skips the round quietly; anything else
    (a JetStream publish timeout) is logged as `event` with `context` and the loop backs off
    `retry_after` before its next round, which decides again from the views.
    """
    try:
        await round_()
    except LedgerNotReady as exc:
        log.info("round.skipped_ledger_not_ready", loop=event, reason=str(exc), **context)
        return False
    except Exception:
        log.exception(event, retry_in=retry_after, **context)
        await asyncio.sleep(retry_after)
        return False
    return True


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
        self._stopping = False

    async def start(self) -> None:
        """Start the views (their listeners added beforehand by the caller), subscribe to the
        outcomes, take part in the lease election and start the loop."""
        for view in self.views:
            await view.start()
        self._subscription = await self.bus.nc.subscribe(self.outcomes_subject, cb=self.on_outcome)
        self.lease.add_listener(self.on_leadership)
        await self.lease.start()
        self.task = asyncio.create_task(self.loop(), name=self.name)

    async def watch(self) -> None:
        """Wait for the loop task, which only `stop()` ends: if it ends otherwise (returned,
        raised, cancelled by someone else), raise, so the task running `watch` (spawned with
        `ServiceContext.spawn`) fails and the process exits to be restarted, rather than
        staying up and leading with no loop."""
        if self.task is None:
            raise RuntimeError(f"{self.name} was not started")
        # asyncio.wait, not `await self.task`: cancelling the watch must not cancel the loop.
        await asyncio.wait({self.task})
        if self._stopping:
            return
        error = None if self.task.cancelled() else self.task.exception()
        log.error("leader_loop.ended", loop=self.name, error=repr(error))
        raise RuntimeError(f"{self.name} ended unexpectedly") from error

    async def stop(self) -> None:
        """Stop the loop, then the subscription, release the lease and stop the views."""
        self._stopping = True
        if self.task is not None:
            # One cancel() can be swallowed by nats-py's wait_for on Python 3.11.
            await cancel_and_wait(self.task)
        if self._subscription is not None:
            with contextlib.suppress(Exception):
                await self._subscription.unsubscribe()
        await self.lease.stop()
        for view in reversed(self.views):
            await view.stop()
