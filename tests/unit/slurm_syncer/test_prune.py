"""pruneSlurmNodeRecords: which Slurm node records slurm-syncer deletes (prune.py, pure)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nodeflow_contracts.slurm import SlurmNodeState
from slurm_syncer.nodestate import derive
from slurm_syncer.prune import (
    decide_prune,
    is_dynamic,
    nodeset_names,
    owner_of,
    plan_prunes,
    prune_mode,
)
from slurm_syncer.reasons import DEFAULT_DRAIN_REASONS

DELETE_REASON = (
    "slurm-operator: delete: ScalingDeleteScheduled: pod slurm/w-000-002 is scheduled for "
    "deletion: NodeSet scale-down"
)


def nodeset(name: str, mode: str | None, *, prefix: str | None = None, ns: str = "slurm") -> Any:
    spec: dict[str, Any] = {"slurmCluster": "a", "template": {}}
    if mode is not None:
        spec["pruneSlurmNodeRecords"] = mode
    if prefix is not None:
        spec["podNamePrefix"] = prefix
    return {"metadata": {"name": name, "namespace": ns}, "spec": spec}


def state(name: str, base: Any = "Idle", flags: tuple[str, ...] = (), reason: str = "") -> Any:
    derived = derive(base, flags)
    return SlurmNodeState(
        cluster="a",
        name=name,
        known=True,
        base_state=base,
        flags=flags,
        reason=reason,
        reason_is_ours=DEFAULT_DRAIN_REASONS.is_ours(reason),
        busy=derived.busy,
        drain=derived.drain,
        drained=derived.drained,
        draining=derived.draining,
    )


PRUNING = nodeset_names(nodeset("w", "NodeNotFound"))


def test_rule_prune_mode_defaults_to_never() -> None:
    assert prune_mode(nodeset("w", None)) == "Never"
    assert prune_mode(nodeset("w", "Never")) == "Never"
    assert prune_mode(nodeset("w", "nodenotfound")) == "Never"
    assert prune_mode(nodeset("w", "NodeNotFound")) == "NodeNotFound"


def test_rule_prune_a_gone_pods_record_that_is_down_or_drained_for_deletion() -> None:
    down = state("w-000-002", "Down", ("NotResponding",), "Not responding")
    assert decide_prune(down, PRUNING, pod_exists=False).prune
    drained = state("w-000-002", "Idle", ("Drain",), DELETE_REASON)
    assert decide_prune(drained, PRUNING, pod_exists=False).prune
    # Slinky's scale-in drain is a deletion drain too.
    slinky = state(
        "w-000-002",
        "Idle",
        ("Drain",),
        "slurm-operator: Pod (slurm/w-0) is pending termination for scale-in",
    )
    assert decide_prune(slinky, PRUNING, pod_exists=False).prune


@pytest.mark.parametrize(
    ("slurm", "pod_exists", "why"),
    [
        (state("w-000-002", "Down", ("NotResponding",), "Not responding"), True, "its pod exists"),
        (state("w-000-002", "Idle"), False, "node still in service"),
        (state("w-000-002", "Idle", ("Drain",), "slurm-operator: cordon: x"), False, "service"),
        (state("w-000-002", "Mixed", ("Drain",), DELETE_REASON), False, "runs work"),
        (state("w-000-002", "Down", ("Completing",), "Not responding"), False, "runs work"),
        (state("w-000-002", "Down", (), "bad DIMM, ask bob"), False, "external"),
        (None, False, "unknown"),
    ],
)
def test_rule_prune_never_a_busy_live_unknown_or_humans_node(
    slurm: SlurmNodeState | None, pod_exists: bool, why: str
) -> None:
    decision = decide_prune(slurm, PRUNING, pod_exists)
    assert not decision.prune and why in decision.why


def test_rule_prune_only_for_the_one_nodeset_that_asks() -> None:
    down = state("w-000-002", "Down", ("NotResponding",), "Not responding")
    keeping = nodeset_names(nodeset("w", "Never"))
    assert not decide_prune(down, keeping, pod_exists=False).prune
    pruning = nodeset_names(nodeset("w", "NodeNotFound"))
    other = nodeset_names(nodeset("other", None, prefix="w", ns="team-b"))
    assert pruning is not None and other is not None
    # Two NodeSets of the cluster could have named it: nobody owns it, nothing is deleted.
    assert owner_of("w-000-002", [pruning, other]) is None
    assert owner_of("w-000-002", [pruning]) is pruning
    # Names that are not `<prefix>-<ddd>-<ddd>`.
    for name in ("w-0", "w-000-0002", "ww-000-002", "w-000-002-003", "x-000-002"):
        assert owner_of(name, [pruning]) is None, name


def test_rule_prune_plan_reads_pods_by_namespace_and_name() -> None:
    states = {
        "w-000-001": state("w-000-001", "Down", ("NotResponding",), "Not responding"),
        "w-000-002": state("w-000-002", "Idle", ("Drain",), DELETE_REASON),
        "w-000-003": state("w-000-003"),
        "k-000-001": state("k-000-001", "Down", ("NotResponding",), "Not responding"),
    }
    nodesets = [nodeset("w", "NodeNotFound"), nodeset("k", "Never")]
    planned = plan_prunes("a", states, nodesets, {"slurm.w-000-001"})
    assert planned == ["w-000-002"]
    assert plan_prunes("b", states, nodesets, set()) == []


def test_rule_prune_only_dynamic_nodes() -> None:
    assert is_dynamic({"state": ["DOWN", "NOT_RESPONDING", "DYNAMIC_NORM"]})
    assert not is_dynamic({"state": ["DOWN", "NOT_RESPONDING"]})


BASES = ["Idle", "Allocated", "Mixed", "Down", "Unknown"]
FLAGS = ["Drain", "Completing", "NotResponding", "Undrain"]
REASONS = ["", "Not responding", DELETE_REASON, "slurm-operator: cordon: x", "bad DIMM"]


@given(
    base=st.sampled_from(BASES),
    flags=st.lists(st.sampled_from(FLAGS), unique=True).map(tuple),
    reason=st.sampled_from(REASONS),
    known=st.booleans(),
    pod_exists=st.booleans(),
    mode=st.sampled_from(["Never", "NodeNotFound", None]),
)
def test_rule_prune_property_never_deletes_a_node_that_may_run_work_or_has_a_pod(
    base: str,
    flags: tuple[str, ...],
    reason: str,
    known: bool,
    pod_exists: bool,
    mode: str | None,
) -> None:
    slurm = state("w-000-002", base, flags, reason)
    if not known:
        # Even an unknown state that says DOWN: what cannot be read is never pruned.
        slurm = SlurmNodeState(cluster="a", name="w-000-002", known=False, base_state="Down")
    decision = decide_prune(slurm, nodeset_names(nodeset("w", mode)), pod_exists)
    if decision.prune:
        assert mode == "NodeNotFound" and not pod_exists and slurm.known and not slurm.busy
        assert not DEFAULT_DRAIN_REASONS.is_external(slurm.reason)
        assert slurm.base_state == "Down" or slurm.drained
