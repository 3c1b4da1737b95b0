"""Rules of job-level preemption, through the placement pass."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from nodeflow_contracts.pod_protocol import NODESET_LABEL
from tests.unit.plan_checks import expect_actions, expect_no_actions
from tests.unit.topology_placer.builders import TOPOLOGY, node, pod, pod_group
from tests.unit.topology_placer.simulate import run, state
from topology_placer.fit import pod_request_milli
from topology_placer.gang import MODE, POD_GROUP_LABEL
from topology_placer.inflight import InFlight
from topology_placer.planner import (
    Decision,
    Disrupt,
    MarkUnschedulable,
    Nominate,
    Plan,
    plan,
)
from topology_placer.preemption import (
    DISABLE_PREEMPTIBLE_LABEL,
    QUOTA_PREEMPTIBLE_LABEL,
    ChargedPod,
    broken_budgets,
    eligibility,
    is_protected_from_preemption,
    preemption_message,
    victim_units,
)

BLOCK_MUST = [{"layer": "BlockLayer", "strategy": "MustGather"}]


def _of(result: Plan, kind: type[Any]) -> list[Any]:
    return [a for a in result.actions if isinstance(a, kind)]


def _two_nodes() -> list[dict[str, Any]]:
    return [node("n1", "s1", "b1"), node("n2", "s1", "b1")]


def _hello_job() -> list[dict[str, Any]]:
    return [pod(f"preemptor-pod-{i}", "hello-job", gpus=8, priority=100) for i in (1, 2)]


def test_preemption_evicts_lower_priority_job_with_the_reference_message() -> None:
    victims = [pod(f"victim-{i}", None, gpus=8, node_name=f"n{i}", owner="low") for i in (1, 2)]
    result, _after = run(_two_nodes(), victims + _hello_job(), [pod_group("hello-job", 2)])
    evicted = _of(result, Disrupt)
    assert {e.pod.name for e in evicted} == {"victim-1", "victim-2"}
    assert {e.reason for e in evicted} == {"PreemptionByScheduler"}
    assert evicted[0].message == (
        "koord-scheduler: preempting to accommodate higher priority pods, preemptor: "
        "default/hello-job, triggerpod: default/preemptor-pod-1"
    )
    nominations = {(n.pod.name, n.node) for n in _of(result, Nominate)}
    assert {name for name, _ in nominations} == {"preemptor-pod-1", "preemptor-pod-2"}
    decision = next(d for d in _of(result, Decision) if d.kind == "preempted")
    assert decision.victims == ("default/victim-1", "default/victim-2")
    assert result.gang_states["default/hello-job"] == "preempting"


def test_preemption_message_matches_the_reference() -> None:
    assert preemption_message("koord-scheduler", "default/hello-job", "default/p-2") == (
        "koord-scheduler: preempting to accommodate higher priority pods, "
        "preemptor: default/hello-job, triggerpod: default/p-2"
    )


def test_preemption_policy_never_makes_the_gang_ineligible() -> None:
    victims = [pod(f"v-{i}", None, gpus=8, node_name=f"n{i}") for i in (1, 2)]
    gang = [
        pod(f"p-{i}", "hello-job", gpus=8, priority=100, preemption_policy="Never") for i in (1, 2)
    ]
    result, _ = run(_two_nodes(), victims + gang, [pod_group("hello-job", 2)])
    assert not _of(result, Disrupt)
    decision = next(d for d in _of(result, Decision) if d.kind == "unschedulable")
    assert "preemptionPolicy Never" in decision.message


def test_victims_still_terminating_block_a_second_preemption_and_keep_nominations() -> None:
    terminating = [pod(f"v-{i}", None, gpus=8, node_name=f"n{i}", deleting=True) for i in (1, 2)]
    other = pod("v-3", None, gpus=8, node_name="n3")
    gang = [pod(f"p-{i}", "hello-job", gpus=8, priority=100, nominated=f"n{i}") for i in (1, 2)]
    nodes = [*_two_nodes(), node("n3", "s1", "b1")]
    result, _ = run(nodes, [*terminating, other, *gang], [pod_group("hello-job", 2)])
    assert not _of(result, Disrupt)
    assert not _of(result, Nominate)
    decision = next(d for d in _of(result, Decision) if d.kind == "unschedulable")
    assert "still terminating on nominated node" in decision.message


def test_unneeded_victims_are_given_back() -> None:
    nodes = [node("n1", "s1", "b1", gpus=8)]
    small = [pod(f"v-{i}", None, gpus=2, node_name="n1", owner=f"job{i}") for i in range(4)]
    gang = [pod("p-1", "hello-job", gpus=4, priority=100)]
    result, _ = run(nodes, [*small, *gang], [pod_group("hello-job", 1)])
    assert len(_of(result, Disrupt)) == 2


def test_rule_a_nodeset_pod_is_never_a_preemption_victim() -> None:
    """A slurmd pod may run Slurm jobs the placer cannot see: whatever its priority, only the
    NodeSet protocol (drain in Slurm first) takes it away. With it the only way to make room,
    the gang waits and nothing is deleted."""
    slurmd = [pod(f"slurmd-{i}", None, gpus=8, node_name=f"n{i}", owner="gpu") for i in (1, 2)]
    for member in slurmd:
        member["metadata"]["labels"] = {NODESET_LABEL: "gpu"}
    result, _ = run(_two_nodes(), slurmd + _hello_job(), [pod_group("hello-job", 2)])
    assert not _of(result, Disrupt)
    assert not _of(result, Nominate)
    # Without the label the same pods are victims: the label alone protects them. (Removing
    # it is a new version of each pod, as the API server makes on every change.)
    for member in slurmd:
        member["metadata"]["labels"] = {}
        member["metadata"]["resourceVersion"] = "2"
    result, _ = run(_two_nodes(), slurmd + _hello_job(), [pod_group("hello-job", 2)])
    assert {d.pod.name for d in _of(result, Disrupt)} == {"slurmd-1", "slurmd-2"}


def test_least_cost_evicts_the_lowest_priority_job() -> None:
    nodes = [node("n1", "s1", "b1"), node("n2", "s2", "b3")]
    cheap = pod("cheap", None, gpus=8, node_name="n1", priority=1)
    dear = pod("dear", None, gpus=8, node_name="n2", priority=50)
    gang = [pod("p-1", "hello-job", gpus=8, priority=100)]
    result, _ = run(nodes, [cheap, dear, *gang], [pod_group("hello-job", 1)], topology=TOPOLOGY)
    assert [e.pod.name for e in _of(result, Disrupt)] == ["cheap"]


def test_rule_a_victim_gang_in_mode_single_loses_only_its_members_on_the_chosen_nodes() -> None:
    """KEP-4671's default disruption mode `single`, as Koordinator evicts victim gangs: pod by
    pod. The low gang spans both nodes; taking n1 evicts only its member there."""
    nodes = [node("n1", "s1", "b1"), node("n2", "s2", "b3")]
    low = [
        pod("low-0", "low", gpus=8, node_name="n1", phase="Running"),
        pod("low-1", "low", gpus=4, node_name="n2", phase="Running"),
    ]
    gang = [pod("p-1", "hello-job", gpus=8, priority=100)]
    groups = [pod_group("low", 2), pod_group("hello-job", 1)]
    result, _ = run(nodes, [*low, *gang], groups, topology=TOPOLOGY)
    assert {e.pod.name for e in _of(result, Disrupt)} == {"low-0"}
    decision = next(d for d in _of(result, Decision) if d.kind == "preempted")
    assert "evicting 1 pods of 1 lower-priority jobs" in decision.message


def test_rule_a_victim_gangs_members_are_costed_as_one_job() -> None:
    """Members of one gang cost one job, as replicas do: the block holding two of them is
    cheaper than the (earlier) block holding one pod each of two gangs of the same priority."""
    nodes = [node("n1", "s1", "b1"), node("n2", "s1", "b1")]
    nodes += [node("n3", "s2", "b3"), node("n4", "s2", "b3")]
    two_gangs = [
        pod("a-1", "a", gpus=8, node_name="n1", phase="Running"),
        pod("b-2", "b", gpus=8, node_name="n2", phase="Running"),
    ]
    one_gang = [pod(f"c-{i}", "c", gpus=8, node_name=f"n{i}", phase="Running") for i in (3, 4)]
    gang = [pod(f"p-{i}", "hello-job", gpus=8, priority=100) for i in (1, 2)]
    groups = [pod_group(name, 1) for name in ("a", "b", "c")]
    groups.append(pod_group("hello-job", 2, gather=BLOCK_MUST))
    result, _ = run(nodes, [*two_gangs, *one_gang, *gang], groups, topology=TOPOLOGY)
    assert {d.pod.name for d in _of(result, Disrupt)} == {"c-3", "c-4"}


def test_plan_breaking_a_disruption_budget_is_used_only_when_no_other_exists() -> None:
    nodes = [node("n1", "s1", "b1"), node("n2", "s2", "b3")]
    guarded = pod("guarded", None, gpus=8, node_name="n1", priority=1)
    guarded["metadata"]["labels"] = {"app": "db"}
    free = pod("free", None, gpus=8, node_name="n2", priority=5)
    gang = [pod("p-1", "hello-job", gpus=8, priority=100)]
    budget = {
        "metadata": {"name": "db", "namespace": "default"},
        "spec": {"selector": {"matchLabels": {"app": "db"}}},
        "status": {"disruptionsAllowed": 0},
    }
    groups = [pod_group("hello-job", 1)]
    result = plan(state(nodes, [guarded, free, *gang], groups, topology=TOPOLOGY, budgets=[budget]))
    # The budget-breaking plan is cheaper (priority 1) but another plan exists.
    assert [e.pod.name for e in _of(result, Disrupt)] == ["free"]
    only = plan(state(nodes[:1], [guarded, *gang], groups, topology=TOPOLOGY, budgets=[budget]))
    assert [e.pod.name for e in _of(only, Disrupt)] == ["guarded"]
    decision = next(d for d in _of(only, Decision) if d.kind == "preempted")
    assert "budgets broken 1" in decision.message
    assert broken_budgets([guarded], [budget]) == 1


def test_rule_a_budget_with_an_empty_selector_guards_every_pod_of_its_namespace() -> None:
    # policy/v1: `selector: {}` selects all pods in the namespace; a null selector selects none.
    victim = pod("anyone", None, gpus=8, node_name="n1", priority=1)
    victim["metadata"]["labels"] = {"app": "whatever"}
    elsewhere = {**victim, "metadata": {**victim["metadata"], "namespace": "other"}}

    def budget(selector: object) -> dict[str, object]:
        return {
            "metadata": {"name": "all", "namespace": "default"},
            "spec": {"selector": selector} if selector is not None else {},
            "status": {"disruptionsAllowed": 0},
        }

    assert broken_budgets([victim], [budget({})]) == 1
    assert broken_budgets([elsewhere], [budget({})]) == 0
    assert broken_budgets([victim], [budget(None)]) == 0
    assert broken_budgets([victim], [budget({"matchLabels": {"app": "db"}})]) == 0


def test_rule_a_budget_selects_by_its_match_expressions() -> None:
    # The selector is read by nodeflow_kube.labels, as the emulator's eviction reads it.
    victim = pod("db-0", None, gpus=8, node_name="n1", priority=1)
    victim["metadata"]["labels"] = {"app": "db", "tier": "primary"}

    def budget(*expressions: dict[str, object]) -> dict[str, object]:
        return {
            "metadata": {"name": "db", "namespace": "default"},
            "spec": {"selector": {"matchExpressions": list(expressions)}},
            "status": {"disruptionsAllowed": 0},
        }

    def guarded(*expressions: dict[str, object]) -> bool:
        return broken_budgets([victim], [budget(*expressions)]) == 1

    assert guarded({"key": "app", "operator": "In", "values": ["db", "cache"]})
    assert not guarded({"key": "app", "operator": "NotIn", "values": ["db"]})
    assert guarded({"key": "tier", "operator": "Exists"})
    assert not guarded({"key": "tier", "operator": "DoesNotExist"})
    assert not guarded({"key": "tier", "operator": "Exists"}, {"key": "zone", "operator": "Exists"})
    # An operator the object form does not have (node affinity's Gt) reads as no selector.
    assert not guarded({"key": "tier", "operator": "Gt", "values": ["1"]})


def test_preemption_not_helpful_evicts_nothing() -> None:
    nodes = [node("n1", "s1", "b1", gpus=4)]
    victim = pod("v", None, gpus=4, node_name="n1")
    gang = [pod("p-1", "hello-job", gpus=8, priority=100)]
    result, _ = run(nodes, [victim, *gang], [pod_group("hello-job", 1)])
    assert not _of(result, Disrupt)
    decision = next(d for d in _of(result, Decision) if d.kind == "unschedulable")
    assert "preemption not helpful" in decision.message


def test_higher_or_equal_priority_pods_are_never_victims() -> None:
    nodes = [node("n1", "s1", "b1"), node("n2", "s1", "b1"), node("n3", "s1", "b1")]
    running = [
        pod("peer", None, gpus=8, node_name="n1", priority=100),
        pod("higher", None, gpus=8, node_name="n2", priority=200),
        pod("lower", None, gpus=8, node_name="n3", priority=99),
    ]
    # One pod: the lower-priority pod is the victim, never the peer or the higher one.
    one = [pod("p-1", "hello-job", gpus=8, priority=100)]
    result, _ = run(nodes, [*running, *one], [pod_group("hello-job", 1)])
    expect_actions(result.actions, Disrupt, count=1, pod__name="lower")
    expect_actions(result.actions, Nominate, count=1, pod__name="p-1", node="n3")
    # Two pods need a second node, which only evicting the peer or the higher pod would
    # free: nothing is evicted at all (all or nothing), and the gang is told why.
    two = [pod(f"p-{i}", "hello-job", gpus=8, priority=100) for i in (1, 2)]
    result, _ = run(nodes, [*running, *two], [pod_group("hello-job", 2)])
    expect_no_actions(result.actions, Disrupt, while_it_has=MarkUnschedulable)
    decision = next(d for d in _of(result, Decision) if d.kind == "unschedulable")
    assert "preemption not helpful" in decision.message


@settings(max_examples=80, deadline=None)
@given(
    victims=st.lists(
        st.tuples(st.integers(0, 3), st.sampled_from([2, 4, 8]), st.integers(0, 150)), max_size=8
    ),
    size=st.integers(1, 4),
)
def test_property_preemption_never_evicts_equal_or_higher_priority_and_places_whole(
    victims: list[tuple[int, int, int]], size: int
) -> None:
    nodes = [node(f"n{i}", f"s{i // 2}", f"b{i // 2}") for i in range(4)]
    running = [
        pod(f"v{k}", None, gpus=gpus, node_name=f"n{n}", priority=priority)
        for k, (n, gpus, priority) in enumerate(victims)
    ]
    # Victims may overcommit in this generator; keep only what fits on each node.
    used: dict[str, int] = {}
    kept = []
    for p in running:
        gpus = int(p["spec"]["containers"][0]["resources"]["requests"]["nvidia.com/gpu"])
        if used.get(p["spec"]["nodeName"], 0) + gpus <= 8:
            used[p["spec"]["nodeName"]] = used.get(p["spec"]["nodeName"], 0) + gpus
            kept.append(p)
    gang = [pod(f"p-{i}", "hello-job", gpus=8, priority=100) for i in range(size)]
    result, after = run(nodes, kept + gang, [pod_group("hello-job", size)], topology=TOPOLOGY)
    evicted = {e.pod.name for e in _of(result, Disrupt)}
    assert all(p["spec"]["priority"] < 100 for p in kept if p["metadata"]["name"] in evicted)
    nominated = [
        p
        for p in after
        if p["metadata"]["name"].startswith("p-") and p["status"].get("nominatedNodeName")
    ]
    assert len(nominated) in (0, size)
    # ... and all of it whenever evicting only lower-priority pods frees enough nodes: a
    # planner that places or evicts nothing fails here.
    blocked = {p["spec"]["nodeName"] for p in kept if p["spec"]["priority"] >= 100}
    if len({n["metadata"]["name"] for n in nodes} - blocked) >= size:
        assert len(nominated) == size
    per_node: dict[str, int] = {}
    for p in after:
        where = p["spec"].get("nodeName") or p["status"].get("nominatedNodeName")
        if where:
            gpus = int(p["spec"]["containers"][0]["resources"]["requests"]["nvidia.com/gpu"])
            per_node[where] = per_node.get(where, 0) + gpus
    assert all(total <= 8 for total in per_node.values())


def test_a_gang_does_not_preempt_again_while_its_victims_terminate() -> None:
    # The evictions landed before the nominations: the victims carry the gang's
    # DisruptionTarget and still hold their nodes, the members are not nominated yet.
    message = preemption_message("koord-scheduler", "default/hello-job", "default/p-1")
    marked = []
    for i in (1, 2):
        victim = pod(f"v-{i}", None, gpus=8, node_name=f"n{i}", deleting=True)
        victim["status"]["conditions"] = [
            {
                "type": "DisruptionTarget",
                "status": "True",
                "reason": "PreemptionByScheduler",
                "message": message,
            }
        ]
        marked.append(victim)
    others = [pod(f"o-{i}", None, gpus=8, node_name=f"n{i}") for i in (3, 4)]
    nodes = [node(f"n{i}", "s1", "b1") for i in (1, 2, 3, 4)]
    gang = [pod(f"p-{i}", "hello-job", gpus=8, priority=100) for i in (1, 2)]
    result, _ = run(nodes, [*marked, *others, *gang], [pod_group("hello-job", 2)])
    assert not _of(result, Disrupt)
    decision = next(d for d in _of(result, Decision) if d.kind == "unschedulable")
    assert "of this gang's preemption is still terminating" in decision.message


def test_preemption_clears_lower_priority_nominations_on_the_nodes_it_takes() -> None:
    nodes = [node("n1", "s1", "b1"), node("n2", "s1", "b1"), node("n3", "s1", "b1")]
    bound = [
        pod("low-1", None, gpus=4, node_name="n1", owner="low-1"),
        pod("low-2", None, gpus=8, node_name="n2", owner="low-2"),
        # Dearer to evict (priority 50): the plan takes n1 and n2, never n3.
        pod("mid-3", None, gpus=4, node_name="n3", priority=50, owner="mid-3"),
    ]
    # A NonStrict lower-priority gang keeps its own nominations when it cannot be placed, so
    # only the preemption can clear them.
    reserved = [
        pod("waiting-1", "low-gang", gpus=4, nominated="n1"),
        pod("waiting-3", "low-gang", gpus=4, nominated="n3"),
    ]
    groups = [
        pod_group("hello-job", 2),
        pod_group("low-gang", 2, annotations={MODE: "NonStrict"}),
    ]
    result, after = run(nodes, [*bound, *reserved, *_hello_job()], groups)
    assert {e.pod.name for e in _of(result, Disrupt)} == {"low-1", "low-2"}
    placed = {n.pod.name: n.node for n in _of(result, Nominate) if n.pod.name.startswith("pre")}
    assert sorted(placed.values()) == ["n1", "n2"]
    cleared = [n.pod.name for n in _of(result, Nominate) if n.node == ""]
    assert cleared == ["waiting-1"]
    nominated = {p["metadata"]["name"]: p["status"].get("nominatedNodeName") for p in after}
    assert nominated["waiting-1"] == ""
    assert nominated["waiting-3"] == "n3"


def _protect(target: dict[str, Any], label: str, value: str) -> dict[str, Any]:
    target["metadata"].setdefault("labels", {})[label] = value
    return target


def test_rule_pods_labelled_not_preemptible_are_never_victims() -> None:
    """Koordinator's opt-outs, with its exact keys and values: disable-preemptible "true" and
    the quota's preemptible "false" keep a pod from being a victim; with only protected pods
    in the way the gang waits and nothing is deleted."""
    for label, value in (
        (DISABLE_PREEMPTIBLE_LABEL, "true"),
        (QUOTA_PREEMPTIBLE_LABEL, "false"),
    ):
        victims = [
            _protect(pod(f"v-{i}", None, gpus=8, node_name=f"n{i}", owner="low"), label, value)
            for i in (1, 2)
        ]
        result, _ = run(_two_nodes(), victims + _hello_job(), [pod_group("hello-job", 2)])
        expect_no_actions(result.actions, Disrupt, while_it_has=MarkUnschedulable)
        assert not _of(result, Nominate)
    # Any other value leaves the pod preemptible, as upstream reads the labels.
    victims = [
        _protect(pod(f"v-{i}", None, gpus=8, node_name=f"n{i}", owner="low"), label, "True")
        for i, label in ((1, DISABLE_PREEMPTIBLE_LABEL), (2, QUOTA_PREEMPTIBLE_LABEL))
    ]
    result, _ = run(_two_nodes(), victims + _hello_job(), [pod_group("hello-job", 2)])
    assert {d.pod.name for d in _of(result, Disrupt)} == {"v-1", "v-2"}


def test_rule_a_victim_gang_with_a_protected_member_is_not_chosen() -> None:
    """One protected member protects its whole gang (evicting the rest would leave it idle):
    the plan takes the dearer unprotected job instead."""
    nodes = [node("n1", "s1", "b1"), node("n2", "s2", "b3"), node("n3", "s2", "b4")]
    low = [
        pod("low-0", "low", gpus=8, node_name="n1", phase="Running"),
        _protect(
            pod("low-1", "low", gpus=8, node_name="n2", phase="Running"),
            DISABLE_PREEMPTIBLE_LABEL,
            "true",
        ),
    ]
    dearer = pod("dearer", None, gpus=8, node_name="n3", priority=50)
    gang = [pod("p-1", "hello-job", gpus=8, priority=100)]
    groups = [pod_group("low", 2), pod_group("hello-job", 1)]
    result, _ = run(nodes, [*low, dearer, *gang], groups, topology=TOPOLOGY)
    assert [d.pod.name for d in _of(result, Disrupt)] == ["dearer"]


@settings(max_examples=80, deadline=None)
@given(
    running=st.lists(
        st.tuples(
            st.integers(0, 3),
            st.sampled_from([4, 8]),
            st.integers(0, 99),
            st.sampled_from(
                [
                    None,
                    (DISABLE_PREEMPTIBLE_LABEL, "true"),
                    (DISABLE_PREEMPTIBLE_LABEL, "false"),
                    (QUOTA_PREEMPTIBLE_LABEL, "false"),
                    (QUOTA_PREEMPTIBLE_LABEL, "true"),
                ]
            ),
            st.sampled_from([None, "low-a", "low-b"]),
        ),
        max_size=8,
    ),
    size=st.integers(1, 3),
)
def test_property_no_protected_pod_or_member_of_a_protected_gang_is_ever_a_victim(
    running: list[tuple[int, int, int, tuple[str, str] | None, str | None]], size: int
) -> None:
    nodes = [node(f"n{i}", f"s{i // 2}", f"b{i // 2}") for i in range(4)]
    used: dict[str, int] = {}
    kept: list[dict[str, Any]] = []
    for k, (where, gpus, priority, protection, group) in enumerate(running):
        if used.get(f"n{where}", 0) + gpus > 8:
            continue
        used[f"n{where}"] = used.get(f"n{where}", 0) + gpus
        victim = pod(
            f"v{k}", group, gpus=gpus, node_name=f"n{where}", priority=priority, phase="Running"
        )
        if protection is not None:
            _protect(victim, *protection)
        kept.append(victim)
    groups = [pod_group(name, 1) for name in ("low-a", "low-b")]
    gang = [pod(f"p-{i}", "hello-job", gpus=8, priority=100) for i in range(size)]
    result, _ = run(nodes, kept + gang, [*groups, pod_group("hello-job", size)], topology=TOPOLOGY)
    evicted = {d.pod.name for d in _of(result, Disrupt)}
    protected = [p for p in kept if is_protected_from_preemption(p)]
    assert not evicted & {p["metadata"]["name"] for p in protected}
    protected_gangs = {p["metadata"]["labels"].get(POD_GROUP_LABEL) for p in protected} - {None}
    assert not any(
        p["metadata"]["labels"].get(POD_GROUP_LABEL) in protected_gangs
        for p in kept
        if p["metadata"]["name"] in evicted
    )


def _marked_victims(*, deleting: bool) -> list[dict[str, Any]]:
    """The gang's two victims after a preemption whose DisruptionTarget patches landed."""
    message = preemption_message("koord-scheduler", "default/hello-job", "default/p-1")
    marked = []
    for i in (1, 2):
        victim = pod(f"v-{i}", None, gpus=8, node_name=f"n{i}", deleting=deleting)
        victim["status"]["conditions"] = [
            {
                "type": "DisruptionTarget",
                "status": "True",
                "reason": "PreemptionByScheduler",
                "message": message,
            }
        ]
        marked.append(victim)
    return marked


