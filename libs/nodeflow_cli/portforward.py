"""`kubectl nodeflow`'s own port-forward to NATS: which pod and port (pure), and the forward
itself over the API server's `pods/portforward` subresource.

The protocol is the kubelet's WebSocket one (its frames: nodeflow_kube.portforward).
A WebSocket carries one connection to the port (no multiplexing), so each local connection
accepted gets its own WebSocket.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from urllib.parse import quote, urlsplit, urlunsplit

import aiohttp

from nodeflow_cli.verdicts import Obj
from nodeflow_kube.portforward import (
    CHANNEL_PROTOCOL,
    PORT_PREFIX_SIZE,
    READ_SIZE,
    data_channel,
    error_channel,
    frame,
    split_frame,
)


class ForwardError(Exception):
    """The forward cannot be set up (no Service, no ready pod, no such port)."""


# --- where NATS is --------------------------------------------------------------------------


def _is_ready(pod: Obj) -> bool:
    metadata, status = pod.get("metadata") or {}, pod.get("status") or {}
    if metadata.get("deletionTimestamp") or status.get("phase") != "Running":
        return False
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )


def selector_query(service: Obj) -> str:
    """The Service's selector as a labelSelector (empty: it selects no pod by itself)."""
    selector: Mapping[str, str] = (service.get("spec") or {}).get("selector") or {}
    return ",".join(f"{key}={value}" for key, value in sorted(selector.items()))


def ready_pod(pods: Sequence[Obj]) -> Obj | None:
    """A Ready, running, not terminating pod among `pods` (the first by name), else None."""
    ready = [pod for pod in pods if _is_ready(pod)]
    return min(ready, key=lambda pod: pod["metadata"]["name"]) if ready else None


def target_port(service: Obj, pod: Obj, port_name: str) -> int:
    """The pod port behind the Service's port `port_name`: its targetPort as a number, or the
    pod's container port of that name (a missing targetPort means the Service's port)."""
    service_name = service.get("metadata", {}).get("name", "")
    ports = (service.get("spec") or {}).get("ports") or []
    chosen = next((p for p in ports if p.get("name") == port_name), None)
    if chosen is None:
        raise ForwardError(f"Service {service_name} has no port named {port_name}")
    target = chosen.get("targetPort", chosen.get("port"))
    if isinstance(target, int):
        return target
    if isinstance(target, str) and target.isdigit():
        return int(target)
    for container in (pod.get("spec") or {}).get("containers") or []:
        for port in container.get("ports") or []:
            if port.get("name") == target and isinstance(port.get("containerPort"), int):
                found: int = port["containerPort"]
                return found
    raise ForwardError(
        f"pod {pod['metadata']['name']} has no container port named {target} "
        f"(Service {service_name}'s port {port_name})"
    )


def websocket_url(host: str, path: str) -> str:
    """The API server's `host` (http[s]://...) with `path`, as a ws[s]:// URL."""
    parts = urlsplit(host)
    scheme = {"http": "ws", "https": "wss"}.get(parts.scheme, parts.scheme)
    return urlunsplit((scheme, parts.netloc, parts.path.rstrip("/") + path, "", ""))


def port_forward_path(namespace: str, pod: str, port: int) -> str:
    return (
        f"/api/v1/namespaces/{quote(namespace, safe='')}/pods/{quote(pod, safe='')}"
        f"/portforward?ports={port}"
    )


# --- the forward ----------------------------------------------------------------------------


@dataclass
class PortForward:
    """A local listener on 127.0.0.1 whose every connection is carried by its own WebSocket
    to `url` (a pod's portforward, one port). `errors` keeps what the server reported, so a
    client that failed through the forward can say why."""

    session: aiohttp.ClientSession
    url: str
    headers: Mapping[str, str]
    port: int
    pod: str
    errors: list[str] = field(default_factory=list)
    local_port: int | None = None
    _server: asyncio.Server | None = None
    _connections: set[asyncio.Task[None]] = field(default_factory=set)

    @property
    def what(self) -> str:
        return f"pod {self.pod} port {self.port}"

    async def start(self) -> int:
        """Listen on 127.0.0.1 (a free port); that port."""
        self._server = await asyncio.start_server(self._accepted, "127.0.0.1", 0)
        local_port: int = self._server.sockets[0].getsockname()[1]
        self.local_port = local_port
        return local_port

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._connections):
            task.cancel()
        for task in list(self._connections):
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._server is not None:
            await self._server.wait_closed()

    async def _accepted(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        try:
            await self._carry(reader, writer)
        except (aiohttp.ClientError, OSError, TimeoutError, ValueError) as exc:
            # ValueError: a message without its channel byte, not the protocol spoken here.
            self.errors.append(f"the API server's portforward failed: {exc}")
        except asyncio.CancelledError:
            # close() ended it. Returning leaves the task done, not cancelled: Python 3.11's
            # start_server calls exception() on a finished connection task, which raises for a
            # cancelled one and prints a traceback after every command (3.12 checks first).
            pass
        finally:
            self._connections.discard(task)
            writer.close()

    async def _carry(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        async with self.session.ws_connect(
            self.url, protocols=(CHANNEL_PROTOCOL,), headers=dict(self.headers)
        ) as ws:
            sending = asyncio.create_task(self._send(reader, ws))
            try:
                await self._receive(ws, writer)
            finally:
                sending.cancel()
                with contextlib.suppress(asyncio.CancelledError, ConnectionError):
                    await sending

    async def _send(
        self, reader: asyncio.StreamReader, ws: aiohttp.ClientWebSocketResponse
    ) -> None:
        while chunk := await reader.read(READ_SIZE):
            await ws.send_bytes(frame(data_channel(0), chunk))
        await ws.close()

    async def _receive(
        self, ws: aiohttp.ClientWebSocketResponse, writer: asyncio.StreamWriter
    ) -> None:
        """The server's frames: data to the local connection, errors kept. Each channel's
        first two bytes are the port prefix, not data."""
        prefix_pending = {data_channel(0), error_channel(0)}
        async for message in ws:
            if message.type is not aiohttp.WSMsgType.BINARY:
                continue
            channel, payload = split_frame(message.data)
            if channel in prefix_pending:
                prefix_pending.discard(channel)
                payload = payload[PORT_PREFIX_SIZE:]
            if not payload:
                continue
            if channel == data_channel(0):
                writer.write(payload)
                await writer.drain()
            elif channel == error_channel(0):
                self.errors.append(payload.decode(errors="replace"))
