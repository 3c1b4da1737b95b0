"""The batch/v1 Job of one stage and the NodeMaintenance of one interrupt (pure builders).

Names are deterministic -- one Job per (skyhook, package, version, stage, node, run, config),
one request per (skyhook, node) -- so a restarted controller re-creating them is refused as
already existing, never a second Job for a stage. They are memoised: every round asks for the
same.

A Job proves only what it ran: its IDENTITY_ANNOTATION records the Skyhook's uid, the node's
uid, the package version, the run and the config hash it ran with, so a Complete Job left by
an earlier run (a re-added package, a reset node, a version rolled back, an edited configMap,
a re-created Skyhook or node) within its 24 h TTL does not count for the current one.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from collections.abc import Mapping
from typing import Any, Final

from maintenance_scheduler.api import GC_IGNORE_ANNOTATION
from maintenance_scheduler.skyhook.api import (
    DrainConfig,
    Interrupt,
    LabelSelector,
    Package,
    Skyhook,
)
from maintenance_scheduler.skyhook.pod import (
    PodOptions,
    interrupt_pod_spec,
    package_annotation,
    stage_pod_spec,
)
from maintenance_scheduler.skyhook.stages import INTERRUPT_STAGES
from nodeflow_contracts.skyhook import FLAVORS, SKYHOOK, SkyhookNames
from nodeflow_kube.labels import LabelSelector as KubeLabelSelector

MANAGED_BY: Final = "nodeflow-maintenance-scheduler"
# A Skyhook's (a NodeWright's are `names.package_annotation`, `names.identity_annotation`).
PACKAGE_ANNOTATION: Final = SKYHOOK.package_annotation
IDENTITY_ANNOTATION: Final = SKYHOOK.identity_annotation
# A drain for an interrupt evicts everything but the package pods of either kind: a Skyhook's
# interrupt never evicts a NodeWright's package pod on the same node, nor the other way round.
DRAIN_POD_SELECTOR: Final = ",".join(f"!{names.name_label}" for names in FLAVORS)
SUCCEEDED_TTL_SECONDS: Final = 86400
# Interrupt Jobs restart their pod OnFailure, as upstream's interrupt pods and Jobs do: the
# reboot kills the interrupt pod (exit 143, upstream issue #633), the kubelet restarts it after
# the boot and the Job completes then. The Job controller counts container restarts of an
# OnFailure pod against backoffLimit, hence upstream's JOB_BACKOFF_LIMIT default of 3.
INTERRUPT_BACKOFF_LIMIT: Final = 3
# Package pods survive the node being NotReady or unreachable for as long as it takes: the
# interrupt (a reboot) makes it so on purpose (upstream's Jobs add these, no
# tolerationSeconds, to the package pod's own tolerations).
UNBOUNDED_TOLERATIONS: Final[tuple[Mapping[str, Any], ...]] = (
    {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"},
    {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute"},
)
DEFAULT_POD_OPTIONS: Final = PodOptions()
_NOT_DNS = re.compile(r"[^a-z0-9-]+")


def _digest(*parts: object) -> str:
    return hashlib.sha256("\x1f".join(str(p) for p in parts).encode()).hexdigest()


def _slug(text: str, length: int) -> str:
    return _NOT_DNS.sub("-", text.lower())[:length].strip("-") or "x"


@functools.lru_cache(maxsize=1 << 16)
def job_name(
    skyhook: str, package: str, version: str, stage: str, node: str, identity: str = ""
) -> str:
    """<= 63 characters (the job-name label), readable, unique by a digest of every part.
    `identity` (the entry's run and config) is left out when empty, so an entry written before
    it existed still finds its Jobs."""
    parts_digested: tuple[str, ...] = (skyhook, package, version, stage, node)
    if identity:
        parts_digested += (identity,)
    digest = _digest(*parts_digested)[:8]
    parts = (_slug(skyhook, 12), _slug(package, 12), _slug(stage, 14), _slug(node, 12), digest)
    return "-".join(parts)


@functools.lru_cache(maxsize=1 << 16)
def resource_id(skyhook: str, package: str, version: str, node: str) -> str:
    """Ties every stage Job of one rollout of one package on one node together."""
    return _digest(skyhook, package, version, node)[:20]


@functools.lru_cache(maxsize=1 << 16)
def maintenance_name(skyhook: str, node: str, names: SkyhookNames = SKYHOOK) -> str:
    """The NodeMaintenance of an object on a node. A Skyhook's keeps its name form (so its
    existing requests are found); a NodeWright's has its own, so a Skyhook and a NodeWright
    of one name never share a request."""
    if names == SKYHOOK:
        digest = _digest(skyhook, node)[:8]
        return f"skyhook-{_slug(skyhook, 20)}-{_slug(node, 24)}-{digest}"
    digest = _digest(names.group, skyhook, node)[:8]
    return f"{names.singular}-{_slug(skyhook, 20)}-{_slug(node, 24)}-{digest}"


def entry_identity(run: str, config: str) -> str:
    """The part of a Job's name that says which run and config it is for."""
    return f"{run}:{config}" if run or config else ""


