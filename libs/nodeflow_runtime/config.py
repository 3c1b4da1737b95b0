"""Typed service configuration from environment variables.

Each service declares a msgspec Struct (extending `ServiceConfig`); every field is read from
the environment variable of the same name in upper case (`http_port` <- `HTTP_PORT`). A bad
value fails at start with an error naming the variable, never later.
"""

from __future__ import annotations

import os
import re
import secrets
import socket
from collections.abc import Mapping
from typing import Annotated, Any, Literal, TypeVar, get_args, get_origin
from urllib.parse import urlsplit, urlunsplit

import msgspec
from msgspec import Meta

from nodeflow_bus.tls import NatsTls

C = TypeVar("C", bound="ServiceConfig")

_SECRET_FIELD = re.compile(r"(password|token|secret|seed)(?!_file)", re.IGNORECASE)
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


class ConfigError(ValueError):
    """Configuration that cannot be used; the message names every bad variable."""


class ServiceConfig(msgspec.Struct, kw_only=True):
    """Settings every service shares."""

    # Comma-separated server URLs. Credentials are read by nodeflow_bus.Credentials.from_env
    # (NATS_USER/NATS_PASSWORD[_FILE], NATS_TOKEN[_FILE], NATS_NKEY_SEED_FILE, NATS_CREDS_FILE)
    # so that secrets never sit in a config struct.
    nats_url: Annotated[tuple[str, ...], Meta(min_length=1)] = ("nats://127.0.0.1:4222",)
    # Servers that store each stream and KV bucket: 1 for one nats-server, 3 for a JetStream
    # cluster of three (nothing is lost when one of them dies).
    nats_replicas: Annotated[int, Meta(ge=1, le=5)] = 1
    # Client TLS to NATS (paths; empty = unset). TLS is used when a CA or a certificate is
    # given or a URL is tls://; without a CA the system trust store verifies the server.
    # The certificate and key (mutual TLS) come together or not at all.
    nats_tls_ca_file: str = ""
    nats_tls_cert_file: str = ""
    nats_tls_key_file: str = ""
    # The name to verify in the server certificate when it is not the URL's host.
    nats_tls_server_name: str = ""
    http_host: str = "0.0.0.0"
    http_port: Annotated[int, Meta(ge=0, le=65535)] = 8080
    # A listening socket inherited from the process that started this one (-1: none; bind
    # HTTP_HOST:HTTP_PORT). `make run` binds each service's port itself and passes it down,
    # so no other process can take the port between the pick and the bind, nor across a
    # restart.
    http_listen_fd: Annotated[int, Meta(ge=-1)] = -1
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    # How long SIGTERM waits for in-flight messages before exiting.
    shutdown_deadline_seconds: Annotated[float, Meta(ge=0)] = 20.0
    # Identity of this process (leader leases, logs). By default unique per process: the host
    # (HOSTNAME, the pod name) alone is shared by two replicas on one host and by a process and
    # its restart, and two holders with one identity would both lead.
    instance_id: str = ""
    # The namespace of the Kubernetes Lease that mirrors each of this service's leader leases
    # (`kubectl get leases -n nodeflow-system` shows who leads); empty: no Lease is written.
    kube_lease_namespace: str = "nodeflow-system"

    def __post_init__(self) -> None:
        if not self.instance_id:
            self.instance_id = unique_instance_id(socket.gethostname())
        # Raised here so that load_config names the pair at start, not the handshake later.
        self.nats_tls()

    def nats_tls(self) -> NatsTls:
        """The NATS client TLS settings (raises TlsConfigError, a ValueError, if unusable)."""
        return NatsTls.from_paths(
            ca_file=self.nats_tls_ca_file,
            cert_file=self.nats_tls_cert_file,
            key_file=self.nats_tls_key_file,
            server_name=self.nats_tls_server_name,
        )


def unique_instance_id(host: str) -> str:
    """`<host>-<pid>-<random>`: no two processes share it, not even a pid reused later."""
    return f"{host}-{os.getpid()}-{secrets.token_hex(4)}"


def env_name(field: str) -> str:
    return field.upper()


def _parse(raw: str, annotation: Any) -> Any:
    """Turn one environment string into the shape msgspec.convert expects for `annotation`."""
    origin = get_origin(annotation)
    if annotation is bool:
        lowered = raw.strip().lower()
        if lowered in _TRUE:
            return True
        if lowered in _FALSE:
            return False
        raise ValueError(f"expected a boolean (true/false), got {raw!r}")
    if origin in (tuple, list):
        return [part.strip() for part in raw.split(",") if part.strip()]
    if origin is dict:
        return dict(
            item.split("=", 1) for item in (p.strip() for p in raw.split(",")) if "=" in item
        )
    if origin is not None and type(None) in get_args(annotation) and raw == "":
        return None
    if origin is Literal:
        # LOG_LEVEL=INFO means info: choices are matched regardless of case.
        return next((choice for choice in get_args(annotation) if choice == raw.lower()), raw)
    return raw


def load_config(config_type: type[C], environ: Mapping[str, str] | None = None) -> C:
    """Build `config_type` from the environment; raise ConfigError naming each bad variable."""
    env = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    if env.get("HOSTNAME") and not env.get("INSTANCE_ID"):
        values["instance_id"] = unique_instance_id(env["HOSTNAME"])
    errors: list[str] = []
    for field in msgspec.structs.fields(config_type):
        name = env_name(field.name)
        if name not in env:
            continue
        try:
            parsed = _parse(env[name], _unannotated(field.type))
            values[field.name] = msgspec.convert(parsed, field.type, strict=False)
        except (ValueError, msgspec.ValidationError) as exc:
            shown = "<hidden>" if is_secret(field.name) else repr(env[name])
            errors.append(f"{name}={shown}: {exc}")
    if errors:
        raise ConfigError("invalid configuration: " + "; ".join(errors))
    try:
        return msgspec.convert(values, config_type)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"invalid configuration: {exc}") from exc


def _unannotated(annotation: Any) -> Any:
    """`Annotated[T, Meta(...)]` -> T, for parsing; msgspec checks the constraints after."""
    return get_args(annotation)[0] if hasattr(annotation, "__metadata__") else annotation


def without_userinfo(url: str) -> str:
    """`nats://user:secret@host:4222` -> `nats://host:4222`: URLs are safe to log."""
    parts = urlsplit(url)
    if not (parts.username or parts.password):
        return url
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit(parts._replace(netloc=netloc))


def is_secret(field: str) -> bool:
    return bool(_SECRET_FIELD.search(field))


def redacted(config: msgspec.Struct) -> dict[str, Any]:
    """The configuration as a dict safe to log: secret values replaced by '<hidden>'."""
    shown: dict[str, Any] = {}
    for field in msgspec.structs.fields(type(config)):
        value = getattr(config, field.name)
        if is_secret(field.name) and value:
            value = "<hidden>"
        elif isinstance(value, str):
            value = without_userinfo(value)
        elif isinstance(value, tuple):
            value = tuple(without_userinfo(v) if isinstance(v, str) else v for v in value)
        shown[field.name] = value
    return shown
