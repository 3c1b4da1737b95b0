"""The command ledger's pure rules (nodeflow_contracts.ledger): what is held, when it is
released, what a new leader rebuilds."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nodeflow_contracts.k8s import CommandOutcome, K8sCommand, ObjectRef, PatchObject
from nodeflow_contracts.ledger import (
    LANDING_MARGIN_SECONDS,
    CommandLedger,
    LedgerEntry,
    LedgerRecord,
    rebuilt_ledger,
)

SENDER = "nodeset-controller"
LIFETIME = 20.0
POD = ObjectRef(api_version="v1", kind="Pod", name="p", namespace="ns")


def command(key: str, sent_at: float, lifetime: float = LIFETIME) -> K8sCommand:
    return K8sCommand(
        idempotency_key=key,
        sender=SENDER,
        sent_at=sent_at,
        expires_at=sent_at + lifetime,
        target=POD,
        operation=PatchObject(patch_type="merge", patch={}),
    )


def outcome(entry: LedgerEntry, result: str, attempt: int = 1) -> CommandOutcome:
    return CommandOutcome(
        idempotency_key=entry.idempotency_key,
        op=entry.op,
        sender=SENDER,
        target=entry.target,
        outcome=result,  # type: ignore[arg-type]
        attempt=attempt,
        sent_at=entry.sent_at,
        finished_at=entry.sent_at + 1,
        resource_version="7",
    )


def test_the_margin_covers_k8s_watchers_request_timeout() -> None:
    from k8s_watcher.config import K8sWatcherConfig

    [timeout] = [
        f.default
        for f in msgspec.structs.fields(K8sWatcherConfig)
        if f.name == "kube_request_timeout_seconds"
    ]
    # The request timeout, plus room for the clocks of sender and k8s-watcher to differ.
    assert timeout + 5 <= LANDING_MARGIN_SECONDS


def test_held_until_deadline_plus_margin_without_an_outcome() -> None:
    ledger = CommandLedger(SENDER, max_lifetime=LIFETIME)
    entry = LedgerEntry.of(command("k", 100.0), ["budget", "pod:ns/p"])
    ledger.record(entry)
    end = 100.0 + LIFETIME + LANDING_MARGIN_SECONDS
    assert ledger.holds("budget", end)
    assert "pod:ns/p" in ledger.held(end)
    assert not ledger.holds("budget", end + 0.001)
    assert ledger.expire(end + 0.001) == [entry]
    assert len(ledger) == 0


@pytest.mark.parametrize("result", ["conflict", "not-found", "invalid", "forbidden"])
def test_released_when_the_outcome_says_it_never_lands(result: str) -> None:
    ledger = CommandLedger(SENDER, max_lifetime=LIFETIME)
    entry = LedgerEntry.of(command("k", 100.0), ["budget"])
    ledger.record(entry)
    ledger.settle(outcome(entry, result))
    assert not ledger.holds("budget", 101.0)


@pytest.mark.parametrize(("result", "attempt"), [("failed", 1), ("expired", 2), ("retrying", 1)])
def test_an_outcome_after_an_unanswered_request_releases_nothing(result: str, attempt: int) -> None:
    ledger = CommandLedger(SENDER, max_lifetime=LIFETIME)
    entry = LedgerEntry.of(command("k", 100.0), ["budget"])
    ledger.record(entry)
    ledger.settle(outcome(entry, result, attempt))
    assert ledger.holds("budget", 100.0 + LIFETIME + LANDING_MARGIN_SECONDS)


def test_an_expired_first_attempt_never_lands() -> None:
    ledger = CommandLedger(SENDER, max_lifetime=LIFETIME)
    entry = LedgerEntry.of(command("k", 100.0), ["budget"])
    ledger.record(entry)
    ledger.settle(outcome(entry, "expired", attempt=1))
    assert not ledger.holds("budget", 101.0)


def test_applied_holds_until_the_controller_sees_the_effect() -> None:
    ledger = CommandLedger(SENDER, max_lifetime=LIFETIME)
    entry = LedgerEntry.of(command("k", 100.0), ["budget"])
    ledger.record(entry)
    ledger.settle(outcome(entry, "applied"))
    assert ledger.holds("budget", 101.0)
    assert list(ledger.applied()) == [(entry, "7")]
    ledger.release("k")
    assert not ledger.holds("budget", 101.0)


def test_release_leaves_a_send_not_yet_applied() -> None:
    ledger = CommandLedger(SENDER, max_lifetime=LIFETIME)
    first = LedgerEntry.of(command("k", 100.0), ["budget"])
    again = LedgerEntry.of(command("k", 105.0), ["budget"])
    ledger.record(first)
    ledger.record(again)
    ledger.settle(outcome(first, "applied"))
    ledger.release("k")
    assert ledger.holders("budget", 106.0) == [again]


def test_an_outcome_of_an_earlier_send_does_not_release_a_later_one() -> None:
    ledger = CommandLedger(SENDER, max_lifetime=LIFETIME)
    first = LedgerEntry.of(command("k", 100.0), ["budget"])
    again = LedgerEntry.of(command("k", 130.0), ["budget"])
    ledger.record(first)
    ledger.record(again)
    ledger.settle(outcome(first, "expired", attempt=1))
    assert ledger.holders("budget", 131.0) == [again]


def test_another_senders_outcome_settles_nothing() -> None:
    ledger = CommandLedger(SENDER, max_lifetime=LIFETIME)
    entry = LedgerEntry.of(command("k", 100.0), ["budget"])
    ledger.record(entry)
    foreign = msgspec.structs.replace(outcome(entry, "conflict"), sender="topology-placer")
    assert ledger.settle(foreign) is None
    assert ledger.holds("budget", 101.0)


def test_a_command_living_longer_than_the_ledger_allows_is_refused() -> None:
    ledger = CommandLedger(SENDER, max_lifetime=LIFETIME)
    with pytest.raises(ValueError, match="max lifetime"):
        ledger.record(LedgerEntry.of(command("k", 100.0, lifetime=LIFETIME + 1), ["budget"]))
    no_deadline = msgspec.structs.replace(command("k", 100.0), expires_at=None)
    with pytest.raises(ValueError, match="no expires_at"):
        LedgerEntry.of(no_deadline, ["budget"])


def test_a_new_leader_rebuilds_what_may_still_land() -> None:
    held = LedgerEntry.of(command("a", 100.0), ["pod:ns/a"])
    refused = LedgerEntry.of(command("b", 100.0), ["pod:ns/b"])
    old = LedgerEntry.of(command("c", 10.0), ["pod:ns/c"])
    records = [
        LedgerRecord(ledger="nodeset-controller", sender=SENDER, entries=(held, refused, old)),
        LedgerRecord(
            ledger="other",
            sender=SENDER,
            entries=(LedgerEntry.of(command("d", 100.0), ["pod:ns/d"]),),
        ),
    ]
    ledger = rebuilt_ledger(
        SENDER,
        "nodeset-controller",
        records,
        [outcome(refused, "conflict")],
        now=101.0,
        max_lifetime=LIFETIME,
    )
    assert set(ledger.held(101.0)) == {"pod:ns/a"}


def test_rule_a_fenced_write_holds_its_own_leader_but_not_a_successor() -> None:
    """A write carrying the resourceVersion it was planned on (a status write) cannot land
    over a successor's: the successor does not wait out one its predecessor recorded and
    never sent; its own leader still holds it until it sees it."""
    nodeset = ObjectRef(
        api_version="slinky.slurm.net/v1beta1",
        kind="NodeSet",
        name="gpu",
        namespace="ns",
        resource_version="41",
    )
    status = msgspec.structs.replace(command("status", 100.0), target=nodeset)
    fenced = LedgerEntry.of(status, ["NodeSet/ns/gpu"], fenced=True)
    unfenced = LedgerEntry.of(command("patch", 100.0), ["pod:ns/p"])
    own = CommandLedger(SENDER, max_lifetime=LIFETIME)
    own.record(fenced)
    assert own.holds("NodeSet/ns/gpu", 101.0)
    record = LedgerRecord(ledger="nodeset-controller", sender=SENDER, entries=(fenced, unfenced))
    # It travels as the stream stores it, and reads back fenced.
    [stored] = msgspec.json.decode(msgspec.json.encode(record), type=LedgerRecord).entries[:1]
    assert stored.fenced
    successor = rebuilt_ledger(
        SENDER, "nodeset-controller", [record], [], now=101.0, max_lifetime=LIFETIME
    )
    assert set(successor.held(101.0)) == {"pod:ns/p"}
    # A record written before the field existed holds as it always did.
    written_before = msgspec.to_builtins(fenced)
    del written_before["fenced"]
    assert not msgspec.convert(written_before, type=LedgerEntry).fenced


def test_rule_a_write_without_a_resource_version_cannot_be_fenced() -> None:
    with pytest.raises(ValueError, match="names no resourceVersion"):
        LedgerEntry.of(command("patch", 100.0), ["pod:ns/p"], fenced=True)


# --- property: a slot is never given out twice while a command holding it may land --------


class Model:
    """What may truly land, as k8s-watcher and the API server decide (the test's oracle)."""

    def __init__(self) -> None:
        # (key, sent_at) -> (slot, expires_at, landed_or_refused)
        self.sends: dict[tuple[str, float], tuple[str, float, bool]] = {}

    def may_land(self, slot: str, now: float) -> bool:
        return any(
            s == slot and not done and now <= expires + LANDING_MARGIN_SECONDS
            for s, expires, done in self.sends.values()
        )


steps = st.lists(
    st.one_of(
        st.tuples(st.just("send"), st.sampled_from(["s1", "s2"])),
        st.tuples(
            st.just("outcome"),
            st.sampled_from(["applied", "conflict", "failed", "expired", "retrying"]),
        ),
        st.tuples(st.just("tick"), st.floats(min_value=0.1, max_value=40.0)),
        st.tuples(st.just("leader-change"), st.just("")),
        st.tuples(st.just("seen"), st.just("")),
    ),
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(steps=steps)
def test_property_no_slot_is_given_twice_while_a_holder_may_land(
    steps: list[tuple[str, object]],
) -> None:
    """Random interleavings of sends (each only when the ledger says its slot is free),
    outcomes, time passing, the controller seeing an applied effect, and leader changes
    (the new leader starts from `rebuilt_ledger` over everything published): whenever a
    command may still land on a slot, the ledger holds that slot."""
    now = 1000.0
    ledger = CommandLedger(SENDER, max_lifetime=LIFETIME)
    records: list[LedgerRecord] = []
    outcomes: list[CommandOutcome] = []
    model = Model()
    counter = 0
    for kind, arg in steps:
        if kind == "send":
            slot = str(arg)
            if ledger.holds(slot, now):
                continue  # the controller would not send: its slot is taken
            assert not model.may_land(slot, now), "the ledger gave out a slot still held"
            counter += 1
            entry = LedgerEntry.of(command(f"k{counter}", now), [slot])
            records.append(LedgerRecord(ledger="l", sender=SENDER, entries=(entry,)))
            ledger.record(entry)
            model.sends[(entry.idempotency_key, entry.sent_at)] = (slot, entry.expires_at, False)
        elif kind == "outcome":
            pending = [k for k, (_, _, done) in model.sends.items() if not done]
            if not pending:
                continue
            key, sent_at = pending[0]
            slot, expires, _ = model.sends[(key, sent_at)]
            entry = LedgerEntry.of(command(key, sent_at), [slot])
            result = str(arg)
            # An expired outcome past the deadline: never sent (it never lands).
            attempt = 1 if result == "expired" and now > expires else 2
            out = outcome(entry, result, attempt)
            outcomes.append(out)
            ledger.settle(out)
            if out.never_lands:
                model.sends[(key, sent_at)] = (slot, expires, True)
            # applied: the effect is in the cluster but not yet in the controller's view.
        elif kind == "tick":
            now += float(arg)  # type: ignore[arg-type]
            ledger.expire(now)
        elif kind == "seen":
            # The controller's view shows every applied effect: those release.
            for entry, _ in list(ledger.applied()):
                ledger.release(entry.idempotency_key, entry.sent_at)
                slot, expires, _ = model.sends[(entry.idempotency_key, entry.sent_at)]
                model.sends[(entry.idempotency_key, entry.sent_at)] = (slot, expires, True)
        elif kind == "leader-change":
            ledger = rebuilt_ledger(SENDER, "l", records, outcomes, now, max_lifetime=LIFETIME)
            # The new leader's view shows what was applied before it took over.
            for entry, _ in list(ledger.applied()):
                ledger.release(entry.idempotency_key, entry.sent_at)
                slot, expires, _ = model.sends[(entry.idempotency_key, entry.sent_at)]
                model.sends[(entry.idempotency_key, entry.sent_at)] = (slot, expires, True)
        for slot in ("s1", "s2"):
            if model.may_land(slot, now):
                assert ledger.holds(slot, now)


def test_release_seen_releases_only_applied_entries_the_view_shows() -> None:
    ledger = CommandLedger(SENDER, max_lifetime=LIFETIME)
    shown = LedgerEntry.of(command("a", 100.0), ["pod:ns/a"])
    lagging = LedgerEntry.of(command("b", 100.0), ["pod:ns/b"])
    unanswered = LedgerEntry.of(command("c", 100.0), ["pod:ns/c"])
    for entry in (shown, lagging, unanswered):
        ledger.record(entry)
    ledger.settle(outcome(shown, "applied"))
    ledger.settle(
        msgspec.structs.replace(outcome(lagging, "already-applied"), resource_version="9")
    )
    seen: list[tuple[str, str, str | None]] = []

    def view_shows(entry: LedgerEntry, result: str, rv: str | None) -> bool:
        seen.append((entry.idempotency_key, result, rv))
        return entry.idempotency_key == "a"

    assert ledger.release_seen(view_shows) == 1
    assert sorted(seen) == [("a", "applied", "7"), ("b", "already-applied", "9")]
    assert set(ledger.held(101.0)) == {"pod:ns/b", "pod:ns/c"}
