"""The whole placement pass as one pure function: cluster state in, actions out.

`plan(state)` reads nodes, pods, PodGroups, the ClusterNetworkTopology, the
PodDisruptionBudgets and the PersistentVolumeClaims and PersistentVolumes, and returns what
should change. It remembers nothing between calls:
the reservations are the pods' `status.nominatedNodeName` and a gang's "satisfied once" is
its PodGroup's phase (status.py), both kept in Kubernetes, so a restarted placer sees every
reservation the killed one made and never books a node twice.

Each GangGroup (PodGroups tied by the `groups` annotation; a pod of ours without a PodGroup
is a gang of one) goes through named phases, highest priority first:

1. read (`_read_phase`): every PodGroup parses, every PodGroup of the group exists, every
   rank parses, no member asks what the placer does not check (generic ephemeral volumes, DRA
   claims: it is refused naming the field, interpod.unsupported_reason), every claim a member
   names is bound and usable by it, or unbound of a WaitForFirstConsumer class that
   provisions (else refused naming the claim; a bound volume's node affinity and zone, a
   delayed claim's allowed topologies then filter the member's nodes: volumes.py); a
   PreferGather layer the topology lacks is dropped with a Warning Event;
2. members (`_members_phase`): each PodGroup has minMember pods counted by its match policy,
   or is satisfied (reached minMember once under once-satisfied, has minMember bound under
   waiting-and-running, or has minMember 0);
3. a satisfied gang regrows (`_regrow_phase`): its pending pods need no gang check, each is
   bound or nominated on its own as room appears; it never times out nor is evicted;
   otherwise, bind (`_bind_if_reserved`): every pending member is nominated and the
   nominated nodes still take them: bind all, once every WaitForFirstConsumer claim of theirs
   names its pod's node (`SelectNode` first, as VolumeBinding's PreBind);
4. gather (`_gather_phase`): place every pending member at once (or, failing that, just
   enough to reach each minMember) and nominate them, each member with its own request and
   filters (`_GangFit`), the inter-pod filters (hostPorts, required pod (anti-)affinity,
   DoNotSchedule spread: interpod.GangCheck) included; a partly bound gang with gather rules
   stays in the domain of its bound members;
5. preempt (`_preempt`): when nothing fits, job-level preemption (preemption module), its
   dry run again fitting each member with its own request and filters;
6. unschedulable (`_unschedulable`): PodScheduled=False with the reason in numbers; a Strict
   gang gives its nominations back. Past its waiting time the gang is reported GangTimeout,
   every mode drops its nominations, a Strict group that never reached minMember in all its
   PodGroups has its bound members evicted (GangIncomplete; a Running one only when a
   PodGroup's status proves it), and its cycle restarts.

PodGroup status and the ClusterNetworkTopology's detailStatus are derived each pass.
"""

from __future__ import annotations

import json
import operator
from collections.abc import Callable, Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Literal, NamedTuple

from nodeflow_contracts.placement import PlacementDecisionKind
from nodeflow_kube import fields
from topology_placer import pods as podfacts
from topology_placer.fit import (
    Milli,
    NodeCapacity,
    NodeFacts,
    add_milli,
    facts_of_nodes,
    filter_reason,
    largest_request,
    pod_request_shared,
    slots_in,
)
from topology_placer.gang import (
    NETWORK_TOPOLOGY_SELECTOR,
    GangSpecError,
    GatherRule,
    GroupKey,
    PodGroupSpec,
    RankKey,
    annotation_gang_object,
    is_annotation_gang_member,
    parse_pod_group,
    pod_group_of,
    rank_key,
    topology_index,
)
from topology_placer.gather import NoFit, Placement, PodShape, gather, gather_mixed
from topology_placer.inflight import InFlight
from topology_placer.interpod import (
    HOSTNAME_LABEL,
    Charged,
    GangCheck,
    LabelIndex,
    PodConstraints,
    constraints_of,
    unsupported_reason,
)
from topology_placer.memo import FactsByVersion
from topology_placer.network import (
    DEFAULT_TOPOLOGY_NAME,
    NODE_LAYER,
    DomainPath,
    TopologySpec,
    TopologySpecError,
    TopologyTree,
    build_tree_from_paths,
    detail_status,
    node_path,
    parse_topology,
)
from topology_placer.pods import PodRef, ref_of
from topology_placer.preemption import (
    PREEMPTION_REASON,
    ChargedPod,
    Ineligible,
    NotHelpful,
    eligibility,
    plan_preemption,
    preemption_message,
)
from topology_placer.status import pod_group_status, status_differs
from topology_placer.volumes import (
    SELECTED_NODE_ANNOTATION,
    VolumeIndex,
    VolumeNeeds,
    claim_names,
)

Obj = Mapping[str, Any]

UNSCHEDULABLE = "Unschedulable"
GANG_TIMEOUT = "GangTimeout"
GATHER_LAYER_IGNORED = "GatherLayerIgnored"
SATISFIED_PHASES = frozenset({"Scheduled", "Running", "Finished"})
# The PodGroup phases (status module) of a group that never had minMember bound: only these
# prove a gang incomplete, which alone lets a timeout evict its Running members.
NEVER_SATISFIED_PHASES = frozenset({"Pending", "PreScheduling", "Scheduling"})

GangState = Literal[
    "bound",
    "binding",
    "nominated",
    "waiting",
    "unschedulable",
    "preempting",
    "invalid",
    "in-flight",
]


# --- actions -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Nominate:
    """Set (or with node "" clear) the pod's status.nominatedNodeName: the reservation."""

    pod: PodRef
    node: str


@dataclass(frozen=True)
class Bind:
    pod: PodRef
    node: str


@dataclass(frozen=True)
class SelectNode:
    """Annotate a WaitForFirstConsumer claim with the node its pod is bound to
    (`volume.kubernetes.io/selected-node`), so its provisioner makes the volume there; sent
    before the pod's bind, which waits until the claim shows it (VolumeBinding's PreBind)."""

    namespace: str
    claim: str
    uid: str
    resource_version: str
    node: str


@dataclass(frozen=True)
class MarkUnschedulable:
    """Patch the pod's PodScheduled condition to False with this reason and message."""

    pod: PodRef
    reason: str
    message: str
    at: str


@dataclass(frozen=True)
class Disrupt:
    """Mark the pod DisruptionTarget (reason PreemptionByScheduler or GangIncomplete), then
    delete it, as kube-scheduler deletes its victims: the eviction API would rewrite the
    reason to EvictionByEvictionAPI and could be refused by a budget for ever, while the
    plan has already weighed the PodDisruptionBudgets."""

    pod: PodRef
    reason: str
    message: str
    at: str


@dataclass(frozen=True)
class UpdateGroupStatus:
    group: GroupKey
    uid: str
    status: dict[str, Any]


@dataclass(frozen=True)
class UpdateTopologyStatus:
    name: str
    uid: str
    detail_status: list[dict[str, Any]]


@dataclass(frozen=True)
class Notice:
    """A Kubernetes Event on a pod or PodGroup."""

    kind: Literal["Pod", "PodGroup"]
    namespace: str
    name: str
    uid: str
    reason: str
    message: str
    warning: bool


@dataclass(frozen=True)
class Decision:
    gang_group: tuple[GroupKey, ...]
    kind: PlacementDecisionKind
    reason: str
    message: str
    domain: str = ""
    layer: str = ""
    assignments: tuple[tuple[str, str], ...] = ()
    victims: tuple[str, ...] = ()


Action = (
    Nominate
    | Bind
    | SelectNode
    | MarkUnschedulable
    | Disrupt
    | UpdateGroupStatus
    | UpdateTopologyStatus
    | Notice
    | Decision
)


# --- state -------------------------------------------------------------------------------


@dataclass(frozen=True)
class ClusterState:
    nodes: Sequence[Obj]
    pods: Sequence[Obj]
    pod_groups: Sequence[Obj]
    topologies: Sequence[Obj]
    budgets: Sequence[Obj]
    now: float
    scheduler_names: frozenset[str]
    # The placer's commands that may still land (its command ledger, inflight.py).
    in_flight: InFlight = field(default_factory=InFlight)
    # PersistentVolumeClaims, PersistentVolumes and StorageClasses: the volume topology of
    # pods naming a claim (volumes.py); read only in a pass with such a pod.
    claims: Sequence[Obj] = ()
    volumes: Sequence[Obj] = ()
    storage_classes: Sequence[Obj] = ()
    # The Workload API's PodGroups (scheduling.k8s.io): their disruptionMode (preemption.py).
    workload_pod_groups: Sequence[Obj] = ()


@dataclass
class Plan:
    actions: list[Action] = field(default_factory=list)
    # GangGroup ("ns/a,ns/b") -> state this pass, for the gangs-by-state gauge.
    gang_states: dict[str, GangState] = field(default_factory=dict)
    # Placement attempts this pass by result (placed, unschedulable, preempted, ...).
    attempts: list[str] = field(default_factory=list)
    domains_by_layer: dict[str, int] = field(default_factory=dict)


