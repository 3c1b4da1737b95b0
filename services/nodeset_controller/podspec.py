"""Rule 3, pod creation, and rule 7's revision: the pod a NodeSet runs on one node."""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Mapping
from typing import Any

from nodeflow_contracts.pod_protocol import NODESET_LABEL, REVISION_LABEL, SLURM_CLUSTER_LABEL
from nodeflow_kube.fields import (
    mapping,
    sequence,
)
from nodeset_controller.objects import owned_by_nodeset
from nodeset_controller.spec import NodeSetSpec


def canonical_json(value: Any) -> bytes:
    """The same bytes for equal values, whatever the key order."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def revision_hash(template_spec: Mapping[str, Any]) -> str:
    """The revision of `.spec.template.spec`: stable across processes and key order, and a
    valid label value."""
    return hashlib.sha256(canonical_json(template_spec)).hexdigest()[:10]


def pinned_affinity(affinity: Any, node: str) -> dict[str, Any]:
    """The template's affinity with its node affinity replaced by one required term that
    matches exactly `node` (matchFields metadata.name); pod (anti-)affinity is kept."""
    pinned = {k: copy.deepcopy(v) for k, v in mapping(affinity).items() if k != "nodeAffinity"}
    pinned["nodeAffinity"] = {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
            ]
        }
    }
    return pinned


def with_lock_toleration(tolerations: Any, key: str) -> list[Any]:
    """The tolerations with one for every effect of the lock taint `key` (the reference's
    `sunk.coreweave.com/lock` unless configured otherwise)."""
    found = [copy.deepcopy(t) for t in sequence(tolerations)]
    if not any(
        mapping(t).get("key") == key
        and mapping(t).get("operator") == "Exists"
        and not mapping(t).get("effect")
        for t in found
    ):
        found.append({"key": key, "operator": "Exists"})
    return found


def placement_spec(nodeset: NodeSetSpec) -> dict[str, Any]:
    """The template's pod spec as the feasibility check must see it: with the lock
    toleration the controller adds."""
    spec = dict(nodeset.template_spec)
    spec["tolerations"] = with_lock_toleration(spec.get("tolerations"), nodeset.lock_toleration_key)
    return spec


def pod_labels(nodeset: NodeSetSpec, revision: str) -> dict[str, str]:
    labels = {
        str(k): str(v)
        for k, v in mapping(mapping(nodeset.template.get("metadata")).get("labels")).items()
    }
    labels[NODESET_LABEL] = nodeset.name
    labels[REVISION_LABEL] = revision
    labels[SLURM_CLUSTER_LABEL] = nodeset.slurm_cluster
    return labels


def selector(nodeset: NodeSetSpec) -> str:
    """The label selector of the NodeSet's pods, as `status.selector` reports it."""
    return f"{NODESET_LABEL}={nodeset.name}"


def build_pod(nodeset: NodeSetSpec, node: str, name: str, revision: str) -> dict[str, Any]:
    template_meta = mapping(nodeset.template.get("metadata"))
    spec = copy.deepcopy(dict(nodeset.template_spec))
    spec["affinity"] = pinned_affinity(spec.get("affinity"), node)
    spec["tolerations"] = with_lock_toleration(spec.get("tolerations"), nodeset.lock_toleration_key)
    # The Slurm node is named after the pod; the hostname makes slurmd agree.
    spec.setdefault("hostname", name)
    metadata: dict[str, Any] = {
        "name": name,
        "namespace": nodeset.namespace,
        "labels": pod_labels(nodeset, revision),
        "ownerReferences": owned_by_nodeset(nodeset.name, nodeset.uid),
    }
    annotations = {str(k): str(v) for k, v in mapping(template_meta.get("annotations")).items()}
    if annotations:
        metadata["annotations"] = annotations
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}
