"""What nodeset-controller keeps of pods in its view: of its own NodeSet pods all that its plan
reads, and of every other pod only what it reads (name, labels, node, requests, phase), with
nothing lost."""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from nodeflow_contracts.pod_protocol import ROLLING_DELETE, SCALING_DELETE
from nodeflow_kube.projections import LAST_APPLIED_ANNOTATION as LAST_APPLIED
from nodeset_controller.objects import (
    OtherPod,
    claim_of,
    internal_ipv4,
    keep_in_view,
    keep_node_in_view,
    node_allocatable,
    nodeset_pod_fields,
    pod_node,
    pod_occupies_node,
    pod_requests,
)
from nodeset_controller.planner import plan
from tests.unit.nodeset_controller.builders import T0, nodeset, pod, slurm
from tests.unit.nodeset_controller.test_planner import KEY, REV, nodes, view

QUANTITY = st.sampled_from(["1", "250m", "2Gi", "8"])
RESOURCES = st.dictionaries(st.sampled_from(["cpu", "memory", "nvidia.com/gpu"]), QUANTITY)
CONTAINER = st.fixed_dictionaries(
    {"name": st.just("c"), "image": st.just("i")},
    optional={
        "resources": st.fixed_dictionaries(
            {}, optional={"requests": RESOURCES, "limits": RESOURCES}
        ),
        "restartPolicy": st.just("Always"),
        "env": st.just([{"name": "A", "value": "b"}]),
    },
)
PINNED = {
    "nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n2"]}]}
            ]
        }
    }
}