@dataclass
class Gang:
    """One GangGroup as this pass sees it."""

    keys: tuple[GroupKey, ...]
    specs: dict[GroupKey, PodGroupSpec] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    members: dict[GroupKey, list[Obj]] = field(default_factory=dict)
    # uid of each PodGroup object that exists (Events go to the first).
    uids: dict[GroupKey, str] = field(default_factory=dict)
    # PreferGather layers the ClusterNetworkTopology does not have: dropped (phase 1).
    ignored_layers: tuple[str, ...] = ()
    # A pending member has hostPorts, required pod (anti-)affinity or a DoNotSchedule
    # spread (phase 1): the inter-pod filters apply to the gang.
    constrained: bool = False
    # What each pending member's bound PersistentVolumeClaims ask, by pod name (phase 1):
    # only members naming a claim are here.
    volume_needs: dict[str, VolumeNeeds] = field(default_factory=dict)

    @property
    def id(self) -> str:
        return ",".join(str(k) for k in self.keys)

    # Members, pending and bound are read many times a pass, only once `members` is whole.
    @cached_property
    def all_members(self) -> list[Obj]:
        return [pod for key in self.keys for pod in self.members.get(key, [])]

    @cached_property
    def pending(self) -> list[Obj]:
        return [pod for pod in self.all_members if pod_facts(pod).pending]

    @cached_property
    def bound(self) -> list[Obj]:
        return [pod for pod in self.all_members if pod_facts(pod).occupies]

    @property
    def rules(self) -> tuple[GatherRule, ...]:
        # The PodGroups of one GangGroup normally carry the same spec; the union honours all.
        seen: dict[tuple[str, str, int], GatherRule] = {}
        for spec in self.specs.values():
            for rule in spec.gather:
                if rule.strategy == "PreferGather" and rule.layer in self.ignored_layers:
                    continue
                seen.setdefault((rule.layer, rule.strategy, rule.pod_count_multiple), rule)
        return tuple(seen.values())

    @property
    def strict(self) -> bool:
        return all(spec.mode == "Strict" for spec in self.specs.values())

    @property
    def priority(self) -> int:
        pending = self.pending
        return min((pod_facts(p).priority for p in pending), default=0)


# --- helpers ------------------------------------------------------------------------------


def _union_groups(specs: Mapping[GroupKey, PodGroupSpec]) -> list[tuple[GroupKey, ...]]:
    parent: dict[GroupKey, GroupKey] = {}

    def find(key: GroupKey) -> GroupKey:
        while parent.setdefault(key, key) != key:
            key = parent[key]
        return key

    for key, spec in specs.items():
        for other in spec.gang_group:
            parent[find(other)] = find(key)
    groups: dict[GroupKey, list[GroupKey]] = {}
    for key in parent:
        groups.setdefault(find(key), []).append(key)
    return sorted(tuple(sorted(keys, key=str)) for keys in groups.values())


_NO_FILTER_FIELDS = json.dumps(
    {k: None for k in ("tolerations", "affinity", "nodeSelector")}, sort_keys=True
)


def _spec_signature(pod: Obj) -> str:
    spec = podfacts.spec(pod)
    if not ("tolerations" in spec or "affinity" in spec or "nodeSelector" in spec):
        return _NO_FILTER_FIELDS
    relevant = {k: spec.get(k) for k in ("tolerations", "affinity", "nodeSelector")}
    return json.dumps(relevant, sort_keys=True, default=str)


def _lowest_common_domain(tree: TopologyTree, nodes: Sequence[str]) -> DomainPath | None:
    paths = [tree.leaves[n].path[:-1] for n in nodes if n in tree.leaves]
    if not paths:
        return None
    common: list[str] = []
    for parts in zip(*paths, strict=False):
        if len(set(parts)) != 1:
            break
        common.append(parts[0])
    return tuple(common)


def _condition_differs(pod: Obj, reason: str, message: str) -> bool:
    current = fields.condition(pod, podfacts.POD_SCHEDULED)
    return (
        current is None
        or current.get("status") != "False"
        or current.get("reason") != reason
        or current.get("message") != message
    )


class PodFacts(NamedTuple):
    """What one version of a pod tells every pass, read once: its key, its gang, its
    scheduler, its state (finished, pending, on a node), what it charges its node, its
    request, priority, creation time and rank. (Not its PodRef: only the pods a pass binds or
    nominates need one, and kept for every pod of the cluster it was a fifth of its facts.)"""

    key: str
    group: GroupKey | None
    annotation_member: bool
    scheduler: str
    terminal: bool
    pending: bool
    occupies: bool
    # What it is charged to its node by (None: nothing), made once per version.
    charged: ChargedPod | None
    request: Mapping[str, int]
    priority: int
    # Read of a pending pod only (None for any other): its creation time, its rank order key
    # or why its network-topology-index does not parse.
    created: float | None
    rank: RankKey | None
    rank_error: str
    # What it brings to the inter-pod filters (hostPorts, required pod (anti-)affinity,
    # DoNotSchedule spread), None for most pods; of a pending pod, what it asks that the
    # placer does not check (interpod.unsupported_reason, "" when nothing).
    constraints: PodConstraints | None = None
    unsupported: str = ""
    # The PersistentVolumeClaims it names (of a pending pod: their topology filters its
    # nodes; of a charged one: it uses them, ReadWriteOncePod). Empty for most pods.
    claims: tuple[str, ...] = ()


def _read_pod_facts(pod: Obj) -> PodFacts:
    rank: RankKey | None = None
    rank_error = ""
    unsupported = ""
    constraints = constraints_of(pod)
    charge = podfacts.charged_node(pod)
    request = pod_request_shared(pod)
    pending = podfacts.is_pending(pod)
    # Only a pending pod is ranked and ordered by age (a placement reads neither of the
    # others): kept for every pod of the cluster, they were a quarter of its facts.
    if pending:
        try:
            rank = rank_key(topology_index(pod), fields.name_of(pod))
        except GangSpecError as error:
            rank_error = str(error)
        unsupported = unsupported_reason(pod, constraints)
    return PodFacts(
        key=fields.uid_of(pod) or f"{fields.namespace_of(pod)}/{fields.name_of(pod)}",
        group=pod_group_of(pod),
        annotation_member=is_annotation_gang_member(pod),
        scheduler=podfacts.scheduler_of(pod),
        terminal=podfacts.is_terminal(pod),
        pending=pending,
        occupies=podfacts.occupies_node(pod),
        charged=None if charge is None else ChargedPod(pod, charge[0], request, charge[1]),
        request=request,
        priority=podfacts.priority_of(pod),
        created=podfacts.created_at(pod) if pending else None,
        rank=rank,
        rank_error=rank_error,
        constraints=constraints,
        unsupported=unsupported,
        claims=claim_names(pod_spec) if "volumes" in (pod_spec := podfacts.spec(pod)) else (),
    )


# The facts of each pod version (see memo.py): the API server gives every change (binding,
# nomination, phase, deletion) a new resourceVersion.
_POD_FACTS: FactsByVersion[PodFacts] = FactsByVersion(_read_pod_facts, limit=400_000)
pod_facts = _POD_FACTS.of
facts_of_pods = _POD_FACTS.of_all


class _NodeIndex:
    """What the nodes alone decide, shared by every pass while the nodes stay the same
    versions in the same order: their facts by name, the nodes that pass the filters for each
    pod spec signature, and the names grouped by allocatable. Read only once made."""

    def __init__(self, facts_in_order: list[NodeFacts]) -> None:
        self.facts_in_order = facts_in_order
        self.facts: dict[str, NodeFacts] = {f.name: f for f in facts_in_order if f.name}
        # Nodes that pass the filters, by the signature of a pod spec's filter fields.
        self.passing: dict[str, set[str]] = {}
        self._by_allocatable: list[tuple[Milli, set[str]]] | None = None
        # The domain tree by topology spec (see _tree_of).
        self.trees: dict[TopologySpec, TopologyTree] = {}
        # Node names by label key and value, filled as the inter-pod filters ask.
        self.by_label: LabelIndex = {}

    # Read by the inter-pod filters only (made when a gang first needs them).
    @cached_property
    def labels(self) -> dict[str, Obj]:
        return {name: facts.labels for name, facts in self.facts.items()}

    @cached_property
    def objects(self) -> dict[str, Obj]:
        return {name: facts.node for name, facts in self.facts.items()}

    def by_allocatable(self) -> list[tuple[Milli, set[str]]]:
        """Node names grouped by their (shared) allocatable."""
        if self._by_allocatable is None:
            groups: dict[int, tuple[Milli, set[str]]] = {}
            for name, facts in self.facts.items():
                group = groups.get(id(facts.allocatable))
                if group is None:
                    group = groups[id(facts.allocatable)] = (facts.allocatable, set())
                group[1].add(name)
            self._by_allocatable = list(groups.values())
        return self._by_allocatable


_LAST_NODE_INDEX: list[_NodeIndex] = []


def _node_index(facts_in_order: list[NodeFacts]) -> _NodeIndex:
    # The very same facts objects (memoised by node version): a node read afresh (without a
    # resourceVersion) makes a new index, since its taints are not part of its facts' value.
    if _LAST_NODE_INDEX:
        last = _LAST_NODE_INDEX[0].facts_in_order
        if len(last) == len(facts_in_order) and all(map(operator.is_, last, facts_in_order)):
            return _LAST_NODE_INDEX[0]
    index = _NodeIndex(facts_in_order)
    _LAST_NODE_INDEX[:] = [index]
    return index


