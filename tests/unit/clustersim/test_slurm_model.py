"""The emulated slurmctld state machine, on a manual clock (no sleeping)."""

from __future__ import annotations

import pytest

from clustersim.slurm import errors as e
from clustersim.slurm.clock import ManualClock
from clustersim.slurm.errors import SlurmError
from clustersim.slurm.hostlist import compress, expand
from clustersim.slurm.model import JobRequest, Partition, SlurmCluster, script_run_seconds


def request(**overrides: object) -> JobRequest:
    fields: dict[str, object] = {
        "name": "job",
        "script": "#!/bin/bash\nsleep 30\n",
        "partition": None,
        "current_working_directory": "/tmp",
        "environment": ("PATH=/bin",),
        "time_limit_minutes": 1,
        "time_limit_infinite": False,
        "required_nodes": (),
        "minimum_nodes": 1,
        "cpus_per_node": 1,
        "exclusive": False,
    }
    fields.update(overrides)
    return JobRequest(**fields)  # type: ignore[arg-type]


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def cluster(clock: ManualClock) -> SlurmCluster:
    sim = SlurmCluster("test", clock, completing_seconds=2)
    for name in ("n-1", "n-2"):
        sim.register_node(name, cpus=4, real_memory=4096, gres="gpu:2")
    return sim


def state(cluster: SlurmCluster, name: str) -> list[str]:
    cluster.tick()
    return cluster.node_state(cluster.nodes[name])


def test_registered_node_is_idle(cluster: SlurmCluster) -> None:
    assert state(cluster, "n-1") == ["IDLE"]


def test_dynamic_node_shows_dynamic_norm(cluster: SlurmCluster) -> None:
    cluster.register_node("d-1", cpus=2, real_memory=100, dynamic=True)
    assert state(cluster, "d-1") == ["IDLE", "DYNAMIC_NORM"]


def test_job_makes_node_mixed_then_allocated(cluster: SlurmCluster) -> None:
    cluster.submit_job(request(required_nodes=("n-1",)), "alice")
    assert state(cluster, "n-1") == ["MIXED"]
    cluster.submit_job(request(required_nodes=("n-1",), cpus_per_node=3), "alice")
    assert state(cluster, "n-1") == ["ALLOCATED"]
    assert cluster.node_alloc_cpus(cluster.nodes["n-1"]) == 4


def test_exclusive_job_takes_every_cpu(cluster: SlurmCluster) -> None:
    cluster.submit_job(request(exclusive=True), "alice")
    assert state(cluster, "n-1") == ["ALLOCATED"]
    assert state(cluster, "n-2") == ["IDLE"]


def test_job_ends_with_script_then_completes_briefly(
    cluster: SlurmCluster, clock: ManualClock
) -> None:
    job_id = cluster.submit_job(request(script="#!/bin/bash\nsleep 3\n"), "alice")
    clock.advance(2.9)
    assert state(cluster, "n-1") == ["MIXED"]
    clock.advance(0.2)
    assert state(cluster, "n-1") == ["IDLE", "COMPLETING"]
    assert cluster.jobs[job_id].state == "COMPLETED"
    clock.advance(2)
    assert state(cluster, "n-1") == ["IDLE"]


def test_job_without_end_times_out_at_its_limit(cluster: SlurmCluster, clock: ManualClock) -> None:
    job_id = cluster.submit_job(request(script="#!/bin/bash\nsleep infinity\n"), "alice")
    clock.advance(59)
    cluster.tick()
    assert cluster.jobs[job_id].state == "RUNNING"
    clock.advance(1)
    cluster.tick()
    assert cluster.jobs[job_id].state == "TIMEOUT"
    assert cluster.jobs[job_id].end_time == cluster.jobs[job_id].submit_time + 60


def test_drain_on_busy_node_is_draining_then_drained(
    cluster: SlurmCluster, clock: ManualClock
) -> None:
    cluster.submit_job(request(required_nodes=("n-1",), exclusive=True), "alice")
    cluster.update_node("n-1", "root", ["DRAIN"], "nodeflow: maintenance", None)
    assert state(cluster, "n-1") == ["ALLOCATED", "DRAIN"]
    node = cluster.nodes["n-1"]
    assert (node.reason, node.reason_user, node.reason_time) == (
        "nodeflow: maintenance",
        "root",
        clock.now(),
    )
    clock.advance(30)
    assert state(cluster, "n-1") == ["IDLE", "DRAIN", "COMPLETING"]
    clock.advance(2)
    assert state(cluster, "n-1") == ["IDLE", "DRAIN"]
    cluster.update_node("n-1", "root", ["UNDRAIN"], None, None)
    assert state(cluster, "n-1") == ["IDLE"]
    # Slurm 24.11.5 keeps the old reason after UNDRAIN; only the flag says "drained".
    assert node.reason == "nodeflow: maintenance"


