"""maintenance-scheduler: one scheduling round at scale, and 200 requests through Ready on a
1,000-node simulated cluster with an invariant checker.

1. Scheduling round: 10,000 nodes (5% cordoned or not Ready), 2,000 Pending requests from 20
   requestors plus 50 in progress, maxParallelOperations 100, maxUnavailable 10%: the time of
   `schedule()` alone and with parsing the 2,050 objects (median of 15 rounds). Target: a
   round under 50 ms.
2. Whole stack in one process (simulator, real nats-server, k8s-watcher, maintenance-scheduler):
   200 NodeMaintenances on 200 of 1,000 nodes (maxParallelOperations 25, maxUnavailable 3%,
   10 nodes cordoned beforehand: the last 10 requests target them and spend no budget); each
   is deleted by its "requestor" as soon as it is Ready. A checker sees every change of
   every NodeMaintenance and Node in the API store and records the most requests in progress
   and the most nodes unavailable at once: neither may exceed its budget. Figures: seconds
   until all 200 are gone and every node is schedulable again, requests per second, the two
   maxima against their limits. BENCH_MAINTENANCE_REQUESTS, BENCH_MAINTENANCE_NODES change
   the sizes.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import time
from typing import Any

from bench._stack import InProcessStack, run_inprocess_stack, scratch_nats_server
from clustersim.cluster.spec import ClusterSpec
from clustersim.runner import SimulatorConfig
from maintenance_scheduler.api import (
    API_VERSION,
    IntOrPercent,
    OperatorConfig,
    parse_node_maintenance,
)
from maintenance_scheduler.config import MaintenanceSchedulerConfig
from maintenance_scheduler.scheduler import NodeInfo, schedule
from maintenance_scheduler.service import MaintenanceScheduler
from nodeflow_bus import Bus, BusOptions
from nodeflow_kube.fields import (
    rfc3339,
)
from nodeflow_runtime.logs import configure_logging

ROUND_TARGET_MS = 50.0
NODE_MAINTENANCES = "nodemaintenances.maintenance.nvidia.com"
CONFIGS = "maintenanceoperatorconfigs.maintenance.nvidia.com"
NS = "default"
PRE_CORDONED = 10


def request_object(name: str, node: str, requestor: str, phase: str, created: float) -> Any:
    return {
        "apiVersion": API_VERSION,
        "kind": "NodeMaintenance",
        "metadata": {
            "name": name,
            "namespace": NS,
            "uid": f"uid-{name}",
            "resourceVersion": "1",
            "creationTimestamp": rfc3339(created),
        },
        "spec": {"requestorID": requestor, "nodeName": node, "drainSpec": {"force": True}},
        "status": {
            "conditions": [
                {
                    "type": "Ready",
                    "status": "False",
                    "reason": phase,
                    "message": "",
                    "lastTransitionTime": rfc3339(created),
                }
            ]
        },
    }


def scheduling_round() -> None:
    nodes = {
        f"node-{i:05d}": NodeInfo(
            name=f"node-{i:05d}",
            unschedulable=i % 40 == 0,
            ready=i % 41 != 0,
            uid=f"uid-node-{i:05d}",
        )
        for i in range(10_000)
    }
    names = list(nodes)
    objects = [
        request_object(
            f"busy-{i}", names[i * 7], f"team-{i % 20}.example.com", "Draining", 1.7e9 + i
        )
        for i in range(50)
    ]
    objects += [
        request_object(
            f"req-{i}",
            names[(i * 13 + 1) % 10_000],
            f"team-{i % 20}.example.com",
            "Pending",
            1.7e9 + i,
        )
        for i in range(2_000)
    ]
    config = OperatorConfig(
        max_parallel_operations=IntOrPercent(100), max_unavailable=IntOrPercent(10, percent=True)
    )
    parsed = [parse_node_maintenance(o) for o in objects]
    only_schedule: list[float] = []
    with_parse: list[float] = []
    result = None
    for _ in range(15):
        started = time.perf_counter()
        result = schedule(nodes, parsed, config)
        only_schedule.append((time.perf_counter() - started) * 1000)
        started = time.perf_counter()
        schedule(nodes, [parse_node_maintenance(o) for o in objects], config)
        with_parse.append((time.perf_counter() - started) * 1000)
    assert result is not None
    median = statistics.median(only_schedule)
    print(
        f"   scheduling round, 10,000 nodes / 2,000 pending: {median:.1f} ms "
        f"(target < {ROUND_TARGET_MS:.0f} ms: {'ok' if median < ROUND_TARGET_MS else 'MISSED'}); "
        f"cold, parsing every object too (the service parses each resourceVersion once): "
        f"{statistics.median(with_parse):.1f} ms; "
        f"scheduled {len(result.scheduled)} (slots {result.slots}, "
        f"canBecomeUnavailable {result.can_become_unavailable})",
        flush=True,
    )


class InvariantChecker:
    """Every change of a NodeMaintenance or Node in the API store, checked against the budgets."""

    def __init__(self, store: Any, parallel: int, unavailable: int) -> None:
        self.store = store
        self.parallel = parallel
        self.unavailable = unavailable
        self.max_in_progress = 0
        self.max_unavailable = 0
        self.violations: list[str] = []
        self.in_progress: dict[str, str] = {}  # request name -> node
        self.cordoned: set[str] = set()

    def on_change(self, resource: str, event: str, obj: dict[str, Any], old: Any) -> None:
        name = obj["metadata"]["name"]
        if resource == NODE_MAINTENANCES or resource.startswith("nodemaintenances"):
            ready = next(
                (
                    c
                    for c in (obj.get("status") or {}).get("conditions") or []
                    if c.get("type") == "Ready"
                ),
                None,
            )
            phase = (ready or {}).get("reason") or ""
            if event == "DELETED" or phase in ("", "Pending"):
                self.in_progress.pop(name, None)
            else:
                self.in_progress[name] = obj["spec"]["nodeName"]
        elif resource == "nodes":
            if event != "DELETED" and (obj.get("spec") or {}).get("unschedulable"):
                self.cordoned.add(name)
            else:
                self.cordoned.discard(name)
        else:
            return
        in_progress = len(self.in_progress)
        unavailable = len(self.cordoned | set(self.in_progress.values()))
        self.max_in_progress = max(self.max_in_progress, in_progress)
        self.max_unavailable = max(self.max_unavailable, unavailable)
        if in_progress > self.parallel:
            self.violations.append(f"{in_progress} in progress > {self.parallel}")
        if unavailable > self.unavailable:
            self.violations.append(f"{unavailable} unavailable > {self.unavailable}")


async def through_ready(requests: int, node_count: int) -> None:
    parallel, unavailable_percent = 25, 3
    unavailable_limit = node_count * unavailable_percent // 100
    options = BusOptions(name="bench-maintenance", initial_connect_deadline=10.0)
    config = SimulatorConfig(
        cluster=ClusterSpec(nodes=node_count),
        kubelet_delay=0.01,
        slurm_clusters=("sim",),
        start_admin_server=False,
    )
    watcher_settings = {
        "instance_id": "bench-watcher",
        "kube_qps": 2000.0,
        "kube_burst": 4000,
        "command_retry_initial_seconds": 0.1,
        "command_retry_max_seconds": 1.0,
    }
    async with (
        scratch_nats_server() as nats,
        run_inprocess_stack(
            nats.url,
            config,
            InProcessStack,
            watcher_settings=watcher_settings,
            bus_options=options,
        ) as stack,
    ):
        sim = stack.sim
        sim.store.create(
            CONFIGS,
            {
                "apiVersion": API_VERSION,
                "kind": "MaintenanceOperatorConfig",
                "metadata": {"name": "default", "namespace": NS},
                "spec": {
                    "maxParallelOperations": parallel,
                    "maxUnavailable": f"{unavailable_percent}%",
                },
            },
        )
        service_bus = await Bus.connect(nats.url, options=options)
        service = MaintenanceScheduler(
            service_bus,
            MaintenanceSchedulerConfig(
                nats_url=(nats.url,), instance_id="bench", operator_namespace=NS
            ),
        )
        checker = InvariantChecker(sim.store, parallel, unavailable_limit)
        sim.store.add_listener(checker.on_change)
        await service.start()
        await service.lease.wait_until_leader(timeout=20)
        nodes = sorted(n["metadata"]["name"] for n in sim.store.list("nodes").items)
        # Nodes cordoned by someone else: they spend the unavailability budget, and
        # the last requests target them (those spend none, and stay cordoned after).
        pre_cordoned = [nodes[1 + 5 * k] for k in range(PRE_CORDONED)]
        for name in pre_cordoned:
            sim.store.patch(
                "nodes",
                name,
                {"spec": {"unschedulable": True}},
                "application/merge-patch+json",
            )
        targets = [nodes[(i * 5) % len(nodes)] for i in range(requests - PRE_CORDONED)]
        targets += pre_cordoned
        started = time.perf_counter()
        for i in range(requests):
            sim.store.create(
                NODE_MAINTENANCES,
                {
                    "apiVersion": API_VERSION,
                    "kind": "NodeMaintenance",
                    "metadata": {"name": f"bench-{i}", "namespace": NS},
                    "spec": {
                        "requestorID": f"team-{i % 5}.example.com",
                        "nodeName": targets[i],
                        "drainSpec": {"force": True},
                    },
                },
            )
        deadline = time.monotonic() + 900
        while True:
            left = sim.store.list(NODE_MAINTENANCES, namespace=NS).items
            for obj in left:
                ready = [
                    c
                    for c in (obj.get("status") or {}).get("conditions") or []
                    if c.get("type") == "Ready" and c.get("reason") == "Ready"
                ]
                if ready and not obj["metadata"].get("deletionTimestamp"):
                    sim.store.delete(NODE_MAINTENANCES, obj["metadata"]["name"], namespace=NS)
            cordoned = [
                n
                for n in sim.store.list("nodes").items
                if n["spec"].get("unschedulable") and n["metadata"]["name"] not in pre_cordoned
            ]
            if not left and not cordoned:
                break
            if time.monotonic() > deadline:
                print(f"   NOT SETTLED: {len(left)} requests left", flush=True)
                break
            await asyncio.sleep(0.1)
        seconds = time.perf_counter() - started
        await service.stop()
        await service_bus.close()
    verdict = "ok" if not checker.violations else f"VIOLATED ({checker.violations[:3]})"
    print(
        f"   {requests} requests through Ready and deletion on {node_count} nodes: "
        f"{seconds:.1f} s ({requests / seconds:.1f} requests/s); most in progress "
        f"{checker.max_in_progress} (maxParallelOperations {parallel}), most unavailable "
        f"(cordoned, not Ready or under maintenance) "
        f"{checker.max_unavailable} (maxUnavailable {unavailable_percent}% = {unavailable_limit}); "
        f"budgets {verdict}",
        flush=True,
    )


async def main() -> None:
    configure_logging("maintenance-bench", "warning")
    scheduling_round()
    await through_ready(
        int(os.environ.get("BENCH_MAINTENANCE_REQUESTS", "200")),
        int(os.environ.get("BENCH_MAINTENANCE_NODES", "1000")),
    )
