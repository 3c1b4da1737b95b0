"""Typed API errors that map one-to-one onto Kubernetes ``Status`` objects.

Every error carries the HTTP code, the machine-readable ``reason`` the real apiserver uses and
optional ``details`` (name, group, kind, causes with field paths).  ``ApiError.status()`` renders
the ``meta.k8s.io/v1 Status`` body the HTTP layer sends; in-process callers catch the subclasses.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Cause:
    """One entry of ``details.causes``: what is wrong (``reason``) at which ``field`` path."""

    reason: str
    message: str
    field: str = ""

    def to_dict(self) -> dict[str, str]:
        out = {"reason": self.reason, "message": self.message}
        if self.field:
            out["field"] = self.field
        return out


@dataclass
class ApiError(Exception):
    """Base of all store/server errors; ``code`` and ``reason`` are the Status fields."""

    message: str
    name: str = ""
    group: str = ""
    kind: str = ""
    causes: list[Cause] = field(default_factory=list)
    retry_after_seconds: int | None = None

    code: int = 500
    reason: str = "InternalError"

    def __post_init__(self) -> None:
        Exception.__init__(self, self.message)

    def __str__(self) -> str:
        return f"{self.code} {self.reason}: {self.message}"

    def status(self) -> dict[str, Any]:
        """The ``Status`` object the real apiserver would answer with."""
        details: dict[str, Any] = {}
        if self.name:
            details["name"] = self.name
        if self.group:
            details["group"] = self.group
        if self.kind:
            details["kind"] = self.kind
        if self.causes:
            details["causes"] = [c.to_dict() for c in self.causes]
        if self.retry_after_seconds is not None:
            details["retryAfterSeconds"] = self.retry_after_seconds
        body: dict[str, Any] = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if details:
            body["details"] = details
        return body


@dataclass
class BadRequest(ApiError):
    code: int = 400
    reason: str = "BadRequest"


@dataclass
class Forbidden(ApiError):
    code: int = 403
    reason: str = "Forbidden"


@dataclass
class NotFound(ApiError):
    code: int = 404
    reason: str = "NotFound"


@dataclass
class MethodNotAllowed(ApiError):
    code: int = 405
    reason: str = "MethodNotAllowed"


@dataclass
class AlreadyExists(ApiError):
    code: int = 409
    reason: str = "AlreadyExists"


@dataclass
class Conflict(ApiError):
    code: int = 409
    reason: str = "Conflict"


@dataclass
class Gone(ApiError):
    code: int = 410
    reason: str = "Expired"


@dataclass
class UnsupportedMediaType(ApiError):
    code: int = 415
    reason: str = "UnsupportedMediaType"


@dataclass
class Invalid(ApiError):
    code: int = 422
    reason: str = "Invalid"


@dataclass
class TooManyRequests(ApiError):
    code: int = 429
    reason: str = "TooManyRequests"


@dataclass
class Timeout(ApiError):
    code: int = 504
    reason: str = "Timeout"


@dataclass
class InternalError(ApiError):
    code: int = 500
    reason: str = "InternalError"


def not_found(resource: str, name: str, group: str = "") -> NotFound:
    qualified = f"{resource}.{group}" if group else resource
    return NotFound(f'{qualified} "{name}" not found', name=name, group=group, kind=resource)


def already_exists(resource: str, name: str, group: str = "") -> AlreadyExists:
    qualified = f"{resource}.{group}" if group else resource
    return AlreadyExists(
        f'{qualified} "{name}" already exists', name=name, group=group, kind=resource
    )


def conflict(resource: str, name: str, group: str = "", why: str = "") -> Conflict:
    qualified = f"{resource}.{group}" if group else resource
    why = why or (
        "the object has been modified; please apply your changes to the latest version "
        "and try again"
    )
    return Conflict(
        f'Operation cannot be fulfilled on {qualified} "{name}": {why}',
        name=name,
        group=group,
        kind=resource,
    )


def invalid(kind: str, name: str, causes: list[Cause], group: str = "") -> Invalid:
    """422 with the apiserver's message format: ``Kind.group "name" is invalid: [f: msg, ...]``."""
    parts = [f"{c.field}: {c.message}" if c.field else c.message for c in causes]
    joined = parts[0] if len(parts) == 1 else "[" + ", ".join(parts) + "]"
    qualified = f"{kind}.{group}" if group else kind  # schema.GroupKind.String()
    return Invalid(
        f'{qualified} "{name}" is invalid: {joined}',
        name=name,
        group=group,
        kind=kind,
        causes=causes,
    )


def too_large_resource_version(wanted: int, current: int) -> Timeout:
    """``storage.NewTooLargeResourceVersionError``: 504 with a ResourceVersionTooLarge cause."""
    return Timeout(
        f"Timeout: Too large resource version: {wanted}, current: {current}",
        causes=[Cause("ResourceVersionTooLarge", "Too large resource version")],
        retry_after_seconds=1,
    )
