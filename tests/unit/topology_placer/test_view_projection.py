"""The placer keeps every pod of the cluster in its view, projected (`placement_fields`) and
its nodes too (`placement_node_fields`): a placement pass over what it keeps decides exactly
what it decides over the whole objects."""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.topology_placer.builders import NS, TOPOLOGY, pod, pod_group, reference_nodes
from tests.unit.topology_placer.simulate import state
from topology_placer.planner import plan, pod_facts
from topology_placer.pods import placement_fields, placement_node_fields
from topology_placer.volumes import claim_fields, storage_class_fields, volume_fields

BLOCK_MUST = [{"layer": "BlockLayer", "strategy": "MustGather"}]


def dressed(obj: dict[str, Any], index: int) -> dict[str, Any]:
    """What a real pod carries beside its scheduling fields."""
    pod_obj = copy.deepcopy(obj)
    annotations = pod_obj["metadata"].setdefault("annotations", {})
    annotations["kubectl.kubernetes.io/last-applied-configuration"] = '{"kind":"Pod"}' * 20
    for container in pod_obj["spec"]["containers"]:
        container["env"] = [{"name": f"VAR_{i}", "value": "x" * 40} for i in range(10)]
        container["command"] = ["/bin/train", "--epochs", "90"]
        container["volumeMounts"] = [{"name": "data", "mountPath": "/data"}]
        container["readinessProbe"] = {"exec": {"command": ["true"]}}
    pod_obj["spec"]["volumes"] = [{"name": "data", "emptyDir": {}}]
    pod_obj["status"]["podIP"] = f"10.0.0.{index}"
    pod_obj["status"]["containerStatuses"] = [{"name": "main", "ready": True, "restartCount": 0}]
    conditions = pod_obj["status"].setdefault("conditions", [])
    if pod_obj["spec"].get("nodeName"):
        # kubelet's conditions; node filters that only mattered before the pod was bound.
        for kind in (
            "PodScheduled",
            "PodReadyToStartContainers",
            "Initialized",
            "Ready",
            "ContainersReady",
        ):
            conditions.append({"type": kind, "status": "True"})
        pod_obj["spec"]["tolerations"] = [{"key": "nvidia.com/gpu", "operator": "Exists"}]
        pod_obj["spec"]["nodeSelector"] = {"pool": "elsewhere"}
    pod_obj["spec"].update(
        terminationGracePeriodSeconds=30,
        restartPolicy="Always",
        dnsPolicy="ClusterFirst",
        securityContext={},
        serviceAccountName="default",
    )
    return pod_obj


def preempted_by_the_gang(obj: dict[str, Any]) -> dict[str, Any]:
    """A victim this gang already preempted, still on its node (blocks a second preemption)."""
    obj["status"]["conditions"].append(
        {
            "type": "DisruptionTarget",
            "status": "True",
            "reason": "PreemptionByScheduler",
            "message": f"preemptor: {NS}/gang, triggerpod: {NS}/worker-0",
        }
    )
    return obj


@settings(max_examples=25, deadline=None)
@given(
    busy=st.lists(st.sampled_from([2, 4, 8]), max_size=6),
    members=st.integers(min_value=1, max_value=6),
    gpus=st.sampled_from([2, 4, 8]),
    priority=st.integers(min_value=0, max_value=2),
    preempted=st.sets(st.integers(min_value=0, max_value=5)),
    not_ready=st.sets(st.integers(min_value=0, max_value=7), max_size=3),
)
def test_rule_a_pass_over_the_kept_objects_decides_what_it_decides_over_whole_ones(
    busy: list[int],
    members: int,
    gpus: int,
    priority: int,
    preempted: set[int],
    not_ready: set[int],
) -> None:
    nodes = reference_nodes()
    for index, node in enumerate(nodes):
        node["status"]["images"] = [{"names": [f"registry/image-{index}:1"], "sizeBytes": 1}]
        node["status"]["nodeInfo"] = {"kubeletVersion": "v1.36.3"}
        node["metadata"]["annotations"] = {"node.alpha.kubernetes.io/ttl": "0"}
        # kubelet's conditions with their heartbeats, Ready among them (False on some nodes).
        node["status"]["conditions"] = [
            {
                "type": kind,
                "status": status,
                "lastHeartbeatTime": "2026-11-27T06:00:00Z",
                "reason": "KubeletReady" if kind == "Ready" else "KubeletHasSufficientMemory",
            }
            for kind, status in (
                ("MemoryPressure", "False"),
                ("Ready", "False" if index in not_ready else "True"),
                ("DiskPressure", "False"),
            )
        ]
    running = [
        pod(f"busy{i}", None, gpus=g, node_name=f"node{i % 8 + 1}", phase="Running", owner="job")
        for i, g in enumerate(busy)
    ]
    gang = [pod(f"worker-{i}", gpus=gpus, priority=priority * 100) for i in range(members)]
    pods = [dressed(p, i) for i, p in enumerate(running + gang)]
    for index in preempted & set(range(len(running))):
        preempted_by_the_gang(pods[index])
    groups = [pod_group("gang", members, gather=BLOCK_MUST)]
    whole = plan(state(nodes, pods, groups, topology=TOPOLOGY))
    kept = plan(
        state(
            [placement_node_fields(n) for n in nodes],
            [placement_fields(p) for p in pods],
            groups,
            topology=TOPOLOGY,
        )
    )
    assert kept.actions == whole.actions
    assert kept.gang_states == whole.gang_states and kept.attempts == whole.attempts


