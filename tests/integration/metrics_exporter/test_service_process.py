"""`python -m metrics_exporter` as a process: ready once its views load, serves the NodeSet
and Slurm series on /metrics, drops a deleted NodeSet's series, stops cleanly on SIGTERM."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from metrics_exporter.exporter import NODESETS_BUCKET
from nodeflow_bus import Bus
from nodeflow_contracts import codec
from nodeflow_contracts.slurm import SlurmNodeState
from nodeflow_contracts.topology import SLURM_NODES_BUCKET
from nodeflow_runtime.launcher import listening_socket
from nodeflow_runtime.natsd import NatsServerProcess, free_port

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


async def scrape(url: str) -> tuple[int, str]:
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        return response.status, await response.text()


def parse(text: str) -> Samples:
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


async def wait_for_metrics(
    url: str, check: Callable[[Samples], bool], timeout: float = 15.0
) -> Samples:
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        try:
            status, text = await scrape(url)
            if status == 200:
                samples = parse(text)
                if check(samples):
                    return samples
                last = "condition not met"
            else:
                last = status
        except aiohttp.ClientError as exc:
            last = exc
        await asyncio.sleep(0.1)
    raise AssertionError(f"{url} never met the condition; last: {last}")


def ready_of(samples: Samples, namespace: str, name: str) -> float | None:
    key = frozenset({("namespace", namespace), ("nodeset", name)})
    return samples.get(("kube_sunk_nodeset_ready", key))


async def test_service_serves_nodeset_and_slurm_series_and_stops_cleanly(
    nats_server: NatsServerProcess, bus: Bus, tmp_path: Path
) -> None:
    # Bound here and inherited (HTTP_LISTEN_FD): no other process takes it meanwhile.
    listener = listening_socket(0)
    port = listener.getsockname()[1]
    env = {
        **os.environ,
        "NATS_URL": nats_server.url,
        "HTTP_HOST": "127.0.0.1",
        "HTTP_PORT": str(port),
        "HTTP_LISTEN_FD": str(listener.fileno()),
        "SHUTDOWN_DEADLINE_SECONDS": "5",
    }
    log_file = tmp_path / "exporter.log"
    with listener, log_file.open("wb") as handle:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "metrics_exporter",
            stdout=handle,
            stderr=asyncio.subprocess.STDOUT,
            env=env,
            pass_fds=(listener.fileno(),),
        )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                if (await scrape(f"{base}/readyz"))[0] == 200:
                    break
            except aiohttp.ClientError:
                pass
            assert time.monotonic() < deadline, log_file.read_text()
            await asyncio.sleep(0.1)

        nodesets = await bus.js.key_value(NODESETS_BUCKET)
        obj = {
            "kind": "NodeSet",
            "metadata": {"namespace": "team-a", "name": "gpus"},
            "status": {"numberReady": 3, "currentNumberScheduled": 4},
        }
        await nodesets.put("team-a.gpus", json.dumps(obj).encode())
        slurm = await bus.js.key_value(SLURM_NODES_BUCKET)
        node = SlurmNodeState(cluster="prod", name="gpu-0", known=True, base_state="Idle")
        await slurm.put(node.key, codec.encode(node))

        idle = frozenset({("cluster", "prod"), ("state", "Idle")})
        # The two buckets reach the exporter through views of their own: wait for both.
        samples = await wait_for_metrics(
            f"{base}/metrics",
            lambda s: (
                ready_of(s, "team-a", "gpus") == 3.0
                and s.get(("nodeflow_slurm_nodes", idle)) == 1.0
            ),
        )
        assert ("nodeflow_bus_connected", frozenset()) in samples

        await nodesets.delete("team-a.gpus")
        await wait_for_metrics(f"{base}/metrics", lambda s: ready_of(s, "team-a", "gpus") is None)

        process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(process.wait(), 15) == 0
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert '"event": "exporter.stopped"' in log_file.read_text()


async def test_bad_limits_fail_at_start(tmp_path: Path) -> None:
    env = {**os.environ, "LABEL_VALUE_LIMIT": "0", "HTTP_PORT": str(free_port())}
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "metrics_exporter",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env=env,
    )
    output, _ = await asyncio.wait_for(process.communicate(), 15)
    assert process.returncode == 2
    assert b"LABEL_VALUE_LIMIT" in output
