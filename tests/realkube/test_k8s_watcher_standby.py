"""Rule: the standby is Ready, on a real API server. Two `python -m k8s_watcher` processes, as
a Deployment with replicas 2 runs them, both authenticated as k8s-watcher's ServiceAccount
with exactly the RBAC of k8s/rbac: the holder of the `k8s-watcher` lease mirrors, the other
only applies commands, and both are Ready (the standby asks the API server `GET /version`
itself), so the PodDisruptionBudget (minAvailable 1) allows one disruption and a drain or a
`maxUnavailable: 0` rollout proceeds. When the leader stops (a rollout replacing it), the
standby takes the mirror over and is still Ready."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import nats.js.errors
import pytest

from nodeflow_bus import Bus, ensure_topology
from nodeflow_contracts import subjects
from nodeflow_contracts.permissions import ADMIN_USER
from nodeflow_contracts.topology import CONSUMERS, KV_BUCKETS, STREAMS
from nodeflow_runtime.natsd import (
    NatsServerProcess,
    generate_users,
    user_credentials,
    write_password_files,
)
from tests.fixtures.nats import TEST_BUS_OPTIONS
from tests.integration.k8s_watcher.replicas import WatcherReplica, start_replica, stop_replicas
from tests.realkube.support import STEP_TIMEOUT, kubectl, until
from tests.realkube.watcher_identity import watcher_kubeconfig

pytestmark = pytest.mark.real_kube


@pytest.fixture
async def admin_bus_and_replicas(
    tmp_path: Path,
) -> AsyncIterator[tuple[Bus, list[WatcherReplica]]]:
    kubeconfig = await watcher_kubeconfig(tmp_path)
    users = generate_users()
    passwords = write_password_files(tmp_path / "credentials", users)
    server = NatsServerProcess(tmp_path / "nats", users=users)
    await server.start()
    replicas: list[WatcherReplica] = []
    bus: Bus | None = None
    try:
        bus = await Bus.connect(
            server.url, credentials=user_credentials(users, ADMIN_USER), options=TEST_BUS_OPTIONS
        )
        await ensure_topology(
            bus.js, streams=STREAMS, kv_buckets=KV_BUCKETS, consumers=CONSUMERS["k8s-watcher"]
        )
        for name in ("replica-a", "replica-b"):
            replicas.append(
                await start_replica(
                    name,
                    nats_url=server.url,
                    password_file=passwords["k8s-watcher"],
                    kubeconfig=kubeconfig,
                    log_dir=tmp_path,
                    KUBE_PROBE_INTERVAL_SECONDS="2",
                )
            )
        yield bus, replicas
        for replica in replicas:
            # Its RBAC was enough for every call, the probe included.
            assert "Forbidden" not in replica.log_file.read_text(errors="replace")
    finally:
        await stop_replicas(*replicas)
        if bus is not None:
            await bus.close()
        await server.kill()


async def wait_all_ready(replicas: list[WatcherReplica]) -> None:
    for replica in replicas:
        try:
            await until(replica.ready, f"{replica.name} Ready", timeout=STEP_TIMEOUT)
        except AssertionError:
            status, body = await replica.readiness()
            raise AssertionError(f"{replica.name}: {status} {body}\n{replica.log_tail()}") from None


async def test_rule_two_replicas_on_the_real_api_server_are_both_ready_one_mirroring(
    admin_bus_and_replicas: tuple[Bus, list[WatcherReplica]],
) -> None:
    bus, replicas = admin_bus_and_replicas
    await wait_all_ready(replicas)
    roles = [await replica.holds_mirror_lease() for replica in replicas]
    assert sorted(roles) == [False, True], roles
    leader = replicas[roles.index(True)]
    standby = replicas[roles.index(False)]
    assert "k8s_watcher.mirroring" not in standby.log_file.read_text()

    namespace = f"rk-standby-{uuid.uuid4().hex[:8]}"
    await kubectl("create", "namespace", namespace)
    try:
        # A PodDisruptionBudget like the chart's, mirrored by the leader alone.
        await kubectl(
            "-n", namespace, "create", "poddisruptionbudget", "watchers",
            "--selector=app=k8s-watcher", "--min-available=1",
        )  # fmt: skip
        kv = await bus.js.key_value(subjects.k8s_bucket("PodDisruptionBudget"))

        async def pdb_mirrored() -> bool:
            try:
                entry = await kv.get(subjects.object_key(namespace, "watchers"))
            except nats.js.errors.KeyNotFoundError:
                return False
            if not entry.value:
                return False
            return bool(msgspec.json.decode(entry.value)["spec"]["minAvailable"] == 1)

        await until(pdb_mirrored, "the new PodDisruptionBudget mirrored by the leader")

        # A rollout replaces the leader: the standby takes the mirror over and stays Ready.
        await stop_replicas(leader)
        await until(standby.holds_mirror_lease, "the standby holding the mirror's lease")
        await wait_all_ready([standby])
    finally:
        await kubectl("delete", "namespace", namespace, "--wait=false")
