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
   then the domain already holding most of the job's pods; still tied, the same two figures
   of their parents, then grandparents (Koordinator compares candidates ancestor by
   ancestor), so of two equal blocks the one in the fuller spine is taken and the emptier
   spine stays whole for a larger gang; then the path.
5. Inside the winner, children are filled largest-first, so the gang uses as few domains as
   it can at every level.
6. Pods in rank order (network-topology-index, then unindexed by name in natural order) go
   to the nodes in fill order, so every domain holds a contiguous run of ranks and
   neighbouring ranks share the lowest domain possible.
7. A gang of several pod shapes takes a domain only when its nodes take every member, each
   by its own request and filters: first fit, and when first fit misses, an exact search
   bounded in steps (`_pack`); a domain whose search reaches the bound takes nothing.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterable, Iterator, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass

from topology_placer.fit import slots_in
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


def _by_ancestors(
    tree: TopologyTree, domain: Domain, sums: DomainSlots
) -> tuple[list[tuple[int, int]], DomainPath]:
    """Rule 4's tie-break: the slots and existing pods of the domain's parent, grandparent,
    ..., nearest first, then its path."""
    figures: list[tuple[int, int]] = []
    for cut in range(len(domain.path) - 1, -1, -1):
        ancestor = tree.find(domain.path[:cut])
        if ancestor is not None:
            figures.append((sums.slots[ancestor.index], -sums.existing[ancestor.index]))
    return figures, domain.path


def _tightest(tree: TopologyTree, candidates: Sequence[Domain], sums: DomainSlots) -> Domain:
    """Rule 4: the candidate with the fewest slots, then the most existing pods; ties broken
    by the ancestors' figures, nearest first, then the path. The ancestors are looked up only
    for the tied few (a one-pod gang may have every node of the cluster as a candidate)."""
    slots, existing = sums.slots, sums.existing
    best = min((slots[d.index], -existing[d.index]) for d in candidates)
    tied = [d for d in candidates if (slots[d.index], -existing[d.index]) == best]
    if len(tied) == 1:
        return tied[0]
    return min(tied, key=lambda d: _by_ancestors(tree, d, sums))


def _in_rule_4_order(
    tree: TopologyTree, candidates: Sequence[Domain], sums: DomainSlots
) -> list[Domain]:
    """Every candidate, best first by rule 4 (what `_tightest` picks comes first)."""
    return sorted(
        candidates,
        key=lambda d: (sums.slots[d.index], -sums.existing[d.index], _by_ancestors(tree, d, sums)),
    )


@dataclass(frozen=True)
class _Rules:
    """The gather rules read against the tree: podCountMultiple by depth and the deepest
    MustGather layer."""

    multiples: dict[int, int]
    must_depth: int | None
    must_layer: str


def _read_rules(tree: TopologyTree, rules: Sequence[GatherRule], desired: int) -> _Rules | NoFit:
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
    return _Rules(multiples, must_depth, must_layer)


def _scope(tree: TopologyTree, read: _Rules, within: DomainPath | None) -> tuple[list[Domain], int]:
    """Rules 2 and `within`: the domains the search stays inside and their depth."""
    scope = [tree.root] if read.must_depth is None else _within(tree.root, read.must_depth)
    highest = 0 if read.must_depth is None else read.must_depth
    if within is not None:
        confined = tree.find(within)
        if confined is None:
            scope = []
        elif confined.depth >= highest:
            scope, highest = [confined], confined.depth
        else:
            scope = [d for d in scope if d.path[: len(within)] == within]
    return scope, highest


def _no_fit(
    read: _Rules,
    scope: Sequence[Domain],
    sums: DomainSlots,
    desired: int,
    within: DomainPath | None,
    root: Domain,
    what: str = "",
) -> NoFit:
    best = min(scope, key=lambda d: (-sums.slots[d.index], d.path), default=root)
    best_slots = sums.slots[best.index]
    wanted = what or f"{desired} slots"
    if read.must_depth is not None:
        layer = read.must_layer
        message = (
            f"MustGather {layer}: no {layer} domain offers {wanted}; "
            f"best {best.display} offers {best_slots}"
        )
    elif within is not None:
        message = (
            f"no domain within {best.display}, where the gang's bound pods are, offers "
            f"{wanted}; it offers {best_slots}"
        )
    else:
        message = f"no topology domain offers {wanted}; the cluster offers {best_slots}"
    return NoFit(message=message, desired=desired, best_domain=best.display, best_slots=best_slots)


