"""What nodeset-controller keeps of pods in its view: its own NodeSet pods whole, and of every
other pod only what it reads (name, labels, node, requests, phase), with nothing lost."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from nodeset_controller.objects import (
    claim_of,
    internal_ipv4,
    keep_in_view,
    keep_node_in_view,
    node_allocatable,
    pod_node,
    pod_occupies_node,
    pod_requests,
)

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
    assert pod_node(kept) == pod_node(pod)
    assert pod_occupies_node(kept) == pod_occupies_node(pod)
    assert pod_requests(kept["spec"]) == pod_requests(pod["spec"])
    for key in ("name", "namespace", "labels"):
        assert kept["metadata"][key] == pod["metadata"][key]
    assert "managedFields" not in kept["metadata"]


def test_rule_a_nodeset_pod_is_kept_whole() -> None:
    pod = {"metadata": {"name": "gpu-1", "labels": {"nodeflow.dev/nodeset": "gpu"}}, "spec": {}}
    assert keep_in_view(pod) is pod


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
    assert kept["status"]["conditions"] == node["status"]["conditions"]
    assert kept["metadata"] == node["metadata"] and kept["spec"] == node["spec"]
    assert "images" not in kept["status"] and "nodeInfo" not in kept["status"]
