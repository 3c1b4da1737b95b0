"""Wiring of the Skyhook controller: KV views in, one round of `plan_round`, commands out.

It reads only KV (k8s_skyhooks, k8s_deploymentpolicies, k8s_nodes, k8s_jobs, k8s_pods,
k8s_nodemaintenances from k8s-watcher) and acts only through `cmd.k8s.v1.*` commands, as the
NodeMaintenance controller beside it. One replica is active (its own leader lease). A round
runs on every change of those views (debounced) and at least every `resync_seconds`.

What it keeps in memory is an optimisation, never a source of truth: which node patches and
Skyhook status writes it has just sent, so a round made before they show in KV does not act
on the old state (those nodes are left alone; the whole round waits for a status write), and
which commands it has sent. Every entry ends on the command's outcome, on the object
changing, or after `in_flight_timeout_seconds`; after a restart the same state yields the
same idempotency keys and deterministic Job names, so no stage gets a second Job.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import structlog
from nats.aio.msg import Msg

from maintenance_scheduler import SERVICE
from maintenance_scheduler.commands import SENDER
from maintenance_scheduler.config import MaintenanceSchedulerConfig
from maintenance_scheduler.skyhook import metrics
from maintenance_scheduler.skyhook.api import (
    NAME_LABEL,
    NODE_LABEL,
    DeploymentPolicy,
    Skyhook,
    parse_deployment_policy,
    parse_skyhook,
)
from maintenance_scheduler.skyhook.commands import KEY_PREFIX, commands_for, decision_for
from maintenance_scheduler.skyhook.observe import NodeViews, job_facts, maintenance_phase
from maintenance_scheduler.skyhook.plan import (
    ForgetNode,
    PatchNode,
    RoundPlan,
    SetSkyhookStatus,
    World,
    plan_round,
)
from maintenance_scheduler.skyhook.pod import pod_options
from maintenance_scheduler.skyhook.stages import JobFacts
from nodeflow_bus import Bus, KVView, LeaderLease, OutgoingMessage
from nodeflow_bus.leader_loop import LeaderLoop
from nodeflow_contracts import codec, subjects
from nodeflow_contracts.codec import ContractDecodeError
from nodeflow_contracts.k8s import CommandOutcome
from nodeflow_kube.fields import (
    mapping,
    meta,
)
from nodeflow_kube.projections import kept_metadata

log = structlog.get_logger("maintenance_scheduler.skyhook")

Obj = dict[str, Any]


def only_skyhook_pods(pod: Obj) -> Obj | None:
    """The pods this controller keeps in its view: those of its stage Jobs (labelled with
    their Skyhook), never the rest of the cluster's."""
    return pod if NAME_LABEL in mapping(meta(pod).get("labels")) else None


def node_metadata(node: Obj) -> Obj:
    """What this controller keeps of a node (its KVView projection): its metadata, all that
    `observe.node_view` reads (name, uid, version, labels, annotations, creation), without
    kubectl's last-applied copy. The status (images, conditions, system info) and spec of
    10,000 nodes were the largest part of this process's memory."""
    return {"metadata": kept_metadata(meta(node))}


APPLIED = frozenset({"applied", "already-applied", "retrying"})
LEASE_NAME = f"{SERVICE}-skyhook"


