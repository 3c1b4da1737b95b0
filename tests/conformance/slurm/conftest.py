"""The server under test: a real slurmrestd named by env, or else the emulator.

NODEFLOW_SLURM_URL, NODEFLOW_SLURM_TOKEN: a slurmrestd and an admin's token.
NODEFLOW_SLURM_USER (default root): that token's user.
NODEFLOW_SLURM_NODES (optional): comma separated nodes the suite may drain and run jobs on.
NODEFLOW_SLURM_NONADMIN_USER, NODEFLOW_SLURM_NONADMIN_TOKEN: a non-admin user's token.
NODEFLOW_SLURM_JWT_KEY (optional): the signing key file, to mint an expired token.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from clustersim.slurm import run_slurm_emulator
from tests.conformance.slurm.support import SlurmTarget

EMULATED_NODES = ["c-001", "c-002", "c-003"]
NON_ADMIN = "alice"


@pytest.fixture
async def slurm() -> AsyncIterator[SlurmTarget]:
    url = os.environ.get("NODEFLOW_SLURM_URL")
    if url:
        async with aiohttp.ClientSession() as session:
            target = await _real_target(url, session)
            target.session = session
            yield target
        return
    async with run_slurm_emulator("conformance", driver_interval=0.1) as running:
        for name in EMULATED_NODES:
            running.emulator.register_node(name, cpus=4, real_memory=8192, gres="gpu:2")
        target = SlurmTarget(
            url=running.url,
            user="root",
            token=running.mint_token("root"),
            nodes=list(EMULATED_NODES),
            non_admin=(NON_ADMIN, running.mint_token(NON_ADMIN)),
            jwt_key=running.emulator.key,
            is_emulator=True,
        )
        async with aiohttp.ClientSession() as session:
            target.session = session
            yield target


async def _real_target(url: str, session: aiohttp.ClientSession) -> SlurmTarget:
    token = os.environ.get("NODEFLOW_SLURM_TOKEN", "")
    if not token:
        pytest.fail("NODEFLOW_SLURM_URL is set but NODEFLOW_SLURM_TOKEN is not")
    user = os.environ.get("NODEFLOW_SLURM_USER", "root")
    non_admin_user = os.environ.get("NODEFLOW_SLURM_NONADMIN_USER")
    non_admin_token = os.environ.get("NODEFLOW_SLURM_NONADMIN_TOKEN")
    key_file = os.environ.get("NODEFLOW_SLURM_JWT_KEY")
    target = SlurmTarget(
        url=url.rstrip("/"),
        user=user,
        token=token,
        nodes=[],
        non_admin=(non_admin_user, non_admin_token) if non_admin_user and non_admin_token else None,
        jwt_key=Path(key_file).read_bytes() if key_file else None,
    )
    target.session = session
    listed = os.environ.get("NODEFLOW_SLURM_NODES", "")
    if listed:
        target.nodes = [name.strip() for name in listed.split(",") if name.strip()]
    else:
        body = (await target.request("GET", "/nodes")).ok()
        target.nodes = sorted(node["name"] for node in body["nodes"])
    if not target.nodes:
        pytest.fail(f"the Slurm at {url} has no nodes to test with")
    return target
