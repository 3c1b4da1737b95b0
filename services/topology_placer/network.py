"""ClusterNetworkTopology: the layer hierarchy, the domain tree built from node labels, and the
`status.detailStatus` the placer keeps true as nodes come and go.

Domains are keyed by their whole path from the root (("s1", "b2") is block b2 under spine
s1), so two blocks both labelled "b1" under different spines stay two domains; Koordinator
indexes them by (layer, name) and merges them. A node missing the label of some layer hangs
from the deepest domain it does have labels for: it still counts for the cluster and the
layers above the gap, never for a domain it does not belong to.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

Obj = Mapping[str, Any]

CLUSTER_LAYER = "ClusterTopologyLayer"
NODE_LAYER = "NodeTopologyLayer"
DEFAULT_TOPOLOGY_NAME = "default"


class TopologySpecError(ValueError):
    """The ClusterNetworkTopology's layers do not form one chain from the cluster to nodes."""


@dataclass(frozen=True)
class Layer:
    name: str
    label_keys: tuple[str, ...]


@dataclass(frozen=True)
class TopologySpec:
    """Layers between the cluster root and the nodes, top first (neither built-in included)."""

    layers: tuple[Layer, ...]

    def depth_of(self, layer: str) -> int | None:
        """Depth of a layer: 0 the cluster, 1.. the listed layers, len+1 the nodes. Layer
        names compare case-insensitively (the reference writes both "SpineLayer" and
        "spineLayer")."""
        wanted = layer.lower()
        if wanted == CLUSTER_LAYER.lower():
            return 0
        if wanted == NODE_LAYER.lower():
            return len(self.layers) + 1
        for position, candidate in enumerate(self.layers):
            if candidate.name.lower() == wanted:
                return position + 1
        return None

    def layer_name(self, depth: int) -> str:
        if depth == 0:
            return CLUSTER_LAYER
        if depth > len(self.layers):
            return NODE_LAYER
        return self.layers[depth - 1].name


def parse_topology(obj: Obj | None) -> TopologySpec:
    """`spec.networkTopologySpec` as a chain. No object: a flat cluster of nodes."""
    if obj is None:
        return TopologySpec(layers=())
    spec = obj.get("spec")
    entries = spec.get("networkTopologySpec") if isinstance(spec, Mapping) else None
    if not isinstance(entries, list):
        return TopologySpec(layers=())
    children: dict[str, Obj] = {}
    for entry in entries:
        if not isinstance(entry, Mapping) or not entry.get("topologyLayer"):
            raise TopologySpecError(f"networkTopologySpec entry without topologyLayer: {entry!r}")
        parent = str(entry.get("parentTopologyLayer") or CLUSTER_LAYER)
        if parent in children:
            raise TopologySpecError(
                f"layers {children[parent]['topologyLayer']} and {entry['topologyLayer']} "
                f"both have parent {parent}: the hierarchy must be one chain"
            )
        children[parent] = entry
    layers: list[Layer] = []
    current = CLUSTER_LAYER
    while current in children:
        entry = children.pop(current)
        current = str(entry["topologyLayer"])
        if current == NODE_LAYER:
            break
        keys = entry.get("labelKey")
        label_keys = tuple(str(k) for k in keys) if isinstance(keys, list) else ()
        if not label_keys:
            raise TopologySpecError(f"layer {current} has no labelKey")
        layers.append(Layer(name=current, label_keys=label_keys))
    if children:
        orphans = sorted(str(e["topologyLayer"]) for e in children.values())
        raise TopologySpecError(f"layers not reachable from {CLUSTER_LAYER}: {', '.join(orphans)}")
    return TopologySpec(layers=tuple(layers))


DomainPath = tuple[str, ...]


@dataclass
class Domain:
    """One topology domain: the root (path ()), a layer value under its parents, or a node
    (its path ends with the node name and `node` is set)."""

    path: DomainPath
    depth: int
    children: dict[str, Domain] = field(default_factory=dict)
    node: str | None = None
    node_count: int = 0
    # Position in TopologyTree.order: per-domain figures live in lists indexed by it.
    index: int = 0

    @property
    def display(self) -> str:
        return "/".join(self.path) if self.path else "cluster"


@dataclass(frozen=True)
class SumOrder:
    leaf_indexes: list[int]
    leaf_names: list[str]
    node_depth: int
    # (index, depth, children's indexes) of every non-node domain, parents first.
    inner_top_down: list[tuple[int, int, tuple[int, ...]]]


