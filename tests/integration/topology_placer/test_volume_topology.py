"""topology-placer on the emulator stack with shared storage: k8s-watcher mirrors the
PersistentVolumeClaims, PersistentVolumes and StorageClasses, the placer waits (naming the
claim) while a gang's claim is not bound, and once it is bound places the gang only on the
nodes its volume's node affinity admits."""

from __future__ import annotations

from typing import Any

from tests.integration.topology_placer.conftest import (
    BLOCK,
    NS,
    PODGROUPS,
    TOPOLOGIES,
    Stack,
    eventually,
    gang_pod,
    pod_group_object,
    topology_object,
)


def _with_claim(pod: dict[str, Any], claim: str) -> dict[str, Any]:
    pod["spec"]["volumes"] = [{"name": "data", "persistentVolumeClaim": {"claimName": claim}}]
    return pod


def _scheduled_false(stack: Stack, group: str) -> str:
    for pod in stack.pods(group):
        for condition in pod.get("status", {}).get("conditions") or []:
            if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
                return str(condition.get("message"))
    return ""


async def test_gang_waits_for_its_claim_then_goes_where_its_volume_reaches(stack: Stack) -> None:
    stack.sim.store.create(TOPOLOGIES, topology_object())
    stack.sim.store.create(
        "persistentvolumeclaims",
        {
            "metadata": {"name": "shared", "namespace": NS},
            "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": "nfs"},
        },
    )
    stack.sim.store.create(PODGROUPS, pod_group_object("train", 2))
    for rank in range(2):
        stack.sim.store.create(
            "pods", _with_claim(gang_pod(f"train-{rank}", "train", gpus=8), "shared")
        )
    await stack.start_placer()

    text = await eventually(lambda: _scheduled_false(stack, "train"), what="the gang waits")
    assert "PersistentVolumeClaim shared is not bound" in text, text

    # The volume is reachable from the last block only; the claim is bound to it.
    nodes = stack.sim.store.list("nodes").items
    block = sorted(n["metadata"]["labels"][BLOCK] for n in nodes)[-1]
    reachable = {n["metadata"]["name"] for n in nodes if n["metadata"]["labels"][BLOCK] == block}
    term = {"matchExpressions": [{"key": BLOCK, "operator": "In", "values": [block]}]}
    stack.sim.store.create(
        "persistentvolumes",
        {
            "metadata": {"name": "data"},
            "spec": {
                "capacity": {"storage": "1Ti"},
                "accessModes": ["ReadWriteMany"],
                "nfs": {"server": "nfs.example", "path": "/data"},
                "claimRef": {"namespace": NS, "name": "shared"},
                "nodeAffinity": {"required": {"nodeSelectorTerms": [term]}},
            },
        },
    )
    stack.sim.store.patch(
        "persistentvolumeclaims", "shared", {"spec": {"volumeName": "data"}}, namespace=NS
    )
    stack.sim.store.patch(
        "persistentvolumeclaims",
        "shared",
        {"status": {"phase": "Bound"}},
        namespace=NS,
        subresource="status",
    )

    def bound() -> dict[str, str]:
        pods = stack.pods("train")
        nodes_of = {p["metadata"]["name"]: p["spec"].get("nodeName", "") for p in pods}
        return nodes_of if all(nodes_of.values()) and len(nodes_of) == 2 else {}

    placed = await eventually(bound, what="the gang bound once its claim is")
    assert set(placed.values()) == reachable


async def test_rule_a_wait_for_first_consumer_claim_is_annotated_with_its_node_then_the_pod_bound(
    stack: Stack,
) -> None:
    """k8s-watcher mirrors the StorageClass; the placer places the pod on a node of its
    allowedTopologies (the last block), has k8s-watcher write the claim's
    volume.kubernetes.io/selected-node with that node (its only write to a claim), and binds
    the pod there once KV shows the annotation."""
    stack.sim.store.create(TOPOLOGIES, topology_object())
    nodes = stack.sim.store.list("nodes").items
    block = sorted(n["metadata"]["labels"][BLOCK] for n in nodes)[-1]
    in_block = {n["metadata"]["name"] for n in nodes if n["metadata"]["labels"][BLOCK] == block}
    stack.sim.store.create(
        "storageclasses",
        {
            "metadata": {"name": "local-nvme"},
            "provisioner": "csi.example.com",
            "volumeBindingMode": "WaitForFirstConsumer",
            "allowedTopologies": [{"matchLabelExpressions": [{"key": BLOCK, "values": [block]}]}],
        },
    )
    stack.sim.store.create(
        "persistentvolumeclaims",
        {
            "metadata": {"name": "scratch", "namespace": NS},
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "storageClassName": "local-nvme",
                "resources": {"requests": {"storage": "100Gi"}},
            },
        },
    )
    stack.sim.store.create(PODGROUPS, pod_group_object("solo", 1))
    stack.sim.store.create("pods", _with_claim(gang_pod("solo-0", "solo", gpus=8), "scratch"))
    await stack.start_placer()

    def bound_node() -> str:
        return str(stack.pods("solo")[0]["spec"].get("nodeName") or "")

    node = await eventually(bound_node, what="the pod bound")
    assert node in in_block
    claim = stack.sim.store.get("persistentvolumeclaims", "scratch", NS)
    assert claim["metadata"]["annotations"]["volume.kubernetes.io/selected-node"] == node
