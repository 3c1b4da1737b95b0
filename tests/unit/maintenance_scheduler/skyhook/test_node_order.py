"""SKYHOOK_NODE_ORDER counts on across batches (upstream `operator/internal/wrapper/skyhook.go::
RemoveNodePriority`, `NodeOrder`): every node that leaves status.nodePriority (complete, or no
longer a target) bumps status.nodeOrderOffset, and a node's order is its place among the nodes
picked plus that offset."""

from __future__ import annotations

from maintenance_scheduler.skyhook.api import SKYHOOK_FINALIZER, parse_skyhook
from maintenance_scheduler.skyhook.plan import CreateJob
from tests.unit.maintenance_scheduler.skyhook.test_skyhook_plan import (
    FakeCluster,
    cluster_nodes,
)


def one_at_a_time() -> FakeCluster:
    skyhook = parse_skyhook(
        {
            "metadata": {"name": "gpu-init", "uid": "u1", "finalizers": [SKYHOOK_FINALIZER]},
            "spec": {
                "interruptionBudget": {"count": 1},
                "packages": {"driver": {"version": "1.0.0", "image": "ghcr.io/x/driver"}},
            },
        }
    )
    return FakeCluster(skyhooks=[skyhook], nodes=cluster_nodes(3))


def test_rule_node_order_keeps_counting_across_batches_with_the_offset() -> None:
    cluster = one_at_a_time()
    orders: dict[str, set[int]] = {}
    for _ in range(60):
        plan = cluster.round()
        for action in plan.actions:
            if isinstance(action, CreateJob):
                orders.setdefault(action.node, set()).add(action.node_order)
        if not plan.actions:
            break
    assert cluster.status()["status"] == "complete"
    # One node per batch: the first is 0, the next 1, then 2 (not 0 every time).
    assert orders == {"node-00": {0}, "node-01": {1}, "node-02": {2}}
    assert cluster.status()["nodeOrderOffset"] == 3
    assert cluster.status()["nodePriority"] == {}


def test_rule_a_node_no_longer_targeted_leaves_node_priority_and_bumps_the_offset() -> None:
    cluster = one_at_a_time()
    cluster.round()
    picked = set(cluster.status()["nodePriority"])
    assert picked and "nodeOrderOffset" not in cluster.status()  # omitted while 0
    for name in picked:
        del cluster.nodes[name]
    cluster.round()
    assert not picked & set(cluster.status()["nodePriority"])
    assert cluster.status()["nodeOrderOffset"] == len(picked)