def test_rule_the_kept_pod_has_no_container_internals_volumes_or_statuses() -> None:
    kept = placement_fields(dressed(pod("w", gpus=8), 1))
    assert kept["spec"]["containers"] == [
        {
            "name": "main",
            "resources": {
                "requests": {"cpu": "1", "nvidia.com/gpu": "8"},
                "limits": {"nvidia.com/gpu": "8"},
            },
        }
    ]
    assert "volumes" not in kept["spec"]
    assert set(kept["status"]) <= {"phase", "nominatedNodeName", "conditions"}
    assert "kubectl.kubernetes.io/last-applied-configuration" not in kept["metadata"]["annotations"]


def test_rule_a_bound_pod_is_kept_without_its_node_filters_or_kubelets_conditions() -> None:
    """Of a bound pod only what a placement reads of one: node, priority, scheduler, what
    it requests, whether it is a victim."""
    bound = preempted_by_the_gang(dressed(pod("w", gpus=8, node_name="node1"), 1))
    kept = placement_fields(bound)
    # The whole pod has node filters, restartPolicy, dnsPolicy, securityContext... too.
    assert set(kept["spec"]) == {"nodeName", "priority", "schedulerName", "containers"}
    assert [c["type"] for c in kept["status"]["conditions"]] == ["DisruptionTarget"]
    assert kept["spec"]["nodeName"] == "node1"
    # Not a victim: no conditions at all.
    assert "conditions" not in placement_fields(dressed(pod("v", node_name="node1"), 3))["status"]
    # A pending pod keeps what filters its nodes.
    pending = dressed(pod("p", gpus=8, tolerations=[{"key": "a", "operator": "Exists"}]), 2)
    assert placement_fields(pending)["spec"]["tolerations"] == [{"key": "a", "operator": "Exists"}]


def test_rule_only_a_pending_pods_facts_carry_its_rank_and_age() -> None:
    """A placement ranks and orders by age only pending pods; the facts of the others (most
    of a cluster) do not hold them."""
    created = "2026-11-27T06:00:00Z"
    pending_pod, bound_pod = pod("worker-3"), pod("worker-4", node_name="node1")
    for obj in (pending_pod, bound_pod):
        obj["metadata"]["creationTimestamp"] = created
    pending = pod_facts(placement_fields(pending_pod))
    bound = pod_facts(placement_fields(bound_pod))
    assert pending.rank is not None and pending.created is not None
    assert bound.rank is None and bound.created is None
    assert bound.request == pending.request and bound.request is pending.request


def test_rule_pods_and_nodes_of_one_template_hold_their_common_parts_once() -> None:
    """What the pods of one job hold alike (labels, containers, status) is kept once for
    all of them, and the nodes of one pool share their allocatable and conditions; what
    differs stays each object's own."""
    first = placement_fields(dressed(pod("w-1", gpus=8, node_name="node1"), 1))
    second = placement_fields(dressed(pod("w-2", gpus=8, node_name="node2"), 2))
    other = placement_fields(dressed(pod("w-3", gpus=4, node_name="node2"), 3))
    assert second["spec"]["containers"] is first["spec"]["containers"]
    assert second["status"] is first["status"]
    assert other["spec"]["containers"] is not first["spec"]["containers"]
    assert other["spec"]["containers"][0]["resources"]["requests"]["nvidia.com/gpu"] == "4"
    assert (first["metadata"]["name"], second["metadata"]["name"]) == ("w-1", "w-2")
    assert (first["spec"]["nodeName"], second["spec"]["nodeName"]) == ("node1", "node2")
    nodes = [placement_node_fields(node) for node in reference_nodes()]
    assert len({id(node["status"]["allocatable"]) for node in nodes}) < len(nodes)
    assert len({id(node["status"]["conditions"]) for node in nodes}) == 1


