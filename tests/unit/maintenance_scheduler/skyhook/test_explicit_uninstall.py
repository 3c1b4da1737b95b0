"""nodewright's explicit uninstall (upstream docs/uninstall.md; skyhook_controller.go
HandleUninstallRequests, HandleCancelledUninstalls, HandleFinalizer; pod_controller.go
HandleCompletePod; cluster_state_v2.go HasUninstallWork, UpdateUninstallConditions,
UpdateBlockedCondition). Each test names its rule; docs/maintenance-scheduler.md (S47..S52)
points here. Rules of a NodeWright only say so; the others hold for both kinds."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from maintenance_scheduler.skyhook.api import Skyhook, parse_skyhook
from maintenance_scheduler.skyhook.jobs import build_job
from maintenance_scheduler.skyhook.plan import (
    CreateJob,
    CreateMaintenance,
    FailJob,
    ForgetNode,
    PatchNode,
    SetSkyhookFinalizer,
    World,
    plan_round,
    step_node,
)
from maintenance_scheduler.skyhook.stages import (
    PackageState,
    parse_node_state,
    render_node_state,
)
from nodeflow_contracts.skyhook import FLAVORS, NODEWRIGHT, SKYHOOK, SkyhookNames
from tests.unit.maintenance_scheduler.skyhook.skyhook_cluster import Cluster, make_skyhook
from tests.unit.maintenance_scheduler.skyhook.test_skyhook_plan import (
    T0,
    FakeCluster,
    cluster_nodes,
    run_until_settled,
)

BOTH = pytest.mark.parametrize("names", FLAVORS, ids=[n.kind for n in FLAVORS])


def driver(
    *,
    apply: bool = False,
    enabled: bool = True,
    version: str = "1.0.0",
    interrupt: dict[str, Any] | None = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "version": version,
        "image": "ghcr.io/x/driver",
        "configMap": {"driver.conf": "mode=fast"},
        "uninstall": {"enabled": enabled, "apply": apply},
    }
    if interrupt is not None:
        spec["interrupt"] = interrupt
    return spec


TOOL = {"version": "1.0.0", "image": "ghcr.io/x/tool"}


def obj(
    names: SkyhookNames,
    packages: dict[str, Any],
    *,
    generation: int = 1,
    annotations: dict[str, str] | None = None,
) -> Skyhook:
    return parse_skyhook(
        {
            "apiVersion": names.api_version,
            "kind": names.kind,
            "metadata": {
                "name": "gpu-init",
                "uid": f"uid-{names.kind}",
                "generation": generation,
                "annotations": annotations or {},
                "finalizers": [names.finalizer],
            },
            "spec": {"packages": packages},
        }
    )


def respec(
    cluster: FakeCluster,
    packages: dict[str, Any],
    *,
    annotations: dict[str, str] | None = None,
) -> None:
    """The object's spec edited (a new generation), its status and deletion kept."""
    old = cluster.skyhooks[0]
    new = obj(old.names, packages, generation=old.generation + 1, annotations=annotations)
    cluster.skyhooks = [replace(new, status=old.status, deleting=old.deleting)]


def state(cluster: FakeCluster, node: str = "node-00") -> dict[str, PackageState]:
    names = cluster.skyhooks[0].names if cluster.skyhooks else SKYHOOK
    raw = cluster.nodes[node].annotations.get(names.node_state_annotation("gpu-init"))
    entries, readable = parse_node_state(raw)
    assert readable
    return dict(entries)


def with_entries(cluster: FakeCluster, names: SkyhookNames, *entries: PackageState) -> None:
    annotation = render_node_state({e.name: e for e in entries})
    for name, node in cluster.nodes.items():
        cluster.nodes[name] = replace(
            node,
            annotations={**node.annotations, names.node_state_annotation("gpu-init"): annotation},
        )


def conditions(cluster: FakeCluster) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in cluster.status().get("conditions", [])}


