"""Safety rules of gangs that already run or hold reservations (issue #31, placement audit):
a gang that may have been satisfied is never evicted for incompleteness. Each test drives
`plan()` through raw objects."""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.plan_checks import expect_no_actions
from tests.unit.topology_placer.builders import BLOCK, TOPOLOGY, node, pod, pod_group
from tests.unit.topology_placer.simulate import apply, state
from topology_placer.gang import MATCH_POLICY, MIN_AVAILABLE, NAME
from topology_placer.planner import (
    Bind,
    Disrupt,
    MarkUnschedulable,
    Nominate,
    Plan,
    UpdateGroupStatus,
    plan,
)
from topology_placer.status import pod_group_status

CREATED = 1_767_225_600.0  # 2026-01-01T00:00:00Z, the builders' creation time
LONG_AFTER = CREATED + 10_000  # past every waiting time (600s by default)


def _aged(made: dict[str, Any]) -> dict[str, Any]:
    made["metadata"]["creationTimestamp"] = "2026-01-01T00:00:00Z"
    return made


def _annotated(name: str, min_available: int, **kwargs: Any) -> dict[str, Any]:
    """A member of gang "low" declared by pod annotations alone (no PodGroup object)."""
    made = pod(name, None, gpus=8, **kwargs)
    made["metadata"]["annotations"].update({NAME: "low", MIN_AVAILABLE: str(min_available)})
    return _aged(made)


def _incomplete(result: Plan) -> list[Disrupt]:
    return [a for a in result.actions if isinstance(a, Disrupt) and a.reason == "GangIncomplete"]


# --- 1. a gang that may have been satisfied is never evicted for incompleteness --------------


def test_rule_an_annotation_only_gang_never_has_its_running_members_evicted_as_incomplete() -> None:
    # low ran 2 of 2 on n1 and n2; n1 was lost (or low-0 preempted) and its replacement has no
    # room anywhere, long past the waiting time. Nothing durable says low never reached
    # minMember (no PodGroup, so no status): its running member stays, as in Koordinator.
    nodes = [node("n2", "s2", "b3")]
    pods = [_annotated("low-1", 2, node_name="n2", phase="Running"), _annotated("low-0b", 2)]
    result = plan(state(nodes, pods, [], topology=TOPOLOGY, now=LONG_AFTER))
    expect_no_actions(result.actions, Disrupt, while_it_has=MarkUnschedulable)
    assert {m.reason for m in result.actions if isinstance(m, MarkUnschedulable)} == {"GangTimeout"}


def test_rule_a_bound_member_of_a_group_whose_phase_says_satisfied_is_not_evicted() -> None:
    # waiting-and-running: the group reached minMember once (its status says Scheduled, the
    # phase the placer keeps while a satisfied group recovers); w-0 is bound, still starting
    # (not Running), and the replacement w-1 has no room past the waiting time. The recorded
    # phase alone shows the group was satisfied: w-0 stays.
    nodes = [node("n1", "s1", "b1")]
    groups = [
        pod_group(
            "gang",
            2,
            timeout=30,
            annotations={MATCH_POLICY: "waiting-and-running"},
            status={"phase": "Scheduled"},
        )
    ]
    pods = [_aged(pod("w-0", gpus=8, node_name="n1")), _aged(pod("w-1", gpus=8))]
    result = plan(state(nodes, pods, groups, topology=TOPOLOGY, now=LONG_AFTER))
    assert not _incomplete(result)
    assert any(
        m.reason == "GangTimeout" for m in result.actions if isinstance(m, MarkUnschedulable)
    )


def test_rule_a_group_whose_status_proves_it_never_reached_min_member_is_evicted() -> None:
    # The converse, kept: the status (Scheduling) shows the group never had minMember bound, so
    # a timed-out Strict gang's bound member goes even though it runs.
    nodes = [node("n1", "s1", "b1")]
    groups = [pod_group("gang", 2, timeout=30, status={"phase": "Scheduling"})]
    pods = [
        _aged(pod("w-0", gpus=8, node_name="n1", phase="Running")),
        _aged(pod("w-1", gpus=8)),
    ]
    result = plan(state(nodes, pods, groups, topology=TOPOLOGY, now=LONG_AFTER))
    assert [d.pod.name for d in _incomplete(result)] == ["w-0"]


def test_rule_a_satisfied_group_with_no_bound_member_stays_scheduled_while_one_is_nominated() -> (
    None
):
    # Every bound member is gone; the placer nominated a replacement as a satisfied gang's
    # (regrowth) and binds it next: the group must still read as satisfied once that one is
    # bound alone, or its timeout would evict it as a partial bind.
    members = [pod("w-r1", nominated="n3"), pod("w-r2"), pod("w-r3")]
    assert pod_group_status(3, members, {"phase": "Scheduled"}, CREATED)["phase"] == "Scheduled"
    # Nothing bound nor nominated: the record ends, the next placement is all or nothing.
    fresh = [pod("w-r1"), pod("w-r2"), pod("w-r3")]
    assert pod_group_status(3, fresh, {"phase": "Scheduled"}, CREATED)["phase"] == "PreScheduling"


