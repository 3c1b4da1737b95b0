"""Rules of the placement pass (`planner.plan`) that mutation testing found no test held
(`make mutate MODULES=services/topology_placer/planner.py`, docs/testing.md): one test per
rule, named after it, each failing on the slip it was written against."""

from __future__ import annotations

from typing import Any

from tests.unit.plan_checks import expect_actions, expect_no_actions
from tests.unit.topology_placer.builders import TOPOLOGY, node, pod, pod_group, reference_nodes
from tests.unit.topology_placer.simulate import state
from topology_placer.gang import GROUPS, MODE
from topology_placer.planner import (
    Bind,
    Decision,
    Disrupt,
    MarkUnschedulable,
    Nominate,
    Notice,
    Plan,
    SelectNode,
    plan,
)

NAME = "gang.scheduling.koordinator.sh/name"
MIN_AVAILABLE = "gang.scheduling.koordinator.sh/min-available"
CREATED = 1_767_225_600.0  # 2026-01-01T00:00:00Z, the builders' creation time


def _of(result: Plan, kind: type[Any]) -> list[Any]:
    return [a for a in result.actions if isinstance(a, kind)]


def _annotated(name: str, gang: str, min_available: str) -> dict[str, Any]:
    """A member of a gang its pods declare (no PodGroup label)."""
    made = pod(name, None, gpus=8)
    made["metadata"]["annotations"][NAME] = gang
    made["metadata"]["annotations"][MIN_AVAILABLE] = min_available
    return made


def _created_at_start(*pods: dict[str, Any]) -> None:
    for made in pods:
        made["metadata"]["creationTimestamp"] = "2026-01-01T00:00:00Z"


# --- which pods make gangs (plan) -----------------------------------------------------------


def test_rule_a_finished_pod_of_ours_makes_no_gang() -> None:
    # A Succeeded pod of our scheduler is no gang of one: counted, it showed in the
    # placer's gangs-by-state metric as a gang waiting for ever.
    done = pod("done", None, node_name="node1", phase="Succeeded")
    waiting = pod("w-0", None)
    result = plan(state(reference_nodes(), [done, waiting], topology=TOPOLOGY))
    expect_actions(result.actions, Nominate, pod__name="w-0")
    assert result.gang_states == {"default/w-0": "nominated"}


def test_rule_a_member_of_a_missing_pod_group_is_invalid_naming_it() -> None:
    result = plan(state(reference_nodes(), [pod("w-0", "gone")], topology=TOPOLOGY))
    (mark,) = _of(result, MarkUnschedulable)
    assert mark.message == "PodGroup default/gone does not exist"
    assert result.gang_states == {"default/gone": "invalid"}


def test_rule_the_first_annotated_member_by_name_speaks_for_its_gang() -> None:
    # The members disagree: a-0 (first by name) asks for 2, a-1 for 3. Two are there.
    pods = [_annotated("a-1", "ann", "3"), _annotated("a-0", "ann", "2")]
    result = plan(state(reference_nodes(), pods, topology=TOPOLOGY))
    assert {n.pod.name for n in _of(result, Nominate)} == {"a-0", "a-1"}
    assert result.gang_states == {"default/ann": "nominated"}


def test_rule_a_pod_group_object_wins_over_its_members_annotations() -> None:
    # The pods also carry gang annotations asking for 3; the PodGroup of that name says 2.
    pods = [_annotated("a-0", "ann", "3"), _annotated("a-1", "ann", "3")]
    result = plan(state(reference_nodes(), pods, [pod_group("ann", 2)], topology=TOPOLOGY))
    assert {n.pod.name for n in _of(result, Nominate)} == {"a-0", "a-1"}
    assert result.gang_states == {"default/ann": "nominated"}


def test_rule_a_gang_group_naming_a_missing_pod_group_is_invalid() -> None:
    annotations = {GROUPS: '["default/master", "default/worker"]'}
    groups = [pod_group("master", 1, annotations=annotations)]
    result = plan(state(reference_nodes(), [pod("m-0", "master")], groups, topology=TOPOLOGY))
    (mark,) = _of(result, MarkUnschedulable)
    assert mark.message == "GangGroup member PodGroup default/worker does not exist"
    expect_no_actions(result.actions, Nominate, while_it_has=MarkUnschedulable)


def test_rule_a_pod_without_pod_group_is_a_gang_of_one_not_a_satisfied_gang() -> None:
    # minMember 1: its nomination is bound as a whole gang's, not as a satisfied gang's
    # recreated member (which a minMember of 0 would make it).
    lone = pod("solo", None, nominated="node1")
    result = plan(state(reference_nodes(), [lone], topology=TOPOLOGY))
    expect_actions(result.actions, Bind, count=1, pod__name="solo", node="node1")
    (decision,) = _of(result, Decision)
    assert decision.message == "binding 1 pods to their nominated nodes"
    assert result.attempts == ["bound"]