def stages_run(plans: list[Any], node: str = "node-00") -> list[tuple[str, str]]:
    return [
        (a.package.name, a.stage)
        for plan in plans
        for a in plan.actions
        if isinstance(a, CreateJob) and a.node == node
    ]


def rounds(cluster: FakeCluster, count: int = 12) -> list[Any]:
    return [cluster.round() for _ in range(count)]


def installed(names: SkyhookNames, packages: dict[str, Any], nodes: int = 1) -> FakeCluster:
    cluster = FakeCluster(skyhooks=[obj(names, packages)], nodes=cluster_nodes(nodes))
    run_until_settled(cluster)
    assert cluster.status()["status"] == "complete"
    return cluster


# --- rule 1: an uninstall starts only from a complete install -------------------------------------


@BOTH
def test_rule_an_uninstall_waits_for_the_install_under_way_to_complete(
    names: SkyhookNames,
) -> None:
    cluster = FakeCluster(skyhooks=[obj(names, {"driver": driver()})], nodes=cluster_nodes(1))
    first = cluster.round()
    assert stages_run([first]) == [("driver", "apply")]
    respec(cluster, {"driver": driver(apply=True)})
    ran = stages_run(rounds(cluster))
    # The install finishes (config) before the uninstall starts.
    assert ran == [("driver", "config"), ("driver", "uninstall")]
    assert "driver" not in state(cluster)
    assert cluster.status()["status"] == "complete"


@BOTH
def test_rule_an_erroring_install_starts_no_uninstall(names: SkyhookNames) -> None:
    """nodewright's known gap, kept: the install goes on (retried once its failed Job is
    gone) and the uninstall waits for it to complete."""
    skyhook = obj(names, {"driver": driver(apply=True)})
    erroring = PackageState(
        "driver", "1.0.0", "ghcr.io/x/driver", "apply", "erroring", run="r1", message="boom"
    )
    node = cluster_nodes(1)["node-00"]
    world = World(skyhooks=[skyhook], policies={}, nodes=[node], jobs={}, maintenances={})
    step = step_node(
        skyhook,
        "node-00",
        {"driver": erroring},
        world,
        may_start=True,
        now=T0,
        pull_grace_seconds=120,
        node_view=node,
    )
    jobs = [a for a in step.actions if isinstance(a, CreateJob)]
    assert [(a.package.name, a.stage) for a in jobs] == [("driver", "apply")]
    retried = step.entries["driver"]
    assert (retried.stage, retried.state, retried.restarts) == ("apply", "in_progress", 1)


# --- rule 2: uninstall-interrupt ------------------------------------------------------------------


@BOTH
def test_rule_an_uninstall_with_an_interrupt_runs_uninstall_interrupt_drained_then_goes(
    names: SkyhookNames,
) -> None:
    reboot = {"type": "reboot"}
    cluster = installed(names, {"driver": driver(interrupt=reboot), "tool": TOOL})
    respec(cluster, {"driver": driver(apply=True, interrupt=reboot), "tool": TOOL})
    plans = rounds(cluster, 16)
    ran = stages_run(plans)
    assert ran == [("driver", "uninstall"), ("driver", "uninstall-interrupt")]
    jobs = [a for p in plans for a in p.actions if isinstance(a, CreateJob)]
    assert jobs[1].package.interrupt is not None and jobs[1].package.interrupt.type == "reboot"
    # The drain is requested before the uninstall (S53) and holds through its interrupt.
    order = [
        type(a).__name__ + (f":{a.stage}" if isinstance(a, CreateJob) else "")
        for p in plans
        for a in p.actions
        if isinstance(a, CreateJob | CreateMaintenance)
    ]
    assert order == ["CreateMaintenance", "CreateJob:uninstall", "CreateJob:uninstall-interrupt"]
    assert set(state(cluster)) == {"tool"}
    assert cluster.maintenances == {}  # released once the interrupt is done
    assert cluster.status()["status"] == "complete"


