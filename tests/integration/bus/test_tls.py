"""Client TLS against a real nats-server that requires it (certificates made by the test)."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import pytest

from nodeflow_bus import Bus, NatsTls, NotConnectedError
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


async def test_nats_tls_configured_refuses_a_server_without_tls(tmp_path: Path, pki: Pki) -> None:
    # nats-py upgrades only when the server asks for TLS; a plain server must not get our
    # traffic in clear because the client was told to use TLS.
    async with NatsServerProcess(tmp_path / "plain") as server:
        with pytest.raises(NotConnectedError, match="refusing a plaintext connection"):
            await Bus.connect(server.url, options=FAILING_OPTIONS, tls=NatsTls(ca_file=pki.ca_cert))
        plain = await Bus.connect(server.url, options=TEST_BUS_OPTIONS)  # no TLS asked: fine
        await plain.close()


async def test_nats_tls_reconnect_to_a_plaintext_server_is_refused(
    tmp_path: Path, pki: Pki
) -> None:
    port = free_port()
    states: list[str] = []
    closed = asyncio.Event()

    def record(state: str) -> None:
        states.append(state)
        if state == "closed":
            closed.set()

    async with tls_nats_server(tmp_path / "tls", pki, verify_clients=False, port=port) as url:
        bus = await Bus.connect(url, options=TEST_BUS_OPTIONS, tls=NatsTls(ca_file=pki.ca_cert))
        bus.add_state_listener(record)
    # The same address now answers without TLS: the bus closes instead of talking in clear.
    async with NatsServerProcess(tmp_path / "plain", port=port):
        try:
            await asyncio.wait_for(closed.wait(), 30.0)
        finally:
            await bus.close()
    assert "connected" not in states
