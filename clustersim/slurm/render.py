"""Response bodies in the shapes slurmrestd serves, per data_parser version.

Each entry is built whole, then cut to the fields its version's record names
(nodeflow_contracts.slurm_api): a field a version added is given a value here, a field it
dropped is left out, so the entry has exactly the fields of that version's OpenAPI schema.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from clustersim.slurm.hostlist import compress
from clustersim.slurm.model import Job, Node, Reservation, SlurmCluster
from clustersim.slurm.releases import SlurmRelease
from nodeflow_contracts.slurm_api import SlurmApiVersion

Json = dict[str, Any]


def _only(entry: Json, fields: Iterable[str]) -> Json:
    wanted = set(fields)
    return {key: value for key, value in entry.items() if key in wanted}


def no_val(number: float | None, *, infinite: bool = False) -> Json:
    """A `*_no_val_struct`: unset, infinite, or a number."""
    if infinite:
        return {"set": False, "infinite": True, "number": 0}
    if number is None:
        return {"set": False, "infinite": False, "number": 0}
    return {"set": True, "infinite": False, "number": int(number)}


def meta(
    cluster: SlurmCluster,
    client_source: str,
    user: str | None,
    release: SlurmRelease,
    version: SlurmApiVersion,
) -> Json:
    major, minor, micro = release.version_parts
    return {
        "plugin": {
            "type": "openapi/slurmctld",
            "name": "Slurm OpenAPI slurmctld",
            "data_parser": version.data_parser,
            "accounting_storage": "",
        },
        "client": {"source": client_source, "user": user or "", "group": user or ""},
        "command": [],
        "slurm": {
            "version": {"major": major, "micro": micro, "minor": minor},
            "release": release.release,
            "cluster": cluster.name,
        },
    }


def ping(cluster: SlurmCluster, version: SlurmApiVersion) -> Json:
    """One entry of `pings`: v0.0.42 added responding/primary, v0.0.45 dropped pinged/mode
    and added status (slurm_strerror of the ping's result)."""
    entry = {
        "hostname": f"slurmctld-{cluster.name}",
        "pinged": "UP",
        "responding": True,
        "latency": 500,
        "mode": "primary",
        "primary": True,
        "status": "No error",
    }
    return _only(entry, version.ping_fields)


def warning(description: str, source: str) -> Json:
    return {"description": description, "source": source}


def node(cluster: SlurmCluster, n: Node, version: SlurmApiVersion, release: str) -> Json:
    alloc = cluster.node_alloc_cpus(n)
    used_mb = 0
    state = cluster.node_state(n)
    tres = f"cpu={n.cpus},mem={_mem(n.real_memory)},billing={n.cpus}"
    if n.gres:
        tres += "," + ",".join(_gres_tres(n.gres))
    entry = {
        "architecture": "x86_64",
        "burstbuffer_network_address": "",
        "boards": 1,
        "boot_time": no_val(n.registered_at),
        "cluster_name": "",
        "cores": n.cpus,
        "specialized_cores": 0,
        "cpu_binding": 0,
        "cpu_load": 0,
        "free_mem": no_val(max(n.real_memory - used_mb, 0)),
        "cpus": n.cpus,
        "effective_cpus": n.cpus,
        "specialized_cpus": "",
        "energy": {
            "average_watts": 0,
            "base_consumed_energy": 0,
            "consumed_energy": 0,
            "current_watts": no_val(None),
            "previous_consumed_energy": 0,
            "last_collected": 0,
        },
        "external_sensors": {},
        "extra": "",
        "power": {},
        "features": list(n.features),
        "active_features": list(n.features),
        "gpu_spec": "",
        "gres": n.gres,
        "gres_drained": "N/A",
        "gres_used": _gres_used(n.gres),
        "instance_id": "",
        "instance_type": "",
        "last_busy": no_val(n.last_busy or n.registered_at),
        "mcs_label": "",
        "specialized_memory": 0,
        "name": n.name,
        "next_state_after_reboot": ["INVALID"],
        "address": n.address,
        "hostname": n.hostname,
        "state": state,
        "operating_system": "Linux 6.12.0 #1 SMP Debian",
        "owner": "",
        "partitions": cluster.node_partitions(n),
        "port": 6818,
        "real_memory": n.real_memory,
        "res_cores_per_gpu": 0,
        "comment": n.comment,
        "reason": n.reason,
        "reason_changed_at": no_val(n.reason_time or 0),
        "reason_set_by_user": n.reason_user,
        "resume_after": no_val(None),
        "reservation": active.name if (active := cluster.active_reservation(n)) else "",
        "alloc_memory": 0,
        "alloc_cpus": alloc,
        "alloc_idle_cpus": 0 if n.down else n.cpus - alloc,
        "tres_used": f"cpu={alloc}" if alloc else "",
        "tres_weighted": float(alloc),
        "slurmd_start_time": no_val(n.registered_at),
        "sockets": 1,
        "threads": 1,
        "temporary_disk": 0,
        "weight": 1,
        "tres": tres,
        "version": release,
        # v0.0.43 on
        "cert_flags": [],
        "tls_cert_last_renewal": no_val(None),
        "topology": "",
        # v0.0.45 on
        "suspend_time": no_val(None),
    }
    return _only(entry, version.node_fields)


def reservation(r: Reservation) -> Json:
    """`reservations[]` of `GET /reservations` (the same fields in every version we serve)."""
    return {
        "accounts": "",
        "burst_buffer": "",
        "core_count": 0,
        "core_specializations": [],
        "end_time": no_val(r.end),
        "features": "",
        "flags": list(r.flags),
        "groups": "",
        "licenses": "",
        "max_start_delay": 0,
        "name": r.name,
        "node_count": len(r.nodes),
        "node_list": compress(r.nodes),
        "partition": "",
        "purge_completed": {"time": no_val(None)},
        "start_time": no_val(r.start),
        "tres": f"cpu={len(r.nodes)}",
        "users": ",".join(r.users),
    }


def job(cluster: SlurmCluster, j: Job, version: SlurmApiVersion) -> Json:
    nodes = list(j.allocation)
    state = [j.state, "COMPLETING"] if j.completing else [j.state]
    limit = j.time_limit_minutes
    end = j.end_time
    if end is None and j.start_time is not None and limit is not None:
        end = j.start_time + limit * 60
    cpus = sum(j.allocation.values())
    exit_status = "SUCCESS" if j.exit_code == 0 else "ERROR"
    finished = j.end_time is not None
    exit_code = {
        "status": [exit_status if finished else "PENDING"],
        "return_code": no_val(j.exit_code if finished else None),
        "signal": {"id": no_val(None), "name": ""},
    }
    request = j.request
    entry = {
        "account": request.account,
        "accrue_time": no_val(j.submit_time),
        "admin_comment": "",
        "allocating_node": "",
        "array_job_id": no_val(0),
        "array_task_id": no_val(None),
        "array_max_tasks": no_val(0),
        "array_task_string": "",
        "association_id": 0,
        "batch_features": "",
        "batch_flag": True,
        "batch_host": nodes[0] if nodes else "",
        "flags": ["STARTED_ON_SUBMIT"] if j.start_time == j.submit_time else [],
        "burst_buffer": "",
        "burst_buffer_state": "",
        "cluster": cluster.name,
        "cluster_features": "",
        "command": "",
        "comment": request.comment,
        "container": "",
        "container_id": "",
        "contiguous": False,
        "core_spec": 0,
        "thread_spec": 0,
        "cores_per_socket": no_val(None),
        "billable_tres": {"set": True, "infinite": False, "number": float(cpus)},
        "cpus_per_task": no_val(1),
        "cpu_frequency_minimum": no_val(None),
        "cpu_frequency_maximum": no_val(None),
        "cpu_frequency_governor": no_val(None),
        "cpus_per_tres": "",
        "cron": "",
        "deadline": no_val(0),
        "delay_boot": no_val(0),
        "dependency": "",
        "derived_exit_code": exit_code,
        "eligible_time": no_val(j.submit_time),
        "end_time": no_val(end if end is not None else 0),
        "excluded_nodes": "",
        "exit_code": exit_code,
        "extra": "",
        "failed_node": "",
        "features": "",
        "federation_origin": "",
        "federation_siblings_active": "",
        "federation_siblings_viable": "",
        "gres_detail": [],
        "group_id": 0 if j.user == "root" else 1000,
        "group_name": j.user,
        "het_job_id": no_val(0),
        "het_job_id_set": "",
        "het_job_offset": no_val(None),
        "job_id": j.job_id,
        "job_resources": _job_resources(j) if nodes else {},
        "job_size_str": [],
        "job_state": state,
        "last_sched_evaluation": no_val(j.start_time or j.submit_time),
        "licenses": "",
        "mail_type": [],
        "mail_user": j.user,
        "max_cpus": no_val(0),
        "max_nodes": no_val(0),
        "mcs_label": "",
        "memory_per_tres": "",
        "name": request.name,
        "network": "",
        "nodes": compress(nodes),
        "nice": 0,
        "tasks_per_core": no_val(None, infinite=True),
        "tasks_per_tres": no_val(0),
        "tasks_per_node": no_val(0),
        "tasks_per_socket": no_val(None, infinite=True),
        "tasks_per_board": no_val(0),
        "cpus": no_val(cpus or request.cpus_per_node * request.minimum_nodes),
        "node_count": no_val(len(nodes) or request.minimum_nodes),
        "tasks": no_val(len(nodes) or request.minimum_nodes),
        "partition": j.partition,
        "prefer": "",
        "memory_per_cpu": no_val(None),
        "memory_per_node": no_val(0),
        "minimum_cpus_per_node": no_val(request.cpus_per_node),
        "minimum_tmp_disk_per_node": no_val(0),
        "power": {"flags": []},
        "preempt_time": no_val(0),
        "preemptable_time": no_val(0),
        "pre_sus_time": no_val(0),
        "hold": False,
        "priority": no_val(1),
        "profile": ["NOT_SET"],
        "qos": "normal",
        "reboot": False,
        "required_nodes": compress(request.required_nodes),
        "minimum_switches": 0,
        "requeue": True,
        "resize_time": no_val(0),
        "restart_cnt": 0,
        "resv_name": "",
        "scheduled_nodes": "",
        "selinux_context": "",
        "shared": [],
        "exclusive": ["true"] if request.exclusive else [],
        "oversubscribe": False,
        "show_flags": ["DETAIL", "LOCAL"],
        "sockets_per_board": 0,
        "sockets_per_node": no_val(None),
        "start_time": no_val(j.start_time if j.start_time is not None else 0),
        "state_description": "",
        "state_reason": j.state_reason,
        "standard_error": request.standard_error or _default_output(j),
        "standard_input": "/dev/null",
        "standard_output": request.standard_output or _default_output(j),
        "submit_time": no_val(j.submit_time),
        "suspend_time": no_val(0),
        "system_comment": "",
        "time_limit": no_val(limit, infinite=limit is None),
        "time_minimum": no_val(0),
        "threads_per_core": no_val(None),
        "tres_bind": "",
        "tres_freq": "",
        "tres_per_job": "",
        "tres_per_node": "",
        "tres_per_socket": "",
        "tres_per_task": "cpu=1",
        "tres_req_str": f"cpu={request.cpus_per_node * request.minimum_nodes},"
        f"node={request.minimum_nodes},billing={request.cpus_per_node}",
        "tres_alloc_str": f"cpu={cpus},node={len(nodes)},billing={cpus}" if nodes else "",
        "user_id": 0 if j.user == "root" else 1000,
        "user_name": j.user,
        "maximum_switch_wait_time": 0,
        "wckey": "",
        "current_working_directory": request.current_working_directory,
        # v0.0.42 on
        "priority_by_partition": [],
        "required_switches": 0,
        # v0.0.43 on
        "licenses_allocated": "",
        "segment_size": 0,
        "stderr_expanded": request.standard_error or _default_output(j),
        "stdin_expanded": "/dev/null",
        "stdout_expanded": request.standard_output or _default_output(j),
        # v0.0.44 on
        "step_id": {
            "sluid": "",
            "job_id": no_val(j.job_id),
            "step_het_component": no_val(None),
            "step_id": "batch",
        },
        "submit_line": "",
        # v0.0.45 on
        "container_type": "",
        "memory_update_delay": 0,
        "memory_update_margin": 0,
    }
    return _only(entry, version.job_fields)


def _job_resources(j: Job) -> Json:
    allocation = [
        {
            "index": index,
            "name": name,
            "cpus": {"count": count, "used": count},
            "memory": {"used": 0, "allocated": 0},
            "sockets": [],
        }
        for index, (name, count) in enumerate(j.allocation.items())
    ]
    return {
        "select_type": ["CPU"],
        "nodes": {
            "count": len(j.allocation),
            "select_type": ["AVAILABLE"],
            "list": compress(j.allocation),
            "whole": j.request.exclusive,
            "allocation": allocation,
        },
        "cpus": sum(j.allocation.values()),
        "threads_per_core": no_val(1),
    }


def _default_output(j: Job) -> str:
    cwd = j.request.current_working_directory or "/tmp"
    return f"{cwd.rstrip('/')}/slurm-{j.job_id}.out"


def _mem(megabytes: int) -> str:
    if megabytes and megabytes % 1024 == 0:
        return f"{megabytes // 1024}G"
    return f"{megabytes}M"


def _gres_tres(gres: str) -> list[str]:
    """`gpu:8` or `gpu:h100:8` -> `gres/gpu=8` (the TRES form slurmctld prints)."""
    out = []
    for item in gres.split(","):
        parts = item.split("(")[0].split(":")
        if len(parts) >= 2 and parts[-1].isdigit():
            out.append(f"gres/{parts[0]}={parts[-1]}")
    return out


def _gres_used(gres: str) -> str:
    if not gres:
        return ""
    used = []
    for item in gres.split(","):
        parts = item.split("(")[0].split(":")
        if len(parts) >= 2 and parts[-1].isdigit():
            used.append(":".join([*parts[:-1], "0(IDX:N/A)"]))
    return ",".join(used)
