"""Facts about raw pods that every placement phase reads."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

Obj = Mapping[str, Any]

TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})
POD_SCHEDULED = "PodScheduled"
DISRUPTION_TARGET = "DisruptionTarget"


def _mapping(value: object) -> Obj:
    # Objects decoded from JSON are dicts; the dict check is much cheaper than the ABC's.
    if type(value) is dict:
        return value
    return value if isinstance(value, Mapping) else {}


def metadata(obj: Obj) -> Obj:
    return _mapping(obj.get("metadata"))


def spec(obj: Obj) -> Obj:
    return _mapping(obj.get("spec"))


def status(obj: Obj) -> Obj:
    return _mapping(obj.get("status"))


def name_of(obj: Obj) -> str:
    return str(metadata(obj).get("name") or "")


def namespace_of(obj: Obj) -> str:
    return str(metadata(obj).get("namespace") or "")


def uid_of(obj: Obj) -> str:
    return str(metadata(obj).get("uid") or "")


def resource_version_of(obj: Obj) -> str:
    return str(metadata(obj).get("resourceVersion") or "")


def labels_of(obj: Obj) -> Obj:
    return _mapping(metadata(obj).get("labels"))


def node_name_of(pod: Obj) -> str:
    return str(spec(pod).get("nodeName") or "")


def nominated_node_of(pod: Obj) -> str:
    return str(status(pod).get("nominatedNodeName") or "")


def phase_of(pod: Obj) -> str:
    return str(status(pod).get("phase") or "Pending")


def is_terminal(pod: Obj) -> bool:
    return phase_of(pod) in TERMINAL_PHASES


def is_deleting(obj: Obj) -> bool:
    return metadata(obj).get("deletionTimestamp") is not None


def priority_of(pod: Obj) -> int:
    raw = spec(pod).get("priority")
    return raw if isinstance(raw, int) and not isinstance(raw, bool) else 0


def scheduler_of(pod: Obj) -> str:
    return str(spec(pod).get("schedulerName") or "default-scheduler")


def is_pending(pod: Obj) -> bool:
    """Waiting for a node: not bound, not finished, not being deleted."""
    return not node_name_of(pod) and not is_terminal(pod) and not is_deleting(pod)


def occupies_node(pod: Obj) -> bool:
    """Charged to its node: bound and not finished (a terminating pod still holds its
    resources until it is gone, as in kube-scheduler)."""
    return bool(node_name_of(pod)) and not is_terminal(pod)


def condition(pod: Obj, kind: str) -> Obj | None:
    for entry in status(pod).get("conditions") or []:
        if isinstance(entry, Mapping) and entry.get("type") == kind:
            return entry
    return None


def owner_name(pod: Obj) -> str:
    """The controller that owns the pod (its job), or the pod itself."""
    for owner in metadata(pod).get("ownerReferences") or []:
        if isinstance(owner, Mapping) and owner.get("name"):
            return str(owner["name"])
    return name_of(pod)


def parse_time(raw: object) -> float | None:
    if not isinstance(raw, str) or not raw:
        return None
    try:
        return datetime.fromisoformat(raw.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def rfc3339(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def created_at(obj: Obj) -> float | None:
    return parse_time(metadata(obj).get("creationTimestamp"))


@dataclass(frozen=True)
class PodRef:
    namespace: str
    name: str
    uid: str
    resource_version: str

    @property
    def display(self) -> str:
        return f"{self.namespace}/{self.name}"


def ref_of(obj: Obj) -> PodRef:
    return PodRef(namespace_of(obj), name_of(obj), uid_of(obj), resource_version_of(obj))
