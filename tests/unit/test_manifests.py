"""Checks of everything under k8s/, docker-compose.yml and the Dockerfile.

No Kubernetes cluster or Docker engine is needed: CRD schemas are checked for the structural
rules the apiserver enforces, the examples go through the API emulator's own prune/default/
validate code, RBAC is compared verb for verb with what k8s-watcher needs, the NATS config is
loaded by the real nats-server (and its publish permissions exercised), and kustomize is run
through kubectl where it is installed (it must be, in CI).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import functools
import importlib.util
import os
import re
import shutil
import subprocess
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nats
import pytest
import yaml
from nats.errors import Error as NatsError

from clustersim.kube.schema import prepare_custom_object, prune, validate
from k8s_watcher.config import K8sWatcherConfig
from maintenance_scheduler.config import MaintenanceSchedulerConfig
from nodeflow_contracts.permissions import ADMIN_USER, nats_publish_allow
from nodeflow_contracts.topology import APPLIED_COMMANDS_BUCKET, WATCHED_KINDS, subject_matches
from nodeflow_runtime.config import ServiceConfig, load_config
from nodeflow_runtime.natsd import free_port, nats_server_binary
from slurm_syncer.settings import SlurmSyncerConfig, cluster_settings
from tests.fixtures.tls import make_pki

Obj = dict[str, Any]

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "k8s"
NAMESPACE = "nodeflow-system"
IMAGE = "ghcr.io/nodeflow/nodeflow:0.1.0"
SERVICES = (
    "k8s-watcher",
    "slurm-syncer",
    "nodeset-controller",
    "maintenance-scheduler",
    "topology-placer",
    "metrics-exporter",
)
CRD_NAMES = {
    "nodesets.nodeflow.dev",
    "nodeslices.nodeflow.dev",
    "nodemaintenances.maintenance.nvidia.com",
    "maintenanceoperatorconfigs.maintenance.nvidia.com",
    "podgroups.scheduling.sigs.k8s.io",
    "clusternetworktopologies.scheduling.koordinator.sh",
    "skyhooks.skyhook.nvidia.com",
    "nodewrights.nodewright.nvidia.com",
    "deploymentpolicies.skyhook.nvidia.com",
    "deploymentpolicies.nodewright.nvidia.com",
}
# Upstream's CRDs that name no short name, kept so (a NodeWright is `kubectl get nodewrights`),
# and the renamed group's DeploymentPolicy (`dp` is the skyhook.nvidia.com one's).
NO_SHORT_NAMES = {"nodewrights.nodewright.nvidia.com", "deploymentpolicies.nodewright.nvidia.com"}
# Short names of built-in resources (kubectl api-resources); a CRD must not shadow them.
BUILTIN_SHORT_NAMES = {
    "cs", "cm", "ep", "ev", "limits", "ns", "no", "pvc", "pv", "po", "rc", "quota", "sa",
    "svc", "crd", "crds", "ds", "deploy", "rs", "sts", "hpa", "cj", "csr", "ing", "netpol",
    "pdb", "pc", "psp", "sc", "ingclass", "eps",
}  # fmt: skip


def module_of(service: str) -> str:
    return service.replace("-", "_")


# --- loading --------------------------------------------------------------------------------


def yaml_files() -> list[Path]:
    return sorted(p for p in K8S.rglob("*") if p.suffix in (".yaml", ".yml"))


def load_docs(path: Path) -> list[Obj]:
    """The documents of one file (a fresh copy: tests may edit what they get)."""
    return copy.deepcopy(_parsed(path, path.stat().st_mtime_ns))


@functools.lru_cache(maxsize=128)
def _parsed(path: Path, mtime_ns: int) -> list[Obj]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def objects_under(*parts: str) -> list[Obj]:
    """Every Kubernetes object (not kustomization) in the given files or directories."""
    found: list[Obj] = []
    for part in parts:
        target = K8S / part
        paths = [target] if target.is_file() else sorted(target.rglob("*.yaml"))
        for path in paths:
            if path.name == "kustomization.yaml":
                continue
            found.extend(doc for doc in load_docs(path) if "kind" in doc)
    return found


BASE = K8S / "base"
DEV = K8S / "overlays" / "dev"
PRODUCTION = K8S / "overlays" / "production"
THIRD_PARTY_CRDS = K8S / "third-party-crds"
THIRD_PARTY_CRD_NAMES = {
    "nodemaintenances.maintenance.nvidia.com",
    "maintenanceoperatorconfigs.maintenance.nvidia.com",
    "podgroups.scheduling.sigs.k8s.io",
    "clusternetworktopologies.scheduling.koordinator.sh",
    "skyhooks.skyhook.nvidia.com",
    "nodewrights.nodewright.nvidia.com",
    "deploymentpolicies.skyhook.nvidia.com",
    "deploymentpolicies.nodewright.nvidia.com",
}


def deployed_objects() -> list[Obj]:
    """What `kubectl apply -k k8s/overlays/dev/` creates, read from the files the kustomizations
    list, less the objects their `$patch: delete` patches drop."""
    return kustomized_objects(DEV)


def kustomized_objects(directory: Path) -> list[Obj]:
    dropped = deleted_by_patches(directory)
    return [
        obj
        for path in kustomize_resource_files(directory)
        for obj in load_docs(path)
        if (obj.get("kind"), obj.get("metadata", {}).get("name")) not in dropped
    ]


def deleted_by_patches(directory: Path) -> set[tuple[str, str]]:
    kustomization = yaml.safe_load((directory / "kustomization.yaml").read_text())
    dropped: set[tuple[str, str]] = set()
    for entry in kustomization.get("patches", []):
        patch = yaml.safe_load(entry.get("patch", "")) or {}
        if patch.get("$patch") == "delete":
            dropped.add((patch["kind"], patch["metadata"]["name"]))
    for entry in kustomization.get("resources", []):
        if (directory / entry).is_dir():
            dropped |= deleted_by_patches((directory / entry).resolve())
    return dropped


def kustomize_resource_files(directory: Path) -> Iterator[Path]:
    kustomization = yaml.safe_load((directory / "kustomization.yaml").read_text())
    for entry in kustomization.get("resources", []):
        target = (directory / entry).resolve()
        if target.is_dir():
            yield from kustomize_resource_files(target)
        else:
            yield target


def of_kind(objects: list[Obj], kind: str) -> list[Obj]:
    return [obj for obj in objects if obj.get("kind") == kind]


def by_name(objects: list[Obj], kind: str) -> dict[str, Obj]:
    return {obj["metadata"]["name"]: obj for obj in of_kind(objects, kind)}


def crds() -> dict[str, Obj]:
    return by_name(objects_under("crds"), "CustomResourceDefinition")


def crd_for_kind(kind: str, group: str = "") -> Obj:
    """The CRD of a kind (of `group`, where two groups serve one kind name)."""
    for crd in crds().values():
        if crd["spec"]["names"]["kind"] == kind and group in ("", crd["spec"]["group"]):
            return crd
    raise LookupError(kind)


def storage_schema(crd: Obj) -> Obj:
    (version,) = [v for v in crd["spec"]["versions"] if v["storage"]]
    schema: Obj = version["schema"]["openAPIV3Schema"]
    return schema


def storage_version(crd: Obj) -> Obj:
    (version,) = [v for v in crd["spec"]["versions"] if v["storage"]]
    found: Obj = version
    return found


# --- a structural-schema checker (the apiserver's rules for apiextensions.k8s.io/v1) ---------


def structural_violations(schema: Obj, path: str = "") -> list[str]:
    problems: list[str] = []
    int_or_string = schema.get("x-kubernetes-int-or-string") is True
    preserve = schema.get("x-kubernetes-preserve-unknown-fields") is True
    kind = schema.get("type")
    if kind is None and not (int_or_string or preserve):
        problems.append(f"{path or '<root>'}: no type")
    if int_or_string:
        if kind is not None:
            problems.append(f"{path}: int-or-string must not set type")
        if schema.get("anyOf") not in (None, [{"type": "integer"}, {"type": "string"}]):
            problems.append(f"{path}: int-or-string anyOf must be [integer, string]")
    elif any(key in schema for key in ("anyOf", "allOf", "oneOf", "not")):
        problems.append(f"{path}: logical junctors are only used for int-or-string here")
    if "properties" in schema and "additionalProperties" in schema:
        problems.append(f"{path}: properties and additionalProperties are exclusive")
    if kind == "array":
        items = schema.get("items")
        if not isinstance(items, dict):
            problems.append(f"{path}: array without an items schema")
        else:
            problems.extend(structural_violations(items, f"{path}[*]"))
            if schema.get("x-kubernetes-list-type") == "map":
                keys = schema.get("x-kubernetes-list-map-keys") or []
                required = set(items.get("required") or [])
                if not keys or not set(keys) <= required:
                    problems.append(f"{path}: list-map keys must be required item fields")
    for name, sub in (schema.get("properties") or {}).items():
        problems.extend(structural_violations(sub, f"{path}.{name}" if path else name))
    additional = schema.get("additionalProperties")
    if isinstance(additional, dict):
        problems.extend(structural_violations(additional, f"{path}.*"))
    if "default" in schema:
        problems.extend(
            f"{path}: default invalid: {c.message}"
            for c in validate(schema["default"], schema, path)
        )
    for rule in schema.get("x-kubernetes-validations") or []:
        if not rule.get("rule") or not rule.get("message"):
            problems.append(f"{path}: a validation rule needs a rule and a message")
    return problems


def resolve_json_path(schema: Obj, json_path: str) -> Obj | None:
    """The schema node a printer column / subresource path points at, or None."""
    node: Obj | None = schema
    for token in re.findall(r"\[[^\]]*\]|[A-Za-z0-9_]+", json_path):
        if node is None:
            return None
        if token.startswith("["):
            node = node.get("items")
        elif token == "metadata" and node is schema:
            return {"type": "object"}
        else:
            node = (node.get("properties") or {}).get(token)
    return node


def test_every_yaml_file_under_k8s_parses_into_objects_or_known_config() -> None:
    files = yaml_files()
    assert files, "k8s/ has no YAML"
    for path in files:
        docs = load_docs(path)
        assert docs, f"{path} is empty"
        for doc in docs:
            if path.name == "kustomization.yaml":
                assert doc["kind"] == "Kustomization"
            elif path.name == "prometheus-scrape.yaml":
                assert "scrape_configs" in doc
            else:
                assert {"apiVersion", "kind", "metadata"} <= set(doc), path


# --- CRDs -----------------------------------------------------------------------------------


def test_the_six_crds_one_per_file_named_after_the_crd() -> None:
    files = sorted((K8S / "crds").glob("*.yaml"))
    crd_files = [p for p in files if p.name != "kustomization.yaml"]
    assert {p.stem for p in crd_files} == CRD_NAMES
    for path in crd_files:
        (doc,) = load_docs(path)
        assert doc["apiVersion"] == "apiextensions.k8s.io/v1"
        assert doc["metadata"]["name"] == path.stem


@pytest.mark.parametrize("name", sorted(CRD_NAMES))
def test_crd_names_are_consistent(name: str) -> None:
    crd = crds()[name]
    spec = crd["spec"]
    names = spec["names"]
    assert name == f"{names['plural']}.{spec['group']}"
    assert names["listKind"] == names["kind"] + "List"
    assert names["singular"] == names["kind"].lower()
    assert (name in NO_SHORT_NAMES or names["shortNames"]) and names["categories"]
    assert "nodeflow" in names["categories"]
    versions = spec["versions"]
    assert [v["name"] for v in versions] == ["v1alpha1"]
    assert [v for v in versions if v["storage"] and v["served"]] == versions


def test_crds_match_the_kinds_k8s_watcher_mirrors() -> None:
    """k8s-watcher watches exactly these resources: group, version, plural and scope agree."""
    custom = {f"{kind.plural}.{kind.group}": kind for kind in WATCHED_KINDS if kind.served_by_crd}
    assert set(custom) == CRD_NAMES
    for name, crd in crds().items():
        watched = custom[name]
        assert crd["spec"]["group"] == watched.group
        assert crd["spec"]["names"]["kind"] == watched.kind
        assert storage_version(crd)["name"] == watched.version
        assert (crd["spec"]["scope"] == "Namespaced") is watched.namespaced


def test_short_names_are_unique_and_do_not_shadow_built_in_resources() -> None:
    short = [s for crd in crds().values() for s in crd["spec"]["names"].get("shortNames", ())]
    assert len(short) == len(set(short))
    assert not set(short) & BUILTIN_SHORT_NAMES
    assert crds()["nodesets.nodeflow.dev"]["spec"]["names"]["shortNames"] == ["nds"]


@pytest.mark.parametrize("name", sorted(CRD_NAMES))
def test_crd_schema_is_structural(name: str) -> None:
    schema = storage_schema(crds()[name])
    assert structural_violations(schema) == []
    assert schema["properties"]["metadata"] == {"type": "object"}
    assert schema["properties"]["status"]["type"] == "object"


def test_structural_checker_rejects_non_structural_schemas() -> None:
    assert structural_violations({"type": "object", "properties": {"a": {}}}) == ["a: no type"]
    assert structural_violations({"type": "array"}) == [": array without an items schema"]
    bad_default = {"type": "integer", "minimum": 0, "default": -1}
    assert structural_violations(bad_default)
    loose = {"type": "object", "properties": {"x": {"anyOf": [{"type": "string"}]}}}
    assert len(structural_violations(loose)) == 2


@pytest.mark.parametrize("name", sorted(CRD_NAMES))
def test_status_subresource_and_printer_columns_point_at_schema_fields(name: str) -> None:
    crd = crds()[name]
    version = storage_version(crd)
    schema = storage_schema(crd)
    assert version["subresources"]["status"] == {}
    columns = version["additionalPrinterColumns"]
    assert columns[-1] == {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}
    for column in columns:
        target = resolve_json_path(schema, column["jsonPath"])
        assert target is not None, f"{name}: column {column['name']} reads nothing"
        if column["type"] == "integer":
            assert target.get("type") == "integer", column


def test_nodeset_schema() -> None:
    crd = crds()["nodesets.nodeflow.dev"]
    version = storage_version(crd)
    schema = storage_schema(crd)
    spec = schema["properties"]["spec"]
    status = schema["properties"]["status"]
    assert [c["name"].upper() for c in version["additionalPrinterColumns"]] == [
        "DESIRED", "CURRENT", "READY", "UP-TO-DATE", "FEASIBLE", "RUNNING", "DRAINED", "AGE",
    ]  # fmt: skip
    scale = version["subresources"]["scale"]
    assert scale == {
        "specReplicasPath": ".spec.replicas",
        "statusReplicasPath": ".status.currentNumberScheduled",
        "labelSelectorPath": ".status.selector",
    }
    for path in scale.values():
        assert resolve_json_path(schema, path) is not None
    assert set(spec["required"]) == {"slurmCluster", "template"}
    assert spec["properties"]["replicas"]["minimum"] == 0
    assert spec["properties"]["template"]["properties"]["spec"]["required"] == ["containers"]
    strategy = spec["properties"]["updateStrategy"]["properties"]
    assert strategy["type"]["enum"] == ["RollingUpdate", "OnDelete", "ScheduledUpdate"]
    assert strategy["type"]["default"] == "RollingUpdate"
    max_unavailable = strategy["rollingUpdate"]["properties"]["maxUnavailable"]
    assert max_unavailable["x-kubernetes-int-or-string"] is True
    assert max_unavailable["default"] == 1
    assert spec["properties"]["scaleDownPriorityOrdering"]["type"] == "boolean"
    for timeout in (
        "forceScalingDeleteKnownConditionTimeout",
        "forceScalingDeleteUnknownConditionTimeout",
    ):
        assert spec["properties"][timeout] == spec["properties"][timeout] | {
            "type": "integer",
            "minimum": 0,
        }
    nine = {
        "currentNumberScheduled", "numberMisscheduled", "desiredNumberScheduled",
        "updatedNumberScheduled", "numberFeasible", "numberReady", "numberUnavailable",
        "numberRunning", "numberDrain",
    }  # fmt: skip
    # Rule 7e's revisions: the ControllerRevision the pods run and the template's.
    revisions = {"currentRevision", "updateRevision"}
    assert set(status["properties"]) == nine | revisions | {
        "observedGeneration",
        "selector",
        "conditions",
    }
    conditions = status["properties"]["conditions"]
    assert conditions["x-kubernetes-list-type"] == "map"
    assert conditions["x-kubernetes-list-map-keys"] == ["type"]
    assert set(conditions["items"]["properties"]) == {
        "type", "status", "reason", "message", "lastTransitionTime", "observedGeneration",
    }  # fmt: skip


def test_maintenance_crds_keep_the_upstream_api() -> None:
    nm = storage_schema(crds()["nodemaintenances.maintenance.nvidia.com"])
    spec = nm["properties"]["spec"]
    assert set(spec["required"]) == {"nodeName", "requestorID"}
    assert set(spec["properties"]) == {
        "requestorID", "additionalRequestors", "nodeName", "cordon", "waitForPodCompletion",
        "drainSpec",
    }  # fmt: skip
    for immutable in ("requestorID", "nodeName"):
        rules = spec["properties"][immutable]["x-kubernetes-validations"]
        assert rules == [{"rule": "self == oldSelf", "message": "Value is immutable"}]
    assert spec["properties"]["cordon"]["default"] is True
    drain = spec["properties"]["drainSpec"]["properties"]
    assert set(drain) == {
        "force",
        "podSelector",
        "timeoutSeconds",
        "deleteEmptyDir",
        "podEvictionFilters",
    }
    assert drain["timeoutSeconds"]["default"] == 300
    assert set(drain["podEvictionFilters"]["items"]["properties"]) == {"byResourceNameRegex"}
    wait = spec["properties"]["waitForPodCompletion"]["properties"]
    assert set(wait) == {"podSelector", "timeoutSeconds"}
    assert wait["timeoutSeconds"]["default"] == 0
    status = nm["properties"]["status"]["properties"]
    assert set(status) == {"conditions", "waitForCompletion", "drain"}
    assert set(status["drain"]["properties"]) == {
        "totalPods",
        "evictionPods",
        "drainProgress",
        "waitForEviction",
    }
    columns = storage_version(crds()["nodemaintenances.maintenance.nvidia.com"])[
        "additionalPrinterColumns"
    ]
    assert [c["name"].upper() for c in columns] == [
        "NODE",
        "REQUESTOR",
        "READY",
        "PHASE",
        "FAILED",
        "AGE",
    ]

    moc = storage_schema(crds()["maintenanceoperatorconfigs.maintenance.nvidia.com"])
    config = moc["properties"]["spec"]["properties"]
    assert set(config) == {
        "logLevel",
        "maxNodeMaintenanceTimeSeconds",
        "maxParallelOperations",
        "maxUnavailable",
    }
    assert config["logLevel"]["enum"] == ["debug", "info", "error"]
    assert config["maxParallelOperations"]["default"] == 1
    assert config["maxNodeMaintenanceTimeSeconds"]["default"] == 3600
    assert "default" not in config["maxUnavailable"]  # unset means no limit
    for int_or_percent in ("maxParallelOperations", "maxUnavailable"):
        assert config[int_or_percent]["x-kubernetes-int-or-string"] is True


def test_scheduling_crds_match_koordinator() -> None:
    pg = storage_schema(crds()["podgroups.scheduling.sigs.k8s.io"])
    assert set(pg["properties"]["spec"]["properties"]) == {
        "minMember",
        "minResources",
        "scheduleTimeoutSeconds",
    }
    assert set(pg["properties"]["status"]["properties"]) == {
        "phase", "scheduled", "running", "succeeded", "failed", "occupiedBy", "scheduleStartTime",
    }  # fmt: skip
    cnt_crd = crds()["clusternetworktopologies.scheduling.koordinator.sh"]
    assert cnt_crd["spec"]["scope"] == "Cluster"
    cnt = storage_schema(cnt_crd)
    layer = cnt["properties"]["spec"]["properties"]["networkTopologySpec"]["items"]
    assert set(layer["properties"]) == {"labelKey", "parentTopologyLayer", "topologyLayer"}
    detail = cnt["properties"]["status"]["properties"]["detailStatus"]["items"]
    assert set(detail["properties"]) == {
        "childTopologyLayer", "childTopologyNames", "nodeNum", "parentTopologyInfo", "topologyInfo",
    }  # fmt: skip


# --- examples -------------------------------------------------------------------------------


def examples() -> list[Obj]:
    return objects_under("examples")


def admitted(obj: Obj) -> tuple[Obj, list[str]]:
    """The object as the API emulator would store it, and every reason it would refuse it.

    Unknown fields count as errors here (the apiserver would silently prune them, which hides
    a typo in an example), so the example must survive pruning unchanged.
    """
    group = str(obj.get("apiVersion") or "").rpartition("/")[0]
    schema = storage_schema(crd_for_kind(obj["kind"], group))
    problems = [f"unknown fields: {obj} != pruned"] if prune(obj, schema, root=True) != obj else []
    stored, causes = prepare_custom_object(copy.deepcopy(obj), schema)
    return stored, problems + [f"{c.field}: {c.message}" for c in causes]


def test_every_custom_resource_example_conforms_to_its_crd() -> None:
    custom_kinds = {(crd["spec"]["group"], crd["spec"]["names"]["kind"]) for crd in crds().values()}
    seen = set()
    for obj in examples():
        group, _, version = str(obj.get("apiVersion")).rpartition("/")
        if (group, obj["kind"]) not in custom_kinds:
            continue
        assert version == "v1alpha1"
        _, problems = admitted(obj)
        assert problems == [], f"{obj['kind']}/{obj['metadata']['name']}: {problems}"
        seen.add((group, obj["kind"]))
    assert seen == custom_kinds - {("nodeflow.dev", "NodeSlice")}


def the_example(kind: str) -> Obj:
    (obj,) = of_kind(examples(), kind)
    return obj


def test_nodeset_example() -> None:
    nodeset = the_example("NodeSet")
    assert nodeset["spec"]["slurmCluster"] == "sim"
    assert nodeset["spec"]["replicas"] == 4
    (container,) = nodeset["spec"]["template"]["spec"]["containers"]
    assert container["name"] == "slurmd"
    assert container["image"] == "ghcr.io/nodeflow/slurmd:24.11"
    assert {"cpu", "memory", "nvidia.com/gpu"} <= set(container["resources"]["requests"])
    # The CRD has no spec.selector (nothing read it): the example sets none.
    assert "selector" not in nodeset["spec"]


def test_topology_and_gang_examples_are_coherent() -> None:
    topology = the_example("ClusterNetworkTopology")
    assert topology["metadata"]["name"] == "default"
    layers = topology["spec"]["networkTopologySpec"]
    keys = {key for layer in layers for key in layer["labelKey"]}
    assert keys == {
        f"network.topology.nvidia.com/{level}"
        for level in ("datacenter", "spine", "block", "accelerator")
    } | {"kubernetes.io/hostname"}
    defined: set[str] = set()
    for layer in layers:  # a chain from the top: every parent is declared before its child
        assert layer.get("parentTopologyLayer") is None or layer["parentTopologyLayer"] in defined
        defined.add(layer["topologyLayer"])
    assert the_example("MaintenanceOperatorConfig")["metadata"]["name"] == "default"
    group = the_example("PodGroup")
    members = [
        pod
        for pod in of_kind(examples(), "Pod")
        if pod["metadata"]["labels"].get("pod-group.scheduling.sigs.k8s.io")
        == group["metadata"]["name"]
    ]
    assert len(members) == group["spec"]["minMember"]
    indices = sorted(
        int(p["metadata"]["annotations"]["gang.scheduling.koordinator.sh/network-topology-index"])
        for p in members
    )
    assert indices == list(range(1, len(members) + 1))


def test_api_defaults_fill_a_minimal_node_maintenance() -> None:
    minimal = {
        "apiVersion": "maintenance.nvidia.com/v1alpha1",
        "kind": "NodeMaintenance",
        "metadata": {"name": "m", "namespace": "default"},
        "spec": {"requestorID": "a.b", "nodeName": "gpu-001", "drainSpec": {}},
    }
    stored, problems = admitted(minimal)
    assert problems == []
    assert stored["spec"]["cordon"] is True
    assert stored["spec"]["drainSpec"] == {
        "force": False,
        "timeoutSeconds": 300,
        "deleteEmptyDir": False,
    }


INVALID_EDITS = [
    ("NodeSet", ("spec", "replicas"), -1),
    ("NodeSet", ("spec", "slurmCluster"), "Has.Dots"),
    ("NodeSet", ("spec", "updateStrategy", "type"), "Recreate"),
    ("NodeSet", ("spec", "updateStrategy", "rollingUpdate", "maxUnavailable"), "two"),
    ("NodeSet", ("spec", "updateStrategy", "rollingUpdate", "maxUnavailable"), 1.5),
    ("NodeSet", ("spec", "forceScalingDeleteKnownConditionTimeout"), -5),
    ("NodeSet", ("spec", "template", "spec", "containers"), []),
    ("NodeMaintenance", ("spec", "requestorID"), "-bad-"),
    ("NodeMaintenance", ("spec", "drainSpec", "timeoutSeconds"), -1),
    ("NodeMaintenance", ("spec", "cordon"), "yes"),
    ("MaintenanceOperatorConfig", ("spec", "logLevel"), "trace"),
    ("MaintenanceOperatorConfig", ("spec", "maxParallelOperations"), True),
    ("PodGroup", ("spec", "minMember"), -1),
    ("PodGroup", ("spec", "minResources", "cpu"), "lots"),
    ("ClusterNetworkTopology", ("spec", "networkTopologySpec"), [{"labelKey": ["x"]}]),
]


@pytest.mark.parametrize(("kind", "path", "value"), INVALID_EDITS)
def test_schemas_refuse_invalid_objects(kind: str, path: tuple[str, ...], value: Any) -> None:
    obj = copy.deepcopy(the_example(kind))
    target = obj
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    _, problems = admitted(obj)
    assert problems, f"{kind} with {'.'.join(path)}={value!r} was admitted"


def test_required_fields_are_required() -> None:
    for kind, field in (
        ("NodeSet", "slurmCluster"),
        ("NodeSet", "template"),
        ("NodeMaintenance", "requestorID"),
        ("NodeMaintenance", "nodeName"),
    ):
        obj = copy.deepcopy(the_example(kind))
        del obj["spec"][field]
        _, problems = admitted(obj)
        assert any(f"spec.{field}" in p for p in problems), (kind, field)
    nodes = [f"gpu-{i:03d}" for i in range(64)]
    slice_obj: Obj = {
        "apiVersion": "nodeflow.dev/v1alpha1",
        "kind": "NodeSlice",
        "metadata": {"name": "gpu-0"},
        "spec": {"nodeSetName": "gpu", "nodes": nodes},
    }
    assert admitted(slice_obj)[1] == []
    nodes.append("gpu-064")
    assert admitted(slice_obj)[1]


# --- RBAC -----------------------------------------------------------------------------------

EXPECTED_PERMISSIONS: dict[tuple[str, str], set[str]] = {
    ("", "nodes"): {"list", "watch", "patch"},
    # The Skyhook controller's node conditions (skyhook.nvidia.com/<name>/NotReady, /Erroring).
    ("", "nodes/status"): {"patch"},
    ("", "pods"): {"get", "list", "watch", "create", "delete", "patch"},
    ("", "pods/status"): {"patch"},
    ("", "pods/eviction"): {"create"},
    ("", "pods/binding"): {"create"},
    ("batch", "jobs"): {"get", "list", "watch", "create", "delete", "patch"},
    # create/delete: nodeset-controller's budget per NodeSet (workloadDisruptionProtection).
    ("policy", "poddisruptionbudgets"): {"get", "list", "watch", "create", "delete"},
    # A NodeSet's revision history (nodeset-controller's ControllerRevisions).
    ("apps", "controllerrevisions"): {"get", "list", "watch", "create", "delete"},
    # The volume topology of pods naming a claim (topology-placer), which annotates a
    # WaitForFirstConsumer claim with its selected node.
    ("", "persistentvolumeclaims"): {"list", "watch", "patch"},
    ("", "persistentvolumes"): {"list", "watch"},
    # Read only: an unbound claim's class (topology-placer).
    ("storage.k8s.io", "storageclasses"): {"list", "watch"},
    ("", "events"): {"get", "create", "patch"},
    ("coordination.k8s.io", "leases"): {"get", "create", "patch"},
    ("nodeflow.dev", "nodeslices"): {"get", "list", "watch", "create", "delete", "patch"},
    ("nodeflow.dev", "nodesets"): {"list", "watch", "patch"},
    ("maintenance.nvidia.com", "nodemaintenances"): {
        "get",
        "list",
        "watch",
        "patch",
        "create",
        "delete",
    },
    ("maintenance.nvidia.com", "maintenanceoperatorconfigs"): {"list", "watch", "patch"},
    ("scheduling.sigs.k8s.io", "podgroups"): {"list", "watch", "patch"},
    # The Workload API's PodGroups: read only (their disruptionMode).
    ("scheduling.k8s.io", "podgroups"): {"list", "watch"},
    ("scheduling.koordinator.sh", "clusternetworktopologies"): {"list", "watch", "patch"},
    ("skyhook.nvidia.com", "skyhooks"): {"list", "watch", "patch"},
    ("skyhook.nvidia.com", "deploymentpolicies"): {"list", "watch", "patch"},
    ("nodewright.nvidia.com", "nodewrights"): {"list", "watch", "patch"},
    ("nodewright.nvidia.com", "deploymentpolicies"): {"list", "watch", "patch"},
    **{(name.split(".", 1)[1], name.split(".", 1)[0] + "/status"): {"patch"} for name in CRD_NAMES},
}


def granted_permissions(role: Obj) -> dict[tuple[str, str], set[str]]:
    granted: dict[tuple[str, str], set[str]] = {}
    for rule in role["rules"]:
        assert "resourceNames" not in rule and "nonResourceURLs" not in rule
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                granted.setdefault((group, resource), set()).update(rule["verbs"])
    return granted


# The ConfigMaps a Skyhook package pod mounts: written, deleted once no longer wanted, and
# mirrored with the Skyhook controller's label selector -- in the Skyhook namespace only.
SKYHOOK_ROLE = "nodeflow-k8s-watcher-skyhook"
SKYHOOK_NAMESPACE_PERMISSIONS: dict[tuple[str, str], set[str]] = {
    ("", "configmaps"): {"get", "list", "watch", "create", "patch", "delete"},
}


def test_k8s_watcher_cluster_role_has_exactly_the_needed_verbs() -> None:
    objects = deployed_objects()
    (role,) = of_kind(objects, "ClusterRole")
    assert granted_permissions(role) == EXPECTED_PERMISSIONS


def test_rule_k8s_watcher_reaches_config_maps_in_the_skyhook_namespace_only() -> None:
    """No cluster-wide grant on ConfigMaps (it would reach kube-system's): one Role in the
    namespace both services' SKYHOOK_NAMESPACE defaults to, and k8s-watcher mirrors
    ConfigMaps from there only."""
    objects = deployed_objects()
    (role,) = of_kind(objects, "Role")
    skyhook_namespace = MaintenanceSchedulerConfig(nats_url=("nats://x:4222",)).skyhook_namespace
    watcher = K8sWatcherConfig(nats_url=("nats://x:4222",))
    assert role["metadata"]["namespace"] == skyhook_namespace == watcher.skyhook_namespace
    assert granted_permissions(role) == SKYHOOK_NAMESPACE_PERMISSIONS
    (cluster_role,) = of_kind(objects, "ClusterRole")
    assert not {resource for _, resource in granted_permissions(cluster_role)} & {"configmaps"}
    (config_maps,) = (kind for kind in WATCHED_KINDS if kind.kind == "ConfigMap")
    assert watcher.mirrored_namespaces(config_maps) == (skyhook_namespace,)


def test_only_k8s_watcher_is_bound_to_a_role() -> None:
    objects = deployed_objects()
    (cluster_binding,) = of_kind(objects, "ClusterRoleBinding")
    (binding,) = of_kind(objects, "RoleBinding")
    for bound in (cluster_binding, binding):
        assert bound["subjects"] == [
            {"kind": "ServiceAccount", "name": "k8s-watcher", "namespace": NAMESPACE}
        ]
    (cluster_role,) = of_kind(objects, "ClusterRole")
    assert cluster_binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": cluster_role["metadata"]["name"],
    }
    (role,) = of_kind(objects, "Role")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": role["metadata"]["name"],
    }
    assert binding["metadata"]["namespace"] == role["metadata"]["namespace"]
    accounts = by_name(objects, "ServiceAccount")
    assert set(accounts) == set(SERVICES)
    for name, account in accounts.items():
        assert account["automountServiceAccountToken"] is (name == "k8s-watcher")


# --- Deployments, Services, Secrets ---------------------------------------------------------


def container_of(deployment: Obj) -> Obj:
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    result: Obj = container
    return result


def env_of(container: Obj) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def test_one_deployment_per_service_running_its_module() -> None:
    deployments = by_name(deployed_objects(), "Deployment")
    assert set(deployments) == set(SERVICES)
    for name, deployment in deployments.items():
        container = container_of(deployment)
        assert container["image"] == IMAGE
        assert container["command"] == ["python", "-m", module_of(name)]
        assert importlib.util.find_spec(module_of(name)) is not None
        assert container["ports"] == [{"name": "http", "containerPort": 8080, "protocol": "TCP"}]
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()


def test_deployments_probe_healthz_and_readyz_with_resources_and_locked_down() -> None:
    for name, deployment in by_name(deployed_objects(), "Deployment").items():
        pod = deployment["spec"]["template"]["spec"]
        container = container_of(deployment)
        assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
        assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
        for kind in ("requests", "limits"):
            assert {"cpu", "memory"} <= set(container["resources"][kind]), name
        security = container["securityContext"]
        assert security["runAsNonRoot"] is True
        assert security["readOnlyRootFilesystem"] is True
        assert security["allowPrivilegeEscalation"] is False
        assert security["capabilities"] == {"drop": ["ALL"]}
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        assert pod["serviceAccountName"] == name
        assert pod["automountServiceAccountToken"] is (name == "k8s-watcher")


def test_services_get_nats_credentials_from_their_own_secret() -> None:
    objects = kustomize_build(DEV)
    secrets = by_name(objects, "Secret")
    for name, deployment in by_name(objects, "Deployment").items():
        env = env_of(container_of(deployment))
        assert env["NATS_URL"] == ",".join(nats_pod_urls(4222))
        assert env["NATS_REPLICAS"] == "3"
        assert env["HTTP_PORT"] == "8080"
        assert env["LOG_LEVEL"] in ("debug", "info", "warning", "error")
        for variable, key in (("NATS_USER", "user"), ("NATS_PASSWORD", "password")):
            ref = env[variable]["secretKeyRef"]
            assert ref == {"name": f"nodeflow-{name}-nats", "key": key}
            assert key in secrets[ref["name"]]["stringData"]
        assert secrets[f"nodeflow-{name}-nats"]["stringData"]["user"] == name
        slurm_vars = {v for v in env if v.startswith("SLURM_")}
        if name == "slurm-syncer":
            assert env["SLURM_CLUSTERS"] == "sim"
            assert {"SLURM_SIM_URL", "SLURM_SIM_TOKEN_FILE", "SLURM_SIM_USER"} <= slurm_vars
        else:
            assert not slurm_vars, f"only slurm-syncer may hold Slurm settings ({name})"


def test_only_slurm_syncer_mounts_the_slurm_token() -> None:
    objects = kustomize_build(DEV)
    for name, deployment in by_name(objects, "Deployment").items():
        volumes = deployment["spec"]["template"]["spec"]["volumes"]
        secret_volumes = [v["secret"]["secretName"] for v in volumes if "secret" in v]
        assert secret_volumes == (["nodeflow-slurm-sim"] if name == "slurm-syncer" else [])
    syncer = container_of(by_name(objects, "Deployment")["slurm-syncer"])
    token_file = Path(env_of(syncer)["SLURM_SIM_TOKEN_FILE"])
    mounts = {m["mountPath"] for m in syncer["volumeMounts"]}
    assert str(token_file.parent) in mounts
    assert token_file.name in by_name(objects, "Secret")["nodeflow-slurm-sim"]["stringData"]


def effective_labels(obj: Obj) -> dict[str, str]:
    """Labels after kustomize adds the top-level kustomization's common labels."""
    kustomization = yaml.safe_load((BASE / "kustomization.yaml").read_text())
    labels = dict(obj["metadata"].get("labels", {}))
    for entry in kustomization.get("labels", []):
        labels.update(entry["pairs"])
    return labels


def test_a_metrics_service_and_a_service_monitor_per_service() -> None:
    objects = deployed_objects()
    services = by_name(objects, "Service")
    monitors = by_name(objects_under("monitoring"), "ServiceMonitor")
    assert set(monitors) == set(SERVICES)
    for name in SERVICES:
        service = services[name]
        assert service["spec"]["selector"] == {"app.kubernetes.io/name": name}
        (port,) = service["spec"]["ports"]
        assert port["name"] == "http" and port["targetPort"] == "http"
        monitor = monitors[name]
        assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
        selector = monitor["spec"]["selector"]["matchLabels"]
        assert selector.items() <= effective_labels(service).items()
        assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
        (endpoint,) = monitor["spec"]["endpoints"]
        assert endpoint["port"] == "http" and endpoint["path"] == "/metrics"


def test_plain_prometheus_scrape_config_keeps_nodeflow_http_endpoints() -> None:
    (config,) = load_docs(K8S / "monitoring" / "prometheus-scrape.yaml")
    (job,) = config["scrape_configs"]
    assert job["metrics_path"] == "/metrics"
    keeps = {
        (tuple(r["source_labels"]), r["regex"])
        for r in job["relabel_configs"]
        if r.get("action") == "keep"
    }
    assert keeps == {
        (("__meta_kubernetes_service_label_app_kubernetes_io_part_of",), "nodeflow"),
        (("__meta_kubernetes_endpoint_port_name",), "http"),
    }
    some_service = by_name(deployed_objects(), "Service")["nodeset-controller"]
    assert effective_labels(some_service)["app.kubernetes.io/part-of"] == "nodeflow"


# --- NATS -----------------------------------------------------------------------------------


def nats_config_text() -> str:
    config = by_name(deployed_objects(), "ConfigMap")["nats-config"]
    text: str = config["data"]["nats.conf"]
    return text


def nats_secret(user: str) -> str:
    """The Secret holding a NATS user's password: one per service, and the admin's."""
    return "nodeflow-admin-nats" if user == ADMIN_USER else f"nodeflow-{user}-nats"


def nats_env(passwords: dict[str, str]) -> dict[str, str]:
    """The environment the StatefulSet gives nats-server, with the given passwords."""
    (statefulset,) = of_kind(deployed_objects(), "StatefulSet")
    env = {"PATH": os.environ.get("PATH", ""), "POD_NAME": "nats-0"}
    by_secret = {nats_secret(user): password for user, password in passwords.items()}
    for item in statefulset["spec"]["template"]["spec"]["containers"][0]["env"]:
        ref = item.get("valueFrom", {}).get("secretKeyRef")
        if ref:
            env[item["name"]] = by_secret[ref["name"]]
    return env


def test_nats_statefulset_reads_every_service_password_from_that_service_secret() -> None:
    (statefulset,) = of_kind(deployed_objects(), "StatefulSet")
    pod = statefulset["spec"]["template"]["spec"]
    refs = {
        item["name"]: item["valueFrom"]["secretKeyRef"]
        for item in pod["containers"][0]["env"]
        if "secretKeyRef" in item.get("valueFrom", {})
    }
    assert refs == {
        f"NATS_PASSWORD_{module_of(s).upper()}": {"name": nats_secret(s), "key": "password"}
        for s in (*SERVICES, ADMIN_USER)
    }
    text = nats_config_text()
    for service in (*SERVICES, ADMIN_USER):
        assert f"user: {service}\n" in text
        assert f"password: $NATS_PASSWORD_{module_of(service).upper()}\n" in text
    assert statefulset["spec"]["volumeClaimTemplates"][0]["metadata"]["name"] == "data"
    # The namespace enforces the `restricted` Pod Security Standard, NATS included.
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    security = pod["containers"][0]["securityContext"]
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert pod["automountServiceAccountToken"] is False
    assert "jetstream" in text and "store_dir: /data\n" in text


def nats_pod_urls(port: int, scheme: str = "nats") -> list[str]:
    """One URL per pod of the NATS StatefulSet, by its name under the headless Service."""
    (statefulset,) = of_kind(deployed_objects(), "StatefulSet")
    spec = statefulset["spec"]
    name, service = statefulset["metadata"]["name"], spec["serviceName"]
    return [
        f"{scheme}://{name}-{index}.{service}.{NAMESPACE}.svc:{port}"
        for index in range(spec["replicas"])
    ]


def test_nats_runs_as_a_three_server_jetstream_cluster_routed_through_the_headless_service() -> (
    None
):
    objects = deployed_objects()
    (statefulset,) = of_kind(objects, "StatefulSet")
    assert statefulset["spec"]["replicas"] == 3
    headless = by_name(objects, "Service")[statefulset["spec"]["serviceName"]]
    assert headless["spec"]["clusterIP"] == "None"
    assert headless["spec"]["publishNotReadyAddresses"] is True
    assert {"name": "cluster", "port": 6222, "targetPort": "cluster", "protocol": "TCP"} in (
        headless["spec"]["ports"]
    )
    container = statefulset["spec"]["template"]["spec"]["containers"][0]
    assert {"name": "cluster", "containerPort": 6222, "protocol": "TCP"} in container["ports"]
    text = nats_config_text()
    cluster = re.search(r"\ncluster \{\n(.*?)\n\}\n", text, flags=re.DOTALL)
    assert cluster, "no cluster block in nats.conf"
    assert "port: 6222" in cluster.group(1)
    routes = re.findall(r"nats://\S+", cluster.group(1))
    assert routes == nats_pod_urls(6222)
    # JetStream clustering needs a unique server name per pod.
    assert "server_name: $POD_NAME\n" in text
    (budget,) = [
        pdb
        for pdb in of_kind(objects, "PodDisruptionBudget")
        if pdb["metadata"]["name"] == statefulset["metadata"]["name"]
    ]
    # Never more than one server down on purpose: two of three keep the JetStream quorum.
    assert budget["spec"] == {
        "maxUnavailable": 1,
        "selector": statefulset["spec"]["selector"],
    }


# One replica, no budget: its KV-derived gauges would be exported twice by two replicas.
SINGLE_REPLICA = {"metrics-exporter"}


def test_every_service_runs_two_replicas_with_a_disruption_budget_keeping_one() -> None:
    objects = deployed_objects()
    budgets = by_name(objects, "PodDisruptionBudget")
    for name, deployment in by_name(objects, "Deployment").items():
        if name in SINGLE_REPLICA:
            assert deployment["spec"]["replicas"] == 1 and name not in budgets, name
            continue
        assert deployment["spec"]["replicas"] == 2, name
        budget = budgets[name]
        assert budget["apiVersion"] == "policy/v1"
        assert budget["spec"]["minAvailable"] == 1
        selected = budget["spec"]["selector"]["matchLabels"]
        assert selected.items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
        assert selected == deployment["spec"]["selector"]["matchLabels"]


def test_nats_config_is_accepted_by_nats_server(tmp_path: Path) -> None:
    config = tmp_path / "nats.conf"
    config.write_text(nats_config_text())
    passwords = {s: f"pw-{s}" for s in (*SERVICES, ADMIN_USER)}
    result = subprocess.run(
        [str(nats_server_binary()), "-c", str(config), "-t"],
        env=nats_env(passwords),
        capture_output=True,
        text=True,
        timeout=20,
        check=False,
    )
    assert result.returncode == 0, result.stderr


def test_only_the_owner_of_a_kv_bucket_may_write_it() -> None:
    # The watched kinds' buckets, and its record of applied commands (its idempotency).
    watcher_keys = [f"$KV.{kind.bucket}.key" for kind in WATCHED_KINDS]
    watcher_keys.append(f"$KV.{APPLIED_COMMANDS_BUCKET}.key")
    for service in SERVICES:
        allowed = nats_publish_allow(service)

        def may(subject: str, allowed: list[str] = allowed) -> bool:
            return any(subject_matches(pattern, subject) for pattern in allowed)

        if service != "k8s-watcher":
            assert not any(may(key) for key in watcher_keys), service
            assert not may("k8s.v1.pod.default.p"), service
        if service != "slurm-syncer":
            assert not may("$KV.slurm_nodes.sim.n") and not may("slurm.v1.sim.node.n"), service
        # A lease key is written by its own service only.
        for other in SERVICES:
            assert may(f"$KV.leases.{other}") == (other == service and may(f"$KV.leases.{service}"))


async def test_nats_publish_permissions_follow_ownership(tmp_path: Path) -> None:
    store = tmp_path / "store"
    config = tmp_path / "nats.conf"
    config.write_text(nats_config_text().replace("store_dir: /data\n", f"store_dir: {store}\n"))
    passwords = {s: f"pw-{s}" for s in (*SERVICES, ADMIN_USER)}
    port, monitor = free_port(), free_port()
    process = await asyncio.create_subprocess_exec(
        str(nats_server_binary()),
        *("-c", str(config), "-a", "127.0.0.1", "-p", str(port), "-m", str(monitor)),
        env=nats_env(passwords),
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:

        async def violations(user: str, subject: str) -> list[str]:
            errors: list[str] = []

            async def on_error(error: Exception) -> None:
                errors.append(str(error))

            client = await nats.connect(
                f"nats://127.0.0.1:{port}",
                user=user,
                password=passwords[user],
                error_cb=on_error,
                max_reconnect_attempts=0,
                connect_timeout=2,
            )
            try:
                await client.publish(subject, b"{}")
                await client.flush(timeout=2)
                await asyncio.sleep(0.05)
            finally:
                await client.close()
            return errors

        for _ in range(100):
            try:
                _, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.close()
                break
            except OSError:
                await asyncio.sleep(0.05)
        event = "k8s.v1.pod.default.gpu-001"
        assert await violations("k8s-watcher", event) == []
        assert await violations("k8s-watcher", "$KV.k8s_pods.default.gpu-001") == []
        assert await violations("nodeset-controller", "cmd.k8s.v1.nodeset-controller.patch") == []
        assert await violations("nodeset-controller", "$KV.leases.nodeset-controller") == []
        assert await violations("slurm-syncer", "slurm.v1.sim.node.gpu-001") == []
        denied = await violations("nodeset-controller", event)
        assert any("permissions violation" in e.lower() for e in denied), denied
        assert await violations("metrics-exporter", "cmd.k8s.v1.metrics-exporter.patch")
        assert await violations("slurm-syncer", "cmd.k8s.v1.nodeset-controller.delete")
        assert await violations("topology-placer", "$KV.k8s_pods.default.gpu-001")
        with pytest.raises(NatsError):
            await nats.connect(
                f"nats://127.0.0.1:{port}",
                user="nodeset-controller",
                password="wrong",
                max_reconnect_attempts=0,
                allow_reconnect=False,
                connect_timeout=2,
            )
    finally:
        process.terminate()
        await process.wait()


# --- kustomize ------------------------------------------------------------------------------


def test_every_manifest_is_listed_by_a_kustomization() -> None:
    listed = {
        path
        for root in (DEV, PRODUCTION, THIRD_PARTY_CRDS, K8S / "monitoring")
        for path in kustomize_resource_files(root)
    }
    for path in listed:
        assert path.is_file(), f"{path} is listed but missing"
    owned = [BASE / "namespace.yaml"] + [
        p
        for d in ("crds", "nats", "services", "rbac", "credentials-sample", "monitoring")
        for p in (K8S / d).glob("*.yaml")
        if p.name not in ("kustomization.yaml", "prometheus-scrape.yaml")
    ]
    assert sorted(set(owned) - listed) == []


def kubectl() -> str:
    found = shutil.which("kubectl")
    if found is None:
        pytest.skip("kubectl not installed (make test installs it as root)")
    return found


def kustomize_build(directory: Path) -> list[Obj]:
    result = subprocess.run(
        [kubectl(), "kustomize", str(directory)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def test_kubectl_kustomize_builds_the_deployment() -> None:
    built = kustomize_build(DEV)
    kinds = Counter(obj["kind"] for obj in built)
    assert kinds == Counter(
        {
            "CustomResourceDefinition": 2,  # ours; the third-party ones install separately
            "Deployment": 6,
            "ServiceAccount": 6,
            "Service": 8,
            "Secret": 8,  # a NATS user per service and the admin, the Slurm token
            "Role": 1,  # ConfigMaps, in the Skyhook namespace only
            "RoleBinding": 1,
            "ClusterRole": 1,
            "ClusterRoleBinding": 1,
            "ConfigMap": 1,
            "StatefulSet": 1,
            "PodDisruptionBudget": 6,  # five services and NATS (metrics-exporter: one replica)
            "Namespace": 2,  # the services' (restricted) and Skyhook's stages' (privileged)
        }
    )
    namespaces = {
        obj["metadata"]["name"]: obj["metadata"]["labels"]["pod-security.kubernetes.io/enforce"]
        for obj in of_kind(built, "Namespace")
    }
    # maintenance-scheduler puts Skyhook's stage Jobs in the privileged one by default.
    skyhook_namespace = MaintenanceSchedulerConfig(nats_url=("nats://x:4222",)).skyhook_namespace
    assert namespaces == {NAMESPACE: "restricted", skyhook_namespace: "privileged"}
    cluster_scoped = {"CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding", "Namespace"}
    for obj in built:
        assert obj["metadata"]["labels"]["app.kubernetes.io/part-of"] == "nodeflow"
        namespace = obj["metadata"].get("namespace")
        if obj["kind"] in cluster_scoped:
            assert namespace is None, obj["kind"]
        elif obj["metadata"]["name"] == SKYHOOK_ROLE:
            assert namespace == skyhook_namespace, obj["kind"]
        else:
            assert namespace == NAMESPACE, obj["kind"]
    monitors = kustomize_build(K8S / "monitoring")
    assert {m["metadata"]["namespace"] for m in monitors} == {NAMESPACE}


def test_the_base_ships_no_secret_and_only_our_own_crds() -> None:
    built = kustomize_build(BASE)
    assert of_kind(built, "Secret") == []
    syncer = container_of(by_name(built, "Deployment")["slurm-syncer"])
    assert not any(name.startswith("SLURM_") for name in env_of(syncer)), "no simulator wiring"
    crd_names = {obj["metadata"]["name"] for obj in of_kind(built, "CustomResourceDefinition")}
    assert crd_names == {"nodesets.nodeflow.dev", "nodeslices.nodeflow.dev"}


def test_third_party_crds_install_apart_from_the_app_and_are_never_pruned() -> None:
    built = kustomize_build(THIRD_PARTY_CRDS)
    assert {obj["metadata"]["name"] for obj in built} == THIRD_PARTY_CRD_NAMES
    for crd in built:
        annotations = crd["metadata"]["annotations"]
        assert annotations["helm.sh/resource-policy"] == "keep"
        assert "Prune=false" in annotations["argocd.argoproj.io/sync-options"]
        assert annotations["kustomize.toolkit.fluxcd.io/prune"] == "disabled"
    for overlay in (DEV, PRODUCTION):
        app_crds = of_kind(kustomize_build(overlay), "CustomResourceDefinition")
        assert THIRD_PARTY_CRD_NAMES.isdisjoint(c["metadata"]["name"] for c in app_crds)


# --- docker-compose and Dockerfile ----------------------------------------------------------


def compose() -> Obj:
    loaded: Obj = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    return loaded


def command_module(command: list[str] | str) -> str:
    text = command if isinstance(command, str) else " ".join(command)
    match = re.search(r"python -m ([A-Za-z_][A-Za-z0-9_.]*)", text)
    assert match, f"no `python -m` in {command!r}"
    return match.group(1)


def test_compose_runs_nats_the_simulator_and_the_six_services() -> None:
    services = compose()["services"]
    assert set(services) == {"nats", "clustersim", *SERVICES}
    assert services["nats"]["command"] == ["--config", "/etc/nats/nodeflow.conf"]
    assert "jetstream {" in compose()["configs"]["nats-config"]["content"]
    assert any(v.endswith(":/data") for v in services["nats"]["volumes"])
    sim_command = " ".join(services["clustersim"]["command"])
    assert "python -m clustersim --nodes 16 --run-dir /run/nodeflow" in sim_command
    # The image ships the CRDs there (the simulator's default CRD dir is the source tree's).
    assert "--crd-dir /usr/share/nodeflow/crds" in sim_command
    sim_check = " ".join(services["clustersim"]["healthcheck"]["test"])
    assert "--kube-port 6443" in sim_command and "127.0.0.1:6443/_sim/readyz" in sim_check
    for name, service in services.items():
        if name == "nats":
            continue
        module = command_module(service["command"])
        assert module == ("clustersim" if name == "clustersim" else module_of(name))
        assert importlib.util.find_spec(f"{module}.__main__") is not None, f"python -m {module}"
        assert service["build"]["dockerfile"] == "Dockerfile"
        assert service["read_only"] is True and service["cap_drop"] == ["ALL"]
        for dependency in service.get("depends_on", {}):
            assert dependency in services


def test_compose_ports_do_not_clash_and_healthchecks_hit_readyz() -> None:
    services = compose()["services"]
    published = [p for s in services.values() for p in s.get("ports", [])]
    host_ports = [p.split("#")[0].strip().rsplit(":", 2)[-2] for p in published]
    assert len(host_ports) == len(set(host_ports)), host_ports
    assert all(p.startswith("127.0.0.1:") for p in published), "publish on loopback only"
    shared = [name for name, s in services.items() if s.get("network_mode") == "service:clustersim"]
    assert set(shared) == set(SERVICES)
    http_ports = [services[name]["environment"]["HTTP_PORT"] for name in SERVICES]
    assert len(set(http_ports)) == len(SERVICES), "services in one network namespace"
    for name in SERVICES:
        port = services[name]["environment"]["HTTP_PORT"]
        assert f"127.0.0.1:{port}:{port}" in " ".join(services["clustersim"]["ports"])
        check = " ".join(services[name]["healthcheck"]["test"])
        assert f"http://127.0.0.1:{port}/readyz" in check
        assert services[name]["depends_on"]["nats"] == {"condition": "service_healthy"}


def test_compose_gives_run_dir_credentials_only_to_watcher_and_syncer() -> None:
    services = compose()["services"]
    assert set(compose()["volumes"]) == {"nats-data", "run-dir"}
    for name in SERVICES:
        volumes = services[name].get("volumes", [])
        if name in ("k8s-watcher", "slurm-syncer"):
            assert volumes == ["run-dir:/run/nodeflow:ro"]
            assert ". /run/nodeflow/env" in " ".join(services[name]["command"])
        else:
            assert volumes == []


def test_dockerfile_installs_from_the_lock_file_and_runs_as_non_root() -> None:
    text = (ROOT / "Dockerfile").read_text()
    instructions = [line for line in text.splitlines() if line and not line.startswith("#")]
    froms = [line.split()[1] for line in instructions if line.startswith("FROM ")]
    (base,) = [
        line.split("=", 1)[1] for line in instructions if line.startswith("ARG PYTHON_BASE=")
    ]
    # An exact Python patch release on an exact Debian release, pinned by digest: never a
    # floating tag, and every stage starts from that one base.
    assert re.fullmatch(r"python:3\.11\.\d+-slim-bookworm@sha256:[0-9a-f]{64}", base)
    assert froms and all(i == "${PYTHON_BASE}" for i in froms)
    assert "uv sync --frozen --no-dev" in text
    assert "COPY pyproject.toml uv.lock" in text
    users = [line.split()[1] for line in instructions if line.startswith("USER ")]
    assert len(users) == 2, "the simulator and the runtime stage each set a user"
    for user in users:
        uid = user.split(":")[0]
        assert uid.isdigit() and int(uid) > 0
    assert text.rstrip().splitlines()[-1].startswith("CMD") or instructions[-1].startswith("CMD")
    for line in instructions:
        if line.startswith(("ENV", "ARG")):
            assert not re.search(r"(PASSWORD|TOKEN|SECRET|_KEY)\b", line, re.IGNORECASE), line
    ignore = (ROOT / ".dockerignore").read_text().splitlines()
    assert ignore[ignore.index("*")] == "*", ".dockerignore must exclude everything by default"
    allowed = {line[1:].rstrip("/") for line in ignore if line.startswith("!")}
    assert allowed == {
        "pyproject.toml", "uv.lock", "README.md", "LICENSE", "libs", "services", "clustersim",
        "k8s/crds",
    }  # fmt: skip
    assert "COPY k8s/crds /usr/share/nodeflow/crds" in text


def dockerfile_stages() -> dict[str, list[str]]:
    """Each stage's instructions (continuation lines joined), by its `AS` name."""
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    stages: dict[str, list[str]] = {}
    current: list[str] = []
    for line in text.splitlines():
        if line.startswith("FROM "):
            current = stages.setdefault(line.split()[-1], [])
        if line and not line.startswith("#"):
            current.append(line)
    return stages


def test_the_runtime_image_carries_no_simulator() -> None:
    stages = dockerfile_stages()
    assert list(stages)[-1] == "runtime", "the default (last) stage must be the runtime image"
    runtime = stages["runtime"]
    assert not any("clustersim" in line or "k8s/crds" in line for line in runtime)
    (copy_env,) = [line for line in runtime if line.startswith("COPY --from=build")]
    source = copy_env.split()[2]
    pruned = [line for line in stages["build"] if source in line and "rm -rf" in line]
    assert pruned and "site-packages/clustersim" in pruned[0]
    assert compose()["services"]["clustersim"]["build"]["target"] == "simulator"
    makefile = (ROOT / "Makefile").read_text()
    assert "build --target runtime" in makefile and 'push "$(IMAGE)"' in makefile


# --- production overlay: network policies, monitoring --------------------------------------


METRIC_NAME = re.compile(r"\b(?:nodeflow|kube_sunk)_[a-z_]+\b")
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")


def exported_metric_names() -> set[str]:
    """Every series name a service or lib defines: the quoted names in their sources."""
    names: set[str] = set()
    for source in [*(ROOT / "services").rglob("*.py"), *(ROOT / "libs").rglob("*.py")]:
        names.update(re.findall(r"[\"']((?:nodeflow|kube_sunk)_[a-z_]+)[\"']", source.read_text()))
    return names


def is_exported(name: str, exported: set[str]) -> bool:
    """prometheus_client appends `_total` to a Counter's name and the histogram suffixes to a
    Histogram's, so the series may carry a suffix its definition does not."""
    suffixes = (*HISTOGRAM_SUFFIXES, "_total")
    base = next((name.removesuffix(s) for s in suffixes if name.endswith(s)), name)
    return name in exported or base in exported


def test_every_metric_the_alert_rules_use_is_exported() -> None:
    exported = exported_metric_names()
    (rules,) = of_kind(kustomize_build(PRODUCTION), "PrometheusRule")
    used = {
        name
        for group in rules["spec"]["groups"]
        for rule in group["rules"]
        for name in METRIC_NAME.findall(rule["expr"])
    }
    assert used, "the alert rules use no Nodeflow series"
    assert sorted(n for n in used if not is_exported(n, exported)) == []


def test_every_metric_the_dashboards_use_is_exported() -> None:
    exported = exported_metric_names()
    used: set[str] = set()
    for dashboard in (K8S / "grafana").glob("*.json"):
        used.update(METRIC_NAME.findall(dashboard.read_text()))
    assert used, "the dashboards use no Nodeflow series"
    assert sorted(n for n in used if not is_exported(n, exported)) == []


def test_every_alert_rule_has_a_runbook_and_a_severity() -> None:
    (rules,) = of_kind(kustomize_build(PRODUCTION), "PrometheusRule")
    alerts = {rule["alert"]: rule for group in rules["spec"]["groups"] for rule in group["rules"]}
    assert {
        "NodeflowSlurmPollStale",
        "NodeflowSlurmNodesUnreadable",
        "NodeflowPublishFailures",
        "NodeflowDeadLettersGrowing",
        "NodeflowNodeSetUnavailable",
        "NodeflowMaintenanceStuck",
        "NodeflowRolloutStopped",
        "NodeflowServiceDown",
        "NodeflowNoLeader",
        "NodeflowNatsDisconnected",
        "NodeflowJetStreamUnhealthy",
        "NodeflowJetStreamReplicasBehind",
    } <= set(alerts)
    for rule in alerts.values():
        assert rule["annotations"]["runbook"].strip() and rule["labels"]["severity"]


def test_service_monitors_honor_labels_and_carry_the_selected_label() -> None:
    built = kustomize_build(PRODUCTION)
    monitors = of_kind(built, "ServiceMonitor")
    assert {m["metadata"]["name"] for m in monitors} == set(SERVICES)
    for monitoring_object in [*monitors, *of_kind(built, "PrometheusRule")]:
        assert monitoring_object["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    for monitor in monitors:
        (endpoint,) = monitor["spec"]["endpoints"]
        assert endpoint["honorLabels"] is True


def allowed_ports(policies: list[Obj], direction: str, pod_labels: dict[str, str]) -> set[int]:
    ports: set[int] = set()
    for policy in policies:
        selector = policy["spec"]["podSelector"].get("matchLabels", {})
        if not selector.items() <= pod_labels.items():
            continue
        for rule in policy["spec"].get(direction, []):
            ports.update(p["port"] for p in rule.get("ports", []))
    return ports


def test_network_policies_deny_by_default_and_allow_only_the_needed_flows() -> None:
    built = kustomize_build(PRODUCTION)
    policies = of_kind(built, "NetworkPolicy")
    deny = by_name(policies, "NetworkPolicy")["default-deny"]
    assert deny["spec"] == {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}
    nats = {"app.kubernetes.io/name": "nats"}
    assert allowed_ports(policies, "ingress", nats) == {4222, 6222}
    assert allowed_ports(policies, "egress", nats) == {53, 6222}
    for name in SERVICES:
        pod = {"app.kubernetes.io/name": name, "app.kubernetes.io/component": "service"}
        extra = {"k8s-watcher": {443, 6443}, "slurm-syncer": {6820}}.get(name, set())
        assert allowed_ports(policies, "egress", pod) == {53, 4222} | extra, name
        assert allowed_ports(policies, "ingress", pod) == {8080}, name
    deployments = by_name(built, "Deployment")
    for deployment in deployments.values():
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert labels["app.kubernetes.io/component"] == "service"


def test_production_spreads_each_service_over_nodes() -> None:
    for deployment in of_kind(kustomize_build(PRODUCTION), "Deployment"):
        (spread,) = deployment["spec"]["template"]["spec"]["topologySpreadConstraints"]
        assert spread["topologyKey"] == "kubernetes.io/hostname"
        assert spread["matchLabelKeys"] == ["app.kubernetes.io/name"]
        pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert spread["labelSelector"]["matchLabels"].items() <= pod_labels.items()


# --- production: TLS and per-namespace RBAC -------------------------------------------------


def secret_mount_of(deployment: Obj, path: str) -> tuple[Obj, str]:
    """The secret volume mounted over `path` in the pod, and `path` relative to the mount."""
    spec = deployment["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    for mount in container.get("volumeMounts", []):
        prefix = mount["mountPath"].rstrip("/") + "/"
        if path.startswith(prefix):
            volumes = {volume["name"]: volume for volume in spec["volumes"]}
            return volumes[mount["name"]]["secret"], path[len(prefix) :]
    raise AssertionError(f"nothing is mounted over {path}")


def test_production_services_dial_nats_over_tls_with_the_ca_of_nats_tls() -> None:
    for name, deployment in by_name(kustomize_build(PRODUCTION), "Deployment").items():
        env = env_of(container_of(deployment))
        urls = env["NATS_URL"].split(",")
        assert urls == nats_pod_urls(4222, scheme="tls"), name
        secret, key = secret_mount_of(deployment, env["NATS_TLS_CA_FILE"])
        assert secret["secretName"] == "nats-tls" and key == "ca.crt", name
        # The CA only: the server's private key is never mounted into a service.
        assert secret["items"] == [{"key": "ca.crt", "path": "ca.crt"}], name
        plain = {k: v for k, v in env.items() if isinstance(v, str) and k.startswith("NATS_")}
        tls = load_config(ServiceConfig, plain).nats_tls()
        assert tls.required_for(urls) and tls.ca_file is not None, name


def test_production_nats_serves_tls_from_the_nats_tls_secret(tmp_path: Path) -> None:
    built = kustomize_build(PRODUCTION)
    (statefulset,) = of_kind(built, "StatefulSet")
    spec = statefulset["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    assert container["command"] == ["nats-server", "--config", "/etc/nats/nats-production.conf"]
    volumes = {volume["name"]: volume for volume in spec["volumes"]}
    mounts = {mount["mountPath"]: mount["name"] for mount in container["volumeMounts"]}
    sources = volumes[mounts["/etc/nats"]]["projected"]["sources"]
    assert [s["configMap"]["name"] for s in sources] == ["nats-config", "nats-tls-config"]
    assert volumes[mounts["/etc/nats-tls"]]["secret"]["secretName"] == "nats-tls"
    configs = by_name(built, "ConfigMap")
    production = configs["nats-tls-config"]["data"]["nats-production.conf"]
    assert production.startswith("include nats.conf\n")
    for key in ("ca.crt", "tls.crt", "tls.key"):
        assert f"/etc/nats-tls/{key}\n" in production
    # nats-server itself loads the pair, with the mounted files stood in for by test ones.
    pki = make_pki(tmp_path / "pki")
    mounted = tmp_path / "nats-tls"
    mounted.mkdir()
    for key, source in (
        ("ca.crt", pki.ca_cert),
        ("tls.crt", pki.server_cert),
        ("tls.key", pki.server_key),
    ):
        (mounted / key).write_bytes(source.read_bytes())
    (tmp_path / "nats.conf").write_text(configs["nats-config"]["data"]["nats.conf"])
    config = tmp_path / "nats-production.conf"
    config.write_text(production.replace("/etc/nats-tls/", f"{mounted}/"))
    passwords = {s: f"pw-{s}" for s in (*SERVICES, ADMIN_USER)}
    result = subprocess.run(
        [str(nats_server_binary()), "-c", str(config), "-t"],
        env=nats_env(passwords),
        capture_output=True,
        text=True,
        timeout=20,
        check=False,
    )
    assert result.returncode == 0, result.stderr


def cluster_block(text: str) -> str:
    """The body of a nats-server config's top-level `cluster { ... }` block."""
    found = re.search(r"\ncluster \{\n(.*?)\n\}(\n|$)", text, flags=re.DOTALL)
    assert found, "no cluster block"
    return found.group(1)


def setting_lines(text: str) -> list[str]:
    """A config's lines without comments, indentation and blank lines."""
    lines = (line.split("#", 1)[0].strip() for line in text.splitlines())
    return [line for line in lines if line]


def production_nats_conf() -> str:
    configs = by_name(kustomize_build(PRODUCTION), "ConfigMap")
    text: str = configs["nats-tls-config"]["data"]["nats-production.conf"]
    return text


ROUTE_TLS = re.compile(r"\n\s*tls \{\n(.*?)\n\s*\}", flags=re.DOTALL)


def test_production_nats_routes_repeat_the_base_cluster_settings_with_tls() -> None:
    # A second `cluster` block replaces the included one whole: it must keep every setting.
    block = cluster_block(production_nats_conf())
    tls = ROUTE_TLS.search(block)
    assert tls, "the production cluster block has no tls block"
    assert setting_lines(tls.group(1)) == [
        "cert_file: /etc/nats-tls/tls.crt",
        "key_file: /etc/nats-tls/tls.key",
        "ca_file: /etc/nats-tls/ca.crt",
        "timeout: 5",
    ]
    without_tls = ROUTE_TLS.sub("", block)
    assert setting_lines(without_tls) == setting_lines(cluster_block(nats_config_text()))


def loopback_cluster(
    block: str, route_port: int, peer_port: int, cert: Path, key: Path, ca: Path
) -> str:
    """The production cluster block with its ports and routes on loopback and the test's files."""
    block = block.replace("port: 6222", f"listen: 127.0.0.1:{route_port}")
    block = re.sub(
        r"routes: \[.*?\]", f"routes: [ nats://127.0.0.1:{peer_port} ]", block, flags=re.S
    )
    for mounted, local in (("tls.crt", cert), ("tls.key", key), ("ca.crt", ca)):
        block = block.replace(f"/etc/nats-tls/{mounted}", str(local))
    return block


async def routez(http_port: int) -> dict[str, Any]:
    reader, writer = await asyncio.open_connection("127.0.0.1", http_port)
    writer.write(b"GET /routez HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
    response = await reader.read()
    writer.close()
    body = response.split(b"\r\n\r\n", 1)[1]
    parsed: dict[str, Any] = yaml.safe_load(body)
    return parsed


async def test_production_nats_routes_are_mutual_tls_between_real_servers(tmp_path: Path) -> None:
    pki = make_pki(tmp_path / "pki")
    block = cluster_block(production_nats_conf())
    names = ("nats-0", "nats-1", "stranger")
    client, http, route = ({n: free_port() for n in names} for _ in range(3))
    # nats-0 and nats-1 route to each other; the stranger (a certificate of another CA) dials
    # nats-0 too.
    peers = {"nats-0": "nats-1", "nats-1": "nats-0", "stranger": "nats-0"}
    processes: dict[str, asyncio.subprocess.Process] = {}
    logs = {name: tmp_path / f"{name}.log" for name in names}
    try:
        for name in names:
            cert, key = (
                (pki.stranger_cert, pki.stranger_key)
                if name == "stranger"
                else (pki.peer_cert, pki.peer_key)
            )
            cluster = loopback_cluster(
                block, route[name], route[peers[name]], cert, key, pki.ca_cert
            )
            config = tmp_path / f"{name}.conf"
            config.write_text(
                f"server_name: {name}\nlisten: 127.0.0.1:{client[name]}\n"
                f"http: 127.0.0.1:{http[name]}\ncluster {{\n{cluster}\n}}\n"
            )
            processes[name] = await asyncio.create_subprocess_exec(
                str(nats_server_binary()), "-c", str(config), "-l", str(logs[name])
            )

        async def routed() -> bool:
            with contextlib.suppress(OSError, IndexError):
                zero, one = await routez(http["nats-0"]), await routez(http["nats-1"])
                return bool(zero.get("num_routes")) and bool(one.get("num_routes"))
            return False

        async def stranger_refused() -> bool:
            text = logs["nats-0"].read_text() if logs["nats-0"].exists() else ""
            return "TLS route handshake error" in text

        for _ in range(300):
            if await routed() and await stranger_refused():
                break
            await asyncio.sleep(0.2)
        else:
            raise AssertionError("nats-0 and nats-1 did not route, or the stranger was not refused")
        for name in ("nats-0", "nats-1"):
            listed = await routez(http[name])
            assert {r["remote_name"] for r in listed["routes"]} == {
                "nats-1" if name == "nats-0" else "nats-0"
            }
    finally:
        for process in processes.values():
            if process.returncode is None:
                process.kill()
            await process.wait()


def rule_grants(rules: list[Obj]) -> set[tuple[str, str, str]]:
    return {
        (group, resource, verb)
        for rule in rules
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


WRITE_VERBS = {"create", "delete", "patch", "update"}


def test_production_k8s_watcher_writes_only_in_its_command_namespaces() -> None:
    built = kustomize_build(PRODUCTION)
    watcher = env_of(container_of(by_name(built, "Deployment")["k8s-watcher"]))
    command_namespaces = set(watcher["COMMAND_NAMESPACES"].split(","))
    assert NAMESPACE in command_namespaces and len(command_namespaces) >= 2
    # The ConfigMaps' Role in the Skyhook namespace is the base's, whatever the namespaces.
    (skyhook_role,) = [r for r in of_kind(built, "Role") if r["metadata"]["name"] == SKYHOOK_ROLE]
    assert granted_permissions(skyhook_role) == SKYHOOK_NAMESPACE_PERMISSIONS
    roles = [r for r in of_kind(built, "Role") if r["metadata"]["name"] != SKYHOOK_ROLE]
    bindings = [b for b in of_kind(built, "RoleBinding") if b["metadata"]["name"] != SKYHOOK_ROLE]
    assert {r["metadata"]["namespace"] for r in roles} == command_namespaces
    assert {b["metadata"]["namespace"] for b in bindings} == command_namespaces
    (first, *others) = [rule_grants(role["rules"]) for role in roles]
    assert all(grants == first for grants in others), "every namespace gets the same writes"
    for binding in bindings:
        assert binding["roleRef"]["kind"] == "Role"
        role_names = {
            r["metadata"]["name"]
            for r in roles
            if r["metadata"]["namespace"] == binding["metadata"]["namespace"]
        }
        assert binding["roleRef"]["name"] in role_names
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": "k8s-watcher", "namespace": NAMESPACE}
        ]
    (cluster_role,) = of_kind(built, "ClusterRole")
    cluster_grants = rule_grants(cluster_role["rules"])
    # Cluster-wide writes: Nodes, Events, the leaders' Leases (their names pinned by k8s-watcher's
    # policy), the cluster-scoped custom resources only.
    scoped = {
        (crd["spec"]["group"], crd["spec"]["names"]["plural"])
        for crd in crds().values()
        if crd["spec"]["scope"] == "Cluster"
    }
    cluster_wide = {("", "nodes"), ("", "events"), ("coordination.k8s.io", "leases")} | scoped
    for group, resource, verb in cluster_grants:
        if verb in WRITE_VERBS or "/" in resource:
            assert (group, resource.split("/")[0]) in cluster_wide, (group, resource, verb)
    assert not any(resource.startswith("pods/") for _, resource, _ in cluster_grants)
    # Nothing the code uses is lost: the ClusterRole and a Role together grant what the base's
    # ClusterRole (which test_rbac holds equal to the code's needs) grants.
    (base_role,) = of_kind(kustomize_build(BASE), "ClusterRole")
    assert cluster_grants | first == rule_grants(base_role["rules"])
    assert not cluster_grants & first


def test_production_slurm_syncer_uses_https_with_a_ca_from_a_secret() -> None:
    syncer = by_name(kustomize_build(PRODUCTION), "Deployment")["slurm-syncer"]
    env = {k: v for k, v in env_of(container_of(syncer)).items() if isinstance(v, str)}
    config = load_config(SlurmSyncerConfig, env)
    assert config.slurm_clusters
    for name, settings in cluster_settings(config.slurm_clusters, env).items():
        assert settings.url.startswith("https://"), name
        assert settings.ca_file is not None and settings.jwt_key_file is not None, name
        for path in (settings.ca_file, settings.jwt_key_file):
            secret, _ = secret_mount_of(syncer, str(path))
            assert secret["secretName"].startswith("nodeflow-slurm-"), name
