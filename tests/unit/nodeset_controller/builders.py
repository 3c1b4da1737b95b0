"""Small builders of raw Kubernetes objects and Slurm states for the NodeSet rule tests."""

from __future__ import annotations

import dataclasses
from typing import Any

from nodeflow_contracts.pod_protocol import (
    CLAIM_ANNOTATION,
    NODESET_LABEL,
    REVISION_LABEL,
    SLURM_DELETE_CONDITION,
    SLURM_NOT_REGISTERED_REASON,
    slurm_state_condition,
)
from nodeflow_contracts.slurm import SlurmClusterStatus, SlurmNodeState
from nodeflow_kube.fields import (
    rfc3339,
)
from nodeset_controller.podstate import PodState, pod_state
from nodeset_controller.spec import Defaults

NS = "slurm"
CLUSTER = "a"
T0 = 1_700_000_000.0
# How long before T0 a pod marked with SlurmDelete (and no time given) was marked.
MARKED_BEFORE = 60.0
TEMPLATE_SPEC: dict[str, Any] = {
    "containers": [
        {"name": "slurmd", "image": "slurmd:24.11", "resources": {"requests": {"cpu": "2"}}}
    ]
}


def node(
    name: str,
    ip: str | None = "10.0.1.1",
    *,
    labels: dict[str, str] | None = None,
    taints: list[dict[str, str]] | None = None,
    allocatable: dict[str, str] | None = None,
    claim: str | None = None,
    rv: str = "1",
    unschedulable: bool = False,
) -> dict[str, Any]:
    addresses = [{"type": "Hostname", "address": name}]
    if ip is not None:
        addresses.append({"type": "InternalIP", "address": ip})
    annotations = {CLAIM_ANNOTATION: claim} if claim else {}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "uid": f"uid-{name}",
            "resourceVersion": rv,
            "labels": {"kubernetes.io/hostname": name, **(labels or {})},
            "annotations": annotations,
        },
        "spec": {"taints": taints or [], "unschedulable": unschedulable},
        "status": {
            "addresses": addresses,
            "allocatable": allocatable or {"cpu": "8", "memory": "32Gi", "pods": "110"},
        },
    }


def nodeset(
    name: str = "gpu",
    *,
    replicas: int | None = 3,
    template_spec: dict[str, Any] | None = None,
    max_unavailable: Any = None,
    strategy: str | None = None,
    extra: dict[str, Any] | None = None,
    status: dict[str, Any] | None = None,
    rv: str = "10",
    generation: int = 1,
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "slurmCluster": CLUSTER,
        "template": {
            "metadata": {"labels": {"app": "slurmd"}},
            "spec": template_spec or TEMPLATE_SPEC,
        },
    }
    if replicas is not None:
        spec["replicas"] = replicas
    update: dict[str, Any] = {}
    if strategy is not None:
        update["type"] = strategy
    if max_unavailable is not None:
        update["rollingUpdate"] = {"maxUnavailable": max_unavailable}
    if update:
        spec["updateStrategy"] = update
    spec.update(extra or {})
    obj: dict[str, Any] = {
        "apiVersion": "nodeflow.dev/v1alpha1",
        "kind": "NodeSet",
        "metadata": {
            "name": name,
            "namespace": NS,
            "uid": f"uid-nodeset-{name}",
            "resourceVersion": rv,
            "generation": generation,
        },
        "spec": spec,
    }
    if status is not None:
        obj["status"] = status
    return obj


def pod(
    name: str,
    node_name: str | None,
    *,
    nodeset_name: str = "gpu",
    ready: bool = True,
    revision: str = "rev",
    delete_reason: str | None = None,
    delete_since: float | None = None,
    delete_message: str | None = None,
    created: float = T0,
    phase: str | None = None,
    terminating: bool = False,
    rv: str = "5",
    requests: dict[str, str] | None = None,
    not_registered_since: float | None = None,
    phase_missing: bool = False,
    ready_since: float | None = None,
) -> dict[str, Any]:
    """`ready_since`: the Ready condition's lastTransitionTime (none written when None)."""
    readiness: dict[str, Any] = {"type": "Ready", "status": "True" if ready else "False"}
    if ready_since is not None:
        readiness["lastTransitionTime"] = rfc3339(ready_since)
    conditions: list[dict[str, Any]] = [readiness]
    if not_registered_since is not None:
        conditions.append(
            {
                "type": slurm_state_condition("Unknown"),
                "status": "True",
                "reason": SLURM_NOT_REGISTERED_REASON,
                "message": "node not registered in Slurm",
                "lastTransitionTime": rfc3339(not_registered_since),
            }
        )
    if delete_reason is not None:
        conditions.append(
            {
                "type": SLURM_DELETE_CONDITION,
                "status": "True",
                "reason": delete_reason,
                # By default the mark was set a minute before T0: Slurm was read since.
                "lastTransitionTime": rfc3339(
                    delete_since if delete_since is not None else T0 - MARKED_BEFORE
                ),
                **({"message": delete_message} if delete_message is not None else {}),
            }
        )
    meta: dict[str, Any] = {
        "name": name,
        "namespace": NS,
        "uid": f"uid-{name}",
        "resourceVersion": rv,
        "creationTimestamp": rfc3339(created),
        "labels": {NODESET_LABEL: nodeset_name, REVISION_LABEL: revision},
    }
    if terminating:
        meta["deletionTimestamp"] = rfc3339(created + 1)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {
            "nodeName": node_name,
            "containers": [
                {"name": "c", "image": "i", "resources": {"requests": requests or {"cpu": "2"}}}
            ],
        },
        "status": (
            {"conditions": conditions}
            if phase_missing
            else {"phase": phase or "Running", "conditions": conditions}
        ),
    }


def slurm(
    name: str,
    *,
    busy: bool = False,
    drain: bool = False,
    known: bool = True,
    down: bool = False,
) -> SlurmNodeState:
    if not known:
        return SlurmNodeState(cluster=CLUSTER, name=name, known=False, base_state="Unknown")
    flags: tuple[str, ...] = ("Drain",) if drain else ()
    if down:
        flags += ("NotResponding",)
    return SlurmNodeState(
        cluster=CLUSTER,
        name=name,
        known=True,
        base_state="Down" if down else "Allocated" if busy else "Idle",
        reason="Not responding" if down else "",
        flags=flags,
        busy=busy,
        drain=drain,
        drained=drain and not busy,
        draining=drain and busy,
    )


def cluster_status(
    *,
    last_success_at: float = T0,
    reachable: bool = True,
    poll_interval: float = 10.0,
    nodes_revision: int = 1,
) -> SlurmClusterStatus:
    """slurm-syncer's status of CLUSTER: by default polled successfully at T0, its node
    states written up to `slurm_nodes` sequence `nodes_revision`."""
    return SlurmClusterStatus(
        cluster=CLUSTER,
        reachable=reachable,
        last_poll_at=last_success_at,
        last_success_at=last_success_at,
        poll_interval_seconds=poll_interval,
        nodes_revision=nodes_revision,
    )


def state(
    raw_pod: dict[str, Any],
    slurm_state: SlurmNodeState | None = None,
    *,
    read_at: float | None = None,
) -> PodState:
    """The pod as the rules see it; `read_at`: when its cluster was last polled successfully
    (what the plan adds for a pod on its way out)."""
    result = pod_state(raw_pod, slurm_state)
    return dataclasses.replace(result, slurm_read_at=read_at) if read_at is not None else result


DEFAULTS = Defaults()
