"""slurm-syncer's client against the Slurm emulator served over HTTPS (certificates made here)."""

from __future__ import annotations

import dataclasses
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web

from clustersim.slurm import ManualClock, SlurmEmulator
from nodeflow_runtime.natsd import free_port
from slurm_syncer.auth import SigningKeyTokens
from slurm_syncer.client import SlurmClient, SlurmUnreachable
from tests.fixtures.tls import Pki, make_pki
from tests.integration.slurm_syncer.conftest import CLUSTER, FAST_CLIENT

pytestmark = pytest.mark.timeout(60)


@dataclasses.dataclass(frozen=True)
class HttpsSlurm:
    url: str
    emulator: SlurmEmulator
    key_path: Path
    pki: Pki


@pytest.fixture
async def https_slurm(tmp_path: Path) -> AsyncIterator[HttpsSlurm]:
    pki = make_pki(tmp_path / "pki")
    key_path = tmp_path / "jwt_hs256.key"
    emulator = SlurmEmulator(CLUSTER, key_path=key_path, clock=ManualClock())
    emulator.register_node("n1", cpus=4, real_memory=1024)
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_tls.load_cert_chain(pki.server_cert, pki.server_key)
    runner = web.AppRunner(emulator.app(), access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port, ssl_context=server_tls).start()
    try:
        yield HttpsSlurm(f"https://127.0.0.1:{port}", emulator, key_path, pki)
    finally:
        await runner.cleanup()


def _client(slurm: HttpsSlurm, ca_file: Path | None) -> SlurmClient:
    tokens = SigningKeyTokens("slurm", slurm.key_path, clock=slurm.emulator.clock.now)
    return SlurmClient(CLUSTER, slurm.url, tokens, FAST_CLIENT, ca_file=ca_file)


async def test_slurm_https_polls_with_the_configured_ca(https_slurm: HttpsSlurm) -> None:
    client = _client(https_slurm, https_slurm.pki.ca_cert)
    try:
        assert (await client.ping())[0]["responding"] is True
        assert [node["name"] for node in await client.list_nodes()] == ["n1"]
    finally:
        await client.close()


@pytest.mark.parametrize("trust", ["system store", "unrelated CA"])
async def test_slurm_https_certificate_error_is_unreachable_never_success(
    https_slurm: HttpsSlurm, trust: str
) -> None:
    ca_file = None if trust == "system store" else https_slurm.pki.other_ca_cert
    client = _client(https_slurm, ca_file)
    served_before = https_slurm.emulator.requests_served
    try:
        with pytest.raises(SlurmUnreachable, match=r"certificate verify failed|CERTIFICATE"):
            await client.list_nodes()
    finally:
        await client.close()
    # The handshake failed before any request reached slurmrestd (the token was never sent).
    assert https_slurm.emulator.requests_served == served_before


async def test_slurm_https_unreadable_ca_file_fails_at_start(
    https_slurm: HttpsSlurm, tmp_path: Path
) -> None:
    with pytest.raises(OSError):
        _client(https_slurm, tmp_path / "absent-ca.crt")
