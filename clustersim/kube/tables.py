"""Server-side printing: ``meta.k8s.io/v1 Table`` responses (``Accept: ...;as=Table``) with
kubectl's usual columns for built-in kinds and ``additionalPrinterColumns`` for custom ones.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from clustersim.kube.resources import PrinterColumn, ResourceInfo

Obj = dict[str, Any]
Cell = Any


def human_duration(seconds: float) -> str:
    """``duration.HumanDuration`` of k8s.io/apimachinery: ~2-3 significant figures."""
    whole = int(seconds)  # Go truncates toward zero
    if whole < -1:
        return "<invalid>"
    if whole < 0:
        return "0s"
    if whole < 120:
        return f"{whole}s"
    minutes = whole // 60
    if minutes < 10:
        rest = whole % 60
        return f"{minutes}m{rest}s" if rest else f"{minutes}m"
    if minutes < 180:
        return f"{minutes}m"
    hours = whole // 3600
    if hours < 8:
        rest = minutes % 60
        return f"{hours}h{rest}m" if rest else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    if hours < 24 * 8:
        rest = hours % 24
        return f"{hours // 24}d{rest}h" if rest else f"{hours // 24}d"
    if hours < 24 * 365 * 2:
        return f"{hours // 24}d"
    if hours < 24 * 365 * 8:
        rest = (hours // 24) % 365
        years = hours // 24 // 365
        return f"{years}y{rest}d" if rest else f"{years}y"
    return f"{hours // 24 // 365}y"


def parse_timestamp(timestamp: str) -> datetime | None:
    """An RFC 3339 time as metav1.Time accepts it (``Z`` or an offset, optional fraction)."""
    try:
        parsed = datetime.fromisoformat(timestamp.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        return None
    if parsed.tzinfo is None or "T" not in timestamp.upper():
        return None
    return parsed


def human_age(timestamp: str | None, now: datetime | None = None) -> str:
    """``ConvertToHumanReadableDateType``: the time since ``timestamp`` as a human duration."""
    if not timestamp:
        return "<unknown>"
    then = parse_timestamp(timestamp)
    if then is None:
        return "<invalid>"
    return human_duration(((now or datetime.now(UTC)) - then).total_seconds())


_TOKEN_RE = re.compile(
    r"\.([A-Za-z0-9_\-/]+)|\[(\d+|\*)\]|\[\?\(@\.([\w.\-/]+)\s*==\s*['\"]([^'\"]*)['\"]\)\]"
)


def jsonpath(obj: Any, path: str) -> list[Any]:
    """A subset of kubectl JSONPath: ``.a.b``, ``[0]``, ``[*]``, ``[?(@.type=="Ready")]``."""
    expr = path.strip()
    if expr.startswith("{") and expr.endswith("}"):
        expr = expr[1:-1]
    if expr.startswith("$"):
        expr = expr[1:]
    current: list[Any] = [obj]
    pos = 0
    while pos < len(expr):
        match = _TOKEN_RE.match(expr, pos)
        if match is None:
            return []
        pos = match.end()
        field, index, filter_key, filter_value = match.groups()
        nxt: list[Any] = []
        for item in current:
            if field is not None:
                if isinstance(item, Mapping) and field in item:
                    nxt.append(item[field])
            elif index is not None:
                if isinstance(item, list):
                    if index == "*":
                        nxt.extend(item)
                    elif int(index) < len(item):
                        nxt.append(item[int(index)])
            elif isinstance(item, list):
                for element in item:
                    value = element
                    for part in filter_key.split("."):
                        value = value.get(part) if isinstance(value, Mapping) else None
                    if value is not None and str(value) == filter_value:
                        nxt.append(element)
        current = nxt
    return current


def _column_cell(obj: Obj, column: PrinterColumn) -> Cell:
    values = jsonpath(obj, column.json_path)
    if not values:
        return None
    value = values[0] if len(values) == 1 else ",".join(str(v) for v in values)
    if column.type == "string":
        if isinstance(value, bool):
            return "true" if value else "false"
        return value if isinstance(value, str) else str(value)
    return cell_for_json_value(column.type, value)


def cell_for_json_value(column_type: str, value: Any) -> Cell:
    """The CRD table convertor's typed cell: a mismatching value becomes null; ``date`` cells
    are human durations since the timestamp."""
    if value is None:
        return None
    numeric = isinstance(value, int | float) and not isinstance(value, bool)
    if column_type == "integer" and numeric:
        return int(value)
    if column_type == "number" and numeric:
        return float(value)
    if column_type == "boolean" and isinstance(value, bool):
        return value
    if column_type == "date" and isinstance(value, str):
        return human_age(value) if value not in ("", "null") else "<unknown>"
    return None


def _pod_cells(pod: Obj) -> list[Cell]:
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    statuses = status.get("containerStatuses") or []
    total = len(spec.get("containers") or [])
    ready = sum(1 for s in statuses if s.get("ready"))
    restarts = sum(int(s.get("restartCount", 0)) for s in statuses)
    reason = status.get("reason") or status.get("phase") or "Unknown"
    for s in statuses:
        waiting = (s.get("state") or {}).get("waiting")
        if waiting and waiting.get("reason"):
            reason = waiting["reason"]
    if pod["metadata"].get("deletionTimestamp"):
        reason = "Terminating"
    return [
        pod["metadata"]["name"],
        f"{ready}/{total}",
        reason,
        restarts,
        human_age(pod["metadata"].get("creationTimestamp")),
        status.get("podIP") or "<none>",
        spec.get("nodeName") or "<none>",
        status.get("nominatedNodeName") or "<none>",
    ]


def _node_cells(node: Obj) -> list[Cell]:
    conditions = (node.get("status") or {}).get("conditions") or []
    ready = next((c for c in conditions if c.get("type") == "Ready"), None)
    if ready is None:
        status = "Unknown"
    else:
        status = "Ready" if ready.get("status") == "True" else "NotReady"
    if (node.get("spec") or {}).get("unschedulable"):
        status += ",SchedulingDisabled"
    labels = node["metadata"].get("labels") or {}
    roles = sorted(k.split("/", 1)[1] for k in labels if k.startswith("node-role.kubernetes.io/"))
    info = (node.get("status") or {}).get("nodeInfo") or {}
    addresses = (node.get("status") or {}).get("addresses") or []
    internal = next((a["address"] for a in addresses if a.get("type") == "InternalIP"), "<none>")
    return [
        node["metadata"]["name"],
        status,
        ",".join(roles) or "<none>",
        human_age(node["metadata"].get("creationTimestamp")),
        info.get("kubeletVersion", ""),
        internal,
    ]


def _job_cells(job: Obj) -> list[Cell]:
    spec = job.get("spec") or {}
    status = job.get("status") or {}
    conditions = {c.get("type"): c.get("status") for c in status.get("conditions") or []}
    if conditions.get("Complete") == "True":
        state = "Complete"
    elif conditions.get("Failed") == "True":
        state = "Failed"
    elif spec.get("suspend"):
        state = "Suspended"
    else:
        state = "Running"
    completions = spec.get("completions")
    done = status.get("succeeded", 0)
    return [
        job["metadata"]["name"],
        state,
        f"{done}/{completions}"
        if completions is not None
        else f"{done}/1 of {spec.get('parallelism', 1)}",
        _job_duration(status),
        human_age(job["metadata"].get("creationTimestamp")),
    ]


def _job_duration(status: Mapping[str, Any]) -> str:
    """kubectl's job DURATION: start to completion, or start to now while running."""
    start = parse_timestamp(status.get("startTime") or "")
    if start is None:
        return ""
    end = parse_timestamp(status.get("completionTime") or "") or datetime.now(UTC)
    return human_duration((end - start).total_seconds())


