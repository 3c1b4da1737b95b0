"""PodGroups and Koordinator's gang annotations, read into typed specs.

A PodGroup (`scheduling.sigs.k8s.io/v1alpha1`) names its members through the pod label
`pod-group.scheduling.sigs.k8s.io`; annotations `gang.scheduling.koordinator.sh/*` on the
PodGroup refine it (GangGroup membership, mode, waiting time, match policy, topology
gather strategy). A value that does not parse is an error with the key and the value in its
message, never a silent default: the gang is then reported unschedulable with that message.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from nodeflow_contracts.durations import go_duration_seconds
from nodeflow_kube import QuantityError, ResourceList, fields, parse_resources

Obj = Mapping[str, Any]

POD_GROUP_LABEL = "pod-group.scheduling.sigs.k8s.io"
# The lightweight-coscheduling labels scheduler-plugins once used, deprecated upstream but still
# read by Koordinator: the gang's name (after POD_GROUP_LABEL, before the `name` annotation) and
# its minimum (before the `min-available` annotation) for a gang declared by its pods.
DEPRECATED_NAME_LABEL = "pod-group.scheduling.sigs.k8s.io/name"
DEPRECATED_MIN_AVAILABLE_LABEL = "pod-group.scheduling.sigs.k8s.io/min-available"
GANG_PREFIX = "gang.scheduling.koordinator.sh/"
# A gang declared on its pods alone (no PodGroup object): the pods' annotations carry it.
NAME = GANG_PREFIX + "name"
GROUPS = GANG_PREFIX + "groups"
MODE = GANG_PREFIX + "mode"
WAITING_TIME = GANG_PREFIX + "waiting-time"
MATCH_POLICY = GANG_PREFIX + "match-policy"
MATCH_POLICY_ALIAS = "pod-group.scheduling.sigs.k8s.io/match-policy"
MIN_AVAILABLE = GANG_PREFIX + "min-available"
TOTAL_NUMBER = GANG_PREFIX + "total-number"
NETWORK_TOPOLOGY_SPEC = GANG_PREFIX + "network-topology-spec"
NETWORK_TOPOLOGY_INDEX = GANG_PREFIX + "network-topology-index"
# Pods of one job carry the same value: where they already run counts, as the gang's own bound
# members do, when the gather breaks ties between domains.
NETWORK_TOPOLOGY_SELECTOR = "scheduling.koordinator.sh/network-topology-selector"

DEFAULT_WAITING_SECONDS = 600.0

GangMode = Literal["Strict", "NonStrict"]
MatchPolicy = Literal["only-waiting", "waiting-and-running", "once-satisfied"]
GatherStrategy = Literal["MustGather", "PreferGather"]

_MODES: tuple[GangMode, ...] = ("Strict", "NonStrict")
_MATCH_POLICIES: tuple[MatchPolicy, ...] = ("only-waiting", "waiting-and-running", "once-satisfied")
_STRATEGIES: tuple[GatherStrategy, ...] = ("MustGather", "PreferGather")
# Go's time.ParseDuration units, in seconds.
_INTEGER = re.compile(r"\s*[+-]?[0-9]+\s*")
_NAME_PARTS = re.compile(r"[0-9]+|[^0-9]+")


_Option = TypeVar("_Option", bound=str)


class GangSpecError(ValueError):
    """A PodGroup or a member pod carries a value the placer cannot read."""


@dataclass(frozen=True)
class GatherRule:
    layer: str
    strategy: GatherStrategy
    # Offer slots of a domain of this layer are floored to a multiple of this.
    pod_count_multiple: int = 1


@dataclass(frozen=True, order=True)
class GroupKey:
    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class PodGroupSpec:
    key: GroupKey
    uid: str
    min_member: int
    total_number: int
    min_resources: ResourceList
    mode: GangMode
    waiting_seconds: float
    match_policy: MatchPolicy
    # Every PodGroup of the GangGroup, this one included, sorted.
    gang_group: tuple[GroupKey, ...]
    gather: tuple[GatherRule, ...]


def _annotations(obj: Obj) -> Mapping[str, Any]:
    metadata = obj.get("metadata")
    annotations = metadata.get("annotations") if isinstance(metadata, Mapping) else None
    return annotations if isinstance(annotations, Mapping) else {}


def parse_int(value: object, *, key: str, minimum: int) -> int:
    """An integer field or annotation (annotations are strings), at least `minimum`."""
    if isinstance(value, bool):
        raise GangSpecError(f"{key}: {value!r} is not an integer")
    if isinstance(value, int):
        number = value
    elif isinstance(value, str) and _INTEGER.fullmatch(value):
        number = int(value)
    else:
        raise GangSpecError(f"{key}: {value!r} is not an integer")
    if number < minimum:
        raise GangSpecError(f"{key}: {number} is below the minimum {minimum}")
    return number


def parse_group_list(raw: str, own: GroupKey) -> tuple[GroupKey, ...]:
    """The `groups` annotation: a JSON list of "namespace/name"; the group itself is always a
    member, even when the list forgets it."""
    try:
        decoded = json.loads(raw)
    except json.JSONDecodeError as error:
        raise GangSpecError(f"{GROUPS}: not JSON ({error.msg}): {raw!r}") from None
    if not isinstance(decoded, list):
        raise GangSpecError(f'{GROUPS}: expected a JSON list of "namespace/name", got {raw!r}')
    keys = {own}
    for entry in decoded:
        if not isinstance(entry, str) or entry.count("/") != 1 or "" in entry.split("/"):
            raise GangSpecError(f'{GROUPS}: {entry!r} is not "namespace/name"')
        namespace, name = entry.split("/")
        keys.add(GroupKey(namespace, name))
    return tuple(sorted(keys, key=str))


def parse_gather_spec(raw: str) -> tuple[GatherRule, ...]:
    """`network-topology-spec`: {"gatherStrategy": [{"layer", "strategy", "podCountMultiple"}]}."""
    try:
        decoded = json.loads(raw)
    except json.JSONDecodeError as error:
        raise GangSpecError(f"{NETWORK_TOPOLOGY_SPEC}: not JSON ({error.msg})") from None
    if not isinstance(decoded, Mapping):
        raise GangSpecError(f"{NETWORK_TOPOLOGY_SPEC}: expected an object with gatherStrategy")
    entries = decoded.get("gatherStrategy", [])
    if not isinstance(entries, list):
        raise GangSpecError(f"{NETWORK_TOPOLOGY_SPEC}: gatherStrategy must be a list")
    rules: list[GatherRule] = []
    for entry in entries:
        if not isinstance(entry, Mapping):
            raise GangSpecError(f"{NETWORK_TOPOLOGY_SPEC}: {entry!r} is not an object")
        layer = entry.get("layer")
        if not isinstance(layer, str) or not layer:
            raise GangSpecError(f"{NETWORK_TOPOLOGY_SPEC}: a rule has no layer: {entry!r}")
        strategy = entry.get("strategy")
        if strategy not in _STRATEGIES:
            raise GangSpecError(
                f"{NETWORK_TOPOLOGY_SPEC}: strategy {strategy!r} of layer {layer} is not "
                "MustGather or PreferGather"
            )
        multiple = parse_int(
            entry.get("podCountMultiple", 1),
            key=f"{NETWORK_TOPOLOGY_SPEC} podCountMultiple of {layer}",
            minimum=1,
        )
        rules.append(GatherRule(layer=layer, strategy=strategy, pod_count_multiple=multiple))
    return tuple(rules)


def _choice(value: object, key: str, allowed: Sequence[_Option], default: _Option) -> _Option:
    if value is None:
        return default
    for option in allowed:
        if value == option:
            return option
    raise GangSpecError(f"{key}: {value!r} is not one of {', '.join(allowed)}")


def parse_pod_group(pod_group: Obj) -> PodGroupSpec:
    """A PodGroup object as a spec; raises GangSpecError naming the bad key and value."""
    metadata = pod_group.get("metadata")
    metadata = metadata if isinstance(metadata, Mapping) else {}
    key = GroupKey(str(metadata.get("namespace") or ""), str(metadata.get("name") or ""))
    spec = pod_group.get("spec")
    spec = spec if isinstance(spec, Mapping) else {}
    annotations = _annotations(pod_group)

    # minMember 0 is legal upstream (the PodGroup CRD's default): no gang check, each pod is
    # placed as room appears. A gang declared by its pods still needs a positive minimum.
    if spec.get("minMember") is not None:
        min_member = parse_int(spec["minMember"], key="spec.minMember", minimum=0)
    elif annotations.get(MIN_AVAILABLE) is not None:
        min_member = parse_int(annotations[MIN_AVAILABLE], key=MIN_AVAILABLE, minimum=1)
    else:
        raise GangSpecError(f"spec.minMember (or the annotation {MIN_AVAILABLE}) is required")
    total_number = min_member
    if annotations.get(TOTAL_NUMBER) is not None:
        # total-number below min-available reads as min-available (the anchor's floor).
        total_number = max(
            min_member, parse_int(annotations[TOTAL_NUMBER], key=TOTAL_NUMBER, minimum=0)
        )
    try:
        min_resources = parse_resources(spec.get("minResources") or {})
    except QuantityError as error:
        raise GangSpecError(f"spec.minResources: {error}") from None

    waiting_seconds = DEFAULT_WAITING_SECONDS
    if spec.get("scheduleTimeoutSeconds") is not None:
        # 0 (or below) falls back to the default wait, as Koordinator's GetWaitTimeDuration.
        timeout = parse_int(
            spec["scheduleTimeoutSeconds"], key="spec.scheduleTimeoutSeconds", minimum=-(2**31)
        )
        if timeout > 0:
            waiting_seconds = float(timeout)
    elif annotations.get(WAITING_TIME) is not None:
        try:
            waiting_seconds = go_duration_seconds(str(annotations[WAITING_TIME]))
        except ValueError as error:
            raise GangSpecError(f"{WAITING_TIME}: {error}") from None
        if waiting_seconds <= 0:
            raise GangSpecError(f"{WAITING_TIME}: {annotations[WAITING_TIME]!r} is not positive")

    mode = _choice(annotations.get(MODE), MODE, _MODES, "Strict")
    policy_raw = annotations.get(MATCH_POLICY, annotations.get(MATCH_POLICY_ALIAS))
    match_policy = _choice(policy_raw, MATCH_POLICY, _MATCH_POLICIES, "once-satisfied")
    groups_raw = annotations.get(GROUPS)
    gang_group = (key,) if groups_raw is None else parse_group_list(str(groups_raw), key)
    gather_raw = annotations.get(NETWORK_TOPOLOGY_SPEC)
    gather = () if gather_raw is None else parse_gather_spec(str(gather_raw))
    return PodGroupSpec(
        key=key,
        uid=str(metadata.get("uid") or ""),
        min_member=min_member,
        total_number=total_number,
        min_resources=min_resources,
        mode=mode,
        waiting_seconds=waiting_seconds,
        match_policy=match_policy,
        gang_group=gang_group,
        gather=gather,
    )


def pod_group_of(pod: Obj) -> GroupKey | None:
    """The gang a pod belongs to, read as Koordinator's GetGangName: the membership label,
    else the deprecated `pod-group.scheduling.sigs.k8s.io/name` label, else the
    `gang.scheduling.koordinator.sh/name` annotation."""
    # fields.mapping: the exact dict check first, as every pass asks this of every pod.
    metadata = fields.mapping(pod.get("metadata"))
    labels = fields.mapping(metadata.get("labels"))
    name = labels.get(POD_GROUP_LABEL) or labels.get(DEPRECATED_NAME_LABEL)
    if not name:
        name = fields.mapping(metadata.get("annotations")).get(NAME)
    if not name:
        return None
    return GroupKey(str(metadata.get("namespace") or ""), str(name))


def _labels(obj: Obj) -> Mapping[str, Any]:
    metadata = obj.get("metadata")
    labels = metadata.get("labels") if isinstance(metadata, Mapping) else None
    return labels if isinstance(labels, Mapping) else {}


def is_annotation_gang_member(pod: Obj) -> bool:
    """A pod whose gang is declared by the pod itself (the `name` annotation or the deprecated
    name label) rather than by the PodGroup membership label. Such a gang is read from its
    pods when no PodGroup of that name exists."""
    labels = _labels(pod)
    if labels.get(POD_GROUP_LABEL):
        return False
    return bool(labels.get(DEPRECATED_NAME_LABEL) or _annotations(pod).get(NAME))


def annotation_gang_object(pod: Obj) -> dict[str, Any]:
    """The PodGroup a gang declared by its pods stands for, read from one member: its
    annotations, with the deprecated `min-available` label winning over the annotation, as
    Koordinator's GetGangMinNumFromPod (one of the two is required)."""
    metadata = pod.get("metadata")
    metadata = metadata if isinstance(metadata, Mapping) else {}
    annotations = dict(_annotations(pod))
    labels = _labels(pod)
    if labels.get(DEPRECATED_MIN_AVAILABLE_LABEL):
        annotations[MIN_AVAILABLE] = labels[DEPRECATED_MIN_AVAILABLE_LABEL]
    key = pod_group_of(pod)
    return {
        "metadata": {
            "name": key.name if key is not None else "",
            "namespace": str(metadata.get("namespace") or ""),
            "annotations": annotations,
        },
        "spec": {},
    }


def topology_index(pod: Obj) -> int | None:
    """The pod's rank (`network-topology-index`), None when it has none."""
    raw = _annotations(pod).get(NETWORK_TOPOLOGY_INDEX)
    if raw is None:
        return None
    return parse_int(raw, key=f"{NETWORK_TOPOLOGY_INDEX} of a pod", minimum=0)


def natural_key(name: str) -> tuple[tuple[int, int | str], ...]:
    """Sorts "pod-2" before "pod-10" (digits compare as numbers)."""
    return tuple(
        (0, int(part)) if part.isdigit() else (1, part) for part in _NAME_PARTS.findall(name)
    )


RankKey = tuple[int, int, tuple[tuple[int, int | str], ...]]


def rank_key(index: int | None, name: str) -> RankKey:
    """Rank order: indexed pods by index, then unindexed pods, each by name in natural order."""
    return (0 if index is not None else 1, index or 0, natural_key(name))
