"""nodeflow_nodeset_draining: a NodeSet's nodes draining in Slurm (Drain and Busy), counted
from the NodeSet pods in KV and slurm-syncer's states (real NATS, the exporter's own views)."""

from __future__ import annotations

import json
from typing import Any

from prometheus_client import CollectorRegistry

from metrics_exporter.exporter import NODESETS_BUCKET, PODS_BUCKET, Exporter
from nodeflow_bus import Bus
from nodeflow_contracts import codec, subjects
from nodeflow_contracts.slurm import SlurmNodeState
from nodeflow_contracts.topology import SLURM_NODES_BUCKET
from tests.integration.metrics_exporter.conftest import eventually

LABELS = {"namespace": "team-a", "nodeset": "gpus"}


def pod(name: str, nodeset: str | None = "gpus", namespace: str = "team-a") -> dict[str, Any]:
    labels = {"nodeflow.dev/nodeset": nodeset} if nodeset else {}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": labels, "uid": name},
        "spec": {"nodeName": f"node-{name}", "containers": [{"name": "slurmd"}]},
        "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]},
    }


def slurm_state(name: str, *, busy: bool, drain: bool, known: bool = True) -> SlurmNodeState:
    return SlurmNodeState(
        cluster="prod",
        name=name,
        known=known,
        base_state="Allocated" if busy else "Idle",
        flags=("Drain",) if drain else (),
        busy=busy and known,
        drain=drain and known,
        drained=drain and not busy and known,
        draining=drain and busy and known,
    )


def draining(registry: CollectorRegistry) -> float | None:
    return registry.get_sample_value("nodeflow_nodeset_draining", LABELS)


async def test_rule_draining_nodes_of_a_nodeset_are_counted_beside_the_drained_ones(
    bus: Bus, exporter: Exporter, registry: CollectorRegistry
) -> None:
    nodesets = await bus.js.key_value(NODESETS_BUCKET)
    pods = await bus.js.key_value(PODS_BUCKET)
    slurm = await bus.js.key_value(SLURM_NODES_BUCKET)
    nodeset = {
        "apiVersion": "nodeflow.dev/v1alpha1",
        "kind": "NodeSet",
        "metadata": {"namespace": "team-a", "name": "gpus", "uid": "u"},
        "spec": {"replicas": 4, "slurmCluster": "prod", "template": {}},
        "status": {"numberDrain": 1},
    }
    await nodesets.put("team-a.gpus", json.dumps(nodeset).encode())
    await eventually(lambda: draining(registry) == 0.0, what="an empty NodeSet shows 0")

    states = {
        "gpus-0": slurm_state("gpus-0", busy=True, drain=True),  # draining
        "gpus-1": slurm_state("gpus-1", busy=False, drain=True),  # drained, not draining
        "gpus-2": slurm_state("gpus-2", busy=True, drain=False),  # busy, no drain
        "gpus-3": slurm_state("gpus-3", busy=True, drain=True, known=False),  # unknown
        "other-0": slurm_state("other-0", busy=True, drain=True),  # not this NodeSet's
    }
    for state in states.values():
        await slurm.put(state.key, codec.encode(state))
    for name in ("gpus-0", "gpus-1", "gpus-2", "gpus-3"):
        await pods.put(subjects.object_key("team-a", name), json.dumps(pod(name)).encode())
    await pods.put("team-a.other-0", json.dumps(pod("other-0", nodeset=None)).encode())
    await pods.put("team-b.gpus-9", json.dumps(pod("gpus-9", namespace="team-b")).encode())
    await eventually(lambda: draining(registry) == 1.0, what="one draining node")
    assert registry.get_sample_value("kube_sunk_nodeset_drained", LABELS) == 1.0

    # The drained node takes a job again while still drained: now two are draining.
    busy_again = slurm_state("gpus-1", busy=True, drain=True)
    await slurm.put(busy_again.key, codec.encode(busy_again))
    await eventually(lambda: draining(registry) == 2.0, what="two draining nodes")
    # The pod is gone: its node no longer counts for the NodeSet.
    await pods.delete("team-a.gpus-0")
    await eventually(lambda: draining(registry) == 1.0, what="the deleted pod not counted")
    # The NodeSet is gone: so is its series.
    await nodesets.delete("team-a.gpus")
    await eventually(lambda: draining(registry) is None, what="no series for a gone NodeSet")
