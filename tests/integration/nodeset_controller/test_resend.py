"""A command sent again on purpose reaches the stream: JetStream's duplicate window must not
swallow it, while the idempotency key stays the same (k8s-watcher applies it once)."""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from typing import Any

from nodeflow_bus import Bus, ensure_topology
from nodeflow_contracts import codec
from nodeflow_contracts.k8s import CommandOutcome, K8sCommand, send_msg_id
from nodeflow_contracts.slurm import SlurmClusterStatus
from nodeflow_contracts.topology import KV_BUCKETS, SLURM_CLUSTERS_BUCKET, STREAMS
from nodeflow_runtime.natsd import NatsServerProcess
from nodeset_controller.config import NodeSetControllerConfig
from nodeset_controller.service import NodeSetController
from tests.integration.nodeset_controller.conftest import FAST_BUS
from tests.unit.nodeset_controller.builders import CLUSTER, NS, node, nodeset

STREAM = "K8S_COMMANDS"


async def commands_in_stream(bus: Bus) -> list[tuple[K8sCommand, str]]:
    """Every command stored in the stream, with its Nats-Msg-Id."""
    info = await bus.js.stream_info(STREAM)
    found: list[tuple[K8sCommand, str]] = []
    if not info.state.messages:
        return found
    for seq in range(info.state.first_seq, info.state.last_seq + 1):
        msg = await bus.js.get_msg(STREAM, seq)
        if msg.data is None:
            continue
        command = codec.decode(K8sCommand, msg.data, subject=msg.subject or "")
        found.append((command, (msg.headers or {}).get("Nats-Msg-Id", "")))
    return found


def put_json(value: Any) -> bytes:
    return json.dumps(value).encode()


async def test_rule_resend_after_in_flight_expiry_is_not_swallowed_by_the_duplicate_window(
    nats_server: NatsServerProcess,
) -> None:
    bus = await Bus.connect(nats_server.url, options=FAST_BUS)
    controller: NodeSetController | None = None
    try:
        await ensure_topology(bus.js, streams=STREAMS, kv_buckets=KV_BUCKETS)
        nodes_kv = await bus.js.key_value("k8s_nodes")
        nodesets_kv = await bus.js.key_value("k8s_nodesets")
        clusters_kv = await bus.js.key_value(SLURM_CLUSTERS_BUCKET)
        await nodes_kv.put("_.n0", put_json(node("n0", "10.0.1.1")))
        await nodesets_kv.put(f"{NS}.gpu", put_json(nodeset(replicas=1)))
        status = SlurmClusterStatus(
            cluster=CLUSTER,
            reachable=True,
            last_poll_at=time.time(),
            last_success_at=time.time(),
            poll_interval_seconds=10.0,
        )
        await clusters_kv.put(CLUSTER, codec.encode(status))
        # Nobody applies the claim: k8s-watcher stands in by reporting each attempt expired
        # before it was ever sent (it can never land), which frees the node in the command
        # ledger, and the controller sends it again, the same command under the same
        # idempotency key.
        config = NodeSetControllerConfig(
            nats_url=(nats_server.url,),
            instance_id="resend-it",
            leader_lease_ttl_seconds=1.5,
            resync_seconds=0.2,
            debounce_seconds=0.01,
            in_flight_timeout_seconds=1.0,
            command_lifetime_seconds=1.0,
        )
        controller = NodeSetController(bus, config)
        await controller.start()

        async def claims() -> list[tuple[K8sCommand, str]]:
            return [
                (c, msg_id)
                for c, msg_id in await commands_in_stream(bus)
                if c.target.kind == "Node" and c.reason.startswith("claim")
            ]

        stored: list[tuple[K8sCommand, str]] = []
        answered: set[str] = set()
        async with asyncio.timeout(30):
            while len(stored) < 3:
                await asyncio.sleep(0.1)
                stored = await claims()
                for command, msg_id in stored:
                    if msg_id in answered:
                        continue
                    answered.add(msg_id)
                    expired = CommandOutcome(
                        idempotency_key=command.idempotency_key,
                        op=command.op,
                        sender=command.sender,
                        target=command.target,
                        outcome="expired",
                        attempt=1,
                        sent_at=command.sent_at,
                        finished_at=time.time(),
                    )
                    await bus.publish(expired.subject, expired, msg_id=f"{msg_id}:expired")
        keys = Counter(c.idempotency_key for c, _ in stored)
        assert len(keys) == 1, keys  # one command ...
        assert len(stored) >= 3  # ... stored once per attempt
        msg_ids = [msg_id for _, msg_id in stored]
        assert len(set(msg_ids)) == len(msg_ids)
        (key,) = keys
        # Each send's Nats-Msg-Id names the send (its sent_at), the n-th attempt's also `#n`.
        assert msg_ids[0] == stored[0][0].msg_id
        assert msg_ids[1] == send_msg_id(f"{key}#2", stored[1][0].sent_at)
    finally:
        if controller is not None:
            await controller.stop()
        await bus.close()
