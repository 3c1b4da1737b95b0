"""Rule 1a (one NodeSet per node): a create waits for every command on its node's slot.

A NodeSet scaled down releases its node's claim; scaled back up before the release is
visible, its plan still reads the node as claimed and plans a create there. Were the create
sent, the release would land, a second NodeSet would claim the node and create its pod, and
the first create would land too: two slurmd pods on one node. The service holds the create
until the node's slot is free, and the next plan claims the node again or leaves it.
"""

from __future__ import annotations

import asyncio
import copy
from typing import cast

from nats.aio.msg import Msg

from nodeflow_contracts import codec
from nodeflow_contracts.k8s import CommandOutcome, CreateObject, K8sCommand, PatchObject
from nodeflow_contracts.pod_protocol import CLAIM_ANNOTATION
from nodeflow_contracts.slurm import SlurmClusterStatus
from nodeset_controller.commands import node_slot, to_outgoing
from nodeset_controller.config import NodeSetControllerConfig
from nodeset_controller.planner import CreatePod, Release
from nodeset_controller.service import RELEASE_LANDING_MARGIN_SECONDS
from nodeset_controller.spec import parse
from tests.unit.nodeset_controller.builders import CLUSTER, DEFAULTS, NS, T0, node, nodeset
from tests.unit.nodeset_controller.memory_cluster import MemoryCluster, _Delivered

A = f"{NS}.gpu"
B = f"{NS}.cpu"
# The controller has led long enough that no earlier leader's command can still land.
LEADING_SINCE = T0 - 3600.0


def test_rule_a_create_is_blocked_by_its_node_slot() -> None:
    spec = parse(nodeset(replicas=1), DEFAULTS)
    create = CreatePod("n0", "uid-n0", "7", "gpu-001-001", "rev", spec, "scale up")
    assert node_slot("n0") in to_outgoing(spec, create, T0).also_blocked_by
    release = Release("n0", "uid-n0", "7", "gpu-001-001", "scaled down")
    assert to_outgoing(spec, release, T0).slot == node_slot("n0")


def _nodes_on(cluster: MemoryCluster) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for pod in cluster.pods.values():
        if not pod["metadata"].get("deletionTimestamp"):
            found.setdefault(pod["spec"]["nodeName"], []).append(pod["metadata"]["name"])
    return found


async def _deliver(cluster: MemoryCluster, command: K8sCommand, now: float) -> None:
    """Apply a pod command (MemoryCluster) or a node claim patch (resourceVersion
    precondition, as the API server would), and report its outcome."""
    if command.target.kind == "Pod":
        await cluster.deliver(command, now)
        return
    assert command.target.kind == "Node" and isinstance(command.operation, PatchObject)
    key = f"_.{command.target.name}"
    current = cluster.nodes.get(key)
    applied = current is not None and (
        command.target.resource_version in (None, current["metadata"]["resourceVersion"])
    )
    rv = None
    if applied and current is not None:
        changed = copy.deepcopy(current)
        for name, value in command.operation.patch["metadata"]["annotations"].items():
            if value is None:
                changed["metadata"]["annotations"].pop(name, None)
            else:
                changed["metadata"]["annotations"][name] = value
        rv = cluster.next_rv()
        changed["metadata"]["resourceVersion"] = rv
        cluster.nodes.put(key, changed)
    outcome = CommandOutcome(
        idempotency_key=command.idempotency_key,
        op="PatchObject",
        sender=command.sender,
        target=command.target,
        outcome="applied" if applied else "conflict",
        sent_at=command.sent_at,
        finished_at=now,
        resource_version=rv,
    )
    await cluster.controller._on_outcome(
        cast(Msg, _Delivered(codec.encode(outcome), outcome.subject))
    )


def _changes(commands: list[K8sCommand]) -> list[K8sCommand]:
    return [c for c in commands if c.target.kind in ("Pod", "Node")]