def _four_nodes_with_others() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    others = [pod(f"o-{i}", None, gpus=8, node_name=f"n{i}", owner=f"o-{i}") for i in (3, 4)]
    return [node(f"n{i}", "s1", "b1") for i in (1, 2, 3, 4)], others


def test_rule_a_victim_whose_delete_did_not_land_is_deleted_again_in_one_pass() -> None:
    """Half-applied preemption heals: the mark landed, the delete expired or failed (the pod
    is not deleting and no command on it may still land). The same victims are marked and
    deleted again -- no new victims, the gang keeps waiting for them -- instead of the gang
    waiting for ever on its own marker."""
    nodes, others = _four_nodes_with_others()
    gang = [pod(f"p-{i}", "hello-job", gpus=8, priority=100) for i in (1, 2)]
    marked = _marked_victims(deleting=False)
    result, _ = run(nodes, [*marked, *others, *gang], [pod_group("hello-job", 2)])
    resent = _of(result, Disrupt)
    assert {d.pod.name for d in resent} == {"v-1", "v-2"}
    assert {d.reason for d in resent} == {"PreemptionByScheduler"}
    assert {d.message for d in resent} == {marked[0]["status"]["conditions"][0]["message"]}
    decision = next(d for d in _of(result, Decision) if d.kind == "unschedulable")
    assert "did not land and is sent again" in decision.message
    # While the resent delete may still land, it is not sent a third time.
    held = InFlight(pods=frozenset({("default", "v-1"), ("default", "v-2")}))
    cluster = state(nodes, [*marked, *others, *gang], [pod_group("hello-job", 2)])
    waiting = plan(replace(cluster, in_flight=held))
    expect_no_actions(waiting.actions, Disrupt, while_it_has=MarkUnschedulable)
    decision = next(d for d in _of(waiting, Decision) if d.kind == "unschedulable")
    assert "its delete is on its way" in decision.message