# --- the order of gangs (plan) --------------------------------------------------------------


def test_rule_among_gangs_of_one_priority_the_one_waiting_longest_is_placed_first() -> None:
    # Room for one 2-pod gang. "zeta" has waited longest (its oldest pending pod, 10:00:00)
    # though its newest came last; "alpha", first by name, came at 10:00:05.
    nodes = [node("n1", "s1", "b1"), node("n2", "s1", "b1")]
    zeta = [pod("z-0", "zeta"), pod("z-1", "zeta")]
    alpha = [pod("a-0", "alpha"), pod("a-1", "alpha")]
    zeta[0]["metadata"]["creationTimestamp"] = "2026-01-01T10:00:00Z"
    zeta[1]["metadata"]["creationTimestamp"] = "2026-01-01T10:00:10Z"
    for made in alpha:
        made["metadata"]["creationTimestamp"] = "2026-01-01T10:00:05Z"
    groups = [pod_group("zeta", 2), pod_group("alpha", 2)]
    result = plan(state(nodes, alpha + zeta, groups, topology=TOPOLOGY))
    assert {n.pod.name for n in _of(result, Nominate)} == {"z-0", "z-1"}
    assert result.gang_states == {"default/zeta": "nominated", "default/alpha": "unschedulable"}


def test_rule_a_gang_with_nothing_pending_is_reported_bound_or_waiting() -> None:
    # A gang whose pods all have nodes is bound; a PodGroup whose pods have not come waits.
    groups = [pod_group("done", 1), pod_group("early", 2)]
    running = pod("d-0", "done", node_name="node1", phase="Running")
    result = plan(state(reference_nodes(), [running], groups, topology=TOPOLOGY))
    assert result.gang_states == {"default/done": "bound", "default/early": "waiting"}


# --- the waiting time (_unschedulable) ------------------------------------------------------


def _reasons(result: Plan) -> set[str]:
    return {m.reason for m in _of(result, MarkUnschedulable)}


def test_rule_a_gang_group_waits_as_long_as_its_shortest_timeout() -> None:
    annotations = {GROUPS: '["default/master", "default/worker"]'}
    groups = [
        pod_group("master", 1, annotations=annotations, timeout=30),
        pod_group("worker", 2, annotations=annotations, timeout=100),
    ]
    pods = [pod("m-0", "master"), pod("w-0", "worker")]
    _created_at_start(*pods)
    result = plan(state(reference_nodes(), pods, groups, topology=TOPOLOGY, now=CREATED + 31))
    assert _reasons(result) == {"GangTimeout"}
    assert _of(result, MarkUnschedulable)[0].message.startswith(
        "gang default/master,default/worker waited more than 30s: "
    )


def test_rule_the_wait_runs_from_the_latest_recorded_schedule_start_time() -> None:
    # The worker PodGroup's cycle started 50 s after the master's: 10 s of its 30 are gone.
    annotations = {GROUPS: '["default/master", "default/worker"]'}
    groups = [
        pod_group(
            "master",
            1,
            annotations=annotations,
            timeout=30,
            status={"phase": "Pending", "scheduleStartTime": "2026-01-01T00:00:00Z"},
        ),
        pod_group(
            "worker",
            2,
            annotations=annotations,
            timeout=30,
            status={"phase": "Pending", "scheduleStartTime": "2026-01-01T00:00:50Z"},
        ),
    ]
    pods = [pod("m-0", "master"), pod("w-0", "worker")]
    _created_at_start(*pods)
    result = plan(state(reference_nodes(), pods, groups, topology=TOPOLOGY, now=CREATED + 60))
    assert _reasons(result) == {"Unschedulable"}
    assert result.gang_states == {"default/master,default/worker": "waiting"}


def test_rule_without_a_recorded_start_the_wait_runs_from_the_oldest_pod() -> None:
    groups = [pod_group("gang", 3, timeout=30)]
    old, young = pod("w-0"), pod("w-1")
    old["metadata"]["creationTimestamp"] = "2026-01-01T00:00:00Z"
    young["metadata"]["creationTimestamp"] = "2026-01-01T00:00:25Z"
    result = plan(state(reference_nodes(), [young, old], groups, now=CREATED + 31))
    assert _reasons(result) == {"GangTimeout"}


def test_rule_a_gang_times_out_only_past_its_waiting_time_not_at_it() -> None:
    groups = [pod_group("gang", 3, timeout=30)]
    pods = [pod("w-0"), pod("w-1")]
    _created_at_start(*pods)
    at_the_second = plan(state(reference_nodes(), pods, groups, now=CREATED + 30))
    assert _reasons(at_the_second) == {"Unschedulable"}
    past_it = plan(state(reference_nodes(), pods, groups, now=CREATED + 30.5))
    assert _reasons(past_it) == {"GangTimeout"}


