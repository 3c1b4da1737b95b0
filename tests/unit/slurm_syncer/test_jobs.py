"""The jobs on each node (`GET /jobs` -> node -> job ids, jobs.py) and how a node state
carries them: information for `why pod`, never a safety input, and no KV write of its own."""

from __future__ import annotations

import dataclasses
from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from clustersim.slurm import render
from clustersim.slurm.clock import ManualClock
from clustersim.slurm.model import JobRequest, SlurmCluster
from nodeflow_contracts.slurm import JOBS_KEPT, SlurmNodeState
from nodeflow_contracts.slurm_api import API_VERSIONS
from slurm_syncer.jobs import HOLDING_STATES, carry_jobs, jobs_by_node, with_jobs
from slurm_syncer.nodestate import apply_jobs, apply_poll, parse_node, same_state
from tests.conformance.slurm.openapi_facts import Captured, _Spec, captured_documents


def request(nodes: tuple[str, ...], script: str = "#!/bin/bash\nsleep 300\n") -> JobRequest:
    return JobRequest(
        name="train",
        script=script,
        partition=None,
        current_working_directory="/tmp",
        environment=("PATH=/bin",),
        time_limit_minutes=10,
        time_limit_infinite=False,
        required_nodes=nodes,
        minimum_nodes=len(nodes),
        cpus_per_node=1,
        exclusive=False,
    )


def job(job_id: Any, state: Any, nodes: str = "", **extra: Any) -> dict[str, Any]:
    return {"job_id": job_id, "job_state": state, "nodes": nodes, **extra}


@pytest.mark.parametrize("version", sorted(API_VERSIONS))
def test_rule_jobs_by_node_reads_every_api_versions_job_listing(version: str) -> None:
    """The emulator renders `/jobs` field for field as slurmrestd does for each version: a
    running job on one node, one across two (a hostlist), one completing (its epilog still
    holds n-3), one finished and one pending are read as the jobs holding each node."""
    clock = ManualClock()
    cluster = SlurmCluster("sim", clock, completing_seconds=5)
    for name in ("n-1", "n-2", "n-3", "n-4"):
        cluster.register_node(name, cpus=4, real_memory=4096)
    single = cluster.submit_job(request(("n-1",)), "alice")
    spread = cluster.submit_job(request(("n-1", "n-2")), "bob")
    done = cluster.submit_job(request(("n-4",), "#!/bin/bash\nsleep 1\n"), "dave")
    clock.advance(2)
    cluster.tick()
    clock.advance(4)  # `done` finished 5 s ago: its completing spell is over
    cluster.tick()
    ending = cluster.submit_job(request(("n-3",), "#!/bin/bash\nsleep 1\n"), "carol")
    clock.advance(2)
    cluster.tick()
    # Every node whole, while jobs run on three of them: it waits.
    pending = cluster.submit_job(
        dataclasses.replace(request(()), minimum_nodes=4, exclusive=True), "eve"
    )
    listing = [render.job(cluster, j, API_VERSIONS[version]) for j in cluster.jobs.values()]
    states = {entry["job_id"]: entry["job_state"] for entry in listing}
    assert "COMPLETING" in states[ending] and "COMPLETING" not in states[done]
    assert states[pending] == ["PENDING"]

    read = jobs_by_node(listing)

    assert read.malformed == []
    assert read.by_node == {
        "n-1": [str(single), str(spread)],
        "n-2": [str(spread)],
        "n-3": [str(ending)],
    }


def test_rule_jobs_by_node_expands_hostlists_and_keeps_only_jobs_that_hold_nodes() -> None:
    read = jobs_by_node(
        [
            job(4212, ["RUNNING"], "gpu-[001-003,007]"),
            job(4211, ["RUNNING"], "gpu-001"),
            job(4300, ["SUSPENDED"], "gpu-002"),
            job(4301, ["COMPLETED", "COMPLETING"], "gpu-003"),
            job(4302, "RUNNING", "cpu-1"),  # v0.0.38 and older: a plain string
            # `nodes` empty: job_resources.nodes.list names the same nodes (v0.0.41 on).
            job(4303, ["RUNNING"], "", job_resources={"nodes": {"list": "cpu-[2-3]"}}),
            job(4400, ["PENDING"], ""),
            job(4401, ["COMPLETED"], "gpu-004"),
            job(4402, ["CANCELLED"], "gpu-004"),
            job(4403, ["FAILED"], "gpu-004"),
        ]
    )
    assert read.malformed == []
    assert read.by_node == {
        "gpu-001": ["4211", "4212"],
        "gpu-002": ["4212", "4300"],
        "gpu-003": ["4212", "4301"],
        "gpu-007": ["4212"],
        "cpu-1": ["4302"],
        "cpu-2": ["4303"],
        "cpu-3": ["4303"],
    }