class _Pass:
    """The mutable bookkeeping of one pass: capacities change as gangs are nominated."""

    def __init__(self, state: ClusterState) -> None:
        self.state = state
        self.now_text = fields.rfc3339(state.now)
        self.plan = Plan()
        self.topology = next(
            (t for t in state.topologies if fields.name_of(t) == DEFAULT_TOPOLOGY_NAME), None
        )
        self.topology_error = ""
        try:
            spec = parse_topology(self.topology)
        except TopologySpecError as error:
            self.topology_error = f"ClusterNetworkTopology {DEFAULT_TOPOLOGY_NAME}: {error}"
            spec = parse_topology(None)
        # One read of every pod and node, memoised per version (pod_facts, fit.node_facts).
        self.pod_facts = facts_of_pods(state.pods)
        self.nodes = _node_index(facts_of_nodes(state.nodes))
        self.facts = self.nodes.facts
        tree = self.nodes.trees.get(spec)
        if tree is None:
            tree = self.nodes.trees[spec] = _tree_of(spec, self.nodes.facts_in_order, self.facts)
        self.tree = tree
        # Every pod charged to a node (bound, or only nominated), by uid; what that uses of
        # each node, and what each node offers. Filled by `account()`, only in a pass that
        # has a gang to place.
        self.charged: dict[str, ChargedPod] = {}
        self.used: dict[str, Milli] = {}
        self.group_objects: dict[GroupKey, Obj] = {}
        # PodGroups whose gang timed out this pass: their scheduleStartTime starts again.
        self.restarted: set[GroupKey] = set()
        # Pods by their network-topology-selector value, built when a gang first asks.
        self._by_selector: dict[str, list[Obj]] | None = None
        # The inter-pod filters' view of the charged pods, built when a gang first needs it;
        # whether any charged pod has a required anti-affinity (it may repel any pod).
        self._interpod: Charged | None = None
        self.repelling = False
        # Charged pods with hostPorts or a required anti-affinity (by key): all the inter-pod
        # filters index up front.
        self.constrained: list[tuple[str, PodConstraints]] = []

    # --- volumes (volumes.py): read only in a pass with a pending pod naming a claim ---

    @cached_property
    def volume_index(self) -> VolumeIndex:
        return VolumeIndex(self.state.claims, self.state.volumes, self.state.storage_classes)

    @cached_property
    def claim_users(self) -> dict[str, list[tuple[str, str]]]:
        """Every pod charged to a node (bound or nominated) by each claim it names
        ("namespace/claim" -> [(its key, its name)])."""
        users: dict[str, list[tuple[str, str]]] = {}
        for facts in self.pod_facts:
            if facts.claims and facts.charged is not None:
                pod = facts.charged.pod
                namespace = fields.namespace_of(pod)
                for claim in facts.claims:
                    users.setdefault(f"{namespace}/{claim}", []).append(
                        (facts.key, fields.name_of(pod))
                    )
        return users

    def volume_nodes(self, needs: VolumeNeeds, nodes: AbstractSet[str]) -> AbstractSet[str]:
        """Those of `nodes` that every bound PersistentVolume admits (its node affinity and its
        zone labels)."""
        if not needs.node_selectors and not needs.zones and not needs.waiting:
            return nodes
        return {
            name
            for name in nodes
            if (facts := self.facts.get(name)) is not None and needs.admit(facts.node)
        }

    def pods_sharing_selector(self, value: str) -> list[Obj]:
        """Every pod whose `network-topology-selector` annotation is `value`."""
        if self._by_selector is None:
            index: dict[str, list[Obj]] = {}
            for pod in self.state.pods:
                found = fields.annotations_of(pod).get(NETWORK_TOPOLOGY_SELECTOR)
                if isinstance(found, str) and found:
                    index.setdefault(found, []).append(pod)
            self._by_selector = index
        return self._by_selector.get(value, [])

    def existing_pods(self, gang: Gang, ranked: Sequence[Obj]) -> dict[str, int]:
        """Per node, the job's pods already running there: the gang's bound members and the
        bound pods sharing its `network-topology-selector` (Koordinator's existingPodNum)."""
        counted: set[str] = set()
        existing: dict[str, int] = {}
        selectors = {
            value
            for pod in ranked
            if isinstance(value := fields.annotations_of(pod).get(NETWORK_TOPOLOGY_SELECTOR), str)
            and value
        }
        peers = [p for value in sorted(selectors) for p in self.pods_sharing_selector(value)]
        for pod in (*gang.bound, *peers):
            uid = fields.uid_of(pod)
            if uid in counted or not pod_facts(pod).occupies:
                continue
            counted.add(uid)
            node = podfacts.node_name_of(pod)
            existing[node] = existing.get(node, 0) + 1
        return existing

    def account(self) -> None:
        charged, used = self.charged, self.used
        for facts in self.pod_facts:
            if facts.charged is not None:
                charged[facts.key] = facts.charged
                if facts.constraints is not None:
                    self.constrained.append((facts.key, facts.constraints))
                    if facts.constraints.anti_affinity:
                        self.repelling = True
        for item in charged.values():
            node_used = used.get(item.node)
            if node_used is None:
                used[item.node] = dict(item.request)
            else:
                add_milli(node_used, item.request)

    def usable_nodes(self, specs_by_signature: Mapping[str, Obj]) -> AbstractSet[str]:
        """Nodes that pass the filters (cordon, readiness, taints, node affinity) for every
        one of these pod specs; each spec's verdicts are worked out once while the nodes stay
        the same, as the members of most gangs share their specs. Read only: it may be the
        node index's own set."""
        usable: AbstractSet[str] | None = None
        for signature, spec in specs_by_signature.items():
            passing = self.nodes.passing.get(signature)
            if passing is None:
                passing = self.nodes.passing[signature] = self._passing(spec)
            usable = passing if usable is None else usable & passing
        return frozenset() if usable is None else usable

    def _passing(self, spec: Obj) -> set[str]:
        # The filters answer for a schedulable node without taints from the cordon and
        # readiness facts alone, unless the pod selects nodes: only the rest see the
        # nodeflow_kube filters (same verdicts as filter_reason on every node).
        selective = bool(spec.get("nodeSelector") or spec.get("affinity"))
        passing: set[str] = set()
        for name, facts in self.facts.items():
            if not facts.schedulable:
                continue
            if (facts.tainted or selective) and filter_reason(spec, facts.node) is not None:
                continue
            passing.add(name)
        return passing

    def given_back(self, gang: Gang) -> dict[str, Milli]:
        """What the gang's own nominations use, by node: it is being placed again."""
        given_back: dict[str, Milli] = {}
        for pod in gang.all_members:
            item = self.charged.get(fields.uid_of(pod))
            if item is not None and item.nominated_only:
                add_milli(given_back.setdefault(item.node, {}), item.request)
        return given_back

    def capacities_for(self, gang: Gang) -> dict[str, NodeCapacity]:
        """Every node's capacity with the gang's own nominations given back."""
        given_back = self.given_back(gang)
        capacities: dict[str, NodeCapacity] = {}
        for name, facts in self.facts.items():
            used = self.used.get(name, {})
            if name in given_back:
                used = dict(used)
                add_milli(used, given_back[name], -1)
            capacities[name] = NodeCapacity(
                name=name, node=facts.node, allocatable=facts.allocatable, used=used
            )
        return capacities

    def offer_slots(
        self, gang: Gang, usable: AbstractSet[str], request: Mapping[str, int]
    ) -> dict[str, int]:
        """fit.offer_slots over `capacities_for(gang)`, without building a capacity per node:
        nodes nothing is charged to offer what their allocatable does, worked out once per
        distinct allocatable and handed out in bulk."""
        given_back = self.given_back(gang)
        untouched = usable - self.used.keys() - given_back.keys()
        slots: dict[str, int] = {}
        for allocatable, names in self.nodes.by_allocatable():
            count = slots_in(allocatable, {}, request)
            if count > 0:
                slots.update(dict.fromkeys(names & untouched, count))
        # Most charged nodes carry the same few pod shapes: one division per distinct
        # (allocatable, use) pair.
        known: dict[tuple[int, tuple[tuple[str, int], ...]], int] = {}
        for name in usable - untouched:
            allocatable = self.facts[name].allocatable
            used = self.used.get(name, {})
            if name in given_back:
                used = dict(used)
                add_milli(used, given_back[name], -1)
            shape = (id(allocatable), tuple(used.items()))
            fitting = known.get(shape)
            if fitting is None:
                fitting = known[shape] = slots_in(allocatable, used, request)
            if fitting > 0:
                slots[name] = fitting
        return slots

    def free_for(self, gang: Gang, nodes: AbstractSet[str]) -> dict[str, Mapping[str, int]]:
        """What each of `nodes` has free, the gang's own nominations given back. The dicts
        are shared (a node nothing is charged to holds its allocatable): read only."""
        given_back = self.given_back(gang)
        free: dict[str, Mapping[str, int]] = {}
        # Most charged nodes carry the same few pod shapes: one dict per distinct (allocatable,
        # use), shared by the nodes alike, so gather_mixed divides once per dict.
        known: dict[tuple[int, tuple[tuple[str, int], ...]], Mapping[str, int]] = {}
        untouched = nodes - self.used.keys() - given_back.keys()
        for allocatable, names in self.nodes.by_allocatable():
            free.update(dict.fromkeys(names & untouched, allocatable))
        for name in nodes - untouched:
            facts = self.facts.get(name)
            if facts is None:
                continue
            used = self.used.get(name)
            back = given_back.get(name)
            net: Milli = dict(used or {})
            if back:
                add_milli(net, back, -1)
            shape = (id(facts.allocatable), tuple(sorted(net.items())))
            room = known.get(shape)
            if room is None:
                fresh = dict(facts.allocatable)
                add_milli(fresh, net, -1)
                room = known[shape] = fresh
            free[name] = room
        return free

    def reserve(self, pod: Obj, node: str) -> None:
        """Charge a pod nominated this pass, so the next gang sees it."""
        facts = pod_facts(pod)
        previous = self.charged.get(facts.key)
        if previous is not None:
            add_milli(self.used[previous.node], previous.request, -1)
        add_milli(self.used.setdefault(node, {}), facts.request)
        self.charged[facts.key] = ChargedPod(pod, node, facts.request, True)
        if facts.constraints is not None:
            self.constrained.append((facts.key, facts.constraints))
            if facts.constraints.anti_affinity:
                self.repelling = True
        if self._interpod is not None:
            self._interpod.charge(facts.key, pod, node)

    def interpod_check(self, gang: Gang) -> GangCheck | None:
        """The inter-pod filters for this gang, or None when none can apply: no pending
        member has hostPorts, required pod (anti-)affinity or a DoNotSchedule spread, and no
        charged pod has a required anti-affinity (the usual pass pays nothing for them)."""
        if not self.repelling and not gang.constrained:
            return None
        if self._interpod is None:
            self._interpod = Charged(self.charged, self.constrained, _constraints_of_pod)
        return GangCheck(
            charged=self._interpod,
            own=frozenset(pod_facts(p).key for p in gang.pending),
            node_labels=self.nodes.labels,
            label_index=self.nodes.by_label,
            node_objects=self.nodes.objects,
            constraints_of_pod=_constraints_of_pod,
        )


