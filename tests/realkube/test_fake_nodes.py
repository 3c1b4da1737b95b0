"""The KWOK nodes of the real control plane (tools/kube/fake_nodes.py) are the simulator's nodes:
same names, labels (topology, GPU, instance type), capacity, allocatable, taints and addresses,
handed to KWOK by its annotation, with their readiness left to KWOK's stages."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from clustersim.__main__ import build_parser, config_from_args
from clustersim.cluster.spec import build_node_specs, node_object
from tools.kube.fake_nodes import KWOK_NODE_ANNOTATION, KWOK_NODE_VALUE, fake_nodes

REPO = Path(__file__).resolve().parents[2]


def simulator_nodes(*cli: str) -> list[dict[str, Any]]:
    """The Nodes the simulator registers when started with these CLI flags."""
    config = config_from_args(build_parser().parse_args(list(cli)))
    return [node_object(node, "2026-01-01T00:00:00Z") for node in build_node_specs(config.cluster)]


@pytest.mark.parametrize(
    ("nodes", "topology"),
    [(16, ""), (40, ""), (6, "spines=1,blocks_per_spine=2,nodes_per_block=3")],
)
def test_fake_nodes_have_the_simulators_names_labels_capacity_and_taints(
    nodes: int, topology: str
) -> None:
    cli = ["--nodes", str(nodes), *(["--topology", topology] if topology else [])]
    expected = simulator_nodes(*cli)
    fake = fake_nodes(nodes, topology)
    assert [n["metadata"]["name"] for n in fake] == [n["metadata"]["name"] for n in expected]
    for got, want in zip(fake, expected, strict=True):
        assert got["metadata"]["labels"] == want["metadata"]["labels"]
        assert got["spec"].get("taints") == want["spec"].get("taints")
        assert got["spec"].get("unschedulable") == want["spec"].get("unschedulable")
        for field in ("capacity", "allocatable", "addresses"):
            assert got["status"][field] == want["status"][field]


def test_fake_nodes_are_managed_by_kwok_which_makes_them_ready() -> None:
    for node in fake_nodes(4, ""):
        assert node["metadata"]["annotations"][KWOK_NODE_ANNOTATION] == KWOK_NODE_VALUE
        # KWOK's node-initialize stage acts on nodes that are not Ready yet.
        assert "conditions" not in node["status"]
        assert "providerID" not in node["spec"]


def test_fake_nodes_script_prints_a_node_list_kubectl_accepts() -> None:
    printed = subprocess.run(
        [sys.executable, str(REPO / "tools/kube/fake_nodes.py"), "--nodes", "3"],
        check=True,
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(REPO)},
    ).stdout
    listed = json.loads(printed)
    assert listed["apiVersion"] == "v1"
    assert listed["kind"] == "List"
    assert [item["kind"] for item in listed["items"]] == ["Node"] * 3
