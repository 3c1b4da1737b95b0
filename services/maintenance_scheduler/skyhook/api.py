"""The skyhook.nvidia.com/v1alpha1 and nodewright.nvidia.com/v1alpha1 APIs as the controller
reads them (pure).

Skyhook (and its renamed twin NodeWright, the same spec) and DeploymentPolicy are parsed
field for field as NVIDIA's Skyhook operator defines them (names, defaults, validation), so
its manifests mean the same here. Parsing never
raises: what its webhook would have refused is reported as `problems`, and the controller
starts nothing for an object with problems.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from nodeflow_contracts.durations import go_duration_seconds
from nodeflow_contracts.skyhook import (
    NODEWRIGHT,
    SKYHOOK,
    SkyhookNames,
    flavor_of,
    is_node_condition,
)
from nodeflow_contracts.skyhook import POLICY_API_VERSION as _POLICY_API_VERSION
from nodeflow_contracts.skyhook import POLICY_KIND as _POLICY_KIND
from nodeflow_kube.fields import Obj, mapping, meta
from nodeflow_kube.labels import SelectorError, check_key, check_value

# The legacy flavor's names (skyhook.nvidia.com). The controller reads every key from the
# names of the object it reconciles (`Skyhook.names`: Skyhook or NodeWright, see
# nodeflow_contracts.skyhook); these spell the Skyhook's for callers that mean that kind.
API_GROUP: Final = SKYHOOK.group
API_VERSION: Final = SKYHOOK.api_version
SKYHOOK_KIND: Final = SKYHOOK.kind
POLICY_KIND: Final = _POLICY_KIND
POLICY_API_VERSION: Final = _POLICY_API_VERSION

SKYHOOK_PREFIX: Final = SKYHOOK.prefix
PAUSE_ANNOTATION: Final = SKYHOOK.pause_annotation
DISABLE_ANNOTATION: Final = SKYHOOK.disable_annotation
IGNORE_NODE_LABEL: Final = SKYHOOK.ignore_label
# A DeploymentPolicy named by a Skyhook carries this finalizer, so it cannot go while in use
# (a NodeWright's policy, of nodewright.nvidia.com, its group's: `names.policy_finalizer`).
POLICY_FINALIZER: Final = SKYHOOK.policy_finalizer
# A Skyhook carries this finalizer while its nodes may carry its state: deleting the Skyhook
# first removes what it wrote on them.
SKYHOOK_FINALIZER: Final = SKYHOOK.finalizer
DEFAULT_COMPARTMENT: Final = "__default__"
DEFAULT_PRIORITY: Final = 200

# Job labels, so the proposal's `kubectl get jobs -l ...` queries work.
NAME_LABEL: Final = SKYHOOK.name_label
PACKAGE_LABEL: Final = SKYHOOK.package_label
NODE_LABEL: Final = SKYHOOK.node_label
STAGE_LABEL: Final = SKYHOOK.stage_label
RESOURCE_ID_LABEL: Final = SKYHOOK.resource_id_label

node_state_annotation = SKYHOOK.node_state_annotation
version_annotation = SKYHOOK.version_annotation
cordon_annotation = SKYHOOK.cordon_annotation
auto_taint_annotation = SKYHOOK.auto_taint_annotation
not_ready_condition = SKYHOOK.not_ready_condition
erroring_condition = SKYHOOK.erroring_condition
status_key = SKYHOOK.status_key
# A node condition of either kind (never the kubelet's own).
is_skyhook_condition = is_node_condition

# What upstream writes as `version_<skyhook>` on a node: the operator release whose node-state
# schema the nodeState annotation follows (`name|version` keys with image and containerSHA).
# An upstream operator that takes the node over reads it and migrates nothing (its Migrate
# rewrites only states of releases before v0.8).
NODE_STATE_VERSION: Final = "v0.9.0"


InterruptType = Literal["service", "reboot", "noop", "restartAllServices"]
INTERRUPT_TYPES: Final[tuple[str, ...]] = ("service", "reboot", "noop", "restartAllServices")
StrategyKind = Literal["fixed", "linear", "exponential"]
# Safer first: overlapping compartments resolve to the safer strategy.
STRATEGY_SAFETY: Final[Mapping[str, int]] = {"fixed": 0, "linear": 1, "exponential": 2}
Sequencing = Literal["node", "all"]

PACKAGE_NAME = re.compile(r"^[a-z][-a-z0-9]{0,41}[a-z]$")
# A version as upstream's webhook takes it: golang.org/x/mod/semver.IsValid after a `v` is put
# in front, so `1`, `1.2` and `1.2.3-rc.1+build` pass; a pre-release or build needs all
# three numbers, and no number has a leading zero.
_SEMVER_IDENTIFIER = r"(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)"
SEMVER = re.compile(
    r"^v?(0|[1-9]\d*)(?:\.(0|[1-9]\d*)(?:\.(0|[1-9]\d*)"
    rf"(?:-({_SEMVER_IDENTIFIER}(?:\.{_SEMVER_IDENTIFIER})*))?"
    r"(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?)?)?$"
)
_QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(m|k|Ki|Mi|Gi|Ti|M|G|T)?$")


# --- label selectors (metav1.LabelSelector) --------------------------------------------------


@dataclass(frozen=True)
class Expression:
    key: str
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"]
    values: frozenset[str] = frozenset()

    def matches(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        if self.operator == "In":
            return present and labels[self.key] in self.values
        if self.operator == "NotIn":
            return not present or labels[self.key] not in self.values
        if self.operator == "Exists":
            return present
        return not present


@dataclass(frozen=True)
class LabelSelector:
    """An empty selector matches every node, as metav1.LabelSelectorAsSelector does."""

    match_labels: tuple[tuple[str, str], ...] = ()
    expressions: tuple[Expression, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        for key, value in self.match_labels:
            if labels.get(key) != value:
                return False
        return all(expression.matches(labels) for expression in self.expressions)

    def canonical(self) -> str:
        parts = [f"{k}={v}" for k, v in self.match_labels]
        parts += [f"{e.key} {e.operator} {sorted(e.values)}" for e in self.expressions]
        return ",".join(sorted(parts))


def parse_label_selector(raw: object, where: str, problems: list[str]) -> LabelSelector:
    """A metav1.LabelSelector, its keys and values checked as the API server checks them
    (a selector turned into a podSelector string must parse again)."""
    data = mapping(raw)
    labels = mapping(data.get("matchLabels"))
    match_labels = tuple(sorted((str(k), str(v)) for k, v in labels.items()))
    for key, value in match_labels:
        _check_label(key, value, f"{where}.matchLabels", problems)
    expressions: list[Expression] = []
    for index, entry in enumerate(data.get("matchExpressions") or ()):
        item = mapping(entry)
        operator = item.get("operator")
        key = str(item.get("key") or "")
        values = frozenset(str(v) for v in item.get("values") or ())
        if not key:
            problems.append(f"{where}.matchExpressions[{index}]: key is required")
            continue
        if not _check_label(key, None, f"{where}.matchExpressions[{index}]", problems) or not all(
            _check_label(key, value, f"{where}.matchExpressions[{index}]", problems)
            for value in sorted(values)
        ):
            continue
        if operator in ("In", "NotIn"):
            if not values:
                problems.append(f"{where}.matchExpressions[{index}]: {operator} needs values")
                continue
            expressions.append(Expression(key, operator, values))
        elif operator in ("Exists", "DoesNotExist"):
            if values:
                problems.append(f"{where}.matchExpressions[{index}]: {operator} takes no values")
                continue
            expressions.append(Expression(key, operator))
        else:
            problems.append(f"{where}.matchExpressions[{index}]: unknown operator {operator!r}")
    return LabelSelector(match_labels, tuple(expressions))


def _check_label(key: str, value: str | None, where: str, problems: list[str]) -> bool:
    try:
        check_key(key, where)
        if value is not None:
            check_value(value, where)
    except SelectorError as exc:
        problems.append(f"{where}: {exc}")
        return False
    return True


# --- DeploymentPolicy ------------------------------------------------------------------------


@dataclass(frozen=True)
class Budget:
    """Exactly one of percent or count: 1-100 and >= 1 in a DeploymentPolicy, 0-100 and
    >= 0 in a Skyhook's interruptionBudget (upstream's CRD minimums)."""

    percent: int | None = None
    count: int | None = None

    def ceiling(self, matched: int) -> int:
        """count, or upstream's CalculateCeiling: max(1, int(matched x (percent / 100))),
        the fraction dropped; 0 when nothing matched."""
        if self.count is not None:
            return self.count
        if self.percent is None or matched == 0:
            return 0
        return max(1, percent_share(matched, self.percent))

    def legacy_batch(self, matched: int) -> int:
        """The batch of a Skyhook without a DeploymentPolicy (upstream's
        createLegacyDefaultCompartment): count clamped to the nodes, or the percent's share,
        never less than one node, so `count: 0` still moves one node at a time."""
        if self.count is not None:
            return max(1, min(matched, self.count))
        if self.percent is None or matched == 0:
            return 1
        return max(1, percent_share(matched, self.percent))


def percent_share(matched: int, percent: int) -> int:
    """upstream's int(float64(n) * (float64(p) / 100)): the percent is divided first, so the
    float product can fall just under a whole number (100 nodes at 29% give 28, not 29)."""
    return int(matched * (percent / 100))


@dataclass(frozen=True)
class Strategy:
    kind: StrategyKind = "fixed"
    initial_batch: int = 1
    delta: int = 1
    growth_factor: int = 2
    batch_threshold: int = 100
    # None: consecutive failed batches never stop the rollout.
    failure_threshold: int | None = None
    safety_limit: int = 50


@dataclass(frozen=True)
class Compartment:
    name: str
    selector: LabelSelector
    budget: Budget
    strategy: Strategy | None = None


@dataclass(frozen=True)
class DeploymentPolicy:
    name: str
    uid: str = ""
    resource_version: str = ""
    default: Compartment = field(
        default_factory=lambda: Compartment(DEFAULT_COMPARTMENT, LabelSelector(), Budget(100))
    )
    compartments: tuple[Compartment, ...] = ()
    reset_batch_state_on_completion: bool = True
    finalizers: tuple[str, ...] = ()
    deleting: bool = False
    problems: tuple[str, ...] = ()
    # Whose group it is in (skyhook.nvidia.com or nodewright.nvidia.com): only an object of
    # that kind names it.
    names: SkyhookNames = SKYHOOK


def _int_field(
    data: Obj, name: str, where: str, problems: list[str], *, low: int, high: int | None = None
) -> int | None:
    if name not in data or data[name] is None:
        return None
    value = data[name]
    if isinstance(value, bool) or not isinstance(value, int):
        problems.append(f"{where}.{name}: must be an integer, got {value!r}")
        return None
    if value < low or (high is not None and value > high):
        bound = f"between {low} and {high}" if high is not None else f">= {low}"
        problems.append(f"{where}.{name}: must be {bound}, got {value}")
        return None
    return value


def parse_budget(raw: object, where: str, problems: list[str], *, low: int = 1) -> Budget:
    """`low`: the smallest percent and count allowed (0 for an interruptionBudget)."""
    data = mapping(raw)
    percent = _int_field(data, "percent", where, problems, low=low, high=100)
    count = _int_field(data, "count", where, problems, low=low)
    has_percent = data.get("percent") is not None
    has_count = data.get("count") is not None
    if has_percent == has_count:
        problems.append(f"{where}: exactly one of percent or count must be set")
        return Budget(percent=100)
    if (has_percent and percent is None) or (has_count and count is None):
        return Budget(percent=100)
    return Budget(percent=percent, count=count)


def parse_strategy(raw: object, where: str, problems: list[str]) -> Strategy | None:
    data = mapping(raw)
    kinds = [k for k in ("fixed", "linear", "exponential") if data.get(k) is not None]
    if len(kinds) != 1:
        problems.append(f"{where}: exactly one of fixed, linear, or exponential must be set")
        return None
    kind: StrategyKind = kinds[0]  # type: ignore[assignment]
    params = mapping(data[kind])
    here = f"{where}.{kind}"
    known = {"initialBatch", "batchThreshold", "failureThreshold", "safetyLimit"}
    known |= {"linear": {"delta"}, "exponential": {"growthFactor"}}.get(kind, set())
    for name in params:
        if name not in known:
            problems.append(f"{here}.{name}: not a field of a {kind} strategy")
    strategy = Strategy(kind=kind)
    values = {
        "initial_batch": _int_field(params, "initialBatch", here, problems, low=1),
        "batch_threshold": _int_field(params, "batchThreshold", here, problems, low=1, high=100),
        "safety_limit": _int_field(params, "safetyLimit", here, problems, low=1, high=100),
        "delta": _int_field(params, "delta", here, problems, low=1) if kind == "linear" else None,
        "growth_factor": (
            _int_field(params, "growthFactor", here, problems, low=2)
            if kind == "exponential"
            else None
        ),
    }
    chosen: dict[str, Any] = {k: v for k, v in values.items() if v is not None}
    failure = _int_field(params, "failureThreshold", here, problems, low=1)
    return Strategy(
        kind=kind,
        initial_batch=chosen.get("initial_batch", strategy.initial_batch),
        delta=chosen.get("delta", strategy.delta),
        growth_factor=chosen.get("growth_factor", strategy.growth_factor),
        batch_threshold=chosen.get("batch_threshold", strategy.batch_threshold),
        failure_threshold=failure,
        safety_limit=chosen.get("safety_limit", strategy.safety_limit),
    )


def parse_deployment_policy(obj: Obj) -> DeploymentPolicy:
    """A DeploymentPolicy of either group (by its apiVersion; anything else: skyhook's)."""
    metadata = meta(obj)
    spec = mapping(obj.get("spec"))
    problems: list[str] = []
    default_raw = mapping(spec.get("default"))
    if not default_raw:
        problems.append("spec.default: required")
    default = Compartment(
        DEFAULT_COMPARTMENT,
        LabelSelector(),
        parse_budget(default_raw.get("budget"), "spec.default.budget", problems),
        parse_strategy(default_raw.get("strategy"), "spec.default.strategy", problems)
        if default_raw.get("strategy") is not None
        else Strategy(),
    )
    compartments: list[Compartment] = []
    names: set[str] = set()
    selectors: dict[str, str] = {}
    for index, entry in enumerate(spec.get("compartments") or ()):
        item = mapping(entry)
        where = f"spec.compartments[{index}]"
        name = str(item.get("name") or "")
        if not name:
            problems.append(f"{where}.name: required")
        elif name == DEFAULT_COMPARTMENT:
            problems.append(f"{where}.name: {DEFAULT_COMPARTMENT!r} is reserved")
        elif name in names:
            problems.append(f"{where}.name: {name!r} is used twice")
        names.add(name)
        if item.get("selector") is None:
            problems.append(f"{where}.selector: required")
        selector = parse_label_selector(item.get("selector"), f"{where}.selector", problems)
        canonical = selector.canonical()
        if canonical in selectors:
            problems.append(
                f"{where}.selector: identical to compartment {selectors[canonical]!r}'s"
            )
        selectors[canonical] = name
        strategy = (
            parse_strategy(item.get("strategy"), f"{where}.strategy", problems)
            if item.get("strategy") is not None
            else None
        )
        compartments.append(
            Compartment(
                name,
                selector,
                parse_budget(item.get("budget"), f"{where}.budget", problems),
                strategy,
            )
        )
    reset = spec.get("resetBatchStateOnCompletion")
    return DeploymentPolicy(
        name=str(metadata.get("name") or ""),
        uid=str(metadata.get("uid") or ""),
        resource_version=str(metadata.get("resourceVersion") or ""),
        default=default,
        compartments=tuple(compartments),
        reset_batch_state_on_completion=reset if isinstance(reset, bool) else True,
        finalizers=tuple(str(f) for f in metadata.get("finalizers") or ()),
        deleting=bool(metadata.get("deletionTimestamp")),
        problems=tuple(problems),
        names=flavor_of(str(obj.get("apiVersion") or "")) or SKYHOOK,
    )


# --- Skyhook ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Interrupt:
    type: InterruptType
    services: tuple[str, ...] = ()


@dataclass(frozen=True)
class Resources:
    """Quantities as the manifest gives them (upstream's resource.Quantity is int-or-string
    in the CRD: `1` and `"500m"` both)."""

    cpu_request: str
    cpu_limit: str
    memory_request: str
    memory_limit: str


@dataclass(frozen=True)
class EnvVar:
    """One corev1.EnvVar of a package: a value, or a valueFrom source (kept as canonical
    JSON, handed to the pod as written)."""

    name: str
    value: str = ""
    value_from: str = ""

    def to_container(self) -> dict[str, Any]:
        if self.value_from:
            return {"name": self.name, "valueFrom": json.loads(self.value_from)}
        return {"name": self.name, "value": self.value}


@dataclass(frozen=True)
class Package:
    name: str
    version: str
    image: str
    interrupt: Interrupt | None = None
    depends_on: tuple[tuple[str, str], ...] = ()
    config_map: tuple[tuple[str, str], ...] = ()
    # configInterrupts: the interrupt a change of one configMap key needs, by key.
    config_interrupts: tuple[tuple[str, Interrupt], ...] = ()
    env: tuple[EnvVar, ...] = ()
    resources: Resources | None = None
    # activeDeadlineSeconds of each stage Job; None: the controller's default; 0: no deadline.
    stage_timeout_seconds: int | None = None
    # The image digest (`sha256:...`): pulled by digest instead of the version tag.
    container_sha: str = ""
    # The agent image for this package instead of the controller's SKYHOOK_AGENT_IMAGE.
    agent_image_override: str = ""
    # gracefulShutdown (a Go duration) in whole seconds: the pod's
    # terminationGracePeriodSeconds; None: the Kubernetes default.
    graceful_shutdown_seconds: int | None = None
    # uninstall.enabled / uninstall.apply (nodewright): apply uninstalls it from every node.
    uninstall_enabled: bool = False
    uninstall_apply: bool = False

    @property
    def uninstalling(self) -> bool:
        """upstream's IsUninstalling: uninstall.enabled and uninstall.apply."""
        return self.uninstall_enabled and self.uninstall_apply

    @property
    def key(self) -> str:
        """The node-state key of this package, as the anchor writes it: `name|version`."""
        return f"{self.name}|{self.version}"

    @property
    def image_ref(self) -> str:
        """The package image as upstream's getPackageImage pulls it: by digest when
        containerSHA is set, else by the version tag."""
        if self.container_sha:
            return f"{self.image}@{self.container_sha}"
        return f"{self.image}:{self.version}"


@dataclass(frozen=True)
class DrainConfig:
    """A NodeWright's spec.drainConfig (upstream's DrainConfig), its defaults upstream's: the
    drain it had before the field. Only delete_empty_dir_data, force and timeout_seconds reach
    the NodeMaintenance drainSpec (jobs.build_maintenance); the rest are read so a manifest
    using them is understood, and documented as not acted on (S56)."""

    disable_eviction: bool = False
    delete_empty_dir_data: bool = True
    force: bool = True
    ignore_daemon_sets: bool = True
    # Whole seconds; None: unset (our configured drain timeout applies), 0: no timeout.
    timeout_seconds: int | None = None
    grace_period_seconds: int | None = None


@dataclass(frozen=True)
class Skyhook:
    name: str
    uid: str = ""
    resource_version: str = ""
    generation: int = 0
    node_selector: LabelSelector = LabelSelector()
    packages: tuple[Package, ...] = ()
    interruption_budget: Budget | None = None
    deployment_policy: str = ""
    pod_non_interrupt_labels: LabelSelector | None = None
    additional_tolerations: tuple[Mapping[str, Any], ...] = ()
    priority: int = DEFAULT_PRIORITY
    serial: bool = False
    sequencing: Sequencing = "node"
    paused: bool = False
    disabled: bool = False
    # runtimeRequired: its pods tolerate the runtime-required taint, and (autoTaintNewNodes)
    # new nodes it selects get that taint until every runtimeRequired Skyhook is complete.
    runtime_required: bool = False
    auto_taint_new_nodes: bool = False
    # runtimeRequiredCordonAfter (only with runtimeRequired): the node is cordoned, with the
    # runtimeRequiredCordon mark, when its runtime-required taint is removed.
    runtime_required_cordon_after: bool = False
    # spec.drainConfig; None: unset, the default drain.
    drain_config: DrainConfig | None = None
    # deploymentPolicyOptions.resetBatchStateOnCompletion; None: the policy decides.
    reset_batch_state_on_completion: bool | None = None
    problems: tuple[str, ...] = ()
    status: Obj = field(default_factory=dict)
    finalizers: tuple[str, ...] = ()
    deleting: bool = False
    # Which kind it is (Skyhook or NodeWright): every key it reads or writes is of its names.
    names: SkyhookNames = SKYHOOK

    @property
    def owner_key(self) -> str:
        return owner_key(self.name, self.names)

    def package(self, name: str) -> Package | None:
        for package in self.packages:
            if package.name == name:
                return package
        return None


def owner_key(name: str, names: SkyhookNames = SKYHOOK) -> str:
    """How the controller's bookkeeping (whose NodeMaintenance, whose running Jobs) tells a
    Skyhook and a NodeWright of one name apart: a Skyhook by its name (as before), a
    NodeWright by its group and name (an object name never holds a '/')."""
    return name if names == SKYHOOK else f"{names.group}/{name}"


def owner_name(key: str) -> str:
    """The object name an owner_key is for."""
    return key.rpartition("/")[2]


def owner_kind(key: str) -> str:
    """The kind an owner_key is for: a NodeWright's key carries its group."""
    return NODEWRIGHT.kind if key.startswith(f"{NODEWRIGHT.group}/") else SKYHOOK.kind


def _pairs(raw: object) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((str(k), str(v)) for k, v in mapping(raw).items()))


