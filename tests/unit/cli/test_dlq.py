"""`kubectl nodeflow dlq`, the pure part (nodeflow_cli.dlq): what a replay republishes and
when it refuses, and how a dead letter is listed and shown. Against a real nats-server:
tests/integration/cli/test_dlq.py."""

from __future__ import annotations

import datetime

import pytest

from nodeflow_bus import dead_letter
from nodeflow_cli.dlq import (
    DeadLetter,
    ReplayRefused,
    format_list,
    format_payload,
    format_show,
    plan_replay,
    preview,
    subject_filter,
)
from nodeflow_contracts.permissions import SERVICES, nats_publish_allow

STORED = datetime.datetime(2026, 11, 28, 6, 30, 5, tzinfo=datetime.UTC)


def letter(
    *,
    subject: str = "dlq.cmd.k8s.v1.nodeflow-admin.patch",
    data: bytes = b"{bad",
    extra: dict[str, str] | None = None,
) -> DeadLetter:
    headers = dead_letter.dead_letter_headers(
        original_headers={"Nats-Msg-Id": "original-id", "Trace-Id": "t-9"},
        error="cannot decode K8sCommand:\nmissing field sender",
        error_kind="decode",
        deliveries=1,
        stream="K8S_COMMANDS",
        stream_sequence=42,
        consumer="k8s-watcher-commands",
        subject="cmd.k8s.v1.nodeflow-admin.patch",
    )
    # As stored: the copy's own Nats-Msg-Id (dead_letter_msg_id).
    headers["Nats-Msg-Id"] = "dlq:K8S_COMMANDS:k8s-watcher-commands:42"
    headers.update(extra or {})
    return DeadLetter(sequence=7, time=STORED, subject=subject, headers=headers, data=data)


def test_replay_goes_to_the_original_subject_with_the_originals_own_headers() -> None:
    replay = plan_replay(letter())
    assert replay.subject == "cmd.k8s.v1.nodeflow-admin.patch"
    # Neither the dead letter's headers nor any Nats-* one (the copy's Msg-Id, the
    # original's kept under Nodeflow-Original-): only what the publisher set itself.
    assert replay.headers == {"Trace-Id": "t-9"}


def test_replay_of_one_dead_letter_always_has_the_same_msg_id() -> None:
    assert plan_replay(letter()).msg_id == "replay-DEAD_LETTERS-7"
    assert plan_replay(letter()).msg_id == plan_replay(letter()).msg_id


def test_replay_refuses_a_dead_letter_without_its_original_subject_header() -> None:
    unnamed = DeadLetter(sequence=1, time=None, subject="dlq.work.x", headers={}, data=b"x")
    with pytest.raises(ReplayRefused, match="no Nodeflow-Subject header"):
        plan_replay(unnamed)


def test_replay_refuses_an_original_subject_that_is_itself_a_dead_letter_subject() -> None:
    looping = letter(subject="dlq.dlq.work.x", extra={dead_letter.SUBJECT: "dlq.work.x"})
    with pytest.raises(ReplayRefused, match="itself a dead-letter subject"):
        plan_replay(looping)


def test_replay_refuses_a_header_that_disagrees_with_the_stored_subject() -> None:
    with pytest.raises(ReplayRefused, match=r"stored under dlq\.work\.x"):
        plan_replay(letter(subject="dlq.work.x"))


def test_subject_filter_takes_an_original_or_a_dead_letter_subject() -> None:
    assert subject_filter("") == "dlq.>"
    assert subject_filter("cmd.k8s.v1.>") == "dlq.cmd.k8s.v1.>"
    assert subject_filter("dlq.cmd.>") == "dlq.cmd.>"


def test_dlq_list_is_one_line_per_dead_letter_with_its_error_header() -> None:
    header, line = format_list([letter()])
    assert header.split() == ["SEQ", "TIME", "SUBJECT", "KIND", "ERROR", "PAYLOAD"]
    assert line == (
        "7    2026-11-28T06:30:05Z  cmd.k8s.v1.nodeflow-admin.patch  decode  "
        "cannot decode K8sCommand: missing field sender  {bad"
    )
    unnamed = DeadLetter(sequence=8, time=None, subject="dlq.work.x", headers={}, data=b"")
    assert format_list([unnamed])[1].split() == [
        "8",
        "-",
        "dlq.work.x",
        "(no",
        "Nodeflow-Subject)",
        "-",
        "-",
        "''",
    ]


def test_a_payload_preview_is_one_short_line_or_hex() -> None:
    assert preview(b'{"a":\n 1}') == '{"a": 1}'
    assert preview(b"x" * 100) == "x" * 57 + "..."
    assert preview(b"\xff\x00") == "0xff00"


def test_dlq_show_prints_json_indented_text_as_repr_and_binary_as_hex() -> None:
    assert format_payload(b'{"a": [1]}') == (
        'payload (10 bytes, JSON):\n{\n  "a": [\n    1\n  ]\n}'
    )
    assert format_payload(b"{bad") == "payload (4 bytes, not JSON):\n  '{bad'"
    assert format_payload(b"\xff\xfe" + bytes(range(16))) == (
        "payload (18 bytes, binary):\n"
        "  00000000  ff fe 00 01 02 03 04 05 06 07 08 09 0a 0b 0c 0d\n"
        "  00000010  0e 0f"
    )
    shown = format_show(letter())
    assert shown.splitlines()[:3] == [
        "dead letter 7 of DEAD_LETTERS, stored 2026-11-28T06:30:05Z",
        "subject:          dlq.cmd.k8s.v1.nodeflow-admin.patch",
        "original subject: cmd.k8s.v1.nodeflow-admin.patch",
    ]
    assert "  Nodeflow-Error: cannot decode K8sCommand: missing field sender" in shown
    assert "  Nodeflow-Original-Nats-Msg-Id: original-id" in shown


def test_no_service_user_may_delete_dead_letters_only_the_operators_user() -> None:
    """`dlq replay` needs the admin user (docs/cli.md): no service's allow list has the
    stream's message delete, so a leaked service credential cannot erase dead letters."""
    for service in SERVICES:
        allowed = nats_publish_allow(service)
        assert not any("MSG.DELETE" in subject for subject in allowed), service
