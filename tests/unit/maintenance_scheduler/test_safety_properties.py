"""Safety rules as properties over random inputs: a drain never evicts a pod it must not
(Slurm node busy or unknown, DaemonSet, mirror, filtered out, while a pod blocks), and a
deletion never uncordons a node it did not cordon or that another request still needs, and a
node that replaced the one a request was made for is never touched for it."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from maintenance_scheduler.actions import CordonNode, EvictPod, PatchRequest, UncordonNode
from maintenance_scheduler.api import INITIAL_STATE_ANNOTATION, DrainSpec
from maintenance_scheduler.drain import filter_matches, plan_drain
from maintenance_scheduler.pods import PodFacts
from maintenance_scheduler.reconcile import reconcile_request
from tests.unit.maintenance_scheduler.builders import (
    T0,
    nm,
    node_facts,
    pod,
    predecessor_owner,
)

SLURM_STATES = st.one_of(
    st.none(),
    st.lists(
        st.sampled_from(
            [
                "Idle",
                "Allocated",
                "Mixed",
                "Down",
                "Unknown",
                "Drain",
                "Completing",
                "NotResponding",
            ]
        ),
        max_size=3,
        unique=True,
    ).map(tuple),
)


@st.composite
def pods(draw: st.DrawFn, index: int) -> PodFacts:
    return pod(
        f"p{index}",
        owner=draw(st.sampled_from([None, "ReplicaSet", "DaemonSet", "Job"])),
        resources=tuple(
            draw(
                st.lists(
                    st.sampled_from(["cpu", "memory", "nvidia.com/gpu", "nvidia.com/rdma_a"]),
                    min_size=1,
                    max_size=3,
                    unique=True,
                )
            )
        ),
        empty_dir=draw(st.booleans()),
        mirror=draw(st.booleans()),
        phase=draw(st.sampled_from(["Running", "Running", "Pending", "Succeeded"])),
        terminating=draw(st.booleans()),
        slurm=draw(SLURM_STATES),
    )


@st.composite
def drains(draw: st.DrawFn) -> tuple[DrainSpec, list[PodFacts]]:
    spec = DrainSpec(
        force=draw(st.booleans()),
        delete_empty_dir=draw(st.booleans()),
        eviction_filters=tuple(
            draw(st.lists(st.sampled_from(["nvidia.com/gpu", "rdma", "cpu", "["]), max_size=2))
        ),
    )
    count = draw(st.integers(0, 8))
    return spec, [draw(pods(i)) for i in range(count)]


@settings(max_examples=300, deadline=None)
@given(drains())
def test_rule_property_drain_never_evicts_what_it_must_not(
    case: tuple[DrainSpec, list[PodFacts]],
) -> None:
    spec, on_node = case
    plan = plan_drain(spec, on_node)
    if plan.blocking:
        assert plan.evict_now == []
    for evicted in plan.evict_now:
        assert not evicted.terminating
        assert not evicted.daemonset and not evicted.mirror
        if spec.eviction_filters:
            assert any(
                filter_matches(f, evicted.requested_resources) for f in spec.eviction_filters
            )
        if not evicted.terminal:
            assert spec.force or evicted.has_controller
            assert spec.delete_empty_dir or not evicted.empty_dir
            if evicted.slurm is not None:
                # Slurm first, fail closed: only a known, idle, drained (or down) node.
                assert evicted.slurm.known and not evicted.slurm.busy
                assert "Drain" in evicted.slurm.flags or evicted.slurm.base_state == "Down"


PHASES = ["Pending", "Scheduled", "Cordon", "WaitForPodCompletion", "Draining", "Ready"]


@settings(max_examples=300, deadline=None)
@given(
    phase=st.sampled_from(PHASES),
    initial=st.sampled_from([None, "true", "false"]),
    cordon=st.booleans(),
    unschedulable=st.booleans(),
    other_phase=st.sampled_from([None, *PHASES]),
    other_cordon=st.booleans(),
)
def test_rule_property_deletion_uncordons_only_its_own_unneeded_cordon(
    phase: str,
    initial: str | None,
    cordon: bool,
    unschedulable: bool,
    other_phase: str | None,
    other_cordon: bool,
) -> None:
    annotations = {INITIAL_STATE_ANNOTATION: initial} if initial is not None else {}
    request = nm(
        "r",
        "n1",
        phase=phase,
        finalizer=True,
        deleting=True,
        annotations=annotations,
        cordon=cordon,
    )
    others = []
    if other_phase is not None:
        others.append(nm("other", "n1", phase=other_phase, finalizer=True, cordon=other_cordon))
    step = reconcile_request(request, node_facts("n1", unschedulable=unschedulable), [], others, T0)
    if any(isinstance(a, UncordonNode) for a in step.actions):
        assert initial == "false" and cordon
        assert phase not in ("Pending", "Scheduled")
        assert not (
            other_cordon and other_phase in ("Cordon", "WaitForPodCompletion", "Draining", "Ready")
        )


@settings(max_examples=300, deadline=None)
@given(
    phase=st.sampled_from(
        [None, "Pending", "Scheduled", "Cordon", "WaitForPodCompletion", "Draining", "Ready"]
    ),
    deleting=st.booleans(),
    finalizer=st.booleans(),
    initial=st.sampled_from([None, "true", "false"]),
    unschedulable=st.booleans(),
    additional=st.booleans(),
    drain=st.booleans(),
    pod_count=st.integers(0, 3),
)
def test_rule_property_a_replacement_node_is_never_touched_for_its_predecessors_request(
    phase: str | None,
    deleting: bool,
    finalizer: bool,
    initial: str | None,
    unschedulable: bool,
    additional: bool,
    drain: bool,
    pod_count: int,
) -> None:
    """A request made for node n1 of another uid (its Node ownerReference) is never cordoned,
    drained, uncordoned or re-owned on the n1 that replaced it, in any phase or state."""
    spec: dict[str, object] = {}
    if additional:
        spec["additionalRequestors"] = ["other.example.com"]
    if drain:
        spec["drainSpec"] = {"force": True, "deleteEmptyDir": True, "timeoutSeconds": 0}
    request = nm(
        "r",
        "n1",
        phase=phase,
        deleting=deleting,
        finalizer=finalizer,
        annotations={} if initial is None else {INITIAL_STATE_ANNOTATION: initial},
        owners=(predecessor_owner("n1"),),
        **spec,
    )
    newcomer = node_facts("n1", unschedulable=unschedulable)
    pods_on_node = [pod(f"p{i}") for i in range(pod_count)]
    step = reconcile_request(request, newcomer, pods_on_node, [request], T0)
    touched = [a for a in step.actions if isinstance(a, CordonNode | UncordonNode | EvictPod)]
    assert touched == []
    assert all(a.owner_references is None for a in step.actions if isinstance(a, PatchRequest))