def test_rule_an_invalid_gang_never_times_out_nor_evicts_its_bound_members() -> None:
    # w-1's rank does not parse: the gang is invalid, past its waiting time as well. Its
    # bound member keeps running (an invalid gang is refused, not timed out).
    groups = [pod_group("gang", 2, timeout=30, status={"phase": "Scheduling"})]
    bound = pod("w-0", node_name="node1", phase="Running")
    broken = pod("w-1")
    broken["metadata"]["annotations"]["gang.scheduling.koordinator.sh/network-topology-index"] = (
        "first"
    )
    _created_at_start(bound, broken)
    result = plan(state(reference_nodes(), [bound, broken], groups, now=CREATED + 300))
    assert _reasons(result) == {"Unschedulable"}
    expect_no_actions(result.actions, Disrupt, while_it_has=MarkUnschedulable)
    assert [d.kind for d in _of(result, Decision)] == ["invalid"]


def test_rule_an_invalid_non_strict_gang_gives_its_nominations_back() -> None:
    # NonStrict keeps its reservations while it waits, but an invalid gang never times out:
    # kept, its nominations would hold the node from every other gang for ever.
    groups = [pod_group("gang", 1, annotations={MODE: "NonStrict"})]
    broken = pod("w-0", nominated="node1")
    broken["metadata"]["annotations"]["gang.scheduling.koordinator.sh/network-topology-index"] = (
        "first"
    )
    result = plan(state(reference_nodes(), [broken], groups, topology=TOPOLOGY))
    expect_actions(result.actions, Nominate, count=1, pod__name="w-0", node="")
    assert result.gang_states == {"default/gang": "invalid"}


def test_rule_a_non_strict_gang_past_its_waiting_time_keeps_its_bound_members() -> None:
    # Timed out, a NonStrict gang drops its nominations but evicts nothing (only Strict
    # gangs must not run in part), though its status proves it never reached minMember.
    groups = [
        pod_group(
            "gang", 3, annotations={MODE: "NonStrict"}, timeout=30, status={"phase": "Scheduling"}
        )
    ]
    pods = [
        pod("w-0", node_name="node1", phase="Running"),
        pod("w-1", nominated="node2"),
        pod("w-2"),
    ]
    pods[2]["spec"]["nodeSelector"] = {"pool": "nowhere"}
    _created_at_start(*pods)
    result = plan(state(reference_nodes(), pods, groups, topology=TOPOLOGY, now=CREATED + 31))
    assert _reasons(result) == {"GangTimeout"}
    expect_actions(result.actions, Nominate, count=1, pod__name="w-1", node="")
    expect_no_actions(result.actions, Disrupt, while_it_has=MarkUnschedulable)


def test_rule_each_placement_attempt_is_counted_by_its_result() -> None:
    groups = [pod_group("gang", 2)]
    pods = [pod("w-0"), pod("w-1")]
    for made in pods:
        made["spec"]["nodeSelector"] = {"pool": "nowhere"}
    result = plan(state(reference_nodes(), pods, groups, topology=TOPOLOGY))
    assert result.attempts == ["unschedulable"]
    waiting = plan(state(reference_nodes(), pods[:1], groups, topology=TOPOLOGY))
    assert waiting.attempts == ["waiting"]


def test_rule_a_gang_group_with_a_pod_group_that_does_not_parse_is_invalid_whole() -> None:
    # worker's mode does not parse. Its group is refused whole, naming it, and the pass goes
    # on for the other gangs (a bug found by the mutants of plan: the group was placed
    # without worker's spec, and the KeyError failed the pass for every gang).
    annotations = {GROUPS: '["default/master", "default/worker"]'}
    groups = [
        pod_group("master", 1, annotations=annotations),
        pod_group("worker", 1, annotations={**annotations, MODE: "Sometimes"}),
        pod_group("other", 1),
    ]
    pods = [pod("m-0", "master"), pod("w-0", "worker"), pod("o-0", "other")]
    result = plan(state(reference_nodes(), pods, groups, topology=TOPOLOGY))
    marks = {m.pod.name: m.message for m in _of(result, MarkUnschedulable)}
    assert set(marks) == {"m-0", "w-0"}
    assert all(m.startswith("PodGroup default/worker: ") for m in marks.values())
    expect_actions(result.actions, Nominate, count=1, pod__name="o-0")
    assert result.gang_states == {
        "default/master,default/worker": "invalid",
        "default/worker": "invalid",
        "default/other": "nominated",
    }


def test_rule_the_unschedulable_event_goes_to_the_first_pod_group_of_the_group() -> None:
    annotations = {GROUPS: '["default/master", "default/worker"]'}
    groups = [
        pod_group("master", 1, annotations=annotations),
        pod_group("worker", 1, annotations=annotations),
    ]
    pods = [pod("m-0", "master", gpus=16), pod("w-0", "worker")]
    result = plan(state(reference_nodes(), pods, groups, topology=TOPOLOGY))
    (notice,) = expect_actions(result.actions, Notice, reason="FailedScheduling")
    assert (notice.name, notice.uid) == ("master", "uid-pg-default-master")


