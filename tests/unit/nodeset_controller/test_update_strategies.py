"""Update strategies on the pure planner: OnDelete, and minReadySeconds under RollingUpdate."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from nodeflow_contracts.pod_protocol import ROLLING_DELETE, SCALING_DELETE
from nodeset_controller.planner import CancelDelete, CreatePod, DeletePod, ScheduleDelete, plan
from nodeset_controller.spec import parse, resolve_max_unavailable, validate
from tests.unit.nodeset_controller.builders import DEFAULTS, T0, nodeset, pod, slurm
from tests.unit.nodeset_controller.test_planner import KEY, REV, full, nodes, of, view

# --- OnDelete ------------------------------------------------------------------------------


def test_rule_on_delete_template_change_replaces_nothing_until_a_pod_is_deleted() -> None:
    """OnDelete: outdated pods stay; the one deleted by someone else comes back on its node
    with the current template's revision."""
    node_map, pods = full(3, revision="old")
    states = {p["metadata"]["name"]: slurm(p["metadata"]["name"]) for p in pods}
    untouched = plan(view(nodeset(replicas=3, strategy="OnDelete"), node_map, pods, states))
    assert of(untouched, ScheduleDelete) == []
    assert of(untouched, DeletePod) == []
    assert of(untouched, CreatePod) == []
    # Someone deletes gpu-001-002: it is gone from the view.
    after = plan(view(nodeset(replicas=3, strategy="OnDelete"), node_map, [pods[0], pods[2]]))
    (create,) = of(after, CreatePod)
    assert (create.node, create.name, create.revision) == ("n1", "gpu-001-002", REV)
    assert create.pod["metadata"]["labels"]["controller-revision-hash"] == REV
    assert of(after, ScheduleDelete) == []


def test_rule_on_delete_cancels_a_rolling_mark_left_from_a_rolling_update() -> None:
    """A RollingUpdate switched to OnDelete mid-rollout: the pod marked for replacement is
    not deleted (even drained and idle); its mark is cancelled, so its drain is undone."""
    node_map, pods = full(2, revision="old")
    pods[0] = pod("gpu-001-001", "n0", revision="old", delete_reason=ROLLING_DELETE)
    states = {p["metadata"]["name"]: slurm(p["metadata"]["name"]) for p in pods}
    states["gpu-001-001"] = slurm("gpu-001-001", drain=True)
    result = plan(view(nodeset(replicas=2, strategy="OnDelete"), node_map, pods, states))
    assert of(result, DeletePod) == []
    (cancel,) = of(result, CancelDelete)
    assert cancel.pod.name == "gpu-001-001"
    assert "OnDelete" in cancel.why


@st.composite
def on_delete_clusters(draw: st.DrawFn) -> tuple[dict[str, Any], list[dict[str, Any]], Any]:
    """A NodeSet at its replica count (no scale-down), every node fitting the template, its
    pods of any revision, readiness, Slurm state and mark (rolling or none), some
    terminating."""
    count = draw(st.integers(min_value=1, max_value=6))
    node_map = nodes(count, claim=KEY)
    pods: list[dict[str, Any]] = []
    states = {}
    for i in range(count):
        name = f"gpu-001-{i + 1:03d}"
        pods.append(
            pod(
                name,
                f"n{i}",
                revision=draw(st.sampled_from([REV, "old", "older"])),
                ready=draw(st.booleans()),
                delete_reason=draw(st.sampled_from([None, ROLLING_DELETE])),
                terminating=draw(st.booleans()),
            )
        )
        states[name] = slurm(name, busy=draw(st.booleans()), drain=draw(st.booleans()))
    return node_map, pods, states


@given(on_delete_clusters(), st.sampled_from([1, "25%", "100%"]))
def test_rule_on_delete_never_deletes_a_pod_for_a_template_change(
    cluster: tuple[dict[str, Any], list[dict[str, Any]], Any], max_unavailable: int | str
) -> None:
    node_map, pods, states = cluster
    obj = nodeset(replicas=len(node_map), strategy="OnDelete", max_unavailable=max_unavailable)
    result = plan(view(obj, node_map, pods, states))
    assert [a for a in of(result, ScheduleDelete) if a.reason == ROLLING_DELETE] == []
    # A pod is deleted only for a reason other than its revision.
    for delete in of(result, DeletePod):
        assert delete.pod.delete_reason != ROLLING_DELETE
    # Every rolling mark is cancelled.
    marked = {
        p["metadata"]["name"]
        for p in pods
        if "deletionTimestamp" not in p["metadata"]
        and any(c.get("reason") == ROLLING_DELETE for c in p["status"]["conditions"])
    }
    assert {c.pod.name for c in of(result, CancelDelete)} == marked
    assert SCALING_DELETE not in {a.reason for a in of(result, ScheduleDelete)}


# --- minReadySeconds -----------------------------------------------------------------------

MIN_READY = 30


def warming_rollout(ready_for: float, **spec: Any) -> tuple[dict[str, Any], Any]:
    """Four pods, maxUnavailable 1: gpu-001-001 already replaced (the current revision, Ready
    for `ready_for` seconds at T0), the other three outdated and Ready for long."""
    node_map = nodes(4, claim=KEY)
    pods = [pod("gpu-001-001", "n0", revision=REV, ready_since=T0 - ready_for)]
    pods += [
        pod(f"gpu-001-{i + 1:03d}", f"n{i}", revision="old", ready_since=T0 - 3600)
        for i in range(1, 4)
    ]
    states = {p["metadata"]["name"]: slurm(p["metadata"]["name"]) for p in pods}
    obj = nodeset(replicas=4, max_unavailable=1, extra={"minReadySeconds": MIN_READY, **spec})
    return obj, (node_map, pods, states)


