"""`release-claim` (pure, nodeflow_cli.claims): when a node's NodeSet claim may go, and the
patch that removes it only from the node as read."""

from __future__ import annotations

from typing import Any

from nodeflow_cli import claims
from nodeflow_contracts.pod_protocol import CLAIM_ANNOTATION, NODESET_LABEL


def node(claim: str | None, rv: str = "42") -> dict[str, Any]:
    annotations = {CLAIM_ANNOTATION: claim} if claim else {}
    return {"metadata": {"name": "gpu-1", "resourceVersion": rv, "annotations": annotations}}


def test_rule_release_claim_patch_tests_the_resource_version_and_the_claim_then_removes_it() -> (
    None
):
    release = claims.plan_release(
        node("slurm.gpu"), nodeset_exists=False, pods_on_node=[], force=False
    )
    assert release.patch == [
        {"op": "test", "path": "/metadata/resourceVersion", "value": "42"},
        {"op": "test", "path": "/metadata/annotations/nodeflow.dev~1nodeset", "value": "slurm.gpu"},
        {"op": "remove", "path": "/metadata/annotations/nodeflow.dev~1nodeset"},
    ]
    assert not release.refused and release.warning == ""


def test_rule_release_claim_a_claim_naming_no_nodeset_is_kept_unless_forced() -> None:
    """A value no controller writes cannot be looked up: nothing proves its NodeSet gone."""
    assert claims.claiming_nodeset("no-dot") is None
    kept = claims.plan_release(node("no-dot"), nodeset_exists=True, pods_on_node=[], force=False)
    assert kept.refused and kept.patch is None
    assert "claim 'no-dot' is not a NodeSet this command can look up" in kept.message
    forced = claims.plan_release(node("no-dot"), nodeset_exists=True, pods_on_node=[], force=True)
    assert forced.patch is not None and forced.warning.startswith("warning: claim 'no-dot'")


def test_rule_release_claim_counts_unfinished_nodeset_pods_bound_or_pinned_to_the_node() -> None:
    def pod(name: str, **spec: Any) -> dict[str, Any]:
        phase = spec.pop("phase", "Running")
        labels = spec.pop("labels", {NODESET_LABEL: "gpu"})
        return {
            "metadata": {"name": name, "namespace": "slurm", "labels": labels},
            "spec": spec,
            "status": {"phase": phase},
        }

    pinned = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchFields": [
                            {"key": "metadata.name", "operator": "In", "values": ["gpu-1"]}
                        ]
                    }
                ]
            }
        }
    }
    pods = [
        pod("bound", nodeName="gpu-1"),
        pod("pinned", affinity=pinned, phase="Pending"),
        pod("finished", nodeName="gpu-1", phase="Failed"),
        pod("elsewhere", nodeName="gpu-2"),
        pod("not-a-nodeset-pod", nodeName="gpu-1", labels={"app": "x"}),
    ]
    assert claims.nodeset_pods_on("gpu-1", pods) == ["slurm/bound", "slurm/pinned"]