def test_rule_an_unschedulable_gang_is_warned_of_the_prefer_gather_layer_it_ignores() -> None:
    # The warning goes with a change of verdict too, not only with a nomination.
    groups = [
        pod_group("gang", 1, gather=[{"layer": "AcceleratorLayer", "strategy": "PreferGather"}])
    ]
    result = plan(state(reference_nodes(), [pod("w-0", gpus=16)], groups, topology=TOPOLOGY))
    expect_actions(result.actions, MarkUnschedulable, count=1, pod__name="w-0")
    (warning,) = expect_actions(result.actions, Notice, reason="GatherLayerIgnored")
    assert "AcceleratorLayer" in warning.message


def test_rule_a_timed_out_annotation_gang_evicts_only_members_not_yet_running() -> None:
    # Declared by its pods, the gang has no PodGroup status to prove it never reached
    # minMember: past its waiting time a bound member that runs is kept (fail closed), one
    # bound but not running yet goes.
    pods = [_annotated(f"a-{i}", "ann", "4") for i in range(3)]
    for made in pods:
        made["metadata"]["annotations"]["gang.scheduling.koordinator.sh/waiting-time"] = "30s"
    pods[0]["spec"]["nodeName"], pods[0]["status"]["phase"] = "node1", "Running"
    pods[1]["spec"]["nodeName"] = "node2"
    _created_at_start(*pods)
    result = plan(state(reference_nodes(), pods, topology=TOPOLOGY, now=CREATED + 31))
    assert _reasons(result) == {"GangTimeout"}
    (evicted,) = expect_actions(result.actions, Disrupt, reason="GangIncomplete")
    assert evicted.pod.name == "a-1"


def test_rule_a_pod_group_with_min_member_bound_has_reached_it_whatever_its_status_says() -> None:
    # only-waiting counts the pending pod alone, so the gang waits and times out; but its
    # minMember are bound now, which its status (written last pass) does not say yet: that
    # status proves nothing and the running members stay.
    groups = [
        pod_group(
            "gang",
            2,
            annotations={"gang.scheduling.koordinator.sh/match-policy": "only-waiting"},
            timeout=30,
            status={"phase": "Scheduling"},
        )
    ]
    pods = [
        pod("w-0", node_name="node1", phase="Running"),
        pod("w-1", node_name="node2", phase="Running"),
        pod("w-2"),
    ]
    _created_at_start(*pods)
    result = plan(state(reference_nodes(), pods, groups, topology=TOPOLOGY, now=CREATED + 31))
    assert _reasons(result) == {"GangTimeout"}
    expect_no_actions(result.actions, Disrupt, while_it_has=MarkUnschedulable)


def test_rule_a_pod_group_that_has_min_member_bound_proves_no_gang_incomplete() -> None:
    # master has its one member bound (its status, a pass old, still says Scheduling);
    # worker's status was never written. Past the waiting time nothing proves the group
    # never reached minMember, so its running members stay.
    annotations = {GROUPS: '["default/master", "default/worker"]'}
    groups = [
        pod_group("master", 1, annotations=annotations, timeout=30, status={"phase": "Scheduling"}),
        pod_group("worker", 2, annotations=annotations, timeout=30),
    ]
    pods = [
        pod("m-0", "master", node_name="node1", phase="Running"),
        pod("w-0", "worker", node_name="node2", phase="Running"),
        pod("w-1", "worker"),
    ]
    pods[2]["spec"]["nodeSelector"] = {"pool": "nowhere"}
    _created_at_start(*pods)
    result = plan(state(reference_nodes(), pods, groups, topology=TOPOLOGY, now=CREATED + 31))
    assert _reasons(result) == {"GangTimeout"}
    expect_no_actions(result.actions, Disrupt, while_it_has=MarkUnschedulable)


def test_rule_a_gang_incomplete_eviction_skips_members_already_being_deleted() -> None:
    groups = [pod_group("gang", 3, timeout=30, status={"phase": "Scheduling"})]
    pods = [
        pod("w-0", node_name="node1", phase="Running"),
        pod("w-1", node_name="node2", phase="Running", deleting=True),
        pod("w-2"),
    ]
    pods[2]["spec"]["nodeSelector"] = {"pool": "nowhere"}
    _created_at_start(*pods)
    result = plan(state(reference_nodes(), pods, groups, topology=TOPOLOGY, now=CREATED + 31))
    (evicted,) = expect_actions(result.actions, Disrupt, reason="GangIncomplete")
    assert evicted.pod.name == "w-0"
    (decision,) = [d for d in _of(result, Decision) if d.kind == "gang-evicted"]
    assert decision.victims == ("default/w-0",)


# --- binding nominations (_GangFit.takes) ---------------------------------------------------