def _constraints_of_pod(pod: Obj) -> PodConstraints | None:
    return pod_facts(pod).constraints


# Memo of the last tree and of each node version's path (by topology spec): the tree only
# changes when nodes come, go or are relabelled, and rebuilding 16k leaves every pass would
# be most of a pass. A node's facts are memoised by version, so the same node facts in the
# same order are the same tree; a new node version (a heartbeat) is read for its path alone.
_PATHS: dict[TopologySpec, dict[int, tuple[NodeFacts, DomainPath]]] = {}
_LAST_TREE: list[tuple[object, TopologyTree]] = []
_LAST_FACTS: list[tuple[TopologySpec, list[NodeFacts], TopologyTree]] = []


def _tree_of(
    spec: TopologySpec, facts_in_order: list[NodeFacts], facts: Mapping[str, NodeFacts]
) -> TopologyTree:
    if _LAST_FACTS:
        last_spec, last_facts, last_tree = _LAST_FACTS[0]
        # Identical objects compare at C speed; a node read afresh compares by value.
        if last_spec == spec and last_facts == facts_in_order:
            return last_tree
    known = _PATHS.get(spec, {})
    # Only the current nodes' paths are kept for next time (no pile of old node versions).
    kept: dict[int, tuple[NodeFacts, DomainPath]] = {}
    paths: list[tuple[str, DomainPath]] = []
    for name, node_facts_ in facts.items():
        # Keyed by the facts object's identity, held in the value so the id stays its own.
        entry = known.get(id(node_facts_))
        if entry is None or entry[0] is not node_facts_:
            entry = (node_facts_, node_path(spec, node_facts_.labels))
        kept[id(node_facts_)] = entry
        paths.append((name, entry[1]))
    _PATHS.clear()
    _PATHS[spec] = kept
    paths.sort()
    memo_key = (spec, tuple(paths))
    if _LAST_TREE and _LAST_TREE[0][0] == memo_key:
        tree = _LAST_TREE[0][1]
    else:
        tree = build_tree_from_paths(spec, paths)
        _LAST_TREE[:] = [(memo_key, tree)]
    _LAST_FACTS[:] = [(spec, facts_in_order, tree)]
    return tree


# --- the pass -----------------------------------------------------------------------------


def plan(state: ClusterState) -> Plan:
    run = _Pass(state)
    # One walk over every pod: its gang, and whether it is ours to place.
    ours: list[Obj] = []
    all_members: dict[GroupKey, list[Obj]] = {}
    group_of: dict[int, GroupKey | None] = {}
    for pod, facts in zip(state.pods, run.pod_facts, strict=True):
        group = facts.group
        if group is not None:
            all_members.setdefault(group, []).append(pod)
        if facts.scheduler in state.scheduler_names and not facts.terminal:
            ours.append(pod)
            group_of[id(pod)] = group
    specs: dict[GroupKey, PodGroupSpec] = {}
    errors: dict[GroupKey, str] = {}
    group_objects: dict[GroupKey, Obj] = {}
    for obj in state.pod_groups:
        key = GroupKey(fields.namespace_of(obj), fields.name_of(obj))
        group_objects[key] = obj
        try:
            specs[key] = parse_pod_group(obj)
        except GangSpecError as error:
            errors[key] = f"PodGroup {key}: {error}"
    # Gangs declared by pod annotations alone: the first member (by name) speaks for them.
    declared_by_pods: set[GroupKey] = set()
    annotation_members = [p for p in ours if pod_facts(p).annotation_member]
    for pod in sorted(annotation_members, key=fields.name_of):
        declared = pod_group_of(pod)
        if declared is None or declared in group_objects:
            continue
        if declared not in declared_by_pods:
            declared_by_pods.add(declared)
            try:
                specs[declared] = parse_pod_group(annotation_gang_object(pod))
            except GangSpecError as error:
                errors[declared] = f"gang {declared} (pod annotations): {error}"
    gangs: list[Gang] = []
    for keys in _union_groups(specs):
        # A PodGroup of the group that does not parse makes the whole group invalid, naming it.
        own = {k: specs[k] for k in keys if k in specs}
        gangs.append(Gang(keys=keys, specs=own, errors=[errors[k] for k in keys if k in errors]))
    for key in sorted(errors, key=str):
        gangs.append(Gang(keys=(key,), errors=[errors[key]]))
    run.group_objects = group_objects
    by_key = {key: gang for gang in gangs for key in gang.keys}
    solitary: list[Gang] = []
    for pod in ours:
        group = group_of[id(pod)]
        if group is None:
            # A pod of ours with no PodGroup is a gang of one, placed anywhere.
            key = GroupKey(fields.namespace_of(pod), fields.name_of(pod))
            lone = Gang(keys=(key,), members={key: [pod]})
            lone.specs[key] = PodGroupSpec(
                key=key,
                uid="",
                min_member=1,
                total_number=1,
                min_resources={},
                mode="Strict",
                waiting_seconds=float("inf"),
                match_policy="once-satisfied",
                gang_group=(key,),
                gather=(),
            )
            solitary.append(lone)
            continue
        gang = by_key.get(group)
        if gang is None:
            gang = Gang(keys=(group,), errors=[f"PodGroup {group} does not exist"])
            by_key[group] = gang
            gangs.append(gang)
        gang.members.setdefault(group, []).append(pod)
    for gang in gangs:
        gang.uids = {k: fields.uid_of(group_objects[k]) for k in gang.keys if k in group_objects}
        missing = [k for k in gang.keys if k not in group_objects and k not in declared_by_pods]
        if missing and not gang.errors:
            gang.errors.append(
                "GangGroup member PodGroup "
                + ", ".join(str(k) for k in missing)
                + " does not exist"
            )
    ordered = sorted(
        [g for g in gangs + solitary if g.pending],
        key=lambda g: (
            -g.priority,
            min((pod_facts(p).created or 0.0) for p in g.pending),
            g.id,
        ),
    )
    for gang in gangs + solitary:
        if not gang.pending:
            # A PodGroup whose pods have not arrived yet waits; one whose pods all have
            # nodes is bound.
            run.plan.gang_states[gang.id] = "bound" if gang.bound else "waiting"
    if ordered:
        run.account()
    # Gangs with a command on its way are left as they are, their reservations charged
    # first, so no gang is placed on a node another's nomination is about to take.
    placing = [gang for gang in ordered if not _hold_in_flight(run, gang)]
    for gang in placing:
        _place_gang(run, gang, group_objects)
    _group_statuses(run, specs, group_objects, all_members)
    _topology_status(run)
    return run.plan


