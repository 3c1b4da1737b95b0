"""Volume topology of a pod's PersistentVolumeClaims, as kube-scheduler's volume plugins decide
it for claims that are already bound.

- VolumeBinding: each claim a pod names must exist and not be deleting; a bound claim's
  PersistentVolume must exist, and its `spec.nodeAffinity.required` node selector terms
  (any term) must match the node; a bound volume without node affinity imposes nothing. An
  unbound claim is not bound here: one whose StorageClass binds at once (Immediate, or no
  class) waits for the volume controller; one of a WaitForFirstConsumer class is read as
  VolumeBinding reads it: only the node named by its `volume.kubernetes.io/selected-node`
  annotation when it has one, else the nodes its class's `allowedTopologies` admit when the
  class has a provisioner (the placer writes that annotation before binding the pod:
  planner.SelectNode), else (pre-made volumes only, which the placer does not bind) the pod is
  refused naming the claim and how many nodes an available volume that fits it reaches.
- VolumeZone: a bound PersistentVolume's zone and region labels (`topology.kubernetes.io/zone`,
  `/region`, and the legacy `failure-domain.beta.kubernetes.io/zone`, `/region`; a value may
  list several, `__`-separated) must each name the node's value of that label (a legacy key is
  read on the node under its GA name when the node lacks it); a node with none of the four
  labels takes any volume (a single-zone cluster), and a label whose value does not parse is
  ignored, as upstream's VolumeZone reads them.
- VolumeRestrictions: a ReadWriteOncePod claim is used by one pod at most: a pod naming one
  that another pod (charged to a node, bound or nominated) already uses is refused, and so is
  a gang two of whose members name the same one.

Generic ephemeral volumes are not read here: their claim is made only once the pod is placed
(interpod.unsupported_reason refuses such a pod). Pure: claims and volumes in, verdicts out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from nodeflow_kube.affinity import selector_terms_match
from nodeflow_kube.fields import mapping, meta, name_of, namespace_of, sequence, uid_of
from nodeflow_kube.quantity import QuantityError, parse_quantity

Obj = Mapping[str, Any]

READ_WRITE_ONCE_POD = "ReadWriteOncePod"

LEGACY_ZONE_LABEL = "failure-domain.beta.kubernetes.io/zone"
LEGACY_REGION_LABEL = "failure-domain.beta.kubernetes.io/region"
ZONE_LABEL = "topology.kubernetes.io/zone"
REGION_LABEL = "topology.kubernetes.io/region"
# In upstream's order (VolumeZone's topologyLabels).
ZONE_LABELS = (LEGACY_ZONE_LABEL, LEGACY_REGION_LABEL, ZONE_LABEL, REGION_LABEL)
_GA_NAME = {LEGACY_ZONE_LABEL: ZONE_LABEL, LEGACY_REGION_LABEL: REGION_LABEL}
# What separates the zones of a volume reachable from several (LabelMultiZoneDelimiter).
MULTI_ZONE_DELIMITER = "__"

WAIT_FOR_FIRST_CONSUMER = "WaitForFirstConsumer"
# The node a delayed-binding claim is provisioned for, written by kube-scheduler's PreBind.
SELECTED_NODE_ANNOTATION = "volume.kubernetes.io/selected-node"
# A class read before spec.storageClassName existed (GetPersistentVolumeClaimClass).
LEGACY_CLASS_ANNOTATION = "volume.beta.kubernetes.io/storage-class"
# A class with this provisioner only binds pre-made volumes (local volumes).
NO_PROVISIONER = "kubernetes.io/no-provisioner"


@dataclass(frozen=True)
class WaitingClaim:
    """An unbound claim of a WaitForFirstConsumer class: the nodes it could be bound for.

    A class with a provisioner makes the volume on the node named by the claim's selected-node
    annotation, so the claim admits the nodes of the class's allowedTopologies (the placer
    writes that annotation before it binds the pod, as VolumeBinding's PreBind does). A class
    without one only binds pre-made volumes, which the scheduler itself must bind (the PV
    controller leaves delayed claims to it): the claim admits the nodes an available volume
    that fits it reaches, for the refusal to say, as the placer binds no volume."""

    name: str
    # What a write of the annotation is conditioned on.
    uid: str = ""
    resource_version: str = ""
    # The node named by its selected-node annotation: only that one.
    selected_node: str = ""
    # Whether its class provisions volumes, and where (allowedTopologies: any term; none: any
    # node).
    provisioned: bool = False
    allowed_topologies: tuple[Obj, ...] = ()
    # The node affinity of each available volume that fits it (None: no affinity).
    static_volumes: tuple[tuple[Obj, ...] | None, ...] = ()

    def admits(self, node: Obj) -> bool:
        if self.selected_node:
            return name_of(node) == self.selected_node
        if self.provisioned:
            return not self.allowed_topologies or topology_terms_match(
                self.allowed_topologies, node
            )
        return any(
            terms is None or selector_terms_match(terms, node) for terms in self.static_volumes
        )


def topology_terms_match(terms: Sequence[Obj], node: Obj) -> bool:
    """A StorageClass's allowedTopologies: any term whose every matchLabelExpression names a
    label of the node with one of its values (MatchTopologySelectorTerms)."""
    labels = mapping(meta(node).get("labels"))
    return any(
        all(
            labels.get(str(expression.get("key"))) in sequence(expression.get("values"))
            for expression in map(mapping, sequence(term.get("matchLabelExpressions")))
        )
        for term in terms
    )


def claim_names(pod_spec: Obj) -> tuple[str, ...]:
    """The PersistentVolumeClaims a pod spec names in spec.volumes (not its generic ephemeral
    volumes), in order and each once."""
    names: dict[str, None] = {}
    for volume in map(mapping, sequence(pod_spec.get("volumes"))):
        claim = volume.get("persistentVolumeClaim")
        if claim is not None:
            names.setdefault(str(mapping(claim).get("claimName") or ""), None)
    return tuple(names)


@dataclass(frozen=True)
class VolumeNeeds:
    """What a pending pod's bound claims ask of a node and of other pods."""

    # Each bound PersistentVolume's required node selector terms: a node must match one term
    # of every one of them.
    node_selectors: tuple[tuple[Obj, ...], ...] = ()
    # The ReadWriteOncePod claims it names ("namespace/name").
    exclusive: tuple[str, ...] = ()
    # Each bound PersistentVolume's zone and region labels: (label, the values it allows).
    zones: tuple[tuple[str, frozenset[str]], ...] = ()
    # Its unbound claims of WaitForFirstConsumer classes.
    waiting: tuple[WaitingClaim, ...] = ()

    @property
    def key(self) -> str:
        """Tells pods with different volume needs apart (their usable nodes differ)."""
        return repr(
            (self.node_selectors, self.exclusive, sorted(map(repr, self.zones)), self.waiting)
        )

    def admit(self, node: Obj) -> bool:
        """Whether the node is one every volume can follow the pod to (or be made for)."""
        return (
            selectors_match(self.node_selectors, node)
            and zones_match(self.zones, node)
            and all(claim.admits(node) for claim in self.waiting)
        )