def gather(
    tree: TopologyTree,
    pods_in_rank_order: Sequence[str],
    rules: Sequence[GatherRule],
    node_slots: Mapping[str, int],
    existing: Mapping[str, int] | None = None,
    within: DomainPath | None = None,
) -> Placement | NoFit:
    """Place every pod of a gang whose members all ask alike, or say in numbers why not.

    `within` confines the search to one domain (the rest of a partly bound gang stays in the
    domain of its bound members; a preemption plan is costed domain by domain).
    """
    desired = len(pods_in_rank_order)
    read = _read_rules(tree, rules, desired)
    if isinstance(read, NoFit):
        return read
    sums = sum_slots(tree, node_slots, existing or {}, read.multiples)
    scope, highest = _scope(tree, read, within)
    node_depth = len(tree.spec.layers) + 1
    lowest = node_depth if rules or within is not None else highest
    placed = _place(tree, pods_in_rank_order, sums, scope, lowest, highest)
    return placed or _no_fit(read, scope, sums, desired, within, tree.root)


def _place(
    tree: TopologyTree,
    pods_in_rank_order: Sequence[str],
    sums: DomainSlots,
    scope: Sequence[Domain],
    lowest: int,
    highest: int,
) -> Placement | None:
    """Rules 3-6 inside `scope`, layers from `lowest` up to `highest` depth."""
    desired = len(pods_in_rank_order)
    for depth in range(lowest, highest - 1, -1):
        candidates = [domain for top in scope for domain in _fitting(top, depth, sums, desired)]
        if not candidates:
            continue
        winner = _tightest(tree, candidates, sums)
        nodes: list[str] = []
        _fill(winner, desired, sums, nodes)
        return Placement(
            assignments=tuple(zip(pods_in_rank_order, nodes, strict=True)),
            domain=winner.path,
            layer=tree.spec.layer_name(depth),
        )
    return None


def gather_within_each(
    tree: TopologyTree,
    pods_in_rank_order: Sequence[str],
    rules: Sequence[GatherRule],
    node_slots: Mapping[str, int],
    domains: Iterable[Domain],
) -> Iterator[tuple[Domain, Placement]]:
    """`gather(..., within=domain.path)` for each of `domains`, yielding those that take the
    gang: the same placements, with the slots summed up the tree once instead of once per
    domain, and a domain offering fewer slots than the gang skipped at once (nothing inside
    it offers more). A preemption plan is costed domain by domain over the whole cluster;
    this keeps that pass linear in the cluster's size."""
    desired = len(pods_in_rank_order)
    read = _read_rules(tree, rules, desired)
    if isinstance(read, NoFit):
        return
    sums = sum_slots(tree, node_slots, {}, read.multiples)
    node_depth = len(tree.spec.layers) + 1
    must_depth = 0 if read.must_depth is None else read.must_depth
    for domain in domains:
        if sums.slots[domain.index] < desired:
            continue
        if domain.depth >= must_depth:
            # What _scope answers for such a domain, without listing the MustGather layer.
            scope, highest = [domain], domain.depth
        else:
            scope, highest = _scope(tree, read, domain.path)
        placed = _place(tree, pods_in_rank_order, sums, scope, node_depth, highest)
        if placed is not None:
            yield domain, placed


# --- gangs of several pod shapes ---------------------------------------------------------


@dataclass(frozen=True)
class PodShape:
    """What the members of one shape ask of a node, and the nodes whose filters they pass."""

    request: Mapping[str, int]
    usable: AbstractSet[str]


def _fill_order(domain: Domain, sums: DomainSlots, out: list[str]) -> None:
    """Every node under `domain`, children largest-first (as _fill), depth-first."""
    if domain.node is not None:
        out.append(domain.node)
        return
    for child in sorted(
        domain.children.values(),
        key=lambda c: (-sums.slots[c.index], -sums.existing[c.index], c.path),
    ):
        if sums.slots[child.index] > 0:
            _fill_order(child, sums, out)


