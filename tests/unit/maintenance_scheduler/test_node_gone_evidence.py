"""A node is gone on evidence, never on one view that lacks it: the k8s_nodes view can lack a
live node (k8s-watcher's label selector turns a node whose labels stop matching into a KV
delete). Another uid under the name is evidence at once; an absence only once it has lasted
NODE_GONE_GRACE_SECONDS. Until then a request in progress keeps its slot, counts as
unavailable and keeps its finalizer, and nothing is uncordoned for it. Also: only the Node
ownerReference naming spec.nodeName binds a request, a node read without a uid is no verdict,
and an invalid request on a gone node still loses its finalizer."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from maintenance_scheduler.actions import PatchRequest, SetStatus, UncordonNode
from maintenance_scheduler.api import (
    INITIAL_STATE_ANNOTATION,
    IntOrPercent,
    NodeMaintenance,
    OperatorConfig,
)
from maintenance_scheduler.config import MaintenanceSchedulerConfig
from maintenance_scheduler.reconcile import Step, reconcile_request
from maintenance_scheduler.scheduler import (
    NodeInfo,
    names_absent_past_grace,
    schedule,
    track_absences,
)
from nodeflow_kube.fields import condition
from nodeflow_runtime.config import ConfigError, load_config
from tests.unit.maintenance_scheduler.builders import T0, nm, node_facts, node_info, node_owner

OURS = {INITIAL_STATE_ANNOTATION: "false"}
GRACE = 300.0


def parallel(limit: int, unavailable: int | None = None) -> OperatorConfig:
    return OperatorConfig(
        max_parallel_operations=IntOrPercent(limit),
        max_unavailable=None if unavailable is None else IntOrPercent(unavailable),
    )


def finalizer_dropped(step: Step) -> bool:
    return any(
        isinstance(a, PatchRequest) and a.finalizers is not None and not a.finalizers
        for a in step.actions
    )


def test_rule_a_view_gap_frees_no_parallel_slot() -> None:
    """n1 drains (the one slot); the view lacks n1 for a round: r2 is not scheduled."""
    draining = nm("r1", "n1", phase="Draining", finalizer=True, drainSpec={"force": True})
    waiting = nm("r2", "n2", phase="Pending")
    gap = {"n2": node_info("n2"), "n3": node_info("n3")}
    result = schedule(gap, [draining, waiting], parallel(1))
    assert result.scheduled == []
    assert result.under_maintenance == 1
    assert [s.reason for s in result.skipped] == ["no-slot"]


def test_rule_a_view_gap_keeps_the_node_unavailable() -> None:
    """maxUnavailable 1 is spent by r1's node; a gap in the view must not give it back."""
    draining = nm("r1", "n1", phase="Draining", finalizer=True)
    waiting = nm("r2", "n2", phase="Pending")
    gap = {"n2": node_info("n2"), "n3": node_info("n3")}
    result = schedule(gap, [draining, waiting], parallel(5, unavailable=1))
    assert result.scheduled == []
    assert result.can_become_unavailable == 0


def test_rule_an_absence_past_the_grace_frees_the_slot() -> None:
    draining = nm("r1", "n1", phase="Draining", finalizer=True)
    waiting = nm("r2", "n2", phase="Pending")
    gap = {"n2": node_info("n2"), "n3": node_info("n3")}
    result = schedule(gap, [draining, waiting], parallel(1), absent_past_grace={"n1"})
    assert [r.name for r in result.scheduled] == ["r2"]


def test_rule_a_view_gap_keeps_the_finalizer_of_a_request_in_progress() -> None:
    request = nm("r1", "n1", phase="Draining", finalizer=True, drainSpec={"force": True})
    step = reconcile_request(request, None, [], [request], T0)
    assert step.actions == []
    step = reconcile_request(request, None, [], [request], T0, absent_past_grace=True)
    assert finalizer_dropped(step)


