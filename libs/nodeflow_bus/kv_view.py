"""A materialized view of a KV bucket: an informer over NATS.

It loads a snapshot (the last value of every key), sets `ready`, then applies live updates.
After any reconnect (a NATS restart included) it takes a fresh snapshot and diffs it against
what it holds, so puts *and deletes* made while it was disconnected become changes too.

Changes reach listeners as (key, old, new); old/new is None for a key that did not exist or
was deleted. Values are decoded with the contracts codec into `value_type` (`bytes` keeps the
raw payload, `dict` gives plain JSON). A value that does not decode is logged, counted, and
left out of the view (as if deleted), never crashing the watch.

Snapshot diffs and live updates reach listeners through one ordered path, so a listener never
sees a live change followed by an older one.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import nats.errors
import structlog
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import DeliverPolicy

from nodeflow_bus import metrics
from nodeflow_bus.backoff import Backoff
from nodeflow_bus.connection import Bus, ConnectionState
from nodeflow_bus.declare import kv_stream_name
from nodeflow_bus.errors import BusError
from nodeflow_bus.tasks import cancel_and_wait
from nodeflow_contracts import codec
from nodeflow_contracts.codec import ContractDecodeError

log = structlog.get_logger("nodeflow_bus")

V = TypeVar("V")

KV_OPERATION = "KV-Operation"
MARKER_REASON = "Nats-Marker-Reason"
_DELETE_OPERATIONS = frozenset({"DEL", "PURGE"})
_DELETE_MARKER_REASONS = frozenset({"MaxAge", "Purge", "Remove"})

ChangeListener = Callable[[str, V | None, V | None], Awaitable[None] | None]


class _SnapshotInterrupted(Exception):
    pass


class ChangesOverflowError(BusError):
    """A `changes()` reader fell too far behind and missed changes: re-read the view (it is
    complete and current) and start a new `changes()`."""


@dataclass(frozen=True)
class Change(Generic[V]):
    key: str
    old: V | None
    new: V | None


class _ChangeQueue(Generic[V]):
    """A bounded queue of changes for one `changes()` reader; overflowing ends it with an
    error rather than dropping changes unnoticed."""

    def __init__(self, max_pending: int) -> None:
        self._items: asyncio.Queue[Change[V] | None] = asyncio.Queue()
        self._max_pending = max_pending
        self._overflowed = False

    def put(self, change: Change[V]) -> None:
        if self._overflowed:
            return
        if self._items.qsize() >= self._max_pending:
            self._overflowed = True
            return
        self._items.put_nowait(change)

    def end(self) -> None:
        self._items.put_nowait(None)

    async def get(self) -> Change[V] | None:
        if self._overflowed:
            raise ChangesOverflowError(
                f"a changes() reader fell more than {self._max_pending} changes behind"
            )
        return await self._items.get()


@dataclass(frozen=True)
class _Entry(Generic[V]):
    value: V
    revision: int


def is_delete(headers: dict[str, str] | None) -> bool:
    """A KV delete/purge marker, or a server-placed expiry marker (nats-server 2.11+)."""
    if not headers:
        return False
    if headers.get(KV_OPERATION) in _DELETE_OPERATIONS:
        return True
    return headers.get(MARKER_REASON) in _DELETE_MARKER_REASONS


def diff_snapshot(
    current: dict[str, _Entry[V]], snapshot: dict[str, _Entry[V]]
) -> list[tuple[str, _Entry[V] | None, _Entry[V] | None]]:
    """Changes that turn `current` into `snapshot` (same revision means same value)."""
    changes: list[tuple[str, _Entry[V] | None, _Entry[V] | None]] = []
    for key, new in snapshot.items():
        old = current.get(key)
        if old is None or old.revision != new.revision:
            changes.append((key, old, new))
    for key, old in current.items():
        if key not in snapshot:
            changes.append((key, old, None))
    return changes


# Longer strings (messages, last-applied copies) are seldom repeated.
SHARED_STRING_MAX_LENGTH = 64


def share_strings(value: Any) -> Any:
    """`value` (decoded JSON) with every short string in it replaced, in place, by the one
    shared copy of its text (sys.intern). A cluster's objects repeat the same few values
    thousands of times (condition types and statuses, phases, timestamps of one second, label
    values, images, quantities): decoded afresh, each is its own string, and at 50,000 pods
    those copies are a third of a projected pod's memory. Interned strings are freed when no
    object holds them any more."""
    slots: Iterable[tuple[Any, Any]]
    if type(value) is dict:
        slots = value.items()  # values are replaced, never added: iterating stays valid
    elif type(value) is list:
        slots = enumerate(value)
    else:
        return value
    for slot, item in slots:
        item_kind = type(item)
        if item_kind is str:
            if len(item) <= SHARED_STRING_MAX_LENGTH:
                value[slot] = sys.intern(item)
        elif item_kind is dict or item_kind is list:
            share_strings(item)
    return value


class KVView(Generic[V]):
    """Usage: `view = KVView(bus, "k8s_pods", Pod); await view.start(); await view.ready.wait()`.

    `keys` is a KV key pattern ('>' for all, 'ns.*', or one key). `start()` returns once the
    watch is set up; `ready` is set when the first snapshot is loaded. Listeners added before
    `start()` also receive the snapshot as (key, None, value) changes.

    `project`, when given, is applied to every decoded value before the view keeps it: it
    returns what to keep (e.g. the object without the fields its reader never looks at), or
    None to leave the key out of the view as if it did not exist (a value that stops
    matching reaches listeners as a deletion). At 50,000 pods the full objects are most of a
    service's memory. `KVView.projected` makes a view that keeps another type than it decodes
    (a pod decoded as a dict, kept as a small record of the facts its reader uses). A kept
    dict has its short strings shared (`share_strings`).
    """

    def __init__(
        self,
        bus: Bus,
        bucket: str,
        value_type: type[V],
        *,
        keys: str = ">",
        resync_backoff: Backoff | None = None,
        idle_heartbeat: float = 5.0,
        track_deletes: bool = False,
        project: Callable[[V], V | None] | None = None,
    ) -> None:
        self._bus = bus
        self.bucket = bucket
        self._decode_type: type[Any] = value_type
        self._project = project
        self._filter = keys
        self._prefix = f"$KV.{bucket}."
        self._stream = kv_stream_name(bucket)
        self._resync_backoff = resync_backoff or Backoff(initial=0.1, maximum=5.0)
        self._idle_heartbeat = idle_heartbeat
        self._entries: dict[str, _Entry[V]] = {}
        # Key -> revision of its delete marker, while the key stays deleted (track_deletes).
        self._track_deletes = track_deletes
        self._deleted: dict[str, int] = {}
        self._snapshot_deleted: dict[str, int] = {}
        self._listeners: list[ChangeListener[V]] = []
        self._queues: list[_ChangeQueue[V]] = []
        # Live messages arrive on the subscription's task, the empty snapshot on ours: one lock
        # keeps what listeners see in order.
        self._order = asyncio.Lock()
        self.ready = asyncio.Event()
        self._resync = asyncio.Event()
        self._generation = 0
        self._snapshot: dict[str, _Entry[V]] | None = None
        self._snapshot_done = asyncio.Event()
        self._subscription: JetStreamContext.PushSubscription | None = None
        self._task: asyncio.Task[None] | None = None
        self._was_disconnected = False
        self._keys_gauge = metrics.KV_VIEW_KEYS.labels(bucket)
        self.last_revision = 0
        self.resyncs = 0

    # --- reading -----------------------------------------------------------------------------

    @classmethod
    def projected(
        cls,
        bus: Bus,
        bucket: str,
        decode_as: type[Any],
        project: Callable[[Any], V | None],
        **options: Any,
    ) -> KVView[V]:
        """A view whose values decode as `decode_as` and are kept as what `project` makes of
        them (None: left out); `options` as for the constructor."""
        view: KVView[V] = cls(bus, bucket, decode_as, project=project, **options)
        return view

    def get(self, key: str) -> V | None:
        entry = self._entries.get(key)
        return entry.value if entry is not None else None

    def revision(self, key: str) -> int | None:
        entry = self._entries.get(key)
        return entry.revision if entry is not None else None

    def deleted_revision(self, key: str) -> int | None:
        """Revision of the delete marker of a key that is deleted now (None: it exists, or it
        was never seen deleted). Each deletion has its own revision, so a writer can tell one
        incarnation of a key from the next; a resync reads it again from the stream.
        Requires `track_deletes=True`."""
        if not self._track_deletes:
            raise RuntimeError(f"KVView({self.bucket}) does not track deletes")
        return self._deleted.get(key)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._entries))

    def items(self) -> list[tuple[str, V]]:
        return [(key, entry.value) for key, entry in self._entries.items()]

    def as_dict(self) -> dict[str, V]:
        return {key: entry.value for key, entry in self._entries.items()}

    # --- listening ---------------------------------------------------------------------------

    def add_listener(self, listener: ChangeListener[V]) -> None:
        """Call `listener(key, old, new)` for every change (sync or async callable)."""
        self._listeners.append(listener)

    def remove_listener(self, listener: ChangeListener[V]) -> None:
        if listener in self._listeners:
            self._listeners.remove(listener)

    async def changes(self, max_pending: int = 10_000) -> AsyncIterator[Change[V]]:
        """Changes from now on, until the view stops.

        A reader more than `max_pending` changes behind raises ChangesOverflowError (memory
        stays bounded and the reader knows it missed some) instead of skipping silently.
        """
        if max_pending < 1:
            raise ValueError("max_pending must be at least 1")
        queue: _ChangeQueue[V] = _ChangeQueue(max_pending)
        self._queues.append(queue)
        try:
            while True:
                change = await queue.get()
                if change is None:
                    return
                yield change
        finally:
            if queue in self._queues:
                self._queues.remove(queue)

    async def _emit(self, key: str, old: V | None, new: V | None) -> None:
        if self._queues:
            change = Change(key, old, new)
            for queue in self._queues:
                queue.put(change)
        for listener in list(self._listeners):
            try:
                result = listener(key, old, new)
                if result is not None:
                    await result
            except Exception:
                log.exception("kv_view.listener_failed", bucket=self.bucket, key=key)

    # --- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        if self._task is not None:
            raise RuntimeError("the view was already started")
        self._bus.add_state_listener(self._on_connection_state)
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        self._bus.remove_state_listener(self._on_connection_state)
        if self._task is not None:
            await cancel_and_wait(self._task)
        await self._unsubscribe()
        for queue in self._queues:
            queue.end()

    def request_resync(self) -> None:
        """Take a fresh snapshot and diff it (done automatically after a reconnect)."""
        self._resync.set()

    def _on_connection_state(self, state: ConnectionState) -> None:
        if state in ("disconnected", "closed"):
            self._was_disconnected = True
        elif state == "connected" and self._was_disconnected:
            self._was_disconnected = False
            self.request_resync()

    async def _run(self) -> None:
        attempt = 0
        while True:
            self._resync.clear()
            try:
                await self._load_snapshot()
                attempt = 0
            except _SnapshotInterrupted:
                continue
            except (TimeoutError, nats.errors.Error, OSError) as exc:
                attempt += 1
                delay = self._resync_backoff.delay(attempt)
                log.warning(
                    "kv_view.watch_failed",
                    bucket=self.bucket,
                    attempt=attempt,
                    retry_in=delay,
                    error=f"{type(exc).__name__}: {exc}",
                )
                await asyncio.sleep(delay)
                continue
            await self._resync.wait()
            log.info("kv_view.resync_requested", bucket=self.bucket, keys=len(self._entries))

    async def _unsubscribe(self) -> None:
        subscription, self._subscription = self._subscription, None
        if subscription is not None:
            with contextlib.suppress(Exception):
                await subscription.unsubscribe()

    async def _load_snapshot(self) -> None:
        """Subscribe afresh (last value per key), collect the snapshot, apply its diff; the
        same subscription then carries the live updates. One view of the connection loads
        its snapshot at a time (Bus.snapshot_slot)."""
        async with self._bus.snapshot_slot:
            await self._load_snapshot_now()

    async def _load_snapshot_now(self) -> None:
        await self._unsubscribe()
        self._generation += 1
        generation = self._generation
        self._snapshot = {}
        self._snapshot_deleted = {}
        self._snapshot_done = asyncio.Event()

        async def on_message(msg: Msg) -> None:
            if generation == self._generation:
                await self._on_message(msg)

        js = self._bus.js
        self._subscription = await js.subscribe(
            self._prefix + self._filter,
            stream=self._stream,
            cb=on_message,
            ordered_consumer=True,
            deliver_policy=DeliverPolicy.LAST_PER_SUBJECT,
            idle_heartbeat=self._idle_heartbeat,
            inactive_threshold=max(30.0, 6 * self._idle_heartbeat),
        )
        if not self._snapshot_done.is_set():
            info = await self._subscription.consumer_info()
            # Nothing was or will be delivered: the snapshot is empty. (Checking what the
            # server delivered, not what arrived here: its reply can overtake the messages.)
            delivered = info.delivered.consumer_seq if info.delivered is not None else 0
            if info.num_pending == 0 and delivered == 0:
                async with self._order:
                    await self._finish_snapshot()
        # A reconnect while the snapshot loads makes it incomplete: start over.
        waits = {
            asyncio.create_task(self._snapshot_done.wait()),
            asyncio.create_task(self._resync.wait()),
        }
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()
        if not self._snapshot_done.is_set():
            raise _SnapshotInterrupted

    async def _on_message(self, msg: Msg) -> None:
        async with self._order:
            await self._on_message_in_order(msg)

    async def _on_message_in_order(self, msg: Msg) -> None:
        metadata = msg.metadata
        revision = metadata.sequence.stream
        key = msg.subject[len(self._prefix) :]
        self.last_revision = max(self.last_revision, revision)
        entry: _Entry[V] | None = None
        deleted = is_delete(msg.headers)
        if not deleted:
            entry = self._decode_entry(key, msg.data, revision)
        if self._track_deletes:
            deletes = self._snapshot_deleted if self._snapshot is not None else self._deleted
            if deleted:
                deletes[key] = revision
            else:
                deletes.pop(key, None)
        if self._snapshot is not None:
            if entry is not None:
                self._snapshot[key] = entry
            else:
                self._snapshot.pop(key, None)
            if metadata.num_pending == 0:
                await self._finish_snapshot()
            return
        await self._apply(key, entry)

    def _decode_entry(self, key: str, data: bytes, revision: int) -> _Entry[V] | None:
        existing = self._entries.get(key)
        if existing is not None and existing.revision == revision:
            # A resync re-reads unchanged keys: reuse the decoded value.
            return existing
        if self._decode_type is bytes:
            return _Entry(data, revision)  # type: ignore[arg-type]
        try:
            value = codec.decode(self._decode_type, data, subject=self._prefix + key)
        except ContractDecodeError as exc:
            metrics.KV_VIEW_UNDECODABLE.labels(self.bucket).inc()
            log.error("kv_view.undecodable", bucket=self.bucket, key=key, error=str(exc))
            return None
        if self._project is not None:
            try:
                projected = self._project(value)
            except Exception as exc:
                # A value its reader cannot make sense of is left out, like one that does
                # not decode: it must not stop the view.
                metrics.KV_VIEW_UNDECODABLE.labels(self.bucket).inc()
                log.error("kv_view.unprojectable", bucket=self.bucket, key=key, error=repr(exc))
                return None
            if projected is None:
                return None
            value = projected
        if type(value) is dict:
            share_strings(value)
        return _Entry(value, revision)

    async def _apply(self, key: str, entry: _Entry[V] | None) -> None:
        old = self._entries.get(key)
        if entry is None:
            if old is None:
                return
            del self._entries[key]
        else:
            self._entries[key] = entry
        self._keys_gauge.set(len(self._entries))
        await self._emit(key, old.value if old else None, entry.value if entry else None)

    async def _finish_snapshot(self) -> None:
        snapshot, self._snapshot = self._snapshot, None
        if snapshot is None:
            return
        changes = diff_snapshot(self._entries, snapshot)
        if self.ready.is_set():
            self.resyncs += 1
            metrics.KV_VIEW_RESYNCS.labels(self.bucket).inc()
        # Swap the whole dict first so readers never see a half-applied snapshot.
        self._entries = snapshot
        self._deleted, self._snapshot_deleted = self._snapshot_deleted, {}
        self._keys_gauge.set(len(snapshot))
        self.ready.set()
        self._snapshot_done.set()
        log.info(
            "kv_view.snapshot_loaded",
            bucket=self.bucket,
            keys=len(snapshot),
            changes=len(changes),
            revision=self.last_revision,
        )
        for key, old, new in changes:
            await self._emit(key, old.value if old else None, new.value if new else None)

    async def wait_ready(self, timeout: float | None = None) -> None:
        await asyncio.wait_for(self.ready.wait(), timeout)

    def debug_state(self) -> dict[str, Any]:
        return {
            "bucket": self.bucket,
            "keys": len(self._entries),
            "ready": self.ready.is_set(),
            "last_revision": self.last_revision,
            "resyncs": self.resyncs,
        }
