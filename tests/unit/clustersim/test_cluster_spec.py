from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from clustersim.__main__ import build_parser, config_from_args, main
from clustersim.cluster.spec import (
    ACCELERATOR_LABEL,
    BLOCK_LABEL,
    DATACENTER_LABEL,
    SPINE_LABEL,
    ClusterSpec,
    SpecError,
    Taint,
    TopologyShape,
    build_node_specs,
    check_addresses,
    default_topology,
    internal_ips,
    load_spec_file,
    merge_cli_overrides,
    node_object,
    parse_taint,
    parse_topology,
    topology_place,
)


def test_parse_topology_and_product() -> None:
    shape = parse_topology("spines=2,blocks_per_spine=4,nodes_per_block=8")
    assert shape == TopologyShape(spines=2, blocks_per_spine=4, nodes_per_block=8)
    assert shape.node_count == 64


@pytest.mark.parametrize("text", ["spines=0", "leaves=2", "spines", "spines=x"])
def test_parse_topology_rejects(text: str) -> None:
    with pytest.raises(SpecError):
        parse_topology(text)


def test_parse_taint() -> None:
    assert parse_taint("dedicated=gpu:NoSchedule") == Taint("dedicated", "NoSchedule", "gpu")
    assert parse_taint("maint:NoExecute") == Taint("maint", "NoExecute", "")
    with pytest.raises(SpecError):
        parse_taint("maint:Sometimes")


def test_node_count_is_topology_product_unless_given() -> None:
    shape = parse_topology("spines=2,blocks_per_spine=2,nodes_per_block=4")
    assert len(build_node_specs(ClusterSpec(topology=shape))) == 16
    assert len(build_node_specs(ClusterSpec(topology=shape, nodes=5))) == 5


def test_topology_labels_nest() -> None:
    shape = parse_topology("spines=2,blocks_per_spine=2,nodes_per_block=4")
    nodes = build_node_specs(ClusterSpec(topology=shape))
    first, fifth, ninth = nodes[0].labels, nodes[4].labels, nodes[8].labels
    assert first[BLOCK_LABEL] == "block-0" and fifth[BLOCK_LABEL] == "block-1"
    assert first[SPINE_LABEL] == fifth[SPINE_LABEL] == "spine-0"
    assert ninth[SPINE_LABEL] == "spine-1"
    assert {n.labels[DATACENTER_LABEL] for n in nodes} == {"dc-0"}
    assert first[ACCELERATOR_LABEL] == nodes[3].labels[ACCELERATOR_LABEL] == "nvl-0"


def test_accelerator_domains_split_blocks() -> None:
    shape = TopologyShape(nodes_per_block=4, nodes_per_accelerator=2)
    assert [topology_place(i, shape).accelerator for i in range(6)] == [
        "nvl-0",
        "nvl-0",
        "nvl-1",
        "nvl-1",
        "nvl-2",
        "nvl-2",
    ]


def test_ips_spread_over_third_and_fourth_octet() -> None:
    assert internal_ips(5, 2) == [
        "10.174.12.2",
        "10.174.12.3",
        "10.174.13.2",
        "10.174.13.3",
        "10.174.14.2",
    ]


@given(
    count=st.integers(min_value=1, max_value=3000),
    per_block=st.integers(min_value=1, max_value=600),
    start=st.integers(min_value=0, max_value=40),
)
def test_ip_last_two_octets_unique_and_valid(count: int, per_block: int, start: int) -> None:
    try:
        ips = internal_ips(count, per_block, "10.174", start)
    except SpecError:
        return  # the /16 ran out of third octets, which must be refused, not wrapped
    pairs = [tuple(ip.split(".")[2:]) for ip in ips]
    assert len(set(pairs)) == count
    network = ipaddress.ip_network("10.174.0.0/16")
    for ip in ips:
        address = ipaddress.ip_address(ip)
        assert address in network
        assert 2 <= int(ip.split(".")[3]) <= 253


def test_ip_space_exhaustion_is_an_error() -> None:
    with pytest.raises(SpecError):
        internal_ips(300, 1, "10.174", 12)


