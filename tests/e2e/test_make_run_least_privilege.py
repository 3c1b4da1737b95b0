"""`make run` with least privilege: NATS refuses anonymous clients, each service holds only its
own credentials (files 0600, named in its environment, never the secret in .run/env), and the
whole stack scales a NodeSet up and down with those users without one permission violation
or one refused command."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import stat
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import nats
import pytest
from nats.errors import Error as NatsError

from nodeflow_bus import Bus, Credentials
from nodeflow_contracts.permissions import ADMIN_USER, SERVICES
from nodeflow_runtime.envfile import read_env_file
from tests.e2e.test_make_run import read_until_ready
from tests.fixtures.nats import TEST_BUS_OPTIONS

NODESET_PATH = "/apis/nodeflow.dev/v1alpha1/namespaces/default/nodesets"


def nodeset(replicas: int) -> dict[str, Any]:
    return {
        "apiVersion": "nodeflow.dev/v1alpha1",
        "kind": "NodeSet",
        "metadata": {"name": "gpu", "namespace": "default"},
        "spec": {
            "replicas": replicas,
            "slurmCluster": "sim",
            "podNamePrefix": "gpu",
            "template": {
                "metadata": {"labels": {"nodeflow.dev/nodeset": "gpu"}},
                "spec": {
                    "nodeSelector": {"nvidia.com/gpu.present": "true"},
                    "containers": [{"name": "slurmd", "image": "slurmd:24.11"}],
                },
            },
        },
    }


async def eventually(check: Callable[[], Awaitable[Any]], what: str, timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = await check()
        if value:
            return value
        assert time.monotonic() < deadline, f"not within {timeout}s: {what}"
        await asyncio.sleep(0.2)


def pod_conditions(pod: dict[str, Any]) -> set[str]:
    return {c.get("type", "") for c in (pod.get("status") or {}).get("conditions") or []}


async def test_make_run_grants_each_service_only_its_own_nats_user(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "nodeflow_runtime.launcher",
        *("--run-dir", str(run_dir), "--nodes", "4", "--nats-port", "0"),
        *("--topology", "spines=1,blocks_per_spine=2,nodes_per_block=2"),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        await read_until_ready(process, timeout=120)
        env = read_env_file(run_dir / "env")
        credentials = run_dir / "credentials"
        assert stat.S_IMODE(credentials.stat().st_mode) == 0o700
        files = {path.name for path in credentials.iterdir()}
        assert files == {f"{user}.password" for user in (*SERVICES, ADMIN_USER)}
        for path in credentials.iterdir():
            assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
        # .run/env says where the operators' credentials are, never what they are.
        assert env["NATS_USER"] == ADMIN_USER
        assert Path(env["NATS_PASSWORD_FILE"]) == credentials / f"{ADMIN_USER}.password"
        env_text = (run_dir / "env").read_text()
        for path in credentials.iterdir():
            assert path.read_text().strip() not in env_text
        # Each service process was given its own user and password file, and no other.
        for service in SERVICES:
            pid = int(json.loads((run_dir / "children.json").read_text())[service]["pid"])
            environ = dict(
                item.split("=", 1)
                for item in Path(f"/proc/{pid}/environ").read_text().split("\0")
                if "=" in item
            )
            assert environ["NATS_USER"] == service
            assert environ["NATS_PASSWORD_FILE"] == str(credentials / f"{service}.password")
            assert not {"NATS_PASSWORD", "NATS_TOKEN", "NATS_CREDS_FILE"} & set(environ)

        with pytest.raises(NatsError):
            await nats.connect(
                env["NATS_URL"], allow_reconnect=False, max_reconnect_attempts=0, connect_timeout=2
            )

        admin = await Bus.connect(
            env["NATS_URL"], credentials=Credentials.from_env(env), options=TEST_BUS_OPTIONS
        )
        kube = env["KUBE_API_URL"].rstrip("/")
        async with aiohttp.ClientSession() as session:

            async def nodeset_pods() -> list[dict[str, Any]]:
                async with session.get(
                    f"{kube}/api/v1/namespaces/default/pods",
                    params={"labelSelector": "nodeflow.dev/nodeset=gpu"},
                ) as response:
                    items: list[dict[str, Any]] = (await response.json())["items"]
                    return items

            async with session.post(f"{kube}{NODESET_PATH}", json=nodeset(2)) as response:
                assert response.status == 201, await response.text()

            async def two_pods_with_slurm_state() -> bool:
                pods = await nodeset_pods()
                return len(pods) == 2 and all(
                    any(c.startswith("SlurmNodeState") for c in pod_conditions(p)) for p in pods
                )

            # nodeset-controller creates, k8s-watcher applies, slurm-syncer patches conditions.
            await eventually(two_pods_with_slurm_state, "two NodeSet pods with Slurm state")
            async with session.patch(
                f"{kube}{NODESET_PATH}/gpu",
                json={"spec": {"replicas": 1}},
                headers={"Content-Type": "application/merge-patch+json"},
            ) as response:
                assert response.status == 200, await response.text()

            async def one_pod() -> bool:
                return len(await nodeset_pods()) == 1

            # SlurmDelete, drain in Slurm, delete: every service's part of a scale-in.
            await eventually(one_pod, "scale-in to one pod")

        dead = await admin.js.stream_info("DEAD_LETTERS")
        await admin.close()
        assert dead.state.messages == 0, "a command was refused or could not be handled"
        log = (run_dir / "logs" / "nats-server.log").read_text()
        assert "Violation" not in log, [line for line in log.splitlines() if "Violation" in line]
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGINT)
            try:
                await asyncio.wait_for(process.wait(), 90)
            except TimeoutError:
                process.kill()
                await process.wait()
