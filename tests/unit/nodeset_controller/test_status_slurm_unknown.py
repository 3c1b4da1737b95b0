"""Rule 8 (status) during a Slurm outage: numberRunning and numberDrain keep their last known
values (the status in Kubernetes is the durable store, so a restarted controller keeps them
too), and the SlurmStateUnknown condition says since when the counts are not current."""

from __future__ import annotations

from typing import Any

import msgspec
from hypothesis import given
from hypothesis import strategies as st

from nodeset_controller.planner import plan
from nodeset_controller.status import SLURM_STATE_UNKNOWN, Counts, last_known_slurm_counts
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
    # Running first; no drained node is left to claim beside three running ones.
    assert (result.status["numberRunning"], result.status["numberDrain"]) == (3, 0)
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


def test_rule_kept_running_and_drain_together_claim_no_more_nodes_than_exist() -> None:
    """Audit of issue 28 item 3: three nodes run jobs and three are drained; Slurm goes stale
    and three pods disappear. Each kept count alone fits the three pods left, but together
    they claimed six nodes. Running is kept first, drained within what is left."""
    node_map, pods = full(6)
    states = _states(3, busy=True)
    states.update({f"gpu-001-{i:03d}": slurm(f"gpu-001-{i:03d}", drain=True) for i in (4, 5, 6)})
    fresh = plan(view(nodeset(replicas=6), node_map, pods, states))
    assert fresh.status is not None
    assert (fresh.status["numberRunning"], fresh.status["numberDrain"]) == (3, 3)
    stale = plan(
        view(
            nodeset(replicas=6, status=fresh.status),
            node_map,
            pods[:3],
            states,
            now=T0 + 600,
            status=cluster_status(last_success_at=T0),
        )
    )
    wanted = stale.wanted_status
    assert (wanted["numberRunning"], wanted["numberDrain"]) == (3, 0)
    # Two pods left: two running, none drained.
    fewer = plan(
        view(
            nodeset(replicas=6, status=fresh.status),
            node_map,
            pods[:2],
            states,
            now=T0 + 600,
            status=cluster_status(last_success_at=T0),
        )
    )
    assert (fewer.wanted_status["numberRunning"], fewer.wanted_status["numberDrain"]) == (2, 0)
    # Fewer running than pods: the drained count fills what is left.
    stored = {"numberRunning": 1, "numberDrain": 5}
    rest = plan(view(nodeset(replicas=6, status=stored), node_map, pods[:4], states, status=None))
    assert (rest.wanted_status["numberRunning"], rest.wanted_status["numberDrain"]) == (1, 3)


_STORED = st.one_of(st.none(), st.integers(min_value=-2, max_value=20), st.booleans(), st.text())


@given(running=_STORED, drain=_STORED, on_nodes=st.integers(min_value=0, max_value=12))
def test_rule_kept_slurm_counts_never_exceed_the_pods_on_nodes(
    running: object, drain: object, on_nodes: int
) -> None:
    """Whatever the stored status holds (missing, negative, not a count), the kept counts
    are non-negative and together claim at most the pods on nodes; a stored running count
    within that bound is kept as it was."""
    existing: dict[str, Any] = {}
    if running is not None:
        existing["numberRunning"] = running
    if drain is not None:
        existing["numberDrain"] = drain
    computed = Counts(on_nodes, 0, on_nodes, on_nodes, on_nodes, on_nodes, 0, 0, 0)
    kept = last_known_slurm_counts(computed, existing, on_nodes)
    assert kept.number_running >= 0 and kept.number_drain >= 0
    assert kept.number_running + kept.number_drain <= on_nodes
    valid = isinstance(running, int) and not isinstance(running, bool) and running >= 0
    if valid and isinstance(running, int) and running <= on_nodes:
        assert kept.number_running == running


def test_rule_slurm_unknown_message_stays_the_same_while_the_outage_lasts() -> None:
    """The condition's message holds no error text: slurm-syncer's error changes from poll
    to poll, and a message that followed it would rewrite the NodeSet status every poll."""
    node_map, pods = full(2)
    states = _states(2, busy=True)
    first_error = msgspec.structs.replace(
        cluster_status(last_success_at=T0, reachable=False), error="timeout after 3.1s"
    )
    first = plan(
        view(nodeset(replicas=2), node_map, pods, states, now=T0 + 600, status=first_error)
    )
    assert first.status is not None
    unknown = _condition(first.status, SLURM_STATE_UNKNOWN)
    assert unknown["status"] == "True"
    assert "cannot reach" in unknown["message"]
    later_error = msgspec.structs.replace(first_error, error="timeout after 3.4s")
    later = plan(
        view(
            nodeset(replicas=2, status=first.status),
            node_map,
            pods,
            states,
            now=T0 + 610,
            status=msgspec.structs.replace(later_error, last_poll_at=T0 + 610),
        )
    )
    assert later.status is None, "a new error text rewrote the status"