def test_rule_a_marked_victim_no_longer_a_victim_does_not_block_a_new_plan() -> None:
    """A marked victim whose delete never landed and which its owner has since protected, or
    whose priority now equals the gang's, is no victim any more: the gang plans again around
    it (here: the other jobs' nodes), it is not deleted, and the gang is not blocked by its
    own marker."""
    nodes, others = _four_nodes_with_others()
    gang = [pod(f"p-{i}", "hello-job", gpus=8, priority=100) for i in (1, 2)]
    protected = [
        _protect(v, DISABLE_PREEMPTIBLE_LABEL, "true") for v in _marked_victims(deleting=False)
    ]
    raised = _marked_victims(deleting=False)
    for victim in raised:
        victim["spec"]["priority"] = 100
    for marked in (protected, raised):
        result, _ = run(nodes, [*marked, *others, *gang], [pod_group("hello-job", 2)])
        assert {d.pod.name for d in _of(result, Disrupt)} == {"o-3", "o-4"}
        assert sorted(n.node for n in _of(result, Nominate)) == ["n3", "n4"]


def _replica(
    name: str, controller: str, kind: str, node_name: str, **kwargs: Any
) -> dict[str, Any]:
    replica = pod(name, None, gpus=8, node_name=node_name, phase="Running", **kwargs)
    replica["metadata"]["ownerReferences"] = [
        {"kind": kind, "name": controller, "uid": f"uid-{controller}", "controller": True}
    ]
    return replica


