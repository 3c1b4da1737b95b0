"""Rules of the ClusterNetworkTopology: layers, domains keyed by path, detailStatus."""

from __future__ import annotations

from typing import Any

import pytest

from tests.unit.topology_placer.builders import BLOCK, SPINE, TOPOLOGY, node, reference_nodes
from topology_placer.network import (
    TopologySpecError,
    build_tree,
    detail_status,
    parse_topology,
)


def _tree(nodes: list[dict[str, Any]]) -> Any:
    return build_tree(
        parse_topology(TOPOLOGY),
        [(n["metadata"]["name"], n["metadata"]["labels"]) for n in nodes],
    )


def test_layers_form_a_chain_from_the_cluster_to_the_nodes() -> None:
    spec = parse_topology(TOPOLOGY)
    assert [layer.name for layer in spec.layers] == ["SpineLayer", "BlockLayer"]
    assert spec.depth_of("spineLayer") == 1
    assert spec.depth_of("NodeTopologyLayer") == 3
    assert spec.depth_of("AcceleratorLayer") is None


def test_two_layers_under_one_parent_are_rejected() -> None:
    bad = {
        "spec": {
            "networkTopologySpec": [
                {"labelKey": [SPINE], "topologyLayer": "SpineLayer"},
                {"labelKey": [BLOCK], "topologyLayer": "BlockLayer"},
            ]
        }
    }
    with pytest.raises(TopologySpecError, match="one chain"):
        parse_topology(bad)


def test_reference_example_detail_status() -> None:
    status = detail_status(_tree(reference_nodes()))
    by_name = {entry["topologyInfo"]["topologyName"]: entry for entry in status}
    root = by_name[""]
    assert root["topologyInfo"]["topologyLayer"] == "ClusterTopologyLayer"
    assert root["childTopologyNames"] == ["s1", "s2"]
    assert root["nodeNum"] == 8
    assert by_name["s1"]["childTopologyNames"] == ["b1", "b2"]
    assert by_name["s1"]["nodeNum"] == 4
    assert by_name["s1"]["parentTopologyInfo"] == {
        "topologyLayer": "ClusterTopologyLayer",
        "topologyName": "",
    }
    block = by_name["b2"]
    assert block["nodeNum"] == 2
    assert block["childTopologyLayer"] == "NodeTopologyLayer"
    assert "childTopologyNames" not in block
    assert block["parentTopologyInfo"] == {"topologyLayer": "SpineLayer", "topologyName": "s1"}
    assert len(status) == 7


def test_rule_detail_status_is_a_depth_first_pre_order_walk() -> None:
    # The CRD says pre-order: a spine is followed by its blocks before the next spine (a
    # breadth-first walk would list s1, s2, b1, b2, ...).
    status = detail_status(_tree(reference_nodes()))
    order = [entry["topologyInfo"]["topologyName"] for entry in status]
    assert order == ["", "s1", "b1", "b2", "s2", "b3", "b4"]


def test_detail_status_follows_nodes_coming_and_going() -> None:
    nodes = reference_nodes()
    fewer = [n for n in nodes if n["metadata"]["labels"][BLOCK] != "b4"]
    status = detail_status(_tree(fewer))
    names = {entry["topologyInfo"]["topologyName"] for entry in status}
    assert "b4" not in names
    s2 = next(e for e in status if e["topologyInfo"]["topologyName"] == "s2")
    assert s2["nodeNum"] == 2


def test_domains_are_keyed_by_their_whole_path_so_equal_names_do_not_merge() -> None:
    nodes = [node("n1", "s1", "b1"), node("n2", "s2", "b1")]
    tree = _tree(nodes)
    blocks = tree.domains_at(2)
    assert [b.path for b in blocks] == [("s1", "b1"), ("s2", "b1")]
    assert all(b.node_count == 1 for b in blocks)


def test_node_missing_a_layer_label_hangs_from_its_deepest_labelled_domain() -> None:
    tree = _tree([node("n1", "s1", None), node("n2", "s1", "b1")])
    assert tree.leaves["n1"].path == ("s1", "n1")
    assert tree.root.children["s1"].node_count == 2
    assert tree.root.children["s1"].children["b1"].node_count == 1


RACK = "network.topology.nvidia.com/rack"
RACK_TOPOLOGY: dict[str, Any] = {
    **TOPOLOGY,
    "spec": {
        "networkTopologySpec": [
            *TOPOLOGY["spec"]["networkTopologySpec"][:2],
            {"labelKey": [RACK], "parentTopologyLayer": "BlockLayer", "topologyLayer": "RackLayer"},
            {"parentTopologyLayer": "RackLayer", "topologyLayer": "NodeTopologyLayer"},
        ]
    },
}


def test_rule_a_node_missing_a_middle_layer_label_stops_there_and_joins_no_deeper_domain() -> None:
    """A node with spine and rack labels but no block label belongs to its spine only: its
    rack label names no rack of any block, so it is never taken for a rack (or a block)."""
    spec = parse_topology(RACK_TOPOLOGY)
    gap = node("gap", "s1", None, labels={RACK: "r1"})
    whole = node("whole", "s1", "b1", labels={RACK: "r1"})
    tree = build_tree(
        spec, [(n["metadata"]["name"], n["metadata"]["labels"]) for n in (gap, whole)]
    )
    assert tree.leaves["gap"].path == ("s1", "gap")
    assert tree.leaves["whole"].path == ("s1", "b1", "r1", "whole")
    spine = tree.root.children["s1"]
    assert spine.node_count == 2
    assert set(spine.children) == {"b1", "gap"}
    assert spine.children["b1"].node_count == 1
    assert spine.children["b1"].children["r1"].node_count == 1
    assert [d.path for d in tree.domains_at(3)] == [("s1", "b1", "r1")]
