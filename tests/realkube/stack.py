"""The whole stack on the real control plane, as `make run KUBE=real` runs it: the Slurm
emulator following the API server's NodeSet pods (clustersim.bridge, in this process), and the
launcher with NATS and the six services as processes, k8s-watcher authenticated as its own
ServiceAccount with exactly k8s/rbac. The test sees it through the chaos suite's Stack, Kube
(over HTTPS with the admin's token) and Slurm, so the same recorder of safety rules watches."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import ssl
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from clustersim.bridge import run_slurm_bridge
from clustersim.runner import SimulatorConfig
from nodeflow_runtime.envfile import read_env_file
from tests.e2e.chaos_support import (
    CHAOS_ENV,
    NODESETS,
    PODS,
    READY_LINE,
    Kube,
    LauncherOutput,
    Recorder,
    Slurm,
    Stack,
    is_true,
)
from tests.realkube.support import STEP_TIMEOUT, admin_kubeconfig, until
from tests.realkube.watcher_identity import watcher_kubeconfig


def admin_session() -> aiohttp.ClientSession:
    """An HTTP session that reaches the real API server as its admin (bearer token, its CA)."""
    config = yaml.safe_load(admin_kubeconfig().read_text())
    token = config["users"][0]["user"]["token"]
    ca = config["clusters"][0]["cluster"]["certificate-authority"]
    return aiohttp.ClientSession(
        headers={"Authorization": f"Bearer {token}"},
        connector=aiohttp.TCPConnector(ssl=ssl.create_default_context(cafile=ca)),
    )


@contextlib.asynccontextmanager
async def real_stack(
    directory: Path, as_watcher: Path | None = None, env: dict[str, str] | None = None
) -> AsyncIterator[Stack]:
    """The stack, ready; stopped with SIGINT at the end (killed if it overstays). k8s-watcher
    authenticates with `as_watcher` (default: k8s/rbac's ServiceAccount); `env` adds settings
    for the services."""
    if as_watcher is None:
        as_watcher = await watcher_kubeconfig(directory)
    simulator = SimulatorConfig(run_dir=directory / "bridge", slurm_driver_interval=0.2)
    async with (
        run_slurm_bridge(simulator, admin_kubeconfig()) as bridge,
        admin_session() as kube_session,
        aiohttp.ClientSession() as slurm_session,
    ):
        bridge_env = read_env_file(bridge.env_path)
        run_dir = directory / "run"
        launcher = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "nodeflow_runtime.launcher",
            "--run-dir",
            str(run_dir),
            "--no-sim",
            "--nats-port",
            "0",
            "--log-level",
            "warning",
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            env={
                **os.environ,
                **bridge_env,
                "KUBECONFIG": str(as_watcher),
                **CHAOS_ENV,
                **(env or {}),
                "PYTHONUNBUFFERED": "1",
            },
        )
        output = LauncherOutput(launcher)
        try:
            await output.wait_for(READY_LINE, 0, timeout=150)
            env = {**bridge_env, **read_env_file(run_dir / "env")}
            yield Stack(
                run_dir,
                launcher,
                output,
                env,
                kube_session,
                Kube(kube_session, bridge.kube_url),
                Slurm(slurm_session, bridge_env),
            )
        finally:
            if launcher.returncode is None:
                launcher.send_signal(signal.SIGINT)
                try:
                    await asyncio.wait_for(launcher.wait(), 90)
                except TimeoutError:
                    launcher.kill()
                    await launcher.wait()
            await output.close()


def nodeset_pods(recorder: Recorder, name: str) -> list[dict[str, Any]]:
    """Every pod of the NodeSet the recorder knows, terminating ones included."""
    return [
        p
        for p in recorder.pods.values()
        if (p["metadata"].get("labels") or {}).get("nodeflow.dev/nodeset") == name
    ]


async def ready_and_idle(stack: Stack, recorder: Recorder, name: str, count: int) -> list[str]:
    """Wait until `count` pods of `name` are Ready and their Slurm nodes IDLE; their names."""

    async def settled() -> bool:
        pods = recorder.live_pods(name)
        if len(pods) != count or not all(is_true(p, "Ready") for p in pods):
            return False
        states = await stack.slurm.nodes()
        return all(
            "IDLE" in states.get(p["metadata"]["name"], [])
            and "DRAIN" not in states[p["metadata"]["name"]]
            for p in pods
        )

    await until(settled, f"{count} pods of {name} Ready and IDLE in Slurm", STEP_TIMEOUT * 2)
    return sorted(p["metadata"]["name"] for p in recorder.live_pods(name))


async def remove_nodeset(stack: Stack, recorder: Recorder, name: str) -> None:
    """Scale the NodeSet to 0 (its pods leave through safe deletion), then delete it, while
    the stack still runs; the next test starts from an empty namespace."""
    for job, (states, _) in (await stack.slurm.jobs()).items():
        if "RUNNING" in states or "PENDING" in states:
            await stack.slurm.end_job(job)
    with contextlib.suppress(RuntimeError):  # a test that failed before creating it
        await stack.kube.merge_patch(f"{NODESETS}/{name}", {"spec": {"replicas": 0}})

    async def no_pods() -> bool:
        return not nodeset_pods(recorder, name)

    await until(no_pods, f"every pod of {name} gone", STEP_TIMEOUT * 2)
    with contextlib.suppress(RuntimeError):
        await stack.kube.delete(f"{NODESETS}/{name}")
    assert not [
        p
        for p in await stack.kube.items(PODS)
        if (p["metadata"].get("labels") or {}).get("nodeflow.dev/nodeset") == name
    ]