def job_identity(
    skyhook_uid: str, node_uid: str, version: str, run: str, config: str
) -> dict[str, str]:
    """What a Complete Job must have run to count for a stage (IDENTITY_ANNOTATION)."""
    return {
        "skyhook": skyhook_uid,
        "node": node_uid,
        "version": version,
        "run": run,
        "config": config,
    }


def requestor_id(skyhook: str, names: SkyhookNames = SKYHOOK) -> str:
    return names.requestor_id(skyhook)


def job_labels(
    skyhook: str,
    package: Package | str,
    stage: str,
    node: str,
    version: str,
    names: SkyhookNames = SKYHOOK,
) -> dict[str, str]:
    name = package.name if isinstance(package, Package) else package
    return {
        names.name_label: skyhook,
        names.package_label: name,
        names.node_label: node,
        names.stage_label: stage,
        names.resource_id_label: resource_id(skyhook, name, version, node),
        "app.kubernetes.io/managed-by": MANAGED_BY,
    }


def build_job(
    skyhook: Skyhook,
    package: Package,
    stage: str,
    node: str,
    *,
    namespace: str,
    default_stage_timeout_seconds: int,
    run: str = "",
    config: str = "",
    node_uid: str = "",
    options: PodOptions = DEFAULT_POD_OPTIONS,
    node_order: int = 0,
) -> dict[str, Any]:
    """parallelism 1, completions 1, backoffLimit 0 (the controller decides retries),
    podReplacementPolicy Failed (no two pods racing for the node's host paths), the pod
    pinned to its node; an eviction (DisruptionTarget) is not a package failure. An
    interrupt Job restarts its pod OnFailure (INTERRUPT_BACKOFF_LIMIT) instead: the reboot
    it causes kills its own pod. The pod is upstream's package pod (pod.stage_pod_spec,
    pod.interrupt_pod_spec)."""
    name = job_name(
        skyhook.name, package.name, package.version, stage, node, entry_identity(run, config)
    )
    names = skyhook.names
    labels = job_labels(skyhook.name, package, stage, node, package.version, names)
    if stage in INTERRUPT_STAGES:
        interrupt = package.interrupt or Interrupt("noop")
        pod_spec = interrupt_pod_spec(options, skyhook, package, interrupt, node, node_order)
    else:
        pod_spec = stage_pod_spec(options, skyhook, package, stage, node, node_order)
    package_json = package_annotation(skyhook, package, stage)
    timeout = (
        default_stage_timeout_seconds
        if package.stage_timeout_seconds is None
        else package.stage_timeout_seconds
    )
    interrupting = stage in INTERRUPT_STAGES
    spec: dict[str, Any] = {
        "parallelism": 1,
        "completions": 1,
        "backoffLimit": INTERRUPT_BACKOFF_LIMIT if interrupting else 0,
        "ttlSecondsAfterFinished": SUCCEEDED_TTL_SECONDS,
        "podReplacementPolicy": "Failed",
        "template": {
            "metadata": {
                "labels": dict(labels),
                "annotations": {names.package_annotation: package_json},
            },
            "spec": {
                **pod_spec,
                # podFailurePolicy needs restartPolicy Never: an interrupt Job has neither.
                "restartPolicy": "OnFailure" if interrupting else "Never",
                "tolerations": [
                    *pod_spec["tolerations"],
                    *(dict(t) for t in UNBOUNDED_TOLERATIONS),
                ],
            },
        },
    }
    if not interrupting:
        spec["podFailurePolicy"] = {
            "rules": [{"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]}]
        }
    if timeout:
        spec["activeDeadlineSeconds"] = timeout
    identity = job_identity(skyhook.uid, node_uid, package.version, run, config)
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": labels,
            "annotations": {
                names.package_annotation: package_json,
                names.identity_annotation: json.dumps(identity, sort_keys=True),
            },
            "ownerReferences": [
                {
                    "apiVersion": names.api_version,
                    "kind": names.kind,
                    "name": skyhook.name,
                    "uid": skyhook.uid,
                    "blockOwnerDeletion": False,
                }
            ],
        },
        "spec": spec,
    }


