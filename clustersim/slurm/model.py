"""The emulated slurmctld: nodes, partitions and batch jobs, driven by an injectable clock.

Time only moves through `tick()`, which applies every transition due at `clock.now()`:
jobs end at their script's end or time limit, stay COMPLETING for a moment, then free their
CPUs; pending jobs start on nodes that can take them. Every REST call ticks first, so a
reader always sees the state as of "now"; a driver task also ticks in real time.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from clustersim.slurm import errors as e
from clustersim.slurm.clock import Clock
from clustersim.slurm.errors import SlurmError

# Flags in the order slurmrestd lists them after the base state.
FLAG_ORDER: tuple[str, ...] = (
    "DRAIN",
    "COMPLETING",
    "NOT_RESPONDING",
    "MAINTENANCE",
    "DYNAMIC_NORM",
)
UPDATE_STATES: frozenset[str] = frozenset({"DRAIN", "UNDRAIN", "RESUME", "DOWN", "IDLE"})
NOT_RESPONDING_REASON = "Not responding"


@dataclass
class Partition:
    name: str
    nodes: set[str] = field(default_factory=set)
    all_nodes: bool = False
    default: bool = False
    max_time_minutes: int | None = None

    def contains(self, node: str) -> bool:
        return self.all_nodes or node in self.nodes


@dataclass
class Node:
    name: str
    cpus: int
    real_memory: int
    gres: str
    hostname: str
    address: str
    features: tuple[str, ...]
    dynamic: bool
    registered_at: float
    down: bool = False
    drain: bool = False
    not_responding: bool = False
    not_responding_since: float | None = None
    # An UNDRAIN/RESUME made slurmctld ping the node; slurmd answers at this time.
    ping_answer_at: float | None = None
    reason: str = ""
    reason_user: str = ""
    reason_time: float | None = None
    comment: str = ""
    last_busy: float = 0.0

    def set_reason(self, reason: str, user: str, now: float) -> None:
        self.reason, self.reason_user, self.reason_time = reason, user, now

    def clear_reason(self) -> None:
        self.reason, self.reason_user, self.reason_time = "", "", None


@dataclass(frozen=True)
class Reservation:
    """A reservation over whole nodes for [start, end). slurmctld shows its nodes in it while
    it is active, with the MAINTENANCE flag when it is MAINT; it purges a one-off reservation
    once it has ended."""

    name: str
    nodes: tuple[str, ...]
    start: float
    end: float
    flags: tuple[str, ...]
    users: tuple[str, ...]

    @property
    def maint(self) -> bool:
        return "MAINT" in self.flags

    def active(self, now: float) -> bool:
        return self.start <= now < self.end

    def overlaps(self, begin: float, finish: float | None) -> bool:
        """Does [begin, finish) (finish None: no end) meet the reservation?"""
        return begin < self.end and (finish is None or finish > self.start)


@dataclass(frozen=True)
class JobRequest:
    """The parts of a job description (job_desc_msg, any version) the emulator acts on."""

    name: str
    script: str
    partition: str | None
    current_working_directory: str
    environment: tuple[str, ...]
    time_limit_minutes: int | None
    time_limit_infinite: bool
    required_nodes: tuple[str, ...]
    minimum_nodes: int
    cpus_per_node: int
    exclusive: bool
    comment: str = ""
    account: str = ""
    standard_output: str = ""
    standard_error: str = ""


@dataclass
class Job:
    job_id: int
    request: JobRequest
    user: str
    partition: str
    submit_time: float
    time_limit_minutes: int | None
    run_seconds: float | None
    exit_code: int
    state: str = "PENDING"
    state_reason: str = "None"
    start_time: float | None = None
    end_time: float | None = None
    completing_until: float | None = None
    allocation: dict[str, int] = field(default_factory=dict)
    last_update: float = 0.0

    @property
    def running(self) -> bool:
        return self.state == "RUNNING"

    @property
    def completing(self) -> bool:
        return self.completing_until is not None

    def scheduled_end(self) -> float | None:
        """When a running job stops on its own: its script ends or its time limit hits."""
        if self.start_time is None:
            return None
        ends = []
        if self.run_seconds is not None:
            ends.append(self.start_time + self.run_seconds)
        if self.time_limit_minutes is not None:
            ends.append(self.start_time + self.time_limit_minutes * 60)
        return min(ends) if ends else None


def script_run_seconds(script: str) -> tuple[float | None, int]:
    """How long a batch script runs and its exit code, reading only `sleep` and `exit`.

    Other commands take no time. None means the script never ends by itself (`sleep
    infinity`), so the job runs until its time limit or until it is cancelled.
    """
    total = 0.0
    for raw in script.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        words = line.split()
        if words[0] == "exit":
            return total, int(words[1]) if len(words) > 1 and words[1].isdigit() else 0
        if words[0] != "sleep" or len(words) < 2:
            continue
        for word in words[1:]:
            if word == "infinity":
                return None, 0
            total += _duration_seconds(word)
    return total, 0


def _duration_seconds(word: str) -> float:
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([smhd]?)", word)
    if not match:
        return 0.0
    value, unit = match.groups()
    return float(value) * {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}[unit]


class SlurmCluster:
    """One emulated cluster. Names, users and errors follow slurmctld's."""

    def __init__(
        self,
        name: str,
        clock: Clock,
        *,
        admin_users: Iterable[str] = ("root", "slurm"),
        slurm_user: str = "slurm",
        partitions: Sequence[Partition] | None = None,
        return_to_service: int = 1,
        invalid_resume_error: int = e.ESLURM_INVALID_NODE_STATE,
        slurmd_timeout: float = 300.0,
        min_job_age: float = 300.0,
        completing_seconds: float = 1.0,
        first_job_id: int = 1,
        resume_ping_seconds: float = 0.0,
    ) -> None:
        """`resume_ping_seconds` > 0: an UNDRAIN or RESUME shows the node NOT_RESPONDING until
        slurmd answers slurmctld's fresh ping that long after (Slurm 24.11.5 over REST:
        `["IDLE", "NOT_RESPONDING"]` for 0.2-0.8 s); 0 keeps the node as it was."""
        self.name = name
        self.clock = clock
        self.admin_users = frozenset(admin_users)
        self.slurm_user = slurm_user
        self.partitions: dict[str, Partition] = {
            p.name: p for p in (partitions or [Partition("debug", all_nodes=True, default=True)])
        }
        self.return_to_service = return_to_service
        # What slurmctld answers a RESUME of a node neither drained nor down (per release).
        self.invalid_resume_error = invalid_resume_error
        self.slurmd_timeout = slurmd_timeout
        self.min_job_age = min_job_age
        self.completing_seconds = completing_seconds
        self.resume_ping_seconds = resume_ping_seconds
        self.nodes: dict[str, Node] = {}
        # Nodes a tick may change by itself (a ping answer due, or a silent node not yet
        # DOWN): a tick looks at these, not at every node, so a request costs the same on
        # 10 nodes as on 10,000.
        self._timed: set[str] = set()
        self.jobs: dict[int, Job] = {}
        self.reservations: dict[str, Reservation] = {}
        # The reservations active at the last tick: one starting or ending touches the nodes.
        self._active_reservations: set[str] = set()
        self._next_job_id = first_job_id
        now = clock.now()
        self.started_at = now
        self.last_node_update = now
        self.last_job_update = now

    # ---- node lifecycle (the simulated kubelet calls these) ----

    def register_node(
        self,
        name: str,
        cpus: int,
        real_memory: int,
        gres: str = "",
        *,
        hostname: str | None = None,
        address: str | None = None,
        features: Sequence[str] = (),
        partitions: Sequence[str] = (),
        dynamic: bool = False,
    ) -> None:
        """slurmd starts on a node (or comes back): the node is IDLE unless held down/drained."""
        if cpus < 1 or real_memory < 0:
            raise ValueError("a node needs at least one CPU and non-negative memory")
        now = self.clock.now()
        node = self.nodes.get(name)
        if node is None:
            node = Node(
                name=name,
                cpus=cpus,
                real_memory=real_memory,
                gres=gres,
                hostname=hostname or name,
                address=address or hostname or name,
                features=tuple(features),
                dynamic=dynamic,
                registered_at=now,
            )
            self.nodes[name] = node
        else:
            node.cpus, node.real_memory, node.gres = cpus, real_memory, gres
            node.hostname = hostname or node.hostname
            node.address = address or hostname or node.address
            node.features = tuple(features) or node.features
            node.registered_at = now
            self._return_to_service(node)
        for partition in partitions:
            self.partitions.setdefault(partition, Partition(partition)).nodes.add(name)
        self._touch_nodes()
        self._schedule()

    def mark_lost(self, name: str) -> None:
        """The node's pod is gone: slurmd stops answering, so the node goes DOWN."""
        node = self._node(name, "mark_lost")
        now = self.clock.now()
        node.not_responding = True
        node.not_responding_since = now
        node.ping_answer_at = None
        self._set_down_not_responding(node, now)
        self._track_timers(node)
        self._touch_nodes()

    def remove_node(self, name: str) -> None:
        """Forget a node entirely (what `scontrol delete nodename=` does to a dynamic node)."""
        node = self._node(name, "remove_node")
        self._fail_jobs_on(node, self.clock.now())
        del self.nodes[name]
        self._timed.discard(name)
        for partition in self.partitions.values():
            partition.nodes.discard(name)
        self._touch_nodes()

    def _track_timers(self, node: Node) -> None:
        """Keep `_timed` true for `node` after its timers or DOWN flag changed."""
        if node.ping_answer_at is not None or (
            node.not_responding_since is not None and not node.down
        ):
            self._timed.add(node.name)
        else:
            self._timed.discard(node.name)

    def _return_to_service(self, node: Node) -> None:
        node.not_responding, node.not_responding_since = False, None
        node.ping_answer_at = None
        self._timed.discard(node.name)
        if not node.down:
            return
        back = self.return_to_service >= 2 or (
            self.return_to_service == 1 and node.reason == NOT_RESPONDING_REASON
        )
        if back:
            node.down = False
            if not node.drain:
                node.clear_reason()

    # ---- admin operations over REST ----

    def require_admin(self, user: str, description: str, source: str) -> None:
        if user not in self.admin_users:
            raise SlurmError(e.ESLURM_USER_ID_MISSING, description, source)

    def update_node(
        self,
        name: str,
        user: str,
        states: Sequence[str],
        reason: str | None,
        comment: str | None,
        reason_user: str | None = None,
    ) -> None:
        failure = f"Failure to update node {name}"
        self.require_admin(user, failure, "_update_node")
        node = self.nodes.get(name)
        if node is None:
            raise SlurmError(e.ESLURM_INVALID_NODE_NAME, failure, "_update_node")
        for state in states:
            if state not in UPDATE_STATES:
                raise SlurmError(e.ESLURM_INVALID_NODE_STATE, failure, "_update_node")
        if "RESUME" in states and not (node.down or node.drain):
            raise SlurmError(self.invalid_resume_error, failure, "_update_node")
        now = self.clock.now()
        who = reason_user or user
        # Observed on Slurm 24.11.5 over REST: DRAIN and DOWN need no reason (only scontrol
        # insists on one), and UNDRAIN/RESUME leave the old reason in place. A reason-less
        # drain still records who asked for it.
        for state in states:
            if state == "DRAIN":
                node.drain = True
            elif state == "DOWN":
                node.down = True
                self._fail_jobs_on(node, now)
            elif state == "UNDRAIN":
                node.drain = False
            elif state in ("RESUME", "IDLE"):
                node.drain, node.down = False, False
        pinged = any(state in ("UNDRAIN", "RESUME") for state in states)
        if pinged and self.resume_ping_seconds > 0 and node.not_responding_since is None:
            # A lost node (not_responding_since set) never answers: it stays NOT_RESPONDING.
            node.not_responding = True
            node.ping_answer_at = now + self.resume_ping_seconds
        # RESUME may lift DOWN from a node whose slurmd is gone: it goes DOWN again in time.
        self._track_timers(node)
        if reason:
            node.set_reason(reason, who, now)
        elif any(state in ("DRAIN", "DOWN") for state in states):
            node.reason_user = who
        if comment is not None:
            node.comment = comment
        self._touch_nodes()
        self._schedule()

    def delete_node(self, name: str, user: str) -> None:
        failure = f"Failure to update node {name}"
        self.require_admin(user, failure, "_delete_node")
        node = self.nodes.get(name)
        if node is None:
            raise SlurmError(e.ESLURM_INVALID_NODE_NAME, failure, "_delete_node")
        if not node.dynamic:
            raise SlurmError(e.ESLURM_INVALID_NODE_STATE, failure, "_delete_node")
        if self.node_alloc_cpus(node) or self._completing_on(node):
            raise SlurmError(e.ESLURM_NODES_BUSY, failure, "_delete_node")
        self.remove_node(name)

    def _set_down_not_responding(self, node: Node, now: float) -> None:
        """slurmctld keeps the reason a node already has and appends its own: a node drained
        with "nodeflow: delete: x" reads "nodeflow: delete: x : Not responding" (set by slurm),
        as seen on Slurm 24.11.5; a node with no reason gets "Not responding"."""
        if not node.reason or node.reason.startswith(NOT_RESPONDING_REASON):
            reason = NOT_RESPONDING_REASON
        elif node.reason.endswith(f" : {NOT_RESPONDING_REASON}"):
            reason = node.reason
        else:
            reason = f"{node.reason} : {NOT_RESPONDING_REASON}"
        self._set_down(node, reason, self.slurm_user, now)

    def _set_down(self, node: Node, reason: str, user: str, now: float) -> None:
        node.down = True
        node.set_reason(reason, user, now)
        self._fail_jobs_on(node, now)

    # ---- jobs ----

    # ---- reservations (scontrol create/delete reservation, POST/DELETE /reservation) ----

    def create_reservation(
        self,
        user: str,
        name: str,
        nodes: Sequence[str],
        start: float,
        minutes: int,
        flags: Sequence[str],
        users: Sequence[str],
    ) -> Reservation:
        """As slurmctld's create_resv: admins only; a name in use, an unknown node, no users or
        an end already past are refused. Running jobs that would outlive the start refuse it
        unless IGNORE_JOBS (slurmctld: "Requested nodes are busy"); so does a start more than
        ten minutes past."""
        source = "_create_reservation"
        self.require_admin(user, "Failure to create reservation", source)
        if not name or name in self.reservations:
            raise SlurmError(e.ESLURM_RESERVATION_INVALID, f"Reservation {name!r} exists", source)
        if not nodes:
            raise SlurmError(e.ESLURM_INVALID_NODE_NAME, "Reservation without nodes", source)
        unknown = [node for node in nodes if node not in self.nodes]
        if unknown:
            raise SlurmError(
                e.ESLURM_INVALID_NODE_NAME, f"Invalid node name {','.join(unknown)}", source
            )
        if not users:
            raise SlurmError(e.ESLURM_USER_ID_MISSING, "Reservation without users", source)
        now = self.clock.now()
        end = start + minutes * 60
        # slurmctld: a start more than MAX_RESV_DELAY (600 s) past is invalid.
        if minutes <= 0 or start < now - 600:
            raise SlurmError(e.ESLURM_INVALID_TIME_VALUE, "Invalid reservation time", source)
        words = tuple(flag.upper() for flag in flags)
        if "IGNORE_JOBS" not in words:
            for job in self.jobs.values():
                if not job.running or not set(job.allocation) & set(nodes):
                    continue
                job_end = job.scheduled_end()
                if job_end is None or job_end > start:
                    raise SlurmError(e.ESLURM_NODES_BUSY, "Requested nodes are busy", source)
        reservation = Reservation(name, tuple(sorted(set(nodes))), start, end, words, tuple(users))
        self.reservations[name] = reservation
        self._touch_nodes()
        return reservation

    def delete_reservation(self, user: str, name: str) -> None:
        source = "_delete_reservation"
        self.require_admin(user, "Failure to delete reservation", source)
        if self.reservations.pop(name, None) is None:
            raise SlurmError(
                e.ESLURM_RESERVATION_INVALID, f"Reservation {name!r} not found", source
            )
        self._touch_nodes()

    def active_reservation(self, node: Node) -> Reservation | None:
        """The reservation slurmctld shows the node in now (the first by name)."""
        now = self.clock.now()
        for reservation in sorted(self.reservations.values(), key=lambda r: r.name):
            if reservation.active(now) and node.name in reservation.nodes:
                return reservation
        return None

    def _held_by_maintenance(self, node: Node, job: Job) -> bool:
        """A MAINT reservation over the node that the job, started now with its time limit,
        would run into (no limit: runs into any that has not ended)."""
        now = self.clock.now()
        finish = None if job.time_limit_minutes is None else now + job.time_limit_minutes * 60
        return any(
            reservation.maint
            and node.name in reservation.nodes
            and reservation.overlaps(now, finish)
            for reservation in self.reservations.values()
        )

    def submit_job(self, request: JobRequest, user: str) -> int:
        partition = self._job_partition(request)
        self._validate_job_fits(request, partition)
        run_seconds, exit_code = script_run_seconds(request.script)
        limit = None if request.time_limit_infinite else request.time_limit_minutes
        if limit is None and not request.time_limit_infinite:
            limit = partition.max_time_minutes
        now = self.clock.now()
        job = Job(
            job_id=self._next_job_id,
            request=request,
            user=user,
            partition=partition.name,
            submit_time=now,
            time_limit_minutes=limit,
            run_seconds=run_seconds,
            exit_code=exit_code,
            last_update=now,
        )
        self._next_job_id += 1
        self.jobs[job.job_id] = job
        self._touch_jobs()
        self._schedule()
        return job.job_id

    def cancel_job(self, job_id: int, user: str) -> bool:
        """Cancel a job; False when it had already finished (slurmrestd only warns then)."""
        job = self.jobs.get(job_id)
        if job is None:
            raise SlurmError(
                e.ESLURM_INVALID_JOB_ID, f"Unable to find JobId={job_id}", "_handle_job_delete"
            )
        if user != job.user and user not in self.admin_users:
            raise SlurmError(
                e.ESLURM_ACCESS_DENIED,
                f"unable to send signal 9 to JobId={job_id}",
                "slurm_kill_job()",
            )
        if job.state not in ("PENDING", "RUNNING"):
            return False
        self._finish(job, "CANCELLED", self.clock.now(), exit_code=0)
        self._schedule()
        return True

    def get_job(self, job_id: int) -> Job:
        job = self.jobs.get(job_id)
        if job is None:
            raise SlurmError(
                e.ESLURM_INVALID_JOB_ID, f"Unable to query JobId={job_id}", "_op_handler_job"
            )
        return job

    def _job_partition(self, request: JobRequest) -> Partition:
        if request.partition:
            partition = self.partitions.get(request.partition)
            if partition is None:
                raise SlurmError(
                    e.ESLURM_INVALID_PARTITION_NAME,
                    "Batch job submission failed",
                    "slurm_submit_batch_job()",
                )
            return partition
        for partition in self.partitions.values():
            if partition.default:
                return partition
        raise SlurmError(
            e.ESLURM_INVALID_PARTITION_NAME,
            "Batch job submission failed",
            "slurm_submit_batch_job()",
        )

    def _validate_job_fits(self, request: JobRequest, partition: Partition) -> None:
        failure = ("Batch job submission failed", "slurm_submit_batch_job()")
        if not request.script.strip():
            raise SlurmError(
                e.ESLURM_JOB_SCRIPT_MISSING, "Batch job script empty or missing", "script"
            )
        for name in request.required_nodes:
            if name not in self.nodes:
                raise SlurmError(e.ESLURM_INVALID_NODE_NAME, *failure)
            if not partition.contains(name):
                raise SlurmError(e.ESLURM_REQUESTED_NODES_NOT_IN_PARTITION, *failure)
        members = [n for n in self.nodes.values() if partition.contains(n.name)]
        wanted = max(request.minimum_nodes, len(request.required_nodes))
        big_enough = [n for n in members if n.cpus >= request.cpus_per_node]
        if wanted > len(members) or len(big_enough) < wanted:
            raise SlurmError(e.ESLURM_REQUESTED_NODE_CONFIG_UNAVAILABLE, *failure)

    # ---- time ----

    def tick(self) -> None:
        """Apply every transition due by now, in time order."""
        now = self.clock.now()
        for job in sorted(self.jobs.values(), key=lambda j: j.job_id):
            end = job.scheduled_end() if job.running else None
            if end is not None and end <= now:
                timed_out = job.run_seconds is None or (
                    job.time_limit_minutes is not None
                    and job.time_limit_minutes * 60 < job.run_seconds
                )
                state = (
                    "TIMEOUT" if timed_out else ("COMPLETED" if job.exit_code == 0 else "FAILED")
                )
                self._finish(job, state, end, exit_code=job.exit_code)
        for job in self.jobs.values():
            if job.completing_until is not None and job.completing_until <= now:
                job.completing_until = None
                job.last_update = now
                self._touch_nodes()
                self._touch_jobs()
        for name in sorted(self._timed):
            node = self.nodes[name]
            if node.ping_answer_at is not None and node.ping_answer_at <= now:
                node.not_responding, node.ping_answer_at = False, None
                self._touch_nodes()
            overdue = node.not_responding_since is not None and (
                now - node.not_responding_since >= self.slurmd_timeout
            )
            if overdue and not node.down:
                self._set_down_not_responding(node, now)
                self._touch_nodes()
            self._track_timers(node)
        expired = [
            job_id
            for job_id, job in self.jobs.items()
            if job.end_time is not None
            and not job.completing
            and now - job.end_time >= self.min_job_age
        ]
        for job_id in expired:
            del self.jobs[job_id]
        if expired:
            self._touch_jobs()
        ended = [name for name, r in self.reservations.items() if r.end <= now]
        for name in ended:
            del self.reservations[name]
        active = {name for name, r in self.reservations.items() if r.active(now)}
        if active != self._active_reservations:
            # A reservation starting or ending changes its nodes' state.
            self._active_reservations = active
            self._touch_nodes()
        self._schedule()

    def _finish(self, job: Job, state: str, when: float, exit_code: int) -> None:
        job.state = state
        job.exit_code = exit_code
        job.end_time = when
        job.state_reason = "None" if state in ("COMPLETED", "CANCELLED") else state.title()
        if job.allocation:
            job.completing_until = when + self.completing_seconds
            for name in job.allocation:
                if name in self.nodes:
                    self.nodes[name].last_busy = when
        # The CPUs go back at once (only running jobs count); the nodes show COMPLETING
        # until the epilog would be done.
        job.last_update = self.clock.now()
        self._touch_jobs()
        self._touch_nodes()

    def _fail_jobs_on(self, node: Node, now: float) -> None:
        for job in self.jobs.values():
            if job.running and node.name in job.allocation:
                self._finish(job, "NODE_FAIL", now, exit_code=0)

    # ---- scheduling ----

    def _schedule(self) -> None:
        now = self.clock.now()
        for job in sorted(self.jobs.values(), key=lambda j: j.job_id):
            if job.state != "PENDING":
                continue
            chosen, reason = self._pick_nodes(job)
            if chosen is None:
                if job.state_reason != reason:
                    job.state_reason = reason
                    job.last_update = now
                    self._touch_jobs()
                continue
            job.allocation = {
                name: (
                    self.nodes[name].cpus if job.request.exclusive else job.request.cpus_per_node
                )
                for name in chosen
            }
            job.state, job.state_reason, job.start_time = "RUNNING", "None", now
            job.last_update = now
            self._touch_jobs()
            self._touch_nodes()

    def _pick_nodes(self, job: Job) -> tuple[list[str] | None, str]:
        partition = self.partitions[job.partition]
        wanted = max(job.request.minimum_nodes, len(job.request.required_nodes))
        unavailable = [
            name
            for name in job.request.required_nodes
            if name not in self.nodes
            or not self._schedulable(self.nodes[name])
            or self._held_by_maintenance(self.nodes[name], job)
        ]
        if unavailable:
            return None, f"ReqNodeNotAvail, UnavailableNodes:{','.join(unavailable)}"
        chosen = [n for n in job.request.required_nodes if self._fits(self.nodes[n], job)]
        if len(chosen) < len(job.request.required_nodes):
            return None, "Resources"
        for node in sorted(self.nodes.values(), key=lambda n: n.name):
            if len(chosen) >= wanted:
                break
            if node.name in chosen or not partition.contains(node.name):
                continue
            if (
                self._schedulable(node)
                and self._fits(node, job)
                and not self._held_by_maintenance(node, job)
            ):
                chosen.append(node.name)
        if len(chosen) < wanted:
            return None, "Resources"
        return chosen, "None"

    def _schedulable(self, node: Node) -> bool:
        return not (node.down or node.drain or node.not_responding) and not self._completing_on(
            node
        )

    def _fits(self, node: Node, job: Job) -> bool:
        used = self.node_alloc_cpus(node)
        if job.request.exclusive:
            return used == 0
        return node.cpus - used >= job.request.cpus_per_node

    # ---- derived node state ----

    def node_alloc_cpus(self, node: Node) -> int:
        return sum(job.allocation.get(node.name, 0) for job in self.jobs.values() if job.running)

    def _completing_on(self, node: Node) -> bool:
        return any(job.completing and node.name in job.allocation for job in self.jobs.values())

    def node_state(self, node: Node) -> list[str]:
        """`nodes[].state`: the base state, then the flags in slurmrestd's order."""
        alloc = self.node_alloc_cpus(node)
        if node.down:
            base = "DOWN"
        elif alloc == 0:
            base = "IDLE"
        elif alloc >= node.cpus:
            base = "ALLOCATED"
        else:
            base = "MIXED"
        flags = {
            "DRAIN": node.drain,
            "COMPLETING": self._completing_on(node),
            "NOT_RESPONDING": node.not_responding,
            "MAINTENANCE": (active := self.active_reservation(node)) is not None and active.maint,
            "DYNAMIC_NORM": node.dynamic,
        }
        return [base, *(flag for flag in FLAG_ORDER if flags[flag])]

    def node_partitions(self, node: Node) -> list[str]:
        return [p.name for p in self.partitions.values() if p.contains(node.name)]

    def _node(self, name: str, source: str) -> Node:
        node = self.nodes.get(name)
        if node is None:
            raise KeyError(f"{source}: no Slurm node named {name!r} in cluster {self.name!r}")
        return node

    def _touch_nodes(self) -> None:
        self.last_node_update = self.clock.now()

    def _touch_jobs(self) -> None:
        self.last_job_update = self.clock.now()


def cpus_per_node(
    *,
    nodes: int,
    tasks: int | None,
    cpus_per_task: int | None,
    minimum_cpus: int | None,
    minimum_cpus_per_node: int | None,
    tasks_per_node: int | None,
) -> int:
    """CPUs a job needs on each node, from the ways a job description can say it."""
    per_task = cpus_per_task or 1
    candidates = [1]
    if minimum_cpus_per_node:
        candidates.append(minimum_cpus_per_node)
    if tasks_per_node:
        candidates.append(tasks_per_node * per_task)
    if tasks:
        candidates.append(math.ceil(tasks * per_task / max(nodes, 1)))
    if minimum_cpus:
        candidates.append(math.ceil(minimum_cpus / max(nodes, 1)))
    if cpus_per_task:
        candidates.append(cpus_per_task)
    return max(candidates)