def test_rule_pods_keep_their_claim_volumes_and_volumes_only_their_topology() -> None:
    """A pod keeps of spec.volumes only its PersistentVolumeClaim volumes (a pending pod its
    generic ephemeral ones too, without their template): the bound ones for ReadWriteOncePod,
    the pending ones for their volume topology. A claim is kept as the volume it is bound to,
    its class, access modes, storage request, selected node and phase; a volume as its zone
    labels, node affinity, claim, class, access modes, capacity and phase; a StorageClass as
    its binding mode, provisioner and allowed topologies."""
    claim_volume = {"name": "ckpt", "persistentVolumeClaim": {"claimName": "shared"}}
    ephemeral = {"name": "tmp", "ephemeral": {"volumeClaimTemplate": {"spec": {}}}}
    pending, bound = dressed(pod("p"), 1), dressed(pod("b", node_name="node1"), 2)
    for obj in (pending, bound):
        obj["spec"]["volumes"] += [claim_volume, ephemeral]
    assert placement_fields(pending)["spec"]["volumes"] == [
        claim_volume,
        {"name": "tmp", "ephemeral": {}},
    ]
    assert placement_fields(bound)["spec"]["volumes"] == [claim_volume]
    assert pod_facts(placement_fields(bound)).claims == ("shared",)
    # Pods without claims carry nothing more.
    assert "volumes" not in placement_fields(dressed(pod("c", node_name="node1"), 3))["spec"]
    affinity: dict[str, Any] = {"required": {"nodeSelectorTerms": [{"matchExpressions": []}]}}
    volume = {
        "metadata": {"name": "data", "uid": "u", "resourceVersion": "3", "labels": {"a": "b"}},
        "spec": {
            "capacity": {"storage": "1Ti"},
            "nfs": {"server": "nfs", "path": "/"},
            "nodeAffinity": affinity,
            "claimRef": {"namespace": NS, "name": "shared"},
            "mountOptions": ["hard"],
        },
        "status": {"phase": "Bound", "lastPhaseTransitionTime": "2026-01-01T00:00:00Z"},
    }
    assert volume_fields(volume) == {
        "metadata": {"name": "data", "uid": "u", "resourceVersion": "3"},
        "spec": {
            "nodeAffinity": affinity,
            "claimRef": {"namespace": NS, "name": "shared"},
            "capacity": {"storage": "1Ti"},
        },
        "status": {"phase": "Bound"},
    }
    claim = {
        "metadata": {
            "name": "shared",
            "namespace": NS,
            "annotations": {"x": "y", "volume.kubernetes.io/selected-node": "node1"},
        },
        "spec": {
            "accessModes": ["ReadWriteMany"],
            "resources": {"requests": {"storage": "1Ti"}},
            "volumeName": "data",
            "storageClassName": "nfs",
        },
        "status": {"phase": "Bound", "capacity": {"storage": "1Ti"}},
    }
    assert claim_fields(claim) == {
        "metadata": {
            "name": "shared",
            "namespace": NS,
            "annotations": {"volume.kubernetes.io/selected-node": "node1"},
        },
        "spec": {
            "accessModes": ["ReadWriteMany"],
            "volumeName": "data",
            "storageClassName": "nfs",
            "resources": {"requests": {"storage": "1Ti"}},
        },
        "status": {"phase": "Bound"},
    }
    storage_class = {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {"name": "local", "uid": "sc", "labels": {"a": "b"}},
        "provisioner": "csi.example.com",
        "parameters": {"type": "nvme"},
        "volumeBindingMode": "WaitForFirstConsumer",
        "allowedTopologies": [{"matchLabelExpressions": [{"key": "k", "values": ["v"]}]}],
        "mountOptions": ["noatime"],
    }
    assert storage_class_fields(storage_class) == {
        "metadata": {"name": "local", "uid": "sc"},
        "provisioner": "csi.example.com",
        "volumeBindingMode": "WaitForFirstConsumer",
        "allowedTopologies": [{"matchLabelExpressions": [{"key": "k", "values": ["v"]}]}],
    }
