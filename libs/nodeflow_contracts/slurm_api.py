"""The slurmrestd API versions Nodeflow speaks (data_parser v0.0.41 to v0.0.45), one record each,
and the choice of the version to speak with a given slurmrestd.

Every fact here is read from the OpenAPI document a real slurmrestd serves at `/openapi/v3` for
that version (captured in tests/conformance/slurm/openapi/; tests/unit/contracts/
test_slurm_api.py holds each record to its document, field by field). slurm-syncer's client
reads and writes what a record names; clustersim's Slurm emulator serves what it names.

What differs between the versions we use:
  - the node `state` words: v0.0.44 adds EXTERNAL and BLOCKED, v0.0.45 POWER_DOWN_ASAP and
    POWER_DOWN_FORCE (a drain/undrain body may only name words of its version);
  - the node entry: v0.0.43 adds cert_flags, tls_cert_last_renewal and topology; v0.0.45
    adds suspend_time and drops external_sensors, power and tres_weighted;
  - the node update body (`update_node_msg`): v0.0.43 adds topology_str;
  - the ping entry: v0.0.42 adds `responding` and `primary` (deprecating `pinged` and `mode`),
    v0.0.45 drops `pinged` and `mode` and adds `status`;
  - reservations: v0.0.43 adds `POST /reservation` and `DELETE /reservation/{name}` (every
    version lists them; Slurm 26.05's v0.0.42 also deletes, 24.11's does not);
  - jobs: v0.0.42 drops `exclusive`/`oversubscribe` (exclusivity is `shared: ["none"]`) and the
    submit answer's `result`; later versions add fields listed in each record.
What does not differ is named once and checked against every version: the node fields the
syncer reads, the `{set, infinite, number}` number structure, the error entry, and the `meta`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

# Paths of one version: /slurm/v0.0.42/nodes/ -> v0.0.42.
_VERSION_PATH = re.compile(r"^/slurm/(v\d+\.\d+\.\d+)/")

# The node fields slurm-syncer reads (nodestate.parse_node), present in every version.
NODE_FIELDS_READ: tuple[str, ...] = (
    "name",
    "state",
    "reason",
    "reason_set_by_user",
    "reason_changed_at",
    "cpus",
    "alloc_cpus",
    "reservation",
)
# A `*_no_val_struct` (times, counts that may be unset or infinite), in every version.
NO_VAL_FIELDS: frozenset[str] = frozenset({"set", "infinite", "number"})
# An entry of `errors` / `warnings`, in every version.
ERROR_FIELDS: frozenset[str] = frozenset({"description", "error_number", "error", "source"})
WARNING_FIELDS: frozenset[str] = frozenset({"description", "source"})
META_FIELDS: frozenset[str] = frozenset({"client", "command", "plugin", "slurm"})
# The oldest version whose slurmrestd creates and deletes reservations (Slurm 25.05).
RESERVATIONS_SINCE = "v0.0.43"
# Who may run jobs in a reservation Nodeflow creates (slurmctld wants users or accounts): only
# root, so a maintenance window holds no one's jobs.
RESERVATION_USERS: tuple[str, ...] = ("root",)


@dataclass(frozen=True)
class SlurmApiVersion:
    """One data_parser version of slurmrestd's `/slurm/` API."""

    name: str  # "v0.0.42"
    # The words of a node's `state`, read and written (one list in the document for both).
    node_states: frozenset[str]
    # The fields of a node entry in `GET /nodes` and `GET /node/{name}`.
    node_fields: frozenset[str]
    # The fields of the body of `POST /node/{name}` (update_node_msg).
    node_update_fields: frozenset[str]
    # The fields of an entry of `pings` in `GET /ping`.
    ping_fields: frozenset[str]
    # The fields of a job entry in `GET /jobs` and `GET /job/{id}`.
    job_fields: frozenset[str]
    # The fields of `job` in the body of `POST /job/submit` (job_desc_msg).
    job_desc_fields: frozenset[str]
    # The fields of the answer to `POST /job/submit`.
    job_submit_fields: frozenset[str]
    # The `flags` words of `POST /reservation` (reservation_desc_msg); empty when the version
    # has no `POST /reservation` and `DELETE /reservation/{name}` (before v0.0.43: Slurm 24.11
    # only lists reservations).
    reservation_flags: frozenset[str] = frozenset()

    @property
    def prefix(self) -> str:
        return f"/slurm/{self.name}"

    @property
    def data_parser(self) -> str:
        return f"data_parser/{self.name}"

    @property
    def number(self) -> tuple[int, ...]:
        return version_number(self.name)

    @property
    def writes_reservations(self) -> bool:
        """Does slurmrestd of this version create and delete reservations?"""
        return bool(self.reservation_flags)

    def reservation_body(
        self, name: str, nodes: Iterable[str], start: int, minutes: int, flags: Iterable[str]
    ) -> dict[str, Any]:
        """The body of `POST /reservation` that creates `name` over `nodes` from `start`
        (epoch seconds) for `minutes`, for the admin users (RESERVATION_USERS).

        ValueError when this version cannot create reservations or a flag is not one of its
        words: slurmrestd would refuse the body, and we want to know before sending it."""
        if not self.writes_reservations:
            raise ValueError(f"slurmrestd {self.name} cannot create reservations")
        words = [flag.upper() for flag in flags]
        unknown = [word for word in words if word not in self.reservation_flags]
        if unknown:
            raise ValueError(f"slurmrestd {self.name} has no reservation flag {', '.join(unknown)}")
        return {
            "name": name,
            "node_list": sorted(nodes),
            "start_time": {"set": True, "infinite": False, "number": start},
            "duration": {"set": True, "infinite": False, "number": minutes},
            "flags": words,
            "users": list(RESERVATION_USERS),
        }

    def node_update_body(self, states: Iterable[str], reason: str | None = None) -> dict[str, Any]:
        """The body of `POST /node/{name}` that sets `states` (and `reason`).

        ValueError when a state word is not one of this version's: slurmrestd would refuse
        the whole body (HTTP 400), and we want to know before sending it."""
        words = [state.upper() for state in states]
        unknown = [word for word in words if word not in self.node_states]
        if unknown:
            raise ValueError(f"slurmrestd {self.name} has no node state {', '.join(unknown)}")
        body: dict[str, Any] = {"state": words}
        if reason is not None:
            body["reason"] = reason
        return body