# How many steps the packing search may take for one gang in one gather (a step: one member
# tried on the nodes it may go to), all its candidate domains together, so one pass's worst
# case is bounded whatever the number of domains. Gangs of real jobs (a launcher or a master,
# a few parameter servers, any number of workers) take a few dozen at most; a domain whose
# search reaches the bound, or that is reached once it is spent (first fit only), is treated
# as not fitting, and the gather's message says so.
PACK_SEARCH_STEPS = 5_000


class _SearchBound(Exception):
    """The packing search took every step of its budget without an answer."""


class _SearchBudget:
    """The steps the packing search has left, shared by every domain of one gather."""

    def __init__(self, steps: int) -> None:
        self.left = steps

    def spend(self) -> None:
        self.left -= 1
        if self.left < 0:
            raise _SearchBound


def _pack(
    domain: Domain,
    members: Sequence[tuple[str, int]],
    shapes: Sequence[PodShape],
    free: Mapping[str, Mapping[str, int]],
    sums: DomainSlots,
    scarcest_first: Sequence[int],
    budget: _SearchBudget,
    gave_up: list[str] | None = None,
) -> dict[str, str] | None:
    """Every member on a node of `domain` with its own request and filters, or None. The
    shape with the least room to spare goes first (the 8-GPU workers before a CPU-only
    launcher), each shape's pods in rank order onto the nodes in fill order, first fit: a
    node's resources are taken by every pod put on it, whatever its shape.

    First fit can miss a packing (the workers take the only nodes the launcher may use while
    nodes only workers may use stay empty); then the exact search (`_search_pack`) decides,
    within what is left of `budget`. A domain whose search reaches the bound (or that is
    reached with the budget spent) is None, and its name is appended to `gave_up`: never a
    partial gang, and the caller can say why."""
    order: list[str] = []
    _fill_order(domain, sums, order)
    placed = _first_fit(order, members, shapes, free, scarcest_first)
    if placed is not None:
        return placed
    try:
        return _search_pack(order, members, shapes, free, scarcest_first, budget)
    except _SearchBound:
        if gave_up is not None:
            gave_up.append(domain.display)
        return None


def _first_fit(
    order: Sequence[str],
    members: Sequence[tuple[str, int]],
    shapes: Sequence[PodShape],
    free: Mapping[str, Mapping[str, int]],
    scarcest_first: Sequence[int],
) -> dict[str, str] | None:
    """`_pack`'s first try: shape after shape, each member on the first node in `order` its
    shape fits on now, never going back."""
    left: dict[str, dict[str, int]] = {}
    placed: dict[str, str] = {}
    for shape_index in scarcest_first:
        shape = shapes[shape_index]
        position = 0
        for name, index in members:
            if index != shape_index:
                continue
            while position < len(order):
                node = order[position]
                if node in shape.usable:
                    room = left.get(node)
                    if room is None:
                        room = left[node] = dict(free.get(node, {}))
                    if slots_in(room, {}, shape.request) > 0:
                        for resource, amount in shape.request.items():
                            room[resource] = room.get(resource, 0) - amount
                        placed[name] = node
                        break
                # A node this shape does not fit now never fits it later in this pack.
                position += 1
            else:
                return None
    return placed


@dataclass
class _NodeClass:
    """Nodes of a domain alike for the gang: the same free resources and the same shapes
    that may go there (in fill order). The search counts members per class, not per node."""

    room: Mapping[str, int]
    # The shapes that may go on its nodes and fit on an empty one.
    shapes: tuple[int, ...]
    nodes: list[str]


