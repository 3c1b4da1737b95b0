"""Issue 29 item 4: what a Skyhook shows (`kubectl get skyhooks`, node labels, conditions,
metrics) and the fields that shape its rollout, as NVIDIA's Skyhook operator (nodewright)
computes them. Each test names the rule; docs/maintenance-scheduler.md points here."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from prometheus_client import REGISTRY

from maintenance_scheduler.skyhook import metrics
from maintenance_scheduler.skyhook.api import (
    NODE_STATE_VERSION,
    SKYHOOK_FINALIZER,
    Budget,
    Skyhook,
    auto_taint_annotation,
    cordon_annotation,
    node_state_annotation,
    parse_deployment_policy,
    parse_skyhook,
    policy_for,
    version_annotation,
)
from maintenance_scheduler.skyhook.plan import (
    CreateJob,
    ForgetNode,
    NodeView,
    PatchNode,
    SetRuntimeTaint,
    SetSkyhookStatus,
    World,
    collect_node_status,
    plan_round,
    stamp_conditions,
)
from maintenance_scheduler.skyhook.stages import PackageState, render_node_state
from nodeflow_kube.fields import rfc3339
from tests.unit.maintenance_scheduler.skyhook.test_skyhook_plan import (
    T0,
    FakeCluster,
    cluster_nodes,
    exponential_policy,
    run_until_settled,
)

DRIVER = {"driver": {"version": "1.0.0", "image": "ghcr.io/x/driver"}}


def make(
    spec: dict[str, Any],
    *,
    name: str = "gpu-init",
    annotations: dict[str, str] | None = None,
    generation: int = 1,
) -> Skyhook:
    return parse_skyhook(
        {
            "metadata": {
                "name": name,
                "uid": f"uid-{name}",
                "generation": generation,
                "annotations": annotations or {},
                "finalizers": [SKYHOOK_FINALIZER],
            },
            "spec": {"packages": DRIVER, **spec},
        }
    )


def conditions(cluster: FakeCluster, name: str = "gpu-init") -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in cluster.status(name)["conditions"]}


def driver_state(state: str, version: str = "1.0.0", stage: str = "apply") -> str:
    entry = PackageState("driver", version, "ghcr.io/x/driver", stage, state)
    return render_node_state({"driver": entry})


def with_state(node: NodeView, skyhook: str, annotation: str) -> NodeView:
    return replace(
        node, annotations={**node.annotations, node_state_annotation(skyhook): annotation}
    )


# --- node status ------------------------------------------------------------------------------


def test_rule_a_node_held_by_an_earlier_skyhook_shows_waiting() -> None:
    first = make({"priority": 10}, name="first")
    second = make({"priority": 20}, name="second")
    cluster = FakeCluster(skyhooks=[first, second], nodes=cluster_nodes(1))
    cluster.round()
    assert cluster.status("second")["nodeStatus"] == {"node-00": "waiting"}


def test_rule_every_node_of_a_paused_skyhook_shows_paused() -> None:
    cluster = FakeCluster(skyhooks=[make({})], nodes=cluster_nodes(2))
    cluster.round()
    cluster.skyhooks = [replace(cluster.skyhooks[0], paused=True)]
    cluster.round()
    assert cluster.status()["status"] == "paused"
    assert cluster.status()["nodeStatus"] == {"node-00": "paused", "node-01": "paused"}
    assert cluster.nodes["node-00"].labels["skyhook.nvidia.com/status_gpu-init"] == "paused"


def test_rule_every_node_of_a_disabled_skyhook_not_complete_shows_disabled() -> None:
    cluster = FakeCluster(skyhooks=[make({})], nodes=cluster_nodes(2))
    cluster.round()
    cluster.skyhooks = [replace(cluster.skyhooks[0], disabled=True)]
    cluster.round()
    assert cluster.status()["status"] == "disabled"
    assert set(cluster.status()["nodeStatus"].values()) == {"disabled"}


def test_rule_a_node_with_a_taint_it_does_not_tolerate_is_blocked_taint_not_tolerable() -> None:
    nodes = cluster_nodes(2)
    taint = {"key": "gpu", "value": "broken", "effect": "NoSchedule"}
    nodes["node-00"] = replace(nodes["node-00"], taints=(taint,))
    cluster = FakeCluster(skyhooks=[make({})], nodes=nodes)
    plan = cluster.round()
    assert {a.node for a in plan.actions if isinstance(a, CreateJob)} == {"node-01"}
    assert cluster.status()["nodeStatus"]["node-00"] == "blocked"
    found = conditions(cluster)["TaintNotTolerable"]
    assert (found["status"], found["reason"]) == ("True", "TaintNotTolerable")
    assert "node-00" in found["message"]
    # additionalTolerations tolerate it: the node works, the condition clears.
    tolerant = make({"additionalTolerations": [{"key": "gpu", "operator": "Exists"}]})
    fresh = cluster_nodes(2)
    fresh["node-00"] = replace(fresh["node-00"], taints=(taint,))
    cluster = FakeCluster(skyhooks=[tolerant], nodes=fresh)
    plan = cluster.round()
    assert {a.node for a in plan.actions if isinstance(a, CreateJob)} == {"node-00", "node-01"}
    assert conditions(cluster)["TaintNotTolerable"]["status"] == "False"


def test_rule_a_cordon_and_for_runtime_required_its_taint_are_tolerated() -> None:
    nodes = cluster_nodes(1)
    cordon = {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}
    runtime = {"key": "skyhook.nvidia.com", "value": "runtime-required", "effect": "NoSchedule"}
    nodes["node-00"] = replace(nodes["node-00"], taints=(cordon, runtime))
    plain = FakeCluster(skyhooks=[make({})], nodes=nodes)
    plain.round()
    assert plain.status()["nodeStatus"] == {"node-00": "blocked"}
    required = FakeCluster(skyhooks=[make({"runtimeRequired": True})], nodes=nodes)
    plan = required.round()
    assert [a.node for a in plan.actions if isinstance(a, CreateJob)] == ["node-00"]


def test_rule_an_ignored_node_stays_targeted_blocked_and_sets_nodes_ignored() -> None:
    nodes = cluster_nodes(2)
    nodes["node-00"] = replace(nodes["node-00"], labels={"skyhook.nvidia.com/ignore": "true"})
    cluster = FakeCluster(skyhooks=[make({})], nodes=nodes)
    plan = cluster.round()
    assert {a.node for a in plan.actions if isinstance(a, CreateJob)} == {"node-01"}
    status = cluster.status()
    assert status["nodeStatus"]["node-00"] == "blocked"
    assert status["completeNodes"] == "0/2"
    found = conditions(cluster)["NodesIgnored"]
    assert (found["status"], found["reason"]) == ("True", "NodesIgnored")
    assert found["message"] == "Node [node-00] has ignore label set. Skipping."
    run_until_settled(cluster)
    # The others done, the ignored node alone remains: blocked.
    assert cluster.status()["status"] == "blocked"


def test_rule_condition_messages_count_nodes_past_ten() -> None:
    nodes = {
        name: replace(node, labels={"skyhook.nvidia.com/ignore": "true"})
        for name, node in cluster_nodes(11).items()
    }
    cluster = FakeCluster(skyhooks=[make({})], nodes=nodes)
    cluster.round()
    assert conditions(cluster)["NodesIgnored"]["message"] == (
        "11 nodes have ignore label set. Skipping."
    )


# --- roll-up ----------------------------------------------------------------------------------


def test_rule_roll_up_is_in_progress_while_a_node_is_even_beside_erroring_ones() -> None:
    skyhook = make({})
    nodes = cluster_nodes(2)
    nodes["node-00"] = with_state(nodes["node-00"], "gpu-init", driver_state("erroring"))
    world = World([skyhook], {}, list(nodes.values()), {}, {})
    plan = plan_round(world, now=T0)
    (status,) = (a.status for a in plan.actions if isinstance(a, SetSkyhookStatus))
    assert status["nodeStatus"] == {"node-00": "erroring", "node-01": "in_progress"}
    assert status["status"] == "in_progress"
    # nodesInProgress counts erroring nodes with the ones in progress (upstream's column).
    assert status["nodesInProgress"] == 2


def test_rule_roll_up_is_erroring_only_when_every_remaining_node_errors() -> None:
    assert collect_node_status(["erroring", "complete", "erroring"]) == "erroring"
    assert collect_node_status(["erroring", "waiting"]) == "unknown"
    assert collect_node_status(["blocked", "complete"]) == "blocked"
    assert collect_node_status(["waiting", "waiting"]) == "waiting"
    assert collect_node_status(["complete", "complete"]) == "complete"
    assert collect_node_status([]) == "complete"
    assert collect_node_status(["in_progress", "erroring", "blocked"]) == "in_progress"


def test_rule_a_missing_policy_blocks_the_skyhook_even_when_its_nodes_are_complete() -> None:
    nodes = {
        n: with_state(v, "gpu-init", driver_state("complete", stage="config"))
        for n, v in cluster_nodes(1).items()
    }
    cluster = FakeCluster(skyhooks=[make({"deploymentPolicy": "gone"})], nodes=nodes)
    cluster.round()
    assert cluster.status()["status"] == "blocked"


def test_rule_an_earlier_sequencing_all_skyhook_not_complete_makes_it_waiting() -> None:
    first = make({"priority": 10, "sequencing": "all"}, name="first")
    second = make({"priority": 20}, name="second")
    nodes = cluster_nodes(2)
    # `second` had started on node-00 before `first` came: its node is in progress, yet the
    # Skyhook waits for `first` to be complete everywhere.
    nodes["node-00"] = with_state(nodes["node-00"], "second", driver_state("in_progress"))
    cluster = FakeCluster(skyhooks=[first, second], nodes=nodes)
    cluster.round()
    assert cluster.status("second")["nodeStatus"]["node-00"] == "in_progress"
    assert cluster.status("second")["status"] == "waiting"


# --- conditions -------------------------------------------------------------------------------


def test_rule_conditions_are_metav1_conditions_with_last_transition_time() -> None:
    cluster = FakeCluster(skyhooks=[make({}, generation=3)], nodes=cluster_nodes(1))
    cluster.round()
    first = conditions(cluster)
    for condition in first.values():
        assert condition["observedGeneration"] == 3
        assert condition["lastTransitionTime"] == rfc3339(T0 + 1)
    run_until_settled(cluster)
    last = conditions(cluster)
    # Ready went False -> True: its time moved; NodesIgnored stayed False: its time stayed.
    assert last["Ready"]["status"] == "True"
    assert last["Ready"]["lastTransitionTime"] != rfc3339(T0 + 1)
    assert last["NodesIgnored"]["lastTransitionTime"] == rfc3339(T0 + 1)


def test_rule_an_unchanged_condition_keeps_its_transition_time() -> None:
    previous = [{"type": "Ready", "status": "False", "lastTransitionTime": "2020-01-01T00:00:00Z"}]
    again = {"type": "Ready", "status": "False", "reason": "Waiting", "message": "m"}
    (kept,) = stamp_conditions([again], previous, 2, T0)
    assert kept["lastTransitionTime"] == "2020-01-01T00:00:00Z"
    (moved,) = stamp_conditions([{**again, "status": "True"}], previous, 2, T0)
    assert moved["lastTransitionTime"] == rfc3339(T0)


# --- validation -------------------------------------------------------------------------------


def test_rule_interruption_budget_count_zero_is_valid_and_moves_one_node_at_a_time() -> None:
    skyhook = make({"interruptionBudget": {"count": 0}})
    assert skyhook.problems == ()
    cluster = FakeCluster(skyhooks=[skyhook], nodes=cluster_nodes(3))
    run_until_settled(cluster)
    assert cluster.status()["status"] == "complete"
    assert [len(batch) for batch in cluster.batches] == [1, 1, 1]
    assert make({"interruptionBudget": {"percent": 0}}).problems == ()
    assert make({"interruptionBudget": {"count": -1}}).problems != ()


def test_rule_versions_x_mod_semver_accepts_are_valid() -> None:
    for version in ("1.2", "1", "v1.2", "1.2.3-rc.1+build.5"):
        package = {"driver": {"version": version, "image": "ghcr.io/x/driver"}}
        assert make({"packages": package}).problems == (), version
    for version in ("1.2-rc1", "01.2.3", "1.2.3.4", "1.2.3-01"):
        package = {"driver": {"version": version, "image": "ghcr.io/x/driver"}}
        assert make({"packages": package}).problems != (), version


def test_rule_percent_ceiling_rounds_down_with_a_minimum_of_one() -> None:
    # upstream: max(1, int(float64(n) * (float64(p) / 100))).
    assert Budget(percent=33).ceiling(10) == 3
    assert Budget(percent=10).ceiling(5) == 1
    assert Budget(percent=99).ceiling(3) == 2
    assert Budget(percent=50).ceiling(0) == 0
    assert Budget(percent=25).legacy_batch(7) == 1
    assert Budget(count=0).legacy_batch(4) == 1
    assert Budget(count=9).legacy_batch(4) == 4


def test_rule_percent_ceiling_divides_the_percent_first_as_upstream() -> None:
    # 100 x 0.29 is 28.999... in float64: upstream's CalculateCeiling gives 28, not 29.
    assert Budget(percent=29).ceiling(100) == 28
    assert Budget(percent=58).ceiling(50) == 28
    assert Budget(percent=29).legacy_batch(100) == 28
    assert Budget(percent=58).legacy_batch(50) == 28
    assert Budget(percent=50).ceiling(10) == 5


# --- batch state reset ------------------------------------------------------------------------


def _reset_policy(reset: bool) -> Any:
    return parse_deployment_policy(
        {
            "metadata": {"name": "exp"},
            "spec": {
                "default": {
                    "budget": {"percent": 100},
                    "strategy": {"exponential": {"initialBatch": 1}},
                },
                "resetBatchStateOnCompletion": reset,
            },
        }
    )


def test_rule_deployment_policy_options_reset_overrides_the_policy() -> None:
    for policy_says, skyhook_says in ((True, False), (False, True)):
        spec = {
            "deploymentPolicy": "exp",
            "deploymentPolicyOptions": {"resetBatchStateOnCompletion": skyhook_says},
        }
        cluster = FakeCluster(
            skyhooks=[make(spec)],
            nodes=cluster_nodes(2),
            policies={"exp": _reset_policy(policy_says)},
        )
        run_until_settled(cluster)
        assert cluster.status()["status"] == "complete"
        kept = "batchState" in cluster.status()["compartmentStatuses"]["__default__"]
        assert kept is not skyhook_says


def test_rule_a_version_change_resets_the_batch_state_so_a_fixed_version_resumes() -> None:
    broken = {"driver": {"version": "1.0.0", "image": "ghcr.io/x/driver"}}
    cluster = FakeCluster(
        skyhooks=[make({"packages": broken, "deploymentPolicy": "exp"})],
        nodes=cluster_nodes(16),
        policies={"exp": exponential_policy(failure_threshold=2)},
        fail_images=("ghcr.io/x/driver",),
    )
    run_until_settled(cluster)
    state = cluster.status()["compartmentStatuses"]["__default__"]["batchState"]
    assert state["shouldStop"] is True
    fixed = {"driver": {"version": "1.0.1", "image": "ghcr.io/x/driver-fixed"}}
    cluster.skyhooks = [
        replace(
            make({"packages": fixed, "deploymentPolicy": "exp"}, generation=2),
            status=cluster.status(),
        )
    ]
    run_until_settled(cluster, rounds=200)
    status = cluster.status()
    assert status["status"] == "complete", status["nodeStatus"]
    assert status["completeNodes"] == "16/16"


# --- metrics ----------------------------------------------------------------------------------


def test_rule_package_restarts_count_is_exported() -> None:
    restarted = PackageState("driver", "1.0.0", "ghcr.io/x/driver", "apply", "in_progress", 2)
    nodes = {
        n: with_state(v, "gpu-init", render_node_state({"driver": restarted}))
        for n, v in cluster_nodes(3).items()
    }
    plan = plan_round(World([make({})], {}, list(nodes.values()), {}, {}), now=T0)
    metrics.report(plan.rounds)
    labels = {"skyhook_name": "gpu-init", "package_name": "driver", "package_version": "1.0.0"}
    assert REGISTRY.get_sample_value("skyhook_package_restarts_count", labels) == 6


def test_rule_legacy_rollouts_are_labelled_policy_legacy_strategy_fixed() -> None:
    skyhook = make({"interruptionBudget": {"count": 1}})
    plan = plan_round(World([skyhook], {}, list(cluster_nodes(2).values()), {}, {}), now=T0)
    metrics.report(plan.rounds)
    labels = {
        "skyhook_name": "gpu-init",
        "policy_name": "legacy",
        "compartment_name": "__default__",
        "strategy": "fixed",
    }
    assert REGISTRY.get_sample_value("skyhook_rollout_matched_nodes", labels) == 2
    legacy = policy_for(skyhook, {}, 2)
    assert legacy is not None and legacy.default.strategy is not None
    assert legacy.default.strategy.kind == "fixed"


# --- runtimeRequired --------------------------------------------------------------------------

RUNTIME_TAINT = {"key": "skyhook.nvidia.com", "value": "runtime-required", "effect": "NoSchedule"}


def round_with_taints(cluster: FakeCluster) -> list[SetRuntimeTaint]:
    """One round; the taint changes land on the nodes as the API server would apply them."""
    changes = [a for a in cluster.round().actions if isinstance(a, SetRuntimeTaint)]
    for change in changes:
        node = cluster.nodes[change.node.name]
        kept = tuple(t for t in node.taints if t.get("key") != change.taint["key"])
        annotations = dict(node.annotations)
        if change.present:
            annotations[auto_taint_annotation(change.taint["key"])] = "true"
        cluster.nodes[node.name] = replace(
            node,
            taints=(*kept, change.taint) if change.present else kept,
            annotations=annotations,
        )
    return changes


def test_rule_runtime_required_taint_goes_on_new_nodes_and_off_once_complete() -> None:
    spec = {"runtimeRequired": True, "autoTaintNewNodes": True, "interruptionBudget": {"count": 1}}
    nodes = cluster_nodes(2)
    # node-01 was handled before (it carries a mark of the operator): not a new node.
    nodes["node-01"] = replace(nodes["node-01"], annotations={"skyhook.nvidia.com/other": "x"})
    cluster = FakeCluster(skyhooks=[make(spec)], nodes=nodes)
    changes = round_with_taints(cluster)
    assert [(c.node.name, c.present) for c in changes] == [("node-00", True)]
    assert cluster.nodes["node-00"].taints == (RUNTIME_TAINT,)
    # Nothing else was written on it that round: the taint lands on a still-new node.
    assert set(cluster.nodes["node-00"].annotations) == {
        auto_taint_annotation("skyhook.nvidia.com")
    }
    removed: list[str] = []
    for _ in range(30):
        removed += [c.node.name for c in round_with_taints(cluster) if not c.present]
    assert cluster.status()["status"] == "complete"
    assert removed == ["node-00"]
    assert not cluster.nodes["node-00"].taints


def test_rule_the_runtime_required_taint_stays_until_every_runtime_required_skyhook_is_done() -> (
    None
):
    tainted = {n: replace(v, taints=(RUNTIME_TAINT,)) for n, v in cluster_nodes(1).items()}
    # `held` comes first (priority 100) but is disabled: `quick` runs and completes alone.
    held = make({"runtimeRequired": True, "priority": 100}, name="held")
    quick = make({"runtimeRequired": True}, name="quick")
    cluster = FakeCluster(skyhooks=[replace(held, disabled=True), quick], nodes=tainted)
    for _ in range(20):
        assert round_with_taints(cluster) == []
    assert cluster.status("quick")["status"] == "complete"
    assert cluster.nodes["node-00"].taints == (RUNTIME_TAINT,)
    cluster.skyhooks = [replace(cluster.skyhooks[0], disabled=False), cluster.skyhooks[1]]
    removed = [c for _ in range(20) for c in round_with_taints(cluster) if not c.present]
    assert [c.node.name for c in removed] == ["node-00"]
    # Without autoTaintNewNodes a node never gets the taint.
    plain = FakeCluster(skyhooks=[make({"runtimeRequired": True})], nodes=cluster_nodes(1))
    assert round_with_taints(plain) == []


def test_rule_the_runtime_taint_patch_keeps_other_taints_and_is_allowed() -> None:
    from k8s_watcher.policy import Allowed, authorize
    from maintenance_scheduler.skyhook.commands import commands_for

    other = {"key": "gpu", "effect": "NoExecute"}
    node = replace(cluster_nodes(1)["node-00"], taints=(other, RUNTIME_TAINT))
    for present, expected in ((False, [other]), (True, [other, RUNTIME_TAINT])):
        (command,) = commands_for(
            SetRuntimeTaint(node, RUNTIME_TAINT, present),
            T0,
            namespace="skyhook",
            default_stage_timeout_seconds=0,
            drain_timeout_seconds=0,
        )
        assert command.operation.patch["spec"]["taints"] == expected  # type: ignore[union-attr]
        assert command.target.resource_version == node.resource_version
        assert isinstance(authorize(command, command.subject), Allowed)


# --- node marks -------------------------------------------------------------------------------


def test_rule_node_marks_version_and_cordon_while_its_request_holds_the_node() -> None:
    reboot = {
        "kern": {"version": "1.0.0", "image": "ghcr.io/x/kern", "interrupt": {"type": "reboot"}}
    }
    cluster = FakeCluster(skyhooks=[make({"packages": reboot})], nodes=cluster_nodes(1))
    cordon, version = cordon_annotation("gpu-init"), version_annotation("gpu-init")
    held: list[bool] = []
    for _ in range(30):
        cluster.round()
        annotations = cluster.nodes["node-00"].annotations
        # The mark follows the request one round later (it is written on what the round saw).
        held.append(annotations.get(cordon) == "true")
    assert cluster.status()["status"] == "complete"
    assert any(held) and not held[-1]
    assert cluster.nodes["node-00"].annotations[version] == NODE_STATE_VERSION


def test_rule_node_marks_are_written_and_forgotten_by_the_node_patches() -> None:
    from k8s_watcher.policy import Allowed, authorize
    from maintenance_scheduler.skyhook.commands import commands_for

    node = cluster_nodes(1)["node-00"]
    for action, expected in (
        (PatchNode("gpu-init", node, '{"x":1}', "in_progress", cordon=True), ("v", "true")),
        (PatchNode("gpu-init", node, "", "complete"), (None, None)),
        (ForgetNode("gpu-init", node), (None, None)),
    ):
        (command,) = commands_for(
            action,
            T0,
            namespace="skyhook",
            default_stage_timeout_seconds=0,
            drain_timeout_seconds=0,
        )
        annotations = command.operation.patch["metadata"]["annotations"]  # type: ignore[union-attr]
        written = (
            annotations[version_annotation("gpu-init")],
            annotations[cordon_annotation("gpu-init")],
        )
        assert written == (NODE_STATE_VERSION if expected[0] else None, expected[1])
        assert isinstance(authorize(command, command.subject), Allowed)


# --- uninstall (nodewright) -------------------------------------------------------------------


def _uninstallable(apply: bool, enabled: bool = True) -> dict[str, Any]:
    return {
        "driver": {
            "version": "1.0.0",
            "image": "ghcr.io/x/driver",
            "configMap": {"driver.conf": "mode=fast"},
            "uninstall": {"enabled": enabled, "apply": apply},
        },
        "tool": {"version": "1.0.0", "image": "ghcr.io/x/tool"},
    }


def test_rule_uninstall_apply_uninstalls_the_package_from_every_node() -> None:
    cluster = FakeCluster(
        skyhooks=[make({"packages": _uninstallable(apply=False)})], nodes=cluster_nodes(2)
    )
    run_until_settled(cluster)
    assert cluster.status()["status"] == "complete"
    cluster.skyhooks = [
        replace(
            make({"packages": _uninstallable(apply=True)}, generation=2), status=cluster.status()
        )
    ]
    uninstalls: list[CreateJob] = []
    for _ in range(10):
        plan = cluster.round()
        uninstalls += [a for a in plan.actions if isinstance(a, CreateJob)]
    assert {(a.package.name, a.stage, a.node) for a in uninstalls} == {
        ("driver", "uninstall", "node-00"),
        ("driver", "uninstall", "node-01"),
    }
    # With the package's config (nodewright's explicit uninstall reads it).
    assert all(a.package.config_map == (("driver.conf", "mode=fast"),) for a in uninstalls)
    status = cluster.status()
    assert status["status"] == "complete"
    for entries in status["nodeState"].values():
        assert set(entries) == {"tool|1.0.0"}
    # apply turned off again: the uninstalled package is installed again.
    cluster.skyhooks = [
        replace(
            make({"packages": _uninstallable(apply=False)}, generation=3), status=cluster.status()
        )
    ]
    reinstalled: set[tuple[str, str]] = set()
    for _ in range(10):
        plan = cluster.round()
        reinstalled |= {(a.node, a.stage) for a in plan.actions if isinstance(a, CreateJob)}
    assert ("node-00", "apply") in reinstalled
    assert cluster.status()["status"] == "complete"
    assert set(cluster.status()["nodeState"]["node-00"]) == {"driver|1.0.0", "tool|1.0.0"}


def test_rule_uninstall_apply_without_enabled_is_invalid() -> None:
    assert make({"packages": _uninstallable(apply=True, enabled=False)}).problems != ()
    assert make({"packages": _uninstallable(apply=False, enabled=False)}).problems == ()
