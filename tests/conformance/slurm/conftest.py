"""The server under test: a real slurmrestd named by env, or else the emulator; every test runs
once per API version the server serves.

NODEFLOW_SLURM_URL, NODEFLOW_SLURM_TOKEN: a slurmrestd and an admin's token.
NODEFLOW_SLURM_USER (default root): that token's user.
NODEFLOW_SLURM_VERSION (optional): the Slurm release it runs (24.11, 26.05), checked in `meta`.
NODEFLOW_SLURM_API_VERSIONS (optional): comma separated API versions to test (default: those
  of ours the server's /openapi/v3 lists, read when the tests are collected).
NODEFLOW_SLURM_NODES (optional): comma separated nodes the suite may drain and run jobs on.
NODEFLOW_SLURM_NONADMIN_USER, NODEFLOW_SLURM_NONADMIN_TOKEN: a non-admin user's token.
NODEFLOW_SLURM_JWT_KEY (optional): the signing key file, to mint an expired token.
Without NODEFLOW_SLURM_URL the emulator runs as each release it emulates, each of its versions.
"""

from __future__ import annotations

import json
import os
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from clustersim.slurm import SLURM_RELEASES, run_slurm_emulator
from nodeflow_contracts.slurm_api import (
    API_VERSIONS,
    api_version,
    version_number,
    versions_in_openapi,
)
from tests.conformance.slurm.support import SlurmTarget

EMULATED_NODES = ["c-001", "c-002", "c-003"]
NON_ADMIN = "alice"


def _targets() -> list[tuple[str | None, str]]:
    """(release, API version) pairs to run: the real server's, or each emulated release's."""
    if os.environ.get("NODEFLOW_SLURM_URL"):
        listed = os.environ.get("NODEFLOW_SLURM_API_VERSIONS", "")
        names = [name.strip() for name in listed.split(",") if name.strip()]
        names = names or sorted(_served_by_real_slurm(), key=version_number)
        release = os.environ.get("NODEFLOW_SLURM_VERSION") or None
        # A version we do not speak (v0.0.40 of 24.11) has no record to test against.
        return [(release, name) for name in names if name in API_VERSIONS]
    return [
        (release.name, version.name)
        for release in SLURM_RELEASES.values()
        for version in release.api_versions
    ]


def _served_by_real_slurm() -> frozenset[str]:
    url = os.environ["NODEFLOW_SLURM_URL"].rstrip("/") + "/openapi/v3"
    headers = {
        "X-SLURM-USER-NAME": os.environ.get("NODEFLOW_SLURM_USER", "root"),
        "X-SLURM-USER-TOKEN": os.environ.get("NODEFLOW_SLURM_TOKEN", ""),
    }
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=30) as reply:
        return versions_in_openapi(json.load(reply))


@pytest.fixture(params=_targets(), ids=lambda target: f"{target[0] or 'slurm'}-{target[1]}")
async def slurm(request: pytest.FixtureRequest) -> AsyncIterator[SlurmTarget]:
    release, version_name = request.param
    version = api_version(version_name)
    url = os.environ.get("NODEFLOW_SLURM_URL")
    if url:
        async with aiohttp.ClientSession() as session:
            target = await _real_target(url, session, release, version_name)
            yield target
        return
    async with run_slurm_emulator(
        "conformance", driver_interval=0.1, slurm_version=release
    ) as running:
        for name in EMULATED_NODES:
            running.emulator.register_node(name, cpus=4, real_memory=8192, gres="gpu:2")
        if release == "26.05":
            # As Slurm 26.05.5's slurmrestd: every error answer is followed by a second one.
            running.emulator.set_faults(doubled_error_answers=True)
        target = SlurmTarget(
            url=running.url,
            api=version,
            release=release,
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


async def _real_target(
    url: str, session: aiohttp.ClientSession, release: str | None, version_name: str
) -> SlurmTarget:
    token = os.environ.get("NODEFLOW_SLURM_TOKEN", "")
    if not token:
        pytest.fail("NODEFLOW_SLURM_URL is set but NODEFLOW_SLURM_TOKEN is not")
    user = os.environ.get("NODEFLOW_SLURM_USER", "root")
    non_admin_user = os.environ.get("NODEFLOW_SLURM_NONADMIN_USER")
    non_admin_token = os.environ.get("NODEFLOW_SLURM_NONADMIN_TOKEN")
    key_file = os.environ.get("NODEFLOW_SLURM_JWT_KEY")
    target = SlurmTarget(
        url=url.rstrip("/"),
        api=api_version(version_name),
        release=release,
        user=user,
        token=token,
        nodes=[],
        non_admin=(non_admin_user, non_admin_token) if non_admin_user and non_admin_token else None,
        jwt_key=Path(key_file).read_bytes() if key_file else None,
    )
    target.session = session
    served = versions_in_openapi(await target.openapi())
    if version_name not in served:
        pytest.skip(f"the Slurm at {url} does not serve {version_name} ({sorted(served)})")
    listed = os.environ.get("NODEFLOW_SLURM_NODES", "")
    if listed:
        target.nodes = [name.strip() for name in listed.split(",") if name.strip()]
    else:
        body = (await target.request("GET", "/nodes")).ok()
        target.nodes = sorted(node["name"] for node in body["nodes"])
    if not target.nodes:
        pytest.fail(f"the Slurm at {url} has no nodes to test with")
    return target
