"""The README's ten-minute tour, verbatim, on `make run`'s stack (the launcher, 16 nodes): each
`sh` block of the section runs in bash with `set -euo pipefail` from a directory whose `.run` is
the stack's, so a command that fails (an API path, a jq filter on an error, a missing example)
fails the test; between blocks the test waits for what the tour says happens, and checks it
happened: eight Slurm nodes, the job running, the scale-in done only once the job ended, the
NodeMaintenance's node cordoned then uncordoned, and the gang bound whole inside one block."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.test_make_run import read_until_ready

ROOT = Path(__file__).resolve().parents[2]
SECTION = "## A ten-minute tour"
STEP_TIMEOUT = 60.0

pytestmark = pytest.mark.slow


def tour_blocks() -> list[str]:
    text = (ROOT / "README.md").read_text()
    start = text.index(SECTION)
    end = text.find("\n## ", start + len(SECTION))
    section = text[start : end if end != -1 else len(text)]
    return re.findall(r"```sh\n(.*?)```", section, re.DOTALL)


def test_the_tour_has_its_setup_and_five_steps() -> None:
    blocks = tour_blocks()
    assert len(blocks) == 6
    assert ". .run/env" in blocks[0] and "slurm()" in blocks[0]


class Tour:
    def __init__(self, workdir: Path, setup: str) -> None:
        self.workdir = workdir
        self.setup = setup

    async def bash(self, script: str) -> str:
        process = await asyncio.create_subprocess_exec(
            "bash",
            "-c",
            f"set -euo pipefail\n{self.setup}\n{script}",
            cwd=self.workdir,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        output, _ = await process.communicate()
        text = output.decode(errors="replace")
        assert process.returncode == 0, f"{script}\n---\n{text}"
        return text

    async def json(self, script: str) -> Any:
        return json.loads(await self.bash(script))

    async def until(self, check: Callable[[], Awaitable[bool]], what: str) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + STEP_TIMEOUT
        while not await check():
            assert loop.time() < deadline, f"not within {STEP_TIMEOUT:.0f} s: {what}"
            await asyncio.sleep(0.5)

    async def slurm_nodes(self) -> dict[str, list[str]]:
        nodes = await self.json("slurm /nodes")
        return {node["name"]: node["state"] for node in nodes["nodes"]}

    async def nodeset_pods(self) -> list[dict[str, Any]]:
        pods = await self.json("kubectl get pods -l nodeflow.dev/nodeset=gpu -o json")
        return [p for p in pods["items"] if not p["metadata"].get("deletionTimestamp")]


@pytest.fixture
async def tour(tmp_path: Path) -> AsyncIterator[Tour]:
    for tool in ("kubectl", "jq", "curl"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed: the tour's commands need it")
    run_dir = tmp_path / "run"
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "nodeflow_runtime.launcher",
        "--run-dir",
        str(run_dir),
        "--nats-port",
        "0",
        "--log-level",
        "warning",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        await read_until_ready(process, timeout=180)
        workdir = tmp_path / "work"
        workdir.mkdir()
        (workdir / ".run").symlink_to(run_dir)
        (workdir / "k8s").symlink_to(ROOT / "k8s")
        yield Tour(workdir, tour_blocks()[0])
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGINT)
            try:
                await asyncio.wait_for(process.wait(), 90)
            except TimeoutError:
                process.kill()
                await process.wait()


async def test_the_readme_tour_works_on_make_run(tour: Tour) -> None:
    _, scale, job, scale_in, maintenance, gang = tour_blocks()

    await tour.bash(scale)

    async def eight_idle_slurm_nodes() -> bool:
        states = await tour.slurm_nodes()
        return len(states) == 8 and all(s == ["IDLE"] for s in states.values())

    await tour.until(eight_idle_slurm_nodes, "eight Slurm nodes, one per NodeSet pod")

    await tour.bash(job)

    async def job_running_on_eight_nodes() -> bool:
        jobs = (await tour.json("slurm /jobs"))["jobs"]
        return [j["job_state"] for j in jobs if j["job_id"] == 1] == [["RUNNING"]]

    await tour.until(job_running_on_eight_nodes, "job 1 running")

    # Step 3 ends the job right after the scale-in: the pods go once their node is idle.
    await tour.bash(scale_in)

    async def four_pods_left() -> bool:
        return len(await tour.nodeset_pods()) == 4

    await tour.until(four_pods_left, "the NodeSet scaled in to four pods")
    events = await tour.bash("kubectl get events --field-selector involvedObject.kind=NodeSet")
    assert "drained and idle in Slurm" in events

    await tour.bash(maintenance)
    nodes = await tour.json("kubectl get nodes -o json")
    assert not any(n["spec"].get("unschedulable") for n in nodes["items"]), "left cordoned"

    await tour.bash(gang)

    async def gang_bound() -> bool:
        pods = await tour.json("kubectl get pods -l pod-group.scheduling.sigs.k8s.io=train -o json")
        return len(pods["items"]) == 4 and all(p["spec"].get("nodeName") for p in pods["items"])

    await tour.until(gang_bound, "the four trainers bound")
    pods = await tour.json("kubectl get pods -l pod-group.scheduling.sigs.k8s.io=train -o json")
    nodes = {
        n["metadata"]["name"]: n for n in (await tour.json("kubectl get nodes -o json"))["items"]
    }
    blocks = {
        nodes[p["spec"]["nodeName"]]["metadata"]["labels"]["network.topology.nvidia.com/block"]
        for p in pods["items"]
    }
    assert len(blocks) == 1, blocks
