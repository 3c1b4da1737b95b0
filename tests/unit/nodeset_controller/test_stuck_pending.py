"""Rule 7a: a pod no kubelet has, Pending on a node that no longer fits it (other pods took
its room after it was created), is replaced on a free feasible node after a bounded wait
(issue 28 item 5). Never bound, it ran no slurmd: it goes without a drain."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

from nodeflow_contracts.pod_protocol import MISSCHEDULED_DELETE
from nodeset_controller.commands import to_outgoing
from nodeset_controller.planner import (
    CancelDelete,
    Claim,
    CreatePod,
    DeletePod,
    Plan,
    ScheduleDelete,
    plan,
)
from nodeset_controller.podspec import pinned_affinity
from nodeset_controller.spec import parse
from tests.unit.nodeset_controller.builders import DEFAULTS, T0, nodeset, pod
from tests.unit.nodeset_controller.test_planner import KEY, REV, nodes, of, view

WAIT = 120.0
# What other pods request on n0: with our pod's 2 CPUs, more than its 8.
OTHERS_ON_N0 = Fraction(7)


def stuck_pod(*, created: float, marked: bool = False, bound: bool = False) -> dict[str, Any]:
    raw = pod(
        "gpu-001-001",
        "n0" if bound else None,
        revision=REV,
        ready=False,
        phase="Pending",
        created=created,
        delete_reason=MISSCHEDULED_DELETE if marked else None,
    )
    raw["spec"]["affinity"] = pinned_affinity(None, "n0")
    return raw


def plan_with(
    raw: dict[str, Any], *, replicas: int | None = 1, free_nodes: int = 1, now: float = T0
) -> Plan:
    node_map = nodes(1 + free_nodes)
    node_map["n0"]["metadata"]["annotations"] = {"nodeflow.dev/nodeset": KEY}
    requested = {"n0": {"cpu": OTHERS_ON_N0 + 2}}
    result = plan(
        view(nodeset(replicas=replicas), node_map, [raw], {}, now=now, requested=requested)
    )
    return result


def test_rule_a_pod_stuck_pending_on_a_full_node_is_replaced_on_a_free_one() -> None:
    result = plan_with(stuck_pod(created=T0 - WAIT))
    scheduled = [(a.pod.name, a.reason) for a in of(result, ScheduleDelete)]
    assert scheduled == [("gpu-001-001", MISSCHEDULED_DELETE)]
    assert [c.node for c in of(result, Claim)] == ["n1"]
    # Marked: it goes at once (never bound), its delete refused if a kubelet took it since.
    marked = plan_with(stuck_pod(created=T0 - WAIT, marked=True))
    (delete,) = of(marked, DeletePod)
    assert (delete.pod.name, delete.reason, delete.forced) == ("gpu-001-001", "NeverStarted", False)
    spec = parse(nodeset(replicas=1), DEFAULTS)
    target = to_outgoing(spec, delete, T0).command.target
    assert (target.uid, target.resource_version) == ("uid-gpu-001-001", "5")
    assert of(marked, CancelDelete) == []


def test_rule_a_stuck_pod_waits_the_bounded_time_first() -> None:
    young = plan_with(stuck_pod(created=T0 - 30))
    assert of(young, ScheduleDelete) == []
    assert young.wake_at == T0 - 30 + WAIT


def test_rule_a_stuck_pod_stays_without_a_free_node_or_once_bound() -> None:
    alone = plan_with(stuck_pod(created=T0 - 10 * WAIT), free_nodes=0)
    assert of(alone, ScheduleDelete) == []
    # Every feasible node is wanted anyway (replicas unset): nothing to gain by moving.
    everywhere = plan_with(stuck_pod(created=T0 - 10 * WAIT), replicas=None)
    assert of(everywhere, ScheduleDelete) == []
    assert [c.node for c in of(everywhere, Claim)] == ["n1"]
    # A kubelet took it meanwhile: it may run slurmd now, the mark is cancelled.
    bound = plan_with(stuck_pod(created=T0 - 10 * WAIT, marked=True, bound=True))
    assert [c.pod.name for c in of(bound, CancelDelete)] == ["gpu-001-001"]
    assert of(bound, DeletePod) == []


def test_rule_a_marked_stuck_pod_keeps_leaving_when_the_free_node_is_taken() -> None:
    """The free node taken by another NodeSet meanwhile: no flapping, the pod still goes."""
    result = plan_with(stuck_pod(created=T0 - WAIT, marked=True), free_nodes=0)
    assert [d.reason for d in of(result, DeletePod)] == ["NeverStarted"]
    assert of(result, CreatePod) == []
