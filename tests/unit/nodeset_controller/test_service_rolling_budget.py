"""The rolling budget at the service level: the controller's decision loop (plan, command
ledger, send) against an in-memory cluster, with commands delivered late and in any order,
Slurm states changing, new pods turning ready and the lead changing hands in between.

A command may land at any time until its deadline plus the landing margin (k8s-watcher's
last request may be applied that late); one not delivered by then is lost. A new leader
starts from the ledger rebuilt from what the earlier one recorded and was told
(`MemoryCluster.regain_lead`)."""

from __future__ import annotations

import asyncio
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from nodeflow_contracts.ledger import LANDING_MARGIN_SECONDS
from nodeflow_contracts.pod_protocol import (
    CLAIM_ANNOTATION,
    NODESET_LABEL,
    REVISION_LABEL,
    SLURM_DELETE_CONDITION,
)
from nodeflow_contracts.slurm import SlurmClusterStatus, SlurmNodeState
from nodeset_controller.config import NodeSetControllerConfig
from tests.unit.nodeset_controller.builders import CLUSTER, NS, T0, node, nodeset, pod
from tests.unit.nodeset_controller.memory_cluster import MemoryCluster, Sent, is_marked

IN_FLIGHT_TIMEOUT = 20.0
TOO_BIG = {
    "containers": [
        {"name": "slurmd", "image": "slurmd:24.12", "resources": {"requests": {"cpu": "999"}}}
    ]
}
KEY = f"{NS}.gpu"


def slurm_state(
    name: str, *, busy: bool, drain: bool = False, down: bool = False
) -> SlurmNodeState:
    return SlurmNodeState(
        cluster=CLUSTER,
        name=name,
        known=True,
        base_state="Down" if down else "Allocated" if busy else "Idle",
        flags=("Drain",) if drain else (),
        busy=busy and not down,
        drain=drain,
        drained=drain and not (busy and not down),
        draining=drain and busy and not down,
    )