def _node_classes(
    order: Sequence[str],
    shapes: Sequence[PodShape],
    free: Mapping[str, Mapping[str, int]],
) -> list[_NodeClass]:
    """The domain's nodes that take a pod of some shape, grouped into classes, each class
    where its first node comes in fill order."""
    resources = sorted({r for shape in shapes for r, amount in shape.request.items() if amount > 0})
    classes: dict[tuple[tuple[int, ...], tuple[int, ...]], _NodeClass] = {}
    # Nodes alike mostly share one free dict: its figures are read once.
    seen: dict[int, tuple[tuple[int, ...], list[int]]] = {}
    for node in order:
        room = free.get(node)
        if room is None:
            continue
        known = seen.get(id(room))
        if known is None:
            known = seen[id(room)] = (
                tuple(room.get(r, 0) for r in resources),
                [slots_in(room, {}, shape.request) for shape in shapes],
            )
        figures, slots = known
        usable = tuple(i for i, shape in enumerate(shapes) if slots[i] > 0 and node in shape.usable)
        if not usable:
            continue
        key = (usable, figures)
        found = classes.get(key)
        if found is None:
            found = classes[key] = _NodeClass(room=room, shapes=usable, nodes=[])
        found.nodes.append(node)
    return list(classes.values())


@dataclass
class _Frame:
    """`_search_pack`'s stack entry: a searched member tried on its candidates in turn."""

    position: int
    # (position, hash of the loads): the state a failure is remembered by.
    state: tuple[int, int]
    candidates: Iterator[tuple[int, tuple[int, ...]]]
    # The (class, load, grown load) the member is on now, taken back before the next try.
    tried: tuple[int, tuple[int, ...], tuple[int, ...]] | None = None


