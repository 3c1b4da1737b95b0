"""Leader leases on KV: one leader, release hands over at once, a dead leader within the TTL."""

from __future__ import annotations

import asyncio
import time

from nodeflow_bus import Bus, LeaderLease, ensure_topology
from nodeflow_contracts.topology import LEASES_BUCKET, KVSpec
from nodeflow_runtime.natsd import NatsServerProcess
from tests.fixtures.nats import TEST_BUS_OPTIONS
from tests.integration.bus.conftest import eventually

TTL = 1.5


async def leases_bus(server: NatsServerProcess) -> Bus:
    bus = await Bus.connect(server.url, options=TEST_BUS_OPTIONS)
    await ensure_topology(
        bus.js,
        streams=[],
        kv_buckets=[KVSpec(bucket=LEASES_BUCKET, description="leases")],
        consumers=[],
    )
    return bus


async def test_one_leader_and_release_hands_over_at_once(nats_server: NatsServerProcess) -> None:
    buses = [await leases_bus(nats_server) for _ in range(3)]
    leases = [LeaderLease(bus, "ctrl", holder=f"r{i}", ttl=TTL) for i, bus in enumerate(buses)]
    transitions: list[tuple[str, bool]] = []
    for lease in leases:

        def record(gained: bool, holder: str = lease.holder) -> None:
            transitions.append((holder, gained))

        lease.add_listener(record)
        await lease.start()
    await eventually(lambda: sum(lease.is_leader for lease in leases) == 1)
    # Stays exactly one across several renewals.
    for _ in range(20):
        await asyncio.sleep(TTL / 10)
        assert sum(lease.is_leader for lease in leases) == 1
    leader = next(lease for lease in leases if lease.is_leader)
    released_at = time.monotonic()
    await leader.stop()
    await eventually(lambda: sum(lease.is_leader for lease in leases) == 1, timeout=TTL)
    assert time.monotonic() - released_at < TTL / 2
    assert (leader.holder, False) in transitions
    for lease in leases:
        if lease is not leader:
            await lease.stop()
    for bus in buses:
        await bus.close()


async def test_a_dead_leader_is_replaced_within_the_ttl(nats_server: NatsServerProcess) -> None:
    leader_bus = await leases_bus(nats_server)
    follower_bus = await leases_bus(nats_server)
    leader = LeaderLease(leader_bus, "ctrl", holder="leader", ttl=TTL)
    await leader.start()
    await leader.wait_until_leader(5)
    follower = LeaderLease(follower_bus, "ctrl", holder="follower", ttl=TTL)
    await follower.start()
    await asyncio.sleep(TTL * 1.5)
    assert leader.is_leader and not follower.is_leader

    # Crash: the task dies and the connection drops, nothing is released.
    await leader.stop(release=False)
    await leader_bus.nc.close()
    died_at = time.monotonic()
    await follower.wait_until_leader(TTL * 2)
    took = time.monotonic() - died_at
    assert took <= TTL + 0.3, f"takeover took {took:.2f}s"
    await follower.stop()
    await follower_bus.close()


async def test_a_stale_leader_loses_when_overtaken(nats_server: NatsServerProcess) -> None:
    bus_a = await leases_bus(nats_server)
    bus_b = await leases_bus(nats_server)
    a = LeaderLease(bus_a, "ctrl", holder="a", ttl=TTL)
    await a.start()
    await a.wait_until_leader(5)
    # Someone else overwrites the lease (as after a takeover a stale leader did not see).
    kv = await bus_b.js.key_value(LEASES_BUCKET)
    await kv.put("ctrl", b'{"holder":"b","renewed_at":0,"ttl_seconds":1.5}')
    await asyncio.wait_for(a.lost.wait(), TTL)
    assert not a.is_leader
    await a.stop()
    await bus_a.close()
    await bus_b.close()
