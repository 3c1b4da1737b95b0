"""Upstream `kubectl skyhook`'s read-only verbs (nodeflow_cli.skyhook_status): `node list`,
`node status`, `package status` and `version` read the nodes' nodeState annotations of their
own group only, roll a node up as upstream does, and skip an unreadable node with a warning
while showing the others."""

from __future__ import annotations

import json
from typing import Any

import pytest

from nodeflow_cli.skyhook_status import (
    COMPLETE,
    ERRORING,
    IN_PROGRESS,
    UNKNOWN,
    PackageRow,
    controller_version,
    package_rows,
    render_node_list,
    render_node_status,
    render_package_status,
    roll_up,
    select_nodes,
    summaries,
)
from nodeflow_contracts.skyhook import NODEWRIGHT, SKYHOOK


def entry(name: str, version: str, stage: str, state: str, restarts: int = 0) -> dict[str, Any]:
    return {"name": name, "version": version, "image": f"r/{name}", "stage": stage,
            "state": state, "restarts": restarts}  # fmt: skip


def node(name: str, **states: Any) -> dict[str, Any]:
    """`states`: annotation key -> its value (a dict is written as JSON)."""
    annotations = {k: v if isinstance(v, str) else json.dumps(v) for k, v in states.items()}
    return {"metadata": {"name": name, "annotations": annotations}}


GPU = SKYHOOK.node_state_annotation("gpu-init")
OTHER = SKYHOOK.node_state_annotation("tuning")
WRIGHT = NODEWRIGHT.node_state_annotation("gpu-init")
DONE = {"driver|1.0": entry("driver", "1.0", "config", COMPLETE, 1)}
HALF = {
    "driver|1.0": entry("driver", "1.0", "config", COMPLETE),
    "nic|2.0": entry("nic", "2.0", "apply", IN_PROGRESS, 2),
}
BROKEN = {"driver|1.0": entry("driver", "1.0", "apply", ERRORING, 3)}


def rows(*states: str) -> list[PackageRow]:
    return [PackageRow(f"p{i}", "1", "apply", s, 0, "") for i, s in enumerate(states)]


@pytest.mark.parametrize(
    ("states", "status"),
    [
        ((COMPLETE, COMPLETE), COMPLETE),
        ((COMPLETE, IN_PROGRESS), IN_PROGRESS),
        ((COMPLETE, "waiting"), IN_PROGRESS),
        ((IN_PROGRESS,), IN_PROGRESS),
        ((COMPLETE, ERRORING), ERRORING),
        (("waiting",), UNKNOWN),
        ((), UNKNOWN),
    ],
)
def test_rule_a_node_rolls_up_as_upstreams_cli(states: tuple[str, ...], status: str) -> None:
    assert roll_up(rows(*states)) == status


def test_rule_node_list_counts_one_objects_packages_per_node_and_sums_the_restarts() -> None:
    nodes = [node("n2", **{GPU: HALF}), node("n1", **{GPU: DONE, OTHER: BROKEN}), node("n3")]
    found = summaries(nodes, SKYHOOK, "gpu-init", warn=print)
    counts = [(s.nodeName, s.status, s.packagesComplete, s.packagesTotal, s.restarts)
              for s in found]  # fmt: skip
    assert counts == [("n1", COMPLETE, 1, 1, 1), ("n2", IN_PROGRESS, 1, 2, 2)]
    table = render_node_list("gpu-init", found, "wide")
    assert table[:3] == [
        "Skyhook: gpu-init",
        "",
        "Summary: 2 nodes (1 complete, 0 erroring, 1 in progress)",
    ]
    assert table[4].split() == ["NODE", "STATUS", "PACKAGES", "RESTARTS"]
    assert [line.split() for line in table[5:]] == [
        ["n1", "complete", "1/1", "1"],
        ["n2", "in_progress", "1/2", "2"],
    ]
    as_json = json.loads(render_node_list("gpu-init", found, "json")[0])
    assert as_json["skyhookName"] == "gpu-init"
    assert as_json["nodes"][1] == {
        "nodeName": "n2",
        "status": IN_PROGRESS,
        "packagesComplete": 1,
        "packagesTotal": 2,
        "restarts": 2,
    }
    assert render_node_list("none", [], "table") == ['No nodes found for Skyhook "none"']


def test_rule_an_erroring_node_is_shouted_in_the_table() -> None:
    found = summaries([node("n1", **{GPU: BROKEN})], SKYHOOK, None, warn=print)
    assert render_node_list("gpu-init", found, "table")[5].split() == ["n1", "ERRORING", "0/1"]


