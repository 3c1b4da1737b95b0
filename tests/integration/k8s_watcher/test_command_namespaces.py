"""COMMAND_NAMESPACES through the real path: a command published on NATS, judged by a running
k8s-watcher, against the Kubernetes API emulator."""

from __future__ import annotations

from nodeflow_contracts.k8s import CordonNode, CreateObject, DeleteObject, ObjectRef
from tests.integration.k8s_watcher.conftest import Harness, node, pod


def pod_ref(name: str, namespace: str) -> ObjectRef:
    return ObjectRef(api_version="v1", kind="Pod", name=name, namespace=namespace)


async def test_commands_outside_command_namespaces_are_refused(harness: Harness) -> None:
    await harness.start_watcher(command_namespaces=("slurm",))
    for namespace in ("slurm", "payments"):
        harness.store.create(
            "namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}
        )
    harness.store.create("pods", pod("inside", "slurm"))
    harness.store.create("pods", pod("outside", "payments"))
    harness.store.create("nodes", node("node-a"))

    delete_outside = await harness.send(pod_ref("outside", "payments"), DeleteObject())
    create_outside = await harness.send(
        pod_ref("intruder", "payments"), CreateObject(object=pod("intruder", "payments"))
    )
    # The target says slurm, the object it makes says payments: judged where it is written.
    smuggled = await harness.send(
        pod_ref("smuggled", "slurm"), CreateObject(object=pod("smuggled", "payments"))
    )
    for cmd in (delete_outside, create_outside, smuggled):
        outcome = await harness.final_outcome(cmd.idempotency_key)
        assert outcome.outcome == "forbidden", outcome
        assert "'payments'" in outcome.message and "COMMAND_NAMESPACES" in outcome.message
    assert harness.store.get("pods", "outside", "payments")["metadata"]["name"] == "outside"
    names = {p["metadata"]["name"] for p in harness.store.list("pods", "payments").items}
    assert names == {"outside"}

    delete_inside = await harness.send(pod_ref("inside", "slurm"), DeleteObject())
    cordon = await harness.send(
        ObjectRef(api_version="v1", kind="Node", name="node-a"), CordonNode()
    )
    for cmd in (delete_inside, cordon):
        outcome = await harness.final_outcome(cmd.idempotency_key)
        assert outcome.outcome == "applied", outcome
    assert harness.store.get("nodes", "node-a")["spec"]["unschedulable"] is True