def _with_host_port(made: dict[str, Any], port: int = 8080) -> dict[str, Any]:
    made["spec"]["containers"][0]["ports"] = [{"containerPort": port, "hostPort": port}]
    return made


def test_rule_nominations_the_inter_pod_filters_allow_are_bound() -> None:
    pods = [
        _with_host_port(pod("w-0", gpus=1, nominated="node1")),
        _with_host_port(pod("w-1", gpus=1, nominated="node2")),
    ]
    result = plan(state(reference_nodes(), pods, [pod_group("gang", 2)], topology=TOPOLOGY))
    bound = expect_actions(result.actions, Bind, count=2)
    assert {(b.pod.name, b.node) for b in bound} == {("w-0", "node1"), ("w-1", "node2")}


def test_rule_nominations_the_inter_pod_filters_refuse_are_not_bound() -> None:
    # Both members hold hostPort 8080 and were nominated to one node (by another writer of
    # pod status): the room is there, the port is not. (Of two sizes, so the room is counted
    # per member and only the filters see the conflict; the gather then finds no placement
    # the filters take, a documented limit for mixed gangs with shared hostPorts.)
    pods = [
        _with_host_port(pod("w-0", gpus=1, nominated="node1")),
        _with_host_port(pod("w-1", gpus=2, nominated="node1")),
    ]
    result = plan(state(reference_nodes(), pods, [pod_group("gang", 2)], topology=TOPOLOGY))
    expect_no_actions(result.actions, Bind, while_it_has=MarkUnschedulable)
    # Checked in rank order: the later member is the one refused.
    assert _of(result, MarkUnschedulable)[0].message == (
        "inter-pod filters refuse the placement found: pod w-1 on node node1: hostPort "
        "conflict with member w-0 (0.0.0.0:8080/TCP)"
    )


def test_rule_a_mixed_gang_is_not_bound_to_a_node_that_no_longer_takes_a_member() -> None:
    # A launcher and a worker of two sizes, nominated earlier; since then node2 was cordoned.
    nodes = reference_nodes()
    nodes[1]["spec"]["unschedulable"] = True
    pods = [pod("launcher", gpus=1, nominated="node1"), pod("worker", gpus=2, nominated="node2")]
    result = plan(state(nodes, pods, [pod_group("gang", 2)], topology=TOPOLOGY))
    expect_no_actions(result.actions, Bind, while_it_has=Nominate)
    placed = {n.pod.name: n.node for n in _of(result, Nominate)}
    assert placed.get("worker", "node2") != "node2"


def test_rule_a_mixed_gang_is_not_bound_to_a_node_its_member_selects_out() -> None:
    # The worker selects pool=a nodes; it was nominated (by another writer) to node2, which
    # the launcher could use but the worker may not.
    nodes = reference_nodes()
    for made in nodes[2:]:
        made["metadata"]["labels"]["pool"] = "a"
    worker = pod("worker", gpus=2, nominated="node2")
    worker["spec"]["nodeSelector"] = {"pool": "a"}
    pods = [pod("launcher", gpus=1, nominated="node1"), worker]
    result = plan(state(nodes, pods, [pod_group("gang", 2)], topology=TOPOLOGY))
    expect_no_actions(result.actions, Bind, while_it_has=Nominate)
    placed = {n.pod.name: n.node for n in _of(result, Nominate)}
    assert placed["worker"] not in {"node1", "node2"}


def test_rule_a_mixed_gang_is_bound_only_where_its_members_fit_together() -> None:
    # Each fits node1's 8 GPUs alone (4 and 6), not both: placed again, not bound there.
    pods = [pod("launcher", gpus=4, nominated="node1"), pod("worker", gpus=6, nominated="node1")]
    result = plan(state(reference_nodes(), pods, [pod_group("gang", 2)], topology=TOPOLOGY))
    expect_no_actions(result.actions, Bind, while_it_has=Nominate)
    placed = {n.pod.name: n.node for n in _of(result, Nominate)}
    assert placed.get("launcher", "node1") != placed.get("worker", "node1")


# --- a satisfied gang regrows (_regrow_phase, _GangFit.consume) ----------------------------


def _satisfied(**kwargs: Any) -> list[dict[str, Any]]:
    """A PodGroup of minMember 1 that ran (its member is bound), for members to regrow."""
    return [pod_group("gang", 1, status={"phase": "Running"}, **kwargs)]


def test_rule_regrown_members_nominated_to_one_node_are_bound_while_it_has_room() -> None:
    # node2 offers two 4-GPU slots: both recreated members nominated there are bound.
    pods = [
        pod("w-0", node_name="node1", phase="Running"),
        pod("w-1", gpus=4, nominated="node2"),
        pod("w-2", gpus=4, nominated="node2"),
    ]
    result = plan(state(reference_nodes(), pods, _satisfied(), topology=TOPOLOGY))
    bound = expect_actions(result.actions, Bind, count=2)
    assert {(b.pod.name, b.node) for b in bound} == {("w-1", "node2"), ("w-2", "node2")}


