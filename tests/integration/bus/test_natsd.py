"""The embedded nats-server: start, restart on the same port and store, kill -9, monitoring."""

from __future__ import annotations

import asyncio
from pathlib import Path

from nodeflow_bus import Bus
from nodeflow_runtime.natsd import NatsServerProcess, free_port
from tests.fixtures.nats import TEST_BUS_OPTIONS


async def test_restart_keeps_port_and_stored_messages(tmp_path: Path) -> None:
    server = NatsServerProcess(tmp_path / "store", monitor_port=free_port())
    await server.start()
    url, port = server.url, server.port
    bus = await Bus.connect(url, options=TEST_BUS_OPTIONS)
    await bus.js.add_stream(name="P", subjects=["p.>"])
    await bus.publish("p.1", b"{}")
    await bus.close()

    await server.restart(graceful=False)
    assert server.port == port and server.running
    await server.restart(graceful=True)
    bus = await Bus.connect(url, options=TEST_BUS_OPTIONS)
    assert (await bus.js.stream_info("P")).state.messages == 1
    await bus.close()

    reader, writer = await asyncio.open_connection("127.0.0.1", server.monitor_port)
    writer.write(b"GET /healthz HTTP/1.0\r\n\r\n")
    await writer.drain()
    response = await reader.read()
    writer.close()
    assert b"200 OK" in response

    await server.stop()
    assert not server.running
    await server.stop()  # idempotent
