"""Rule 4 (safe deletion): what proves a bound pod runs no job.

A bound pod is deleted only on Slurm's word read after its SlurmDelete was set: drained and
idle, DOWN, or absent past the grace. Pending proves nothing on a bound pod (the kubelet
reports Pending while a sidecar's image does not pull, slurmd running beside it), and an
"idle" read from before the mark proves nothing either (a job placed since, a drain undone
by a scale back up). The NeverStarted shortcut is for pods no kubelet has (unbound).
"""

from __future__ import annotations

import asyncio

from hypothesis import given
from hypothesis import strategies as st

from nodeflow_contracts.k8s import DeleteObject
from nodeflow_contracts.pod_protocol import ROLLING_DELETE, SCALING_DELETE
from nodeflow_contracts.slurm import SlurmNodeState
from nodeset_controller.config import NodeSetControllerConfig
from nodeset_controller.deletion import AWAITING_SLURM_READ, decide_deletion
from nodeset_controller.planner import DeletePod, plan
from tests.unit.nodeset_controller.builders import (
    CLUSTER,
    NS,
    T0,
    cluster_status,
    node,
    nodeset,
    pod,
    slurm,
    state,
)
from tests.unit.nodeset_controller.memory_cluster import MemoryCluster
from tests.unit.nodeset_controller.test_planner import KEY, REV, full, of, view


def test_rule_a_bound_pending_pod_never_counts_as_never_started() -> None:
    """Issue 28 item 1: slurmd runs and is registered beside a sidecar whose image does not
    pull, so the pod is Pending; Slurm, read fresh, says idle and not drained. The pod is not
    deleted: a job may have been placed after that poll."""
    node_map, pods = full(3)
    pods[0] = pod("gpu-001-001", "n0", ready=False, phase="Pending", delete_reason=SCALING_DELETE)
    states = {p["metadata"]["name"]: slurm(p["metadata"]["name"]) for p in pods}
    result = plan(view(nodeset(replicas=2), node_map, pods, states))
    assert of(result, DeletePod) == []
    bound = state(pods[0], slurm("gpu-001-001"), read_at=T0)
    decision = decide_deletion(bound, T0 + 10**6, 0, 0)
    assert (decision.verdict, decision.reason) == ("wait", "NotDrained")
    # Drained and idle, read after the mark: it goes, as drained and idle (not NeverStarted).
    states["gpu-001-001"] = slurm("gpu-001-001", drain=True)
    drained = plan(view(nodeset(replicas=2), node_map, pods, states))
    assert [(d.pod.name, d.reason) for d in of(drained, DeletePod)] == [
        ("gpu-001-001", "DrainedAndIdle")
    ]


def test_rule_an_unbound_pending_pod_never_started_whatever_slurm_says() -> None:
    """No kubelet has the pod: no slurmd ever ran in it, so it goes at once, Slurm unknown."""
    unbound = pod("p", None, ready=False, phase="Pending", delete_reason=SCALING_DELETE)
    decision = decide_deletion(state(unbound, None), T0, 0, 0)
    assert (decision.verdict, decision.reason) == ("delete", "NeverStarted")


