"""Slurm node lifecycle wiring: slurmd inside a NodeSet pod registers and vanishes with it.

A pod labelled `nodeflow.dev/nodeset` that becomes Ready registers a Slurm node named after
the pod (IDLE, CPUs/memory/GPUs from the pod's requests, else its node's capacity). When the
pod goes away, reaches a terminal phase or stops being Ready (its node died), the Slurm node is
marked lost (DOWN+NOT_RESPONDING); when it is Ready again, slurmd registers again. Pods
labelled `nodeflow.dev/slurm-cluster=<name>` go to that emulated cluster, others to the default.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Protocol

import structlog

from clustersim.cluster.loop import Controller, Obj, pod_key
from clustersim.cluster.podlife import is_pod_ready
from clustersim.cluster.scheduling import pod_requests
from clustersim.kube.errors import NotFound
from clustersim.kube.store import Store
from nodeflow_kube.quantity import parse_resources

log = structlog.get_logger("clustersim.slurmwire")

NODESET_LABEL = "nodeflow.dev/nodeset"
SLURM_CLUSTER_LABEL = "nodeflow.dev/slurm-cluster"
GPU_RESOURCE = "nvidia.com/gpu"
MIB = 2**20

PodKey = tuple[str, str]


class SlurmNodeSink(Protocol):
    """The part of an emulated slurmctld that slurmd start/stop talks to."""

    def register_node(
        self,
        name: str,
        cpus: int,
        real_memory: int,
        gres: str = "",
        *,
        hostname: str | None = None,
        address: str | None = None,
        features: Sequence[str] = (),
        partitions: Sequence[str] = (),
        dynamic: bool = False,
    ) -> None: ...

    def mark_lost(self, name: str) -> None: ...


@dataclass(frozen=True)
class SlurmdRegistration:
    """What slurmd reports about itself when it starts in a pod."""

    cluster: str
    name: str
    cpus: int
    real_memory_mib: int
    gres: str
    hostname: str
    address: str
    features: tuple[str, ...]


def registration_for(pod: Obj, node: Obj | None, default_cluster: str) -> SlurmdRegistration:
    """Resources come from the pod's requests; unrequested ones from the node's capacity."""
    labels = pod["metadata"].get("labels") or {}
    requests = pod_requests(pod)
    capacity = parse_resources(((node or {}).get("status") or {}).get("capacity"))

    def amount(resource: str) -> Fraction:
        requested = requests.get(resource, Fraction(0))
        return requested if requested > 0 else capacity.get(resource, Fraction(0))

    gpus = int(amount(GPU_RESOURCE))
    status = pod.get("status") or {}
    return SlurmdRegistration(
        cluster=str(labels.get(SLURM_CLUSTER_LABEL) or default_cluster),
        name=pod["metadata"]["name"],
        cpus=max(1, math.ceil(amount("cpu"))),
        real_memory_mib=int(amount("memory") // MIB),
        gres=f"gpu:{gpus}" if gpus > 0 else "",
        hostname=pod["metadata"]["name"],
        address=str(status.get("podIP") or status.get("hostIP") or pod["metadata"]["name"]),
        features=(str(labels[NODESET_LABEL]),),
    )


def slurmd_should_run(pod: Obj | None) -> bool:
    """slurmd runs while the pod is Ready; a terminating pod's slurmd runs until it is killed."""
    if pod is None:
        return False
    if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
        return False
    return is_pod_ready(pod)


