"""The package pod contract: what a stage Job's pod runs, and the ConfigMaps it mounts (pure).

A package image holds the package's files under /skyhook-package; the Skyhook agent image runs
them. Each stage's pod, as upstream's createPodFromPackage builds it (NVIDIA/nodewright
operator/internal/controller/skyhook_controller.go), is a chain of init containers:

  <pkg>-init          the package image copies /skyhook-package/* to the host copy dir
                      <copyDirRoot>/<skyhook>/<pkg>-<version>-<skyhook uid>-<generation>
  <pkg>-<stage>       the agent: [stage, /root, copyDir]
  <pkg>-<stage>check  the agent: [stage-check, /root, copyDir]

all privileged, with hostPID and hostNetwork, the host's / at /root (HostToContainer), the
node-metadata ConfigMap at /skyhook-package/node-metadata and the package's configMap at
/skyhook-package/configmaps. An interrupt's pod (createInterruptPodForPackage) runs one agent
init container `interrupt` with [interrupt, /root, copyDir, <the interrupt, base64 JSON>].

Inside a Job, upstream's forever-running `pause` container is replaced by a `done` container
that exits 0 (upstream's Jobs design, nodewright #299/#307), so the pod can succeed and the
Job complete; the agent image is already pulled for the init containers.

The ConfigMaps are upstream's too: `<skyhook>-<pkg>-<version>` holds the package's configMap
(UpsertConfigmaps), and the node-metadata ConfigMap (UpsertNodeLabelsAnnotationsPackages)
holds the node's labels and annotations and the Skyhook's packages as JSON for the agent.
Both carry a controller reference to the Skyhook, so they go with it.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from maintenance_scheduler.config import MaintenanceSchedulerConfig
from maintenance_scheduler.skyhook.api import (
    Interrupt,
    Package,
    Skyhook,
)
from nodeflow_contracts.skyhook import (
    CONFIG_MAP_MANAGED_BY,
    CONFIG_MAP_MANAGED_BY_LABEL,
    NODEWRIGHT,
    SKYHOOK,
    SkyhookNames,
)
from nodeflow_kube.fields import parse_time

PACKAGE_MOUNT: Final = "/skyhook-package"
NODE_METADATA_MOUNT: Final = "/skyhook-package/node-metadata"
CONFIG_MAP_MOUNT: Final = "/skyhook-package/configmaps"
HOST_ROOT_MOUNT: Final = "/root"
ROOT_VOLUME: Final = "root-mount"
DONE_CONTAINER: Final = "done"
INTERRUPT_CONTAINER: Final = "interrupt"
# The labels upstream selects its ConfigMaps by (a Skyhook's package configMaps; its
# node-metadata ConfigMaps).
# A Skyhook's; a NodeWright's are of its names (`names.name_label`, `names.node_metadata_label`).
CONFIG_MAP_LABEL: Final = SKYHOOK.name_label
NODE_METADATA_LABEL: Final = SKYHOOK.node_metadata_label
TAINT_UNSCHEDULABLE: Final = "node.kubernetes.io/unschedulable"
# The agent's names for the interrupt types (upstream Interrupt.ToArgs).
AGENT_INTERRUPT_NAMES: Final[Mapping[str, str]] = {
    "reboot": "node_restart",
    "service": "service_restart",
    "noop": "no_op",
    "restartAllServices": "restart_all_services",
}
# upstream: the pause container's, and the interrupt container's, fixed resources.
_DONE_RESOURCES: Final[Mapping[str, Mapping[str, str]]] = {
    "limits": {"cpu": "100m", "memory": "20Mi"},
    "requests": {"cpu": "100m", "memory": "20Mi"},
}
_INTERRUPT_RESOURCES: Final[Mapping[str, Mapping[str, str]]] = {
    "limits": {"cpu": "500m", "memory": "64Mi"},
    "requests": {"cpu": "500m", "memory": "64Mi"},
}


@dataclass(frozen=True)
class PodOptions:
    """The controller's settings the pod contract reads (upstream's SkyhookOperatorOptions)."""

    agent_image: str = "nvcr.io/nvidia/skyhook/agent:v6.4.1"
    copy_dir_root: str = "/var/lib/skyhook"
    agent_log_root: str = "/var/log/skyhook"
    image_pull_secret: str = ""
    runtime_required_taint: str = SKYHOOK.runtime_required_taint
    # A NodeWright's runtime-required taint (its own key, as upstream's renamed release).
    nodewright_runtime_required_taint: str = NODEWRIGHT.runtime_required_taint

    @property
    def agent_version(self) -> str:
        """The agent image's tag (upstream AgentVersion), told to the agent in packages.json."""
        return self.agent_image.rsplit(":", 1)[-1]

    def runtime_required_toleration(self, names: SkyhookNames = SKYHOOK) -> dict[str, str]:
        """Tolerates the runtime-required taint of a Skyhook (or a NodeWright) exactly
        (operator Equal, its value, effect)."""
        taint = (
            self.nodewright_runtime_required_taint
            if names == NODEWRIGHT
            else self.runtime_required_taint
        )
        key_value, _, effect = taint.rpartition(":")
        key, _, value = key_value.partition("=")
        return {"key": key, "operator": "Equal", "value": value, "effect": effect}


