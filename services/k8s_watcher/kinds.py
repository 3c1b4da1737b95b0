"""The Kubernetes kinds k8s-watcher knows: where each lives in the API and how its paths look."""

from __future__ import annotations

from urllib.parse import quote

import msgspec

from nodeflow_contracts.topology import WATCHED_KINDS, WatchedKind


class KindInfo(WatchedKind, frozen=True, kw_only=True):
    """A kind of the topology table (or a core Event), with the API paths to reach it."""

    def collection_path(self, namespace: str | None) -> str:
        """`/api/v1/pods`, `/apis/batch/v1/namespaces/ns/jobs`, ... (namespace None: all)."""
        root = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if self.namespaced and namespace:
            return f"{root}/namespaces/{quote(namespace, safe='')}/{self.plural}"
        return f"{root}/{self.plural}"

    def object_path(self, namespace: str | None, name: str, subresource: str = "") -> str:
        path = f"{self.collection_path(namespace)}/{quote(name, safe='')}"
        return f"{path}/{subresource}" if subresource else path


def _from_watched(watched: WatchedKind) -> KindInfo:
    return KindInfo(**msgspec.structs.asdict(watched))


CORE_EVENT = KindInfo(kind="Event", group="", version="v1", plural="events", namespaced=True)

# Written, never mirrored: each leader's Lease in the install namespace (nodeflow_bus.kube_lease
# mirrors the NATS lease there; k8s-watcher's policy lets a service write only its own).
COORDINATION_LEASE = KindInfo(
    kind="Lease", group="coordination.k8s.io", version="v1", plural="leases", namespaced=True
)

# Commands may target the watched kinds (ConfigMaps among them: only the Skyhook controller's
# are mirrored), core Events and Leases; nothing else is in k8s-watcher's RBAC.
KNOWN_KINDS: tuple[KindInfo, ...] = (
    *(_from_watched(w) for w in WATCHED_KINDS),
    CORE_EVENT,
    COORDINATION_LEASE,
)

_BY_API_VERSION_AND_KIND: dict[tuple[str, str], KindInfo] = {
    (info.api_version, info.kind): info for info in KNOWN_KINDS
}

# What each write may touch: k8s/rbac/k8s-watcher.yaml grants exactly these verbs, so a command
# outside them is refused here (outcome `forbidden`) rather than by the API server.
# PodDisruptionBudget: a NodeSet's budget over its pods running jobs (workloadDisruptionProtection).
# ControllerRevision: a NodeSet's revision history (created and deleted, never patched).
# PersistentVolume, StorageClass: only read (topology-placer's volume topology);
# PersistentVolumeClaim: read, and patched (topology-placer's selected-node annotation).
CREATABLE_KINDS: frozenset[str] = frozenset(
    {
        "ControllerRevision",
        "Pod",
        "Job",
        "Event",
        "NodeSlice",
        "NodeMaintenance",
        "PodDisruptionBudget",
        "ConfigMap",
        "Lease",
    }
)
# ConfigMap: the Skyhook controller's own, no longer wanted (policy: only those labelled with a
# Skyhook or NodeWright).
DELETABLE_KINDS: frozenset[str] = frozenset(
    {
        "Pod",
        "Job",
        "NodeSlice",
        "NodeMaintenance",
        "PodDisruptionBudget",
        "ControllerRevision",
        "ConfigMap",
    }
)
# Kinds k8s-watcher reads and writes in the Skyhook namespace only (SKYHOOK_NAMESPACE): its
# RBAC on them is a Role there (policy.authorize refuses a command on one elsewhere).
SKYHOOK_NAMESPACE_KINDS: frozenset[str] = frozenset(
    w.kind for w in WATCHED_KINDS if w.skyhook_namespace_only
)
PATCHABLE_KINDS: frozenset[str] = frozenset(
    {info.kind for info in KNOWN_KINDS}
    - {
        "PodDisruptionBudget",
        "ControllerRevision",
        "PersistentVolume",
        "StorageClass",
    }
)
# The status subresource: pods (nominatedNodeName), nodes (the Skyhook controller's node
# conditions) and the custom resources.
STATUS_PATCHABLE_KINDS: frozenset[str] = frozenset(
    {"Pod", "Node"}
    | {info.kind for info in KNOWN_KINDS if "." in info.group} - {"Lease", "StorageClass"}
)


def resolve_kind(api_version: str, kind: str) -> KindInfo | None:
    return _BY_API_VERSION_AND_KIND.get((api_version, kind))


def resolve_watched_kind(kind: str) -> WatchedKind | None:
    """The watched kind of that name (the first: a kind two groups serve shares its selector)."""
    return next((w for w in WATCHED_KINDS if w.kind == kind), None)


def watched_kind_infos(only: tuple[str, ...] = ()) -> tuple[KindInfo, ...]:
    """The kinds to mirror: all of WATCHED_KINDS, or the named subset (case-insensitive)."""
    wanted = {name.lower() for name in only}
    infos = tuple(_from_watched(w) for w in WATCHED_KINDS)
    if not wanted:
        return infos
    unknown = wanted - {info.kind.lower() for info in infos}
    if unknown:
        raise ValueError(f"not watched kinds: {sorted(unknown)}")
    return tuple(info for info in infos if info.kind.lower() in wanted)
