"""slurmrestd behaviours Nodeflow relies on, checked against any server, per API version.

Runs against the emulator (as Slurm 24.11 and 26.05, each API version they serve) by default
and against a real Slurm when NODEFLOW_SLURM_URL is set (see conftest.py). The entries'
fields are checked against the version's record (nodeflow_contracts.slurm_api): none outside
it, and every field the syncer reads present (the emulator's entries are held to exactly the
record's fields by tests/unit/clustersim/test_slurm_versions.py). Nothing here touches emulator
internals.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import jwt
import pytest

from clustersim.slurm import SLURM_RELEASES
from nodeflow_contracts.slurm_api import ERROR_FIELDS, NODE_FIELDS_READ, versions_in_openapi
from slurm_syncer.auth import StaticToken
from slurm_syncer.client import SlurmClient
from slurm_syncer.jobs import jobs_by_node
from tests.conformance.slurm.support import (
    BASE_STATES,
    BUSY_BASES,
    SLEEP_SCRIPT,
    Json,
    SlurmTarget,
    base,
    flags,
    free_node,
    our_reason,
    require,
    restore,
    wait_for,
)

NO_VAL_KEYS = {"set", "infinite", "number"}


def assert_no_val(value: Any) -> None:
    assert isinstance(value, dict) and set(value) == NO_VAL_KEYS, value
    assert isinstance(value["set"], bool) and isinstance(value["infinite"], bool)
    assert isinstance(value["number"], int)


def assert_meta(body: Json, slurm: SlurmTarget) -> None:
    meta = body["meta"]
    version = meta["slurm"]["version"]
    assert isinstance(version["micro"], str)
    if slurm.release is not None:
        assert f"{version['major']}.{version['minor']}" == slurm.release, version
        assert meta["slurm"]["release"].startswith(slurm.release)
    assert meta["plugin"]["data_parser"] == slurm.api.data_parser
    assert isinstance(body["errors"], list) and isinstance(body["warnings"], list)


async def test_openapi_lists_the_version(slurm: SlurmTarget) -> None:
    document = await slurm.openapi()
    assert slurm.api.name in versions_in_openapi(document)
    paths = {path.rstrip("/") for path in document["paths"]}
    for tail in ("ping", "nodes", "node/{node_name}", "jobs", "job/{job_id}", "job/submit"):
        assert f"{slurm.api.prefix}/{tail}" in paths, tail


async def test_ping(slurm: SlurmTarget) -> None:
    body = (await slurm.request("GET", "/ping")).ok()
    assert_meta(body, slurm)
    assert body["pings"], body
    for ping in body["pings"]:
        assert set(ping) <= slurm.api.ping_fields, ping
        assert isinstance(ping["hostname"], str)
        # v0.0.42 added `responding`; v0.0.45 dropped `pinged`.
        if "responding" in ping:
            assert ping["responding"] is True, ping
        if "pinged" in ping:
            assert ping["pinged"] == "UP", ping


async def test_nodes_list_shape(slurm: SlurmTarget) -> None:
    body = (await slurm.request("GET", "/nodes")).ok()
    assert_meta(body, slurm)
    assert_no_val(body["last_update"])
    listed = {node["name"]: node for node in body["nodes"]}
    assert set(slurm.nodes) <= set(listed), (slurm.nodes, sorted(listed))
    for name in slurm.nodes:
        node = listed[name]
        # Nothing outside the version's schema, and everything the syncer reads.
        assert set(node) <= slurm.api.node_fields, sorted(set(node) - slurm.api.node_fields)
        assert set(NODE_FIELDS_READ) <= set(node), sorted(set(NODE_FIELDS_READ) - set(node))
        assert set(node["state"]) <= slurm.api.node_states, node["state"]
        for key in ("hostname", "address", "reason", "reason_set_by_user", "gres", "comment"):
            assert isinstance(node[key], str), (key, node[key])
        for key in ("cpus", "alloc_cpus", "alloc_idle_cpus", "real_memory"):
            assert isinstance(node[key], int), (key, node[key])
        assert_no_val(node["reason_changed_at"])
        assert isinstance(node["partitions"], list)
        state = node["state"]
        assert isinstance(state, list) and state and all(isinstance(s, str) for s in state)
        assert base(state) in BASE_STATES, state
        assert not (flags(state) & BASE_STATES), state


async def test_single_node_matches_list(slurm: SlurmTarget) -> None:
    name = slurm.nodes[0]
    node = await slurm.node(name)
    assert node["name"] == name and node["cpus"] >= 1


async def test_drain_idle_node_then_undrain(slurm: SlurmTarget) -> None:
    name = await free_node(slurm)
    reason = our_reason("idle drain")
    before = time.time()
    try:
        (await slurm.update_node(name, state=["DRAIN"], reason=reason)).ok()
        node = await slurm.node(name)
        assert base(node["state"]) == "IDLE" and "DRAIN" in flags(node["state"]), node["state"]
        assert node["reason"] == reason
        assert node["reason_set_by_user"] == slurm.user
        changed = node["reason_changed_at"]
        assert changed["set"] and changed["number"] >= int(before) - 5, changed

        (await slurm.update_node(name, state=["UNDRAIN"])).ok()
        node = await slurm.node(name)
        assert "DRAIN" not in flags(node["state"]), node["state"]
        assert base(node["state"]) == "IDLE"
        # Slurm 24.11.5 leaves the reason in place after UNDRAIN: only the flag counts.
        assert node["reason"] in ("", reason)
    finally:
        await restore(slurm, name)


async def test_resume_clears_drain(slurm: SlurmTarget) -> None:
    name = await free_node(slurm)
    try:
        (await slurm.update_node(name, state=["DRAIN"], reason=our_reason("resume"))).ok()
        (await slurm.update_node(name, state=["RESUME"])).ok()
        node = await slurm.node(name)
        assert base(node["state"]) == "IDLE" and "DRAIN" not in flags(node["state"])
    finally:
        await restore(slurm, name)


async def test_drain_busy_node_drains_then_is_drained(slurm: SlurmTarget) -> None:
    name = await free_node(slurm)
    reason = our_reason("busy drain")
    job_id = await slurm.submit(
        "nodeflow-conformance-busy", SLEEP_SCRIPT.format(seconds=6), required_nodes=[name]
    )
    try:

        async def running() -> Json | None:
            job = await slurm.job(job_id)
            return job if job and job["job_state"] == ["RUNNING"] else None

        job = await wait_for(running, f"job {job_id} to run on {name}")
        assert job["nodes"] == name, job["nodes"]
        # slurm-syncer reads this entry as the job holding the node (its jobs.py).
        assert jobs_by_node([job]).by_node == {name: [str(job["job_id"])]}, job
        (await slurm.update_node(name, state=["DRAIN"], reason=reason)).ok()
        node = await slurm.node(name)
        assert base(node["state"]) in BUSY_BASES and "DRAIN" in flags(node["state"]), node
        assert node["reason"] == reason

        async def drained() -> Json | None:
            node = await slurm.node(name)
            state = node["state"]
            done = base(state) == "IDLE" and flags(state) & {"DRAIN", "COMPLETING"} == {"DRAIN"}
            return node if done else None

        node = await wait_for(drained, f"{name} to be IDLE+DRAIN after job {job_id}")
        assert node["alloc_cpus"] == 0 and node["reason"] == reason
        job = await slurm.job(job_id)
        assert job is None or "COMPLETED" in job["job_state"], job
    finally:
        await slurm.cancel(job_id)
        await restore(slurm, name)


async def test_submit_list_get_cancel_job(slurm: SlurmTarget) -> None:
    job_id = await slurm.submit("nodeflow-conformance-cancel", SLEEP_SCRIPT.format(seconds=50))
    listed = await slurm.job(job_id)
    assert listed is not None, f"job {job_id} not in /jobs"
    assert set(listed) <= slurm.api.job_fields, sorted(set(listed) - slurm.api.job_fields)
    assert listed["name"] == "nodeflow-conformance-cancel"
    assert listed["user_name"] == slurm.user
    assert_no_val(listed["time_limit"])
    assert listed["time_limit"]["number"] == 1
    assert listed["job_state"][0] in {"PENDING", "RUNNING"}, listed["job_state"]
    single = (await slurm.request("GET", f"/job/{job_id}")).ok()
    assert [job["job_id"] for job in single["jobs"]] == [job_id]

    (await slurm.cancel(job_id)).ok()

    async def cancelled() -> bool:
        job = await slurm.job(job_id)
        return job is None or job["job_state"][0] == "CANCELLED"

    await wait_for(cancelled, f"job {job_id} to be cancelled")


async def test_short_job_completes(slurm: SlurmTarget) -> None:
    job_id = await slurm.submit("nodeflow-conformance-short", SLEEP_SCRIPT.format(seconds=1))

    async def completed() -> Json | None:
        job = await slurm.job(job_id)
        return job if job and job["job_state"] == ["COMPLETED"] else None

    job = await wait_for(completed, f"job {job_id} to complete")
    assert job["exit_code"]["return_code"]["number"] == 0


async def test_missing_token_is_401(slurm: SlurmTarget) -> None:
    reply = await slurm.request("GET", "/nodes", headers={})
    assert reply.status == 401, (reply.status, reply.text[:200])


async def test_bad_token_is_refused(slurm: SlurmTarget) -> None:
    forged = jwt.encode(
        {"sun": slurm.user, "iat": int(time.time()), "exp": int(time.time()) + 600},
        b"not-the-cluster-key-not-the-cluster-key",
        algorithm="HS256",
    )
    for token in (forged, "garbage"):
        reply = await slurm.request("GET", "/nodes", headers=slurm.headers(token=token))
        assert reply.status >= 400 and reply.status != 404, (reply.status, reply.text[:300])
        assert not (reply.body or {}).get("nodes"), "a refused request leaked node data"


async def test_expired_token_is_refused(slurm: SlurmTarget) -> None:
    require(slurm.jwt_key, "NODEFLOW_SLURM_JWT_KEY is needed to mint an expired token")
    assert slurm.jwt_key is not None
    now = int(time.time())
    expired = jwt.encode(
        {"sun": slurm.user, "iat": now - 7200, "exp": now - 3600}, slurm.jwt_key, "HS256"
    )
    reply = await slurm.request("GET", "/nodes", headers=slurm.headers(token=expired))
    assert reply.status >= 400 and reply.status != 404, (reply.status, reply.text[:300])
    assert not (reply.body or {}).get("nodes")


async def test_non_admin_cannot_update_node(slurm: SlurmTarget) -> None:
    require(slurm.non_admin, "NODEFLOW_SLURM_NONADMIN_USER/_TOKEN are not set")
    assert slurm.non_admin is not None
    user, token = slurm.non_admin
    name = await free_node(slurm)
    try:
        reply = await slurm.request(
            "POST",
            f"/node/{name}",
            {"state": ["DRAIN"], "reason": our_reason("non-admin")},
            headers=slurm.headers(user, token),
        )
        assert reply.refused() and reply.errors, (reply.status, reply.text[:300])
        assert all(isinstance(error.get("description"), str) for error in reply.errors)
        node = await slurm.node(name)
        assert "DRAIN" not in flags(node["state"]), node["state"]
    finally:
        await restore(slurm, name)


async def test_drain_without_reason_is_accepted(slurm: SlurmTarget) -> None:
    # Only scontrol insists on a reason; slurmrestd 24.11.5 drains without one.
    name = await free_node(slurm)
    try:
        (await slurm.update_node(name, state=["DRAIN"])).ok()
        node = await slurm.node(name)
        assert "DRAIN" in flags(node["state"]), node["state"]
        # Who is recorded for a reason-less drain depends on the node's history in real
        # Slurm (the previous reason may be kept), so only acceptance is asserted.
    finally:
        await restore(slurm, name)


async def test_resume_on_an_undrained_node_is_an_error(slurm: SlurmTarget) -> None:
    name = await free_node(slurm)
    reply = await slurm.update_node(name, state=["RESUME"])
    assert reply.refused(), (reply.status, reply.text[:300])
    # 24.11.5: 2028 (invalid node state); 26.05.5: 2180 (invalid node state transition).
    expected = {release.invalid_resume_error for release in SLURM_RELEASES.values()}
    release = SLURM_RELEASES.get(slurm.release or "")
    if release is not None:
        expected = {release.invalid_resume_error}
    numbers = [error["error_number"] for error in reply.errors]
    assert len(numbers) == 1 and numbers[0] in expected, reply.errors


async def test_unknown_node_is_an_error(slurm: SlurmTarget) -> None:
    missing = "nodeflow-no-such-node"
    reply = await slurm.request("GET", f"/node/{missing}")
    assert reply.refused() and reply.errors, (reply.status, reply.text[:300])
    assert not (reply.body or {}).get("nodes")
    update = await slurm.update_node(missing, state=["DRAIN"], reason=our_reason("missing"))
    assert update.refused() and update.errors, (update.status, update.text[:300])


async def test_submit_answer_has_the_version_fields(slurm: SlurmTarget) -> None:
    desc = {
        "name": "nodeflow-conformance-answer",
        "script": SLEEP_SCRIPT.format(seconds=30),
        "time_limit": {"set": True, "infinite": False, "number": 1},
        "current_working_directory": "/tmp",
        "environment": ["PATH=/usr/bin:/bin"],
    }
    body = (await slurm.request("POST", "/job/submit", {"job": desc})).ok()
    try:
        # v0.0.41 has a `result` object beside job_id; v0.0.42 dropped it.
        assert set(body) <= slurm.api.job_submit_fields, sorted(body)
        assert ("result" in body) == ("result" in slurm.api.job_submit_fields), sorted(body)
    finally:
        await slurm.cancel(int(body["job_id"]))


async def test_error_entries_have_the_version_fields(slurm: SlurmTarget) -> None:
    reply = await slurm.request("GET", "/job/999999999")
    assert reply.errors, (reply.status, reply.text[:300])
    for error in reply.errors:
        assert set(error) <= ERROR_FIELDS, error
        assert isinstance(error["description"], str) and isinstance(error["error_number"], int)


async def test_unknown_job_is_an_error(slurm: SlurmTarget) -> None:
    reply = await slurm.request("GET", "/job/999999999")
    assert reply.refused() and reply.errors, (reply.status, reply.text[:300])


async def test_scheduled_update_reservation_through_the_syncer_client(slurm: SlurmTarget) -> None:
    """What ScheduledUpdate relies on, through slurm-syncer's own client speaking this version:
    from v0.0.43 on a MAINT reservation is created over a node (`POST /reservation`), listed,
    shows the node MAINTENANCE with the reservation's name while active, and is deleted
    (`DELETE /reservation/{name}`); before, the document has no such path and the client
    refuses without sending anything."""
    document = await slurm.openapi()
    paths = {path.rstrip("/"): methods for path, methods in document["paths"].items()}
    client = SlurmClient(
        "conformance",
        slurm.url,
        StaticToken(slurm.user, value=slurm.token),
        api_version=slurm.api.name,
    )
    name = f"nodeflow-conformance-{uuid.uuid4().hex[:8]}"
    try:
        if not slurm.api.writes_reservations:
            assert "post" not in paths.get(f"{slurm.api.prefix}/reservation", {})
            with pytest.raises(ValueError, match="cannot create reservations"):
                await client.create_reservation(name, [slurm.nodes[0]], int(time.time()), 5, [])
            assert isinstance(await client.list_reservations(), list)
            return
        node = await free_node(slurm)
        flags_sent = ["MAINT", "IGNORE_JOBS"]
        await client.create_reservation(name, [node], int(time.time()), 5, flags_sent)
        try:
            listed = {r["name"]: r for r in await client.list_reservations()}
            assert name in listed, sorted(listed)
            assert set(flags_sent) <= set(listed[name]["flags"]), listed[name]["flags"]

            async def held() -> Json | None:
                entry = await client.get_node(node)
                if entry is None or "MAINTENANCE" not in entry["state"]:
                    return None
                return entry if entry.get("reservation") == name else None

            await wait_for(held, f"{node} MAINTENANCE under {name}")
        finally:
            await client.delete_reservation(name)
        assert name not in {r["name"] for r in await client.list_reservations()}
    finally:
        await client.close()
