"""Slurm JWT (auth/jwt): HS256 tokens with claims `sun`, `iat`, `exp`, signed with the raw
bytes of the key file named by `AuthAltParameters=jwt_key=<file>`."""

from __future__ import annotations

import functools
import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jwt

DEFAULT_LIFESPAN_SECONDS = 1800


def write_key_file(path: Path, key: bytes | None = None) -> bytes:
    """Write a signing key readable only by its owner, as Slurm wants it, and return it."""
    material = key if key is not None else secrets.token_bytes(32)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(material)
    return material


def mint_token(key: bytes, user: str, now: float, lifespan: int = DEFAULT_LIFESPAN_SECONDS) -> str:
    """What `scontrol token username=<user> lifespan=<lifespan>` prints after SLURM_JWT=."""
    claims = {"sun": user, "iat": int(now), "exp": int(now) + lifespan}
    return jwt.encode(claims, key, algorithm="HS256")


@dataclass(frozen=True)
class TokenCheck:
    user: str | None
    problem: str | None


@functools.lru_cache(maxsize=1024)
def _decoded(key: bytes, token: str) -> dict[str, Any] | str:
    """The token's claims once its signature is checked, or why it is invalid. A client sends
    the same token with every request: its signature is checked once, expiry every time."""
    try:
        return dict(
            jwt.decode(
                token,
                key,
                algorithms=["HS256"],
                options={
                    "verify_exp": False,
                    "verify_iat": False,
                    "verify_nbf": False,
                    "require": ["exp", "sun"],
                },
            )
        )
    except jwt.PyJWTError as exc:
        return f"invalid token: {exc}"


def verify_token(
    key: bytes,
    token: str,
    header_user: str | None,
    now: float,
    proxy_users: frozenset[str] = frozenset({"root", "slurm"}),
) -> TokenCheck:
    """Check a token the way slurmctld's auth/jwt does; `problem` says why it is refused."""
    claims = _decoded(key, token)
    if isinstance(claims, str):
        return TokenCheck(user=None, problem=claims)
    # Expiry is judged on the emulator's clock, not the host's, so tests can move time.
    if int(claims["exp"]) <= int(now):
        return TokenCheck(user=None, problem="token expired")
    token_user = str(claims["sun"])
    if header_user and header_user != token_user and token_user not in proxy_users:
        return TokenCheck(user=None, problem="user name does not match token")
    return TokenCheck(user=header_user or token_user, problem=None)