def _search_pack(
    order: Sequence[str],
    members: Sequence[tuple[str, int]],
    shapes: Sequence[PodShape],
    free: Mapping[str, Mapping[str, int]],
    scarcest_first: Sequence[int],
    budget: _SearchBudget,
) -> dict[str, str] | None:
    """Every member on a node of `order` (the domain's nodes in fill order), or None when no
    packing exists; raises _SearchBound once `budget` is spent without an answer.

    Exact: the members of every shape but the most numerous (the launcher, a master) are
    put one by one, depth first, backtracking; the most numerous shape is then counted, not
    searched (once the others are placed each node takes as many of it as its room leaves,
    whatever the other nodes take). Nodes alike are one choice: the search counts, per class
    of nodes alike (`_node_classes`), how many of its nodes hold which members, and tries a
    member once per distinct (class, load), not once per node; a state that failed is not
    searched again. Each step first checks that shape by shape enough slots remain and
    resource by resource enough is free (what `_MixedSums.may_take` checks of a domain,
    here kept up to date as members are put), so a hopeless branch ends at once.

    A step costs little whatever the number of classes: the search keeps its own stack (a
    gang of thousands of members goes as deep as it has members, never into Python's
    recursion limit), a state is known by a hash updated as loads change (128 random bits
    per (class, load, count): two states share one with odds below 2**-100), and the
    loads a member may join are kept per shape as they change, never sorted per step.

    The packing found is laid out as first fit lays one out: each class's loaded nodes are
    its first in fill order, and each shape's members go in rank order onto the nodes in
    fill order, the most numerous shape's as far as each node's room goes (`_lay_out`).
    """
    classes = _node_classes(order, shapes, free)
    width = len(shapes)
    remaining = [0] * width
    for _, index in members:
        remaining[index] += 1
    bulk = max(range(width), key=lambda i: (remaining[i], -i))
    searched = [i for i in scarcest_first if i != bulk for _ in range(remaining[i])]
    # Each searched member takes a step: a search that cannot reach its last member within
    # the budget is refused at once rather than run to the bound.
    if len(searched) >= budget.left:
        raise _SearchBound
    requests = [shape.request for shape in shapes]
    resources = sorted({r for request in requests for r, amount in request.items() if amount > 0})
    empty = (0,) * width
    # The slot counts the search keeps up to date: each shape's (the first `width`), and of
    # each group of shapes (for up to 4 shapes: every group), pods asking at least what every
    # shape of the group asks (the smallest request), on the nodes some of them may use: a
    # node with room for one pod of 5 CPU takes one of the group, not one of each.
    groups_of_shapes: list[tuple[tuple[int, ...], Mapping[str, int]]] = [
        ((index,), requests[index]) for index in range(width)
    ]
    if width <= 4:
        for size in range(2, width + 1):
            for together in itertools.combinations(range(width), size):
                least = {r: min(requests[i].get(r, 0) for i in together) for r in resources}
                if any(amount > 0 for amount in least.values()):
                    groups_of_shapes.append((together, least))
    # How many nodes of each class hold which searched members: (class, load) -> nodes.
    groups: dict[tuple[int, tuple[int, ...]], int] = {
        (j, empty): len(node_class.nodes) for j, node_class in enumerate(classes)
    }
    # Empty nodes per class, read lazily while a member's candidates are walked.
    empties = [len(node_class.nodes) for node_class in classes]
    slots_cache: dict[tuple[int, tuple[int, ...]], list[int]] = {}

    def slots(j: int, load: tuple[int, ...]) -> list[int]:
        """Pods of each shape a node of class j holding `load` still takes."""
        found = slots_cache.get((j, load))
        if found is None:
            node_class = classes[j]
            taken: dict[str, int] = {}
            for index, count in enumerate(load):
                if count:
                    _take(taken, requests[index], count)
            found = slots_cache[(j, load)] = [
                slots_in(node_class.room, taken, request)
                if any(index in node_class.shapes for index in together)
                else 0
                for together, request in groups_of_shapes
            ]
        return found

    # Per shape: the classes whose empty nodes take one of its members, in fill order, and
    # the loaded (class, load) groups that still take one, in the order they were loaded.
    empty_fits = [[j for j in range(len(classes)) if slots(j, empty)[i] > 0] for i in range(width)]
    loaded_fits: list[dict[tuple[int, tuple[int, ...]], None]] = [{} for _ in range(width)]

    # What every node still takes of each shape (and group of shapes), and has free of each
    # resource, summed.
    have_slots = [0] * len(groups_of_shapes)
    for j, node_class in enumerate(classes):
        for position, count in enumerate(slots(j, empty)):
            have_slots[position] += len(node_class.nodes) * count
    have_free = {r: sum(len(c.nodes) * c.room.get(r, 0) for c in classes) for r in resources}

    # The state's hash: the XOR of a random word per (class, load, count) group held.
    words: dict[tuple[int, tuple[int, ...], int], int] = {}
    draw = random.Random(0)

    def word(j: int, load: tuple[int, ...], count: int) -> int:
        if count == 0:
            return 0
        found = words.get((j, load, count))
        if found is None:
            found = words[(j, load, count)] = draw.getrandbits(128)
        return found

    state_hash = 0
    for (j, load), count in groups.items():
        state_hash ^= word(j, load, count)

    def taking() -> bool:
        for have, (together, _) in zip(have_slots, groups_of_shapes, strict=True):
            if have < sum(remaining[index] for index in together):
                return False
        for resource in resources:
            need = sum(count * requests[i].get(resource, 0) for i, count in enumerate(remaining))
            if have_free[resource] < need:
                return False
        return True

    def regroup(j: int, load: tuple[int, ...], change: int) -> None:
        """One node of class j more (1) or fewer (-1) holding `load`."""
        nonlocal state_hash
        before = groups.get((j, load), 0)
        after = before + change
        state_hash ^= word(j, load, before) ^ word(j, load, after)
        if after:
            groups[(j, load)] = after
        else:
            del groups[(j, load)]
        if load == empty:
            empties[j] = after
        elif before == 0 or after == 0:
            takes = slots(j, load)
            for index in range(width):
                if takes[index] > 0:
                    if after:
                        loaded_fits[index][(j, load)] = None
                    else:
                        del loaded_fits[index][(j, load)]

    def shift(
        j: int, before: tuple[int, ...], after: tuple[int, ...], index: int, sign: int
    ) -> None:
        """One node of class j goes from `before` to `after`, a member of `index` put on it
        (sign 1) or taken back (sign -1)."""
        regroup(j, before, -1)
        regroup(j, after, 1)
        for position, (old, new) in enumerate(zip(slots(j, before), slots(j, after), strict=True)):
            have_slots[position] += new - old
        for resource, amount in requests[index].items():
            if resource in have_free:
                have_free[resource] -= sign * amount
        remaining[index] -= sign

    failed: set[tuple[int, int]] = set()

    stack: list[_Frame] = []

    def enter(position: int) -> bool | None:
        """One step: True when every searched member is put, False when this state cannot
        take the rest, None when a frame for the member at `position` was pushed."""
        budget.spend()
        if not taking():
            return False
        if position == len(searched):
            # Only the most numerous shape is left, and the nodes' slots cover it (taking).
            return True
        state = (position, state_hash)
        if state in failed:
            return False
        index = searched[position]
        # Beside members already put first (packed as first fit packs), then empty nodes,
        # classes in fill order.
        fits = empty_fits[index]
        candidates = itertools.chain(
            list(loaded_fits[index]),
            ((j, empty) for j in itertools.compress(fits, map(empties.__getitem__, fits))),
        )
        stack.append(_Frame(position, state, candidates))
        return None

    outcome = enter(0)
    while outcome is not True and stack:
        frame = stack[-1]
        index = searched[frame.position]
        if frame.tried is not None:
            j, load, grown = frame.tried
            shift(j, grown, load, index, -1)
            frame.tried = None
        for j, load in frame.candidates:
            if groups.get((j, load), 0) > 0:
                grown = tuple(count + (i == index) for i, count in enumerate(load))
                shift(j, load, grown, index, 1)
                frame.tried = (j, load, grown)
                outcome = enter(frame.position + 1)
                break
        else:
            failed.add(frame.state)
            stack.pop()
            outcome = False
    if outcome is not True:
        return None
    # Each class's loaded nodes first, in fill order; what each node takes of each shape.
    loads_of: dict[int, list[tuple[tuple[int, ...], int]]] = {}
    for (j, load), count in groups.items():
        loads_of.setdefault(j, []).append((load, count))
    takes: dict[str, list[int]] = {}
    for j, loads in loads_of.items():
        nodes = iter(classes[j].nodes)
        for load, count in sorted(loads, key=lambda item: (item[0] == empty, item[0])):
            for node in itertools.islice(nodes, count):
                takes[node] = [
                    slots(j, load)[bulk] if index == bulk else load[index] for index in range(width)
                ]
    return _lay_out(order, members, takes)


