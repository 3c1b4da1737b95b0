"""A durable pull consumer: bounded concurrency, retries with backoff, dead letters, clean stop.

For each message: decode it with the contracts codec into the handler's type, call the
handler, then settle it:
- success: ack;
- RetryableError or any unexpected exception: nak with an exponential delay from the delivery
  count (or, with an ordering key, retry in place so later messages of the key wait; the
  concurrency slot is given back while it waits);
- PermanentError, ContractDecodeError, an ordering-key function that raises, or the last
  allowed delivery failing: publish a copy to `dlq.<subject>` with the error, then term, so one
  poison message never blocks the queue.

The delivery limit (`spec.max_deliver`) is enforced here, not by JetStream: `ensure_topology`
declares the durable with an unlimited max_deliver (see declare.server_max_deliver). A message
whose dead-letter copy cannot be published stays held and the copy is retried in place with
backoff; if the consumer stops first, the message is handed back, and a later delivery beyond
the limit is dead-lettered without running the handler again. So nothing is ever left in a
stream where JetStream would no longer deliver it.

Delivery counting: JetStream counts every delivery, including a redelivery after a nak or an
expired ack_wait. Handing unfinished messages back on stop (nak without delay, so another
replica takes them at once) therefore uses up one of their deliveries; JetStream offers no way
to return a message without counting. A message handed back on k rolling restarts gets k
fewer handler attempts before it is dead-lettered.

The ack deadline of every held message is kept alive with in_progress() while it waits or runs.
`failed` / `not_ready_reason()` tell readiness: a crashed loop, or fetches that keep failing
(a deleted durable is recreated from its spec).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import Awaitable, Callable, Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, TypeVar

import nats.errors
import nats.js.errors
import structlog
from nats.aio.msg import Msg
from nats.js import JetStreamContext

from nodeflow_bus import dead_letter, metrics
from nodeflow_bus.backoff import Backoff, redelivery_delay
from nodeflow_bus.connection import MSG_ID_HEADER, Bus
from nodeflow_bus.declare import ensure_consumer
from nodeflow_bus.errors import PermanentError, PublishError
from nodeflow_bus.scheduler import KeyedScheduler
from nodeflow_bus.tasks import cancel_and_wait
from nodeflow_contracts import codec, subjects
from nodeflow_contracts.codec import ContractDecodeError
from nodeflow_contracts.topology import ConsumerSpec

log = structlog.get_logger("nodeflow_bus")

T = TypeVar("T")


@dataclass(frozen=True)
class Delivery:
    """Where a message came from, passed to the handler with the decoded message."""

    subject: str
    headers: Mapping[str, str]
    stream: str
    stream_sequence: int
    num_delivered: int
    msg_id: str | None


Handler = Callable[[T, Delivery], Awaitable[None]]


class DeliveryLimitExceededError(Exception):
    """Delivered beyond the limit: an earlier holder failed or stopped without settling it."""


# --- pure: what to do with a message after its handler ran ---------------------------------


@dataclass(frozen=True)
class Settlement:
    action: Literal["ack", "nak", "dead_letter"]
    delay: float = 0.0
    error_kind: dead_letter.ErrorKind | None = None


def settle(
    error: BaseException | None, *, attempt: int, max_deliver: int, backoff: Backoff
) -> Settlement:
    """Decide the fate of a message whose `attempt`-th delivery ended with `error`.

    `max_deliver` <= 0 means unlimited deliveries (JetStream's -1).
    """
    if error is None:
        return Settlement("ack")
    if isinstance(error, ContractDecodeError):
        return Settlement("dead_letter", error_kind="decode")
    if isinstance(error, PermanentError):
        return Settlement("dead_letter", error_kind="permanent")
    if max_deliver > 0 and attempt >= max_deliver:
        return Settlement("dead_letter", error_kind="max_deliveries")
    return Settlement("nak", delay=redelivery_delay(backoff, attempt))


def delivery_limit_exceeded(num_delivered: int, max_deliver: int) -> bool:
    """True for a delivery past the limit: its handler must not run again."""
    return max_deliver > 0 and num_delivered > max_deliver


def fetch_capacity(*, concurrency: int, demand: int, max_held: int, held: int) -> int:
    """How many messages to fetch: free handler slots, within the bound on held messages.

    `demand` counts the keys running or ready to run; messages waiting behind a key that backs
    off do not use a slot, only room in `max_held`.
    """
    return min(concurrency - demand, max_held - held)


def describe(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"


# --- the consumer ------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class ConsumerOptions:
    """Tuning of a PullConsumer; the defaults suit a service."""

    concurrency: int = 16
    # Messages with the same key are handled one after another, in arrival order. Requires a
    # delivery limit (spec.max_deliver > 0): a key must not retry one message forever.
    ordering_key: Callable[[Any], Hashable] | None = None
    fetch_batch: int = 64
    fetch_timeout: float = 1.0
    backoff: Backoff = field(default_factory=lambda: Backoff(initial=1.0, maximum=60.0))
    # Grace period of stop(): running handlers may finish; the rest is left for redelivery.
    stop_timeout: float = 10.0
    handler_timeout: float | None = None
    # Default: a third of the consumer's ack_wait.
    keepalive_interval: float | None = None
    # Messages held at once (running, queued behind their key, or waiting to retry). Default:
    # 4 x concurrency, at most the consumer's max_ack_pending.
    max_held: int | None = None


@dataclass
class _Work:
    """One held message across the runs of its scheduler job."""

    msg: Msg
    message: Any
    # Known before any handler runs: the payload did not decode, or its key function failed.
    failure: BaseException | None
    ordered: bool
    extra_attempts: int = 0
    # Set once it must be dead-lettered; kept while publishing the copy is retried.
    dead_letter: _PendingDeadLetter | None = None


@dataclass
class _PendingDeadLetter:
    error: BaseException
    kind: dead_letter.ErrorKind
    delivery: Delivery
    failed_publishes: int = 0


class PullConsumer(Generic[T]):
    """Run `handler` for every message of the durable consumer `spec` (declared beforehand
    with `ensure_topology`). Call `start()`, later `stop()`.

    `message_type` is the contract struct the payload decodes to; pass `bytes` to receive the
    raw payload.
    """

    def __init__(
        self,
        bus: Bus,
        spec: ConsumerSpec,
        message_type: type[T],
        handler: Handler[T],
        options: ConsumerOptions | None = None,
    ) -> None:
        self._bus = bus
        self.spec = spec
        self._message_type = message_type
        self._handler = handler
        self.options = options or ConsumerOptions()
        if self.options.concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        if self.options.ordering_key is not None and spec.max_deliver <= 0:
            raise ValueError(
                f"consumer {spec.durable}: an ordering key needs a delivery limit "
                "(max_deliver > 0), or one failing message would hold its key forever"
            )
        default_held = min(4 * self.options.concurrency, max(1, spec.max_ack_pending))
        self._max_held = self.options.max_held or default_held
        if self._max_held < 1:
            raise ValueError("max_held must be at least 1")
        self._capacity = asyncio.Event()
        self._scheduler = KeyedScheduler(
            self.options.concurrency, on_demand_drop=self._capacity.set
        )
        # Keyed by id(): nats-py messages are unhashable dataclasses.
        self._held: dict[int, Msg] = {}
        self._stopping = asyncio.Event()
        self._fetch_task: asyncio.Task[None] | None = None
        self._keepalive_task: asyncio.Task[None] | None = None
        self._subscription: JetStreamContext.PullSubscription | None = None
        self._crash: str | None = None
        self._fetch_problem: str | None = None
        labels = (spec.stream, spec.durable)
        self._m_consumed = metrics.CONSUMED.labels(*labels)
        self._m_acked = metrics.ACKED.labels(*labels)
        self._m_naked = metrics.NAKED.labels(*labels)
        self._m_termed = metrics.TERMED.labels(*labels)
        self._m_latency = metrics.HANDLER_SECONDS.labels(*labels)
        self._m_in_flight = metrics.IN_FLIGHT.labels(*labels)

    @property
    def running(self) -> bool:
        return self._fetch_task is not None and not self._fetch_task.done()

    @property
    def in_flight(self) -> int:
        return len(self._held)

    @property
    def failed(self) -> bool:
        """True once a background loop crashed: the consumer no longer fetches or keeps its
        messages alive, and the service should be restarted."""
        return self._crash is not None

    def not_ready_reason(self) -> str | None:
        """Why this consumer is not working (for /readyz), or None."""
        if self._crash is not None:
            return f"consumer {self.spec.durable}: {self._crash}"
        if self._fetch_problem is not None:
            return f"consumer {self.spec.durable}: fetch failing: {self._fetch_problem}"
        if self._fetch_task is None:
            return f"consumer {self.spec.durable}: not started"
        return None

    async def start(self) -> None:
        if self._fetch_task is not None:
            raise RuntimeError("the consumer was already started")
        self._subscription = await self._bus.js.pull_subscribe_bind(
            durable=self.spec.durable, stream=self.spec.stream
        )
        self._fetch_task = asyncio.create_task(self._fetch_loop(), name="consumer-fetch")
        self._fetch_task.add_done_callback(functools.partial(self._on_loop_done, "fetch loop"))
        self._keepalive_task = asyncio.create_task(self._keepalive_loop(), name="consumer-alive")
        self._keepalive_task.add_done_callback(
            functools.partial(self._on_loop_done, "keepalive loop")
        )
        log.info(
            "consumer.started",
            stream=self.spec.stream,
            consumer=self.spec.durable,
            concurrency=self.options.concurrency,
            ordered=self.options.ordering_key is not None,
        )

    def _on_loop_done(self, loop_name: str, task: asyncio.Task[None]) -> None:
        if task.cancelled() or self._stopping.is_set():
            if not task.cancelled():
                task.exception()  # retrieved: stop() reports nothing more about it
            return
        error = task.exception()
        self._crash = f"{loop_name} crashed: {describe(error)}" if error else f"{loop_name} ended"
        log.error(
            "consumer.loop_crashed",
            stream=self.spec.stream,
            consumer=self.spec.durable,
            loop=loop_name,
            error=describe(error) if error else None,
            exc_info=error,
        )

    async def stop(self, timeout: float | None = None) -> None:
        """Stop fetching, let running handlers finish within `timeout` (default
        options.stop_timeout), then leave whatever is unsettled for redelivery.

        Never raises what a background loop raised (that is reported by `failed`); being
        cancelled itself still cancels the caller.
        """
        grace = self.options.stop_timeout if timeout is None else timeout
        self._stopping.set()
        self._capacity.set()
        if self._fetch_task is not None:
            # The fetch in progress ends within fetch_timeout; what it returns is handed back.
            # asyncio.wait neither raises the task's error nor swallows our own cancellation.
            await asyncio.wait({self._fetch_task}, timeout=self.options.fetch_timeout + 1.0)
            await cancel_and_wait(self._fetch_task)
        self._scheduler.close()
        finished = await self._scheduler.join(grace)
        if not finished:
            log.warning(
                "consumer.stop_deadline",
                stream=self.spec.stream,
                consumer=self.spec.durable,
                unfinished=len(self._held),
            )
            await self._scheduler.cancel()
        # Anything still held was not settled: hand it back for an immediate redelivery.
        for msg in list(self._held.values()):
            await self._release(msg)
        if self._keepalive_task is not None:
            await cancel_and_wait(self._keepalive_task)
        if self._subscription is not None:
            with contextlib.suppress(nats.errors.Error):
                await self._subscription.unsubscribe()
        log.info("consumer.stopped", stream=self.spec.stream, consumer=self.spec.durable)

    # --- fetching ----------------------------------------------------------------------------

    async def _fetch_loop(self) -> None:
        assert self._subscription is not None
        subscription = self._subscription
        options = self.options
        while not self._stopping.is_set():
            capacity = fetch_capacity(
                concurrency=options.concurrency,
                demand=self._scheduler.demand,
                max_held=self._max_held,
                held=len(self._held),
            )
            if capacity <= 0:
                self._capacity.clear()
                await self._capacity.wait()
                continue
            if not self._bus.is_connected:
                await self._wait_connected()
                continue
            try:
                msgs = await subscription.fetch(
                    batch=min(capacity, options.fetch_batch), timeout=options.fetch_timeout
                )
            except (TimeoutError, nats.errors.TimeoutError):
                self._fetch_problem = None
                continue
            except nats.errors.ConnectionClosedError:
                if self._stopping.is_set():
                    return
                raise
            except Exception as exc:
                await self._on_fetch_failed(exc)
                continue
            self._fetch_problem = None
            for msg in msgs:
                self._m_consumed.inc()
                self._hold(msg)
                if self._stopping.is_set():
                    await self._release(msg)
                else:
                    self._dispatch(msg)

    async def _on_fetch_failed(self, error: Exception) -> None:
        self._fetch_problem = describe(error)
        log.warning(
            "consumer.fetch_failed",
            stream=self.spec.stream,
            consumer=self.spec.durable,
            error=self._fetch_problem,
        )
        # A fetch against a deleted durable fails like an unavailable JetStream (503): ask.
        with contextlib.suppress(nats.errors.Error, OSError, TimeoutError):
            try:
                await self._bus.js.consumer_info(self.spec.stream, self.spec.durable)
            except nats.js.errors.NotFoundError:
                self._fetch_problem = "the durable consumer does not exist"
                await ensure_consumer(self._bus.js, self.spec)
                log.warning(
                    "consumer.recreated", stream=self.spec.stream, consumer=self.spec.durable
                )
        await asyncio.sleep(min(1.0, self.options.fetch_timeout))

    async def _wait_connected(self) -> None:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._bus.connected.wait(), self.options.fetch_timeout)

    def _hold(self, msg: Msg) -> None:
        self._held[id(msg)] = msg
        self._m_in_flight.inc()

    def _unhold(self, msg: Msg) -> None:
        if self._held.pop(id(msg), None) is not None:
            self._m_in_flight.dec()
            self._capacity.set()

    async def _release(self, msg: Msg) -> None:
        """Give an unsettled message back (nak without delay); if that fails, JetStream
        redelivers it after ack_wait anyway."""
        self._unhold(msg)
        with contextlib.suppress(Exception):
            await msg.nak()
            self._m_naked.inc()

    def _dispatch(self, msg: Msg) -> None:
        failure: BaseException | None = None
        message: Any = None
        key: Hashable | None = None
        try:
            message = self._decode(msg)
        except ContractDecodeError as exc:
            failure = exc
        else:
            key_of = self.options.ordering_key
            if key_of is not None:
                try:
                    key = key_of(message)
                    hash(key)
                except Exception as exc:
                    failure = PermanentError(f"ordering key failed: {describe(exc)}")
                    key = None
        work = _Work(msg, message, failure, ordered=key is not None)
        self._scheduler.submit(key, functools.partial(self._run, work))

    def _decode(self, msg: Msg) -> T:
        if self._message_type is bytes:
            data: T = msg.data  # type: ignore[assignment]
            return data
        return codec.decode(self._message_type, msg.data, subject=msg.subject)

    # --- handling ----------------------------------------------------------------------------

    def _delivery(self, msg: Msg, extra_attempts: int) -> Delivery:
        metadata = msg.metadata
        headers = msg.headers or {}
        return Delivery(
            subject=msg.subject,
            headers=headers,
            stream=metadata.stream,
            stream_sequence=metadata.sequence.stream,
            num_delivered=metadata.num_delivered + extra_attempts,
            msg_id=headers.get(MSG_ID_HEADER),
        )

    async def _call_handler(self, message: T, delivery: Delivery) -> BaseException | None:
        started = time.perf_counter()
        try:
            if self.options.handler_timeout is not None:
                async with asyncio.timeout(self.options.handler_timeout):
                    await self._handler(message, delivery)
            else:
                await self._handler(message, delivery)
        except Exception as exc:
            return exc
        finally:
            self._m_latency.observe(time.perf_counter() - started)
        return None

    async def _run(self, work: _Work) -> float | None:
        """One step of a message's job; returns a delay to be run again after (the message
        stays held meanwhile), or None once it is settled."""
        if work.dead_letter is not None:
            return await self._dead_letter(work.msg, work.dead_letter)
        delivery = self._delivery(work.msg, work.extra_attempts)
        error: BaseException | None
        if work.failure is not None:
            error = work.failure
        elif delivery_limit_exceeded(delivery.num_delivered, self.spec.max_deliver):
            error = DeliveryLimitExceededError(
                f"delivered {delivery.num_delivered} times, the limit is {self.spec.max_deliver}"
            )
        else:
            error = await self._call_handler(work.message, delivery)
        decision = settle(
            error,
            attempt=delivery.num_delivered,
            max_deliver=self.spec.max_deliver,
            backoff=self.options.backoff,
        )
        if decision.action == "nak" and work.ordered:
            # Retry in place: a redelivery would let later messages of this key overtake.
            self._log_retry(delivery, error, decision.delay)
            work.extra_attempts += 1
            return decision.delay
        if decision.action == "dead_letter":
            assert error is not None and decision.error_kind is not None
            work.dead_letter = _PendingDeadLetter(error, decision.error_kind, delivery)
            return await self._dead_letter(work.msg, work.dead_letter)
        await self._settle(work.msg, delivery, decision, error)
        return None

    def _log_retry(self, delivery: Delivery, error: BaseException | None, delay: float) -> None:
        log.warning(
            "consumer.handler_failed",
            stream=self.spec.stream,
            consumer=self.spec.durable,
            subject=delivery.subject,
            sequence=delivery.stream_sequence,
            delivery=delivery.num_delivered,
            retry_in=delay,
            error=describe(error) if error else None,
        )

    async def _settle(
        self,
        msg: Msg,
        delivery: Delivery,
        decision: Settlement,
        error: BaseException | None = None,
    ) -> None:
        """Ack, nak or term; the message is no longer held afterwards either way."""
        try:
            if decision.action == "ack":
                await msg.ack()
                self._m_acked.inc()
            elif decision.action == "nak":
                self._log_retry(delivery, error, decision.delay)
                await msg.nak(delay=decision.delay)
                self._m_naked.inc()
            else:
                await msg.term()
                self._m_termed.inc()
        except (nats.errors.Error, OSError) as exc:
            # The connection is gone: JetStream redelivers after ack_wait, nothing is lost.
            log.warning(
                "consumer.settle_failed",
                stream=self.spec.stream,
                consumer=self.spec.durable,
                sequence=delivery.stream_sequence,
                error=describe(exc),
            )
        finally:
            self._unhold(msg)

    async def _dead_letter(self, msg: Msg, pending: _PendingDeadLetter) -> float | None:
        """Copy `msg` to the dead-letter stream, then term it. If the copy cannot be
        published, return the delay before trying again: the message stays held (kept alive)
        rather than being nak'd, since a nak past the limit would never be delivered again."""
        delivery, kind, error = pending.delivery, pending.kind, pending.error
        term = Settlement("dead_letter", error_kind=kind)
        if dead_letter.is_dead_letter(msg.subject):
            # A failing dead-letter consumer must not feed dlq.dlq.… back into its own stream.
            await self._settle(msg, delivery, term)
            log.error(
                "consumer.dead_letter_dropped",
                stream=self.spec.stream,
                consumer=self.spec.durable,
                subject=msg.subject,
                sequence=delivery.stream_sequence,
                error_kind=kind,
                error=describe(error),
            )
            return None
        headers = dead_letter.dead_letter_headers(
            original_headers=msg.headers,
            error=describe(error),
            error_kind=kind,
            deliveries=delivery.num_delivered,
            stream=delivery.stream,
            stream_sequence=delivery.stream_sequence,
            consumer=self.spec.durable,
            subject=msg.subject,
        )
        msg_id = dead_letter.dead_letter_msg_id(
            delivery.stream, self.spec.durable, delivery.stream_sequence
        )
        try:
            await self._bus.publish(
                subjects.dead_letter(msg.subject), msg.data, msg_id=msg_id, headers=headers
            )
        except PublishError as exc:
            pending.failed_publishes += 1
            delay = self.options.backoff.delay(pending.failed_publishes)
            log.error(
                "consumer.dead_letter_failed",
                stream=self.spec.stream,
                consumer=self.spec.durable,
                sequence=delivery.stream_sequence,
                error=describe(exc),
                retry_in=delay,
            )
            return delay
        await self._settle(msg, delivery, term)
        metrics.DEAD_LETTERED.labels(self.spec.stream, self.spec.durable, kind).inc()
        log.error(
            "consumer.dead_lettered",
            stream=self.spec.stream,
            consumer=self.spec.durable,
            subject=msg.subject,
            sequence=delivery.stream_sequence,
            deliveries=delivery.num_delivered,
            error_kind=kind,
            error=describe(error),
        )
        return None

    # --- ack deadline ------------------------------------------------------------------------

    async def _keepalive_loop(self) -> None:
        interval = self.options.keepalive_interval or max(0.05, self.spec.ack_wait_seconds / 3)
        while True:
            await asyncio.sleep(interval)
            if not self._bus.is_connected:
                continue
            for msg in list(self._held.values()):
                with contextlib.suppress(nats.errors.Error, OSError):
                    await msg.in_progress()