def _parse_resources(raw: object, where: str, problems: list[str]) -> Resources | None:
    data = mapping(raw)
    if not data:
        return None
    names = ("cpuRequest", "cpuLimit", "memoryRequest", "memoryLimit")
    present = [n for n in names if data.get(n) is not None]
    if len(present) != len(names):
        problems.append(f"{where}: set all of {', '.join(names)} or none")
        return None
    for name in names:
        value = data[name]
        # int-or-string, as upstream's CRD (x-kubernetes-int-or-string): 2 means "2".
        if isinstance(value, bool) or not isinstance(value, int | str):
            problems.append(f"{where}.{name}: {value!r} is not a quantity")
            return None
        if not _QUANTITY.match(str(value)):
            problems.append(f"{where}.{name}: {value!r} is not a quantity")
            return None
    return Resources(*(str(data[n]) for n in names))


def parse_go_duration(text: str) -> float | None:
    """Seconds of a Go duration string (metav1.Duration's form); None when it is not one."""
    try:
        return go_duration_seconds(text)
    except ValueError:
        return None


def _parse_env(raw: object, where: str, problems: list[str]) -> tuple[EnvVar, ...]:
    """corev1.EnvVar entries in order; `valueFrom` is kept (upstream hands the package's env
    to its agent containers as written)."""
    found: list[EnvVar] = []
    for index, entry in enumerate(raw if isinstance(raw, list) else ()):
        item = mapping(entry)
        name = str(item.get("name") or "")
        if not name:
            problems.append(f"{where}[{index}].name: required")
            continue
        source = item.get("valueFrom")
        if source is not None:
            if item.get("value"):
                problems.append(f"{where}[{index}]: value and valueFrom are exclusive")
                continue
            found.append(EnvVar(name, value_from=json.dumps(source, sort_keys=True)))
        else:
            found.append(EnvVar(name, value=str(item.get("value") or "")))
    return tuple(found)