def test_rule_a_request_deleted_during_a_view_gap_keeps_the_node_cordoned_until_it_is_seen() -> (
    None
):
    """Deleted while the view lacks its node: the finalizer stays, so once the node is seen
    again it is uncordoned (dropping the finalizer in the gap would leave it cordoned)."""
    request = nm("r1", "n1", phase="Draining", finalizer=True, deleting=True, annotations=OURS)
    step = reconcile_request(request, None, [], [request], T0)
    assert step.actions == []
    cordoned = node_facts("n1", unschedulable=True)
    step = reconcile_request(request, cordoned, [], [request], T0 + 1)
    assert [a.node for a in step.actions if isinstance(a, UncordonNode)] == ["n1"]
    assert not finalizer_dropped(step)


def test_rule_a_pending_request_on_an_absent_node_says_so_and_is_not_scheduled() -> None:
    request = nm("r", "ghost", phase="Pending")
    step = reconcile_request(request, None, [], [request], T0)
    (status,) = [a for a in step.actions if isinstance(a, SetStatus)]
    ready = condition({"status": status.status}, "Ready")
    assert ready is not None and ready["message"] == "node ghost does not exist"


def test_rule_only_the_node_owner_of_spec_node_name_binds_the_request() -> None:
    """An ownerReference to Node n1 on a request for n2 says nothing about n2: the request is
    scheduled on n2, and n2 is added as its owner beside the other reference."""
    foreign = node_owner("n1")
    request = nm("r", "n2", phase="Pending", owners=(foreign,))
    assert request.node_owner_uid is None
    assert request.meant_for("uid-n2") is True
    result = schedule({"n2": node_info("n2")}, [request], OperatorConfig())
    assert [r.name for r in result.scheduled] == ["r"]
    unowned = nm("r", "n2", owners=(foreign,))
    step = reconcile_request(unowned, node_facts("n2"), [], [unowned], T0)
    (patch,) = [a for a in step.actions if isinstance(a, PatchRequest)]
    assert patch.owner_references is not None
    assert sorted(str(ref["uid"]) for ref in patch.owner_references) == ["uid-n1", "uid-n2"]


def test_rule_a_node_read_without_a_uid_is_no_verdict() -> None:
    """An empty uid is unknown, not another node: the request keeps its slot and its
    finalizer, and nothing is done on that node for it."""
    assert nm("r", "n1").meant_for("") is None
    nodes = {n: NodeInfo(name=n, unschedulable=False, ready=True, uid="") for n in ("n1", "n2")}
    requests = [nm("r1", "n1", phase="Draining", finalizer=True), nm("r2", "n2", phase="Pending")]
    result = schedule(nodes, requests, parallel(1))
    assert result.scheduled == [] and result.under_maintenance == 1
    request = nm("r1", "n1", phase="Draining", finalizer=True, deleting=True, annotations=OURS)
    uidless = dataclasses.replace(node_facts("n1", unschedulable=True), uid="")
    step = reconcile_request(request, uidless, [], [request], T0)
    assert step.actions == []
    cordon = nm("r1", "n1", phase="Cordon", finalizer=True, annotations=OURS)
    step = reconcile_request(cordon, dataclasses.replace(node_facts("n1"), uid=""), [], [], T0)
    assert step.actions == []


def test_rule_node_info_needs_a_uid() -> None:
    with pytest.raises(TypeError):
        NodeInfo(name="n1", unschedulable=False, ready=True)  # type: ignore[call-arg]


def test_rule_an_invalid_request_on_a_gone_node_loses_its_finalizer() -> None:
    request = nm(
        "r",
        "n1",
        phase="Draining",
        finalizer=True,
        drainSpec={"force": True, "podEvictionFilters": [{}]},
    )
    assert request.problems
    step = reconcile_request(request, None, [], [request], T0, absent_past_grace=True)
    assert finalizer_dropped(step)
    # Within the grace it stops in its phase, keeping its finalizer.
    step = reconcile_request(request, None, [], [request], T0)
    assert not finalizer_dropped(step)


