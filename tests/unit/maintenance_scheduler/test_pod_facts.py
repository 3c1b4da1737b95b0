"""A pod as the drain reads it (maintenance_scheduler.pods): its owner, what it lacks, and the
Slurm node of a NodeSet pod, read fail closed from the SlurmNodeState* conditions."""

from __future__ import annotations

from typing import Any

import pytest

from maintenance_scheduler.api import DrainSpec
from maintenance_scheduler.drain import plan_drain
from maintenance_scheduler.pods import PodFacts, SlurmView, pod_facts, with_fresh_slurm
from nodeflow_contracts.slurm import SlurmClusterStatus
from tests.unit.maintenance_scheduler.builders import T0, pod


def nodeset_pod(conditions: list[dict[str, Any]] | None) -> PodFacts:
    status: dict[str, Any] = {"phase": "Running"}
    if conditions is not None:
        status["conditions"] = conditions
    return pod_facts(
        {
            "metadata": {
                "name": "slurm-0",
                "namespace": "slurm",
                "labels": {"nodeflow.dev/nodeset": "compute"},
                "ownerReferences": [{"kind": "NodeSet", "name": "compute", "controller": True}],
            },
            "spec": {"nodeName": "n1", "containers": [{"name": "slurmd"}]},
            "status": status,
        }
    )


def slurm_state(state: str, message: str = "", status: str = "True") -> dict[str, Any]:
    return {"type": f"SlurmNodeState{state}", "status": status, "message": message}


def held_message(facts: PodFacts) -> str:
    plan = plan_drain(DrainSpec(), [facts])
    assert plan.evict_now == []
    [held] = plan.waiting_for_slurm
    return held.why


@pytest.mark.parametrize(
    "states",
    [("Drain",), ("Unknown", "Drain")],
    ids=["drain-flag-without-base-state", "unknown-and-drain"],
)
def test_rule_a_drain_flag_without_a_known_base_state_never_lets_the_pod_go(
    states: tuple[str, ...],
) -> None:
    """Only a known base state says no job runs: a Drain flag beside no base state, or beside
    Unknown, is a node whose jobs nobody knows (fail closed), not a drained idle one. The same
    pod with Idle+Drain goes."""
    facts = pod("slurm-0", slurm=states)
    assert facts.slurm is not None and not facts.slurm.known
    assert "Slurm state unknown" in held_message(facts)
    drained = plan_drain(DrainSpec(), [pod("slurm-0", slurm=("Idle", "Drain"))])
    assert [p.name for p in drained.evict_now] == ["slurm-0"]


def test_rule_an_unknown_slurm_node_counts_as_busy() -> None:
    """SlurmView's own rule, whoever reads `busy`: unknown is busy, and never drained and
    idle, whatever flags it was given."""
    unknown = SlurmView(known=False, base_state="Idle", flags=frozenset({"Drain"}))
    assert unknown.busy and not unknown.drained_and_idle
    idle = SlurmView(known=True, base_state="Idle")
    assert not idle.busy
    assert SlurmView(known=True, base_state="Idle", flags=frozenset({"Completing"})).busy


def test_rule_a_nodeset_pod_without_conditions_has_an_unknown_slurm_node() -> None:
    for facts in (nodeset_pod(None), nodeset_pod([])):
        assert (facts.namespace, facts.name, facts.node, facts.phase) == (
            "slurm",
            "slurm-0",
            "n1",
            "Running",
        )
        assert facts.slurm == SlurmView(known=False)
        assert held_message(facts) == "Slurm node slurm-0: Slurm state unknown, a job may run"


def test_rule_only_true_slurm_node_state_conditions_make_the_slurm_view() -> None:
    """Kubernetes' own conditions, a condition without a type and a False Slurm condition say
    nothing about the Slurm node; the held pod's message names exactly the base state and
    the flags (sorted) that hold, with Slurm's reason."""
    facts = nodeset_pod(
        [
            {"type": "Ready", "status": "True"},
            {"type": "ContainersReady", "status": "True"},
            {"status": "True"},
            slurm_state("Idle", status="False"),
            slurm_state("Allocated", message="running job 42"),
            slurm_state("Drain", message="maintenance"),
            slurm_state("Completing"),
        ]
    )
    assert facts.slurm == SlurmView(
        known=True,
        base_state="Allocated",
        flags=frozenset({"Drain", "Completing"}),
        reason="running job 42",
    )
    assert held_message(facts) == (
        "Slurm node slurm-0: state Allocated+Completing+Drain (running job 42), a job may run"
    )
    # A condition without a message: no reason, never the text "None".
    plain = nodeset_pod([{"type": "SlurmNodeStateMixed", "status": "True"}])
    assert held_message(plain) == "Slurm node slurm-0: state Mixed, a job may run"


