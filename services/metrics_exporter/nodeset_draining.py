"""`nodeflow_nodeset_draining{namespace,nodeset}`: a NodeSet's nodes that are draining in
Slurm (Drain and Busy: jobs still running), beside `kube_sunk_nodeset_drained` (the status's
numberDrain, drained: Drain and not Busy). The NodeSet status has no field for it, so it is
counted at scrape time from the NodeSet pods (`k8s_pods`, only their names and labels are
decoded) and the Slurm states slurm-syncer keeps in `slurm_nodes`.

A pod's Slurm node is named after the pod, in its NodeSet's `spec.slurmCluster` (else the
pod's cluster label). An unknown state is not counted (it is neither drained nor draining).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

import msgspec
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from metrics_exporter.nodesets import NODESET_LABELS
from nodeflow_contracts import subjects
from nodeflow_contracts.pod_protocol import NODESET_LABEL, SLURM_CLUSTER_LABEL
from nodeflow_contracts.slurm import SlurmNodeState

METRIC = "nodeflow_nodeset_draining"
HELP = "Number of the NodeSet's nodes draining in Slurm (drain set, jobs still running)."


class PodMetadata(msgspec.Struct):
    name: str = ""
    namespace: str = ""
    labels: dict[str, Any] | None = None


class PodOwnership(msgspec.Struct):
    """A pod as far as this series needs it: which NodeSet, and its Slurm cluster label."""

    metadata: PodMetadata = msgspec.field(default_factory=PodMetadata)


class ItemSource(Protocol):
    def items(self) -> list[tuple[str, Any]]: ...


class StateLookup(Protocol):
    def get(self, key: str, /) -> SlurmNodeState | None: ...


def _label(pod: PodOwnership, name: str) -> str | None:
    value = (pod.metadata.labels or {}).get(name)
    return value if isinstance(value, str) and value else None


def _slurm_cluster(nodeset: dict[str, Any]) -> str | None:
    spec = nodeset.get("spec")
    cluster = spec.get("slurmCluster") if isinstance(spec, dict) else None
    return cluster if isinstance(cluster, str) and cluster else None


def draining_by_nodeset(
    nodesets: Iterable[tuple[str, dict[str, Any]]],
    pods: Iterable[tuple[str, PodOwnership]],
    slurm: StateLookup,
) -> dict[tuple[str, str], int]:
    """(namespace, nodeset) -> its pods whose Slurm node is draining; every NodeSet present."""
    counts: dict[tuple[str, str], int] = {}
    clusters: dict[tuple[str, str], str | None] = {}
    for key, obj in nodesets:
        namespace, name = subjects.split_object_key(key)
        counts[(namespace or "", name)] = 0
        clusters[(namespace or "", name)] = _slurm_cluster(obj)
    for _, pod in pods:
        owner = _label(pod, NODESET_LABEL)
        if owner is None:
            continue
        nodeset = (pod.metadata.namespace, owner)
        if nodeset not in counts:
            continue
        cluster = clusters[nodeset] or _label(pod, SLURM_CLUSTER_LABEL)
        if cluster is None or not pod.metadata.name:
            continue
        try:
            state = slurm.get(subjects.slurm_node_key(cluster, pod.metadata.name))
        except ValueError:  # a name that cannot be a KV key has no state
            continue
        if state is not None and state.known and state.draining:
            counts[nodeset] += 1
    return counts


class NodeSetDrainingCollector(Collector):
    def __init__(self, nodesets: ItemSource, pods: ItemSource, slurm: StateLookup) -> None:
        self._nodesets = nodesets
        self._pods = pods
        self._slurm = slurm

    def describe(self) -> Iterable[Metric]:
        return [GaugeMetricFamily(METRIC, HELP, labels=NODESET_LABELS)]

    def collect(self) -> Iterable[Metric]:
        family = GaugeMetricFamily(METRIC, HELP, labels=NODESET_LABELS)
        counts = draining_by_nodeset(self._nodesets.items(), self._pods.items(), self._slurm)
        for (namespace, name), count in sorted(counts.items()):
            family.add_metric([namespace, name], count)
        return [family]
