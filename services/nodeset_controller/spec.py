"""The NodeSet spec: validation (rule 9, InvalidSpec) and the resolved options.

A spec the controller cannot act on safely (a bad maxUnavailable, negative replicas, a
template the API server would reject) is reported with every offending field and touches
no pod. The CRD schema rejects many of these already; the controller checks again because
schemas change, objects predate them, and an emulator or an old API server may not enforce
every rule.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypeGuard

from nodeflow_contracts.nodeset import (
    RECURRING_RESERVATION_FLAGS,
    UpdateWindow,
    update_window,
)
from nodeflow_contracts.pod_protocol import DEFAULT_LOCK_TOLERATION_KEY
from nodeflow_contracts.slurm_api import NEWEST
from nodeflow_kube.fields import (
    mapping,
    meta,
    name_of,
    namespace_of,
    resource_version_of,
    sequence,
    uid_of,
)
from nodeflow_kube.quantity import QuantityError, parse_quantity

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_PERCENT = re.compile(r"^(?P<value>\d+)%$")
_LABEL_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_LABEL_PREFIX = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_TOLERATION_OPERATORS = ("Exists", "Equal")
_TAINT_EFFECTS = ("", "NoSchedule", "PreferNoSchedule", "NoExecute")
_SELECTOR_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt")
MAX_PREFIX_LENGTH = 55
# ControllerRevisions kept beyond the live ones (apps/v1's default; Slinky's is 0).
DEFAULT_REVISION_HISTORY_LIMIT = 10

UpdateStrategy = Literal["RollingUpdate", "OnDelete", "ScheduledUpdate"]
UPDATE_STRATEGIES: tuple[UpdateStrategy, ...] = ("RollingUpdate", "OnDelete", "ScheduledUpdate")


@dataclass(frozen=True)
class SpecProblem:
    """One reason the spec cannot be used: the field, a condition-safe reason, the detail."""

    field: str
    reason: str
    message: str

    def describe(self) -> str:
        return f"{self.field}: {self.message}"


@dataclass(frozen=True)
class Defaults:
    """Service-wide options; a NodeSet may override each one in its spec."""

    scale_down_priority_ordering: bool = True
    force_delete_known_timeout: float = 0.0
    force_delete_unknown_timeout: float = 0.0
    # Service-wide only: the taint key NodeSet pods tolerate.
    lock_toleration_key: str = DEFAULT_LOCK_TOLERATION_KEY


@dataclass(frozen=True)
class NodeSetSpec:
    namespace: str
    name: str
    uid: str
    generation: int
    resource_version: str
    replicas: int | None
    pod_name_prefix: str
    slurm_cluster: str
    template: Mapping[str, Any]
    update_strategy: UpdateStrategy
    max_unavailable: int | str
    scale_down_priority_ordering: bool
    force_delete_known_timeout: float
    force_delete_unknown_timeout: float
    lock_toleration_key: str = DEFAULT_LOCK_TOLERATION_KEY
    # Busy pods carry the protect label and a PodDisruptionBudget refuses their eviction
    # (`protection`); Slinky's field, default on.
    workload_disruption_protection: bool = True
    # A pod counts as available (for maxUnavailable and numberUnavailable) once it has been
    # Ready this long, as for a DaemonSet and Slinky; 0: as soon as it is Ready.
    min_ready_seconds: int = 0
    # updateStrategy ScheduledUpdate: the window pods are replaced in (None otherwise).
    update_window: UpdateWindow | None = None
    # How many ControllerRevisions of templates no pod runs are kept for a rollback
    # (`history`); Kubernetes' default for DaemonSets and StatefulSets.
    revision_history_limit: int = DEFAULT_REVISION_HISTORY_LIMIT

    @property
    def key(self) -> str:
        return f"{self.namespace}.{self.name}"

    @property
    def template_spec(self) -> Mapping[str, Any]:
        return mapping(self.template.get("spec"))


def _strategy(value: object) -> UpdateStrategy:
    for strategy in UPDATE_STRATEGIES:
        if value == strategy:
            return strategy
    return "RollingUpdate"


def _window(nodeset: Mapping[str, Any], strategy: Mapping[str, Any]) -> UpdateWindow | None:
    if strategy.get("type") != "ScheduledUpdate":
        return None
    window = update_window(namespace_of(nodeset), name_of(nodeset), strategy)
    return window if isinstance(window, UpdateWindow) else None


def _scheduled_update_problem(
    nodeset: Mapping[str, Any], strategy: Mapping[str, Any]
) -> SpecProblem | None:
    """The window must parse (nodeflow_contracts.nodeset.update_window) and its flags be
    reservation flags slurmrestd knows."""
    window = update_window(namespace_of(nodeset), name_of(nodeset), strategy)
    if isinstance(window, str):
        return SpecProblem("spec.updateStrategy.scheduledUpdate", "InvalidScheduledUpdate", window)
    unknown = [flag for flag in window.flags if flag not in NEWEST.reservation_flags]
    if unknown:
        return SpecProblem(
            "spec.updateStrategy.scheduledUpdate.flags",
            "InvalidScheduledUpdate",
            f"not Slurm reservation flags: {', '.join(unknown)}",
        )
    recurring = [flag for flag in window.flags if flag in RECURRING_RESERVATION_FLAGS]
    if recurring:
        return SpecProblem(
            "spec.updateStrategy.scheduledUpdate.flags",
            "InvalidScheduledUpdate",
            f"{', '.join(recurring)}: a window does not recur (one startTime + duration, its "
            "reservation deleted after it); drop the flag and set a new startTime per window",
        )
    return None


def is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def max_unavailable_problem(value: Any) -> SpecProblem | None:
    """maxUnavailable: a positive int or a percentage 1%..100% (as for a DaemonSet, 0 would
    never let a rollout start, so it is refused rather than silently wedging)."""
    field = "spec.updateStrategy.rollingUpdate.maxUnavailable"
    if is_int(value):
        if value < 0:
            return SpecProblem(field, "NegativeMaxUnavailable", f"{value} is negative")
        if value == 0:
            return SpecProblem(field, "ZeroMaxUnavailable", "0 would never replace a pod")
        return None
    if isinstance(value, str):
        match = _PERCENT.match(value.strip())
        if match is None:
            return SpecProblem(
                field, "MaxUnavailableNotIntOrPercent", f"{value!r} is neither an int nor a %"
            )
        percent = int(match.group("value"))
        if percent > 100:
            return SpecProblem(field, "MaxUnavailableOver100Percent", f"{value} is over 100%")
        if percent == 0:
            return SpecProblem(field, "ZeroMaxUnavailable", "0% would never replace a pod")
        return None
    return SpecProblem(field, "MaxUnavailableNotIntOrPercent", f"{value!r} is not an int or %")


def resolve_max_unavailable(value: int | str, base: int) -> int:
    """The budget as a number of pods: a percentage of `base` -- the pods the NodeSet can
    really run, min(desiredNumberScheduled, numberFeasible) -- rounded up (Kubernetes
    intstr.GetScaledValueFromIntOrPercent with roundUp=true)."""
    if isinstance(value, int):
        return value
    percent = int(value.strip().rstrip("%"))
    return math.ceil(percent * base / 100)


def _label_key_problem(key: str) -> str | None:
    prefix, _, name = key.rpartition("/")
    if prefix and (len(prefix) > 253 or not _LABEL_PREFIX.match(prefix)):
        return f"label key prefix {prefix!r} is not a DNS subdomain"
    if not name or len(name) > 63 or not _LABEL_NAME.match(name):
        return f"label key {key!r} is not a valid label name"
    return None


def _labels_problems(raw: Any, field: str, *, values_are_labels: bool) -> list[SpecProblem]:
    if raw is None:
        return []
    if not isinstance(raw, Mapping):
        return [SpecProblem(field, "InvalidTemplate", "must be a map of strings")]
    problems: list[SpecProblem] = []
    for key, value in raw.items():
        key_problem = _label_key_problem(str(key))
        if key_problem:
            problems.append(SpecProblem(f"{field}[{key}]", "InvalidTemplate", key_problem))
        if not isinstance(value, str):
            problems.append(SpecProblem(f"{field}[{key}]", "InvalidTemplate", "not a string"))
        elif values_are_labels and (len(value) > 63 or not _LABEL_VALUE.match(value)):
            problems.append(
                SpecProblem(f"{field}[{key}]", "InvalidTemplate", f"{value!r} is no label value")
            )
    return problems


def _resources_problems(raw: Any, field: str) -> list[SpecProblem]:
    problems: list[SpecProblem] = []
    resources = mapping(raw)
    for part in ("requests", "limits"):
        for name, value in mapping(resources.get(part)).items():
            try:
                amount = parse_quantity(value)
            except QuantityError as exc:
                problems.append(SpecProblem(f"{field}.{part}[{name}]", "InvalidTemplate", str(exc)))
                continue
            if amount < 0:
                problems.append(
                    SpecProblem(f"{field}.{part}[{name}]", "InvalidTemplate", "negative quantity")
                )
    return problems


def _container_problems(containers: Any, field: str, *, required: bool) -> list[SpecProblem]:
    if containers is None and not required:
        return []
    if not isinstance(containers, list) or (required and not containers):
        return [SpecProblem(field, "InvalidTemplate", "at least one container is required")]
    problems: list[SpecProblem] = []
    seen: set[str] = set()
    for index, raw in enumerate(containers):
        where = f"{field}[{index}]"
        container = mapping(raw)
        name = container.get("name")
        if not isinstance(name, str) or len(name) > 63 or not _DNS_LABEL.match(name):
            problems.append(
                SpecProblem(f"{where}.name", "InvalidTemplate", f"{name!r} is no DNS label")
            )
        elif name in seen:
            problems.append(SpecProblem(f"{where}.name", "InvalidTemplate", f"duplicate {name!r}"))
        else:
            seen.add(name)
        image = container.get("image")
        if not isinstance(image, str) or not image.strip():
            problems.append(SpecProblem(f"{where}.image", "InvalidTemplate", "image is required"))
        problems.extend(_resources_problems(container.get("resources"), f"{where}.resources"))
    return problems


def _affinity_problems(raw: Any, field: str) -> list[SpecProblem]:
    required = mapping(
        mapping(mapping(raw).get("nodeAffinity")).get(
            "requiredDuringSchedulingIgnoredDuringExecution"
        )
    )
    problems: list[SpecProblem] = []
    for t_index, term in enumerate(sequence(required.get("nodeSelectorTerms"))):
        for part in ("matchExpressions", "matchFields"):
            for e_index, expression in enumerate(sequence(mapping(term).get(part))):
                where = (
                    f"{field}.nodeAffinity.required.nodeSelectorTerms[{t_index}].{part}[{e_index}]"
                )
                operator = mapping(expression).get("operator")
                if operator not in _SELECTOR_OPERATORS:
                    problems.append(
                        SpecProblem(where, "InvalidTemplate", f"unknown operator {operator!r}")
                    )
    return problems


def template_problems(template: Any) -> list[SpecProblem]:
    """What the API server would refuse when the pod is created from this template."""
    if not isinstance(template, Mapping):
        return [SpecProblem("spec.template", "InvalidTemplate", "a pod template is required")]
    problems: list[SpecProblem] = []
    template_meta = mapping(template.get("metadata"))
    problems += _labels_problems(
        template_meta.get("labels"), "spec.template.metadata.labels", values_are_labels=True
    )
    problems += _labels_problems(
        template_meta.get("annotations"),
        "spec.template.metadata.annotations",
        values_are_labels=False,
    )
    pod_spec = template.get("spec")
    if not isinstance(pod_spec, Mapping):
        return [*problems, SpecProblem("spec.template.spec", "InvalidTemplate", "required")]
    problems += _container_problems(
        pod_spec.get("containers"), "spec.template.spec.containers", required=True
    )
    problems += _container_problems(
        pod_spec.get("initContainers"), "spec.template.spec.initContainers", required=False
    )
    for index, raw in enumerate(sequence(pod_spec.get("tolerations"))):
        toleration = mapping(raw)
        where = f"spec.template.spec.tolerations[{index}]"
        operator = toleration.get("operator", "Equal") or "Equal"
        if operator not in _TOLERATION_OPERATORS:
            problems.append(SpecProblem(where, "InvalidTemplate", f"unknown operator {operator!r}"))
        elif operator == "Exists" and toleration.get("value"):
            problems.append(SpecProblem(where, "InvalidTemplate", "Exists takes no value"))
        if (toleration.get("effect") or "") not in _TAINT_EFFECTS:
            problems.append(SpecProblem(where, "InvalidTemplate", "unknown effect"))
    problems += _labels_problems(
        pod_spec.get("nodeSelector"), "spec.template.spec.nodeSelector", values_are_labels=True
    )
    problems += _affinity_problems(pod_spec.get("affinity"), "spec.template.spec.affinity")
    return problems


# Reason of a template under which slurmd would register under a name other than the pod's.
SLURM_NODE_NAME_NOT_POD_NAME = "SlurmNodeNameNotPodName"


def slurm_node_name_problems(template: Any) -> list[SpecProblem]:
    """The controller and slurm-syncer find a pod's Slurm node by the pod's name: slurmd
    registers under the pod's hostname, which is the pod name unless the template says
    otherwise. With `hostNetwork: true` the pod has its Kubernetes node's hostname; with
    `hostname` set, that name (the same for every pod of the template). slurmd then
    registers under a name nobody reads: the pod looks unregistered and, past the absence
    grace, is deleted while its jobs run. Such a template is refused rather than the name
    guessed."""
    pod_spec = mapping(mapping(template).get("spec"))
    problems: list[SpecProblem] = []
    if pod_spec.get("hostNetwork") is True:
        problems.append(
            SpecProblem(
                "spec.template.spec.hostNetwork",
                SLURM_NODE_NAME_NOT_POD_NAME,
                "slurmd would register under the Kubernetes node's hostname, not the pod name "
                "its Slurm node is read by",
            )
        )
    hostname = pod_spec.get("hostname")
    if hostname not in (None, ""):
        problems.append(
            SpecProblem(
                "spec.template.spec.hostname",
                SLURM_NODE_NAME_NOT_POD_NAME,
                f"slurmd would register as {hostname!r}, not the pod name its Slurm node is "
                "read by",
            )
        )
    return problems


def _timeout_problem(value: Any, field: str) -> SpecProblem | None:
    if value is None:
        return None
    if not is_int(value) or value < 0:
        return SpecProblem(field, "InvalidTimeout", f"{value!r} is not a non-negative integer")
    return None


def validate(nodeset: Mapping[str, Any]) -> list[SpecProblem]:
    """Every problem of the NodeSet's spec (empty: usable)."""
    spec = nodeset.get("spec")
    if not isinstance(spec, Mapping):
        return [SpecProblem("spec", "MissingSpec", "the NodeSet has no spec")]
    problems: list[SpecProblem] = []
    replicas = spec.get("replicas")
    if replicas is not None:
        if not is_int(replicas):
            problems.append(SpecProblem("spec.replicas", "InvalidReplicas", f"{replicas!r}"))
        elif replicas < 0:
            problems.append(
                SpecProblem("spec.replicas", "NegativeReplicas", f"{replicas} is negative")
            )
    prefix = spec.get("podNamePrefix")
    if prefix is not None and (
        not isinstance(prefix, str)
        or len(prefix) > MAX_PREFIX_LENGTH
        or not _DNS_LABEL.match(prefix)
    ):
        problems.append(
            SpecProblem("spec.podNamePrefix", "InvalidPodNamePrefix", f"{prefix!r} is no DNS label")
        )
    elif prefix is None and len(name_of(nodeset)) > MAX_PREFIX_LENGTH:
        problems.append(
            SpecProblem("metadata.name", "NameTooLong", "pod names would be over 63 characters")
        )
    cluster = spec.get("slurmCluster")
    if not isinstance(cluster, str) or not _DNS_LABEL.match(cluster):
        problems.append(SpecProblem("spec.slurmCluster", "InvalidSlurmCluster", f"{cluster!r}"))
    problems += template_problems(spec.get("template"))
    problems += slurm_node_name_problems(spec.get("template"))
    strategy = mapping(spec.get("updateStrategy"))
    strategy_type = strategy.get("type", "RollingUpdate")
    if strategy_type not in UPDATE_STRATEGIES:
        problems.append(
            SpecProblem("spec.updateStrategy.type", "InvalidUpdateStrategy", f"{strategy_type!r}")
        )
    elif strategy_type == "ScheduledUpdate":
        problem = _scheduled_update_problem(nodeset, strategy)
        if problem is not None:
            problems.append(problem)
    rolling = mapping(strategy.get("rollingUpdate"))
    if "maxUnavailable" in rolling:
        problem = max_unavailable_problem(rolling.get("maxUnavailable"))
        if problem is not None:
            problems.append(problem)
    min_ready = spec.get("minReadySeconds")
    if min_ready is not None and (not is_int(min_ready) or min_ready < 0):
        problems.append(
            SpecProblem(
                "spec.minReadySeconds",
                "InvalidMinReadySeconds",
                f"{min_ready!r} is not a non-negative integer",
            )
        )
    ordering = spec.get("scaleDownPriorityOrdering")
    if ordering is not None and not isinstance(ordering, bool):
        problems.append(
            SpecProblem("spec.scaleDownPriorityOrdering", "InvalidOption", f"{ordering!r}")
        )
    protection = spec.get("workloadDisruptionProtection")
    if protection is not None and not isinstance(protection, bool):
        problems.append(
            SpecProblem("spec.workloadDisruptionProtection", "InvalidOption", f"{protection!r}")
        )
    history_limit = spec.get("revisionHistoryLimit")
    if history_limit is not None and (not is_int(history_limit) or history_limit < 0):
        problems.append(
            SpecProblem(
                "spec.revisionHistoryLimit",
                "InvalidRevisionHistoryLimit",
                f"{history_limit!r} is not a non-negative integer",
            )
        )
    # Acted on by slurm-syncer; checked here so that a bad value is reported on the NodeSet.
    prune = spec.get("pruneSlurmNodeRecords")
    if prune is not None and prune not in ("Never", "NodeNotFound"):
        problems.append(SpecProblem("spec.pruneSlurmNodeRecords", "InvalidOption", f"{prune!r}"))
    for field in (
        "forceScalingDeleteKnownConditionTimeout",
        "forceScalingDeleteUnknownConditionTimeout",
    ):
        problem = _timeout_problem(spec.get(field), f"spec.{field}")
        if problem is not None:
            problems.append(problem)
    return problems