def selectors_match(selectors: Sequence[Sequence[Obj]], node: Obj) -> bool:
    """Whether the node matches a term of each PersistentVolume's required node selector
    (a selector with no terms matches no node, as kube-scheduler reads it)."""
    return all(selector_terms_match(terms, node) for terms in selectors)


def volume_zones(volume: Obj) -> tuple[tuple[str, frozenset[str]], ...]:
    """A PersistentVolume's zone and region labels, each with the values it allows; a value
    with an empty entry does not parse and is left out, as upstream ignores it."""
    labels = mapping(meta(volume).get("labels"))
    found: list[tuple[str, frozenset[str]]] = []
    for key in ZONE_LABELS:
        value = labels.get(key)
        if not isinstance(value, str):
            continue
        values = [part.strip() for part in value.split(MULTI_ZONE_DELIMITER)]
        if all(values):
            found.append((key, frozenset(values)))
    return tuple(found)


def zones_match(zones: Sequence[tuple[str, frozenset[str]]], node: Obj) -> bool:
    """VolumeZone's filter: a node with none of the zone labels takes every volume; else each
    volume label's key (or, for a legacy key the node lacks, its GA name) must be on the node
    with one of the values the volume allows."""
    if not zones:
        return True
    labels = mapping(meta(node).get("labels"))
    if not any(key in labels for key in ZONE_LABELS):
        return True
    for key, values in zones:
        value = labels.get(key)
        if value is None:
            value = labels.get(_GA_NAME.get(key, key))
        if value is None or value not in values:
            return False
    return True