@st.composite
def foreign_pods(draw: st.DrawFn) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "containers": draw(st.lists(CONTAINER, min_size=1, max_size=3)),
        "tolerations": [{"operator": "Exists"}],
    }
    if draw(st.booleans()):
        spec["initContainers"] = draw(st.lists(CONTAINER, max_size=2))
    if draw(st.booleans()):
        spec["nodeName"] = "n1"
    elif draw(st.booleans()):
        spec["affinity"] = PINNED
    if draw(st.booleans()):
        spec["resources"] = {"limits": draw(RESOURCES)}
    if draw(st.booleans()):
        spec["overhead"] = {"cpu": "100m"}
    return {
        "metadata": {
            "name": "job-1",
            "namespace": "default",
            "uid": "u",
            "resourceVersion": "9",
            "labels": draw(st.dictionaries(st.sampled_from(["app", "team"]), st.just("x"))),
            "annotations": {"note": "x"},
            "managedFields": [{"manager": "kubectl"}],
        },
        "spec": spec,
        "status": {
            "phase": draw(st.sampled_from(["Pending", "Running", "Succeeded", "Failed"])),
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


@given(foreign_pods())
def test_rule_a_foreign_pod_is_kept_with_everything_feasibility_reads(pod: dict[str, Any]) -> None:
    kept = keep_in_view(pod)
    assert isinstance(kept, OtherPod)
    assert kept.node == pod_node(pod)
    assert kept.occupies_node == pod_occupies_node(pod)
    assert kept.requests == pod_requests(pod["spec"])
    assert (kept.namespace, kept.name) == (pod["metadata"]["namespace"], pod["metadata"]["name"])
    assert kept.resource_version == pod["metadata"]["resourceVersion"]


def test_rule_foreign_pods_requesting_alike_share_one_copy_of_their_requests() -> None:
    """40,000 workload pods repeat a few request shapes: each is kept once."""
    first, second = (
        keep_in_view(
            {
                "metadata": {"name": name, "namespace": "default"},
                # Equal strings built apart, as a decoder gives them.
                "spec": {"nodeName": "".join(["n", "1"]), "containers": [CONTAINER_ASKING_ONE_GPU]},
            }
        )
        for name in ("a", "b")
    )
    assert isinstance(first, OtherPod) and isinstance(second, OtherPod)
    assert first.requests is second.requests
    assert first.node is second.node


CONTAINER_ASKING_ONE_GPU = {
    "name": "c",
    "resources": {"requests": {"cpu": "2"}, "limits": {"nvidia.com/gpu": "1"}},
}


def dressed(obj: dict[str, Any], index: int) -> dict[str, Any]:
    """What a real slurmd pod carries beside what the controller reads: container internals,
    volumes, kubelet's statuses and conditions, the syncer's Slurm state conditions,
    kubectl's last-applied copy."""
    obj = copy.deepcopy(obj)
    obj["metadata"].setdefault("annotations", {})[LAST_APPLIED] = '{"kind":"Pod"}' * 20
    for container in obj["spec"]["containers"]:
        container["env"] = [{"name": f"VAR_{i}", "value": "x" * 40} for i in range(10)]
        container["volumeMounts"] = [{"name": "spool", "mountPath": "/var/spool/slurmd"}]
        container["readinessProbe"] = {"exec": {"command": ["scontrol", "ping"]}}
    obj["spec"]["volumes"] = [{"name": "spool", "emptyDir": {}}]
    obj["spec"]["tolerations"] = [{"key": "nvidia.com/gpu", "operator": "Exists"}]
    status = obj["status"]
    status["podIP"] = f"10.128.0.{index}"
    status["containerStatuses"] = [{"name": "c", "ready": True, "restartCount": 0}]
    status["conditions"] = [
        *status["conditions"],
        {"type": "PodScheduled", "status": "True"},
        {"type": "ContainersReady", "status": "True"},
        {"type": "SlurmNodeStateIdle", "status": "True", "message": ""},
    ]
    return obj


@st.composite
def nodeset_pods(draw: st.DrawFn) -> list[dict[str, Any]]:
    """Up to five NodeSet pods on nodes n0..n5, in every state the plan tells apart."""
    chosen = draw(st.lists(st.integers(min_value=0, max_value=5), unique=True, max_size=5))
    pods = []
    for index in chosen:
        pods.append(
            pod(
                f"gpu-001-{index + 1:03d}",
                f"n{index}",
                ready=draw(st.booleans()),
                revision=draw(st.sampled_from([REV, "old"])),
                delete_reason=draw(st.sampled_from([None, SCALING_DELETE, ROLLING_DELETE])),
                terminating=draw(st.booleans()),
                phase=draw(st.sampled_from(["Running", "Pending", "Failed"])),
                not_registered_since=draw(st.sampled_from([None, T0 - 600.0, T0 - 10.0])),
            )
        )
    return pods


@given(
    pods=nodeset_pods(),
    replicas=st.integers(min_value=0, max_value=6),
    busy=st.sets(st.integers(min_value=0, max_value=5)),
)
def test_rule_a_plan_over_the_kept_nodeset_pods_decides_what_it_decides_over_whole_ones(
    pods: list[dict[str, Any]], replicas: int, busy: set[int]
) -> None:
    node_map = nodes(6, claim=KEY)
    states = {
        f"gpu-001-{index + 1:03d}": slurm(f"gpu-001-{index + 1:03d}", busy=True) for index in busy
    }
    whole = [dressed(p, i) for i, p in enumerate(pods)]
    kept = [nodeset_pod_fields(p) for p in whole]
    assert all(keep_in_view(p) == k for p, k in zip(whole, kept, strict=True))
    # Whole nodes carry what kubelet reports (conditions, images); the kept ones do not.
    whole_nodes = {
        name: {
            **n,
            "status": {
                **n.get("status", {}),
                "conditions": [{"type": "Ready", "status": "False", "reason": "KubeletDown"}],
                "images": [{"names": ["slurmd:24.11"], "sizeBytes": 1}],
            },
        }
        for name, n in node_map.items()
    }
    kept_nodes = {name: keep_node_in_view(n) for name, n in whole_nodes.items()}
    assert plan(view(nodeset(replicas=replicas), kept_nodes, kept, states)) == plan(
        view(nodeset(replicas=replicas), whole_nodes, whole, states)
    )


def test_rule_a_nodeset_pod_is_kept_without_container_internals_or_kubelets_statuses() -> None:
    whole = dressed(pod("gpu-001-001", "n0", not_registered_since=T0, delete_reason="x"), 1)
    kept = keep_in_view(whole)
    assert isinstance(kept, dict)
    assert kept["spec"]["containers"] == [{"name": "c", "resources": {"requests": {"cpu": "2"}}}]
    assert kept["spec"]["tolerations"] == whole["spec"]["tolerations"]
    assert "volumes" not in kept["spec"]
    assert set(kept["status"]) == {"phase", "conditions"}
    assert {c["type"] for c in kept["status"]["conditions"]} == {
        "Ready",
        "SlurmDelete",
        "SlurmNodeStateUnknown",
    }
    assert LAST_APPLIED not in kept["metadata"]["annotations"]
    assert kept["metadata"]["labels"] == whole["metadata"]["labels"]


def test_rule_a_kept_node_has_what_feasibility_and_naming_read() -> None:
    node: dict[str, Any] = {
        "metadata": {
            "name": "gpu-1",
            "labels": {"topology/block": "b1"},
            "annotations": {"nodeflow.dev/nodeset-claim": "slurm/gpu"},
        },
        "spec": {"taints": [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]},
        "status": {
            "addresses": [{"type": "InternalIP", "address": "10.174.1.2"}],
            "allocatable": {"cpu": "64", "nvidia.com/gpu": "8"},
            "capacity": {"cpu": "64", "nvidia.com/gpu": "8"},
            "conditions": [{"type": "Ready", "status": "True"}],
            "images": [{"names": ["registry/slurmd:24.11"], "sizeBytes": 1}],
            "nodeInfo": {"kubeletVersion": "v1.36.3"},
        },
    }
    kept = keep_node_in_view(node)
    assert internal_ipv4(kept) == internal_ipv4(node)
    assert node_allocatable(kept) == node_allocatable(node)
    assert claim_of(kept) == claim_of(node)
    assert kept["metadata"] == node["metadata"] and kept["spec"] == node["spec"]
    assert set(kept["status"]) == {"addresses", "allocatable", "capacity"}


def test_rule_pods_of_one_nodeset_and_nodes_of_one_pool_hold_their_common_parts_once() -> None:
    """Ten thousand slurmd pods of one NodeSet repeat its labels, owner, containers and
    tolerations, and the nodes of a pool their allocatable: each is kept once."""
    first, second = (
        keep_in_view(dressed(pod(name, node), index))
        for index, (name, node) in enumerate((("gpu-001-001", "n0"), ("gpu-001-002", "n1")))
    )
    assert isinstance(first, dict) and isinstance(second, dict)
    for section, part in (("metadata", "labels"), ("spec", "containers")):
        assert second[section][part] is first[section][part]
    assert second["spec"]["tolerations"] is first["spec"]["tolerations"]
    assert pod_node(first) == "n0" and pod_node(second) == "n1"
    nodes_kept = [
        keep_node_in_view(
            {
                "metadata": {"name": name},
                "status": {
                    "addresses": [{"type": "InternalIP", "address": address}],
                    "allocatable": {"cpu": "64", "nvidia.com/gpu": "8"},
                },
            }
        )
        for name, address in (("gpu-1", "10.174.1.2"), ("gpu-2", "10.174.1.3"))
    ]
    assert nodes_kept[0]["status"]["allocatable"] is nodes_kept[1]["status"]["allocatable"]
    assert nodes_kept[0]["status"]["addresses"] is not nodes_kept[1]["status"]["addresses"]
