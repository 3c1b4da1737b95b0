"""`python -m nodeset_controller` as a real process on the whole stack: it becomes ready,
scales a NodeSet, is killed with SIGKILL in the middle of a scale-in, and a new process
finishes the job from Kubernetes state alone (no duplicate pod, no premature deletion)."""

from __future__ import annotations

import asyncio
import signal
from typing import Any

from nodeflow_runtime.natsd import free_port
from tests.e2e import processes
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
    return await processes.start_service(
        "nodeset_controller",
        running,
        port,
        name,
        IN_FLIGHT_TIMEOUT_SECONDS="5",
        # A new process waits out the earlier one's commands (this plus a margin).
        COMMAND_LIFETIME_SECONDS="2",
    )


async def test_nodeset_controller_process_killed_mid_scale_in(stack: Stack) -> None:
    port = free_port()
    process = await start_process(stack, port, "e2e-1")
    second: asyncio.subprocess.Process | None = None
    try:
        await processes.wait_ready(port, "controller process")
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
        await processes.wait_ready(port, "controller process")
        await eventually(lambda: len(stack.pods("gpu")) == 1, timeout=25, what="scale-in finished")
        assert added == []
        # A status write the killed leader recorded in the command ledger and died before
        # sending is fenced by its resourceVersion: the new leader does not wait it out (its
        # 20 s lifetime plus the ledger's 40 s landing margin), it writes the status now.
        await eventually(
            lambda: stack.status("gpu").get("currentNumberScheduled") == 1,
            timeout=15,
            what="the status written by the new leader",
        )
    finally:
        await processes.stop_processes(process, second)