def test_rule_a_regrown_member_is_not_bound_beside_one_bound_this_pass_holding_its_port() -> None:
    # Two recreated members of two sizes, both with hostPort 8080, nominated to node2: the
    # first is bound, the second would clash with it there and goes elsewhere.
    pods = [
        pod("w-0", node_name="node1", phase="Running"),
        _with_host_port(pod("w-1", gpus=1, nominated="node2")),
        _with_host_port(pod("w-2", gpus=2, nominated="node2")),
    ]
    result = plan(state(reference_nodes(), pods, _satisfied(), topology=TOPOLOGY))
    (bound,) = expect_actions(result.actions, Bind)
    assert (bound.pod.name, bound.node) == ("w-1", "node2")
    assert {n.node for n in _of(result, Nominate) if n.pod.name == "w-2"} - {""} != {"node2"}


def test_rule_regrown_members_of_two_sizes_never_overcommit_the_node_they_share() -> None:
    # Nominated to node2 (8 GPUs), 4 and 6 GPUs: the first is bound, the second has no room.
    pods = [
        pod("w-0", node_name="node1", phase="Running"),
        pod("w-1", gpus=4, nominated="node2"),
        pod("w-2", gpus=6, nominated="node2"),
    ]
    result = plan(state(reference_nodes(), pods, _satisfied(), topology=TOPOLOGY))
    (bound,) = expect_actions(result.actions, Bind)
    assert (bound.pod.name, bound.node) == ("w-1", "node2")
    assert {n.node for n in _of(result, Nominate) if n.pod.name == "w-2"} - {""} != {"node2"}


def test_rule_regrown_members_of_two_sizes_share_a_node_while_it_has_room() -> None:
    # 4 and 3 GPUs nominated to node2 (8 GPUs): both fit, both are bound.
    pods = [
        pod("w-0", node_name="node1", phase="Running"),
        pod("w-1", gpus=4, nominated="node2"),
        pod("w-2", gpus=3, nominated="node2"),
    ]
    result = plan(state(reference_nodes(), pods, _satisfied(), topology=TOPOLOGY))
    bound = expect_actions(result.actions, Bind, count=2)
    assert {(b.pod.name, b.node) for b in bound} == {("w-1", "node2"), ("w-2", "node2")}


# --- when preemption does not help (_place_gang) -------------------------------------------


def test_rule_a_strict_gang_preemption_cannot_help_gives_its_nominations_back() -> None:
    # Evicting the one lower-priority pod (4 GPUs on n1) frees one 8-GPU slot; the gang needs
    # two. It keeps no reservation (only a gang waiting for its victims to go keeps them).
    nodes = [node("n1", "s1", "b1"), node("n2", "s1", "b1")]
    pods = [
        pod("low", None, gpus=4, node_name="n1", phase="Running", priority=0, scheduler="x"),
        pod("high", None, gpus=8, node_name="n2", phase="Running", priority=1000, scheduler="x"),
        pod("w-0", priority=100, nominated="n1"),
        pod("w-1", priority=100),
    ]
    result = plan(state(nodes, pods, [pod_group("gang", 2)], topology=TOPOLOGY))
    expect_no_actions(result.actions, Disrupt, while_it_has=MarkUnschedulable)
    expect_actions(result.actions, Nominate, count=1, pod__name="w-0", node="")


# --- how many members a gang needs (_members_phase) ----------------------------------------


def test_rule_a_strict_gang_waiting_for_members_keeps_its_reservations() -> None:
    # Its other member is not there (yet, or again): within the waiting time the nomination
    # stays, so the gang is not placed afresh each pass.
    result = plan(state(reference_nodes(), [pod("w-0", nominated="node1")], [pod_group("gang", 2)]))
    expect_no_actions(result.actions, Nominate, while_it_has=MarkUnschedulable)
    assert result.gang_states == {"default/gang": "waiting"}


def _three_nodes_one_bound(policy: str | None) -> tuple[list[Any], list[Any]]:
    annotations = {} if policy is None else {"gang.scheduling.koordinator.sh/match-policy": policy}
    groups = [pod_group("gang", 2, annotations=annotations)]
    nodes = [node("n1", "s1", "b1"), node("n2", "s1", "b1"), node("n3", "s1", "b1")]
    return nodes, groups


def test_rule_under_only_waiting_bound_members_do_not_lower_what_must_be_placed_at_once() -> None:
    # minMember 2 counts waiting pods alone: 2 of the 3 pending members are placed together
    # (room for 2), though one member is bound already.
    nodes, groups = _three_nodes_one_bound("only-waiting")
    pods = [pod("w-0", node_name="n1", phase="Running"), *(pod(f"w-{i}") for i in (1, 2, 3))]
    result = plan(state(nodes, pods, groups, topology=TOPOLOGY))
    assert {n.pod.name for n in _of(result, Nominate)} == {"w-1", "w-2"}


