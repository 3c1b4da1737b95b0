"""`kubectl nodeflow doctor` against the Kubernetes API emulator (and a real nats-server), as
an operator runs it (a process, `--kubeconfig`): each problem planted in the cluster is named
on its own line and makes the command exit 1; without NATS, its checks say SKIP."""

from __future__ import annotations

import datetime
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from clustersim.kube.server import RunningServer, serve
from clustersim.kube.store import Store
from clustersim.runner import DEFAULT_CRD_DIR, apply_crds
from nodeflow_bus import Bus, ensure_topology
from nodeflow_contracts.permissions import SERVICES, lease_names
from nodeflow_contracts.slurm import SlurmClusterStatus
from nodeflow_contracts.topology import KV_BUCKETS, SLURM_CLUSTERS_BUCKET, STREAMS
from nodeflow_runtime.natsd import NatsServerProcess
from tests.integration.cli.plugin import run_plugin

NAMESPACE = "nodeflow-system"
LEASES = "leases.coordination.k8s.io"


def rfc3339(at: float) -> str:
    return (
        datetime.datetime.fromtimestamp(at, datetime.UTC)
        .isoformat(timespec="microseconds")
        .replace("+00:00", "Z")
    )


def lease(name: str, renewed_at: float, holder: str = "replica-1") -> dict[str, Any]:
    """A leader's Lease; ten minutes long, so a loaded machine never makes a fresh one stale
    between the fixture and the command."""
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "holderIdentity": holder,
            "leaseDurationSeconds": 600,
            "renewTime": rfc3339(renewed_at),
        },
    }


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[RunningServer]:
    """The emulator with Nodeflow's CRDs and every leader's Lease, freshly renewed."""
    store = Store(bookmark_interval=0.2)
    apply_crds(store, DEFAULT_CRD_DIR)
    store.create("namespaces", {"metadata": {"name": NAMESPACE}})
    for service in SERVICES:
        for name in lease_names(service):
            store.create(LEASES, lease(name, time.time()), NAMESPACE)
    async with serve(store, kubeconfig_path=tmp_path / "kubeconfig") as server:
        yield server


async def doctor(server: RunningServer, *args: str) -> tuple[int, dict[str, tuple[str, str]]]:
    """The plugin's exit code and its checks: name -> (status, detail)."""
    code, output, errors = await run_plugin(server.kubeconfig_path, *args, "doctor")
    checks = {}
    for line in output.splitlines():
        # `STATUS  check  detail`, the status padded to four characters.
        name, detail = line[6:].split("  ", 1)
        checks[name] = (line[:4].strip(), detail)
    assert checks, errors
    return code, checks


async def test_doctor_on_a_healthy_cluster_without_nats_exits_0_and_skips_the_nats_checks(
    cluster: RunningServer,
) -> None:
    code, checks = await doctor(cluster)
    assert code == 0, checks
    assert checks["nats"] == (
        "SKIP",
        f"NATS not given (--nats URL or NATS_URL) and no Service nats in namespace {NAMESPACE} "
        "(--system-namespace) to port-forward to",
    )
    assert checks["slurm"][0] == "SKIP"
    assert checks["crd nodesets.nodeflow.dev"] == (
        "OK",
        "v1alpha1 (served, storage); status by nodeset-controller",
    )
    assert checks["leader nodeset-controller"][0] == "OK"
    # The emulator serves Secrets (none here) but no Deployments: with nothing deployed to
    # mount them, each missing Secret is a WARN to create it first, not a failure.
    secrets = {name: check for name, check in checks.items() if name.startswith("secret ")}
    assert secrets and {status for status, _ in secrets.values()} == {"WARN"}, secrets
    assert checks["ready"] == ("SKIP", f"not deployed as Deployments in {NAMESPACE}")
    assert checks["command-namespaces"][0] == "SKIP"
    assert checks["scheduler koord-scheduler"] == (
        "OK",
        "served by topology-placer; 0 pod(s) pending",
    )