@BOTH
def test_rule_the_uninstall_of_a_package_with_an_interrupt_runs_on_a_drained_node(
    names: SkyhookNames,
) -> None:
    """As upstream's ProcessInterrupt drains before the uninstall pod of a package with an
    interrupt (as before its apply): no uninstall Job while the node's NodeMaintenance is
    not Ready; a package without an interrupt uninstalls undrained."""
    reboot = {"type": "reboot"}
    cluster = installed(names, {"driver": driver(interrupt=reboot), "tool": driver()})
    respec(
        cluster,
        {"driver": driver(apply=True, interrupt=reboot), "tool": driver(apply=True)},
    )
    request = cluster.world().request_of(cluster.skyhooks[0], "node-00")
    cluster.held_pending.add(request)
    plans = rounds(cluster, 4)
    assert request in cluster.maintenances  # requested, held Pending
    assert stages_run(plans) == [("tool", "uninstall")]
    cluster.held_pending.clear()
    plans = rounds(cluster, 12)
    assert stages_run(plans) == [("driver", "uninstall"), ("driver", "uninstall-interrupt")]
    assert state(cluster) == {}
    assert cluster.maintenances == {}


@BOTH
def test_rule_a_committed_uninstall_interrupt_runs_to_its_end_with_its_recorded_interrupt(
    names: SkyhookNames,
) -> None:
    """Neither turning apply off nor removing the interrupt from the spec strands the node
    (nodewright's known issue): the interrupt recorded at commit time runs, then the entry
    goes, and (apply off) the package is installed again."""
    cluster = FakeCluster(skyhooks=[obj(names, {"driver": driver()})], nodes=cluster_nodes(1))
    # As the controller wrote it when the uninstall Job completed (a reboot recorded).
    committed = {
        "driver|1.0.0": {
            "name": "driver",
            "version": "1.0.0",
            "image": "ghcr.io/x/driver",
            "stage": "uninstall-interrupt",
            "state": "in_progress",
            "restarts": 0,
            "run": "r1",
            "uninstallInterrupt": {"type": "reboot"},
            "writtenAs": "uninstall-interrupt/in_progress",
        }
    }
    node = cluster.nodes["node-00"]
    key = names.node_state_annotation("gpu-init")
    cluster.nodes["node-00"] = replace(node, annotations={key: json.dumps(committed)})
    plans = rounds(cluster, 12)
    ran = stages_run(plans)
    assert ran[0] == ("driver", "uninstall-interrupt")
    first = next(a for p in plans for a in p.actions if isinstance(a, CreateJob))
    assert first.package.interrupt is not None and first.package.interrupt.type == "reboot"
    assert any(isinstance(a, CreateMaintenance) for a in plans[0].actions)
    assert ("driver", "apply") in ran[1:]  # reinstalled after the uninstall ended
    assert state(cluster)["driver"].stage != "uninstall-interrupt"


# --- rule 3: cancel -------------------------------------------------------------------------------


@BOTH
def test_rule_cancelling_a_running_uninstall_goes_back_to_apply_and_ends_its_job(
    names: SkyhookNames,
) -> None:
    cluster = installed(names, {"driver": driver()})
    respec(cluster, {"driver": driver(apply=True)})
    started = cluster.round()
    uninstall = next(a for a in started.actions if isinstance(a, CreateJob))
    assert uninstall.stage == "uninstall"
    before = state(cluster)["driver"]
    # Its pod on the node, as observe.job_facts labels it.
    owner = cluster.skyhooks[0].owner_key
    cluster.jobs[uninstall.name] = replace(
        cluster.jobs[uninstall.name], slot=(owner, "driver", "node-00"), stage="uninstall"
    )
    respec(cluster, {"driver": driver(apply=False)})
    # Planned while the uninstall Job still runs.
    plan = plan_round(cluster.world(), now=cluster.now + 1)
    ended = [a for a in plan.actions if isinstance(a, FailJob)]
    assert [a.name for a in ended] == [uninstall.name]
    patch = next(a for a in plan.actions if isinstance(a, PatchNode))
    entry = parse_node_state(patch.node_state)[0]["driver"]
    assert (entry.stage, entry.state) == ("apply", "in_progress")
    assert entry.run != before.run  # a new run: the old apply Job proves nothing now
    # No apply beside the uninstall pod still on the node.
    assert not [a for a in plan.actions if isinstance(a, CreateJob)]