def _parse_package(name: str, raw: object, problems: list[str]) -> Package | None:
    data = mapping(raw)
    where = f"spec.packages.{name}"
    if not PACKAGE_NAME.match(name):
        problems.append(f"{where}: name must match {PACKAGE_NAME.pattern}")
    version = str(data.get("version") or "")
    if not version:
        problems.append(f"{where}.version: required")
    elif not SEMVER.match(version):
        problems.append(f"{where}.version: {version!r} is not a semantic version")
    image = str(data.get("image") or "")
    if not image:
        problems.append(f"{where}.image: required")
    else:
        last = image.rsplit("/", 1)[-1]
        if ":" in last:
            tag = last.rpartition(":")[2]
            if tag != version:
                problems.append(
                    f"{where}.image: tag {tag!r} differs from version {version!r} "
                    "(the version is the tag)"
                )
            image = image[: len(image) - len(tag) - 1]
    interrupt: Interrupt | None = None
    if data.get("interrupt") is not None:
        interrupt = _parse_interrupt(data.get("interrupt"), f"{where}.interrupt", problems)
    config_interrupts: list[tuple[str, Interrupt]] = []
    for key, raw_interrupt in sorted(mapping(data.get("configInterrupts")).items()):
        parsed = _parse_interrupt(raw_interrupt, f"{where}.configInterrupts.{key}", problems)
        if parsed is not None:
            config_interrupts.append((str(key), parsed))
    timeout = _stage_timeout(data.get("stageTimeout"), f"{where}.stageTimeout", problems)
    uninstall = mapping(data.get("uninstall"))
    if uninstall.get("apply") is True and uninstall.get("enabled") is not True:
        problems.append(f"{where}.uninstall.apply: only valid when uninstall.enabled is true")
    return Package(
        name=name,
        version=version,
        image=image,
        interrupt=interrupt,
        depends_on=_pairs(data.get("dependsOn")),
        config_map=_pairs(data.get("configMap")),
        config_interrupts=tuple(config_interrupts),
        env=_parse_env(data.get("env"), f"{where}.env", problems),
        resources=_parse_resources(data.get("resources"), f"{where}.resources", problems),
        stage_timeout_seconds=timeout,
        container_sha=str(data.get("containerSHA") or ""),
        agent_image_override=str(data.get("agentImageOverride") or ""),
        graceful_shutdown_seconds=_graceful_shutdown(data.get("gracefulShutdown"), where, problems),
        uninstall_enabled=uninstall.get("enabled") is True,
        uninstall_apply=uninstall.get("apply") is True,
    )


