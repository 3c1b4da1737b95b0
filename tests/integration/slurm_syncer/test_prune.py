"""pruneSlurmNodeRecords end to end: slurm-syncer deletes, through slurmrestd (the emulator,
HTTP), the Slurm node records of a NodeSet that asks for it once their pods are gone, and keeps
every record that may still matter."""

from __future__ import annotations

import msgspec
from nats.js.errors import KeyNotFoundError

from clustersim.slurm import RunningSlurm
from nodeflow_bus import Bus
from nodeflow_contracts import subjects
from slurm_syncer.syncer import Syncer
from tests.integration.slurm_syncer.conftest import (
    CLUSTER,
    NAMESPACE,
    FakeWatcher,
    KubeKV,
    eventually,
    make_node,
    make_nodeset,
    make_pod,
)
from tests.integration.slurm_syncer.test_syncer import sleep_job

SCALED_IN = ("w-000-002", "w-000-005", "k-000-001")
DELETED = ("w-000-002", "w-000-003", "w-000-004", "w-000-005", "k-000-001")
SLURM_DELETE = {"type": "SlurmDelete", "status": "True", "reason": "ScalingDeleteScheduled"}


async def prune_cluster(slurm: RunningSlurm, kube: KubeKV) -> None:
    pruning = make_nodeset("w")
    pruning["spec"]["pruneSlurmNodeRecords"] = "NodeNotFound"
    await kube.put_nodeset(pruning)
    await kube.put_nodeset(make_nodeset("k"))  # Never (the default)
    pods = {
        "w-000-001": "w",  # keeps its pod
        "w-000-002": "w",  # scale-in: drained for its deletion, then deleted
        "w-000-003": "w",  # its Kubernetes node is gone: slurmd stops answering
        "w-000-004": "w",  # a person drained it before its pod went
        "w-000-005": "w",  # drained for deletion but still runs a job
        "k-000-001": "k",  # scale-in of a NodeSet that keeps its records
    }
    for index, (name, nodeset) in enumerate(pods.items()):
        slurm.emulator.register_node(name, cpus=4, real_memory=8192, dynamic=True)
        await kube.put_node(make_node(f"node-{index}"))
        # nodeset-controller's scale-in mark: slurm-syncer drains the node for the deletion.
        scaled_in = name in SCALED_IN
        conditions = [SLURM_DELETE] if scaled_in else []
        await kube.put_pod(make_pod(name, f"node-{index}", nodeset=nodeset, conditions=conditions))
    # A static node under the same names: Slurm cannot delete it.
    slurm.emulator.register_node("w-000-006", cpus=4, real_memory=8192)


async def delete_pod(kube: KubeKV, name: str) -> None:
    await kube.delete("k8s_pods", subjects.object_key(NAMESPACE, name))


async def test_rule_prune_deletes_the_records_of_gone_pods_when_the_nodeset_asks(
    topology: Bus, slurm: RunningSlurm, kube: KubeKV, watcher: FakeWatcher, syncer: Syncer
) -> None:
    await prune_cluster(slurm, kube)
    slurm.cluster.submit_job(sleep_job("w-000-005"), "alice")
    slurm.cluster.update_node("w-000-004", "root", ["DRAIN"], "bad DIMM, ask bob", None)
    slurm.emulator.mark_lost("w-000-003")
    slurm.emulator.mark_lost("w-000-006")
    await syncer.start()
    await eventually(lambda: all("DRAIN" in slurm.emulator.node_state(name) for name in SCALED_IN))
    await syncer.poll_once(CLUSTER)
    # Every pod still there: nothing goes.
    assert {"w-000-002", "w-000-003"} <= set(slurm.cluster.nodes)
    for name in DELETED:
        await delete_pod(kube, name)
    await eventually(lambda: all(f"{NAMESPACE}.{n}" not in syncer._pods for n in DELETED))
    await syncer.poll_once(CLUSTER)
    remaining = set(slurm.cluster.nodes)
    assert "w-000-002" not in remaining and "w-000-003" not in remaining
    assert {"w-000-001", "w-000-004", "w-000-005", "w-000-006", "k-000-001"} <= remaining
    # The records gone from Slurm are gone from slurm_nodes too.
    kv = await topology.js.key_value("slurm_nodes")
    for name in ("w-000-002", "w-000-003"):
        try:
            entry = await kv.get(subjects.slurm_node_key(CLUSTER, name))
        except KeyNotFoundError:
            continue
        assert entry.value in (b"", None), msgspec.json.decode(entry.value or b"{}")


async def test_rule_prune_never_is_the_default(
    topology: Bus, slurm: RunningSlurm, kube: KubeKV, watcher: FakeWatcher, syncer: Syncer
) -> None:
    await kube.put_nodeset(make_nodeset("w"))
    slurm.emulator.register_node("w-000-001", cpus=4, real_memory=8192, dynamic=True)
    slurm.emulator.mark_lost("w-000-001")
    await syncer.start()
    await syncer.poll_once(CLUSTER)
    await syncer.poll_once(CLUSTER)
    assert "w-000-001" in slurm.cluster.nodes