def _controller_of(obj: Any) -> str:
    """kube-apiserver's Controller column: `<kind>.<group>/<name>` of the controller
    ownerReference (lower-case kind; `<none>` without one)."""
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or []:
        if isinstance(ref, dict) and ref.get("controller"):
            group = str(ref.get("apiVersion", "")).rpartition("/")[0]
            kind = str(ref.get("kind", "")).lower()
            return (
                f"{kind}.{group}/{ref.get('name', '')}"
                if group
                else f"{kind}/{ref.get('name', '')}"
            )
    return "<none>"


def _str(value: Any) -> str:
    return "N/A" if value is None else str(value)


_BUILTIN: dict[str, tuple[list[tuple[str, str, int]], Callable[[Obj], list[Cell]]]] = {
    "pods": (
        [
            ("Name", "string", 0),
            ("Ready", "string", 0),
            ("Status", "string", 0),
            ("Restarts", "string", 0),
            ("Age", "string", 0),
            ("IP", "string", 1),
            ("Node", "string", 1),
            ("Nominated Node", "string", 1),
        ],
        _pod_cells,
    ),
    "nodes": (
        [
            ("Name", "string", 0),
            ("Status", "string", 0),
            ("Roles", "string", 0),
            ("Age", "string", 0),
            ("Version", "string", 0),
            ("Internal-IP", "string", 1),
        ],
        _node_cells,
    ),
    "namespaces": (
        [("Name", "string", 0), ("Status", "string", 0), ("Age", "string", 0)],
        lambda o: [
            o["metadata"]["name"],
            (o.get("status") or {}).get("phase", ""),
            human_age(o["metadata"].get("creationTimestamp")),
        ],
    ),
    "configmaps": (
        [("Name", "string", 0), ("Data", "integer", 0), ("Age", "string", 0)],
        lambda o: [
            o["metadata"]["name"],
            len(o.get("data") or {}) + len(o.get("binaryData") or {}),
            human_age(o["metadata"].get("creationTimestamp")),
        ],
    ),
    "events": (
        [
            ("Last Seen", "string", 0),
            ("Type", "string", 0),
            ("Reason", "string", 0),
            ("Object", "string", 0),
            ("Message", "string", 0),
        ],
        lambda o: [
            human_age(
                o.get("lastTimestamp")
                or o.get("eventTime")
                or o["metadata"].get("creationTimestamp")
            ),
            o.get("type", ""),
            o.get("reason", ""),
            f"{(o.get('involvedObject') or {}).get('kind', '').lower()}/"
            f"{(o.get('involvedObject') or {}).get('name', '')}",
            o.get("message", ""),
        ],
    ),
    "jobs.batch": (
        [
            ("Name", "string", 0),
            ("Status", "string", 0),
            ("Completions", "string", 0),
            ("Duration", "string", 0),
            ("Age", "string", 0),
        ],
        _job_cells,
    ),
    "poddisruptionbudgets.policy": (
        [
            ("Name", "string", 0),
            ("Min Available", "string", 0),
            ("Max Unavailable", "string", 0),
            ("Allowed Disruptions", "integer", 0),
            ("Age", "string", 0),
        ],
        lambda o: [
            o["metadata"]["name"],
            _str((o.get("spec") or {}).get("minAvailable")),
            _str((o.get("spec") or {}).get("maxUnavailable")),
            (o.get("status") or {}).get("disruptionsAllowed", 0),
            human_age(o["metadata"].get("creationTimestamp")),
        ],
    ),
    "controllerrevisions.apps": (
        [
            ("Name", "string", 0),
            ("Controller", "string", 0),
            ("Revision", "integer", 0),
            ("Age", "string", 0),
        ],
        lambda o: [
            o["metadata"]["name"],
            _controller_of(o),
            o.get("revision", 0),
            human_age(o["metadata"].get("creationTimestamp")),
        ],
    ),
    "leases.coordination.k8s.io": (
        [("Name", "string", 0), ("Holder", "string", 0), ("Age", "string", 0)],
        lambda o: [
            o["metadata"]["name"],
            (o.get("spec") or {}).get("holderIdentity", ""),
            human_age(o["metadata"].get("creationTimestamp")),
        ],
    ),
    "customresourcedefinitions.apiextensions.k8s.io": (
        [("Name", "string", 0), ("Created At", "date", 0)],
        lambda o: [o["metadata"]["name"], o["metadata"].get("creationTimestamp")],
    ),
}


