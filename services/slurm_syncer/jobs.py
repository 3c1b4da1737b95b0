"""Slurm's job listing (`GET /jobs`) -> the ids of the jobs on each node. Pure.

Information for people only (`kubectl nodeflow why pod` names the jobs that keep a busy node's
pod): whether a node is busy comes from the node's own state (nodestate.derive), never from
this listing, so a job listing that fails, lags or holds a malformed entry can never make a
node look less busy than Slurm says.

A job holds its nodes while its `job_state` has RUNNING, SUSPENDED (its processes stay on the
node and resume there) or COMPLETING (its epilog still runs; slurmctld shows the node
Completing, which is busy). Every API version we speak (v0.0.41 to v0.0.45) lists `job_state`
as a list of words (`["COMPLETED", "COMPLETING"]`), `job_id` as an integer and `nodes` as a
hostlist (`gpu-[001-003,007]`); a plain-string `job_state` (v0.0.38 and older) is read too.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import hostlist  # type: ignore[import-untyped]
import msgspec

from nodeflow_contracts.slurm import JOBS_KEPT, SlurmNodeState

# The job state words under which a job still holds its nodes.
HOLDING_STATES = frozenset({"RUNNING", "SUSPENDED", "COMPLETING"})


@dataclass
class NodeJobs:
    """Node name -> the ids of the jobs holding it (numeric order), and the entries skipped."""

    by_node: dict[str, list[str]] = field(default_factory=dict)
    malformed: list[str] = field(default_factory=list)


def _states(raw: object) -> list[str] | None:
    if isinstance(raw, str):
        return [raw]
    if isinstance(raw, list) and all(isinstance(word, str) for word in raw):
        return raw
    return None


def _job_id(raw: object) -> str | None:
    if isinstance(raw, int) and not isinstance(raw, bool) and raw > 0:
        return str(raw)
    if isinstance(raw, Mapping):  # a `*_no_val_struct`, as `step_id.job_id` is written
        number = raw.get("number")
        if raw.get("set") and isinstance(number, int) and not isinstance(number, bool):
            return _job_id(number)
    return None


def _nodes(raw: Mapping[str, Any]) -> str | None:
    """The job's hostlist: `nodes`, else `job_resources.nodes.list` (the same names)."""
    nodes = raw.get("nodes")
    if isinstance(nodes, str) and nodes:
        return nodes
    resources = raw.get("job_resources")
    listed = resources.get("nodes") if isinstance(resources, Mapping) else None
    if isinstance(listed, Mapping):
        listed = listed.get("list")
    return listed if isinstance(listed, str) and listed else None


def jobs_by_node(raw_jobs: Iterable[Mapping[str, Any]]) -> NodeJobs:
    """The jobs holding each node, from the entries of a `/jobs` answer.

    Jobs in other states (PENDING, COMPLETED, CANCELLED...) are left out. An entry whose id,
    state or hostlist cannot be read is skipped and named in `malformed`.
    """
    found: dict[str, set[int]] = {}
    result = NodeJobs()
    for raw in raw_jobs:
        job_id = _job_id(raw.get("job_id"))
        states = _states(raw.get("job_state"))
        if job_id is None or states is None:
            result.malformed.append(
                f"job entry {raw.get('job_id')!r} without a readable job_id or job_state"
            )
            continue
        if not HOLDING_STATES.intersection(word.upper() for word in states):
            continue
        expression = _nodes(raw)
        if expression is None:
            result.malformed.append(f"job {job_id} holds nodes but names none")
            continue
        try:
            names = hostlist.expand_hostlist(expression, allow_duplicates=True)
        except hostlist.BadHostlist as exc:
            result.malformed.append(f"job {job_id}: invalid hostlist {expression!r}: {exc}")
            continue
        for name in names:
            if name.strip():
                found.setdefault(name.strip(), set()).add(int(job_id))
    result.by_node = {name: [str(i) for i in sorted(ids)] for name, ids in found.items()}
    return result


def with_jobs(state: SlurmNodeState, job_ids: Sequence[str], read_at: float) -> SlurmNodeState:
    """`state` naming the jobs read on it at `read_at`: the first JOBS_KEPT ids and how many
    there are in all (a KV value stays small on a node shared by many small jobs)."""
    return msgspec.structs.replace(
        state, jobs=tuple(job_ids[:JOBS_KEPT]), jobs_total=len(job_ids), jobs_read_at=read_at
    )


def carry_jobs(state: SlurmNodeState, previous: SlurmNodeState | None) -> SlurmNodeState:
    """`state` (read without the job listing: a poll's node listing, a one-node read-back)
    with the jobs last read on the node, still saying when they were read. A node that is not
    busy by its own state names none: no job holds it, whatever an older listing showed."""
    if previous is None or not previous.known or not state.known or not state.busy:
        return state
    return msgspec.structs.replace(
        state,
        jobs=previous.jobs,
        jobs_total=previous.jobs_total,
        jobs_read_at=previous.jobs_read_at,
    )