@dataclass
class TopologyTree:
    spec: TopologySpec
    root: Domain
    # Node name -> its leaf domain.
    leaves: dict[str, Domain]
    # Every domain, parents before children (Domain.index is the position here).
    order: list[Domain] = field(default_factory=list)
    _sum_order: SumOrder | None = field(default=None, init=False, repr=False, compare=False)

    def sum_order(self) -> SumOrder:
        """The tree as index lists for summing figures bottom-up (worked out once per tree:
        a gather over 16k nodes walks these instead of the Domain objects)."""
        if self._sum_order is None:
            leaves = [d for d in self.order if d.node is not None]
            inner = [
                (d.index, d.depth, tuple(c.index for c in d.children.values()))
                for d in self.order
                if d.node is None
            ]
            self._sum_order = SumOrder(
                leaf_indexes=[d.index for d in leaves],
                leaf_names=[d.node or "" for d in leaves],
                node_depth=len(self.spec.layers) + 1,
                inner_top_down=inner,
            )
        return self._sum_order

    def domains_at(self, depth: int) -> list[Domain]:
        found: list[Domain] = []
        frontier = [self.root]
        while frontier:
            domain = frontier.pop()
            if domain.depth == depth:
                found.append(domain)
            elif domain.depth < depth:
                frontier.extend(domain.children.values())
        return sorted(found, key=lambda d: d.path)

    def find(self, path: DomainPath) -> Domain | None:
        domain: Domain | None = self.root
        for part in path:
            domain = None if domain is None else domain.children.get(part)
        return domain

    def all_domains(self) -> Iterable[Domain]:
        frontier = [self.root]
        while frontier:
            domain = frontier.pop()
            yield domain
            frontier.extend(domain.children.values())


def node_path(spec: TopologySpec, labels: Mapping[str, Any]) -> DomainPath:
    """The node's layer values top-down, stopping at the first layer it has no label for."""
    path: list[str] = []
    for layer in spec.layers:
        value = next((str(labels[k]) for k in layer.label_keys if labels.get(k)), None)
        if value is None:
            break
        path.append(value)
    return tuple(path)


def build_tree(spec: TopologySpec, nodes: Iterable[tuple[str, Mapping[str, Any]]]) -> TopologyTree:
    """The domain tree of `(node name, node labels)`, nodes in name order under each domain."""
    return build_tree_from_paths(spec, [(name, node_path(spec, labels)) for name, labels in nodes])


def build_tree_from_paths(
    spec: TopologySpec, paths: Iterable[tuple[str, DomainPath]]
) -> TopologyTree:
    """The domain tree of `(node name, node_path)`, nodes in name order under each domain."""
    root = Domain(path=(), depth=0)
    leaves: dict[str, Domain] = {}
    node_depth = len(spec.layers) + 1
    for name, path in sorted(paths):
        domain = root
        root.node_count += 1
        for value in path:
            child = domain.children.get(value)
            if child is None:
                child = Domain(path=(*domain.path, value), depth=domain.depth + 1)
                domain.children[value] = child
            child.node_count += 1
            domain = child
        leaf = Domain(path=(*domain.path, name), depth=node_depth, node=name, node_count=1)
        domain.children[name] = leaf
        leaves[name] = leaf
    order: list[Domain] = []
    frontier = [root]
    while frontier:
        current = frontier.pop()
        current.index = len(order)
        order.append(current)
        frontier.extend(current.children.values())
    return TopologyTree(spec=spec, root=root, leaves=leaves, order=order)


def detail_status(tree: TopologyTree) -> list[dict[str, Any]]:
    """`status.detailStatus`: one entry per non-node domain in depth-first pre-order (a
    domain, then each child's subtree in path order), as the CRD describes it and as the
    reference example lists it (`childTopologyNames` omitted when the children are nodes)."""
    entries: list[dict[str, Any]] = []
    # A stack: children pushed in reverse so the first child's subtree comes out next.
    frontier: list[Domain] = [tree.root]
    while frontier:
        domain = frontier.pop()
        if domain.node is not None:
            continue
        layer = tree.spec.layer_name(domain.depth)
        entry: dict[str, Any] = {
            "topologyInfo": {
                "topologyLayer": layer,
                "topologyName": domain.path[-1] if domain.path else "",
            },
            "nodeNum": domain.node_count,
        }
        if domain.depth > 0:
            entry["parentTopologyInfo"] = {
                "topologyLayer": tree.spec.layer_name(domain.depth - 1),
                "topologyName": domain.path[-2] if len(domain.path) > 1 else "",
            }
        children = sorted(domain.children.values(), key=lambda d: d.path)
        group_children = [c for c in children if c.node is None]
        entry["childTopologyLayer"] = tree.spec.layer_name(domain.depth + 1)
        if group_children:
            entry["childTopologyNames"] = [c.path[-1] for c in group_children]
        entries.append(entry)
        frontier.extend(reversed(group_children))
    return entries


def layer_names(spec: TopologySpec) -> Sequence[str]:
    return [layer.name for layer in spec.layers]