class _GangFit:
    """How the pending members of one gang fit the nodes this pass.

    When every member asks alike and passes the same filters (the usual gang) a node offers
    slots of that one request (`gather`). When the members differ (an MPI launcher and its
    8-GPU workers, a PyTorchJob master and its workers) each shape keeps its own request and
    the nodes that pass its own filters, and nodes are weighed by what they have free
    (`gather_mixed`): a member is never sized by another's request nor kept off a node by
    another's selector, in placement as in preemption's dry run (`_preempt`)."""

    def __init__(
        self,
        shape_of: dict[str, int],
        shapes: list[PodShape],
        node_slots: dict[str, int],
        free: dict[str, Mapping[str, int]],
        check: GangCheck | None = None,
        pods: Mapping[str, Obj] | None = None,
        refused: Mapping[str, int] | None = None,
        gathering: Sequence[GatherRule] = (),
        volume_off: int = 0,
    ) -> None:
        self.shape_of = shape_of
        self.shapes = shapes
        self.request: Milli = largest_request(shape.request for shape in shapes)
        # One shape: offer slots per node. Several: free resources per usable node.
        self.node_slots = node_slots
        self.free = free
        # The inter-pod filters (None: none applies to this gang), the members by name and
        # how many nodes each filter took off for the pods already placed.
        self.check = check
        self.pods: Mapping[str, Obj] = pods or {}
        self.refused: Mapping[str, int] = refused or {}
        # MustGather rules the members' required affinity to each other adds (`of`).
        self.gathering = tuple(gathering)
        # Nodes the members' PersistentVolumes' node affinity took off (any shape's).
        self.volume_off = volume_off

    @property
    def uniform(self) -> bool:
        return len(self.shapes) == 1

    @classmethod
    def of(cls, run: _Pass, gang: Gang, ranked: Sequence[Obj]) -> _GangFit:
        shape_index: dict[tuple[tuple[tuple[str, int], ...], str, object], int] = {}
        shape_of: dict[str, int] = {}
        shapes: list[PodShape] = []
        by_signature: dict[str, Obj] = {}
        check = run.interpod_check(gang)
        refused: dict[str, int] = {}
        volume_off = 0
        caps: list[Callable[[str], int] | None] = []
        gathering: dict[str, GatherRule] = {}
        # Pods asking alike mostly share one request dict: its items are sorted once.
        items_of: dict[int, tuple[tuple[str, int], ...]] = {}
        for pod in ranked:
            request = pod_facts(pod).request
            signature = _spec_signature(pod)
            by_signature.setdefault(signature, podfacts.spec(pod))
            items = items_of.get(id(request))
            if items is None:
                items = items_of[id(request)] = tuple(sorted(request.items()))
            # Members the inter-pod filters or their volumes tell apart are shapes of their own.
            needs = gang.volume_needs.get(fields.name_of(pod)) if gang.volume_needs else None
            key = (
                items,
                signature if needs is None else f"{signature} {needs.key}",
                None if check is None else check.shape_key(pod),
            )
            index = shape_index.get(key)
            if index is None:
                usable = run.usable_nodes({signature: by_signature[signature]})
                if needs is not None:
                    admitted = run.volume_nodes(needs, usable)
                    volume_off = max(volume_off, len(usable) - len(admitted))
                    usable = admitted
                if check is not None and check.relevant(pod):
                    usable, off = check.usable(pod, usable)
                    for rule_name, count in off.items():
                        refused[rule_name] = refused.get(rule_name, 0) + count
                caps.append(None if check is None else check.node_cap(pod))
                if check is not None:
                    for rule in _affinity_gathering(run.tree, check.gathering_keys(pod)):
                        gathering[rule.layer] = rule
                index = shape_index[key] = len(shapes)
                shapes.append(PodShape(request=request, usable=usable))
            shape_of[fields.name_of(pod)] = index
        by_name = {fields.name_of(p): p for p in ranked} if check is not None else {}
        if len(shapes) <= 1:
            request = shapes[0].request if shapes else {}
            usable = shapes[0].usable if shapes else frozenset()
            slots = run.offer_slots(gang, usable, request)
            cap = caps[0] if caps else None
            if cap is not None:
                # Members alike that one node may take together (a shared hostPort, a
                # per-node anti-affinity or spread).
                slots = {node: n for node, count in slots.items() if (n := min(count, cap(node)))}
            return cls(
                shape_of,
                shapes,
                slots,
                {},
                check,
                by_name,
                refused,
                tuple(gathering.values()),
                volume_off,
            )
        nodes: set[str] = set()
        for shape in shapes:
            nodes |= shape.usable
        return cls(
            shape_of,
            shapes,
            {},
            run.free_for(gang, nodes),
            check,
            by_name,
            refused,
            tuple(gathering.values()),
            volume_off,
        )

    def takes(self, names_by_node: Mapping[str, Sequence[str]]) -> bool:
        """Whether each node still takes the members named for it, all together (and the
        inter-pod filters let them)."""
        if not self._resources_take(names_by_node):
            return False
        return self.check is None or self.violation(names_by_node) is None

    def violation(self, names_by_node: Mapping[str, Sequence[str]]) -> str | None:
        """What the inter-pod filters refuse of these members on these nodes, checked in
        rank order, or None."""
        if self.check is None:
            return None
        order = {name: index for index, name in enumerate(self.pods)}
        pairs = sorted(
            ((name, node) for node, names in names_by_node.items() for name in names),
            key=lambda pair: order.get(pair[0], len(order)),
        )
        return self.check.violation([(self.pods[name], node) for name, node in pairs])

    def _resources_take(self, names_by_node: Mapping[str, Sequence[str]]) -> bool:
        if self.uniform:
            return all(
                self.node_slots.get(node, 0) >= len(names) for node, names in names_by_node.items()
            )
        for node, names in names_by_node.items():
            room = self.free.get(node)
            if room is None:
                return False
            total: Milli = {}
            for name in names:
                shape = self.shapes[self.shape_of[name]]
                if node not in shape.usable:
                    return False
                add_milli(total, shape.request)
            if any(amount > room.get(resource, 0) for resource, amount in total.items()):
                return False
        return True

    def place(
        self,
        tree: TopologyTree,
        names: Sequence[str],
        rules: Sequence[GatherRule],
        existing: Mapping[str, int],
        within: DomainPath | None,
    ) -> Placement | NoFit:
        rules = (*rules, *self.gathering)
        if self.uniform:
            result = gather(tree, names, rules, self.node_slots, existing, within)
        else:
            members = [(name, self.shape_of[name]) for name in names]
            result = gather_mixed(tree, members, self.shapes, self.free, rules, existing, within)
        if isinstance(result, NoFit) and (self.refused or self.volume_off):
            return NoFit(
                result.message + self._refused_text(),
                result.desired,
                result.best_domain,
                result.best_slots,
            )
        if self.check is None or isinstance(result, NoFit):
            return result
        # A placement the filters refuse is not made: never a misplaced pod.
        by_node: dict[str, list[str]] = {}
        for name, node in result.assignments:
            by_node.setdefault(node, []).append(name)
        why = self.violation(by_node)
        if why is None:
            return result
        return NoFit(
            f"inter-pod filters refuse the placement found: {why}" + self._refused_text(),
            len(names),
            "/".join(result.domain) or "cluster",
            0,
        )

    def _refused_text(self) -> str:
        text = ""
        if self.volume_off:
            text = f" (nodes ruled out by volume node affinity or zone: {self.volume_off})"
        if not self.refused:
            return text
        parts = ", ".join(f"{rule} on {count}" for rule, count in sorted(self.refused.items()))
        return f"{text} (nodes ruled out by pods already placed: {parts})"

    def consume(self, name: str, node: str) -> None:
        """The member now takes room on `node` (bound this pass)."""
        if self.check is not None:
            self.check.placed.append((self.pods[name], node))
        if self.uniform:
            self.node_slots[node] = self.node_slots.get(node, 0) - 1
            return
        room = dict(self.free.get(node, {}))
        add_milli(room, self.shapes[self.shape_of[name]].request, -1)
        self.free[node] = room


def _affinity_gathering(tree: TopologyTree, keys: Sequence[str]) -> list[GatherRule]:
    """Members that must share a domain of these label keys with the first of their kind
    (required affinity to each other) are gathered there: MustGather at the layer the key
    names (the nodes for the hostname). A key no layer names adds nothing (the placement
    is still checked, and refused when it splits them)."""
    rules: list[GatherRule] = []
    for key in keys:
        if key == HOSTNAME_LABEL:
            rules.append(GatherRule(NODE_LAYER, "MustGather"))
            continue
        for layer in tree.spec.layers:
            if layer.label_keys == (key,):
                rules.append(GatherRule(layer.name, "MustGather"))
    return rules


def _hold_in_flight(run: _Pass, gang: Gang) -> bool:
    """A gang with a command of the placer's that may still land (a nomination, bind or
    status patch of a member, by this leader or an earlier one) is not planned this pass:
    a plan on a view that lacks that command's effect would nominate on a stale
    resourceVersion (refused with a conflict), or place the gang twice. Its nominations on
    their way are charged to their nodes."""
    in_flight = run.state.in_flight
    if not in_flight:
        return False
    members = gang.all_members
    if not any(key in in_flight.gangs for key in gang.keys) and not any(
        (fields.namespace_of(pod), fields.name_of(pod)) in in_flight.pods for pod in members
    ):
        return False
    for pod in gang.pending:
        node = in_flight.nominations.get((fields.namespace_of(pod), fields.name_of(pod)))
        if node:
            run.reserve(pod, node)
    run.plan.gang_states[gang.id] = "in-flight"
    return True


def _place_gang(run: _Pass, gang: Gang, group_objects: Mapping[GroupKey, Obj]) -> None:
    """One GangGroup through the phases (module docstring): read, members, then either
    regrowth (a satisfied gang) or bind / gather / preempt / unschedulable (all or nothing)."""
    ranked = _read_phase(run, gang)
    if ranked is None:
        return
    needed = _members_phase(run, gang, ranked, group_objects)
    if needed is None:
        return
    fit = _GangFit.of(run, gang, ranked)
    if not any(needed.values()):
        _regrow_phase(run, gang, ranked, fit)
        return
    within = _confinement(run.tree, gang, _bound_nodes(gang), partial=True)
    # Phase 3: bind what is nominated and still fits.
    if _bind_if_reserved(run, gang, ranked, fit, within):
        return
    # Phase 4: gather.
    result = _gather_phase(run, gang, ranked, needed, fit, within)
    if result is None:
        return
    # Phase 5: preempt.
    names = [fields.name_of(p) for p in ranked]
    preempted = _preempt(run, gang, ranked, names, fit, within)
    if preempted is True:
        return
    message = result.message if preempted is None else f"{result.message}; {preempted}"
    waiting_for_victims = isinstance(preempted, str) and "still terminating" in preempted
    # Phase 6: unschedulable (and the gang's waiting time).
    _unschedulable(run, gang, ranked, "unschedulable", message, clear=not waiting_for_victims)


def _read_volumes(run: _Pass, gang: Gang, pod: Obj, facts: PodFacts) -> str:
    """Phase 1 for a pending member naming PersistentVolumeClaims: what its bound claims ask
    (kept in gang.volume_needs), or why it cannot be placed now (volumes.py): a claim missing,
    unbound or deleting, its volume missing, or a ReadWriteOncePod claim another pod uses."""
    needs = run.volume_index.needs(fields.namespace_of(pod), facts.claims)
    if isinstance(needs, str):
        return needs
    if needs.waiting and (why := _waiting_for_first_consumer(run, needs)):
        return why
    namespace = fields.namespace_of(pod)
    for waiting in needs.waiting:
        if waiting.selected_node:
            # Annotated already: every pod naming it goes to that node alone (WaitingClaim).
            continue
        shared = f"{namespace}/{waiting.name}"
        fellow = next(
            (
                fields.name_of(member)
                for member in gang.pending
                if member is not pod and shared in _claims_of(member)
            ),
            "",
        )
        if fellow:
            # Placed at once, the members could land on two nodes, and one claim cannot be
            # provisioned on both: refused until the claim names its node or is bound.
            return (
                f"PersistentVolumeClaim {waiting.name} waits for its first consumer "
                f"(WaitForFirstConsumer) and pod {fellow} of the same gang names it too: the "
                "topology placer selects one node per claim for one pod, never two nodes for "
                "one claim; bind the claim first or give each pod its own"
            )
    for claim in needs.exclusive:
        other = next((name for key, name in run.claim_users.get(claim, ()) if key != facts.key), "")
        if not other:
            # A fellow pending member naming it (not charged anywhere yet).
            other = next(
                (
                    fields.name_of(member)
                    for member in gang.pending
                    if member is not pod and claim in _claims_of(member)
                ),
                "",
            )
        if other:
            return (
                f"PersistentVolumeClaim {claim.split('/', 1)[1]} is ReadWriteOncePod and "
                f"already used by pod {other}"
            )
    gang.volume_needs[fields.name_of(pod)] = needs
    return ""


