"""The emulator's auth/jwt with `jwks=`: RS256 tokens verified against the JWKS, beside HS256."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import aiohttp

from clustersim.slurm import ManualClock, RunningSlurm, run_slurm_emulator
from clustersim.slurm.auth import mint_rs256_token, new_rsa_key, write_jwks
from clustersim.slurm.releases import DEFAULT_SLURM_VERSION, SLURM_RELEASES

API = SLURM_RELEASES[DEFAULT_SLURM_VERSION].newest.prefix


async def ping(running: RunningSlurm, token: str, user: str = "slurm") -> tuple[int, Any]:
    headers = {"X-SLURM-USER-NAME": user, "X-SLURM-USER-TOKEN": token}
    async with (
        aiohttp.ClientSession() as session,
        session.get(running.url + API + "/nodes", headers=headers) as response,
    ):
        return response.status, await response.json()


async def test_rule_rs256_tokens_verify_against_the_jwks_beside_hs256(tmp_path: Path) -> None:
    signing = new_rsa_key()
    stranger = new_rsa_key()
    jwks_path = tmp_path / "jwks.json"
    write_jwks(jwks_path, {"idp-1": signing})
    clock = ManualClock(start=time.time())
    async with run_slurm_emulator("alpha", clock=clock, jwks_path=jwks_path) as sim:
        now = clock.now()
        good = mint_rs256_token(signing, "idp-1", "slurm", now, lifespan=60)
        status, body = await ping(sim, good)
        assert status == 200 and body["meta"]["client"]["user"] == "slurm"
        # HS256 with jwt_key still works beside the JWKS.
        assert (await ping(sim, sim.mint_token("slurm")))[0] == 200
        # A key the JWKS does not hold, a kid it does not name, an expired token: refused.
        forged = mint_rs256_token(stranger, "idp-1", "slurm", now, lifespan=60)
        unknown_kid = mint_rs256_token(signing, "idp-2", "slurm", now, lifespan=60)
        for refused in (forged, unknown_kid):
            status, body = await ping(sim, refused)
            assert status == 511 and body["errors"][0]["error_number"] == 1007
        clock.advance(61)
        assert (await ping(sim, good))[0] == 511


async def test_rs256_tokens_are_refused_without_a_jwks(tmp_path: Path) -> None:
    signing = new_rsa_key()
    async with run_slurm_emulator("alpha", clock=ManualClock(start=time.time())) as sim:
        token = mint_rs256_token(signing, "idp-1", "slurm", sim.emulator.clock.now())
        assert (await ping(sim, token))[0] == 511
