"""The command ledger: what a controller's k8s-watcher commands may still change.

The protocol, in one place (docs/protocols.md, "The command ledger", says the same for
operators):

- A controller sends every k8s-watcher command through `nodeflow_bus.ledger.LedgerSender`.
  Each command names the slots it holds: strings for what it changes or spends, e.g.
  `pod:<ns>/<name>`, `node:<name>`, `nodeset-budget:<ns>/<name>`,
  `maintenance-slot:<request uid>`, `gang:<ns>/<name>`. Before the commands are published,
  one `LedgerRecord` naming them (idempotency key, slots, target, sent_at, expires_at) is
  stored on `ledger.k8s.v1.<ledger>` (stream COMMAND_LEDGER); a command is published only
  once its record is stored, so no command can land that a successor cannot know of.
- An entry holds its slots until one of these, and only these, releases it:
  * its outcome says it can never land (`CommandOutcome.never_lands`: refused by the API
    server, or expired before k8s-watcher ever sent it);
  * its outcome says it applied (or already had) and the controller has seen the effect in
    its view (`CommandLedger.release`): until then the view does not show it, and a plan on
    that view would spend the slot a second time;
  * `expires_at + LANDING_MARGIN_SECONDS` has passed: no request for it can land after
    that, whatever its outcome (`failed`, a late `expired`, none at all).
  `retrying`, `failed` and an `expired` after an attempt release nothing early: the last
  request may still be applied.
- A new leader (another replica, or this process after a restart or a lapse of its lease)
  plans nothing until it has rebuilt the ledger (`rebuild_ledger`): every `LedgerRecord` of
  its ledger stored in the last `REBUILD_WINDOW_SECONDS` -- a fixed window, not its own
  `max_lifetime`: an earlier leader (an older version, other settings) may have sent
  commands living longer than the new one's, and no sender may use more than the window
  -- then every outcome stored since the earliest of those that may still land, so it
  holds whatever an earlier leader sent that may still land. No fixed pause: it plans as
  soon as the two streams are read (well under a second). If they cannot be read, it does
  not plan (fail closed) and tries again with a backoff.
- A *fenced* command (`LedgerEntry.fenced`: a write carrying the resourceVersion its plan
  read, which holds no slot but its own object's) is held by the leader that sent it, so it
  does not write the object again before it sees the first write, but not by a successor:
  the API server applies it only to the object as it was when planned, so it cannot undo
  what a successor writes later; if it lands first, the successor sees it and writes on
  that. A status write is fenced: a new leader does not wait out a status write its
  predecessor recorded and died before sending (up to a minute of stale status).
- Planners read what is held as a plain value (`HeldSlots`, from `CommandLedger.held`).

This module is pure: the clock is an argument, nothing here does I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field

import msgspec

from nodeflow_contracts import subjects
from nodeflow_contracts.k8s import CommandOutcome, K8sCommand, ObjectRef
from nodeflow_contracts.topology import COMMAND_LEDGER_MAX_AGE_SECONDS

# How long past its `expires_at` a command may still change the cluster -- the one landing
# margin every controller uses. k8s-watcher checks the deadline before each request; a
# request sent just before it may be applied by the API server until k8s-watcher's request
# timeout (KUBE_REQUEST_TIMEOUT_SECONDS, 30 s by default) has run out, and the deadline was
# set on the sender's clock while k8s-watcher reads its own (NTP keeps nodes within a
# second; 10 s allows for a bad one). nodeset-controller's former 5 s margin ignored the
# request timeout (a release could land 25 s after the hold ended); maintenance-scheduler's
# 60 s covered it with room. 40 s covers both causes without holding slots longer than
# needed. A KUBE_REQUEST_TIMEOUT_SECONDS above 30 needs this raised.
LANDING_MARGIN_SECONDS = 40.0

APPLIED_OUTCOMES: frozenset[str] = frozenset({"applied", "already-applied"})

# How far back a new leader reads its ledger's records, whatever its own settings: every
# sender's command lifetime plus margin must fit in it (`LedgerSender` refuses more), so a
# record of any sender that may still land is inside it. Half of COMMAND_LEDGER's retention,
# so the records are still stored when read.
REBUILD_WINDOW_SECONDS = COMMAND_LEDGER_MAX_AGE_SECONDS / 2


def pod_slot(namespace: str, name: str) -> str:
    return f"pod:{namespace}/{name}"


def node_slot(name: str) -> str:
    return f"node:{name}"


def nodeset_budget_slot(namespace: str, name: str) -> str:
    return f"nodeset-budget:{namespace}/{name}"


def maintenance_slot(request_uid: str) -> str:
    return f"maintenance-slot:{request_uid}"


def gang_slot(namespace: str, name: str) -> str:
    return f"gang:{namespace}/{name}"


class LedgerEntry(msgspec.Struct, frozen=True, kw_only=True):
    """One command sent: what it holds and until when it may land."""

    idempotency_key: str
    # The slots the command holds (see the module docstring).
    slots: tuple[str, ...]
    target: ObjectRef
    op: str
    # The command's sent_at: an outcome names it, so an outcome of an earlier send of the
    # same key never releases a later one.
    sent_at: float
    expires_at: float
    # Held by its own leader only (see the module docstring); records written before the
    # field existed read False, which holds as before.
    fenced: bool = False

    @classmethod
    def of(cls, command: K8sCommand, slots: Iterable[str], *, fenced: bool = False) -> LedgerEntry:
        if command.expires_at is None:
            raise ValueError(f"command {command.idempotency_key} has no expires_at")
        if fenced and not command.target.resource_version:
            raise ValueError(
                f"command {command.idempotency_key} is not fenced: it names no resourceVersion"
            )
        return cls(
            idempotency_key=command.idempotency_key,
            slots=tuple(dict.fromkeys(slots)),
            target=command.target,
            op=command.op,
            sent_at=command.sent_at,
            expires_at=command.expires_at,
            fenced=fenced,
        )

    def may_land_until(self, margin: float = LANDING_MARGIN_SECONDS) -> float:
        return self.expires_at + margin


class LedgerRecord(msgspec.Struct, frozen=True, kw_only=True):
    """Commands a controller is about to publish, on `ledger.k8s.v1.<ledger>`."""

    ledger: str
    sender: str
    entries: tuple[LedgerEntry, ...]

    @property
    def subject(self) -> str:
        return subjects.command_ledger(self.ledger)


@dataclass
class _Held:
    entry: LedgerEntry
    # The outcome said it applied: held until the controller sees the effect (`release`).
    applied_rv: str | None = None
    applied: bool = False
    # "applied" or "already-applied" once applied.
    outcome: str = ""


@dataclass(frozen=True)
class HeldSlots:
    """The slots held at one instant, as planners read them (a plain value)."""

    by_slot: Mapping[str, tuple[LedgerEntry, ...]] = field(default_factory=dict)

    def __contains__(self, slot: object) -> bool:
        return slot in self.by_slot

    def __iter__(self) -> Iterator[str]:
        return iter(self.by_slot)

    def __len__(self) -> int:
        return len(self.by_slot)

    def with_prefix(self, prefix: str) -> dict[str, tuple[LedgerEntry, ...]]:
        return {s: e for s, e in self.by_slot.items() if s.startswith(prefix)}


class CommandLedger:
    """The entries of one ledger (one sender's controller); mutable, no I/O."""

    def __init__(
        self, sender: str, *, max_lifetime: float, margin: float = LANDING_MARGIN_SECONDS
    ) -> None:
        if max_lifetime <= 0:
            raise ValueError("max_lifetime must be positive")
        self.sender = sender
        self.max_lifetime = max_lifetime
        self.margin = margin
        # idempotency key -> sent_at -> entry (a key sent again is a second entry).
        self._entries: dict[str, dict[float, _Held]] = {}
        # slot -> the (key, sent_at) of the entries holding it.
        self._by_slot: dict[str, set[tuple[str, float]]] = {}

    # --- changes -------------------------------------------------------------------------------

    def check_lifetime(self, entry: LedgerEntry) -> None:
        """A command living longer than `max_lifetime` could land after a successor's
        rebuild window: refused."""
        if entry.expires_at - entry.sent_at > self.max_lifetime + 1e-6:
            raise ValueError(
                f"command {entry.idempotency_key} lives {entry.expires_at - entry.sent_at:.1f}s, "
                f"longer than the ledger's max lifetime {self.max_lifetime:.1f}s"
            )

    def record(self, entry: LedgerEntry) -> None:
        self.check_lifetime(entry)
        self._insert(entry)

    def _insert(self, entry: LedgerEntry) -> None:
        self._drop(entry.idempotency_key, entry.sent_at)
        self._entries.setdefault(entry.idempotency_key, {})[entry.sent_at] = _Held(entry)
        for slot in entry.slots:
            self._by_slot.setdefault(slot, set()).add((entry.idempotency_key, entry.sent_at))

    def _drop(self, key: str, sent_at: float) -> LedgerEntry | None:
        sends = self._entries.get(key)
        held = None if sends is None else sends.pop(sent_at, None)
        if sends is not None and not sends:
            del self._entries[key]
        if held is None:
            return None
        for slot in held.entry.slots:
            holders = self._by_slot.get(slot)
            if holders is not None:
                holders.discard((key, sent_at))
                if not holders:
                    del self._by_slot[slot]
        return held.entry

    def settle(self, outcome: CommandOutcome) -> LedgerEntry | None:
        """Apply an outcome; returns the entry it concerns (None: not ours or unknown)."""
        if outcome.sender != self.sender:
            return None
        sends = self._entries.get(outcome.idempotency_key)
        held = None if sends is None else sends.get(outcome.sent_at)
        if sends is None or held is None:
            return None
        if outcome.never_lands:
            self._drop(outcome.idempotency_key, outcome.sent_at)
        elif outcome.outcome in APPLIED_OUTCOMES:
            held.applied = True
            held.applied_rv = outcome.resource_version
            held.outcome = outcome.outcome
        return held.entry

    def release(self, idempotency_key: str, sent_at: float | None = None) -> None:
        """The controller saw the effect of an applied command: it holds nothing any more.
        Only applied sends are released (one still unanswered may land later)."""
        sends = self._entries.get(idempotency_key)
        if sends is None:
            return
        for at in [a for a, h in sends.items() if h.applied and sent_at in (None, a)]:
            self._drop(idempotency_key, at)

    def release_seen(self, seen: Callable[[LedgerEntry, str, str | None], bool]) -> int:
        """Release every applied entry whose effect `seen(entry, outcome, resource_version)`
        says the controller's view shows; returns how many."""
        done = [
            (key, at)
            for key, sends in self._entries.items()
            for at, held in sends.items()
            if held.applied and seen(held.entry, held.outcome, held.applied_rv)
        ]
        for key, at in done:
            self._drop(key, at)
        return len(done)

    def expire(self, now: float) -> list[LedgerEntry]:
        """Drop the entries that can no longer land; returns them."""
        dropped: list[LedgerEntry] = []
        for key, sends in list(self._entries.items()):
            for at, held in list(sends.items()):
                if now > held.entry.may_land_until(self.margin):
                    self._drop(key, at)
                    dropped.append(held.entry)
        return dropped

    def clear(self) -> None:
        self._entries.clear()
        self._by_slot.clear()

    # --- queries -------------------------------------------------------------------------------

    def entries(self) -> Iterator[LedgerEntry]:
        for sends in self._entries.values():
            for held in sends.values():
                yield held.entry

    def applied(self) -> Iterator[tuple[LedgerEntry, str | None]]:
        """Entries whose outcome said applied and whose effect the controller has not yet
        confirmed seeing, with the resourceVersion the outcome named."""
        for sends in self._entries.values():
            for held in sends.values():
                if held.applied:
                    yield held.entry, held.applied_rv

    def __len__(self) -> int:
        return sum(len(s) for s in self._entries.values())

    def held(self, now: float) -> HeldSlots:
        """The slots held at `now` (entries past their landing bound count no more, whether
        or not `expire` dropped them yet)."""
        by_slot: dict[str, list[LedgerEntry]] = {}
        for entry in self.entries():
            if now <= entry.may_land_until(self.margin):
                for slot in entry.slots:
                    by_slot.setdefault(slot, []).append(entry)
        return HeldSlots({slot: tuple(entries) for slot, entries in by_slot.items()})

    def holds(self, slot: str, now: float) -> bool:
        return bool(self.holders(slot, now))

    def holders(self, slot: str, now: float) -> list[LedgerEntry]:
        """The entries holding `slot` at `now`."""
        found: list[LedgerEntry] = []
        for key, sent_at in self._by_slot.get(slot, ()):
            entry = self._entries[key][sent_at].entry
            if now <= entry.may_land_until(self.margin):
                found.append(entry)
        return found

    def next_expiry(self) -> float | None:
        """When the next entry stops holding (a controller wakes then to plan again)."""
        bounds = [e.may_land_until(self.margin) for e in self.entries()]
        return min(bounds) if bounds else None

    def rebuild_window_start(self, now: float) -> float:
        """The earliest send time of a command of any sender that may still land at `now`
        (not `max_lifetime`: an earlier leader may have allowed its commands longer)."""
        return now - REBUILD_WINDOW_SECONDS

    def outcomes_window_start(self) -> float | None:
        """The earliest time an outcome of a held entry may have been stored (None: nothing
        held, no outcome matters); the margin allows for the sender's clock skew."""
        sent = [entry.sent_at for entry in self.entries()]
        return min(sent) - self.margin if sent else None


def rebuilt_ledger(
    sender: str,
    ledger_name: str,
    records: Iterable[LedgerRecord],
    outcomes: Iterable[CommandOutcome],
    now: float,
    *,
    max_lifetime: float,
    margin: float = LANDING_MARGIN_SECONDS,
) -> CommandLedger:
    """The ledger a new leader starts from: every recorded command of `ledger_name` that may
    still land at `now`, with the outcomes seen so far applied (records first: an outcome
    read before its record would be lost)."""
    ledger = CommandLedger(sender, max_lifetime=max_lifetime, margin=margin)
    for record in records:
        if record.ledger != ledger_name or record.sender != sender:
            continue
        for entry in record.entries:
            # Not `record`: a command an earlier leader sent with a longer life is held too.
            # A fenced one is not: it cannot land over what this leader writes.
            if not entry.fenced and now <= entry.may_land_until(margin):
                ledger._insert(entry)
    for outcome in outcomes:
        ledger.settle(outcome)
    return ledger
