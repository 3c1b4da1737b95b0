"""The emulator over HTTP: auth, error shapes, faults, the admin API, several clusters."""

from __future__ import annotations

import stat
import time
from typing import Any

import aiohttp
import pytest

from clustersim.slurm import ManualClock, RunningSlurm, run_slurm_emulator
from clustersim.slurm.auth import mint_token
from clustersim.slurm.releases import DEFAULT_SLURM_VERSION, SLURM_RELEASES

# The newest version of the default release (tests/unit/clustersim/test_slurm_versions.py
# covers each version of each release).
API = SLURM_RELEASES[DEFAULT_SLURM_VERSION].newest.prefix


async def call(
    running: RunningSlurm,
    method: str,
    path: str,
    body: Any = None,
    headers: dict[str, str] | None = None,
    user: str = "root",
) -> tuple[int, Any]:
    async with (
        aiohttp.ClientSession() as session,
        session.request(
            method,
            running.url + path,
            json=body,
            headers=running.headers(user) if headers is None else headers,
        ) as response,
    ):
        if "json" in response.content_type:
            return response.status, await response.json()
        return response.status, await response.text()


@pytest.fixture
async def sim() -> Any:
    clock = ManualClock(start=time.time())
    async with run_slurm_emulator("alpha", clock=clock) as running:
        running.emulator.register_node("n-1", cpus=4, real_memory=8192, gres="gpu:8")
        yield running


async def test_key_file_is_private_and_tokens_verify(sim: RunningSlurm) -> None:
    assert stat.S_IMODE(sim.key_path.stat().st_mode) == 0o600
    assert sim.key_path.read_bytes() == sim.emulator.key
    status, body = await call(sim, "GET", API + "/ping")
    assert status == 200 and body["meta"]["client"]["user"] == "root"
    assert body["meta"]["slurm"]["cluster"] == "alpha"


async def test_auth_failures(sim: RunningSlurm) -> None:
    status, text = await call(sim, "GET", API + "/nodes", headers={})
    assert (status, text) == (401, "Authentication failure")
    clock = sim.emulator.clock
    expired = mint_token(sim.emulator.key, "root", clock.now() - 3600, lifespan=60)
    status, body = await call(sim, "GET", API + "/nodes", headers={"X-SLURM-USER-TOKEN": expired})
    assert status == 511 and body["errors"][0]["error_number"] == 1007
    assert body["errors"][0]["description"] == "Failure to query nodes"
    assert "nodes" not in body
    alice = sim.mint_token("alice")
    impersonating = {"X-SLURM-USER-NAME": "bob", "X-SLURM-USER-TOKEN": alice}
    status, body = await call(sim, "GET", API + "/nodes", headers=impersonating)
    assert status == 511
    root_proxy = {"X-SLURM-USER-NAME": "bob", "X-SLURM-USER-TOKEN": sim.mint_token("root")}
    status, body = await call(sim, "GET", API + "/nodes", headers=root_proxy)
    assert status == 200 and body["meta"]["client"]["user"] == "bob"


async def test_token_expiry_follows_the_emulator_clock(sim: RunningSlurm) -> None:
    headers = {"X-SLURM-USER-TOKEN": sim.mint_token("root", lifespan=60)}
    assert (await call(sim, "GET", API + "/ping", headers=headers))[0] == 200
    assert isinstance(sim.emulator.clock, ManualClock)
    sim.emulator.clock.advance(61)
    assert (await call(sim, "GET", API + "/ping", headers=headers))[0] == 511


async def test_non_admin_update_is_500_with_error(sim: RunningSlurm) -> None:
    body = {"state": ["DRAIN"], "reason": "x"}
    status, reply = await call(sim, "POST", API + "/node/n-1", body, user="alice")
    assert status == 500
    assert reply["errors"] == [
        {
            "description": "Failure to update node n-1",
            "error_number": 2010,
            "error": "Invalid user id",
            "source": "_update_node",
        }
    ]
    assert sim.emulator.node_state("n-1") == ["IDLE"]


async def test_unknown_node_answers_200_with_errors(sim: RunningSlurm) -> None:
    status, body = await call(sim, "GET", API + "/node/ghost")
    assert status == 200 and body["nodes"] == []
    assert body["errors"][0]["description"] == "Failure to query node ghost"
    status, body = await call(sim, "POST", API + "/node/ghost", {"state": ["UNDRAIN"]})
    assert status == 500 and body["errors"][0]["error_number"] == 2018