def _waiting_for_first_consumer(run: _Pass, needs: VolumeNeeds) -> str:
    """Why a pod with unbound WaitForFirstConsumer claims cannot be placed now, or "" when it
    can: a claim of a class without a provisioner needs a pre-made volume bound by the
    scheduler, which the placer does not do (it says how many nodes such a volume reaches);
    else the pod is placed where every claim admits it, unless no node does."""
    admitted = len(run.volume_nodes(needs, run.facts.keys()))
    static = next((claim for claim in needs.waiting if not claim.provisioned), None)
    if static is not None:
        return (
            f"PersistentVolumeClaim {static.name} waits for its first consumer "
            f"(WaitForFirstConsumer) and its StorageClass has no provisioner: {admitted} nodes "
            "could take the pod with an available PersistentVolume, but the topology placer "
            "does not bind volumes"
        )
    if admitted:
        return ""
    claim = needs.waiting[0]
    where = (
        f"node {claim.selected_node} (its {SELECTED_NODE_ANNOTATION} annotation)"
        if claim.selected_node
        else "its StorageClass's allowedTopologies"
    )
    return (
        f"PersistentVolumeClaim {claim.name} waits for its first consumer "
        f"(WaitForFirstConsumer), and no node can take the pod: none is in {where}"
    )


def _selections(gang: Gang, pod: Obj, node: str) -> list[SelectNode]:
    """The selected-node annotations to write before `pod` is bound to `node`: one per
    WaitForFirstConsumer claim not yet annotated with that node (VolumeBinding's PreBind)."""
    needs = gang.volume_needs.get(fields.name_of(pod)) if gang.volume_needs else None
    if needs is None:
        return []
    namespace = fields.namespace_of(pod)
    return [
        SelectNode(namespace, claim.name, claim.uid, claim.resource_version, node)
        for claim in needs.waiting
        if claim.selected_node != node
    ]


def _claims_of(pod: Obj) -> set[str]:
    """The claims a pod names, as "namespace/claim"."""
    namespace = fields.namespace_of(pod)
    return {f"{namespace}/{claim}" for claim in pod_facts(pod).claims}


def _read_phase(run: _Pass, gang: Gang) -> list[Obj] | None:
    """Phase 1: the pending members in rank order, or None when the gang cannot be read (it
    is then reported invalid). A PreferGather rule naming a layer the ClusterNetworkTopology
    does not have is a preference that cannot apply: it is dropped, with a Warning Event
    (Koordinator has no PreferGather code path at all). A MustGather on such a layer stays an
    error, reported by the gather."""
    pending = gang.pending
    facts = [pod_facts(p) for p in pending]
    rank_error = next((f.rank_error for f in facts if f.rank_error), "")
    if rank_error:
        gang.errors.append(rank_error)
        ranked = pending
    else:
        keys = [f.rank for f in facts if f.rank is not None]
        ranked = [pending[i] for i in sorted(range(len(keys)), key=keys.__getitem__)]
    if run.topology_error and gang.rules:
        gang.errors.append(run.topology_error)
    # What the placer does not check is refused, never guessed at (interpod module).
    for pod, pod_fact in zip(pending, facts, strict=True):
        if pod_fact.unsupported:
            gang.errors.append(f"pod {fields.name_of(pod)}: {pod_fact.unsupported}")
        if pod_fact.constraints is not None:
            gang.constrained = True
        if pod_fact.claims and not pod_fact.unsupported:
            why = _read_volumes(run, gang, pod, pod_fact)
            if why:
                gang.errors.append(f"pod {fields.name_of(pod)}: {why}")
    if gang.errors:
        # A refused pod's reservation (made before it was refused) holds nothing for it, nor
        # does a gang whose PodGroup was deleted or made invalid: it never times out, so
        # nominations kept would starve every other gang for ever (_unschedulable clears them).
        _unschedulable(run, gang, ranked, "invalid", "; ".join(gang.errors), clear=True)
        return None
    gang.ignored_layers = tuple(
        sorted(
            {
                rule.layer
                for rule in gang.rules
                if rule.strategy == "PreferGather" and run.tree.spec.depth_of(rule.layer) is None
            }
        )
    )
    return ranked


def _members_phase(
    run: _Pass, gang: Gang, ranked: Sequence[Obj], group_objects: Mapping[GroupKey, Obj]
) -> dict[GroupKey, int] | None:
    """Phase 2: how many more pods each PodGroup needs placed at once, or None when one of
    them has too few members (reported waiting). A PodGroup needs none when it is satisfied:
    under once-satisfied it reached minMember once (its phase says Scheduled, Running or
    Finished, or minMember are bound now), under waiting-and-running minMember are bound; a
    minMember of 0 needs none either (no gang check, as upstream)."""
    needed: dict[GroupKey, int] = {}
    for key in gang.keys:
        spec = gang.specs[key]
        members = gang.members.get(key, [])
        waiting = [p for p in members if pod_facts(p).pending]
        bound = [p for p in members if pod_facts(p).occupies]
        previous = podfacts.status(group_objects.get(key, {}))
        satisfied_once = spec.match_policy == "once-satisfied" and (
            previous.get("phase") in SATISFIED_PHASES or len(bound) >= spec.min_member
        )
        counted = len(waiting) if spec.match_policy == "only-waiting" else len(waiting) + len(bound)
        if satisfied_once:
            needed[key] = 0
        elif counted < spec.min_member:
            message = (
                f"waiting for members: PodGroup {key} has {counted} of minMember "
                f"{spec.min_member} pods ({spec.match_policy})"
            )
            _unschedulable(run, gang, ranked, "waiting", message, clear=False)
            return None
        else:
            counted_bound = 0 if spec.match_policy == "only-waiting" else len(bound)
            needed[key] = max(0, spec.min_member - counted_bound)
    return needed


def _gather_phase(
    run: _Pass,
    gang: Gang,
    ranked: Sequence[Obj],
    needed: Mapping[GroupKey, int],
    fit: _GangFit,
    within: DomainPath | None,
) -> NoFit | None:
    """Phase 4: every pending member at once, else just enough to reach each minMember (bound
    at once when those are reserved); nominated when placed (None), else why not."""
    existing = run.existing_pods(gang, ranked)
    names = [fields.name_of(p) for p in ranked]
    result = fit.place(run.tree, names, gang.rules, existing, within)
    if isinstance(result, NoFit) and len(ranked) > sum(needed.values()) > 0:
        subset = _minimum_subset(ranked, needed)
        if _bind_if_reserved(run, gang, subset, fit, within):
            return None
        subset_names = [fields.name_of(p) for p in subset]
        smaller = fit.place(run.tree, subset_names, gang.rules, existing, within)
        if isinstance(smaller, Placement):
            result = smaller
    if isinstance(result, Placement):
        _nominate(run, gang, result)
        return None
    return result


def _regrow_phase(run: _Pass, gang: Gang, ranked: Sequence[Obj], fit: _GangFit) -> None:
    """Phase 3 for a satisfied gang (elastic regrowth, a recreated member): its pending pods
    need no gang check, as Koordinator skips it once a gang is satisfied. Each nominated pod
    whose node still takes it is bound on its own; of the rest, the longest run in rank order
    that fits is nominated (all of them when they fit), still inside the gang's MustGather
    domain (Koordinator lets recreated members escape it, its issue #3181). What does not fit
    yet is reported unschedulable and waits for room: never a timeout, a cleared reservation
    of the others or an eviction, since the gang is not failing but recovering."""
    within = _confinement(run.tree, gang, _bound_nodes(gang), partial=False)
    bindings: list[tuple[str, str]] = []
    rest: list[Obj] = []
    for pod in ranked:
        name, node = fields.name_of(pod), podfacts.nominated_node_of(pod)
        kept = bool(node) and _keeps_gather_rules(run, gang, [node], within, whole=False)
        if kept and fit.takes({node: [name]}):
            fit.consume(name, node)
            selections = _selections(gang, pod, node)
            if selections:
                # Bound once KV shows its claims annotated with the node.
                run.plan.actions.extend(selections)
                continue
            run.plan.actions.append(Bind(ref_of(pod), node))
            bindings.append((name, node))
        else:
            rest.append(pod)
    if bindings:
        run.plan.actions.append(
            Decision(
                gang.keys,
                "bound",
                "Scheduled",
                f"binding {len(bindings)} pods of a satisfied gang to their nominated nodes",
                assignments=tuple(bindings),
            )
        )
        run.plan.attempts.append("bound")
    placed: Placement | None = None
    why = ""
    if rest:
        existing = run.existing_pods(gang, rest)
        names = [fields.name_of(p) for p in rest]

        def place(count: int) -> Placement | NoFit:
            return fit.place(run.tree, names[:count], gang.rules, existing, within)

        first = place(len(names))
        if isinstance(first, Placement):
            placed = first
        else:
            why = first.message
            # The longest prefix that fits: fewer pods never need more room.
            low, high = 0, len(names) - 1
            while low < high:
                middle = (low + high + 1) // 2
                attempt = place(middle)
                if isinstance(attempt, Placement):
                    placed, low = attempt, middle
                else:
                    high = middle - 1
    if placed is not None:
        _nominate(run, gang, placed)
    placed_names = set() if placed is None else set(placed.node_of)
    left = [p for p in rest if fields.name_of(p) not in placed_names]
    for pod in left:
        if podfacts.nominated_node_of(pod):
            # Its node no longer takes it: the reservation holds nothing.
            run.plan.actions.append(Nominate(ref_of(pod), ""))
    if bindings or placed is not None:
        if left:
            _unschedulable(run, gang, left, "unschedulable", why, clear=False, satisfied=True)
        run.plan.gang_states[gang.id] = "binding" if bindings else "nominated"
        return
    names = [fields.name_of(p) for p in ranked]
    preempted = _preempt(run, gang, ranked, names, fit, within)
    if preempted is True:
        return
    message = why if preempted is None else f"{why}; {preempted}"
    _unschedulable(run, gang, left, "unschedulable", message, clear=False, satisfied=True)