def test_rule_absence_is_timed_from_the_first_round_without_the_node_and_restarts() -> None:
    absent = track_absences({}, ["n1", "n2"], ["n2"], T0)
    assert absent == {"n1": T0}
    absent = track_absences(absent, ["n1", "n2"], ["n2"], T0 + GRACE - 1)
    assert names_absent_past_grace(absent, T0 + GRACE - 1, GRACE) == frozenset()
    assert names_absent_past_grace(absent, T0 + GRACE, GRACE) == {"n1"}
    # Seen again: a later absence starts over.
    absent = track_absences(absent, ["n1", "n2"], ["n1", "n2"], T0 + GRACE + 1)
    absent = track_absences(absent, ["n1", "n2"], ["n2"], T0 + GRACE + 2)
    assert names_absent_past_grace(absent, T0 + 2 * GRACE, GRACE) == frozenset()


def test_rule_node_gone_grace_refuses_a_negative_value() -> None:
    assert MaintenanceSchedulerConfig().node_gone_grace_seconds == GRACE
    with pytest.raises(ConfigError):
        load_config(MaintenanceSchedulerConfig, {"NODE_GONE_GRACE_SECONDS": "-1"})


ROUND_SECONDS = 60.0
# With a round a minute, an absence of up to five rounds is seen for at most four minutes.
LONGEST_GAP_ROUNDS = int(GRACE // ROUND_SECONDS)


@st.composite
def gappy_views(draw: st.DrawFn) -> tuple[int, int, list[list[bool]]]:
    nodes = draw(st.integers(min_value=2, max_value=6))
    limit = draw(st.integers(min_value=1, max_value=3))
    rounds = draw(st.integers(min_value=2, max_value=14))
    presence = [[True] * nodes for _ in range(rounds)]
    for node in range(nodes):
        for start, length in draw(
            st.lists(
                st.tuples(
                    st.integers(min_value=0, max_value=rounds - 1),
                    st.integers(min_value=1, max_value=LONGEST_GAP_ROUNDS),
                ),
                max_size=3,
            )
        ):
            for index in range(start, min(rounds, start + length)):
                presence[index][node] = False
    # Overlapping gaps may join into one longer than the grace: cut each run to the longest.
    for node in range(nodes):
        run = 0
        for index in range(rounds):
            run = 0 if presence[index][node] else run + 1
            if run > LONGEST_GAP_ROUNDS:
                presence[index][node] = True
                run = 0
    return nodes, limit, presence


@settings(max_examples=200, deadline=None)
@given(case=gappy_views(), deleting=st.sets(st.integers(min_value=0, max_value=5)))
def test_property_view_gaps_shorter_than_the_grace_neither_overshoot_nor_drop_a_finalizer(
    case: tuple[int, int, list[list[bool]]], deleting: set[int]
) -> None:
    """Every node exists throughout; the view lacks some for less than the grace. Every
    round, at most maxParallelOperations requests are in maintenance, and no finalizer is
    dropped while the view lacks the request's node."""
    node_count, limit, presence = case
    names = [f"n{i}" for i in range(node_count)]
    requests: dict[str, NodeMaintenance] = {
        name: nm(f"r-{name}", name, requestor=f"{name}.example.com", phase="Pending")
        for name in names
    }
    absent_since: dict[str, float] = {}
    for index, present in enumerate(presence):
        now = T0 + index * ROUND_SECONDS
        in_view = [name for name, shown in zip(names, present, strict=True) if shown]
        absent_since = track_absences(absent_since, names, in_view, now)
        gone = names_absent_past_grace(absent_since, now, GRACE)
        assert gone == frozenset()
        infos = {name: node_info(name) for name in in_view}
        result = schedule(infos, requests.values(), parallel(limit), absent_past_grace=gone)
        for scheduled in result.scheduled:
            name = scheduled.node_name
            # Scheduled, then deleted (if drawn so): cleanup must wait for the node.
            requests[name] = nm(
                scheduled.name,
                name,
                requestor=f"{name}.example.com",
                phase="Scheduled",
                finalizer=True,
                deleting=names.index(name) in deleting,
                annotations=OURS,
            )
        assert sum(r.in_progress for r in requests.values()) <= limit
        for name, request in requests.items():
            if name in in_view:
                continue
            step = reconcile_request(
                request, None, [], [request], now, absent_past_grace=name in gone
            )
            assert not finalizer_dropped(step), (request.key, request.phase)
            assert not any(isinstance(a, UncordonNode) for a in step.actions)