def _take(taken: dict[str, int], request: Mapping[str, int], times: int) -> None:
    for resource, amount in request.items():
        taken[resource] = taken.get(resource, 0) + times * amount


def _lay_out(
    order: Sequence[str], members: Sequence[tuple[str, int]], takes: Mapping[str, Sequence[int]]
) -> dict[str, str]:
    """Each shape's members in rank order onto the nodes in fill order, as many on each as
    `takes` says (a node's pods of each shape)."""
    queues: dict[int, list[str]] = {}
    for node in order:
        for index, count in enumerate(takes.get(node, ())):
            if count:
                queues.setdefault(index, []).extend([node] * count)
    placed: dict[str, str] = {}
    position: dict[int, int] = {}
    for name, index in members:
        at = position.get(index, 0)
        placed[name] = queues[index][at]
        position[index] = at + 1
    return placed


@dataclass(frozen=True)
class _MixedSums:
    """What gather_mixed weighs domains by, summed up the tree once: per shape its offer
    slots and how many members it has, all shapes' slots together, and what each domain has
    free of every resource the gang asks for on the nodes some member may use."""

    counts: list[int]
    # The shape with most members: podCountMultiple floors its slots.
    largest: int
    per_shape: list[DomainSlots]
    together: DomainSlots
    total: dict[str, int]
    free_sums: dict[str, list[int]]

    def may_take(self, domain: Domain) -> bool:
        """Shape by shape enough slots, and resource by resource enough free: necessary,
        not sufficient (the shapes share the nodes); no domain inside one that fails this
        passes it."""
        index = domain.index
        return all(
            slots.slots[index] >= count
            for slots, count in zip(self.per_shape, self.counts, strict=True)
        ) and all(self.free_sums[r][index] >= self.total[r] for r in self.free_sums)


