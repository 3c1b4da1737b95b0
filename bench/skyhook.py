"""maintenance-scheduler's Skyhook controller: one planning round at scale, and Jobs on the
simulator.

1. Planning round: a Skyhook of three packages (one with a reboot interrupt) over 4,000
   nodes under an exponential DeploymentPolicy with a canary compartment, mid-rollout (1,000
   nodes complete, 255 in progress with running Jobs, the rest waiting), plus a second
   Skyhook behind it by priority: the time of `plan_round` (parsing the node states,
   compartments, batches, every node's step and the status) and of reading the raw objects
   into its input first (median of 15 rounds). Target: under 50 ms.
2. Jobs on the simulator: stage Jobs as the controller builds them, created through the
   simulator's store on a 200-node cluster; figures: Jobs created per second, and seconds
   until every Job is Complete. BENCH_SKYHOOK_JOBS changes the count (default 1,000).
"""

from __future__ import annotations

import asyncio
import os
import statistics
import time
from typing import Any

from clustersim.cluster.spec import ClusterSpec
from clustersim.runner import SimulatorConfig, run_simulator
from maintenance_scheduler.skyhook.api import (
    NODE_STATE_VERSION,
    SKYHOOK_FINALIZER,
    erroring_condition,
    node_state_annotation,
    not_ready_condition,
    parse_deployment_policy,
    parse_skyhook,
    status_key,
    version_annotation,
)
from maintenance_scheduler.skyhook.jobs import build_job, job_name
from maintenance_scheduler.skyhook.observe import NodeViews
from maintenance_scheduler.skyhook.plan import World, plan_round
from maintenance_scheduler.skyhook.stages import JobFacts, PackageState, render_node_state
from nodeflow_kube.fields import (
    rfc3339,
)

NODES = 4_000
COMPLETE_NODES = 1_000
IN_PROGRESS_NODES = 255
ROUNDS = 15
TARGET_MS = 50.0
T0 = 1_800_000_000.0

PACKAGES: dict[str, Any] = {
    "driver": {"version": "1.2.0", "image": "registry.local/driver"},
    "tuning": {
        "version": "0.4.0",
        "image": "registry.local/tuning",
        "dependsOn": {"driver": "1.2.0"},
    },
    "kernel": {
        "version": "6.1.0",
        "image": "registry.local/kernel",
        "interrupt": {"type": "reboot"},
    },
}


def raw_objects() -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, Any], Any]:
    policy = {
        "metadata": {"name": "careful", "uid": "p1", "resourceVersion": "1"},
        "spec": {
            "default": {
                "budget": {"percent": 100},
                "strategy": {"exponential": {"initialBatch": 1, "failureThreshold": 3}},
            },
            "compartments": [
                {
                    "name": "canary",
                    "selector": {"matchLabels": {"canary": "true"}},
                    "budget": {"count": 10},
                    "strategy": {"fixed": {"initialBatch": 5}},
                }
            ],
        },
    }
    status: dict[str, Any] = {"compartmentStatuses": {}, "nodePriority": {}}
    skyhooks = [
        {
            "metadata": {
                "name": "gpu-init",
                "uid": "s1",
                "resourceVersion": "7",
                "finalizers": [SKYHOOK_FINALIZER],
            },
            "spec": {"packages": PACKAGES, "deploymentPolicy": "careful", "priority": 100},
            "status": status,
        },
        {
            "metadata": {
                "name": "later",
                "uid": "s2",
                "resourceVersion": "3",
                "finalizers": [SKYHOOK_FINALIZER],
            },
            "spec": {"packages": {"extra": {"version": "1.0.0", "image": "registry.local/x"}}},
        },
    ]
    done = {
        name: PackageState(
            name,
            spec["version"],
            spec["image"],
            "post-interrupt" if name == "kernel" else "config",
            "complete",
        )
        for name, spec in PACKAGES.items()
    }
    nodes: list[dict[str, Any]] = []
    jobs: dict[str, JobFacts] = {}
    for index in range(NODES):
        name = f"gpu-{index:05d}"
        annotations: dict[str, str] = {}
        labels = {"canary": "true"} if index % 400 == 0 else {}
        # The node conditions the controller wrote (steady state: none is written again).
        conditions: list[dict[str, str]] = []
        if index < COMPLETE_NODES + IN_PROGRESS_NODES:
            complete = index < COMPLETE_NODES
            conditions = [
                {
                    "type": not_ready_condition("gpu-init"),
                    "status": "False" if complete else "True",
                    "reason": "Complete" if complete else "Incomplete",
                },
                {
                    "type": erroring_condition("gpu-init"),
                    "status": "False",
                    "reason": "Not Erroring",
                },
            ]
        if index < COMPLETE_NODES:
            annotations[node_state_annotation("gpu-init")] = render_node_state(done)
            annotations[version_annotation("gpu-init")] = NODE_STATE_VERSION
            annotations[status_key("gpu-init")] = labels[status_key("gpu-init")] = "complete"
        elif index < COMPLETE_NODES + IN_PROGRESS_NODES:
            running = {
                "driver": PackageState(
                    "driver", "1.2.0", "registry.local/driver", "apply", "in_progress"
                )
            }
            annotations[node_state_annotation("gpu-init")] = render_node_state(running)
            annotations[version_annotation("gpu-init")] = NODE_STATE_VERSION
            annotations[status_key("gpu-init")] = labels[status_key("gpu-init")] = "in_progress"
            status["nodePriority"][name] = rfc3339(T0)
            job = job_name("gpu-init", "driver", "1.2.0", "apply", name)
            jobs[job] = JobFacts(job, "running")
        nodes.append(
            {
                "metadata": {
                    "name": name,
                    "uid": f"u{index}",
                    "resourceVersion": str(index + 10),
                    "creationTimestamp": rfc3339(T0 + index),
                    "labels": labels,
                    "annotations": annotations,
                },
                "status": {"conditions": conditions},
            }
        )
    return skyhooks, nodes, policy, jobs


