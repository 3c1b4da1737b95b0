"""Services as real processes (`python -m <service>`) on an in-process stack, and kubectl
against its simulator: start one with test timings, wait until its /readyz answers 200, stop
it with SIGTERM (SIGKILL if it does not exit within the grace).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Any, Self

import aiohttp

from bench._stack import InProcessStack
from nodeflow_runtime.launcher import listening_socket

KUBECTL = shutil.which("kubectl")

# To debug a flaky run: NODEFLOW_E2E_LOG_DIR=/some/dir keeps each service's log there, as
# `<instance id>.log` at LOG_LEVEL=info (appended, so a restarted instance adds to it).
LOG_DIR = os.environ.get("NODEFLOW_E2E_LOG_DIR")

# Short lease, resync and debounce so that a restarted process takes over within seconds.
TEST_TIMINGS = {
    "LOG_LEVEL": "warning",
    "LEADER_LEASE_TTL_SECONDS": "1.5",
    "RESYNC_SECONDS": "0.5",
    "DEBOUNCE_SECONDS": "0.02",
}


async def start_service(
    module: str, running: InProcessStack, port: int, instance_id: str, **settings: str
) -> asyncio.subprocess.Process:
    """`python -m module` on the stack's NATS, its HTTP server on 127.0.0.1:`port`;
    `settings` are further environment variables. The port is bound here and inherited
    (HTTP_LISTEN_FD), as `make run` does: no other process can take it while the service
    starts."""
    with listening_socket(port, fallback=False) as listener:
        env = {
            **os.environ,
            "NATS_URL": running.nats_url,
            "HTTP_HOST": "127.0.0.1",
            "HTTP_PORT": str(port),
            "HTTP_LISTEN_FD": str(listener.fileno()),
            "INSTANCE_ID": instance_id,
            **TEST_TIMINGS,
            **({"LOG_LEVEL": "info"} if LOG_DIR else {}),
            **settings,
        }
        if not LOG_DIR:
            return await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                module,
                env=env,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.DEVNULL,
                pass_fds=(listener.fileno(),),
            )
        Path(LOG_DIR).mkdir(parents=True, exist_ok=True)
        with (Path(LOG_DIR) / f"{instance_id}.log").open("ab") as log:
            return await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                module,
                env=env,
                stdout=log,
                stderr=asyncio.subprocess.STDOUT,
                pass_fds=(listener.fileno(),),
            )


async def wait_ready(port: int, what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession() as session:
        while True:
            try:
                async with session.get(f"http://127.0.0.1:{port}/readyz") as response:
                    if response.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            assert time.monotonic() < deadline, f"{what} not ready"
            await asyncio.sleep(0.1)


async def stop_processes(
    *processes: asyncio.subprocess.Process | None, grace: float = 10.0
) -> None:
    """SIGTERM each process still running; SIGKILL one that has not exited after `grace` s."""
    for process in processes:
        if process is None or process.returncode is not None:
            continue
        process.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(process.wait(), grace)
        except TimeoutError:
            process.kill()
            await process.wait()


async def kubectl(
    running: InProcessStack, *args: str, stdin: str | None = None, check: bool = True
) -> str:
    """kubectl against the stack's simulator: its output, and with `check=False` its errors
    too instead of failing the test on a non-zero exit."""
    assert KUBECTL is not None
    kubeconfig = Path(running.sim.kubeconfig_path)
    proc = await asyncio.create_subprocess_exec(
        KUBECTL,
        f"--kubeconfig={kubeconfig}",
        *args,
        stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "KUBECACHEDIR": str(kubeconfig.parent / "kubectl-cache")},
    )
    out, err = await asyncio.wait_for(
        proc.communicate(stdin.encode() if stdin is not None else None), 60
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"kubectl {' '.join(args)} failed: {err.decode()}{out.decode()}")
    return out.decode() + ("" if check else err.decode())


class KubectlWatch:
    """`kubectl get ARGS --watch --output=json` in the background: every JSON document kubectl
    prints, in the API server's order, the existing objects first, so states an object only
    passes through (a condition set just before an eviction) are seen too."""

    def __init__(self, kubeconfig: Path, *args: str) -> None:
        self.kubeconfig = kubeconfig
        self.args = args
        self.documents: list[dict[str, Any]] = []
        self._buffer = ""
        self._process: asyncio.subprocess.Process | None = None
        self._reader: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Self:
        assert KUBECTL is not None
        self._process = await asyncio.create_subprocess_exec(
            KUBECTL,
            f"--kubeconfig={self.kubeconfig}",
            "get",
            *self.args,
            "--watch",
            "--output=json",
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
            env={**os.environ, "KUBECACHEDIR": str(self.kubeconfig.parent / "kubectl-cache")},
        )
        self._reader = asyncio.create_task(self._read())
        return self

    async def _read(self) -> None:
        assert self._process is not None and self._process.stdout is not None
        decoder = json.JSONDecoder()
        while chunk := await self._process.stdout.read(65536):
            self._buffer += chunk.decode()
            while self._buffer.strip():
                try:
                    document, end = decoder.raw_decode(self._buffer.lstrip())
                except json.JSONDecodeError:
                    break  # a document still arriving
                self._buffer = self._buffer.lstrip()[end:]
                self.documents.append(document)

    def assert_unbroken(self) -> None:
        """kubectl still watching: no event can have been missed."""
        assert self._process is not None
        assert self._process.returncode is None, f"kubectl get {self.args} --watch ended early"

    async def __aexit__(self, *_: object) -> None:
        if self._process is not None and self._process.returncode is None:
            self._process.kill()
            await self._process.wait()
        if self._reader is not None:
            await asyncio.wait_for(self._reader, 10)
