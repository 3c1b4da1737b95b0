"""An interrupt added to a package already complete without one (upstream's NodeState.NextStage:
a package with an interrupt is complete only at post-interrupt): the node is drained, the
interrupt and post-interrupt run, and only then is the node complete again. Upstream goes
straight to the interrupt (its drain runs only before apply); ours drains first, as for every
interrupt."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from maintenance_scheduler.skyhook.plan import (
    CreateJob,
    CreateMaintenance,
    NodeView,
    World,
    node_status,
    plan_round,
)
from maintenance_scheduler.skyhook.stages import (
    PackageState,
    interrupt_added,
    parse_node_state,
    render_node_state,
)
from nodeflow_contracts.skyhook import SKYHOOK
from tests.unit.maintenance_scheduler.skyhook.test_skyhook_plan import (
    T0,
    FakeCluster,
    cluster_nodes,
    run_until_settled,
    skyhook,
)

DRIVER = {"version": "1.0.0", "image": "ghcr.io/x/driver"}
REBOOT = {"interrupt": {"type": "reboot"}}


def driver_state(cluster: FakeCluster, node: str = "node-00") -> PackageState:
    raw = cluster.nodes[node].annotations[SKYHOOK.node_state_annotation("gpu-init")]
    return parse_node_state(raw)[0]["driver"]


def complete_without_interrupt() -> FakeCluster:
    cluster = FakeCluster(skyhooks=[skyhook(packages={"driver": DRIVER})], nodes=cluster_nodes(1))
    run_until_settled(cluster)
    assert cluster.status()["status"] == "complete"
    assert (driver_state(cluster).stage, driver_state(cluster).state) == ("config", "complete")
    return cluster


def edit_packages(cluster: FakeCluster, packages: dict[str, Any]) -> None:
    edited = skyhook(packages=packages, status=dict(cluster.skyhooks[0].status))
    cluster.skyhooks = [edited]


def test_rule_an_interrupt_added_to_a_complete_package_drains_then_runs_it() -> None:
    cluster = complete_without_interrupt()
    edit_packages(cluster, {"driver": {**DRIVER, **REBOOT}})
    seen: list[tuple[str, str]] = []
    for _ in range(12):
        plan = cluster.round()
        assert cluster.last_world is not None
        drained = set(cluster.last_world.maintenances.values()) == {"Ready"}
        for action in plan.actions:
            if isinstance(action, CreateMaintenance):
                seen.append(("drain", ""))
            elif isinstance(action, CreateJob):
                # Every stage of the added interrupt starts on a drained node.
                assert drained, action.stage
                seen.append(("job", action.stage))
    assert seen == [("drain", ""), ("job", "interrupt"), ("job", "post-interrupt")]
    entry = driver_state(cluster)
    assert (entry.stage, entry.state) == ("post-interrupt", "complete")
    assert cluster.status()["status"] == "complete"
    assert cluster.maintenances == {}, "the drain is released once post-interrupt is done"


def test_rule_a_node_whose_package_gained_an_interrupt_is_not_complete() -> None:
    cluster = complete_without_interrupt()
    edit_packages(cluster, {"driver": {**DRIVER, **REBOOT}})
    edited = cluster.skyhooks[0]
    entries = parse_node_state(
        cluster.nodes["node-00"].annotations[SKYHOOK.node_state_annotation("gpu-init")]
    )[0]
    assert node_status(edited, entries, True) != "complete"
    # The same entries are complete for the spec they ran.
    assert node_status(skyhook(packages={"driver": DRIVER}), entries, True) == "complete"


def test_rule_a_config_rerun_done_without_a_config_interrupt_never_runs_the_own_interrupt() -> None:
    """A config re-run whose changed keys have no configInterrupt completes at config
    (upstream's configUpdates): the package's own interrupt is not then taken as added."""
    package = {**DRIVER, **REBOOT, "configMap": {"a": "1"}}
    entry = PackageState(
        "driver",
        "1.0.0",
        "ghcr.io/x/driver",
        "config",
        "complete",
        rerun="config",
        written="config/complete",
    )
    parsed = skyhook(packages={"driver": package}).packages[0]
    assert not interrupt_added(parsed, entry)
    assert interrupt_added(parsed, replace(entry, rerun=""))


def test_rule_an_entry_written_before_reruns_were_marked_is_never_interrupted_on_a_guess() -> None:
    """An entry without `writtenAs` (an earlier release's, or upstream's own) complete at config:
    whether it was a config re-run is not known, so no reboot is started on it."""
    legacy = PackageState("driver", "1.0.0", "ghcr.io/x/driver", "config", "complete")
    node = NodeView(
        "node-00",
        "uid-0",
        "1",
        {},
        {SKYHOOK.node_state_annotation("gpu-init"): render_node_state({"driver": legacy})},
        created=0.0,
    )
    spec = skyhook(packages={"driver": {**DRIVER, **REBOOT}})
    # What render_node_state writes carries `writtenAs`; the earlier release's did not.
    raw = node.annotations[SKYHOOK.node_state_annotation("gpu-init")].replace(
        ',"writtenAs":"config/complete"', ""
    )
    assert "writtenAs" not in raw
    node = replace(node, annotations={SKYHOOK.node_state_annotation("gpu-init"): raw})
    plan = plan_round(World([spec], {}, [node], {}, {}), now=T0)
    assert not [a for a in plan.actions if isinstance(a, (CreateJob, CreateMaintenance))]


def test_rule_an_unmarked_entry_stays_uninterrupted_after_the_controller_stamps_it() -> None:
    """The controller stamps its `writtenAs` on an entry written without one at its first
    patch of the node: from then on the entry must still not read as an interrupt added
    (it is read as the config re-run it may have been), or the next round drains and
    reboots the node on the very guess the rule refuses."""
    annotation = SKYHOOK.node_state_annotation("gpu-init")
    legacy = PackageState("driver", "1.0.0", "ghcr.io/x/driver", "config", "complete")
    raw = render_node_state({"driver": legacy}).replace(',"writtenAs":"config/complete"', "")
    assert "writtenAs" not in raw
    nodes = {
        name: replace(node, annotations={**node.annotations, annotation: raw})
        for name, node in cluster_nodes(2).items()
    }
    cluster = FakeCluster(
        skyhooks=[skyhook(packages={"driver": {**DRIVER, **REBOOT}})], nodes=nodes
    )
    for _ in range(8):
        plan = cluster.round()
        assert not [a for a in plan.actions if isinstance(a, (CreateJob, CreateMaintenance))]
    assert "writtenAs" in cluster.nodes["node-00"].annotations[annotation], "stamped"
    assert (driver_state(cluster).stage, driver_state(cluster).state) == ("config", "complete")
    assert cluster.status()["status"] == "complete"
