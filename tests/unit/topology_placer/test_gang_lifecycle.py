"""Rules of the gangs real training jobs are (issue #31, placement): members of different
shapes, PreferGather on a layer the topology lacks, elastic regrowth, recovery that is not
failure, timeouts that release, and what is read as Koordinator reads it (deprecated labels,
minMember 0). Each test drives `plan()` through raw objects."""

from __future__ import annotations

import json
from typing import Any

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
from topology_placer.gang import (
    DEPRECATED_MIN_AVAILABLE_LABEL,
    DEPRECATED_NAME_LABEL,
    GROUPS,
    MATCH_POLICY,
    MODE,
    NETWORK_TOPOLOGY_SPEC,
    POD_GROUP_LABEL,
)
from topology_placer.planner import (
    GATHER_LAYER_IGNORED,
    Bind,
    Decision,
    Disrupt,
    MarkUnschedulable,
    Nominate,
    Notice,
    Plan,
    UpdateGroupStatus,
    plan,
)
from topology_placer.status import pod_group_status

BLOCK_MUST = [{"layer": "BlockLayer", "strategy": "MustGather"}]
CREATED = 1_767_225_600.0  # 2026-01-01T00:00:00Z, the builders' creation time


def _of(result: Plan, kind: type[Any]) -> list[Any]:
    return [a for a in result.actions if isinstance(a, kind)]


def _where(pods: list[dict[str, Any]]) -> dict[str, str]:
    return {
        p["metadata"]["name"]: p["spec"].get("nodeName") or p["status"].get("nominatedNodeName")
        for p in pods
        if p["spec"].get("nodeName") or p["status"].get("nominatedNodeName")
    }


def _block_of(nodes: list[dict[str, Any]], name: str) -> str:
    labels = next(n["metadata"]["labels"] for n in nodes if n["metadata"]["name"] == name)
    return str(labels[BLOCK])