class RollingBudget(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        config = NodeSetControllerConfig(
            nats_url=("nats://unused",),
            in_flight_timeout_seconds=IN_FLIGHT_TIMEOUT,
            max_commands_in_flight=64,
        )
        self.cluster = MemoryCluster(config)
        self.now = T0
        self.pending: list[Sent] = []
        self.replicas = 0
        self.budget = 0

    def teardown(self) -> None:
        self.loop.close()

    @initialize(
        replicas=st.integers(min_value=2, max_value=5),
        budget=st.integers(min_value=1, max_value=2),
        busy=st.lists(st.booleans(), min_size=5, max_size=5),
    )
    def start(self, replicas: int, budget: int, busy: list[bool]) -> None:
        self.replicas, self.budget = replicas, budget
        c = self.cluster
        c.clusters.put(CLUSTER, self.status())
        for i in range(replicas):
            name = f"gpu-001-{i + 1:03d}"
            c.nodes.put(f"_.n{i}", node(f"n{i}", f"10.0.1.{i + 1}", claim=KEY))
            raw = pod(name, f"n{i}", revision="old")
            raw["metadata"]["uid"] = c.next_uid()
            c.pods.put(f"{NS}.{name}", raw)
            c.slurm.put(f"{CLUSTER}.{name}", slurm_state(name, busy=busy[i]))
        # The template changed: every pod is outdated.
        c.nodesets.put(KEY, nodeset(replicas=replicas, max_unavailable=budget))
        assert all(n["metadata"]["annotations"][CLAIM_ANNOTATION] == KEY for n in c.nodes.values())

    def status(self) -> SlurmClusterStatus:
        return SlurmClusterStatus(
            cluster=CLUSTER,
            reachable=True,
            last_poll_at=self.now,
            last_success_at=self.now,
            poll_interval_seconds=10.0,
            # slurm-syncer writes a poll's node states before its status.
            nodes_revision=self.cluster.slurm.last_revision,
        )

    def live_pods(self) -> list[dict[str, Any]]:
        return [p for p in self.cluster.pods.values() if not p["metadata"].get("deletionTimestamp")]

    # --- the controller --------------------------------------------------------------------

    @rule()
    def decision_round(self) -> None:
        before = len(self.cluster.sink.sent)
        self.loop.run_until_complete(self.cluster.round(KEY, self.now))
        # Only pod commands matter to the budget (the rest -- status, slices, Events -- is
        # never delivered here).
        self.pending.extend(
            s for s in self.cluster.sink.sent[before:] if s.command.target.kind == "Pod"
        )

    # --- the API, late and out of order ------------------------------------------------------

    @precondition(lambda self: bool(self.pending))
    @rule(data=st.data())
    def deliver_a_command(self, data: st.DataObject) -> None:
        index = data.draw(st.integers(min_value=0, max_value=len(self.pending) - 1))
        sent = self.pending.pop(index)
        expires_at = sent.command.expires_at
        assert expires_at is not None
        if self.now > expires_at + LANDING_MARGIN_SECONDS:
            return  # too late: lost
        self.loop.run_until_complete(self.cluster.deliver(sent.command, self.now))

    @rule()
    def the_lead_changes_hands(self) -> None:
        """The leader stops (a helm upgrade) and another takes over at once: its ledger is
        rebuilt from the streams, the commands in flight still land later."""
        self.cluster.regain_lead(self.now)

    @rule(seconds=st.sampled_from([0.5, 3.0, 12.0, 25.0]))
    def time_passes(self, seconds: float) -> None:
        self.now += seconds
        # slurm-syncer keeps polling: the cluster stays fresh.
        self.cluster.clusters.put(CLUSTER, self.status())

    # --- Slurm and the pods ------------------------------------------------------------------

    @precondition(lambda self: bool(self.cluster.slurm))
    @rule(data=st.data(), change=st.sampled_from(["job-starts", "job-ends", "down"]))
    def slurm_changes(self, data: st.DataObject, change: str) -> None:
        key = data.draw(st.sampled_from(sorted(self.cluster.slurm)))
        old = self.cluster.slurm.get(key)
        assert old is not None
        self.cluster.slurm.put(
            key,
            slurm_state(
                old.name,
                busy=change == "job-starts",
                drain=old.drain,
                down=change == "down",
            ),
        )

    @rule()
    def syncer_drains_marked_pods(self) -> None:
        for raw in self.cluster.pods.values():
            key = f"{CLUSTER}.{raw['metadata']['name']}"
            state = self.cluster.slurm.get(key)
            if is_marked(raw) and state is not None and not state.drain:
                down = state.base_state == "Down"
                self.cluster.slurm.put(
                    key, slurm_state(state.name, busy=state.busy, drain=True, down=down)
                )

    @precondition(
        lambda self: any(p["metadata"].get("deletionTimestamp") for p in self.cluster.pods.values())
    )
    @rule()
    def a_terminating_pod_goes_away(self) -> None:
        for key, raw in self.cluster.pods.items():
            if raw["metadata"].get("deletionTimestamp"):
                self.cluster.pods.delete(key)
                self.cluster.slurm.delete(f"{CLUSTER}.{raw['metadata']['name']}")
                return

    @precondition(
        lambda self: any(p["status"]["conditions"][0]["status"] != "True" for p in self.live_pods())
    )
    @rule()
    def a_new_pod_turns_ready(self) -> None:
        for key, raw in self.cluster.pods.items():
            ready = raw["status"]["conditions"][0]
            if ready["status"] != "True" and not raw["metadata"].get("deletionTimestamp"):
                updated = {
                    **raw,
                    "metadata": {**raw["metadata"], "resourceVersion": self.cluster.next_rv()},
                    "status": {
                        "phase": "Running",
                        "conditions": [
                            {"type": "Ready", "status": "True"},
                            *raw["status"]["conditions"][1:],
                        ],
                    },
                }
                self.cluster.pods.put(key, updated)
                name = raw["metadata"]["name"]
                self.cluster.slurm.put(f"{CLUSTER}.{name}", slurm_state(name, busy=False))
                return

    @rule()
    def the_template_changes_to_one_no_node_can_take(self) -> None:
        """A second template change, to more CPU than any node has: the rollout must stop,
        not delete pods whose replacements could never run."""
        self.cluster.nodesets.put(
            KEY, nodeset(replicas=self.replicas, max_unavailable=self.budget, template_spec=TOO_BIG)
        )

    # --- the rule ----------------------------------------------------------------------------

    @invariant()
    def unavailable_never_exceeds_the_budget(self) -> None:
        if not self.replicas:
            return
        live = self.live_pods()
        unavailable = sum(
            1 for p in live if p["status"]["conditions"][0]["status"] != "True" or is_marked(p)
        )
        missing = max(0, self.replicas - len(live))
        assert unavailable + missing <= self.budget, [
            (p["metadata"]["name"], p["metadata"]["labels"][REVISION_LABEL], is_marked(p))
            for p in live
        ]

    @invariant()
    def only_pods_of_the_nodeset(self) -> None:
        assert all(
            p["metadata"]["labels"][NODESET_LABEL] == "gpu" for p in self.cluster.pods.values()
        )


RollingBudget.TestCase.settings = settings(
    max_examples=60,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestRuleRollingBudgetNeverExceededWithCommandsInFlight = RollingBudget.TestCase


def test_rule_rolling_update_finishes_when_every_command_lands() -> None:
    """The bound is not bought with a stall: delivering every command in order, with Slurm
    idle and pods turning ready, the rollout replaces every pod."""
    machine = RollingBudget()
    try:
        machine.start(replicas=3, budget=1, busy=[False] * 5)
        for _ in range(60):
            machine.decision_round()
            while machine.pending:
                sent = machine.pending.pop(0)
                machine.loop.run_until_complete(machine.cluster.deliver(sent.command, machine.now))
            machine.syncer_drains_marked_pods()
            while any(
                p["metadata"].get("deletionTimestamp") for p in machine.cluster.pods.values()
            ):
                machine.a_terminating_pod_goes_away()
            while any(
                p["status"]["conditions"][0]["status"] != "True" for p in machine.live_pods()
            ):
                machine.a_new_pod_turns_ready()
            machine.unavailable_never_exceeds_the_budget()
            machine.time_passes(0.5)
        revisions = {p["metadata"]["labels"][REVISION_LABEL] for p in machine.live_pods()}
        assert "old" not in revisions and len(machine.live_pods()) == 3
    finally:
        machine.teardown()


def test_rule_a_new_leader_counts_the_earlier_leaders_mark_against_the_budget() -> None:
    """maxUnavailable 1 across a handover: the leader marks one outdated idle pod, a job
    starts on it (so a fresh plan would pick another pod), and the lead changes hands before
    the mark lands. The new leader's rebuilt ledger holds the mark: it marks no second pod,
    and once both leaders' commands have landed at most one pod is unavailable."""
    machine = RollingBudget()
    try:
        machine.start(replicas=3, budget=1, busy=[False] * 5)
        machine.decision_round()
        # Besides the mark, the pods held by the budget get their wait condition (rule 8b).
        (mark,) = [s for s in machine.pending if sets_slurm_delete(s)]
        assert mark.command.target.kind == "Pod"
        first = mark.command.target.name
        machine.cluster.slurm.put(f"{CLUSTER}.{first}", slurm_state(first, busy=True))
        machine.time_passes(0.5)
        machine.the_lead_changes_hands()
        machine.decision_round()
        assert {s.command.target.name for s in machine.pending if sets_slurm_delete(s)} == {first}
        while machine.pending:
            sent = machine.pending.pop()
            machine.loop.run_until_complete(machine.cluster.deliver(sent.command, machine.now))
        machine.unavailable_never_exceeds_the_budget()
    finally:
        machine.loop.close()


def sets_slurm_delete(sent: Sent) -> bool:
    """Is `sent` a SlurmDelete mark (not another patch of the pod's status)?"""
    patch = getattr(sent.command.operation, "patch", None)
    conditions = patch.get("status", {}).get("conditions", []) if isinstance(patch, dict) else []
    return any(
        c.get("type") == SLURM_DELETE_CONDITION and c.get("status") == "True" for c in conditions
    )
