"""Slurm node counts by cluster, state and flag; poll freshness computed at scrape time."""

from __future__ import annotations

import msgspec
from prometheus_client import CollectorRegistry

from metrics_exporter.slurm import PollTracker, SlurmCollector, count_nodes
from nodeflow_contracts.slurm import BASE_STATES, FLAGS, SlurmNodeState, SlurmPollResult


def node(
    cluster: str, name: str, base: str = "Idle", *flags: str, **derived: bool
) -> SlurmNodeState:
    state = SlurmNodeState(
        cluster=cluster,
        name=name,
        known=derived.pop("known", True),
        base_state=base,  # type: ignore[arg-type]
        flags=tuple(flags),
    )
    return msgspec.structs.replace(state, **derived)


class FakeNodes:
    def __init__(self, *states: SlurmNodeState) -> None:
        self.states = {state.key: state for state in states}

    def items(self) -> list[tuple[str, SlurmNodeState]]:
        return list(self.states.items())


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def poll(cluster: str, ok: bool, started_at: float, duration: float = 0.5) -> SlurmPollResult:
    return SlurmPollResult(cluster=cluster, ok=ok, started_at=started_at, duration_seconds=duration)


def test_count_nodes_by_cluster_base_state_flags_and_drains() -> None:
    counts = count_nodes(
        [
            node("a", "n1", "Idle"),
            node("a", "n2", "Idle", "Drain", drain=True, drained=True),
            node("a", "n3", "Mixed", "Drain", "Completing", drain=True, draining=True),
            node("a", "n4", "Unknown", "PowerDown", known=False),
            node("b", "n1", "Allocated"),
        ]
    )
    a = counts["a"]
    assert a.total == 4
    assert a.states == {"Idle": 2, "Mixed": 1, "Unknown": 1}
    assert a.flags == {"Drain": 2, "Completing": 1, "other": 1}
    assert (a.drained, a.draining, a.unreadable) == (1, 1, 1)
    assert counts["b"].states == {"Allocated": 1}


def test_collector_emits_every_state_and_flag_per_cluster_and_drops_removed_nodes() -> None:
    nodes = FakeNodes(
        node("a", "n1", "Idle"), node("a", "n2", "Down", "Drain", drain=True, drained=True)
    )
    registry = CollectorRegistry()
    registry.register(SlurmCollector(nodes, PollTracker(), Clock(0.0)))
    value = registry.get_sample_value
    assert value("nodeflow_slurm_nodes", {"cluster": "a", "state": "Idle"}) == 1
    assert value("nodeflow_slurm_nodes", {"cluster": "a", "state": "Down"}) == 1
    for state in BASE_STATES:
        assert value("nodeflow_slurm_nodes", {"cluster": "a", "state": state}) is not None
    for flag in FLAGS:
        assert value("nodeflow_slurm_node_flags", {"cluster": "a", "flag": flag}) is not None
    assert value("nodeflow_slurm_node_flags", {"cluster": "a", "flag": "Drain"}) == 1
    assert value("nodeflow_slurm_node_flags", {"cluster": "a", "flag": "other"}) is None
    assert value("nodeflow_slurm_nodes_drained", {"cluster": "a"}) == 1
    del nodes.states["a.n2"]
    assert value("nodeflow_slurm_nodes", {"cluster": "a", "state": "Down"}) == 0
    assert value("nodeflow_slurm_nodes_drained", {"cluster": "a"}) == 0
    del nodes.states["a.n1"]
    assert value("nodeflow_slurm_nodes", {"cluster": "a", "state": "Idle"}) is None


def test_poll_age_is_time_since_the_last_successful_poll_finished() -> None:
    clock = Clock(1000.0)
    tracker = PollTracker()
    registry = CollectorRegistry()
    registry.register(SlurmCollector(FakeNodes(), tracker, clock))
    value = registry.get_sample_value
    assert value("nodeflow_slurm_last_poll_success", {"cluster": "a"}) is None

    tracker.record(poll("a", False, 990.0))
    assert value("nodeflow_slurm_last_poll_success", {"cluster": "a"}) == 0
    assert value("nodeflow_slurm_last_successful_poll_age_seconds", {"cluster": "a"}) is None

    tracker.record(poll("a", True, 994.0, duration=1.0))
    assert value("nodeflow_slurm_last_poll_success", {"cluster": "a"}) == 1
    assert value("nodeflow_slurm_last_successful_poll_age_seconds", {"cluster": "a"}) == 5.0
    clock.now = 1010.0
    assert value("nodeflow_slurm_last_successful_poll_age_seconds", {"cluster": "a"}) == 15.0

    tracker.record(poll("a", False, 1008.0))
    assert value("nodeflow_slurm_last_poll_success", {"cluster": "a"}) == 0
    assert value("nodeflow_slurm_last_successful_poll_age_seconds", {"cluster": "a"}) == 15.0
    assert value("nodeflow_slurm_polls_total", {"cluster": "a", "result": "failure"}) == 2
    assert value("nodeflow_slurm_polls_total", {"cluster": "a", "result": "success"}) == 1


def test_a_redelivered_older_poll_does_not_hide_a_newer_one() -> None:
    tracker = PollTracker()
    tracker.record(poll("a", True, 100.0))
    tracker.record(poll("a", False, 50.0))
    polls = tracker.clusters["a"]
    assert polls.last_ok
    assert polls.last_success_at == 100.5


def test_poll_tracker_refuses_clusters_beyond_its_limit() -> None:
    tracker = PollTracker(max_clusters=1)
    assert tracker.record(poll("a", True, 1.0))
    assert not tracker.record(poll("b", True, 1.0))
    assert list(tracker.clusters) == ["a"]
