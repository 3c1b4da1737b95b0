"""The two names of NVIDIA's node package operator, and every key each one owns (pure).

Upstream renamed Skyhook to NodeWright (NVIDIA/nodewright#349, operator v0.18): the new
release serves `nodewright.nvidia.com/v1alpha1` kind `NodeWright`, the old one
`skyhook.nvidia.com/v1alpha1` kind `Skyhook`. A cluster on either release moves to Nodeflow
without rewriting a manifest, so the maintenance-scheduler reconciles both kinds with one
controller, and each object only ever reads and writes the keys of its own name.

The naming contract, for a flavor whose API group is `<g>` (`skyhook.nvidia.com` or
`nodewright.nvidia.com`) and an object named `<n>`:

- the custom resource: `<g>/v1alpha1`, cluster-scoped, kind `Skyhook` / `NodeWright`
  (plural `skyhooks` / `nodewrights`); its annotations `<g>/pause` and `<g>/disable`
  ("true"), its finalizer `<g>/<singular>` (`skyhook.nvidia.com/skyhook`,
  `nodewright.nvidia.com/nodewright`);
- on a node it selects: the label `<g>/ignore`="true" (the node stays targeted but nothing
  runs there); the annotations `<g>/nodeState_<n>` (JSON), `<g>/version_<n>`,
  `<g>/cordon_<n>`, the annotation and label `<g>/status_<n>`; the node conditions
  `<g>/<n>/NotReady` and `<g>/<n>/Erroring`; the runtime-required taint
  `<g>=runtime-required:NoSchedule` and, on a node given it, the annotation
  `<g>/autoTaint_<taint key>`;
- on what it creates (stage Jobs and their pods, NodeMaintenances, ConfigMaps): the labels
  `<g>/name`, `<g>/package`, `<g>/node`, `<g>/stage`, `<g>/resource-id`, the ConfigMap labels
  `<g>/skyhook-node-meta`, `<g>/Node.name`, `<g>/Package.Name`, `<g>/Package.Version`, the
  annotations `<g>/package` (upstream's package JSON) and `<g>/identity`; an owner reference
  to the object by its own apiVersion and kind.

The DeploymentPolicy moves with the group, its kind kept (`<g>/v1alpha1` kind
DeploymentPolicy, upstream's migration changes only its apiVersion): a Skyhook names a
skyhook.nvidia.com policy, a NodeWright a nodewright.nvidia.com one, and a policy in use carries
the finalizer `<g>/deploymentpolicy-in-use`.

What does not change with the name: the package agent's environment (`SKYHOOK_LOG_DIR`,
`SKYHOOK_ROOT_DIR`, `SKYHOOK_RESOURCE_ID`, `SKYHOOK_NODE_ORDER`, `COPY_RESOLV`: the agent image
reads these names whichever kind ran it) and the package contract (`/skyhook-package/...`
inside the package image).

Both kinds may hold an object of the same name. Upstream's v0.18 keeps the legacy Skyhook
read-only beside its NodeWright (the NodeWright is the one that is reconciled and reports
status), so here too the NodeWright of a name wins: the Skyhook of that name is left alone.
Objects of different names never meet: their keys differ by name, and between a Skyhook and a
NodeWright also by group.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

VERSION: Final = "v1alpha1"

# Where the Skyhook controller puts what it creates (stage Jobs, the ConfigMaps their pods
# mount, interrupt NodeMaintenances) unless SKYHOOK_NAMESPACE says otherwise: maintenance-
# scheduler writes there, and k8s-watcher mirrors the controller's ConfigMaps from there only.
DEFAULT_SKYHOOK_NAMESPACE: Final = "skyhook"


@dataclass(frozen=True)
class SkyhookNames:
    """Every name one flavor (Skyhook or NodeWright) owns; see the module docstring."""

    group: str
    kind: str
    plural: str
    singular: str
    short_names: tuple[str, ...] = ()

    @property
    def api_version(self) -> str:
        return f"{self.group}/{VERSION}"

    @property
    def list_kind(self) -> str:
        return f"{self.kind}List"

    @property
    def crd_name(self) -> str:
        return f"{self.plural}.{self.group}"

    @property
    def collection_path(self) -> str:
        """The API path listing every object of the kind (cluster-scoped)."""
        return f"/apis/{self.group}/{VERSION}/{self.plural}"

    @property
    def prefix(self) -> str:
        """What every key of the flavor starts with (upstream's HasSkyhookAnnotations)."""
        return f"{self.group}/"

    # --- the custom resource's own keys ---

    @property
    def policy_finalizer(self) -> str:
        """Held by a DeploymentPolicy of the group while an object of the kind names it."""
        return f"{self.group}/deploymentpolicy-in-use"

    @property
    def pause_annotation(self) -> str:
        return f"{self.group}/pause"

    @property
    def disable_annotation(self) -> str:
        return f"{self.group}/disable"

    @property
    def finalizer(self) -> str:
        """Held while its nodes may carry its marks: deleting the object removes them first."""
        return f"{self.group}/{self.singular}"

    # --- node keys ---

    @property
    def ignore_label(self) -> str:
        return f"{self.group}/ignore"

    def node_state_annotation(self, name: str) -> str:
        return f"{self.group}/nodeState_{name}"

    def version_annotation(self, name: str) -> str:
        return f"{self.group}/version_{name}"

    def cordon_annotation(self, name: str) -> str:
        """`true` while the object holds a cordon of the node (its NodeMaintenance exists)."""
        return f"{self.group}/cordon_{name}"

    @property
    def runtime_required_cordon_annotation(self) -> str:
        """On a node cordoned when its runtime-required taint went (runtimeRequiredCordonAfter):
        the cordon persists, no interrupt's uncordon lifts it, until someone releases it."""
        return f"{self.group}/runtimeRequiredCordon"

    def status_key(self, name: str) -> str:
        """The node label and annotation holding the node's status for one object."""
        return f"{self.group}/status_{name}"

    def auto_taint_annotation(self, taint_key: str) -> str:
        """Set on a node the controller gave the runtime-required taint (autoTaintNewNodes)."""
        return f"{self.group}/autoTaint_{taint_key}"

    def not_ready_condition(self, name: str) -> str:
        """True while the object is not complete on the node, False once it is."""
        return f"{self.group}/{name}/NotReady"

    def erroring_condition(self, name: str) -> str:
        """True while a package of the object errors (or is unknown) on the node."""
        return f"{self.group}/{name}/Erroring"

    def is_node_condition(self, kind: str) -> bool:
        """One of the node conditions this flavor writes (never the kubelet's own)."""
        return kind.startswith(self.prefix) and kind.endswith(("/NotReady", "/Erroring"))

    @property
    def runtime_required_taint(self) -> str:
        """upstream's default RUNTIME_REQUIRED_TAINT, `key=value:effect`."""
        return f"{self.group}=runtime-required:NoSchedule"

    # --- what the controller creates ---

    @property
    def name_label(self) -> str:
        return f"{self.group}/name"

    @property
    def package_label(self) -> str:
        return f"{self.group}/package"

    @property
    def node_label(self) -> str:
        return f"{self.group}/node"

    @property
    def stage_label(self) -> str:
        return f"{self.group}/stage"

    @property
    def resource_id_label(self) -> str:
        return f"{self.group}/resource-id"

    @property
    def package_annotation(self) -> str:
        return f"{self.group}/package"

    @property
    def identity_annotation(self) -> str:
        return f"{self.group}/identity"

    @property
    def node_metadata_label(self) -> str:
        return f"{self.group}/skyhook-node-meta"

    @property
    def config_map_node_label(self) -> str:
        return f"{self.group}/Node.name"

    @property
    def config_map_package_label(self) -> str:
        return f"{self.group}/Package.Name"

    @property
    def config_map_version_label(self) -> str:
        return f"{self.group}/Package.Version"

    def requestor_id(self, name: str) -> str:
        """The NodeMaintenance requestorID of the object (<= 63 characters)."""
        return f"{name}.{self.group}"[:63].rstrip(".-")


SKYHOOK: Final = SkyhookNames(
    group="skyhook.nvidia.com",
    kind="Skyhook",
    plural="skyhooks",
    singular="skyhook",
    short_names=("scr",),
)
NODEWRIGHT: Final = SkyhookNames(
    group="nodewright.nvidia.com", kind="NodeWright", plural="nodewrights", singular="nodewright"
)
# Legacy first: where both may name one node or one object, the later one wins.
FLAVORS: Final[tuple[SkyhookNames, ...]] = (SKYHOOK, NODEWRIGHT)

# The one label every ConfigMap the Skyhook controller writes carries (both flavors, package
# configMaps and node metadata), beside upstream's own: k8s-watcher mirrors ConfigMaps by it
# alone (CONFIG_MAP_SELECTOR), so the controller sees which of its ConfigMaps exist, and no
# other ConfigMap of the cluster is held in memory.
CONFIG_MAP_MANAGED_BY_LABEL: Final = "app.kubernetes.io/managed-by"
CONFIG_MAP_MANAGED_BY: Final = "nodeflow-skyhook"
CONFIG_MAP_SELECTOR: Final = f"{CONFIG_MAP_MANAGED_BY_LABEL}={CONFIG_MAP_MANAGED_BY}"

# The legacy group's DeploymentPolicy; a flavor's own is `names.api_version`, kind POLICY_KIND.
POLICY_API_VERSION: Final = SKYHOOK.api_version
POLICY_KIND: Final = "DeploymentPolicy"
# How k8s-watcher mirrors nodewright.nvidia.com's DeploymentPolicy on the bus (its KV bucket,
# `k8s_nodewrightdeploymentpolicies`): the kind name alone is skyhook.nvidia.com's.
NODEWRIGHT_POLICY_MIRROR: Final = "NodeWrightDeploymentPolicy"


def flavor_of(api_version: str, kind: str = "") -> SkyhookNames | None:
    """The flavor an object's apiVersion (and kind, when given) belongs to."""
    for names in FLAVORS:
        if api_version == names.api_version and kind in ("", names.kind):
            return names
    return None


def flavor_by_kind(kind: str) -> SkyhookNames | None:
    """The flavor of kind `Skyhook` or `NodeWright` (case-insensitive, plural accepted)."""
    wanted = kind.lower()
    for names in FLAVORS:
        if wanted in (names.kind.lower(), names.plural, names.singular, *names.short_names):
            return names
    return None


def owner_in(labels: Mapping[str, str]) -> tuple[SkyhookNames, str] | None:
    """The flavor and object name a Job, pod, ConfigMap or NodeMaintenance is labelled with."""
    for names in reversed(FLAVORS):
        name = labels.get(names.name_label)
        if name:
            return names, name
    return None


def is_node_condition(kind: str) -> bool:
    """A node condition of either flavor."""
    return any(names.is_node_condition(kind) for names in FLAVORS)


def carries_marks(annotations: Mapping[str, str]) -> bool:
    """Whether a node carries any annotation of either flavor (so it is not a new node)."""
    prefixes = tuple(names.prefix for names in FLAVORS)
    return any(key.startswith(prefixes) for key in annotations)
