"""Leader leases on KV: one leader, release hands over at once, a dead leader after its TTL,
no identity shortcut. How long a takeover takes is measured by `python -m bench bus`."""

from __future__ import annotations

import asyncio

from nodeflow_bus import Bus, LeaderLease, ensure_topology
from nodeflow_bus.lease import LeaseRecord
from nodeflow_contracts import codec
from nodeflow_contracts.topology import LEASES_BUCKET, KVSpec
from nodeflow_runtime.natsd import NatsServerProcess
from tests.fixtures.nats import TEST_BUS_OPTIONS, PausableProxy
from tests.fixtures.waiting import eventually

TTL = 1.5


async def leases_bus(server: NatsServerProcess | PausableProxy) -> Bus:
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
    await leader.stop()
    await eventually(lambda: sum(lease.is_leader for lease in leases) == 1, timeout=TTL * 4)
    successor = next(lease for lease in leases if lease.is_leader)
    # Created anew on the deleted key, not taken over after waiting out the TTL.
    assert successor.last_transition == "created"
    assert (leader.holder, False) in transitions
    for lease in leases:
        if lease is not leader:
            await lease.stop()
    for bus in buses:
        await bus.close()


async def test_a_dead_leader_is_replaced_once_its_lease_expires(
    nats_server: NatsServerProcess,
) -> None:
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
    await follower.wait_until_leader(TTL * 6)
    assert follower.last_transition == "took over"
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


async def test_a_partitioned_leader_steps_down_before_the_follower_takes_over(
    nats_server: NatsServerProcess, nats_proxy: PausableProxy
) -> None:
    leader_bus = await leases_bus(nats_proxy)
    follower_bus = await leases_bus(nats_server)
    leader = LeaderLease(leader_bus, "ctrl", holder="leader", ttl=TTL)
    follower = LeaderLease(follower_bus, "ctrl", holder="follower", ttl=TTL)
    events: list[tuple[str, bool]] = []
    leader.add_listener(lambda gained: events.append(("leader", gained)))
    follower.add_listener(lambda gained: events.append(("follower", gained)))
    await leader.start()
    await leader.wait_until_leader(5)
    await follower.start()
    await asyncio.sleep(TTL / 2)

    # The leader's requests now hang (sockets open, nothing answered); the follower is fine.
    nats_proxy.pause()
    await follower.wait_until_leader(TTL * 6)
    # The leader stepped down before the follower took over (the gap between the two is
    # measured by the bench).
    assert events == [("leader", True), ("leader", False), ("follower", True)]
    assert not leader.is_leader and follower.is_leader

    await follower.stop()
    await follower_bus.close()
    await leader.stop(release=False)
    nats_proxy.resume()
    await leader_bus.close()


async def test_a_lost_renewal_reply_does_not_make_the_leader_flap(
    nats_server: NatsServerProcess,
) -> None:
    bus = await leases_bus(nats_server)
    lease = LeaderLease(bus, "ctrl", holder="solo", ttl=TTL)
    transitions: list[bool] = []
    lease.add_listener(transitions.append)
    await lease.start()
    await lease.wait_until_leader(5)
    assert lease._kv is not None
    kv = lease._kv
    real_update = kv.update
    lost_replies: list[int] = []

    async def reply_lost_once(key: str, value: bytes, last: int | None = None) -> int:
        revision = await real_update(key, value, last=last)
        if not lost_replies:
            # Written, but the reply never reaches the leader.
            lost_replies.append(revision)
            raise TimeoutError("reply lost")
        return revision

    kv.update = reply_lost_once  # type: ignore[method-assign,assignment]
    await asyncio.sleep(TTL * 2)
    assert lost_replies, "no renewal happened"
    assert transitions == [True]
    assert lease.is_leader
    await lease.stop()
    await bus.close()


async def test_a_restarted_process_waits_the_ttl_for_a_lease_in_its_own_name(
    nats_server: NatsServerProcess,
) -> None:
    bus = await leases_bus(nats_server)
    old = LeaderLease(bus, "ctrl", holder="controller-0", ttl=TTL)
    await old.start()
    await old.wait_until_leader(5)
    # kill -9: nothing released, the key still names "controller-0".
    await old.stop(release=False)
    kv = await bus.js.key_value(LEASES_BUCKET)
    restarted = LeaderLease(bus, "ctrl", holder="controller-0", ttl=TTL)
    await restarted.start()
    # Whoever still renews the old record (the old process was only slow, or a twin was given
    # the same INSTANCE_ID) keeps the lease: the restarted one must not take it on its name.
    entry = await kv.get("ctrl")
    revision = entry.revision
    for _ in range(3 * 6):
        await asyncio.sleep(TTL / 6)
        assert not restarted.is_leader and not restarted.gained.is_set()
        revision = await kv.update("ctrl", entry.value or b"", last=revision)
    # Once the old record stops changing it is taken over like anyone else's.
    await restarted.wait_until_leader(TTL * 6)
    assert restarted.last_transition == "took over"
    await restarted.stop()
    await bus.close()


async def test_two_replicas_with_one_instance_id_never_both_lead(
    nats_server: NatsServerProcess,
) -> None:
    buses = [await leases_bus(nats_server) for _ in range(2)]
    twins = [LeaderLease(bus, "ctrl", holder="same-name", ttl=TTL) for bus in buses]
    for twin in twins:
        await twin.start()
    await eventually(lambda: any(twin.is_leader for twin in twins), timeout=TTL * 4)
    # Across many renewals (each of which compares the writer's token), never two leaders.
    for _ in range(4 * 10):
        await asyncio.sleep(TTL / 10)
        assert sum(twin.is_leader for twin in twins) == 1
    kv = await buses[0].js.key_value(LEASES_BUCKET)
    record = codec.decode(LeaseRecord, (await kv.get("ctrl")).value or b"", subject="lease")
    leader = next(twin for twin in twins if twin.is_leader)
    assert record.token == leader.token
    for twin in twins:
        await twin.stop()
    for bus in buses:
        await bus.close()