def test_rule_a_replicated_workload_loses_only_the_replicas_on_the_chosen_nodes() -> None:
    """A ReplicaSet, DaemonSet or StatefulSet is not a gang: a plan needing one node takes the
    one replica there, never every replica cluster-wide."""
    nodes = [node(f"n{i}", "s1", "b1") for i in (1, 2, 3, 4)]
    for kind in ("ReplicaSet", "DaemonSet", "StatefulSet"):
        replicas = [_replica(f"web-{i}", "web", kind, f"n{i}") for i in (1, 2, 3, 4)]
        gang = [pod("p-1", "hello-job", gpus=8, priority=100)]
        result, _ = run(nodes, [*replicas, *gang], [pod_group("hello-job", 1)])
        evicted = [d.pod.name for d in _of(result, Disrupt)]
        assert len(evicted) == 1, kind
        nominated = [n.node for n in _of(result, Nominate)]
        assert nominated == [f"n{evicted[0].removeprefix('web-')}"]
        decision = next(d for d in _of(result, Decision) if d.kind == "preempted")
        assert "evicting 1 pods of 1 lower-priority jobs" in decision.message


def test_rule_a_batch_job_loses_only_the_pods_on_the_chosen_nodes() -> None:
    """A batch Job's pods outside any gang are victims pod by pod, as kube-scheduler's
    DefaultPreemption chooses them: a plan needing one node takes the one pod there, never
    every pod of the Job; the Job recreates it as it would a failed pod."""
    nodes = [node(f"n{i}", "s1", "b1") for i in (1, 2, 3, 4)]
    workers = [_replica(f"sweep-{i}", "sweep", "Job", f"n{i}") for i in (1, 2, 3, 4)]
    gang = [pod("p-1", "hello-job", gpus=8, priority=100)]
    result, _ = run(nodes, [*workers, *gang], [pod_group("hello-job", 1)])
    evicted = [d.pod.name for d in _of(result, Disrupt)]
    assert len(evicted) == 1
    assert [n.node for n in _of(result, Nominate)] == [f"n{evicted[0].removeprefix('sweep-')}"]


