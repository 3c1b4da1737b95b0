"""A JetStream cluster of nats-server processes on 127.0.0.1: for tests of a replicated bus.

Each node listens for clients and for routes on ports of its own, names every node's route,
and keeps its store in a directory of its own, so that a node can be killed (kill -9) and
started again on the same ports and store while the others keep the cluster's quorum.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path

import nats
import nats.errors
import nats.js.errors
import structlog

from nodeflow_runtime.natsd import HOST, NatsServerError, NatsServerProcess, free_port

log = structlog.get_logger("nodeflow_runtime.natsd")

CLUSTER_NAME = "nodeflow"


def _quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def render_cluster_node_config(
    *, server_name: str, port: int, route_port: int, route_ports: list[int], store_dir: Path
) -> str:
    """The config of one node of a loopback JetStream cluster (pure)."""
    routes = ", ".join(_quote(f"nats-route://{HOST}:{other}") for other in route_ports)
    return (
        "\n".join(
            [
                f"server_name: {_quote(server_name)}",
                f"listen: {_quote(f'{HOST}:{port}')}",
                "jetstream {",
                f"  store_dir: {_quote(str(store_dir))}",
                "}",
                "cluster {",
                f"  name: {_quote(CLUSTER_NAME)}",
                f"  listen: {_quote(f'{HOST}:{route_port}')}",
                f"  routes: [{routes}]",
                "}",
            ]
        )
        + "\n"
    )


class ClusterNodeProcess(NatsServerProcess):
    """One node: a NatsServerProcess whose config joins the cluster."""

    def __init__(
        self, store_dir: Path, *, server_name: str, port: int, route_port: int, routes: list[int]
    ) -> None:
        super().__init__(store_dir, port=port)
        self.server_name = server_name
        self.route_port = route_port
        self.routes = routes

    async def start(self) -> None:
        if self.running:
            raise NatsServerError(f"{self!r} is already running")
        assert self.port is not None
        self.store_dir.mkdir(parents=True, exist_ok=True)
        self.config_file.write_text(
            render_cluster_node_config(
                server_name=self.server_name,
                port=self.port,
                route_port=self.route_port,
                route_ports=self.routes,
                store_dir=self.store_dir,
            )
        )
        with open(self.log_file, "ab") as log_stream:
            self._process = await asyncio.create_subprocess_exec(
                str(self.binary),
                "-c",
                str(self.config_file),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log_stream,
                stderr=log_stream,
                start_new_session=True,
            )
        try:
            await self._wait_accepting()
        except BaseException:
            await self.kill()
            raise
        log.info("natsd.node_started", node=self.server_name, url=self.url, pid=self.pid)


class NatsCluster:
    """`size` nodes of one JetStream cluster; `urls` lists them all for clients."""

    def __init__(self, base_dir: Path, size: int = 3) -> None:
        if size < 3:
            raise ValueError("a JetStream cluster needs at least three nodes for a quorum")
        route_ports = [free_port() for _ in range(size)]
        self.nodes = [
            ClusterNodeProcess(
                Path(base_dir) / f"node-{index}",
                server_name=f"node-{index}",
                port=free_port(),
                route_port=route_ports[index],
                routes=route_ports,
            )
            for index in range(size)
        ]

    @property
    def urls(self) -> list[str]:
        return [node.url for node in self.nodes]

    def node(self, server_name: str) -> ClusterNodeProcess:
        return next(node for node in self.nodes if node.server_name == server_name)

    async def start(self, ready_timeout: float = 60.0) -> None:
        await asyncio.gather(*(node.start() for node in self.nodes))
        await self.wait_jetstream_ready(ready_timeout)

    async def wait_jetstream_ready(self, timeout: float) -> None:
        """Until the cluster has elected its JetStream meta leader (it answers account info)."""
        deadline = time.monotonic() + timeout
        client = await nats.connect(servers=self.urls, connect_timeout=2)
        try:
            js = client.jetstream(timeout=2)
            while True:
                try:
                    await js.account_info()
                    return
                except (nats.errors.Error, nats.js.errors.Error) as exc:
                    if time.monotonic() > deadline:
                        raise NatsServerError(f"JetStream cluster not ready: {exc}") from exc
                await asyncio.sleep(0.2)
        finally:
            await client.close()

    async def stop(self) -> None:
        await asyncio.gather(*(node.stop() for node in self.nodes))

    async def kill(self) -> None:
        await asyncio.gather(*(node.kill() for node in self.nodes))

    async def __aenter__(self) -> NatsCluster:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        with contextlib.suppress(Exception):
            await self.stop()
        await self.kill()
