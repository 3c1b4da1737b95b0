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

from nodeflow_contracts.k8s import CommandOutcome, CreateObject, K8sCommand, PatchObject
from nodeflow_contracts.ledger import LANDING_MARGIN_SECONDS
from nodeflow_contracts.pod_protocol import CLAIM_ANNOTATION
from nodeflow_contracts.slurm import SlurmClusterStatus
from nodeset_controller.commands import node_slot, to_outgoing
from nodeset_controller.config import NodeSetControllerConfig
from nodeset_controller.planner import CreatePod, Release
from nodeset_controller.spec import parse
from tests.unit.nodeset_controller.builders import CLUSTER, DEFAULTS, NS, T0, node, nodeset
from tests.unit.nodeset_controller.memory_cluster import MemoryCluster

A = f"{NS}.gpu"
B = f"{NS}.cpu"


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
    await cluster.report(outcome)


def _outcome(command: K8sCommand, result: str, at: float) -> CommandOutcome:
    return CommandOutcome(
        idempotency_key=command.idempotency_key,
        op=command.op,
        sender=command.sender,
        target=command.target,
        outcome=result,  # type: ignore[arg-type]
        sent_at=command.sent_at,
        finished_at=at,
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
    """A release neither applied nor refused (its last request unanswered: `failed`) may
    still land, so the create on its node waits until the release's deadline and the
    landing margin (k8s-watcher's request timeout, clock skew) have passed, not just the
    in-flight timeout."""
    loop = asyncio.new_event_loop()
    try:
        cluster = MemoryCluster(
            NodeSetControllerConfig(nats_url=("nats://unused",), resync_seconds=1.0),
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
        loop.run_until_complete(cluster.report(outcome))
        cluster.nodesets.put(A, nodeset("gpu", replicas=1, rv="11"))
        assert release.expires_at is not None
        last_landing = release.expires_at + LANDING_MARGIN_SECONDS
        for now in (T0 + 1, T0 + 5, release.expires_at, release.expires_at + 6, last_landing):
            _slurm_read(cluster, now)
            held = round_at(now)
            assert not any(isinstance(c.operation, CreateObject) for c in held), now
        _slurm_read(cluster, last_landing + 1)
        later = round_at(last_landing + 1)
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
    return [
        c.target.name
        for c in commands
        if isinstance(c.operation, CreateObject) and c.target.kind == "Pod"
    ]


def test_rule_a_regained_lead_sends_no_create_while_an_earlier_release_may_land() -> None:
    """Rule 1a across a leadership change: the leader releases n0 (gpu scaled to 0), loses
    and regains the lead (its ledger rebuilt from the streams), and gpu is scaled back to 1
    while the release is still in flight. The plan reads n0 as gpu's; a create sent now
    could be followed by the release, leaving gpu's pod on an unclaimed node for another
    NodeSet. The rebuilt ledger holds n0 until the release can no longer land (its deadline
    and the landing margin); the NodeSet status is still kept meanwhile."""
    loop = asyncio.new_event_loop()
    try:
        config = NodeSetControllerConfig(nats_url=("nats://unused",))
        cluster = MemoryCluster(config)
        _slurm_read(cluster, T0)
        cluster.nodes.put("_.n0", node("n0", "10.0.1.1", claim=A, rv="50"))
        cluster.nodesets.put(A, nodeset("gpu", replicas=0))

        def round_at(now: float) -> list[K8sCommand]:
            return loop.run_until_complete(cluster.round(A, now))

        sent = round_at(T0)
        (release,) = _changes(sent)
        assert release.expires_at is not None
        regained = T0 + 1
        cluster.regain_lead(regained)
        cluster.nodesets.put(A, nodeset("gpu", replicas=1, rv="11"))
        # The scale changed the NodeSet: k8s-watcher refuses the earlier status write.
        for status in (c for c in sent if c.target.kind == "NodeSet"):
            loop.run_until_complete(cluster.report(_outcome(status, "conflict", T0 + 1)))
        window_end = release.expires_at + LANDING_MARGIN_SECONDS
        first = round_at(regained)
        assert _changes(first) == []
        # The status still goes out: only the node's slot is held.
        assert "NodeSet" in {c.target.kind for c in first}
        for now in (regained + 5, release.expires_at, window_end):
            _slurm_read(cluster, now)
            assert _changes(round_at(now)) == [], now
        # The release was lost on its way: once it can no longer land, the create goes out.
        _slurm_read(cluster, window_end + 0.01)
        assert _creates(round_at(window_end + 0.01)) == ["gpu-001-001"]
    finally:
        loop.close()


def test_rule_a_new_leader_plans_at_once_around_settled_commands() -> None:
    """No fixed pause after taking the lead: the earlier leader's release was refused
    (`conflict`: it can never land), so the rebuilt ledger holds nothing on n0 and the new
    leader's first round creates gpu's pod on the node gpu still claims."""
    loop = asyncio.new_event_loop()
    try:
        config = NodeSetControllerConfig(nats_url=("nats://unused",))
        earlier = MemoryCluster(config)
        _slurm_read(earlier, T0)
        earlier.nodes.put("_.n0", node("n0", "10.0.1.1", claim=A, rv="50"))
        earlier.nodesets.put(A, nodeset("gpu", replicas=0))
        (release,) = _changes(loop.run_until_complete(earlier.round(A, T0)))
        loop.run_until_complete(earlier.report(_outcome(release, "conflict", T0 + 0.5)))

        successor = MemoryCluster(config, predecessor=earlier, leading_since=T0 + 1)
        _slurm_read(successor, T0 + 1)
        successor.nodes.put("_.n0", node("n0", "10.0.1.1", claim=A, rv="50"))
        successor.nodesets.put(A, nodeset("gpu", replicas=1, rv="11"))
        first = loop.run_until_complete(successor.round(A, T0 + 1))
        assert _creates(first) == ["gpu-001-001"]
    finally:
        loop.close()


def test_rule_a_restarted_controller_waits_out_the_earlier_commands_life() -> None:
    """A restarted controller (or another replica taking over) rebuilds its ledger from the
    earlier one's records: the release it sent holds n0. When that release lands, the new
    leader's next plan reads n0 as free and claims it again at once (no fixed window):
    never a pod on an unclaimed node."""
    loop = asyncio.new_event_loop()
    try:
        config = NodeSetControllerConfig(nats_url=("nats://unused",))
        earlier = MemoryCluster(config)
        _slurm_read(earlier, T0)
        earlier.nodes.put("_.n0", node("n0", "10.0.1.1", claim=A, rv="50"))
        earlier.nodesets.put(A, nodeset("gpu", replicas=0))
        (release,) = _changes(loop.run_until_complete(earlier.round(A, T0)))

        started = T0 + 2
        restarted = MemoryCluster(config, predecessor=earlier, leading_since=started)
        _slurm_read(restarted, started)
        restarted.nodes.put("_.n0", node("n0", "10.0.1.1", claim=A, rv="50"))
        restarted.nodesets.put(A, nodeset("gpu", replicas=1, rv="11"))

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
        after = round_at(started + 16)
        assert _creates(after) == []
        (claim,) = after
        assert isinstance(claim.operation, PatchObject)
        assert claim.operation.patch["metadata"]["annotations"][CLAIM_ANNOTATION] == A
        assert _nodes_on(restarted) == {}
    finally:
        loop.close()


def _status_writes(commands: list[K8sCommand]) -> list[K8sCommand]:
    return [c for c in commands if c.target.kind == "NodeSet" and c.op == "update-status"]


def test_rule_a_new_leader_writes_the_status_at_once_over_an_unsent_status_write() -> None:
    """A status write the earlier leader recorded and never sent (killed in between) names
    the NodeSet's resourceVersion, so it cannot land over a newer write: the new leader does
    not wait out its life plus the landing margin (a minute of stale status), it writes the
    status in its first round. A release of the same round still holds its node."""
    loop = asyncio.new_event_loop()
    try:
        config = NodeSetControllerConfig(nats_url=("nats://unused",))
        earlier = MemoryCluster(config)
        _slurm_read(earlier, T0)
        earlier.nodes.put("_.n0", node("n0", "10.0.1.1", claim=A, rv="50"))
        earlier.nodesets.put(A, nodeset("gpu", replicas=0, rv="11"))
        sent = loop.run_until_complete(earlier.round(A, T0))
        assert _status_writes(sent) and _changes(sent)

        started = T0 + 2
        restarted = MemoryCluster(config, predecessor=earlier, leading_since=started)
        _slurm_read(restarted, started)
        restarted.nodes.put("_.n0", node("n0", "10.0.1.1", claim=A, rv="50"))
        restarted.nodesets.put(A, nodeset("gpu", replicas=0, rv="11"))
        first = loop.run_until_complete(restarted.round(A, started))
        assert _status_writes(first)
        assert _changes(first) == []
    finally:
        loop.close()
