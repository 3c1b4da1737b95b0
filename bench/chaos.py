"""Recovery after kill -9, on the whole stack as `make run` starts it with every service
default (8 simulated nodes): for each service and for nats-server, one kill -9, then at once
the next action of a scenario that needs the killed process. Two figures per kill:

* ready again: kill -> the launcher restarted it and its /readyz answers 200 (for
  nats-server: restarted and every service ready again);
* next action: kill -> the scenario's next action observed in the Kubernetes API or Slurm:
  - k8s-watcher, nodeset-controller, nats-server: NodeSet replicas + 1 -> the new pod exists;
  - slurm-syncer: a NodeSet pod's node cordoned -> its Slurm node DRAIN;
  - maintenance-scheduler: a NodeMaintenance created -> it leaves Pending;
  - topology-placer: a gang of one created -> its pod bound;
  - metrics-exporter: /metrics answers with the NodeSet's series.

Each figure is also shown as a ratio to the launcher's first restart backoff and to the leader
lease TTL (a restarted process has a new identity, so it waits out its predecessor's lease
before it acts: the TTL is the floor of a leader's recovery). No targets: these are the
numbers an operator plans an outage with.
"""

from __future__ import annotations

import asyncio
import os
import random
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from clustersim.chaos import (
    NATS,
    NODE_MAINTENANCES,
    NODES,
    NODESETS,
    OPERATOR_CONFIGS,
    OPERATOR_NAMESPACE,
    POD_GROUP_LABEL,
    POD_GROUPS,
    PODS,
    Monkey,
    Recorder,
    Stack,
    condition,
    launched_stack,
    recording,
    wait_until,
)
from nodeflow_runtime.launcher import RESTART_BACKOFF
from nodeflow_runtime.logs import configure_logging
from nodeset_controller.config import NodeSetControllerConfig

NODESET = "bench"
TOPOLOGY = "spines=1,blocks_per_spine=2,nodes_per_block=4"
ACTION_TIMEOUT = 180.0

Probe = Callable[[Stack, Recorder, int], Awaitable[tuple[str, Callable[[], Awaitable[bool]]]]]


def nodeset_object(replicas: int) -> dict[str, Any]:
    return {
        "apiVersion": "nodeflow.dev/v1alpha1",
        "kind": "NodeSet",
        "metadata": {"name": NODESET, "namespace": "default"},
        "spec": {
            "replicas": replicas,
            "slurmCluster": "sim",
            "template": {
                "metadata": {"labels": {"app": "slurmd"}},
                "spec": {
                    "containers": [
                        {
                            "name": "slurmd",
                            "image": "slurmd:24.11",
                            "resources": {"requests": {"cpu": "1"}},
                        }
                    ]
                },
            },
        },
    }


def claimed_nodes(recorder: Recorder) -> set[str]:
    return {str(p["spec"].get("nodeName")) for p in recorder.live_pods(NODESET)}


async def scale_up(
    stack: Stack, recorder: Recorder, step: int
) -> tuple[str, Callable[[], Awaitable[bool]]]:
    wanted = int(recorder.nodesets[NODESET]["spec"]["replicas"]) + 1
    await stack.kube.merge_patch(f"{NODESETS}/{NODESET}", {"spec": {"replicas": wanted}})

    async def created() -> bool:
        return len(recorder.live_pods(NODESET)) >= wanted

    return f"replicas {wanted - 1} -> {wanted}: new pod", created


async def cordon_to_drain(
    stack: Stack, recorder: Recorder, step: int
) -> tuple[str, Callable[[], Awaitable[bool]]]:
    pod = sorted(recorder.live_pods(NODESET), key=lambda p: str(p["metadata"]["name"]))[0]
    name, node = pod["metadata"]["name"], pod["spec"]["nodeName"]
    await stack.kube.merge_patch(f"{NODES}/{node}", {"spec": {"unschedulable": True}})

    async def drained() -> bool:
        return "DRAIN" in (await stack.slurm.nodes()).get(name, [])

    return f"cordon {node} -> Slurm DRAIN of {name}", drained


async def maintenance_starts(
    stack: Stack, recorder: Recorder, step: int
) -> tuple[str, Callable[[], Awaitable[bool]]]:
    node = sorted(set(recorder.nodes) - claimed_nodes(recorder))[-1]
    request = f"bench-{step}"
    await stack.kube.create(
        NODE_MAINTENANCES,
        {
            "apiVersion": "maintenance.nvidia.com/v1alpha1",
            "kind": "NodeMaintenance",
            "metadata": {"name": request, "namespace": "default"},
            "spec": {"requestorID": "bench.nodeflow.dev", "nodeName": node, "cordon": True},
        },
    )

    async def started() -> bool:
        obj = recorder.maintenances.get(request)
        reason = (condition(obj, "Ready") or {}).get("reason") if obj else None
        return reason not in (None, "", "Pending")

    return f"NodeMaintenance on {node} -> past Pending", started