def test_rule_pods_of_another_owner_are_still_evicted_with_their_owner() -> None:
    """A custom controller's pods may depend on each other in ways not read here: they stay
    one victim unit, as before."""
    nodes = [node(f"n{i}", "s1", "b1") for i in (1, 2)]
    workers = [_replica(f"mpi-{i}", "mpi", "MPIJob", f"n{i}") for i in (1, 2)]
    gang = [pod("p-1", "hello-job", gpus=8, priority=100)]
    result, _ = run(nodes, [*workers, *gang], [pod_group("hello-job", 1)])
    assert {d.pod.name for d in _of(result, Disrupt)} == {"mpi-1", "mpi-2"}


def test_rule_replicas_are_costed_per_job() -> None:
    """Two replicas of one ReplicaSet cost one job: the block holding them is cheaper than the
    (earlier) block holding one pod each of two jobs of the same priority."""
    nodes = [node("n1", "s1", "b1"), node("n2", "s1", "b1")]
    nodes += [node("n3", "s2", "b3"), node("n4", "s2", "b3")]
    two_jobs = [_replica("a-1", "a", "ReplicaSet", "n1"), _replica("b-2", "b", "ReplicaSet", "n2")]
    one_job = [_replica(f"web-{i}", "web", "ReplicaSet", f"n{i}") for i in (3, 4)]
    gang = [pod(f"p-{i}", "hello-job", gpus=8, priority=100) for i in (1, 2)]
    groups = [pod_group("hello-job", 2, gather=BLOCK_MUST)]
    result, _ = run(nodes, [*two_jobs, *one_job, *gang], groups, topology=TOPOLOGY)
    assert {d.pod.name for d in _of(result, Disrupt)} == {"web-3", "web-4"}


