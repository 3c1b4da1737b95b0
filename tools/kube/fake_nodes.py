"""The simulator's GPU nodes as KWOK fake nodes, for a real control plane.

    python tools/kube/fake_nodes.py --nodes 16 [--topology spines=2,...] | kubectl create -f -

prints a v1 List of Nodes with the names, labels (topology, GPU, instance type), capacity,
allocatable, taints, addresses and node info the simulator gives the same node count, so a
test sees the same cluster on either. They carry the annotation KWOK manages, and no
conditions: KWOK's node-initialize stage makes them Ready, as a kubelet would.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from datetime import UTC, datetime
from typing import Any

from clustersim.cluster.spec import (
    ClusterSpec,
    build_node_specs,
    check_spec,
    default_topology,
    merge_cli_overrides,
    node_object,
)

KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"
KWOK_NODE_VALUE = "fake"


def fake_node(node: dict[str, Any]) -> dict[str, Any]:
    """One simulator Node, handed to KWOK: its annotation added, its readiness left to KWOK."""
    metadata = {**node["metadata"]}
    metadata["annotations"] = {**metadata["annotations"], KWOK_NODE_ANNOTATION: KWOK_NODE_VALUE}
    status = {k: v for k, v in node["status"].items() if k not in ("conditions", "phase")}
    # A providerID of our simulator would be a lie on a real API server; a kubelet without a
    # cloud provider registers none.
    spec = {k: v for k, v in node["spec"].items() if k != "providerID"}
    return {**node, "metadata": metadata, "spec": spec, "status": status}


def fake_nodes(nodes: int, topology: str) -> list[dict[str, Any]]:
    """The simulator's rendering for `--nodes nodes --topology topology` (its CLI's defaults)."""
    spec = merge_cli_overrides(ClusterSpec(), nodes=nodes, topology=topology or None)
    if spec.topology is None:
        spec = dataclasses.replace(spec, topology=default_topology(nodes))
    check_spec(spec)
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return [fake_node(node_object(node, now)) for node in build_node_specs(spec)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--nodes", type=int, default=16)
    parser.add_argument("--topology", default="", help="as the simulator's --topology")
    args = parser.parse_args(argv)
    items = fake_nodes(args.nodes, args.topology)
    json.dump({"apiVersion": "v1", "kind": "List", "items": items}, sys.stdout, indent=1)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
