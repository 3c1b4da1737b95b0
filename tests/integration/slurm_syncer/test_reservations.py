"""ScheduledUpdate's Slurm reservation end to end: slurm-syncer, over real NATS and HTTP to the
emulator of each Slurm release, creates the reservation of a NodeSet's update window over its
Slurm nodes, shows its nodes MAINTENANCE in it while it is active, deletes it once the NodeSet
no longer asks for it, never touches anyone else's, and on Slurm 24.11 (which cannot create
reservations) sends nothing and says which API version it speaks."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime

import pytest
from structlog.testing import capture_logs

from clustersim.slurm import SLURM_RELEASES, ManualClock, RunningSlurm
from nodeflow_bus import Bus
from nodeflow_contracts import codec, subjects
from nodeflow_contracts.nodeset import reservation_name
from nodeflow_contracts.slurm import SlurmNodeState
from nodeflow_contracts.topology import SLURM_NODES_BUCKET
from slurm_syncer.syncer import Syncer, SyncerOptions
from tests.integration.slurm_syncer.conftest import (
    CLUSTER,
    NAMESPACE,
    KubeKV,
    make_nodeset,
    slurm_client,
)
from tests.integration.slurm_syncer.test_freshness_and_absence import stored_status


@pytest.fixture
async def timed_syncer(
    topology: Bus, slurm: RunningSlurm, clock: ManualClock
) -> AsyncIterator[Syncer]:
    client = slurm_client(slurm)
    running = Syncer(
        topology,
        {CLUSTER: client},
        SyncerOptions(poll_interval=3600.0, registration_wait=0.0),
        clock=clock.now,
    )
    try:
        yield running
    finally:
        await running.stop()
        await client.close()


def scheduled(name: str, start: float, duration: str = "30m") -> dict[str, object]:
    nodeset = make_nodeset(name)
    stamp = datetime.fromtimestamp(start, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    nodeset["spec"]["updateStrategy"] = {
        "type": "ScheduledUpdate",
        "scheduledUpdate": {"startTime": stamp, "duration": duration, "flags": ["flex"]},
    }
    return nodeset


async def node_state(bus: Bus, name: str) -> SlurmNodeState:
    kv = await bus.js.key_value(SLURM_NODES_BUCKET)
    entry = await kv.get(subjects.slurm_node_key(CLUSTER, name))
    return codec.decode(SlurmNodeState, entry.value or b"", subject="kv")


async def test_rule_the_window_is_held_by_a_maint_reservation_over_the_nodesets_nodes(
    topology: Bus, slurm: RunningSlurm, kube: KubeKV, clock: ManualClock, timed_syncer: Syncer
) -> None:
    start = int(clock.now()) + 3600
    name = reservation_name(NAMESPACE, "w", start)
    await kube.put_nodeset(scheduled("w", start))
    await kube.put_nodeset(make_nodeset("k"))  # RollingUpdate: no reservation
    for node in ("w-000-001", "w-000-002", "k-000-001"):
        slurm.emulator.register_node(node, cpus=4, real_memory=8192, dynamic=True)
    writes = slurm.emulator.release.newest.writes_reservations
    if writes:  # someone else's maintenance: never ours to delete
        slurm.cluster.create_reservation(
            "root", "ops-maint", ["k-000-001"], start, 60, ["MAINT"], ["root"]
        )
    await timed_syncer.start()
    await timed_syncer.poll_once(CLUSTER)
    status = await stored_status(topology)
    assert status.api_version == slurm.emulator.release.newest.name
    if not writes:
        # Slurm 24.11: nothing is sent, nothing exists; the controller reads api_version.
        assert slurm.cluster.reservations == {}
        # The NodeSet's condition says it for good; the log says it once, not every poll.
        with capture_logs() as logs:
            await timed_syncer.poll_once(CLUSTER)
        assert not [e for e in logs if e["event"] == "syncer.reservations_unsupported"]
        return
    reservation = slurm.cluster.reservations[name]
    assert reservation.nodes == ("w-000-001", "w-000-002")
    assert reservation.flags == ("MAINT", "IGNORE_JOBS", "FLEX")
    assert (reservation.start, reservation.end) == (start, start + 1800)
    # A second poll (or a restarted syncer) finds it by name and creates nothing more.
    await timed_syncer.poll_once(CLUSTER)
    assert set(slurm.cluster.reservations) == {name, "ops-maint"}
    # Inside the window slurmctld shows the nodes in maintenance, under the reservation.
    clock.advance(3601)
    await timed_syncer.poll_once(CLUSTER)
    state = await node_state(topology, "w-000-001")
    assert "Maintenance" in state.flags and state.reservation == name
    # The NodeSet stops asking (another strategy): ours goes, the other stays.
    await kube.put_nodeset(make_nodeset("w"))
    await timed_syncer.poll_once(CLUSTER)
    assert set(slurm.cluster.reservations) == {"ops-maint"}
    await timed_syncer.poll_once(CLUSTER)  # the next listing reads the node freed
    state = await node_state(topology, "w-000-001")
    assert "Maintenance" not in state.flags and state.reservation == ""


# The releases whose slurmrestd creates reservations (26.05 here; 24.11 cannot, and the first
# test covers what it does instead): the tests below run only against them.
WRITING_RELEASES = sorted(
    version for version, release in SLURM_RELEASES.items() if release.newest.writes_reservations
)


@pytest.mark.parametrize("slurm", WRITING_RELEASES, indirect=True)
async def test_rule_a_window_that_is_over_gets_no_reservation_and_a_new_start_replaces_it(
    topology: Bus, slurm: RunningSlurm, kube: KubeKV, clock: ManualClock, timed_syncer: Syncer
) -> None:
    past = int(clock.now()) - 7200
    await kube.put_nodeset(scheduled("w", past))
    slurm.emulator.register_node("w-000-001", cpus=4, real_memory=8192, dynamic=True)
    await timed_syncer.start()
    await timed_syncer.poll_once(CLUSTER)
    assert slurm.cluster.reservations == {}
    first = int(clock.now()) + 600
    await kube.put_nodeset(scheduled("w", first))
    await timed_syncer.poll_once(CLUSTER)
    assert set(slurm.cluster.reservations) == {reservation_name(NAMESPACE, "w", first)}
    later = first + 86400
    await kube.put_nodeset(scheduled("w", later, "1h"))
    await timed_syncer.poll_once(CLUSTER)
    assert set(slurm.cluster.reservations) == {reservation_name(NAMESPACE, "w", later)}
    assert slurm.cluster.reservations[reservation_name(NAMESPACE, "w", later)].end == later + 3600


@pytest.mark.parametrize("slurm", WRITING_RELEASES, indirect=True)
async def test_rule_a_reservation_of_ours_left_from_before_a_restart_is_deleted_if_unasked(
    slurm: RunningSlurm, kube: KubeKV, clock: ManualClock, timed_syncer: Syncer
) -> None:
    """The NodeSet stopped asking (or was deleted) while slurm-syncer was down: the new process
    has never listed Slurm's reservations, so it lists them once and deletes ours."""
    start = int(clock.now()) + 3600
    left = reservation_name(NAMESPACE, "w", start)
    await kube.put_nodeset(make_nodeset("w"))  # RollingUpdate now: asks for no window
    slurm.emulator.register_node("w-000-001", cpus=4, real_memory=8192, dynamic=True)
    slurm.cluster.create_reservation(
        "root", left, ["w-000-001"], start, 30, ["MAINT", "IGNORE_JOBS"], ["root"]
    )
    slurm.cluster.create_reservation(
        "root", "ops-maint", ["w-000-001"], start, 60, ["MAINT"], ["root"]
    )
    await timed_syncer.start()
    await timed_syncer.poll_once(CLUSTER)
    assert set(slurm.cluster.reservations) == {"ops-maint"}
