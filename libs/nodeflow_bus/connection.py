"""The NATS connection of a service: reconnect forever, state for readiness, acked publishes."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Literal, Protocol

import msgspec
import nats
import nats.errors
import nats.js.errors
import structlog
from nats.aio.client import Client as NatsClient
from nats.js import JetStreamContext
from nats.js.api import PubAck
from nats.nuid import NUID

from nodeflow_bus import metrics
from nodeflow_bus.backoff import Backoff
from nodeflow_bus.credentials import Credentials
from nodeflow_bus.errors import BatchPublishError, NotConnectedError, PublishError
from nodeflow_bus.kube_lease import KubeLeaseTarget
from nodeflow_bus.tls import NatsTls, TlsOnlyClient
from nodeflow_contracts import codec, topology
from nodeflow_contracts.permissions import inbox_prefix

log = structlog.get_logger("nodeflow_bus")

MSG_ID_HEADER = "Nats-Msg-Id"

ConnectionState = Literal["connecting", "connected", "disconnected", "closed"]
StateListener = Callable[[ConnectionState], Awaitable[None] | None]

# Failures after which the same publish (same Nats-Msg-Id, so deduplicated) may succeed.
_RETRYABLE_PUBLISH_ERRORS: tuple[type[BaseException], ...] = (
    nats.errors.TimeoutError,
    asyncio.TimeoutError,
    nats.errors.NoRespondersError,
    nats.js.errors.NoStreamResponseError,
    nats.js.errors.ServiceUnavailableError,
    nats.errors.ConnectionReconnectingError,
    nats.errors.OutboundBufferLimitError,
)


def is_retryable_publish_error(error: BaseException) -> bool:
    if isinstance(error, _RETRYABLE_PUBLISH_ERRORS):
        return True
    # JetStream answers 503 while it is starting or has no quorum.
    return isinstance(error, nats.js.errors.APIError) and error.code == 503


@lru_cache(maxsize=8192)
def stream_label(subject: str) -> str:
    """The stream name used as a metric label (`unknown` for a subject outside the table)."""
    try:
        return topology.stream_for_subject(subject).name
    except LookupError:
        return "unknown"


def is_kv_subject(subject: str) -> bool:
    """A KV bucket's subject: only the last value of each key matters."""
    return subject.startswith("$KV.")


def plan_batch_retries(
    subjects: Sequence[str], failed: Iterable[int], acked: Iterable[int]
) -> tuple[list[int], dict[int, int]]:
    """Which messages of a batch to publish again, and which need not be.

    Returns the indexes to retry, in batch order (so per subject in order), and the failed KV
    writes superseded by a later acknowledged write of the same key (index -> later index):
    retrying those would put an older value over a newer one. A failed message of a plain
    stream subject is retried even after a later one of its subject was acknowledged: it is
    then stored after it, but not lost.
    """
    last_acked: dict[str, int] = {}
    for index in acked:
        subject = subjects[index]
        last_acked[subject] = max(index, last_acked.get(subject, index))
    retry: list[int] = []
    superseded: dict[int, int] = {}
    for index in sorted(failed):
        subject = subjects[index]
        later = last_acked.get(subject, -1)
        if is_kv_subject(subject) and later > index:
            superseded[index] = later
        else:
            retry.append(index)
    return retry, superseded


def publish_budget(attempts: int, attempt_timeout: float, backoff: Backoff) -> float:
    """The longest one `publish` may take: every attempt's timeout plus the waits between."""
    return attempts * attempt_timeout + sum(backoff.delay(n) for n in range(1, attempts))


def encode_payload(message: Any) -> bytes:
    if isinstance(message, bytes | bytearray | memoryview):
        return bytes(message)
    return codec.encode(message)


def attempt_msg_id(message_id: str, attempt: int) -> str:
    """The Nats-Msg-Id of the `attempt`-th send (1, 2, ...) of one logical message.

    JetStream drops a message whose id it saw within the duplicate window, so a deliberate
    resend (the first send was lost, or its executor died) that reused the first id would be
    swallowed. Naming the attempt keeps the retries of one attempt deduplicated (they carry the
    same id) while every new attempt is stored; whoever applies the message must then be
    idempotent across attempts (preconditions, the logical id in the payload).
    """
    if attempt < 1:
        raise ValueError("attempts are numbered from 1")
    return f"{message_id}.attempt-{attempt}"