def test_rule_drained_and_idle_read_before_the_mark_proves_nothing() -> None:
    """A drained, idle state read before SlurmDelete was set (the drain of an earlier mark
    that a scale back up undid since, say) waits for a poll after the mark; the plan names
    the time it waits past, and deletes once the cluster was polled after it."""
    node_map, pods = full(2)
    pods[0] = pod("gpu-001-001", "n0", delete_reason=SCALING_DELETE, delete_since=T0)
    states = {p["metadata"]["name"]: slurm(p["metadata"]["name"]) for p in pods}
    states["gpu-001-001"] = slurm("gpu-001-001", drain=True)
    polled_before = cluster_status(last_success_at=T0 - 5)
    waiting = plan(view(nodeset(replicas=1), node_map, pods, states, status=polled_before))
    assert of(waiting, DeletePod) == []
    assert waiting.awaits_slurm_read_after == T0
    # Within the second the mark's time names, a poll may still predate the mark.
    same_second = cluster_status(last_success_at=T0 + 0.5)
    assert (
        of(plan(view(nodeset(replicas=1), node_map, pods, states, status=same_second)), DeletePod)
        == []
    )
    polled_after = cluster_status(last_success_at=T0 + 1)
    done = plan(view(nodeset(replicas=1), node_map, pods, states, now=T0 + 2, status=polled_after))
    assert [(d.pod.name, d.reason) for d in of(done, DeletePod)] == [
        ("gpu-001-001", "DrainedAndIdle")
    ]
    assert done.awaits_slurm_read_after is None
    down = state(pods[0], slurm("gpu-001-001", down=True), read_at=T0 - 5)
    decision = decide_deletion(down, T0 + 10, 0, 0)
    assert (decision.verdict, decision.reason) == ("wait", AWAITING_SLURM_READ)


@given(
    phase=st.sampled_from(["Pending", "Running", ""]),
    ready=st.booleans(),
    busy=st.booleans(),
    drain=st.booleans(),
    known=st.booleans(),
    down=st.booleans(),
    stale=st.booleans(),
    read_offset=st.one_of(st.none(), st.floats(min_value=-100, max_value=100)),
    reason=st.sampled_from([SCALING_DELETE, ROLLING_DELETE]),
)
def test_rule_a_bound_pod_is_deleted_only_on_slurm_read_after_its_mark(
    phase: str,
    ready: bool,
    busy: bool,
    drain: bool,
    known: bool,
    down: bool,
    stale: bool,
    read_offset: float | None,
    reason: str,
) -> None:
    """Property: without a forced timeout, a bound pod is deleted only when a known Slurm
    state, read at least a second after its SlurmDelete time, shows no job (drained and
    idle, or DOWN and idle)."""
    raw = pod(
        "p",
        "n",
        ready=ready,
        phase=phase or None,
        phase_missing=not phase,
        delete_reason=reason,
        delete_since=T0,
    )
    slurm_state = None if stale else slurm("p", busy=busy, drain=drain, known=known, down=down)
    read_at = None if stale or read_offset is None else T0 + read_offset
    pod_state = state(raw, slurm_state, read_at=read_at)
    decision = decide_deletion(pod_state, T0 + 10**6, 0, 0)
    if decision.verdict == "delete":
        assert read_at is not None and read_at >= T0 + 1
        assert slurm_state is not None and slurm_state.known and not slurm_state.busy
        assert slurm_state.drained or slurm_state.base_state == "Down"
    assert decision.verdict != "forced-delete"


def test_rule_slurm_read_after_the_mark_counts_only_once_the_node_states_of_that_read_arrived() -> (
    None
):
    """Audit of issue 28 item 1: the cluster status (KV slurm_clusters) and the node states
    (KV slurm_nodes) arrive on separate consumers, so the status of a poll after the mark
    can come before that poll's node states. The DOWN state the controller holds was read a
    minute before the mark (the node has come back since, and runs a job); the status of a
    later poll alone proves nothing about it. Only once the view of slurm_nodes has applied
    the sequence that status names does its poll time count, and then the state is that
    poll's (here: still DOWN, so the pod goes)."""
    mark = T0 - 60
    node_map, pods = full(1, delete_reason=SCALING_DELETE, delete_since=mark)
    down = {"gpu-001-001": slurm("gpu-001-001", down=True)}
    after_mark = cluster_status(last_success_at=mark + 5, nodes_revision=40)

    def deletes(nodes_revision: int, status: object = after_mark) -> list[tuple[str, str]]:
        result = plan(
            view(
                nodeset(replicas=0),
                node_map,
                pods,
                down,
                status=status,  # type: ignore[arg-type]
                now=mark + 6,
                slurm_nodes_revision=nodes_revision,
            )
        )
        return [(d.pod.name, d.reason) for d in of(result, DeletePod)]

    assert deletes(39) == [], "deleted on a node state from before the poll the status names"
    assert deletes(0) == []
    assert deletes(40) == [("gpu-001-001", "SlurmNodeDown")]
    assert deletes(41) == [("gpu-001-001", "SlurmNodeDown")]
    # A status that does not name its sequence (an older slurm-syncer) proves nothing.
    unnamed = cluster_status(last_success_at=mark + 5, nodes_revision=0)
    assert deletes(10**6, unnamed) == []


