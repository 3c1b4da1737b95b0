"""docs/slurm-syncer.md rule 19: the job listing (`GET /jobs`, for `why pod` only) is read
once a poll's node states are published, in one try: a slow or failing slurmrestd answer to
it never holds a node state back, and the next poll is the retry."""

from __future__ import annotations

import asyncio

from clustersim.slurm import RunningSlurm
from nodeflow_bus import Bus
from nodeflow_contracts import codec
from nodeflow_contracts.slurm import SlurmClusterStatus
from slurm_syncer.syncer import Syncer
from tests.integration.slurm_syncer.conftest import (
    CLUSTER,
    FAST_CLIENT,
    FakeWatcher,
    KubeKV,
    eventually,
    slurm_conditions,
)
from tests.integration.slurm_syncer.test_syncer import setup_cluster, sleep_job, stored_state


async def cluster_status(bus: Bus) -> SlurmClusterStatus:
    kv = await bus.js.key_value("slurm_clusters")
    entry = await kv.get(CLUSTER)
    return codec.decode(SlurmClusterStatus, entry.value or b"", subject="kv")


async def busy_with_its_job_named(
    topology: Bus, slurm: RunningSlurm, kube: KubeKV, syncer: Syncer
) -> str:
    """gpu-001 runs a job, and the syncer's first poll (its job listing included) is over."""
    await setup_cluster(slurm, kube)
    job = str(slurm.cluster.submit_job(sleep_job("gpu-001"), "alice"))
    await syncer.start()
    await eventually(
        lambda: slurm_conditions(kube.pod("gpu-001")) == {"SlurmNodeStateAllocated": ""}
    )

    async def named() -> bool:
        return (await stored_state(topology, "gpu-001")).jobs == (job,)

    for _ in range(250):
        if await named():
            return job
        await asyncio.sleep(0.02)
    raise AssertionError("the first poll never named the job on gpu-001")


async def test_rule_a_held_job_listing_never_holds_back_the_polls_node_states(
    topology: Bus, slurm: RunningSlurm, kube: KubeKV, watcher: FakeWatcher, syncer: Syncer
) -> None:
    job = await busy_with_its_job_named(topology, slurm, kube, syncer)
    before = await stored_state(topology, "gpu-001")
    slow_jobs = slurm.emulator.intercept("/jobs", held=True)
    slurm.cluster.update_node("gpu-001", "root", ["DRAIN"], "bad DIMM (admin)", None)
    poll = asyncio.create_task(syncer.poll_once(CLUSTER))
    try:
        # Causality, not timing: while slurmctld holds this poll's job listing, the poll's
        # node state and cluster status are already in KV.
        await slow_jobs.arrived.wait()
        assert not poll.done()
        draining = await stored_state(topology, "gpu-001")
        assert draining.draining and draining.busy and draining.observed_at > before.observed_at
        # Named as of the last listing that answered, not as of this poll.
        assert (draining.jobs, draining.jobs_read_at) == ((job,), before.jobs_read_at)
        status = await cluster_status(topology)
        assert status.reachable and status.last_poll_at == draining.observed_at
    finally:
        slow_jobs.release()
        result = await poll
    assert result.ok and slow_jobs.requests == 1
    assert (await stored_state(topology, "gpu-001")).jobs == (job,)


async def test_rule_a_failing_job_listing_is_tried_once_per_poll_and_keeps_the_jobs_last_read(
    topology: Bus, slurm: RunningSlurm, kube: KubeKV, watcher: FakeWatcher, syncer: Syncer
) -> None:
    assert FAST_CLIENT.attempts > 1  # else one try would be the client's default anyway
    job = await busy_with_its_job_named(topology, slurm, kube, syncer)
    before = await stored_state(topology, "gpu-001")
    failing_jobs = slurm.emulator.intercept("/jobs", status=500)
    slurm.cluster.update_node("gpu-001", "root", ["DRAIN"], "bad DIMM (admin)", None)
    assert (await syncer.poll_once(CLUSTER)).ok
    assert failing_jobs.requests == 1
    assert (await syncer.poll_once(CLUSTER)).ok
    assert failing_jobs.requests == 2
    kept = await stored_state(topology, "gpu-001")
    assert kept.draining and kept.busy
    assert (kept.jobs, kept.jobs_read_at) == ((job,), before.jobs_read_at)
