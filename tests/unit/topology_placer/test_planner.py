"""Rules of the placement pass: gang all-or-nothing, nominate-then-bind, reservations,
fit, Strict/NonStrict, timeouts, messages, PodGroup and topology status."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.plan_checks import expect_actions, expect_no_actions
from tests.unit.topology_placer.builders import (
    BLOCK,
    TOPOLOGY,
    node,
    pod,
    pod_group,
    reference_nodes,
)
from tests.unit.topology_placer.simulate import apply, run, state
from topology_placer import fit, planner
from topology_placer.gang import GROUPS, MODE, NETWORK_TOPOLOGY_SELECTOR
from topology_placer.planner import (
    Bind,
    Decision,
    Disrupt,
    MarkUnschedulable,
    Nominate,
    Notice,
    Plan,
    UpdateGroupStatus,
    UpdateTopologyStatus,
    plan,
)

BLOCK_MUST = [{"layer": "BlockLayer", "strategy": "MustGather"}]
BLOCK_PREFER = [{"layer": "BlockLayer", "strategy": "PreferGather"}]


def _of(result: Plan, kind: type[Any]) -> list[Any]:
    return [a for a in result.actions if isinstance(a, kind)]


def _nodes_of(pods: list[dict[str, Any]], group: str = "gang") -> dict[str, str]:
    return {
        p["metadata"]["name"]: p["status"].get("nominatedNodeName") or p["spec"].get("nodeName", "")
        for p in pods
        if p["metadata"]["labels"].get("pod-group.scheduling.sigs.k8s.io") == group
    }


def _block(name: str, nodes: list[dict[str, Any]]) -> str:
    labels = next(n["metadata"]["labels"] for n in nodes if n["metadata"]["name"] == name)
    return str(labels[BLOCK])


def test_reference_example_four_pod_gang_lands_on_one_block() -> None:
    nodes = reference_nodes()
    # s1's nodes each already run a 4-GPU pod: they offer one slot each, s2's nodes two.
    busy = [pod(f"busy{i}", None, gpus=4, node_name=f"node{i}", scheduler="x") for i in range(1, 5)]
    gang = [pod(f"worker-{i}", gpus=4) for i in range(4)]
    _, after = run(
        nodes, busy + gang, [pod_group("gang", 4, gather=BLOCK_PREFER)], topology=TOPOLOGY
    )
    placed = _nodes_of(after)
    assert len({_block(n, nodes) for n in placed.values()}) == 1
    assert set(placed.values()) <= {"node5", "node6", "node7", "node8"}


def test_rule_pods_sharing_the_network_topology_selector_draw_the_gang_to_their_domain() -> None:
    # Koordinator's existingPodNum: bound pods carrying the gang's network-topology-selector
    # value count as the job's, so among equally fitting blocks the one holding them wins.
    def placed_block(peer_selector: str) -> str:
        nodes = reference_nodes()
        peer = pod("launcher", None, gpus=0, cpu="100m", node_name="node7", scheduler="x")
        peer["metadata"]["annotations"][NETWORK_TOPOLOGY_SELECTOR] = peer_selector
        gang = [pod(f"worker-{i}") for i in range(2)]
        for member in gang:
            member["metadata"]["annotations"][NETWORK_TOPOLOGY_SELECTOR] = "job-x"
        _, after = run(
            nodes, [peer, *gang], [pod_group("gang", 2, gather=BLOCK_MUST)], topology=TOPOLOGY
        )
        blocks = {_block(n, nodes) for n in _nodes_of(after).values()}
        assert len(blocks) == 1, blocks
        return blocks.pop()

    assert placed_block("job-x") == "b4"
    # Every block offers two slots: without a peer of the same job the first by path wins.
    assert placed_block("another-job") == "b1"


def test_nominate_first_then_bind_on_the_next_pass() -> None:
    nodes = reference_nodes()
    gang = [pod(f"w-{i}", gpus=8) for i in range(2)]
    groups = [pod_group("gang", 2, gather=BLOCK_MUST)]
    first, after = run(nodes, gang, groups, topology=TOPOLOGY)
    assert len(_of(first, Nominate)) == 2
    assert not _of(first, Bind)
    second, bound = run(nodes, after, groups, topology=TOPOLOGY)
    binds = _of(second, Bind)
    assert {b.node for b in binds} == set(_nodes_of(after).values())
    assert not _of(second, Nominate)
    assert all(p["spec"].get("nodeName") for p in bound)


def test_gang_waits_for_min_member_and_says_how_many_it_has() -> None:
    result, _after = run(reference_nodes(), [pod("w-0")], [pod_group("gang", 3)], topology=TOPOLOGY)
    assert not _of(result, Nominate)
    marks = _of(result, MarkUnschedulable)
    assert marks[0].message == (
        "waiting for members: PodGroup default/gang has 1 of minMember 3 pods (once-satisfied)"
    )
    assert result.gang_states["default/gang"] == "waiting"


def test_gang_group_is_all_or_nothing_across_its_pod_groups() -> None:
    nodes = reference_nodes()
    annotations = {GROUPS: '["default/master", "default/worker"]'}
    groups = [
        pod_group("master", 1, annotations=annotations, gather=BLOCK_MUST),
        pod_group("worker", 4, annotations=annotations, gather=BLOCK_MUST),
    ]
    master = [pod("master-0", "master", gpus=8)]
    workers = [pod(f"worker-{i}", "worker", gpus=8) for i in range(4)]
    # A block holds 2 eight-GPU pods: the 5 pods of the GangGroup fit in none.
    result, _ = run(nodes, master + workers, groups, topology=TOPOLOGY)
    assert not _of(result, Nominate)
    assert not _of(result, Bind)
    message = _of(result, MarkUnschedulable)[0].message
    assert (
        message == "MustGather BlockLayer: no BlockLayer domain offers 5 slots; best s1/b1 offers 2"
    )
    # Without the MustGather, the same group is placed whole in one decision.
    loose = [
        pod_group("master", 1, annotations=annotations),
        pod_group("worker", 4, annotations=annotations),
    ]
    placed, _after = run(nodes, master + workers, loose, topology=TOPOLOGY)
    assert len(_of(placed, Nominate)) == 5
    decisions = [d for d in _of(placed, Decision) if d.kind == "nominated"]
    assert len(decisions) == 1
    assert decisions[0].gang_group[0].name == "master"


def test_nominations_are_reservations_so_a_restart_never_double_books() -> None:
    nodes = reference_nodes()
    groups = [pod_group("a", 2), pod_group("b", 2)]
    a = [pod(f"a-{i}", "a", gpus=8, nominated=f"node{i + 1}") for i in range(2)]
    b = [pod(f"b-{i}", "b", gpus=8) for i in range(2)]
    # A fresh placer (no memory) sees a's nominations in the pods and keeps off those nodes.
    _, after = run(nodes, a + b, groups, topology=TOPOLOGY)
    b_nodes = set(_nodes_of(after, "b").values())
    assert b_nodes.isdisjoint({"node1", "node2"})
    assert len(b_nodes) == 2 and "" not in b_nodes  # b is placed, elsewhere


def test_bound_pods_and_other_schedulers_pods_are_charged_to_their_nodes() -> None:
    nodes = [node("n1", "s1", "b1"), node("n2", "s1", "b1")]
    other = pod("other", None, gpus=8, node_name="n1", scheduler="default-scheduler")
    gang = [pod("w-0", gpus=8)]
    _, after = run(nodes, [other, *gang], [pod_group("gang", 1)], topology=TOPOLOGY)
    assert _nodes_of(after) == {"w-0": "n2"}


def test_pods_of_other_schedulers_are_left_alone() -> None:
    stranger = pod("s-0", "gang", scheduler="default-scheduler")
    result, _ = run(reference_nodes(), [stranger], [pod_group("gang", 1)], topology=TOPOLOGY)
    assert not _of(result, Nominate)
    assert not _of(result, MarkUnschedulable)
    # The same pod naming this placer is placed.
    ours = pod("s-0", "gang")
    result, _ = run(reference_nodes(), [ours], [pod_group("gang", 1)], topology=TOPOLOGY)
    expect_actions(result.actions, Nominate, count=1, pod__name="s-0")


ZONE_A_OR_C = {
    "nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [
                {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a", "c"]}]}
            ]
        }
    }
}
GPU_TAINT = {"key": "gpu", "effect": "NoSchedule"}
GPU_TOLERATION = {"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}

# Each exclusion alone: the one node fails only that filter, and the pod asks nothing else
# (no affinity) unless the filter is the affinity itself. The sibling is the same node and
# pod with that one thing changed, which the pod must then be placed on.
EXCLUSIONS: dict[str, tuple[dict[str, Any], dict[str, Any], dict[str, Any], dict[str, Any]]] = {
    # reason: (node kwargs, pod kwargs, sibling node kwargs, sibling pod kwargs)
    "cordoned": ({"unschedulable": True}, {}, {}, {}),
    "not-ready": ({"ready": False}, {}, {}, {}),
    "untolerated-taint": (
        {"taints": [GPU_TAINT]},
        {},
        {"taints": [GPU_TAINT]},
        {"tolerations": [GPU_TOLERATION]},
    ),
    "required-affinity": (
        {"labels": {"zone": "b"}},
        {"affinity": ZONE_A_OR_C},
        {"labels": {"zone": "c"}},
        {"affinity": ZONE_A_OR_C},
    ),
}


def _place_one(node_kwargs: dict[str, Any], pod_kwargs: dict[str, Any]) -> Plan:
    nodes = [node("only", "s1", "b1", **node_kwargs)]
    result, _ = run(
        nodes, [pod("w-0", gpus=8, **pod_kwargs)], [pod_group("gang", 1)], topology=TOPOLOGY
    )
    return result


@pytest.mark.parametrize("reason", sorted(EXCLUSIONS))
def test_rule_a_node_is_excluded_by_each_filter_alone(reason: str) -> None:
    node_kwargs, pod_kwargs, sibling_node, sibling_pod = EXCLUSIONS[reason]
    excluded = _place_one(node_kwargs, pod_kwargs)
    expect_no_actions(excluded.actions, Nominate, while_it_has=MarkUnschedulable)
    expect_no_actions(excluded.actions, Bind, while_it_has=MarkUnschedulable)
    expect_actions(excluded.actions, MarkUnschedulable, count=1, pod__name="w-0")
    placed = _place_one(sibling_node, sibling_pod)
    expect_actions(placed.actions, Nominate, count=1, pod__name="w-0", node="only")


def test_rule_the_placer_never_uses_a_node_whose_taint_the_pod_does_not_tolerate() -> None:
    """A pod with no node selector nor affinity, beside an emptier tainted node: only the
    untainted (fuller) one is used, whatever the binpack would prefer."""
    nodes = [
        node("tainted", "s1", "b1", taints=[GPU_TAINT]),
        node("busy", "s1", "b1"),
        node("free", "s2", "b2", taints=[{"key": "gpu", "effect": "NoExecute"}]),
    ]
    half = pod("half", None, gpus=4, node_name="busy", scheduler="x")
    gang = [pod("w-0", gpus=4)]
    result, after = run(nodes, [half, *gang], [pod_group("gang", 1)], topology=TOPOLOGY)
    expect_actions(result.actions, Nominate, count=1, pod__name="w-0", node="busy")
    assert _nodes_of(after) == {"w-0": "busy"}
    # Tolerated (Exists without a key tolerates every taint), the tainted nodes are usable.
    tolerant = [pod("w-0", gpus=8, tolerations=[{"operator": "Exists"}])]
    result, after = run(nodes, [half, *tolerant], [pod_group("gang", 1)], topology=TOPOLOGY)
    assert _nodes_of(after)["w-0"] in {"tainted", "free"}


def test_gpus_fit_counts_requests_of_bound_and_nominated_pods() -> None:
    nodes = [node("n1", "s1", "b1", gpus=8)]
    bound = pod("x", None, gpus=4, node_name="n1", scheduler="x")
    nominated = pod("y", "other", gpus=2, nominated="n1")
    gang = [pod("w-0", gpus=4)]
    groups = [pod_group("gang", 1), pod_group("other", 1)]
    result, after = run(nodes, [bound, nominated, *gang], groups, topology=TOPOLOGY)
    assert _nodes_of(after)["w-0"] == ""
    assert any("offers 0" in m.message for m in _of(result, MarkUnschedulable))


def test_ranks_are_kept_pod_2_lands_before_pod_10() -> None:
    nodes = reference_nodes()
    gang = [pod(f"pod-{i}", gpus=4) for i in (10, 2, 1, 0)]
    _, after = run(nodes, gang, [pod_group("gang", 4, gather=BLOCK_MUST)], topology=TOPOLOGY)
    placed = _nodes_of(after)
    assert placed["pod-0"] == placed["pod-1"]
    assert placed["pod-2"] == placed["pod-10"]
    assert placed["pod-0"] != placed["pod-2"]


def test_network_topology_index_orders_ranks() -> None:
    nodes = reference_nodes()
    gang = [pod(f"p-{c}", gpus=4, index=i) for i, c in enumerate("dcba")]
    _, after = run(nodes, gang, [pod_group("gang", 4, gather=BLOCK_MUST)], topology=TOPOLOGY)
    placed = _nodes_of(after)
    assert "" not in placed.values()  # all four are placed: two per 8-GPU node
    assert placed["p-d"] == placed["p-c"]
    assert placed["p-b"] == placed["p-a"]
    assert placed["p-d"] != placed["p-b"]


def test_failed_bind_replans_the_rest_inside_the_same_domain() -> None:
    nodes = [
        node("n1", "s1", "b1"),
        node("n2", "s1", "b1"),
        node("n3", "s2", "b3"),
        node("n4", "s2", "b3"),
    ]
    groups = [pod_group("gang", 3, gather=BLOCK_PREFER)]
    bound = [pod("w-0", gpus=8, node_name="n1", phase="Running")]
    # w-1 was nominated to a node that has since gone (its bind failed with not-found).
    lost = [pod("w-1", gpus=4, nominated="gone"), pod("w-2", gpus=4, nominated="gone")]
    result, after = run(nodes, bound + lost, groups, topology=TOPOLOGY)
    assert _nodes_of(after) == {"w-0": "n1", "w-1": "n2", "w-2": "n2"}
    assert not _of(result, Disrupt)


def test_strict_gang_that_cannot_complete_is_sent_back_whole() -> None:
    nodes = [node("n1", "s1", "b1"), node("n2", "s2", "b3")]
    # Its status (Scheduling, as the placer wrote it) proves it never had minMember bound.
    groups = [pod_group("gang", 3, gather=BLOCK_MUST, timeout=30, status={"phase": "Scheduling"})]
    pods = [
        pod("w-0", gpus=8, node_name="n1", phase="Running"),
        pod("w-1", gpus=8, nominated="n2"),
        pod("w-2", gpus=8, nominated="n2"),
    ]
    for p in pods:
        p["metadata"]["creationTimestamp"] = "2026-01-01T00:00:00Z"
    created = 1_767_225_600.0
    # Within its waiting time the Strict gang gives its reservations back and keeps w-0 ...
    result, _ = run(nodes, pods, groups, topology=TOPOLOGY, now=created + 10)
    assert not _of(result, Disrupt)
    assert {(a.pod.name, a.node) for a in _of(result, Nominate)} == {("w-1", ""), ("w-2", "")}
    # ... and once the wait is over, the part that is bound goes too (GangIncomplete).
    result, _ = run(nodes, pods, groups, topology=TOPOLOGY, now=created + 31)
    assert {(a.pod.name, a.reason) for a in _of(result, Disrupt)} == {("w-0", "GangIncomplete")}
    assert {(a.pod.name, a.node) for a in _of(result, Nominate)} == {("w-1", ""), ("w-2", "")}
    assert any(d.kind == "gang-evicted" for d in _of(result, Decision))


def test_non_strict_gang_keeps_its_bound_members_and_nominations() -> None:
    nodes = [node("n1", "s1", "b1"), node("n2", "s2", "b3")]
    groups = [pod_group("gang", 3, gather=BLOCK_MUST, annotations={MODE: "NonStrict"})]
    pods = [
        pod("w-0", gpus=8, node_name="n1", phase="Running"),
        pod("w-1", gpus=8, nominated="n2"),
        pod("w-2", gpus=8, nominated="n2"),
    ]
    result, _ = run(nodes, pods, groups, topology=TOPOLOGY)
    # The gang cannot gather in one block, and says so, but keeps what it holds.
    expect_no_actions(result.actions, Disrupt, while_it_has=MarkUnschedulable)
    expect_no_actions(result.actions, Nominate, while_it_has=MarkUnschedulable)
    # A Strict gang in the same state gives its reservations back.
    strict = [pod_group("gang", 3, gather=BLOCK_MUST, annotations={MODE: "Strict"})]
    result, _ = run(nodes, pods, strict, topology=TOPOLOGY)
    cleared = expect_actions(result.actions, Nominate, count=2, node="")
    assert {c.pod.name for c in cleared} == {"w-1", "w-2"}


def test_unschedulable_is_reported_once_with_an_event_and_a_decision() -> None:
    nodes = [node("n1", "s1", "b1", gpus=4)]
    groups = [pod_group("gang", 2)]
    pods = [pod("w-0", gpus=8), pod("w-1", gpus=8)]
    result = plan(state(nodes, pods, groups, topology=TOPOLOGY))
    message = "no topology domain offers 2 slots; the cluster offers 0"
    assert {m.message for m in _of(result, MarkUnschedulable)} == {message}
    notices = _of(result, Notice)
    assert notices[0].reason == "FailedScheduling" and notices[0].warning
    assert [d.kind for d in _of(result, Decision)] == ["unschedulable"]
    # The same verdict on the next pass changes nothing.
    for p in pods:
        p["status"]["conditions"] = [
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": message,
            }
        ]
    again = plan(state(nodes, pods, groups, topology=TOPOLOGY))
    assert not _of(again, MarkUnschedulable)
    assert not _of(again, Notice)


def test_gang_past_its_waiting_time_times_out_and_restarts_its_cycle() -> None:
    groups = [pod_group("gang", 3, timeout=30)]
    pods = [pod("w-0"), pod("w-1")]
    for p in pods:
        p["metadata"]["creationTimestamp"] = "2026-01-01T00:00:00Z"
    created = 1_767_225_600.0
    early = plan(state(reference_nodes(), pods, groups, now=created + 10))
    assert _of(early, MarkUnschedulable)[0].reason == "Unschedulable"
    late = plan(state(reference_nodes(), pods, groups, now=created + 31))
    marks = _of(late, MarkUnschedulable)
    assert marks[0].reason == "GangTimeout"
    assert marks[0].message.startswith(
        "gang default/gang waited more than 30s: waiting for members"
    )
    assert any(d.kind == "timed-out" for d in _of(late, Decision))
    # The new cycle starts now, recorded in the PodGroup's scheduleStartTime.
    (restart,) = _of(late, UpdateGroupStatus)
    assert restart.status["scheduleStartTime"] == "2026-01-01T00:00:31Z"
    groups[0]["status"] = restart.status
    for p in pods:
        p["status"]["conditions"] = [
            {"type": "PodScheduled", "status": "False", "reason": "GangTimeout", "message": "x"}
        ]
    # Within the new cycle the gang is back to waiting, and stays so (no flapping) ...
    for now in (created + 40, created + 60):
        again = plan(state(reference_nodes(), pods, groups, now=now))
        assert _of(again, MarkUnschedulable)[0].reason == "Unschedulable"
        assert not _of(again, UpdateGroupStatus)
    # ... until the new cycle runs out too.
    final = plan(state(reference_nodes(), pods, groups, now=created + 62))
    assert _of(final, MarkUnschedulable)[0].reason == "GangTimeout"


def test_invalid_pod_group_is_reported_with_the_bad_key() -> None:
    groups = [pod_group("gang", 1, annotations={MODE: "Sometimes"})]
    result, _ = run(reference_nodes(), [pod("w-0")], groups)
    assert (
        "gang.scheduling.koordinator.sh/mode: 'Sometimes'"
        in _of(result, MarkUnschedulable)[0].message
    )
    assert result.gang_states["default/gang"] == "invalid"


def test_pod_group_status_follows_its_pods() -> None:
    groups = [pod_group("gang", 2)]
    pods = [pod("w-0", owner="job"), pod("w-1", owner="job")]
    first = plan(state(reference_nodes(), pods, groups))
    status = _of(first, UpdateGroupStatus)[0].status
    assert status["phase"] == "PreScheduling"
    assert status["occupiedBy"] == "default/job"
    running = [pod(f"w-{i}", node_name="node1", phase="Running") for i in range(2)]
    later = plan(state(reference_nodes(), running, groups))
    assert _of(later, UpdateGroupStatus)[0].status["phase"] == "Running"


def test_topology_detail_status_is_kept_true() -> None:
    result = plan(state(reference_nodes(), [], topology=TOPOLOGY))
    update = _of(result, UpdateTopologyStatus)[0]
    assert update.name == "default"
    assert update.detail_status[0]["nodeNum"] == 8
    settled = dict(TOPOLOGY, status={"detailStatus": update.detail_status})
    assert not _of(plan(state(reference_nodes(), [], topology=settled)), UpdateTopologyStatus)


def test_apply_helper_binds_what_was_nominated() -> None:
    # The simulation used by these tests applies a Bind as the API server's binding does.
    nodes = [node("n1", "s1", "b1")]
    pods = [pod("w-0", gpus=8, nominated="n1")]
    result = plan(state(nodes, pods, [pod_group("gang", 1)]))
    assert apply(pods, result)[0]["spec"]["nodeName"] == "n1"


@settings(max_examples=60, deadline=None)
@given(
    load=st.lists(st.tuples(st.integers(1, 8), st.sampled_from([1, 2, 4])), max_size=12),
    gangs=st.lists(
        st.tuples(st.integers(1, 5), st.sampled_from([1, 2, 4, 8])), min_size=1, max_size=4
    ),
    must=st.booleans(),
)
def test_property_placement_never_exceeds_allocatable_and_gangs_are_whole(
    load: list[tuple[int, int]], gangs: list[tuple[int, int]], must: bool
) -> None:
    nodes = reference_nodes()
    used: dict[str, int] = {}
    pods: list[dict[str, Any]] = []
    for k, (number, gpus) in enumerate(load):
        name = f"node{number}"
        if used.get(name, 0) + gpus <= 8:
            used[name] = used.get(name, 0) + gpus
            pods.append(pod(f"busy{k}", None, gpus=gpus, node_name=name, scheduler="x"))
    groups = []
    for g, (size, gpus) in enumerate(gangs):
        groups.append(pod_group(f"g{g}", size, gather=BLOCK_MUST if must else None))
        pods.extend(pod(f"g{g}-{i}", f"g{g}", gpus=gpus) for i in range(size))
    after = pods
    for _ in range(2):  # nominate, then bind
        after = apply(after, plan(state(nodes, after, groups, topology=TOPOLOGY)))
    per_node: dict[str, int] = {}
    for p in after:
        where = p["spec"].get("nodeName") or p["status"].get("nominatedNodeName")
        if where:
            gpus = int(p["spec"]["containers"][0]["resources"]["requests"]["nvidia.com/gpu"])
            per_node[where] = per_node.get(where, 0) + gpus
    assert all(total <= 8 for total in per_node.values())
    for g, (size, _) in enumerate(gangs):
        members = [p for p in after if p["metadata"]["name"].startswith(f"g{g}-")]
        placed = [p for p in members if p["spec"].get("nodeName")]
        assert len(placed) in (0, size)
        if placed and must:
            assert len({_block(p["spec"]["nodeName"], nodes) for p in placed}) == 1
    # ... and a gang goes whole onto a node that has room for all of it: the first gang
    # (placed first: same age, lowest name) is placed whenever one node can take it, so a
    # planner that places nothing fails here.
    size, gpus = gangs[0]
    if any(8 - used.get(f"node{i}", 0) >= size * gpus for i in range(1, 9)):
        first = [p for p in after if p["metadata"]["name"].startswith("g0-")]
        assert all(p["spec"].get("nodeName") for p in first)


def test_recreated_member_of_a_satisfied_must_gather_gang_stays_in_its_domain() -> None:
    # n3 (another block) is the tighter fit, so only the confinement keeps w-2 in b1.
    nodes = [node("n1", "s1", "b1"), node("n2", "s1", "b1"), node("n3", "s2", "b3", gpus=4)]
    groups = [pod_group("gang", 2, gather=BLOCK_MUST, status={"phase": "Running"})]
    pods = [
        pod("w-0", gpus=8, node_name="n1", phase="Running"),
        pod("w-1", gpus=0, node_name="n2", phase="Running"),
        # w-2 replaces a member that died.
        pod("w-2", gpus=4),
    ]
    _, after = run(nodes, pods, groups, topology=TOPOLOGY)
    assert _nodes_of(after)["w-2"] == "n2"


def test_recreated_member_of_a_satisfied_gang_without_must_gather_may_go_anywhere() -> None:
    nodes = [node("n1", "s1", "b1"), node("n3", "s2", "b3")]
    groups = [pod_group("gang", 1, status={"phase": "Running"})]
    pods = [pod("w-0", gpus=8, node_name="n1", phase="Running"), pod("w-1", gpus=8)]
    _, after = run(nodes, pods, groups, topology=TOPOLOGY)
    assert _nodes_of(after)["w-1"] == "n3"


def test_when_not_all_members_fit_just_min_member_is_placed_then_bound() -> None:
    nodes = [node("n1", "s1", "b1"), node("n2", "s1", "b1")]
    groups = [pod_group("gang", 2)]
    pods = [pod(f"w-{i}", gpus=8) for i in range(3)]
    first, after = run(nodes, pods, groups, topology=TOPOLOGY)
    assert {n.pod.name for n in _of(first, Nominate)} == {"w-0", "w-1"}
    second, bound = run(nodes, after, groups, topology=TOPOLOGY)
    assert {b.pod.name for b in _of(second, Bind)} == {"w-0", "w-1"}
    assert _nodes_of(bound)["w-2"] == ""


def _annotated(name: str, gang: str, min_available: str | None) -> dict[str, Any]:
    made = pod(name, None, gpus=8)
    made["metadata"]["annotations"]["gang.scheduling.koordinator.sh/name"] = gang
    if min_available is not None:
        made["metadata"]["annotations"]["gang.scheduling.koordinator.sh/min-available"] = (
            min_available
        )
    return made


def test_a_gang_declared_by_pod_annotations_alone_is_placed_whole() -> None:
    nodes = reference_nodes()
    one = [_annotated("a-0", "ann", "2")]
    waiting, _ = run(nodes, one, topology=TOPOLOGY)
    assert not _of(waiting, Nominate)
    assert "has 1 of minMember 2" in _of(waiting, MarkUnschedulable)[0].message
    both = [*one, _annotated("a-1", "ann", "2")]
    placed, _ = run(nodes, both, topology=TOPOLOGY)
    assert {n.pod.name for n in _of(placed, Nominate)} == {"a-0", "a-1"}
    assert not _of(placed, UpdateGroupStatus)


def test_an_annotation_gang_without_min_available_is_invalid() -> None:
    result, _ = run(reference_nodes(), [_annotated("a-0", "ann", None)], topology=TOPOLOGY)
    assert (
        "gang.scheduling.koordinator.sh/min-available) is required"
        in _of(result, MarkUnschedulable)[0].message
    )


def test_match_policy_decides_which_members_count_toward_min_member() -> None:
    nodes = reference_nodes()
    pods = [pod("w-0", gpus=8, node_name="node1", phase="Running"), pod("w-1", gpus=8)]
    counted = {}
    for policy in ("only-waiting", "waiting-and-running"):
        groups = [
            pod_group(
                "gang", 2, annotations={"gang.scheduling.koordinator.sh/match-policy": policy}
            )
        ]
        result, _ = run(nodes, pods, groups, topology=TOPOLOGY)
        counted[policy] = result.gang_states["default/gang"]
    assert counted == {"only-waiting": "waiting", "waiting-and-running": "nominated"}


def _status_after(result: Plan, group: dict[str, Any]) -> dict[str, Any]:
    """The PodGroup's status once the pass's update is written (unchanged when none is)."""
    updates = [
        u for u in _of(result, UpdateGroupStatus) if u.group.name == group["metadata"]["name"]
    ]
    if updates:
        group["status"] = updates[-1].status
    return dict(group["status"])


def test_pod_group_phase_goes_scheduling_then_scheduled_with_its_schedule_start_time() -> None:
    group = pod_group("gang", 2)
    start = 1_767_225_600.0 + 60
    pods = [pod(f"w-{i}", owner="job") for i in range(2)]
    # Pass 1: nothing nominated yet (the pass computes status from the pods it was given).
    first, pods = run(reference_nodes(), pods, [group], now=start)
    assert _status_after(first, group)["phase"] == "PreScheduling"
    assert "scheduleStartTime" not in group["status"]
    assert all(p["status"].get("nominatedNodeName") for p in pods)
    # Pass 2: members are nominated, none bound: Scheduling, and its wait starts now.
    second, pods = run(reference_nodes(), pods, [group], now=start + 5)
    status = _status_after(second, group)
    assert status["phase"] == "Scheduling"
    assert status["scheduled"] == 0
    assert status["scheduleStartTime"] == "2026-01-01T00:01:05Z"
    assert all(p["spec"].get("nodeName") for p in pods)
    # Pass 3: minMember bound, not yet running: Scheduled; scheduleStartTime is kept.
    third, pods = run(reference_nodes(), pods, [group], now=start + 9)
    status = _status_after(third, group)
    assert status["phase"] == "Scheduled"
    assert status["scheduled"] == 2
    assert status["scheduleStartTime"] == "2026-01-01T00:01:05Z"


def test_pod_group_is_scheduling_while_fewer_than_min_member_are_bound() -> None:
    group = pod_group("gang", 2)
    pods = [pod("w-0", node_name="node1", phase="Running"), pod("w-1")]
    result = plan(state(reference_nodes(), pods, [group]))
    status = _status_after(result, group)
    assert (status["phase"], status["scheduled"], status["running"]) == ("Scheduling", 1, 1)
    assert status["scheduleStartTime"] == "2026-01-01T00:01:00Z"


def test_pod_group_fails_when_a_member_failed_and_finishes_when_min_member_succeeded() -> None:
    group = pod_group("gang", 2)
    failed = [
        pod("w-0", node_name="node1", phase="Running"),
        pod("w-1", node_name="node2", phase="Failed"),
    ]
    status = _status_after(plan(state(reference_nodes(), failed, [group])), group)
    assert (status["phase"], status["running"], status["failed"]) == ("Failed", 1, 1)
    finished = [pod(f"w-{i}", node_name=f"node{i + 1}", phase="Succeeded") for i in range(2)]
    status = _status_after(plan(state(reference_nodes(), finished, [group])), group)
    assert (status["phase"], status["succeeded"]) == ("Finished", 2)
    # One success short of minMember, the rest still running: Running, not Finished.
    mixed = [
        pod("w-0", node_name="node1", phase="Succeeded"),
        pod("w-1", node_name="node2", phase="Running"),
    ]
    assert _status_after(plan(state(reference_nodes(), mixed, [group])), group)["phase"] == (
        "Running"
    )


def test_facts_are_read_per_version_and_only_the_current_versions_are_kept() -> None:
    # A pass memoises what each pod and node version says; a new resourceVersion is read
    # again, and versions gone from the cluster are not kept (nor the objects they hold).
    nodes = reference_nodes()
    for index, n in enumerate(nodes):
        n["metadata"]["resourceVersion"] = str(index + 1)
    pods = [pod(f"w-{i}", gpus=8) for i in range(2)]
    groups = [pod_group("gang", 2)]
    first, pods = run(nodes, pods, groups)
    assert {n.pod.name for n in _of(first, Nominate)} == {"w-0", "w-1"}
    second, pods = run(nodes, pods, groups)
    assert {b.pod.name for b in _of(second, Bind)} == {"w-0", "w-1"}
    bound, _ = run(nodes, apply(pods, second), groups)
    assert not _of(bound, Nominate) and not _of(bound, Bind)
    kept_pods = planner._POD_FACTS.versions()
    assert kept_pods == {
        (p["metadata"]["uid"], p["metadata"]["resourceVersion"]) for p in apply(pods, second)
    }
    cordoned = [dict(n) for n in nodes]
    cordoned[0] = {**nodes[0], "spec": {"unschedulable": True}}
    cordoned[0]["metadata"] = {**nodes[0]["metadata"], "resourceVersion": "100"}
    plan(state(cordoned, [pod("x-0", "solo", gpus=8)], [pod_group("solo", 1)]))
    assert fit._NODE_FACTS.versions() == {
        (n["metadata"]["uid"], n["metadata"]["resourceVersion"]) for n in cordoned
    }
    cordoned_facts = fit._NODE_FACTS.held(("uid-node1", "100"))
    assert cordoned_facts is not None and not cordoned_facts.schedulable
