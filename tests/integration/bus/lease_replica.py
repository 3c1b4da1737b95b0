"""One replica of a leased controller, as its own process: `python -m
tests.integration.bus.lease_replica <nats-url> <ttl>`.

Its identity is the runtime's default (no INSTANCE_ID), as a service's would be. While it holds
the lease it acts: it publishes `lease_actions.ctrl` naming itself, ten times per TTL. It
prints `replica: holder <id>` once, and `replica: gained`/`replica: lost` on each transition,
for the test to follow (other lines on stdout are logs).
"""

from __future__ import annotations

import asyncio
import sys

import msgspec

from nodeflow_bus import Bus, BusOptions, LeaderLease, ensure_topology
from nodeflow_contracts.topology import LEASES_BUCKET, KVSpec, StreamSpec
from nodeflow_runtime.config import ServiceConfig, load_config

ACTIONS_STREAM = StreamSpec(
    name="LEASE_ACTIONS",
    subjects=("lease_actions.>",),
    description="what each leased replica did, in order",
    max_age_seconds=600.0,
)


class Action(msgspec.Struct, frozen=True, kw_only=True):
    holder: str
    number: int


MARK = "replica: "


def say(line: str) -> None:
    print(MARK + line, flush=True)


async def run(url: str, ttl: float) -> None:
    config = load_config(ServiceConfig)
    bus = await Bus.connect(url, options=BusOptions(name=config.instance_id))
    await ensure_topology(
        bus.js,
        streams=[ACTIONS_STREAM],
        kv_buckets=[KVSpec(bucket=LEASES_BUCKET, description="leases")],
        consumers=[],
    )
    lease = LeaderLease(bus, "ctrl", holder=config.instance_id, ttl=ttl)
    lease.add_listener(lambda gained: say("gained" if gained else "lost"))
    await lease.start()
    say(f"holder {config.instance_id}")
    number = 0
    while True:
        await asyncio.sleep(ttl / 10)
        if lease.is_leader:
            number += 1
            await bus.publish(
                "lease_actions.ctrl", Action(holder=config.instance_id, number=number)
            )


if __name__ == "__main__":
    asyncio.run(run(sys.argv[1], float(sys.argv[2])))