def version_number(name: str) -> tuple[int, ...]:
    """`v0.0.42` -> (0, 0, 42), for ordering; ValueError for anything else."""
    if not re.fullmatch(r"v\d+\.\d+\.\d+", name):
        raise ValueError(f"not a slurmrestd API version: {name!r} (expected e.g. v0.0.42)")
    return tuple(int(part) for part in name[1:].split("."))


def _fields(text: str) -> frozenset[str]:
    return frozenset(text.split())


# --- v0.0.41 (Slurm 24.05 - 25.11) ---------------------------------------------------------------

_STATES_41 = _fields(
    """INVALID UNKNOWN DOWN IDLE ALLOCATED ERROR MIXED FUTURE RESERVED UNDRAIN CLOUD RESUME DRAIN
    COMPLETING NOT_RESPONDING POWERED_DOWN FAIL POWERING_UP MAINTENANCE REBOOT_REQUESTED
    REBOOT_CANCELED POWERING_DOWN DYNAMIC_FUTURE REBOOT_ISSUED PLANNED INVALID_REG POWER_DOWN
    POWER_UP POWER_DRAIN DYNAMIC_NORM"""
)
_NODE_41 = _fields(
    """architecture burstbuffer_network_address boards boot_time cluster_name cores
    specialized_cores cpu_binding cpu_load free_mem cpus effective_cpus specialized_cpus energy
    external_sensors extra power features active_features gpu_spec gres gres_drained gres_used
    instance_id instance_type last_busy mcs_label specialized_memory name
    next_state_after_reboot address hostname state operating_system owner partitions port
    real_memory res_cores_per_gpu comment reason reason_changed_at reason_set_by_user
    resume_after reservation alloc_memory alloc_cpus alloc_idle_cpus tres_used tres_weighted
    slurmd_start_time sockets threads temporary_disk weight tres version"""
)
_NODE_UPDATE_41 = _fields(
    """comment cpu_bind extra features features_act gres address hostname name state reason
    reason_uid resume_after weight"""
)
_PING_41 = _fields("hostname pinged latency mode")
_JOB_41 = _fields(
    """account accrue_time admin_comment allocating_node array_job_id array_task_id
    array_max_tasks array_task_string association_id batch_features batch_flag batch_host
    flags burst_buffer burst_buffer_state cluster cluster_features command comment container
    container_id contiguous core_spec thread_spec cores_per_socket billable_tres cpus_per_task
    cpu_frequency_minimum cpu_frequency_maximum cpu_frequency_governor cpus_per_tres cron
    deadline delay_boot dependency derived_exit_code eligible_time end_time excluded_nodes
    exit_code extra failed_node features federation_origin federation_siblings_active
    federation_siblings_viable gres_detail group_id group_name het_job_id het_job_id_set
    het_job_offset job_id job_resources job_size_str job_state last_sched_evaluation licenses
    mail_type mail_user max_cpus max_nodes mcs_label memory_per_tres name network nodes nice
    tasks_per_core tasks_per_tres tasks_per_node tasks_per_socket tasks_per_board cpus
    node_count tasks partition prefer memory_per_cpu memory_per_node minimum_cpus_per_node
    minimum_tmp_disk_per_node power preempt_time preemptable_time pre_sus_time hold priority
    profile qos reboot required_nodes minimum_switches requeue resize_time restart_cnt
    resv_name scheduled_nodes selinux_context shared exclusive oversubscribe show_flags
    sockets_per_board sockets_per_node start_time state_description state_reason
    standard_error standard_input standard_output submit_time suspend_time system_comment
    time_limit time_minimum threads_per_core tres_bind tres_freq tres_per_job tres_per_node
    tres_per_socket tres_per_task tres_req_str tres_alloc_str user_id user_name
    maximum_switch_wait_time wckey current_working_directory"""
)
_JOB_DESC_41 = _fields(
    """account account_gather_frequency admin_comment allocation_node_list
    allocation_node_port argv array batch_features begin_time flags burst_buffer clusters
    cluster_constraint comment contiguous container container_id core_specification
    thread_specification cpu_binding cpu_binding_flags cpu_frequency cpus_per_tres crontab
    deadline delay_boot dependency end_time environment rlimits excluded_nodes extra
    constraints group_id hetjob_group immediate job_id kill_on_node_fail licenses mail_type
    mail_user mcs_label memory_binding memory_binding_type memory_per_tres name network nice
    tasks open_mode reserve_ports overcommit partition distribution_plane_size power_flags
    prefer hold priority profile qos reboot required_nodes requeue reservation resv_mpi_ports
    script shared exclusive oversubscribe site_factor spank_environment distribution
    time_limit time_minimum tres_bind tres_freq tres_per_job tres_per_node tres_per_socket
    tres_per_task user_id wait_all_nodes kill_warning_flags kill_warning_signal
    kill_warning_delay current_working_directory cpus_per_task minimum_cpus maximum_cpus nodes
    minimum_nodes maximum_nodes minimum_boards_per_node minimum_sockets_per_board
    sockets_per_node threads_per_core tasks_per_node tasks_per_socket tasks_per_core
    tasks_per_board ntasks_per_tres minimum_cpus_per_node memory_per_cpu memory_per_node
    temporary_disk_per_node selinux_context required_switches segment_size standard_error
    standard_input standard_output wait_for_switch wckey x11 x11_magic_cookie x11_target_host
    x11_target_port"""
)
_SUBMIT_41 = _fields("result job_id step_id job_submit_user_msg meta errors warnings")

