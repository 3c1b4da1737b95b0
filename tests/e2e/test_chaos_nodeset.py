"""Chaos on a NodeSet, the whole stack as `make run` starts it (8 nodes): kill -9 of the
services and nats-server at seeded random points (the seed is printed; CHAOS_SEED=<seed>
replays it) during a scale-in with Slurm jobs running and during a rolling update, with the
recorder of tests/e2e/chaos_support.py asserting the safety rules and convergence."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from typing import Any

import pytest

from nodeflow_contracts.pod_protocol import SLURM_DELETE_CONDITION
from tests.e2e.chaos_support import (
    NATS,
    NODESETS,
    Monkey,
    Recorder,
    Stack,
    chaos_seed,
    is_true,
    launched_stack,
    recording,
    summary,
    terminating,
    wait_until,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

TOPOLOGY = "spines=1,blocks_per_spine=2,nodes_per_block=4"
REVISION = "controller-revision-hash"


def template(version: str) -> dict[str, Any]:
    return {
        "metadata": {"labels": {"app": "slurmd"}},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "slurmd",
                    "image": "slurmd:24.11",
                    "env": [{"name": "VERSION", "value": version}],
                    "resources": {"requests": {"cpu": "1"}},
                }
            ],
        },
    }


def nodeset(name: str, replicas: int) -> dict[str, Any]:
    return {
        "apiVersion": "nodeflow.dev/v1alpha1",
        "kind": "NodeSet",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "replicas": replicas,
            "slurmCluster": "sim",
            "template": template("v1"),
            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}},
        },
    }


async def ready_and_idle(stack: Stack, recorder: Recorder, name: str, count: int) -> list[str]:
    """Wait until `count` pods of `name` are Ready and their Slurm nodes IDLE."""

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

    await wait_until(settled, 90, f"{count} pods of {name} Ready and idle in Slurm")
    return sorted(p["metadata"]["name"] for p in recorder.live_pods(name))


async def test_chaos_scale_in_with_running_jobs_deletes_no_busy_pod(tmp_path: Path) -> None:
    rng = random.Random(chaos_seed())
    async with (
        launched_stack(tmp_path / "run", 8, TOPOLOGY) as stack,
        recording(stack) as recorder,
    ):
        await stack.kube.create(NODESETS, nodeset("scale", 6))
        names = await ready_and_idle(stack, recorder, "scale", 6)
        jobs = {name: await stack.slurm.run_job(name) for name in names}

        async def all_busy() -> bool:
            states = await stack.slurm.nodes()
            return all("ALLOCATED" in states.get(name, []) for name in names)

        await wait_until(all_busy, 60, "every Slurm node running its job")
        await stack.kube.merge_patch(f"{NODESETS}/scale", {"spec": {"replicas": 2}})
        monkey = Monkey(stack, rng)
        chaos = asyncio.create_task(
            monkey.run(
                ["nodeset-controller", "k8s-watcher", "slurm-syncer", "metrics-exporter", NATS],
                pause=(0.3, 2.5),
            )
        )

        def marked() -> list[str]:
            return sorted(
                p["metadata"]["name"]
                for p in recorder.live_pods("scale")
                if is_true(p, SLURM_DELETE_CONDITION)
            )

        async def four_marked() -> bool:
            return len(marked()) == 4

        await wait_until(four_marked, 90, "four busy pods marked SlurmDelete")
        # The busy pods wait, drained, through the first half of the kills.
        await asyncio.wait_for(monkey.half_done.wait(), 300)
        leaving = marked()
        assert len(leaving) == 4, f"the pods marked for deletion changed: {leaving}"
        for name in rng.sample(leaving, len(leaving)):
            await stack.slurm.end_job(jobs[name])
            await asyncio.sleep(rng.uniform(0.2, 2.0))
        kills = await chaos

        kept = sorted(set(names) - set(leaving))

        def scaled_in() -> bool:
            pods = [
                p
                for p in recorder.pods.values()
                if p["metadata"].get("labels", {}).get("nodeflow.dev/nodeset") == "scale"
            ]
            return sorted(p["metadata"]["name"] for p in pods) == kept and all(
                is_true(p, "Ready")
                and not terminating(p)
                and not is_true(p, SLURM_DELETE_CONDITION)
                for p in pods
            )

        took = await recorder.converged(scaled_in, monkey.last_kill, "scale-in to 2 pods")
        print(f"scale-in converged {took:.1f} s after the last kill; {summary(kills)}")
        running = await stack.slurm.jobs()
        for name in kept:  # the pods that stay never lost their jobs
            assert "RUNNING" in running[jobs[name]][0], (name, running[jobs[name]])
            await stack.slurm.end_job(jobs[name])
        recorder.assert_quiescent()


async def test_chaos_rolling_update_keeps_the_unavailable_budget(tmp_path: Path) -> None:
    rng = random.Random(chaos_seed())
    async with (
        launched_stack(tmp_path / "run", 8, TOPOLOGY) as stack,
        recording(stack) as recorder,
    ):
        await stack.kube.create(NODESETS, nodeset("roll", 4))
        names = await ready_and_idle(stack, recorder, "roll", 4)
        old = {recorder.pods[name]["metadata"]["labels"][REVISION] for name in names}
        assert len(old) == 1
        recorder.arm_rolling_budget("roll", replicas=4, max_unavailable=1)
        await stack.kube.merge_patch(f"{NODESETS}/roll", {"spec": {"template": template("v2")}})
        monkey = Monkey(stack, rng)
        kills = await monkey.run(
            ["nodeset-controller", "k8s-watcher", "slurm-syncer", NATS], pause=(0.3, 2.5)
        )

        def rolled_out() -> bool:
            pods = [
                p
                for p in recorder.pods.values()
                if p["metadata"].get("labels", {}).get("nodeflow.dev/nodeset") == "roll"
            ]
            return len(pods) == 4 and all(
                is_true(p, "Ready")
                and not terminating(p)
                and p["metadata"]["labels"].get(REVISION) not in old
                for p in pods
            )

        took = await recorder.converged(rolled_out, monkey.last_kill, "rolling update of 4 pods")
        print(
            f"rolling update converged {took:.1f} s after the last kill (worst unavailable "
            f"{recorder.rolling['roll'].worst}); {summary(kills)}"
        )
        recorder.assert_quiescent()