def pod_options(config: MaintenanceSchedulerConfig) -> PodOptions:
    return PodOptions(
        agent_image=config.skyhook_agent_image,
        copy_dir_root=config.skyhook_copy_dir_root,
        agent_log_root=config.skyhook_agent_log_root,
        image_pull_secret=config.skyhook_image_pull_secret,
        runtime_required_taint=config.skyhook_runtime_required_taint,
        nodewright_runtime_required_taint=config.skyhook_nodewright_runtime_required_taint,
    )


def safe_name(max_length: int, *parts: str) -> str:
    """upstream generateSafeName: the parts joined by '-', dots made dashes, cut to fit, then
    '-' and the first 8 hex digits of the SHA-256 of the uncut name, all lower case."""
    name = "-".join(parts).replace(".", "-")
    unique = hashlib.sha256(name.encode()).hexdigest()[:8]
    room = max_length - len(unique) - 1
    return f"{name[:room]}-{unique}".lower()


@functools.lru_cache(maxsize=1 << 14)
def node_metadata_name(skyhook: str, node: str) -> str:
    return safe_name(253, skyhook, node, "metadata")


def package_config_map_name(skyhook: str, package: Package) -> str:
    return f"{skyhook}-{package.name}-{package.version}".lower()


def copy_dir(options: PodOptions, skyhook: Skyhook, package: Package) -> str:
    """Where the package's files land on the host, per package version and Skyhook
    generation (a new generation copies afresh)."""
    return (
        f"{options.copy_dir_root}/{skyhook.name}/"
        f"{package.name}-{package.version}-{skyhook.uid}-{skyhook.generation}"
    )


def agent_image(options: PodOptions, package: Package) -> str:
    return package.agent_image_override or options.agent_image


def resource_id(skyhook: Skyhook) -> str:
    """upstream Skyhook.ResourceID: name, uid and generation."""
    return f"{skyhook.name}-{skyhook.uid}-{skyhook.generation}"


def node_orders(priorities: Mapping[str, object], offset: int) -> dict[str, int]:
    """SKYHOOK_NODE_ORDER of every node (upstream Skyhook.NodeOrder): its place among the
    nodes the rollout picked (status.nodePriority, by time then name) plus
    status.nodeOrderOffset; a node not there has 0."""
    ranked = sorted(priorities, key=lambda name: (_seconds(priorities[name]), name))
    return {name: offset + index for index, name in enumerate(ranked)}


def _seconds(value: object) -> float:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    parsed = parse_time(value)
    return parsed if parsed is not None else 0.0


def agent_env(options: PodOptions, skyhook: Skyhook, package: Package, order: int) -> list[Any]:
    """upstream getAgentConfigEnvVars."""
    return [
        {"name": "SKYHOOK_LOG_DIR", "value": f"{options.agent_log_root}/{skyhook.name}"},
        {"name": "SKYHOOK_ROOT_DIR", "value": f"{options.copy_dir_root}/{skyhook.name}"},
        {"name": "COPY_RESOLV", "value": "false"},
        {
            "name": "SKYHOOK_RESOURCE_ID",
            "value": f"{resource_id(skyhook)}_{package.name}_{package.version}",
        },
        {"name": "SKYHOOK_NODE_ORDER", "value": str(order)},
    ]


def interrupt_argument(interrupt: Interrupt) -> str:
    """upstream Interrupt.ToArgs: the interrupt as JSON, its type in the agent's words,
    base64-encoded."""
    body: dict[str, Any] = {"type": AGENT_INTERRUPT_NAMES[interrupt.type]}
    if interrupt.services:
        body["services"] = list(interrupt.services)
    return base64.b64encode(json.dumps(body, separators=(",", ":")).encode()).decode()


def _tolerations(options: PodOptions, skyhook: Skyhook) -> list[Any]:
    return [
        {"key": TAINT_UNSCHEDULABLE, "operator": "Exists"},
        options.runtime_required_toleration(skyhook.names),
        *(dict(t) for t in skyhook.additional_tolerations),
    ]


def _root_volume() -> dict[str, Any]:
    return {"name": ROOT_VOLUME, "hostPath": {"path": "/"}}


def _root_mount() -> dict[str, Any]:
    return {
        "name": ROOT_VOLUME,
        "mountPath": HOST_ROOT_MOUNT,
        "mountPropagation": "HostToContainer",
    }