def test_rule_bound_members_lower_what_must_be_placed_at_once() -> None:
    # once-satisfied (not reached yet): one bound member counts, so one more is enough when
    # both pending members do not fit.
    nodes, groups = _three_nodes_one_bound(None)
    nodes = nodes[:2]
    pods = [pod("w-0", node_name="n1", phase="Running"), pod("w-1"), pod("w-2")]
    result = plan(state(nodes, pods, groups, topology=TOPOLOGY))
    assert {(n.pod.name, n.node) for n in _of(result, Nominate)} == {("w-1", "n2")}


def test_rule_a_gang_with_more_than_min_member_bound_regrows_and_never_times_out() -> None:
    # waiting-and-running, minMember 1, two bound: satisfied. The recreated member that does
    # not fit waits for room, past the waiting time too, and nothing is evicted.
    groups = [
        pod_group(
            "gang",
            1,
            annotations={"gang.scheduling.koordinator.sh/match-policy": "waiting-and-running"},
            timeout=30,
        )
    ]
    pods = [
        pod("w-0", node_name="node1", phase="Running"),
        pod("w-1", node_name="node2", phase="Running"),
        pod("w-2"),
    ]
    pods[2]["spec"]["nodeSelector"] = {"pool": "nowhere"}
    _created_at_start(*pods)
    result = plan(state(reference_nodes(), pods, groups, topology=TOPOLOGY, now=CREATED + 300))
    assert _reasons(result) == {"Unschedulable"}
    expect_no_actions(result.actions, Disrupt, while_it_has=MarkUnschedulable)


# --- where a satisfied gang's recreated members may go (_confinement) ----------------------


def _recreated_beside_a_full_block(gather: list[dict[str, Any]]) -> Plan:
    """A satisfied gang bound on node1 (block b1); node2, b1's other node, is full; its
    recreated member w-1 asks for a whole node."""
    pods = [
        pod("w-0", node_name="node1", phase="Running"),
        pod("busy", None, node_name="node2", phase="Running", scheduler="x"),
        pod("w-1"),
    ]
    return plan(state(reference_nodes(), pods, _satisfied(gather=gather), topology=TOPOLOGY))


def test_rule_prefer_gather_does_not_confine_a_satisfied_gangs_recreated_member() -> None:
    result = _recreated_beside_a_full_block([{"layer": "BlockLayer", "strategy": "PreferGather"}])
    (nominated,) = expect_actions(result.actions, Nominate, pod__name="w-1")
    assert nominated.node not in {"node1", "node2", ""}


def test_rule_a_satisfied_gang_stays_in_the_domain_of_its_deepest_must_gather_layer() -> None:
    # MustGather on the spine and on the block: the block, the deeper one, confines w-1.
    result = _recreated_beside_a_full_block(
        [
            {"layer": "SpineLayer", "strategy": "MustGather"},
            {"layer": "BlockLayer", "strategy": "MustGather"},
        ]
    )
    expect_no_actions(result.actions, Nominate, while_it_has=MarkUnschedulable)


def test_rule_a_must_gather_layer_the_topology_lacks_does_not_break_the_confinement() -> None:
    # Satisfied before the topology lost AcceleratorLayer: the block still confines w-1, and
    # the missing layer is reported, not a failed pass.
    result = _recreated_beside_a_full_block(
        [
            {"layer": "BlockLayer", "strategy": "MustGather"},
            {"layer": "AcceleratorLayer", "strategy": "MustGather"},
        ]
    )
    expect_no_actions(result.actions, Nominate, while_it_has=MarkUnschedulable)


# --- which nominations are bound (_keeps_gather_rules) --------------------------------------


def test_rule_a_partly_bound_gangs_nomination_inside_its_domain_is_bound() -> None:
    groups = [pod_group("gang", 2, gather=[{"layer": "BlockLayer", "strategy": "PreferGather"}])]
    pods = [pod("w-0", node_name="node1", phase="Running"), pod("w-1", nominated="node2")]
    result = plan(state(reference_nodes(), pods, groups, topology=TOPOLOGY))
    expect_actions(result.actions, Bind, count=1, pod__name="w-1", node="node2")


def test_rule_prefer_gather_nominations_across_blocks_are_bound() -> None:
    # Only MustGather asks the members into one domain: a preference does not refuse them.
    groups = [pod_group("gang", 2, gather=[{"layer": "BlockLayer", "strategy": "PreferGather"}])]
    pods = [pod("w-0", nominated="node1"), pod("w-1", nominated="node3")]
    result = plan(state(reference_nodes(), pods, groups, topology=TOPOLOGY))
    bound = expect_actions(result.actions, Bind, count=2)
    assert {(b.pod.name, b.node) for b in bound} == {("w-0", "node1"), ("w-1", "node3")}


