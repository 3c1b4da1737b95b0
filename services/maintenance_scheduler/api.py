"""The maintenance.nvidia.com/v1alpha1 API as the scheduler reads it (pure).

NodeMaintenance and MaintenanceOperatorConfig are parsed field for field as NVIDIA's
maintenance-operator defines them (names, defaults, validation), so an object written for
that operator means the same here. Parsing never raises: a request the API server should
have refused (the CRD's schema and CEL rules do) is reported as `problems` and left alone.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from nodeflow_kube.fields import Obj, condition, mapping, meta, parse_time

API_GROUP: Final = "maintenance.nvidia.com"
API_VERSION: Final = "maintenance.nvidia.com/v1alpha1"
NODE_MAINTENANCE_KIND: Final = "NodeMaintenance"
CONFIG_KIND: Final = "MaintenanceOperatorConfig"
CONFIG_NAME: Final = "default"

FINALIZER: Final = "maintenance.nvidia.com/finalizer"
INITIAL_STATE_ANNOTATION: Final = "maintenance.nvidia.com/node-initial-state.unschedulable"
READY_TIME_ANNOTATION: Final = "maintenance.nvidia.com/ready-time"
WAIT_START_ANNOTATION: Final = "maintenance.nvidia.com/wait-pod-completion-start-time"
GC_IGNORE_ANNOTATION: Final = "maintenance.nvidia.com/garbage-collector.ignore"
# The drain in progress: a fingerprint of the drainSpec it runs with, and when it started (its
# timeout counts from then). Kept on the object, so a drainSpec change restarts the drain (as
# the reference operator cancels and recreates its drain request) and a restart does not.
DRAIN_SPEC_ANNOTATION: Final = "nodeflow.dev/drain-spec-hash"
DRAIN_START_ANNOTATION: Final = "nodeflow.dev/drain-start-time"

READY_CONDITION: Final = "Ready"
REQUESTOR_FAILED_CONDITION: Final = "RequestorFailed"

# Phases: the reason of the Ready condition.
UNINITIALIZED: Final = ""
PENDING: Final = "Pending"
SCHEDULED: Final = "Scheduled"
CORDON: Final = "Cordon"
WAIT_FOR_POD_COMPLETION: Final = "WaitForPodCompletion"
DRAINING: Final = "Draining"
READY: Final = "Ready"
REQUESTOR_FAILED: Final = "RequestorFailed"
PHASES: Final = (
    PENDING,
    SCHEDULED,
    CORDON,
    WAIT_FOR_POD_COMPLETION,
    DRAINING,
    READY,
    REQUESTOR_FAILED,
)
# Phases of a request that is not yet scheduled; every other phase is "in progress".
NOT_STARTED: Final = frozenset({UNINITIALIZED, PENDING})

DEFAULT_DRAIN_TIMEOUT_SECONDS: Final = 300
DEFAULT_MAX_PARALLEL_OPERATIONS: Final = 1
DEFAULT_MAX_NODE_MAINTENANCE_TIME_SECONDS: Final = 3600
LOG_LEVELS: Final = ("debug", "info", "error")

REQUESTOR_ID_PATTERN: Final = re.compile(
    r"^([a-z0-9A-Z]([-a-z0-9A-Z]*[a-z0-9A-Z])?(\.[a-z0-9A-Z]([-a-z0-9A-Z]*[a-z0-9A-Z])?)*)$"
)
_INT32_MAX: Final = 2**31 - 1
_PERCENT = re.compile(r"^(\d+)%$")


@dataclass(frozen=True)
class WaitForPodCompletion:
    pod_selector: str = ""
    # 0 waits forever.
    timeout_seconds: int = 0


@dataclass(frozen=True)
class DrainSpec:
    force: bool = False
    pod_selector: str = ""
    # 0 means no limit.
    timeout_seconds: int = DEFAULT_DRAIN_TIMEOUT_SECONDS
    delete_empty_dir: bool = False
    # byResourceNameRegex of each filter; a pod matching any of them is evicted.
    eviction_filters: tuple[str, ...] = ()


def drain_spec_fingerprint(spec: DrainSpec) -> str:
    """A short digest of a drainSpec as defaulted: equal specs, equal fingerprints. The
    eviction filters are ORed, so their order does not count; the form is versioned, so a
    later release that adds a field can keep the digests of drains in progress."""
    fields = dataclasses.asdict(spec)
    fields["eviction_filters"] = sorted(fields["eviction_filters"])
    canonical = json.dumps({"v": 1, **fields}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class NodeMaintenance:
    """One NodeMaintenance object, its spec defaulted and its progress read from status."""

    namespace: str
    name: str
    uid: str
    resource_version: str
    generation: int
    created_at: float
    requestor_id: str
    additional_requestors: tuple[str, ...]
    node_name: str
    cordon: bool
    wait_for_pod_completion: WaitForPodCompletion | None
    drain_spec: DrainSpec | None
    phase: str
    # When the Ready condition last changed reason (the start of the current phase).
    phase_since: float | None
    ready_message: str
    requestor_failed: bool
    deleting: bool
    has_finalizer: bool
    finalizers: tuple[str, ...]
    annotations: Mapping[str, str]
    status: Obj
    problems: tuple[str, ...] = ()
    # metadata.ownerReferences as read (a merge patch replaces the list: others are kept).
    owner_references: tuple[Mapping[str, Any], ...] = ()

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def in_progress(self) -> bool:
        """Scheduled or past it: the node counts as under maintenance."""
        return self.phase not in NOT_STARTED

    @property
    def initial_unschedulable(self) -> str | None:
        return self.annotations.get(INITIAL_STATE_ANNOTATION)

    @property
    def ready_time(self) -> float | None:
        return parse_time(self.annotations.get(READY_TIME_ANNOTATION))

    @property
    def gc_ignored(self) -> bool:
        return self.annotations.get(GC_IGNORE_ANNOTATION) == "true"

    @property
    def wait_started_at(self) -> float | None:
        return parse_time(self.annotations.get(WAIT_START_ANNOTATION))

    @property
    def drain_spec_hash(self) -> str | None:
        return self.annotations.get(DRAIN_SPEC_ANNOTATION)

    @property
    def drain_started_at(self) -> float | None:
        return parse_time(self.annotations.get(DRAIN_START_ANNOTATION))

    def _is_own_node_ref(self, ref: Mapping[str, Any]) -> bool:
        """A Node ownerReference that names spec.nodeName: one naming another node says
        nothing about which node of this name the request was made for."""
        return ref.get("kind") == "Node" and ref.get("name") == self.node_name

    @property
    def node_owner_uid(self) -> str | None:
        """The uid of the Node this request was made for, from its Node ownerReference of
        spec.nodeName (set at its first round, as upstream sets it); None before that."""
        return next(
            (
                str(ref.get("uid"))
                for ref in self.owner_references
                if self._is_own_node_ref(ref) and ref.get("uid")
            ),
            None,
        )

    def meant_for(self, node_uid: str) -> bool | None:
        """Whether the node of `spec.nodeName` with this uid is the one the request was made
        for: a node that replaced it under the same name is not (upstream's garbage collector
        deletes a request whose owner Node is gone; until it has, the request must not touch
        the newcomer). None when that cannot be told: a node read without a uid is no evidence
        either way, neither the request's node nor another."""
        owner = self.node_owner_uid
        if owner is None:
            return True
        if not node_uid:
            return None
        return owner == node_uid

    def owned_by_node(self, node_uid: str) -> bool:
        return bool(node_uid) and any(
            self._is_own_node_ref(ref) and ref.get("uid") == node_uid
            for ref in self.owner_references
        )

    def with_node_owner(self, node_name: str, node_uid: str) -> tuple[dict[str, Any], ...]:
        """The ownerReferences with the Node added, as upstream sets it: not the controller,
        not blocking the Node's deletion; the garbage collector deletes the request with it."""
        kept = tuple(dict(ref) for ref in self.owner_references if not self._is_own_node_ref(ref))
        node = {"apiVersion": "v1", "kind": "Node", "name": node_name, "uid": node_uid}
        return (*kept, node)


