"""maxUnavailable across a leader handover, on real NATS (the command ledger).

Leader A marks one outdated pod for deletion (SlurmDelete) under `maxUnavailable: 1`; the
mark is still queued for k8s-watcher (none runs here) when A stops gracefully (a helm
upgrade) and hands the lease over at once. A job then starts on the marked pod, so a plan
that did not know of the mark would pick another pod. Leader B rebuilds the ledger from
COMMAND_LEDGER and COMMAND_OUTCOMES before it plans: it counts A's mark against the budget
and marks no second pod."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from nodeflow_bus import Bus, ensure_topology
from nodeflow_contracts import codec
from nodeflow_contracts.k8s import K8sCommand, PatchObject
from nodeflow_contracts.pod_protocol import SLURM_DELETE_CONDITION
from nodeflow_contracts.slurm import SlurmClusterStatus, SlurmNodeState
from nodeflow_contracts.subjects import slurm_node_key
from nodeflow_contracts.topology import KV_BUCKETS, SLURM_CLUSTERS_BUCKET, STREAMS
from nodeflow_runtime.natsd import NatsServerProcess
from nodeset_controller.config import NodeSetControllerConfig
from nodeset_controller.service import NodeSetController
from tests.fixtures.waiting import eventually
from tests.integration.nodeset_controller.conftest import FAST_BUS
from tests.integration.nodeset_controller.test_resend import commands_in_stream
from tests.unit.nodeset_controller.builders import CLUSTER, NS, node, nodeset, pod, slurm

PODS = ("gpu-001-001", "gpu-001-002", "gpu-001-003")


def put_json(value: Any) -> bytes:
    return json.dumps(value).encode()


def marks(stored: list[tuple[K8sCommand, str]]) -> set[str]:
    """The pods a SlurmDelete patch was sent for."""
    return {
        c.target.name
        for c, _ in stored
        if c.target.kind == "Pod"
        and isinstance(c.operation, PatchObject)
        and SLURM_DELETE_CONDITION in json.dumps(c.operation.patch)
    }


def config_for(url: str, instance: str) -> NodeSetControllerConfig:
    return NodeSetControllerConfig(
        nats_url=(url,),
        instance_id=instance,
        leader_lease_ttl_seconds=1.5,
        resync_seconds=0.2,
        debounce_seconds=0.01,
        in_flight_timeout_seconds=20.0,
        command_lifetime_seconds=20.0,
    )


async def test_rule_a_new_leader_does_not_exceed_max_unavailable_after_a_graceful_handover(
    nats_server: NatsServerProcess,
) -> None:
    bus = await Bus.connect(nats_server.url, options=FAST_BUS)
    leaders: list[NodeSetController] = []
    buses = [bus]
    try:
        await ensure_topology(bus.js, streams=STREAMS, kv_buckets=KV_BUCKETS)
        nodes_kv = await bus.js.key_value("k8s_nodes")
        pods_kv = await bus.js.key_value("k8s_pods")
        nodesets_kv = await bus.js.key_value("k8s_nodesets")
        slurm_kv = await bus.js.key_value("slurm_nodes")
        clusters_kv = await bus.js.key_value(SLURM_CLUSTERS_BUCKET)
        owner = f"{NS}.gpu"

        async def slurm_read(states: dict[str, SlurmNodeState]) -> None:
            revision = 0
            for name, state in states.items():
                revision = await slurm_kv.put(slurm_node_key(CLUSTER, name), codec.encode(state))
            now = time.time()
            status = SlurmClusterStatus(
                cluster=CLUSTER,
                reachable=True,
                last_poll_at=now,
                last_success_at=now,
                poll_interval_seconds=10.0,
                nodes_revision=revision,
            )
            await clusters_kv.put(CLUSTER, codec.encode(status))

        for i, name in enumerate(PODS):
            await nodes_kv.put(f"_.n{i}", put_json(node(f"n{i}", f"10.0.1.{i + 1}", claim=owner)))
            raw = pod(name, f"n{i}", revision="old", created=time.time() - 60)
            raw["metadata"]["uid"] = f"uid-{name}"
            await pods_kv.put(f"{NS}.{name}", put_json(raw))
        await slurm_read({name: slurm(name) for name in PODS})
        # The template changed: every pod is outdated, one may be unavailable at a time.
        await nodesets_kv.put(owner, put_json(nodeset(replicas=3, max_unavailable=1)))

        first = NodeSetController(bus, config_for(nats_server.url, "leader-a"))
        leaders.append(first)
        await first.start()
        stored: list[tuple[K8sCommand, str]] = []
        async with asyncio.timeout(30):
            while not marks(stored):
                await asyncio.sleep(0.05)
                stored = await commands_in_stream(bus)
        (marked,) = marks(stored)
        await first.stop()

        # A job starts on the marked pod: a plan blind to the mark would pick another pod.
        await slurm_read(
            {name: slurm(name, busy=name == marked) for name in PODS},
        )
        successor_bus = await Bus.connect(nats_server.url, options=FAST_BUS)
        buses.append(successor_bus)
        second = NodeSetController(successor_bus, config_for(nats_server.url, "leader-b"))
        leaders.append(second)
        await second.start()
        # Planned several times as leader, on the Slurm states above.
        await eventually(
            lambda: not (second.stats.plans < 5 or not second.ledger.ready), timeout=30
        )
        assert marks(await commands_in_stream(bus)) == {marked}
    finally:
        for leader in leaders:
            await leader.stop()
        for connection in buses:
            await connection.close()
