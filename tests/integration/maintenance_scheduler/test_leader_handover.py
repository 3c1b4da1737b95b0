"""maxParallelOperations across a leader handover, on real NATS (the command ledger).

Under `maxParallelOperations: 2`, request x of requestor r2 is Ready (one slot). Leader A
schedules request a (r1); its Scheduled write is still queued for k8s-watcher (none runs
here) when A stops gracefully (a helm upgrade) and hands the lease over at once. Request c
of r2 arrives (r2 has a request in progress: c ranks before a). Leader B rebuilds the ledger
from COMMAND_LEDGER and COMMAND_OUTCOMES before its first round: a's write holds the second
slot, so c is not scheduled while a's write may still land (x, a and c: three against
two)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from maintenance_scheduler.config import MaintenanceSchedulerConfig
from maintenance_scheduler.service import MaintenanceScheduler
from nodeflow_bus import Bus, ensure_topology
from nodeflow_contracts.k8s import K8sCommand
from nodeflow_contracts.topology import KV_BUCKETS, STREAMS
from nodeflow_runtime.natsd import NatsServerProcess
from tests.fixtures.stack import fast_bus
from tests.fixtures.waiting import eventually
from tests.integration.nodeset_controller.test_resend import commands_in_stream
from tests.unit.maintenance_scheduler.builders import nm_object

FAST_BUS = fast_bus("maintenance-handover-it")


def put_json(value: Any) -> bytes:
    return json.dumps(value).encode()


def node(name: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "uid": f"uid-{name}", "resourceVersion": "5"},
        "spec": {},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }


def scheduled(stored: list[tuple[K8sCommand, str]]) -> set[str]:
    """The requests a Scheduled status write was sent for."""
    return {
        c.target.name
        for c, _ in stored
        if c.sender == "maintenance-scheduler"
        and c.op == "update-status"
        and "Scheduled" in c.reason
    }


def config_for(url: str, instance: str) -> MaintenanceSchedulerConfig:
    return MaintenanceSchedulerConfig(
        nats_url=(url,),
        instance_id=instance,
        leader_lease_ttl_seconds=1.5,
        resync_seconds=0.2,
        debounce_seconds=0.01,
    )


async def test_rule_a_new_leader_keeps_max_parallel_operations_after_a_graceful_handover(
    nats_server: NatsServerProcess,
) -> None:
    bus = await Bus.connect(nats_server.url, options=FAST_BUS)
    leaders: list[MaintenanceScheduler] = []
    buses = [bus]
    try:
        await ensure_topology(bus.js, streams=STREAMS, kv_buckets=KV_BUCKETS)
        nodes_kv = await bus.js.key_value("k8s_nodes")
        requests_kv = await bus.js.key_value("k8s_nodemaintenances")
        configs_kv = await bus.js.key_value("k8s_maintenanceoperatorconfigs")
        for name in ("n1", "n3", "n9"):
            await nodes_kv.put(f"_.{name}", put_json(node(name)))
        await configs_kv.put(
            "nodeflow-system.default",
            put_json(
                {
                    "metadata": {
                        "name": "default",
                        "namespace": "nodeflow-system",
                        "uid": "uid-config",
                        "resourceVersion": "3",
                    },
                    "spec": {"maxParallelOperations": 2},
                }
            ),
        )
        ready = nm_object("x", "n9", requestor="r2.example.com", phase="Ready", finalizer=True)
        await requests_kv.put("default.x", put_json(ready))
        await requests_kv.put(
            "default.a", put_json(nm_object("a", "n1", requestor="r1.example.com", phase="Pending"))
        )

        first = MaintenanceScheduler(bus, config_for(nats_server.url, "leader-a"))
        leaders.append(first)
        await first.start()
        stored: list[tuple[K8sCommand, str]] = []
        async with asyncio.timeout(30):
            while not scheduled(stored):
                await asyncio.sleep(0.05)
                stored = await commands_in_stream(bus)
        assert scheduled(stored) == {"a"}
        await first.stop()

        await requests_kv.put(
            "default.c", put_json(nm_object("c", "n3", requestor="r2.example.com", phase="Pending"))
        )
        successor_bus = await Bus.connect(nats_server.url, options=FAST_BUS)
        buses.append(successor_bus)
        second = MaintenanceScheduler(successor_bus, config_for(nats_server.url, "leader-b"))
        leaders.append(second)
        await second.start()
        # Several rounds as leader, with c in its view.
        await eventually(
            lambda: not (second.stats.rounds < 5 or not second.ledger.ready), timeout=30
        )
        assert second.requests.get("default.c") is not None
        assert scheduled(await commands_in_stream(bus)) == {"a"}
    finally:
        for leader in leaders:
            await leader.stop()
        for connection in buses:
            await connection.close()
