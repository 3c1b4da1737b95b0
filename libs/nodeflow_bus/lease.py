"""Leader election with a lease in the `leases` KV bucket: one active replica per controller.

The leader writes `{holder, renewed_at}` every ttl/3 with a compare-and-set on the revision it
wrote last. Others watch the key: a holder is considered dead when the key's revision has not
changed for `ttl`, measured on the local monotonic clock from when the change was seen (never
comparing clocks across machines); they then take over with a compare-and-set on that revision,
so at most one wins. A leader that cannot renew for `ttl` (measured from before its last
successful renewal was sent, so it always gives up before anyone can take over) steps down.
Releasing on a graceful stop deletes the key, so a follower takes over at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time
from collections.abc import Awaitable, Callable

import msgspec
import nats.errors
import nats.js.errors
import structlog
from nats.js.kv import KeyValue

from nodeflow_bus import metrics
from nodeflow_bus.connection import Bus
from nodeflow_bus.kv_view import KVView
from nodeflow_bus.tasks import cancel_and_wait
from nodeflow_contracts import codec
from nodeflow_contracts.topology import LEASES_BUCKET

log = structlog.get_logger("nodeflow_bus")

LeadershipListener = Callable[[bool], Awaitable[None] | None]

_WRITE_ERRORS: tuple[type[BaseException], ...] = (
    nats.errors.Error,
    OSError,
    asyncio.TimeoutError,
)
_RELEASE_ERRORS: tuple[type[BaseException], ...] = (*_WRITE_ERRORS, nats.js.errors.APIError)


class LeaseRecord(msgspec.Struct, frozen=True, kw_only=True):
    holder: str
    # Wall-clock time of the renewal, for people reading the bucket; never used to decide.
    renewed_at: float
    ttl_seconds: float


def default_holder_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{os.urandom(3).hex()}"


def follower_may_take_over(observed_at: float, now: float, ttl: float) -> bool:
    """True when the lease revision seen at `observed_at` is older than `ttl` (monotonic)."""
    return now - observed_at >= ttl


def leader_still_valid(renew_sent_at: float, now: float, ttl: float) -> bool:
    """A leader is valid until `ttl` after it *sent* its last successful renewal."""
    return now - renew_sent_at < ttl


class LeaderLease:
    """Usage: `lease = LeaderLease(bus, "nodeset-controller", ttl=15); await lease.start()`;
    act only while `lease.is_leader`; `await lease.stop()` releases it.

    Listeners get True on gaining and False on losing leadership.
    """

    def __init__(
        self,
        bus: Bus,
        name: str,
        *,
        holder: str | None = None,
        ttl: float = 15.0,
        bucket: str = LEASES_BUCKET,
    ) -> None:
        if ttl <= 0:
            raise ValueError("ttl must be positive")
        self._bus = bus
        self.name = name
        self.holder = holder or default_holder_id()
        self.ttl = ttl
        self.bucket = bucket
        self._kv: KeyValue | None = None
        self._view: KVView[bytes] = KVView(bus, bucket, bytes, keys=name)
        self._leader = False
        self._revision: int | None = None
        self._renew_sent_at = 0.0
        self._observed_revision: int | None = None
        self._observed_at = time.monotonic()
        self._changed = asyncio.Event()
        self._stopping = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._listeners: list[LeadershipListener] = []
        self.gained = asyncio.Event()
        self.lost = asyncio.Event()
        self._gauge = metrics.LEASE_IS_LEADER.labels(name)

    # --- state ---------------------------------------------------------------------------

    @property
    def is_leader(self) -> bool:
        return self._leader and leader_still_valid(self._renew_sent_at, time.monotonic(), self.ttl)

    def add_listener(self, listener: LeadershipListener) -> None:
        self._listeners.append(listener)

    async def wait_until_leader(self, timeout: float | None = None) -> None:
        await asyncio.wait_for(self.gained.wait(), timeout)

    async def _set_leader(self, leader: bool, reason: str) -> None:
        if leader == self._leader:
            return
        self._leader = leader
        self._gauge.set(1 if leader else 0)
        metrics.LEASE_TRANSITIONS.labels(self.name, "gained" if leader else "lost").inc()
        if leader:
            self.lost.clear()
            self.gained.set()
        else:
            self.gained.clear()
            self.lost.set()
            self._revision = None
        log.info(
            "lease.gained" if leader else "lease.lost",
            lease=self.name,
            holder=self.holder,
            reason=reason,
        )
        for listener in list(self._listeners):
            try:
                result = listener(leader)
                if result is not None:
                    await result
            except Exception:
                log.exception("lease.listener_failed", lease=self.name)

    # --- lifecycle -----------------------------------------------------------------------

    async def start(self) -> None:
        if self._task is not None:
            raise RuntimeError("the lease was already started")
        self._kv = await self._bus.js.key_value(self.bucket)
        self._view.add_listener(self._on_change)
        await self._view.start()
        self._task = asyncio.create_task(self._run())

    async def stop(self, *, release: bool = True) -> None:
        """Stop campaigning; `release` deletes the key so a follower takes over at once."""
        self._stopping.set()
        self._changed.set()
        if self._task is not None:
            await cancel_and_wait(self._task)
        was_leader = self._leader
        revision = self._revision
        await self._set_leader(False, "stopped")
        if release and was_leader and revision is not None and self._kv is not None:
            try:
                await self._kv.delete(self.name, last=revision)
                log.info("lease.released", lease=self.name, holder=self.holder)
            except _RELEASE_ERRORS as exc:
                log.warning("lease.release_failed", lease=self.name, error=str(exc))
        await self._view.stop()

    def _on_change(self, key: str, old: bytes | None, new: bytes | None) -> None:
        self._observed_revision = self._view.revision(key)
        self._observed_at = time.monotonic()
        self._changed.set()

    # --- the campaign ----------------------------------------------------------------------

    def _record(self) -> bytes:
        return codec.encode(
            LeaseRecord(holder=self.holder, renewed_at=time.time(), ttl_seconds=self.ttl)
        )

    async def _run(self) -> None:
        await self._view.ready.wait()
        while not self._stopping.is_set():
            try:
                if self._leader:
                    await self._lead()
                else:
                    await self._follow()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("lease.step_failed", lease=self.name)
                await asyncio.sleep(min(1.0, self.ttl / 6))

    async def _lead(self) -> None:
        assert self._kv is not None
        await self._sleep(self._renew_sent_at + self.ttl / 3 - time.monotonic())
        if self._stopping.is_set():
            return
        sent_at = time.monotonic()
        try:
            self._revision = await asyncio.wait_for(
                self._kv.update(self.name, self._record(), last=self._revision),
                timeout=max(0.1, self.ttl / 3),
            )
            self._renew_sent_at = sent_at
        except nats.js.errors.KeyWrongLastSequenceError:
            await self._set_leader(False, "taken over")
        except _WRITE_ERRORS as exc:
            if not leader_still_valid(self._renew_sent_at, time.monotonic(), self.ttl):
                await self._set_leader(False, f"cannot renew: {type(exc).__name__}")
            else:
                log.warning("lease.renew_failed", lease=self.name, error=str(exc))
                await self._sleep(min(self.ttl / 6, 1.0))

    async def _follow(self) -> None:
        assert self._kv is not None
        current = self._view.get(self.name)
        revision = self._view.revision(self.name)
        now = time.monotonic()
        if current is None:
            await self._try_acquire(None)
            return
        if revision != self._observed_revision:
            # Seen by the view without a callback yet (e.g. the first snapshot).
            self._observed_revision = revision
            self._observed_at = now
        if self._holder_of(current) == self.holder or follower_may_take_over(
            self._observed_at, now, self.ttl
        ):
            await self._try_acquire(revision)
            return
        self._changed.clear()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._changed.wait(), self._observed_at + self.ttl - now)

    def _holder_of(self, value: bytes) -> str | None:
        try:
            return codec.decode(LeaseRecord, value, subject=f"$KV.{self.bucket}.{self.name}").holder
        except ValueError:
            return None

    async def _try_acquire(self, revision: int | None) -> None:
        """Create the key (revision None) or take over the revision seen as expired."""
        assert self._kv is not None
        sent_at = time.monotonic()
        try:
            if revision is None:
                new_revision = await self._kv.create(self.name, self._record())
            else:
                new_revision = await self._kv.update(self.name, self._record(), last=revision)
        except nats.js.errors.KeyWrongLastSequenceError:
            # Someone else wrote first: start the clock again from what is there now.
            await self._refresh_observed()
            return
        except _WRITE_ERRORS as exc:
            log.warning("lease.acquire_failed", lease=self.name, error=str(exc))
            await self._sleep(min(self.ttl / 6, 1.0))
            return
        self._revision = new_revision
        self._renew_sent_at = sent_at
        await self._set_leader(True, "created" if revision is None else "took over")

    async def _refresh_observed(self) -> None:
        assert self._kv is not None
        try:
            entry = await self._kv.get(self.name)
        except nats.js.errors.NotFoundError:
            # Deleted (released) in between: try again right away.
            return
        except _WRITE_ERRORS:
            await self._sleep(min(self.ttl / 6, 1.0))
            return
        if entry.revision != self._observed_revision:
            self._observed_revision = entry.revision
            self._observed_at = time.monotonic()

    async def _sleep(self, seconds: float) -> None:
        if seconds <= 0:
            return
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), seconds)
