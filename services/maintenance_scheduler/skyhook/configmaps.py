"""Which of its ConfigMaps the Skyhook controller deletes (pure).

upstream UpsertConfigmaps and ValidateNodeConfigmaps: the controller lists the ConfigMaps it
made by label and deletes those it no longer wants --

- a package configMap (`<skyhook>-<pkg>-<version>`, labelled `<g>/name=<skyhook>`) whose name
  no package of the spec has any more (an older version's, a removed package's), unless an
  uninstall of that package is in progress on some node (a node-state entry at stage
  `uninstall` or `uninstall-interrupt`): its Job runs with the configMap of the version it
  uninstalls. Fail closed, as upstream: a node whose state cannot be read, or whose state
  patch may still land, may hide such an uninstall, so no package configMap is deleted that
  round. (Upstream deletes before it reads the node states; we read them first.)
- a node-metadata ConfigMap (`<skyhook>-<node>-metadata`, labelled
  `<g>/skyhook-node-meta=<skyhook>`) of a node the object no longer targets, unless a Job of
  the object still runs there.

Neither is deleted when written this round. A deleted Skyhook's ConfigMaps go with it: each
carries an ownerReference to its object (upstream's SetControllerReference), so the API
server's garbage collector deletes them once the object is gone (after its finalizer).

Our node-metadata ConfigMaps carry `<g>/name` too (the label k8s-watcher requires on a
ConfigMap we write): a package configMap is one labelled `<g>/name` without
`<g>/skyhook-node-meta`.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

from maintenance_scheduler.skyhook.api import Skyhook
from maintenance_scheduler.skyhook.pod import node_metadata_name, package_config_map_name
from maintenance_scheduler.skyhook.stages import UNINSTALL_STAGES, parse_node_state
from nodeflow_contracts.skyhook import SKYHOOK, SkyhookNames


@dataclass(frozen=True)
class ConfigMapFacts:
    """What the controller reads of one of its mirrored ConfigMaps."""

    name: str
    uid: str
    labels: Mapping[str, str]
    annotations: Mapping[str, str]


@dataclass(frozen=True)
class DeleteConfigMap:
    """Delete a ConfigMap the object no longer wants (uid precondition: never a newer one)."""

    skyhook: str
    name: str
    uid: str
    purpose: Literal["package", "node-metadata"]
    names: SkyhookNames = SKYHOOK


def package_config_maps(
    skyhook: Skyhook, config_maps: Iterable[ConfigMapFacts]
) -> list[ConfigMapFacts]:
    """The object's package configMaps (upstream lists them by `<g>/name=<skyhook>`)."""
    names = skyhook.names
    return [
        cm
        for cm in config_maps
        if cm.labels.get(names.name_label) == skyhook.name
        and names.node_metadata_label not in cm.labels
    ]


def node_metadata_config_maps(
    skyhook: Skyhook, config_maps: Iterable[ConfigMapFacts]
) -> list[ConfigMapFacts]:
    """The object's node-metadata ConfigMaps (`<g>/skyhook-node-meta=<skyhook>`)."""
    label = skyhook.names.node_metadata_label
    return [cm for cm in config_maps if cm.labels.get(label) == skyhook.name]


def uninstalling_packages(node_states: Iterable[str | None]) -> frozenset[str] | None:
    """The packages whose uninstall cycle is in progress on any node (nodewright's
    IsUninstallCycleInProgress), from the object's node-state annotations; None when any
    of them cannot be read (one of them may be uninstalling)."""
    found: set[str] = set()
    for raw in node_states:
        entries, readable = parse_node_state(raw)
        if not readable:
            return None
        found.update(entry.name for entry in entries.values() if entry.stage in UNINSTALL_STAGES)
    return frozenset(found)


def _package_of(cm: ConfigMapFacts, names: SkyhookNames) -> str | None:
    """The package a configMap is for (its annotation, as upstream writes it); None: unknown."""
    return cm.annotations.get(names.config_map_package_label) or None


def package_config_map_deletes(
    skyhook: Skyhook,
    config_maps: Iterable[ConfigMapFacts],
    *,
    node_states: Iterable[str | None],
    states_settled: bool,
    writing: Collection[str] = (),
) -> list[DeleteConfigMap]:
    """Package configMaps no package of the spec names, none in an uninstall in progress.

    `node_states`: the object's node-state annotation of every node that has one;
    `states_settled`: no node-state patch of the object may still land (else nothing is
    deleted: the patch may start an uninstall)."""
    wanted = {package_config_map_name(skyhook.name, p) for p in skyhook.packages}
    stale = [
        cm
        for cm in package_config_maps(skyhook, config_maps)
        if cm.name not in wanted and cm.name not in writing
    ]
    if not stale:
        return []
    uninstalling = uninstalling_packages(node_states) if states_settled else None
    if uninstalling is None:
        return []
    names = skyhook.names
    deletes: list[DeleteConfigMap] = []
    for cm in sorted(stale, key=lambda c: c.name):
        package = _package_of(cm, names)
        if uninstalling and (package is None or package in uninstalling):
            # Its uninstall may mount it (one of unknown package: any uninstall might).
            continue
        deletes.append(DeleteConfigMap(skyhook.name, cm.name, cm.uid, "package", names))
    return deletes


def node_metadata_deletes(
    skyhook: Skyhook,
    config_maps: Iterable[ConfigMapFacts],
    *,
    targets: Iterable[str],
    running_on: Iterable[str] = (),
    writing: Collection[str] = (),
) -> list[DeleteConfigMap]:
    """Node-metadata ConfigMaps of nodes the object no longer targets and runs no Job on."""
    kept = {node_metadata_name(skyhook.name, node) for node in (*targets, *running_on)}
    return [
        DeleteConfigMap(skyhook.name, cm.name, cm.uid, "node-metadata", skyhook.names)
        for cm in sorted(node_metadata_config_maps(skyhook, config_maps), key=lambda c: c.name)
        if cm.name not in kept and cm.name not in writing
    ]