class SlurmdRegistry:
    """Which NodeSet pods have a registered slurmd, in which cluster, and the register/lose
    calls to the emulated slurmctlds. The same for the simulator's own store
    (SlurmNodeWiring) and for the pods of a real API server (clustersim.bridge)."""

    def __init__(
        self,
        clusters: Callable[[str], SlurmNodeSink | None] | Mapping[str, SlurmNodeSink],
        default_cluster: str,
    ) -> None:
        self._clusters = clusters
        self.default_cluster = default_cluster
        self._registered: dict[PodKey, tuple[str, str]] = {}  # pod -> (uid, cluster)

    def cluster(self, name: str) -> SlurmNodeSink | None:
        if isinstance(self._clusters, Mapping):
            return self._clusters.get(name)
        return self._clusters(name)

    def registered(self) -> set[PodKey]:
        return set(self._registered)

    def will_register(self, key: PodKey, pod: Obj | None) -> bool:
        """Whether `apply(key, pod, ...)` registers a slurmd (so it needs the pod's node)."""
        if pod is None or not slurmd_should_run(pod):
            return False
        registered = self._registered.get(key)
        return registered is None or registered[0] != pod["metadata"]["uid"]

    def apply(self, key: PodKey, pod: Obj | None, node: Obj | None) -> None:
        """Bring the Slurm side in line with the pod (None: gone, or not a NodeSet pod):
        a slurmd that stopped, or belongs to an earlier pod of the same name, is lost; one
        that should run and is not registered registers (with `node`, the pod's node)."""
        if pod is not None and NODESET_LABEL not in (pod["metadata"].get("labels") or {}):
            pod = None
        registered = self._registered.get(key)
        uid = pod["metadata"]["uid"] if pod is not None else None
        if registered is not None and (registered[0] != uid or not slurmd_should_run(pod)):
            self._lose(key, key[1], registered[1])
            registered = None
        if registered is None and pod is not None and slurmd_should_run(pod):
            self._register(key, pod, node)

    def _register(self, key: PodKey, pod: Obj, node: Obj | None) -> None:
        reg = registration_for(pod, node, self.default_cluster)
        cluster = self.cluster(reg.cluster)
        if cluster is None:
            log.warning("no such slurm cluster", cluster=reg.cluster, pod=reg.name)
            return
        cluster.register_node(
            reg.name,
            reg.cpus,
            reg.real_memory_mib,
            reg.gres,
            hostname=reg.hostname,
            address=reg.address,
            features=reg.features,
        )
        self._registered[key] = (str(pod["metadata"]["uid"]), reg.cluster)
        log.info("slurm node registered", cluster=reg.cluster, node=reg.name, cpus=reg.cpus)

    def _lose(self, key: PodKey, name: str, cluster_name: str) -> None:
        self._registered.pop(key, None)
        cluster = self.cluster(cluster_name)
        if cluster is None:
            return
        try:
            cluster.mark_lost(name)
        except Exception as exc:  # the node may have been deleted through the REST API
            log.info("slurm node already gone", cluster=cluster_name, node=name, error=str(exc))
            return
        log.info("slurm node lost", cluster=cluster_name, node=name)


class SlurmNodeWiring(Controller[PodKey]):
    name = "slurm-wiring"
    watched = ("pods",)

    def __init__(
        self,
        store: Store,
        clusters: Callable[[str], SlurmNodeSink | None] | Mapping[str, SlurmNodeSink],
        default_cluster: str,
    ) -> None:
        super().__init__(store)
        self.registry = SlurmdRegistry(clusters, default_cluster)

    @property
    def default_cluster(self) -> str:
        return self.registry.default_cluster

    def cluster(self, name: str) -> SlurmNodeSink | None:
        return self.registry.cluster(name)

    def keys_for(self, resource: str, event: str, obj: Obj, old: Obj | None) -> Iterable[PodKey]:
        for candidate in (obj, old):
            if candidate is not None and NODESET_LABEL in (
                candidate["metadata"].get("labels") or {}
            ):
                return (pod_key(obj),)
        return ()

    def initial_keys(self) -> Iterable[PodKey]:
        return [pod_key(p) for p in self.store.list("pods", label_selector=NODESET_LABEL).items]

    def reconcile(self, key: PodKey) -> float | None:
        namespace, name = key
        try:
            pod: Obj | None = self.store.peek("pods", name, namespace)
        except NotFound:
            pod = None
        node: Obj | None = None
        node_name = (pod or {}).get("spec", {}).get("nodeName")
        if node_name and self.registry.will_register(key, pod):
            try:
                node = self.store.peek("nodes", node_name)
            except NotFound:
                node = None
        self.registry.apply(key, pod, node)
        return None
