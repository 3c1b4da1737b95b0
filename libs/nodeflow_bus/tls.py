"""Client TLS to NATS: which CA to trust, which certificate to present, which name to verify.

A service uses TLS when a CA or a client certificate is configured, or when a server URL is
`tls://`. With neither a CA file nor a certificate the system trust store verifies the server.
The certificate and its key come together or not at all: one without the other would make
the server refuse every connection with a handshake error far from the misconfiguration.
"""

from __future__ import annotations

import ssl
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import nats.errors
from nats.aio.client import Client as NatsClient


class TlsConfigError(ValueError):
    """TLS settings that cannot be used together."""


@dataclass(frozen=True)
class NatsTls:
    """TLS settings of a NATS client. Paths only: the key stays in its file."""

    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None
    # The name the server certificate must carry when it differs from the URL's host
    # (a Service reached by IP, one certificate for the whole cluster).
    server_name: str | None = None

    def __post_init__(self) -> None:
        if (self.cert_file is None) != (self.key_file is None):
            raise TlsConfigError(
                "NATS_TLS_CERT_FILE and NATS_TLS_KEY_FILE must be set together "
                f"(cert={self.cert_file}, key={self.key_file})"
            )

    @classmethod
    def from_paths(
        cls,
        *,
        ca_file: str = "",
        cert_file: str = "",
        key_file: str = "",
        server_name: str = "",
    ) -> NatsTls:
        """From settings where the empty string means unset."""
        return cls(
            ca_file=Path(ca_file) if ca_file else None,
            cert_file=Path(cert_file) if cert_file else None,
            key_file=Path(key_file) if key_file else None,
            server_name=server_name or None,
        )

    @property
    def configured(self) -> bool:
        return self.ca_file is not None or self.cert_file is not None

    def required_for(self, servers: Sequence[str]) -> bool:
        """Whether connections to `servers` use TLS."""
        return self.configured or any(urlsplit(url).scheme == "tls" for url in servers)

    def ssl_context(self) -> ssl.SSLContext:
        """A client context verifying the server (hostname included), with our certificate
        when one is configured. Raises OSError/ssl.SSLError for unreadable or bad files."""
        context = ssl.create_default_context(
            ssl.Purpose.SERVER_AUTH,
            cafile=str(self.ca_file) if self.ca_file is not None else None,
        )
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        if self.cert_file is not None and self.key_file is not None:
            context.load_cert_chain(str(self.cert_file), str(self.key_file))
        return context

    def connect_options(self, servers: Sequence[str]) -> dict[str, Any]:
        """Keyword arguments for `nats.connect` (none when TLS is not used)."""
        if not self.required_for(servers):
            return {}
        options: dict[str, Any] = {"tls": self.ssl_context()}
        if self.server_name:
            options["tls_hostname"] = self.server_name
        return options


class PlaintextRefused(nats.errors.Error):
    """TLS is configured and the server did not ask for it: nothing was sent to it."""

    def __str__(self) -> str:
        return (
            "nats: TLS is configured but the server does not require it: "
            "refusing a plaintext connection (no CONNECT, no credentials sent)"
        )


class TlsOnlyClient(NatsClient):
    """A NATS client that never speaks in clear.

    nats-py upgrades to TLS only when the server's INFO says `tls_required`, and then writes
    CONNECT, which carries the password or token. A server that lets plain clients in (or one
    pretending to be ours) would get our credentials and traffic in clear although TLS is
    configured. Here CONNECT is refused before it is written unless the socket is TLS; nats-py
    treats that as a failed attempt and tries again (first connection and reconnects alike),
    so a TLS server that comes back is used and a plain one never hears from us.
    """

    def _connect_command(self) -> bytes:
        writer = getattr(self._transport, "_io_writer", None)
        if writer is None or writer.get_extra_info("ssl_object") is None:
            raise PlaintextRefused()
        return super()._connect_command()
