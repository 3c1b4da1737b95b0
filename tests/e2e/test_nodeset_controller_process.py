"""`python -m nodeset_controller` as a real process on the whole stack: it becomes ready,
scales a NodeSet, is killed with SIGKILL in the middle of a scale-in, and a new process
finishes the job from Kubernetes state alone (no duplicate pod, no premature deletion)."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from typing import Any

import aiohttp

from nodeflow_runtime.natsd import free_port
from tests.integration.nodeset_controller import conftest as whole_stack
from tests.integration.nodeset_controller.conftest import (
    SLURM_DELETE,
    Stack,
    condition,
    eventually,
)

# The whole-stack fixture of the integration suite (simulator, NATS, k8s-watcher, syncer).
stack = whole_stack.stack


async def start_process(running: Stack, port: int, name: str) -> asyncio.subprocess.Process:
    env = {
        **os.environ,
        "NATS_URL": running.nats_url,
        "HTTP_HOST": "127.0.0.1",
        "HTTP_PORT": str(port),
        "INSTANCE_ID": name,
        "LOG_LEVEL": "warning",
        "LEADER_LEASE_TTL_SECONDS": "1.5",
        "RESYNC_SECONDS": "0.5",
        "DEBOUNCE_SECONDS": "0.02",
        "IN_FLIGHT_TIMEOUT_SECONDS": "5",
    }
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "nodeset_controller",
        env=env,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )


async def wait_ready(port: int, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession() as session:
        while True:
            try:
                async with session.get(f"http://127.0.0.1:{port}/readyz") as response:
                    if response.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            assert time.monotonic() < deadline, "controller process not ready"
            await asyncio.sleep(0.1)


async def test_nodeset_controller_process_killed_mid_scale_in(stack: Stack) -> None:
    port = free_port()
    process = await start_process(stack, port, "e2e-1")
    second: asyncio.subprocess.Process | None = None
    try:
        await wait_ready(port)
        stack.create_nodeset("gpu", 3)
        await eventually(lambda: len(stack.ready_pods("gpu")) == 3, timeout=20)
        await eventually(
            lambda: all(stack.slurm_node(p["metadata"]["name"]) for p in stack.pods("gpu"))
        )
        for pod in stack.pods("gpu"):
            stack.run_job(pod["metadata"]["name"], "3")
        await eventually(lambda: stack.status("gpu").get("numberRunning") == 3)
        added: list[str] = []

        def on_change(resource: str, event: str, obj: dict[str, Any], old: Any) -> None:
            if resource == "pods" and event == "ADDED":
                added.append(obj["metadata"]["name"])

        stack.sim.store.add_listener(on_change)
        stack.patch_nodeset("gpu", {"replicas": 1})
        await eventually(
            lambda: sum(1 for p in stack.pods("gpu") if condition(p, SLURM_DELETE)) == 2
        )
        process.send_signal(signal.SIGKILL)
        await process.wait()
        # Busy pods are not deleted while no controller runs, nor right after the restart.
        assert len(stack.live_pods("gpu")) == 3
        second = await start_process(stack, port, "e2e-2")
        await wait_ready(port)
        await eventually(lambda: len(stack.pods("gpu")) == 1, timeout=25, what="scale-in finished")
        assert added == []
        await eventually(lambda: stack.status("gpu").get("currentNumberScheduled") == 1)
    finally:
        for proc in (process, second):
            if proc is not None and proc.returncode is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    await asyncio.wait_for(proc.wait(), 10)
                except TimeoutError:
                    proc.kill()
                    await proc.wait()
