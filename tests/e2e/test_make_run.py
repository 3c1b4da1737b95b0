"""`make run`: NATS, the simulator and six ready services; Ctrl-C leaves no process behind; a
killed service or nats-server comes back while the simulator keeps its cluster."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

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


class LauncherOutput:
    """Collects the launcher's output lines in the background, to wait for one."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.lines: list[str] = []
        self._process = process
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        assert self._process.stdout is not None
        while line := await self._process.stdout.readline():
            self.lines.append(line.decode(errors="replace").rstrip())

    async def wait_for(self, text: str, after: int, timeout: float) -> int:
        """The index of the first line after `after` that contains `text`."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for index in range(after, len(self.lines)):
                if text in self.lines[index]:
                    return index
            await asyncio.sleep(0.1)
        raise AssertionError(f"no line with {text!r} in {timeout}s:\n" + "\n".join(self.lines))

    async def close(self) -> None:
        self._reader.cancel()
        await asyncio.gather(self._reader, return_exceptions=True)


def children_pids(run_dir: Path) -> dict[str, int]:
    return {
        name: child["pid"]
        for name, child in json.loads((run_dir / "children.json").read_text()).items()
    }


async def ready(session: aiohttp.ClientSession, url: str) -> bool:
    try:
        async with session.get(f"{url}/readyz", timeout=aiohttp.ClientTimeout(total=2)) as r:
            return r.status == 200
    except (aiohttp.ClientError, TimeoutError):
        return False


async def until(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not await predicate():
        assert time.monotonic() < deadline, f"{what} not within {timeout}s"
        await asyncio.sleep(0.2)


async def test_make_run_restarts_a_killed_service_and_nats_and_keeps_the_simulator(
    tmp_path: Path,
) -> None:
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
    output = LauncherOutput(launcher)
    try:
        seen = await output.wait_for(READY_LINE.decode(), 0, timeout=120)
        env = read_env_file(run_dir / "env")
        before = children_pids(run_dir)
        simulator_pid = before["clustersim"]
        async with aiohttp.ClientSession() as session:
            # kill -9 a service: it comes back on the same URL and answers ready again.
            os.kill(before["k8s-watcher"], signal.SIGKILL)
            seen = await output.wait_for("k8s-watcher exited with code -9", seen, timeout=30)
            # While it is down its port stays the launcher's (HTTP_LISTEN_FD): no other
            # process can take it before the restart binds it.
            port = int(env[env_key("k8s-watcher")].rsplit(":", 1)[1])
            with socket.socket() as squatter, pytest.raises(OSError, match="in use"):
                squatter.bind(("127.0.0.1", port))
            seen = await output.wait_for("k8s-watcher ready again", seen, timeout=120)
            assert await ready(session, env[env_key("k8s-watcher")])
            assert children_pids(run_dir)["k8s-watcher"] != before["k8s-watcher"]

            # kill -9 nats-server: restarted on the same port and store; every service
            # reconnects (NATS counts their connections again) and is ready.
            os.kill(before["nats-server"], signal.SIGKILL)
            seen = await output.wait_for("nats-server exited", seen, timeout=30)
            seen = await output.wait_for("nats-server restarted", seen, timeout=60)
            assert read_env_file(run_dir / "env")["NATS_URL"] == env["NATS_URL"]

            async def all_services_connected() -> bool:
                url = f"{env['NATS_MONITOR_URL']}/connz"
                try:
                    async with session.get(url) as response:
                        names = [c.get("name", "") for c in (await response.json())["connections"]]
                except (aiohttp.ClientError, TimeoutError):
                    return False
                return all(any(n.startswith(f"{s}/") for n in names) for s, _ in SERVICES)

            await until(all_services_connected, 120, "every service reconnected to NATS")
            for service, _ in SERVICES:
                url = env[env_key(service)]
                await until(lambda url=url: ready(session, url), 120, f"{service} ready")

            # The simulator was never stopped: same process, same cluster.
            assert children_pids(run_dir)["clustersim"] == simulator_pid
            assert pid_alive(simulator_pid)
            async with session.get(f"{env['KUBE_API_URL']}/api/v1/nodes") as response:
                assert len((await response.json())["items"]) == 2
        assert launcher.returncode is None, "the launcher stopped"
        running = children_pids(run_dir)
        launcher.send_signal(signal.SIGINT)
        assert await asyncio.wait_for(launcher.wait(), 90) == 0
        assert [name for name, pid in running.items() if pid_alive(pid)] == []
    finally:
        if launcher.returncode is None:
            launcher.kill()
            await launcher.wait()
        await output.close()
