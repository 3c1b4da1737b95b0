"""`kubectl nodeflow release-claim NODE` (pure): whether a node's NodeSet claim may be removed,
and the patch that removes it.

nodeset-controller claims a node for one NodeSet with the annotation `CLAIM_ANNOTATION`
(`<namespace>.<name>`) before it creates a pod there, and releases it when the pod is gone and
the node no longer needed. A deleted NodeSet's claims stay (nodeset-controller cannot yet tell a
deletion from a NodeSet leaving its view), and no other NodeSet may use the node until the
annotation goes. It goes here only when that is safe: the claiming NodeSet no longer exists
(`--force` overrides this one check, with a warning), and no NodeSet pod runs on, or is pinned
to, the node. The patch tests the node's resourceVersion and the claim as read, so a claim
written since (another NodeSet's, or the same one's again) is never removed.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from nodeflow_cli.verdicts import Obj
from nodeflow_contracts.pod_protocol import CLAIM_ANNOTATION, NODESET_LABEL

# The claim's path in a JSON patch (RFC 6901: `/` in a key is `~1`).
CLAIM_POINTER = "/metadata/annotations/" + CLAIM_ANNOTATION.replace("~", "~0").replace("/", "~1")


@dataclass(frozen=True)
class ClaimRelease:
    """What `release-claim` does: `patch` to send (None: nothing to send), `message` to print
    (on stdout when it goes ahead or there is nothing to do, as the error when `refused`),
    and `warning` for stderr (a forced release)."""

    patch: list[dict[str, Any]] | None
    message: str
    refused: bool = False
    warning: str = ""


def claim_of(node: Obj) -> str | None:
    """The node's claim (`<namespace>.<name>` of a NodeSet), None when it has none."""
    annotations = (node.get("metadata") or {}).get("annotations") or {}
    value = annotations.get(CLAIM_ANNOTATION)
    return value if isinstance(value, str) and value else None


def claiming_nodeset(claim: str) -> tuple[str, str] | None:
    """(namespace, name) of the claiming NodeSet; a namespace holds no dot, so the claim splits
    at its first. None for a value no controller writes."""
    namespace, dot, name = claim.partition(".")
    return (namespace, name) if dot and namespace and name else None


def nodeset_pods_on(node_name: str, pods: Iterable[Obj]) -> list[str]:
    """`namespace/name` of the NodeSet pods (any NodeSet's) that are not finished and are bound
    to the node or pinned to it (a pod not yet bound lands there), sorted."""
    found = []
    for pod in pods:
        metadata = pod.get("metadata") or {}
        if NODESET_LABEL not in (metadata.get("labels") or {}):
            continue
        if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue
        spec = pod.get("spec") or {}
        if spec.get("nodeName") == node_name or node_name in _pinned_nodes(spec):
            found.append(f"{metadata.get('namespace', '')}/{metadata.get('name', '')}")
    return sorted(found)


def _pinned_nodes(spec: Obj) -> set[str]:
    """The nodes a pod's required node affinity names by `metadata.name` (how a NodeSet pod is
    pinned to its node)."""
    affinity = (spec.get("affinity") or {}).get("nodeAffinity") or {}
    required = affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {}
    names: set[str] = set()
    for term in required.get("nodeSelectorTerms") or []:
        for field in (term or {}).get("matchFields") or []:
            if field.get("key") == "metadata.name" and field.get("operator") == "In":
                names.update(v for v in field.get("values") or [] if isinstance(v, str))
    return names


def plan_release(
    node: Obj, *, nodeset_exists: bool, pods_on_node: list[str], force: bool
) -> ClaimRelease:
    """Whether and how to release `node`'s claim. `nodeset_exists`: the claiming NodeSet was
    found (a claim naming no NodeSet counts as found: nothing proves it gone);
    `pods_on_node`: `nodeset_pods_on` the node."""
    metadata = node.get("metadata") or {}
    title = f"node/{metadata.get('name', '')}"
    claim = claim_of(node)
    if claim is None:
        return ClaimRelease(None, f"{title} has no NodeSet claim: nothing to release")
    target = claiming_nodeset(claim)
    owner = f"NodeSet {target[0]}/{target[1]}" if target else f"claim {claim!r}"
    if pods_on_node:
        return ClaimRelease(
            None,
            f"{title} not released: NodeSet pods still on it ({', '.join(pods_on_node)}); a "
            f"second NodeSet there would run two slurmd on one node. Delete them (or scale "
            f"their NodeSet down) first",
            refused=True,
        )
    warning = ""
    if nodeset_exists:
        if not force:
            still = "still exists" if target else "is not a NodeSet this command can look up"
            return ClaimRelease(
                None,
                f"{title} not released: {owner} {still}, and nodeset-controller releases its "
                f"claims itself once it no longer needs the node. Pass --force to release it "
                f"anyway",
                refused=True,
            )
        warning = (
            f"warning: {owner} still exists (--force): releasing its claim on {title} lets "
            f"another NodeSet take the node; if {owner} still wants the node it claims it "
            f"again, and the first to claim it wins"
        )
    # The node as read: a claim or any change written since makes the patch fail whole.
    patch: list[dict[str, Any]] = [
        {
            "op": "test",
            "path": "/metadata/resourceVersion",
            "value": str(metadata.get("resourceVersion", "")),
        },
        {"op": "test", "path": CLAIM_POINTER, "value": claim},
        {"op": "remove", "path": CLAIM_POINTER},
    ]
    why = "forced" if nodeset_exists else f"{owner} no longer exists"
    return ClaimRelease(
        patch,
        f"{title} claim released (was {owner}; {why}; no NodeSet pod on the node)",
        warning=warning,
    )
