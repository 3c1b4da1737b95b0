"""`kubectl nodeflow release-claim NODE` against the Kubernetes API emulator, run as an operator
runs it (a process, `--kubeconfig`): it removes a NodeSet's claim only when the NodeSet is gone
(or `--force`, with a warning) and no NodeSet pod is on the node, says what it did, and its
patch tests the node as read, so a claim written since is never removed."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from clustersim.kube.server import RunningServer, serve
from clustersim.kube.store import Store
from clustersim.runner import DEFAULT_CRD_DIR, apply_crds
from nodeflow_cli import claims
from nodeflow_cli.main import ApiStatusError, Kube
from nodeflow_contracts.pod_protocol import CLAIM_ANNOTATION, NODESET_LABEL
from tests.integration.cli.plugin import run_plugin

NODESETS = "nodesets.nodeflow.dev"
NS = "slurm"


def claimed_node(name: str, claim: str | None) -> dict[str, Any]:
    annotations = {CLAIM_ANNOTATION: claim} if claim else {}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "annotations": annotations},
    }


def nodeset_pod(name: str, node: str, *, bound: bool = True) -> dict[str, Any]:
    """A NodeSet pod pinned to `node` as nodeset-controller makes it (bound or not yet)."""
    spec: dict[str, Any] = {
        "containers": [{"name": "slurmd", "image": "slurmd:24.11"}],
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {
                            "matchFields": [
                                {"key": "metadata.name", "operator": "In", "values": [node]}
                            ]
                        }
                    ]
                }
            }
        },
    }
    if bound:
        spec["nodeName"] = node
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "labels": {NODESET_LABEL: "gpu"}},
        "spec": spec,
    }


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[RunningServer]:
    """The emulator with Nodeflow's CRDs; NodeSet slurm/cpu exists, slurm/gpu was deleted."""
    store = Store(bookmark_interval=0.2)
    apply_crds(store, DEFAULT_CRD_DIR)
    store.create("namespaces", {"metadata": {"name": NS}})
    store.create(
        NODESETS,
        {
            "apiVersion": "nodeflow.dev/v1alpha1",
            "kind": "NodeSet",
            "metadata": {"name": "cpu", "namespace": NS},
            "spec": {
                "slurmCluster": "sim",
                "template": {"spec": {"containers": [{"name": "slurmd", "image": "slurmd"}]}},
            },
        },
        NS,
    )
    async with serve(store, kubeconfig_path=tmp_path / "kubeconfig") as server:
        yield server


async def release_claim(server: RunningServer, *args: str) -> tuple[int, str, str]:
    """The plugin's exit code, stdout and stderr."""
    return await run_plugin(server.kubeconfig_path, "release-claim", *args)


def claim_on(server: RunningServer, node: str) -> str | None:
    return claims.claim_of(server.store.get("nodes", node))


async def test_rule_release_claim_removes_a_deleted_nodesets_claim_and_says_so(
    cluster: RunningServer,
) -> None:
    cluster.store.create("nodes", claimed_node("gpu-1", f"{NS}.gpu"))
    code, output, errors = await release_claim(cluster, "gpu-1")
    assert code == 0, errors
    assert output.strip() == (
        "node/gpu-1 claim released (was NodeSet slurm/gpu; NodeSet slurm/gpu no longer "
        "exists; no NodeSet pod on the node)"
    )
    assert claim_on(cluster, "gpu-1") is None
    # Run again: nothing left to release, and nothing is written.
    rv = cluster.store.get("nodes", "gpu-1")["metadata"]["resourceVersion"]
    code, output, _ = await release_claim(cluster, "gpu-1")
    assert (code, output.strip()) == (0, "node/gpu-1 has no NodeSet claim: nothing to release")
    assert cluster.store.get("nodes", "gpu-1")["metadata"]["resourceVersion"] == rv


async def test_rule_release_claim_keeps_a_live_nodesets_claim_unless_forced_with_a_warning(
    cluster: RunningServer,
) -> None:
    cluster.store.create("nodes", claimed_node("cpu-1", f"{NS}.cpu"))
    code, output, errors = await release_claim(cluster, "cpu-1")
    assert code == 1 and output == ""
    assert "NodeSet slurm/cpu still exists" in errors and "--force" in errors
    assert claim_on(cluster, "cpu-1") == f"{NS}.cpu"
    code, output, errors = await release_claim(cluster, "cpu-1", "--force")
    assert code == 0, errors
    assert errors.startswith("warning: NodeSet slurm/cpu still exists (--force)")
    assert output.strip() == (
        "node/cpu-1 claim released (was NodeSet slurm/cpu; forced; no NodeSet pod on the node)"
    )
    assert claim_on(cluster, "cpu-1") is None


async def test_rule_release_claim_never_releases_a_node_a_nodeset_pod_is_on_or_pinned_to(
    cluster: RunningServer,
) -> None:
    """Bound or pinned and not yet bound, a NodeSet pod keeps the claim, even with --force: a
    second NodeSet there would run two slurmd on one node. A finished pod does not."""
    cluster.store.create("nodes", claimed_node("gpu-2", f"{NS}.gpu"))
    cluster.store.create("nodes", claimed_node("gpu-3", f"{NS}.gpu"))
    cluster.store.create("pods", nodeset_pod("gpu-000-002", "gpu-2"), NS)
    cluster.store.create("pods", nodeset_pod("gpu-000-003", "gpu-3", bound=False), NS)
    for node, pod in (("gpu-2", "gpu-000-002"), ("gpu-3", "gpu-000-003")):
        code, output, errors = await release_claim(cluster, node, "--force")
        assert code == 1 and output == "", errors
        assert f"NodeSet pods still on it (slurm/{pod})" in errors
        assert claim_on(cluster, node) == f"{NS}.gpu"
    finished = cluster.store.get("pods", "gpu-000-002", NS)
    finished["status"] = {"phase": "Succeeded"}
    cluster.store.update("pods", finished, NS, subresource="status")
    code, _, errors = await release_claim(cluster, "gpu-2")
    assert code == 0, errors
    assert claim_on(cluster, "gpu-2") is None


async def test_rule_release_claim_patch_never_removes_a_claim_written_since_it_read_the_node(
    cluster: RunningServer,
) -> None:
    """The node is read with slurm/gpu's claim, then slurm/cpu claims it: the release planned on
    the first read is refused by the API server as a whole, and the new claim stays."""
    cluster.store.create("nodes", claimed_node("gpu-4", f"{NS}.gpu"))
    kube = await Kube.connect(str(cluster.kubeconfig_path), "")
    try:
        read = await kube.get("/api/v1/nodes/gpu-4")
        assert read is not None
        release = claims.plan_release(read, nodeset_exists=False, pods_on_node=[], force=False)
        assert release.patch is not None
        await kube.patch(
            "/api/v1/nodes/gpu-4",
            {"metadata": {"annotations": {CLAIM_ANNOTATION: f"{NS}.cpu"}}},
            "application/merge-patch+json",
        )
        with pytest.raises(ApiStatusError):
            await kube.patch("/api/v1/nodes/gpu-4", release.patch, "application/json-patch+json")
    finally:
        await kube.close()
    assert claim_on(cluster, "gpu-4") == f"{NS}.cpu"


async def test_release_claim_of_a_node_that_does_not_exist_fails_with_its_name(
    cluster: RunningServer,
) -> None:
    code, output, errors = await release_claim(cluster, "nowhere")
    assert code == 1 and output == ""
    assert errors.strip() == "error: node nowhere not found"