@given(
    status_revision=st.integers(min_value=0, max_value=50),
    applied=st.integers(min_value=0, max_value=50),
    read_after_mark=st.booleans(),
)
def test_rule_a_bound_pod_leaves_only_when_the_view_holds_a_poll_after_its_mark(
    status_revision: int, applied: int, read_after_mark: bool
) -> None:
    """Whatever the order the two buckets arrive in: a bound pod on a DOWN node is deleted
    only when the cluster was polled after its mark AND the view of slurm_nodes holds that
    poll's states (the status names a sequence, and the view has applied it)."""
    mark = T0 - 60
    node_map, pods = full(1, delete_reason=SCALING_DELETE, delete_since=mark)
    polled = mark + 5 if read_after_mark else mark - 5
    status = cluster_status(last_success_at=polled, nodes_revision=status_revision)
    result = plan(
        view(
            nodeset(replicas=0),
            node_map,
            pods,
            {"gpu-001-001": slurm("gpu-001-001", down=True)},
            status=status,
            now=mark + 6,
            slurm_nodes_revision=applied,
        )
    )
    evidence = read_after_mark and 0 < status_revision <= applied
    assert bool(of(result, DeletePod)) == evidence


def test_rule_the_service_deletes_once_the_node_states_of_the_awaited_poll_arrive() -> None:
    """At the service: the status of the poll after the mark arrives first (the view of
    slurm_nodes has not applied the sequence it names): no delete. When slurm_nodes catches
    up -- here with a change of a node that is no pod's, so nothing else would re-plan the
    NodeSet -- the NodeSet is planned again and the pod on the DOWN node goes."""
    loop = asyncio.new_event_loop()
    try:
        cluster = MemoryCluster(NodeSetControllerConfig(nats_url=("nats://unused",)))
        mark = T0 - 60
        cluster.slurm.put(f"{CLUSTER}.gpu-001-001", slurm("gpu-001-001", down=True))
        cluster.clusters.put(
            CLUSTER,
            cluster_status(last_success_at=mark - 30, nodes_revision=cluster.slurm.last_revision),
        )
        cluster.nodes.put("_.n0", node("n0", "10.0.1.1", claim=KEY))
        raw = pod(
            "gpu-001-001", "n0", revision=REV, delete_reason=SCALING_DELETE, delete_since=mark
        )
        raw["metadata"]["uid"] = cluster.next_uid()
        cluster.pods.put(f"{NS}.gpu-001-001", raw)
        cluster.nodesets.put(KEY, nodeset(replicas=0))
        now = mark + 6

        def deletes_sent() -> list[str]:
            before = len(cluster.sink.sent)
            loop.run_until_complete(cluster.controller.reconcile_dirty(now))
            return [
                s.command.target.name
                for s in cluster.sink.sent[before:]
                if isinstance(s.command.operation, DeleteObject)
            ]

        assert deletes_sent() == []  # polled before the mark
        awaited = cluster.slurm.last_revision + 1
        cluster.clusters.put(
            CLUSTER, cluster_status(last_success_at=mark + 5, nodes_revision=awaited)
        )
        assert deletes_sent() == []  # that poll's node states are still on their way
        cluster.slurm.put(
            f"{CLUSTER}.login-01",
            SlurmNodeState(cluster=CLUSTER, name="login-01", known=True, base_state="Idle"),
        )
        assert cluster.slurm.last_revision == awaited
        assert deletes_sent() == ["gpu-001-001"]
    finally:
        loop.close()