def _done_container(image: str) -> dict[str, Any]:
    return {
        "name": DONE_CONTAINER,
        "image": image,
        "command": ["/bin/sh", "-c", "exit 0"],
        "resources": {k: dict(v) for k, v in _DONE_RESOURCES.items()},
    }


def _package_resources(package: Package) -> dict[str, Any] | None:
    """upstream setPodResources: every init container gets the package's resources."""
    if package.resources is None:
        return None
    res = package.resources
    return {
        "limits": {"cpu": res.cpu_limit, "memory": res.memory_limit},
        "requests": {"cpu": res.cpu_request, "memory": res.memory_request},
    }


def stage_pod_spec(
    options: PodOptions, skyhook: Skyhook, package: Package, stage: str, node: str, order: int
) -> dict[str, Any]:
    """The pod spec of a package stage (apply, config, upgrade, uninstall, post-interrupt):
    upstream createPodFromPackage, the `pause` container replaced by `done`."""
    metadata_volume = safe_name(63, "metadata", node)
    volumes: list[Any] = [
        _root_volume(),
        {"name": metadata_volume, "configMap": {"name": node_metadata_name(skyhook.name, node)}},
    ]
    mounts: list[Any] = [_root_mount(), {"name": metadata_volume, "mountPath": NODE_METADATA_MOUNT}]
    if package.config_map:
        mounts.append({"name": package.name, "mountPath": CONFIG_MAP_MOUNT})
        volumes.append(
            {
                "name": package.name,
                "configMap": {"name": package_config_map_name(skyhook.name, package)},
            }
        )
    where = copy_dir(options, skyhook, package)
    env = [e.to_container() for e in package.env] + agent_env(options, skyhook, package, order)
    agent = agent_image(options, package)
    short = package.name[:43]
    privileged = {"privileged": True}
    init_containers: list[Any] = [
        {
            "name": f"{short}-init",
            "image": package.image_ref,
            "imagePullPolicy": "Always",
            "command": ["/bin/sh"],
            "args": [
                "-c",
                "mkdir -p /root/${SKYHOOK_DIR} && cp -r /skyhook-package/* /root/${SKYHOOK_DIR}",
            ],
            "env": [{"name": "SKYHOOK_DIR", "value": where}],
            "securityContext": dict(privileged),
            "volumeMounts": [dict(m) for m in mounts],
        },
        {
            "name": f"{short}-{stage}",
            "image": agent,
            "imagePullPolicy": "Always",
            "args": [stage.lower(), HOST_ROOT_MOUNT, where],
            "env": [dict(e) for e in env],
            "securityContext": dict(privileged),
            "volumeMounts": [dict(m) for m in mounts],
        },
        {
            "name": f"{short}-{stage}check",
            "image": agent,
            "imagePullPolicy": "Always",
            "args": [f"{stage}-check".lower(), HOST_ROOT_MOUNT, where],
            "env": [dict(e) for e in env],
            "securityContext": dict(privileged),
            "volumeMounts": [dict(m) for m in mounts],
        },
    ]
    resources = _package_resources(package)
    if resources is not None:
        for container in init_containers:
            container["resources"] = {k: dict(v) for k, v in resources.items()}
    spec: dict[str, Any] = {
        "nodeName": node,
        "initContainers": init_containers,
        "containers": [_done_container(agent)],
        "volumes": volumes,
        "hostPID": True,
        "hostNetwork": True,
        "tolerations": _tolerations(options, skyhook),
    }
    if options.image_pull_secret:
        spec["imagePullSecrets"] = [{"name": options.image_pull_secret}]
    if package.graceful_shutdown_seconds is not None:
        spec["terminationGracePeriodSeconds"] = package.graceful_shutdown_seconds
    return spec


def interrupt_pod_spec(
    options: PodOptions,
    skyhook: Skyhook,
    package: Package,
    interrupt: Interrupt,
    node: str,
    order: int,
) -> dict[str, Any]:
    """The pod spec of an interrupt: upstream createInterruptPodForPackage (the agent alone,
    with the package's copy dir, which its apply left on the host), `pause` replaced by
    `done`. The node-metadata volume names the ConfigMap the controller writes (upstream
    names it without the hash suffix here, a ConfigMap it never creates; the volume is not
    mounted either way)."""
    agent = agent_image(options, package)
    spec: dict[str, Any] = {
        "nodeName": node,
        "initContainers": [
            {
                "name": INTERRUPT_CONTAINER,
                "image": agent,
                "args": [
                    "interrupt",
                    HOST_ROOT_MOUNT,
                    copy_dir(options, skyhook, package),
                    interrupt_argument(interrupt),
                ],
                "env": agent_env(options, skyhook, package, order),
                "securityContext": {"privileged": True},
                "volumeMounts": [_root_mount()],
                "resources": {k: dict(v) for k, v in _INTERRUPT_RESOURCES.items()},
            }
        ],
        "containers": [_done_container(agent)],
        "hostPID": True,
        "hostNetwork": True,
        "tolerations": _tolerations(options, skyhook),
        "volumes": [
            _root_volume(),
            {
                "name": safe_name(63, skyhook.name, node, "metadata"),
                "configMap": {"name": node_metadata_name(skyhook.name, node)},
            },
        ],
    }
    if options.image_pull_secret:
        spec["imagePullSecrets"] = [{"name": options.image_pull_secret}]
    return spec