@settings(max_examples=200, deadline=None)
@given(
    size=st.integers(min_value=2, max_value=4),
    declared_by=st.sampled_from(["annotations", "once-satisfied", "waiting-and-running"]),
    spare_nodes=st.integers(min_value=0, max_value=1),
    steps=st.lists(
        st.tuples(
            st.sampled_from(["lose", "lose-node", "recreate", "start"]),
            st.integers(min_value=0, max_value=3),
            st.integers(min_value=1, max_value=2_000),
        ),
        min_size=1,
        max_size=8,
    ),
)
def test_property_a_running_member_of_a_satisfied_gang_is_never_evicted_as_incomplete(
    size: int, declared_by: str, spare_nodes: int, steps: list[tuple[str, int, int]]
) -> None:
    """A gang ran whole; members are then lost (deleted, or their node goes) and recreated,
    with time passing well beyond the waiting time. Whatever happens, no pod that runs is
    evicted with GangIncomplete."""
    nodes = [node(f"n{i}", "s1", "b1") for i in range(size + spare_nodes)]
    groups: list[dict[str, Any]] = []
    if declared_by == "annotations":

        def member(name: str, **kwargs: Any) -> dict[str, Any]:
            return _annotated(name, size, **kwargs)

    else:
        groups.append(
            pod_group(
                "low",
                size,
                timeout=30,
                annotations={MATCH_POLICY: declared_by},
                status={"phase": "Running"},
            )
        )

        def member(name: str, **kwargs: Any) -> dict[str, Any]:
            return _aged(pod(name, "low", gpus=8, **kwargs))

    pods = [member(f"w-{i}", node_name=f"n{i}", phase="Running") for i in range(size)]
    # Filler pods take the spare nodes, so a replacement may find no room.
    pods += [
        _aged(pod(f"busy-{i}", None, gpus=8, node_name=f"n{i}", phase="Running", scheduler="x"))
        for i in range(size, size + spare_nodes)
    ]
    now = CREATED + 60
    serial = 0
    for action, which, elapsed in steps:
        members = [p for p in pods if p["metadata"]["name"].startswith("w-")]
        target = members[which % len(members)] if members else None
        if action in ("lose", "lose-node") and target is not None:
            pods = [p for p in pods if p is not target]
            if action == "lose-node" and target["spec"].get("nodeName"):
                nodes = [n for n in nodes if n["metadata"]["name"] != target["spec"]["nodeName"]]
            serial += 1
            pods.append(member(f"w-r{serial}"))
        elif action == "recreate":
            # A busy node frees up: room for a replacement appears.
            pods = [p for p in pods if not p["metadata"]["name"].startswith("busy-")]
        elif action == "start":
            for p in pods:
                if p["spec"].get("nodeName"):
                    p["status"]["phase"] = "Running"
        now += elapsed
        result = plan(state(nodes, pods, groups, topology=TOPOLOGY, now=now))
        running = {p["metadata"]["name"] for p in pods if p["status"].get("phase") == "Running"}
        assert not [d.pod.name for d in _incomplete(result) if d.pod.name in running]
        for update in result.actions:
            if isinstance(update, UpdateGroupStatus):
                groups[0] = copy.deepcopy(groups[0])
                groups[0]["status"] = dict(update.status)
                version = int(groups[0]["metadata"]["resourceVersion"]) + 1
                groups[0]["metadata"]["resourceVersion"] = str(version)
        pods = apply(pods, result)


# --- 2. preemption and replanning stay in the gang's domain ----------------------------------

BLOCK_MUST = [{"layer": "BlockLayer", "strategy": "MustGather"}]
BLOCK_PREFER = [{"layer": "BlockLayer", "strategy": "PreferGather"}]


def _victims() -> list[dict[str, Any]]:
    """b1's n2 holds a priority-50 pod; b3's nodes hold cheaper priority-1 pods."""
    made = [
        pod("mid", None, gpus=8, node_name="n2", priority=50, owner="midjob"),
        pod("cheap-3", None, gpus=8, node_name="n3", priority=1, owner="cheap3"),
        pod("cheap-4", None, gpus=8, node_name="n4", priority=1, owner="cheap4"),
    ]
    for victim in made:
        victim["metadata"]["ownerReferences"][0]["kind"] = "ReplicaSet"
    return made


def _two_blocks() -> list[dict[str, Any]]:
    return [
        node("n1", "s1", "b1"),
        node("n2", "s1", "b1"),
        node("n3", "s2", "b3"),
        node("n4", "s2", "b3"),
    ]


def test_rule_preemption_for_a_gang_with_bound_members_stays_in_their_must_gather_domain() -> None:
    # w-0 runs in b1; w-1 (recreated, or its bind failed) fits nowhere. Victims in b3 are
    # cheaper, but a preemption there would split the MustGather gang across blocks: the
    # victim is taken in b1, for a satisfied gang and for a partly bound one alike.
    members = [
        pod("w-0", "g", gpus=8, node_name="n1", phase="Running", priority=100),
        pod("w-1", "g", gpus=8, priority=100),
    ]
    for phase in ("Running", "Scheduling"):
        groups = [pod_group("g", 2, gather=BLOCK_MUST, status={"phase": phase})]
        result = plan(state(_two_blocks(), _victims() + members, groups, topology=TOPOLOGY))
        assert [d.pod.name for d in result.actions if isinstance(d, Disrupt)] == ["mid"], phase
        assert [(n.pod.name, n.node) for n in result.actions if isinstance(n, Nominate)] == [
            ("w-1", "n2")
        ], phase