def test_rule_a_malformed_job_entry_is_named_and_skipped_the_others_are_read() -> None:
    read = jobs_by_node(
        [
            job(None, ["RUNNING"], "gpu-001"),
            job(1, None, "gpu-001"),
            job(2, ["RUNNING"], "gpu-[003-001]"),
            job(3, ["RUNNING"], ""),
            job(4, ["RUNNING"], "gpu-002"),
        ]
    )
    assert read.by_node == {"gpu-002": ["4"]}
    assert len(read.malformed) == 4
    assert "job 2: invalid hostlist 'gpu-[003-001]'" in read.malformed[2]
    assert read.malformed[3] == "job 3 holds nodes but names none"


def node(state: str = "ALLOCATED") -> dict[str, Any]:
    return {"name": "gpu-001", "state": [state], "cpus": 8, "alloc_cpus": 8}


def test_rule_a_state_keeps_the_first_job_ids_and_counts_them_all() -> None:
    ids = [str(i) for i in range(100, 100 + JOBS_KEPT + 5)]
    state = with_jobs(parse_node("a", node(), 1.0), ids, 1.0)
    assert state.jobs == tuple(ids[:JOBS_KEPT]) and state.jobs_total == JOBS_KEPT + 5
    assert state.jobs_read_at == 1.0


def test_rule_a_change_of_jobs_alone_is_not_published_but_a_busy_nodes_first_jobs_are() -> None:
    busy = parse_node("a", node(), 1.0)
    first = with_jobs(busy, ["4211"], 1.0)
    churned = with_jobs(busy, ["4212", "4213"], 2.0)
    # The first jobs of a busy node, or the last going while it stays busy: published.
    assert not same_state(busy, first)
    assert not same_state(first, with_jobs(busy, [], 2.0))
    # Other jobs on a node that stays busy: no write.
    assert same_state(first, churned)
    # An idle node's jobs never matter; any other change still does, jobs or not.
    idle = parse_node("a", node("IDLE"), 1.0)
    assert same_state(idle, with_jobs(idle, ["9"], 2.0))
    drained = parse_node("a", {**node(), "state": ["ALLOCATED", "DRAIN"]}, 2.0)
    assert not same_state(first, with_jobs(drained, ["4211"], 2.0))


def test_rule_a_poll_names_the_jobs_and_writes_nothing_for_job_churn() -> None:
    first = apply_poll("a", {}, [node()], 1.0, node_jobs={"gpu-001": ["4211", "4212"]})
    state = first.states["gpu-001"]
    assert first.changed == [state]
    assert (state.jobs, state.jobs_total, state.jobs_read_at) == (("4211", "4212"), 2, 1.0)
    churn = apply_poll("a", first.states, [node()], 2.0, node_jobs={"gpu-001": ["4213"]})
    assert churn.changed == []
    # The syncer's view holds the newest read: the next change publishes it.
    assert churn.states["gpu-001"].jobs == ("4213",)


def test_rule_a_failed_job_listing_keeps_the_jobs_last_read_and_when() -> None:
    first = apply_poll("a", {}, [node()], 1.0, node_jobs={"gpu-001": ["4211"]})
    failed = apply_poll("a", first.states, [node()], 2.0, node_jobs=None)
    assert failed.changed == []
    state = failed.states["gpu-001"]
    assert (state.jobs, state.jobs_read_at, state.observed_at) == (("4211",), 1.0, 2.0)
    # A one-node read-back (a drain) has no job listing either.
    read_back = parse_node("a", {**node(), "state": ["ALLOCATED", "DRAIN"]}, 3.0)
    assert carry_jobs(read_back, state).jobs == ("4211",)
    # A node that cannot be read names no job (nothing is known of it).
    unreadable = apply_poll("a", failed.states, None, 4.0)
    assert unreadable.states["gpu-001"].jobs == ()


