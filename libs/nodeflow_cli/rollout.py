"""`kubectl nodeflow rollout history|undo nodeset NAME` (pure): a NodeSet's revision history
and the patch that puts an earlier template back, as `kubectl rollout` does for a DaemonSet.

nodeset-controller keeps one apps/v1 ControllerRevision per template (named
`<nodeset>-<controller-revision-hash>`, labelled `nodeflow.dev/nodeset`, owned by the
NodeSet, `data.spec.template` the template). `undo` without `--to-revision` goes back to the
revision before the newest, as kubectl does; the patch replaces `.spec.template` whole and
carries the NodeSet's resourceVersion, so a change made since the history was read is not
overwritten. The controller then rolls the pods back and makes that revision the newest
instead of making a duplicate.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from nodeflow_contracts.pod_protocol import NODESET_LABEL, REVISION_LABEL

Obj = Mapping[str, Any]

# Where the revisions of a namespace are, and how the NodeSet's are selected.
REVISIONS_PATH = "/apis/apps/v1/namespaces/{ns}/controllerrevisions"


class RolloutError(Exception):
    """The history cannot answer (no such revision, nothing to roll back to)."""


def revisions_query(nodeset_name: str) -> str:
    return f"labelSelector={NODESET_LABEL}%3D{nodeset_name}"


def _meta(obj: Obj) -> Obj:
    found = obj.get("metadata")
    return found if isinstance(found, Mapping) else {}


def _number(revision: Obj) -> int:
    number = revision.get("revision")
    return number if isinstance(number, int) and not isinstance(number, bool) else 0


def _template(revision: Obj) -> Obj | None:
    data = revision.get("data")
    spec = data.get("spec") if isinstance(data, Mapping) else None
    template = spec.get("template") if isinstance(spec, Mapping) else None
    return template if isinstance(template, Mapping) else None


def owned_history(nodeset: Obj, revisions: Iterable[Obj]) -> list[Obj]:
    """The NodeSet's revisions (controlled by its uid), oldest first."""
    uid = _meta(nodeset).get("uid")
    ours = [
        r
        for r in revisions
        if any(
            isinstance(ref, Mapping) and ref.get("uid") == uid and ref.get("controller") is True
            for ref in _meta(r).get("ownerReferences") or ()
        )
    ]
    return sorted(ours, key=lambda r: (_number(r), str(_meta(r).get("name") or "")))


def _images(template: Obj | None) -> str:
    spec = template.get("spec") if isinstance(template, Mapping) else None
    containers = spec.get("containers") if isinstance(spec, Mapping) else None
    images = [
        f"{c.get('name', '?')}={c.get('image', '?')}"
        for c in containers or ()
        if isinstance(c, Mapping)
    ]
    return ",".join(images) or "<none>"


def format_history(nodeset: Obj, history: Sequence[Obj], revision: int = 0) -> str:
    """kubectl's table (REVISION, and here the ControllerRevision, its hash and images), the
    update (template) and current (pods) revisions marked from the NodeSet's status; with
    `revision`, that revision's template in full."""
    meta = _meta(nodeset)
    title = f"nodeset.nodeflow.dev/{meta.get('name')}"
    if revision:
        chosen = by_number(history, revision)
        lines = [f"{title} with revision #{revision}", "Pod Template:"]
        lines.extend(f"  {line}" for line in _yaml_lines(_template(chosen) or {}))
        return "\n".join(lines)
    status = nodeset.get("status")
    status = status if isinstance(status, Mapping) else {}
    rows = [("REVISION", "CONTROLLER-REVISION", "HASH", "IMAGES", "")]
    for entry in history:
        name = str(_meta(entry).get("name") or "")
        marks = [
            word
            for word, field in (("update", "updateRevision"), ("current", "currentRevision"))
            if status.get(field) == name
        ]
        labels = _meta(entry).get("labels") or {}
        rows.append(
            (
                str(_number(entry)),
                name,
                str(labels.get(REVISION_LABEL, "")),
                _images(_template(entry)),
                ",".join(marks),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    table = [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]
    return "\n".join([title, *table])


def _yaml_lines(value: Any, indent: str = "") -> list[str]:
    """A small YAML-like rendering for reading (not for applying)."""
    lines: list[str] = []
    if isinstance(value, Mapping):
        for key, item in value.items():
            if isinstance(item, Mapping | list) and item:
                lines.append(f"{indent}{key}:")
                lines.extend(_yaml_lines(item, indent + "  "))
            else:
                lines.append(f"{indent}{key}: {item}")
    elif isinstance(value, list):
        for item in value:
            sub = _yaml_lines(item, indent + "  ")
            if sub:
                lines.append(f"{indent}- {sub[0].strip()}")
                lines.extend(sub[1:])
    else:
        lines.append(f"{indent}{value}")
    return lines


def by_number(history: Sequence[Obj], revision: int) -> Obj:
    for entry in history:
        if _number(entry) == revision:
            return entry
    raise RolloutError(f"unable to find the specified revision {revision}")


@dataclass(frozen=True)
class Undo:
    """The rollback: the revision gone back to and the JSON patch of the NodeSet (None: the
    template already is that revision's, nothing to do)."""

    revision: int
    patch: list[dict[str, Any]] | None


def plan_undo(nodeset: Obj, history: Sequence[Obj], to_revision: int = 0) -> Undo:
    """`to_revision` 0: the revision before the newest (kubectl's default)."""
    if to_revision:
        chosen = by_number(history, to_revision)
    else:
        if len(history) < 2:
            raise RolloutError("no rollout history found: there is no earlier revision")
        chosen = history[-2]
    template = _template(chosen)
    if template is None:
        raise RolloutError(f"revision {_number(chosen)} holds no template")
    spec = nodeset.get("spec")
    current = spec.get("template") if isinstance(spec, Mapping) else None
    if current == template:
        return Undo(_number(chosen), None)
    patch: list[dict[str, Any]] = [
        # Refused (409/422) if the NodeSet changed since it was read.
        {
            "op": "test",
            "path": "/metadata/resourceVersion",
            "value": _meta(nodeset).get("resourceVersion"),
        },
        {"op": "replace", "path": "/spec/template", "value": copy.deepcopy(dict(template))},
    ]
    return Undo(_number(chosen), patch)