def test_rule_each_group_reads_only_its_own_node_state() -> None:
    both = [node("n1", **{GPU: DONE, WRIGHT: BROKEN})]
    assert [s.status for s in summaries(both, SKYHOOK, None, warn=print)] == [COMPLETE]
    assert [s.status for s in summaries(both, NODEWRIGHT, None, warn=print)] == [ERRORING]


def test_rule_node_status_shows_every_object_on_the_nodes_and_their_packages_when_wide() -> None:
    nodes = [node("n1", **{GPU: HALF, OTHER: DONE}), node("n2", **{GPU: DONE})]
    chosen = select_nodes(nodes, ["n1"])
    found = summaries(chosen, SKYHOOK, None, warn=print)
    assert [line.split() for line in render_node_status(found, "table")] == [
        ["NODE", "SKYHOOK", "STATUS", "PACKAGES"],
        ["n1", "gpu-init", "in_progress", "1/2"],
        ["n1", "tuning", "complete", "1/1"],
    ]
    wide = [line.split() for line in render_node_status(found, "wide")]
    assert wide[0] == ["NODE", "SKYHOOK", "PACKAGE", "VERSION", "STAGE", "STATE", "RESTARTS"]
    assert ["n1", "gpu-init", "nic", "2.0", "apply", IN_PROGRESS, "2"] in wide
    only = summaries(nodes, SKYHOOK, "tuning", warn=print)
    assert [(s.nodeName, s.skyhookName) for s in only] == [("n1", "tuning")]
    # A regular expression matches whole names, as upstream's.
    assert [n["metadata"]["name"] for n in select_nodes(nodes, ["n."])] == ["n1", "n2"]
    assert select_nodes(nodes, ["n"]) == []


def test_rule_an_unreadable_node_is_skipped_with_a_warning_and_the_others_shown() -> None:
    warned: list[str] = []
    nodes = [node("bad", **{GPU: "{not json"}), node("good", **{GPU: DONE})]
    found = summaries(nodes, SKYHOOK, "gpu-init", warn=warned.append)
    assert [s.nodeName for s in found] == ["good"]
    assert len(warned) == 1 and "bad" in warned[0] and GPU in warned[0]


def test_rule_package_status_lists_the_package_on_each_node_with_its_image_when_wide() -> None:
    nodes = [node("n1", **{GPU: HALF}), node("n2", **{GPU: BROKEN}), node("n3", **{GPU: {}})]
    found = summaries(nodes, SKYHOOK, "gpu-init", warn=print)
    wide = [line.split() for line in render_package_status("gpu-init", "driver", found, "wide")]
    assert wide == [
        ["NODE", "PACKAGE", "VERSION", "STAGE", "STATE", "RESTARTS", "IMAGE"],
        ["n1", "driver", "1.0", "config", COMPLETE, "0", "r/driver"],
        ["n2", "driver", "1.0", "apply", ERRORING, "3", "r/driver"],
    ]
    as_json = json.loads(render_package_status("gpu-init", "nic", found, "json")[0])
    assert as_json == [{"nodeName": "n1", **package_rows({"nic|2.0": HALF["nic|2.0"]})[0].__dict__}]
    assert render_package_status("gpu-init", "absent", found, "table") == [
        'No package status found for skyhook "gpu-init"'
    ]


def test_rule_an_entry_without_name_or_version_takes_them_from_its_key() -> None:
    (row,) = package_rows({"driver|1.2": {"stage": "apply", "state": COMPLETE}})
    assert (row.name, row.version, row.restarts) == ("driver", "1.2", 0)


def deployment(*images: tuple[str, str]) -> dict[str, Any]:
    containers = [{"name": name, "image": image} for name, image in images]
    return {"spec": {"template": {"spec": {"containers": containers}}}}


@pytest.mark.parametrize(
    ("found", "version"),
    [
        (deployment(("maintenance-scheduler", "ghcr.io/x/nodeflow:0.4.2")), "0.4.2"),
        (deployment(("sidecar", "a:1"), ("maintenance-scheduler", "r:5000/n:v1")), "v1"),
        (deployment(("maintenance-scheduler", "r/n@sha256:abc")), "sha256:abc"),
        (deployment(("maintenance-scheduler", "registry:5000/nodeflow")), "latest"),
        (deployment(("maintenance-scheduler", "")), "unknown (Deployment ns/"),
        (None, "unknown (no Deployment maintenance-scheduler in ns)"),
    ],
)
def test_rule_the_controller_version_is_its_deployments_image_tag(
    found: dict[str, Any] | None, version: str
) -> None:
    assert controller_version(found, "ns").startswith(version)