V0_0_41 = SlurmApiVersion(
    name="v0.0.41",
    node_states=_STATES_41,
    node_fields=_NODE_41,
    node_update_fields=_NODE_UPDATE_41,
    ping_fields=_PING_41,
    job_fields=_JOB_41,
    job_desc_fields=_JOB_DESC_41,
    job_submit_fields=_SUBMIT_41,
)

# --- v0.0.42 (Slurm 24.11 - 26.05) ---------------------------------------------------------------

V0_0_42 = SlurmApiVersion(
    name="v0.0.42",
    node_states=_STATES_41,
    node_fields=_NODE_41,
    node_update_fields=_NODE_UPDATE_41,
    ping_fields=_PING_41 | _fields("responding primary"),
    job_fields=(_JOB_41 - _fields("exclusive oversubscribe show_flags minimum_switches"))
    | _fields("priority_by_partition required_switches"),
    job_desc_fields=(_JOB_DESC_41 - _fields("exclusive oversubscribe resv_mpi_ports"))
    | _fields("oom_kill_step"),
    job_submit_fields=_SUBMIT_41 - _fields("result"),
)

_RESERVATION_FLAGS_43 = _fields(
    """MAINT NO_MAINT DAILY NO_DAILY WEEKLY NO_WEEKLY IGNORE_JOBS NO_IGNORE_JOBS ANY_NODES STATIC
    NO_STATIC PART_NODES NO_PART_NODES OVERLAP SPEC_NODES TIME_FLOAT REPLACE ALL_NODES
    PURGE_COMP WEEKDAY NO_WEEKDAY WEEKEND NO_WEEKEND FLEX NO_FLEX DURATION_PLUS DURATION_MINUS
    NO_HOLD_JOBS_AFTER_END NO_PURGE_COMP MAGNETIC SKIP HOURLY NO_HOURLY USER_DELETE
    NO_USER_DELETE REOCCURRING"""
)

