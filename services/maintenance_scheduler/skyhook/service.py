"""Wiring of the Skyhook controller: KV views in, one round of `plan_round`, commands out.

It reads only KV (k8s_skyhooks and k8s_nodewrights: both kinds, one controller;
k8s_deploymentpolicies and k8s_nodewrightdeploymentpolicies, each group's policies; k8s_nodes,
k8s_jobs, k8s_pods, k8s_nodemaintenances, k8s_configmaps from k8s-watcher) and acts only through
`cmd.k8s.v1.*` commands, as the NodeMaintenance controller beside it. One replica is active
(its own leader lease). A round runs on every change of those views (debounced) and at least
every `resync_seconds`.

Every command goes through the command ledger (`nodeflow_bus.ledger`, slots in
`skyhook/inflight.py`): a Skyhook status write or node-state patch holds its Skyhook, so no
round is planned on a view that lacks it (no second, racing write of a node's state; a node
it starts counts against the interruption budget), and a node-state patch also holds its
node, which every round leaves alone; any other command holds itself, so it is not sent
again. A slot is free once the command's outcome says it never lands, or it applied and KV
shows its effect, or its deadline plus the landing margin has passed. A new leader rebuilds
the ledger from the streams before its first round, so it waits for what an earlier leader
sent that may still land; after a restart the same state yields the same idempotency keys and
deterministic Job names, so no stage gets a second Job.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import structlog

from maintenance_scheduler import SERVICE
from maintenance_scheduler.commands import COMMAND_LIFETIME_SECONDS, SENDER
from maintenance_scheduler.config import MaintenanceSchedulerConfig
from maintenance_scheduler.skyhook import metrics
from maintenance_scheduler.skyhook.api import (
    DeploymentPolicy,
    Skyhook,
    owner_key,
    parse_deployment_policy,
    parse_skyhook,
    reconciled,
)
from maintenance_scheduler.skyhook.commands import commands_for, decision_for
from maintenance_scheduler.skyhook.configmaps import ConfigMapFacts
from maintenance_scheduler.skyhook.inflight import settling_nodes, slots_of, waiting_skyhooks
from maintenance_scheduler.skyhook.observe import (
    NodeViews,
    job_facts,
    maintenance_phase,
    skyhook_conditions,
)
from maintenance_scheduler.skyhook.plan import (
    RoundPlan,
    World,
    plan_round,
)
from maintenance_scheduler.skyhook.pod import pod_options
from maintenance_scheduler.skyhook.stages import JobFacts
from nodeflow_bus import Bus, KVView, LeaderLease, OutgoingMessage
from nodeflow_bus.leader_loop import LeaderLoop, run_round
from nodeflow_bus.ledger import LedgerSender, Sending, log_refused
from nodeflow_contracts import subjects
from nodeflow_contracts.k8s import CommandOutcome
from nodeflow_contracts.ledger import LedgerEntry
from nodeflow_contracts.skyhook import (
    NODEWRIGHT,
    NODEWRIGHT_POLICY_MIRROR,
    POLICY_KIND,
    SKYHOOK,
    owner_in,
)
from nodeflow_kube.fields import (
    mapping,
    meta,
    resource_version_of,
    resource_version_reached,
)
from nodeflow_kube.projections import kept_metadata

log = structlog.get_logger("maintenance_scheduler.skyhook")

Obj = dict[str, Any]


def only_skyhook_pods(pod: Obj) -> Obj | None:
    """The pods this controller keeps in its view: those of its stage Jobs (labelled with
    their Skyhook), never the rest of the cluster's."""
    return pod if owner_in(mapping(meta(pod).get("labels"))) is not None else None


def node_metadata(node: Obj) -> Obj:
    """What this controller keeps of a node (its KVView projection): all that
    `observe.node_view` reads -- its metadata (name, uid, version, labels, annotations,
    creation; without kubectl's last-applied copy), its taints, whether it is cordoned and
    the Skyhooks' own node conditions. The rest of the status (images, the kubelet's
    conditions, system info) and of the spec of 10,000 nodes were the largest part of this
    process's memory."""
    kept: Obj = {"metadata": kept_metadata(meta(node))}
    spec = mapping(node.get("spec"))
    kept_spec = {key: spec[key] for key in ("taints", "unschedulable") if spec.get(key)}
    if kept_spec:
        kept["spec"] = kept_spec
    conditions = skyhook_conditions(node)
    if conditions:
        kept["status"] = {"conditions": list(conditions.values())}
    return kept


def config_map_metadata(config_map: Obj) -> Obj:
    """What this controller keeps of its ConfigMaps: their metadata (not their data)."""
    return {"metadata": kept_metadata(meta(config_map))}


APPLIED = frozenset({"applied", "already-applied"})
LEASE_NAME = f"{SERVICE}-skyhook"