def _stage_timeout(raw: object, where: str, problems: list[str]) -> int | None:
    """A package's stageTimeout: whole seconds (a Skyhook here), or a Go duration string as a
    NodeWright's CRD types it, "0" removing the bound (upstream: the fraction dropped)."""
    if raw is None or raw == "":
        return None
    if isinstance(raw, bool) or not isinstance(raw, int | str):
        problems.append(f"{where}: {raw!r} is neither seconds nor a duration")
        return None
    if isinstance(raw, int):
        if raw < 1:
            problems.append(f"{where}: must be >= 1, got {raw}")
            return None
        return raw
    seconds = parse_go_duration(raw)
    if seconds is None or seconds < 0:
        problems.append(f"{where}: {raw!r} is not a duration")
        return None
    return int(seconds)


def _graceful_shutdown(raw: object, where: str, problems: list[str]) -> int | None:
    if raw is None or raw == "":
        return None
    seconds = parse_go_duration(str(raw))
    if seconds is None or seconds < 0:
        problems.append(f"{where}.gracefulShutdown: {raw!r} is not a duration")
        return None
    # upstream: int64(Duration.Seconds()), the fraction dropped.
    return int(seconds)


def _drain_flag(raw: Mapping[str, Any], key: str, default: bool, problems: list[str]) -> bool:
    value = raw.get(key)
    if value is None:  # unset or null (the CRD's nullable): upstream's default
        return default
    if not isinstance(value, bool):
        problems.append(f"spec.drainConfig.{key}: {value!r} is not a boolean")
        return default
    return value


