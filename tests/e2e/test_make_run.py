"""`make run`: NATS, the simulator and six ready services; Ctrl-C leaves no process behind."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from pathlib import Path

import aiohttp

from nodeflow_runtime.envfile import read_env_file
from nodeflow_runtime.launcher import SERVICES, env_key, pid_alive

READY_LINE = b"Ctrl-C stops everything"


async def read_until_ready(process: asyncio.subprocess.Process, timeout: float) -> bytes:
    assert process.stdout is not None
    output = b""
    deadline = time.monotonic() + timeout
    while READY_LINE not in output:
        left = deadline - time.monotonic()
        assert left > 0, f"stack not ready in {timeout}s:\n{output.decode()}"
        line = await asyncio.wait_for(process.stdout.readline(), left)
        assert line, f"launcher exited early:\n{output.decode()}"
        output += line
    return output


async def test_make_run_starts_everything_ready_and_ctrl_c_stops_all(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "nodeflow_runtime.launcher",
        "--run-dir",
        str(run_dir),
        "--nodes",
        "4",
        "--topology",
        "spines=1,blocks_per_spine=2,nodes_per_block=2",
        "--nats-port",
        "0",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        output = await read_until_ready(process, timeout=120)
        env = read_env_file(run_dir / "env")
        for key in ("NATS_URL", "KUBECONFIG", "KUBE_API_URL", "SLURM_URL"):
            assert key in env, f"{key} missing from .run/env: {env}"
        async with aiohttp.ClientSession() as session:
            for service, _ in SERVICES:
                url = env[env_key(service)]
                assert url.encode() + b"/metrics" in output
                async with session.get(f"{url}/readyz") as response:
                    assert response.status == 200, service
            async with session.get(f"{env['KUBE_API_URL']}/api/v1/nodes") as response:
                assert len((await response.json())["items"]) == 4
        children = {
            name: child["pid"]
            for name, child in json.loads((run_dir / "children.json").read_text()).items()
        }
        assert set(children) >= {"nats-server", "clustersim", *dict(SERVICES)}
        process.send_signal(signal.SIGINT)
        assert await asyncio.wait_for(process.wait(), 90) == 0
        alive = [name for name, pid in children.items() if pid_alive(pid)]
        assert alive == [], f"left running: {alive}"
        assert not (run_dir / "launcher.pid").exists()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


async def test_make_stop_stops_a_stack_started_in_the_background(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    launcher = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "nodeflow_runtime.launcher",
        "--run-dir",
        str(run_dir),
        "--nodes",
        "2",
        "--topology",
        "spines=1,blocks_per_spine=1,nodes_per_block=2",
        "--nats-port",
        "0",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        await read_until_ready(launcher, timeout=120)
        children = {
            name: child["pid"]
            for name, child in json.loads((run_dir / "children.json").read_text()).items()
        }
        stopper = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "nodeflow_runtime.launcher", "--stop", "--run-dir", str(run_dir)
        )
        assert await asyncio.wait_for(stopper.wait(), 90) == 0
        assert await asyncio.wait_for(launcher.wait(), 30) == 0
        assert [name for name, pid in children.items() if pid_alive(pid)] == []
    finally:
        if launcher.returncode is None:
            launcher.kill()
            await launcher.wait()
