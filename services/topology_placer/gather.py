"""The topology gather: which nodes a whole gang goes to, and which rank to which node.

1. Offer slots per node are summed up the domain tree; a layer's `podCountMultiple` floors
   the slots of its domains to a multiple (a domain that can take 7 pods of a gang placed in
   fours offers 4), and no domain offers more than the domain it lies in.
2. MustGather at a layer restricts the search to that layer's domains (the deepest such
   layer when several are listed); nothing fitting there means unschedulable.
3. Within the scope, the deepest domain that fits the whole gang wins: layers are tried from
   the nodes upwards, so a PreferGather gang lands in one block when one block can take it
   and falls back to a spine, then to the cluster, layer by layer. A gang with no gather
   rule is placed across the whole cluster.
4. Among the domains of the winning layer: the tightest fit (fewest spare slots, binpack),
   then the domain already holding most of the job's pods, then the path.
5. Inside the winner, children are filled largest-first, so the gang uses as few domains as
   it can at every level.
6. Pods in rank order (network-topology-index, then unindexed by name in natural order) go
   to the nodes in fill order, so every domain holds a contiguous run of ranks and
   neighbouring ranks share the lowest domain possible.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from topology_placer.gang import GatherRule
from topology_placer.network import Domain, DomainPath, TopologyTree


@dataclass(frozen=True)
class Placement:
    # (pod name, node name) in rank order.
    assignments: tuple[tuple[str, str], ...]
    domain: DomainPath
    layer: str

    @property
    def node_of(self) -> dict[str, str]:
        return dict(self.assignments)


@dataclass(frozen=True)
class NoFit:
    """Why no domain takes the gang, in numbers."""

    message: str
    desired: int
    best_domain: str
    best_slots: int


@dataclass
class DomainSlots:
    """Offer slots and the job's existing pods of every domain, indexed by Domain.index."""

    slots: list[int]
    existing: list[int]


def sum_slots(
    tree: TopologyTree,
    node_slots: Mapping[str, int],
    existing: Mapping[str, int],
    multiples: Mapping[int, int],
) -> DomainSlots:
    """Offer slots and the job's existing pods of every domain, bottom-up; `multiples` maps a
    depth to its podCountMultiple."""
    count = len(tree.order)
    shape = tree.sum_order()
    slots = [0] * count
    held = [0] * count
    values = [node_slots.get(name, 0) for name in shape.leaf_names]
    node_multiple = multiples.get(shape.node_depth, 1)
    if node_multiple > 1:
        values = [value - value % node_multiple for value in values]
    for index, value in zip(shape.leaf_indexes, values, strict=True):
        slots[index] = value
    if existing:
        for index, name in zip(shape.leaf_indexes, shape.leaf_names, strict=True):
            held[index] = existing.get(name, 0)
    # Children have higher indexes than their parents: bottom-up is the reverse order.
    for index, depth, children in reversed(shape.inner_top_down):
        raw = sum(map(slots.__getitem__, children))
        multiple = multiples.get(depth, 1)
        slots[index] = raw - raw % multiple if multiple > 1 else raw
        if existing:
            held[index] = sum(map(held.__getitem__, children))
    if multiples:
        # A domain inside a floored one offers no more than it: a node of a block that offers
        # 2 cannot take 3 pods of the gang by itself. Top-down, parents before children.
        for index, _, children in shape.inner_top_down:
            cap = slots[index]
            for child in children:
                if slots[child] > cap:
                    slots[child] = cap
    return DomainSlots(slots=slots, existing=held)


def _within(domain: Domain, depth: int) -> list[Domain]:
    found: list[Domain] = []
    frontier = [domain]
    while frontier:
        current = frontier.pop()
        if current.depth == depth:
            found.append(current)
        elif current.depth < depth:
            frontier.extend(current.children.values())
    return found


