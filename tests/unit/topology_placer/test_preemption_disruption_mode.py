"""KEP-4671's disruption mode (issue #31 item 8): the pods of a scheduling.k8s.io PodGroup
(`spec.schedulingGroup.podGroupName`, Kubernetes 1.36's Workload API) are preemption victims
one by one in its default mode, Pod, and only all together in mode PodGroup; a group the
placer has not read is taken in the default mode."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.topology_placer.builders import node, pod, pod_group
from tests.unit.topology_placer.simulate import run
from topology_placer.planner import Decision, Disrupt, Nominate, Plan
from topology_placer.pods import placement_fields
from topology_placer.preemption import evicted_whole, workload_group_of


def _of(result: Plan, kind: type[Any]) -> list[Any]:
    return [a for a in result.actions if isinstance(a, kind)]


def workload_member(name: str, group: str, node_name: str, gpus: int = 8) -> dict[str, Any]:
    member = pod(name, None, gpus=gpus, node_name=node_name, phase="Running")
    member["spec"]["schedulingGroup"] = {"podGroupName": group}
    return member


def workload_group(name: str, mode: str | None) -> dict[str, Any]:
    spec: dict[str, Any] = {"schedulingPolicy": {"gang": {"minCount": 4}}}
    if mode is not None:
        spec["disruptionMode"] = mode
    return {
        "apiVersion": "scheduling.k8s.io/v1alpha2",
        "kind": "PodGroup",
        "metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}"},
        "spec": spec,
    }


def four_nodes_of_one_training_job() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    nodes = [node(f"n{i}", "s1", "b1") for i in (1, 2, 3, 4)]
    members = [workload_member(f"train-{i}", "train", f"n{i}") for i in (1, 2, 3, 4)]
    return nodes, members


def preempt_one_node(workload_groups: list[dict[str, Any]]) -> Plan:
    nodes, members = four_nodes_of_one_training_job()
    gang = [pod("p-1", "hello-job", gpus=8, priority=100)]
    result, _ = run(
        nodes, [*members, *gang], [pod_group("hello-job", 1)], workload_groups=workload_groups
    )
    return result


def test_rule_a_workload_pod_group_in_mode_pod_loses_only_its_pods_on_the_chosen_nodes() -> None:
    for groups in ([workload_group("train", "Pod")], [workload_group("train", None)]):
        result = preempt_one_node(groups)
        evicted = [d.pod.name for d in _of(result, Disrupt)]
        assert len(evicted) == 1, groups
        assert [n.node for n in _of(result, Nominate)] == [f"n{evicted[0].removeprefix('train-')}"]


def test_rule_a_workload_pod_group_in_mode_pod_group_is_evicted_whole() -> None:
    result = preempt_one_node([workload_group("train", "PodGroup")])
    assert {d.pod.name for d in _of(result, Disrupt)} == {f"train-{i}" for i in (1, 2, 3, 4)}
    decision = next(d for d in _of(result, Decision) if d.kind == "preempted")
    assert "evicting 4 pods of 1 lower-priority jobs" in decision.message


def test_rule_a_workload_pod_group_not_read_is_taken_in_the_default_mode() -> None:
    """The alpha API not served (or its object not mirrored yet): the default, Pod."""
    result = preempt_one_node([])
    assert len(_of(result, Disrupt)) == 1


def test_rule_a_whole_workload_pod_group_is_chosen_only_when_nothing_cheaper_frees_room() -> None:
    """Evicting a whole group costs one job, but a cheaper (lower-priority) pod elsewhere is
    still chosen first; the group's pods of another namespace's group of the same name are
    not its pods."""
    nodes, members = four_nodes_of_one_training_job()
    nodes.append(node("n5", "s1", "b1"))
    cheap = pod("cheap", None, gpus=8, node_name="n5", priority=-5, phase="Running")
    other_namespace = workload_member("train-x", "train", "n5", gpus=0)
    other_namespace["metadata"]["namespace"] = "other"
    gang = [pod("p-1", "hello-job", gpus=8, priority=100)]
    result, _ = run(
        nodes,
        [*members, cheap, other_namespace, *gang],
        [pod_group("hello-job", 1)],
        workload_groups=[workload_group("train", "PodGroup")],
    )
    assert {d.pod.name for d in _of(result, Disrupt)} == {"cheap"}


def test_rule_the_placer_keeps_a_bound_pods_scheduling_group_and_reads_the_mode() -> None:
    member = workload_member("train-1", "train", "n1")
    kept = placement_fields(member)
    assert workload_group_of(kept) == "default/train"
    assert evicted_whole(
        [workload_group("train", "PodGroup"), workload_group("eval", "Pod")]
    ) == frozenset({"podgroup.scheduling.k8s.io default/train"})
    assert workload_group_of(pod("plain", None, gpus=1, node_name="n1")) is None


@given(
    layout=st.lists(
        st.tuples(st.sampled_from(["a", "b", "c", None]), st.sampled_from([2, 4, 8])),
        min_size=2,
        max_size=8,
    ),
    modes=st.fixed_dictionaries(
        {name: st.sampled_from(["Pod", "PodGroup", None]) for name in ("a", "b", "c")}
    ),
    wanted=st.integers(min_value=1, max_value=3),
)
@settings(max_examples=150, deadline=None)
def test_property_a_pod_group_mode_group_loses_all_its_pods_or_none(
    layout: list[tuple[str | None, int]], modes: dict[str, str | None], wanted: int
) -> None:
    """Whatever the victims' layout and the gang's size: of a group in mode PodGroup either
    every pod is evicted or none; nothing at the gang's priority or above is."""
    nodes = [node(f"n{i}", "s1", "b1") for i in range(len(layout))]
    pods: list[dict[str, Any]] = []
    for index, (group, gpus) in enumerate(layout):
        if group is None:
            pods.append(pod(f"solo-{index}", None, gpus=gpus, node_name=f"n{index}"))
        else:
            pods.append(workload_member(f"{group}-{index}", group, f"n{index}", gpus=gpus))
    gang = [pod(f"p-{i}", "hello-job", gpus=8, priority=100) for i in range(wanted)]
    groups = [workload_group(name, mode) for name, mode in modes.items()]
    result, _ = run(nodes, [*pods, *gang], [pod_group("hello-job", wanted)], workload_groups=groups)
    evicted = {d.pod.name for d in _of(result, Disrupt)}
    for name, mode in modes.items():
        members = {p["metadata"]["name"] for p in pods if workload_group_of(p) == f"default/{name}"}
        if mode == "PodGroup":
            assert members & evicted in (set(), members), (name, members, evicted)
    assert not {g["metadata"]["name"] for g in gang} & evicted