def test_rule_scale_down_and_up_fast_never_puts_two_nodesets_on_one_node() -> None:
    """Issue 28 item 2, at the service: NodeSet gpu releases n0 (scaled to 0), is scaled back
    to 1 while the release is in flight; NodeSet cpu wants n0 too. Whatever lands when, at
    most one NodeSet pod runs on n0."""
    loop = asyncio.new_event_loop()
    try:
        cluster = MemoryCluster(
            NodeSetControllerConfig(nats_url=("nats://unused",), in_flight_timeout_seconds=20.0),
            leading_since=LEADING_SINCE,
        )
        cluster.clusters.put(
            CLUSTER,
            SlurmClusterStatus(
                cluster=CLUSTER,
                reachable=True,
                last_poll_at=T0,
                last_success_at=T0,
                poll_interval_seconds=10.0,
            ),
        )
        cluster.nodes.put("_.n0", node("n0", "10.0.1.1", claim=A, rv="50"))
        cluster.nodesets.put(A, nodeset("gpu", replicas=0))
        cluster.nodesets.put(B, nodeset("cpu", replicas=1))
        now = T0

        def round_(key: str) -> list[K8sCommand]:
            return _changes(loop.run_until_complete(cluster.round(key, now)))

        (release,) = round_(A)
        assert isinstance(release.operation, PatchObject)
        assert release.operation.patch["metadata"]["annotations"][CLAIM_ANNOTATION] is None
        # Scaled back up before the release landed: the plan still reads n0 as gpu's.
        cluster.nodesets.put(A, nodeset("gpu", replicas=1, rv="11"))
        held = round_(A)
        assert not any(isinstance(c.operation, CreateObject) for c in held)
        late = [*held]
        loop.run_until_complete(_deliver(cluster, release, now))
        # n0 is free: both NodeSets plan a claim; the first to land wins it.
        claims = round_(B) + round_(A)
        for command in claims:
            loop.run_until_complete(_deliver(cluster, command, now))
        for _ in range(3):
            for key in (A, B):
                for command in round_(key):
                    loop.run_until_complete(_deliver(cluster, command, now))
        for command in late:
            loop.run_until_complete(_deliver(cluster, command, now))
        on_nodes = _nodes_on(cluster)
        assert len(on_nodes.get("n0", [])) == 1, on_nodes
        winner = cluster.nodes.get("_.n0")
        assert winner is not None
        owner = winner["metadata"]["annotations"][CLAIM_ANNOTATION]
        prefix = "gpu" if owner == A else "cpu"
        assert on_nodes["n0"][0].startswith(prefix)
    finally:
        loop.close()


def test_rule_a_release_holds_its_node_until_it_can_no_longer_land() -> None:
    """The in-flight timeout is shorter than a command's life: a release neither applied nor
    refused (its last request unanswered: `failed`) may still land, so the create on its
    node waits until the release's deadline has passed, not just the timeout."""
    loop = asyncio.new_event_loop()
    try:
        cluster = MemoryCluster(
            NodeSetControllerConfig(
                nats_url=("nats://unused",), in_flight_timeout_seconds=0.5, resync_seconds=1.0
            ),
            leading_since=LEADING_SINCE,
        )
        cluster.clusters.put(
            CLUSTER,
            SlurmClusterStatus(
                cluster=CLUSTER,
                reachable=True,
                last_poll_at=T0,
                last_success_at=T0,
                poll_interval_seconds=10.0,
            ),
        )
        cluster.nodes.put("_.n0", node("n0", "10.0.1.1", claim=A, rv="50"))
        cluster.nodesets.put(A, nodeset("gpu", replicas=0))

        def round_at(now: float) -> list[K8sCommand]:
            return _changes(loop.run_until_complete(cluster.round(A, now)))

        (release,) = round_at(T0)
        outcome = CommandOutcome(
            idempotency_key=release.idempotency_key,
            op="PatchObject",
            sender=release.sender,
            target=release.target,
            outcome="failed",
            sent_at=release.sent_at,
            finished_at=T0 + 1,
        )
        loop.run_until_complete(
            cluster.controller._on_outcome(
                cast(Msg, _Delivered(codec.encode(outcome), outcome.subject))
            )
        )
        cluster.nodesets.put(A, nodeset("gpu", replicas=1, rv="11"))
        assert release.expires_at is not None
        for now in (T0 + 1, T0 + 5, release.expires_at):
            held = round_at(now)
            assert not any(isinstance(c.operation, CreateObject) for c in held), now
        later = round_at(release.expires_at + 10)
        assert [c.target.name for c in later if isinstance(c.operation, CreateObject)] == [
            "gpu-001-001"
        ]
    finally:
        loop.close()


def _slurm_read(cluster: MemoryCluster, at: float) -> None:
    cluster.clusters.put(
        CLUSTER,
        SlurmClusterStatus(
            cluster=CLUSTER,
            reachable=True,
            last_poll_at=at,
            last_success_at=at,
            poll_interval_seconds=10.0,
        ),
    )