def test_rule_nominations_are_bound_only_inside_one_domain_of_the_deepest_must_gather() -> None:
    # MustGather on spine and block: node1 (b1) and node3 (b2) share a spine, not a block.
    gather = [
        {"layer": "SpineLayer", "strategy": "MustGather"},
        {"layer": "BlockLayer", "strategy": "MustGather"},
    ]
    pods = [pod("w-0", nominated="node1"), pod("w-1", nominated="node3")]
    groups = [pod_group("gang", 2, gather=gather)]
    result = plan(state(reference_nodes(), pods, groups, topology=TOPOLOGY))
    expect_no_actions(result.actions, Bind, while_it_has=Nominate)


def test_rule_a_must_gather_layer_the_topology_lacks_does_not_fail_the_pass_at_bind() -> None:
    gather = [
        {"layer": "BlockLayer", "strategy": "MustGather"},
        {"layer": "AcceleratorLayer", "strategy": "MustGather"},
    ]
    pods = [pod("w-0", nominated="node1"), pod("w-1", nominated="node2"), pod("o-0", "other")]
    groups = [pod_group("gang", 2, gather=gather), pod_group("other", 1)]
    result = plan(state(reference_nodes(), pods, groups, topology=TOPOLOGY))
    expect_actions(result.actions, Nominate, count=1, pod__name="o-0")


def test_rule_a_satisfied_gang_split_over_blocks_binds_its_recreated_member_in_its_domain() -> None:
    # Bound in b1 and b2 (spine s1) before its MustGather on the block: the recreated member,
    # nominated in s1, is bound on its own (no gang check once satisfied).
    pods = [
        pod("w-0", node_name="node1", phase="Running"),
        pod("w-1", node_name="node3", phase="Running"),
        pod("w-2", nominated="node2"),
    ]
    groups = _satisfied(gather=[{"layer": "BlockLayer", "strategy": "MustGather"}])
    result = plan(state(reference_nodes(), pods, groups, topology=TOPOLOGY))
    expect_actions(result.actions, Bind, count=1, pod__name="w-2", node="node2")


def test_rule_a_member_bound_to_a_deleted_node_does_not_fail_the_pass() -> None:
    # w-0's node was deleted (the pod is not gone yet): the gang's nomination is weighed
    # without it, and the pass goes on for every gang.
    gather = [{"layer": "BlockLayer", "strategy": "MustGather"}]
    pods = [
        pod("w-0", node_name="gone", phase="Running"),
        pod("w-1", nominated="node1"),
        pod("o-0", "other"),
    ]
    groups = [pod_group("gang", 2, gather=gather), pod_group("other", 1)]
    result = plan(state(reference_nodes(), pods, groups, topology=TOPOLOGY))
    expect_actions(result.actions, Nominate, count=1, pod__name="o-0")


def test_rule_nominations_are_not_bound_when_the_bound_members_already_split_the_layer() -> None:
    # Not satisfied (2 of minMember 4 bound, in b1 and b2): binding the nominations in b1
    # would leave the gang across two blocks of its MustGather layer.
    gather = [{"layer": "BlockLayer", "strategy": "MustGather"}]
    pods = [
        pod("w-0", gpus=4, node_name="node1", phase="Running"),
        pod("w-1", gpus=4, node_name="node3", phase="Running"),
        pod("w-2", gpus=4, nominated="node2"),
        pod("w-3", gpus=4, nominated="node2"),
    ]
    groups = [pod_group("gang", 4, gather=gather)]
    result = plan(state(reference_nodes(), pods, groups, topology=TOPOLOGY))
    expect_no_actions(result.actions, Bind, while_it_has=Decision)


def test_rule_a_gang_whose_claims_are_being_annotated_is_binding_not_placed_again() -> None:
    # Nominated, its WaitForFirstConsumer claim not yet naming the node: the claim is
    # annotated and the gang waits for it, binding; it is not placed a second time.
    member = pod("w-0", nominated="node1")
    member["spec"]["volumes"] = [{"name": "data", "persistentVolumeClaim": {"claimName": "c"}}]
    claim = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": "c", "namespace": "default", "uid": "uid-pvc-c"},
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": "local",
            "resources": {"requests": {"storage": "10Gi"}},
        },
        "status": {"phase": "Pending"},
    }
    local = {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {"name": "local", "uid": "uid-sc-local"},
        "provisioner": "csi.example.com",
        "volumeBindingMode": "WaitForFirstConsumer",
    }
    result = plan(
        state(
            reference_nodes(),
            [member],
            [pod_group("gang", 1)],
            topology=TOPOLOGY,
            claims=[claim],
            storage_classes=[local],
        )
    )
    expect_actions(result.actions, SelectNode, count=1, claim="c", node="node1")
    expect_no_actions(result.actions, Decision, while_it_has=SelectNode)
    assert result.gang_states == {"default/gang": "binding"}