class OutgoingMessage(msgspec.Struct, frozen=True, kw_only=True):
    """One message of `Bus.publish_batch`. `message` is a contract struct or raw bytes."""

    subject: str
    message: Any
    msg_id: str | None = None
    headers: Mapping[str, str] | None = None


@dataclass(frozen=True, kw_only=True)
class BusOptions:
    """Connection tuning. The defaults suit a service; tests shorten the waits."""

    name: str = "nodeflow"
    connect_timeout: float = 2.0
    reconnect_wait: float = 1.0
    # None: keep trying the first connection forever (a service waits for NATS to come up).
    initial_connect_deadline: float | None = None
    request_timeout: float = 5.0
    publish_attempts: int = 5
    publish_backoff: Backoff = field(
        default_factory=lambda: Backoff(initial=0.1, factor=2.0, maximum=2.0)
    )
    ping_interval: float = 10.0
    max_outstanding_pings: int = 3
    drain_timeout: float = 5.0
    # Set: each LeaderLease of this service also mirrors its leadership into a Kubernetes
    # Lease (nodeflow_bus.kube_lease). The runtime sets it; tests and tools leave it unset.
    kube_lease: KubeLeaseTarget | None = None


class Bus:
    """A connected NATS client with JetStream, shared by every bus component of a service.

    Create it with `await Bus.connect(...)`. It reconnects forever; `state`/`is_connected`
    tell readiness, `add_state_listener` reports transitions (KV views use it to resync).
    """

    def __init__(
        self,
        servers: Sequence[str],
        credentials: Credentials,
        options: BusOptions,
        tls: NatsTls | None = None,
    ):
        self._servers = list(servers)
        self._credentials = credentials
        self._tls = tls or NatsTls()
        self.options = options
        self._nc: NatsClient | None = None
        self._js: JetStreamContext | None = None
        self._state: ConnectionState = "connecting"
        self._listeners: list[StateListener] = []
        self._nuid = NUID()
        self._last_error: str | None = None
        self._closing = False
        self.connected = asyncio.Event()
        # KV views take their first snapshot (every key's last value, pushed as fast as the
        # server can) one at a time: several at once on one connection -- a service's views
        # of 50,000 pods and 10,000 nodes -- outrun the client, the server's pending limit for
        # the connection is exceeded, it is cut as a slow consumer, every view starts over,
        # and so on for ever. Live updates after the snapshot are not limited.
        self.snapshot_slot = asyncio.Semaphore(1)

    # --- lifecycle -------------------------------------------------------------------------

    @classmethod
    async def connect(
        cls,
        servers: str | Sequence[str],
        *,
        credentials: Credentials | None = None,
        options: BusOptions | None = None,
        tls: NatsTls | None = None,
    ) -> Bus:
        """Connect (retrying the first connection with backoff, up to the optional deadline).

        `tls`: the CA, client certificate and server name; TLS is used when it names a CA or
        a certificate, or a server URL is `tls://`.
        """
        server_list = [servers] if isinstance(servers, str) else list(servers)
        bus = cls(server_list, credentials or Credentials(), options or BusOptions(), tls)
        await bus._connect_first()
        return bus

    async def _connect_first(self) -> None:
        options = self.options
        # With max_reconnect_attempts=-1 nats-py itself retries the first connection forever
        # (every reconnect_wait, reporting each failure to error_cb); only the deadline is ours.
        client = TlsOnlyClient() if self._tls.required_for(self._servers) else NatsClient()
        # nats-py annotates its timeouts as int but uses them as seconds in asyncio calls,
        # where our fractional settings work as they did through nats.connect().
        timeouts: dict[str, Any] = {
            "connect_timeout": options.connect_timeout,
            "reconnect_time_wait": options.reconnect_wait,
            "ping_interval": options.ping_interval,
            "drain_timeout": options.drain_timeout,
        }
        connecting = client.connect(
            servers=self._servers,
            name=options.name,
            max_reconnect_attempts=-1,
            allow_reconnect=True,
            max_outstanding_pings=options.max_outstanding_pings,
            **timeouts,
            disconnected_cb=self._on_disconnected,
            reconnected_cb=self._on_reconnected,
            closed_cb=self._on_closed,
            error_cb=self._on_error,
            # Per-user inboxes: NATS lets each service read its own replies only.
            inbox_prefix=inbox_prefix(self._credentials.user),
            **self._credentials.connect_options(),
            **self._tls.connect_options(self._servers),
        )
        if not await _finished_within(connecting, client, options.initial_connect_deadline):
            raise NotConnectedError(
                f"cannot connect to NATS at {self._servers} within "
                f"{options.initial_connect_deadline}s (last error: {self._last_error}); "
                f"credentials: {self._credentials!r}; tls: {self._tls!r}"
            )
        self._nc = client
        self._js = self._nc.jetstream(timeout=options.request_timeout)
        log.info(
            "nats.connected",
            server=str(self._nc.connected_url.netloc) if self._nc.connected_url else None,
            credentials=self._credentials,
            tls=self._tls.required_for(self._servers),
        )
        await self._set_state("connected")

    async def close(self) -> None:
        """Drain and close the connection (pending publishes are flushed first)."""
        nc = self._nc
        if nc is None or nc.is_closed:
            return
        self._closing = True
        try:
            await asyncio.wait_for(nc.drain(), self.options.drain_timeout + 1.0)
        except (TimeoutError, nats.errors.Error, OSError) as exc:
            log.warning("nats.drain_failed", error=f"{type(exc).__name__}: {exc}")
        if not nc.is_closed:
            try:
                await nc.close()
            except OSError as exc:
                # The socket died under the close (the server restarted meanwhile): closed.
                log.warning("nats.close_failed", error=f"{type(exc).__name__}: {exc}")
        await self._set_state("closed")

    # --- state -------------------------------------------------------------------------------

    @property
    def nc(self) -> NatsClient:
        if self._nc is None:
            raise NotConnectedError("the bus is not connected")
        return self._nc

    @property
    def js(self) -> JetStreamContext:
        if self._js is None:
            raise NotConnectedError("the bus is not connected")
        return self._js

    @property
    def state(self) -> ConnectionState:
        return self._state

    @property
    def is_connected(self) -> bool:
        return self._nc is not None and self._nc.is_connected

    def add_state_listener(self, listener: StateListener) -> None:
        """Call `listener(state)` on every transition (sync or async callable)."""
        self._listeners.append(listener)

    def remove_state_listener(self, listener: StateListener) -> None:
        if listener in self._listeners:
            self._listeners.remove(listener)

    async def _set_state(self, state: ConnectionState) -> None:
        self._state = state
        metrics.CONNECTED.set(1 if state == "connected" else 0)
        if state == "connected":
            self.connected.set()
        else:
            self.connected.clear()
        for listener in list(self._listeners):
            try:
                result = listener(state)
                if result is not None:
                    await result
            except Exception:
                log.exception("nats.state_listener_failed", state=state)

    async def _on_disconnected(self) -> None:
        if self._closing:
            log.debug("nats.disconnected", servers=self._servers, reason="closing")
        else:
            log.warning("nats.disconnected", servers=self._servers)
        await self._set_state("disconnected")

    async def _on_reconnected(self) -> None:
        nc = self._nc
        url = nc.connected_url.netloc if nc is not None and nc.connected_url else None
        log.info("nats.reconnected", server=url)
        await self._set_state("connected")

    async def _on_closed(self) -> None:
        log.info("nats.closed")
        await self._set_state("closed")

    async def _on_error(self, error: Exception) -> None:
        self._last_error = f"{type(error).__name__}: {error}"
        if self._state == "connecting":
            log.warning("nats.connect_failed", servers=self._servers, error=self._last_error)
        # Reconnect attempts report each refused connection here; keep it at debug for those.
        elif isinstance(error, OSError | nats.errors.StaleConnectionError):
            log.debug("nats.error", error=f"{type(error).__name__}: {error}")
        else:
            log.warning("nats.error", error=f"{type(error).__name__}: {error}")

    # --- publishing --------------------------------------------------------------------------

    def new_msg_id(self) -> str:
        return self._nuid.next().decode()

    def _headers(self, msg_id: str, headers: Mapping[str, str] | None) -> dict[str, str]:
        merged = dict(headers) if headers else {}
        merged[MSG_ID_HEADER] = msg_id
        return merged

    async def publish(
        self,
        subject: str,
        message: Any,
        *,
        msg_id: str | None = None,
        headers: Mapping[str, str] | None = None,
        timeout: float | None = None,
    ) -> PubAck:
        """Publish and wait for the JetStream ack; retried with backoff on timeouts.

        `message` is a contract struct (encoded with the codec) or bytes. `msg_id` becomes
        `Nats-Msg-Id`, so JetStream drops a repeat within the stream's duplicate window; when
        omitted a unique id is generated so that the retries themselves cannot duplicate.
        Raises PublishError after `options.publish_attempts` attempts or on a refusal.
        """
        payload = encode_payload(message)
        all_headers = self._headers(msg_id or self.new_msg_id(), headers)
        return await self._publish_with_retries(subject, payload, all_headers, timeout)

    async def _publish_with_retries(
        self,
        subject: str,
        payload: bytes,
        headers: dict[str, str],
        timeout: float | None,
        *,
        deadline: float | None = None,
    ) -> PubAck:
        """`deadline` (monotonic) caps the attempts and the waits between them."""
        attempts = self.options.publish_attempts
        attempt_timeout = timeout or self.options.request_timeout
        label = stream_label(subject)
        last_error: BaseException = TimeoutError("the publish deadline passed before an attempt")
        for attempt in range(1, attempts + 1):
            this_timeout = attempt_timeout
            if deadline is not None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    metrics.PUBLISH_FAILURES.labels(label).inc()
                    raise PublishError(subject, attempt - 1, last_error)
                this_timeout = min(attempt_timeout, remaining)
            try:
                ack = await self.js.publish(subject, payload, timeout=this_timeout, headers=headers)
            except Exception as exc:
                last_error = exc
                if not is_retryable_publish_error(exc) or attempt == attempts:
                    metrics.PUBLISH_FAILURES.labels(label).inc()
                    raise PublishError(subject, attempt, exc) from exc
                delay = self.options.publish_backoff.delay(attempt)
                if deadline is not None:
                    delay = min(delay, max(0.0, deadline - time.monotonic()))
                metrics.PUBLISH_RETRIES.labels(label).inc()
                log.warning(
                    "bus.publish_retry",
                    subject=subject,
                    attempt=attempt,
                    retry_in=delay,
                    error=f"{type(exc).__name__}: {exc}",
                )
                await asyncio.sleep(delay)
                continue
            metrics.PUBLISHED.labels(label).inc()
            return ack
        raise AssertionError("unreachable: the loop returns or raises")

    async def publish_batch(
        self,
        messages: Sequence[OutgoingMessage],
        *,
        max_in_flight: int = 256,
        timeout: float | None = None,
    ) -> list[PubAck]:
        """Publish many messages with at most `max_in_flight` acks outstanding.

        Returns the acks in the order of `messages`. A message whose ack timed out is retried
        (same Msg-Id, so no duplicate) in batch order, all retries within one overall budget:
        that of a single `publish`, so an outage fails a batch in about that time, not once
        per message. A timed-out KV write followed by an acknowledged write of the same key
        is not retried (it would overwrite the newer value); its ack is the later write's.
        If any message still failed, raises BatchPublishError listing every failed index
        after all the others were attempted.
        """
        if max_in_flight < 1:
            raise ValueError("max_in_flight must be at least 1")
        js = self.js
        ack_timeout = timeout or self.options.request_timeout
        acks: list[PubAck | None] = [None] * len(messages)
        prepared: list[tuple[str, bytes, dict[str, str]]] = []
        window: deque[tuple[int, asyncio.Future[PubAck], float]] = deque()
        timed_out: list[int] = []
        failures: dict[int, BaseException] = {}

        async def settle_oldest() -> None:
            index, future, deadline = window.popleft()
            try:
                # Acks mostly arrive in order: skip the timer when the oldest is already done.
                if future.done():
                    acks[index] = future.result()
                else:
                    acks[index] = await asyncio.wait_for(
                        future, max(0.0, deadline - time.monotonic())
                    )
            except Exception as exc:
                if is_retryable_publish_error(exc):
                    timed_out.append(index)
                else:
                    failures[index] = exc

        for index, outgoing in enumerate(messages):
            headers = self._headers(outgoing.msg_id or self.new_msg_id(), outgoing.headers)
            payload = encode_payload(outgoing.message)
            prepared.append((outgoing.subject, payload, headers))
            if len(window) >= max_in_flight:
                await settle_oldest()
            try:
                future = await js.publish_async(outgoing.subject, payload, headers=headers)
            except Exception as exc:
                if is_retryable_publish_error(exc):
                    timed_out.append(index)
                else:
                    failures[index] = exc
                continue
            window.append((index, future, time.monotonic() + ack_timeout))
        while window:
            await settle_oldest()

        acked_at_once = [index for index, ack in enumerate(acks) if ack is not None]
        label_counts: dict[str, int] = {}
        for index in acked_at_once:
            label = stream_label(prepared[index][0])
            label_counts[label] = label_counts.get(label, 0) + 1
        for label, count in label_counts.items():
            metrics.PUBLISHED.labels(label).inc(count)
        for index in failures:
            metrics.PUBLISH_FAILURES.labels(stream_label(prepared[index][0])).inc()

        retry, superseded = plan_batch_retries(
            [subject for subject, _, _ in prepared], timed_out, acked_at_once
        )
        retry_deadline = time.monotonic() + publish_budget(
            self.options.publish_attempts, ack_timeout, self.options.publish_backoff
        )
        for index in retry:
            subject, payload, headers = prepared[index]
            try:
                acks[index] = await self._publish_with_retries(
                    subject, payload, headers, timeout, deadline=retry_deadline
                )
            except PublishError as exc:
                failures[index] = exc.cause
        for index, later in superseded.items():
            acks[index] = acks[later]
        if failures:
            raise BatchPublishError(failures, len(messages))
        return [ack for ack in acks if ack is not None]