def _creates(commands: list[K8sCommand]) -> list[str]:
    return [c.target.name for c in commands if isinstance(c.operation, CreateObject)]


def test_rule_a_regained_lead_sends_no_create_while_an_earlier_release_may_land() -> None:
    """Rule 1a across a leadership change: the leader releases n0 (gpu scaled to 0), loses
    and regains the lead (its in-flight table is gone), and gpu is scaled back to 1 while
    the release is still in flight. The plan reads n0 as gpu's; a create sent now could be
    followed by the release, leaving gpu's pod on an unclaimed node for another NodeSet.
    No create, claim or release goes out until the release's whole life and landing margin
    have passed since the lead was regained; the NodeSet status is still kept meanwhile."""
    loop = asyncio.new_event_loop()
    try:
        config = NodeSetControllerConfig(nats_url=("nats://unused",))
        cluster = MemoryCluster(config, leading_since=LEADING_SINCE)
        _slurm_read(cluster, T0)
        cluster.nodes.put("_.n0", node("n0", "10.0.1.1", claim=A, rv="50"))
        cluster.nodesets.put(A, nodeset("gpu", replicas=0))

        def round_at(now: float) -> list[K8sCommand]:
            return loop.run_until_complete(cluster.round(A, now))

        (release,) = _changes(round_at(T0))
        assert release.expires_at is not None
        cluster.controller._on_leadership(False)
        cluster.controller._on_leadership(True)
        cluster.nodesets.put(A, nodeset("gpu", replicas=1, rv="11"))
        regained = T0 + 1
        window = config.command_lifetime_seconds + RELEASE_LANDING_MARGIN_SECONDS
        first = round_at(regained)
        assert _changes(first) == []
        # The status (and the NodeSet's PodDisruptionBudget, no node command) still go out.
        assert {c.target.kind for c in first} == {"NodeSet", "PodDisruptionBudget"}
        for now in (regained + 5, release.expires_at, regained + window - 0.01):
            _slurm_read(cluster, now)
            assert _changes(round_at(now)) == [], now
        # The release was lost on its way: once it can no longer land, the create goes out.
        _slurm_read(cluster, regained + window)
        assert _creates(round_at(regained + window)) == ["gpu-001-001"]
    finally:
        loop.close()


def test_rule_a_restarted_controller_waits_out_the_earlier_commands_life() -> None:
    """A new controller (a restart, or another replica taking over) cannot see what the
    earlier one sent. When the earlier release lands inside the window, the new leader's
    next plan reads n0 as free and claims it again: never a pod on an unclaimed node."""
    loop = asyncio.new_event_loop()
    try:
        config = NodeSetControllerConfig(nats_url=("nats://unused",))
        earlier = MemoryCluster(config, leading_since=LEADING_SINCE)
        _slurm_read(earlier, T0)
        earlier.nodes.put("_.n0", node("n0", "10.0.1.1", claim=A, rv="50"))
        earlier.nodesets.put(A, nodeset("gpu", replicas=0))
        (release,) = _changes(loop.run_until_complete(earlier.round(A, T0)))

        restarted = MemoryCluster(config)
        _slurm_read(restarted, T0 + 2)
        restarted.nodes.put("_.n0", node("n0", "10.0.1.1", claim=A, rv="50"))
        restarted.nodesets.put(A, nodeset("gpu", replicas=1, rv="11"))
        started = T0 + 2

        def round_at(now: float) -> list[K8sCommand]:
            _slurm_read(restarted, now)
            return _changes(loop.run_until_complete(restarted.round(A, now)))

        assert round_at(started) == []
        assert round_at(started + 10) == []
        # The earlier release lands (before its deadline): n0 is no NodeSet's.
        assert release.expires_at is not None and started + 15 < release.expires_at
        loop.run_until_complete(_deliver(restarted, release, started + 15))
        released = restarted.nodes.get("_.n0")
        assert released is not None
        assert CLAIM_ANNOTATION not in released["metadata"]["annotations"]
        window = config.command_lifetime_seconds + RELEASE_LANDING_MARGIN_SECONDS
        after = round_at(started + window)
        assert _creates(after) == []
        (claim,) = after
        assert isinstance(claim.operation, PatchObject)
        assert claim.operation.patch["metadata"]["annotations"][CLAIM_ANNOTATION] == A
        assert _nodes_on(restarted) == {}
    finally:
        loop.close()