def _mixed_sums(
    tree: TopologyTree,
    members_in_rank_order: Sequence[tuple[str, int]],
    shapes: Sequence[PodShape],
    free: Mapping[str, Mapping[str, int]],
    read: _Rules,
    existing: Mapping[str, int],
) -> _MixedSums:
    counts = [0] * len(shapes)
    for _, index in members_in_rank_order:
        counts[index] += 1
    largest = max(range(len(shapes)), key=lambda i: (counts[i], -i))
    # Nodes grouped by their free dict (nodes alike share one): every figure below is worked
    # out once per group and handed to its nodes in bulk.
    reachable: set[str] = set()
    for shape in shapes:
        reachable |= shape.usable
    groups: dict[int, tuple[Mapping[str, int], set[str]]] = {}
    for node in reachable:
        room = free.get(node)
        if room is not None:
            group = groups.get(id(room))
            if group is None:
                group = groups[id(room)] = (room, set())
            group[1].add(node)
    per_shape: list[DomainSlots] = []
    for index, shape in enumerate(shapes):
        slots: dict[str, int] = {}
        for room, names in groups.values():
            fitting = slots_in(room, {}, shape.request)
            if fitting > 0:
                slots.update(dict.fromkeys(names & shape.usable, fitting))
        multiples = read.multiples if index == largest else {}
        per_shape.append(sum_slots(tree, slots, existing, multiples))
    # All shapes together, for the binpack order and the fill order.
    together = DomainSlots(
        slots=[sum(column) for column in zip(*(s.slots for s in per_shape), strict=True)],
        existing=per_shape[0].existing,
    )
    # What the whole gang asks, resource by resource, and what each domain has free of it on
    # the nodes some member may use: a domain with less cannot take the gang, whatever the
    # packing (a node offering a launcher slot and a worker slot, but not both at once).
    total: dict[str, int] = {}
    for _, index in members_in_rank_order:
        for resource, amount in shapes[index].request.items():
            total[resource] = total.get(resource, 0) + amount
    free_sums: dict[str, list[int]] = {}
    for resource, amount in total.items():
        if amount <= 0:
            continue
        values: dict[str, int] = {}
        for room, names in groups.values():
            values.update(dict.fromkeys(names, room.get(resource, 0)))
        free_sums[resource] = sum_slots(tree, values, {}, {}).slots
    return _MixedSums(counts, largest, per_shape, together, total, free_sums)


def _place_mixed(
    tree: TopologyTree,
    members_in_rank_order: Sequence[tuple[str, int]],
    shapes: Sequence[PodShape],
    free: Mapping[str, Mapping[str, int]],
    sums: _MixedSums,
    scope: Sequence[Domain],
    lowest: int,
    highest: int,
    budget: _SearchBudget,
    gave_up: list[str] | None = None,
) -> Placement | None:
    """Rules 3-6 for a gang of several shapes inside `scope`, layers from `lowest` up to
    `highest` depth. A candidate whose packing search reaches the end of `budget` (shared
    by every candidate) is passed over (and appended to `gave_up`), as one that does not
    take the gang."""
    counts, largest, per_shape = sums.counts, sums.largest, sums.per_shape
    for depth in range(lowest, highest - 1, -1):
        candidates = [
            domain
            for top in scope
            for domain in _fitting(top, depth, per_shape[largest], counts[largest])
            if sums.may_take(domain)
        ]
        if not candidates:
            continue
        # Rule 4's choice first (cheap); the full order only when its nodes cannot pack.
        first = _tightest(tree, candidates, sums.together)
        rest = (d for d in _in_rule_4_order(tree, candidates, sums.together) if d is not first)
        for winner in itertools.chain((first,), rest):
            scarcest_first = sorted(
                range(len(shapes)),
                key=lambda i: (per_shape[i].slots[winner.index] - counts[i], i),
            )
            placed = _pack(
                winner,
                members_in_rank_order,
                shapes,
                free,
                sums.together,
                scarcest_first,
                budget,
                gave_up,
            )
            if placed is not None:
                return Placement(
                    assignments=tuple((name, placed[name]) for name, _ in members_in_rank_order),
                    domain=winner.path,
                    layer=tree.spec.layer_name(depth),
                )
    return None


