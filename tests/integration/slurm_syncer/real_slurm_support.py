"""The Slurm the real-Slurm syncer tests run against: a real Slurm (24.11, 26.05) or the emulator.

With NODEFLOW_SLURM_URL set (tools/slurm/real_slurm.sh start prints it, `make test-real-slurm`
sources it) the tests drive that slurmrestd; otherwise they drive the emulator, so the same
steps run in the normal suite. The variables are the conformance suite's:

NODEFLOW_SLURM_URL, NODEFLOW_SLURM_TOKEN   a slurmrestd and an admin's token
NODEFLOW_SLURM_USER                        that token's user (default root)
NODEFLOW_SLURM_NODES                       comma separated nodes the tests may drain and use
NODEFLOW_SLURM_JWT_KEY                     the signing key; when readable the syncer mints its
                                           own tokens from it, as it does in production
NODEFLOW_SLURM_VERSION                     the release it runs (checked by the conformance suite)
NODEFLOW_SLURM_JWKS_PRIVATE_KEY, _KID      the RSA key (PEM) and kid slurmctld takes RS256 tokens
                                           of through jwks= (test_real_slurm.py's RS256 test)

The admin's view speaks the API version the syncer would choose (the newest both speak).

Everything goes through slurmrestd's REST API, never emulator internals, so nothing here
depends on which of the two is behind the URL.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from clustersim.slurm import RunningSlurm, run_slurm_emulator
from nodeflow_bus import Backoff
from nodeflow_contracts.slurm_api import NEWEST, choose_version, versions_in_openapi
from slurm_syncer.auth import token_source
from slurm_syncer.client import ClientOptions, SlurmClient
from slurm_syncer.settings import cluster_settings
from tests.conformance.slurm.support import UNUSABLE_FLAGS, SlurmTarget, wait_for

CLUSTER = "nodeflow"
EMULATED_NODES = ("a-000-001", "a-000-002", "a-000-003", "a-000-004")
EMULATED_CPUS = 2
# A real job must outlive the drain comfortably (slurmctld schedules, the syncer polls and
# drains); the emulator schedules at once, so a shorter job keeps the normal suite fast.
REAL_JOB_SECONDS = 8
EMULATED_JOB_SECONDS = 4
SYNCER_CLIENT = ClientOptions(
    timeout_seconds=5.0, attempts=3, backoff=Backoff(initial=0.05, maximum=0.5)
)
Json = dict[str, Any]


@dataclass
class SlurmUnderTest:
    """A slurmrestd, the admin's view of it, and the settings a syncer needs to reach it.

    Jobs submitted and nodes touched are remembered, so `clean_up` leaves Slurm as it was:
    jobs cancelled, nodes undrained and idle."""

    target: SlurmTarget
    syncer_environ: dict[str, str]
    job_seconds: int
    is_real: bool
    jobs: list[int] = field(default_factory=list)
    touched: set[str] = field(default_factory=set)
    taken: set[str] = field(default_factory=set)

    def syncer_client(self) -> SlurmClient:
        """The client a deployed syncer would build from these SLURM_* settings."""
        settings = cluster_settings((CLUSTER,), self.syncer_environ)[CLUSTER]
        tokens = token_source(settings, lifespan=600, margin=60)
        return SlurmClient(CLUSTER, settings.url, tokens, SYNCER_CLIENT)

    async def node(self, name: str) -> Json:
        return await self.target.node(name)

    async def take_free_node(self) -> str:
        """A node no other step of this test uses that is IDLE with no drain or trouble flag
        (waiting for one: the previous test's jobs may still be completing)."""

        async def probe() -> str | None:
            for name in self.target.nodes:
                if name in self.taken:
                    continue
                state = (await self.node(name))["state"]
                if state[0] == "IDLE" and not set(state[1:]) & UNUSABLE_FLAGS:
                    return name
            return None

        name: str = await wait_for(probe, "an idle, undrained node", timeout=30.0)
        self.taken.add(name)
        self.touched.add(name)
        return name

    async def submit_sleep(self, node: str, seconds: int | None = None) -> int:
        """A batch job `sleep <seconds>` (default `job_seconds`) using every CPU of `node` (so
        it is ALLOCATED). The submit's time limit is a minute: longer sleeps are cut short."""
        cpus = int((await self.node(node))["cpus"])
        job_id = await self.target.submit(
            "nodeflow-syncer-real-slurm",
            f"#!/bin/bash\nsleep {self.job_seconds if seconds is None else seconds}",
            required_nodes=[node],
            minimum_nodes=1,
            tasks=1,
            cpus_per_task=cpus,
        )
        self.jobs.append(job_id)
        return job_id

    async def job_state(self, job_id: int) -> list[str]:
        job = await self.target.job(job_id)
        return list(job["job_state"]) if job is not None else []

    async def drain_as_admin(self, node: str, reason: str) -> None:
        """A drain by someone else (an operator), with a reason Nodeflow does not own."""
        self.touched.add(node)
        (await self.target.update_node(node, state=["DRAIN"], reason=reason)).ok()

    async def clean_up(self) -> None:
        """Cancel our jobs and undrain our nodes, then wait until the nodes are usable, so
        the conformance suite and reruns start from a clean cluster."""
        for job_id in self.jobs:
            with contextlib.suppress(Exception):
                await self.target.cancel(job_id)
        for name in sorted(self.touched):
            node = await self.node(name)
            if "DRAIN" in node["state"][1:]:
                await self.target.update_node(name, state=["UNDRAIN"])

        async def all_usable() -> bool:
            for name in self.touched:
                state = (await self.node(name))["state"]
                if state[0] != "IDLE" or set(state[1:]) & UNUSABLE_FLAGS:
                    return False
            return True

        await wait_for(all_usable, f"nodes {sorted(self.touched)} to be idle and undrained")


def real_slurm_configured(environ: Mapping[str, str] = os.environ) -> bool:
    return bool(environ.get("NODEFLOW_SLURM_URL"))


def _syncer_environ_for_real(environ: Mapping[str, str], url: str, user: str) -> dict[str, str]:
    """Mint tokens from the signing key when it is readable (the production setup); else use
    the admin token as a static one."""
    settings = {"SLURM_URL": url, "SLURM_USER": user}
    key = environ.get("NODEFLOW_SLURM_JWT_KEY", "")
    if key and os.access(key, os.R_OK):
        settings["SLURM_JWT_KEY_FILE"] = key
    else:
        settings["SLURM_TOKEN"] = environ.get("NODEFLOW_SLURM_TOKEN", "")
    return settings


@contextlib.asynccontextmanager
async def real_slurm(
    session: aiohttp.ClientSession, environ: Mapping[str, str] = os.environ
) -> AsyncIterator[SlurmUnderTest]:
    url = environ["NODEFLOW_SLURM_URL"].rstrip("/")
    token = environ.get("NODEFLOW_SLURM_TOKEN", "")
    if not token:
        pytest.fail("NODEFLOW_SLURM_URL is set but NODEFLOW_SLURM_TOKEN is not")
    user = environ.get("NODEFLOW_SLURM_USER", "root")
    listed = [n.strip() for n in environ.get("NODEFLOW_SLURM_NODES", "").split(",") if n.strip()]
    release = environ.get("NODEFLOW_SLURM_VERSION") or None
    target = SlurmTarget(url=url, api=NEWEST, release=release, user=user, token=token, nodes=listed)
    target.session = session
    target.api = choose_version(versions_in_openapi(await target.openapi()))
    if not target.nodes:
        body = (await target.request("GET", "/nodes")).ok()
        target.nodes = sorted(node["name"] for node in body["nodes"])
    if len(target.nodes) < 2:
        pytest.fail(f"the Slurm at {url} needs two nodes for these tests: {target.nodes}")
    yield SlurmUnderTest(
        target=target,
        syncer_environ=_syncer_environ_for_real(environ, url, user),
        job_seconds=REAL_JOB_SECONDS,
        is_real=True,
    )


@contextlib.asynccontextmanager
async def emulated_slurm_running(
    session: aiohttp.ClientSession, **emulator_options: Any
) -> AsyncIterator[tuple[SlurmUnderTest, RunningSlurm]]:
    """The emulator on the wall clock, ticking often, with the real script's four nodes; and
    the running emulator itself (`emulator_options` go to run_slurm_emulator)."""
    async with run_slurm_emulator(CLUSTER, driver_interval=0.05, **emulator_options) as running:
        for name in EMULATED_NODES:
            running.emulator.register_node(name, cpus=EMULATED_CPUS, real_memory=1000)
        target = SlurmTarget(
            url=running.url,
            api=running.emulator.release.newest,
            release=running.emulator.release.name,
            user="root",
            token=running.mint_token("root"),
            nodes=list(EMULATED_NODES),
            is_emulator=True,
        )
        target.session = session
        slurm = SlurmUnderTest(
            target=target,
            syncer_environ={
                "SLURM_URL": running.url,
                "SLURM_USER": "root",
                "SLURM_JWT_KEY_FILE": str(Path(running.key_path)),
            },
            job_seconds=EMULATED_JOB_SECONDS,
            is_real=False,
        )
        yield slurm, running


@contextlib.asynccontextmanager
async def emulated_slurm(session: aiohttp.ClientSession) -> AsyncIterator[SlurmUnderTest]:
    async with emulated_slurm_running(session) as (slurm, _):
        yield slurm


@contextlib.asynccontextmanager
async def slurm_under_test() -> AsyncIterator[SlurmUnderTest]:
    """The real Slurm when NODEFLOW_SLURM_URL names one, else the emulator; cleaned up after."""
    async with aiohttp.ClientSession() as session:
        chosen = real_slurm(session) if real_slurm_configured() else emulated_slurm(session)
        async with chosen as slurm:
            try:
                yield slurm
            finally:
                await slurm.clean_up()
