"""Leader election with a lease in the `leases` KV bucket: one active replica per controller.

The leader writes `{holder, renewed_at}` every ttl/3 with a compare-and-set on the revision it
wrote last. Others watch the key: a holder is considered dead when the key's revision has not
changed for `ttl + margin` (margin = ttl/5), measured on the local monotonic clock from when
the change was seen (never comparing clocks across machines); they then take over with a
compare-and-set on that revision, so at most one wins. Nobody skips that wait, not even a
process that finds its own name in the key: a restarted process (or a second one given the
same INSTANCE_ID) cannot tell its old self's lease from a live twin's, so it waits the TTL like
anyone else. Each LeaderLease writes a random token of its own next to the holder name, and
only that token counts as "this replica wrote it".

A leader is valid until `ttl - margin` after it *sent* its last successful renewal (a follower
sees that renewal no earlier than it was sent), so it steps down at least 2 x margin before
anyone may take over, whatever its requests do: each renewal attempt waits at most until that
expiry, and "lost" fires when the expiry passes without a renewal. A renewal refused because
the revision moved is checked against the key: if it still names this replica, an earlier
renewal was written but its reply was lost, and the leader adopts the new revision instead of
stepping down. Releasing on a graceful stop deletes the key, so a follower takes over at once.
A dead leader is replaced within ttl + margin.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import socket
import time
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
import nats.errors
import nats.js.errors
import structlog
from nats.js.kv import KeyValue

from nodeflow_bus import metrics
from nodeflow_bus.connection import Bus
from nodeflow_bus.kube_lease import KubeLeaseMirror
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
    # Random per LeaderLease object: tells this campaign from any other with the same holder.
    token: str = ""


def default_holder_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{os.urandom(3).hex()}"


def lease_margin(ttl: float) -> float:
    """Slack on each side of the TTL for timer and scheduling delays."""
    return ttl / 5


def follower_may_take_over(observed_at: float, now: float, ttl: float) -> bool:
    """True when the lease revision seen at `observed_at` is older than `ttl + margin`."""
    return now - observed_at >= ttl + lease_margin(ttl)


def leader_expiry(renew_sent_at: float, ttl: float) -> float:
    """When a leader whose last successful renewal was sent at `renew_sent_at` must stop."""
    return renew_sent_at + ttl - lease_margin(ttl)


def leader_still_valid(renew_sent_at: float, now: float, ttl: float) -> bool:
    return now < leader_expiry(renew_sent_at, ttl)


def _retrieve_outcome(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()


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
        self.token = secrets.token_hex(8)
        # Why leadership last changed ("created", "took over", "lease expired ..."): for logs
        # and for tests that must tell a hand-over on release from a takeover on expiry.
        self.last_transition: str | None = None
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
        # Who leads, shown where kubectl looks too (a Kubernetes Lease), when the service
        # asks for it; first among the listeners, so it is in place before any other runs.
        target = bus.options.kube_lease
        if target is not None:
            self._listeners.append(KubeLeaseMirror(bus, self, target).on_leadership)

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
        self.last_transition = reason
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
                async with asyncio.timeout(self.ttl / 3):
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
            LeaseRecord(
                holder=self.holder, renewed_at=time.time(), ttl_seconds=self.ttl, token=self.token
            )
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
                pause = min(1.0, self.ttl / 6)
                if self._leader:
                    # Wake up in time to step down at the expiry.
                    expiry = leader_expiry(self._renew_sent_at, self.ttl)
                    pause = min(pause, max(0.0, expiry - time.monotonic()))
                await asyncio.sleep(pause)

    async def _lead(self) -> None:
        assert self._kv is not None
        await self._sleep(self._renew_sent_at + self.ttl / 3 - time.monotonic())
        if self._stopping.is_set():
            return
        now = time.monotonic()
        expiry = leader_expiry(self._renew_sent_at, self.ttl)
        if now >= expiry:
            await self._set_leader(False, "lease expired before a renewal succeeded")
            return
        update = asyncio.ensure_future(
            self._kv.update(self.name, self._record(), last=self._revision)
        )
        try:
            # The wait ends at the expiry even if the request ignores its own timeout.
            done, _ = await asyncio.wait({update}, timeout=min(self.ttl / 3, expiry - now))
        finally:
            if not update.done():
                update.cancel()
                update.add_done_callback(_retrieve_outcome)
        if not done:
            if time.monotonic() >= expiry:
                await self._set_leader(False, "renewal unanswered until the lease expired")
            else:
                log.warning("lease.renew_failed", lease=self.name, error="timed out")
            return
        error = update.exception()
        if error is None:
            self._revision = update.result()
            self._renew_sent_at = now
        elif isinstance(error, nats.js.errors.KeyWrongLastSequenceError):
            await self._check_holder(expiry)
        elif isinstance(error, _WRITE_ERRORS):
            if not leader_still_valid(self._renew_sent_at, time.monotonic(), self.ttl):
                await self._set_leader(False, f"cannot renew: {type(error).__name__}")
            else:
                log.warning("lease.renew_failed", lease=self.name, error=str(error))
                await self._sleep(min(self.ttl / 6, 1.0, expiry - time.monotonic()))
        else:
            raise error

    async def _check_holder(self, expiry: float) -> None:
        """After a renewal was refused for a moved revision: adopt it if this replica wrote it
        (the reply to an earlier renewal was lost), else step down."""
        assert self._kv is not None
        try:
            async with asyncio.timeout(max(0.0, expiry - time.monotonic())):
                entry = await self._kv.get(self.name)
        except nats.js.errors.NotFoundError:
            await self._set_leader(False, "lease deleted")
            return
        except _WRITE_ERRORS as exc:
            # Unknown: keep the old revision; the next renewal conflicts and asks again.
            if not leader_still_valid(self._renew_sent_at, time.monotonic(), self.ttl):
                await self._set_leader(False, f"cannot read the lease: {type(exc).__name__}")
            return
        record = self._record_of(entry.value or b"")
        if record is None or record.token != self.token:
            holder = record.holder if record else None
            await self._set_leader(False, f"taken over by {holder}")
            return
        # Keep renew_sent_at: when the adopted write was sent is unknown, but not earlier.
        log.info("lease.revision_adopted", lease=self.name, revision=entry.revision)
        self._revision = entry.revision

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
        if follower_may_take_over(self._observed_at, now, self.ttl):
            await self._try_acquire(revision)
            return
        self._changed.clear()
        take_over_at = self._observed_at + self.ttl + lease_margin(self.ttl)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._changed.wait(), take_over_at - now)

    def _record_of(self, value: bytes) -> LeaseRecord | None:
        try:
            return codec.decode(LeaseRecord, value, subject=f"$KV.{self.bucket}.{self.name}")
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
        if not leader_still_valid(sent_at, time.monotonic(), self.ttl):
            # Answered too late to lead on it: follow the revision just written like any
            # other, so whoever outlasts it (this replica included) takes over after the TTL.
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