def test_rule_a_protected_replica_protects_only_itself() -> None:
    """Upstream reads the opt-out per pod: a protected replica keeps its node, its siblings
    stay victims (only a gang is protected whole by one member)."""
    nodes = [node(f"n{i}", "s1", "b1") for i in (1, 2, 3)]
    replicas = [_replica(f"web-{i}", "web", "ReplicaSet", f"n{i}") for i in (1, 2)]
    other = _replica("api-3", "api", "ReplicaSet", "n3")
    _protect(replicas[0], DISABLE_PREEMPTIBLE_LABEL, "true")
    gang = [pod(f"p-{i}", "hello-job", gpus=8, priority=100) for i in (1, 2)]
    result, _ = run(nodes, [*replicas, other, *gang], [pod_group("hello-job", 2)])
    assert {d.pod.name for d in _of(result, Disrupt)} == {"web-2", "api-3"}


def test_rule_only_a_preemption_by_scheduler_disruption_target_marks_a_victim() -> None:
    """A DisruptionTarget of another reason (here the taint manager's) is no mark of this
    gang's preemption, whatever its message says: the terminating pods do not hold the gang
    back, and it preempts the other jobs."""
    nodes, others = _four_nodes_with_others()
    gang = [pod(f"p-{i}", "hello-job", gpus=8, priority=100) for i in (1, 2)]
    evicted_by_others = _marked_victims(deleting=True)
    for victim in evicted_by_others:
        victim["status"]["conditions"][0]["reason"] = "DeletionByTaintManager"
    result, _ = run(nodes, [*evicted_by_others, *others, *gang], [pod_group("hello-job", 2)])
    assert {d.pod.name for d in _of(result, Disrupt)} == {"o-3", "o-4"}
    assert sorted(n.node for n in _of(result, Nominate)) == ["n3", "n4"]