@BOTH
def test_rule_cancelling_an_erroring_uninstall_reinstalls_from_apply(names: SkyhookNames) -> None:
    cluster = FakeCluster(skyhooks=[obj(names, {"driver": driver()})], nodes=cluster_nodes(1))
    failed = PackageState(
        "driver", "1.0.0", "ghcr.io/x/driver", "uninstall", "erroring", run="r1", message="x"
    )
    with_entries(cluster, names, failed)
    ran = stages_run(rounds(cluster, 8))
    assert ran[0] == ("driver", "apply")
    assert ("driver", "uninstall") not in ran
    assert state(cluster)["driver"].state == "complete"
    assert cluster.status()["status"] == "complete"


# --- rule 4: deletion -----------------------------------------------------------------------------


@BOTH
def test_rule_deleting_uninstalls_enabled_packages_on_every_node_before_the_finalizer_cleanup(
    names: SkyhookNames,
) -> None:
    cluster = installed(names, {"driver": driver(), "tool": TOOL}, nodes=2)
    cluster.delete("gpu-init")
    uninstalled: set[str] = set()
    for _ in range(20):
        plan = cluster.round()
        for action in plan.actions:
            if isinstance(action, CreateJob):
                assert (action.package.name, action.stage) == ("driver", "uninstall")
                uninstalled.add(action.node)
            if isinstance(action, ForgetNode | SetSkyhookFinalizer):
                # The cleanup runs only once every node is uninstalled.
                assert uninstalled == {"node-00", "node-01"}
        if not cluster.skyhooks:
            break
    assert uninstalled == {"node-00", "node-01"}
    assert not cluster.skyhooks  # the finalizer was dropped


@BOTH
@pytest.mark.parametrize(
    ("annotations", "reason"),
    [("pause", "PausedWithPendingUninstall"), ("disable", "DisabledWithPendingUninstall")],
)
def test_rule_a_paused_or_disabled_deleted_object_with_pending_uninstall_is_deletion_blocked(
    names: SkyhookNames, annotations: str, reason: str
) -> None:
    cluster = installed(names, {"driver": driver(), "tool": TOOL})
    key = names.pause_annotation if annotations == "pause" else names.disable_annotation
    respec(cluster, {"driver": driver(), "tool": TOOL}, annotations={key: "true"})
    cluster.delete("gpu-init")
    plans = rounds(cluster, 4)
    assert not [a for p in plans for a in p.actions if isinstance(a, CreateJob | ForgetNode)]
    blocked = conditions(cluster)["DeletionBlocked"]
    assert (blocked["status"], blocked["reason"]) == ("True", reason)
    # Unblocked: the uninstall runs, the condition goes, then the finalizer.
    respec(cluster, {"driver": driver(), "tool": TOOL})
    cluster.round()
    assert "DeletionBlocked" not in conditions(cluster)
    run_until_settled(cluster)
    assert not cluster.skyhooks