async def gang_bound(
    stack: Stack, recorder: Recorder, step: int
) -> tuple[str, Callable[[], Awaitable[bool]]]:
    group = f"solo-{step}"
    await stack.kube.create(
        POD_GROUPS,
        {
            "apiVersion": "scheduling.sigs.k8s.io/v1alpha1",
            "kind": "PodGroup",
            "metadata": {"name": group, "namespace": "default"},
            "spec": {"minMember": 1},
        },
    )
    await stack.kube.create(
        PODS,
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": group, "namespace": "default", "labels": {POD_GROUP_LABEL: group}},
            "spec": {
                "schedulerName": "nodeflow-placer",
                "containers": [
                    {"name": "t", "image": "t:1", "resources": {"requests": {"cpu": "1"}}}
                ],
            },
        },
    )

    async def bound() -> bool:
        return bool(((recorder.pods.get(group) or {}).get("spec") or {}).get("nodeName"))

    return "gang of one -> bound", bound


async def metrics_served(
    stack: Stack, recorder: Recorder, step: int
) -> tuple[str, Callable[[], Awaitable[bool]]]:
    url = stack.env["METRICS_EXPORTER_URL"] + "/metrics"

    async def served() -> bool:
        try:
            async with stack.session.get(url) as response:
                return response.status == 200 and NODESET in await response.text()
        except Exception:
            return False

    return "/metrics with the NodeSet's series", served


PROBES: list[tuple[str, Probe]] = [
    ("k8s-watcher", scale_up),
    ("nodeset-controller", scale_up),
    ("slurm-syncer", cordon_to_drain),
    ("maintenance-scheduler", maintenance_starts),
    ("topology-placer", gang_bound),
    ("metrics-exporter", metrics_served),
    (NATS, scale_up),
]


def ratios(seconds: float, backoff: float, ttl: float) -> str:
    return f"{seconds:5.1f} s ({seconds / backoff:4.1f} x backoff, {seconds / ttl:4.2f} x TTL)"


async def main() -> None:
    configure_logging("bench-chaos", os.environ.get("BENCH_LOG_LEVEL", "error"))
    backoff = RESTART_BACKOFF.initial
    ttl = NodeSetControllerConfig().leader_lease_ttl_seconds
    print(
        f"   service defaults; restart backoff {backoff:g} s (first crash), lease TTL {ttl:g} s",
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix="bench-chaos-") as tmp:
        async with (
            launched_stack(Path(tmp) / "run", 8, TOPOLOGY, settings={}) as stack,
            recording(stack) as recorder,
        ):
            await stack.kube.create(
                OPERATOR_CONFIGS,
                {
                    "apiVersion": "maintenance.nvidia.com/v1alpha1",
                    "kind": "MaintenanceOperatorConfig",
                    "metadata": {"name": "default", "namespace": OPERATOR_NAMESPACE},
                    "spec": {"maxParallelOperations": 8},
                },
            )
            await stack.kube.create(NODESETS, nodeset_object(2))

            async def settled() -> bool:
                pods = recorder.live_pods(NODESET)
                states = await stack.slurm.nodes()
                return len(pods) == 2 and all(
                    "IDLE" in states.get(p["metadata"]["name"], []) for p in pods
                )

            await wait_until(settled, ACTION_TIMEOUT, "the NodeSet's 2 pods idle in Slurm")
            # Each process is killed once: its restart waits the first backoff step.
            monkey = Monkey(stack, random.Random(0))
            for step, (target, probe) in enumerate(PROBES):
                killing = asyncio.create_task(monkey.kill(target))

                async def sent(count: int = step + 1) -> bool:
                    return len(monkey.kills) >= count

                await wait_until(sent, 30, f"kill -9 {target}", interval=0.01)
                what, observed = await probe(stack, recorder, step)
                await wait_until(observed, ACTION_TIMEOUT, f"{target}: {what}", interval=0.05)
                acted = time.monotonic() - monkey.kills[-1].at
                kill = await killing
                print(
                    f"   kill -9 {target:<22} ready again {ratios(kill.recovery, backoff, ttl)}; "
                    f"next action {ratios(acted, backoff, ttl)}: {what}",
                    flush=True,
                )
                if target == "slurm-syncer":
                    for node in sorted(recorder.unavailable_nodes()):
                        await stack.kube.merge_patch(
                            f"{NODES}/{node}", {"spec": {"unschedulable": False}}
                        )
            recorder.assert_no_violation()
