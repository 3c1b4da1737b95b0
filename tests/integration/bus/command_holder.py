"""An executor that takes one command and never finishes it, as its own process:
`python -m tests.integration.bus.command_holder <nats-url> <service>`.

It consumes `<service>`'s (first) command durable of the project topology and prints
`holder: holding <stream sequence>` once its handler runs, then hangs there, so that the test
can kill it with SIGKILL while the command is in its hands.
"""

from __future__ import annotations

import asyncio
import sys

from nodeflow_bus import Bus, BusOptions, ConsumerOptions, Delivery, PullConsumer
from nodeflow_contracts.topology import CONSUMERS

MARK = "holder: "


async def run(url: str, service: str) -> None:
    bus = await Bus.connect(url, options=BusOptions(name="command-holder"))
    spec = CONSUMERS[service][0]

    async def hold(_: bytes, delivery: Delivery) -> None:
        print(f"{MARK}holding {delivery.stream_sequence}", flush=True)
        await asyncio.Event().wait()

    consumer = PullConsumer(bus, spec, bytes, hold, ConsumerOptions(concurrency=1))
    await consumer.start()
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(run(sys.argv[1], sys.argv[2]))
