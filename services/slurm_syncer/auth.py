"""Credentials for slurmrestd: `X-SLURM-USER-NAME` + `X-SLURM-USER-TOKEN`.

Either a static token (given, or read from a file that an operator may rotate), or a signing
key (Slurm's `jwt_key` file) from which short-lived HS256 tokens with the claims `sun`, `iat`
and `exp` are minted, and minted again before they expire.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import jwt

from slurm_syncer.settings import ClusterSettings

Clock = Callable[[], float]


class TokenSource(Protocol):
    user: str

    def token(self) -> str:
        """The token to send now."""
        ...

    def invalidate(self) -> None:
        """The server refused the token: get a fresh one next time."""
        ...


def mint(key: bytes, user: str, now: float, lifespan: int) -> str:
    """An HS256 token as `scontrol token username=<user> lifespan=<lifespan>` makes it."""
    claims = {"sun": user, "iat": int(now), "exp": int(now) + lifespan}
    return jwt.encode(claims, key, algorithm="HS256")


def needs_new_token(expires_at: float | None, now: float, margin: float) -> bool:
    """Mint again when there is no token yet or it expires within `margin` seconds."""
    return expires_at is None or now >= expires_at - margin


@dataclass
class StaticToken:
    """A token given as is, or read from a file; the file is read again after a refusal."""

    user: str
    value: str | None = None
    path: Path | None = None

    def __post_init__(self) -> None:
        if self.value is None and self.path is None:
            raise ValueError("a static token needs a value or a file")
        self._cached: str | None = None

    def token(self) -> str:
        if self.value is not None:
            return self.value
        if self._cached is None:
            assert self.path is not None
            self._cached = self.path.read_text(encoding="utf-8").strip()
            if self._cached.startswith("SLURM_JWT="):  # `scontrol token` output, verbatim
                self._cached = self._cached.removeprefix("SLURM_JWT=")
        return self._cached

    def invalidate(self) -> None:
        self._cached = None


@dataclass
class SigningKeyTokens:
    """Mints tokens with the cluster's signing key and refreshes them `margin` before expiry."""

    user: str
    key_file: Path
    lifespan: int = 1800
    margin: int = 300
    clock: Clock = time.time

    def __post_init__(self) -> None:
        if not 0 <= self.margin < self.lifespan:
            raise ValueError("the refresh margin must be below the token lifespan")
        self._key: bytes | None = None
        self._token: str | None = None
        self._expires_at: float | None = None
        self.minted = 0

    def token(self) -> str:
        now = self.clock()
        if self._token is None or needs_new_token(self._expires_at, now, self.margin):
            if self._key is None:
                self._key = self.key_file.read_bytes()
            self._token = mint(self._key, self.user, now, self.lifespan)
            self._expires_at = int(now) + self.lifespan
            self.minted += 1
        return self._token

    def invalidate(self) -> None:
        # The key may have been rotated as well: read it again.
        self._key = None
        self._token = None
        self._expires_at = None


def token_source(
    settings: ClusterSettings, *, lifespan: int, margin: int, clock: Clock = time.time
) -> TokenSource:
    if settings.jwt_key_file is not None:
        return SigningKeyTokens(
            settings.user, settings.jwt_key_file, lifespan=lifespan, margin=margin, clock=clock
        )
    return StaticToken(settings.user, value=settings.token, path=settings.token_file)