def parse(nodeset: Mapping[str, Any], defaults: Defaults) -> NodeSetSpec:
    """The spec with defaults and per-NodeSet overrides applied; call only when `validate`
    found no problem."""
    spec = mapping(nodeset.get("spec"))
    strategy = mapping(spec.get("updateStrategy"))
    max_unavailable = mapping(strategy.get("rollingUpdate")).get("maxUnavailable", 1)
    ordering = spec.get("scaleDownPriorityOrdering")
    known = spec.get("forceScalingDeleteKnownConditionTimeout")
    unknown = spec.get("forceScalingDeleteUnknownConditionTimeout")
    generation = meta(nodeset).get("generation")
    min_ready = spec.get("minReadySeconds")
    history_limit = spec.get("revisionHistoryLimit")
    return NodeSetSpec(
        namespace=namespace_of(nodeset),
        name=name_of(nodeset),
        uid=uid_of(nodeset),
        generation=generation if is_int(generation) else 0,
        resource_version=resource_version_of(nodeset),
        replicas=spec.get("replicas"),
        pod_name_prefix=str(spec.get("podNamePrefix") or name_of(nodeset)),
        slurm_cluster=str(spec.get("slurmCluster")),
        template=mapping(spec.get("template")),
        update_strategy=_strategy(strategy.get("type")),
        update_window=_window(nodeset, strategy),
        max_unavailable=max_unavailable.strip()
        if isinstance(max_unavailable, str)
        else max_unavailable,
        scale_down_priority_ordering=(
            ordering if isinstance(ordering, bool) else defaults.scale_down_priority_ordering
        ),
        force_delete_known_timeout=(
            float(known) if is_int(known) else defaults.force_delete_known_timeout
        ),
        force_delete_unknown_timeout=(
            float(unknown) if is_int(unknown) else defaults.force_delete_unknown_timeout
        ),
        lock_toleration_key=defaults.lock_toleration_key,
        workload_disruption_protection=spec.get("workloadDisruptionProtection") is not False,
        min_ready_seconds=min_ready if is_int(min_ready) else 0,
        revision_history_limit=(
            history_limit if is_int(history_limit) else DEFAULT_REVISION_HISTORY_LIMIT
        ),
    )
