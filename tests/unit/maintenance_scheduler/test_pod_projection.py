"""The maintenance controller keeps each pod as `kept_pod_facts` makes it: nothing its drain
decisions read may be lost (every pod of the cluster is in that view, so it must be small)."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from maintenance_scheduler.pods import kept_pod_facts, pod_facts
from maintenance_scheduler.service import node_facts, node_fields
from maintenance_scheduler.skyhook.observe import node_view
from maintenance_scheduler.skyhook.service import node_metadata, only_skyhook_pods

NAMES = st.sampled_from(["a", "b", "slurmd-0", "trainer"])
LABELS = st.dictionaries(
    st.sampled_from(["app", "nodeflow.dev/nodeset", "slurm.nodeflow.dev/cluster", "team"]),
    NAMES,
)
OWNER = st.fixed_dictionaries(
    {"kind": st.sampled_from(["DaemonSet", "ReplicaSet", "Job"]), "name": NAMES},
    optional={"controller": st.booleans(), "uid": NAMES},
)
CONDITION = st.fixed_dictionaries(
    {
        "type": st.sampled_from(
            ["Ready", "SlurmNodeStateIdle", "SlurmNodeStateAllocated", "SlurmNodeStateDrain"]
        ),
        "status": st.sampled_from(["True", "False"]),
    },
    optional={"message": NAMES, "reason": NAMES},
)
CONTAINER = st.fixed_dictionaries(
    {"name": NAMES, "image": NAMES},
    optional={
        "resources": st.fixed_dictionaries(
            {},
            optional={
                "requests": st.dictionaries(
                    st.sampled_from(["cpu", "memory", "nvidia.com/gpu"]), st.just("1")
                ),
                "limits": st.dictionaries(st.sampled_from(["nvidia.com/gpu"]), st.just("1")),
            },
        )
    },
)
VOLUME = st.one_of(
    st.just({"name": "scratch", "emptyDir": {}}),
    st.just({"name": "config", "configMap": {"name": "c"}}),
)


@st.composite
def pods(draw: st.DrawFn) -> dict[str, Any]:
    metadata: dict[str, Any] = {
        "name": draw(NAMES),
        "namespace": draw(st.sampled_from(["default", "slurm"])),
        "uid": draw(NAMES),
        "resourceVersion": "7",
        "labels": draw(LABELS),
        "ownerReferences": draw(st.lists(OWNER, max_size=2)),
        "annotations": draw(
            st.dictionaries(st.sampled_from(["kubernetes.io/config.mirror", "note"]), NAMES)
        ),
    }
    if draw(st.booleans()):
        metadata["deletionTimestamp"] = "2026-11-26T00:00:00Z"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": {
            "nodeName": draw(st.sampled_from(["", "n1", "n2"])),
            "containers": draw(st.lists(CONTAINER, max_size=3)),
            "volumes": draw(st.lists(VOLUME, max_size=2)),
            "tolerations": [{"key": "x", "operator": "Exists"}],
        },
        "status": {
            "phase": draw(st.sampled_from(["Pending", "Running", "Succeeded", "Failed"])),
            "conditions": draw(st.lists(CONDITION, max_size=5)),
            "podIP": "10.0.0.1",
        },
    }


@given(pods())
def test_rule_the_kept_pod_says_to_the_drain_what_the_whole_pod_says(pod: dict[str, Any]) -> None:
    assert kept_pod_facts(pod) == pod_facts(pod)


def test_rule_pods_kept_share_one_copy_of_what_they_repeat() -> None:
    """50,000 kept pods repeat a few namespaces, nodes, label keys and values, resource-name
    sets: each is kept once (decoded JSON gives every pod its own copy)."""

    def decoded(name: str) -> dict[str, Any]:
        # Built afresh each time, as a decoder does: equal strings, distinct objects.
        return {
            "metadata": {
                "name": name,
                "namespace": "".join(["team", "-a"]),
                "labels": {"".join(["ap", "p"]): "".join(["train", "er"])},
            },
            "spec": {
                "nodeName": "".join(["gpu", "-1"]),
                "containers": [{"resources": {"requests": {"".join(["cp", "u"]): "1"}}}],
            },
            "status": {"phase": "".join(["Run", "ning"])},
        }

    first, second = kept_pod_facts(decoded("a")), kept_pod_facts(decoded("b"))
    assert first.namespace is second.namespace and first.node is second.node
    assert first.phase is second.phase
    [(key_a, value_a)] = first.labels.items()
    [(key_b, value_b)] = second.labels.items()
    assert key_a is key_b and value_a is value_b
    assert first.requested_resources is second.requested_resources


def test_rule_the_skyhook_controller_keeps_only_its_stage_job_pods() -> None:
    stage = {"metadata": {"name": "p", "labels": {"skyhook.nvidia.com/name": "gpu-driver"}}}
    assert only_skyhook_pods(stage) is stage
    assert only_skyhook_pods({"metadata": {"name": "q", "labels": {"app": "x"}}}) is None


@given(
    unschedulable=st.one_of(st.none(), st.booleans()),
    ready=st.one_of(st.none(), st.sampled_from(["True", "False", "Unknown"])),
    reason=st.one_of(st.none(), st.sampled_from(["", "maintenance-scheduler: default/r"])),
)
def test_rule_the_kept_node_gives_the_same_node_facts(
    unschedulable: bool | None, ready: str | None, reason: str | None
) -> None:
    annotations = {"other": "x"}
    if reason is not None:
        annotations["nodeflow.dev/node-cordon-reason"] = reason
    spec: dict[str, Any] = {"podCIDR": "10.0.0.0/24"}
    if unschedulable is not None:
        spec["unschedulable"] = unschedulable
    conditions = [{"type": "MemoryPressure", "status": "False"}]
    if ready is not None:
        conditions.append({"type": "Ready", "status": ready, "reason": "KubeletReady"})
    node = {
        "metadata": {"name": "n1", "uid": "u1", "resourceVersion": "4", "annotations": annotations},
        "spec": spec,
        "status": {"conditions": conditions, "capacity": {"cpu": "64"}},
    }
    assert node_facts(node_fields(node)) == node_facts(node)


@given(
    labels=LABELS,
    annotations=st.dictionaries(st.sampled_from(["skyhook.nvidia.com/state_gpu", "note"]), NAMES),
    unschedulable=st.booleans(),
)
def test_rule_the_skyhook_controller_keeps_of_a_node_what_its_node_view_reads(
    labels: dict[str, str], annotations: dict[str, str], unschedulable: bool
) -> None:
    node = {
        "metadata": {
            "name": "n1",
            "uid": "u1",
            "resourceVersion": "4",
            "creationTimestamp": "2026-11-26T00:00:00Z",
            "labels": labels,
            "annotations": annotations,
        },
        "spec": {"unschedulable": unschedulable, "taints": [{"key": "x", "effect": "NoSchedule"}]},
        "status": {
            "conditions": [{"type": "Ready", "status": "True"}],
            "images": [{"names": ["registry/slurmd:24.11"], "sizeBytes": 1}],
            "nodeInfo": {"kubeletVersion": "v1.36.3"},
        },
    }
    kept = node_metadata(node)
    assert node_view(kept) == node_view(node)
    # Of the spec only the taints (a Skyhook blocks a node whose taint it does not tolerate)
    # and the cordon (a runtimeRequiredCordon mark on a schedulable node is stale, S57).
    wanted = {"taints", "unschedulable"} if unschedulable else {"taints"}
    assert set(kept) == {"metadata", "spec"} and set(kept["spec"]) == wanted