class SkyhookController:
    def __init__(self, bus: Bus, config: MaintenanceSchedulerConfig) -> None:
        self.bus = bus
        self.config = config
        self.namespace = config.skyhook_namespace
        self.skyhooks: KVView[Obj] = KVView(bus, "k8s_skyhooks", dict)
        self.policies: KVView[Obj] = KVView(bus, "k8s_deploymentpolicies", dict)
        self.nodes: KVView[Obj] = KVView(bus, "k8s_nodes", dict, project=node_metadata)
        self.jobs: KVView[Obj] = KVView(bus, "k8s_jobs", dict)
        self.pods: KVView[Obj] = KVView(bus, "k8s_pods", dict, project=only_skyhook_pods)
        self.requests: KVView[Obj] = KVView(bus, "k8s_nodemaintenances", dict)
        self.views: tuple[KVView[Any], ...] = (
            self.skyhooks,
            self.policies,
            self.nodes,
            self.jobs,
            self.pods,
            self.requests,
        )
        self.lease = LeaderLease(
            bus, LEASE_NAME, holder=config.instance_id or None, ttl=config.leader_lease_ttl_seconds
        )
        self._pods_of_job: dict[str, dict[str, Obj]] = {}  # Job name -> pod key -> pod
        self._node_sent: dict[str, tuple[str, float]] = {}  # node -> (resourceVersion, sent at)
        self._status_sent: dict[str, tuple[str, float]] = {}  # skyhook -> (rv, sent at)
        self._by_key: dict[str, tuple[str, str]] = {}  # command key -> ("node"|"status", name)
        self._sent: dict[str, float] = {}  # command key / decision id -> sent at
        self._parsed: dict[str, tuple[str, Skyhook]] = {}
        self._node_views = NodeViews()
        self._wake = asyncio.Event()
        self._leader_loop = LeaderLoop(
            bus,
            self.lease,
            self.views,
            outcomes_subject=subjects.K8S_OUTCOMES,
            on_outcome=self._on_outcome,
            on_leadership=self._on_leadership,
            loop=self._run,
            name="skyhook controller loop",
        )
        self.rounds = 0
        self.last_plan: RoundPlan | None = None

    # --- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        self.pods.add_listener(self._on_pod)
        for view in self.views:
            if view is not self.pods:
                view.add_listener(self._on_change)
        await self._leader_loop.start()

    async def stop(self, grace: float = 5.0) -> None:
        await self._leader_loop.stop()

    def not_ready_reason(self) -> str | None:
        return None if all(v.ready.is_set() for v in self.views) else "Skyhook KV views loading"

    # --- listeners ---------------------------------------------------------------------------

    def _on_change(self, key: str, old: Any, new: Any) -> None:
        self._wake.set()

    def _on_pod(self, key: str, old: Obj | None, new: Obj | None) -> None:
        # Only pods of stage Jobs are in the view (only_skyhook_pods).
        for pod, adding in ((old, False), (new, True)):
            if pod is None:
                continue
            job = str(mapping(meta(pod).get("labels")).get("batch.kubernetes.io/job-name") or "")
            if adding:
                self._pods_of_job.setdefault(job, {})[key] = pod
            else:
                on_job = self._pods_of_job.get(job, {})
                on_job.pop(key, None)
                if not on_job:
                    self._pods_of_job.pop(job, None)
        self._wake.set()

    def _on_leadership(self, leader: bool) -> None:
        self._node_sent.clear()
        self._status_sent.clear()
        self._by_key.clear()
        self._sent.clear()
        self._wake.set()

    async def _on_outcome(self, msg: Msg) -> None:
        try:
            outcome = codec.decode(CommandOutcome, msg.data, subject=msg.subject)
        except ContractDecodeError:
            return
        if outcome.sender != SENDER or not outcome.idempotency_key.startswith(KEY_PREFIX):
            return
        if outcome.outcome in APPLIED:
            tracked = self._by_key.get(outcome.idempotency_key)
            if tracked is not None and outcome.outcome != "retrying":
                what, name = tracked
                held = self._node_sent if what == "node" else self._status_sent
                sent = held.get(name)
                # A write that changed nothing leaves the resourceVersion as it was: KV will
                # show no change to wait for.
                if sent is not None and outcome.resource_version == sent[0]:
                    held.pop(name, None)
                    self._wake.set()
            return
        # Not applied: the same state may decide it again; what it held is released.
        self._sent.pop(outcome.idempotency_key, None)
        tracked = self._by_key.pop(outcome.idempotency_key, None)
        if tracked is not None:
            what, name = tracked
            (self._node_sent if what == "node" else self._status_sent).pop(name, None)
        report = log.info if outcome.outcome == "conflict" else log.warning
        report(
            "skyhook.command.refused",
            key=outcome.idempotency_key,
            op=outcome.op,
            target=outcome.target.ordering_key,
            outcome=outcome.outcome,
            message=outcome.message,
        )
        self._wake.set()

    # --- the loop ----------------------------------------------------------------------------

    async def _run(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.config.resync_seconds)
            self._wake.clear()
            if not self.lease.is_leader or self.not_ready_reason() is not None:
                if not self.lease.is_leader:
                    await asyncio.sleep(0.2)
                continue
            if self.config.debounce_seconds:
                await asyncio.sleep(self.config.debounce_seconds)
            self._wake.clear()
            try:
                await self.round(time.time())
            except Exception:
                # One bad round (a publish timeout) must not end the loop; the next retries.
                log.exception("skyhook.round.failed")
                await asyncio.sleep(1.0)

    def _parse_skyhooks(self) -> list[Skyhook]:
        parsed: list[Skyhook] = []
        seen: dict[str, tuple[str, Skyhook]] = {}
        for key, obj in self.skyhooks.items():
            rv = str(meta(obj).get("resourceVersion") or "")
            cached = self._parsed.get(key)
            skyhook = cached[1] if cached is not None and cached[0] == rv else parse_skyhook(obj)
            seen[key] = (rv, skyhook)
            parsed.append(skyhook)
        self._parsed = seen
        return parsed

    def world(self, now: float) -> World | None:
        """The state to decide on; None while a Skyhook status write is not yet visible."""
        horizon = self.config.in_flight_timeout_seconds
        skyhooks = self._parse_skyhooks()
        for skyhook in skyhooks:
            sent = self._status_sent.get(skyhook.name)
            if sent is None:
                continue
            if sent[0] == skyhook.resource_version and now - sent[1] < horizon:
                return None
            self._status_sent.pop(skyhook.name, None)
        policies: dict[str, DeploymentPolicy] = {}
        for obj in self.policies.as_dict().values():
            policy = parse_deployment_policy(obj)
            policies[policy.name] = policy
        nodes = self._node_views.read(self.nodes.as_dict())
        settling: set[str] = set()
        for node in nodes:
            sent = self._node_sent.get(node.name)
            if sent is None:
                continue
            if sent[0] == node.resource_version and now - sent[1] < horizon:
                settling.add(node.name)
            else:
                self._node_sent.pop(node.name, None)
        jobs: dict[str, JobFacts] = {}
        for obj in self.jobs.as_dict().values():
            metadata = meta(obj)
            if metadata.get("namespace") != self.namespace:
                continue
            if NAME_LABEL not in mapping(metadata.get("labels")):
                continue
            name = str(metadata.get("name") or "")
            pods = list(self._pods_of_job.get(name, {}).values())
            jobs[name] = job_facts(obj, pods)
        phases: dict[str, str] = {}
        uids: dict[str, str] = {}
        owners: dict[str, tuple[str, str]] = {}
        for obj in self.requests.as_dict().values():
            metadata = meta(obj)
            if metadata.get("namespace") != self.namespace:
                continue
            if NAME_LABEL not in mapping(metadata.get("labels")):
                continue
            name = str(metadata.get("name") or "")
            labels = mapping(metadata.get("labels"))
            phases[name] = maintenance_phase(obj)
            uids[name] = str(metadata.get("uid") or "")
            owners[name] = (str(labels.get(NAME_LABEL)), str(labels.get(NODE_LABEL) or ""))
        return World(
            skyhooks=skyhooks,
            policies=policies,
            nodes=nodes,
            jobs=jobs,
            maintenances=phases,
            maintenance_uids=uids,
            maintenance_owners=owners,
            settling=frozenset(settling),
        )

    async def round(self, now: float) -> None:
        world = self.world(now)
        if world is None:
            return
        self.rounds += 1
        plan = plan_round(
            world, now=now, pull_grace_seconds=self.config.skyhook_image_pull_grace_seconds
        )
        self.last_plan = plan
        horizon = now - self.config.in_flight_timeout_seconds
        for key in [k for k, at in self._sent.items() if at < horizon]:
            self._sent.pop(key, None)
        messages: list[OutgoingMessage] = []
        commands = [
            (action, command)
            for action in plan.actions
            for command in commands_for(
                action,
                now,
                namespace=self.namespace,
                default_stage_timeout_seconds=self.config.skyhook_stage_timeout_seconds,
                drain_timeout_seconds=self.config.skyhook_drain_timeout_seconds,
                options=pod_options(self.config),
            )
        ]
        for action, command in commands:
            if command.idempotency_key in self._sent:
                continue
            self._sent[command.idempotency_key] = now
            if isinstance(action, PatchNode | ForgetNode):
                self._node_sent[action.node.name] = (action.node.resource_version, now)
                self._by_key[command.idempotency_key] = ("node", action.node.name)
            elif isinstance(action, SetSkyhookStatus):
                rv = action.skyhook.resource_version
                self._status_sent[action.skyhook.name] = (rv, now)
                self._by_key[command.idempotency_key] = ("status", action.skyhook.name)
            messages.append(
                OutgoingMessage(
                    subject=command.subject, message=command, msg_id=command.idempotency_key
                )
            )
        versions = {s.name: s.resource_version for s in world.skyhooks}
        node_versions = {n.name: n.resource_version for n in world.nodes}
        for note in plan.decisions:
            basis = f"{versions.get(note.skyhook, '')}:{node_versions.get(note.node, '')}"
            decision = decision_for(note, now, basis)
            if decision.decision_id in self._sent:
                continue
            self._sent[decision.decision_id] = now
            log.info(
                "skyhook.decision",
                skyhook=note.skyhook,
                kind=note.kind,
                reason=decision.reason,
                node=note.node,
                package=note.package,
                stage=note.stage,
                message=note.message,
            )
            messages.append(
                OutgoingMessage(
                    subject=decision.subject, message=decision, msg_id=decision.decision_id
                )
            )
        metrics.report(plan.rounds, {s.name: s.deployment_policy for s in world.skyhooks})
        if messages:
            await self.bus.publish_batch(messages, max_in_flight=self.config.publish_window)
