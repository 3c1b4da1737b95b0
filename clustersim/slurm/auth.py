"""Slurm JWT (auth/jwt): HS256 tokens with claims `sun`, `iat`, `exp`, signed with the raw
bytes of the key file named by `AuthAltParameters=jwt_key=<file>`; and, when slurmctld runs
with `AuthAltParameters=jwks=<file>`, RS256 tokens from an identity provider, verified against
the public key in that JSON Web Key Set whose `kid` the token's header names.

RS256 needs the `cryptography` package (pyjwt[crypto], a dev dependency): it is imported only
when a JWKS is used, so the simulator runs without it for HS256."""

from __future__ import annotations

import functools
import json
import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jwt

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.rsa import RSAPrivateKey

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


class JsonWebKeys:
    """The public keys of a JWKS file (`jwks=`), by `kid`; RSA keys only, as Slurm takes."""

    def __init__(self, path: Path) -> None:
        self.path = path
        document = json.loads(path.read_text(encoding="utf-8"))
        self.keys: dict[str, Any] = {}
        for entry in document.get("keys", []):
            if entry.get("kty") != "RSA" or "kid" not in entry:
                continue
            self.keys[str(entry["kid"])] = jwt.PyJWK(entry, algorithm="RS256").key


def new_rsa_key() -> RSAPrivateKey:
    from cryptography.hazmat.primitives.asymmetric import rsa

    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def write_jwks(path: Path, keys: dict[str, RSAPrivateKey]) -> None:
    """Publish the public halves of `keys` (by kid) as a JWKS file, as an identity provider's
    `jwks_uri` document copied next to slurm.conf."""
    from jwt.algorithms import RSAAlgorithm

    entries = []
    for kid, private in keys.items():
        entry = RSAAlgorithm.to_jwk(private.public_key(), as_dict=True)
        entries.append({**entry, "kid": kid, "use": "sig", "alg": "RS256"})
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"keys": entries}), encoding="utf-8")


def mint_rs256_token(
    private: RSAPrivateKey,
    kid: str,
    user: str,
    now: float,
    lifespan: int = DEFAULT_LIFESPAN_SECONDS,
) -> str:
    """An RS256 token as an identity provider configured for Slurm issues it."""
    claims = {"sun": user, "iat": int(now), "exp": int(now) + lifespan}
    return jwt.encode(claims, private, algorithm="RS256", headers={"kid": kid})


_CLAIM_OPTIONS: Any = {
    "verify_exp": False,
    "verify_iat": False,
    "verify_nbf": False,
    "require": ["exp", "sun"],
}


@functools.lru_cache(maxsize=1024)
def _decoded(key: bytes, token: str, jwks: JsonWebKeys | None = None) -> dict[str, Any] | str:
    """The token's claims once its signature is checked, or why it is invalid. A client sends
    the same token with every request: its signature is checked once, expiry every time."""
    try:
        header = jwt.get_unverified_header(token)
        if header.get("alg") == "RS256":
            if jwks is None:
                return "invalid token: RS256 tokens need jwks= in AuthAltParameters"
            public = jwks.keys.get(str(header.get("kid")))
            if public is None:
                return f"invalid token: no key with kid {header.get('kid')!r} in {jwks.path}"
            return dict(jwt.decode(token, public, algorithms=["RS256"], options=_CLAIM_OPTIONS))
        return dict(jwt.decode(token, key, algorithms=["HS256"], options=_CLAIM_OPTIONS))
    except jwt.PyJWTError as exc:
        return f"invalid token: {exc}"


def verify_token(
    key: bytes,
    token: str,
    header_user: str | None,
    now: float,
    proxy_users: frozenset[str] = frozenset({"root", "slurm"}),
    jwks: JsonWebKeys | None = None,
) -> TokenCheck:
    """Check a token the way slurmctld's auth/jwt does (HS256 with the key, RS256 against the
    JWKS when one is configured); `problem` says why it is refused."""
    claims = _decoded(key, token, jwks)
    if isinstance(claims, str):
        return TokenCheck(user=None, problem=claims)
    # Expiry is judged on the emulator's clock, not the host's, so tests can move time.
    if int(claims["exp"]) <= int(now):
        return TokenCheck(user=None, problem="token expired")
    token_user = str(claims["sun"])
    if header_user and header_user != token_user and token_user not in proxy_users:
        return TokenCheck(user=None, problem="user name does not match token")
    return TokenCheck(user=header_user or token_user, problem=None)
