"""`python -m clustersim`: run the cluster simulator until SIGINT/SIGTERM.

Example::

    python -m clustersim --nodes 16 --topology spines=2,blocks_per_spine=2,nodes_per_block=4 \\
        --run-dir .run --kubelet-delay 0.2 --job-runtime 5

Writes `<run-dir>/kubeconfig` and updates `<run-dir>/env` (KUBECONFIG, KUBE_API_URL,
SLURM_CLUSTERS, SLURM_URL, SLURM_TOKEN_FILE, SLURM_JWT_KEY_FILE, SLURM_USER, SIM_ADMIN_URL, and
per cluster SLURM_<CLUSTER>_URL, _TOKEN_FILE, _JWT_KEY_FILE and _USER);
`GET /_sim/readyz` on the Kubernetes port answers once everything is up.

With `--follow-kubeconfig PATH` it emulates Slurm only, beside the real Kubernetes API server
that kubeconfig names (tools/kube/real_kube.sh): the NodeSet pods there register and lose
their Slurm nodes (clustersim.bridge). The env file then holds that KUBECONFIG, and is written
once the bridge has applied its first list of pods.

With `--nats-url URL --nats-admin-password-file PATH` (make run's nats-server) the emulator
holds that NATS as an install shows it (clustersim.localnats), for `kubectl nodeflow`'s own
port-forward.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

import structlog

from clustersim.bridge import run_slurm_bridge
from clustersim.cluster.spec import (
    ClusterSpec,
    SpecError,
    check_spec,
    default_topology,
    load_spec_file,
    merge_cli_overrides,
)
from clustersim.localnats import LocalNats
from clustersim.runner import DEFAULT_CRD_DIR, SimulatorConfig, run_simulator
from clustersim.slurm.releases import DEFAULT_SLURM_VERSION, SLURM_RELEASES

log = structlog.get_logger("clustersim")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m clustersim", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--nodes", type=int, help="node count (default: the topology's product)")
    parser.add_argument(
        "--topology",
        help="shape, e.g. spines=2,blocks_per_spine=4,nodes_per_block=8 (default: grows with "
        "--nodes)",
    )
    parser.add_argument("--spec", type=Path, help="cluster spec YAML (flags override it)")
    parser.add_argument("--run-dir", type=Path, default=Path(".run"))
    parser.add_argument("--kubelet-delay", type=float, default=0.2, help="bound -> Running, s")
    parser.add_argument("--job-runtime", type=float, default=5.0, help="finite pods run, s")
    parser.add_argument("--failure-runtime", type=float, help=":fail/:oom pods run, s")
    parser.add_argument("--job-backoff", type=float, default=10.0, help="Job retry base delay, s")
    parser.add_argument("--taint", action="append", default=[], help="key[=value]:Effect")
    parser.add_argument("--name-prefix", help="node name prefix")
    parser.add_argument(
        "--slurm-cluster",
        action="append",
        default=[],
        help="emulated Slurm cluster name (repeatable; the first is the default; 'sim')",
    )
    parser.add_argument("--slurm-user", default="slurm")
    parser.add_argument(
        "--slurm-version",
        choices=sorted(SLURM_RELEASES),
        default=DEFAULT_SLURM_VERSION,
        help="emulated Slurm release: the slurmrestd API versions served (24.11: v0.0.41-42, "
        f"26.05: v0.0.42-45; default {DEFAULT_SLURM_VERSION})",
    )
    parser.add_argument("--kube-port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--admin-port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--crd-dir", type=Path, default=DEFAULT_CRD_DIR)
    parser.add_argument(
        "--runtime-config",
        default="",
        help="alpha APIs to serve, as kube-apiserver's: e.g. scheduling.k8s.io/v1alpha2=true "
        "(the Workload API's PodGroup); none by default",
    )
    parser.add_argument(
        "--follow-kubeconfig",
        type=Path,
        help="emulate Slurm only, registering the NodeSet pods of this real API server",
    )
    parser.add_argument(
        "--nats-url",
        help="a nats-server on this host (make run's): shown in nodeflow-system as the Service "
        "nats, a pod behind it whose client port forwards there, and the Secret "
        "nodeflow-admin-nats (needs --nats-admin-password-file)",
    )
    parser.add_argument("--nats-monitor-url", default="", help="its monitoring endpoint")
    parser.add_argument(
        "--nats-admin-password-file", type=Path, help="the nodeflow-admin password it accepts"
    )
    parser.add_argument("--log-level", default="info")
    return parser


def local_nats_from_args(args: argparse.Namespace) -> LocalNats | None:
    if not args.nats_url:
        return None
    if args.nats_admin_password_file is None:
        raise SystemExit("--nats-url needs --nats-admin-password-file")
    return LocalNats(
        client_url=args.nats_url,
        admin_password_file=args.nats_admin_password_file,
        monitor_url=args.nats_monitor_url,
    )


def config_from_args(args: argparse.Namespace) -> SimulatorConfig:
    spec = load_spec_file(str(args.spec)) if args.spec else ClusterSpec()
    spec = merge_cli_overrides(
        spec,
        nodes=args.nodes,
        topology=args.topology,
        taints=args.taint,
        name_prefix=args.name_prefix,
    )
    if spec.topology is None and args.nodes is not None:
        spec = dataclasses.replace(
            spec, topology=default_topology(args.nodes, spec.third_octet_start)
        )
    check_spec(spec)
    return SimulatorConfig(
        cluster=spec,
        kubelet_delay=args.kubelet_delay,
        job_runtime=args.job_runtime,
        failure_runtime=args.failure_runtime,
        job_backoff_seconds=args.job_backoff,
        run_dir=args.run_dir,
        crd_dir=args.crd_dir if args.crd_dir and args.crd_dir.is_dir() else None,
        slurm_clusters=tuple(args.slurm_cluster) or ("sim",),
        slurm_user=args.slurm_user,
        slurm_version=args.slurm_version,
        slurm_driver_interval=0.5,
        kube_port=args.kube_port,
        admin_port=args.admin_port,
        local_nats=local_nats_from_args(args),
        runtime_config=tuple(e for e in args.runtime_config.split(",") if e),
    )


def stop_on_signals() -> asyncio.Event:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    return stop


async def run_bridge(config: SimulatorConfig, kubeconfig: Path) -> None:
    stop = stop_on_signals()
    async with run_slurm_bridge(config, kubeconfig) as bridge:
        log.info("clustersim following a real API server", kube=bridge.kube_url)
        await stop.wait()
        log.info("clustersim stopping")


async def run(config: SimulatorConfig) -> None:
    stop = stop_on_signals()
    async with run_simulator(config) as sim:
        log.info(
            "clustersim running",
            kube=sim.kube_url,
            slurm=sim.slurm_url,
            admin=sim.admin_url,
            env=str(sim.env_path),
        )
        await stop.wait()
        log.info("clustersim stopping")


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    level = logging.getLevelNamesMapping().get(args.log_level.upper(), logging.INFO)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(level))
    try:
        config = config_from_args(args)
    except (SpecError, OSError) as exc:
        print(f"clustersim: {exc}", file=sys.stderr)
        return 2
    if args.follow_kubeconfig is not None:
        asyncio.run(run_bridge(config, args.follow_kubeconfig))
    else:
        asyncio.run(run(config))
    return 0


if __name__ == "__main__":
    sys.exit(main())