def test_rule_the_held_message_says_why_a_slurm_state_is_unknown() -> None:
    """slurm-syncer's SlurmNodeStateUnknown message says why in words (the node is not
    registered, the cluster unreachable): the drain's message carries it."""
    facts = nodeset_pod([slurm_state("Unknown", message="node not registered in Slurm")])
    assert facts.slurm == SlurmView(known=False, reason="node not registered in Slurm")
    assert held_message(facts) == (
        "Slurm node slurm-0: Slurm state unknown (node not registered in Slurm), a job may run"
    )


def test_rule_only_a_controller_owner_makes_a_pod_managed() -> None:
    """kubectl drain reads the controller reference only: a DaemonSet named as a plain owner
    neither makes the pod a DaemonSet pod nor managed, so it blocks without force."""
    owners: list[dict[str, Any]] = [
        {"kind": "DaemonSet", "name": "ds", "controller": False},
        {"kind": "ReplicaSet", "name": "rs"},
    ]
    raw = {
        "metadata": {"name": "p", "namespace": "default", "ownerReferences": owners},
        "spec": {"nodeName": "n1", "containers": [{"name": "c"}]},
        "status": {"phase": "Running"},
    }
    facts = pod_facts(raw)
    assert not facts.daemonset and not facts.has_controller
    assert [p.pod.name for p in plan_drain(DrainSpec(), [facts]).blocking] == ["p"]
    owners[1]["controller"] = True
    managed = pod_facts(raw)
    assert managed.has_controller and not managed.daemonset
    assert [p.name for p in plan_drain(DrainSpec(), [managed]).evict_now] == ["p"]


def test_rule_what_a_pod_object_lacks_reads_as_empty_never_as_none() -> None:
    """A pod not yet scheduled has no nodeName, a pod just created no status: each reads as
    "" (no node, no phase), never the text "None", which would name a node."""
    facts = pod_facts({"metadata": {}, "spec": {}})
    assert (facts.namespace, facts.name, facts.uid, facts.node, facts.phase) == ("",) * 5
    assert facts.labels == {} and facts.requested_resources == frozenset()
    assert facts.slurm is None and facts.slurm_cluster == ""
    assert not (facts.terminating or facts.daemonset or facts.mirror or facts.empty_dir)
    bare = pod_facts({"metadata": {"name": "q"}, "spec": {"containers": None, "volumes": None}})
    assert bare.requested_resources == frozenset() and not bare.empty_dir


def polled(cluster: str) -> SlurmClusterStatus:
    """A cluster slurm-syncer polled successfully at T0."""
    return SlurmClusterStatus(
        cluster=cluster,
        reachable=True,
        last_poll_at=T0,
        last_success_at=T0,
        poll_interval_seconds=10.0,
    )


def test_rule_only_a_known_slurm_view_is_checked_for_freshness() -> None:
    """A pod that is no NodeSet pod has no Slurm view to age, and an unknown view stays as it
    was (with its reason); a known one of a fresh cluster is kept."""
    fresh = {"sim": polled("sim")}
    web = pod("web")
    assert with_fresh_slurm(web, fresh, T0 + 5) is web
    unknown = nodeset_pod([slurm_state("Unknown", message="node not registered in Slurm")])
    assert with_fresh_slurm(unknown, fresh, T0 + 3600) is unknown
    drained = pod("slurm-0", slurm=("Idle", "Drain"))
    assert with_fresh_slurm(drained, fresh, T0 + 5) is drained
    # Without a cluster label the pod belongs to the only cluster recorded; with two it
    # could be either's, so its state is unknown (fail closed).
    two = {"sim": polled("sim"), "other": polled("other")}
    unlabelled = with_fresh_slurm(drained, two, T0 + 5)
    assert unlabelled.slurm is not None and not unlabelled.slurm.known