def test_rule_a_victim_of_another_gangs_preemption_does_not_hold_this_gang_back() -> None:
    nodes, others = _four_nodes_with_others()
    gang = [pod(f"p-{i}", "hello-job", gpus=8, priority=100) for i in (1, 2)]
    theirs = _marked_victims(deleting=True)
    for victim in theirs:
        victim["status"]["conditions"][0]["message"] = preemption_message(
            "koord-scheduler", "default/other-job", "default/q-1"
        )
    result, _ = run(nodes, [*theirs, *others, *gang], [pod_group("hello-job", 2)])
    assert {d.pod.name for d in _of(result, Disrupt)} == {"o-3", "o-4"}


def test_rule_a_marked_victim_that_has_finished_is_neither_waited_for_nor_deleted_again() -> None:
    nodes, others = _four_nodes_with_others()
    gang = [pod(f"p-{i}", "hello-job", gpus=8, priority=100) for i in (1, 2)]
    finished = _marked_victims(deleting=False)
    for victim in finished:
        victim["status"]["phase"] = "Failed"
    result, _ = run(nodes, [*finished, *others, *gang], [pod_group("hello-job", 2)])
    expect_no_actions(result.actions, Disrupt, while_it_has=Nominate)
    assert sorted(n.node for n in _of(result, Nominate)) == ["n1", "n2"]
    # Read alone, as the pass reads every pod of the cluster: no cause to wait or resend.
    assert eligibility(gang, 100, finished, "default/hello-job") is None


def test_rule_eligibility_without_a_preemptor_reads_no_mark() -> None:
    gang = [pod(f"p-{i}", "hello-job", gpus=8, priority=100) for i in (1, 2)]
    marked = _marked_victims(deleting=False)
    assert eligibility(gang, 100, marked) is None
    assert eligibility(gang, 100, marked, "default/hello-job") is not None


