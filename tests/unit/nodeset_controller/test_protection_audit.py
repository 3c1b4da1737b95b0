"""Rule 4a (workloadDisruptionProtection), audit of issue #32 item 1: the defects found in the
budget's shape, the label patches' order and preconditions, and where the labels are kept.

Each test names the rule it holds and fails on the code before its fix.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from clustersim.kube.disruption import compute_pdb_status
from k8s_watcher.policy import Allowed, Refused, authorize
from nodeflow_contracts.k8s import CreateObject, K8sCommand, ObjectRef, PatchObject, RecordEvent
from nodeflow_contracts.pod_protocol import (
    NODESET_LABEL,
    POD_PROTECT_LABEL,
    PROTECTION_BUDGET_MIN_AVAILABLE,
)
from nodeset_controller.commands import notice_outgoing, to_outgoing
from nodeset_controller.config import NodeSetControllerConfig
from nodeset_controller.planner import Notice
from nodeset_controller.protection import (
    CreateDisruptionBudget,
    DeleteDisruptionBudget,
    ProtectPod,
    budget_object,
)
from nodeset_controller.spec import parse
from tests.unit.nodeset_controller.builders import (
    CLUSTER,
    DEFAULTS,
    NS,
    T0,
    cluster_status,
    node,
    nodeset,
    pod,
    slurm,
)
from tests.unit.nodeset_controller.memory_cluster import MemoryCluster
from tests.unit.nodeset_controller.test_planner import KEY, full
from tests.unit.nodeset_controller.test_protection import (
    NAMES,
    labelled,
    our_budget,
    planned,
    protected,
)
from tests.unit.plan_checks import expect_actions

# --- the budget's shape: no eviction whatever the NodeSet's replicas -------------------------


def busy_ready_pod(index: int, spec_uid: str) -> dict[str, Any]:
    return {
        "metadata": {
            "name": f"gpu-{index:03d}",
            "namespace": "slurm",
            "labels": {NODESET_LABEL: "gpu", POD_PROTECT_LABEL: "true"},
            "ownerReferences": [
                {
                    "apiVersion": "nodeflow.dev/v1alpha1",
                    "kind": "NodeSet",
                    "name": "gpu",
                    "uid": spec_uid,
                    "controller": True,
                }
            ],
        },
        "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]},
    }


@pytest.mark.parametrize("replicas", [10, 2, 0])
def test_rule_4a_the_budget_refuses_every_eviction_after_a_scale_down(replicas: int) -> None:
    # Ten pods run jobs; the NodeSet was scaled down to `replicas` (its scale subresource):
    # the disruption controller's status of our budget must still allow no eviction.
    spec = parse(nodeset(replicas=replicas), DEFAULTS)
    budget = budget_object(spec)
    budget["metadata"]["generation"] = 1
    pods = [busy_ready_pod(i, spec.uid) for i in range(10)]
    status = compute_pdb_status(budget, pods, lambda ref, namespace: replicas)
    assert status is not None
    assert status["disruptionsAllowed"] == 0
    assert status["expectedPods"] == 10
    assert status["desiredHealthy"] == PROTECTION_BUDGET_MIN_AVAILABLE


def test_rule_4a_a_budget_of_the_old_max_unavailable_shape_is_made_again() -> None:
    obj = nodeset(replicas=1)
    _, pods = full(1)
    old = our_budget(obj)
    old["spec"] = {"maxUnavailable": 0, "selector": old["spec"]["selector"]}
    result = planned(obj, pods, {NAMES[0]: slurm(NAMES[0], busy=True)}, budget=old)
    expect_actions(result.actions, DeleteDisruptionBudget, count=1, uid="uid-budget")
    current = planned(obj, pods, {NAMES[0]: slurm(NAMES[0], busy=True)}, budget=our_budget(obj))
    assert not [a for a in current.actions if isinstance(a, DeleteDisruptionBudget)]


def test_rule_4a_a_budget_letting_unready_pods_go_is_made_again() -> None:
    obj = nodeset(replicas=1)
    _, pods = full(1)
    loose = our_budget(obj, unhealthyPodEvictionPolicy="AlwaysAllow")
    result = planned(obj, pods, {NAMES[0]: slurm(NAMES[0], busy=True)}, budget=loose)
    expect_actions(result.actions, DeleteDisruptionBudget, count=1, uid="uid-budget")


def budget_create(obj: dict[str, Any]) -> K8sCommand:
    return K8sCommand(
        idempotency_key="k",
        sender="nodeset-controller",
        sent_at=T0,
        expires_at=T0 + 20,
        target=ObjectRef(
            api_version="policy/v1",
            kind="PodDisruptionBudget",
            name=obj["metadata"]["name"],
            namespace="slurm",
        ),
        operation=CreateObject(object=obj),
    )


def test_rule_4a_k8s_watcher_lets_nodeset_controller_create_its_budget() -> None:
    obj = nodeset(replicas=1)
    _, pods = full(1)
    result = planned(obj, pods, {NAMES[0]: slurm(NAMES[0], busy=True)})
    (create,) = expect_actions(result.actions, CreateDisruptionBudget, count=1)
    command = to_outgoing(parse(obj, DEFAULTS), create, T0).command
    assert authorize(command, f"cmd.k8s.v1.nodeset-controller.{command.op}") == Allowed()


def _reshaped(change: str) -> dict[str, Any]:
    made = copy.deepcopy(budget_object(parse(nodeset(replicas=1), DEFAULTS)))
    selector = made["spec"]["selector"]
    if change == "empty-selector":
        selector.clear()
    elif change == "nodeset-only":
        del selector["matchLabels"][POD_PROTECT_LABEL]
    elif change == "other-nodeset":
        selector["matchLabels"][NODESET_LABEL] = "other"
    elif change == "expressions":
        selector["matchExpressions"] = [{"key": "app", "operator": "Exists"}]
    elif change == "max-unavailable":
        made["spec"] = {"maxUnavailable": 0, "selector": selector}
    elif change == "small-min-available":
        made["spec"]["minAvailable"] = 1
    elif change == "always-allow":
        made["spec"]["unhealthyPodEvictionPolicy"] = "AlwaysAllow"
    return made


@pytest.mark.parametrize(
    "change",
    [
        "empty-selector",
        "nodeset-only",
        "other-nodeset",
        "expressions",
        "max-unavailable",
        "small-min-available",
        "always-allow",
    ],
)
def test_rule_4a_k8s_watcher_refuses_a_budget_create_of_another_shape(change: str) -> None:
    # A buggy sender's budget over other pods would block every drain of the namespace.
    command = budget_create(_reshaped(change))
    verdict = authorize(command, "cmd.k8s.v1.nodeset-controller.create")
    assert isinstance(verdict, Refused), change
    assert "protection budget" in verdict.reason


# --- the label patches: outside the create/delete window, protection first -----------------


def protect_patches(commands: list[K8sCommand]) -> list[K8sCommand]:
    return [
        c
        for c in commands
        if isinstance(c.operation, PatchObject)
        and POD_PROTECT_LABEL in str(c.operation.patch.get("metadata"))
    ]


async def test_rule_4a_a_busy_pods_label_does_not_wait_behind_a_scale_ups_creates() -> None:
    # Window of 4, a scale-up of 9 pods, and the one running pod's node takes a job: the
    # label goes out in the same round, first of the pod commands, creates filling the window.
    cluster = MemoryCluster(
        NodeSetControllerConfig(nats_url=("nats://unused",), max_commands_in_flight=4)
    )
    for i in range(10):
        cluster.nodes.put(f"_.n{i}", node(f"n{i}", f"10.0.1.{i + 1}", claim=KEY))
    running = pod(NAMES[0], "n0")
    running["metadata"]["uid"] = cluster.next_uid()
    cluster.pods.put(f"{NS}.{NAMES[0]}", running)
    cluster.slurm.put(f"{CLUSTER}.{NAMES[0]}", slurm(NAMES[0], busy=True))
    cluster.clusters.put(CLUSTER, cluster_status(nodes_revision=cluster.slurm.last_revision))
    cluster.nodesets.put(KEY, nodeset(replicas=10))
    commands = await cluster.round(KEY, T0)
    (patch,) = protect_patches(commands)
    assert patch.target.name == NAMES[0]
    pod_commands = [c for c in commands if c.target.kind == "Pod"]
    assert pod_commands[0] is patch
    made = [c.operation.object for c in commands if isinstance(c.operation, CreateObject)]
    assert len([obj for obj in made if obj.get("kind") == "Pod"]) == 4


def test_rule_4a_protect_true_is_planned_before_protect_false() -> None:
    obj = nodeset(replicas=2)
    _, pods = full(2)
    # The first pod in order loses its label, the second gains one: the gain goes first.
    pods = [labelled(pods[0]), pods[1]]
    states = {NAMES[0]: slurm(NAMES[0]), NAMES[1]: slurm(NAMES[1], busy=True)}
    result = planned(obj, pods, states, budget=our_budget(obj))
    order = [(a.pod.name, a.protect) for a in result.actions if isinstance(a, ProtectPod)]
    assert order == [(NAMES[1], True), (NAMES[0], False)]


# --- a stale unlabel: refused by the pod's resourceVersion, never holding back protection --


def test_rule_4a_an_unlabel_carries_the_pods_resource_version_and_a_label_does_not() -> None:
    obj = nodeset(replicas=2)
    _, pods = full(2)
    pods = [labelled(pods[0]), pods[1]]
    states = {NAMES[0]: slurm(NAMES[0]), NAMES[1]: slurm(NAMES[1], busy=True)}
    result = planned(obj, pods, states, budget=our_budget(obj))
    spec = parse(obj, DEFAULTS)
    by_pod = {
        a.pod.name: to_outgoing(spec, a, T0) for a in result.actions if isinstance(a, ProtectPod)
    }
    unlabel, label = by_pod[NAMES[0]], by_pod[NAMES[1]]
    assert unlabel.command.target.resource_version == pods[0]["metadata"]["resourceVersion"]
    assert unlabel.command.target.uid == pods[0]["metadata"]["uid"]
    assert label.command.target.resource_version is None
    # Two slots: a held unlabel does not hold back a label of the same pod.
    unlabelled = next(a.pod for a in result.actions if isinstance(a, ProtectPod) and not a.protect)
    assert unlabel.slot != to_outgoing(spec, ProtectPod(unlabelled, True, "busy"), T0).slot


async def test_rule_4a_a_held_unlabel_does_not_hold_back_protection() -> None:
    # The unlabel is decided on an idle read and held (its outcome lost); the node takes a
    # job and the label is gone: protect=true goes out at once, not after the unlabel's
    # deadline and margin.
    cluster = MemoryCluster(NodeSetControllerConfig(nats_url=("nats://unused",)))
    cluster.nodes.put("_.n0", node("n0", "10.0.1.1", claim=KEY))
    raw = labelled(pod(NAMES[0], "n0"))
    raw["metadata"]["uid"] = cluster.next_uid()
    cluster.pods.put(f"{NS}.{NAMES[0]}", raw)
    cluster.slurm.put(f"{CLUSTER}.{NAMES[0]}", slurm(NAMES[0]))
    cluster.nodesets.put(KEY, nodeset(replicas=1))

    async def label_patches(now: float) -> list[K8sCommand]:
        status = cluster_status(last_success_at=now, nodes_revision=cluster.slurm.last_revision)
        cluster.clusters.put(CLUSTER, status)
        return protect_patches(await cluster.round(KEY, now))

    (unlabel,) = await label_patches(T0)
    assert isinstance(unlabel.operation, PatchObject)
    assert unlabel.operation.patch["metadata"]["labels"][POD_PROTECT_LABEL] is None
    assert unlabel.target.resource_version == raw["metadata"]["resourceVersion"]
    # The job starts: Allocated, and the pod changes (slurm-syncer's condition patch); the
    # label is gone (the unlabel's outcome never comes back: it stays held).
    cluster.slurm.put(f"{CLUSTER}.{NAMES[0]}", slurm(NAMES[0], busy=True))
    current = cluster.pods.get(f"{NS}.{NAMES[0]}")
    assert current is not None
    moved = copy.deepcopy(current)
    del moved["metadata"]["labels"][POD_PROTECT_LABEL]
    moved["metadata"]["resourceVersion"] = cluster.next_rv()
    cluster.pods.put(f"{NS}.{NAMES[0]}", moved)
    (label,) = await label_patches(T0 + 5)
    assert isinstance(label.operation, PatchObject)
    assert label.operation.patch["metadata"]["labels"][POD_PROTECT_LABEL] == "true"


# --- an invalid spec keeps the labels following Slurm ----------------------------------------


def test_rule_4a_an_invalid_spec_keeps_the_labels_following_slurm() -> None:
    valid = nodeset(replicas=2)
    _, pods = full(2)
    pods = [labelled(pods[0]), pods[1]]
    # The first pod's job ended (idle, still labelled), the second's node took a job.
    states = {NAMES[0]: slurm(NAMES[0]), NAMES[1]: slurm(NAMES[1], busy=True)}
    invalid = nodeset(replicas=-1)
    result = planned(invalid, pods, states, budget=our_budget(valid))
    assert result.problems and result.nodeset is None
    assert protected(result, True) == {NAMES[1]}
    assert protected(result, False) == {NAMES[0]}
    assert result.protection_spec is not None
    assert result.protection_spec.uid == parse(valid, DEFAULTS).uid


def test_rule_4a_an_invalid_spec_with_protection_off_still_removes_labels() -> None:
    _, pods = full(1)
    invalid = nodeset(replicas=-1, extra={"workloadDisruptionProtection": False})
    result = planned(invalid, [labelled(pods[0])], {NAMES[0]: slurm(NAMES[0], busy=True)})
    assert protected(result, False) == {NAMES[0]}


async def test_rule_4a_the_service_sends_the_labels_of_a_nodeset_whose_spec_is_invalid() -> None:
    cluster = MemoryCluster(NodeSetControllerConfig(nats_url=("nats://unused",)))
    cluster.nodes.put("_.n0", node("n0", "10.0.1.1", claim=KEY))
    raw = pod(NAMES[0], "n0")
    raw["metadata"]["uid"] = cluster.next_uid()
    cluster.pods.put(f"{NS}.{NAMES[0]}", raw)
    cluster.slurm.put(f"{CLUSTER}.{NAMES[0]}", slurm(NAMES[0], busy=True))
    status = cluster_status(last_success_at=T0, nodes_revision=cluster.slurm.last_revision)
    cluster.clusters.put(CLUSTER, status)
    cluster.nodesets.put(KEY, nodeset(replicas=-1))
    (label,) = protect_patches(await cluster.round(KEY, T0))
    assert label.target.name == NAMES[0]
    assert authorize(label, f"cmd.k8s.v1.nodeset-controller.{label.op}") == Allowed(
        required_label=NODESET_LABEL
    )


# --- an idle read lifts a label only from a view that holds a recent poll whole -------------


def test_rule_4a_an_idle_read_from_a_view_behind_the_polls_keeps_the_label() -> None:
    # The slurm_nodes view applied sequence 5; the cluster status says the last poll's states
    # reach 900: the view's idle read may be from long ago (its consumer stuck).
    obj = nodeset(replicas=2)
    _, pods = full(2)
    pods = [labelled(p) for p in pods]
    states = {NAMES[0]: slurm(NAMES[0]), NAMES[1]: slurm(NAMES[1], busy=True)}
    behind = planned(
        obj,
        pods,
        states,
        budget=our_budget(obj),
        status=cluster_status(last_success_at=T0, nodes_revision=900),
        slurm_nodes_revision=5,
    )
    assert protected(behind, False) == set()
    # Once the view holds that poll, the idle read lifts the label.
    caught_up = planned(
        obj,
        pods,
        states,
        budget=our_budget(obj),
        status=cluster_status(last_success_at=T0, nodes_revision=900),
        slurm_nodes_revision=900,
    )
    assert protected(caught_up, False) == {NAMES[0]}


# --- a budget of our name that is not ours is reported ---------------------------------------


def test_rule_4a_a_budget_not_ours_is_reported_by_a_condition_and_one_warning() -> None:
    obj = nodeset(replicas=1)
    _, pods = full(1)
    states = {NAMES[0]: slurm(NAMES[0], busy=True)}
    foreign = our_budget(obj)
    foreign["metadata"]["ownerReferences"] = []
    result = planned(obj, pods, states, budget=foreign)
    conditions = {c["type"]: c for c in result.wanted_status["conditions"]}
    conflict = conditions["DisruptionBudgetConflict"]
    assert (conflict["status"], conflict["reason"]) == ("True", "BudgetNotOwned")
    assert "slurm-workers-pdb-gpu" in conflict["message"]
    (notice,) = [a for a in result.actions if isinstance(a, Notice)]
    assert notice.decision == "protection-disabled"
    spec = parse(obj, DEFAULTS)
    event = notice_outgoing(spec.namespace, spec.name, spec.uid, notice, T0).command.operation
    assert isinstance(event, RecordEvent) and event.type == "Warning"
    # Reported once: with the condition written, no second Warning.
    reported = copy.deepcopy(obj)
    reported["status"] = result.wanted_status
    again = planned(reported, pods, states, budget=foreign)
    assert not [a for a in again.actions if isinstance(a, Notice)]
    # Our own budget: no such condition.
    ours = planned(obj, pods, states, budget=our_budget(obj))
    assert "DisruptionBudgetConflict" not in {c["type"] for c in ours.wanted_status["conditions"]}