async def test_update_node_sets_reason_and_comment(sim: RunningSlurm) -> None:
    update = {"state": "DRAIN", "reason": "nodeflow: test", "comment": "c", "bogus": 1}
    status, body = await call(sim, "POST", API + "/node/n-1/", update, user="slurm")
    assert status == 200 and body["errors"] == []
    assert "bogus" in body["warnings"][0]["description"]
    node = sim.emulator.node_json("n-1")
    assert node["state"] == ["IDLE", "DRAIN"] and node["comment"] == "c"
    assert node["reason_set_by_user"] == "slurm"
    assert node["reason_changed_at"]["number"] == int(sim.emulator.clock.now())
    assert node["gres"] == "gpu:8" and "gres/gpu=8" in node["tres"]
    status, body = await call(sim, "POST", API + "/node/n-1", {"state": ["SIDEWAYS"]})
    assert status == 400 and body["errors"][0]["error_number"] == 9001


async def test_update_time_answers_304_when_unchanged(sim: RunningSlurm) -> None:
    now = int(sim.emulator.clock.now())
    status, _ = await call(sim, "GET", f"{API}/nodes?update_time={now}")
    assert status == 304
    status, body = await call(sim, "GET", f"{API}/nodes?update_time={now - 10}")
    assert status == 200 and len(body["nodes"]) == 1


async def test_job_lifecycle_on_manual_clock(sim: RunningSlurm) -> None:
    job = {"name": "j", "script": "#!/bin/bash\nsleep 10", "time_limit": 5, "tasks": 2}
    status, body = await call(sim, "POST", API + "/job/submit", {"job": job}, user="alice")
    assert status == 200 and body["errors"] == [] and body["job_id"]
    job_id = body["job_id"]
    assert sim.emulator.node_state("n-1") == ["MIXED"]
    status, body = await call(sim, "GET", f"{API}/job/{job_id}")
    listed = body["jobs"][0]
    assert listed["job_state"] == ["RUNNING"] and listed["nodes"] == "n-1"
    assert listed["time_limit"] == {"set": True, "infinite": False, "number": 5}
    assert listed["user_name"] == "alice" and listed["cpus"]["number"] == 2
    assert isinstance(sim.emulator.clock, ManualClock)
    sim.emulator.clock.advance(10)
    status, body = await call(sim, "GET", f"{API}/job/{job_id}")
    assert body["jobs"][0]["job_state"] == ["COMPLETED", "COMPLETING"]
    status, body = await call(sim, "DELETE", f"{API}/job/{job_id}")
    assert status == 200 and body["warnings"]
    status, body = await call(sim, "GET", f"{API}/job/424242")
    assert status == 404 and body["errors"][0]["error_number"] == 2017


async def test_submit_rejects_bad_bodies(sim: RunningSlurm) -> None:
    status, body = await call(sim, "POST", API + "/job/submit", {"job": {"name": 3}})
    assert status == 400
    status, body = await call(sim, "POST", API + "/job/submit", {"job": {"name": "x"}})
    assert status == 500 and body["errors"][0]["error_number"] == 2009
    status, body = await call(
        sim, "POST", API + "/job/submit", {"job": {"script": "sleep 1", "partition": "nope"}}
    )
    assert status == 500 and body["errors"][0]["error_number"] == 2000


async def test_submit_required_nodes_are_a_hostlist_and_a_bad_one_is_a_parse_error(
    sim: RunningSlurm,
) -> None:
    job = {"script": "sleep 1", "required_nodes": ["n-[1]"]}
    status, body = await call(sim, "POST", API + "/job/submit", {"job": job})
    assert status == 200 and body["errors"] == [] and body["job_id"], body
    status, body = await call(sim, "GET", f"{API}/job/{body['job_id']}")
    assert body["jobs"][0]["required_nodes"] == "n-1"
    job = {"script": "sleep 1", "required_nodes": ["n-[2-1]"]}
    status, body = await call(sim, "POST", API + "/job/submit", {"job": job})
    assert status == 400 and body["errors"][0]["error_number"] == 9001, body
    assert "n-[2-1]" in body["errors"][0]["description"] + body["errors"][0].get("source", "")


async def test_faults(sim: RunningSlurm) -> None:
    sim.emulator.set_faults(down="503")
    assert (await call(sim, "GET", API + "/ping"))[0] == 503
    sim.emulator.set_faults(down="controller")
    status, body = await call(sim, "GET", API + "/nodes")
    assert status == 502 and body["errors"][0]["error_number"] == 1800
    sim.emulator.set_faults(down=None, error_rate=1.0)
    status, body = await call(sim, "GET", API + "/nodes")
    assert status == 500 and body["errors"] and "nodes" not in body
    sim.emulator.set_faults(error_rate=0.0, errors_in_200_rate=1.0)
    status, body = await call(sim, "GET", API + "/nodes")
    assert status == 200 and body["nodes"] == [] and body["errors"]
    sim.emulator.clear_faults()
    status, body = await call(sim, "GET", API + "/nodes")
    assert status == 200 and len(body["nodes"]) == 1
    with pytest.raises(ValueError):
        sim.emulator.set_faults(down="sideways")