def _bool(value: object, default: bool, field: str, problems: list[str]) -> bool:
    if value is None:
        return default
    if isinstance(value, bool):
        return value
    problems.append(f"{field} must be a boolean")
    return default


def _seconds(value: object, default: int, field: str, problems: list[str]) -> int:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        problems.append(f"{field} must be an integer")
        return default
    if value < 0 or value > _INT32_MAX:
        problems.append(f"{field} must be between 0 and {_INT32_MAX}")
        return default
    return value


def _text(value: object, field: str, problems: list[str]) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        problems.append(f"{field} must be a string")
        return ""
    return value


def parse_node_maintenance(obj: Obj) -> NodeMaintenance:
    metadata = meta(obj)
    spec = mapping(obj.get("spec"))
    problems: list[str] = []
    requestor = _text(spec.get("requestorID"), "spec.requestorID", problems)
    if not requestor:
        problems.append("spec.requestorID is required")
    elif not 2 <= len(requestor) <= 63 or not REQUESTOR_ID_PATTERN.match(requestor):
        problems.append("spec.requestorID must be a DNS-subdomain-like name of 2-63 characters")
    node_name = _text(spec.get("nodeName"), "spec.nodeName", problems)
    if not node_name:
        problems.append("spec.nodeName is required")
    additional_raw = spec.get("additionalRequestors") or []
    additional: list[str] = []
    if isinstance(additional_raw, list):
        for item in additional_raw:
            if isinstance(item, str) and item not in additional:
                additional.append(item)
    else:
        problems.append("spec.additionalRequestors must be a list of strings")

    wait: WaitForPodCompletion | None = None
    wait_raw = spec.get("waitForPodCompletion")
    if isinstance(wait_raw, Mapping):
        wait = WaitForPodCompletion(
            pod_selector=_text(
                wait_raw.get("podSelector"), "waitForPodCompletion.podSelector", problems
            ),
            timeout_seconds=_seconds(
                wait_raw.get("timeoutSeconds"), 0, "waitForPodCompletion.timeoutSeconds", problems
            ),
        )
    drain: DrainSpec | None = None
    drain_raw = spec.get("drainSpec")
    if isinstance(drain_raw, Mapping):
        filters: list[str] = []
        raw_filters = drain_raw.get("podEvictionFilters")
        if raw_filters is not None and not isinstance(raw_filters, list):
            problems.append("drainSpec.podEvictionFilters must be a list")
        for index, entry in enumerate(raw_filters if isinstance(raw_filters, list) else ()):
            regex = mapping(entry).get("byResourceNameRegex")
            if isinstance(regex, str):
                filters.append(regex)
            else:
                # Skipping it would leave no filter, and no filter evicts every pod: the
                # opposite of what a filter asks (upstream dereferences the missing regex).
                problems.append(
                    f"drainSpec.podEvictionFilters[{index}].byResourceNameRegex is required "
                    "(a filter without it selects nothing to evict, not every pod)"
                )
        drain = DrainSpec(
            force=_bool(drain_raw.get("force"), False, "drainSpec.force", problems),
            pod_selector=_text(drain_raw.get("podSelector"), "drainSpec.podSelector", problems),
            timeout_seconds=_seconds(
                drain_raw.get("timeoutSeconds"),
                DEFAULT_DRAIN_TIMEOUT_SECONDS,
                "drainSpec.timeoutSeconds",
                problems,
            ),
            delete_empty_dir=_bool(
                drain_raw.get("deleteEmptyDir"), False, "drainSpec.deleteEmptyDir", problems
            ),
            eviction_filters=tuple(filters),
        )

    ready = condition(obj, READY_CONDITION)
    phase = str(ready.get("reason") or "") if ready else UNINITIALIZED
    failed = condition(obj, REQUESTOR_FAILED_CONDITION)
    finalizers = tuple(str(f) for f in metadata.get("finalizers") or () if isinstance(f, str))
    annotations = {
        str(k): str(v) for k, v in mapping(metadata.get("annotations")).items() if v is not None
    }
    generation = metadata.get("generation")
    return NodeMaintenance(
        namespace=str(metadata.get("namespace") or ""),
        name=str(metadata.get("name") or ""),
        uid=str(metadata.get("uid") or ""),
        resource_version=str(metadata.get("resourceVersion") or ""),
        generation=generation if isinstance(generation, int) else 0,
        created_at=parse_time(metadata.get("creationTimestamp")) or 0.0,
        requestor_id=requestor,
        additional_requestors=tuple(additional),
        node_name=node_name,
        cordon=_bool(spec.get("cordon"), True, "spec.cordon", problems),
        wait_for_pod_completion=wait,
        drain_spec=drain,
        phase=phase,
        phase_since=parse_time(ready.get("lastTransitionTime")) if ready else None,
        ready_message=str(ready.get("message") or "") if ready else "",
        requestor_failed=failed is not None and failed.get("status") == "True",
        deleting=bool(metadata.get("deletionTimestamp")),
        has_finalizer=FINALIZER in finalizers,
        finalizers=finalizers,
        annotations=annotations,
        status=mapping(obj.get("status")),
        problems=tuple(problems),
        owner_references=tuple(
            mapping(ref)
            for ref in metadata.get("ownerReferences") or ()
            if isinstance(ref, Mapping)
        ),
    )