def test_rule_a_job_listing_read_after_the_poll_names_every_node_but_publishes_only_changes() -> (
    None
):
    """The syncer reads the jobs once the poll's node states are out (apply_jobs): every node
    then holds the newest jobs, but only a busy node whose jobs became known or all went is
    published again; nothing but the jobs moves."""
    polled = apply_poll("a", {}, [node(), {**node("IDLE"), "name": "gpu-002"}], 1.0).states
    read = apply_jobs(polled, {"gpu-001": ["4211"], "gpu-002": ["9"]}, 2.0)
    assert read.changed == ["gpu-001"]
    busy, idle = read.states["gpu-001"], read.states["gpu-002"]
    assert (busy.jobs, busy.jobs_read_at, busy.observed_at) == (("4211",), 2.0, 1.0)
    assert idle.jobs == ("9",) and same_state(idle, polled["gpu-002"])
    churn = apply_jobs(read.states, {"gpu-001": ["4212"]}, 3.0)
    assert churn.changed == [] and churn.states["gpu-001"].jobs == ("4212",)
    gone = apply_jobs(churn.states, {}, 4.0)
    assert gone.changed == ["gpu-001"] and gone.states["gpu-001"].jobs == ()
    for name, state in gone.states.items():
        assert (state.busy, state.draining, state.drained) == (
            polled[name].busy,
            polled[name].draining,
            polled[name].drained,
        )


def test_rule_a_node_that_is_no_longer_busy_names_no_job_before_the_jobs_are_read() -> None:
    """A poll's node states are published before its job listing is read: a node whose jobs
    ended (drained) is not stored naming the jobs an older listing showed on it."""
    first = apply_poll("a", {}, [node()], 1.0, node_jobs={"gpu-001": ["4211"]})
    drained = apply_poll("a", first.states, [{**node(), "state": ["IDLE", "DRAIN"]}], 2.0)
    state = drained.states["gpu-001"]
    assert drained.changed == [state] and state.drained
    assert (state.jobs, state.jobs_total, state.jobs_read_at) == ((), 0, 0.0)
    read_back = parse_node("a", {**node(), "state": ["IDLE", "DRAIN"]}, 3.0)
    assert carry_jobs(read_back, first.states["gpu-001"]).jobs == ()


NODE_STATES = st.lists(
    st.sampled_from(["IDLE", "MIXED", "ALLOCATED", "DOWN", "DRAIN", "COMPLETING"]),
    min_size=1,
    max_size=3,
)
JOB_IDS = st.none() | st.lists(st.integers(1, 10**6).map(str), max_size=30)


@given(NODE_STATES, JOB_IDS, JOB_IDS)
def test_rule_jobs_never_change_what_a_poll_makes_of_a_node(
    words: list[str], before: list[str] | None, now: list[str] | None
) -> None:
    """Safety: busy/drained/draining (what deletes a pod) are the node's own word, whatever
    jobs were (or were not) read on it, this poll or the last."""
    raw = {**node(), "state": words}
    bare = apply_poll("a", {}, [raw], 2.0).states["gpu-001"]
    previous = apply_poll(
        "a", {}, [raw], 1.0, node_jobs=None if before is None else {"gpu-001": before}
    ).states
    read = apply_poll(
        "a", previous, [raw], 2.0, node_jobs=None if now is None else {"gpu-001": now}
    ).states["gpu-001"]
    without_jobs = msgspec.structs.replace(read, jobs=(), jobs_total=0, jobs_read_at=0.0)
    assert without_jobs == bare
    assert isinstance(read, SlurmNodeState)


DOCUMENTS = [captured for captured in captured_documents() if captured.version in API_VERSIONS]


@pytest.mark.parametrize(
    "captured", DOCUMENTS, ids=lambda captured: f"{captured.release}-{captured.version}"
)
def test_rule_the_job_fields_read_have_these_shapes_in_every_real_openapi_document(
    captured: Captured,
) -> None:
    """What jobs_by_node reads, as the slurmrestd of Slurm 24.11.5 and 26.05.5 documents
    `GET /jobs` for each version we speak: an integer `job_id`, a `job_state` list whose words
    include those that hold a node, a hostlist string `nodes` and `job_resources.nodes.list`."""
    spec = _Spec(captured.document, captured.version)
    job_schema = spec.items(spec.properties(spec.answer("jobs", "get"))["jobs"])
    fields = spec.properties(job_schema)
    assert spec.resolve(fields["job_id"])["type"] == "integer"
    job_state = spec.resolve(fields["job_state"])
    assert job_state["type"] == "array"
    assert set(spec.items(job_state)["enum"]) >= HOLDING_STATES
    assert spec.resolve(fields["nodes"])["type"] == "string"
    resources = spec.properties(fields["job_resources"])
    listed = spec.properties(resources["nodes"])["list"]
    assert spec.resolve(listed)["type"] == "string"
