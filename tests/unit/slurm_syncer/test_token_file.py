"""Token file refresh (issue 30 item 4): a token file an operator's refresher rewrites (RS256
tokens from an identity provider, verified by slurmctld against a JWKS) is read again before its
token expires, picked up as soon as it is rotated, and an expired one is an error."""

from __future__ import annotations

from pathlib import Path

import jwt
import pytest

from slurm_syncer.auth import CredentialsUnusable, StaticToken, token_source, unverified_expiry
from slurm_syncer.settings import ClusterSettings

# The syncer never verifies these tokens: any signing key will do for the tests.
_ISSUER_KEY = b"an identity provider's key the syncer never sees"


def _token(user: str, issued: int, expires: int) -> str:
    return jwt.encode({"sun": user, "iat": issued, "exp": expires}, _ISSUER_KEY, "HS256")


class FakeClock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_expiry_is_read_without_a_key_and_absent_for_opaque_tokens() -> None:
    assert unverified_expiry(_token("slurm", 100, 1900)) == 1900
    assert unverified_expiry("not-a-jwt") is None
    assert unverified_expiry(jwt.encode({"sun": "slurm"}, _ISSUER_KEY, "HS256")) is None


def test_rule_token_file_is_read_again_before_its_token_expires(tmp_path: Path) -> None:
    path = tmp_path / "token"
    first = _token("slurm", 1000, 1600)
    path.write_text(f"SLURM_JWT={first}\n")
    clock = FakeClock(1000)
    tokens = StaticToken("slurm", path=path, margin=100, clock=clock)
    assert tokens.token() == first
    assert tokens.reads == 1
    clock.now = 1499  # 101 s left: outside the margin, the held token is kept
    assert tokens.token() == first
    assert tokens.reads == 1
    # The refresher writes the next token; once within the margin it is read (no refusal).
    second = _token("slurm", 1500, 2100)
    path.write_text(second)
    clock.now = 1500
    assert tokens.token() == second
    # Within the margin with no newer token yet: the file is read again, the held one still
    # serves until it expires.
    clock.now = 2050
    assert tokens.token() == second
    assert tokens.token() == second
    assert tokens.reads == 4


def test_rule_rotated_token_file_is_picked_up_before_the_margin(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text(_token("slurm", 1000, 5000))
    clock = FakeClock(1000)
    tokens = StaticToken("slurm", path=path, margin=100, clock=clock)
    tokens.token()
    rotated = _token("slurm", 1010, 6000)
    # A Kubernetes Secret volume replaces the file (a new inode behind a swapped link).
    replacement = tmp_path / "token.new"
    replacement.write_text(rotated)
    replacement.replace(path)
    clock.now = 1010
    assert tokens.token() == rotated


def test_rule_expired_token_file_without_replacement_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text(_token("slurm", 1000, 1600))
    clock = FakeClock(1000)
    tokens = StaticToken("slurm", path=path, margin=100, clock=clock)
    tokens.token()
    clock.now = 1600
    with pytest.raises(CredentialsUnusable) as refused:
        tokens.token()
    assert str(path) in str(refused.value)
    assert "1970-01-01T00:26:40+00:00" in str(refused.value)  # exp 1600, in UTC
    # Still an error on the next call, until the refresher writes a newer token.
    with pytest.raises(CredentialsUnusable):
        tokens.token()
    fresh = _token("slurm", 1600, 2200)
    path.write_text(fresh)
    assert tokens.token() == fresh


def test_a_token_without_exp_is_kept_until_refused(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("opaque-one")
    clock = FakeClock(1000)
    tokens = StaticToken("slurm", path=path, margin=100, clock=clock)
    assert tokens.token() == "opaque-one"
    path.write_text("opaque-two")
    clock.now = 10**9
    assert tokens.token() == "opaque-one"
    tokens.invalidate()
    assert tokens.token() == "opaque-two"


def test_token_source_gives_the_token_file_the_refresh_margin_and_clock(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text(_token("slurm", 0, 1000))
    clock = FakeClock(0)
    settings = ClusterSettings(name="a", url="http://x", user="slurm", token_file=path)
    tokens = token_source(settings, lifespan=600, margin=50, clock=clock)
    assert isinstance(tokens, StaticToken)
    assert (tokens.margin, tokens.clock) == (50, clock)