# --- MaintenanceOperatorConfig ----------------------------------------------------------------


@dataclass(frozen=True)
class IntOrPercent:
    """An IntOrString limit: an absolute count or a percentage of the nodes."""

    value: int
    percent: bool = False

    def resolve(self, total: int, *, round_up: bool) -> int:
        if not self.percent:
            return self.value
        exact = self.value * total / 100
        return math.ceil(exact) if round_up else math.floor(exact)

    def __str__(self) -> str:
        return f"{self.value}%" if self.percent else str(self.value)


def parse_int_or_percent(value: object) -> IntOrPercent | None:
    """5 -> 5; "10%" -> 10 percent; "5" -> 5; anything else (or negative) -> None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return IntOrPercent(value) if value >= 0 else None
    if isinstance(value, str):
        match = _PERCENT.match(value.strip())
        if match:
            return IntOrPercent(int(match.group(1)), percent=True)
        if value.strip().isdigit():
            return IntOrPercent(int(value.strip()))
    return None


@dataclass(frozen=True)
class OperatorConfig:
    max_parallel_operations: IntOrPercent = IntOrPercent(DEFAULT_MAX_PARALLEL_OPERATIONS)
    # None: no limit.
    max_unavailable: IntOrPercent | None = None
    max_node_maintenance_time_seconds: int = DEFAULT_MAX_NODE_MAINTENANCE_TIME_SECONDS
    log_level: str = "info"
    problems: tuple[str, ...] = ()

    def parallel_limit(self, total_nodes: int) -> int | None:
        """Most requests in progress at once; None when unlimited (an explicit 0, as the
        field's documentation says -- upstream schedules nothing then). Percent rounds up."""
        limit = self.max_parallel_operations.resolve(total_nodes, round_up=True)
        return None if limit == 0 else limit

    def unavailable_limit(self, total_nodes: int) -> int | None:
        """Most nodes unavailable at once; None when unset. Percent rounds down, so "10%" of
        5 nodes is 0: nothing new becomes unavailable."""
        if self.max_unavailable is None:
            return None
        return self.max_unavailable.resolve(total_nodes, round_up=False)


UNLIMITED_PARALLEL_OPERATIONS_REASON: Final = "UnlimitedParallelOperations"


def config_warnings(config: OperatorConfig) -> tuple[tuple[str, str], ...]:
    """(reason, message) of each Warning Event the config deserves: values it reads here
    otherwise than NVIDIA's controller would."""
    if config.max_parallel_operations.value != 0:
        return ()
    return (
        (
            UNLIMITED_PARALLEL_OPERATIONS_REASON,
            f"maxParallelOperations {config.max_parallel_operations} means no limit here, as "
            "the field's documentation says; NVIDIA's maintenance-operator controller computes "
            "zero slots from it and schedules nothing. Set a positive limit to mean the same "
            "to both.",
        ),
    )


def parse_operator_config(obj: Obj | None) -> OperatorConfig:
    if obj is None:
        return OperatorConfig()
    spec = mapping(obj.get("spec"))
    problems: list[str] = []
    parallel = IntOrPercent(DEFAULT_MAX_PARALLEL_OPERATIONS)
    if spec.get("maxParallelOperations") is not None:
        parsed = parse_int_or_percent(spec.get("maxParallelOperations"))
        if parsed is None:
            problems.append("maxParallelOperations must be a non-negative integer or a percent")
        else:
            parallel = parsed
    unavailable: IntOrPercent | None = None
    if spec.get("maxUnavailable") is not None:
        unavailable = parse_int_or_percent(spec.get("maxUnavailable"))
        if unavailable is None:
            problems.append("maxUnavailable must be a non-negative integer or a percent")
            # Fail closed: an unreadable availability limit allows nothing new to go down.
            unavailable = IntOrPercent(0)
    max_time = _seconds(
        spec.get("maxNodeMaintenanceTimeSeconds"),
        DEFAULT_MAX_NODE_MAINTENANCE_TIME_SECONDS,
        "maxNodeMaintenanceTimeSeconds",
        problems,
    )
    log_level = spec.get("logLevel") or "info"
    if log_level not in LOG_LEVELS:
        problems.append(f"logLevel must be one of {', '.join(LOG_LEVELS)}")
        log_level = "info"
    return OperatorConfig(
        max_parallel_operations=parallel,
        max_unavailable=unavailable,
        max_node_maintenance_time_seconds=max_time,
        log_level=str(log_level),
        problems=tuple(problems),
    )
