"""Issue 35 item 1: what holds a scale-down or a rollout is on the NodeSet where kubectl looks.
ScaleDownWaiting and RolloutWaiting are True while pods the NodeSet wants gone cannot be
removed yet (reason: the most blocking cause; message: the pods and why each waits), False
(NoneWaiting) when nothing waits; the planner hands the waits over as data (`Plan`), status.py
makes the conditions, and an unchanged cluster writes no status."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from nodeflow_contracts.pod_protocol import ROLLING_DELETE, SCALING_DELETE
from nodeset_controller.planner import plan
from nodeset_controller.status import (
    NAMED_WAITS,
    ROLLOUT_WAITING,
    SCALE_DOWN_WAITING,
    WAIT_ORDER,
    PodWait,
    waiting_condition,
)
from tests.unit.nodeset_controller.builders import T0, nodeset, pod, slurm
from tests.unit.nodeset_controller.test_planner import REV, full, view


def _condition(status: dict[str, Any], kind: str) -> dict[str, Any]:
    found: list[dict[str, Any]] = [c for c in status["conditions"] if c["type"] == kind]
    (only,) = found
    return only


def _busy_scale_down() -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, Any]]:
    """Three pods, scaled down to two: gpu-001-003 is marked and its node runs jobs."""
    node_map, pods = full(3)
    pods[2] = pod("gpu-001-003", "n2", revision=REV, delete_reason=SCALING_DELETE)
    states = {p["metadata"]["name"]: slurm(p["metadata"]["name"]) for p in pods}
    states["gpu-001-003"] = slurm("gpu-001-003", busy=True, drain=True)
    return node_map, pods, states


def test_rule_scale_down_waiting_names_the_busy_pod_it_cannot_delete() -> None:
    node_map, pods, states = _busy_scale_down()
    result = plan(view(nodeset(replicas=2, generation=7), node_map, pods, states))
    assert [(w.pod, w.cause) for w in result.scale_down_waits] == [("gpu-001-003", "PodsBusy")]
    assert result.status is not None
    waiting = _condition(result.status, SCALE_DOWN_WAITING)
    assert (waiting["status"], waiting["reason"]) == ("True", "PodsBusy")
    assert waiting["message"] == "1 pod waits: gpu-001-003 (node busy with jobs, draining)"
    # metav1.Condition: the generation the condition was computed from.
    assert waiting["observedGeneration"] == 7
    assert _condition(result.status, ROLLOUT_WAITING)["status"] == "False"


def test_rule_scale_down_waiting_names_a_pod_marked_by_this_plan_as_it_will_wait() -> None:
    """A pod chosen for the scale-down in this plan waits as it will once the mark lands, so
    the condition does not change again when it does."""
    node_map, pods = full(3)
    states = {p["metadata"]["name"]: slurm(p["metadata"]["name"], busy=True) for p in pods}
    result = plan(view(nodeset(replicas=2), node_map, pods, states))
    assert result.status is not None
    waiting = _condition(result.status, SCALE_DOWN_WAITING)
    assert (waiting["status"], waiting["reason"]) == ("True", "PodsBusy")
    assert "(node busy with jobs, not draining yet)" in waiting["message"]


def test_rule_scale_down_waiting_reason_is_the_most_blocking_cause() -> None:
    """A pod whose Slurm state is unknown holds more than one that is busy: the reason says
    SlurmStateUnknown and that pod is named first."""
    node_map, pods = full(4)
    for index in (2, 3):
        name = f"gpu-001-{index + 1:03d}"
        pods[index] = pod(name, f"n{index}", revision=REV, delete_reason=SCALING_DELETE)
    states = {p["metadata"]["name"]: slurm(p["metadata"]["name"]) for p in pods}
    states["gpu-001-003"] = slurm("gpu-001-003", busy=True)
    states["gpu-001-004"] = slurm("gpu-001-004", known=False)
    result = plan(view(nodeset(replicas=2), node_map, pods, states))
    assert result.status is not None
    waiting = _condition(result.status, SCALE_DOWN_WAITING)
    assert (waiting["status"], waiting["reason"]) == ("True", "SlurmStateUnknown")
    assert waiting["message"] == (
        "2 pods wait: gpu-001-004 (Slurm state unknown), "
        "gpu-001-003 (node busy with jobs, not draining yet)"
    )


def test_rule_rollout_waiting_budget_exhausted_names_the_pods_held_by_max_unavailable() -> None:
    """maxUnavailable 1, spent by a replacement not Ready yet: the three outdated Ready pods
    wait for the budget, and the message gives its figures."""
    node_map, pods = full(4, revision="old")
    pods[0] = pod("gpu-001-001", "n0", revision=REV, ready=False)
    states = {p["metadata"]["name"]: slurm(p["metadata"]["name"]) for p in pods}
    result = plan(view(nodeset(replicas=4, max_unavailable=1), node_map, pods, states))
    assert result.status is not None
    waiting = _condition(result.status, ROLLOUT_WAITING)
    assert (waiting["status"], waiting["reason"]) == ("True", "BudgetExhausted")
    for name in ("gpu-001-002", "gpu-001-003", "gpu-001-004"):
        assert f"{name} (held by maxUnavailable)" in waiting["message"]
    assert waiting["message"].endswith("; unavailable 1 of at most 1 (maxUnavailable)")
    assert _condition(result.status, SCALE_DOWN_WAITING)["status"] == "False"


def test_rule_rollout_waiting_names_a_marked_pod_whose_node_still_runs_jobs() -> None:
    node_map, pods = full(2, revision="old")
    pods[0] = pod("gpu-001-001", "n0", revision="old", delete_reason=ROLLING_DELETE)
    states = {p["metadata"]["name"]: slurm(p["metadata"]["name"]) for p in pods}
    states["gpu-001-001"] = slurm("gpu-001-001", busy=True, drain=True)
    result = plan(view(nodeset(replicas=2, max_unavailable=1), node_map, pods, states))
    assert result.status is not None
    waiting = _condition(result.status, ROLLOUT_WAITING)
    assert (waiting["status"], waiting["reason"]) == ("True", "PodsBusy")
    assert "gpu-001-001 (node busy with jobs, draining)" in waiting["message"]
    assert "gpu-001-002 (held by maxUnavailable)" in waiting["message"]


def test_rule_nothing_waiting_gives_false_none_waiting() -> None:
    node_map, pods = full(3)
    states = {p["metadata"]["name"]: slurm(p["metadata"]["name"]) for p in pods}
    result = plan(view(nodeset(replicas=3), node_map, pods, states))
    assert result.status is not None
    for kind in (SCALE_DOWN_WAITING, ROLLOUT_WAITING):
        entry = _condition(result.status, kind)
        assert (entry["status"], entry["reason"]) == ("False", "NoneWaiting")


def test_rule_waiting_message_stable_when_nothing_changed_so_no_status_write() -> None:
    """The busy pod still holds the scale-down ten minutes on, with nothing else changed:
    the condition is the same byte for byte and no status is written."""
    node_map, pods, states = _busy_scale_down()
    first = plan(view(nodeset(replicas=2), node_map, pods, states))
    assert first.status is not None
    later = plan(
        view(nodeset(replicas=2, status=first.status), node_map, pods, states, now=T0 + 600)
    )
    assert later.status is None
    assert _condition(later.wanted_status, SCALE_DOWN_WAITING) == _condition(
        first.status, SCALE_DOWN_WAITING
    )
    # The job ends and the node is drained: the pod is deleted and nothing waits any more.
    states["gpu-001-003"] = slurm("gpu-001-003", drain=True)
    done = plan(
        view(nodeset(replicas=2, status=first.status), node_map, pods, states, now=T0 + 1200)
    )
    assert done.status is not None
    assert _condition(done.status, SCALE_DOWN_WAITING)["status"] == "False"


def test_rule_invalid_spec_keeps_the_waiting_conditions_as_they_were() -> None:
    """An invalid spec looks at no pod: what it last said of the waits stays."""
    node_map, pods, states = _busy_scale_down()
    first = plan(view(nodeset(replicas=2), node_map, pods, states))
    assert first.status is not None
    broken = nodeset(replicas=2, status=first.status, extra={"slurmCluster": ""})
    result = plan(view(broken, node_map, pods, states))
    assert (
        _condition(result.wanted_status, SCALE_DOWN_WAITING)["message"]
        == (_condition(first.status, SCALE_DOWN_WAITING)["message"])
    )


_WAITS = st.lists(
    st.builds(
        PodWait,
        st.sampled_from([f"p{i}" for i in range(12)]),
        st.sampled_from(WAIT_ORDER),
        st.sampled_from(["a", "b"]),
    ),
    max_size=12,
    unique_by=lambda w: w.pod,
)


@given(_WAITS, st.randoms())
def test_rule_waiting_condition_is_order_free_bounded_and_led_by_the_most_blocking(
    waits: list[PodWait], shuffler: Any
) -> None:
    """Whatever order the phases record waits in, the condition is the same (no rewrite for
    a reordering), its reason is the most blocking cause, and it names at most NAMED_WAITS
    pods."""
    condition = waiting_condition(SCALE_DOWN_WAITING, waits, idle="none")
    shuffled = list(waits)
    shuffler.shuffle(shuffled)
    assert waiting_condition(SCALE_DOWN_WAITING, shuffled, idle="none") == condition
    if not waits:
        assert (condition.status, condition.reason) == ("False", "NoneWaiting")
        return
    assert condition.status == "True"
    assert condition.reason == min((w.cause for w in waits), key=WAIT_ORDER.index)
    assert sum(condition.message.count(f"{w.pod} (") for w in waits) == min(len(waits), NAMED_WAITS)
