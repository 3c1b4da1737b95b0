"""The drain decision: what is evicted, skipped or blocks, and Slurm first."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from maintenance_scheduler.api import DrainSpec
from maintenance_scheduler.drain import drain_progress, filter_matches, plan_drain
from maintenance_scheduler.pods import with_fresh_slurm
from nodeflow_contracts.slurm import SlurmClusterStatus
from tests.unit.maintenance_scheduler.builders import T0, pod

GPU_FILTERS = ("nvidia.com/gpu-*", "nvidia.com/rdma*")


def names(pods: Sequence[object]) -> list[str]:
    return [getattr(p, "name", None) or p.pod.name for p in pods]  # type: ignore[attr-defined]


def test_rule_daemonset_and_mirror_pods_are_skipped() -> None:
    plan = plan_drain(
        DrainSpec(force=True),
        [pod("ds", owner="DaemonSet"), pod("static", owner=None, mirror=True), pod("web")],
    )
    assert names(plan.evict_now) == ["web"]
    assert sorted(h.why for h in plan.skipped) == ["DaemonSet pod", "mirror pod"]


def test_rule_unmanaged_pod_blocks_without_force() -> None:
    plan = plan_drain(DrainSpec(force=False), [pod("bare", owner=None), pod("web")])
    assert names(plan.blocking) == ["bare"]
    assert plan.evict_now == []  # as kubectl drain: nothing evicted while a pod blocks
    assert not plan.done


def test_rule_force_evicts_unmanaged_pods() -> None:
    plan = plan_drain(DrainSpec(force=True), [pod("bare", owner=None)])
    assert names(plan.evict_now) == ["bare"]


def test_rule_empty_dir_blocks_without_delete_empty_dir() -> None:
    assert names(plan_drain(DrainSpec(), [pod("p", empty_dir=True)]).blocking) == ["p"]
    allowed = plan_drain(DrainSpec(delete_empty_dir=True), [pod("p", empty_dir=True)])
    assert names(allowed.evict_now) == ["p"]


def test_rule_eviction_filters_apply_before_empty_dir_and_unmanaged_checks() -> None:
    spec = DrainSpec(eviction_filters=GPU_FILTERS)
    pods = [
        pod("cpu-scratch", empty_dir=True, resources=("cpu",)),
        pod("cpu-bare", owner=None, resources=("cpu",)),
        pod("gpu", resources=("cpu", "nvidia.com/gpu-h100")),
    ]
    plan = plan_drain(spec, pods)
    assert plan.blocking == []
    assert names(plan.evict_now) == ["gpu"]
    assert sorted(h.pod.name for h in plan.skipped) == ["cpu-bare", "cpu-scratch"]


def test_rule_eviction_filters_are_ored() -> None:
    plan = plan_drain(
        DrainSpec(eviction_filters=GPU_FILTERS),
        [
            pod("rdma", resources=("nvidia.com/rdma_shared",)),
            pod("gpu", resources=("nvidia.com/gpu",)),
        ],
    )
    assert names(plan.evict_now) == ["gpu", "rdma"]


def test_rule_invalid_filter_regex_matches_nothing() -> None:
    assert not filter_matches("nvidia.com/gpu[", ["nvidia.com/gpu"])


def test_rule_eviction_filters_are_go_regexps() -> None:
    """The reference's filters are Go regexps (RE2 syntax): POSIX classes, Unicode classes
    and \\z read as Go reads them (Python's re refused or misread each, so the GPU pod
    matched no filter and was left on the node)."""
    for pattern in (r"^[[:alpha:]]+\.com/gpu$", r"\pL+/gpu", r"gpu\z", r"(?i)NVIDIA\.COM"):
        assert filter_matches(pattern, ["nvidia.com/gpu"]), pattern
    # A backreference is no Go regexp: it matches nothing, as an invalid one does upstream.
    assert not filter_matches(r"(gpu)\1", ["nvidia.com/gpugpu"])


def test_rule_a_filter_cannot_stall_a_round() -> None:
    """RE2 runs in time linear in the input: a pattern that makes a backtracking engine
    run for ages (nested quantifiers over a long near-match) answers at once."""
    assert not filter_matches(r"^(a+)+$", ["a" * 5000 + "!"])


def test_rule_pod_selector_limits_the_drain() -> None:
    plan = plan_drain(
        DrainSpec(pod_selector="app=train"),
        [pod("a", labels={"app": "train"}), pod("b", labels={"app": "web"})],
    )
    assert names(plan.evict_now) == ["a"]


def test_rule_terminating_pod_is_waited_for_not_evicted_again() -> None:
    plan = plan_drain(DrainSpec(), [pod("going", terminating=True)])
    assert names(plan.to_go) == ["going"]
    assert plan.evict_now == []
    assert not plan.done


def test_rule_drain_done_when_nothing_is_left() -> None:
    assert plan_drain(DrainSpec(), [pod("ds", owner="DaemonSet")]).done


def test_rule_slurm_first_nodeset_pod_waits_while_a_job_runs() -> None:
    plan = plan_drain(DrainSpec(), [pod("slurm-0", slurm=("Allocated", "Drain"))])
    assert plan.evict_now == []
    assert names(plan.waiting_for_slurm) == ["slurm-0"]


def test_rule_slurm_first_nodeset_pod_waits_until_drained() -> None:
    plan = plan_drain(DrainSpec(), [pod("slurm-0", slurm=("Idle",))])
    assert names(plan.waiting_for_slurm) == ["slurm-0"]


def test_rule_slurm_first_unknown_state_is_busy() -> None:
    for states in ((), ("Unknown",), ("Idle", "Drain", "Completing")):
        plan = plan_drain(DrainSpec(), [pod("slurm-0", slurm=states)])
        assert plan.evict_now == [], states


def test_rule_slurm_first_drained_and_idle_is_evicted() -> None:
    plan = plan_drain(DrainSpec(), [pod("slurm-0", slurm=("Idle", "Drain"))])
    assert names(plan.evict_now) == ["slurm-0"]


def test_rule_slurm_first_down_node_is_evicted() -> None:
    plan = plan_drain(DrainSpec(), [pod("slurm-0", slurm=("Down",))])
    assert names(plan.evict_now) == ["slurm-0"]


def test_rule_drain_progress_rounds_down() -> None:
    assert drain_progress(3, 2) == 33
    assert drain_progress(0, 0) == 100
    assert drain_progress(4, 0) == 100
    assert drain_progress(2, 5) == 0


def cluster_status(last_success_at: float) -> SlurmClusterStatus:
    return SlurmClusterStatus(
        cluster="sim",
        reachable=True,
        last_poll_at=last_success_at,
        last_success_at=last_success_at,
        poll_interval_seconds=10.0,
    )


def test_rule_slurm_first_stale_slurm_state_is_unknown() -> None:
    drained = pod("slurm-0", slurm=("Idle", "Drain"))
    drained = dataclasses.replace(drained, slurm_cluster="sim")
    fresh = with_fresh_slurm(drained, {"sim": cluster_status(T0)}, T0 + 5)
    assert fresh.slurm is not None and fresh.slurm.drained_and_idle
    stale = with_fresh_slurm(drained, {"sim": cluster_status(T0)}, T0 + 3600)
    assert names(plan_drain(DrainSpec(), [stale]).waiting_for_slurm) == ["slurm-0"]
    unrecorded = with_fresh_slurm(drained, {"other": cluster_status(T0)}, T0 + 5)
    assert unrecorded.slurm is not None and not unrecorded.slurm.known
    # No cluster status recorded at all (a lost bucket, a syncer not yet started): the
    # conditions left in Kubernetes may be any age, so they prove nothing (fail closed).
    unseen = with_fresh_slurm(drained, {}, T0 + 3600)
    assert unseen.slurm is not None and not unseen.slurm.known
    assert names(plan_drain(DrainSpec(), [unseen]).waiting_for_slurm) == ["slurm-0"]


def test_rule_finished_pods_never_block_the_drain() -> None:
    """A Succeeded or Failed pod loses nothing by going: its emptyDir or missing controller
    does not block the drain (kubectl drain's checks are for running pods)."""
    finished = [
        pod("done-scratch", empty_dir=True, phase="Succeeded"),
        pod("failed-bare", owner=None, phase="Failed"),
    ]
    plan = plan_drain(DrainSpec(), finished)
    assert plan.blocking == []
    assert names(plan.evict_now) == ["done-scratch", "failed-bare"]
    # The same pods running block it.
    running = [pod("scratch", empty_dir=True), pod("bare", owner=None)]
    assert names(plan_drain(DrainSpec(), running).blocking) == ["bare", "scratch"]


def test_rule_a_terminating_pod_is_waited_for_even_with_an_empty_dir_or_no_controller() -> None:
    """A pod already terminating is going whatever the drain says: it never blocks the others'
    evictions, the drain waits for it to be gone."""
    plan = plan_drain(
        DrainSpec(),
        [pod("going", empty_dir=True, owner=None, terminating=True), pod("web")],
    )
    assert plan.blocking == []
    assert names(plan.to_go) == ["going", "web"]
    assert names(plan.evict_now) == ["web"]


def test_rule_slurm_first_a_finished_nodeset_pod_is_removed_without_waiting() -> None:
    """A NodeSet pod that has finished runs no slurmd, so no job: its Slurm conditions (left
    as they were, Allocated) do not hold it; the same pod running waits for Slurm."""
    finished = pod("slurm-0", slurm=("Allocated",), phase="Failed")
    assert names(plan_drain(DrainSpec(), [finished]).evict_now) == ["slurm-0"]
    running = pod("slurm-0", slurm=("Allocated",))
    assert names(plan_drain(DrainSpec(), [running]).waiting_for_slurm) == ["slurm-0"]


def test_rule_a_drain_is_not_done_while_a_pod_blocks_it() -> None:
    """The only pod left blocks (no controller, force false): nothing is evicted and the
    drain is not done, so the node never goes Ready with the pod on it."""
    blocked = plan_drain(DrainSpec(), [pod("bare", owner=None)])
    assert names(blocked.blocking) == ["bare"]
    assert blocked.to_go == []
    assert not blocked.done
    assert plan_drain(DrainSpec(force=True), [pod("bare", owner=None)]).evict_now


def test_rule_an_invalid_pod_selector_never_makes_a_drain_done() -> None:
    plan = plan_drain(DrainSpec(pod_selector="app in (a"), [pod("web")])
    assert plan.selector_error
    assert plan.to_go == []
    assert plan.total_pods == 1
    assert not plan.done


def test_rule_drain_progress_of_a_single_pod_and_of_two_thirds() -> None:
    """One pod to evict and still there is 0 %, gone 100 %; two of three gone is 66 % (down)."""
    assert drain_progress(1, 1) == 0
    assert drain_progress(1, 0) == 100
    assert drain_progress(3, 1) == 66