# --- v0.0.43 (Slurm 25.05 - 26.05) ---------------------------------------------------------------

V0_0_43 = SlurmApiVersion(
    name="v0.0.43",
    node_states=_STATES_41,
    node_fields=_NODE_41 | _fields("cert_flags tls_cert_last_renewal topology"),
    node_update_fields=_NODE_UPDATE_41 | _fields("topology_str"),
    ping_fields=V0_0_42.ping_fields,
    job_fields=V0_0_42.job_fields
    | _fields("licenses_allocated segment_size stderr_expanded stdin_expanded stdout_expanded"),
    job_desc_fields=V0_0_42.job_desc_fields,
    job_submit_fields=V0_0_42.job_submit_fields,
    reservation_flags=_RESERVATION_FLAGS_43,
)

# --- v0.0.44 (Slurm 25.11 - 26.05) ---------------------------------------------------------------

V0_0_44 = SlurmApiVersion(
    name="v0.0.44",
    node_states=_STATES_41 | _fields("EXTERNAL BLOCKED"),
    node_fields=V0_0_43.node_fields,
    node_update_fields=V0_0_43.node_update_fields,
    ping_fields=V0_0_43.ping_fields,
    job_fields=V0_0_43.job_fields | _fields("step_id submit_line"),
    job_desc_fields=V0_0_43.job_desc_fields | _fields("step_id"),
    job_submit_fields=V0_0_43.job_submit_fields,
    reservation_flags=_RESERVATION_FLAGS_43
    | _fields("NO_ANY_NODES REPLACE_DOWN NO_MAGNETIC FORCE_START TRES_PER_NODE"),
)

