"""The inter-pod filters of kube-scheduler that a placement of ours honours too, and what a
pod may ask that the placer does not check (such a pod is refused, never misplaced).

- hostPort (upstream NodePorts): two pods conflict on a node when a container port of each
  has the same hostPort and protocol (TCP when unset) and their hostIPs overlap (unset or
  0.0.0.0 overlaps every address). Upstream reads `containers`; sidecars (init containers
  with restartPolicy Always) listen as long, so their hostPorts count here too.
- required inter-pod affinity (upstream InterPodAffinity): for every term the node's domain
  (its value of topologyKey; a node without that label fails) holds a pod matching all of the
  pod's required affinity terms; when no pod anywhere matches them and the pod matches its
  own terms it may be the first of its kind and goes anywhere with the keys.
- required inter-pod anti-affinity: no pod matching a term in the node's domain, and
  symmetrically no pod already there whose own required anti-affinity term matches the
  incoming pod.
- topologySpreadConstraints with whenUnsatisfiable DoNotSchedule (upstream PodTopologySpread):
  on the node's domain, matching pods + the pod itself (when it matches) - the fewest
  matching pods of any eligible domain must not exceed maxSkew; the fewest is 0 while there
  are fewer eligible domains than minDomains. Matching pods are the pod's namespace's pods,
  not terminating, on eligible nodes: nodes with every constraint's key that pass the pod's
  node affinity (nodeAffinityPolicy Honor, the default) and, with nodeTaintsPolicy Honor
  (default Ignore), tolerate its taints. ScheduleAnyway is a preference: not a filter.

A term's namespaces are its `namespaces`, else the pod's own namespace; an empty
namespaceSelector ({}) selects every namespace. The placer does not read Namespace objects:
a pending pod whose term has a non-empty namespaceSelector is refused; such a term of a pod
already placed is read as selecting every namespace (it repels more, never less).
matchLabelKeys / mismatchLabelKeys are merged into the selector with the pod's own values.

Pods already on a node or nominated to one (the gang's own nominations excepted: it is being
placed again) and the gang's members placed earlier in the same plan are what these rules
count. The planner uses this module three ways: `GangCheck.usable` takes off a shape's nodes
what the pods already there rule out, `GangCheck.node_cap` bounds how many members alike one
node takes (a hostPort or a per-node anti-affinity/spread they share), and
`GangCheck.violation` checks a whole placement member by member before it is nominated or
bound: what it rules out is not placed (refused, never misplaced).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Any, Protocol

from nodeflow_kube import node_affinity_matches, untolerated_taint
from nodeflow_kube.fields import labels_of, mapping, namespace_of, sequence, uid_of
from nodeflow_kube.labels import LabelSelector, Requirement, SelectorError

Obj = Mapping[str, Any]

EVERY_ADDRESS = "0.0.0.0"
HOSTNAME_LABEL = "kubernetes.io/hostname"
DO_NOT_SCHEDULE = "DoNotSchedule"
# Node labels by key: value -> node names (see GangCheck): shared by the passes while the
# nodes stay the same.
LabelIndex = dict[str, dict[str, set[str]]]


@dataclass(frozen=True, slots=True)
class HostPort:
    protocol: str
    ip: str
    port: int

    def conflicts(self, other: HostPort) -> bool:
        return (
            self.port == other.port
            and self.protocol == other.protocol
            and (self.ip == other.ip or EVERY_ADDRESS in (self.ip, other.ip))
        )

    @property
    def display(self) -> str:
        return f"{self.ip}:{self.port}/{self.protocol}"


@dataclass(frozen=True, slots=True)
class PodTerm:
    """One required (anti-)affinity term as its pod holds it. `selector` None is a nil
    labelSelector (it matches no pod); `namespaces` None is every namespace."""

    selector: LabelSelector | None
    namespaces: frozenset[str] | None
    topology_key: str
    # A non-empty namespaceSelector (read as every namespace; refused on a pending pod).
    namespace_selector: bool = False

    def matches(self, namespace: str, labels: Mapping[str, str]) -> bool:
        if self.selector is None:
            return False
        if self.namespaces is not None and namespace not in self.namespaces:
            return False
        return self.selector.matches(labels)


@dataclass(frozen=True, slots=True)
class SpreadConstraint:
    max_skew: int
    topology_key: str
    selector: LabelSelector | None
    min_domains: int
    honor_node_affinity: bool
    honor_taints: bool

    def matches(self, labels: Mapping[str, str]) -> bool:
        return self.selector is not None and self.selector.matches(labels)


@dataclass(frozen=True, slots=True)
class PodConstraints:
    """What one pod version brings to the inter-pod filters."""

    namespace: str
    labels: tuple[tuple[str, str], ...]
    host_ports: tuple[HostPort, ...] = ()
    affinity: tuple[PodTerm, ...] = ()
    anti_affinity: tuple[PodTerm, ...] = ()
    spread: tuple[SpreadConstraint, ...] = ()
    # Why a pending pod with these constraints cannot be placed by the placer ("" if it can).
    unreadable: str = ""

    @property
    def label_map(self) -> dict[str, str]:
        return dict(self.labels)


# --- reading a pod ------------------------------------------------------------------------


def _listening_containers(pod_spec: Obj) -> Iterable[Obj]:
    yield from map(mapping, sequence(pod_spec.get("containers")))
    for container in map(mapping, sequence(pod_spec.get("initContainers"))):
        if container.get("restartPolicy") == "Always":
            yield container


def host_ports_of(pod_spec: Obj) -> tuple[HostPort, ...]:
    found: list[HostPort] = []
    for container in _listening_containers(pod_spec):
        for port in map(mapping, sequence(container.get("ports"))):
            number = port.get("hostPort")
            if isinstance(number, int) and not isinstance(number, bool) and number > 0:
                found.append(
                    HostPort(
                        str(port.get("protocol") or "TCP"),
                        str(port.get("hostIP") or EVERY_ADDRESS),
                        number,
                    )
                )
    return tuple(found)


def _merged_selector(
    raw: object, labels: Mapping[str, str], match_keys: object, mismatch_keys: object
) -> LabelSelector | None:
    """The term's labelSelector with matchLabelKeys (key in (own value)) and mismatchLabelKeys
    (key notin (own value)) merged in, as the API server merges them."""
    extra = [
        Requirement(str(key), "in", (labels[str(key)],))
        for key in sequence(match_keys)
        if str(key) in labels
    ] + [
        Requirement(str(key), "notin", (labels[str(key)],))
        for key in sequence(mismatch_keys)
        if str(key) in labels
    ]
    if raw is None:
        return LabelSelector(tuple(extra)) if extra else None
    selector = LabelSelector.from_match(raw)
    return LabelSelector(selector.requirements + tuple(extra)) if extra else selector


def _pod_term(raw: Obj, namespace: str, labels: Mapping[str, str]) -> PodTerm:
    namespaces = {str(n) for n in sequence(raw.get("namespaces"))}
    namespace_selector = raw.get("namespaceSelector")
    every = False
    unknown = False
    if isinstance(namespace_selector, Mapping):
        if namespace_selector.get("matchLabels") or namespace_selector.get("matchExpressions"):
            every = unknown = True
        else:
            every = True
    elif not namespaces:
        namespaces = {namespace}
    return PodTerm(
        selector=_merged_selector(
            raw.get("labelSelector"),
            labels,
            raw.get("matchLabelKeys"),
            raw.get("mismatchLabelKeys"),
        ),
        namespaces=None if every else frozenset(namespaces),
        topology_key=str(raw.get("topologyKey") or ""),
        namespace_selector=unknown,
    )


def _required_terms(
    affinity: Obj, kind: str, namespace: str, labels: Mapping[str, str]
) -> tuple[PodTerm, ...]:
    terms = mapping(affinity.get(kind)).get("requiredDuringSchedulingIgnoredDuringExecution")
    return tuple(_pod_term(mapping(raw), namespace, labels) for raw in sequence(terms))


def _spread(raw: Obj, labels: Mapping[str, str]) -> SpreadConstraint:
    max_skew = raw.get("maxSkew")
    min_domains = raw.get("minDomains")
    return SpreadConstraint(
        max_skew=max_skew if isinstance(max_skew, int) and max_skew > 0 else 1,
        topology_key=str(raw.get("topologyKey") or ""),
        selector=_merged_selector(
            raw.get("labelSelector"), labels, raw.get("matchLabelKeys"), None
        ),
        min_domains=min_domains if isinstance(min_domains, int) and min_domains > 0 else 1,
        honor_node_affinity=raw.get("nodeAffinityPolicy", "Honor") != "Ignore",
        honor_taints=raw.get("nodeTaintsPolicy", "Ignore") == "Honor",
    )


def _may_constrain(pod_spec: Obj) -> bool:
    """Whether the spec has any field the filters read: every pod version of the cluster is
    asked this once, and nearly all answer no."""
    if pod_spec.get("affinity") or pod_spec.get("topologySpreadConstraints"):
        return True
    for key in ("containers", "initContainers"):
        containers = pod_spec.get(key)
        if isinstance(containers, list):
            for container in containers:
                if isinstance(container, Mapping) and container.get("ports"):
                    return True
    return False


def constraints_of(pod: Obj) -> PodConstraints | None:
    """What the pod brings to the inter-pod filters, or None when nothing (most pods)."""
    pod_spec = mapping(pod.get("spec"))
    if not _may_constrain(pod_spec):
        return None
    ports = host_ports_of(pod_spec)
    affinity = mapping(pod_spec.get("affinity"))
    has_terms = any(
        mapping(affinity.get(kind)).get("requiredDuringSchedulingIgnoredDuringExecution")
        for kind in ("podAffinity", "podAntiAffinity")
    )
    spreads = [
        mapping(raw)
        for raw in sequence(pod_spec.get("topologySpreadConstraints"))
        if mapping(raw).get("whenUnsatisfiable") == DO_NOT_SCHEDULE
    ]
    if not ports and not has_terms and not spreads:
        return None
    namespace = namespace_of(pod)
    labels = {str(k): str(v) for k, v in labels_of(pod).items()}
    try:
        return PodConstraints(
            namespace=namespace,
            labels=tuple(sorted(labels.items())),
            host_ports=ports,
            affinity=_required_terms(affinity, "podAffinity", namespace, labels),
            anti_affinity=_required_terms(affinity, "podAntiAffinity", namespace, labels),
            spread=tuple(_spread(raw, labels) for raw in spreads),
        )
    except SelectorError as error:
        # A pod already placed with a selector Kubernetes would refuse repels nothing here;
        # a pending one is refused with the reason.
        return PodConstraints(
            namespace=namespace,
            labels=tuple(sorted(labels.items())),
            host_ports=ports,
            unreadable=f"a label selector of its inter-pod affinity or spread: {error}",
        )


def unsupported_reason(pod: Obj, constraints: PodConstraints | None) -> str:
    """Why the placer cannot place this pending pod without risking a wrong node: what it
    asks that the placer does not check, by field ("" when nothing)."""
    pod_spec = mapping(pod.get("spec"))
    for volume in map(mapping, sequence(pod_spec.get("volumes"))):
        # Its claim is made only once the pod is placed (PersistentVolumeClaims are read:
        # volumes.py), so its volume topology cannot be known before.
        if volume.get("ephemeral") is not None:
            return (
                f"spec.volumes[{volume.get('name')}].ephemeral: volume topology of a generic "
                "ephemeral volume is not checked by the topology placer"
            )
    if sequence(pod_spec.get("resourceClaims")):
        return (
            "spec.resourceClaims: dynamic resource allocation is not checked by the topology placer"
        )
    if constraints is None:
        return ""
    if constraints.unreadable:
        return constraints.unreadable
    for kind, terms in (
        ("podAffinity", constraints.affinity),
        ("podAntiAffinity", constraints.anti_affinity),
    ):
        if any(term.namespace_selector for term in terms):
            return (
                f"spec.affinity.{kind} namespaceSelector: the topology placer does not read "
                "Namespaces"
            )
    return ""


# --- the charged pods ---------------------------------------------------------------------


class Placed(Protocol):
    """A pod charged to a node, as the planner holds it (preemption.ChargedPod)."""

    @property
    def pod(self) -> Obj: ...

    @property
    def node(self) -> str: ...


class Charged:
    """Every pod charged to a node (bound, or nominated) as the inter-pod filters count it:
    `charged` is the pass's own table (uid -> pod and node), which the pass keeps up to date
    and tells of each change (`charge`); `constrained` are those of its pods that have
    hostPorts or required anti-affinity, which alone are indexed up front. What a term or a
    spread selector matches is worked out, over all of them, once per distinct term and pass,
    and only when a gang asks."""

    def __init__(
        self,
        charged: Mapping[str, Placed],
        constrained: Iterable[tuple[str, PodConstraints]],
        constraints_of_pod: Callable[[Obj], PodConstraints | None],
    ) -> None:
        self._charged = charged
        self._constraints = constraints_of_pod
        # uid -> (node, its host ports) of pods with host ports.
        self.ports: dict[str, tuple[str, tuple[HostPort, ...]]] = {}
        # uid -> node of pods with required anti-affinity, and each distinct term of theirs
        # -> the pods holding it (uid -> node).
        self.repelling: dict[str, str] = {}
        self.repelling_terms: dict[PodTerm, dict[str, str]] = {}
        # A term (or spread selector) -> the matching pods, uid -> node.
        self._matches: dict[object, dict[str, str]] = {}
        for uid, facts in constrained:
            item = charged.get(uid)
            if item is not None:
                self._index(uid, item.node, facts)

    def _index(self, uid: str, node: str, facts: PodConstraints | None) -> None:
        if facts is None:
            return
        if facts.host_ports:
            self.ports[uid] = (node, facts.host_ports)
        if facts.anti_affinity:
            self.repelling[uid] = node
            for term in facts.anti_affinity:
                self.repelling_terms.setdefault(term, {})[uid] = node

    def charge(self, uid: str, pod: Obj, node: str) -> None:
        """The pod is now charged to `node` (the pass nominated it)."""
        self._index(uid, node, self._constraints(pod))
        for key, found in self._matches.items():
            if _matches_key(key, pod):
                found[uid] = node

    def matching(self, key: object) -> dict[str, str]:
        """The charged pods a term or spread key (`term_key`, `spread_key`) matches."""
        found = self._matches.get(key)
        if found is None:
            found = self._matches[key] = {
                uid: item.node for uid, item in self._charged.items() if _matches_key(key, item.pod)
            }
        return found


def _matches_key(key: object, pod: Obj) -> bool:
    kind, payload = key if isinstance(key, tuple) else ("", None)
    if kind == "all-terms":
        terms: tuple[PodTerm, ...] = payload
        namespace, labels = namespace_of(pod), labels_of(pod)
        return all(term.matches(namespace, labels) for term in terms)
    if kind == "term":
        term: PodTerm = payload
        return term.matches(namespace_of(pod), labels_of(pod))
    if kind == "spread":
        namespace_, constraint = payload
        return (
            namespace_of(pod) == namespace_
            and mapping(pod.get("metadata")).get("deletionTimestamp") is None
            and constraint.matches(labels_of(pod))
        )
    return False


def all_terms_key(terms: tuple[PodTerm, ...]) -> object:
    return ("all-terms", terms)


def term_key(term: PodTerm) -> object:
    return ("term", term)


def spread_key(namespace: str, constraint: SpreadConstraint) -> object:
    return ("spread", (namespace, constraint))


# --- one gang -----------------------------------------------------------------------------


@dataclass
class _Spread:
    """One spread constraint of one pod shape: matching pods per eligible domain."""

    constraint: SpreadConstraint
    counts: dict[str, int]
    # The fewest matching pods of an eligible domain (0 below minDomains) and the domains
    # holding that few.
    lowest: int
    at_lowest: set[str]
    node_domain: Mapping[str, str]


@dataclass
class GangCheck:
    """The inter-pod filters for one gang's placement this pass (module docstring)."""

    charged: Charged
    # uids of the gang's pending members: their nominations are being placed again.
    own: AbstractSet[str]
    node_labels: Mapping[str, Mapping[str, str]]
    label_index: LabelIndex
    node_objects: Mapping[str, Obj]
    constraints_of_pod: Callable[[Obj], PodConstraints | None]
    # Members placed earlier this pass (bound or kept for binding), in order.
    placed: list[tuple[Obj, str]] = field(default_factory=list)
    _spreads: dict[object, _Spread] = field(default_factory=dict)
    _blocked_memo: dict[object, dict[str, set[str]]] = field(default_factory=dict)

    def relevant(self, pod: Obj) -> bool:
        """Whether any filter here can refuse this pod a node."""
        return self.constraints_of_pod(pod) is not None or bool(self.charged.repelling)

    def shape_key(self, pod: Obj) -> object:
        """What tells members apart for the nodes these filters leave them (None: nothing
        does): their own terms and ports, which of their terms they match themselves, and
        which terms of pods already placed match them. Not their labels as such: members
        labelled one by one (an index label) stay one shape when no term reads it."""
        facts = self.constraints_of_pod(pod)
        repelled = self._repelled_by(pod)
        if facts is None:
            return ("repelled", repelled) if repelled else None
        labels = facts.label_map
        return (
            facts.namespace,
            facts.host_ports,
            facts.affinity,
            facts.anti_affinity,
            facts.spread,
            repelled,
            tuple(term.matches(facts.namespace, labels) for term in facts.anti_affinity),
            all(term.matches(facts.namespace, labels) for term in facts.affinity),
            tuple(constraint.matches(labels) for constraint in facts.spread),
        )

    def _repelled_by(self, pod: Obj) -> frozenset[PodTerm]:
        """The required anti-affinity terms of pods already placed that match `pod`."""
        if not self.charged.repelling_terms:
            return frozenset()
        namespace, labels = namespace_of(pod), labels_of(pod)
        return frozenset(
            term
            for term, holders in self.charged.repelling_terms.items()
            if term.matches(namespace, labels) and any(uid not in self.own for uid in holders)
        )

    def _blocked(self, pod: Obj) -> dict[str, set[str]]:
        """The nodes the pods already placed rule out for `pod` by the rules members placed
        later never undo (hostPort, both anti-affinities), by rule; once per shape."""
        memo_key = self.shape_key(pod)
        found = self._blocked_memo.get(memo_key)
        if found is not None:
            return found
        facts = self.constraints_of_pod(pod)
        blocked: dict[str, set[str]] = {}
        if facts is not None and facts.host_ports:
            blocked["hostPort in use"] = {
                node
                for uid, (node, ports) in self.charged.ports.items()
                if uid not in self.own
                and any(a.conflicts(b) for a in facts.host_ports for b in ports)
            }
        repelling: set[str] = set()
        for term in self._repelled_by(pod):
            values = {
                value
                for uid, node in self.charged.repelling_terms[term].items()
                if uid not in self.own and (value := self._domain(node, term.topology_key))
            }
            for value in values:
                repelling |= self._nodes_with(term.topology_key, value)
        if repelling:
            blocked["an existing pod's required anti-affinity"] = repelling
        if facts is not None:
            repelled: set[str] = set()
            for term in facts.anti_affinity:
                for value in self._existing_domains(term_key(term), term.topology_key):
                    repelled |= self._nodes_with(term.topology_key, value)
            if repelled:
                blocked["required anti-affinity"] = repelled
        self._blocked_memo[memo_key] = blocked
        return blocked

    # -- what is there already

    def _nodes_with(self, key: str, value: str) -> set[str]:
        return self._by_label(key).get(value, set())

    def _by_label(self, key: str) -> dict[str, set[str]]:
        found = self.label_index.get(key)
        if found is None:
            found = {}
            for name, labels in self.node_labels.items():
                value = labels.get(key)
                if value is not None:
                    found.setdefault(str(value), set()).add(name)
            self.label_index[key] = found
        return found

    def _domain(self, node: str, key: str) -> str | None:
        value = self.node_labels.get(node, {}).get(key)
        return None if value is None else str(value)

    def _existing_domains(self, key: object, topology_key: str) -> dict[str, int]:
        counts: dict[str, int] = {}
        for uid, node in self.charged.matching(key).items():
            if uid in self.own:
                continue
            value = self._domain(node, topology_key)
            if value is not None:
                counts[value] = counts.get(value, 0) + 1
        return counts

    def usable(
        self, pod: Obj, nodes: AbstractSet[str], *, counted: bool = True
    ) -> tuple[set[str], dict[str, int]]:
        """`nodes` but those the pods already placed rule out for `pod`, and how many each
        rule took off (for the unschedulable message). Without `counted` only the rules that
        members placed later can never undo (hostPort, both anti-affinities): affinity and
        spread are then left to `violation`, which counts the members too."""
        facts = self.constraints_of_pod(pod)
        kept = set(nodes)
        refused: dict[str, int] = {}

        def take_off(rule: str, off: Iterable[str]) -> None:
            before = len(kept)
            kept.difference_update(off)
            if len(kept) < before:
                refused[rule] = refused.get(rule, 0) + before - len(kept)

        for rule, off in self._blocked(pod).items():
            take_off(rule, off)
        if facts is None or not counted:
            return kept, refused
        if facts.affinity:
            allowed = self._affinity_nodes(facts)
            if allowed is not None:
                take_off("required affinity", kept - allowed)
        for constraint in facts.spread:
            spread = self._spread_of(pod, facts, constraint)
            self_match = 1 if constraint.matches(facts.label_map) else 0
            allowed_nodes = {
                node
                for node in kept
                if (domain := spread.node_domain.get(node)) is not None
                and spread.counts.get(domain, 0) + self_match - spread.lowest <= constraint.max_skew
            }
            take_off("topology spread", kept - allowed_nodes)
        return kept, refused

    def _affinity_nodes(self, facts: PodConstraints) -> set[str] | None:
        """Nodes whose domains hold a pod matching all the affinity terms, for every term;
        None when no pod matches and the pod matches itself (the first of its kind may go
        wherever the nodes have every term's key)."""
        key = all_terms_key(facts.affinity)
        matching = {
            uid: node for uid, node in self.charged.matching(key).items() if uid not in self.own
        }
        if not matching and all(
            term.matches(facts.namespace, facts.label_map) for term in facts.affinity
        ):
            allowed: set[str] | None = None
            for term in facts.affinity:
                with_key = set().union(*self._by_label(term.topology_key).values())
                allowed = with_key if allowed is None else allowed & with_key
            return allowed
        allowed = None
        for term in facts.affinity:
            values = {
                value
                for node in matching.values()
                if (value := self._domain(node, term.topology_key)) is not None
            }
            nodes: set[str] = set()
            for value in values:
                nodes |= self._nodes_with(term.topology_key, value)
            allowed = nodes if allowed is None else allowed & nodes
        return allowed if allowed is not None else set()

    def _spread_of(self, pod: Obj, facts: PodConstraints, constraint: SpreadConstraint) -> _Spread:
        pod_spec = mapping(pod.get("spec"))
        memo_key = (
            facts.namespace,
            constraint,
            tuple(c.topology_key for c in facts.spread),
            repr(pod_spec.get("nodeSelector")),
            repr(mapping(pod_spec.get("affinity")).get("nodeAffinity")),
            repr(pod_spec.get("tolerations")) if constraint.honor_taints else "",
        )
        found = self._spreads.get(memo_key)
        if found is not None:
            return found
        keys = [c.topology_key for c in facts.spread]
        node_domain: dict[str, str] = {}
        selective = bool(pod_spec.get("nodeSelector") or pod_spec.get("affinity"))
        for name, labels in self.node_labels.items():
            if any(key not in labels for key in keys):
                continue
            node_object = self.node_objects[name]
            if (
                constraint.honor_node_affinity
                and selective
                and not node_affinity_matches(pod_spec, node_object)
            ):
                continue
            if constraint.honor_taints and untolerated_taint(pod_spec, node_object) is not None:
                continue
            node_domain[name] = str(labels[constraint.topology_key])
        counts = dict.fromkeys(node_domain.values(), 0)
        for uid, where in self.charged.matching(spread_key(facts.namespace, constraint)).items():
            domain = node_domain.get(where)
            if uid not in self.own and domain is not None:
                counts[domain] += 1
        lowest = min(counts.values(), default=0)
        if len(counts) < constraint.min_domains:
            lowest = 0
        found = self._spreads[memo_key] = _Spread(
            constraint,
            counts,
            lowest,
            {d for d, c in counts.items() if c == lowest},
            node_domain,
        )
        return found

    def gathering_keys(self, pod: Obj) -> tuple[str, ...]:
        """The topology keys of the pod's required affinity terms when it is the first of
        its kind (no pod placed matches them, it matches them itself): the members alike
        must then share one domain of each key with it (the planner gathers them there)."""
        facts = self.constraints_of_pod(pod)
        if facts is None or not facts.affinity:
            return ()
        matching = self.charged.matching(all_terms_key(facts.affinity))
        if any(uid not in self.own for uid in matching) or not all(
            term.matches(facts.namespace, facts.label_map) for term in facts.affinity
        ):
            return ()
        return tuple(term.topology_key for term in facts.affinity)

    def node_cap(self, pod: Obj) -> Callable[[str], int] | None:
        """How many members alike (`pod`'s shape) one node may take, when these filters bound
        it: 1 when their hostPorts conflict with each other or a required anti-affinity term
        they match has one node per domain; a spread over one node per domain leaves
        maxSkew + fewest - already there. None when nothing bounds it."""
        facts = self.constraints_of_pod(pod)
        if facts is None:
            return None
        labels = facts.label_map
        one = any(a.conflicts(b) for a in facts.host_ports for b in facts.host_ports) or any(
            self._per_node(term.topology_key) and term.matches(facts.namespace, labels)
            for term in facts.anti_affinity
        )
        spreads = [
            self._spread_of(pod, facts, c)
            for c in facts.spread
            if self._per_node(c.topology_key) and c.matches(labels)
        ]
        if not one and not spreads:
            return None

        def cap(node: str) -> int:
            limit = 1 if one else 1 << 30
            for spread in spreads:
                domain = spread.node_domain.get(node)
                room = (
                    0
                    if domain is None
                    else spread.lowest + spread.constraint.max_skew - spread.counts.get(domain, 0)
                )
                limit = min(limit, max(0, room))
            return limit

        return cap

    def _per_node(self, key: str) -> bool:
        """Whether every domain of the label `key` is a single node (the hostname)."""
        return key == HOSTNAME_LABEL or all(
            len(nodes) == 1 for nodes in self._by_label(key).values()
        )

    # -- a whole placement

    def violation(self, assignments: Sequence[tuple[Obj, str]]) -> str | None:
        """Why placing these members on these nodes, in this order after `placed`, breaks a
        filter (naming the pod, the node and the rule), or None."""
        done = _Done(self._domain)
        for pod, node in self.placed:
            done.add(pod, node, self.constraints_of_pod(pod))
        for pod, node in assignments:
            facts = self.constraints_of_pod(pod)
            why = self._refusal(pod, node, facts, done)
            if why is not None:
                return f"pod {_name(pod)} on node {node}: {why}"
            done.add(pod, node, facts)
        return None

    def _by_domain(self, topology_key: str) -> Callable[[str], str | None]:
        return lambda node: self._domain(node, topology_key)

    def _refusal(
        self, pod: Obj, node: str, facts: PodConstraints | None, done: _Done
    ) -> str | None:
        for rule, off in self._blocked(pod).items():
            if node in off:
                return f"{rule} (a pod already placed)"
        if done.repelling:
            namespace, labels = namespace_of(pod), labels_of(pod)
            for term, by_value in done.repelling.items():
                here = self._domain(node, term.topology_key)
                if here in by_value and term.matches(namespace, labels):
                    return f"member {by_value[here]}'s required anti-affinity ({term.topology_key})"
        if facts is None:
            return None
        for other, ports in done.ports.get(node, ()):
            if any(a.conflicts(b) for a in facts.host_ports for b in ports):
                return f"hostPort conflict with member {other} ({facts.host_ports[0].display})"
        for term in facts.anti_affinity:
            here = self._domain(node, term.topology_key)
            members = done.by_domain(
                term_key(term), term.topology_key, self._by_domain(term.topology_key)
            )
            if here is not None and members.get(here):
                return (
                    f"required anti-affinity ({term.topology_key}) with member {members[here][0]}"
                )
        if facts.affinity and not self._affinity_holds(node, facts, done):
            return "required affinity not satisfied in the node's domain"
        for constraint in facts.spread:
            skew = self._skew(pod, node, facts, constraint, done)
            if skew is not None:
                return skew
        return None

    def _affinity_holds(self, node: str, facts: PodConstraints, done: _Done) -> bool:
        key = all_terms_key(facts.affinity)
        existing = [n for uid, n in self.charged.matching(key).items() if uid not in self.own]
        values = [self._domain(node, term.topology_key) for term in facts.affinity]
        if any(value is None for value in values):
            return False
        members = [
            done.by_domain(key, term.topology_key, self._by_domain(term.topology_key))
            for term in facts.affinity
        ]
        if not existing and not any(members):
            return all(term.matches(facts.namespace, facts.label_map) for term in facts.affinity)
        return all(
            bool(found.get(str(value)))
            or any(self._domain(other, term.topology_key) == value for other in existing)
            for term, value, found in zip(facts.affinity, values, members, strict=True)
        )

    def _skew(
        self,
        pod: Obj,
        node: str,
        facts: PodConstraints,
        constraint: SpreadConstraint,
        done: _Done,
    ) -> str | None:
        spread = self._spread_of(pod, facts, constraint)
        domain = spread.node_domain.get(node)
        if domain is None:
            return f"topology spread: node not eligible for {constraint.topology_key}"
        members = done.by_domain(
            spread_key(facts.namespace, constraint), id(spread), spread.node_domain.get
        )
        lowest = spread.lowest
        # The fewest rises only once members sit in every domain that had the fewest.
        if (
            len(spread.counts) >= constraint.min_domains
            and len(members) >= len(spread.at_lowest)
            and all(d in members for d in spread.at_lowest)
        ):
            lowest = min(spread.counts[d] + len(members.get(d, ())) for d in spread.counts)
        self_match = 1 if constraint.matches(facts.label_map) else 0
        skew = spread.counts.get(domain, 0) + len(members.get(domain, ())) + self_match - lowest
        if skew > constraint.max_skew:
            return (
                f"topology spread ({constraint.topology_key}) skew {skew} > maxSkew "
                f"{constraint.max_skew}"
            )
        return None


