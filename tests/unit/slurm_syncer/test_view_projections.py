"""What slurm-syncer keeps of the cluster's pods and nodes in its views: only NodeSet pods, and
of each node only what its decisions read (a large cluster's objects were most of its memory)."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from nodeflow_contracts.pod_protocol import NODE_CORDON_REASON_ANNOTATION
from slurm_syncer.pods import (
    is_past_pending,
    node_cordon_facts,
    node_key,
    only_nodeset_pods,
    pod_facts,
)

NODESET = {"slurm.gpu": {"metadata": {"name": "gpu"}, "spec": {"slurmCluster": "a"}}}


def nodeset_pod(node: str) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "gpu-001",
            "namespace": "slurm",
            "uid": "u1",
            "resourceVersion": "3",
            "labels": {"nodeflow.dev/nodeset": "gpu"},
        },
        "spec": {"nodeName": node},
        "status": {"phase": "Running"},
    }


@given(
    unschedulable=st.one_of(st.none(), st.booleans()),
    reason=st.one_of(st.none(), st.sampled_from(["", "  ", "maintenance: firmware"])),
    extra=st.dictionaries(st.sampled_from(["topology/block", "note"]), st.just("x")),
)
def test_rule_a_projected_node_gives_the_same_pod_facts(
    unschedulable: bool | None, reason: str | None, extra: dict[str, str]
) -> None:
    annotations = dict(extra)
    if reason is not None:
        annotations[NODE_CORDON_REASON_ANNOTATION] = reason
    spec: dict[str, Any] = {"podCIDR": "10.0.0.0/24"}
    if unschedulable is not None:
        spec["unschedulable"] = unschedulable
    node = {
        "metadata": {"name": "n1", "annotations": annotations, "labels": {"a": "b"}},
        "spec": spec,
        "status": {"capacity": {"cpu": "64"}},
    }
    pod = nodeset_pod("n1")
    whole = pod_facts(pod, {node_key("n1"): node}, NODESET)
    kept = pod_facts(pod, {node_key("n1"): node_cordon_facts(node)}, NODESET)
    assert whole is not None and whole.node_known
    assert kept == whole


@given(
    phase=st.one_of(st.none(), st.sampled_from(["Pending", "Running"])),
    node=st.one_of(st.none(), st.just("n1")),
    annotations=st.dictionaries(
        st.sampled_from(["slurm.nodeflow.dev/cordon", "slurm.nodeflow.dev/cordon-source", "x"]),
        st.sampled_from(["true", "node", ""]),
    ),
    terminating=st.booleans(),
    conditions=st.lists(
        st.fixed_dictionaries(
            {
                "type": st.sampled_from(["Ready", "SlurmDelete", "SlurmNodeStateIdle"]),
                "status": st.sampled_from(["True", "False"]),
            },
            optional={"reason": st.just("ScalingDeleteScheduled"), "message": st.just("m")},
        ),
        max_size=3,
    ),
)
def test_rule_a_kept_nodeset_pod_gives_the_same_pod_facts(
    phase: str | None,
    node: str | None,
    annotations: dict[str, str],
    terminating: bool,
    conditions: list[dict[str, str]],
) -> None:
    pod = nodeset_pod(node or "")
    if node is None:
        del pod["spec"]["nodeName"]
    pod["metadata"]["annotations"] = annotations
    pod["metadata"]["ownerReferences"] = [{"kind": "NodeSet", "name": "gpu", "uid": "u"}]
    if terminating:
        pod["metadata"]["deletionTimestamp"] = "2026-11-26T00:00:00Z"
    pod["spec"]["containers"] = [{"name": "slurmd", "image": "slurmd:24.11"}]
    pod["status"] = {"conditions": conditions, "podIP": "10.0.0.1"}
    if phase is not None:
        pod["status"]["phase"] = phase
    nodes = {node_key("n1"): {"metadata": {"name": "n1"}, "spec": {"unschedulable": True}}}
    kept = only_nodeset_pods(pod)
    assert kept is not None
    assert pod_facts(kept, nodes, NODESET) == pod_facts(pod, nodes, NODESET)
    assert is_past_pending(kept) == is_past_pending(pod)
    assert "containers" not in kept["spec"]


def test_rule_no_other_pod_is_kept() -> None:
    assert only_nodeset_pods({"metadata": {"name": "job", "labels": {"app": "x"}}}) is None