def gather_mixed(
    tree: TopologyTree,
    members_in_rank_order: Sequence[tuple[str, int]],
    shapes: Sequence[PodShape],
    free: Mapping[str, Mapping[str, int]],
    rules: Sequence[GatherRule],
    existing: Mapping[str, int] | None = None,
    within: DomainPath | None = None,
    pack_steps: int = PACK_SEARCH_STEPS,
) -> Placement | NoFit:
    """Place a gang whose members ask differently (a launcher and its workers), each member
    with its own request and filters, under the same rules as `gather`.

    `members_in_rank_order` pairs each pod's name with its shape (an index into `shapes`);
    `free` is what each node has left. A domain is a candidate when, shape by shape, it
    offers as many slots as the gang has pods of that shape (necessary, not sufficient: the
    shapes share the nodes), and is taken when its nodes really take every member (`_pack`:
    first fit, then an exact search of at most `pack_steps` steps for all the domains
    together; a domain whose search reaches the bound, or that is reached once it is spent,
    is passed over, and named in the message when nothing fits).
    Candidates are tried deepest layer first, tightest first (rule 4, on the slots of all
    shapes together). podCountMultiple floors the slots of the shape with most pods (the
    workers a multiple is written for); a lone launcher is not counted in it.
    """
    desired = len(members_in_rank_order)
    read = _read_rules(tree, rules, desired)
    if isinstance(read, NoFit):
        return read
    sums = _mixed_sums(tree, members_in_rank_order, shapes, free, read, existing or {})
    scope, highest = _scope(tree, read, within)
    node_depth = len(tree.spec.layers) + 1
    lowest = node_depth if rules or within is not None else highest
    gave_up: list[str] = []
    placed = _place_mixed(
        tree,
        members_in_rank_order,
        shapes,
        free,
        sums,
        scope,
        lowest,
        highest,
        _SearchBudget(pack_steps),
        gave_up,
    )
    if placed is not None:
        return placed
    shape_counts = " + ".join(str(count) for count in sums.counts)
    refused = _no_fit(
        read,
        scope,
        sums.together,
        desired,
        within,
        tree.root,
        what=f"room for all {desired} pods ({shape_counts} of {len(shapes)} pod shapes)",
    )
    if not gave_up:
        return refused
    # Fail closed: a domain whose packing was not settled within the bound takes nothing.
    named = ", ".join(gave_up[:3])
    more = f" and {len(gave_up) - 3} more" if len(gave_up) > 3 else ""
    return NoFit(
        message=f"{refused.message}; the packing search stopped at its bound of {pack_steps} "
        f"steps in {named}{more}, treated as not fitting",
        desired=refused.desired,
        best_domain=refused.best_domain,
        best_slots=refused.best_slots,
    )


def gather_mixed_within_each(
    tree: TopologyTree,
    members_in_rank_order: Sequence[tuple[str, int]],
    shapes: Sequence[PodShape],
    free: Mapping[str, Mapping[str, int]],
    rules: Sequence[GatherRule],
    domains: Iterable[Domain],
) -> Iterator[tuple[Domain, Placement]]:
    """`gather_mixed(..., within=domain.path)` for each of `domains`, yielding those that
    take the gang, with every sum worked out once (as `gather_within_each` for a gang of one
    shape): a gang of several shapes' preemption plan is costed domain by domain too."""
    read = _read_rules(tree, rules, len(members_in_rank_order))
    if isinstance(read, NoFit):
        return
    sums = _mixed_sums(tree, members_in_rank_order, shapes, free, read, {})
    node_depth = len(tree.spec.layers) + 1
    must_depth = 0 if read.must_depth is None else read.must_depth
    # One budget for every domain: the worst case of a preemption class's costing is bounded.
    budget = _SearchBudget(PACK_SEARCH_STEPS)
    for domain in domains:
        if not sums.may_take(domain):
            continue
        if domain.depth >= must_depth:
            scope, highest = [domain], domain.depth
        else:
            scope, highest = _scope(tree, read, domain.path)
        placed = _place_mixed(
            tree, members_in_rank_order, shapes, free, sums, scope, node_depth, highest, budget
        )
        if placed is not None:
            yield domain, placed
