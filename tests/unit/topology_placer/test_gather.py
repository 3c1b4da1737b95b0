"""Rules of the topology gather, on the reference's spine/block layout."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.topology_placer.builders import TOPOLOGY, node, reference_nodes
from topology_placer.gang import GatherRule
from topology_placer.gather import NoFit, Placement, gather
from topology_placer.network import TopologySpec, TopologyTree, build_tree, parse_topology

BLOCK_MUST = (GatherRule("BlockLayer", "MustGather"),)
BLOCK_PREFER = (GatherRule("BlockLayer", "PreferGather"),)


def _tree(nodes: list[dict[str, Any]]) -> TopologyTree:
    return build_tree(
        parse_topology(TOPOLOGY),
        [(n["metadata"]["name"], n["metadata"]["labels"]) for n in nodes],
    )


def _pods(count: int) -> list[str]:
    return [f"pod-{i}" for i in range(count)]


def _placed(result: Placement | NoFit) -> Placement:
    assert isinstance(result, Placement), result
    return result


def test_reference_example_four_pod_gang_lands_on_one_block() -> None:
    # Every node takes two pods; node5..node8 (s2) are emptier, node1..node4 offer one each.
    slots = {f"node{i}": 1 for i in range(1, 5)} | {f"node{i}": 2 for i in range(5, 9)}
    placement = _placed(gather(_tree(reference_nodes()), _pods(4), BLOCK_PREFER, slots))
    nodes = {n for _, n in placement.assignments}
    assert placement.layer == "BlockLayer"
    assert placement.domain in {("s2", "b3"), ("s2", "b4")}
    assert len(nodes) == 2


def test_deepest_domain_that_fits_the_whole_gang_wins() -> None:
    slots = {f"node{i}": 4 for i in range(1, 9)}
    placement = _placed(gather(_tree(reference_nodes()), _pods(4), BLOCK_PREFER, slots))
    assert placement.layer == "NodeTopologyLayer"
    assert len({n for _, n in placement.assignments}) == 1


def test_binpack_picks_the_tightest_fitting_domain() -> None:
    slots = {"node1": 3, "node2": 3, "node3": 2, "node4": 2, "node5": 1, "node6": 1}
    placement = _placed(gather(_tree(reference_nodes()), _pods(4), BLOCK_MUST, slots))
    assert placement.domain == ("s1", "b2")


def test_ties_go_to_the_domain_already_holding_the_jobs_pods() -> None:
    slots = {f"node{i}": 2 for i in range(1, 9)}
    existing = {"node7": 1}
    placement = _placed(gather(_tree(reference_nodes()), _pods(4), BLOCK_MUST, slots, existing))
    assert placement.domain == ("s2", "b4")


def test_must_gather_never_leaves_its_layer_and_says_why_in_numbers() -> None:
    slots = {f"node{i}": 2 for i in range(1, 9)}
    result = gather(_tree(reference_nodes()), _pods(6), BLOCK_MUST, slots)
    assert isinstance(result, NoFit)
    assert result.message == (
        "MustGather BlockLayer: no BlockLayer domain offers 6 slots; best s1/b1 offers 4"
    )


def test_prefer_gather_falls_back_layer_by_layer() -> None:
    slots = {f"node{i}": 2 for i in range(1, 9)}
    spine = _placed(gather(_tree(reference_nodes()), _pods(6), BLOCK_PREFER, slots))
    assert spine.layer == "SpineLayer"
    assert spine.domain == ("s1",)
    # One whole block (b1, the first of two equal ones), then the rest in its sibling.
    assert [n for _, n in spine.assignments] == ["node1", "node1", "node2", "node2"] + ["node3"] * 2
    cluster = _placed(gather(_tree(reference_nodes()), _pods(12), BLOCK_PREFER, slots))
    assert cluster.layer == "ClusterTopologyLayer"


def test_rule_the_largest_child_domain_is_filled_first() -> None:
    # Spine s1: b1 offers 2 (one slot per node), b2 offers 4. Five pods fit no block: the
    # spine takes them, b2 (the larger) first and whole, then b1; in b2 the node offering
    # more first.
    slots = {"node1": 1, "node2": 1, "node3": 3, "node4": 1}
    placement = _placed(gather(_tree(reference_nodes()), _pods(5), BLOCK_PREFER, slots))
    assert placement.domain == ("s1",)
    assert [n for _, n in placement.assignments] == ["node3"] * 3 + ["node4", "node1"]


def test_rule_with_several_must_gather_layers_the_deepest_wins() -> None:
    # Four pods fit spine s1 (2 + 2) but no single block (2 each): MustGather on both the
    # spine and the block layer confines the gang to a block, so it does not fit, in
    # whichever order the rules are listed.
    slots = {f"node{i}": 1 for i in range(1, 5)}
    spine_must = GatherRule("SpineLayer", "MustGather")
    block_must = GatherRule("BlockLayer", "MustGather")
    for rules in ((spine_must, block_must), (block_must, spine_must)):
        result = gather(_tree(reference_nodes()), _pods(4), rules, slots)
        assert isinstance(result, NoFit), rules
        assert result.message.startswith("MustGather BlockLayer:")
        # Two pods fit a block: then the gang is placed inside one.
        two = _placed(gather(_tree(reference_nodes()), _pods(2), rules, slots))
        assert two.layer == "BlockLayer"
    # The spine rule alone lets the four pods spread over s1's two blocks.
    four = _placed(gather(_tree(reference_nodes()), _pods(4), (spine_must,), slots))
    assert four.domain == ("s1",)


def test_pod_count_multiple_floors_a_domains_slots() -> None:
    slots = {"node1": 3, "node2": 0, "node3": 2, "node4": 2}
    rules = (GatherRule("BlockLayer", "MustGather", pod_count_multiple=2),)
    placement = _placed(gather(_tree(reference_nodes()), _pods(3), rules, slots))
    # b1 offers 3, floored to 2; only b2 (4) takes 3 pods.
    assert placement.domain == ("s1", "b2")


def test_pod_count_multiple_on_the_node_layer_floors_each_nodes_slots() -> None:
    rules = (GatherRule("NodeTopologyLayer", "PreferGather", pod_count_multiple=2),)
    # node1 can take 3 pods of the gang but offers 2 (pods go in twos); node3 offers 2.
    slots = {"node1": 3, "node3": 2}
    result = gather(_tree(reference_nodes()), _pods(3), rules, slots)
    placement = _placed(result)
    assert placement.layer == "BlockLayer" or placement.layer == "SpineLayer"
    assert sorted(placement.node_of.values()) == ["node1", "node1", "node3"]
    # A multiple of 1 floors nothing: the three pods fit node1 alone.
    alone = _placed(gather(_tree(reference_nodes()), _pods(3), (), {"node1": 3}))
    assert set(alone.node_of.values()) == {"node1"}


def test_a_node_offers_no_more_than_its_floored_domain() -> None:
    # b1 offers 3, floored to 2 by the block's podCountMultiple: node1 inside it offers 2 too,
    # so three pods fit nowhere (no node, no block, the spine and the cluster sum to 2).
    rules = (GatherRule("BlockLayer", "PreferGather", pod_count_multiple=2),)
    result = gather(_tree(reference_nodes()), _pods(3), rules, {"node1": 3})
    assert isinstance(result, NoFit)
    assert result.best_slots == 2
    two = _placed(gather(_tree(reference_nodes()), _pods(2), rules, {"node1": 3}))
    assert (two.layer, set(two.node_of.values())) == ("NodeTopologyLayer", {"node1"})
    # Confined to node1 itself (a plan costed domain by domain), it still offers 2.
    confined = gather(
        _tree(reference_nodes()), _pods(3), rules, {"node1": 3}, within=("s1", "b1", "node1")
    )
    assert isinstance(confined, NoFit)
    assert confined.best_slots == 2


def test_a_domain_without_the_jobs_pods_counts_none_whatever_its_size() -> None:
    # b1 (three nodes) and b2 (two nodes) fit the gang equally tightly (two slots each, one
    # per node); neither holds a pod of the job (it has one in s2): the path decides, b1,
    # not the number of nodes of either.
    nodes = [
        node("big-1", "s1", "b1"),
        node("big-2", "s1", "b1"),
        node("big-3", "s1", "b1"),
        node("small-1", "s1", "b2"),
        node("small-2", "s1", "b2"),
        node("far", "s2", "b3"),
    ]
    slots = {"big-1": 1, "big-2": 1, "small-1": 1, "small-2": 1, "far": 1}
    existing = {"far": 1}
    placement = _placed(gather(_tree(nodes), _pods(2), BLOCK_MUST, slots, existing))
    assert placement.domain == ("s1", "b1")


def test_unknown_gather_layer_is_unschedulable_naming_the_known_layers() -> None:
    rules = (GatherRule("AcceleratorLayer", "MustGather"),)
    result = gather(_tree(reference_nodes()), _pods(1), rules, {"node1": 1})
    assert isinstance(result, NoFit)
    assert "AcceleratorLayer" in result.message
    assert "SpineLayer, BlockLayer" in result.message


def test_ranks_are_kept_so_neighbouring_ranks_share_a_node() -> None:
    slots = {f"node{i}": 2 for i in range(1, 9)}
    # Rank order as given: pod-2 before pod-10 (a name sort would swap them).
    ranks = ["pod-0", "pod-1", "pod-2", "pod-10"]
    placement = _placed(gather(_tree(reference_nodes()), ranks, BLOCK_MUST, slots))
    assert [pod for pod, _ in placement.assignments] == ranks
    node_of = placement.node_of
    assert node_of["pod-0"] == node_of["pod-1"]
    assert node_of["pod-2"] == node_of["pod-10"]


def test_no_gather_rule_places_across_the_cluster() -> None:
    slots = {"node1": 1, "node8": 1}
    placement = _placed(gather(_tree(reference_nodes()), _pods(2), (), slots))
    assert placement.layer == "ClusterTopologyLayer"
    assert set(placement.node_of.values()) == {"node1", "node8"}


# --- properties ------------------------------------------------------------------------------

_LAYOUT = [(f"s{s}", f"b{b}") for s in range(3) for b in range(3)]
NODES = [node(f"n{i}", *_LAYOUT[i % len(_LAYOUT)]) for i in range(27)]
TREE = _tree(NODES)
BLOCK_OF = {n["metadata"]["name"]: _LAYOUT[i % len(_LAYOUT)] for i, n in enumerate(NODES)}

slot_maps = st.dictionaries(
    st.sampled_from([n["metadata"]["name"] for n in NODES]), st.integers(0, 4), max_size=27
)
rule_sets = st.lists(
    st.builds(
        GatherRule,
        st.sampled_from(["SpineLayer", "BlockLayer", "NodeTopologyLayer"]),
        st.sampled_from(["MustGather", "PreferGather"]),
        st.integers(1, 3),
    ),
    max_size=2,
)


@settings(max_examples=300, deadline=None)
@given(slots=slot_maps, count=st.integers(1, 20), rules=rule_sets)
def test_property_gang_is_placed_whole_or_not_at_all_within_node_slots(
    slots: dict[str, int], count: int, rules: list[GatherRule]
) -> None:
    result = gather(TREE, _pods(count), rules, slots)
    if isinstance(result, NoFit):
        return
    assert len(result.assignments) == count
    assert len({pod for pod, _ in result.assignments}) == count
    per_node: dict[str, int] = {}
    for _, name in result.assignments:
        per_node[name] = per_node.get(name, 0) + 1
    assert all(per_node[name] <= slots.get(name, 0) for name in per_node)


@settings(max_examples=300, deadline=None)
@given(slots=slot_maps, count=st.integers(1, 20), layer=st.sampled_from([1, 2]))
def test_property_must_gather_never_crosses_its_layer(
    slots: dict[str, int], count: int, layer: int
) -> None:
    name = "SpineLayer" if layer == 1 else "BlockLayer"
    result = gather(TREE, _pods(count), [GatherRule(name, "MustGather")], slots)
    if isinstance(result, NoFit):
        return
    domains = {BLOCK_OF[node_name][:layer] for _, node_name in result.assignments}
    assert len(domains) == 1


@settings(max_examples=300, deadline=None)
@given(slots=slot_maps, count=st.integers(1, 20), rules=rule_sets)
def test_property_ranks_are_contiguous_in_every_domain(
    slots: dict[str, int], count: int, rules: list[GatherRule]
) -> None:
    result = gather(TREE, _pods(count), rules, slots)
    if isinstance(result, NoFit):
        return
    for depth in (1, 2, 3):
        ranks_by_domain: dict[tuple[str, ...], list[int]] = {}
        for rank, (_, node_name) in enumerate(result.assignments):
            key = (*BLOCK_OF[node_name], node_name)[:depth]
            ranks_by_domain.setdefault(key, []).append(rank)
        for ranks in ranks_by_domain.values():
            assert ranks == list(range(ranks[0], ranks[0] + len(ranks)))


def test_within_confines_the_gang_and_names_the_domain_when_it_is_full() -> None:
    slots = {f"node{i}": 2 for i in range(1, 9)}
    placed = _placed(gather(_tree(reference_nodes()), _pods(2), (), slots, within=("s2", "b4")))
    assert set(placed.node_of.values()) <= {"node7", "node8"}
    full = gather(_tree(reference_nodes()), _pods(5), (), slots, within=("s2", "b4"))
    assert isinstance(full, NoFit)
    assert full.message == (
        "no domain within s2/b4, where the gang's bound pods are, offers 5 slots; it offers 4"
    )


def test_within_places_in_the_deepest_domain_inside_it_even_without_a_gather_rule() -> None:
    slots = {f"node{i}": 2 for i in range(1, 9)}
    placed = _placed(gather(_tree(reference_nodes()), _pods(2), (), slots, within=("s1",)))
    assert placed.layer == "NodeTopologyLayer"
    assert placed.domain[:1] == ("s1",)


def test_within_a_domain_above_the_must_gather_layer_keeps_to_its_blocks() -> None:
    # s2's b3 fits three pods tighter than s1's blocks (4 each), but the gang is confined to s1.
    slots = {"node1": 2, "node2": 2, "node3": 2, "node4": 2, "node5": 2, "node6": 1}
    placed = _placed(gather(_tree(reference_nodes()), _pods(3), BLOCK_MUST, slots, within=("s1",)))
    assert placed.domain in {("s1", "b1"), ("s1", "b2")}
    free = _placed(gather(_tree(reference_nodes()), _pods(3), BLOCK_MUST, slots))
    assert free.domain == ("s2", "b3")


def test_a_gather_rule_without_pod_count_multiple_floors_nothing() -> None:
    # b1 offers 3 (an odd number): a MustGather gang of three takes it.
    slots = {"node1": 2, "node2": 1}
    placed = _placed(gather(_tree(reference_nodes()), _pods(3), BLOCK_MUST, slots))
    assert placed.domain == ("s1", "b1")


def test_unknown_layer_on_a_topology_without_layers_says_none_and_offers_nothing() -> None:
    tree = build_tree(TopologySpec(layers=()), [("n1", {})])
    result = gather(tree, _pods(1), BLOCK_MUST, {"n1": 1})
    assert isinstance(result, NoFit)
    assert result.message.endswith("(layers: none)")
    assert (result.best_domain, result.best_slots) == ("", 0)


def test_rule_binpack_ties_go_to_the_block_of_the_fuller_spine() -> None:
    # b1 (spine s1) and b3 (spine s2) both offer exactly 4; s2 has nothing else free while
    # s1's b2 offers 6 more. Taking b1 would fragment s1, the only spine that can still take
    # a 10-pod gang: the ancestors' slots break the tie towards b3, as Koordinator does.
    slots = {"node1": 2, "node2": 2, "node3": 3, "node4": 3, "node5": 2, "node6": 2}
    placement = _placed(gather(_tree(reference_nodes()), _pods(4), BLOCK_MUST, slots))
    assert placement.domain == ("s2", "b3")