def test_node_object_shape() -> None:
    spec = ClusterSpec(nodes=2, name_prefix="gpu", taints=(Taint("a", "NoSchedule", "b"),))
    node = node_object(build_node_specs(spec)[1], "2025-01-01T00:00:00Z")
    assert node["metadata"]["name"] == "gpu-001"
    labels = node["metadata"]["labels"]
    assert labels["kubernetes.io/hostname"] == "gpu-001"
    assert labels["nvidia.com/gpu.present"] == "true"
    assert labels["node.kubernetes.io/instance-type"] == "sim.h100x8"
    assert node["spec"]["taints"] == [{"key": "a", "value": "b", "effect": "NoSchedule"}]
    addresses = {a["type"]: a["address"] for a in node["status"]["addresses"]}
    assert addresses == {"InternalIP": "10.174.12.3", "Hostname": "gpu-001"}
    ready = [c for c in node["status"]["conditions"] if c["type"] == "Ready"]
    assert ready[0]["status"] == "True"
    assert node["status"]["allocatable"]["nvidia.com/gpu"] == "8"
    assert node["status"]["nodeInfo"]["kubeletVersion"].startswith("v1.")


def test_spec_file_with_overrides(tmp_path: Path) -> None:
    path = tmp_path / "cluster.yaml"
    path.write_text(
        """
name_prefix: gpu
topology: {spines: 1, blocks_per_spine: 2, nodes_per_block: 2}
capacity: {cpu: "32", nvidia.com/gpu: 4}
allocatable: {cpu: "30"}
taints: ["dedicated=gpu:NoSchedule"]
labels: {pool: a}
overrides:
  gpu-003: {unschedulable: true, labels: {pool: b}, taints: []}
"""
    )
    nodes = build_node_specs(load_spec_file(str(path)))
    assert [n.name for n in nodes] == ["gpu-000", "gpu-001", "gpu-002", "gpu-003"]
    assert nodes[0].capacity["cpu"] == "32" and nodes[0].allocatable["cpu"] == "30"
    assert nodes[0].capacity["memory"] == "512Gi"
    assert nodes[0].taints == (Taint("dedicated", "NoSchedule", "gpu"),)
    assert nodes[3].taints == () and nodes[3].unschedulable
    assert nodes[3].labels["pool"] == "b" and nodes[0].labels["pool"] == "a"


def test_spec_file_rejects_unknown_keys(tmp_path: Path) -> None:
    path = tmp_path / "cluster.yaml"
    path.write_text("nodez: 3\n")
    with pytest.raises(SpecError):
        load_spec_file(str(path))


def test_cli_overrides_win() -> None:
    spec = merge_cli_overrides(
        ClusterSpec(nodes=3), nodes=8, topology="nodes_per_block=4", taints=["x:NoSchedule"]
    )
    nodes = build_node_specs(spec)
    assert len(nodes) == 8
    assert nodes[4].labels[BLOCK_LABEL] == "block-1"
    assert nodes[0].taints == (Taint("x", "NoSchedule"),)


# --- make run NODES=n: the default shape grows, an impossible pair is one clear line ----------


@pytest.mark.parametrize("nodes", [1, 16, 17, 300, 1000, 4000, 10000, 61488])
def test_default_topology_grows_with_nodes(nodes: int) -> None:
    shape = default_topology(nodes)
    assert shape.node_count >= nodes
    check_addresses(nodes, shape.nodes_per_block)


def test_default_topology_of_sixteen_nodes_is_the_documented_one() -> None:
    assert default_topology(16) == TopologyShape(spines=2, blocks_per_spine=2, nodes_per_block=4)


def test_four_thousand_nodes_from_the_command_line_get_distinct_addresses() -> None:
    config = config_from_args(build_parser().parse_args(["--nodes", "4000"]))
    specs = build_node_specs(config.cluster)
    assert len({spec.internal_ip for spec in specs}) == 4000


def test_nodes_and_topology_that_cannot_work_fail_in_one_line_naming_what_would(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert (
        main(["--nodes", "4000", "--topology", "nodes_per_block=4", "--run-dir", "/nonexistent"])
        == 2
    )
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "nodes_per_block >= 17" in err and "at most 976 nodes" in err


def test_a_spec_file_of_four_thousand_nodes_without_a_topology_gets_one_that_grows(
    tmp_path: Path,
) -> None:
    """As the one-line error promises ("or no topology, which grows with the node count"):
    blocks of eight would need 500 third octets of the /16."""
    path = tmp_path / "cluster.yaml"
    path.write_text("nodes: 4000\n")
    specs = build_node_specs(load_spec_file(str(path)))
    assert len({spec.internal_ip for spec in specs}) == 4000
    # Its address range starting higher: the shape grows further.
    path.write_text("nodes: 4000\nthird_octet_start: 150\n")
    specs = build_node_specs(load_spec_file(str(path)))
    assert len({spec.internal_ip for spec in specs}) == 4000
    # A small spec keeps its blocks of up to eight nodes.
    assert {spec.labels[BLOCK_LABEL] for spec in build_node_specs(ClusterSpec(nodes=12))} == {
        "block-0",
        "block-1",
    }
