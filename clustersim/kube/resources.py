"""The resource registry: which kinds the emulator serves and how (scope, names, subresources,
printer columns, CRD schemas).  Built-in kinds are declared here; CRDs add entries at run time.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

ALL_VERBS = ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")


@dataclass(frozen=True)
class PrinterColumn:
    name: str
    type: str
    json_path: str
    description: str = ""
    priority: int = 0
    format: str = ""


@dataclass(frozen=True)
class ScaleSpec:
    spec_replicas_path: str
    status_replicas_path: str
    label_selector_path: str | None = None


@dataclass(frozen=True)
class ResourceInfo:
    """One served resource.  ``key`` (``plural`` or ``plural.group``) names it in the store."""

    group: str
    versions: tuple[str, ...]
    plural: str
    kind: str
    namespaced: bool
    singular: str = ""
    short_names: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    subresources: frozenset[str] = frozenset()
    verbs: tuple[str, ...] = ALL_VERBS
    strategic_merge: bool = True
    scale: ScaleSpec | None = None
    printer_columns: tuple[PrinterColumn, ...] = ()
    #: version -> openAPIV3Schema (CRDs only)
    schemas: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)
    #: status is dropped (or reset) on create, like the real registry strategies
    reset_status_on_create: bool = False
    #: delete answers with the deleted object instead of a success Status
    return_deleted_object: bool = False
    #: propagationPolicy used when a delete does not name one
    default_propagation: str = "Background"
    is_crd: bool = False

    @property
    def key(self) -> str:
        return f"{self.plural}.{self.group}" if self.group else self.plural

    @property
    def storage_version(self) -> str:
        return self.versions[0]

    def api_version(self, version: str | None = None) -> str:
        v = version or self.storage_version
        return f"{self.group}/{v}" if self.group else v

    @property
    def list_kind(self) -> str:
        return self.kind + "List"

    @property
    def has_status(self) -> bool:
        return "status" in self.subresources


def _col(name: str, type_: str, path: str, priority: int = 0) -> PrinterColumn:
    return PrinterColumn(name=name, type=type_, json_path=path, priority=priority)


BUILTINS: tuple[ResourceInfo, ...] = (
    ResourceInfo(
        group="",
        versions=("v1",),
        plural="namespaces",
        kind="Namespace",
        singular="namespace",
        namespaced=False,
        short_names=("ns",),
        subresources=frozenset({"status"}),
        verbs=("create", "delete", "get", "list", "patch", "update", "watch"),
        return_deleted_object=True,
    ),
    ResourceInfo(
        group="",
        versions=("v1",),
        plural="nodes",
        kind="Node",
        singular="node",
        namespaced=False,
        short_names=("no",),
        subresources=frozenset({"status"}),
    ),
    ResourceInfo(
        group="",
        versions=("v1",),
        plural="pods",
        kind="Pod",
        singular="pod",
        namespaced=True,
        short_names=("po",),
        categories=("all",),
        subresources=frozenset({"status", "eviction", "binding", "log", "portforward"}),
        reset_status_on_create=True,
        return_deleted_object=True,
    ),
    ResourceInfo(
        group="",
        versions=("v1",),
        plural="events",
        kind="Event",
        singular="event",
        namespaced=True,
        short_names=("ev",),
    ),
    ResourceInfo(
        group="",
        versions=("v1",),
        plural="configmaps",
        kind="ConfigMap",
        singular="configmap",
        namespaced=True,
        short_names=("cm",),
    ),
    # Services and Secrets are stored only (no cluster IPs, no endpoints): what reads them
    # (`kubectl nodeflow` finding NATS's pod and the admin password) reads them as written.
    ResourceInfo(
        group="",
        versions=("v1",),
        plural="services",
        kind="Service",
        singular="service",
        namespaced=True,
        short_names=("svc",),
        categories=("all",),
        subresources=frozenset({"status"}),
    ),
    ResourceInfo(
        group="",
        versions=("v1",),
        plural="secrets",
        kind="Secret",
        singular="secret",
        namespaced=True,
    ),
    ResourceInfo(
        group="batch",
        versions=("v1",),
        plural="jobs",
        kind="Job",
        singular="job",
        namespaced=True,
        categories=("all",),
        subresources=frozenset({"status"}),
        reset_status_on_create=True,
        return_deleted_object=True,
        default_propagation="Orphan",
    ),
    ResourceInfo(
        group="policy",
        versions=("v1",),
        plural="poddisruptionbudgets",
        kind="PodDisruptionBudget",
        singular="poddisruptionbudget",
        namespaced=True,
        short_names=("pdb",),
        subresources=frozenset({"status"}),
        reset_status_on_create=True,
        return_deleted_object=True,
    ),
    # Volumes: k8s-watcher mirrors them for topology-placer's volume topology. No volume
    # controller runs here: a claim is bound by writing its spec.volumeName (and status).
    ResourceInfo(
        group="",
        versions=("v1",),
        plural="persistentvolumeclaims",
        kind="PersistentVolumeClaim",
        singular="persistentvolumeclaim",
        namespaced=True,
        short_names=("pvc",),
        subresources=frozenset({"status"}),
        reset_status_on_create=True,
        return_deleted_object=True,
    ),
    ResourceInfo(
        group="",
        versions=("v1",),
        plural="persistentvolumes",
        kind="PersistentVolume",
        singular="persistentvolume",
        namespaced=False,
        short_names=("pv",),
        subresources=frozenset({"status"}),
        reset_status_on_create=True,
        return_deleted_object=True,
    ),
    # A claim's class: its binding mode and allowed topologies (no provisioner runs here).
    ResourceInfo(
        group="storage.k8s.io",
        versions=("v1",),
        plural="storageclasses",
        kind="StorageClass",
        singular="storageclass",
        namespaced=False,
        short_names=("sc",),
        return_deleted_object=True,
    ),
    ResourceInfo(
        group="apps",
        versions=("v1",),
        plural="controllerrevisions",
        kind="ControllerRevision",
        singular="controllerrevision",
        namespaced=True,
    ),
    ResourceInfo(
        group="scheduling.k8s.io",
        versions=("v1",),
        plural="priorityclasses",
        kind="PriorityClass",
        singular="priorityclass",
        namespaced=False,
        short_names=("pc",),
    ),
    ResourceInfo(
        group="coordination.k8s.io",
        versions=("v1",),
        plural="leases",
        kind="Lease",
        singular="lease",
        namespaced=True,
    ),
    ResourceInfo(
        group="apiextensions.k8s.io",
        versions=("v1",),
        plural="customresourcedefinitions",
        kind="CustomResourceDefinition",
        singular="customresourcedefinition",
        namespaced=False,
        short_names=("crd", "crds"),
        categories=("api-extensions",),
        subresources=frozenset({"status"}),
        return_deleted_object=True,
    ),
)


def crd_resource_infos(crd: dict[str, Any]) -> ResourceInfo:
    """Translate a CustomResourceDefinition into the ResourceInfo that serves it."""
    spec = crd.get("spec") or {}
    names = spec.get("names") or {}
    served = [v for v in spec.get("versions") or [] if v.get("served", True)]
    storage = [v for v in served if v.get("storage")]
    ordered = storage + [v for v in served if v not in storage]
    first = ordered[0] if ordered else {}
    subresources = first.get("subresources") or {}
    scale_spec = None
    if "scale" in subresources:
        scale = subresources["scale"] or {}
        scale_spec = ScaleSpec(
            spec_replicas_path=scale.get("specReplicasPath", ".spec.replicas"),
            status_replicas_path=scale.get("statusReplicasPath", ".status.replicas"),
            label_selector_path=scale.get("labelSelectorPath"),
        )
    columns = tuple(
        PrinterColumn(
            name=c["name"],
            type=c.get("type", "string"),
            json_path=c.get("jsonPath", ""),
            description=c.get("description", ""),
            priority=int(c.get("priority", 0)),
            format=c.get("format", ""),
        )
        for c in first.get("additionalPrinterColumns") or []
    )
    schemas = {v["name"]: ((v.get("schema") or {}).get("openAPIV3Schema") or {}) for v in ordered}
    kind = names.get("kind", "")
    return ResourceInfo(
        group=spec.get("group", ""),
        versions=tuple(v["name"] for v in ordered),
        plural=names.get("plural", ""),
        kind=kind,
        singular=names.get("singular") or kind.lower(),
        namespaced=spec.get("scope", "Namespaced") == "Namespaced",
        short_names=tuple(names.get("shortNames") or ()),
        categories=tuple(names.get("categories") or ()),
        subresources=frozenset({"status"} if "status" in subresources else set())
        | (frozenset({"scale"}) if scale_spec else frozenset()),
        strategic_merge=False,
        scale=scale_spec,
        printer_columns=columns,
        schemas=schemas,
        reset_status_on_create="status" in subresources,
        return_deleted_object=True,
        is_crd=True,
    )


# Built-in APIs still in alpha, served only when enabled as kube-apiserver's `--runtime-config`
# enables them (`group/version=true`): off by default, as on a real cluster.
ALPHA_BUILTINS: dict[str, tuple[ResourceInfo, ...]] = {
    # The Workload API's PodGroup (KEP-4671; Kubernetes 1.36, gate GenericWorkload).
    "scheduling.k8s.io/v1alpha2": (
        ResourceInfo(
            group="scheduling.k8s.io",
            versions=("v1alpha2",),
            plural="podgroups",
            kind="PodGroup",
            singular="podgroup",
            namespaced=True,
            subresources=frozenset({"status"}),
            reset_status_on_create=True,
        ),
    ),
}


def alpha_resource_infos(runtime_config: Iterable[str]) -> list[ResourceInfo]:
    """The alpha resources `runtime_config` enables (entries `group/version=true`, or
    `group/version` alone; `=false` leaves one off). An API it does not know is an error, as
    kube-apiserver refuses one at start."""
    infos: list[ResourceInfo] = []
    for entry in runtime_config:
        group_version, _, value = entry.partition("=")
        if group_version not in ALPHA_BUILTINS:
            raise ValueError(
                f"--runtime-config {entry}: no such alpha API here "
                f"(known: {', '.join(sorted(ALPHA_BUILTINS))})"
            )
        if value.lower() in ("", "true"):
            infos.extend(ALPHA_BUILTINS[group_version])
        elif value.lower() != "false":
            raise ValueError(f"--runtime-config {entry}: the value is true or false")
    return infos
