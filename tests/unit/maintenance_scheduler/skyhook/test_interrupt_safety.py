"""Interrupt safety: no more nodes drained and interrupted at once than the
interruptionBudget, whatever is edited; one interrupt at a time on a node, alone there; a
drained node stays cordoned while a Job of the Skyhook still runs on it."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from maintenance_scheduler.skyhook.api import (
    DISABLE_ANNOTATION,
    IGNORE_NODE_LABEL,
    SKYHOOK_FINALIZER,
    Skyhook,
    parse_skyhook,
)
from maintenance_scheduler.skyhook.jobs import build_job, maintenance_name
from maintenance_scheduler.skyhook.observe import job_facts
from maintenance_scheduler.skyhook.plan import (
    CreateJob,
    CreateMaintenance,
    NodeView,
    World,
    plan_round,
)
from tests.unit.maintenance_scheduler.skyhook.skyhook_cluster import (
    NAMESPACE,
    T0,
    Cluster,
    make_skyhook,
)

REBOOT = {"type": "reboot"}
SERVICE = {"type": "service", "services": ["nvidia-persistenced"]}
REQUEST = maintenance_name("gpu-init", "node-0")


def package(
    version: str = "1.0.0",
    interrupt: dict[str, Any] | None = None,
    config: dict[str, str] | None = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {"version": version, "image": "ghcr.io/x/p"}
    if interrupt is not None:
        spec["interrupt"] = interrupt
    if config is not None:
        spec["configMap"] = config
        spec["configInterrupts"] = {key: REBOOT for key in config}
    return spec


def budgeted(
    packages: dict[str, Any],
    budget: int,
    generation: int = 1,
    selector: dict[str, str] | None = None,
) -> Skyhook:
    spec: dict[str, Any] = {"packages": packages, "interruptionBudget": {"count": budget}}
    if selector is not None:
        spec["nodeSelectors"] = {"matchLabels": selector}
    return parse_skyhook(
        {
            "metadata": {
                "name": "gpu-init",
                "uid": "uid-gpu-init",
                "generation": generation,
                "finalizers": [SKYHOOK_FINALIZER],
            },
            "spec": spec,
        }
    )


def edit(cluster: Cluster, edited: Skyhook) -> None:
    cluster.skyhook = replace(edited, status=cluster.skyhook.status)


def running_interrupts(cluster: Cluster) -> list[CreateJob]:
    return [
        a
        for a in cluster.created
        if a.stage == "interrupt" and not cluster.jobs[a.name].get("status")
    ]


def drained_at_most(cluster: Cluster, budget: int, rounds: int) -> int:
    """Run rounds; the most NodeMaintenances and running interrupt Jobs seen at once."""
    most = 0
    for _ in range(rounds):
        plan = cluster.round()
        started = {a.node for a in plan.actions if isinstance(a, CreateJob)}
        most = max(most, len(cluster.maintenances), len(started))
        assert len(cluster.maintenances) <= budget, cluster.maintenances
    return most


def test_rule_a_config_edit_drains_no_more_nodes_than_the_interruption_budget() -> None:
    cluster = Cluster.of(budgeted({"kern": package(interrupt=REBOOT, config={"k": "1"})}, 1), 3)
    cluster.settle(200)
    assert cluster.status() == "complete"
    edit(cluster, budgeted({"kern": package(interrupt=REBOOT, config={"k": "2"})}, 1, 2))
    most = 0
    for _ in range(30):
        cluster.round()
        most = max(most, len(cluster.maintenances))
        shown = cluster.skyhook.status["nodeStatus"].values()
        # Nodes outside the batch wait: they enter no run (so no batch) of their own.
        assert sum(1 for s in shown if s == "in_progress") <= 1
    assert most == 1
    assert cluster.status() == "complete"


def test_rule_a_version_bump_drains_no_more_nodes_than_the_interruption_budget() -> None:
    cluster = Cluster.of(budgeted({"kern": package(interrupt=REBOOT)}, 1), 3)
    cluster.settle(200)
    edit(cluster, budgeted({"kern": package("1.1.0", interrupt=REBOOT)}, 1, 2))
    assert drained_at_most(cluster, 1, 40) == 1
    assert cluster.status() == "complete"


@settings(max_examples=12, deadline=None)
@given(
    budget=st.integers(min_value=1, max_value=2),
    edits=st.lists(
        st.tuples(st.sampled_from(["1.0.0", "1.1.0", "1.2.0"]), st.sampled_from(["a", "b"])),
        min_size=1,
        max_size=3,
    ),
    gaps=st.lists(st.integers(min_value=0, max_value=6), min_size=3, max_size=3),
)
def test_property_never_more_drained_nodes_than_the_interruption_budget(
    budget: int, edits: list[tuple[str, str]], gaps: list[int]
) -> None:
    cluster = Cluster.of(
        budgeted({"kern": package(interrupt=REBOOT, config={"k": "a"})}, budget), 4
    )
    cluster.settle(200)
    for generation, ((version, value), gap) in enumerate(zip(edits, gaps, strict=False), 2):
        # An edit lands mid-rollout (after `gap` rounds) or once it settled.
        kern = package(version, interrupt=REBOOT, config={"k": value})
        edit(cluster, budgeted({"kern": kern}, budget, generation))
        drained_at_most(cluster, budget, gap)
    drained_at_most(cluster, budget, 80)
    assert cluster.status() == "complete"


def drained_working_nodes(cluster: Cluster) -> set[str]:
    """Nodes holding a NodeMaintenance that are not shown erroring (an erroring node keeps its
    drain for its failed Job's logs while the rollout moves on)."""
    shown = cluster.skyhook.status.get("nodeStatus") or {}
    return {node for _, node in cluster.owners.values() if shown.get(node) != "erroring"}


def fail_reboots_while_tools_run(cluster: Cluster, failing: set[str]) -> None:
    """On the `failing` nodes, kern's Jobs fail while tool's Jobs keep running."""
    for made in cluster.created:
        if made.node not in failing:
            continue
        if made.package.name == "tool":
            cluster.held_jobs.add(made.name)
        elif made.name not in cluster.jobs or not cluster.jobs[made.name].get("status"):
            cluster.fate[made.name] = "failed"


def test_rule_an_edit_never_lets_a_once_erroring_node_drain_beside_the_batch() -> None:
    def spec(version: str, generation: int) -> Skyhook:
        return budgeted(
            {"tool": package(), "kern": package(version, interrupt=REBOOT)}, 1, generation
        )

    cluster = Cluster.of(spec("1.0.0", 1), 3)
    for _ in range(12):
        cluster.round()
        fail_reboots_while_tools_run(cluster, {"node-0"})
        if any(a.node == "node-1" for a in cluster.created):
            break
    cluster.round()
    assert cluster.skyhook.status["nodeStatus"]["node-0"] == "erroring"
    # The version fixed: node-0's failed entry is stale, its running tool Job makes it in
    # progress; it must wait for node-1's batch instead of draining and rebooting beside it.
    edit(cluster, spec("1.0.1", 2))
    cluster.fate.clear()
    cluster.held_jobs.clear()
    for _ in range(40):
        cluster.held_jobs |= {a.name for a in cluster.created if a.stage == "interrupt"}
        plan = cluster.round()
        interrupting = {
            a.node for a in plan.actions if isinstance(a, CreateJob) and a.package.name == "kern"
        }
        assert len(drained_working_nodes(cluster)) <= 1, cluster.owners
        assert len(interrupting) <= 1, interrupting
        if len(cluster.created) > 40:
            break
    cluster.held_jobs.clear()
    cluster.settle(200)
    assert cluster.status() == "complete"


@settings(max_examples=25, deadline=None)
@given(
    budget=st.integers(min_value=1, max_value=2),
    failing=st.sets(st.sampled_from(["node-0", "node-1", "node-2"]), max_size=2),
    versions=st.lists(st.sampled_from(["1.0.1", "1.1.0", "1.2.0"]), min_size=1, max_size=2),
    gaps=st.lists(st.integers(min_value=0, max_value=8), min_size=3, max_size=3),
)
def test_property_failing_jobs_and_two_packages_never_drain_more_than_the_budget(
    budget: int, failing: set[str], versions: list[str], gaps: list[int]
) -> None:
    """S21 with failing Jobs: kern (reboot) fails on some nodes while tool (no interrupt)
    still runs there, then the version is edited (mid-rollout or after it settled)."""

    def spec(version: str, generation: int) -> Skyhook:
        kern = package(version, interrupt=REBOOT, config={"k": "a"})
        return budgeted({"tool": package(), "kern": kern}, budget, generation)

    def rounds(count: int) -> None:
        for _ in range(count):
            plan = cluster.round()
            fail_reboots_while_tools_run(cluster, failing)
            started = {
                a.node
                for a in plan.actions
                if isinstance(a, CreateJob) and a.package.name == "kern" and a.stage != "uninstall"
            }
            assert len(drained_working_nodes(cluster)) <= budget, cluster.owners
            assert len(started) <= budget, started

    cluster = Cluster.of(spec("1.0.0", 1), 4)
    rounds(gaps[0] + 6)
    for generation, (version, gap) in enumerate(zip(versions, gaps[1:], strict=False), 2):
        edit(cluster, spec(version, generation))
        # The failing nodes recover once fixed: their stale erroring entries run again.
        failing = set()
        cluster.held_jobs.clear()
        rounds(gap)
    rounds(120)
    assert cluster.status() == "complete"


def hold_first_interrupt(cluster: Cluster) -> CreateJob:
    for _ in range(30):
        cluster.round()
        made = [a for a in cluster.created if a.stage == "interrupt"]
        if made:
            cluster.held_jobs.add(made[0].name)
            cluster.round()
            assert cluster.maintenances == {REQUEST: "Ready"}
            return made[0]
    raise AssertionError("no interrupt Job made")


def test_rule_a_removed_package_s_running_reboot_keeps_another_interrupt_off_the_node() -> None:
    cluster = Cluster.of(
        make_skyhook({"kern": package(interrupt=REBOOT), "svcs": package(interrupt=SERVICE)})
    )
    reboot = hold_first_interrupt(cluster)
    assert reboot.package.name == "kern"
    cluster.change({"svcs": package(interrupt=SERVICE)})
    for _ in range(6):
        cluster.round()
        assert [a.name for a in running_interrupts(cluster)] == [reboot.name]
    # Once the reboot is over, svcs' own interrupt runs, still drained, then all is released.
    cluster.held_jobs.clear()
    cluster.settle()
    assert ("svcs", "1.0.0", "interrupt") in cluster.stages_created()
    assert cluster.status() == "complete"
    assert cluster.maintenances == {}


def test_rule_the_interrupt_waits_for_every_other_job_of_the_skyhook_on_the_node() -> None:
    cluster = Cluster.of(make_skyhook({"kern": package(interrupt=REBOOT), "tool": package()}))
    tool_apply = ""
    for _ in range(20):
        cluster.round()
        for made in cluster.created:
            if made.package.name == "tool" and made.stage == "apply" and not tool_apply:
                tool_apply = made.name
                cluster.held_jobs.add(made.name)
    assert tool_apply and not cluster.jobs[tool_apply].get("status")
    assert [a for a in cluster.created if a.stage == "interrupt"] == []
    cluster.held_jobs.clear()
    cluster.settle()
    assert ("kern", "1.0.0", "interrupt") in cluster.stages_created()
    assert cluster.status() == "complete"


def _keeps_drain_while_reboot_runs(cluster: Cluster, reboot: CreateJob) -> None:
    for _ in range(3):
        cluster.round()
        assert not cluster.jobs[reboot.name].get("status")
        assert cluster.maintenances == {REQUEST: "Ready"}, "uncordoned while the reboot runs"
    cluster.held_jobs.clear()
    cluster.settle()


def test_rule_a_rollback_keeps_the_node_drained_while_the_reboot_still_runs() -> None:
    cluster = Cluster.of(make_skyhook({"kern": package("2.0.0", interrupt=REBOOT)}))
    reboot = hold_first_interrupt(cluster)
    cluster.change({"kern": package("1.0.0", interrupt=REBOOT)})
    _keeps_drain_while_reboot_runs(cluster, reboot)
    assert cluster.status() == "complete"
    assert cluster.maintenances == {}


def test_rule_a_removal_keeps_the_node_drained_while_the_reboot_still_runs() -> None:
    cluster = Cluster.of(make_skyhook({"kern": package(interrupt=REBOOT), "tool": package()}))
    reboot = hold_first_interrupt(cluster)
    cluster.change({"tool": package()})
    _keeps_drain_while_reboot_runs(cluster, reboot)
    assert cluster.status() == "complete"
    assert cluster.maintenances == {}


def test_rule_an_ignored_node_stays_drained_while_the_reboot_still_runs() -> None:
    cluster = Cluster.of(make_skyhook({"kern": package(interrupt=REBOOT)}))
    reboot = hold_first_interrupt(cluster)
    node = cluster.nodes["node-0"]
    cluster.nodes["node-0"] = cluster.bump(node, labels={**node.labels, IGNORE_NODE_LABEL: "true"})
    _keeps_drain_while_reboot_runs(cluster, reboot)
    assert cluster.maintenances == {}  # the reboot over, the ignored node's request goes


def test_rule_a_node_leaving_the_selector_stays_drained_while_the_reboot_still_runs() -> None:
    cluster = Cluster.of(budgeted({"kern": package(interrupt=REBOOT)}, 1, selector={"gpu": "yes"}))
    node = cluster.nodes["node-0"]
    cluster.nodes["node-0"] = cluster.bump(node, labels={"gpu": "yes"})
    reboot = hold_first_interrupt(cluster)
    node = cluster.nodes["node-0"]
    cluster.nodes["node-0"] = cluster.bump(
        node, labels={k: v for k, v in node.labels.items() if k != "gpu"}
    )
    _keeps_drain_while_reboot_runs(cluster, reboot)
    assert cluster.maintenances == {}


def test_rule_a_disabled_earlier_skyhook_still_blocks_its_node_while_its_reboot_runs() -> None:
    def skyhook(name: str, priority: int, disabled: bool) -> Skyhook:
        return parse_skyhook(
            {
                "metadata": {
                    "name": name,
                    "uid": f"uid-{name}",
                    "generation": 1,
                    "finalizers": [SKYHOOK_FINALIZER],
                    "annotations": {DISABLE_ANNOTATION: "true"} if disabled else {},
                },
                "spec": {"packages": {"kern": package(interrupt=REBOOT)}, "priority": priority},
            }
        )

    first, second = skyhook("first", 1, True), skyhook("second", 2, False)
    reboot = build_job(
        first,
        first.packages[0],
        "interrupt",
        "node-0",
        namespace=NAMESPACE,
        default_stage_timeout_seconds=0,
        run="r1",
        node_uid="node-uid-0",
    )
    node = NodeView("node-0", "node-uid-0", "1", {}, {}, created=0.0)
    name = reboot["metadata"]["name"]
    running = World(
        skyhooks=[first, second],
        policies={},
        nodes=[node],
        jobs={name: job_facts(reboot, [])},
        maintenances={},
    )
    plan = plan_round(running, now=T0)
    assert not [a for a in plan.actions if isinstance(a, CreateJob | CreateMaintenance)]
    # Held back by an earlier Skyhook, the node waits (upstream's per-node priority).
    assert plan.rounds[-1].node_status == {"node-0": "waiting"}
    # Its reboot over, the disabled Skyhook no longer holds the node.
    reboot["status"] = {"conditions": [{"type": "Complete", "status": "True"}]}
    plan = plan_round(replace(running, jobs={name: job_facts(reboot, [])}), now=T0)
    assert [a.skyhook.name for a in plan.actions if isinstance(a, CreateMaintenance)] == ["second"]
