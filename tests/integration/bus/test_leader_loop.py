"""LeaderLoop, the shell of every leader-elected controller, on a real nats-server: start
starts the views (the loop sees them load), subscribes to outcomes and joins the election;
stop ends the loop, hears no more outcomes and releases the lease so a successor leads at
once."""

from __future__ import annotations

import asyncio
from typing import Any

from nats.aio.msg import Msg

from nodeflow_bus import Bus, KVView, LeaderLease, ensure_topology
from nodeflow_bus.leader_loop import LeaderLoop
from nodeflow_contracts.topology import LEASES_BUCKET, KVSpec
from nodeflow_runtime.natsd import NatsServerProcess
from tests.fixtures.nats import TEST_BUS_OPTIONS
from tests.fixtures.waiting import eventually

TTL = 1.5
BUCKET = "things"
SUBJECT = "outcome.test.v1.>"


class Recorder:
    """What the loop and the callbacks saw."""

    def __init__(self, view: KVView[Any]) -> None:
        self.view = view
        self.leadership: list[bool] = []
        self.outcomes: list[str] = []
        self.loaded: dict[str, Any] | None = None
        self.loop_ended = asyncio.Event()

    async def on_outcome(self, msg: Msg) -> None:
        self.outcomes.append(msg.subject)

    def on_leadership(self, leader: bool) -> None:
        self.leadership.append(leader)

    async def loop(self) -> None:
        try:
            # As the controllers' loops do: decide only once the views are loaded.
            await self.view.ready.wait()
            self.loaded = self.view.as_dict()
            await asyncio.Event().wait()
        finally:
            self.loop_ended.set()


async def controller_bus(nats_server: NatsServerProcess) -> Bus:
    bus = await Bus.connect(nats_server.url, options=TEST_BUS_OPTIONS)
    await ensure_topology(
        bus.js,
        streams=[],
        kv_buckets=[
            KVSpec(bucket=LEASES_BUCKET, description="leases"),
            KVSpec(bucket=BUCKET, description="a view's bucket"),
        ],
        consumers=[],
    )
    return bus


def leader_loop(bus: Bus, holder: str) -> tuple[LeaderLoop, Recorder]:
    view: KVView[Any] = KVView(bus, BUCKET, dict)
    recorder = Recorder(view)
    lease = LeaderLease(bus, "ctrl", holder=holder, ttl=TTL)
    shell = LeaderLoop(
        bus,
        lease,
        [view],
        outcomes_subject=SUBJECT,
        on_outcome=recorder.on_outcome,
        on_leadership=recorder.on_leadership,
        loop=recorder.loop,
        name=f"{holder} loop",
    )
    return shell, recorder


async def test_leader_loop_starts_views_lease_and_loop_and_hears_outcomes(
    nats_server: NatsServerProcess,
) -> None:
    bus = await controller_bus(nats_server)
    kv = await bus.js.key_value(BUCKET)
    await kv.put("a", b'{"n": 1}')
    shell, recorder = leader_loop(bus, "first")
    await shell.start()
    try:
        await shell.lease.wait_until_leader(timeout=10)
        await eventually(lambda: recorder.loaded is not None)
        assert recorder.loaded == {"a": {"n": 1}}
        assert recorder.leadership == [True]
        await bus.nc.publish("outcome.test.v1.one", b"{}")
        await eventually(lambda: recorder.outcomes == ["outcome.test.v1.one"])
    finally:
        await shell.stop()
        await bus.close()


async def test_leader_loop_stop_ends_the_loop_and_hands_the_lease_over_at_once(
    nats_server: NatsServerProcess,
) -> None:
    first_bus, second_bus = await controller_bus(nats_server), await controller_bus(nats_server)
    first, first_seen = leader_loop(first_bus, "first")
    second, _ = leader_loop(second_bus, "second")
    await first.start()
    await first.lease.wait_until_leader(timeout=10)
    await second.start()
    try:
        await first.stop()
        assert first_seen.loop_ended.is_set()
        assert first.task is not None and first.task.done()
        await first_bus.nc.publish("outcome.test.v1.after", b"{}")
        await first_bus.nc.flush()
        # Released, not expired: the successor creates the lease anew, no TTL waited out.
        await second.lease.wait_until_leader(timeout=TTL * 4)
        assert second.lease.last_transition == "created"
        assert first_seen.outcomes == []
    finally:
        await second.stop()
        await first_bus.close()
        await second_bus.close()
