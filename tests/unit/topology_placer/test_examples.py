"""The shipped examples read as the placer reads them, and the gang example is placed whole
inside one spine of the example topology."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from tests.unit.topology_placer.builders import node
from tests.unit.topology_placer.simulate import run
from topology_placer.gang import parse_pod_group
from topology_placer.network import parse_topology
from topology_placer.planner import Nominate

EXAMPLES = Path(__file__).resolve().parents[3] / "k8s" / "examples"


def _load(name: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all((EXAMPLES / name).read_text()) if doc]


def test_example_topology_and_gang_parse_and_place_inside_one_spine() -> None:
    (topology,) = _load("clusternetworktopology.yaml")
    spec = parse_topology(topology)
    assert [layer.name for layer in spec.layers] == [
        "DatacenterLayer",
        "SpineLayer",
        "BlockLayer",
        "AcceleratorLayer",
    ]
    documents = _load("gang.yaml")
    (group,) = [d for d in documents if d["kind"] == "PodGroup"]
    pods = [d for d in documents if d["kind"] == "Pod"]
    assert parse_pod_group(group).min_member == len(pods)
    for pod in pods:
        pod["metadata"]["uid"] = f"uid-{pod['metadata']['name']}"
        pod["status"] = {"phase": "Pending"}
    nodes = []
    for index in range(8):
        made = node(f"n{index}", f"spine-{index // 4}", f"block-{index // 2}")
        made["metadata"]["labels"]["network.topology.nvidia.com/datacenter"] = "dc-0"
        made["metadata"]["labels"]["network.topology.nvidia.com/accelerator"] = f"nvl-{index // 2}"
        nodes.append(made)
    result, _ = run(nodes, pods, [group], topology=topology)
    placed = {a.pod.name: a.node for a in result.actions if isinstance(a, Nominate)}
    assert len(placed) == 4
    assert len({int(n[1:]) // 4 for n in placed.values()}) == 1