def _drain_duration(raw: Mapping[str, Any], key: str, problems: list[str]) -> int | None:
    value = raw.get(key)
    if value is None or value == "":
        return None
    seconds = parse_go_duration(str(value)) if isinstance(value, str) else None
    if seconds is None or seconds < 0:
        # upstream's DrainConfig.Validate: both durations must be >= 0.
        problems.append(f"spec.drainConfig.{key}: {value!r} is not a duration >= 0")
        return None
    return int(seconds)


def parse_drain_config(raw: object, problems: list[str]) -> DrainConfig | None:
    """spec.drainConfig, None when unset."""
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        problems.append(f"spec.drainConfig: {raw!r} is not an object")
        return None
    return DrainConfig(
        disable_eviction=_drain_flag(raw, "disableEviction", False, problems),
        delete_empty_dir_data=_drain_flag(raw, "deleteEmptyDirData", True, problems),
        force=_drain_flag(raw, "force", True, problems),
        ignore_daemon_sets=_drain_flag(raw, "ignoreDaemonSets", True, problems),
        timeout_seconds=_drain_duration(raw, "timeout", problems),
        grace_period_seconds=_drain_duration(raw, "gracePeriod", problems),
    )


def _parse_interrupt(raw: object, where: str, problems: list[str]) -> Interrupt | None:
    data = mapping(raw)
    kind = data.get("type")
    if kind not in INTERRUPT_TYPES:
        problems.append(f"{where}.type: {kind!r} is not one of {', '.join(INTERRUPT_TYPES)}")
        return None
    services = tuple(str(s) for s in data.get("services") or ())
    if kind == "service" and not services:
        problems.append(f"{where}.services: a service interrupt names services")
    return Interrupt(kind, services)