@BOTH
@pytest.mark.parametrize(
    ("annotations", "message"),
    [
        (
            "pause",
            "Skyhook is paused with uninstall-enabled packages still tracked in nodeState. "
            "Unpause to let uninstall complete before deletion.",
        ),
        (
            "disable",
            "Skyhook is disabled with uninstall-enabled packages still tracked in nodeState. "
            "Re-enable the Skyhook to let uninstall complete before deletion.",
        ),
        (
            "malformed",
            "Cannot safely delete Skyhook: malformed nodeState on one or more nodes "
            "(node-00). Repair the nodeState annotation before deletion.",
        ),
    ],
)
def test_rule_deletion_blocked_says_what_upstream_says(
    names: SkyhookNames, annotations: str, message: str
) -> None:
    """DeletionBlocked's messages are upstream's HandleFinalizer's, word for word (the
    malformed one also names the nodes it cannot read)."""
    cluster = installed(names, {"driver": driver(), "tool": TOOL})
    if annotations == "malformed":
        node = cluster.nodes["node-00"]
        key = names.node_state_annotation("gpu-init")
        cluster.nodes["node-00"] = replace(node, annotations={**node.annotations, key: "{"})
    else:
        key = names.pause_annotation if annotations == "pause" else names.disable_annotation
        respec(cluster, {"driver": driver(), "tool": TOOL}, annotations={key: "true"})
    cluster.delete("gpu-init")
    rounds(cluster, 2)
    assert conditions(cluster)["DeletionBlocked"]["message"] == message


@BOTH
def test_rule_an_unreadable_node_state_blocks_the_deletion_as_malformed(
    names: SkyhookNames,
) -> None:
    cluster = installed(names, {"driver": driver()}, nodes=2)
    node = cluster.nodes["node-01"]
    cluster.nodes["node-01"] = replace(
        node,
        annotations={**node.annotations, names.node_state_annotation("gpu-init"): "{not json"},
    )
    cluster.delete("gpu-init")
    plans = rounds(cluster, 6)
    assert not [a for p in plans for a in p.actions if isinstance(a, ForgetNode)]
    assert conditions(cluster)["DeletionBlocked"]["reason"] == "MalformedNodeState"
    assert cluster.skyhooks


@BOTH
def test_rule_uninstall_conditions_follow_the_uninstall_cycle_on_the_nodes(
    names: SkyhookNames,
) -> None:
    cluster = installed(names, {"driver": driver()})
    assert "UninstallInProgress" not in conditions(cluster)
    cluster.fail_images = ("ghcr.io/x/driver",)
    respec(cluster, {"driver": driver(apply=True)})
    rounds(cluster, 3)
    assert (state(cluster)["driver"].stage, state(cluster)["driver"].state) == (
        "uninstall",
        "erroring",
    )
    shown = conditions(cluster)
    assert shown["UninstallInProgress"]["status"] == "True"
    assert (shown["UninstallFailed"]["status"], shown["UninstallFailed"]["reason"]) == (
        "True",
        "UninstallPodFailing",
    )
    # Cancelled: back to the install, the conditions go.
    cluster.fail_images = ()
    respec(cluster, {"driver": driver(apply=False)})
    run_until_settled(cluster)
    assert state(cluster)["driver"].state == "complete"
    shown = conditions(cluster)
    assert "UninstallInProgress" not in shown and "UninstallFailed" not in shown


# --- rule 5: a NodeWright's removal and downgrade -------------------------------------------------


def test_rule_a_nodewright_package_removed_runs_uninstall_only_if_enabled_else_stays_a_marker() -> (
    None
):
    cluster = installed(NODEWRIGHT, {"driver": driver(), "tool": TOOL})
    respec(cluster, {})
    ran = stages_run(rounds(cluster))
    assert ran == [("driver", "uninstall")]
    left = state(cluster)
    assert set(left) == {"tool|1.0.0"}
    assert left["tool|1.0.0"].retained and left["tool|1.0.0"].state == "complete"
    assert cluster.status()["status"] == "complete"
    # The marker is not worked on again.
    assert not cluster.round().actions


