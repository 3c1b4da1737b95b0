"""updateStrategy ScheduledUpdate on the pure planner (planner.scheduled_update_holds,
plan_rolling_update): outdated pods are replaced only inside the window, only those whose
Slurm node reads as held by the window's MAINT reservation, through the usual drain -> idle ->
delete, within maxUnavailable; never on a slurmrestd that cannot create reservations."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import msgspec
from hypothesis import given
from hypothesis import strategies as st

from nodeflow_contracts.nodeset import reservation_name
from nodeflow_contracts.pod_protocol import ROLLING_DELETE
from nodeflow_contracts.slurm import SlurmNodeState
from nodeset_controller.planner import CancelDelete, DeletePod, ScheduleDelete, plan
from nodeset_controller.spec import validate
from tests.unit.nodeset_controller.builders import NS, T0, cluster_status, nodeset, pod, slurm
from tests.unit.nodeset_controller.test_planner import full, of, view

START = int(T0) + 3600
END = START + 1800
RESERVATION = reservation_name(NS, "gpu", START)


def scheduled(replicas: int = 3, max_unavailable: Any = None, **window: Any) -> dict[str, Any]:
    stamp = datetime.fromtimestamp(START, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    obj = nodeset(replicas=replicas, strategy="ScheduledUpdate", max_unavailable=max_unavailable)
    obj["spec"]["updateStrategy"]["scheduledUpdate"] = {
        "startTime": stamp,
        "duration": "30m",
        **window,
    }
    return obj


def reserved(name: str, *, busy: bool = False, drain: bool = False) -> SlurmNodeState:
    state = slurm(name, busy=busy, drain=drain)
    return msgspec.structs.replace(
        state, flags=(*state.flags, "Maintenance"), reservation=RESERVATION
    )


def status_speaking(version: str, now: float) -> Any:
    return msgspec.structs.replace(cluster_status(last_success_at=now), api_version=version)


def condition(result: Any) -> dict[str, Any]:
    (found,) = [c for c in result.wanted_status["conditions"] if c["type"] == "ScheduledUpdate"]
    return dict(found)


def test_rule_scheduled_update_replaces_nothing_before_its_window_and_wakes_at_its_start() -> None:
    node_map, pods = full(3, revision="old")
    states = {p["metadata"]["name"]: slurm(p["metadata"]["name"]) for p in pods}
    now = START - 60
    result = plan(
        view(scheduled(), node_map, pods, states, now=now, status=status_speaking("v0.0.45", now))
    )
    assert of(result, ScheduleDelete) == [] and of(result, DeletePod) == []
    assert condition(result)["reason"] == "WindowPending"
    assert RESERVATION in condition(result)["message"]
    # (The Slurm view going stale may wake it sooner.)
    assert result.wake_at is not None and result.wake_at <= START


def test_rule_scheduled_update_replaces_pods_under_its_reservation_within_max_unavailable() -> None:
    node_map, pods = full(3, revision="old")
    names = [p["metadata"]["name"] for p in pods]
    # The third node is not (yet) read as in the reservation: it is not replaced.
    states = {names[0]: reserved(names[0]), names[1]: reserved(names[1]), names[2]: slurm(names[2])}
    now = START + 60
    speaking = status_speaking("v0.0.45", now)
    one = plan(view(scheduled(), node_map, pods, states, now=now, status=speaking))
    assert [a.pod.name for a in of(one, ScheduleDelete)] == [names[0]]
    assert of(one, ScheduleDelete)[0].reason == ROLLING_DELETE
    assert condition(one)["status"] == "True" and condition(one)["reason"] == "WindowOpen"
    assert one.wake_at is not None and one.wake_at <= END
    every = plan(
        view(scheduled(max_unavailable="100%"), node_map, pods, states, now=now, status=speaking)
    )
    assert sorted(a.pod.name for a in of(every, ScheduleDelete)) == names[:2]


def test_rule_scheduled_update_deletes_a_marked_pod_only_once_its_node_is_drained_and_idle() -> (
    None
):
    node_map, pods = full(2, revision="old")
    name = pods[0]["metadata"]["name"]
    pods[0] = pod(name, "n0", revision="old", delete_reason=ROLLING_DELETE)
    now = START + 60
    speaking = status_speaking("v0.0.45", now)
    busy = plan(
        view(
            scheduled(replicas=2),
            node_map,
            pods,
            {name: reserved(name, busy=True, drain=True)},
            now=now,
            status=speaking,
        )
    )
    assert of(busy, DeletePod) == [] and of(busy, CancelDelete) == []
    idle = plan(
        view(
            scheduled(replicas=2),
            node_map,
            pods,
            {name: reserved(name, drain=True)},
            now=now,
            status=speaking,
        )
    )
    assert [a.pod.name for a in of(idle, DeletePod)] == [name]


def test_rule_scheduled_update_cancels_its_marks_once_the_window_is_over() -> None:
    node_map, pods = full(2, revision="old")
    name = pods[0]["metadata"]["name"]
    pods[0] = pod(name, "n0", revision="old", delete_reason=ROLLING_DELETE)
    now = END + 1
    states = {name: slurm(name, drain=True, busy=True)}
    result = plan(
        view(
            scheduled(replicas=2),
            node_map,
            pods,
            states,
            now=now,
            status=status_speaking("v0.0.45", now),
        )
    )
    (cancel,) = of(result, CancelDelete)
    assert cancel.pod.name == name and "window closed" in cancel.why
    assert of(result, ScheduleDelete) == [] and condition(result)["reason"] == "WindowOver"


def test_rule_scheduled_update_without_reservation_writes_replaces_nothing_and_says_so() -> None:
    """Slurm 24.11's slurmrestd (v0.0.42) cannot create the reservation: fail closed, even if
    the nodes read as in someone's maintenance reservation of that name."""
    node_map, pods = full(2, revision="old")
    states = {p["metadata"]["name"]: reserved(p["metadata"]["name"]) for p in pods}
    now = START + 60
    for version in ("v0.0.42", ""):
        result = plan(
            view(
                scheduled(replicas=2),
                node_map,
                pods,
                states,
                now=now,
                status=status_speaking(version, now),
            )
        )
        assert of(result, ScheduleDelete) == [] and of(result, DeletePod) == []
        found = condition(result)
        assert found["status"] == "False"
        if version:
            assert found["reason"] == "ReservationsUnsupported"
            assert "v0.0.42" in found["message"] and "v0.0.43" in found["message"]
        else:
            assert found["reason"] == "SlurmApiVersionUnknown"


