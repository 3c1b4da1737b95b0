"""Request bodies of slurmrestd, parsed per data_parser version as strictly as Slurm: a field
of the wrong type is a parse error (HTTP 400); a field the version does not have is a warning
(so `exclusive`, dropped in v0.0.42, is ignored there: `shared: ["none"]` says it)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from clustersim.slurm import errors as e
from clustersim.slurm.errors import SlurmError
from clustersim.slurm.model import JobRequest, cpus_per_node
from nodeflow_contracts.slurm_api import SlurmApiVersion


@dataclass(frozen=True)
class NodeUpdate:
    states: tuple[str, ...]
    reason: str | None
    comment: str | None
    reason_user: str | None
    warnings: tuple[str, ...]


def parse_node_update(body: object, version: SlurmApiVersion) -> NodeUpdate:
    data = _require_dict(body, "update_node_msg")
    warnings = [
        f'Ignoring unknown field "{key}" of type {type(value).__name__} in update_node_msg'
        for key, value in data.items()
        if key not in version.node_update_fields
    ]
    raw_states = data.get("state", [])
    if isinstance(raw_states, str):
        raw_states = [raw_states]
    if not isinstance(raw_states, list) or not all(isinstance(s, str) for s in raw_states):
        raise _parse_error("state", "expected a list of node state flag strings")
    states = tuple(s.upper() for s in raw_states)
    for state in states:
        if state not in version.node_states:
            raise _parse_error("state", f"Unknown node state flag: {state}")
    return NodeUpdate(
        states=states,
        reason=_optional_str(data, "reason"),
        comment=_optional_str(data, "comment"),
        reason_user=_optional_str(data, "reason_uid"),
        warnings=tuple(warnings),
    )


@dataclass(frozen=True)
class ParsedSubmit:
    request: JobRequest
    warnings: tuple[str, ...]


def parse_job_submit(body: object, version: SlurmApiVersion) -> ParsedSubmit:
    data = _require_dict(body, "job_submit_req")
    warnings: list[str] = []
    if "jobs" in data:
        raise SlurmError(
            e.ESLURM_REST_INVALID_QUERY,
            "The emulator accepts only single jobs in `job`, not HetJobs in `jobs`",
            "job_submit_req",
        )
    job = _require_dict(data.get("job"), "job")
    for key, value in job.items():
        if key not in version.job_desc_fields:
            warnings.append(
                f'Ignoring unknown field "{key}" of type {type(value).__name__} in job_desc_msg'
            )
    script = _optional_str(job, "script")
    top_script = _optional_str(data, "script")
    if top_script is not None:
        warnings.append("script field is deprecated; populate script in job")
        script = script or top_script
    limit, infinite = _no_val(job, "time_limit")
    nodes_range = _optional_str(job, "nodes")
    minimum_nodes = _optional_int(job, "minimum_nodes") or _range_minimum(nodes_range) or 1
    required = _csv(job, "required_nodes")
    node_count = max(minimum_nodes, len(required))
    exclusive_flags = _str_list(job, "exclusive") if "exclusive" in version.job_desc_fields else []
    shared = _str_list(job, "shared")
    request = JobRequest(
        name=_optional_str(job, "name") or "",
        script=script or "",
        partition=_optional_str(job, "partition"),
        current_working_directory=_optional_str(job, "current_working_directory") or "",
        environment=tuple(_str_list(job, "environment")),
        time_limit_minutes=limit,
        time_limit_infinite=infinite,
        required_nodes=tuple(required),
        minimum_nodes=minimum_nodes,
        cpus_per_node=cpus_per_node(
            nodes=node_count,
            tasks=_optional_int(job, "tasks"),
            cpus_per_task=_optional_int(job, "cpus_per_task"),
            minimum_cpus=_optional_int(job, "minimum_cpus"),
            minimum_cpus_per_node=_optional_int(job, "minimum_cpus_per_node"),
            tasks_per_node=_optional_int(job, "tasks_per_node"),
        ),
        exclusive="true" in exclusive_flags or "none" in shared,
        comment=_optional_str(job, "comment") or "",
        account=_optional_str(job, "account") or "",
        standard_output=_optional_str(job, "standard_output") or "",
        standard_error=_optional_str(job, "standard_error") or "",
    )
    return ParsedSubmit(request=request, warnings=tuple(warnings))


@dataclass(frozen=True)
class ParsedReservation:
    name: str
    nodes: list[str]
    start: int
    minutes: int
    flags: list[str]
    users: list[str]
    warnings: list[str]


def parse_reservation(body: object, version: SlurmApiVersion) -> ParsedReservation:
    """`POST /reservation` (reservation_desc_msg), for a version that has it: a flag not of
    the version's enum is a parse error, as slurmrestd's; a field it does not read a warning."""
    data = _require_dict(body, "reservation")
    flags = [flag.upper() for flag in _str_list(data, "flags")]
    unknown = [flag for flag in flags if flag not in version.reservation_flags]
    if unknown:
        raise _parse_error("flags", f"unknown reservation flag {', '.join(unknown)}")
    start, _ = _no_val(data, "start_time")
    minutes, infinite = _no_val(data, "duration")
    if start is None or minutes is None or infinite:
        raise _parse_error("start_time", "the emulator needs start_time and a finite duration")
    read = {"name", "node_list", "start_time", "duration", "flags", "users"}
    return ParsedReservation(
        name=_optional_str(data, "name") or "",
        nodes=_csv(data, "node_list"),
        start=start,
        minutes=minutes,
        flags=flags,
        users=_csv(data, "users"),
        warnings=[
            f"field {key} is not emulated and was ignored" for key in data if key not in read
        ],
    )


def _parse_error(field: str, why: str) -> SlurmError:
    return SlurmError(e.ESLURM_REST_FAIL_PARSING, f"{why} (field {field})", field)


def _require_dict(value: object, field: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _parse_error(field, "expected a JSON object")
    return value


def _optional_str(data: dict[str, Any], key: str) -> str | None:
    value = data.get(key)
    if value is None or isinstance(value, str):
        return value
    raise _parse_error(key, "expected a string")


def _optional_int(data: dict[str, Any], key: str) -> int | None:
    value = data.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise _parse_error(key, "expected an integer")
    if value < 0:
        raise _parse_error(key, "expected a non-negative integer")
    return value


def _str_list(data: dict[str, Any], key: str) -> list[str]:
    value = data.get(key)
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and all(isinstance(item, str) for item in value):
        return list(value)
    raise _parse_error(key, "expected a list of strings")


def _csv(data: dict[str, Any], key: str) -> list[str]:
    from clustersim.slurm.hostlist import InvalidHostlist, expand

    items: list[str] = []
    for item in _str_list(data, key):
        try:
            items.extend(expand(item))
        except InvalidHostlist as exc:
            raise _parse_error(key, str(exc)) from exc
    return items


def _no_val(data: dict[str, Any], key: str) -> tuple[int | None, bool]:
    """A `*_no_val_struct` field: a plain integer or {set, infinite, number}."""
    value = data.get(key)
    if value is None:
        return None, False
    if isinstance(value, bool):
        raise _parse_error(key, "expected an integer or a no_val struct")
    if isinstance(value, int):
        return value, False
    if isinstance(value, dict):
        if value.get("infinite") is True:
            return None, True
        number = value.get("number", 0)
        if isinstance(number, bool) or not isinstance(number, int):
            raise _parse_error(key, "number must be an integer")
        return (number, False) if value.get("set", True) else (None, False)
    raise _parse_error(key, "expected an integer or a no_val struct")


def _range_minimum(value: str | None) -> int | None:
    if not value:
        return None
    head = value.split("-", 1)[0].split(":", 1)[0]
    if not head.isdigit():
        raise _parse_error("nodes", "expected a node count range like 2 or 1-4")
    return int(head)
