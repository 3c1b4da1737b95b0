"""The emulator as each Slurm release: the API versions it serves, /openapi/v3, and each
version's shapes (the fields of its record in nodeflow_contracts.slurm_api)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from clustersim.slurm import SLURM_RELEASES, ManualClock, RunningSlurm, run_slurm_emulator
from clustersim.slurm.releases import SlurmRelease, slurm_release
from nodeflow_contracts.slurm_api import API_VERSIONS, SlurmApiVersion, versions_in_openapi
from tests.conformance.slurm.openapi_facts import captured_documents

SERVED = [
    (release, version) for release in SLURM_RELEASES.values() for version in release.api_versions
]


async def call(
    running: RunningSlurm, method: str, path: str, body: Any = None, token: bool = True
) -> tuple[int, Any]:
    headers = running.headers("root") if token else {}
    async with (
        aiohttp.ClientSession() as session,
        session.request(method, running.url + path, json=body, headers=headers) as response,
    ):
        if "json" in response.content_type:
            return response.status, await response.json()
        return response.status, await response.text()


@pytest.fixture(params=sorted(SLURM_RELEASES))
async def sim(request: pytest.FixtureRequest) -> AsyncIterator[RunningSlurm]:
    clock = ManualClock(start=time.time())
    async with run_slurm_emulator("v", clock=clock, slurm_version=request.param) as running:
        running.emulator.register_node("n-1", cpus=4, real_memory=8192, gres="gpu:8")
        yield running


def test_releases_serve_what_real_slurmrestd_loads_of_ours() -> None:
    assert [v.name for v in slurm_release("24.11").api_versions] == ["v0.0.41", "v0.0.42"]
    assert [v.name for v in slurm_release("26.05").api_versions] == [
        "v0.0.42",
        "v0.0.43",
        "v0.0.44",
        "v0.0.45",
    ]
    with pytest.raises(ValueError, match=r"24\.11, 26\.05"):
        slurm_release("25.05")


async def test_only_the_release_versions_are_served(sim: RunningSlurm) -> None:
    served = {version.name for version in sim.api_versions}
    for name, version in API_VERSIONS.items():
        status, body = await call(sim, "GET", version.prefix + "/ping/")
        if name in served:
            assert status == 200 and body["meta"]["plugin"]["data_parser"] == version.data_parser
        else:
            assert status == 404, (name, status)
    assert sim.api_prefix == sim.api_versions[-1].prefix


async def test_openapi_lists_the_served_versions_and_needs_a_token(sim: RunningSlurm) -> None:
    status, _ = await call(sim, "GET", "/openapi/v3", token=False)
    assert status == 401
    status, document = await call(sim, "GET", "/openapi/v3")
    assert status == 200
    assert versions_in_openapi(document) == {version.name for version in sim.api_versions}
    release = sim.emulator.release
    assert document["info"]["x-slurm"]["release"] == release.release
    for version in sim.api_versions:
        assert f"{version.prefix}/nodes/" in document["paths"]
        assert "post" in document["paths"][f"{version.prefix}/node/{{node_name}}"]
    sim.emulator.set_faults(openapi_hidden=True)
    status, _ = await call(sim, "GET", "/openapi/v3")
    assert status == 404


@pytest.mark.parametrize(
    ("release", "version"), SERVED, ids=[f"{r.name}-{v.name}" for r, v in SERVED]
)
async def test_entries_have_exactly_the_fields_of_their_version(
    release: SlurmRelease, version: SlurmApiVersion
) -> None:
    clock = ManualClock(start=time.time())
    async with run_slurm_emulator("v", clock=clock, slurm_version=release.name) as sim:
        sim.emulator.register_node("n-1", cpus=4, real_memory=8192, gres="gpu:8")
        api = version.prefix
        status, body = await call(sim, "GET", api + "/nodes")
        assert status == 200
        node = body["nodes"][0]
        assert set(node) == version.node_fields, sorted(set(node) ^ version.node_fields)
        assert node["version"] == release.release
        assert body["meta"]["slurm"]["release"] == release.release
        _, body = await call(sim, "GET", api + "/ping")
        assert set(body["pings"][0]) == version.ping_fields
        job = {"name": "j", "script": "#!/bin/bash\nsleep 10", "time_limit": 5}
        status, body = await call(sim, "POST", api + "/job/submit", {"job": job})
        assert status == 200 and set(body) == version.job_submit_fields, body
        _, body = await call(sim, "GET", f"{api}/job/{body['job_id']}")
        listed = body["jobs"][0]
        assert set(listed) == version.job_fields, sorted(set(listed) ^ version.job_fields)


async def test_exclusive_is_a_job_field_of_v0_0_41_only() -> None:
    clock = ManualClock(start=time.time())
    async with run_slurm_emulator("v", clock=clock, slurm_version="24.11") as sim:
        sim.emulator.register_node("n-1", cpus=4, real_memory=8192)
        job = {"script": "sleep 10", "time_limit": 5, "exclusive": ["true"]}
        status, body = await call(sim, "POST", "/slurm/v0.0.41/job/submit", {"job": job})
        assert status == 200 and body["warnings"] == []
        assert sim.cluster.node_alloc_cpus(sim.cluster.nodes["n-1"]) == 4
        await call(sim, "DELETE", f"/slurm/v0.0.41/job/{body['job_id']}")
        clock.advance(1)
        # v0.0.42 dropped it: a warning, and the job is not exclusive...
        status, body = await call(sim, "POST", "/slurm/v0.0.42/job/submit", {"job": job})
        assert status == 200
        assert any('"exclusive"' in w["description"] for w in body["warnings"]), body
        assert sim.cluster.node_alloc_cpus(sim.cluster.nodes["n-1"]) == 1
        await call(sim, "DELETE", f"/slurm/v0.0.42/job/{body['job_id']}")
        clock.advance(1)
        # ...which `shared: ["none"]` says instead.
        job = {"script": "sleep 10", "time_limit": 5, "shared": ["none"]}
        status, body = await call(sim, "POST", "/slurm/v0.0.42/job/submit", {"job": job})
        assert status == 200 and body["warnings"] == []
        assert sim.cluster.node_alloc_cpus(sim.cluster.nodes["n-1"]) == 4


async def test_a_state_word_is_parsed_by_its_version() -> None:
    async with run_slurm_emulator("v", clock=ManualClock(), slurm_version="26.05") as sim:
        sim.emulator.register_node("n-1", cpus=4, real_memory=8192)
        # BLOCKED is not a v0.0.43 word: a parse error (400)...
        status, body = await call(sim, "POST", "/slurm/v0.0.43/node/n-1", {"state": ["BLOCKED"]})
        assert status == 400 and "BLOCKED" in body["errors"][0]["description"]
        # ...and a v0.0.44 word slurmctld does not take in an update (invalid state).
        status, body = await call(sim, "POST", "/slurm/v0.0.44/node/n-1", {"state": ["BLOCKED"]})
        assert status != 400 and body["errors"], body
        status, body = await call(
            sim, "POST", "/slurm/v0.0.45/node/n-1", {"state": ["DRAIN"], "reason": "x"}
        )
        assert status == 200 and sim.emulator.node_state("n-1") == ["IDLE", "DRAIN"]


CAPTURED = {(captured.release, captured.version): captured for captured in captured_documents()}


@pytest.mark.parametrize(
    ("release", "version"), SERVED, ids=[f"{r.name}-{v.name}" for r, v in SERVED]
)
async def test_every_path_and_method_served_is_the_real_releases(
    release: SlurmRelease, version: SlurmApiVersion
) -> None:
    """What the emulator's /openapi/v3 lists is in the document the real release serves
    (tests/conformance/slurm/openapi/), methods included."""
    real = CAPTURED[(release.name, version.name)]
    async with run_slurm_emulator("v", clock=ManualClock(), slurm_version=release.name) as sim:
        _, document = await call(sim, "GET", "/openapi/v3")
    ours = {
        (path, method)
        for path, methods in document["paths"].items()
        if path.startswith(version.prefix + "/")
        for method in methods
    }
    assert ours
    theirs = {
        (path, method) for path, methods in real.document["paths"].items() for method in methods
    }
    assert ours <= theirs, sorted(ours - theirs)
