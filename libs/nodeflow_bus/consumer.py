"""A durable pull consumer: bounded concurrency, retries with backoff, dead letters, clean stop.

For each message: decode it with the contracts codec into the handler's type, call the
handler, then settle it:
- success: ack;
- RetryableError or any unexpected exception: nak with an exponential delay from the delivery
  count (or, with an ordering key, retry in place so later messages of the key wait);
- PermanentError, ContractDecodeError, or the last allowed delivery failing: publish a copy to
  `dlq.<subject>` with the error, then term, so one poison message never blocks the queue.

The ack deadline of every held message is kept alive with in_progress() while it waits or runs.
"""

from __future__ import annotations

import asyncio
import contextlib
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
from nodeflow_bus.errors import PermanentError, PublishError
from nodeflow_bus.scheduler import KeyedScheduler
from nodeflow_bus.tasks import cancel_and_wait
from nodeflow_contracts import codec
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


def describe(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"


# --- the consumer ------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class ConsumerOptions:
    """Tuning of a PullConsumer; the defaults suit a service."""

    concurrency: int = 16
    # Messages with the same key are handled one after another, in arrival order.
    ordering_key: Callable[[Any], Hashable] | None = None
    fetch_batch: int = 64
    fetch_timeout: float = 1.0
    backoff: Backoff = field(default_factory=lambda: Backoff(initial=1.0, maximum=60.0))
    # Grace period of stop(): running handlers may finish; the rest is left for redelivery.
    stop_timeout: float = 10.0
    handler_timeout: float | None = None
    # Default: a third of the consumer's ack_wait.
    keepalive_interval: float | None = None


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
        self._scheduler = KeyedScheduler(self.options.concurrency)
        # Keyed by id(): nats-py messages are unhashable dataclasses.
        self._held: dict[int, Msg] = {}
        self._capacity = asyncio.Event()
        self._stopping = asyncio.Event()
        self._fetch_task: asyncio.Task[None] | None = None
        self._keepalive_task: asyncio.Task[None] | None = None
        self._subscription: JetStreamContext.PullSubscription | None = None
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

    async def start(self) -> None:
        if self._fetch_task is not None:
            raise RuntimeError("the consumer was already started")
        self._subscription = await self._bus.js.pull_subscribe_bind(
            durable=self.spec.durable, stream=self.spec.stream
        )
        self._fetch_task = asyncio.create_task(self._fetch_loop())
        self._keepalive_task = asyncio.create_task(self._keepalive_loop())
        log.info(
            "consumer.started",
            stream=self.spec.stream,
            consumer=self.spec.durable,
            concurrency=self.options.concurrency,
            ordered=self.options.ordering_key is not None,
        )

    async def stop(self, timeout: float | None = None) -> None:
        """Stop fetching, let running handlers finish within `timeout` (default
        options.stop_timeout), then leave whatever is unsettled for redelivery."""
        grace = self.options.stop_timeout if timeout is None else timeout
        self._stopping.set()
        self._capacity.set()
        if self._fetch_task is not None:
            # The fetch in progress ends within fetch_timeout; what it returns is handed back.
            with contextlib.suppress(asyncio.CancelledError):
                await self._fetch_task
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
            capacity = options.concurrency - len(self._held)
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
                continue
            except nats.errors.ConnectionClosedError:
                return
            except Exception as exc:
                log.warning(
                    "consumer.fetch_failed",
                    stream=self.spec.stream,
                    consumer=self.spec.durable,
                    error=describe(exc),
                )
                await asyncio.sleep(min(1.0, options.fetch_timeout))
                continue
            for msg in msgs:
                self._m_consumed.inc()
                self._hold(msg)
                if self._stopping.is_set():
                    await self._release(msg)
                else:
                    self._dispatch(msg)

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
        try:
            message = self._decode(msg)
        except ContractDecodeError as exc:
            error = exc
            self._scheduler.submit(None, lambda: self._settle_failure(msg, error, 0))
            return
        key_of = self.options.ordering_key
        key = key_of(message) if key_of is not None else None
        self._scheduler.submit(key, lambda: self._handle(msg, message, ordered=key is not None))

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

    async def _handle(self, msg: Msg, message: T, *, ordered: bool) -> None:
        extra_attempts = 0
        while True:
            delivery = self._delivery(msg, extra_attempts)
            error = await self._call_handler(message, delivery)
            decision = settle(
                error,
                attempt=delivery.num_delivered,
                max_deliver=self.spec.max_deliver,
                backoff=self.options.backoff,
            )
            if decision.action == "nak" and ordered and not self._stopping.is_set():
                # Retry in place: a redelivery would let later messages of this key overtake.
                self._log_retry(delivery, error, decision.delay)
                try:
                    await asyncio.wait_for(self._stopping.wait(), decision.delay)
                except TimeoutError:
                    extra_attempts += 1
                    continue
                # Stopping: hand the message back rather than wait out the delay.
                await self._release(msg)
                return
            await self._apply(msg, decision, error, delivery)
            return

    async def _settle_failure(self, msg: Msg, error: BaseException, extra_attempts: int) -> None:
        delivery = self._delivery(msg, extra_attempts)
        decision = settle(
            error,
            attempt=delivery.num_delivered,
            max_deliver=self.spec.max_deliver,
            backoff=self.options.backoff,
        )
        await self._apply(msg, decision, error, delivery)

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

    async def _apply(
        self, msg: Msg, decision: Settlement, error: BaseException | None, delivery: Delivery
    ) -> None:
        try:
            if decision.action == "ack":
                await msg.ack()
                self._m_acked.inc()
            elif decision.action == "nak":
                self._log_retry(delivery, error, decision.delay)
                await msg.nak(delay=decision.delay)
                self._m_naked.inc()
            else:
                assert error is not None and decision.error_kind is not None
                await self._dead_letter(msg, error, decision.error_kind, delivery)
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

    async def _dead_letter(
        self,
        msg: Msg,
        error: BaseException,
        kind: dead_letter.ErrorKind,
        delivery: Delivery,
    ) -> None:
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
        if dead_letter.is_dead_letter(msg.subject):
            # A failing dead-letter consumer must not feed dlq.dlq.… back into its own stream.
            await msg.term()
            self._m_termed.inc()
            log.error(
                "consumer.dead_letter_dropped",
                stream=self.spec.stream,
                consumer=self.spec.durable,
                subject=msg.subject,
                sequence=delivery.stream_sequence,
                error_kind=kind,
                error=describe(error),
            )
            return
        subject = dead_letter.dead_letter_subject(msg.subject)
        try:
            await self._bus.publish(
                subject,
                msg.data,
                msg_id=dead_letter.dead_letter_msg_id(delivery.stream, delivery.stream_sequence),
                headers=headers,
            )
        except PublishError as exc:
            # Without its copy the message must not be dropped: retry it later instead.
            delay = redelivery_delay(self.options.backoff, delivery.num_delivered)
            log.error(
                "consumer.dead_letter_failed",
                stream=self.spec.stream,
                consumer=self.spec.durable,
                sequence=delivery.stream_sequence,
                error=describe(exc),
                retry_in=delay,
            )
            await msg.nak(delay=delay)
            self._m_naked.inc()
            return
        await msg.term()
        self._m_termed.inc()
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