class SkyhookController:
    def __init__(self, bus: Bus, config: MaintenanceSchedulerConfig) -> None:
        self.bus = bus
        self.config = config
        self.namespace = config.skyhook_namespace
        self.skyhooks: KVView[Obj] = KVView(bus, subjects.k8s_bucket(SKYHOOK.kind), dict)
        self.nodewrights: KVView[Obj] = KVView(bus, subjects.k8s_bucket(NODEWRIGHT.kind), dict)
        self.policies: KVView[Obj] = KVView(bus, subjects.k8s_bucket(POLICY_KIND), dict)
        self.nodewright_policies: KVView[Obj] = KVView(
            bus, subjects.k8s_bucket(NODEWRIGHT_POLICY_MIRROR), dict
        )
        self.nodes: KVView[Obj] = KVView(bus, "k8s_nodes", dict, project=node_metadata)
        self.jobs: KVView[Obj] = KVView(bus, "k8s_jobs", dict)
        self.pods: KVView[Obj] = KVView(bus, "k8s_pods", dict, project=only_skyhook_pods)
        self.requests: KVView[Obj] = KVView(bus, "k8s_nodemaintenances", dict)
        # Only the ConfigMaps this controller wrote (k8s-watcher's label selector).
        self.config_maps: KVView[Obj] = KVView(
            bus, subjects.k8s_bucket("ConfigMap"), dict, project=config_map_metadata
        )
        self.views: tuple[KVView[Any], ...] = (
            self.skyhooks,
            self.nodewrights,
            self.policies,
            self.nodewright_policies,
            self.nodes,
            self.jobs,
            self.pods,
            self.requests,
            self.config_maps,
        )
        self.lease = LeaderLease(
            bus, LEASE_NAME, holder=config.instance_id or None, ttl=config.leader_lease_ttl_seconds
        )
        self._pods_of_job: dict[str, dict[str, Obj]] = {}  # Job name -> pod key -> pod
        # Its own ledger beside the NodeMaintenance scheduler's (same sender, own records).
        self.ledger = LedgerSender(
            bus,
            ledger=LEASE_NAME,
            sender=SENDER,
            max_lifetime=COMMAND_LIFETIME_SECONDS,
            on_outcome=self._on_outcome,
            leading=lambda: self.lease.is_leader,
        )
        # Decision id -> published at: a decision is not published again within
        # `in_flight_timeout_seconds` (commands are the ledger's).
        self._published: dict[str, float] = {}
        self._parsed: dict[str, tuple[str, Skyhook]] = {}
        self._node_views = NodeViews()
        self._wake = asyncio.Event()
        self.ledger.on_ready = self._wake.set
        # (apiVersion, kind) -> the view that shows what an applied command did to an object.
        self._view_of: dict[tuple[str, str], KVView[Obj]] = {
            ("v1", "Node"): self.nodes,
            (SKYHOOK.api_version, SKYHOOK.kind): self.skyhooks,
            (NODEWRIGHT.api_version, NODEWRIGHT.kind): self.nodewrights,
            (SKYHOOK.api_version, POLICY_KIND): self.policies,
            (NODEWRIGHT.api_version, POLICY_KIND): self.nodewright_policies,
            ("batch/v1", "Job"): self.jobs,
            ("maintenance.nvidia.com/v1alpha1", "NodeMaintenance"): self.requests,
            ("v1", "ConfigMap"): self.config_maps,
        }
        self._leader_loop = LeaderLoop(
            bus,
            self.lease,
            self.views,
            outcomes_subject=subjects.K8S_OUTCOMES,
            on_outcome=self.ledger.handle_outcome,
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

    async def watch(self) -> None:
        """Raises once the decision loop ended without `stop()` (the process then exits)."""
        await self._leader_loop.watch()

    async def stop(self, grace: float = 5.0) -> None:
        await self._leader_loop.stop()
        await self.ledger.stop()

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
        # The ledger is rebuilt from the streams before this replica plans as leader: it then
        # holds whatever an earlier leader sent that may still land.
        self.ledger.on_leadership(leader)
        self._published.clear()
        self._wake.set()

    def _on_outcome(self, outcome: CommandOutcome, entry: LedgerEntry | None) -> None:
        """An outcome of this controller's, decoded and already settled in the ledger (the
        NodeMaintenance scheduler's, of the same sender, have no entry here)."""
        if entry is None or outcome.outcome == "retrying":
            return
        if outcome.outcome not in APPLIED:
            # Not applied: the same state may decide it again.
            log_refused(outcome)
        self._wake.set()

    def _effect_seen(self, entry: LedgerEntry, rv: str | None) -> bool:
        """Does KV show what an applied command did (so what it held is free again)?"""
        view = self._view_of.get((entry.target.api_version, entry.target.kind))
        if view is None or not rv:
            return True
        current = view.get(subjects.object_key(entry.target.namespace, entry.target.name))
        if current is None:
            return True  # deleted: nothing of it is left to see
        # A write that changed nothing leaves the resourceVersion as it was: reached too.
        return resource_version_reached(resource_version_of(current), rv)

    # --- the loop ----------------------------------------------------------------------------

    async def _run(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.config.resync_seconds)
            self._wake.clear()
            if (
                not self.lease.is_leader
                or self.not_ready_reason() is not None
                or not self.ledger.ready
            ):
                # A leader whose ledger is not rebuilt yet plans nothing: it may not know an
                # earlier leader's commands (the ledger wakes the loop once rebuilt).
                if not self.lease.is_leader:
                    await asyncio.sleep(0.2)
                continue
            if self.config.debounce_seconds:
                await asyncio.sleep(self.config.debounce_seconds)
            self._wake.clear()
            # One bad round (a publish timeout) must not end the loop; the next retries.
            await run_round(lambda: self.round(time.time()), event="skyhook.round.failed")

    def _parse_skyhooks(self) -> list[Skyhook]:
        """The Skyhooks and NodeWrights, one object per name (`reconciled`)."""
        parsed: list[Skyhook] = []
        seen: dict[str, tuple[str, Skyhook]] = {}
        for view, names in ((self.skyhooks, SKYHOOK), (self.nodewrights, NODEWRIGHT)):
            for key, obj in view.items():
                rv = str(meta(obj).get("resourceVersion") or "")
                cache_key = f"{names.kind}/{key}"
                cached = self._parsed.get(cache_key)
                fresh = cached is None or cached[0] != rv
                skyhook = parse_skyhook(obj) if fresh or cached is None else cached[1]
                seen[cache_key] = (rv, skyhook)
                parsed.append(skyhook)
        self._parsed = seen
        return reconciled(parsed)

    def world(self, now: float) -> World | None:
        """The state to decide on; None while a Skyhook status write or node-state patch may
        still land (see the module docstring)."""
        ledger = self.ledger.ledger
        ledger.release_seen(lambda entry, _, rv: self._effect_seen(entry, rv))
        ledger.expire(now)
        held = ledger.held(now)
        if waiting_skyhooks(held):
            return None
        skyhooks = self._parse_skyhooks()
        policies: dict[str, DeploymentPolicy] = {}
        nodewright_policies: dict[str, DeploymentPolicy] = {}
        for view, found in (
            (self.policies, policies),
            (self.nodewright_policies, nodewright_policies),
        ):
            for obj in view.as_dict().values():
                policy = parse_deployment_policy(obj)
                found[policy.name] = policy
        nodes = self._node_views.read(self.nodes.as_dict())
        jobs: dict[str, JobFacts] = {}
        for obj in self.jobs.as_dict().values():
            metadata = meta(obj)
            if metadata.get("namespace") != self.namespace:
                continue
            if owner_in(mapping(metadata.get("labels"))) is None:
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
            labels = mapping(metadata.get("labels"))
            owner = owner_in(labels)
            if owner is None:
                continue
            name = str(metadata.get("name") or "")
            phases[name] = maintenance_phase(obj)
            uids[name] = str(metadata.get("uid") or "")
            node = str(labels.get(owner[0].node_label) or "")
            owners[name] = (owner_key(owner[1], owner[0]), node)
        config_maps: dict[str, ConfigMapFacts] = {}
        for obj in self.config_maps.as_dict().values():
            metadata = meta(obj)
            if metadata.get("namespace") != self.namespace:
                continue
            name = str(metadata.get("name") or "")
            config_maps[name] = ConfigMapFacts(
                name=name,
                uid=str(metadata.get("uid") or ""),
                labels=mapping(metadata.get("labels")),
                annotations=mapping(metadata.get("annotations")),
            )
        return World(
            skyhooks=skyhooks,
            policies=policies,
            nodewright_policies=nodewright_policies,
            nodes=nodes,
            jobs=jobs,
            maintenances=phases,
            maintenance_uids=uids,
            maintenance_owners=owners,
            settling=settling_nodes(held),
            runtime_required_toleration=pod_options(self.config).runtime_required_toleration(),
            nodewright_runtime_required_toleration=pod_options(
                self.config
            ).runtime_required_toleration(NODEWRIGHT),
            config_maps=config_maps,
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
        for key in [k for k, at in self._published.items() if at < horizon]:
            self._published.pop(key, None)
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
        # A round runs only when no Skyhook or node slot is held (`world`); what the ledger
        # still holds is a command of its own, not sent again.
        held = self.ledger.ledger.held(now)
        sendings: list[Sending] = []
        for action, command in commands:
            slots = slots_of(action, command)
            if not any(slot in held for slot in slots):
                sendings.append(Sending(command, slots))
        versions = {s.name: s.resource_version for s in world.skyhooks}
        node_versions = {n.name: n.resource_version for n in world.nodes}
        for note in plan.decisions:
            basis = f"{versions.get(note.skyhook, '')}:{node_versions.get(note.node, '')}"
            decision = decision_for(note, now, basis)
            if decision.decision_id in self._published:
                continue
            self._published[decision.decision_id] = now
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
        metrics.report(plan.rounds)
        if sendings or messages:
            await self.ledger.send(sendings, messages, publish_window=self.config.publish_window)