def _confinement(
    tree: TopologyTree, gang: Gang, bound_nodes: Sequence[str], *, partial: bool
) -> DomainPath | None:
    """Where the rest of a gang with bound members may go. A gang with no gather rule may go
    anywhere. A gang still short of minMember stays in the lowest domain holding its bound
    members (a failed bind re-plans inside it). A satisfied gang's new or recreated members
    stay in its MustGather domain (Koordinator lets them escape it, issue #3181); without
    MustGather they may go anywhere."""
    if not gang.rules:
        return None
    common = _lowest_common_domain(tree, bound_nodes) if bound_nodes else None
    if common is None:
        return None
    if partial:
        return common
    depths = [
        tree.spec.depth_of(rule.layer) for rule in gang.rules if rule.strategy == "MustGather"
    ]
    must = max((d for d in depths if d is not None), default=None)
    if must is None:
        return None
    return common[:must]


def _keeps_gather_rules(
    run: _Pass, gang: Gang, nodes: Sequence[str], within: DomainPath | None, *, whole: bool
) -> bool:
    """`nodes` (nominations, which anyone who writes pod status may have left) lie `within`
    the gang's confinement and, when `whole`, with its bound members inside one domain of
    its MustGather layer: the room and filters of a nominated node do not say that."""
    if not gang.rules and within is None:
        return True
    paths = []
    for name in nodes:
        leaf = run.tree.leaves.get(name)
        if leaf is None:
            return False
        paths.append(leaf.path)
    if within is not None and any(path[: len(within)] != within for path in paths):
        return False
    depths = [run.tree.spec.depth_of(r.layer) for r in gang.rules if r.strategy == "MustGather"]
    must = max((d for d in depths if d is not None), default=None)
    if not whole or must is None:
        return True
    bound = [run.tree.leaves[n].path for n in _bound_nodes(gang) if n in run.tree.leaves]
    return len({path[:must] for path in paths + bound}) <= 1


def _bound_nodes(gang: Gang) -> list[str]:
    return [podfacts.node_name_of(p) for p in gang.bound]


def _bind_if_reserved(
    run: _Pass, gang: Gang, pods: Sequence[Obj], fit: _GangFit, within: DomainPath | None
) -> bool:
    """Bind `pods` when every one is nominated, the nominated nodes still take them all and
    keep the gang's gather rules (else they are placed again)."""
    nominated = {fields.name_of(p): podfacts.nominated_node_of(p) for p in pods}
    if not pods or not all(nominated.values()):
        return False
    if not _keeps_gather_rules(run, gang, list(nominated.values()), within, whole=True):
        return False
    per_node: dict[str, list[str]] = {}
    for name, node in nominated.items():
        per_node.setdefault(node, []).append(name)
    if not fit.takes(per_node):
        return False
    selections = [s for p in pods for s in _selections(gang, p, nominated[fields.name_of(p)])]
    if selections:
        # The claims are annotated first; the gang is bound once KV shows every annotation.
        run.plan.actions.extend(selections)
        run.plan.gang_states[gang.id] = "binding"
        return True
    for pod in pods:
        run.plan.actions.append(Bind(ref_of(pod), nominated[fields.name_of(pod)]))
    run.plan.actions.append(
        Decision(
            gang.keys,
            "bound",
            "Scheduled",
            f"binding {len(pods)} pods to their nominated nodes",
            assignments=tuple((name, node) for name, node in nominated.items()),
        )
    )
    run.plan.gang_states[gang.id] = "binding"
    run.plan.attempts.append("bound")
    return True


def _minimum_subset(ranked: Sequence[Obj], needed: Mapping[GroupKey, int]) -> list[Obj]:
    left = dict(needed)
    chosen: list[Obj] = []
    for pod in ranked:
        key = pod_group_of(pod)
        if key is not None and left.get(key, 0) > 0:
            chosen.append(pod)
            left[key] -= 1
    return chosen


def _nominate(run: _Pass, gang: Gang, placement: Placement) -> None:
    node_of = placement.node_of
    for pod in gang.pending:
        node = node_of.get(fields.name_of(pod))
        if node is None:
            continue
        if podfacts.nominated_node_of(pod) != node:
            run.plan.actions.append(Nominate(ref_of(pod), node))
        run.reserve(pod, node)
    domain = "/".join(placement.domain) or "cluster"
    run.plan.actions.append(
        Decision(
            gang.keys,
            "nominated",
            "Nominated",
            f"{len(placement.assignments)} pods nominated in {placement.layer} {domain}",
            domain=domain,
            layer=placement.layer,
            assignments=placement.assignments,
        )
    )
    run.plan.gang_states[gang.id] = "nominated"
    run.plan.attempts.append("placed")
    _warn_ignored_layers(run, gang)


def _warn_ignored_layers(run: _Pass, gang: Gang) -> None:
    """The Warning Event for PreferGather layers dropped in phase 1, sent with a decision
    (a nomination, or a change of the unschedulable verdict), not on every pass."""
    first = gang.keys[0]
    if not gang.ignored_layers or not gang.uids.get(first):
        return
    known = ", ".join(layer.name for layer in run.tree.spec.layers) or "none"
    run.plan.actions.append(
        Notice(
            "PodGroup",
            first.namespace,
            first.name,
            gang.uids[first],
            GATHER_LAYER_IGNORED,
            f"PreferGather on {', '.join(gang.ignored_layers)} ignored: not a layer of "
            f"ClusterNetworkTopology {DEFAULT_TOPOLOGY_NAME} (layers: {known})",
            True,
        )
    )


def _preempt(
    run: _Pass,
    gang: Gang,
    ranked: Sequence[Obj],
    names: Sequence[str],
    fit: _GangFit,
    within: DomainPath | None,
) -> bool | str | None:
    """True when a preemption was planned; else why not (None: nothing lower to evict).
    Victims and placement stay `within` the gang's confinement (`_confinement`), as its
    gather does: evicting elsewhere would split the gang. A gang of several pod shapes is
    placed by the dry run shape by shape, each on the nodes its own members may use
    (`_preemption_nodes`), so a launcher's nodeSelector does not keep the workers' victims
    out of reach, nor is the launcher sized like a worker."""
    priority = gang.priority
    if not any(podfacts.priority_of(c.pod) < priority for c in run.charged.values()):
        return None
    preemptor = f"{gang.keys[0].namespace}/{gang.keys[0].name}"
    ineligible = eligibility(ranked, priority, run.state.pods, preemptor, run.state.in_flight.pods)
    if isinstance(ineligible, Ineligible):
        for victim in ineligible.resend:
            # Its mark landed, its delete did not: send both again, with the mark's message.
            marked = fields.condition(victim, podfacts.DISRUPTION_TARGET) or {}
            run.plan.actions.append(
                Disrupt(
                    ref_of(victim),
                    PREEMPTION_REASON,
                    str(marked.get("message") or ""),
                    run.now_text,
                )
            )
        return ineligible.message
    shapes: list[PodShape] = []
    if fit.uniform:
        usable = _preemption_nodes(run, gang, ranked, within, gang.volume_needs.values())
    else:
        members_of: list[list[Obj]] = [[] for _ in fit.shapes]
        for pod in ranked:
            members_of[fit.shape_of[fields.name_of(pod)]].append(pod)
        for shape, members in zip(fit.shapes, members_of, strict=True):
            needs = [
                found
                for pod in members
                if (found := gang.volume_needs.get(fields.name_of(pod))) is not None
            ]
            nodes = _preemption_nodes(run, gang, members, within, needs) if members else set()
            shapes.append(PodShape(shape.request, nodes))
        usable = frozenset().union(*(shape.usable for shape in shapes))
    own = {pod_facts(p).key for p in gang.all_members}
    charged = [c for key, c in run.charged.items() if key not in own]
    outcome = plan_preemption(
        tree=run.tree,
        pods_in_rank_order=names,
        rules=gang.rules,
        capacities=run.capacities_for(gang),
        usable_nodes=usable,
        request=fit.request,
        charged=charged,
        gang_priority=priority,
        budgets=run.state.budgets,
        shapes=shapes,
        shape_of=fit.shape_of,
        workload_pod_groups=run.state.workload_pod_groups,
    )
    if isinstance(outcome, NotHelpful):
        return outcome.message
    check = run.interpod_check(gang)
    if check is not None:
        # The victims are gone when the gang binds: they hold no port and repel nothing.
        check.own = check.own | {pod_facts(v).key for v in outcome.victim_pods}
        by_name = {fields.name_of(p): p for p in ranked}
        why = check.violation(
            [(by_name[name], node) for name, node in outcome.placement.assignments]
        )
        if why is not None:
            return f"preemption not planned, the inter-pod filters refuse its placement: {why}"
    trigger = ranked[0]
    scheduler = podfacts.scheduler_of(trigger)
    message = preemption_message(
        scheduler, preemptor, f"{fields.namespace_of(trigger)}/{fields.name_of(trigger)}"
    )
    victims = outcome.victim_pods
    for victim in victims:
        run.plan.actions.append(
            Disrupt(ref_of(victim), "PreemptionByScheduler", message, run.now_text)
        )
    for cleared in outcome.cleared_nominations:
        run.plan.actions.append(Nominate(ref_of(cleared), ""))
    _nominate(run, gang, outcome.placement)
    run.plan.attempts[-1] = "preempted"
    run.plan.gang_states[gang.id] = "preempting"
    victim_names = tuple(f"{fields.namespace_of(v)}/{fields.name_of(v)}" for v in victims)
    run.plan.actions.append(
        Decision(
            gang.keys,
            "preempted",
            "Preempted",
            f"evicting {len(victims)} pods of {outcome.victim_jobs} lower-priority jobs "
            f"(cost {outcome.cost}, budgets broken {outcome.broken_budgets})",
            domain="/".join(outcome.placement.domain) or "cluster",
            layer=outcome.placement.layer,
            assignments=outcome.placement.assignments,
            victims=victim_names,
        )
    )
    first = gang.keys[0]
    if gang.uids.get(first):
        run.plan.actions.append(
            Notice(
                "PodGroup",
                first.namespace,
                first.name,
                gang.uids[first],
                "Preempted",
                message,
                False,
            )
        )
    return True