def test_rule_scheduled_update_on_a_slurmrestd_version_it_does_not_know_replaces_nothing() -> None:
    """A version this controller has no record of (a newer slurm-syncer's): fail closed, and
    the condition names the version rather than saying none was reported."""
    node_map, pods = full(2, revision="old")
    states = {p["metadata"]["name"]: reserved(p["metadata"]["name"]) for p in pods}
    now = START + 60
    result = plan(
        view(
            scheduled(replicas=2),
            node_map,
            pods,
            states,
            now=now,
            status=status_speaking("v0.0.99", now),
        )
    )
    assert of(result, ScheduleDelete) == [] and of(result, DeletePod) == []
    found = condition(result)
    assert (found["status"], found["reason"]) == ("False", "SlurmApiVersionUnknown")
    assert "v0.0.99" in found["message"]


def test_rule_scheduled_update_spec_needs_an_rfc3339_start_whole_minutes_and_known_flags() -> None:
    assert validate(scheduled()) == []
    bad_start = scheduled(startTime="2026-12-01 02:00")
    assert [p.reason for p in validate(bad_start)] == ["InvalidScheduledUpdate"]
    assert [p.reason for p in validate(scheduled(duration="90s"))] == ["InvalidScheduledUpdate"]
    (flag,) = validate(scheduled(flags=["MAINT", "NOPE"]))
    assert flag.field == "spec.updateStrategy.scheduledUpdate.flags" and "NOPE" in flag.message


