"""Rule (issue #35): every leader also holds a `coordination.k8s.io/v1` Lease named after its
NATS lease in the install namespace (holderIdentity = the instance id, renewTime,
leaseDurationSeconds = the NATS lease TTL), written through k8s-watcher's commands with the
service's own NATS user; the NATS lease stays the one that decides.

Real NATS with per-service authorization, a running k8s-watcher, the API emulator."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from typing import Any

import pytest

from clustersim.kube.errors import ApiError
from nodeflow_bus import Bus, LeaderLease
from nodeflow_bus.credentials import Secret
from nodeflow_bus.kube_lease import DEFAULT_LEASE_NAMESPACE, KubeLeaseTarget
from nodeflow_runtime.natsd import NatsServerProcess, user_credentials
from tests.fixtures.nats import TEST_BUS_OPTIONS
from tests.integration.k8s_watcher.conftest import Harness, violations_of, wait_until

TTL = 1.0


@pytest.fixture
async def mirrored_bus(
    nats_server: NatsServerProcess, nats_users: dict[str, Secret]
) -> AsyncIterator[Any]:
    """`await mirrored_bus(user)`: a Bus of `user` whose leases mirror into Kubernetes, as
    nodeflow_runtime connects each service."""
    opened: list[Bus] = []

    async def connect(user: str) -> Bus:
        options = dataclasses.replace(
            TEST_BUS_OPTIONS,
            name=f"as-{user}",
            kube_lease=KubeLeaseTarget(sender=user, namespace=DEFAULT_LEASE_NAMESPACE),
        )
        bus = await Bus.connect(
            nats_server.url, credentials=user_credentials(nats_users, user), options=options
        )
        opened.append(bus)
        return bus

    try:
        yield connect
    finally:
        for bus in opened:
            await bus.close()


def kube_lease(harness: Harness, name: str) -> dict[str, Any] | None:
    try:
        lease: dict[str, Any] = harness.store.get("leases", name, DEFAULT_LEASE_NAMESPACE)
    except ApiError:
        return None
    return lease


def holder_of(harness: Harness, name: str) -> str | None:
    lease = kube_lease(harness, name)
    return None if lease is None else lease["spec"].get("holderIdentity")


async def test_each_leader_holds_a_kubernetes_lease_named_after_its_service(
    harness: Harness, mirrored_bus: Any, nats_server: NatsServerProcess
) -> None:
    await harness.start_watcher()
    harness.store.create(
        "namespaces",
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": DEFAULT_LEASE_NAMESPACE}},
    )
    first = LeaderLease(
        await mirrored_bus("nodeset-controller"), "nodeset-controller", holder="replica-a", ttl=TTL
    )
    await first.start()
    await first.wait_until_leader(5.0)
    await wait_until(lambda: holder_of(harness, "nodeset-controller") == "replica-a")
    lease = kube_lease(harness, "nodeset-controller")
    assert lease is not None
    assert lease["spec"]["leaseDurationSeconds"] == 1
    acquired = lease["spec"]["renewTime"]
    assert lease["spec"]["acquireTime"] == acquired
    # Renewed while it leads.
    await wait_until(
        lambda: (kube_lease(harness, "nodeset-controller") or {})["spec"]["renewTime"] != acquired
    )

    # A follower does not write; on a graceful stop the holder empties it and the follower,
    # taking the NATS lease over, names itself.
    second = LeaderLease(
        await mirrored_bus("nodeset-controller"), "nodeset-controller", holder="replica-b", ttl=TTL
    )
    await second.start()
    assert holder_of(harness, "nodeset-controller") == "replica-a"
    await first.stop()
    await second.wait_until_leader(5.0)
    await wait_until(lambda: holder_of(harness, "nodeset-controller") == "replica-b")
    await second.stop()
    await wait_until(lambda: holder_of(harness, "nodeset-controller") == "")
    # Each sender's NATS user was enough (its commands are in its allow lists).
    assert violations_of(nats_server.log_file, "as-nodeset-controller") == []


async def test_k8s_watcher_mirrors_its_own_lease_through_its_executor(
    harness: Harness, mirrored_bus: Any
) -> None:
    """k8s-watcher sends its own Lease commands to itself, like every other service."""
    await harness.start_watcher()
    harness.store.create(
        "namespaces",
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": DEFAULT_LEASE_NAMESPACE}},
    )
    lease = LeaderLease(
        await mirrored_bus("k8s-watcher"), "k8s-watcher", holder="watcher-0", ttl=TTL
    )
    await lease.start()
    try:
        await wait_until(lambda: holder_of(harness, "k8s-watcher") == "watcher-0")
    finally:
        await lease.stop()