class VolumeIndex:
    """The cluster's PersistentVolumeClaims by namespace and name, its PersistentVolumes by
    name; built only in a pass with a pending pod that names a claim."""

    def __init__(
        self, claims: Sequence[Obj], volumes: Sequence[Obj], classes: Sequence[Obj] = ()
    ) -> None:
        self.claims: dict[tuple[str, str], Obj] = {
            (namespace_of(claim), name_of(claim)): claim for claim in claims
        }
        self.volumes: dict[str, Obj] = {name_of(volume): volume for volume in volumes}
        self.classes: dict[str, Obj] = {name_of(each): each for each in classes}

    def needs(self, namespace: str, names: Sequence[str]) -> VolumeNeeds | str:
        """What the claims `names` of a pod in `namespace` ask, or why the pod cannot be
        placed now (naming the claim)."""
        selectors: list[tuple[Obj, ...]] = []
        exclusive: list[str] = []
        zones: list[tuple[str, frozenset[str]]] = []
        waiting: list[WaitingClaim] = []
        for name in names:
            claim = self.claims.get((namespace, name))
            if claim is None:
                return f"PersistentVolumeClaim {name} not found"
            if meta(claim).get("deletionTimestamp") is not None:
                return f"PersistentVolumeClaim {name} is being deleted"
            claim_spec = mapping(claim.get("spec"))
            volume_name = str(claim_spec.get("volumeName") or "")
            if not volume_name:
                delayed = self._waiting(namespace, name, claim)
                if isinstance(delayed, str):
                    return delayed
                waiting.append(delayed)
                if READ_WRITE_ONCE_POD in sequence(claim_spec.get("accessModes")):
                    exclusive.append(f"{namespace}/{name}")
                continue
            volume = self.volumes.get(volume_name)
            if volume is None:
                return (
                    f"PersistentVolumeClaim {name} is bound to PersistentVolume {volume_name}, "
                    "which does not exist"
                )
            if not _claimed_by(volume, namespace, claim):
                return (
                    f"PersistentVolumeClaim {name}: PersistentVolume {volume_name} is bound to "
                    "another claim"
                )
            affinity = mapping(mapping(volume.get("spec")).get("nodeAffinity"))
            required = affinity.get("required")
            if required is not None:
                selectors.append(
                    tuple(map(mapping, sequence(mapping(required).get("nodeSelectorTerms"))))
                )
            zones.extend(volume_zones(volume))
            if READ_WRITE_ONCE_POD in sequence(claim_spec.get("accessModes")):
                exclusive.append(f"{namespace}/{name}")
        return VolumeNeeds(tuple(selectors), tuple(exclusive), tuple(zones), tuple(waiting))

    def _waiting(self, namespace: str, name: str, claim: Obj) -> WaitingClaim | str:
        """An unbound claim as VolumeBinding reads it: of a WaitForFirstConsumer class, the
        nodes it could be bound for; else why the pod waits (naming the claim)."""
        phase = mapping(claim.get("status")).get("phase") or "Pending"
        class_name = claim_class(claim)
        if not class_name:
            return (
                f"PersistentVolumeClaim {name} is not bound (phase {phase}) and names no "
                "StorageClass: it waits for the volume controller to bind it"
            )
        storage_class = self.classes.get(class_name)
        if storage_class is None:
            return (
                f"PersistentVolumeClaim {name} is not bound (phase {phase}): its StorageClass "
                f"{class_name} does not exist"
            )
        if storage_class.get("volumeBindingMode") != WAIT_FOR_FIRST_CONSUMER:
            return (
                f"PersistentVolumeClaim {name} is not bound (phase {phase}): its StorageClass "
                f"{class_name} binds it at once (Immediate), so it waits for the volume "
                "controller to bind it"
            )
        selected = str(mapping(meta(claim).get("annotations")).get(SELECTED_NODE_ANNOTATION) or "")
        return WaitingClaim(
            name=name,
            uid=uid_of(claim),
            resource_version=str(meta(claim).get("resourceVersion") or ""),
            selected_node=selected,
            provisioned=storage_class.get("provisioner") != NO_PROVISIONER,
            allowed_topologies=tuple(
                map(mapping, sequence(storage_class.get("allowedTopologies")))
            ),
            static_volumes=tuple(
                _required_terms(volume)
                for volume in self.volumes.values()
                if _fits(volume, namespace, claim, class_name)
            ),
        )


def claim_class(claim: Obj) -> str:
    """A claim's StorageClass: the legacy annotation, else spec.storageClassName."""
    legacy = mapping(meta(claim).get("annotations")).get(LEGACY_CLASS_ANNOTATION)
    if legacy:
        return str(legacy)
    return str(mapping(claim.get("spec")).get("storageClassName") or "")


def _required_terms(volume: Obj) -> tuple[Obj, ...] | None:
    """A volume's required node selector terms; None when it has no node affinity."""
    required = mapping(mapping(volume.get("spec")).get("nodeAffinity")).get("required")
    if required is None:
        return None
    return tuple(map(mapping, sequence(mapping(required).get("nodeSelectorTerms"))))


def _storage(obj: Obj) -> Fraction | None:
    try:
        return parse_quantity(obj.get("storage"))
    except QuantityError:
        return None


