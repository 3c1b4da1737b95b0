"""Encoding and decoding of every message, with errors that name the subject and the field."""

from __future__ import annotations

import re
from functools import cache
from typing import Any, TypeVar, cast

import msgspec

T = TypeVar("T")

_FIELD_PATH = re.compile(r" - at `(?P<path>[^`]+)`$")


class ContractDecodeError(ValueError):
    """A payload that does not match its contract. Never worth retrying."""

    def __init__(self, subject: str, field: str | None, detail: str) -> None:
        self.subject = subject
        self.field = field
        self.detail = detail
        where = f" field {field}" if field else ""
        super().__init__(f"cannot decode message on {subject}{where}: {detail}")


_encoder = msgspec.json.Encoder()


def encode(message: Any) -> bytes:
    return _encoder.encode(message)


@cache
def _decoder(message_type: Any) -> msgspec.json.Decoder[Any]:
    return msgspec.json.Decoder(message_type)


def decode(message_type: type[T], data: bytes, *, subject: str) -> T:
    """Decode `data` as `message_type`, raising ContractDecodeError naming subject and field."""
    try:
        result: T = _decoder(cast(Any, message_type)).decode(data)
    except msgspec.ValidationError as exc:
        text = str(exc)
        match = _FIELD_PATH.search(text)
        field = match.group("path") if match else None
        detail = text[: match.start()] if match else text
        raise ContractDecodeError(subject, field, detail) from exc
    except msgspec.DecodeError as exc:
        raise ContractDecodeError(subject, None, f"malformed JSON: {exc}") from exc
    return result


def to_builtins(message: Any) -> Any:
    return msgspec.to_builtins(message)
