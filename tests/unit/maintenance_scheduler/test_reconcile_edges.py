"""The edges of the NodeMaintenance waits and drains (`reconcile`): a timeout is reached at
its very second, a one-second timeout is a timeout, finished pods never hold a wait, the
counts and lists the status and messages carry, and a running drain writes nothing it has
already written. Each test here was written for a slip `make mutate` found no test noticing
(docs/testing.md)."""

from __future__ import annotations

from typing import Any

from maintenance_scheduler.actions import Decision, Event, EvictPod, PatchRequest, SetStatus
from maintenance_scheduler.api import WAIT_START_ANNOTATION
from maintenance_scheduler.reconcile import reconcile_request
from nodeflow_kube.fields import condition, rfc3339
from tests.unit.maintenance_scheduler.builders import T0, nm, pod
from tests.unit.maintenance_scheduler.test_reconcile import (
    CORDONED,
    NODE,
    drain_annotations,
    draining,
    new_phase,
    only,
)


def waiting(timeout: int) -> Any:
    return nm(
        "r",
        "n1",
        phase="WaitForPodCompletion",
        finalizer=True,
        annotations={WAIT_START_ANNOTATION: rfc3339(T0)},
        waitForPodCompletion={"podSelector": "app=x", "timeoutSeconds": timeout},
    )


def test_rule_a_wait_times_out_at_its_very_second_and_one_second_is_a_timeout() -> None:
    held = [pod("p", labels={"app": "x"})]
    assert new_phase(reconcile_request(waiting(60), NODE, held, [], T0 + 59)) in (
        None,
        "WaitForPodCompletion",
    )
    assert new_phase(reconcile_request(waiting(60), NODE, held, [], T0 + 60)) == "Draining"
    assert new_phase(reconcile_request(waiting(1), NODE, held, [], T0 + 1)) == "Draining"


def test_rule_finished_pods_never_hold_a_wait_for_pod_completion() -> None:
    done = [pod("ok", labels={"app": "x"}, phase="Succeeded"), pod("bad", phase="Failed")]
    step = reconcile_request(waiting(60), NODE, done, [], T0 + 1)
    assert new_phase(step) == "Draining"
    assert "WaitForPodCompletionTimeout" not in [e.reason for e in only(step, Event)]


def test_rule_a_wait_timeout_names_at_most_ten_pods_and_is_told() -> None:
    held = [pod(f"p{i:02d}", labels={"app": "x"}) for i in range(12)]
    step = reconcile_request(waiting(60), NODE, held, [], T0 + 60)
    (event,) = [e for e in only(step, Event) if e.reason == "WaitForPodCompletionTimeout"]
    assert event.type == "Warning"
    assert event.message == (
        "waitForPodCompletion timed out after 60s; 12 pods still run: "
        + ", ".join(f"default/p{i:02d}" for i in range(10))
    )
    decisions = [d for d in step.decisions if isinstance(d, Decision) and d.kind == "wait-timeout"]
    assert [d.message for d in decisions] == [event.message]


def test_rule_a_drain_times_out_at_its_very_second_and_one_second_is_a_timeout() -> None:
    assert not reconcile_request(draining(), CORDONED, [pod("a")], [], T0 + 99).drain_timed_out
    assert reconcile_request(draining(), CORDONED, [pod("a")], [], T0 + 100).drain_timed_out
    spec = {"force": True, "timeoutSeconds": 1}
    short = draining(drainSpec=spec, annotations=drain_annotations(spec))
    assert reconcile_request(short, CORDONED, [pod("a")], [], T0 + 1).drain_timed_out


def test_rule_a_drain_counts_the_pods_that_block_it_among_those_to_evict() -> None:
    """Its totals are fixed when it starts: the pods to evict and the ones that block the
    drain (an unmanaged pod without force) both count."""
    spec = {"force": False, "timeoutSeconds": 100}
    request = nm(
        "r",
        "n1",
        phase="Draining",
        finalizer=True,
        drainSpec=spec,
        annotations=drain_annotations(spec),
    )
    pods = [pod("a"), pod("b"), pod("lonely", owner=None)]
    step = reconcile_request(request, CORDONED, pods, [], T0 + 1)
    drain = only(step, SetStatus)[0].status["drain"]
    assert drain["evictionPods"] == 3
    assert drain["totalPods"] == 3


def test_rule_a_running_drain_with_its_record_writes_no_record_again() -> None:
    step = reconcile_request(draining(), CORDONED, [pod("a")], [], T0 + 10)
    assert only(step, PatchRequest) == []
    assert [e.pod.name for e in only(step, EvictPod)] == ["a"]
    evicted = [d for d in step.decisions if d.kind == "evict"]
    assert [(d.reason, d.message, d.pod, d.node) for d in evicted] == [
        ("Evict", "evict pod default/a", "default/a", "n1")
    ]


def test_rule_a_blocked_drain_names_at_most_five_blocking_pods() -> None:
    spec = {"force": False, "timeoutSeconds": 100}
    request = draining(drainSpec=spec, annotations=drain_annotations(spec))
    pods = [pod(f"u{i}", owner=None) for i in range(7)]
    step = reconcile_request(request, CORDONED, pods, [], T0 + 10)
    ready = condition({"status": only(step, SetStatus)[0].status}, "Ready")
    assert ready is not None
    message = str(ready["message"])
    assert message.startswith("drain blocked, nothing evicted: ")
    assert [f"default/u{i}" in message for i in range(7)] == [True] * 5 + [False] * 2
