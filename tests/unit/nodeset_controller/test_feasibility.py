"""Rule 1: node selection (required affinity, taints, resources, IPv4, one NodeSet per node)."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

from nodeflow_contracts.pod_protocol import DEFAULT_LOCK_TOLERATION_KEY
from nodeset_controller.feasibility import can_place, may_keep
from tests.unit.nodeset_controller.builders import node

KEY = "slurm.gpu"
REQ = {"cpu": Fraction(2)}


LOCK_TOLERATION = {"key": DEFAULT_LOCK_TOLERATION_KEY, "operator": "Exists"}


def spec_with(**extra: Any) -> dict[str, Any]:
    return {"containers": [{"name": "c", "image": "i"}], "tolerations": [LOCK_TOLERATION], **extra}


def required(*terms: dict[str, Any]) -> dict[str, Any]:
    return {
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": list(terms)
                },
            }
        }
    }


def test_rule_node_selection_required_affinity_decides_placing_and_keeping() -> None:
    # The matching itself is tested with nodeflow_kube (tests/unit/kube/test_affinity.py).
    spec = spec_with(
        **required({"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["h100"]}]})
    )
    assert can_place(spec, REQ, node("n1", labels={"gpu": "h100"}), {}, KEY).feasible
    verdict = can_place(spec, REQ, node("n2", labels={"gpu": "a100"}), {}, KEY)
    assert not verdict.feasible and "affinity" in verdict.reason
    assert not may_keep(spec, node("n2", labels={"gpu": "a100"}), KEY).feasible
    assert not can_place(spec_with(**required({})), REQ, node("n1"), {}, KEY).feasible


def test_rule_node_selection_ignores_preferred_affinity_and_pod_affinity() -> None:
    spec = spec_with(
        affinity={
            "nodeAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "weight": 1,
                        "preference": {"matchExpressions": [{"key": "x", "operator": "Exists"}]},
                    }
                ]
            },
            "podAntiAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": [{"topologyKey": "k"}]
            },
        }
    )
    assert can_place(spec, REQ, node("n1"), {}, KEY).feasible


def test_rule_node_selection_node_selector_is_required() -> None:
    spec = spec_with(nodeSelector={"pool": "gpu"})
    assert can_place(spec, REQ, node("n1", labels={"pool": "gpu"}), {}, KEY).feasible
    verdict = can_place(spec, REQ, node("n1", labels={"pool": "cpu"}), {}, KEY)
    assert not verdict.feasible and "affinity" in verdict.reason


def test_rule_node_selection_taints_must_be_tolerated() -> None:
    tainted = node("n1", taints=[{"key": "dedicated", "value": "ml", "effect": "NoSchedule"}])
    verdict = can_place(spec_with(), REQ, tainted, {}, KEY)
    assert not verdict.feasible and "dedicated" in verdict.reason
    tolerant = spec_with(
        tolerations=[LOCK_TOLERATION, {"key": "dedicated", "operator": "Equal", "value": "ml"}]
    )
    assert can_place(tolerant, REQ, tainted, {}, KEY).feasible
    soft = node("n1", taints=[{"key": "x", "effect": "PreferNoSchedule"}])
    assert can_place(spec_with(), REQ, soft, {}, KEY).feasible


def test_rule_node_selection_lock_taint_is_tolerated_by_nodeset_pods() -> None:
    locked = node("n1", taints=[{"key": "sunk.coreweave.com/lock", "effect": "NoSchedule"}])
    assert can_place(spec_with(), REQ, locked, {}, KEY).feasible


def test_rule_node_selection_resources_fit_allocatable_minus_other_pods() -> None:
    small = node("n1", allocatable={"cpu": "4", "memory": "8Gi"})
    assert can_place(spec_with(), REQ, small, {"cpu": Fraction(2)}, KEY).feasible
    verdict = can_place(spec_with(), REQ, small, {"cpu": Fraction(5, 2)}, KEY)
    assert not verdict.feasible and verdict.reason == "insufficient cpu"
    gpu = {"cpu": Fraction(1), "nvidia.com/gpu": Fraction(8)}
    assert not can_place(spec_with(), gpu, small, {}, KEY).feasible


def test_rule_node_selection_node_without_ipv4_internal_ip_is_not_feasible_with_reason() -> None:
    verdict = can_place(spec_with(), REQ, node("n1", ip=None), {}, KEY)
    assert not verdict.feasible and "IPv4 InternalIP" in verdict.reason
    v6 = can_place(spec_with(), REQ, node("n1", ip="fd00::5"), {}, KEY)
    assert not v6.feasible


def test_rule_node_selection_one_nodeset_per_node() -> None:
    claimed = node("n1", claim="slurm.other")
    verdict = can_place(spec_with(), REQ, claimed, {}, KEY)
    assert not verdict.feasible and "slurm.other" in verdict.reason
    assert can_place(spec_with(), REQ, node("n1", claim=KEY), {}, KEY).feasible
    assert not may_keep(spec_with(), claimed, KEY).feasible


def test_rule_node_selection_cordoned_node_takes_no_new_pod_but_keeps_its_pod() -> None:
    cordoned = node(
        "n1",
        unschedulable=True,
        taints=[{"key": "node.kubernetes.io/unreachable", "effect": "NoSchedule"}],
    )
    assert not can_place(spec_with(), REQ, cordoned, {}, KEY).feasible
    assert may_keep(spec_with(), cordoned, KEY).feasible


def test_rule_node_selection_label_change_makes_existing_pod_misscheduled() -> None:
    spec = spec_with(nodeSelector={"pool": "gpu"})
    assert not may_keep(spec, node("n1", labels={"pool": "cpu"}), KEY).feasible
    evict = node("n1", labels={"pool": "gpu"}, taints=[{"key": "bad", "effect": "NoExecute"}])
    assert not may_keep(spec, evict, KEY).feasible


def test_rule_node_selection_a_not_ready_or_unreachable_node_keeps_its_pod() -> None:
    """The node lifecycle controller's NoExecute taints (NotReady, unreachable) do not make a
    running pod misscheduled: the node may come back. Another NoExecute taint does."""
    for key in ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"):
        lost = node("n1", taints=[{"key": key, "effect": "NoExecute"}])
        assert may_keep(spec_with(), lost, KEY).feasible, key
        assert not can_place(spec_with(), REQ, lost, {}, KEY).feasible, key
    evicting = node("n1", taints=[{"key": "maintenance", "effect": "NoExecute"}])
    verdict = may_keep(spec_with(), evicting, KEY)
    assert not verdict.feasible and verdict.reason == "untolerated taint maintenance:NoExecute"


def test_rule_node_selection_a_lifecycle_taint_does_not_hide_another_no_execute_taint() -> None:
    """A NotReady node that is also tainted NoExecute by someone else: that other taint, which
    the pod does not tolerate, makes the pod misscheduled whatever the order of the taints."""
    taints = [
        {"key": "node.kubernetes.io/not-ready", "effect": "NoExecute"},
        {"key": "maintenance", "value": "psu", "effect": "NoExecute"},
    ]
    for ordered in (taints, taints[::-1]):
        verdict = may_keep(spec_with(), node("n1", taints=ordered), KEY)
        assert not verdict.feasible, ordered
        assert verdict.reason == "untolerated taint maintenance:NoExecute"


def test_rule_node_selection_an_untolerated_taint_is_named_with_its_value_and_effect() -> None:
    """The reason a node is refused names the taint as key=value:effect (value empty when the
    taint has none), so the NodeSet's message says which taint to tolerate."""
    valued = node("n1", taints=[{"key": "dedicated", "value": "ml", "effect": "NoSchedule"}])
    assert can_place(spec_with(), REQ, valued, {}, KEY).reason == (
        "untolerated taint dedicated=ml:NoSchedule"
    )
    bare = node("n1", taints=[{"key": "gpu-fault", "effect": "NoSchedule"}])
    assert can_place(spec_with(), REQ, bare, {}, KEY).reason == (
        "untolerated taint gpu-fault=:NoSchedule"
    )
