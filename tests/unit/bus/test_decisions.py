"""Pure decisions of the bus: backoff, settlement, topology differences, dead-letter headers."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from nodeflow_bus import Backoff, PermanentError, RetryableError, settle
from nodeflow_bus.connection import plan_batch_retries
from nodeflow_bus.consumer import delivery_limit_exceeded, fetch_capacity
from nodeflow_bus.dead_letter import (
    ORIGINAL_PREFIX,
    dead_letter_headers,
    dead_letter_msg_id,
    one_line,
)
from nodeflow_bus.declare import (
    actual_stream_settings,
    consumer_config,
    differences,
    server_max_deliver,
    stream_config,
    stream_settings,
)
from nodeflow_bus.kv_view import _Entry, diff_snapshot, is_delete
from nodeflow_bus.lease import (
    follower_may_take_over,
    leader_expiry,
    leader_still_valid,
    lease_margin,
)
from nodeflow_contracts.codec import ContractDecodeError
from nodeflow_contracts.topology import STREAMS, ConsumerSpec

backoffs = st.builds(
    lambda initial, factor, extra: Backoff(initial=initial, factor=factor, maximum=initial + extra),
    st.floats(0.001, 10),
    st.floats(1, 4),
    st.floats(0, 100),
)


@given(backoffs, st.integers(1, 10_000))
def test_backoff_is_monotone_and_bounded(policy: Backoff, attempt: int) -> None:
    current = policy.delay(attempt)
    assert policy.initial <= current <= policy.maximum
    assert policy.delay(attempt + 1) >= current


def test_backoff_doubles_until_the_cap() -> None:
    policy = Backoff(initial=1, factor=2, maximum=5)
    assert [policy.delay(n) for n in range(1, 6)] == [1, 2, 4, 5, 5]


@given(st.integers(1, 20), st.integers(-1, 20))
def test_settlement(attempt: int, max_deliver: int) -> None:
    policy = Backoff(initial=1, maximum=8)
    assert settle(None, attempt=attempt, max_deliver=max_deliver, backoff=policy).action == "ack"
    decode = ContractDecodeError("s", "$.x", "bad")
    assert settle(decode, attempt=attempt, max_deliver=max_deliver, backoff=policy).error_kind == (
        "decode"
    )
    permanent = settle(PermanentError(), attempt=attempt, max_deliver=max_deliver, backoff=policy)
    assert permanent.error_kind == "permanent"
    for error in (RetryableError("x"), KeyError("unexpected")):
        decision = settle(error, attempt=attempt, max_deliver=max_deliver, backoff=policy)
        if 0 < max_deliver <= attempt:
            assert decision.error_kind == "max_deliveries"
        else:
            assert decision.action == "nak" and decision.delay == policy.delay(attempt)


def test_the_table_matches_itself_and_changes_are_named() -> None:
    for spec in STREAMS:
        config = stream_config(spec)
        assert differences(stream_settings(spec), actual_stream_settings(config)) == ()
    spec = STREAMS[0]
    changed = stream_config(spec)
    changed.max_age = spec.max_age_seconds + 1
    changed.subjects = ["other.>"]
    assert differences(stream_settings(spec), actual_stream_settings(changed)) == (
        "subjects",
        "max_age",
    )


def test_dead_letter_headers_keep_originals_and_flatten_the_error() -> None:
    headers = dead_letter_headers(
        original_headers={"Nats-Msg-Id": "m1", "Trace": "t"},
        error="line one\nline two\r\n",
        error_kind="permanent",
        deliveries=2,
        stream="S",
        stream_sequence=9,
        consumer="c",
        subject="a.b",
    )
    assert headers[ORIGINAL_PREFIX + "Nats-Msg-Id"] == "m1"
    assert "Nats-Msg-Id" not in headers
    assert headers["Trace"] == "t"
    assert headers["Nodeflow-Error"] == "line one line two"
    assert len(one_line("x" * 5000)) == 2000


@given(
    st.dictionaries(st.sampled_from("abcdef"), st.integers(1, 5)),
    st.dictionaries(st.sampled_from("abcdef"), st.integers(1, 5)),
)
def test_snapshot_diff_turns_current_into_snapshot(
    current: dict[str, int], snapshot: dict[str, int]
) -> None:
    def entries(revisions: dict[str, int]) -> dict[str, _Entry[int]]:
        return {key: _Entry(revision * 10, revision) for key, revision in revisions.items()}

    state = dict(entries(current))
    for key, _old, new in diff_snapshot(entries(current), entries(snapshot)):
        if new is None:
            del state[key]
        else:
            state[key] = new
    assert state == entries(snapshot)


def test_delete_markers() -> None:
    assert is_delete({"KV-Operation": "DEL"}) and is_delete({"KV-Operation": "PURGE"})
    assert is_delete({"Nats-Marker-Reason": "MaxAge"})
    assert not is_delete(None) and not is_delete({"Other": "x"})


@given(st.floats(0, 1000), st.floats(0, 100), st.floats(0.1, 60))
def test_a_leader_always_steps_down_before_a_follower_takes_over(
    renew_sent_at: float, seen_after: float, ttl: float
) -> None:
    # The follower sees a renewal no earlier than it was sent.
    observed_at = renew_sent_at + seen_after
    for now in (observed_at + ttl * f for f in (0.0, 0.5, 0.999, 1.0, 1.2, 1.5)):
        if follower_may_take_over(observed_at, now, ttl):
            # With room to spare: two margins of timer or scheduling delay.
            slack = 2 * lease_margin(ttl) * 0.999
            assert not leader_still_valid(renew_sent_at, now - slack, ttl)


def test_a_dead_leader_is_replaced_within_ttl_plus_margin() -> None:
    assert follower_may_take_over(0.0, 1.2 * 10, 10) and not follower_may_take_over(0, 11.9, 10)
    assert leader_expiry(0.0, 10) == 8.0


def test_batch_retries_never_write_an_older_kv_value_over_a_newer_one() -> None:
    subjects = ["$KV.b.x", "$KV.b.y", "$KV.b.x", "s.x", "s.x", "$KV.b.x"]
    retry, superseded = plan_batch_retries(subjects, failed=[0, 3, 5], acked=[1, 2, 4])
    # x#0 is superseded by x#2 (acked later); the stream message s.x#3 is retried anyway;
    # x#5 is the newest write of x: retried.
    assert superseded == {0: 2}
    assert retry == [3, 5]


@given(
    st.lists(st.sampled_from(["$KV.b.k1", "$KV.b.k2", "s.a"]), min_size=1, max_size=12), st.data()
)
def test_batch_retry_plan_keeps_the_last_value_of_every_kv_key(
    subjects: list[str], data: st.DataObject
) -> None:
    failed = data.draw(st.sets(st.sampled_from(range(len(subjects)))))
    acked = [index for index in range(len(subjects)) if index not in failed]
    retry, superseded = plan_batch_retries(subjects, failed, acked)
    assert retry == sorted(retry)
    assert set(retry) | set(superseded) == failed
    # Replaying acked then retried messages: each key ends with its last value in the batch.
    final: dict[str, int] = {}
    for index in sorted(acked):
        final[subjects[index]] = index
    for index in retry:
        final[subjects[index]] = index
    for subject in set(subjects):
        if subject.startswith("$KV."):
            assert final[subject] == max(i for i, s in enumerate(subjects) if s == subject)


def test_the_delivery_limit_belongs_to_the_client() -> None:
    spec = ConsumerSpec(stream="S", durable="d", filter_subjects=("s.>",), description="d")
    assert server_max_deliver(spec) == -1
    assert consumer_config(spec).max_deliver == -1
    assert not delivery_limit_exceeded(5, 5) and delivery_limit_exceeded(6, 5)
    assert not delivery_limit_exceeded(100, -1)


def test_fetching_counts_keys_that_want_a_slot_within_the_held_bound() -> None:
    # Two keys backing off hold 12 messages but no slot: fetch for the 4 free slots.
    assert fetch_capacity(concurrency=4, demand=0, max_held=16, held=12) == 4
    assert fetch_capacity(concurrency=4, demand=1, max_held=16, held=14) == 2
    assert fetch_capacity(concurrency=4, demand=4, max_held=16, held=4) == 0


def test_dead_letter_ids_differ_per_durable() -> None:
    assert dead_letter_msg_id("S", "a", 7) != dead_letter_msg_id("S", "b", 7)
    assert dead_letter_msg_id("S", "a", 7) == dead_letter_msg_id("S", "a", 7)
