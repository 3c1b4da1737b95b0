"""Each service process: starts, connects, declares its topology, serves health and metrics,
stops cleanly on SIGTERM; bad configuration fails at start with a clear message."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
import time
from pathlib import Path

import aiohttp
import pytest

from clustersim.kube.server import serve
from clustersim.kube.store import Store
from clustersim.runner import DEFAULT_CRD_DIR, apply_crds
from nodeflow_bus import Bus
from nodeflow_contracts.topology import CONSUMERS, KV_BUCKETS, STREAMS
from nodeflow_runtime.launcher import SERVICES
from nodeflow_runtime.natsd import NatsServerProcess, free_port

MODULES = dict(SERVICES)


async def start_service(
    module: str, env_overrides: dict[str, str], log_file: Path, pass_fds: tuple[int, ...] = ()
) -> asyncio.subprocess.Process:
    env = {**os.environ, "HTTP_HOST": "127.0.0.1", "SHUTDOWN_DEADLINE_SECONDS": "5"}
    env.update(env_overrides)
    with log_file.open("wb") as handle:
        return await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            module,
            stdout=handle,
            stderr=asyncio.subprocess.STDOUT,
            env=env,
            pass_fds=pass_fds,
        )


async def get(url: str) -> tuple[int, str]:
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        return response.status, await response.text()


async def wait_for_status(url: str, status: int, timeout: float = 20.0) -> str:
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        try:
            code, body = await get(url)
            if code == status:
                return body
            last = (code, body)
        except aiohttp.ClientError as exc:
            last = exc
        await asyncio.sleep(0.1)
    raise AssertionError(f"{url} never answered {status}; last: {last}")


@pytest.mark.parametrize("service", list(MODULES))
async def test_service_starts_declares_topology_serves_health_and_stops_cleanly(
    service: str, nats_server: NatsServerProcess, bus: Bus, tmp_path: Path
) -> None:
    port = free_port()
    # k8s-watcher needs a Kubernetes API; the others need nothing but NATS.
    store = Store()
    apply_crds(store, DEFAULT_CRD_DIR)
    kube_api = serve(store, kubeconfig_path=tmp_path / "kubeconfig")
    api = await kube_api.__aenter__()
    process = await start_service(
        MODULES[service],
        {
            "NATS_URL": nats_server.url,
            "HTTP_PORT": str(port),
            "KUBECONFIG": str(api.kubeconfig_path),
        },
        tmp_path / "service.log",
    )
    try:
        base = f"http://127.0.0.1:{port}"
        await wait_for_status(f"{base}/readyz", 200)
        assert (await get(f"{base}/healthz"))[0] == 200
        status, metrics = await get(f"{base}/metrics")
        assert status == 200
        assert "nodeflow_bus_connected" in metrics
        for stream in STREAMS:
            assert (await bus.js.stream_info(stream.name)).config.name == stream.name
        for kv in KV_BUCKETS:
            await bus.js.key_value(kv.bucket)
        for consumer in CONSUMERS[service]:
            info = await bus.js.consumer_info(consumer.stream, consumer.durable)
            assert info.config.durable_name == consumer.durable
        process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(process.wait(), 15) == 0
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
        await kube_api.__aexit__(None, None, None)
    log = (tmp_path / "service.log").read_text()
    assert '"event": "service.stopped"' in log
    assert f'"service": "{service}"' in log


async def test_bad_configuration_fails_at_start_naming_the_variable(tmp_path: Path) -> None:
    process = await start_service(
        "nodeset_controller", {"HTTP_PORT": "eighty", "LOG_LEVEL": "loud"}, tmp_path / "bad.log"
    )
    assert await asyncio.wait_for(process.wait(), 15) == 2
    output = (tmp_path / "bad.log").read_text()
    assert "HTTP_PORT='eighty'" in output
    assert "LOG_LEVEL='loud'" in output


async def test_unreadable_credentials_file_fails_at_start_naming_it(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-password"
    process = await start_service(
        "topology_placer",
        {"NATS_USER": "svc", "NATS_PASSWORD_FILE": str(missing)},
        tmp_path / "bad.log",
    )
    assert await asyncio.wait_for(process.wait(), 15) == 2
    assert str(missing) in (tmp_path / "bad.log").read_text()


async def test_not_ready_until_nats_is_reachable_then_ready(tmp_path: Path) -> None:
    nats_port = free_port()
    http_port = free_port()
    process = await start_service(
        "topology_placer",
        {"NATS_URL": f"nats://127.0.0.1:{nats_port}", "HTTP_PORT": str(http_port)},
        tmp_path / "service.log",
    )
    server = NatsServerProcess(tmp_path / "nats", port=nats_port)
    try:
        base = f"http://127.0.0.1:{http_port}"
        body = await wait_for_status(f"{base}/readyz", 503)
        assert "connecting to NATS" in body
        assert (await get(f"{base}/healthz"))[0] == 200
        await server.start()
        await wait_for_status(f"{base}/readyz", 200)
        process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(process.wait(), 15) == 0
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
        await server.kill()


async def test_sigterm_before_nats_is_reachable_exits_cleanly(tmp_path: Path) -> None:
    http_port = free_port()
    process = await start_service(
        "slurm_syncer",
        {"NATS_URL": f"nats://127.0.0.1:{free_port()}", "HTTP_PORT": str(http_port)},
        tmp_path / "service.log",
    )
    await wait_for_status(f"http://127.0.0.1:{http_port}/readyz", 503)
    process.send_signal(signal.SIGTERM)
    assert await asyncio.wait_for(process.wait(), 15) == 0


async def test_a_service_serves_on_the_listening_socket_it_inherits(tmp_path: Path) -> None:
    """HTTP_LISTEN_FD (how `make run` hands each service its port): the service answers on the
    socket its parent bound, whatever HTTP_PORT says, so the port was never free for another
    process to take between the pick and the service's start."""
    with socket.socket() as listener, socket.socket() as occupied:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        occupied.bind(("127.0.0.1", 0))
        occupied.listen()
        process = await start_service(
            "metrics_exporter",
            {
                "NATS_URL": f"nats://127.0.0.1:{free_port()}",
                # A port in use: a service that bound HTTP_PORT would exit at once.
                "HTTP_PORT": str(occupied.getsockname()[1]),
                "HTTP_LISTEN_FD": str(listener.fileno()),
            },
            tmp_path / "service.log",
            pass_fds=(listener.fileno(),),
        )
    try:
        body = await wait_for_status(f"http://127.0.0.1:{port}/healthz", 200)
        assert "metrics-exporter" in body
        process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(process.wait(), 15) == 0
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
