"""Authenticated connections against a real server, and secrets never reaching output."""

from __future__ import annotations

from pathlib import Path

import pytest
import structlog

from nodeflow_bus import Bus, Credentials, NotConnectedError, Secret
from nodeflow_runtime.natsd import NatsServerProcess, ServerAuth
from tests.fixtures.nats import TEST_BUS_OPTIONS

PASSWORD = "s3cret-pass-Zq9"
TOKEN = "tok-Xy7-very-secret"


async def test_user_password_connects_and_is_never_printed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    auth = ServerAuth(user="svc", password=Secret(PASSWORD))
    async with NatsServerProcess(tmp_path / "nats", auth=auth) as server:
        credentials = Credentials.from_env({"NATS_USER": "svc", "NATS_PASSWORD": PASSWORD})
        bus = await Bus.connect(server.url, credentials=credentials, options=TEST_BUS_OPTIONS)
        assert bus.is_connected
        await bus.close()
        structlog.get_logger().info("explicit", credentials=credentials, auth=auth)
        print(repr(credentials), str(credentials), credentials.password, repr(server))
    output = capsys.readouterr()
    assert PASSWORD not in output.out + output.err
    assert "svc" in output.out  # the user name is not secret and helps debugging
    assert PASSWORD not in repr(auth)


async def test_token_from_file_connects(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    auth = ServerAuth(token=Secret(TOKEN))
    async with NatsServerProcess(tmp_path / "nats", auth=auth) as server:
        credentials = Credentials.from_env({"NATS_TOKEN_FILE": str(token_file)})
        assert credentials.kind == "token"
        assert TOKEN not in repr(credentials)
        bus = await Bus.connect(server.url, credentials=credentials, options=TEST_BUS_OPTIONS)
        await bus.close()


async def test_wrong_password_fails_without_leaking(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    auth = ServerAuth(user="svc", password=Secret(PASSWORD))
    async with NatsServerProcess(tmp_path / "nats", auth=auth) as server:
        wrong = Credentials(user="svc", password=Secret("wrong-" + PASSWORD))
        options = TEST_BUS_OPTIONS.__class__(
            **{**TEST_BUS_OPTIONS.__dict__, "initial_connect_deadline": 0.5}
        )
        with pytest.raises(NotConnectedError) as raised:
            await Bus.connect(server.url, credentials=wrong, options=options)
    output = capsys.readouterr()
    assert PASSWORD not in output.out + output.err + str(raised.value)
