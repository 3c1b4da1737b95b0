"""NATS credentials, from the environment or files, that never show a secret when printed.

Supported, in order of precedence when several are set: a `.creds` file (JWT + nkey seed),
an nkey seed file, a token, a user + password. Secrets are wrapped in `Secret`, whose repr
and str are masked, so logging the struct (or an exception that contains it) is safe.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path
from typing import Any

MASK = "***"


class Secret:
    """A string that is masked in repr/str; call `reveal()` where the real value is needed."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return f"Secret({MASK!r})"

    def __str__(self) -> str:
        return MASK

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)

    def __reduce__(self) -> Any:
        # Pickling would write the secret out; refuse rather than leak it.
        raise TypeError("Secret values cannot be pickled")


@dataclass(frozen=True, repr=False)
class Credentials:
    """How to authenticate to NATS. Every field is optional; all unset means no auth."""

    user: str | None = None
    password: Secret | None = None
    token: Secret | None = None
    nkey_seed_file: Path | None = None
    creds_file: Path | None = None

    @property
    def kind(self) -> str:
        if self.creds_file:
            return "creds"
        if self.nkey_seed_file:
            return "nkey"
        if self.token:
            return "token"
        if self.user:
            return "user_password"
        return "none"

    def __repr__(self) -> str:
        # Paths are not secret (the files are); user names are not secret either.
        parts = [f"kind={self.kind!r}"]
        if self.user:
            parts.append(f"user={self.user!r}")
        if self.password:
            parts.append(f"password={MASK!r}")
        if self.token:
            parts.append(f"token={MASK!r}")
        if self.nkey_seed_file:
            parts.append(f"nkey_seed_file={str(self.nkey_seed_file)!r}")
        if self.creds_file:
            parts.append(f"creds_file={str(self.creds_file)!r}")
        return f"Credentials({', '.join(parts)})"

    __str__ = __repr__

    def connect_options(self) -> dict[str, Any]:
        """Keyword arguments for `nats.connect` (the only place secrets are revealed)."""
        if (self.creds_file or self.nkey_seed_file) and find_spec("nkeys") is None:
            raise RuntimeError(
                f"{self.kind} authentication needs the 'nkeys' package (nats-py[nkeys]), "
                "which is not installed"
            )
        if self.creds_file:
            return {"user_credentials": str(self.creds_file)}
        if self.nkey_seed_file:
            return {"nkeys_seed": str(self.nkey_seed_file)}
        if self.token:
            return {"token": self.token.reveal()}
        if self.user:
            password = self.password.reveal() if self.password else ""
            return {"user": self.user, "password": password}
        return {}

    @classmethod
    def from_env(
        cls, environ: Mapping[str, str] | None = None, prefix: str = "NATS_"
    ) -> Credentials:
        """Read `<prefix>USER`, `<prefix>PASSWORD` or `<prefix>PASSWORD_FILE`, `<prefix>TOKEN`
        or `<prefix>TOKEN_FILE`, `<prefix>NKEY_SEED_FILE`, `<prefix>CREDS_FILE`.

        A `*_FILE` variable names a file holding the secret (a mounted Kubernetes Secret);
        trailing whitespace in the file is ignored.
        """
        env = os.environ if environ is None else environ

        def value(name: str) -> str | None:
            found = env.get(prefix + name)
            return found if found else None

        def secret(name: str) -> Secret | None:
            direct = value(name)
            if direct is not None:
                return Secret(direct)
            file_name = value(name + "_FILE")
            if file_name is not None:
                return Secret(Path(file_name).read_text(encoding="utf-8").rstrip())
            return None

        nkey = value("NKEY_SEED_FILE")
        creds = value("CREDS_FILE")
        return cls(
            user=value("USER"),
            password=secret("PASSWORD"),
            token=secret("TOKEN"),
            nkey_seed_file=Path(nkey) if nkey else None,
            creds_file=Path(creds) if creds else None,
        )
