"""SIGTERM while a service is handling messages loses none (issue 2): k8s-watcher, a real
process, is stopped in the middle of a stream of slow pod-create commands; a second process
applies the rest, and every command ends applied exactly once."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp

from clustersim.kube.server import serve
from clustersim.kube.store import Store
from clustersim.runner import DEFAULT_CRD_DIR, apply_crds
from nodeflow_bus import Bus, ensure_topology
from nodeflow_contracts import subjects
from nodeflow_contracts.codec import decode
from nodeflow_contracts.k8s import CommandOutcome, CreateObject, K8sCommand, ObjectRef
from nodeflow_contracts.permissions import ADMIN_USER
from nodeflow_runtime.natsd import NatsServerProcess, free_port

COMMANDS = 24


def pod(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]},
    }


def create_command(index: int) -> K8sCommand:
    name = f"sigterm-{index:03d}"
    return K8sCommand(
        idempotency_key=f"sigterm-test-{index}",
        # The operators' sender: k8s-watcher's policy allows it any command.
        sender=ADMIN_USER,
        sent_at=time.time(),
        target=ObjectRef(api_version="v1", kind="Pod", name=name, namespace="default"),
        operation=CreateObject(object=pod(name)),
    )


async def start_watcher(
    nats_url: str, kubeconfig: Path, log_file: Path
) -> tuple[asyncio.subprocess.Process, str]:
    port = free_port()
    env = {
        **os.environ,
        "NATS_URL": nats_url,
        "KUBECONFIG": str(kubeconfig),
        "HTTP_HOST": "127.0.0.1",
        "HTTP_PORT": str(port),
        "SHUTDOWN_DEADLINE_SECONDS": "10",
        "COMMAND_CONCURRENCY": "4",
        "WATCHED_KINDS": "Pod",
    }
    with log_file.open("ab") as handle:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "k8s_watcher", stdout=handle, stderr=handle, env=env
        )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < deadline:
            try:
                async with session.get(f"{base}/readyz") as response:
                    if response.status == 200:
                        return process, base
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.1)
    raise AssertionError(f"k8s-watcher not ready:\n{log_file.read_text()[-3000:]}")


async def test_sigterm_during_handling_loses_no_command(
    nats_server: NatsServerProcess, bus: Bus, tmp_path: Path
) -> None:
    await ensure_topology(bus.js)
    outcomes: list[CommandOutcome] = []

    async def on_outcome(msg: Any) -> None:
        outcome = decode(CommandOutcome, msg.data, subject=msg.subject)
        # This test's commands only: not the Lease each k8s-watcher mirrors its leadership
        # into (nodeflow_bus.kube_lease; its namespace does not exist in this bare API).
        if outcome.sender == ADMIN_USER:
            outcomes.append(outcome)

    await bus.nc.subscribe(subjects.K8S_OUTCOMES, cb=on_outcome)
    dead_letters: list[str] = []

    async def on_dead_letter(msg: Any) -> None:
        dead_letters.append(msg.subject)

    await bus.nc.subscribe(subjects.DEAD_LETTERS, cb=on_dead_letter)

    store = Store()
    apply_crds(store, DEFAULT_CRD_DIR)
    async with serve(store, kubeconfig_path=tmp_path / "kubeconfig") as api:
        # Slow API calls keep several commands in flight when SIGTERM arrives.
        async with aiohttp.ClientSession() as session:
            await session.post(f"{api.url}/_sim/faults", json={"latency_ms": 150})
        log_file = tmp_path / "watcher.log"
        first, _ = await start_watcher(nats_server.url, api.kubeconfig_path, log_file)
        for index in range(COMMANDS):
            command = create_command(index)
            await bus.publish(command.subject, command, msg_id=command.idempotency_key)
        deadline = time.monotonic() + 30
        while not any(o.outcome == "applied" for o in outcomes):
            assert time.monotonic() < deadline, "no command applied before SIGTERM"
            await asyncio.sleep(0.02)
        first.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(first.wait(), 30) == 0
        applied_by_first = {o.idempotency_key for o in outcomes if o.outcome == "applied"}
        assert len(applied_by_first) < COMMANDS, "SIGTERM came after all work was done"

        second, _ = await start_watcher(nats_server.url, api.kubeconfig_path, log_file)
        try:
            final = {"applied", "already-applied"}
            deadline = time.monotonic() + 60
            while len({o.idempotency_key for o in outcomes if o.outcome in final}) < COMMANDS:
                assert time.monotonic() < deadline, (
                    f"{len(outcomes)} outcomes; log:\n{log_file.read_text()[-3000:]}"
                )
                await asyncio.sleep(0.05)
        finally:
            second.send_signal(signal.SIGTERM)
            await asyncio.wait_for(second.wait(), 30)

        names = sorted(p["metadata"]["name"] for p in store.list("pods", namespace="default").items)
        assert names == [f"sigterm-{i:03d}" for i in range(COMMANDS)]
        assert not [o for o in outcomes if o.outcome not in {"applied", "already-applied"}]
        assert dead_letters == []
