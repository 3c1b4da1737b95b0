"""A tiny controller runtime for in-process actors over the store.

Store listeners are synchronous and fire inside a store write, so they only enqueue keys;
a worker task drains the queue and calls `reconcile(key)`, which runs without awaiting and
therefore sees and changes the store atomically with respect to every other actor and the
HTTP server (all on one event loop).
"""

from __future__ import annotations

import asyncio
import contextlib
from abc import ABC, abstractmethod
from collections.abc import Hashable, Iterable
from typing import Any, Generic, TypeVar

import structlog

from clustersim.kube.errors import ApiError
from clustersim.kube.store import Store

K = TypeVar("K", bound=Hashable)
Obj = dict[str, Any]

log = structlog.get_logger("clustersim.cluster")

RETRY_AFTER_ERROR = 0.2


class WorkQueue(Generic[K]):
    """Deduplicating FIFO of keys with delayed re-adds."""

    def __init__(self) -> None:
        self._pending: dict[K, None] = {}
        self._ready = asyncio.Event()
        self._timers: dict[K, asyncio.TimerHandle] = {}

    def add(self, key: K) -> None:
        self._pending[key] = None
        self._ready.set()

    def add_after(self, key: K, delay: float) -> None:
        """Re-add `key` after `delay` seconds; an earlier pending timer for it wins."""
        if delay <= 0:
            self.add(key)
            return
        loop = asyncio.get_running_loop()
        due = loop.time() + delay
        existing = self._timers.get(key)
        if existing is not None and existing.when() <= due:
            return
        if existing is not None:
            existing.cancel()
        self._timers[key] = loop.call_at(due, self._fire, key)

    def _fire(self, key: K) -> None:
        self._timers.pop(key, None)
        self.add(key)

    async def get(self) -> K:
        while not self._pending:
            self._ready.clear()
            await self._ready.wait()
        key = next(iter(self._pending))
        del self._pending[key]
        return key

    def __len__(self) -> int:
        return len(self._pending)

    def close(self) -> None:
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()


class Controller(ABC, Generic[K]):
    """Subclasses map store events to keys (`keys_for`) and act on a key (`reconcile`)."""

    name = "controller"
    watched: tuple[str, ...] = ()

    def __init__(self, store: Store) -> None:
        self.store = store
        self.queue: WorkQueue[K] = WorkQueue()
        self._running = False
        self._listening = False

    @abstractmethod
    def keys_for(self, resource: str, event: str, obj: Obj, old: Obj | None) -> Iterable[K]:
        """The keys a store event concerns."""

    @abstractmethod
    def initial_keys(self) -> Iterable[K]:
        """The keys to reconcile when the controller starts."""

    @abstractmethod
    def reconcile(self, key: K) -> float | None:
        """Do one step for `key`; return seconds after which to look again, or None."""

    def _on_store_event(self, resource: str, event: str, obj: Obj, old: Obj | None) -> None:
        if not self._running or resource not in self.watched:
            return
        for key in self.keys_for(resource, event, obj, old):
            self.queue.add(key)

    async def run(self) -> None:
        if not self._listening:
            # The store has no way to remove a listener; `_running` gates it instead.
            self.store.add_listener(self._on_store_event)
            self._listening = True
        self._running = True
        for key in self.initial_keys():
            self.queue.add(key)
        try:
            while True:
                key = await self.queue.get()
                self._step(key)
                # Let the HTTP server and the other actors in between reconciles.
                await asyncio.sleep(0)
        finally:
            self._running = False
            self.queue.close()

    def _step(self, key: K) -> None:
        try:
            again = self.reconcile(key)
        except ApiError as exc:
            log.debug("reconcile conflict", controller=self.name, key=key, error=str(exc))
            again = RETRY_AFTER_ERROR
        except Exception:
            log.exception("reconcile failed", controller=self.name, key=key)
            again = RETRY_AFTER_ERROR * 5
        if again is not None:
            self.queue.add_after(key, again)


async def cancel_tasks(tasks: Iterable[asyncio.Task[Any]]) -> None:
    pending = [t for t in tasks if not t.done()]
    for task in pending:
        task.cancel()
    for task in pending:
        with contextlib.suppress(asyncio.CancelledError):
            await task


def pod_key(obj: Obj) -> tuple[str, str]:
    meta = obj["metadata"]
    return (str(meta.get("namespace", "default")), str(meta["name"]))