def test_drain_without_reason_is_accepted_and_records_the_user(cluster: SlurmCluster) -> None:
    cluster.update_node("n-1", "slurm", ["DRAIN"], None, None)
    assert state(cluster, "n-1") == ["IDLE", "DRAIN"]
    node = cluster.nodes["n-1"]
    assert (node.reason, node.reason_user, node.reason_time) == ("", "slurm", None)


def test_drained_node_gets_no_new_jobs(cluster: SlurmCluster) -> None:
    cluster.update_node("n-1", "root", ["DRAIN"], "busy elsewhere", None)
    job_id = cluster.submit_job(request(required_nodes=("n-1",)), "alice")
    job = cluster.jobs[job_id]
    assert job.state == "PENDING"
    assert job.state_reason == "ReqNodeNotAvail, UnavailableNodes:n-1"
    cluster.update_node("n-1", "root", ["RESUME"], None, None)
    assert job.state == "RUNNING"


def test_pending_job_waits_for_resources(cluster: SlurmCluster, clock: ManualClock) -> None:
    cluster.submit_job(request(minimum_nodes=2, exclusive=True), "alice")
    waiting = cluster.submit_job(request(exclusive=True), "bob")
    assert cluster.jobs[waiting].state_reason == "Resources"
    clock.advance(32)
    cluster.tick()
    assert cluster.jobs[waiting].state == "RUNNING"


def test_update_refusals(cluster: SlurmCluster) -> None:
    cases = [
        (("n-1", "alice", ["DRAIN"], "why", None), e.ESLURM_USER_ID_MISSING),
        (("nope", "root", ["DRAIN"], "why", None), e.ESLURM_INVALID_NODE_NAME),
        (("n-1", "root", ["RESUME"], None, None), e.ESLURM_INVALID_NODE_STATE),
        (("n-1", "root", ["MAINTENANCE"], "x", None), e.ESLURM_INVALID_NODE_STATE),
    ]
    for args, expected in cases:
        with pytest.raises(SlurmError) as caught:
            cluster.update_node(*args)
        assert caught.value.error_number == expected, args
        assert caught.value.description.startswith("Failure to update node")
    assert state(cluster, "n-1") == ["IDLE"]


def test_down_fails_running_jobs(cluster: SlurmCluster) -> None:
    job_id = cluster.submit_job(request(required_nodes=("n-1",)), "alice")
    cluster.update_node("n-1", "slurm", ["DOWN"], "bad gpu", None)
    assert cluster.jobs[job_id].state == "NODE_FAIL"
    assert state(cluster, "n-1") == ["DOWN", "COMPLETING"]


def test_lost_node_goes_down_and_returns_on_registration(
    cluster: SlurmCluster, clock: ManualClock
) -> None:
    job_id = cluster.submit_job(request(required_nodes=("n-2",)), "alice")
    cluster.mark_lost("n-2")
    clock.advance(5)
    assert state(cluster, "n-2") == ["DOWN", "NOT_RESPONDING"]
    node = cluster.nodes["n-2"]
    assert (node.reason, node.reason_user) == ("Not responding", "slurm")
    assert cluster.jobs[job_id].state == "NODE_FAIL"
    cluster.register_node("n-2", cpus=8, real_memory=4096)
    assert state(cluster, "n-2") == ["IDLE"]
    assert cluster.nodes["n-2"].cpus == 8 and node.reason == ""


def test_admin_down_survives_registration(cluster: SlurmCluster) -> None:
    cluster.update_node("n-1", "root", ["DOWN"], "hardware", None)
    cluster.register_node("n-1", cpus=4, real_memory=4096)
    assert state(cluster, "n-1") == ["DOWN"]


def test_drain_survives_loss_and_return(clock: ManualClock) -> None:
    cluster = SlurmCluster("t", clock, return_to_service=2)
    cluster.register_node("n-1", cpus=4, real_memory=4096)
    cluster.update_node("n-1", "root", ["DRAIN"], "nodeflow: keep", None)
    cluster.mark_lost("n-1")
    # As Slurm 24.11.5 does: the drain reason is kept and "Not responding" appended by slurm.
    node = cluster.nodes["n-1"]
    assert (node.reason, node.reason_user) == ("nodeflow: keep : Not responding", "slurm")
    cluster.register_node("n-1", cpus=4, real_memory=4096)
    assert state(cluster, "n-1") == ["IDLE", "DRAIN"]
    assert node.reason == "nodeflow: keep : Not responding"


