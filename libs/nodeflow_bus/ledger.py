"""The I/O half of the command ledger (`nodeflow_contracts.ledger` holds the protocol and
the pure value): one way for every controller to send k8s-watcher commands.

`LedgerSender.send` stores the commands' `LedgerRecord`s on COMMAND_LEDGER, records them in
the in-memory `CommandLedger` and only then publishes the commands (and whatever else the
round produced: decisions, Events). `handle_outcome` is the controller's one outcome
subscription: it decodes each outcome once, keeps only its sender's, settles the ledger
and hands the outcome on. On taking the lead, `on_leadership` rebuilds the ledger from
COMMAND_LEDGER and COMMAND_OUTCOMES (`rebuild`); `ready` is False until that completes, and
`send` refuses to publish meanwhile, so a leader never plans on a ledger that may miss an
earlier leader's commands. A failed rebuild (NATS unreachable) is retried with a backoff,
logged and counted (`nodeflow_bus_ledger_rebuilds_total{result="failed"}`).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import hashlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import structlog
from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from nodeflow_bus import metrics
from nodeflow_bus.backoff import Backoff
from nodeflow_bus.connection import Bus, OutgoingMessage
from nodeflow_bus.tasks import cancel_and_wait
from nodeflow_contracts import codec, subjects
from nodeflow_contracts.codec import ContractDecodeError
from nodeflow_contracts.k8s import CommandOutcome, K8sCommand, send_msg_id
from nodeflow_contracts.ledger import (
    LANDING_MARGIN_SECONDS,
    REBUILD_WINDOW_SECONDS,
    CommandLedger,
    LedgerEntry,
    LedgerRecord,
    rebuilt_ledger,
)

log = structlog.get_logger("nodeflow_bus.ledger")

LEDGER_STREAM = "COMMAND_LEDGER"
OUTCOMES_STREAM = "COMMAND_OUTCOMES"
# Entries per LedgerRecord: a round of a thousand commands stays far below NATS' payload limit.
RECORD_CHUNK = 256
# Messages fetched per pull while rebuilding.
FETCH_BATCH = 1000

OutcomeListener = Callable[[CommandOutcome, LedgerEntry | None], None]


class LedgerNotReady(RuntimeError):
    """The ledger has not been rebuilt since this replica took the lead: nothing is sent."""


@dataclass(frozen=True)
class Sending:
    """One command to send and the slots it holds; `msg_id` names the attempt when it is
    not the idempotency key (a deliberate resend past JetStream's duplicate window); the
    Nats-Msg-Id is it (or the key) with the command's `sent_at`; `fenced`: held by this
    leader only (`nodeflow_contracts.ledger.LedgerEntry.fenced`)."""

    command: K8sCommand
    slots: tuple[str, ...] = ()
    msg_id: str | None = None
    fenced: bool = False


class LedgerSender:
    def __init__(
        self,
        bus: Bus,
        *,
        ledger: str,
        sender: str,
        max_lifetime: float,
        on_outcome: OutcomeListener | None = None,
        margin: float = LANDING_MARGIN_SECONDS,
        retry: Backoff | None = None,
        leading: Callable[[], bool] | None = None,
    ) -> None:
        if max_lifetime + margin > REBUILD_WINDOW_SECONDS:
            # Every sender's commands must be inside the window any new leader reads.
            raise ValueError(
                f"a command lifetime of {max_lifetime:.0f}s plus the landing margin does not fit "
                f"in the ledger's rebuild window of {REBUILD_WINDOW_SECONDS:.0f}s"
            )
        self.bus = bus
        self.name = ledger
        self.sender = sender
        self.ledger = CommandLedger(sender, max_lifetime=max_lifetime, margin=margin)
        self.on_outcome = on_outcome
        self.retry = retry or Backoff(initial=0.5, maximum=10.0)
        # Does this replica still hold the lease (its own monotonic clock)? Asked again before
        # each record is stored and before the commands are published: the lease may lapse
        # while a round plans or stores its records, and `ready` follows the lease only
        # once its listener ran.
        self.leading = leading
        # True once rebuilt as leader; False while a follower or while rebuilding.
        self.ready = False
        # Called (no arguments) once a rebuild completed: the controller plans again.
        self.on_ready: Callable[[], None] | None = None
        self._rebuild_task: asyncio.Task[None] | None = None
        # Outcomes that arrived while a rebuild reads the streams: applied after it.
        self._during_rebuild: list[CommandOutcome] | None = None
        self._set_ready(False)
        # Read at each scrape: the controllers release and expire entries on the ledger itself
        # (`release_seen`, `expire`), which a gauge set on send and settle would miss.
        metrics.LEDGER_HELD.labels(self.name).set_function(lambda: len(self.ledger))

    def _set_ready(self, ready: bool) -> None:
        self.ready = ready
        metrics.LEDGER_READY.labels(self.name).set(1 if ready else 0)

    # --- outcomes ------------------------------------------------------------------------------

    async def handle_outcome(self, msg: Msg) -> None:
        """The callback of the controller's outcome subscription."""
        try:
            outcome = codec.decode(CommandOutcome, msg.data, subject=msg.subject)
        except ContractDecodeError as exc:
            # A plain subscription has nothing to redeliver: the outcome stays stored in
            # COMMAND_OUTCOMES; it settles nothing here, so its command is held until it can
            # no longer land (fail closed).
            metrics.LEDGER_UNDECODABLE_OUTCOMES.labels(self.name).inc()
            log.warning("ledger.outcome_undecodable", ledger=self.name, error=str(exc))
            return
        if outcome.sender != self.sender:
            return
        self.settle(outcome)

    def settle(self, outcome: CommandOutcome) -> None:
        if self._during_rebuild is not None:
            self._during_rebuild.append(outcome)
        entry = self.ledger.settle(outcome)
        if entry is not None and not outcome.never_lands and outcome.outcome in ("failed",):
            log.warning(
                "command.may_still_land",
                ledger=self.name,
                key=outcome.idempotency_key,
                target=outcome.target.ordering_key,
                until=entry.may_land_until(self.ledger.margin),
            )
        if self.on_outcome is not None:
            self.on_outcome(outcome, entry)

    # --- sending -------------------------------------------------------------------------------

    async def send(
        self,
        sendings: Sequence[Sending],
        others: Sequence[OutgoingMessage] = (),
        *,
        publish_window: int = 512,
    ) -> None:
        """Store the commands' records, record them, then publish them and `others`.

        Raises LedgerNotReady (no command published) while the ledger is not rebuilt or once
        `leading` says this replica lost the lease (checked before each record and before the
        commands), and
        ValueError for a command without a deadline or living longer than `max_lifetime`.
        """
        if sendings and not self.ready:
            raise LedgerNotReady(f"ledger {self.name} is not rebuilt yet")
        if sendings:
            self._check_leading()
        # A command that holds no slot (a status write, an Event) needs no record: nothing
        # waits on it.
        entries = [LedgerEntry.of(s.command, s.slots, fenced=s.fenced) for s in sendings if s.slots]
        for entry in entries:
            self.ledger.check_lifetime(entry)
        for start in range(0, len(entries), RECORD_CHUNK):
            chunk = tuple(entries[start : start + RECORD_CHUNK])
            record = LedgerRecord(ledger=self.name, sender=self.sender, entries=chunk)
            self._check_leading()
            await self.bus.publish(record.subject, record, msg_id=_record_id(self.name, chunk))
        for entry in entries:
            self.ledger.record(entry)
        messages = [
            OutgoingMessage(
                subject=s.command.subject,
                message=s.command,
                # The send's identity (key and sent_at) always: a resend of the key by a
                # new leader is not a duplicate of the first send.
                msg_id=s.command.msg_id
                if s.msg_id is None
                else send_msg_id(s.msg_id, s.command.sent_at),
            )
            for s in sendings
        ]
        messages.extend(others)
        if sendings:
            # Records stored and not followed by their commands hold their slots until they
            # can no longer land: fail closed.
            self._check_leading()
        if messages:
            await self.bus.publish_batch(messages, max_in_flight=publish_window)

    def _check_leading(self) -> None:
        if self.leading is not None and not self.leading():
            raise LedgerNotReady(f"ledger {self.name}: this replica no longer holds the lease")

    # --- leadership ----------------------------------------------------------------------------

    def on_leadership(self, leader: bool) -> None:
        """The lease listener: rebuild on taking the lead, stop being ready on losing it."""
        self._set_ready(False)
        if self._rebuild_task is not None:
            self._rebuild_task.cancel()
            self._rebuild_task = None
        if leader:
            self._rebuild_task = asyncio.create_task(
                self._rebuild_until_done(), name=f"ledger {self.name} rebuild"
            )

    async def stop(self) -> None:
        if self._rebuild_task is not None:
            await cancel_and_wait(self._rebuild_task)
            self._rebuild_task = None
        self._set_ready(False)

    async def _rebuild_until_done(self) -> None:
        attempt = 0
        while True:
            attempt += 1
            try:
                await self.rebuild()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                delay = self.retry.delay(attempt)
                metrics.LEDGER_REBUILDS.labels(self.name, "failed").inc()
                log.warning(
                    "ledger.rebuild_failed",
                    ledger=self.name,
                    attempt=attempt,
                    retry_in=delay,
                    error=repr(exc),
                )
                await asyncio.sleep(delay)
                continue
            metrics.LEDGER_REBUILDS.labels(self.name, "ok").inc()
            if self.on_ready is not None:
                self.on_ready()
            return

    async def rebuild(self, now: float | None = None) -> None:
        """Read this ledger's records of the rebuild window (fixed, whatever this replica's
        own lifetime) and the outcomes since the earliest of them that may still land, and
        start from what they say is held; `ready` once done."""
        self._set_ready(False)
        now = time.time() if now is None else now
        self._during_rebuild = []
        try:
            records = [
                codec.decode(LedgerRecord, data, subject=subject)
                for subject, data in await self._read_since(
                    LEDGER_STREAM,
                    subjects.command_ledger(self.name),
                    self.ledger.rebuild_window_start(now),
                )
            ]
            # Records first (an outcome read before its record would be lost), then only
            # the outcomes that can concern what they hold.
            rebuilt = rebuilt_ledger(
                self.sender,
                self.name,
                records,
                (),
                now,
                max_lifetime=self.ledger.max_lifetime,
                margin=self.ledger.margin,
            )
            outcomes: list[CommandOutcome] = []
            outcomes_since = rebuilt.outcomes_window_start()
            if outcomes_since is not None:
                for subject, data in await self._read_since(
                    OUTCOMES_STREAM, subjects.K8S_OUTCOMES, outcomes_since
                ):
                    try:
                        outcome = codec.decode(CommandOutcome, data, subject=subject)
                    except ContractDecodeError:
                        metrics.LEDGER_UNDECODABLE_OUTCOMES.labels(self.name).inc()
                        continue
                    if outcome.sender == self.sender:
                        outcomes.append(outcome)
            outcomes.extend(self._during_rebuild)
            for outcome in outcomes:
                rebuilt.settle(outcome)
        finally:
            self._during_rebuild = None
        self.adopt(rebuilt)
        log.info(
            "ledger.rebuilt",
            ledger=self.name,
            records=len(records),
            outcomes=len(outcomes),
            held=len(rebuilt),
            took=round(time.time() - now, 3),
        )

    def adopt(self, ledger: CommandLedger) -> None:
        """Start from `ledger` (what `rebuild` read from the streams) and become ready."""
        if ledger.sender != self.sender:
            raise ValueError(f"a ledger of {ledger.sender} cannot be {self.sender}'s")
        self.ledger = ledger
        self._set_ready(True)

    async def _read_since(self, stream: str, subject: str, since: float) -> list[tuple[str, bytes]]:
        """Every message of `stream` on `subject` stored since `since` (epoch seconds), read
        by an ephemeral pull consumer that acknowledges nothing."""
        config = ConsumerConfig(
            deliver_policy=DeliverPolicy.BY_START_TIME,
            opt_start_time=datetime.datetime.fromtimestamp(since, tz=datetime.UTC),
            ack_policy=AckPolicy.NONE,
            inactive_threshold=30.0,
        )
        subscription = await self.bus.js.pull_subscribe(subject, stream=stream, config=config)
        found: list[tuple[str, bytes]] = []
        try:
            pending = (await subscription.consumer_info()).num_pending or 0
            while pending > 0:
                batch = await subscription.fetch(min(pending, FETCH_BATCH), timeout=5.0)
                for msg in batch:
                    found.append((msg.subject, msg.data))
                pending = (batch[-1].metadata.num_pending or 0) if batch else pending
        finally:
            with contextlib.suppress(Exception):
                await subscription.unsubscribe()
        return found


def log_refused(outcome: CommandOutcome) -> None:
    """The one log line of a command that was not applied (refused, expired or failed): a
    conflict (the object changed after the decision, so it is decided again) at info, the
    rest at warning. A controller's outcome listener calls it for the outcomes it re-plans."""
    report = log.info if outcome.outcome == "conflict" else log.warning
    report(
        "command.refused",
        sender=outcome.sender,
        key=outcome.idempotency_key,
        op=outcome.op,
        target=outcome.target.ordering_key,
        outcome=outcome.outcome,
        message=outcome.message,
    )


def _record_id(ledger: str, entries: Sequence[LedgerEntry]) -> str:
    """The Nats-Msg-Id of a record: the same commands sent at the same instant are one."""
    digest = hashlib.sha256()
    for entry in entries:
        digest.update(f"{entry.idempotency_key}@{entry.sent_at!r};".encode())
    return f"ledger:{ledger}:{digest.hexdigest()[:32]}"