def test_rule_min_ready_seconds_a_new_pod_counts_against_the_budget_until_ready_that_long() -> None:
    """The replaced pod has been Ready 10 s of 30: it is not yet available, so it takes the
    whole budget (nothing else is replaced) and numberUnavailable counts it; the plan wakes
    when it becomes available, and then the rollout goes on."""
    obj, (node_map, pods, states) = warming_rollout(10)
    early = plan(view(obj, node_map, pods, states))
    assert of(early, ScheduleDelete) == []
    assert early.wake_at == T0 + MIN_READY - 10
    assert early.status is not None and early.status["numberUnavailable"] == 1
    assert early.status["numberReady"] == 4
    later = plan(view(obj, node_map, pods, states, now=T0 + MIN_READY - 10))
    assert [a.pod.name for a in of(later, ScheduleDelete)] == ["gpu-001-002"]
    assert later.status is not None and later.status["numberUnavailable"] == 0


def test_rule_min_ready_seconds_zero_makes_a_ready_pod_available_at_once() -> None:
    obj, (node_map, pods, states) = warming_rollout(10, minReadySeconds=0)
    result = plan(view(obj, node_map, pods, states))
    assert [a.pod.name for a in of(result, ScheduleDelete)] == ["gpu-001-002"]


def test_rule_min_ready_seconds_ready_since_an_unknown_time_is_not_available() -> None:
    """A Ready condition without lastTransitionTime proves no readiness time: with
    minReadySeconds set the pod is never counted available (fail closed, as Kubernetes)."""
    obj, (node_map, pods, states) = warming_rollout(10)
    pods[0] = pod("gpu-001-001", "n0", revision=REV)
    result = plan(view(obj, node_map, pods, states, now=T0 + 3600))
    assert of(result, ScheduleDelete) == []
    assert result.status is not None and result.status["numberUnavailable"] == 1


def test_rule_min_ready_seconds_must_be_a_non_negative_integer() -> None:
    for bad in (-1, "30", 1.5, True):
        obj = nodeset(replicas=1, extra={"minReadySeconds": bad})
        (problem,) = validate(obj)
        assert (problem.field, problem.reason) == ("spec.minReadySeconds", "InvalidMinReadySeconds")
    assert validate(nodeset(replicas=1, extra={"minReadySeconds": 0})) == []
    assert parse(nodeset(extra={"minReadySeconds": 45}), DEFAULTS).min_ready_seconds == 45
    assert parse(nodeset(), DEFAULTS).min_ready_seconds == 0


@st.composite
def warming_clusters(
    draw: st.DrawFn,
) -> tuple[int, list[dict[str, Any]], list[bool], list[bool]]:
    """Pods of a NodeSet at its replica count, of either revision, Ready or not, Ready for
    various times (or since an unknown time), some marked for rolling replacement; with
    minReadySeconds. Returns minReadySeconds, the pods, and (known to the test, from the
    raw data alone) whether each is available and whether each is marked."""
    min_ready = draw(st.sampled_from([0, 10, 60, 600]))
    count = draw(st.integers(min_value=1, max_value=8))
    pods: list[dict[str, Any]] = []
    available: list[bool] = []
    marked: list[bool] = []
    for i in range(count):
        # Mostly Ready and unmarked: the budget then has room that a warming pod must take.
        ready = draw(st.sampled_from([True, True, True, False]))
        ready_for = draw(st.sampled_from([None, 0, 5, 10, 59, 60, 600, 3600]))
        mark = draw(st.sampled_from([False, False, False, True]))
        pods.append(
            pod(
                f"gpu-001-{i + 1:03d}",
                f"n{i}",
                revision=draw(st.sampled_from([REV, "old"])),
                ready=ready,
                ready_since=None if ready_for is None else T0 - ready_for,
                delete_reason=ROLLING_DELETE if mark else None,
            )
        )
        available.append(
            ready and (min_ready == 0 or (ready_for is not None and ready_for >= min_ready))
        )
        marked.append(mark)
    return min_ready, pods, available, marked


@given(warming_clusters(), st.sampled_from([1, 2, "25%", "50%"]), st.booleans())
def test_rule_min_ready_seconds_never_lets_the_rolling_budget_be_exceeded(
    cluster: tuple[int, list[dict[str, Any]], list[bool], list[bool]],
    max_unavailable: int | str,
    busy: bool,
) -> None:
    """A pod counts as available only once Ready for minReadySeconds: after the plan's new
    rolling marks, the unavailable pods (not available, or marked) are never more than
    maxUnavailable -- or than they already were."""
    min_ready, pods, available, marked = cluster
    count = len(pods)
    node_map = nodes(count, claim=KEY)
    states = {p["metadata"]["name"]: slurm(p["metadata"]["name"], busy=busy) for p in pods}
    obj = nodeset(
        replicas=count, max_unavailable=max_unavailable, extra={"minReadySeconds": min_ready}
    )
    result = plan(view(obj, node_map, pods, states))
    budget = resolve_max_unavailable(max_unavailable, count)
    before = sum(1 for ok, mark in zip(available, marked, strict=True) if not ok or mark)
    newly = {a.pod.name for a in of(result, ScheduleDelete) if a.reason == ROLLING_DELETE}
    after = sum(
        1
        for p, ok, mark in zip(pods, available, marked, strict=True)
        if not ok or mark or p["metadata"]["name"] in newly
    )
    assert after <= max(budget, before)
