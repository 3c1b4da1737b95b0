"""Two k8s-watcher replicas: both apply commands, only the holder of the `k8s-watcher` lease
mirrors the cluster into KV (two mirrors could write an older object over a newer one), and
the other takes the mirror over when the holder dies."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass

from k8s_watcher import SERVICE
from k8s_watcher.service import K8sWatcher, MirrorLeadership
from nodeflow_bus import LeaderLease
from nodeflow_contracts.k8s import ObjectRef, PatchObject
from tests.integration.k8s_watcher.conftest import Harness, node, wait_until

TTL = 1.0


@dataclass
class Replica:
    watcher: K8sWatcher
    lease: LeaderLease
    transitions: asyncio.Task[None]

    async def die(self) -> None:
        """As a killed process: no release of the lease, nothing handed over."""
        await self.lease.stop(release=False)
        self.transitions.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.transitions
        await self.watcher.stop(grace=1.0)


async def start_replica(harness: Harness, name: str) -> Replica:
    bus = await harness.connect_as("k8s-watcher")
    watcher = await K8sWatcher.connect(harness.config(instance_id=name), bus)
    await watcher.start_commands()
    mirror = MirrorLeadership(watcher)
    lease = LeaderLease(bus, SERVICE, holder=name, ttl=TTL)
    lease.add_listener(mirror.on_leadership)
    transitions = asyncio.create_task(mirror.run())
    await lease.start()
    return Replica(watcher, lease, transitions)


async def test_one_replica_mirrors_both_apply_commands_and_a_dead_mirror_is_taken_over(
    harness: Harness,
) -> None:
    first = await start_replica(harness, "replica-a")
    second = await start_replica(harness, "replica-b")
    replicas = [first, second]
    try:
        await wait_until(lambda: any(r.watcher.mirroring for r in replicas), timeout=10)
        mirrors = [r for r in replicas if r.watcher.mirroring]
        assert len(mirrors) == 1
        leader = mirrors[0]
        standby = second if leader is first else first
        await asyncio.wait_for(leader.watcher.wait_synced(), 10)

        harness.store.create("nodes", node("gpu-a"))

        async def mirrored(key: str) -> bool:
            return await harness.kv_get("Node", key) is not None

        for _ in range(200):
            if await mirrored("_.gpu-a"):
                break
            await asyncio.sleep(0.05)
        assert await mirrored("_.gpu-a")
        assert not standby.watcher.mirroring

        # Commands are applied by whichever replica fetches them, the standby included.
        await harness.send(
            ObjectRef(api_version="v1", kind="Node", name="gpu-a"),
            PatchObject(patch_type="merge", patch={"metadata": {"labels": {"seen": "yes"}}}),
        )
        await wait_until(
            lambda: harness.store.get("nodes", "gpu-a")["metadata"]["labels"].get("seen") == "yes"
        )

        await leader.die()
        replicas.remove(leader)
        await wait_until(lambda: standby.watcher.mirroring, timeout=10 * TTL)
        await asyncio.wait_for(standby.watcher.wait_synced(), 10)
        harness.store.create("nodes", node("gpu-b"))
        for _ in range(200):
            if await mirrored("_.gpu-b"):
                break
            await asyncio.sleep(0.05)
        assert await mirrored("_.gpu-b")
    finally:
        for replica in replicas:
            await replica.die()