@pytest.mark.parametrize("rounds_before_delete", [0, 1])
def test_rule_a_deleted_nodewright_uninstalls_a_removed_enabled_package_before_its_cleanup(
    rounds_before_delete: int,
) -> None:
    """A NodeWright's package removed with uninstall.enabled (S51: uninstalled as the
    finalizer would) and the object deleted before that uninstall is done (not started yet,
    or its Job running): the finalizer's cleanup waits for it (S50), as it would have had
    the package stayed in the spec (upstream's webhook keeps it there until it is gone)."""
    cluster = installed(NODEWRIGHT, {"driver": driver(), "tool": TOOL}, nodes=2)
    respec(cluster, {"tool": TOOL})
    plans = rounds(cluster, rounds_before_delete)
    cluster.delete("gpu-init")
    for _ in range(20):
        before = {node: state(cluster, node) for node in ("node-00", "node-01")}
        plan = cluster.round()
        plans.append(plan)
        if any(isinstance(a, ForgetNode | SetSkyhookFinalizer) for a in plan.actions):
            # The cleanup runs only once the removed package is gone from every node.
            for node, entries in before.items():
                assert "driver" not in entries, (node, entries["driver"])
        if not cluster.skyhooks:
            break
    assert not cluster.skyhooks  # the finalizer was dropped
    for node in ("node-00", "node-01"):
        assert stages_run(plans, node) == [("driver", "uninstall")], node


def test_rule_the_legacy_skyhook_kind_uninstalls_every_removed_package() -> None:
    cluster = installed(SKYHOOK, {"driver": driver(), "tool": TOOL})
    respec(cluster, {})
    ran = stages_run(rounds(cluster))
    assert sorted(ran) == [("driver", "uninstall"), ("tool", "uninstall")]
    assert state(cluster) == {}


def test_rule_a_nodewright_downgrade_without_uninstall_keeps_the_old_entry_beside_the_new() -> None:
    cluster = installed(NODEWRIGHT, {"driver": driver(enabled=False, version="2.0.0")})
    respec(cluster, {"driver": driver(enabled=False, version="1.0.0")})
    ran = stages_run(rounds(cluster))
    assert ran == [("driver", "apply"), ("driver", "config")]
    left = state(cluster)
    assert set(left) == {"driver", "driver|2.0.0"}
    assert left["driver"].version == "1.0.0" and left["driver"].state == "complete"
    assert left["driver|2.0.0"].retained
    assert cluster.status()["status"] == "complete"


def test_rule_a_nodewright_downgrade_with_uninstall_enabled_keeps_the_installed_version() -> None:
    cluster = installed(NODEWRIGHT, {"driver": driver(version="2.0.0")})
    respec(cluster, {"driver": driver(version="1.0.0")})
    assert stages_run(rounds(cluster, 6)) == []
    assert state(cluster)["driver"].version == "2.0.0"
    held = conditions(cluster)["DowngradeBlocked"]
    assert held["status"] == "True" and "uninstall" in held["message"]


def test_rule_the_legacy_skyhook_kind_still_uninstalls_before_a_downgrade() -> None:
    cluster = installed(SKYHOOK, {"driver": driver(enabled=False, version="2.0.0")})
    respec(cluster, {"driver": driver(enabled=False, version="1.0.0")})
    assert stages_run(rounds(cluster))[0] == ("driver", "uninstall")


# --- rule 6: dependencies -------------------------------------------------------------------------


@BOTH
def test_rule_a_package_depending_on_one_being_uninstalled_is_blocked_without_cascade(
    names: SkyhookNames,
) -> None:
    tool = {**TOOL, "dependsOn": {"driver": "1.0.0"}}
    cluster = installed(names, {"driver": driver(), "tool": tool})
    newer = {**tool, "version": "1.1.0"}
    respec(cluster, {"driver": driver(apply=True), "tool": newer})
    ran = stages_run(rounds(cluster))
    assert ran == [("driver", "uninstall")]  # tool's upgrade never starts
    left = state(cluster)
    assert set(left) == {"tool"} and left["tool"].version == "1.0.0"
    blocked = conditions(cluster)["Blocked"]
    assert blocked["reason"] == "DependencyUninstalled"
    assert "dependency driver has been uninstalled" in blocked["message"]