def test_rule_a_failed_bind_replans_the_rest_in_the_bound_members_domain_not_a_tighter_one() -> (
    None
):
    # w-0 is bound in b1; w-1 and w-2 lost their nominations (the node went). b3's n3 would be
    # the tightest fit for them (8 GPUs free against n2's 16), but a partly bound gang stays in
    # the domain of its bound members: they go to n2.
    nodes = [
        node("n1", "s1", "b1"),
        node("n2", "s1", "b1", gpus=16),
        node("n3", "s2", "b3"),
    ]
    groups = [pod_group("gang", 3, gather=BLOCK_PREFER, status={"phase": "Scheduling"})]
    pods = [
        pod("w-0", gpus=8, node_name="n1", phase="Running"),
        pod("w-1", gpus=4, nominated="gone"),
        pod("w-2", gpus=4, nominated="gone"),
    ]
    result = plan(state(nodes, pods, groups, topology=TOPOLOGY))
    nominated = {n.pod.name: n.node for n in result.actions if isinstance(n, Nominate)}
    assert nominated == {"w-1": "n2", "w-2": "n2"}


# --- 3. an invalid gang holds no reservation -------------------------------------------------


def test_rule_a_gang_whose_pod_group_is_deleted_or_invalid_gives_its_nominations_back() -> None:
    # g's members were nominated to n1 and n2; then its PodGroup was deleted, or edited to an
    # invalid waiting time. An invalid gang never times out, so its nominations are cleared
    # now, and on the next pass gang o takes the room they held.
    nodes = [node("n1", "s1", "b1"), node("n2", "s1", "b1")]
    gang = [pod(f"w-{i}", "g", gpus=8, nominated=f"n{i + 1}") for i in range(2)]
    other = [pod("o-0", "o", gpus=8)]
    bad = pod_group("g", 2, annotations={"gang.scheduling.koordinator.sh/waiting-time": "0"})
    for groups in ([pod_group("o", 1)], [bad, pod_group("o", 1)]):
        result = plan(state(nodes, gang + other, groups, topology=TOPOLOGY))
        cleared = {(n.pod.name, n.node) for n in result.actions if isinstance(n, Nominate)}
        assert cleared == {("w-0", ""), ("w-1", "")}
        after = apply(gang + other, result)
        result = plan(state(nodes, after, groups, topology=TOPOLOGY))
        assert [n.pod.name for n in result.actions if isinstance(n, Nominate)] == ["o-0"]


# --- 4. a nomination is bound only when it keeps the gather rules ----------------------------


def test_rule_nominations_that_break_must_gather_are_placed_again_not_bound() -> None:
    # w-0 and w-1 carry nominations in two blocks (left by an older spec, a user, another
    # writer of pod status); both nodes have room. A MustGather(Block) gang is not bound
    # across blocks: it is placed again, inside one.
    nodes = _two_blocks()
    gang = [pod("w-0", "g", gpus=8, nominated="n1"), pod("w-1", "g", gpus=8, nominated="n3")]
    groups = [pod_group("g", 2, gather=BLOCK_MUST)]
    result = plan(state(nodes, gang, groups, topology=TOPOLOGY))
    assert not [b for b in result.actions if isinstance(b, Bind)]
    after = apply(gang, result)
    where = {p["metadata"]["name"]: p["status"]["nominatedNodeName"] for p in after}
    assert {_block(nodes, n) for n in where.values()} == {"b1"}


def test_rule_a_satisfied_gangs_member_nominated_outside_its_domain_is_not_bound_there() -> None:
    # w-0 and w-1 run in b1 (MustGather Block, satisfied); the recreated w-2 carries a
    # nomination to n3 in b3, which has room. It is not bound there: its nomination is cleared
    # and it waits for room in b1.
    nodes = _two_blocks()
    bound = [
        pod("w-0", "g", gpus=8, node_name="n1", phase="Running"),
        pod("w-1", "g", gpus=8, node_name="n2", phase="Running"),
    ]
    stale = pod("w-2", "g", gpus=8, nominated="n3")
    groups = [pod_group("g", 2, gather=BLOCK_MUST, status={"phase": "Running"})]
    result = plan(state(nodes, [*bound, stale], groups, topology=TOPOLOGY))
    assert not [b for b in result.actions if isinstance(b, Bind)]
    assert [(n.pod.name, n.node) for n in result.actions if isinstance(n, Nominate)] == [
        ("w-2", "")
    ]


def _block(nodes: list[dict[str, Any]], name: str) -> str:
    (found,) = [n for n in nodes if n["metadata"]["name"] == name]
    return str(found["metadata"]["labels"][BLOCK])
