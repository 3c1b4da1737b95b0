"""The simulated kubelet's node status writes, as the real kubelet's: a strategic merge of its
own conditions, so the conditions other writers own stay on the node."""

from __future__ import annotations

from typing import Any

from clustersim.cluster.nodes import set_node_ready
from clustersim.cluster.spec import node_conditions
from clustersim.kube.patch import STRATEGIC_MERGE_PATCH
from clustersim.kube.store import Store

SKYHOOK_CONDITION = "skyhook.nvidia.com/gpu-drivers/NotReady"


def a_node(store: Store) -> None:
    store.create(
        "nodes",
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": "n1"},
            "status": {"conditions": node_conditions(True, "2026-01-01T00:00:00Z")},
        },
    )


def conditions(store: Store) -> dict[str, dict[str, Any]]:
    node = store.get("nodes", "n1")
    return {c["type"]: c for c in node["status"]["conditions"]}


def test_rule_the_kubelets_ready_flips_keep_other_writers_node_conditions() -> None:
    store = Store()
    a_node(store)
    foreign = {"type": SKYHOOK_CONDITION, "status": "True", "reason": "Incomplete"}
    store.patch(
        "nodes",
        "n1",
        {"status": {"conditions": [foreign]}},
        STRATEGIC_MERGE_PATCH,
        subresource="status",
    )
    set_node_ready(store, "n1", False, unknown=False)
    after_reboot = conditions(store)
    assert after_reboot["Ready"]["status"] == "False"
    assert after_reboot[SKYHOOK_CONDITION]["reason"] == "Incomplete"
    set_node_ready(store, "n1", True)
    back = conditions(store)
    assert back["Ready"]["status"] == "True"
    assert back[SKYHOOK_CONDITION] == after_reboot[SKYHOOK_CONDITION]