def test_with_return_to_service_1_only_a_plain_not_responding_node_returns(
    cluster: SlurmCluster,
) -> None:
    # slurmctld returns a DOWN node on registration under ReturnToService=1 only when its
    # reason is exactly "Not responding"; a kept drain reason keeps it DOWN.
    cluster.update_node("n-1", "root", ["DRAIN"], "nodeflow: keep", None)
    cluster.mark_lost("n-1")
    cluster.register_node("n-1", cpus=4, real_memory=4096)
    assert state(cluster, "n-1") == ["DOWN", "DRAIN"]


def test_resumed_but_silent_node_goes_down_after_slurmd_timeout(clock: ManualClock) -> None:
    cluster = SlurmCluster("t", clock, slurmd_timeout=60)
    cluster.register_node("n-1", cpus=1, real_memory=1)
    cluster.mark_lost("n-1")
    cluster.update_node("n-1", "root", ["RESUME"], None, None)
    assert state(cluster, "n-1") == ["IDLE", "NOT_RESPONDING"]
    clock.advance(60)
    assert state(cluster, "n-1") == ["DOWN", "NOT_RESPONDING"]


def test_submit_validation(cluster: SlurmCluster) -> None:
    cases = [
        (request(script="  "), e.ESLURM_JOB_SCRIPT_MISSING),
        (request(partition="nope"), e.ESLURM_INVALID_PARTITION_NAME),
        (request(required_nodes=("ghost",)), e.ESLURM_INVALID_NODE_NAME),
        (request(minimum_nodes=3), e.ESLURM_REQUESTED_NODE_CONFIG_UNAVAILABLE),
        (request(cpus_per_node=5), e.ESLURM_REQUESTED_NODE_CONFIG_UNAVAILABLE),
    ]
    for job, expected in cases:
        with pytest.raises(SlurmError) as caught:
            cluster.submit_job(job, "alice")
        assert caught.value.error_number == expected


def test_partition_membership(clock: ManualClock) -> None:
    cluster = SlurmCluster("t", clock, partitions=[Partition("gpu", default=True)])
    cluster.register_node("g-1", cpus=2, real_memory=1, partitions=["gpu"])
    cluster.register_node("c-1", cpus=2, real_memory=1)
    assert cluster.node_partitions(cluster.nodes["g-1"]) == ["gpu"]
    with pytest.raises(SlurmError) as caught:
        cluster.submit_job(request(required_nodes=("c-1",)), "alice")
    assert caught.value.error_number == e.ESLURM_REQUESTED_NODES_NOT_IN_PARTITION


def test_cancel_rules(cluster: SlurmCluster, clock: ManualClock) -> None:
    job_id = cluster.submit_job(request(), "alice")
    with pytest.raises(SlurmError) as caught:
        cluster.cancel_job(job_id, "bob")
    assert caught.value.error_number == e.ESLURM_ACCESS_DENIED
    assert cluster.cancel_job(job_id, "alice") is True
    assert cluster.jobs[job_id].state == "CANCELLED"
    assert cluster.cancel_job(job_id, "root") is False
    with pytest.raises(SlurmError) as missing:
        cluster.cancel_job(12345, "root")
    assert missing.value.error_number == e.ESLURM_INVALID_JOB_ID


def test_finished_jobs_are_forgotten_after_min_job_age(clock: ManualClock) -> None:
    cluster = SlurmCluster("t", clock, min_job_age=10, completing_seconds=1)
    cluster.register_node("n-1", cpus=1, real_memory=1)
    job_id = cluster.submit_job(request(script="sleep 1"), "alice")
    clock.advance(5)
    cluster.tick()
    assert cluster.jobs[job_id].state == "COMPLETED"
    clock.advance(10)
    cluster.tick()
    assert job_id not in cluster.jobs


def test_script_durations() -> None:
    assert script_run_seconds("#!/bin/bash\nsleep 3\n") == (3.0, 0)
    assert script_run_seconds("sleep 1m 30\necho hi\nsleep 0.5") == (90.5, 0)
    assert script_run_seconds("sleep 2\nexit 3\nsleep 100") == (2.0, 3)
    assert script_run_seconds("sleep infinity") == (None, 0)
    assert script_run_seconds("# sleep 9\necho done") == (0.0, 0)


def test_hostlist_round_trip() -> None:
    names = ["a-001", "a-002", "a-003", "a-005", "gpu7", "login"]
    assert compress(names) == "a-[001-003,005],gpu7,login"
    assert expand("a-[001-003,005],gpu7,login") == names
    assert compress([]) == ""