def test_rule_waiting_for_terminating_victims_names_the_first_of_them() -> None:
    nodes, others = _four_nodes_with_others()
    gang = [pod(f"p-{i}", "hello-job", gpus=8, priority=100) for i in (1, 2)]
    marked = _marked_victims(deleting=True)
    result, _ = run(nodes, [*marked, *others, *gang], [pod_group("hello-job", 2)])
    decision = next(d for d in _of(result, Decision) if d.kind == "unschedulable")
    assert "victim default/v-1 of this gang's preemption is still terminating on n1" in (
        decision.message
    )
    in_flight = frozenset({("default", "v-1"), ("default", "v-2")})
    held = eligibility(gang, 100, _marked_victims(deleting=False), "default/hello-job", in_flight)
    assert held is not None
    assert held.message == (
        "victim default/v-1 of this gang's preemption is still terminating on n1 "
        "(its delete is on its way)"
    )


def test_rule_waiting_on_a_nominated_node_names_the_first_terminating_victim() -> None:
    terminating = [pod(f"v-{i}", None, gpus=8, node_name=f"n{i}", deleting=True) for i in (1, 2)]
    gang = [pod(f"p-{i}", "hello-job", gpus=8, priority=100, nominated=f"n{i}") for i in (1, 2)]
    nodes = [*_two_nodes(), node("n3", "s1", "b1")]
    result, _ = run(nodes, [*terminating, *gang], [pod_group("hello-job", 2)])
    decision = next(d for d in _of(result, Decision) if d.kind == "unschedulable")
    assert "victim default/v-1 is still terminating on nominated node n1" in decision.message


def test_rule_only_a_terminating_lower_priority_pod_on_a_nominated_node_holds_preemption() -> None:
    """A running lower-priority pod on a nominated node, or a terminating one of the gang's
    priority, is no earlier preemption still taking effect: the gang preempts."""
    nodes = [node(f"n{i}", "s1", "b1") for i in (1, 2, 3, 4)]
    gang = [pod(f"p-{i}", "hello-job", gpus=8, priority=100, nominated=f"n{i}") for i in (1, 2)]
    running = [pod(f"v-{i}", None, gpus=8, node_name=f"n{i}", owner="low") for i in (1, 2)]
    result, _ = run(nodes[:2], [*running, *gang], [pod_group("hello-job", 2)])
    assert {d.pod.name for d in _of(result, Disrupt)} == {"v-1", "v-2"}
    equal = [
        pod(f"e-{i}", None, gpus=8, node_name=f"n{i}", deleting=True, priority=100) for i in (1, 2)
    ]
    low = [pod(f"o-{i}", None, gpus=8, node_name=f"n{i}", owner=f"o-{i}") for i in (3, 4)]
    result, _ = run(nodes, [*equal, *low, *gang], [pod_group("hello-job", 2)])
    assert {d.pod.name for d in _of(result, Disrupt)} == {"o-3", "o-4"}


def _marked(count: int) -> list[dict[str, Any]]:
    """`count` victims of hello-job's preemption whose delete did not land."""
    message = preemption_message("koord-scheduler", "default/hello-job", "default/p-1")
    marked = []
    for i in range(1, count + 1):
        victim = pod(f"v-{i}", None, gpus=8, node_name=f"n{i}")
        victim["status"]["conditions"] = [
            {
                "type": "DisruptionTarget",
                "status": "True",
                "reason": "PreemptionByScheduler",
                "message": message,
            }
        ]
        marked.append(victim)
    return marked


def test_rule_a_resent_delete_names_up_to_three_victims_and_counts_the_rest() -> None:
    gang = [pod(f"p-{i}", "hello-job", gpus=8, priority=100) for i in (1, 2)]
    expected = {
        3: "the delete of default/v-1, default/v-2, default/v-3 did not land",
        4: "the delete of default/v-1, default/v-2, default/v-3 and 1 more did not land",
        6: "the delete of default/v-1, default/v-2, default/v-3 and 3 more did not land",
    }
    for count, wording in expected.items():
        found = eligibility(gang, 100, _marked(count), "default/hello-job")
        assert found is not None
        assert wording in found.message
        resent = [p["metadata"]["name"] for p in found.resend]
        assert resent == [f"v-{i}" for i in range(1, count + 1)]


def test_rule_the_controller_kind_is_read_from_the_first_named_owner_reference() -> None:
    """As the job (owner_name) is: a malformed or nameless owner reference before the
    ReplicaSet does not hide it, so each replica is still a victim unit of its own."""
    replicas = []
    for i in (1, 2):
        made = pod(f"r-{i}", None, gpus=8, node_name=f"n{i}", phase="Running")
        made["metadata"]["ownerReferences"] = [
            "not-a-reference",
            {"kind": "Job", "uid": "uid-nameless"},
            {"kind": "ReplicaSet", "name": "rs", "uid": "uid-rs", "controller": True},
        ]
        replicas.append(ChargedPod(made, f"n{i}", pod_request_milli(made), False))
    units = victim_units(replicas, 100, {"n1", "n2"})
    assert [(u.key, u.job) for u in units] == [
        ("pod default/r-1", "job default/rs"),
        ("pod default/r-2", "job default/rs"),
    ]
