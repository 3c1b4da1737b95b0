"""Client TLS against a real nats-server that requires it (certificates made by the test)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from nodeflow_bus import Bus, NatsTls, NotConnectedError
from nodeflow_bus.credentials import Credentials, Secret
from nodeflow_runtime.natsd import NatsServerProcess, free_port
from tests.fixtures.nats import TEST_BUS_OPTIONS
from tests.fixtures.tls import Pki, make_pki, tls_nats_server

# A refused handshake is retried until this deadline, then reported.
FAILING_OPTIONS = dataclasses.replace(TEST_BUS_OPTIONS, initial_connect_deadline=2.0)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


async def _round_trip(bus: Bus) -> None:
    reply = await bus.nc.request("$JS.API.INFO", b"", timeout=5.0)
    assert b"memory" in reply.data  # JetStream answered through the encrypted connection


async def test_nats_tls_connects_with_the_configured_ca(tmp_path: Path, pki: Pki) -> None:
    async with tls_nats_server(tmp_path, pki, verify_clients=False) as url:
        bus = await Bus.connect(url, options=TEST_BUS_OPTIONS, tls=NatsTls(ca_file=pki.ca_cert))
        try:
            assert bus.is_connected
            await _round_trip(bus)
        finally:
            await bus.close()


async def test_nats_tls_without_the_ca_fails_with_a_certificate_error(
    tmp_path: Path, pki: Pki
) -> None:
    async with tls_nats_server(tmp_path, pki, verify_clients=False) as url:
        # tls:// with no CA: the system store, which does not know the test CA.
        with pytest.raises(NotConnectedError, match="CERTIFICATE_VERIFY_FAILED"):
            await Bus.connect(url, options=FAILING_OPTIONS)
        with pytest.raises(NotConnectedError, match="CERTIFICATE_VERIFY_FAILED"):
            await Bus.connect(url, options=FAILING_OPTIONS, tls=NatsTls(ca_file=pki.other_ca_cert))


async def test_nats_tls_server_name_is_verified(tmp_path: Path, pki: Pki) -> None:
    async with tls_nats_server(tmp_path, pki, verify_clients=False) as url:
        with pytest.raises(NotConnectedError, match=r"CERTIFICATE_VERIFY_FAILED|hostname"):
            await Bus.connect(
                url,
                options=FAILING_OPTIONS,
                tls=NatsTls(ca_file=pki.ca_cert, server_name="nats.elsewhere.example"),
            )
        bus = await Bus.connect(
            url,
            options=TEST_BUS_OPTIONS,
            tls=NatsTls(ca_file=pki.ca_cert, server_name="localhost"),
        )
        await bus.close()


async def test_nats_mutual_tls_connects_with_the_client_certificate(
    tmp_path: Path, pki: Pki
) -> None:
    tls = NatsTls(ca_file=pki.ca_cert, cert_file=pki.client_cert, key_file=pki.client_key)
    async with tls_nats_server(tmp_path, pki, verify_clients=True) as url:
        bus = await Bus.connect(url, options=TEST_BUS_OPTIONS, tls=tls)
        try:
            await _round_trip(bus)
        finally:
            await bus.close()


async def test_nats_mutual_tls_refuses_a_client_without_certificate(
    tmp_path: Path, pki: Pki
) -> None:
    async with tls_nats_server(tmp_path, pki, verify_clients=True) as url:
        with pytest.raises(NotConnectedError) as raised:
            await Bus.connect(url, options=FAILING_OPTIONS, tls=NatsTls(ca_file=pki.ca_cert))
    assert "last error: None" not in str(raised.value)


class PlainImpostor:
    """A TCP listener that greets like a NATS server allowing plain clients with a password
    and records every byte a client sends it: what a plain or spoofed server would learn."""

    def __init__(self) -> None:
        self.received = bytearray()
        self.connections = 0
        self.seen_two = asyncio.Event()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        if self.connections >= 2:
            self.seen_two.set()
        info = (
            b'INFO {"server_id":"impostor","version":"2.10.22","proto":1,"host":"127.0.0.1",'
            b'"port":4222,"max_payload":1048576,"auth_required":true,"tls_required":false}\r\n'
        )
        writer.write(info)
        await writer.drain()
        with contextlib.suppress(ConnectionError):
            while chunk := await reader.read(4096):
                self.received += chunk
        writer.close()

    @contextlib.asynccontextmanager
    async def listening(self, port: int) -> AsyncIterator[str]:
        server = await asyncio.start_server(self._serve, "127.0.0.1", port)
        try:
            yield f"nats://127.0.0.1:{port}"
        finally:
            server.close()
            await server.wait_closed()


SECRET = "s3cret-never-in-clear"
CREDENTIALS = Credentials(user="svc", password=Secret(SECRET))


async def test_nats_tls_configured_sends_nothing_to_a_server_without_tls(pki: Pki) -> None:
    # nats-py upgrades only when the server asks for TLS, and CONNECT carries the password:
    # with TLS configured a plain server must learn neither the password nor any traffic.
    impostor = PlainImpostor()
    async with impostor.listening(free_port()) as url:
        with pytest.raises(NotConnectedError, match="refusing a plaintext connection"):
            await Bus.connect(
                url,
                credentials=CREDENTIALS,
                options=FAILING_OPTIONS,
                tls=NatsTls(ca_file=pki.ca_cert),
            )
    assert impostor.connections >= 1
    assert SECRET.encode() not in impostor.received
    assert b"CONNECT" not in impostor.received


async def test_nats_tls_configured_refuses_a_real_server_without_tls(
    tmp_path: Path, pki: Pki
) -> None:
    async with NatsServerProcess(tmp_path / "plain") as server:
        with pytest.raises(NotConnectedError, match="refusing a plaintext connection"):
            await Bus.connect(server.url, options=FAILING_OPTIONS, tls=NatsTls(ca_file=pki.ca_cert))
        plain = await Bus.connect(server.url, options=TEST_BUS_OPTIONS)  # no TLS asked: fine
        await plain.close()


async def test_nats_tls_reconnect_sends_nothing_to_a_plaintext_server_and_resumes_on_tls(
    tmp_path: Path, pki: Pki
) -> None:
    port = free_port()
    states: list[str] = []
    connected_again = asyncio.Event()

    def record(state: str) -> None:
        states.append(state)
        if state == "connected":
            connected_again.set()

    tls = NatsTls(ca_file=pki.ca_cert)
    async with tls_nats_server(tmp_path / "tls", pki, verify_clients=False, port=port) as url:
        bus = await Bus.connect(url, options=TEST_BUS_OPTIONS, tls=tls)
        bus.add_state_listener(record)
    try:
        # The same address now answers without TLS: every reconnect attempt stops before
        # CONNECT, so it learns nothing, and the bus stays disconnected.
        impostor = PlainImpostor()
        async with impostor.listening(port):
            await asyncio.wait_for(impostor.seen_two.wait(), 60.0)
        assert SECRET.encode() not in impostor.received
        assert b"CONNECT" not in impostor.received
        assert "connected" not in states
        # TLS is back on the address: the bus resumes by itself.
        async with tls_nats_server(tmp_path / "tls-again", pki, verify_clients=False, port=port):
            await asyncio.wait_for(connected_again.wait(), 60.0)
            await _round_trip(bus)
    finally:
        await bus.close()
