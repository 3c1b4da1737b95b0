"""The Slurm emulator's reservations (clustersim/slurm): served as the real slurmrestd serves
them per release, and honoured by the emulated scheduler.

Rules: POST /reservation and DELETE /reservation/{name} exist from v0.0.43 on (Slurm 24.11
only lists reservations: its write paths answer 404); an active MAINT reservation shows its
nodes MAINTENANCE with its name; a job whose time limit would run into a MAINT reservation
does not start on its nodes (one that ends before it does); a one-off reservation is gone once
it has ended.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from clustersim.slurm import ManualClock, RunningSlurm, run_slurm_emulator
from nodeflow_contracts.slurm_api import api_version
from tests.unit.clustersim.test_slurm_server import call

NEWEST = "/slurm/v0.0.45"


@pytest.fixture
async def sim() -> Any:
    clock = ManualClock(start=time.time())
    async with run_slurm_emulator("alpha", clock=clock) as running:
        for name in ("n-1", "n-2"):
            running.emulator.register_node(name, cpus=4, real_memory=8192)
        yield running


def _advance(running: RunningSlurm, seconds: float) -> None:
    clock = running.emulator.clock
    assert isinstance(clock, ManualClock)
    clock.advance(seconds)


def _body(name: str, nodes: list[str], start: float, minutes: int, flags: list[str]) -> Any:
    return api_version("v0.0.45").reservation_body(name, nodes, int(start), minutes, flags)


async def test_rule_reservation_writes_exist_from_v0_0_43_only() -> None:
    clock = ManualClock(start=time.time())
    async with run_slurm_emulator("old", clock=clock, slurm_version="24.11") as old:
        old.emulator.register_node("n-1", cpus=4, real_memory=8192)
        status, body = await call(old, "GET", "/slurm/v0.0.42/reservations/")
        assert status == 200 and body["reservations"] == []
        status, _ = await call(old, "POST", "/slurm/v0.0.42/reservation", {"name": "r"})
        assert status == 404
        # The path exists for GET: the method is refused (aiohttp says 405).
        status, _ = await call(old, "DELETE", "/slurm/v0.0.42/reservation/r")
        assert status in (404, 405)
        paths = old.emulator.openapi_document()["paths"]
        assert not any(path.endswith("/reservation") for path in paths)
    async with run_slurm_emulator("new", clock=clock, slurm_version="26.05") as new:
        paths = new.emulator.openapi_document()["paths"]
        for version in ("v0.0.43", "v0.0.44", "v0.0.45"):
            assert "post" in paths[f"/slurm/{version}/reservation"]
            assert "delete" in paths[f"/slurm/{version}/reservation/{{reservation_name}}"]


async def test_rule_an_active_maint_reservation_shows_its_nodes_in_maintenance(
    sim: RunningSlurm,
) -> None:
    now = sim.emulator.clock.now()
    body = _body("maint-1", ["n-1"], now + 60, 30, ["MAINT", "IGNORE_JOBS"])
    status, answer = await call(sim, "POST", NEWEST + "/reservation", body)
    assert status == 200 and answer["errors"] == [], answer
    status, listed = await call(sim, "GET", NEWEST + "/reservations/")
    (entry,) = listed["reservations"]
    assert entry["name"] == "maint-1" and entry["node_list"] == "n-1"
    assert entry["flags"] == ["MAINT", "IGNORE_JOBS"]
    assert entry["end_time"]["number"] == int(now) + 60 + 30 * 60
    # Not yet started: the node is as it was.
    assert sim.emulator.node_state("n-1") == ["IDLE"]
    _advance(sim, 61)
    status, nodes = await call(sim, "GET", NEWEST + "/node/n-1")
    assert nodes["nodes"][0]["state"] == ["IDLE", "MAINTENANCE"]
    assert nodes["nodes"][0]["reservation"] == "maint-1"
    assert sim.emulator.node_state("n-2") == ["IDLE"]
    # Over: slurmctld purges it, the node is itself again.
    _advance(sim, 30 * 60)
    status, listed = await call(sim, "GET", NEWEST + "/reservations/")
    assert listed["reservations"] == []
    assert sim.emulator.node_state("n-1") == ["IDLE"]


async def test_rule_a_job_that_would_run_into_a_maint_reservation_does_not_start_there(
    sim: RunningSlurm,
) -> None:
    now = sim.emulator.clock.now()
    body = _body("maint-2", ["n-1", "n-2"], now + 600, 30, ["MAINT"])
    assert (await call(sim, "POST", NEWEST + "/reservation", body))[0] == 200
    long_job = {"name": "long", "script": "#!/bin/bash\nsleep 1", "time_limit": 20, "tasks": 1}
    short_job = {**long_job, "name": "short", "time_limit": 5}
    _, long_answer = await call(sim, "POST", NEWEST + "/job/submit", {"job": long_job})
    _, short_answer = await call(sim, "POST", NEWEST + "/job/submit", {"job": short_job})
    jobs = {job["name"]: job for job in (await call(sim, "GET", NEWEST + "/jobs/"))[1]["jobs"]}
    # 20 minutes from now runs into the window starting in 10: it waits; 5 minutes fits.
    assert jobs["long"]["job_state"] == ["PENDING"]
    assert jobs["short"]["job_state"] == ["RUNNING"]
    assert long_answer["job_id"] and short_answer["job_id"]


async def test_rule_a_reservation_needs_admin_a_new_name_and_jobs_out_of_the_way(
    sim: RunningSlurm,
) -> None:
    now = sim.emulator.clock.now()
    body = _body("maint-3", ["n-1"], now + 60, 30, ["MAINT"])
    status, answer = await call(sim, "POST", NEWEST + "/reservation", body, user="alice")
    assert status == 500 and answer["errors"][0]["error_number"] == 2010
    assert (await call(sim, "POST", NEWEST + "/reservation", body))[0] == 200
    status, answer = await call(sim, "POST", NEWEST + "/reservation", body)
    assert status == 500 and answer["errors"][0]["error_number"] == 2053
    # A running job without a time limit would outlive any start: refused without IGNORE_JOBS.
    job = {"name": "j", "script": "#!/bin/bash\nsleep infinity", "tasks": 1}
    job["required_nodes"] = "n-2"
    job["time_limit"] = {"set": False, "infinite": True, "number": 0}
    assert (await call(sim, "POST", NEWEST + "/job/submit", {"job": job}))[0] == 200
    busy = _body("maint-4", ["n-2"], now + 60, 30, ["MAINT"])
    status, answer = await call(sim, "POST", NEWEST + "/reservation", busy)
    assert status == 500 and answer["errors"][0]["error_number"] == 2016
    ignoring = _body("maint-4", ["n-2"], now + 60, 30, ["MAINT", "IGNORE_JOBS"])
    assert (await call(sim, "POST", NEWEST + "/reservation", ignoring))[0] == 200
    status, _ = await call(sim, "DELETE", NEWEST + "/reservation/maint-4")
    assert status == 200
    status, answer = await call(sim, "DELETE", NEWEST + "/reservation/maint-4")
    assert status == 500 and answer["errors"][0]["error_number"] == 2053
    status, answer = await call(sim, "POST", NEWEST + "/reservation", {**body, "flags": ["NOPE"]})
    assert status == 400
    stale = _body("maint-5", ["n-1"], now - 601, 30, ["MAINT"])
    status, answer = await call(sim, "POST", NEWEST + "/reservation", stale)
    assert status == 500 and answer["errors"][0]["error_number"] == 2054
