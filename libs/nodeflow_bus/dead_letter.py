"""What a dead-lettered message carries: the original payload plus these headers.

A consumer reading `dlq.>` (the metrics exporter, an operator's tool) uses the constants here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

from nodeflow_contracts import subjects

ErrorKind = Literal["decode", "permanent", "max_deliveries"]

ERROR = "Nodeflow-Error"
ERROR_KIND = "Nodeflow-Error-Kind"
DELIVERIES = "Nodeflow-Deliveries"
STREAM = "Nodeflow-Stream"
STREAM_SEQUENCE = "Nodeflow-Stream-Sequence"
CONSUMER = "Nodeflow-Consumer"
SUBJECT = "Nodeflow-Subject"
# NATS' own headers of the original (Nats-Msg-Id, Nats-Expected-*) would change how the copy
# is stored, so they are kept under this prefix instead.
ORIGINAL_PREFIX = "Nodeflow-Original-"

MAX_ERROR_LENGTH = 2000


def one_line(text: str, limit: int = MAX_ERROR_LENGTH) -> str:
    """A header value: no CR/LF (they would end the header), at most `limit` characters."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def dead_letter_msg_id(stream: str, consumer: str, sequence: int) -> str:
    """Deduplicates the copy if a crash makes the same delivery dead-letter twice.

    The durable is part of it: two consumers of one stream may each dead-letter the same
    stream message, and neither copy may be dropped as a duplicate of the other.
    """
    return f"dlq:{stream}:{consumer}:{sequence}"


def dead_letter_headers(
    *,
    original_headers: Mapping[str, str] | None,
    error: str,
    error_kind: ErrorKind,
    deliveries: int,
    stream: str,
    stream_sequence: int,
    consumer: str,
    subject: str,
) -> dict[str, str]:
    headers: dict[str, str] = {}
    for name, value in (original_headers or {}).items():
        if name.lower().startswith("nats-"):
            headers[ORIGINAL_PREFIX + name] = value
        else:
            headers[name] = value
    headers.update(
        {
            ERROR: one_line(error),
            ERROR_KIND: error_kind,
            DELIVERIES: str(deliveries),
            STREAM: stream,
            STREAM_SEQUENCE: str(stream_sequence),
            CONSUMER: consumer,
            SUBJECT: subject,
        }
    )
    return headers


def is_dead_letter(subject: str) -> bool:
    return subject.startswith(subjects.dead_letter(""))
