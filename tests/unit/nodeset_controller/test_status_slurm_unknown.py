"""Rule 8 (status) during a Slurm outage: numberRunning and numberDrain keep their last known
values (the status in Kubernetes is the durable store, so a restarted controller keeps them
too), and the SlurmStateUnknown condition says since when the counts are not current."""

from __future__ import annotations

from typing import Any

from nodeset_controller.planner import plan
from nodeset_controller.status import SLURM_STATE_UNKNOWN
from tests.unit.nodeset_controller.builders import T0, cluster_status, nodeset, slurm
from tests.unit.nodeset_controller.test_planner import full, view


def _condition(status: dict[str, Any], kind: str) -> dict[str, Any]:
    found: list[dict[str, Any]] = [c for c in status["conditions"] if c["type"] == kind]
    (only,) = found
    return only


def _states(count: int, **kwargs: bool) -> dict[str, Any]:
    names = [f"gpu-001-{i + 1:03d}" for i in range(count)]
    return {name: slurm(name, **kwargs) for name in names}


def test_rule_status_keeps_last_known_slurm_counts_while_slurm_is_stale() -> None:
    """Issue 28 item 3: four nodes run jobs, one more is drained; then slurm-syncer's view
    goes stale. The status keeps 4 running and the drained count instead of zeros, and
    SlurmStateUnknown turns True at the moment the view went stale, keeping that time."""
    node_map, pods = full(5)
    states = _states(4, busy=True)
    states["gpu-001-005"] = slurm("gpu-001-005", drain=True)
    fresh = plan(view(nodeset(replicas=5), node_map, pods, states))
    assert fresh.status is not None
    assert (fresh.status["numberRunning"], fresh.status["numberDrain"]) == (4, 1)
    assert _condition(fresh.status, SLURM_STATE_UNKNOWN)["status"] == "False"

    stale_status = cluster_status(last_success_at=T0)
    later = T0 + 600
    stale = plan(
        view(
            nodeset(replicas=5, status=fresh.status),
            node_map,
            pods,
            states,
            now=later,
            status=stale_status,
        )
    )
    assert stale.status is not None
    assert (stale.status["numberRunning"], stale.status["numberDrain"]) == (4, 1)
    unknown = _condition(stale.status, SLURM_STATE_UNKNOWN)
    assert (unknown["status"], unknown["reason"]) == ("True", "SlurmStateStale")
    since = unknown["lastTransitionTime"]
    # Still stale ten minutes on: nothing to write, the since-when stays.
    again = plan(
        view(
            nodeset(replicas=5, status=stale.status),
            node_map,
            pods,
            states,
            now=later + 600,
            status=stale_status,
        )
    )
    assert again.status is None
    assert _condition(again.wanted_status, SLURM_STATE_UNKNOWN)["lastTransitionTime"] == since
    # Fresh again: the counts are Slurm's and the condition turns False.
    back = plan(
        view(
            nodeset(replicas=5, status=stale.status),
            node_map,
            pods,
            _states(5),
            now=later + 1200,
        )
    )
    assert back.status is not None
    assert (back.status["numberRunning"], back.status["numberDrain"]) == (0, 0)
    assert _condition(back.status, SLURM_STATE_UNKNOWN)["status"] == "False"


def test_rule_a_restarted_controller_without_a_slurm_view_publishes_no_zeros() -> None:
    """No cluster status at all (a restart before slurm-syncer reported): the stored counts
    stay; a count cannot exceed the pods still on nodes."""
    node_map, pods = full(3)
    stored = {"numberRunning": 5, "numberDrain": 2, "currentNumberScheduled": 5}
    result = plan(view(nodeset(replicas=3, status=stored), node_map, pods, _states(3), status=None))
    assert result.status is not None
    assert (result.status["numberRunning"], result.status["numberDrain"]) == (3, 2)
    assert _condition(result.status, SLURM_STATE_UNKNOWN)["status"] == "True"
    # With nothing stored, nothing is known: zero, and the condition says why.
    first = plan(view(nodeset(replicas=3), node_map, pods, _states(3, busy=True), status=None))
    assert first.status is not None
    assert first.status["numberRunning"] == 0
    assert "no status" in _condition(first.status, SLURM_STATE_UNKNOWN)["message"]


def test_rule_an_invalid_spec_keeps_the_slurm_condition_as_it_was() -> None:
    node_map, pods = full(2)
    stale = plan(
        view(
            nodeset(replicas=2, status={"numberRunning": 2}),
            node_map,
            pods,
            _states(2, busy=True),
            status=None,
        )
    )
    assert stale.status is not None
    invalid = plan(view(nodeset(replicas=-1, status=stale.status), node_map, pods, status=None))
    assert invalid.status is not None
    kept = _condition(invalid.status, SLURM_STATE_UNKNOWN)
    assert kept == _condition(stale.status, SLURM_STATE_UNKNOWN)
    assert invalid.status["numberRunning"] == 2