async def test_partial_error_rate_is_seeded(sim: RunningSlurm) -> None:
    sim.emulator.set_faults(error_rate=0.5, seed=7)
    first = [(await call(sim, "GET", API + "/ping"))[0] for _ in range(12)]
    sim.emulator.set_faults(seed=7)
    second = [(await call(sim, "GET", API + "/ping"))[0] for _ in range(12)]
    assert first == second and {200, 500} == set(first)


async def test_latency_fault(sim: RunningSlurm) -> None:
    sim.emulator.set_faults(latency=0.3)
    started = time.monotonic()
    assert (await call(sim, "GET", API + "/ping"))[0] == 200
    assert time.monotonic() - started >= 0.3


async def test_refuse_and_come_back(sim: RunningSlurm) -> None:
    await sim.go_down("refuse")
    with pytest.raises(aiohttp.ClientConnectionError):
        await call(sim, "GET", API + "/ping")
    await sim.come_back()
    assert (await call(sim, "GET", API + "/ping"))[0] == 200


async def test_admin_api(sim: RunningSlurm) -> None:
    node = {"name": "n-2", "cpus": 2, "real_memory": 100, "dynamic": True}
    status, body = await call(sim, "POST", "/_sim/slurm/nodes", node, headers={})
    assert status == 200 and body["state"] == ["IDLE", "DYNAMIC_NORM"]
    status, body = await call(sim, "POST", "/_sim/slurm/nodes/n-2/lost", headers={})
    assert body["state"] == ["DOWN", "NOT_RESPONDING", "DYNAMIC_NORM"]
    status, body = await call(sim, "POST", "/_sim/slurm/faults", {"down": "503"}, headers={})
    assert status == 200 and body["down"] == "503"
    status, body = await call(sim, "GET", "/_sim/slurm/state", headers={})
    assert body["nodes"]["n-2"][0] == "DOWN" and body["faults"]["down"] == "503"
    await call(sim, "DELETE", "/_sim/slurm/faults", headers={})
    status, body = await call(sim, "POST", "/_sim/slurm/token", {"user": "bob"}, headers={})
    token = body["token"]
    status, _ = await call(sim, "GET", API + "/ping", headers={"X-SLURM-USER-TOKEN": token})
    assert status == 200
    before = sim.emulator.clock.now()
    status, body = await call(sim, "POST", "/_sim/slurm/clock/advance", {"seconds": 5}, {})
    assert body["now"] == before + 5
    status, _ = await call(sim, "DELETE", API + "/node/n-2")
    assert status == 200 and "n-2" not in sim.cluster.nodes
    status, body = await call(sim, "DELETE", API + "/node/n-1")
    assert status == 500 and body["errors"][0]["error_number"] == 2028


async def test_two_clusters_side_by_side() -> None:
    async with (
        run_slurm_emulator("east", clock=ManualClock()) as east,
        run_slurm_emulator("west", clock=ManualClock()) as west,
    ):
        east.emulator.register_node("e-1", cpus=1, real_memory=1)
        west.emulator.register_node("w-1", cpus=1, real_memory=1)
        _, east_nodes = await call(east, "GET", API + "/nodes")
        _, west_nodes = await call(west, "GET", API + "/nodes")
        assert [n["name"] for n in east_nodes["nodes"]] == ["e-1"]
        assert [n["name"] for n in west_nodes["nodes"]] == ["w-1"]
        assert west_nodes["meta"]["slurm"]["cluster"] == "west"
        foreign = {"X-SLURM-USER-TOKEN": east.mint_token("root")}
        assert (await call(west, "GET", API + "/nodes", headers=foreign))[0] == 511


async def test_wall_clock_driver_finishes_jobs() -> None:
    async with run_slurm_emulator("live", driver_interval=0.05, completing_seconds=0.1) as live:
        live.emulator.register_node("l-1", cpus=2, real_memory=1)
        job = {"script": "sleep 0.3", "required_nodes": ["l-1"]}
        status, body = await call(live, "POST", API + "/job/submit", {"job": job})
        assert status == 200
        assert live.cluster.node_state(live.cluster.nodes["l-1"]) == ["MIXED"]
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and live.cluster.jobs[body["job_id"]].state != (
            "COMPLETED"
        ):
            await _pause()
        assert live.cluster.jobs[body["job_id"]].state == "COMPLETED"


async def _pause() -> None:
    import asyncio

    await asyncio.sleep(0.05)
