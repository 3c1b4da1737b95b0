"""Facts about raw pods that every placement phase reads."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from nodeflow_kube.fields import (
    Obj,
    mapping,
    meta,
    name_of,
    namespace_of,
    parse_time,
    resource_version_of,
    sequence,
    uid_of,
)
from nodeflow_kube.projections import (
    NODE_POOL_PARTS,
    POD_TEMPLATE_PARTS,
    kept_node,
    kept_pod,
    share_parts,
)

TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})
POD_SCHEDULED = "PodScheduled"
DISRUPTION_TARGET = "DisruptionTarget"


def spec(obj: Obj) -> Obj:
    return mapping(obj.get("spec"))


def status(obj: Obj) -> Obj:
    return mapping(obj.get("status"))


def node_name_of(pod: Obj) -> str:
    return str(spec(pod).get("nodeName") or "")


def nominated_node_of(pod: Obj) -> str:
    return str(status(pod).get("nominatedNodeName") or "")


def phase_of(pod: Obj) -> str:
    return str(status(pod).get("phase") or "Pending")


def is_terminal(pod: Obj) -> bool:
    return phase_of(pod) in TERMINAL_PHASES


def is_deleting(obj: Obj) -> bool:
    return meta(obj).get("deletionTimestamp") is not None


def priority_of(pod: Obj) -> int:
    raw = spec(pod).get("priority")
    return raw if isinstance(raw, int) and not isinstance(raw, bool) else 0


def scheduler_of(pod: Obj) -> str:
    return str(spec(pod).get("schedulerName") or "default-scheduler")


def is_pending(pod: Obj) -> bool:
    """Waiting for a node: not bound, not finished, not being deleted."""
    return not node_name_of(pod) and not is_terminal(pod) and not is_deleting(pod)


def occupies_node(pod: Obj) -> bool:
    """Charged to its node: bound and not finished (a terminating pod still holds its
    resources until it is gone, as in kube-scheduler)."""
    return bool(node_name_of(pod)) and not is_terminal(pod)


def charged_node(pod: Obj) -> tuple[str, bool] | None:
    """The node a pod is charged to and whether only by its nomination, or None: the same as
    `occupies_node` (bound, not finished) else `is_pending` with a nomination, read in one go
    because every pass asks it of every pod in the cluster."""
    pod_status = mapping(pod.get("status"))
    if str(pod_status.get("phase") or "Pending") in TERMINAL_PHASES:
        return None
    node = mapping(pod.get("spec")).get("nodeName")
    if node:
        return str(node), False
    nominated = pod_status.get("nominatedNodeName")
    if nominated and not is_deleting(pod):
        return str(nominated), True
    return None


def owner_name(pod: Obj) -> str:
    """The controller that owns the pod (its job), or the pod itself."""
    for owner in meta(pod).get("ownerReferences") or []:
        if isinstance(owner, Mapping) and owner.get("name"):
            return str(owner["name"])
    return name_of(pod)


def created_at(obj: Obj) -> float | None:
    return parse_time(meta(obj).get("creationTimestamp"))


@dataclass(frozen=True, slots=True)
class PodRef:
    namespace: str
    name: str
    uid: str
    resource_version: str

    @property
    def display(self) -> str:
        return f"{self.namespace}/{self.name}"


def ref_of(obj: Obj) -> PodRef:
    return PodRef(namespace_of(obj), name_of(obj), uid_of(obj), resource_version_of(obj))


_STATUS_FIELDS = ("phase", "nominatedNodeName")
# The only pod conditions a placement reads (kubelet's four others are most of a status): of
# a pending pod the PodScheduled it may rewrite; of a bound pod whether it is a victim.
_READ_CONDITIONS = frozenset({POD_SCHEDULED, DISRUPTION_TARGET})
_BOUND_READ_CONDITIONS = frozenset({DISRUPTION_TARGET})
# What a placement reads of a bound pod's spec: its node, priority and scheduler, and what it
# charges its node. Not what filters nodes for a pending pod (but its hostPorts and required
# anti-affinity, which the inter-pod filters read of pods already placed: _keep_interpod)
# nor anything else a pass never looks at.
_BOUND_SPEC_FIELDS = frozenset(
    {
        "nodeName",
        "priority",
        "schedulerName",
        "containers",
        "initContainers",
        "overhead",
        "resources",
        # The Workload API's PodGroup it belongs to: its disruption mode (preemption.py).
        "schedulingGroup",
    }
)


# The parts of a kept pod or node that the objects of one template (a job's pods, a node
# pool) hold alike, each held once (share_parts): at 50,000 pods the dicts of these parts
# were half of what the placer kept. A pod's status too: of a bound pod nearly always just
# its phase.
_SHARED_POD_PARTS = (*POD_TEMPLATE_PARTS, ("status",))


def placement_fields(pod: dict[str, Any]) -> dict[str, Any]:
    """The pod as the placer keeps it in its view (its KVView projection): all of metadata
    (but kubectl's last-applied copy); of status the phase and the nomination; of each
    container its name, resources, restartPolicy and ports with a hostPort. Of a pending pod
    all of spec but volumes (except its claim volumes) and the rest of its containers;
    its PodScheduled and DisruptionTarget conditions. Of a bound pod only the spec fields a
    placement reads of it (node, priority, scheduler, what it requests, its required
    anti-affinity, its PersistentVolumeClaim volumes) and its DisruptionTarget. The placer
    keeps every pod of the cluster, most of them bound: this is a fraction of a real pod's
    size."""
    pod_spec = spec(pod)
    if not pod_spec.get("nodeName"):
        kept = kept_pod(pod, status_fields=_STATUS_FIELDS, conditions=_READ_CONDITIONS)
        # The claims whose volume topology filters its nodes (volumes.py) and the generic
        # ephemeral volumes, for which it is refused.
        _keep_claim_volumes(kept["spec"], pod_spec, ("persistentVolumeClaim", "ephemeral"))
    else:
        kept = kept_pod(
            pod,
            status_fields=_STATUS_FIELDS,
            conditions=_BOUND_READ_CONDITIONS,
            dropped_spec=[key for key in pod_spec if key not in _BOUND_SPEC_FIELDS],
        )
        if not kept["status"].get("conditions"):
            kept["status"].pop("conditions", None)
        anti = mapping(mapping(pod_spec.get("affinity")).get("podAntiAffinity")).get(
            "requiredDuringSchedulingIgnoredDuringExecution"
        )
        if anti:
            kept["spec"]["affinity"] = {
                "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": anti}
            }
        # The claims it uses: a ReadWriteOncePod one is then no other pod's (volumes.py).
        _keep_claim_volumes(kept["spec"], pod_spec, ("persistentVolumeClaim",))
    _keep_host_ports(kept["spec"], pod_spec)
    return share_parts(kept, _SHARED_POD_PARTS)


def _keep_claim_volumes(kept_spec: dict[str, Any], pod_spec: Obj, keys: tuple[str, ...]) -> None:
    """Of spec.volumes only those of `keys` (a generic ephemeral one without its template)."""
    if not pod_spec.get("volumes"):
        return
    claims = [
        {"name": volume.get("name"), key: {} if key == "ephemeral" else volume[key]}
        for volume in map(mapping, sequence(pod_spec.get("volumes")))
        for key in keys
        if volume.get(key) is not None
    ]
    if claims:
        kept_spec["volumes"] = claims


def _keep_host_ports(kept_spec: dict[str, Any], pod_spec: Obj) -> None:
    """Of each container's ports only those with a hostPort (the NodePorts filter's input)."""
    for key in ("containers", "initContainers"):
        raw, kept = pod_spec.get(key), kept_spec.get(key)
        if not isinstance(raw, list) or not isinstance(kept, list):
            continue
        for entry, kept_entry in zip(raw, kept, strict=False):
            ports = [p for p in sequence(mapping(entry).get("ports")) if mapping(p).get("hostPort")]
            if ports:
                kept_entry["ports"] = ports


def placement_node_fields(node: dict[str, Any]) -> dict[str, Any]:
    """The node as the placer keeps it: metadata but its annotations (a placement reads none
    of a node's), spec whole (taints, unschedulable), of status what fit reads: allocatable,
    capacity and of its conditions the Ready one's status (not kubelet's other conditions,
    heartbeats, images, addresses or system info)."""
    kept = kept_node(node, ("allocatable", "capacity"))
    kept["metadata"] = {key: value for key, value in meta(node).items() if key != "annotations"}
    conditions = mapping(node.get("status")).get("conditions")
    if isinstance(conditions, list):
        kept["status"]["conditions"] = [
            {"type": "Ready", "status": entry.get("status")}
            for entry in map(mapping, conditions)
            if entry.get("type") == "Ready"
        ][:1]
    return share_parts(kept, NODE_POOL_PARTS)