async def test_doctor_names_a_stale_leader_a_missing_crd_and_a_gang_nothing_schedules(
    cluster: RunningServer,
) -> None:
    store = cluster.store
    # nodeset-controller's leader stopped renewing an hour ago.
    stale = store.get(LEASES, "nodeset-controller", NAMESPACE)
    stale["spec"]["renewTime"] = rfc3339(time.time() - 3600)
    store.update(LEASES, stale, NAMESPACE)
    # topology-placer released its lease: koord-scheduler's pods have no scheduler.
    for name in lease_names("topology-placer"):
        released = store.get(LEASES, name, NAMESPACE)
        released["spec"]["holderIdentity"] = ""
        store.update(LEASES, released, NAMESPACE)
    store.create(
        "pods",
        {
            "metadata": {"name": "train-0", "namespace": "default"},
            "spec": {
                "schedulerName": "koord-scheduler",
                "containers": [{"name": "main", "image": "busybox"}],
            },
        },
        "default",
    )
    store.delete(
        "customresourcedefinitions.apiextensions.k8s.io", "deploymentpolicies.skyhook.nvidia.com"
    )

    code, checks = await doctor(cluster)
    assert code == 1, checks
    status, detail = checks["leader nodeset-controller"]
    assert status == "FAIL" and detail.startswith("stale: replica-1 renewed it 36")
    assert checks["leader topology-placer"] == ("FAIL", "released: no replica holds it")
    assert checks["leader maintenance-scheduler"][0] == "OK"
    assert checks["crd deploymentpolicies.skyhook.nvidia.com"] == (
        "FAIL",
        "not installed (DeploymentPolicy: read by maintenance-scheduler)",
    )
    assert checks["scheduler koord-scheduler"] == (
        "FAIL",
        "no scheduler serves it: topology-placer serves it but has no fresh leader; "
        "1 pod(s) pending (default/train-0)",
    )


async def test_doctor_says_skip_with_the_reason_for_what_the_caller_may_not_list(
    cluster: RunningServer,
) -> None:
    # The caller's RBAC does not let it list Leases: the checks that read them say so, and
    # doctor still runs every other check (no FAIL: exit 0).
    cluster.faults.error_rate = 1.0
    cluster.faults.error_code = 403
    cluster.faults.verbs = ["list"]
    cluster.faults.resources = ["leases"]
    code, checks = await doctor(cluster)
    assert code == 0, checks
    reason = "Leases not read: the caller may not list them (HTTP 403)"
    assert checks["leaders"] == ("SKIP", reason)
    assert checks["scheduler koord-scheduler"] == ("SKIP", reason)
    assert checks["crd nodesets.nodeflow.dev"][0] == "OK"


def cluster_status(**fields: Any) -> bytes:
    return msgspec.json.encode(SlurmClusterStatus(**fields))


async def test_doctor_with_nats_names_an_unreachable_slurm_cluster_and_its_api_version(
    cluster: RunningServer, nats_server: NatsServerProcess, bus: Bus
) -> None:
    await ensure_topology(bus.js, streams=STREAMS, kv_buckets=KV_BUCKETS, consumers=[])
    kv = await bus.js.key_value(SLURM_CLUSTERS_BUCKET)
    now = time.time()
    await kv.put(
        "main",
        cluster_status(
            cluster="main",
            reachable=True,
            last_poll_at=now,
            last_success_at=now,
            poll_interval_seconds=10,
            api_version="v0.0.42",
            nodes_listed=16,
        ),
    )
    await kv.put(
        "lab",
        cluster_status(
            cluster="lab",
            reachable=False,
            last_poll_at=now,
            poll_interval_seconds=10,
            error="connection refused",
        ),
    )
    code, checks = await doctor(cluster, "--nats", nats_server.url)
    assert code == 1, checks
    assert checks["slurm main"][0] == "OK"
    assert checks["slurm main"][1].startswith("slurmrestd API v0.0.42; last poll ")
    assert checks["slurm lab"][0] == "FAIL"
    assert checks["slurm lab"][1].startswith(
        "unreachable: connection refused; API version not negotiated"
    )
    assert checks["nats"][0] == "OK" and "JetStream" in checks["nats"][1]
    assert checks["nats streams"] == (
        "OK",
        f"all {len(STREAMS)} declared streams have a leader",
    )