# --- v0.0.45 (Slurm 26.05) -----------------------------------------------------------------------

V0_0_45 = SlurmApiVersion(
    name="v0.0.45",
    node_states=V0_0_44.node_states | _fields("POWER_DOWN_ASAP POWER_DOWN_FORCE"),
    node_fields=(V0_0_44.node_fields - _fields("external_sensors power tres_weighted"))
    | _fields("suspend_time"),
    node_update_fields=V0_0_44.node_update_fields,
    ping_fields=_fields("hostname responding latency primary status"),
    job_fields=(V0_0_44.job_fields - _fields("power"))
    | _fields("container_type memory_update_delay memory_update_margin"),
    job_desc_fields=(V0_0_44.job_desc_fields - _fields("power_flags"))
    | _fields("container_type cores_per_socket memory_update_delay memory_update_margin"),
    job_submit_fields=V0_0_44.job_submit_fields,
    reservation_flags=V0_0_44.reservation_flags,
)

# Every version we speak, oldest first.
API_VERSIONS: Mapping[str, SlurmApiVersion] = {
    version.name: version for version in (V0_0_41, V0_0_42, V0_0_43, V0_0_44, V0_0_45)
}
NEWEST = V0_0_45


class NoCommonApiVersion(ValueError):
    """slurmrestd speaks none of the versions we speak (or not the one asked for)."""

    def __init__(self, server: Iterable[str], wanted: str | None = None) -> None:
        self.server = sorted(set(server), key=_order)
        served = ", ".join(self.server) or "none"
        ours = ", ".join(API_VERSIONS)
        if wanted is not None:
            text = (
                f"slurmrestd does not speak SLURM_API_VERSION {wanted} (it speaks: {served}; "
                f"Nodeflow speaks: {ours})"
            )
        else:
            text = (
                f"slurmrestd speaks no API version Nodeflow speaks (slurmrestd: {served}; "
                f"Nodeflow: {ours})"
            )
        super().__init__(text)


def _order(name: str) -> tuple[int, ...]:
    try:
        return version_number(name)
    except ValueError:
        return (-1,)


def api_version(name: str) -> SlurmApiVersion:
    """The record of `name`; ValueError naming the versions we speak when it is not one."""
    version = API_VERSIONS.get(name.strip())
    if version is None:
        raise ValueError(
            f"Nodeflow does not speak slurmrestd API version {name!r} "
            f"(it speaks: {', '.join(API_VERSIONS)})"
        )
    return version


def versions_in_openapi(document: Mapping[str, Any]) -> frozenset[str]:
    """The versions an OpenAPI document (slurmrestd's `/openapi/v3`) has `/slurm/` paths of."""
    paths = document.get("paths")
    if not isinstance(paths, Mapping):
        return frozenset()
    found = set()
    for path in paths:
        match = _VERSION_PATH.match(str(path))
        if match:
            found.add(match.group(1))
    return frozenset(found)


def choose_version(server: Iterable[str], wanted: str | None = None) -> SlurmApiVersion:
    """The newest version both slurmrestd (`server`) and we speak, or `wanted` when given and
    slurmrestd speaks it. NoCommonApiVersion otherwise."""
    served = set(server)
    if wanted is not None:
        chosen = api_version(wanted)
        if chosen.name not in served:
            raise NoCommonApiVersion(served, chosen.name)
        return chosen
    common = [version for name, version in API_VERSIONS.items() if name in served]
    if not common:
        raise NoCommonApiVersion(served)
    return max(common, key=lambda version: version.number)


def prefix_from_openapi(document: Mapping[str, Any], wanted: str | None = None) -> str:
    """`/slurm/<version>` of the version `choose_version` picks from a `/openapi/v3` document:
    what a script that calls slurmrestd directly (tests, benchmarks) prefixes its paths with."""
    return choose_version(versions_in_openapi(document), wanted).prefix
