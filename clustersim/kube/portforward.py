"""pods/portforward as the kubelet serves it over WebSocket (`v4.channel.k8s.io`, or no
subprotocol: the same binary framing).

Each message's first byte is its channel: for the i-th requested port, channel 2i carries the
data both ways and channel 2i+1 the errors the server reports. The server first writes the
port (uint16, little-endian) on both channels; a text on the error channel means that port's
forward failed (nothing listens behind it), and the connection then ends.

A simulated pod runs no process, so nothing listens "in" it: where a pod's port goes is named
by the simulator-only annotation `clustersim.nodeflow.dev/port-forward`
(`"4222=127.0.0.1:41234,8222=127.0.0.1:41235"`: pod port = host:port reachable from the
emulator). A port it does not map answers on the error channel as a kubelet does when
nothing listens on it.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from aiohttp import WSMsgType, web

from clustersim.kube.errors import BadRequest
from clustersim.kube.objects import Obj
from nodeflow_kube.portforward import (
    CHANNEL_PROTOCOL,
    READ_SIZE,
    data_channel,
    error_channel,
    frame,
    is_data_channel,
    port_index,
    port_prefix,
    split_frame,
)

PORT_FORWARD_ANNOTATION = "clustersim.nodeflow.dev/port-forward"


def requested_ports(values: list[str]) -> list[int]:
    """The `ports` query parameter(s), each comma-separated, as the API server takes them:
    at least one, each 1..65535 (400 otherwise)."""
    if not values:
        raise BadRequest('query parameter "ports" is required')
    ports = []
    for value in values:
        if not value:
            raise BadRequest('query parameter "ports" cannot be empty')
        for part in value.split(","):
            try:
                port = int(part)
            except ValueError:
                raise BadRequest(f'unable to parse "{value}" as a port') from None
            if not 0 < port < 65536:
                raise BadRequest(f'port "{value}" must be > 0 and < 65536')
            ports.append(port)
    return ports


def forwarded_addresses(pod: Obj) -> dict[int, tuple[str, int]]:
    """The pod's port -> (host, port) of its `clustersim.nodeflow.dev/port-forward`
    annotation; a malformed entry maps nothing (its port then has nothing behind it)."""
    annotations = pod.get("metadata", {}).get("annotations") or {}
    found: dict[int, tuple[str, int]] = {}
    for entry in str(annotations.get(PORT_FORWARD_ANNOTATION, "")).split(","):
        pod_port, _, address = entry.strip().partition("=")
        host, _, host_port = address.rpartition(":")
        if pod_port.isdigit() and host and host_port.isdigit():
            found[int(pod_port)] = (host, int(host_port))
    return found


def is_websocket_request(request: web.Request) -> bool:
    return request.headers.get("Upgrade", "").lower() == "websocket"


async def serve_port_forward(request: web.Request, pod: Obj) -> web.StreamResponse:
    """Forward the requested ports of `pod` over one WebSocket until the client or every
    port's connection ends."""
    if not is_websocket_request(request):
        # The kubelet serves SPDY too; the emulator only the WebSocket protocol.
        raise BadRequest("Upgrade request required: pods/portforward is served over WebSocket")
    ports = requested_ports(request.query.getall("ports", []))
    ws = web.WebSocketResponse(protocols=(CHANNEL_PROTOCOL,))
    await ws.prepare(request)
    name = f"{pod['metadata'].get('namespace', '')}/{pod['metadata']['name']}"
    addresses = forwarded_addresses(pod)
    writers: dict[int, asyncio.StreamWriter] = {}
    pumps: list[asyncio.Task[None]] = []
    try:
        for index, port in enumerate(ports):
            await ws.send_bytes(frame(data_channel(index), port_prefix(port)))
            await ws.send_bytes(frame(error_channel(index), port_prefix(port)))
            try:
                host, host_port = addresses[port]
                reader, writer = await asyncio.open_connection(host, host_port)
            except (KeyError, OSError) as exc:
                reason = "connection refused" if isinstance(exc, KeyError) else str(exc)
                message = f"error forwarding port {port} to pod {name}: {reason}"
                await ws.send_bytes(frame(error_channel(index), message.encode()))
                continue
            writers[index] = writer
            pumps.append(asyncio.create_task(_pump(reader, ws, data_channel(index))))
        if not writers:
            return ws
        # Until the client leaves or every port's connection has ended.
        pumps_done: asyncio.Future[Any] = asyncio.gather(*pumps, return_exceptions=True)
        reading: asyncio.Future[Any] = asyncio.ensure_future(_read_client(ws, writers))
        await asyncio.wait({pumps_done, reading}, return_when=asyncio.FIRST_COMPLETED)
        for waited in (pumps_done, reading):
            waited.cancel()
    finally:
        for pump in pumps:
            pump.cancel()
        for writer in writers.values():
            writer.close()
        await ws.close()
    return ws


async def _pump(reader: asyncio.StreamReader, ws: web.WebSocketResponse, channel: int) -> None:
    """What the pod's port sends, to the client on its data channel, until it closes."""
    while chunk := await reader.read(READ_SIZE):
        await ws.send_bytes(frame(channel, chunk))


async def _read_client(ws: web.WebSocketResponse, writers: dict[int, asyncio.StreamWriter]) -> None:
    """What the client sends on a data channel, to that port's connection."""
    async for message in ws:
        if message.type is not WSMsgType.BINARY or not message.data:
            continue
        channel, payload = split_frame(message.data)
        writer = writers.get(port_index(channel))
        if is_data_channel(channel) and writer is not None and payload:
            writer.write(payload)
            with contextlib.suppress(ConnectionError):
                await writer.drain()
