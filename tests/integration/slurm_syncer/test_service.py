"""`python -m slurm_syncer` as a process: configured from env, one active replica by lease,
a standby takes over when the leader stops, and SIGTERM exits cleanly."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from clustersim.slurm import RunningSlurm, run_slurm_emulator
from nodeflow_bus import Bus
from nodeflow_runtime.launcher import listening_socket
from nodeflow_runtime.natsd import NatsServerProcess
from tests.integration.slurm_syncer.conftest import (
    CLUSTER,
    FakeWatcher,
    KubeKV,
    eventually,
    make_node,
    make_nodeset,
    make_pod,
    slurm_conditions,
)
from tests.integration.slurm_syncer.test_syncer import sleep_job

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
async def live_slurm() -> AsyncIterator[RunningSlurm]:
    async with run_slurm_emulator(CLUSTER, driver_interval=0.1) as running:
        yield running


async def start_syncer(
    nats: NatsServerProcess, slurm: RunningSlurm, log: Path
) -> asyncio.subprocess.Process:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    # Bound here and inherited (HTTP_LISTEN_FD): no other process takes it meanwhile.
    listener = listening_socket(0)
    env.update(
        {
            "NATS_URL": nats.url,
            "HTTP_HOST": "127.0.0.1",
            "HTTP_PORT": str(listener.getsockname()[1]),
            "HTTP_LISTEN_FD": str(listener.fileno()),
            "SHUTDOWN_DEADLINE_SECONDS": "5",
            "SLURM_CLUSTERS": CLUSTER,
            f"SLURM_{CLUSTER.upper()}_URL": slurm.url,
            "SLURM_JWT_KEY_FILE": str(slurm.key_path),
            "SLURM_USER": "slurm",
            "SLURM_POLL_INTERVAL_SECONDS": "0.2",
            "LEADER_LEASE_TTL_SECONDS": "2",
        }
    )
    with listener, log.open("wb") as handle:
        return await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "slurm_syncer",
            stdout=handle,
            stderr=handle,
            env=env,
            pass_fds=(listener.fileno(),),
        )


async def lease_holder(bus: Bus) -> str | None:
    kv = await bus.js.key_value("leases")
    try:
        entry = await kv.get("slurm-syncer")
    except Exception:
        return None
    return str(json.loads(entry.value or b"{}").get("holder")) if entry.value else None


async def test_one_replica_acts_and_a_standby_takes_over(
    nats_server: NatsServerProcess,
    topology: Bus,
    live_slurm: RunningSlurm,
    kube: KubeKV,
    watcher: FakeWatcher,
    tmp_path: Path,
) -> None:
    live_slurm.emulator.register_node("gpu-001", cpus=4, real_memory=1024)
    await kube.put_nodeset(make_nodeset())
    await kube.put_node(make_node("node-1"))
    await kube.put_pod(make_pod("gpu-001", "node-1"))
    first = await start_syncer(nats_server, live_slurm, tmp_path / "first.log")
    second = await start_syncer(nats_server, live_slurm, tmp_path / "second.log")
    processes = {first.pid: first, second.pid: second}
    try:
        await eventually(
            lambda: slurm_conditions(kube.pod("gpu-001")) == {"SlurmNodeStateIdle": ""},
            timeout=20,
        )
        holder = await lease_holder(topology)
        assert holder is not None
        leader_pid = int(holder.rsplit("-", 1)[1])
        leader = processes.pop(leader_pid)
        standby = next(iter(processes.values()))
        leader.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(leader.wait(), 15) == 0

        live_slurm.cluster.submit_job(sleep_job("gpu-001"), "alice")
        await eventually(
            lambda: slurm_conditions(kube.pod("gpu-001")) == {"SlurmNodeStateAllocated": ""},
            timeout=20,
        )
        new_holder = await lease_holder(topology)
        assert new_holder is not None and new_holder.endswith(f"-{standby.pid}")
        standby.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(standby.wait(), 15) == 0
    finally:
        for process in (first, second):
            if process.returncode is None:
                process.kill()
                await process.wait()
