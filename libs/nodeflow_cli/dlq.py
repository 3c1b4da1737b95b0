"""`kubectl nodeflow dlq list|show|replay`, the pure part: how a dead letter is shown and what
a replay republishes.

A consumer that gives up on a message copies it to `dlq.<original subject>` in the
DEAD_LETTERS stream with the headers of nodeflow_bus.dead_letter (the original subject, the
error and its kind, the deliveries, where it came from). A replay publishes the payload again
to that original subject with the original's own headers, under a Nats-Msg-Id derived from
the dead letter's place in DEAD_LETTERS: the stream of the original subject drops a second
replay of the same dead letter within its duplicate window, so a replay interrupted between
the publish and the removal of the dead letter can be run again without delivering twice.
The I/O (reading the stream, publishing, deleting) is in nodeflow_cli.main.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from nodeflow_bus import dead_letter
from nodeflow_contracts import subjects
from nodeflow_contracts.topology import STREAMS

# The stream that stores `dlq.>`, as the topology table names it.
STREAM = next(spec.name for spec in STREAMS if subjects.DEAD_LETTERS in spec.subjects)
# What the consumer adds to a dead letter (nodeflow_bus.dead_letter.dead_letter_headers); a
# replay leaves them out, so the message arrives as it was first published.
DEAD_LETTER_HEADERS = frozenset(
    name.lower()
    for name in (
        dead_letter.ERROR,
        dead_letter.ERROR_KIND,
        dead_letter.DELIVERIES,
        dead_letter.STREAM,
        dead_letter.STREAM_SEQUENCE,
        dead_letter.CONSUMER,
        dead_letter.SUBJECT,
    )
)
ERROR_WIDTH = 120
PREVIEW_WIDTH = 60
HEX_ROW = 16


@dataclass(frozen=True)
class DeadLetter:
    """One message of DEAD_LETTERS, as stored."""

    sequence: int
    time: datetime.datetime | None
    subject: str
    headers: Mapping[str, str]
    data: bytes

    @property
    def original_subject(self) -> str:
        return self.headers.get(dead_letter.SUBJECT, "")


@dataclass(frozen=True)
class Replay:
    """What replaying one dead letter publishes."""

    subject: str
    headers: dict[str, str]
    msg_id: str


class ReplayRefused(Exception):
    """A dead letter that cannot be replayed safely; the message says why."""


def subject_filter(subject: str) -> str:
    """The DEAD_LETTERS filter for `--subject`: an original subject (wildcards allowed),
    or a dead-letter subject as it is stored; nothing given: every dead letter."""
    if not subject:
        return subjects.DEAD_LETTERS
    return subject if dead_letter.is_dead_letter(subject) else subjects.dead_letter(subject)


def replay_msg_id(sequence: int) -> str:
    """The same dead letter always replays under the same id (deduplicated downstream)."""
    return f"replay-{STREAM}-{sequence}"


def plan_replay(letter: DeadLetter) -> Replay:
    """Where and how `letter` is republished, or ReplayRefused.

    Refused: no original-subject header (the subject would be guessed), a dead-letter
    subject as the original (it would only be dead-lettered again, into dlq.dlq.…), or a
    header that disagrees with the subject it was dead-lettered under.
    """
    original = letter.original_subject
    if not original:
        raise ReplayRefused(
            f"no {dead_letter.SUBJECT} header: its original subject is unknown, not replayed"
        )
    if dead_letter.is_dead_letter(original):
        raise ReplayRefused(
            f"its original subject {original} is itself a dead-letter subject, not replayed"
        )
    if letter.subject != subjects.dead_letter(original):
        raise ReplayRefused(
            f"its {dead_letter.SUBJECT} header says {original} but it was stored under "
            f"{letter.subject}, not replayed"
        )
    headers = {
        name: value
        for name, value in letter.headers.items()
        # Nats-* are this copy's own (its Msg-Id); the original's are under ORIGINAL_PREFIX
        # and stay out: its Msg-Id or Expected-* headers would refuse or drop the replay.
        if name.lower() not in DEAD_LETTER_HEADERS
        and not name.lower().startswith("nats-")
        and not name.lower().startswith(dead_letter.ORIGINAL_PREFIX.lower())
    }
    return Replay(subject=original, headers=headers, msg_id=replay_msg_id(letter.sequence))


def _timestamp(time: datetime.datetime | None) -> str:
    if time is None:
        return "-"
    return time.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def preview(data: bytes, width: int = PREVIEW_WIDTH) -> str:
    """The payload's start on one line: text as text, anything else as hex."""
    try:
        text = data.decode()
    except UnicodeDecodeError:
        text = "0x" + data[: width // 2].hex()
        return text if len(data) <= width // 2 else text + "..."
    return dead_letter.one_line(text, width) if text.strip() else repr(text)


def format_list(letters: Sequence[DeadLetter]) -> list[str]:
    """`dlq list`: a table, one line per dead letter: its sequence in DEAD_LETTERS, when it
    was stored, its original subject, error kind and error, and its payload's start."""
    rows = [("SEQ", "TIME", "SUBJECT", "KIND", "ERROR", "PAYLOAD")]
    for letter in letters:
        error = letter.headers.get(dead_letter.ERROR, "")
        rows.append(
            (
                str(letter.sequence),
                _timestamp(letter.time),
                letter.original_subject or f"{letter.subject} (no {dead_letter.SUBJECT})",
                letter.headers.get(dead_letter.ERROR_KIND) or "-",
                dead_letter.one_line(error, ERROR_WIDTH) if error.strip() else "-",
                preview(letter.data),
            )
        )
    # The short columns are aligned; the error and the payload, of any length, are not.
    widths = [max(len(row[column]) for row in rows) for column in range(4)]
    return [
        "  ".join(
            [*(cell.ljust(width) for cell, width in zip(row, widths, strict=False)), *row[4:]]
        )
        for row in rows
    ]


def format_payload(data: bytes) -> str:
    """JSON indented; other text as its repr; anything else as a hex dump."""
    try:
        text = data.decode()
    except UnicodeDecodeError:
        rows = [
            f"  {offset:08x}  {data[offset : offset + HEX_ROW].hex(' ')}"
            for offset in range(0, len(data), HEX_ROW)
        ]
        return f"payload ({len(data)} bytes, binary):\n" + "\n".join(rows)
    try:
        decoded = json.loads(text)
    except ValueError:
        return f"payload ({len(data)} bytes, not JSON):\n  {text!r}"
    return f"payload ({len(data)} bytes, JSON):\n" + json.dumps(decoded, indent=2)


def format_show(letter: DeadLetter) -> str:
    """`dlq show SEQ`: where it is, every header, the whole payload."""
    original = letter.original_subject or f"(unknown: no {dead_letter.SUBJECT} header)"
    lines = [
        f"dead letter {letter.sequence} of {STREAM}, stored {_timestamp(letter.time)}",
        f"subject:          {letter.subject}",
        f"original subject: {original}",
        "headers:",
        *(f"  {name}: {value}" for name, value in sorted(letter.headers.items())),
        format_payload(letter.data),
    ]
    return "\n".join(lines)