class _Done:
    """The members placed so far in one check, indexed as the next one asks, so a gang of a
    thousand members is checked in near-linear time: their hostPorts by node, their
    anti-affinity terms by domain, and per term or spread selector the members it matches by
    domain (made when first asked, kept up to date as members are added)."""

    def __init__(self, label_of: Callable[[str, str], str | None]) -> None:
        # A node's value of a label key: the domain of a term's topologyKey.
        self._label_of = label_of
        self.repelling: dict[PodTerm, dict[str, str]] = {}
        self.ports: dict[str, list[tuple[str, tuple[HostPort, ...]]]] = {}
        self._all: list[tuple[Obj, str]] = []
        self._domains: dict[
            tuple[object, object], tuple[object, Callable[[str], str | None], dict[str, list[str]]]
        ] = {}

    def add(self, pod: Obj, node: str, facts: PodConstraints | None) -> None:
        self._all.append((pod, node))
        name = _name(pod)
        if facts is not None:
            for term in facts.anti_affinity:
                value = self._label_of(node, term.topology_key)
                if value is not None:
                    self.repelling.setdefault(term, {}).setdefault(value, name)
            if facts.host_ports:
                self.ports.setdefault(node, []).append((name, facts.host_ports))
        for key, domain_of, found in self._domains.values():
            if _matches_key(key, pod):
                value = domain_of(node)
                if value is not None:
                    found.setdefault(value, []).append(name)

    def by_domain(
        self, key: object, domain_id: object, domain_of: Callable[[str], str | None]
    ) -> dict[str, list[str]]:
        """The members `key` matches, by their domain (`domain_of` their node)."""
        entry = self._domains.get((key, domain_id))
        if entry is None:
            found: dict[str, list[str]] = {}
            for pod, node in self._all:
                if _matches_key(key, pod):
                    value = domain_of(node)
                    if value is not None:
                        found.setdefault(value, []).append(_name(pod))
            entry = self._domains[(key, domain_id)] = (key, domain_of, found)
        return entry[2]


def _name(pod: Obj) -> str:
    return str(mapping(pod.get("metadata")).get("name") or uid_of(pod))