def package_annotation(skyhook: Skyhook, package: Package, stage: str) -> str:
    """The `<group>/package` annotation of a package pod (upstream SetPackages,
    PackageSkyhook marshalled: name, version, skyhook, stage, the image without its tag,
    containerSHA when set)."""
    body: dict[str, Any] = {
        "name": package.name,
        "version": package.version,
        "skyhook": skyhook.name,
        "stage": stage,
        "image": package.image,
    }
    if package.container_sha:
        body["containerSHA"] = package.container_sha
    return json.dumps(body, separators=(",", ":"))


def owner_reference(skyhook: Skyhook) -> dict[str, Any]:
    """A controller reference (upstream SetControllerReference): the garbage collector
    deletes the object with its Skyhook."""
    return {
        "apiVersion": skyhook.names.api_version,
        "kind": skyhook.names.kind,
        "name": skyhook.name,
        "uid": skyhook.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def packages_metadata(options: PodOptions, skyhook: Skyhook) -> str:
    """packages.json of the node metadata (upstream NewSkyhookMetadata, Marshal)."""
    packages: dict[str, Any] = {}
    for package in skyhook.packages:
        entry: dict[str, Any] = {
            "name": package.name,
            "version": package.version,
            "image": package.image,
        }
        if package.agent_image_override:
            entry["agentImageOverride"] = package.agent_image_override
        if package.interrupt is not None:
            entry["interrupt"] = _interrupt_json(package.interrupt)
        if package.config_interrupts:
            entry["configInterrupts"] = {
                key: _interrupt_json(value) for key, value in package.config_interrupts
            }
        packages[package.name] = entry
    # Go's encoding/json: struct fields in declaration order, map keys sorted.
    body = {"agentVersion": options.agent_version, "packages": dict(sorted(packages.items()))}
    return json.dumps(body, separators=(",", ":"))


def _interrupt_json(interrupt: Interrupt) -> dict[str, Any]:
    body: dict[str, Any] = {"type": interrupt.type}
    if interrupt.services:
        body["services"] = list(interrupt.services)
    return body


def node_metadata_config_map(
    options: PodOptions,
    skyhook: Skyhook,
    node: str,
    labels: Mapping[str, str],
    annotations: Mapping[str, str],
    *,
    namespace: str,
) -> dict[str, Any]:
    """upstream UpsertNodeLabelsAnnotationsPackages: the node's labels and annotations and
    the Skyhook's packages, for the agent."""
    names = skyhook.names
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": node_metadata_name(skyhook.name, node),
            "namespace": namespace,
            # upstream labels it only with NODE_METADATA_LABEL; CONFIG_MAP_LABEL too, so both
            # ConfigMaps carry the one label k8s-watcher requires on a ConfigMap we write, and
            # the label k8s-watcher mirrors them by.
            "labels": {
                names.node_metadata_label: skyhook.name,
                names.name_label: skyhook.name,
                CONFIG_MAP_MANAGED_BY_LABEL: CONFIG_MAP_MANAGED_BY,
            },
            "annotations": {
                names.name_label: skyhook.name,
                names.config_map_node_label: node,
            },
            "ownerReferences": [owner_reference(skyhook)],
        },
        "data": {
            # Go marshals a map with its keys sorted.
            "annotations.json": json.dumps(
                dict(annotations), separators=(",", ":"), sort_keys=True
            ),
            "labels.json": json.dumps(dict(labels), separators=(",", ":"), sort_keys=True),
            "packages.json": packages_metadata(options, skyhook),
        },
    }


def package_config_map(skyhook: Skyhook, package: Package, *, namespace: str) -> dict[str, Any]:
    """upstream UpsertConfigmaps: the package's configMap, labelled with its Skyhook."""
    names = skyhook.names
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": package_config_map_name(skyhook.name, package),
            "namespace": namespace,
            "labels": {
                names.name_label: skyhook.name,
                CONFIG_MAP_MANAGED_BY_LABEL: CONFIG_MAP_MANAGED_BY,
            },
            "annotations": {
                names.name_label: skyhook.name,
                names.config_map_package_label: package.name,
                names.config_map_version_label: package.version,
            },
            "ownerReferences": [owner_reference(skyhook)],
        },
        "data": dict(package.config_map),
    }
