"""Maintenance-scheduler rules no other test held: each test here fails when its rule is
broken, and each absence it asserts comes with the presence that proves the core decided
(tests/unit/plan_checks.py)."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from maintenance_scheduler.actions import Event, EvictPod, SetStatus
from maintenance_scheduler.api import (
    DRAIN_SPEC_ANNOTATION,
    DRAIN_START_ANNOTATION,
    DrainSpec,
    IntOrPercent,
    OperatorConfig,
    drain_spec_fingerprint,
)
from maintenance_scheduler.drain import SELF_LABELS, plan_drain
from maintenance_scheduler.reconcile import CORDON_REASON_PREFIX, reconcile_request
from maintenance_scheduler.scheduler import NodeInfo, schedule
from nodeflow_kube.fields import condition, rfc3339
from tests.unit.maintenance_scheduler.builders import T0, nm, node_facts, node_info, pod
from tests.unit.plan_checks import expect_actions, expect_no_actions

CORDONED = node_facts("n1", unschedulable=True, reason=CORDON_REASON_PREFIX + "x")


# --- the drain skips the scheduler's own pod ------------------------------------------------


def test_rule_the_drain_skips_the_schedulers_own_pods() -> None:
    own = [pod(f"own-{i}", labels={key: value}) for i, (key, value) in enumerate(SELF_LABELS)]
    plan = plan_drain(DrainSpec(force=True), [*own, pod("web")])
    assert [p.name for p in plan.evict_now] == ["web"]
    assert [p.name for p in plan.to_go] == ["web"]
    assert not plan.blocking and not plan.skipped  # not even listed: never waited for
    # Only its own pods left on the node: the drain is done.
    assert plan_drain(DrainSpec(force=True), own).done
    # A pod with the same label key but another value is anybody's pod and goes.
    other = [pod(f"other-{i}", labels={key: "x"}) for i, (key, _) in enumerate(SELF_LABELS)]
    assert [p.name for p in plan_drain(DrainSpec(force=True), other).evict_now] == [
        "other-0",
        "other-1",
    ]


# --- drain timeoutSeconds: 0 means no limit -------------------------------------------------


def _draining(drain_spec: dict[str, Any]) -> Any:
    """A request whose drain started at T0 with `drain_spec` (its start recorded)."""
    spec = nm("r", "n1", drainSpec=drain_spec).drain_spec
    assert spec is not None
    annotations = {
        DRAIN_SPEC_ANNOTATION: drain_spec_fingerprint(spec),
        DRAIN_START_ANNOTATION: rfc3339(T0),
    }
    status = {"drain": {"totalPods": 1, "evictionPods": 1, "drainProgress": 0}}
    return nm(
        "r",
        "n1",
        phase="Draining",
        finalizer=True,
        drainSpec=drain_spec,
        annotations=annotations,
        status=status,
    )


def _ready_message(step: Any) -> str:
    writes = [a for a in step.actions if isinstance(a, SetStatus)]
    ready = condition({"status": writes[-1].status}, "Ready") if writes else None
    return "" if ready is None else str(ready.get("message", ""))


def test_rule_drain_timeout_seconds_zero_means_no_limit() -> None:
    a_year_later = T0 + 365 * 24 * 3600
    step = reconcile_request(
        _draining({"force": True, "timeoutSeconds": 0}), CORDONED, [pod("a")], [], a_year_later
    )
    assert not step.drain_timed_out
    expect_no_actions(step.actions, Event, reason="DrainTimeout", while_it_has=EvictPod)
    expect_actions(step.actions, EvictPod, count=1, pod__name="a")
    assert "timed out" not in _ready_message(step)
    # With a limit, the same drain a second past it has timed out, and says so.
    step = reconcile_request(
        _draining({"force": True, "timeoutSeconds": 100}), CORDONED, [pod("a")], [], T0 + 101
    )
    assert step.drain_timed_out
    expect_actions(step.actions, Event, count=1, reason="DrainTimeout")
    assert _ready_message(step).startswith("drain timed out after 100s")


# --- the budget counts nodes under maintenance as unavailable -------------------------------


def _config(max_unavailable: int) -> OperatorConfig:
    return OperatorConfig(
        max_parallel_operations=IntOrPercent(0),  # no parallel limit: only the budget holds
        max_unavailable=IntOrPercent(max_unavailable),
    )


def test_rule_the_budget_counts_nodes_under_maintenance_as_unavailable() -> None:
    # n0 is under maintenance without a cordon (spec.cordon false): Ready and schedulable,
    # yet unavailable to the budget. maxUnavailable 1 is spent: n1 waits.
    nodes = {f"n{i}": node_info(f"n{i}") for i in range(3)}
    in_progress = nm("busy", "n0", phase="Draining", cordon=False)
    waiting = nm("next", "n1", phase="Pending")
    result = schedule(nodes, [in_progress, waiting], _config(1))
    assert result.scheduled == []
    assert [(s.request.name, s.reason) for s in result.skipped] == [
        ("next", "unavailability-budget")
    ]
    assert result.unavailable_nodes == 1
    # Once n0's maintenance is over, the same request is scheduled.
    result = schedule(nodes, [waiting], _config(1))
    assert [r.name for r in result.scheduled] == ["next"]


@given(
    nodes=st.integers(2, 8),
    under=st.integers(0, 8),
    down=st.integers(0, 8),
    budget=st.integers(0, 8),
)
def test_rule_property_under_maintenance_plus_scheduled_never_exceeds_max_unavailable(
    nodes: int, under: int, down: int, budget: int
) -> None:
    """Every node counts once: under maintenance, otherwise unavailable (cordoned or not
    Ready), otherwise available; what is scheduled onto available nodes never takes the
    total of unavailable nodes past maxUnavailable, and is as much as the budget allows."""
    under = min(under, nodes)
    down = min(down, nodes - under)
    infos: dict[str, NodeInfo] = {
        f"n{i}": node_info(f"n{i}", ready=not (under <= i < under + down)) for i in range(nodes)
    }
    requests = [nm(f"m{i}", f"n{i}", phase="Draining", cordon=False) for i in range(under)]
    requests += [nm(f"p{i}", f"n{i}", phase="Pending", created=T0 + i) for i in range(under, nodes)]
    result = schedule(infos, requests, _config(budget))
    newly_unavailable = [r for r in result.scheduled if infos[r.node_name].ready]
    assert under + down + len(newly_unavailable) <= max(budget, under + down)
    available_pending = nodes - under - down
    assert len(newly_unavailable) == min(available_pending, max(0, budget - under - down))