def _aged(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    for p in pods:
        p["metadata"]["creationTimestamp"] = "2026-01-01T00:00:00Z"
    return pods


def _passes(
    nodes: list[dict[str, Any]],
    pods: list[dict[str, Any]],
    groups: list[dict[str, Any]],
    count: int = 2,
    **kwargs: Any,
) -> list[dict[str, Any]]:
    for _ in range(count):
        pods = apply(pods, plan(state(nodes, pods, groups, topology=TOPOLOGY, **kwargs)))
    return pods


# --- 1. heterogeneous gangs --------------------------------------------------------------


def test_rule_a_cpu_only_launcher_with_a_node_selector_and_gpu_workers_is_placed() -> None:
    # The launcher may only run on the CPU node of each block, the workers need 8 GPUs: no
    # node passes both their filters and has GPUs, so a gang sized by its largest request on
    # nodes passing every member's filters is never placed.
    nodes = [
        node("cpu-1", "s1", "b1", gpus=0, labels={"role": "cpu"}),
        node("gpu-1a", "s1", "b1"),
        node("gpu-1b", "s1", "b1"),
        node("cpu-2", "s2", "b3", gpus=0, labels={"role": "cpu"}),
        node("gpu-2a", "s2", "b3"),
    ]
    launcher = pod("launcher", gpus=0, cpu="2")
    launcher["spec"]["nodeSelector"] = {"role": "cpu"}
    workers = [pod(f"worker-{i}", gpus=8) for i in range(2)]
    groups = [pod_group("gang", 3, gather=BLOCK_MUST)]
    after = _passes(nodes, [launcher, *workers], groups)
    where = {p["metadata"]["name"]: p["spec"].get("nodeName") for p in after}
    assert where == {"launcher": "cpu-1", "worker-0": "gpu-1a", "worker-1": "gpu-1b"}


def test_rule_each_member_is_sized_by_its_own_request() -> None:
    # A block of two 8-GPU, 8-CPU nodes takes two 8-GPU workers and a 6-CPU launcher (it
    # shares a node with one worker). Sized by the largest request (6 CPU and 8 GPU) every
    # node offers one slot and the block would offer 2 of the 3 the gang needs.
    nodes = [node("n1", "s1", "b1"), node("n2", "s1", "b1")]
    launcher = pod("launcher", gpus=0, cpu="6")
    workers = [pod(f"worker-{i}", gpus=8, cpu="1") for i in range(2)]
    groups = [pod_group("gang", 3, gather=BLOCK_MUST)]
    result, after = run(nodes, [launcher, *workers], groups, topology=TOPOLOGY)
    expect_actions(result.actions, Nominate, count=3)
    where = _where(after)
    assert sorted([where["worker-0"], where["worker-1"]]) == ["n1", "n2"]
    assert where["launcher"] in {"n1", "n2"}


def test_rule_each_member_keeps_its_own_tolerations() -> None:
    # The GPU nodes are tainted; only the workers tolerate the taint. The launcher goes to the
    # untainted node of the block, the workers to the tainted ones.
    taint = [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]
    nodes = [
        node("plain", "s1", "b1", gpus=0),
        node("gpu-a", "s1", "b1", taints=taint),
        node("gpu-b", "s1", "b1", taints=taint),
    ]
    toleration = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    launcher = pod("launcher", gpus=0, cpu="1")
    workers = [pod(f"worker-{i}", gpus=8, tolerations=toleration) for i in range(2)]
    groups = [pod_group("gang", 3, gather=BLOCK_MUST)]
    after = _passes(nodes, [launcher, *workers], groups)
    where = {p["metadata"]["name"]: p["spec"].get("nodeName") for p in after}
    assert where["launcher"] == "plain"
    assert {where["worker-0"], where["worker-1"]} == {"gpu-a", "gpu-b"}


def test_rule_a_mixed_gang_that_does_not_fit_is_placed_not_at_all_and_says_why() -> None:
    nodes = [node("n1", "s1", "b1"), node("n2", "s1", "b1"), node("n3", "s2", "b3")]
    launcher = pod("launcher", gpus=0, cpu="1")
    workers = [pod(f"worker-{i}", gpus=8) for i in range(3)]
    groups = [pod_group("gang", 4, gather=BLOCK_MUST)]
    result, _ = run(nodes, [launcher, *workers], groups, topology=TOPOLOGY)
    expect_no_actions(result.actions, Nominate, while_it_has=MarkUnschedulable)
    (message,) = {m.message for m in _of(result, MarkUnschedulable)}
    assert message.startswith("MustGather BlockLayer: no BlockLayer domain offers room for all")
    assert "(1 + 3 of 2 pod shapes)" in message or "(3 + 1 of 2 pod shapes)" in message


_LAUNCHER_CPU = st.sampled_from(["1", "2", "4"])
_WORKER_GPUS = st.sampled_from([1, 2, 4, 8])


@settings(max_examples=60, deadline=None)
@given(
    load=st.lists(st.tuples(st.integers(1, 8), st.sampled_from([2, 4, 8])), max_size=6),
    gangs=st.lists(
        st.tuples(_LAUNCHER_CPU, _WORKER_GPUS, st.integers(1, 4), st.booleans()),
        min_size=1,
        max_size=3,
    ),
    must=st.booleans(),
    recovering=st.tuples(st.integers(1, 3), st.integers(0, 2)),
)
def test_property_heterogeneous_gangs_are_all_or_nothing_and_never_overcommit(
    load: list[tuple[int, int]],
    gangs: list[tuple[str, int, int, bool]],
    must: bool,
    recovering: tuple[int, int],
) -> None:
    """After every pass: no node holds more GPUs or CPUs than it has; every gang that was
    never satisfied has 0 or at least minMember members bound or nominated; a Running gang
    that lost members is never evicted, whatever its wait; and the first gang is placed
    whenever one empty node can take all of it."""
    nodes = reference_nodes()
    pods: list[dict[str, Any]] = []
    gpus_used: dict[str, int] = {}
    for k, (number, gpus) in enumerate(load):
        name = f"node{number}"
        if gpus_used.get(name, 0) + gpus <= 8:
            gpus_used[name] = gpus_used.get(name, 0) + gpus
            pods.append(pod(f"busy{k}", None, gpus=gpus, cpu="1", node_name=name, scheduler="x"))
    groups = []
    minimum: dict[str, int] = {}
    gather = BLOCK_MUST if must else None
    for g, (launcher_cpu, worker_gpus, workers, spare) in enumerate(gangs):
        size = 1 + workers
        minimum[f"g{g}"] = size - 1 if spare and workers > 1 else size
        groups.append(pod_group(f"g{g}", minimum[f"g{g}"], gather=gather))
        pods.append(pod(f"g{g}-launcher", f"g{g}", gpus=0, cpu=launcher_cpu))
        pods.extend(pod(f"g{g}-w{i}", f"g{g}", gpus=worker_gpus, cpu="1") for i in range(workers))
    # A Running gang that lost `lost` of its members (recreated, pending) and was scaled up by
    # `extra`: it was satisfied before, so it may run short, but is never evicted.
    kept, extra = recovering
    groups.append(pod_group("r", kept + 1, gather=gather, status={"phase": "Running"}))
    for i in range(kept):
        where = f"node{i + 1}"
        if gpus_used.get(where, 0) + 1 <= 8:
            gpus_used[where] = gpus_used.get(where, 0) + 1
            pods.append(pod(f"r-{i}", "r", gpus=1, node_name=where, phase="Running"))
    pods.extend(pod(f"r-new-{i}", "r", gpus=8) for i in range(1 + extra))
    _aged(pods)
    first_fits = any(
        8 - gpus_used.get(f"node{i}", 0) >= gangs[0][1] * gangs[0][2]
        and 8 - sum(1 for p in pods if p["spec"].get("nodeName") == f"node{i}")
        >= int(gangs[0][0]) + gangs[0][2]
        for i in range(1, 9)
    )
    after = pods
    for now in (CREATED + 60, CREATED + 61, CREATED + 5000, CREATED + 5001):
        result = plan(state(nodes, after, groups, topology=TOPOLOGY, now=now))
        assert not [d for d in _of(result, Disrupt) if d.pod.name.startswith("r-")]
        after = apply(after, result)
        gpus_on: dict[str, int] = {}
        cpu_on: dict[str, int] = {}
        for p in after:
            where = p["spec"].get("nodeName") or p["status"].get("nominatedNodeName")
            if where:
                requests = p["spec"]["containers"][0]["resources"]["requests"]
                gpus_on[where] = gpus_on.get(where, 0) + int(requests["nvidia.com/gpu"])
                cpu_on[where] = cpu_on.get(where, 0) + int(requests["cpu"])
        assert all(total <= 8 for total in gpus_on.values())
        assert all(total <= 8 for total in cpu_on.values())
        for g in range(len(gangs)):
            members = [p for p in after if p["metadata"]["name"].startswith(f"g{g}-")]
            held = [
                p
                for p in members
                if p["spec"].get("nodeName") or p["status"].get("nominatedNodeName")
            ]
            assert len(held) == 0 or len(held) >= minimum[f"g{g}"]
            if held and must:
                blocks = {
                    _block_of(nodes, p["spec"].get("nodeName") or p["status"]["nominatedNodeName"])
                    for p in held
                }
                assert len(blocks) == 1
        if now == CREATED + 61 and first_fits:
            first = [p for p in after if p["metadata"]["name"].startswith("g0-")]
            assert all(p["spec"].get("nodeName") for p in first)


# --- 2. PreferGather on a layer the topology does not have -------------------------------


def test_rule_prefer_gather_on_an_absent_layer_is_ignored_with_a_warning_event() -> None:
    groups = [
        pod_group(
            "gang",
            2,
            gather=[
                {"layer": "BlockLayer", "strategy": "PreferGather"},
                {"layer": "AcceleratorLayer", "strategy": "PreferGather"},
            ],
        )
    ]
    nodes = reference_nodes()
    result, after = run(nodes, [pod("w-0"), pod("w-1")], groups, topology=TOPOLOGY)
    expect_actions(result.actions, Nominate, count=2)
    # The remaining PreferGather on BlockLayer still applies: both in one block.
    assert len({_block_of(nodes, n) for n in _where(after).values()}) == 1
    (warning,) = expect_actions(result.actions, Notice, reason=GATHER_LAYER_IGNORED)
    assert warning.warning and warning.kind == "PodGroup" and warning.name == "gang"
    assert "AcceleratorLayer" in warning.message and "SpineLayer, BlockLayer" in warning.message


def test_rule_must_gather_on_an_absent_layer_stays_an_error() -> None:
    groups = [
        pod_group("gang", 1, gather=[{"layer": "AcceleratorLayer", "strategy": "MustGather"}])
    ]
    result, _ = run(reference_nodes(), [pod("w-0")], groups, topology=TOPOLOGY)
    expect_no_actions(result.actions, Nominate, while_it_has=MarkUnschedulable)
    (mark,) = _of(result, MarkUnschedulable)
    assert "gather layer AcceleratorLayer is not in ClusterNetworkTopology" in mark.message
    assert not [n for n in _of(result, Notice) if n.reason == GATHER_LAYER_IGNORED]


def test_rule_the_seed_documents_prefer_gather_example_places() -> None:
    # The seed document's GangGroup: gang-master (minMember 1) and gang-worker (minMember 2),
    # each preferring Spine, Block and AcceleratorLayer, on the spine/block topology.
    spec = json.dumps(
        {
            "gatherStrategy": [
                {"layer": "SpineLayer", "strategy": "PreferGather"},
                {"layer": "BlockLayer", "strategy": "PreferGather"},
                {"layer": "AcceleratorLayer", "strategy": "PreferGather"},
            ]
        }
    )
    annotations = {
        GROUPS: '["default/gang-master", "default/gang-worker"]',
        NETWORK_TOPOLOGY_SPEC: spec,
    }
    groups = [
        pod_group("gang-master", 1, annotations=annotations),
        pod_group("gang-worker", 2, annotations=annotations),
    ]
    pods = [
        pod("master-0", "gang-master", gpus=0, cpu="2"),
        pod("worker-0", "gang-worker", gpus=8),
        pod("worker-1", "gang-worker", gpus=8),
    ]
    nodes = reference_nodes()
    after = _passes(nodes, pods, groups)
    bound = {p["metadata"]["name"]: p["spec"].get("nodeName") for p in after}
    assert all(bound.values())
    assert len({_block_of(nodes, n) for n in bound.values()}) == 1


# --- 3. elastic regrowth -------------------------------------------------------------------


def test_rule_a_satisfied_gang_places_its_remaining_pods_one_at_a_time_as_room_appears() -> None:
    # Two workers run (minMember 2, Running); the job grew by three, and one node has room for
    # just one more: it is placed now, the others wait, and nothing already running is touched.
    nodes = [node("n1", "s1", "b1"), node("n2", "s1", "b1"), node("n3", "s2", "b3")]
    groups = [pod_group("gang", 2, status={"phase": "Running"})]
    running = [
        pod("w-0", gpus=8, node_name="n1", phase="Running"),
        pod("w-1", gpus=8, node_name="n2", phase="Running"),
    ]
    grown = [pod(f"w-{i}", gpus=8) for i in (2, 3, 4)]
    result, after = run(nodes, _aged(running + grown), groups, topology=TOPOLOGY)
    (nominated,) = expect_actions(result.actions, Nominate)
    assert (nominated.pod.name, nominated.node) == ("w-2", "n3")
    assert {m.pod.name for m in _of(result, MarkUnschedulable)} == {"w-3", "w-4"}
    assert not _of(result, Disrupt)
    # The next pass binds it on its own; the others still wait for room.
    result, after = run(nodes, after, groups, topology=TOPOLOGY)
    expect_actions(result.actions, Bind, count=1, pod__name="w-2", node="n3")
    # Room appears (w-0 finished): the next one is placed.
    after = [p for p in after if p["metadata"]["name"] != "w-0"]
    result, _ = run(nodes, after, groups, topology=TOPOLOGY)
    expect_actions(result.actions, Nominate, count=1, pod__name="w-3", node="n1")


def test_rule_a_gang_with_min_member_bound_regrows_under_waiting_and_running() -> None:
    nodes = [node("n1", "s1", "b1"), node("n2", "s1", "b1")]
    groups = [pod_group("gang", 1, annotations={MATCH_POLICY: "waiting-and-running"})]
    pods = [pod("w-0", gpus=8, node_name="n1", phase="Running"), pod("w-1"), pod("w-2")]
    result, _ = run(nodes, pods, groups, topology=TOPOLOGY)
    expect_actions(result.actions, Nominate, count=1, pod__name="w-1", node="n2")


def test_rule_min_member_zero_places_each_pod_as_room_appears() -> None:
    nodes = [node("n1", "s1", "b1")]
    groups = [pod_group("gang", 0)]
    result, _ = run(nodes, [pod("w-0"), pod("w-1")], groups, topology=TOPOLOGY)
    expect_actions(result.actions, Nominate, count=1, pod__name="w-0", node="n1")


# --- 4. recovery is not failure --------------------------------------------------------------


def test_rule_a_running_strict_gang_is_not_evicted_while_a_recreated_member_waits() -> None:
    # w-2 was recreated and there is no room for it anywhere, long past the waiting time: the
    # running members stay, and the replacement waits (no GangTimeout: nothing failed).
    nodes = [node("n1", "s1", "b1"), node("n2", "s1", "b1")]
    groups = [pod_group("gang", 3, timeout=30, status={"phase": "Running"})]
    pods = _aged(
        [
            pod("w-0", gpus=8, node_name="n1", phase="Running"),
            pod("w-1", gpus=8, node_name="n2", phase="Running"),
            pod("w-2", gpus=8),
        ]
    )
    now = CREATED + 10_000
    for _ in range(3):
        result = plan(state(nodes, pods, groups, topology=TOPOLOGY, now=now))
        expect_no_actions(result.actions, Disrupt, while_it_has=MarkUnschedulable)
        assert {m.reason for m in _of(result, MarkUnschedulable)} == {"Unschedulable"}
        # The PodGroup's status, written back, keeps saying it was satisfied.
        for update in _of(result, UpdateGroupStatus):
            groups[0]["status"] = update.status
        pods = apply(pods, result)
        now += 60
    assert groups[0]["status"]["phase"] == "Scheduled"


def test_rule_a_recovering_group_stays_scheduled_not_scheduling() -> None:
    members = [
        pod("w-0", node_name="n1", phase="Running"),
        pod("w-1", node_name="n2", phase="Running"),
        pod("w-2"),
    ]
    recovering = pod_group_status(3, members, {"phase": "Running"}, CREATED)
    assert recovering["phase"] == "Scheduled"
    # A group that never got there is Scheduling, as upstream's controller says.
    assert pod_group_status(3, members, {"phase": "Scheduling"}, CREATED)["phase"] == "Scheduling"


def test_rule_a_gang_with_no_topology_rules_is_not_confined_to_its_first_pods_block() -> None:
    # w-0 was bound in b1, whose only node it fills; the rest of the gang has no gather rule
    # and fits in b3.
    nodes = [node("n1", "s1", "b1"), node("n3", "s2", "b3"), node("n4", "s2", "b3")]
    groups = [pod_group("gang", 3)]
    pods = [pod("w-0", gpus=8, node_name="n1"), pod("w-1", gpus=8), pod("w-2", gpus=8)]
    result, after = run(nodes, pods, groups, topology=TOPOLOGY)
    expect_actions(result.actions, Nominate, count=2)
    assert {_where(after)["w-1"], _where(after)["w-2"]} == {"n3", "n4"}


# --- 5. timeouts release ---------------------------------------------------------------------


def test_rule_a_non_strict_gang_past_its_waiting_time_drops_its_nominations() -> None:
    nodes = [node("n1", "s1", "b1"), node("n2", "s2", "b3")]
    groups = [pod_group("gang", 3, gather=BLOCK_MUST, timeout=30, annotations={MODE: "NonStrict"})]
    pods = _aged(
        [
            pod("w-0", gpus=8, node_name="n1", phase="Running"),
            pod("w-1", gpus=8, nominated="n2"),
            pod("w-2", gpus=8, nominated="n2"),
        ]
    )
    result, _ = run(nodes, pods, groups, topology=TOPOLOGY, now=CREATED + 31)
    cleared = expect_actions(result.actions, Nominate, count=2, node="")
    assert {c.pod.name for c in cleared} == {"w-1", "w-2"}
    # NonStrict keeps what is bound.
    expect_no_actions(result.actions, Disrupt, while_it_has=MarkUnschedulable)
    assert {m.reason for m in _of(result, MarkUnschedulable)} == {"GangTimeout"}


def test_rule_a_partly_bound_gang_group_is_evicted_on_timeout_like_a_single_pod_group() -> None:
    # master (minMember 1) is bound; worker (minMember 2) never got a node, as its status says
    # (PreScheduling). The group never reached minMember as a whole: on timeout the master
    # goes, as a lone PodGroup's would.
    nodes = [node("n1", "s1", "b1", gpus=0), node("n2", "s2", "b3", gpus=8)]
    annotations = {GROUPS: '["default/master", "default/worker"]'}
    groups = [
        pod_group("master", 1, annotations=annotations, timeout=30),
        pod_group(
            "worker", 2, annotations=annotations, timeout=30, status={"phase": "PreScheduling"}
        ),
    ]
    pods = _aged(
        [
            pod("master-0", "master", gpus=0, node_name="n1", phase="Running"),
            pod("worker-0", "worker", gpus=8),
            pod("worker-1", "worker", gpus=8),
        ]
    )
    early, _ = run(nodes, pods, groups, topology=TOPOLOGY, now=CREATED + 10)
    expect_no_actions(early.actions, Disrupt, while_it_has=MarkUnschedulable)
    late, _ = run(nodes, pods, groups, topology=TOPOLOGY, now=CREATED + 31)
    expect_actions(late.actions, Disrupt, count=1, pod__name="master-0", reason="GangIncomplete")
    assert any(d.kind == "gang-evicted" for d in _of(late, Decision))


# --- 7. read as upstream reads it --------------------------------------------------------------


def _deprecated(name: str, gang: str, min_available: str | None) -> dict[str, Any]:
    made = pod(name, None)
    made["metadata"]["labels"][DEPRECATED_NAME_LABEL] = gang
    if min_available is not None:
        made["metadata"]["labels"][DEPRECATED_MIN_AVAILABLE_LABEL] = min_available
    return made


def test_rule_deprecated_pod_group_name_and_min_available_labels_form_a_gang() -> None:
    # One of two members: the gang waits for the other (a lone pod would be placed at once).
    alone = [_deprecated("w-0", "job", "2")]
    result, _ = run(reference_nodes(), alone, topology=TOPOLOGY)
    expect_no_actions(result.actions, Nominate, while_it_has=MarkUnschedulable)
    (mark,) = _of(result, MarkUnschedulable)
    assert "PodGroup default/job has 1 of minMember 2 pods" in mark.message
    # Both members: placed together.
    both = [_deprecated("w-0", "job", "2"), _deprecated("w-1", "job", "2")]
    result, _ = run(reference_nodes(), both, topology=TOPOLOGY)
    expect_actions(result.actions, Nominate, count=2)


def test_rule_the_membership_label_wins_over_the_deprecated_name_label() -> None:
    member = pod("w-0", "gang")
    member["metadata"]["labels"][DEPRECATED_NAME_LABEL] = "other"
    result, _ = run(reference_nodes(), [member], [pod_group("gang", 1)], topology=TOPOLOGY)
    expect_actions(result.actions, Nominate, count=1, pod__name="w-0")
    assert member["metadata"]["labels"][POD_GROUP_LABEL] == "gang"