def dependency_cycle(packages: Mapping[str, Package]) -> list[str] | None:
    """A cycle among dependsOn edges (package names, first repeated), or None."""
    state: dict[str, int] = {}  # 1 visiting, 2 done
    stack: list[str] = []

    def visit(name: str) -> list[str] | None:
        state[name] = 1
        stack.append(name)
        for dependency, _ in packages[name].depends_on:
            if dependency not in packages:
                continue
            if state.get(dependency) == 1:
                return [*stack[stack.index(dependency) :], dependency]
            if dependency not in state and (found := visit(dependency)):
                return found
        stack.pop()
        state[name] = 2
        return None

    for name in sorted(packages):
        if name not in state and (found := visit(name)):
            return found
    return None


def parse_skyhook(obj: Obj) -> Skyhook:
    """A Skyhook or NodeWright (by its apiVersion; anything else is read as a Skyhook)."""
    metadata = meta(obj)
    names = flavor_of(str(obj.get("apiVersion") or ""), str(obj.get("kind") or "")) or SKYHOOK
    spec = mapping(obj.get("spec"))
    annotations = mapping(metadata.get("annotations"))
    problems: list[str] = []
    packages: dict[str, Package] = {}
    for name, raw in sorted(mapping(spec.get("packages")).items()):
        package = _parse_package(str(name), raw, problems)
        if package is not None:
            packages[package.name] = package
    for package in packages.values():
        for dependency, version in package.depends_on:
            other = packages.get(dependency)
            if other is None:
                problems.append(
                    f"spec.packages.{package.name}.dependsOn: {dependency!r} is not a package"
                )
            elif other.version != version:
                problems.append(
                    f"spec.packages.{package.name}.dependsOn: {dependency} {version} is not "
                    f"the version in this Skyhook ({other.version})"
                )
    if (cycle := dependency_cycle(packages)) is not None:
        problems.append(f"spec.packages: dependsOn cycle {' -> '.join(cycle)}")
    budget: Budget | None = None
    raw_budget = mapping(spec.get("interruptionBudget"))
    policy = str(spec.get("deploymentPolicy") or "")
    if any(raw_budget.get(k) is not None for k in ("percent", "count")):
        if policy:
            problems.append("spec: interruptionBudget and deploymentPolicy are mutually exclusive")
        budget = parse_budget(raw_budget, "spec.interruptionBudget", problems, low=0)
    priority = _int_field(spec, "priority", "spec", problems, low=1)
    sequencing = spec.get("sequencing") or "node"
    if sequencing not in ("node", "all"):
        problems.append(f"spec.sequencing: {sequencing!r} is not one of node, all")
        sequencing = "node"
    non_interrupt = (
        parse_label_selector(
            spec.get("podNonInterruptLabels"), "spec.podNonInterruptLabels", problems
        )
        if spec.get("podNonInterruptLabels")
        else None
    )
    return Skyhook(
        name=str(metadata.get("name") or ""),
        uid=str(metadata.get("uid") or ""),
        resource_version=str(metadata.get("resourceVersion") or ""),
        generation=int(metadata.get("generation") or 0),
        node_selector=parse_label_selector(
            spec.get("nodeSelectors"), "spec.nodeSelectors", problems
        ),
        packages=tuple(packages[n] for n in sorted(packages)),
        interruption_budget=budget,
        deployment_policy=policy,
        pod_non_interrupt_labels=non_interrupt,
        additional_tolerations=tuple(
            dict(mapping(t)) for t in spec.get("additionalTolerations") or ()
        ),
        priority=priority if priority is not None else DEFAULT_PRIORITY,
        serial=bool(spec.get("serial")),
        sequencing=sequencing,  # type: ignore[arg-type]
        paused=str(annotations.get(names.pause_annotation, "")).lower() == "true",
        runtime_required=spec.get("runtimeRequired") is True,
        auto_taint_new_nodes=spec.get("autoTaintNewNodes") is True,
        # upstream respects it only with runtimeRequired.
        runtime_required_cordon_after=spec.get("runtimeRequired") is True
        and spec.get("runtimeRequiredCordonAfter") is True,
        drain_config=parse_drain_config(spec.get("drainConfig"), problems),
        reset_batch_state_on_completion=_reset_option(spec),
        disabled=str(annotations.get(names.disable_annotation, "")).lower() == "true",
        problems=tuple(problems),
        status=dict(mapping(obj.get("status"))),
        finalizers=tuple(str(f) for f in metadata.get("finalizers") or ()),
        deleting=bool(metadata.get("deletionTimestamp")),
        names=names,
    )