def _fitting(domain: Domain, depth: int, sums: DomainSlots, desired: int) -> list[Domain]:
    """The domains at `depth` under `domain` that offer `desired` slots. No domain offers
    more than its parent (sums, then the cap of floored ones), so a subtree that offers
    fewer is never walked: a 1,024-pod gang never visits a node."""
    found: list[Domain] = []
    frontier = [domain]
    slots = sums.slots
    while frontier:
        current = frontier.pop()
        if slots[current.index] < desired:
            continue
        if current.depth == depth:
            found.append(current)
        elif current.depth < depth:
            frontier.extend(current.children.values())
    return found


def _fill(domain: Domain, count: int, sums: DomainSlots, out: list[str]) -> None:
    """Append `count` node names to `out`, filling children largest-first."""
    if domain.node is not None:
        out.extend([domain.node] * count)
        return
    children = sorted(
        domain.children.values(),
        key=lambda child: (-sums.slots[child.index], -sums.existing[child.index], child.path),
    )
    remaining = count
    for child in children:
        if remaining == 0:
            break
        take = min(sums.slots[child.index], remaining)
        if take > 0:
            _fill(child, take, sums, out)
            remaining -= take


def gather(
    tree: TopologyTree,
    pods_in_rank_order: Sequence[str],
    rules: Sequence[GatherRule],
    node_slots: Mapping[str, int],
    existing: Mapping[str, int] | None = None,
    within: DomainPath | None = None,
) -> Placement | NoFit:
    """Place every pod of the gang, or say in numbers why it cannot be placed.

    `within` confines the search to one domain (the rest of a partly bound gang stays in the
    domain of its bound members; a preemption plan is costed domain by domain).
    """
    desired = len(pods_in_rank_order)
    spec = tree.spec
    multiples: dict[int, int] = {}
    must_depth: int | None = None
    must_layer = ""
    for rule in rules:
        depth = spec.depth_of(rule.layer)
        if depth is None:
            known = ", ".join(layer.name for layer in spec.layers) or "none"
            return NoFit(
                message=f"gather layer {rule.layer} is not in ClusterNetworkTopology "
                f"(layers: {known})",
                desired=desired,
                best_domain="",
                best_slots=0,
            )
        multiples[depth] = max(multiples.get(depth, 1), rule.pod_count_multiple)
        if rule.strategy == "MustGather" and (must_depth is None or depth > must_depth):
            must_depth, must_layer = depth, spec.layer_name(depth)
    sums = sum_slots(tree, node_slots, existing or {}, multiples)
    scope = [tree.root] if must_depth is None else _within(tree.root, must_depth)
    highest = 0 if must_depth is None else must_depth
    if within is not None:
        confined = tree.find(within)
        if confined is None:
            scope = []
        elif confined.depth >= highest:
            scope, highest = [confined], confined.depth
        else:
            scope = [d for d in scope if d.path[: len(within)] == within]
    node_depth = len(spec.layers) + 1
    lowest = node_depth if rules or within is not None else highest
    for depth in range(lowest, highest - 1, -1):
        candidates = [domain for top in scope for domain in _fitting(top, depth, sums, desired)]
        if not candidates:
            continue
        winner = min(
            candidates,
            key=lambda d: (sums.slots[d.index], -sums.existing[d.index], d.path),
        )
        nodes: list[str] = []
        _fill(winner, desired, sums, nodes)
        return Placement(
            assignments=tuple(zip(pods_in_rank_order, nodes, strict=True)),
            domain=winner.path,
            layer=spec.layer_name(depth),
        )
    best = min(scope, key=lambda d: (-sums.slots[d.index], d.path), default=tree.root)
    best_slots = sums.slots[best.index]
    if must_depth is not None:
        message = (
            f"MustGather {must_layer}: no {must_layer} domain offers {desired} slots; "
            f"best {best.display} offers {best_slots}"
        )
    elif within is not None:
        message = (
            f"no domain within {best.display}, where the gang's bound pods are, offers "
            f"{desired} slots; it offers {best_slots}"
        )
    else:
        message = f"no topology domain offers {desired} slots; the cluster offers {best_slots}"
    return NoFit(message=message, desired=desired, best_domain=best.display, best_slots=best_slots)