def _fits(volume: Obj, namespace: str, claim: Obj, class_name: str) -> bool:
    """An available PersistentVolume the PV controller could bind the claim to
    (FindMatchingVolume): of the claim's class, not claimed by another claim, not released or
    failed, offering every access mode the claim asks and at least the storage it requests."""
    volume_spec = mapping(volume.get("spec"))
    if str(volume_spec.get("storageClassName") or "") != class_name:
        return False
    if mapping(volume.get("status")).get("phase") in ("Released", "Failed"):
        return False
    if meta(volume).get("deletionTimestamp") is not None:
        return False
    if mapping(volume_spec.get("claimRef")) and not _claimed_by(volume, namespace, claim):
        return False
    claim_spec = mapping(claim.get("spec"))
    offered = set(sequence(volume_spec.get("accessModes")))
    if not set(sequence(claim_spec.get("accessModes"))) <= offered:
        return False
    wanted = _storage(mapping(mapping(claim_spec.get("resources")).get("requests")))
    capacity = _storage(mapping(volume_spec.get("capacity")))
    return wanted is None or (capacity is not None and capacity >= wanted)


def _claimed_by(volume: Obj, namespace: str, claim: Obj) -> bool:
    """A volume's claimRef names the claim (by uid when both have one), as the PV controller
    binds them; a volume with no claimRef yet is still being bound to it."""
    ref = mapping(mapping(volume.get("spec")).get("claimRef"))
    if not ref:
        return True
    if ref.get("namespace") != namespace or ref.get("name") != name_of(claim):
        return False
    uid = uid_of(claim)
    return not (ref.get("uid") and uid) or ref.get("uid") == uid


# --- what the placer keeps of them (its KV views' projections) -----------------------------

_KEPT_METADATA = ("name", "namespace", "uid", "resourceVersion", "deletionTimestamp")


def _kept_metadata(obj: Obj) -> dict[str, Any]:
    metadata = meta(obj)
    return {key: metadata[key] for key in _KEPT_METADATA if key in metadata}


def claim_fields(claim: dict[str, Any]) -> dict[str, Any]:
    """A PersistentVolumeClaim as the placer keeps it: its name, uid and deletion, the
    annotations binding reads (its selected node, a legacy class), the volume it is bound to,
    its class, access modes and storage request, and its phase."""
    claim_spec = mapping(claim.get("spec"))
    metadata = _kept_metadata(claim)
    annotations = mapping(meta(claim).get("annotations"))
    kept_annotations = {
        key: annotations[key]
        for key in (SELECTED_NODE_ANNOTATION, LEGACY_CLASS_ANNOTATION)
        if key in annotations
    }
    if kept_annotations:
        metadata["annotations"] = kept_annotations
    spec: dict[str, Any] = {
        key: claim_spec[key]
        for key in ("volumeName", "storageClassName", "accessModes")
        if key in claim_spec
    }
    storage = mapping(mapping(claim_spec.get("resources")).get("requests")).get("storage")
    if storage is not None:
        spec["resources"] = {"requests": {"storage": storage}}
    return {
        "metadata": metadata,
        "spec": spec,
        "status": {"phase": mapping(claim.get("status")).get("phase")},
    }


def volume_fields(volume: dict[str, Any]) -> dict[str, Any]:
    """A PersistentVolume as the placer keeps it: its name, zone and region labels, node
    affinity, the claim it is bound to, its class, access modes and storage capacity (what a
    WaitForFirstConsumer claim may be bound to) and its phase (not its source or mount
    options)."""
    volume_spec = mapping(volume.get("spec"))
    metadata = _kept_metadata(volume)
    labels = mapping(meta(volume).get("labels"))
    zone_labels = {key: labels[key] for key in ZONE_LABELS if key in labels}
    if zone_labels:
        metadata["labels"] = zone_labels
    spec: dict[str, Any] = {
        key: volume_spec[key]
        for key in ("nodeAffinity", "claimRef", "storageClassName", "accessModes")
        if key in volume_spec
    }
    storage = mapping(volume_spec.get("capacity")).get("storage")
    if storage is not None:
        spec["capacity"] = {"storage": storage}
    return {
        "metadata": metadata,
        "spec": spec,
        "status": {"phase": mapping(volume.get("status")).get("phase")},
    }


def storage_class_fields(storage_class: dict[str, Any]) -> dict[str, Any]:
    """A StorageClass as the placer keeps it: its name, binding mode, provisioner and allowed
    topologies (not its parameters or mount options)."""
    kept: dict[str, Any] = {"metadata": _kept_metadata(storage_class)}
    for key in ("volumeBindingMode", "provisioner", "allowedTopologies"):
        if key in storage_class:
            kept[key] = storage_class[key]
    return kept
