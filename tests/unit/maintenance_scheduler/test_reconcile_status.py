"""The NodeMaintenance status a round writes (`reconcile.next_status`): only the Ready
condition is the scheduler's, so everything else a status holds -- the requestor's
RequestorFailed, `drain`, `waitForCompletion`, fields other writers keep there -- survives a
phase change, and the Ready condition's lastTransitionTime moves only when its reason does,
wherever it sits among the conditions. Each test here was written for a slip `make mutate`
found no test noticing (docs/testing.md)."""

from __future__ import annotations

from maintenance_scheduler.reconcile import next_status
from nodeflow_kube.fields import rfc3339
from tests.unit.maintenance_scheduler.builders import T0, nm

LATER = T0 + 600


def requestor_failed() -> dict[str, str]:
    return {
        "type": "RequestorFailed",
        "status": "True",
        "reason": "FailedMaintenance",
        "message": "driver upgrade failed",
        "lastTransitionTime": rfc3339(T0),
    }


def ready(reason: str, since: float) -> dict[str, object]:
    return {
        "type": "Ready",
        "status": "False",
        "reason": reason,
        "message": "",
        "lastTransitionTime": rfc3339(since),
        "observedGeneration": 1,
    }


def test_rule_a_phase_change_keeps_every_other_status_field_and_condition() -> None:
    request = nm(
        "r",
        "n0",
        status={
            "conditions": [requestor_failed(), ready("Draining", T0)],
            "drain": {"totalPods": 3, "evictionPods": 1},
            "waitForCompletion": ["default/job-0"],
        },
    )
    status = next_status(request, "Ready", LATER)
    assert status["drain"] == {"totalPods": 3, "evictionPods": 1}
    assert status["waitForCompletion"] == ["default/job-0"]
    by_type = {c["type"]: c for c in status["conditions"]}
    assert set(by_type) == {"Ready", "RequestorFailed"}
    assert len(status["conditions"]) == 2
    assert by_type["RequestorFailed"] == requestor_failed()
    assert by_type["Ready"]["reason"] == "Ready"
    assert by_type["Ready"]["status"] == "True"
    assert by_type["Ready"]["lastTransitionTime"] == rfc3339(LATER)


def test_rule_the_ready_transition_time_stays_while_its_reason_does_wherever_it_is_listed() -> None:
    """The old Ready condition is found by its type, not by its place: listed after the
    requestor's condition, its time still stays while the phase does not change."""
    request = nm("r", "n0", status={"conditions": [requestor_failed(), ready("Draining", T0)]})
    status = next_status(request, "Draining", LATER, "2 pods left")
    (condition,) = [c for c in status["conditions"] if c["type"] == "Ready"]
    assert condition["lastTransitionTime"] == rfc3339(T0)
    assert condition["message"] == "2 pods left"
    moved = next_status(request, "Ready", LATER)
    (condition,) = [c for c in moved["conditions"] if c["type"] == "Ready"]
    assert condition["lastTransitionTime"] == rfc3339(LATER)


def test_rule_a_status_whose_conditions_are_null_gets_its_first_ready_condition() -> None:
    request = nm("r", "n0", status={"conditions": None, "drain": {"totalPods": 0}})
    status = next_status(request, "Scheduled", LATER)
    assert status["drain"] == {"totalPods": 0}
    (condition,) = status["conditions"]
    assert condition["type"] == "Ready" and condition["reason"] == "Scheduled"
    assert condition["lastTransitionTime"] == rfc3339(LATER)


def test_rule_a_ready_condition_without_a_transition_time_gets_one() -> None:
    old = ready("Draining", T0)
    del old["lastTransitionTime"]
    request = nm("r", "n0", status={"conditions": [old]})
    (condition,) = next_status(request, "Draining", LATER)["conditions"]
    assert condition["lastTransitionTime"] == rfc3339(LATER)


def test_rule_conditions_are_listed_by_type() -> None:
    request = nm("r", "n0", status={"conditions": [ready("Draining", T0), requestor_failed()]})
    listed = [c["type"] for c in next_status(request, "Ready", LATER)["conditions"]]
    assert listed == ["Ready", "RequestorFailed"]
    request = nm("r", "n0", status={"conditions": [requestor_failed()]})
    listed = [c["type"] for c in next_status(request, "Ready", LATER)["conditions"]]
    assert listed == ["Ready", "RequestorFailed"]


def test_rule_an_empty_wait_list_removes_wait_for_completion_and_none_removes_drain() -> None:
    request = nm(
        "r",
        "n0",
        status={"waitForCompletion": ["default/job-0"], "drain": {"totalPods": 1}},
    )
    status = next_status(request, "Draining", LATER, wait_for_completion=(), drain=None)
    assert "waitForCompletion" not in status
    assert "drain" not in status
    kept = next_status(request, "Draining", LATER)
    assert kept["waitForCompletion"] == ["default/job-0"]
    assert kept["drain"] == {"totalPods": 1}
