"""Rule: the standby is Ready. Two k8s-watcher processes (a Deployment with replicas 2): the
holder of the `k8s-watcher` lease mirrors, the other only applies commands and makes no API
call of its own between them, yet both report Ready, because each asks the API server itself
(GET /version) when nothing else has answered for KUBE_PROBE_INTERVAL_SECONDS. Without it the
standby stays "no answer yet" forever: the PodDisruptionBudget (minAvailable 1) then allows no
disruption and a node drain, a `maxUnavailable: 0` rollout or `helm upgrade --wait` hangs. The
same probe makes the standby not Ready while the API server is down, and Ready again after."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from nodeflow_bus.credentials import Secret
from nodeflow_runtime.natsd import NatsServerProcess, write_password_files
from tests.integration.k8s_watcher.conftest import Harness, node
from tests.integration.k8s_watcher.replicas import WatcherReplica, start_replica, stop_replicas
from tests.realkube.support import until

TIMEOUT = 30.0


@pytest.fixture
async def replicas(
    harness: Harness, nats_server: NatsServerProcess, nats_users: dict[str, Secret], tmp_path: Path
) -> AsyncIterator[list[WatcherReplica]]:
    passwords = write_password_files(tmp_path / "credentials", nats_users)
    started = [
        await start_replica(
            name,
            nats_url=nats_server.url,
            password_file=passwords["k8s-watcher"],
            kubeconfig=harness.server.kubeconfig_path,
            log_dir=tmp_path,
            KUBE_PROBE_INTERVAL_SECONDS="0.5",
        )
        for name in ("replica-a", "replica-b")
    ]
    try:
        yield started
    finally:
        await stop_replicas(*started)


async def leader_and_standby(replicas: list[WatcherReplica]) -> tuple[WatcherReplica, ...]:
    """(leader, standby) once both are Ready, each after its own /readyz."""
    for replica in replicas:
        try:
            await until(replica.ready, f"{replica.name} Ready", timeout=TIMEOUT)
        except AssertionError:
            status, body = await replica.readiness()
            raise AssertionError(f"{replica.name}: {status} {body}\n{replica.log_tail()}") from None
    roles = [await replica.holds_mirror_lease() for replica in replicas]
    assert sorted(roles) == [False, True], roles
    leader = replicas[roles.index(True)]
    standby = replicas[roles.index(False)]
    return leader, standby


async def test_rule_the_standby_is_ready_too_and_only_the_leader_mirrors(
    harness: Harness, replicas: list[WatcherReplica]
) -> None:
    leader, standby = await leader_and_standby(replicas)

    # The leader mirrors; the standby's readiness does not come from a mirror of its own.
    harness.store.create("nodes", node("gpu-standby-test"))

    async def mirrored() -> bool:
        return await harness.kv_get("Node", "_.gpu-standby-test") is not None

    await until(mirrored, "the new Node mirrored by the leader", timeout=TIMEOUT)
    assert await leader.holds_mirror_lease()
    assert not await standby.holds_mirror_lease()
    assert (await standby.readiness())[0] == 200
    assert "k8s_watcher.mirroring" in leader.log_file.read_text()
    assert "k8s_watcher.mirroring" not in standby.log_file.read_text()


async def test_rule_the_standby_is_not_ready_while_the_api_is_down_and_ready_once_back(
    harness: Harness, replicas: list[WatcherReplica]
) -> None:
    _, standby = await leader_and_standby(replicas)

    await harness.api_down()

    async def not_ready_for_the_api() -> bool:
        status, body = await standby.readiness()
        return status == 503 and "Kubernetes API" in body["reasons"].get("kubernetes", "")

    await until(not_ready_for_the_api, "the standby not Ready for the API", timeout=TIMEOUT)
    await harness.api_up()
    for replica in replicas:
        await until(replica.ready, f"{replica.name} Ready again", timeout=TIMEOUT)
