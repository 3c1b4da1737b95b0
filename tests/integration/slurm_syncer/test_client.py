"""The slurmrestd client over HTTP: the emulator for real answers, a stub for broken ones."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from aiohttp import web

from clustersim.slurm import ManualClock, RunningSlurm
from nodeflow_bus import Backoff
from nodeflow_contracts.slurm_api import NEWEST
from slurm_syncer.auth import SigningKeyTokens, StaticToken, mint
from slurm_syncer.client import (
    ClientOptions,
    SlurmApiError,
    SlurmAuthError,
    SlurmClient,
    SlurmMalformedResponse,
    SlurmUnreachable,
)
from tests.integration.slurm_syncer.conftest import CLUSTER, FAST_CLIENT

pytestmark = pytest.mark.timeout(30)


async def test_lists_gets_updates_pings_and_lists_jobs(slurm: RunningSlurm) -> None:
    slurm.emulator.register_node("n1", cpus=4, real_memory=1024)
    tokens = SigningKeyTokens("slurm", slurm.key_path, clock=slurm.emulator.clock.now)
    client = SlurmClient(CLUSTER, slurm.url, tokens, FAST_CLIENT)
    try:
        # v0.0.42 on (what 24.11 and 26.05 both offer): `responding`.
        assert (await client.ping())[0]["responding"] is True
        assert [n["name"] for n in await client.list_nodes()] == ["n1"]
        await client.update_node("n1", ["DRAIN"], "nodeflow: test")
        node = await client.get_node("n1")
        assert node is not None and node["state"] == ["IDLE", "DRAIN"]
        assert node["reason"] == "nodeflow: test"
        assert await client.get_node("missing") is None
        assert await client.list_jobs() == []
        # A state word the chosen version does not have is refused before it is sent...
        with pytest.raises(ValueError, match="no node state BOGUS"):
            await client.update_node("n1", ["BOGUS"])
        # ...as slurmrestd would refuse it.
        with pytest.raises(SlurmApiError) as refused:
            await client.request("POST", "/node/n1", {"state": ["BOGUS"]}, what="update node")
        assert "HTTP 400" in str(refused.value)
    finally:
        await client.close()


async def test_minted_tokens_are_refreshed_before_they_expire(
    slurm: RunningSlurm, clock: ManualClock
) -> None:
    tokens = SigningKeyTokens(
        "slurm", slurm.key_path, lifespan=60, margin=10, clock=slurm.emulator.clock.now
    )
    client = SlurmClient(CLUSTER, slurm.url, tokens, FAST_CLIENT)
    try:
        await client.ping()
        first = tokens.token()
        clock.advance(45)  # still 15 s left: the same token
        await client.ping()
        assert tokens.token() == first and tokens.minted == 1
        clock.advance(6)  # 9 s left, inside the margin: a new one
        await client.ping()
        assert tokens.minted == 2 and tokens.token() != first
        clock.advance(3600)  # long past: minted again, never sent expired
        await client.ping()
        assert tokens.minted == 3
    finally:
        await client.close()


async def test_a_refused_static_token_is_read_again_from_its_file(
    slurm: RunningSlurm, clock: ManualClock, tmp_path: Path
) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("SLURM_JWT=" + slurm.mint_token("slurm", lifespan=30) + "\n")
    tokens = StaticToken("slurm", path=token_file, margin=5, clock=clock.now)
    client = SlurmClient(CLUSTER, slurm.url, tokens, FAST_CLIENT)
    try:
        await client.ping()
        clock.advance(60)  # the token expired; an operator (or the simulator) rotates it
        token_file.write_text(slurm.mint_token("slurm", lifespan=600))
        await client.ping()
        # A token Slurm refuses (signed with another key): read again once, then reported.
        foreign_key = b"not the signing key of this Slurm cluster"
        token_file.write_text(mint(foreign_key, "slurm", clock.now(), 600))
        with pytest.raises(SlurmAuthError) as refused:
            await client.ping()
        assert refused.value.status == 511  # what slurmrestd 24.11.5 answers
        clock.advance(3600)  # expired and not replaced: reported without asking slurmrestd
        with pytest.raises(SlurmAuthError) as expired:
            await client.ping()
        assert str(token_file) in str(expired.value) and "expired at" in str(expired.value)
    finally:
        await client.close()


Handler = Callable[[web.Request], web.StreamResponse]


@contextlib.asynccontextmanager
async def stub(responses: list[web.StreamResponse | None]) -> AsyncIterator[tuple[str, list[str]]]:
    """A server answering each request with the next response (None: drop the connection)."""
    seen: list[str] = []

    async def handler(request: web.Request) -> web.StreamResponse:
        if request.path == "/openapi/v3":  # the client's choice of version, not under test
            return web.json_response({"paths": {f"{NEWEST.prefix}/nodes/": {}}})
        seen.append(request.headers.get("X-SLURM-USER-TOKEN", ""))
        response = responses.pop(0) if responses else web.json_response({"errors": []})
        if response is None:
            assert request.transport is not None
            request.transport.close()
            return web.Response()
        return response

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}", seen
    finally:
        await runner.cleanup()


def stub_client(url: str, attempts: int = 3) -> SlurmClient:
    options = ClientOptions(
        timeout_seconds=1.0, attempts=attempts, backoff=Backoff(initial=0.01, maximum=0.02)
    )
    return SlurmClient(CLUSTER, url, StaticToken("slurm", value="t"), options)


@pytest.mark.parametrize(
    ("response", "error"),
    [
        (web.Response(text="<html>proxy</html>"), SlurmMalformedResponse),
        (web.json_response([1, 2]), SlurmMalformedResponse),
        (web.json_response({"errors": "oops"}), SlurmMalformedResponse),
        (web.json_response({"errors": []}), SlurmMalformedResponse),  # no `nodes`
        (web.json_response({"nodes": "x", "errors": []}), SlurmMalformedResponse),
        (web.json_response({"errors": [{"description": "bad"}]}, status=400), SlurmApiError),
    ],
)
async def test_broken_answers_are_errors_that_say_what_was_wrong(
    response: web.StreamResponse, error: type[Exception]
) -> None:
    async with stub([response]) as (url, _):
        client = stub_client(url)
        try:
            with pytest.raises(error) as raised:
                await client.list_nodes()
            assert f"slurm cluster {CLUSTER}" in str(raised.value)
        finally:
            await client.close()


async def test_errors_inside_a_200_answer_are_retried_then_reported() -> None:
    failing = {"nodes": [], "errors": [{"description": "Unable to contact slurmctld"}]}
    async with stub([web.json_response(failing), web.json_response(failing)]) as (url, seen):
        client = stub_client(url, attempts=2)
        try:
            with pytest.raises(SlurmApiError) as raised:
                await client.list_nodes()
            assert raised.value.status == 200
            assert "Unable to contact slurmctld" in str(raised.value)
            assert len(seen) == 2
        finally:
            await client.close()


async def test_transient_failures_are_retried_with_backoff() -> None:
    ok = web.json_response({"nodes": [{"name": "n1", "state": ["IDLE"]}], "errors": []})
    responses: list[web.StreamResponse | None] = [None, web.Response(status=503), ok]
    async with stub(responses) as (url, seen):
        client = stub_client(url)
        try:
            assert [n["name"] for n in await client.list_nodes()] == ["n1"]
            assert len(seen) == 3
        finally:
            await client.close()


async def test_unreachable_after_every_attempt() -> None:
    async with stub([]) as (url, _):
        pass  # the port is closed again
    client = stub_client(url, attempts=2)
    try:
        with pytest.raises(SlurmUnreachable):
            await client.ping()
    finally:
        await client.close()


async def test_rule_a_node_listing_keeps_only_what_the_syncer_reads_of_each_node() -> None:
    """slurmrestd sends sixty-odd fields per node; at 10,000 nodes decoding them all was the
    syncer's peak memory. The listing keeps what parse_node reads, and an entry that is not
    an object as it is (reported malformed later)."""
    whole = {
        "name": "n1",
        "state": ["IDLE", "DRAIN"],
        "reason": "nodeflow: test",
        "reason_set_by_user": "slurm",
        "reason_changed_at": {"set": True, "infinite": False, "number": 1700000000},
        "cpus": 64,
        "alloc_cpus": 0,
        "architecture": "x86_64",
        "gres": "gpu:8",
        "energy": {"current_watts": {"set": False}},
        "features": ["h100"],
    }
    listing = {"nodes": [whole, "not an object"], "errors": [], "warnings": []}
    async with stub([web.json_response(listing)]) as (url, _):
        client = stub_client(url)
        try:
            nodes = await client.list_nodes()
        finally:
            await client.close()
    read = ("name", "state", "reason", "reason_set_by_user", "reason_changed_at", "cpus")
    assert nodes[0] == {key: whole[key] for key in (*read, "alloc_cpus")}
    assert nodes[1] == {"_malformed": "not an object"}
