"""Credentials for slurmrestd: `X-SLURM-USER-NAME` + `X-SLURM-USER-TOKEN`.

Either a static token (given, or read from a file that an operator's refresher rewrites), or a
signing key (Slurm's `jwt_key` file) from which short-lived HS256 tokens with the claims `sun`,
`iat` and `exp` are minted, and minted again before they expire.

A token file is how RS256 tokens reach the syncer when slurmctld verifies them against a JWKS
(`AuthAltParameters=jwks=...`): an identity provider issues them, the syncer has no key to mint
or verify them, so it reads the token's `exp` without checking the signature and reads the file
again when that expiry comes within the refresh margin or when the file changes.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
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


class CredentialsUnusable(Exception):
    """The credentials at hand cannot authenticate (e.g. a token file whose token expired)."""


def unverified_expiry(token: str) -> int | None:
    """The token's `exp` claim, read without checking the signature (the syncer holds no key
    for tokens an identity provider issued), or None when it is not a JWT with an `exp`."""
    try:
        claims = jwt.decode(token, options={"verify_signature": False, "verify_exp": False})
    except jwt.PyJWTError:
        return None
    expiry = claims.get("exp")
    return int(expiry) if isinstance(expiry, int | float) else None


def _iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).isoformat(timespec="seconds")


_FileIdentity = tuple[int, int, int, int]  # device, inode, size, mtime_ns


def _identity(path: Path) -> _FileIdentity:
    # stat() follows symlinks: a Kubernetes Secret volume swaps its `..data` link on update.
    info = os.stat(path)
    return (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)


@dataclass
class StaticToken:
    """A token given as is, or read from a file.

    The file is read again after a refusal. When its token carries an `exp` claim, the file is
    also read again once that expiry is within `margin` seconds, or as soon as the file changes;
    a file whose token has expired is an error naming the file and the expiry, until a newer
    token appears in it. A token without `exp` is read again only after a refusal.
    """

    user: str
    value: str | None = None
    path: Path | None = None
    margin: int = 300
    clock: Clock = time.time

    def __post_init__(self) -> None:
        if self.value is None and self.path is None:
            raise ValueError("a static token needs a value or a file")
        if self.margin < 0:
            raise ValueError("the refresh margin cannot be negative")
        self._cached: str | None = None
        self._expires_at: int | None = None
        self._read_from: _FileIdentity | None = None
        self.reads = 0

    def token(self) -> str:
        if self.value is not None:
            return self.value
        assert self.path is not None
        if self._cached is None or self._stale():
            self._read()
        assert self._cached is not None
        if self._expires_at is not None and self.clock() >= self._expires_at:
            raise CredentialsUnusable(
                f"the token in {self.path} expired at {_iso(self._expires_at)} and no newer"
                " token has been written there"
            )
        return self._cached

    def _stale(self) -> bool:
        if self._expires_at is None:
            return False  # no expiry known: kept until refused, as for an opaque token
        if needs_new_token(self._expires_at, self.clock(), self.margin):
            return True
        assert self.path is not None
        try:
            return _identity(self.path) != self._read_from
        except OSError:
            return True  # let the read report what is wrong with the file

    def _read(self) -> None:
        assert self.path is not None
        identity = _identity(self.path)
        text = self.path.read_text(encoding="utf-8").strip()
        # `scontrol token` output, verbatim
        self._cached = text.removeprefix("SLURM_JWT=")
        self._expires_at = unverified_expiry(self._cached)
        self._read_from = identity
        self.reads += 1

    def invalidate(self) -> None:
        self._cached = None
        self._expires_at = None
        self._read_from = None


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
    return StaticToken(
        settings.user, value=settings.token, path=settings.token_file, margin=margin, clock=clock
    )