def _preemption_nodes(
    run: _Pass,
    gang: Gang,
    members: Sequence[Obj],
    within: DomainPath | None,
    volume_needs: Iterable[VolumeNeeds],
) -> AbstractSet[str]:
    """The nodes preemption may free for `members` (the whole gang of one shape, or the
    members of one shape): those passing every member's filters, inside the gang's
    confinement, that every member's volumes admit, and where no pod preemption may not
    evict keeps a member off."""
    usable = run.usable_nodes({_spec_signature(pod): podfacts.spec(pod) for pod in members})
    if within is not None:
        usable = {
            name
            for name in usable
            if (leaf := run.tree.leaves.get(name)) is not None
            and leaf.path[: len(within)] == within
        }
    for needs in volume_needs:
        # Victims only where every member's volumes let it go.
        usable = run.volume_nodes(needs, usable)
    return _kept_by_higher_priority(run, gang, members, gang.priority, usable)


def _kept_by_higher_priority(
    run: _Pass, gang: Gang, ranked: Sequence[Obj], priority: int, usable: AbstractSet[str]
) -> AbstractSet[str]:
    """`usable` but the nodes where a pod preemption may not evict (of the gang's priority or
    higher) holds a conflicting hostPort or takes part in a required anti-affinity with a
    member: preemption then looks only where evicting can free the way (its placement is
    still checked whole afterwards)."""
    check = run.interpod_check(gang)
    if check is None:
        return usable
    check.own = check.own | {
        key for key, item in run.charged.items() if podfacts.priority_of(item.pod) < priority
    }
    kept = set(usable)
    for pod in ranked:
        if check.relevant(pod):
            kept, _ = check.usable(pod, kept, counted=False)
    return kept


def _unschedulable(
    run: _Pass,
    gang: Gang,
    ranked: Sequence[Obj],
    state: GangState,
    message: str,
    *,
    clear: bool,
    satisfied: bool = False,
) -> None:
    """Phase 6. `ranked` get PodScheduled=False with `message`; a Strict gang that is told to
    `clear` gives its reservations back, as does an invalid gang in every mode (it has no
    waiting time to end them). Past its waiting time (counted only for a gang that
    is not `satisfied`: a satisfied gang is recovering, not failing) the gang is reported
    GangTimeout, every mode drops its nominations, and a Strict gang that never reached
    minMember in every PodGroup of its group has its bound members evicted."""
    reason = UNSCHEDULABLE
    waiting = min((s.waiting_seconds for s in gang.specs.values()), default=float("inf"))
    # The wait runs from the PodGroups' scheduleStartTime (kept in Kubernetes, restarted when
    # a timeout is reported), else from the gang's first pod.
    recorded = [
        fields.parse_time(podfacts.status(run.group_objects[key]).get("scheduleStartTime"))
        for key in gang.keys
        if key in run.group_objects
    ]
    known = [start for start in recorded if start is not None]
    started = (
        max(known)
        if known
        else min((podfacts.created_at(p) or run.state.now for p in ranked), default=run.state.now)
    )
    kind: PlacementDecisionKind = "unschedulable"
    if state == "invalid":
        kind = "invalid"
    elif state == "waiting":
        kind = "waiting"
    timed_out = not satisfied and state != "invalid" and run.state.now - started > waiting
    if timed_out:
        reason = GANG_TIMEOUT
        message = f"gang {gang.id} waited more than {waiting:g}s: {message}"
        kind = "timed-out"
        run.restarted.update(gang.keys)
    changed = [p for p in ranked if _condition_differs(p, reason, message)]
    for pod in changed:
        run.plan.actions.append(MarkUnschedulable(ref_of(pod), reason, message, run.now_text))
    if timed_out or state == "invalid" or (gang.strict and clear and not satisfied):
        for pod in ranked:
            if podfacts.nominated_node_of(pod):
                run.plan.actions.append(Nominate(ref_of(pod), ""))
    if timed_out and gang.strict:
        _evict_partial_gang(run, gang, message)
    run.plan.gang_states[gang.id] = state
    run.plan.attempts.append(kind)
    if changed:
        first = gang.keys[0]
        if gang.uids.get(first):
            run.plan.actions.append(
                Notice(
                    "PodGroup",
                    first.namespace,
                    first.name,
                    gang.uids[first],
                    "FailedScheduling" if kind != "timed-out" else GANG_TIMEOUT,
                    message,
                    True,
                )
            )
        run.plan.actions.append(Decision(gang.keys, kind, reason, message))
        _warn_ignored_layers(run, gang)


def _reached_min_member(run: _Pass, gang: Gang, key: GroupKey) -> bool:
    """The PodGroup reached minMember: it has them bound now, or its phase says it had."""
    spec = gang.specs.get(key)
    if spec is None:
        return False
    bound = [p for p in gang.members.get(key, []) if podfacts.occupies_node(p)]
    previous = podfacts.status(run.group_objects.get(key, {}))
    return len(bound) >= spec.min_member or previous.get("phase") in SATISFIED_PHASES


def _proven_never_satisfied(run: _Pass, gang: Gang, key: GroupKey) -> bool:
    """The PodGroup's status, the placer's only durable record, says it never had minMember
    bound. A gang declared by pod annotations alone has no such record, nor has a PodGroup
    whose status was never written: neither proves anything."""
    if key not in run.group_objects or _reached_min_member(run, gang, key):
        return False
    return podfacts.status(run.group_objects[key]).get("phase") in NEVER_SATISFIED_PHASES


def _evict_partial_gang(run: _Pass, gang: Gang, message: str) -> None:
    """Strict mode, on timeout: a gang group that never reached minMember in every one of its
    PodGroups must not run in part; its bound members are evicted (GangIncomplete), the
    members of every PodGroup of the group alike. Fail closed: a Running member is evicted
    only when a PodGroup's status proves the group never reached minMember; a gang that may
    have been satisfied (annotations only, or no status yet) keeps its running members, as
    Koordinator, whose gangs once satisfied stay so, never evicts one."""
    if all(_reached_min_member(run, gang, key) for key in gang.keys):
        return
    proven = any(_proven_never_satisfied(run, gang, key) for key in gang.keys)
    partial = [
        p
        for p in gang.bound
        if not podfacts.is_deleting(p) and (proven or podfacts.phase_of(p) != "Running")
    ]
    if not partial:
        return
    text = f"gang {gang.id} could not place the rest of its members: {message}"
    for pod in partial:
        run.plan.actions.append(Disrupt(ref_of(pod), "GangIncomplete", text, run.now_text))
    run.plan.actions.append(
        Decision(
            gang.keys,
            "gang-evicted",
            "GangIncomplete",
            text,
            victims=tuple(f"{fields.namespace_of(p)}/{fields.name_of(p)}" for p in partial),
        )
    )


def _group_statuses(
    run: _Pass,
    specs: Mapping[GroupKey, PodGroupSpec],
    objects: Mapping[GroupKey, Obj],
    members: Mapping[GroupKey, list[Obj]],
) -> None:
    for key, obj in sorted(objects.items(), key=lambda item: str(item[0])):
        spec = specs.get(key)
        if spec is None:
            continue
        previous = podfacts.status(obj)
        wanted = pod_group_status(
            spec.min_member,
            members.get(key, []),
            previous,
            run.state.now,
            restart=key in run.restarted,
        )
        if status_differs(wanted, previous):
            run.plan.actions.append(UpdateGroupStatus(key, spec.uid, wanted))


# The figures of the last tree (domains by layer, detailStatus): the tree is memoised, so
# they are worked out again only when it changes. The detailStatus goes out in actions as
# it is: read only.
_LAST_FIGURES: list[tuple[TopologyTree, dict[str, int], list[dict[str, Any]]]] = []


def _tree_figures(tree: TopologyTree) -> tuple[dict[str, int], list[dict[str, Any]]]:
    if _LAST_FIGURES and _LAST_FIGURES[0][0] is tree:
        return _LAST_FIGURES[0][1], _LAST_FIGURES[0][2]
    counts: dict[str, int] = {}
    for domain in tree.all_domains():
        layer = tree.spec.layer_name(domain.depth)
        counts[layer] = counts.get(layer, 0) + 1
    wanted = detail_status(tree)
    _LAST_FIGURES[:] = [(tree, counts, wanted)]
    return counts, wanted


def _topology_status(run: _Pass) -> None:
    counts, wanted = _tree_figures(run.tree)
    run.plan.domains_by_layer = dict(counts)
    if run.topology is None or run.topology_error:
        return
    if podfacts.status(run.topology).get("detailStatus") != wanted:
        run.plan.actions.append(
            UpdateTopologyStatus(fields.name_of(run.topology), fields.uid_of(run.topology), wanted)
        )