# How long a cancelled first connection may take to wind down before the client is closed.
CONNECT_CANCEL_GRACE_SECONDS = 2.0


class _Closable(Protocol):
    async def close(self) -> None: ...


async def _finished_within(
    connecting: Awaitable[None], client: _Closable, deadline: float | None
) -> bool:
    """Whether nats-py's first connection finished within `deadline` (its error, if it failed
    outright, is raised). Not `asyncio.wait_for`: on Python 3.11 a cancellation that lands as
    one of nats-py's own inner timeouts fires is turned into a TimeoutError, which its
    reconnect loop catches and retries, so `wait_for` would wait for ever for a task that
    never ends (a Bus.connect hung on a server refusing the TLS handshake). So the wait is
    bounded, and a task still running after its cancellation is ended by closing the client."""
    task = asyncio.ensure_future(connecting)
    done, _ = await asyncio.wait({task}, timeout=deadline)
    if task in done:
        task.result()
        return True
    task.cancel()
    done, _ = await asyncio.wait({task}, timeout=CONNECT_CANCEL_GRACE_SECONDS)
    if task not in done:
        log.warning("nats.connect_not_cancelled", closing=True)
        try:
            await asyncio.wait_for(client.close(), CONNECT_CANCEL_GRACE_SECONDS)
        except Exception as exc:  # a half-made connection may fail to close in any way
            log.warning("nats.close_after_connect_failed", error=repr(exc))
        await asyncio.wait({task}, timeout=CONNECT_CANCEL_GRACE_SECONDS)
    if task.done() and not task.cancelled():
        task.exception()  # retrieved: the connection was given up, its last error is logged
    return False
