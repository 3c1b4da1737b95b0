"""k8s-watcher replicas as real processes (`python -m k8s_watcher`), as a Deployment with
replicas 2 runs them: what each one's /readyz says and whether it holds the `k8s-watcher`
lease (its /metrics), for the emulator's tests and the real control plane's alike."""

from __future__ import annotations

import asyncio
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from k8s_watcher import SERVICE
from nodeflow_runtime.launcher import listening_socket
from tests.e2e.processes import TEST_TIMINGS, stop_processes

LEADER_GAUGE = "nodeflow_bus_lease_is_leader"


@dataclass
class WatcherReplica:
    name: str
    port: int
    process: asyncio.subprocess.Process
    log_file: Path

    async def readiness(self) -> tuple[int, dict[str, Any]]:
        """/readyz: its HTTP status and body (503 with the reasons while not ready)."""
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"http://127.0.0.1:{self.port}/readyz") as response,
        ):
            body: dict[str, Any] = await response.json()
            return response.status, body

    async def ready(self) -> bool:
        try:
            status, _ = await self.readiness()
        except aiohttp.ClientError:
            return False  # not serving yet
        return status == 200

    async def holds_mirror_lease(self) -> bool:
        """Whether it holds the `k8s-watcher` lease (the mirror's), from its own /metrics."""
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"http://127.0.0.1:{self.port}/metrics") as response,
        ):
            text = await response.text()
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == LEADER_GAUGE and sample.labels.get("lease") == SERVICE:
                    return sample.value == 1.0
        raise AssertionError(f"{self.name} exports no {LEADER_GAUGE}{{lease={SERVICE!r}}}")

    def log_tail(self) -> str:
        return self.log_file.read_text(errors="replace")[-4000:]


async def start_replica(
    name: str,
    *,
    nats_url: str,
    password_file: Path,
    kubeconfig: Path,
    log_dir: Path,
    **settings: str,
) -> WatcherReplica:
    """`python -m k8s_watcher` as NATS user k8s-watcher, INSTANCE_ID `name`, its log in
    `log_dir`; `settings` are further environment variables."""
    # Bound here and inherited (HTTP_LISTEN_FD): no other process takes it meanwhile.
    listener = listening_socket(0)
    port = listener.getsockname()[1]
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("NATS_", "KUBE"))},
        "NATS_URL": nats_url,
        "NATS_USER": SERVICE,
        "NATS_PASSWORD_FILE": str(password_file),
        "KUBECONFIG": str(kubeconfig),
        "HTTP_HOST": "127.0.0.1",
        "HTTP_PORT": str(port),
        "HTTP_LISTEN_FD": str(listener.fileno()),
        "INSTANCE_ID": name,
        **TEST_TIMINGS,
        "LOG_LEVEL": "info",
        **settings,
    }
    log_file = log_dir / f"{name}.log"
    with listener, log_file.open("wb") as log:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "k8s_watcher",
            env=env,
            stdout=log,
            stderr=log,
            pass_fds=(listener.fileno(),),
        )
    return WatcherReplica(name=name, port=port, process=process, log_file=log_file)


async def stop_replicas(*replicas: WatcherReplica) -> None:
    await stop_processes(*(replica.process for replica in replicas))