def reconciled(skyhooks: Sequence[Skyhook]) -> list[Skyhook]:
    """The objects the controller works on: every Skyhook and NodeWright, but of a name both
    kinds hold only the NodeWright (upstream's renamed release keeps the legacy Skyhook beside
    it read-only, its status unwritten). A shadowed Skyhook being deleted stays, so its own
    marks (its group's keys, never the NodeWright's) are removed and its finalizer dropped."""
    renamed = {s.name for s in skyhooks if s.names == NODEWRIGHT}
    return [s for s in skyhooks if s.names == NODEWRIGHT or s.name not in renamed or s.deleting]


def _reset_option(spec: Obj) -> bool | None:
    """deploymentPolicyOptions.resetBatchStateOnCompletion; the CRD defaults it to true once
    deploymentPolicyOptions is given."""
    options = spec.get("deploymentPolicyOptions")
    if not isinstance(options, Mapping):
        return None
    value = options.get("resetBatchStateOnCompletion")
    return value if isinstance(value, bool) else True


# The policy name a Skyhook without a DeploymentPolicy rolls out under (upstream's metrics
# label it so), with a fixed strategy.
LEGACY_POLICY: Final = "legacy"


def policy_for(
    skyhook: Skyhook, policies: Mapping[str, DeploymentPolicy], targets: int = 0
) -> DeploymentPolicy | None:
    """The policy that shapes the Skyhook's rollout: its named policy, or upstream's legacy
    one built from its interruptionBudget over `targets` nodes (a fixed strategy whose batch
    is Budget.legacy_batch; 100% without a budget; no failureThreshold, so it never stops).
    None when the named policy does not exist."""
    if skyhook.deployment_policy:
        return policies.get(skyhook.deployment_policy)
    budget = skyhook.interruption_budget or Budget(percent=100)
    strategy = Strategy(kind="fixed", initial_batch=budget.legacy_batch(targets))
    return DeploymentPolicy(
        name=LEGACY_POLICY,
        default=Compartment(DEFAULT_COMPARTMENT, LabelSelector(), budget, strategy),
        reset_batch_state_on_completion=False,
    )


def resets_batch_state(skyhook: Skyhook, policy: DeploymentPolicy | None) -> bool:
    """upstream's ShouldResetBatchStateOnCompletion: the Skyhook's deploymentPolicyOptions
    first, then its DeploymentPolicy's setting; a Skyhook without either keeps its state."""
    if skyhook.reset_batch_state_on_completion is not None:
        return skyhook.reset_batch_state_on_completion
    if policy is None or not skyhook.deployment_policy:
        return False
    return policy.reset_batch_state_on_completion
