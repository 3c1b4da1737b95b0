"""NodeSet scale on a real Kubernetes control plane, beside the same run on the emulator (#13).

The figure users compare with SUNK and Slinky: NodeSet 0 -> 4,000 pods Ready on 4,000 KWOK
nodes and 4,000 -> 0 through safe deletion (SlurmDelete, drain, delete), with the real
kube-apiserver, etcd, kube-controller-manager, kube-scheduler and KWOK of
tools/kube/real_kube.sh, the Slurm emulator following the NodeSet pods (clustersim's bridge,
as `make run KUBE=real` runs it) and k8s-watcher, slurm-syncer and nodeset-controller as one
process each. The same steps run first on the emulator (bench.nodeset_controller), so the two
sets of figures come from one run on one machine; each set has its own limits measured on its
own API server (raw create, pinned pod create -> Ready through the scheduler and the kubelet or
KWOK). On the real control plane the DaemonSet anchor runs first (bench._daemonset_anchor:
kube-controller-manager's DaemonSet controller over the same nodes, 0 -> N Ready and N -> 0),
and each NodeSet step of the same size is printed as a ratio to it: its rate, our processes'
CPU per pod against kube-controller-manager's, and API writes per pod against the DaemonSet
controller's (counted from the API server's audit log). kube-controller-manager and
kube-scheduler get k8s-watcher's client rate limit
(BENCH_KUBE_QPS, default 1000), as a cluster of thousands of nodes is tuned, and KWOK's node
leases last 120 s (KUBE_NODE_LEASE_SECONDS) instead of 40: at 40 s, 4,000 nodes' renewals
saturate the API server of a 2-core machine and the nodes flap NotReady. Then k8s-watcher's
API change -> NATS event latency on the real API server.

Needs the control plane's binaries: built from their Go modules on the first run (about 7
minutes on an idle 2-core machine, then cached in /var/tmp/nodeflow-kube); without Go and
without a cached build it prints why it is skipped. BENCH_NODESET_NODES sets the cluster size
(default 4000), BENCH_NODESET_BUDGET the time budget of each run (default 900 s);
BENCH_REAL_KUBE_ONLY=1 skips the emulator run.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import ssl
import tempfile
import time
from pathlib import Path

import aiohttp

from bench import nodeset_controller as stack
from bench._daemonset_anchor import AuditLog, report_against_anchor, run_anchor
from bench.k8s_watcher import measure_latency
from nodeflow_bus import Bus, BusOptions
from nodeflow_runtime.logs import configure_logging
from nodeflow_runtime.natsd import NatsServerProcess

REPO = Path(__file__).resolve().parent.parent
REAL_KUBE = REPO / "tools" / "kube" / "real_kube.sh"
KUBE_CACHE = Path(os.environ.get("KUBE_CACHE", "/var/tmp/nodeflow-kube"))
LATENCY_NODES = 100


def exported(text: str) -> dict[str, str]:
    """The `export NAME=value` lines real_kube.sh start prints."""
    values: dict[str, str] = {}
    for line in text.splitlines():
        if line.startswith("export ") and "=" in line:
            name, value = line.removeprefix("export ").split("=", 1)
            values[name] = value
    return values


class RealCluster(stack.Cluster):
    """The Slurm emulator following a real API server (`python -m clustersim
    --follow-kubeconfig`) in a child process; the figures talk to the API server itself,
    as its admin."""

    name = "real control plane"

    def __init__(
        self, run_dir: Path, nodes: int, control_plane: dict[str, str], state: Path
    ) -> None:
        super().__init__(run_dir, nodes)
        self.control_plane = control_plane
        self.state = state

    def processes(self) -> dict[str, int]:
        # real_kube.sh keeps each component's pid in a file named after it.
        found = {"slurm emulator": self.proc.pid} if self.proc is not None else {}
        for pid_file in sorted((self.state / "pids").glob("*")):
            found[pid_file.name] = int(pid_file.read_text().split()[0])
        return found

    @property
    def url(self) -> str:
        return self.control_plane["NODEFLOW_KUBE_URL"]

    def simulator_args(self) -> list[str]:
        return [
            "--follow-kubeconfig",
            self.control_plane["NODEFLOW_KUBE_KUBECONFIG"],
            "--run-dir",
            str(self.run_dir),
            "--slurm-cluster",
            stack.CLUSTER,
            "--log-level",
            "error",
        ]

    def new_session(self) -> aiohttp.ClientSession:
        tls = ssl.create_default_context(cafile=self.control_plane["NODEFLOW_KUBE_CA"])
        return aiohttp.ClientSession(
            headers={"Authorization": f"Bearer {self.control_plane['NODEFLOW_KUBE_TOKEN']}"},
            connector=aiohttp.TCPConnector(ssl=tls, limit=256),
        )

    async def is_ready(self) -> bool:
        # The bridge writes its env file once it has applied the first list of pods.
        return True


def control_plane_unavailable() -> str:
    """Why the real control plane cannot run here ("" when it can)."""
    if shutil.which("go") is None and not any(KUBE_CACHE.glob("kubernetes-*/bin/kube-apiserver")):
        return "no Go toolchain and no cached control plane build in " + str(KUBE_CACHE)
    if shutil.which("kubectl") is None:
        return "kubectl not found (make tools installs it)"
    return ""


async def control_plane(state: Path, nodes: int, topology: str) -> dict[str, str]:
    """Start (building first if needed) the control plane with `nodes` KWOK GPU nodes."""
    env = {**os.environ, "KUBE_STATE": str(state), "KUBE_NODES": str(nodes)}
    env["KUBE_TOPOLOGY"] = topology
    # The control plane's own clients get k8s-watcher's rate limit (KUBE_QPS): at their
    # defaults the scheduler binds at most 50 pods a second.
    env["KUBE_CLIENT_QPS"] = f"{stack.KUBE_QPS:g}"
    # Thousands of KWOK nodes renewing 40 s leases saturate this machine's API server and
    # flap NotReady (their pods with them); a 120 s lease keeps them Ready.
    env.setdefault("KUBE_NODE_LEASE_SECONDS", "120")
    # The audit log names who wrote what: the DaemonSet anchor's writes per pod come from it.
    env["KUBE_AUDIT"] = "1"
    started = time.perf_counter()
    proc = await asyncio.create_subprocess_exec(
        str(REAL_KUBE), "start", env=env, stdout=asyncio.subprocess.PIPE
    )
    out, _ = await proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"real_kube.sh start failed (logs in {state}/logs)")
    print(
        f"   control plane with {nodes:,} KWOK nodes up in {time.perf_counter() - started:.0f} s",
        flush=True,
    )
    return exported(out.decode())


async def stop_control_plane(state: Path) -> None:
    env = {**os.environ, "KUBE_STATE": str(state)}
    proc = await asyncio.create_subprocess_exec(str(REAL_KUBE), "stop", env=env)
    await proc.wait()


async def real_run(tmp: Path) -> None:
    state = tmp / "kube"
    nats = NatsServerProcess(tmp / "nats")
    try:
        plane = await control_plane(state, stack.NODES, stack.topology_for(stack.NODES))
        await nats.start()
        cluster = RealCluster(tmp / "bridge", stack.NODES, plane, state)
        try:
            await cluster.start()
            deadline = stack.Deadline(time.monotonic() + stack.BUDGET)
            print(
                f"   -- the DaemonSet anchor (kube-controller-manager), {stack.NODES:,} nodes",
                flush=True,
            )
            anchor, controller_writes = await run_anchor(
                cluster, stack.NODES, AuditLog(state / "audit.log"), deadline
            )
            print("   -- the NodeSet on the same control plane", flush=True)
            steps = await stack.run(cluster, nats.url, deadline, nats.pid)
            report_against_anchor(steps, anchor, controller_writes)
            bus = await Bus.connect(nats.url, options=BusOptions(name="bench-latency"))
            try:
                # k8s-watcher was stopped with the other services: measure with a fresh one.
                services = stack.Services(
                    cluster.run_dir / "latency",
                    stack.service_env(cluster, nats.url),
                    (("k8s-watcher", "k8s_watcher"),),
                )
                assert cluster.session is not None
                await services.start(cluster.session)
                try:
                    nodes = (await cluster.node_names())[:LATENCY_NODES]
                    await measure_latency(
                        bus, Path(plane["NODEFLOW_KUBE_KUBECONFIG"]), nodes, label="real"
                    )
                finally:
                    await services.stop()
            finally:
                await bus.close()
        except stack.OutOfBudget as exc:
            print(f"   stopped: {exc} (budget {stack.BUDGET:.0f} s)", flush=True)
        finally:
            await cluster.stop()
    finally:
        await nats.kill()
        await stop_control_plane(state)


async def main() -> None:
    configure_logging("bench-nodeset-real-kube", os.environ.get("BENCH_LOG_LEVEL", "error"))
    why_not = control_plane_unavailable()
    if why_not:
        print(f"   skipped: {why_not}", flush=True)
        return
    if os.environ.get("BENCH_REAL_KUBE_ONLY") != "1":
        print(f"   -- the emulator, {stack.NODES:,} nodes", flush=True)
        await stack.main()
    print(f"   -- the real control plane, {stack.NODES:,} KWOK nodes", flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-real-kube-") as tmp:
        try:
            await real_run(Path(tmp))
        except (RuntimeError, aiohttp.ClientError) as exc:
            print(f"   stopped: {exc}", flush=True)
