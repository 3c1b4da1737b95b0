"""Volume topology of a pod's PersistentVolumeClaims, as kube-scheduler's volume plugins decide
it for claims that are already bound.

- VolumeBinding: each claim a pod names must exist and not be deleting; a bound claim's
  PersistentVolume must exist, and its `spec.nodeAffinity.required` node selector terms
  (any term) must match the node; a bound volume without node affinity imposes nothing. An
  unbound claim (Immediate or WaitForFirstConsumer) is not bound here: the placer does not
  provision nor bind volumes, so the pod is refused (it waits) naming the claim.
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
from typing import Any

from nodeflow_kube.affinity import selector_terms_match
from nodeflow_kube.fields import mapping, meta, name_of, namespace_of, sequence, uid_of

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

    @property
    def key(self) -> str:
        """Tells pods with different volume needs apart (their usable nodes differ)."""
        return repr((self.node_selectors, self.exclusive, sorted(map(repr, self.zones))))

    def admit(self, node: Obj) -> bool:
        """Whether the node is one every bound volume can follow the pod to."""
        return selectors_match(self.node_selectors, node) and zones_match(self.zones, node)


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

    def __init__(self, claims: Sequence[Obj], volumes: Sequence[Obj]) -> None:
        self.claims: dict[tuple[str, str], Obj] = {
            (namespace_of(claim), name_of(claim)): claim for claim in claims
        }
        self.volumes: dict[str, Obj] = {name_of(volume): volume for volume in volumes}

    def needs(self, namespace: str, names: Sequence[str]) -> VolumeNeeds | str:
        """What the claims `names` of a pod in `namespace` ask, or why the pod cannot be
        placed now (naming the claim)."""
        selectors: list[tuple[Obj, ...]] = []
        exclusive: list[str] = []
        zones: list[tuple[str, frozenset[str]]] = []
        for name in names:
            claim = self.claims.get((namespace, name))
            if claim is None:
                return f"PersistentVolumeClaim {name} not found"
            if meta(claim).get("deletionTimestamp") is not None:
                return f"PersistentVolumeClaim {name} is being deleted"
            claim_spec = mapping(claim.get("spec"))
            volume_name = str(claim_spec.get("volumeName") or "")
            if not volume_name:
                phase = mapping(claim.get("status")).get("phase") or "Pending"
                return (
                    f"PersistentVolumeClaim {name} is not bound (phase {phase}); the topology "
                    "placer does not bind volumes (WaitForFirstConsumer)"
                )
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
        return VolumeNeeds(tuple(selectors), tuple(exclusive), tuple(zones))


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
    volume it is bound to, its access modes and its phase."""
    claim_spec = mapping(claim.get("spec"))
    return {
        "metadata": _kept_metadata(claim),
        "spec": {
            key: claim_spec[key]
            for key in ("volumeName", "storageClassName", "accessModes")
            if key in claim_spec
        },
        "status": {"phase": mapping(claim.get("status")).get("phase")},
    }


def volume_fields(volume: dict[str, Any]) -> dict[str, Any]:
    """A PersistentVolume as the placer keeps it: its name, zone and region labels, node
    affinity, the claim it is bound to and its phase (not its source, capacity or mount
    options)."""
    volume_spec = mapping(volume.get("spec"))
    metadata = _kept_metadata(volume)
    labels = mapping(meta(volume).get("labels"))
    zone_labels = {key: labels[key] for key in ZONE_LABELS if key in labels}
    if zone_labels:
        metadata["labels"] = zone_labels
    return {
        "metadata": metadata,
        "spec": {
            key: volume_spec[key] for key in ("nodeAffinity", "claimRef") if key in volume_spec
        },
        "status": {"phase": mapping(volume.get("status")).get("phase")},
    }
