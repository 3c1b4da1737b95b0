"""A pod as the waiting and draining rules see it, read from its raw object (pure)."""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from nodeflow_contracts.pod_protocol import (
    NODESET_LABEL,
    SLURM_CLUSTER_LABEL,
    SLURM_STATE_CONDITION_PREFIX,
)
from nodeflow_contracts.slurm import BASE_STATES, SlurmClusterStatus
from nodeflow_kube.fields import (
    mapping,
    meta,
)
from nodeflow_kube.projections import SharedCopies

MIRROR_ANNOTATION: Final = "kubernetes.io/config.mirror"
TERMINAL_PHASES: Final = frozenset({"Succeeded", "Failed"})
BUSY_BASE_STATES: Final = frozenset({"Allocated", "Mixed"})


@dataclass(frozen=True)
class SlurmView:
    """The Slurm node of a NodeSet pod, from the `SlurmNodeState*` conditions slurm-syncer
    projects onto it. `known` is False when there is no state, the state is Unknown, or the
    state is stale: then the node counts as busy (fail closed)."""

    known: bool
    base_state: str = ""
    flags: frozenset[str] = frozenset()
    reason: str = ""

    @property
    def busy(self) -> bool:
        if not self.known:
            return True
        return self.base_state in BUSY_BASE_STATES or "Completing" in self.flags

    @property
    def drained_and_idle(self) -> bool:
        """No job runs and none can start: drained and idle, or DOWN (slurmctld has ended or
        requeued its jobs already)."""
        if not self.known or self.busy:
            return False
        return "Drain" in self.flags or self.base_state == "Down"

    def describe(self) -> str:
        # The reason says why a state is unknown (stale, cluster unreachable, node not
        # registered) or, for a known one, Slurm's own reason for the node.
        why = f" ({self.reason})" if self.reason else ""
        if not self.known:
            return f"Slurm state unknown{why}"
        flags = "+".join(sorted(self.flags))
        return f"state {self.base_state}{'+' + flags if flags else ''}{why}"


@dataclass(frozen=True, slots=True)
class PodFacts:
    namespace: str
    name: str
    uid: str
    node: str
    labels: Mapping[str, str]
    phase: str
    terminating: bool
    daemonset: bool
    mirror: bool
    has_controller: bool
    empty_dir: bool
    # Names of the resources any regular container requests.
    requested_resources: frozenset[str]
    # The pod's Slurm node, for a NodeSet pod; None for any other pod.
    slurm: SlurmView | None
    slurm_cluster: str

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def terminal(self) -> bool:
        return self.phase in TERMINAL_PHASES


def slurm_view_of(pod: Mapping[str, Any]) -> SlurmView:
    base = ""
    flags: set[str] = set()
    reason = ""
    for entry in mapping(pod.get("status")).get("conditions") or ():
        entry = mapping(entry)
        kind = entry.get("type")
        if not isinstance(kind, str) or not kind.startswith(SLURM_STATE_CONDITION_PREFIX):
            continue
        if entry.get("status") != "True":
            continue
        state = kind[len(SLURM_STATE_CONDITION_PREFIX) :]
        if state in BASE_STATES:
            base = state
            reason = str(entry.get("message") or reason)
        else:
            flags.add(state)
    if not base or base == "Unknown":
        return SlurmView(known=False, reason=reason)
    return SlurmView(known=True, base_state=base, flags=frozenset(flags), reason=reason)


def pod_facts(pod: Mapping[str, Any]) -> PodFacts:
    metadata = meta(pod)
    spec = mapping(pod.get("spec"))
    labels = {str(k): str(v) for k, v in mapping(metadata.get("labels")).items()}
    owners = [mapping(o) for o in metadata.get("ownerReferences") or ()]
    controller = next((o for o in owners if o.get("controller") is True), None)
    requested: set[str] = set()
    for container in spec.get("containers") or ():
        requests = mapping(mapping(mapping(container).get("resources")).get("requests"))
        requested.update(str(name) for name in requests)
    empty_dir = any("emptyDir" in mapping(v) for v in spec.get("volumes") or ())
    nodeset = NODESET_LABEL in labels
    return PodFacts(
        namespace=str(metadata.get("namespace") or ""),
        name=str(metadata.get("name") or ""),
        uid=str(metadata.get("uid") or ""),
        node=str(spec.get("nodeName") or ""),
        labels=labels,
        phase=str(mapping(pod.get("status")).get("phase") or ""),
        terminating=bool(metadata.get("deletionTimestamp")),
        daemonset=controller is not None and controller.get("kind") == "DaemonSet",
        mirror=MIRROR_ANNOTATION in mapping(metadata.get("annotations")),
        has_controller=controller is not None,
        empty_dir=empty_dir,
        requested_resources=frozenset(requested),
        slurm=slurm_view_of(pod) if nodeset else None,
        slurm_cluster=labels.get(SLURM_CLUSTER_LABEL, ""),
    )


# The sets of requested resource names, one copy of each: thousands of pods request the same.
_RESOURCE_SETS: SharedCopies[frozenset[str]] = SharedCopies()


def kept_pod_facts(pod: Mapping[str, Any]) -> PodFacts:
    """The pod as maintenance-scheduler keeps it in its view: its `PodFacts`, the only thing
    its rules read, with one shared copy of what thousands of pods repeat (namespaces, node
    names, phases, label keys and values, resource-name sets). Every pod of the cluster is
    kept, any of them may be on a node to drain: whole, 50,000 pods took most of a gigabyte;
    as projected dicts, 1.6 KB each."""
    facts = pod_facts(pod)
    return dataclasses.replace(
        facts,
        namespace=sys.intern(facts.namespace),
        node=sys.intern(facts.node),
        phase=sys.intern(facts.phase),
        slurm_cluster=sys.intern(facts.slurm_cluster),
        labels={sys.intern(k): sys.intern(v) for k, v in facts.labels.items()},
        requested_resources=_RESOURCE_SETS.of(facts.requested_resources),
    )


def with_fresh_slurm(
    pod: PodFacts,
    clusters: Mapping[str, SlurmClusterStatus],
    now: float,
    max_age_seconds: float | None = None,
) -> PodFacts:
    """A NodeSet pod's Slurm conditions count only while slurm-syncer's view of its cluster
    is fresh: a dead syncer's last word is unknown (fail closed). Conditions with no
    `slurm_clusters` entry for their cluster (none recorded yet, or the bucket lost) are
    unknown too: they live in Kubernetes and outlive the syncer that wrote them, as
    nodeset-controller reads them. A pod without a cluster label belongs to the only cluster
    recorded, if there is just one."""
    if pod.slurm is None or not pod.slurm.known:
        return pod
    cluster = pod.slurm_cluster
    if not cluster and len(clusters) == 1:
        cluster = next(iter(clusters))
    status = clusters.get(cluster) if cluster else None
    if status is None or not status.fresh(now, max_age_seconds):
        return dataclasses.replace(pod, slurm=SlurmView(known=False, reason="stale Slurm state"))
    return pod