def test_rule_a_nodewright_package_enabled_after_its_install_is_uninstalled_when_removed() -> None:
    """The flag is recorded on complete nodes too (not only when a stage runs there)."""
    cluster = installed(NODEWRIGHT, {"driver": driver(enabled=False)}, nodes=2)
    respec(cluster, {"driver": driver(enabled=True)})
    run_until_settled(cluster)
    assert all(state(cluster, n)["driver"].uninstall_enabled for n in cluster.nodes)
    respec(cluster, {})
    plans = rounds(cluster)
    assert {n: stages_run(plans, n) for n in cluster.nodes} == {
        "node-00": [("driver", "uninstall")],
        "node-01": [("driver", "uninstall")],
    }


@BOTH
def test_rule_an_uninstall_interrupt_job_is_an_interrupt_pod(names: SkyhookNames) -> None:
    skyhook = obj(names, {"driver": driver(interrupt={"type": "reboot"})})
    job = build_job(
        skyhook,
        skyhook.packages[0],
        "uninstall-interrupt",
        "node-00",
        namespace="skyhook",
        default_stage_timeout_seconds=0,
    )
    pod = job["spec"]["template"]["spec"]
    assert [c["name"] for c in pod["initContainers"]] == ["interrupt"]
    assert pod["restartPolicy"] == "OnFailure"
    assert "podFailurePolicy" not in job["spec"]


UNINSTALL_KINDS = st.sampled_from([None, "reboot", "restartAllServices", "noop"])
INTERRUPTING = ("interrupt", "uninstall-interrupt")


@settings(max_examples=40, deadline=None)
@given(
    kinds=st.lists(UNINSTALL_KINDS, min_size=1, max_size=4),
    asked=st.lists(st.booleans(), min_size=4, max_size=4),
    cancelled=st.lists(st.booleans(), min_size=4, max_size=4),
    cancel_after=st.integers(min_value=0, max_value=6),
    pending_rounds=st.integers(min_value=0, max_value=4),
)
def test_property_an_uninstall_never_interrupts_an_undrained_node_and_ends_as_asked(
    kinds: list[str | None],
    asked: list[bool],
    cancelled: list[bool],
    cancel_after: int,
    pending_rounds: int,
) -> None:
    """Whatever is uninstalled and cancelled when: no interrupt Job starts before the node's
    NodeMaintenance is Ready, never two interrupt Jobs at once on the node, and in the end a
    package still asked to go is absent, every other one installed, the node released."""

    def spec(apply: list[bool]) -> dict[str, Any]:
        packages: dict[str, Any] = {}
        for i, kind in enumerate(kinds):
            one = driver(apply=apply[i], interrupt=None if kind is None else {"type": kind})
            packages[f"pkg-{i}x"] = {**one, "image": f"ghcr.io/x/p{i}"}
        return packages

    def step(cluster: Cluster) -> bool:
        moved = bool(cluster.round().actions)
        running = [
            name
            for name, job in cluster.jobs.items()
            if not job.get("status")
            and job["metadata"]["labels"][SKYHOOK.stage_label] in INTERRUPTING
        ]
        assert len(running) <= 1, running
        return moved

    count = len(kinds)
    cluster = Cluster.of(make_skyhook(spec([False] * count)))
    cluster.settle(80)
    assert cluster.status() == "complete"
    mark = len(cluster.created)
    cluster.change(spec(asked[:count]))
    cluster.held_pending = True
    for _ in range(pending_rounds):
        step(cluster)
    cluster.held_pending = False
    for _ in range(cancel_after):
        step(cluster)
    final = [asked[i] and not cancelled[i] for i in range(count)]
    cluster.change(spec(final))
    for _ in range(120):
        if not step(cluster):
            break
    for action in cluster.created[mark:]:
        if action.stage in INTERRUPTING:
            assert cluster.phase_at_create[action.name] == "Ready", action
    raw = cluster.nodes["node-0"].annotations.get(SKYHOOK.node_state_annotation("gpu-init"))
    left, readable = parse_node_state(raw)
    assert readable
    for i in range(count):
        name = f"pkg-{i}x"
        if final[i]:
            assert name not in left, (name, left.get(name))
        else:
            assert left[name].state == "complete", (name, left.get(name))
    assert cluster.maintenances == {}
    assert cluster.status() == "complete"
