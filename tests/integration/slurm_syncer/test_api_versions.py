"""The client's choice of slurmrestd API version, over HTTP against the emulator as Slurm 24.11
and 26.05, and slurm-syncer refusing at start a slurmrestd that speaks none of ours."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from clustersim.slurm import RunningSlurm, run_slurm_emulator
from nodeflow_runtime.natsd import NatsServerProcess, free_port
from nodeflow_runtime.service import EXIT_BAD_CONFIG
from slurm_syncer.auth import SigningKeyTokens, StaticToken
from slurm_syncer.client import SlurmClient, SlurmVersionMismatch
from tests.integration.slurm_syncer.conftest import CLUSTER, FAST_CLIENT

pytestmark = pytest.mark.timeout(60)


@contextlib.asynccontextmanager
async def emulated(slurm_version: str) -> AsyncIterator[RunningSlurm]:
    async with run_slurm_emulator(CLUSTER, slurm_version=slurm_version) as running:
        running.emulator.register_node("n1", cpus=4, real_memory=8192)
        yield running


def client_of(running: RunningSlurm, api_version: str | None = None) -> SlurmClient:
    tokens = SigningKeyTokens("slurm", running.key_path)
    return SlurmClient(CLUSTER, running.url, tokens, FAST_CLIENT, api_version=api_version)


@pytest.mark.parametrize(("slurm_version", "chosen"), [("24.11", "v0.0.42"), ("26.05", "v0.0.45")])
@pytest.mark.parametrize("openapi_hidden", [False, True], ids=["openapi", "ping-probe"])
async def test_rule_the_newest_version_both_speak_is_spoken(
    slurm_version: str, chosen: str, openapi_hidden: bool
) -> None:
    """From /openapi/v3's paths, or, without the document, from each version's ping."""
    async with emulated(slurm_version) as running:
        running.emulator.set_faults(openapi_hidden=openapi_hidden)
        client = client_of(running)
        try:
            assert [node["name"] for node in await client.list_nodes()] == ["n1"]
            assert client.version is not None and client.version.name == chosen
            await client.update_node("n1", ["DRAIN"], "nodeflow: version test")
            assert running.emulator.node_state("n1") == ["IDLE", "DRAIN"]
        finally:
            await client.close()


@pytest.mark.parametrize("openapi_hidden", [False, True], ids=["openapi", "ping-probe"])
async def test_rule_slurm_api_version_is_spoken_when_the_server_speaks_it(
    openapi_hidden: bool,
) -> None:
    async with emulated("24.11") as running:
        running.emulator.set_faults(openapi_hidden=openapi_hidden)
        client = client_of(running, api_version="v0.0.41")
        try:
            await client.update_node("n1", ["DRAIN"], "nodeflow: pinned version")
            assert client.version is not None and client.version.name == "v0.0.41"
            node = await client.get_node("n1")
            assert node is not None and node["state"] == ["IDLE", "DRAIN"]
        finally:
            await client.close()
    async with emulated("26.05") as running:
        running.emulator.set_faults(openapi_hidden=openapi_hidden)
        client = client_of(running, api_version="v0.0.41")
        try:
            with pytest.raises(SlurmVersionMismatch) as refused:
                await client.list_nodes()
            assert "SLURM_API_VERSION v0.0.41" in str(refused.value)
            assert client.version is None
        finally:
            await client.close()


@contextlib.asynccontextmanager
async def foreign_slurmrestd() -> AsyncIterator[str]:
    """A slurmrestd that serves only API versions we do not speak (v0.0.39, v0.0.40, and a
    future v0.0.46): its document lists their paths; every path of ours is 404."""
    document: dict[str, object] = {
        "paths": {
            f"/slurm/{name}/{tail}": {"get": {}}
            for name in ("v0.0.39", "v0.0.40", "v0.0.46")
            for tail in ("ping/", "nodes/")
        }
    }

    async def openapi(request: web.Request) -> web.StreamResponse:
        return web.json_response(document)

    app = web.Application()
    app.router.add_get("/openapi/v3", openapi)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = free_port()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


async def test_a_client_of_a_server_speaking_none_of_ours_names_both_lists() -> None:
    async with foreign_slurmrestd() as url:
        client = SlurmClient(CLUSTER, url, StaticToken("slurm", value="t"), FAST_CLIENT)
        try:
            with pytest.raises(SlurmVersionMismatch) as refused:
                await client.ping()
        finally:
            await client.close()
    text = str(refused.value)
    assert "slurmrestd: v0.0.39, v0.0.40, v0.0.46" in text
    assert "Nodeflow: v0.0.41, v0.0.42, v0.0.43, v0.0.44, v0.0.45" in text


async def test_rule_slurm_syncer_stops_at_start_with_one_line_when_no_version_is_common(
    nats_server: NatsServerProcess,
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    async with foreign_slurmrestd() as url:
        env.update(
            {
                "NATS_URL": nats_server.url,
                "HTTP_HOST": "127.0.0.1",
                "HTTP_PORT": str(free_port()),
                "SHUTDOWN_DEADLINE_SECONDS": "5",
                "SLURM_CLUSTERS": CLUSTER,
                f"SLURM_{CLUSTER.upper()}_URL": url,
                "SLURM_TOKEN": "t",
            }
        )
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "slurm_syncer",
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=env,
        )
        _, stderr = await asyncio.wait_for(process.communicate(), timeout=45)
    assert process.returncode == EXIT_BAD_CONFIG
    lines = stderr.decode().strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("slurm-syncer: slurm cluster a: slurmrestd speaks no API version")
    assert "slurmrestd: v0.0.39, v0.0.40, v0.0.46" in lines[0]
    assert "Nodeflow: v0.0.41, v0.0.42, v0.0.43, v0.0.44, v0.0.45" in lines[0]
