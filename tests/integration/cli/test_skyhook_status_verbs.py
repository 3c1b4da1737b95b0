"""`kubectl nodeflow skyhook|nodewright node list|status, package status, version` as an
operator runs them (a process, `--kubeconfig`) against the Kubernetes API emulator: they read
the nodes' nodeState annotations of their own group and change nothing."""

from __future__ import annotations

import json

import pytest

from clustersim.kube.server import RunningServer
from nodeflow_contracts.skyhook import NODEWRIGHT, SKYHOOK, SkyhookNames
from tests.integration.cli.test_skyhook_verbs import cli, cluster, entry

__all__ = ["cluster"]  # the emulator fixture: a Skyhook and a NodeWright on n1 and n2


def erroring_on_n2(cluster: RunningServer, names: SkyhookNames) -> None:
    state = {
        "driver|1.0.0": entry("driver", "1.0.0", "apply", "erroring"),
        "tuning|2.0.0": entry("tuning", "2.0.0"),
    }
    cluster.store.patch(
        "nodes",
        "n2",
        {"metadata": {"annotations": {names.node_state_annotation("gpu-init"): json.dumps(state)}}},
        "application/merge-patch+json",
    )


@pytest.mark.parametrize("names", [SKYHOOK, NODEWRIGHT], ids=lambda n: n.kind)
async def test_rule_node_list_status_and_package_status_read_the_groups_node_state(
    cluster: RunningServer, names: SkyhookNames
) -> None:
    config, group = cluster.kubeconfig_path, names.singular
    erroring_on_n2(cluster, names)
    before = cluster.store.get("nodes", "n2")["metadata"]["resourceVersion"]

    code, out = await cli(config, group, "node", "list", f"--{group}", "gpu-init")
    assert code == 0, out
    lines = out.splitlines()
    assert lines[:3] == [
        "Skyhook: gpu-init",
        "",
        "Summary: 2 nodes (1 complete, 1 erroring, 0 in progress)",
    ]
    assert [line.split() for line in lines[5:]] == [
        ["n1", "complete", "2/2"],
        ["n2", "ERRORING", "1/2"],
    ]

    code, out = await cli(config, group, "node", "status", "n[23]", "-o", "json")
    assert code == 0, out
    [n2] = json.loads(out)
    assert (n2["nodeName"], n2["skyhookName"], n2["status"]) == ("n2", "gpu-init", "erroring")

    code, out = await cli(
        config, group, "package", "status", "driver", f"--{group}", "gpu-init", "--node", "n2"
    )
    assert code == 0, out
    assert [line.split() for line in out.splitlines()] == [
        ["NODE", "PACKAGE", "VERSION", "STAGE", "STATE", "RESTARTS"],
        ["n2", "driver", "1.0.0", "apply", "erroring", "0"],
    ]
    code, out = await cli(config, group, "package", "status", "driver", f"--{group}", "absent")
    assert code != 0 and "absent not found" in out
    # Read-only: the node was not written.
    assert cluster.store.get("nodes", "n2")["metadata"]["resourceVersion"] == before


async def test_rule_the_other_group_sees_only_its_own_state(cluster: RunningServer) -> None:
    erroring_on_n2(cluster, NODEWRIGHT)
    code, out = await cli(
        cluster.kubeconfig_path, "skyhook", "node", "list", "--skyhook", "gpu-init"
    )
    assert code == 0 and "Summary: 2 nodes (2 complete, 0 erroring, 0 in progress)" in out, out


async def test_rule_version_names_the_plugin_and_says_why_the_controller_is_unknown(
    cluster: RunningServer,
) -> None:
    code, out = await cli(cluster.kubeconfig_path, "skyhook", "version")
    assert code == 0, out
    assert out.splitlines() == [
        "Nodeflow plugin:\t0.1.0",
        "Skyhook controller:\tunknown (no Deployment maintenance-scheduler in nodeflow-system)",
    ]
    code, out = await cli(cluster.kubeconfig_path, "nodewright", "version", "--client-only")
    assert (code, out.splitlines()) == (0, ["Nodeflow plugin:\t0.1.0"])
