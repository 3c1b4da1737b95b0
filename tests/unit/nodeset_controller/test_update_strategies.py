"""Update strategies on the pure planner: OnDelete, and minReadySeconds under RollingUpdate."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from nodeflow_contracts.pod_protocol import ROLLING_DELETE, SCALING_DELETE
from nodeset_controller.planner import CancelDelete, CreatePod, DeletePod, ScheduleDelete, plan
from tests.unit.nodeset_controller.builders import nodeset, pod, slurm
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