def plan_bench(skyhook_count: int) -> None:
    skyhooks_raw, nodes_raw, policy_raw, jobs = raw_objects()
    skyhooks_raw = skyhooks_raw[:skyhook_count]
    plan_times: list[float] = []
    total_times: list[float] = []
    actions = 0
    # As in the service: node views are kept while their resourceVersion does not change.
    views = NodeViews()
    by_name = {n["metadata"]["name"]: n for n in nodes_raw}
    for _ in range(ROUNDS):
        started = time.perf_counter()
        skyhooks = [parse_skyhook(s) for s in skyhooks_raw]
        policy = parse_deployment_policy(policy_raw)
        nodes = views.read(by_name)
        world = World(skyhooks, {policy.name: policy}, nodes, jobs, {})
        planned = time.perf_counter()
        plan = plan_round(world, now=T0 + 60)
        finished = time.perf_counter()
        plan_times.append((finished - planned) * 1000)
        total_times.append((finished - started) * 1000)
        actions = len(plan.actions)
    plan_ms = statistics.median(plan_times)
    total_ms = statistics.median(total_times)
    what = f"{NODES} nodes, {skyhook_count} Skyhook(s)"
    print(f"plan_round, {what}: {plan_ms:.1f} ms (median of {ROUNDS}, {actions} actions)")
    if skyhook_count == 1:
        verdict = "ok" if total_ms < TARGET_MS else "OVER TARGET"
        print(
            f"reading objects + plan_round, {what}: {total_ms:.1f} ms, "
            f"target < {TARGET_MS:.0f} ms: {verdict} "
            f"(ratio to target {total_ms / TARGET_MS:.2f}; fastest round "
            f"{min(total_times):.1f} ms, ratio {min(total_times) / TARGET_MS:.2f})"
        )
    else:
        print(f"reading objects + plan_round, {what}: {total_ms:.1f} ms")


async def jobs_bench() -> None:
    count = int(os.environ.get("BENCH_SKYHOOK_JOBS", "1000"))
    config = SimulatorConfig(
        cluster=ClusterSpec(nodes=200),
        kubelet_delay=0.01,
        job_runtime=0.2,
        start_admin_server=False,
    )
    skyhook = parse_skyhook(
        {"metadata": {"name": "bench", "uid": "b1"}, "spec": {"packages": PACKAGES}}
    )
    package = skyhook.packages[0]
    async with run_simulator(config) as sim:
        nodes = sim.node_names()
        bodies = [
            build_job(
                skyhook,
                package,
                "apply",
                nodes[i % len(nodes)],
                namespace="default",
                default_stage_timeout_seconds=600,
            )
            for i in range(count)
        ]
        for i, body in enumerate(bodies):
            body["metadata"]["name"] = f"{body['metadata']['name'][:50]}-{i}"
            # The owner is not in this store: without it the garbage collector would take them.
            body["metadata"]["ownerReferences"] = []
        started = time.perf_counter()
        for body in bodies:
            sim.store.create("jobs.batch", body)
        created = time.perf_counter() - started

        def complete() -> int:
            done = 0
            for job in sim.store.list("jobs.batch", "default").items:
                conditions = (job.get("status") or {}).get("conditions") or []
                if any(
                    c.get("type") == "Complete" and c.get("status") == "True" for c in conditions
                ):
                    done += 1
            return done

        deadline = time.monotonic() + 600
        while complete() < count and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.5)
        finished = time.perf_counter() - started
    print(f"Jobs created on the simulator: {count / created:.0f}/s ({count} Jobs)")
    rate = count / finished
    print(f"all {count} Jobs Complete after {finished:.1f} s ({rate:.0f} Jobs/s end to end)")


def calibration_ms() -> float:
    """A fixed pure-Python loop, so figures from a loaded machine can be read fairly."""
    times = []
    for _ in range(5):
        started = time.perf_counter()
        sum(range(1_000_000))
        times.append((time.perf_counter() - started) * 1000)
    return min(times)


async def main() -> None:
    print(
        f"this machine: sum(range(10**6)) takes {calibration_ms():.1f} ms "
        "(about 10 ms on one idle current core)"
    )
    plan_bench(1)
    # The second Skyhook, behind the first by priority, starts on the 1,000 complete nodes.
    plan_bench(2)
    await jobs_bench()
