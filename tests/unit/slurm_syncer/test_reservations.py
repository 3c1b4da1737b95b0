"""slurm-syncer's plan of scheduled-update reservations (slurm_syncer.reservations), pure."""

from __future__ import annotations

from typing import Any

from nodeflow_contracts.nodeset import reservation_name
from nodeflow_contracts.slurm_api import api_version
from slurm_syncer.reservations import plan_reservations

START = 1_800_000_000  # 2027-01-15T08:00:00Z
START_TEXT = "2027-01-15T08:00:00Z"
V45 = api_version("v0.0.45")
NODES = ("w-000-001", "w-000-002", "k-000-001", "other")


def nodeset(name: str = "w", cluster: str = "a", **scheduled: Any) -> dict[str, Any]:
    strategy: dict[str, Any] = {"type": "ScheduledUpdate"}
    strategy["scheduledUpdate"] = {"startTime": START_TEXT, "duration": "30m", **scheduled}
    return {
        "metadata": {"name": name, "namespace": "ns"},
        "spec": {"slurmCluster": cluster, "updateStrategy": strategy},
    }


OURS = reservation_name("ns", "w", START)


def test_rule_a_window_not_yet_over_gets_its_reservation_over_the_nodesets_nodes() -> None:
    plan = plan_reservations("a", START - 86400, [nodeset()], NODES, set(), V45)
    (new,) = plan.create
    assert new.window.reservation == OURS == "nodeflow-ns-w-20270115T080000Z"
    assert new.nodes == ("w-000-001", "w-000-002")
    assert new.window.flags == ("MAINT", "IGNORE_JOBS")
    assert (new.window.start, new.window.end) == (START, START + 1800)
    assert (new.start, new.minutes) == (START, 30)
    # Inside the window it starts now, for what is left (slurmctld refuses a start more than
    # ten minutes past), under the window's name; once it exists nothing more is sent.
    (late,) = plan_reservations("a", START + 900 + 1, [nodeset()], NODES, set(), V45).create
    assert late.window.reservation == OURS and (late.start, late.minutes) == (START + 901, 15)
    assert plan_reservations("a", START + 60, [nodeset()], NODES, {OURS}, V45).create == []


def test_rule_an_ended_window_gets_none_and_ours_is_deleted_but_never_anyone_elses() -> None:
    existing = {OURS, "ops-maint", "nodeflow-ns-gone-20270115T080000Z"}
    plan = plan_reservations("a", START + 1800, [nodeset()], NODES, existing, V45)
    assert plan.create == []
    assert plan.delete == ["nodeflow-ns-gone-20270115T080000Z", OURS]


def test_rule_a_strategy_change_or_a_new_start_deletes_the_old_reservation() -> None:
    moved = nodeset(startTime="2027-01-16T08:00:00Z")
    plan = plan_reservations("a", START - 60, [moved], NODES, {OURS}, V45)
    assert plan.delete == [OURS]
    assert [new.window.reservation for new in plan.create] == [
        reservation_name("ns", "w", START + 86400)
    ]
    rolling = nodeset()
    rolling["spec"]["updateStrategy"] = {"type": "RollingUpdate"}
    assert plan_reservations("a", START - 60, [rolling], NODES, {OURS}, V45).delete == [OURS]


def test_rule_a_slurmrestd_before_v0_0_43_gets_nothing_sent_and_says_why() -> None:
    for version in (api_version("v0.0.42"), None):
        plan = plan_reservations("a", START - 60, [nodeset()], NODES, {OURS}, version)
        assert plan.create == [] and plan.delete == []
        ((key, why),) = plan.held
        assert key == "ns/w" and "cannot create reservations" in why and "v0.0.43" in why


def test_rule_nothing_is_created_without_nodes_with_a_bad_flag_or_for_another_cluster() -> None:
    assert plan_reservations("a", START - 60, [nodeset()], ("other",), set(), V45).held == [
        ("ns/w", "none of its Slurm nodes is registered yet")
    ]
    v43 = api_version("v0.0.43")
    plan = plan_reservations("a", START - 60, [nodeset(flags=["force_start"])], NODES, set(), v43)
    assert plan.create == [] and "FORCE_START" in plan.held[0][1]
    assert (
        plan_reservations("a", START - 60, [nodeset(cluster="b")], NODES, set(), V45).create == []
    )
    bad = nodeset(startTime="tomorrow")
    plan = plan_reservations("a", START - 60, [bad], NODES, set(), V45)
    assert plan.create == [] and "RFC 3339" in plan.held[0][1]