def match_object(selector: LabelSelector) -> dict[str, Any]:
    """The metav1.LabelSelector object a parsed Skyhook selector came from (nodeflow_kube's
    `LabelSelector.from_match` reads it, and writes the string form a podSelector takes)."""
    return {
        "matchLabels": dict(selector.match_labels),
        "matchExpressions": [
            {"key": e.key, "operator": e.operator, "values": sorted(e.values)}
            for e in selector.expressions
        ],
    }


def drain_spec(config: DrainConfig | None, drain_timeout_seconds: int) -> dict[str, Any]:
    """The drainSpec of an interrupt's NodeMaintenance, from spec.drainConfig where its meaning
    is the drainSpec's (S56): deleteEmptyDirData -> deleteEmptyDir, force -> force (both true
    when unset, as upstream), timeout -> timeoutSeconds (0: none, as upstream; unset: the
    configured `drain_timeout_seconds`). DaemonSet pods are always left (ignoreDaemonSets'
    default); disableEviction and gracePeriod have no drainSpec field and are not acted on:
    the drain always evicts, through the PodDisruptionBudgets, with each pod's own grace."""
    config = config or DrainConfig()
    timeout = config.timeout_seconds
    return {
        "force": config.force,
        "deleteEmptyDir": config.delete_empty_dir_data,
        "podSelector": DRAIN_POD_SELECTOR,
        "timeoutSeconds": drain_timeout_seconds if timeout is None else timeout,
    }


def build_maintenance(
    skyhook: Skyhook, node: str, *, namespace: str, drain_timeout_seconds: int
) -> dict[str, Any]:
    """Cordon, wait for the podNonInterruptLabels pods, drain everything but Skyhook's own
    package pods -- through the maintenance budgets and the Slurm-first drain. The Skyhook
    controller deletes the request itself once no interrupt needs it, and keeps it while an
    interrupt failed (the node stays out of service): the garbage collector's age limit
    must not end it under a half-upgraded node, hence garbage-collector.ignore."""
    spec: dict[str, Any] = {
        "requestorID": requestor_id(skyhook.name, skyhook.names),
        "nodeName": node,
        "cordon": True,
        "drainSpec": drain_spec(skyhook.drain_config, drain_timeout_seconds),
    }
    if skyhook.pod_non_interrupt_labels is not None:
        spec["waitForPodCompletion"] = {
            "podSelector": KubeLabelSelector.from_match(
                match_object(skyhook.pod_non_interrupt_labels)
            ).to_string(),
            "timeoutSeconds": 0,
        }
    return {
        "apiVersion": "maintenance.nvidia.com/v1alpha1",
        "kind": "NodeMaintenance",
        "metadata": {
            "name": maintenance_name(skyhook.name, node, skyhook.names),
            "namespace": namespace,
            "labels": {
                skyhook.names.name_label: skyhook.name,
                skyhook.names.node_label: node,
                "app.kubernetes.io/managed-by": MANAGED_BY,
            },
            "annotations": {GC_IGNORE_ANNOTATION: "true"},
        },
        "spec": spec,
    }