def column_definitions(info: ResourceInfo) -> list[Obj]:
    name_col = {
        "name": "Name",
        "type": "string",
        "format": "name",
        "priority": 0,
        "description": "Name must be unique within a namespace.",
    }
    if info.key in _BUILTIN:
        cols, _ = _BUILTIN[info.key]
        out = []
        for name, type_, priority in cols:
            out.append(
                name_col
                if name == "Name"
                else {
                    "name": name,
                    "type": type_,
                    "format": "",
                    "priority": priority,
                    "description": name,
                }
            )
        return out
    if info.printer_columns:
        return [name_col] + [
            {
                "name": c.name,
                "type": c.type,
                "format": c.format,
                "priority": c.priority,
                "description": c.description,
            }
            for c in info.printer_columns
        ]
    return [
        name_col,
        {
            "name": "Age",
            "type": "date",
            "format": "",
            "priority": 0,
            "description": "CreationTimestamp",
        },
    ]


def row_cells(info: ResourceInfo, obj: Obj) -> list[Cell]:
    if info.key in _BUILTIN:
        return _BUILTIN[info.key][1](obj)
    if info.printer_columns:
        return [obj["metadata"]["name"]] + [_column_cell(obj, c) for c in info.printer_columns]
    # A CRD without additionalPrinterColumns is served with a default Age (type date) column.
    return [obj["metadata"]["name"], human_age(obj["metadata"].get("creationTimestamp"))]


def partial_metadata(obj: Obj) -> Obj:
    return {
        "kind": "PartialObjectMetadata",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": obj["metadata"],
    }


def table(
    info: ResourceInfo,
    objects: Iterable[Obj],
    resource_version: str,
    include_object: str = "Metadata",
    continue_: str | None = None,
    with_columns: bool = True,
) -> Obj:
    rows = []
    for obj in objects:
        row: Obj = {"cells": row_cells(info, obj)}
        if include_object == "Object":
            row["object"] = obj
        elif include_object != "None":
            row["object"] = partial_metadata(obj)
        rows.append(row)
    metadata: Obj = {"resourceVersion": resource_version}
    if continue_:
        metadata["continue"] = continue_
    return {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": metadata,
        "columnDefinitions": column_definitions(info) if with_columns else [],
        "rows": rows,
    }