def test_rule_scheduled_update_refuses_a_recurring_flag_its_one_window_would_not_honour() -> None:
    (recurring,) = validate(scheduled(flags=["FLEX", "daily"]))
    assert recurring.field == "spec.updateStrategy.scheduledUpdate.flags"
    assert recurring.reason == "InvalidScheduledUpdate" and "DAILY" in recurring.message
    assert validate(scheduled(flags=["FLEX"])) == []


@st.composite
def scheduled_clusters(
    draw: st.DrawFn,
) -> tuple[Any, list[dict[str, Any]], dict[str, Any], float, str]:
    count = draw(st.integers(min_value=1, max_value=5))
    node_map, pods = full(count, revision="old")
    states: dict[str, Any] = {}
    for i, raw in enumerate(pods):
        name = raw["metadata"]["name"]
        pods[i] = pod(
            name,
            f"n{i}",
            revision=draw(st.sampled_from(["old", "older"])),
            ready=draw(st.booleans()),
            delete_reason=draw(st.sampled_from([None, ROLLING_DELETE])),
        )
        kind = draw(st.sampled_from(["reserved", "plain", "unknown", "absent"]))
        busy, drain = draw(st.booleans()), draw(st.booleans())
        if kind == "reserved":
            states[name] = reserved(name, busy=busy, drain=drain)
        elif kind == "plain":
            states[name] = slurm(name, busy=busy, drain=drain)
        elif kind == "unknown":
            states[name] = slurm(name, known=False)
    now = draw(st.sampled_from([START - 1, START, START + 900, END - 1, END, END + 60]))
    version = draw(st.sampled_from(["v0.0.41", "v0.0.42", "v0.0.43", "v0.0.45", ""]))
    return node_map, pods, states, now, version


@given(scheduled_clusters())
def test_rule_scheduled_update_never_marks_outside_its_window_or_reservation_nor_deletes_busy(
    cluster: tuple[Any, list[dict[str, Any]], dict[str, Any], float, str],
) -> None:
    node_map, pods, states, now, version = cluster
    obj = scheduled(replicas=len(pods), max_unavailable="100%")
    result = plan(view(obj, node_map, pods, states, now=now, status=status_speaking(version, now)))
    open_window = START <= now < END and version in ("v0.0.43", "v0.0.45")
    for action in of(result, ScheduleDelete):
        state = states.get(action.pod.name)
        assert open_window
        assert state is not None and state.known and state.reservation == RESERVATION
    for action in of(result, DeletePod):
        state = states.get(action.pod.name)
        assert state is not None and state.known and not state.busy
        if action.pod.delete_reason == ROLLING_DELETE:
            assert open_window and state.reservation == RESERVATION


def test_rule_scheduled_update_deletes_a_marked_pod_only_while_its_node_reads_as_reserved() -> None:
    """The reservation is gone (deleted in Slurm by hand, or the node left it) while the
    window is still open: the marked, drained, idle pod keeps its mark but is not deleted
    until its node reads as held again; the rollout says why."""
    node_map, pods = full(2, revision="old")
    name = pods[0]["metadata"]["name"]
    pods[0] = pod(name, "n0", revision="old", delete_reason=ROLLING_DELETE)
    now = START + 60
    speaking = status_speaking("v0.0.45", now)
    for state in (slurm(name, drain=True), slurm(name, known=False)):
        held = plan(
            view(scheduled(replicas=2), node_map, pods, {name: state}, now=now, status=speaking)
        )
        assert of(held, DeletePod) == [] and of(held, CancelDelete) == []
        assert [(w.pod, w.cause) for w in held.rollout_waits if w.pod == name] == [
            (name, "ReservationPending")
        ]
    back = plan(
        view(
            scheduled(replicas=2),
            node_map,
            pods,
            {name: reserved(name, drain=True)},
            now=now,
            status=speaking,
        )
    )
    assert [a.pod.name for a in of(back, DeletePod)] == [name]
