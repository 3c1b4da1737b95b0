"""`kubectl nodeflow decisions -f` holds its port-forward for as long as it follows: the
forward's WebSocket must outlive the HTTP session's total timeout (kubernetes-asyncio's
session keeps aiohttp's default, 5 minutes), which bounds ordinary requests only. Measured
here with a session whose total timeout is one second, carrying NATS traffic through the
emulator's `pods/portforward` for several times that, with an idle stretch longer than it."""

from __future__ import annotations

import asyncio

import aiohttp
import nats

from clustersim.kube.server import RunningServer
from nodeflow_cli import portforward
from nodeflow_runtime.natsd import NatsServerProcess
from tests.integration.cli.test_port_forward import NAMESPACE, create, emulator, nats_pod

SESSION_TOTAL_TIMEOUT = 1.0


__all__ = ["emulator"]


async def test_rule_a_forward_outlives_the_http_sessions_total_timeout(
    emulator: RunningServer, nats_server: NatsServerProcess
) -> None:
    assert nats_server.port is not None
    create(emulator.store, "pods", nats_pod("nats-0", nats_server.port))
    timeout = aiohttp.ClientTimeout(total=SESSION_TOTAL_TIMEOUT)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        forward = portforward.PortForward(
            session=session,
            url=portforward.websocket_url(
                emulator.url, portforward.port_forward_path(NAMESPACE, "nats-0", 4222)
            ),
            headers={},
            port=4222,
            pod=f"{NAMESPACE}/nats-0",
        )
        local_port = await forward.start()
        client = await nats.connect(
            f"nats://127.0.0.1:{local_port}",
            allow_reconnect=False,
            ping_interval=3600,
        )
        received: list[bytes] = []
        try:
            subscription = await client.subscribe("forward.check")
            for turn in range(6):
                # An idle stretch longer than the session's timeout, then traffic again.
                await asyncio.sleep(SESSION_TOTAL_TIMEOUT * (2.5 if turn == 2 else 0.6))
                await client.publish("forward.check", str(turn).encode())
                received.append((await subscription.next_msg(timeout=5)).data)
            assert client.is_connected
        finally:
            await client.close()
            await forward.close()
        assert received == [str(turn).encode() for turn in range(6)]
        assert forward.errors == []
