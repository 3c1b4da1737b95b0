"""Slurm 26.05.5's slurmrestd answers every error twice on one connection (the JSON answer with
`Connection: Close`, then a text/plain answer of the same status); aiohttp refuses such an
exchange whole. The client reads the first answer, so a refused token is refreshed and a
refused update is an API error, not an unreachable cluster.

The servers here: a raw asyncio server writing those bytes as the real slurmrestd does, and
the emulator as 26.05 with its `doubled_error_answers` fault, which writes the same."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from clustersim.slurm import run_slurm_emulator
from nodeflow_bus import Backoff
from nodeflow_contracts.slurm_api import NEWEST
from slurm_syncer.auth import SigningKeyTokens, StaticToken
from slurm_syncer.client import (
    ClientOptions,
    SlurmApiError,
    SlurmAuthError,
    SlurmClient,
    SlurmUnreachable,
)

pytestmark = pytest.mark.timeout(30)
CLUSTER = "a"
OPTIONS = ClientOptions(
    timeout_seconds=2.0, attempts=2, backoff=Backoff(initial=0.01, maximum=0.02)
)
GOOD_TOKEN = "fresh"


def _answer(status: int, reason: str, body: bytes, content_type: str) -> bytes:
    head = (
        f"HTTP/1.1 {status} {reason}\r\nConnection: Close\r\nContent-Length: {len(body)}\r\n"
        f"Content-Type: {content_type}\r\n\r\n"
    )
    return head.encode() + body


def _json(body: object) -> bytes:
    return json.dumps(body).encode()


@contextlib.asynccontextmanager
async def doubling_slurmrestd(seen: list[str]) -> AsyncIterator[str]:
    """/openapi/v3 lists the newest version; a token other than GOOD_TOKEN is refused with a
    doubled 401; an update naming RESUME is refused with a doubled 422; the rest is answered
    once, as slurmrestd answers successes."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
        request_line, *lines = head.strip().split("\r\n")
        fields = {n.strip().lower(): v.strip() for n, _, v in (x.partition(":") for x in lines)}
        body = await reader.readexactly(int(fields.get("content-length", "0")))
        method, path, _ = request_line.split(" ", 2)
        seen.append(f"{method} {path}")
        if path == "/openapi/v3":
            writer.write(
                _answer(200, "OK", _json({"paths": {f"{NEWEST.prefix}/nodes/": {}}}), "json")
            )
        elif fields.get("x-slurm-user-token") != GOOD_TOKEN:
            error = {"errors": [{"description": "Authentication failure", "error_number": 0}]}
            writer.write(_answer(401, "UNAUTHORIZED", _json(error), "application/json"))
            writer.write(_answer(401, "UNAUTHORIZED", b"Authentication failure", "text/plain"))
        elif method == "POST" and b"RESUME" in body:
            error = {
                "errors": [{"description": "Invalid node state specified", "error_number": 2028}],
                "warnings": [],
            }
            writer.write(_answer(422, "UNPROCESSABLE CONTENT", _json(error), "application/json"))
            writer.write(_answer(422, "UNPROCESSABLE CONTENT", b"Invalid state", "text/plain"))
        else:
            nodes = {"nodes": [{"name": "n1", "state": ["IDLE"]}], "errors": [], "warnings": []}
            writer.write(_answer(200, "OK", _json(nodes), "application/json"))
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.close()
        await server.wait_closed()


async def test_rule_a_doubled_refusal_of_the_token_is_an_auth_failure_and_the_token_is_reread(
    tmp_path: Path,
) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("stale\n")
    seen: list[str] = []
    async with doubling_slurmrestd(seen) as url:
        client = SlurmClient(CLUSTER, url, StaticToken("slurm", path=token_file), OPTIONS)
        try:
            with pytest.raises(SlurmAuthError) as refused:
                await client.list_nodes()
            assert refused.value.status == 401
            assert "Authentication failure" in str(refused.value)
            # The operator rotates the token: the next call reads it again and succeeds.
            token_file.write_text(GOOD_TOKEN + "\n")
            assert [node["name"] for node in await client.list_nodes()] == ["n1"]
        finally:
            await client.close()


async def test_rule_a_doubled_refusal_of_an_update_is_an_api_error_not_unreachable() -> None:
    seen: list[str] = []
    async with doubling_slurmrestd(seen) as url:
        client = SlurmClient(CLUSTER, url, StaticToken("slurm", value=GOOD_TOKEN), OPTIONS)
        try:
            with pytest.raises(SlurmApiError) as refused:
                await client.update_node("n1", ["RESUME"])
            assert not isinstance(refused.value, SlurmUnreachable)
            assert refused.value.status == 422
            assert refused.value.errors[0]["error_number"] == 2028
            await client.update_node("n1", ["DRAIN"], "nodeflow: test")
        finally:
            await client.close()
    # 4xx is not retried: the update was sent once by aiohttp and read once more on its own.
    assert seen.count(f"POST {NEWEST.prefix}/node/n1") == 3  # RESUME twice, DRAIN once


async def test_rule_the_emulated_26_05_doubled_answers_are_read_as_the_first() -> None:
    """The same against the emulator as 26.05 with its doubled error answers turned on."""
    async with run_slurm_emulator(CLUSTER, slurm_version="26.05") as running:
        running.emulator.register_node("n1", cpus=4, real_memory=8192)
        running.emulator.set_faults(doubled_error_answers=True)
        refused = SlurmClient(CLUSTER, running.url, StaticToken("slurm", value="bad"), OPTIONS)
        client = SlurmClient(
            CLUSTER, running.url, SigningKeyTokens("slurm", running.key_path), OPTIONS
        )
        try:
            with pytest.raises(SlurmAuthError):
                await refused.list_nodes()
            with pytest.raises(SlurmApiError) as invalid:
                await client.update_node("n1", ["RESUME"])  # not drained: refused
            assert not isinstance(invalid.value, SlurmUnreachable)
            assert invalid.value.errors[0]["error_number"] == 2180  # 26.05.5's number
            await client.update_node("n1", ["DRAIN"], "nodeflow: doubled")
            assert running.emulator.node_state("n1") == ["IDLE", "DRAIN"]
        finally:
            await refused.close()
            await client.close()
