"""nodeset-controller: scale a NodeSet on a 4,000-node simulated cluster, the whole stack.

The simulator (Kubernetes API emulator, scheduler, kubelet, Slurm emulator) runs in a child
process (`python -m clustersim`), as the cluster would run elsewhere; NATS is a real
nats-server; k8s-watcher, slurm-syncer and nodeset-controller run as one process each, as they
are deployed (`python -m <service>`, configured by environment), with their service defaults
except k8s-watcher's client rate limit (printed). Figures, each until every pod is Ready (or
gone) *and* the
NodeSet status says so: 0 -> 1,000, 1,000 -> 0, 0 -> 4,000 and 4,000 -> 0 (safe deletion:
SlurmDelete, drain in the Slurm emulator, delete); seconds, pods per second, and the ratio
to two rates of the same emulator in the same run:

* raw create: POST /pods with spec.nodeName set, 32 in flight, nothing else (what the issue
  asks for);
* pinned-pod ceiling: the same number of pods as NodeSet pods are made -- pinned to a node
  by required node affinity, so the emulator's scheduler binds them -- created directly and
  timed until Ready. No controller can bring NodeSet pods up faster than this.

A NodeSet pod costs about three API writes (node claim, pod create, slurm-syncer's one
condition patch once its Slurm node registers), plus shares of NodeSlice, status and Event
writes; each step prints its API writes per pod, by sender, verb and kind, counted from
k8s-watcher's `applied` command outcomes (a scale-out's once slurm-syncer has written every
pod's Slurm state, waited for outside its time, so they are not counted in the next step's).
The service default of 300 QPS alone would cap a
scale-up near 100 pods/s; a 4,000-node deployment raises it like this benchmark does
(BENCH_KUBE_QPS, default 1000, burst twice that).

Target: 0 -> 4,000 under 60 s. BENCH_NODESET_NODES sets the cluster size (default 4000),
BENCH_NODESET_BUDGET the time budget of the whole run in seconds (default 900): a step that
has not settled when the budget runs out is reported as such and the rest is skipped;
BENCH_PROGRESS_SECONDS how often a step that has not settled prints its progress (default 30).
At the end it prints each service process's resident memory, now and at its peak, as a ratio
to the 200 MiB per-service target.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from bench.kube_api import process_cpu_seconds
from k8s_watcher.config import K8sWatcherConfig
from nodeflow_bus import Bus, BusOptions, ensure_topology
from nodeflow_contracts import codec
from nodeflow_contracts.k8s import CommandOutcome
from nodeflow_contracts.pod_protocol import (
    CLAIM_ANNOTATION,
    SLURM_STATE_CONDITION_PREFIX,
    slurm_state_condition,
)
from nodeflow_contracts.topology import KV_BUCKETS, STREAMS
from nodeflow_runtime.logs import configure_logging
from nodeflow_runtime.natsd import NatsServerProcess
from nodeset_controller.config import NodeSetControllerConfig
from slurm_syncer.syncer import SyncerOptions

NODES = int(os.environ.get("BENCH_NODESET_NODES", "4000"))
BUDGET = float(os.environ.get("BENCH_NODESET_BUDGET", "900"))
SMALL = min(1000, NODES)
NS = "default"
CLUSTER = "sim"
NODESET = "bench"
NODESETS_PATH = f"/apis/nodeflow.dev/v1alpha1/namespaces/{NS}/nodesets"
PODS_PATH = f"/api/v1/namespaces/{NS}/pods"
RAW_PODS = 1000
RAW_IN_FLIGHT = 32
PINNED_SAMPLE = min(1000, NODES)
TARGET_SECONDS = 60.0
# Resident memory each service may use at 10,000 nodes / 50,000 pods (issue #17); this bench
# prints the peak of each process it starts as a ratio to it.
MEMORY_TARGET_MIB = 200.0
POLL_SECONDS = 0.25
KUBE_QPS = float(os.environ.get("BENCH_KUBE_QPS", "1000"))
PROGRESS_SECONDS = float(os.environ.get("BENCH_PROGRESS_SECONDS", "30"))
# How long a settled scale-out waits (untimed) for slurm-syncer to write every pod's Slurm
# state before its API writes are counted (`slurm_states_written`).
SLURM_STATE_WAIT = 30.0

TEMPLATE: dict[str, Any] = {
    "metadata": {"labels": {"app": "slurmd"}},
    "spec": {
        "terminationGracePeriodSeconds": 0,
        "containers": [
            {"name": "slurmd", "image": "slurmd:24.11", "resources": {"requests": {"cpu": "1"}}}
        ],
    },
}


class WriteCounter:
    """API writes as k8s-watcher reports them: every command outcome `applied` on
    `outcome.k8s.v1.>` is one write request to the API server, counted by sender, verb and
    kind of object."""

    def __init__(self) -> None:
        self.applied: Counter[tuple[str, str, str]] = Counter()

    async def on_outcome(self, msg: Any) -> None:
        outcome = codec.decode(CommandOutcome, msg.data, subject=msg.subject)
        if outcome.outcome == "applied":
            self.applied[(outcome.sender, outcome.op, outcome.target.kind)] += 1

    def take(self) -> Counter[tuple[str, str, str]]:
        """The writes counted since the last call."""
        taken, self.applied = self.applied, Counter()
        return taken


class CpuMeter:
    """CPU seconds (user + system) each process used since the last `take`: where a step's
    time went when every process shares the same cores."""

    def __init__(self) -> None:
        self.pids: dict[str, int] = {}
        self.last: dict[str, float] = {}

    def watch(self, name: str, pid: int | None) -> None:
        if pid is not None:
            self.pids[name] = pid
            self.last[name] = process_cpu_seconds(pid)

    def take(self) -> dict[str, float]:
        taken: dict[str, float] = {}
        for name, pid in self.pids.items():
            now = process_cpu_seconds(pid)
            taken[name] = now - self.last[name]
            self.last[name] = now
        return taken


def report_cpu(
    label: str, pods: int, seconds: float, used: dict[str, float], pinned: float
) -> None:
    """CPU milliseconds per pod by process, and the share of the step's wall time that all
    of them used together (2.0 = both cores of this machine busy throughout). Then the rate
    that CPU alone allows: this machine's cores spent at that CPU per pod, and the emulator
    (one process, so one core at most) at its own, each as a ratio to the pinned-pod
    ceiling: no step can be faster than either, however little it waits."""
    if not used or not pods:
        return
    total = sum(used.values())
    shown = ", ".join(f"{name} {1000 * cpu / pods:.1f}" for name, cpu in used.items())
    print(
        f"   {label:<14} CPU ms per pod {1000 * total / pods:5.1f} ({shown}); "
        f"{total / seconds if seconds > 0 else 0.0:.2f} cores busy",
        flush=True,
    )
    cores = os.cpu_count() or 1
    bounds = [(f"{cores} cores at {1000 * total / pods:.1f} ms", pods * cores / total)]
    emulator = used.get("emulator", 0.0)
    if emulator > 0:
        bounds.append((f"emulator at {1000 * emulator / pods:.1f} ms", pods / emulator))
    shown = "; ".join(
        f"{what}: {rate:.0f} pods/s ({rate / pinned:.2f} x pinned-pod ceiling)"
        for what, rate in bounds
    )
    print(f"   {label:<14} CPU-bound rate: {shown}", flush=True)


def report_writes(
    label: str, pods: int, writes: Counter[tuple[str, str, str]], note: str = ""
) -> None:
    total = sum(writes.values())
    per_pod = total / pods if pods else 0.0
    shown = ", ".join(
        f"{sender} {op} {kind} {count / pods if pods else 0:.2f}"
        for (sender, op, kind), count in sorted(writes.items())
    )
    print(f"   {label:<14} API writes per pod {per_pod:5.2f} ({shown}){note}", flush=True)


class OutOfBudget(Exception):
    pass


@dataclass
class StepFigures:
    """One settled step: its pods, seconds, the CPU seconds each process used meanwhile and
    the API writes counted for it, by sender, verb and kind."""

    start: int
    end: int
    seconds: float
    cpu: dict[str, float]
    writes: Counter[tuple[str, str, str]]

    @property
    def pods(self) -> int:
        return abs(self.end - self.start)

    @property
    def label(self) -> str:
        return f"{self.start} -> {self.end}"


@dataclass
class Deadline:
    at: float

    def left(self) -> float:
        return self.at - time.monotonic()


def ready(pod: dict[str, Any]) -> bool:
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in (pod.get("status") or {}).get("conditions") or []
    )


def pinned_pod(name: str, node: str, labels: dict[str, str]) -> dict[str, Any]:
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
                ]
            }
        }
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "labels": labels},
        "spec": {**TEMPLATE["spec"], "affinity": affinity},
    }


def topology_for(nodes: int) -> str:
    """Blocks of 250 nodes: one third octet each, so 4,000 nodes fit in 10.174.0.0/16."""
    return f"spines=1,blocks_per_spine={-(-nodes // 250)},nodes_per_block=250"


class Cluster:
    """The simulator child process, driven over its HTTP API."""

    # How the figures name this cluster's API server.
    name = "emulator"

    def __init__(self, run_dir: Path, nodes: int = NODES) -> None:
        self.run_dir = run_dir
        self.nodes = nodes
        self.proc: asyncio.subprocess.Process | None = None
        self.env: dict[str, str] = {}
        self.session: aiohttp.ClientSession | None = None

    def topology(self) -> str:
        return topology_for(self.nodes)

    def simulator_args(self) -> list[str]:
        return [
            "--nodes",
            str(self.nodes),
            "--topology",
            self.topology(),
            "--run-dir",
            str(self.run_dir),
            "--kubelet-delay",
            "0",
            "--slurm-cluster",
            CLUSTER,
            "--log-level",
            "error",
        ]

    def new_session(self) -> aiohttp.ClientSession:
        return aiohttp.ClientSession()

    async def is_ready(self) -> bool:
        assert self.session is not None
        with contextlib.suppress(aiohttp.ClientError, KeyError):
            async with self.session.get(self.url + "/_sim/readyz") as response:
                return response.status == 200
        return False

    async def start(self) -> None:
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "clustersim",
            *self.simulator_args(),
            stdout=asyncio.subprocess.DEVNULL,
        )
        self.session = self.new_session()
        env_file = self.run_dir / "env"
        deadline = time.monotonic() + 180
        while True:
            if self.proc.returncode is not None or time.monotonic() > deadline:
                raise RuntimeError("the simulator child process did not start")
            if env_file.exists():
                self.env = dict(
                    line.split("=", 1) for line in env_file.read_text().splitlines() if "=" in line
                )
                if await self.is_ready():
                    return
            await asyncio.sleep(0.2)

    async def stop(self) -> None:
        if self.session is not None:
            await self.session.close()
        if self.proc is not None and self.proc.returncode is None:
            self.proc.terminate()
            await self.proc.wait()

    @property
    def url(self) -> str:
        return self.env["KUBE_API_URL"]

    def processes(self) -> dict[str, int]:
        """The cluster's processes whose CPU the figures count, by name."""
        return {self.name: self.proc.pid} if self.proc is not None else {}

    async def call(
        self, method: str, path: str, body: Any = None, content_type: str = "application/json"
    ) -> Any:
        assert self.session is not None
        headers = {"Content-Type": content_type}
        async with self.session.request(
            method, self.url + path, json=body, headers=headers
        ) as response:
            if response.status >= 400:
                raise RuntimeError(f"{method} {path}: HTTP {response.status}")
            return await response.json()

    async def node_names(self) -> list[str]:
        listed = await self.call("GET", "/api/v1/nodes")
        return sorted(item["metadata"]["name"] for item in listed["items"])

    async def pods(self, selector: str) -> list[dict[str, Any]]:
        listed = await self.call("GET", f"{PODS_PATH}?labelSelector={selector}")
        return list(listed["items"])

    async def claimed_nodes(self) -> int:
        listed = await self.call("GET", "/api/v1/nodes")
        return sum(
            1
            for item in listed["items"]
            if (item["metadata"].get("annotations") or {}).get(CLAIM_ANNOTATION)
        )

    async def nodeset_status(self) -> dict[str, Any]:
        return dict((await self.call("GET", f"{NODESETS_PATH}/{NODESET}")).get("status") or {})


async def wait_until(
    check: Callable[[], Awaitable[bool]],
    what: str,
    deadline: Deadline,
    progress: Callable[[], Awaitable[str]] | None = None,
) -> None:
    next_report = time.monotonic() + PROGRESS_SECONDS
    while not await check():
        if deadline.left() <= 0:
            detail = f" ({await progress()})" if progress is not None else ""
            raise OutOfBudget(f"{what}: not reached within the budget{detail}")
        if progress is not None and time.monotonic() > next_report:
            print(f"   ... {what}: {await progress()}", flush=True)
            next_report = time.monotonic() + PROGRESS_SECONDS
        await asyncio.sleep(POLL_SECONDS)


async def post_pods(cluster: Cluster, bodies: list[dict[str, Any]]) -> float:
    """Create the pods, RAW_IN_FLIGHT requests at a time; the seconds it took."""
    assert cluster.session is not None
    session, url = cluster.session, cluster.url + PODS_PATH
    queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    for body in bodies:
        queue.put_nowait(body)

    async def worker() -> None:
        while not queue.empty():
            body = queue.get_nowait()
            async with session.post(url, json=body) as response:
                if response.status != 201:
                    name = body["metadata"]["name"]
                    raise RuntimeError(f"create pod {name}: HTTP {response.status}")

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(RAW_IN_FLIGHT)))
    return time.perf_counter() - started


async def raw_create_rate(cluster: Cluster, nodes: list[str]) -> float:
    """Pods per second the emulator accepts over HTTP, nodeName preset, 32 in flight."""

    def body(index: int) -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": f"raw-{index}", "namespace": NS, "labels": {"bench": "raw"}},
            "spec": {
                "nodeName": nodes[index % len(nodes)],
                "terminationGracePeriodSeconds": 0,
                "containers": [
                    {"name": "c", "image": "pause", "resources": {"requests": {"cpu": "10m"}}}
                ],
            },
        }

    seconds = await post_pods(cluster, [body(index) for index in range(RAW_PODS)])
    await delete_all(cluster, "bench=raw")
    return RAW_PODS / seconds


async def delete_all(cluster: Cluster, selector: str) -> None:
    await cluster.call(
        "DELETE",
        f"{PODS_PATH}?labelSelector={selector}",
        {"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 0},
    )
    deadline = Deadline(time.monotonic() + 120)

    async def gone() -> bool:
        return not await cluster.pods(selector)

    await wait_until(gone, f"pods {selector} deleted", deadline)


async def pinned_ceiling(cluster: Cluster, nodes: list[str]) -> float:
    """Pods per second from create to Ready for pods pinned by node affinity (the NodeSet's
    kind of pod): the emulator's scheduler and kubelet alone, created 32 at a time."""
    labels = {"bench": "pinned"}
    names = [(f"pinned-{i}", nodes[-1 - i]) for i in range(min(PINNED_SAMPLE, len(nodes)))]

    async def all_ready() -> bool:
        # The last pod created is about the last to be Ready: until it is, listing them all
        # (what the NodeSet steps do only once the status says so) would only load the API
        # server whose rate this measures.
        last = await cluster.call("GET", f"{PODS_PATH}/{names[-1][0]}")
        if not ready(last):
            return False
        pods = await cluster.pods("bench=pinned")
        return len(pods) == len(names) and all(ready(p) for p in pods)

    started = time.perf_counter()
    await post_pods(cluster, [pinned_pod(name, node, labels) for name, node in names])
    await wait_until(all_ready, "pinned pods Ready", Deadline(time.monotonic() + 300))
    seconds = time.perf_counter() - started
    await delete_all(cluster, "bench=pinned")
    return len(names) / seconds


async def scale(cluster: Cluster, replicas: int, deadline: Deadline) -> float:
    started = time.perf_counter()
    await cluster.call(
        "PATCH",
        f"{NODESETS_PATH}/{NODESET}",
        {"spec": {"replicas": replicas}},
        "application/merge-patch+json",
    )

    async def status_says_so() -> bool:
        status = await cluster.nodeset_status()
        return (
            status.get("desiredNumberScheduled") == replicas
            and status.get("currentNumberScheduled") == replicas
            and status.get("numberReady") == replicas
            and status.get("updatedNumberScheduled") == replicas
        )

    async def settled() -> bool:
        # The status is cheap to read; the pods are listed only once it claims success.
        if not await status_says_so():
            return False
        pods = await cluster.pods(f"nodeflow.dev/nodeset={NODESET}")
        return len(pods) == replicas and all(ready(p) for p in pods)

    async def progress() -> str:
        pods = await cluster.pods(f"nodeflow.dev/nodeset={NODESET}")
        claimed = await cluster.claimed_nodes()
        status = await cluster.nodeset_status()
        shown = {k: v for k, v in status.items() if k not in ("conditions", "selector")}
        return (
            f"{time.perf_counter() - started:.0f} s: {claimed} nodes claimed, {len(pods)} pods, "
            f"{sum(1 for p in pods if ready(p))} ready, status {shown}"
        )

    await wait_until(settled, f"scale to {replicas}", deadline, progress)
    return time.perf_counter() - started


def shows_slurm_state(pod: dict[str, Any]) -> bool:
    """slurm-syncer has written the pod's Slurm node state (a known one) onto it."""
    return any(
        str(c.get("type", "")).startswith(SLURM_STATE_CONDITION_PREFIX)
        and c.get("type") != slurm_state_condition("Unknown")
        and c.get("status") == "True"
        for c in (pod.get("status") or {}).get("conditions") or []
    )


async def slurm_states_written(cluster: Cluster, deadline: Deadline) -> str:
    """After a scale-out has settled (pods Ready, status right), wait -- outside its time --
    until slurm-syncer has written every pod's Slurm state, so the step's API writes hold its
    condition patches instead of the next step's; at most SLURM_STATE_WAIT seconds."""
    until = min(time.monotonic() + SLURM_STATE_WAIT, time.monotonic() + max(deadline.left(), 0))
    while True:
        pods = await cluster.pods(f"nodeflow.dev/nodeset={NODESET}")
        missing = sum(1 for p in pods if not shows_slurm_state(p))
        if not missing:
            return ""
        if time.monotonic() > until:
            return f"; {missing} pods still without their Slurm state after {SLURM_STATE_WAIT:g} s"
        await asyncio.sleep(1.0)


def report(label: str, pods: int, seconds: float, raw: float, pinned: float) -> None:
    rate = pods / seconds if seconds > 0 else float("inf")
    print(
        f"   {label:<14} {seconds:7.1f} s {rate:7.1f} pods/s  {rate / raw:5.3f} x raw create"
        f"  {rate / pinned:5.2f} x pinned-pod ceiling",
        flush=True,
    )


async def main() -> None:
    configure_logging("bench-nodeset-controller", os.environ.get("BENCH_LOG_LEVEL", "error"))
    deadline = Deadline(time.monotonic() + BUDGET)
    with tempfile.TemporaryDirectory(prefix="bench-nodeset-") as tmp:
        nats = NatsServerProcess(Path(tmp) / "nats")
        await nats.start()
        cluster = Cluster(Path(tmp) / "sim")
        try:
            await cluster.start()
            await run(cluster, nats.url, deadline, nats.pid)
        except OutOfBudget as exc:
            print(f"   stopped: {exc} (budget {BUDGET:.0f} s)", flush=True)
        finally:
            await cluster.stop()
            await nats.kill()


class Services:
    """Services as child processes (by default k8s-watcher, slurm-syncer and
    nodeset-controller, started in that order), each with its health/metrics port; their logs
    go to files in the run directory."""

    NAMES: tuple[tuple[str, str], ...] = (
        ("k8s-watcher", "k8s_watcher"),
        ("slurm-syncer", "slurm_syncer"),
        ("nodeset-controller", "nodeset_controller"),
    )

    def __init__(
        self, run_dir: Path, env: dict[str, str], names: tuple[tuple[str, str], ...] = NAMES
    ) -> None:
        self.run_dir = run_dir
        self.env = env
        self.names = names
        self.procs: dict[str, asyncio.subprocess.Process] = {}
        self.urls: dict[str, str] = {}

    def log_file(self, name: str) -> Path:
        return self.run_dir / f"{name}.log"

    async def start(self, session: aiohttp.ClientSession) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        for name, module in self.names:
            port = free_port()
            env = {**self.env, "HTTP_HOST": "127.0.0.1", "HTTP_PORT": str(port)}
            env["INSTANCE_ID"] = f"bench-{name}"
            with self.log_file(name).open("ab") as log_handle:
                self.procs[name] = await asyncio.create_subprocess_exec(
                    sys.executable, "-m", module, env=env, stdout=log_handle, stderr=log_handle
                )
            self.urls[name] = f"http://127.0.0.1:{port}"
            # In order: the controller's first plan should see the watcher's KV filled.
            await self.wait_ready(session, name)

    async def wait_ready(self, session: aiohttp.ClientSession, name: str) -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.procs[name].returncode is not None:
                tail = self.log_file(name).read_text()[-2000:]
                raise RuntimeError(f"{name} exited:\n{tail}")
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                async with session.get(self.urls[name] + "/readyz") as response:
                    if response.status == 200:
                        return
            await asyncio.sleep(0.2)
        raise RuntimeError(f"{name} not ready within 120 s")

    async def metric(self, session: aiohttp.ClientSession, name: str, series: str) -> float:
        """Sum of a series (all label sets) on a service's /metrics."""
        async with session.get(self.urls[name] + "/metrics") as response:
            text = await response.text()
        total = 0.0
        for line in text.splitlines():
            if line.startswith(series) and line[len(series) : len(series) + 1] in (" ", "{"):
                total += float(line.rsplit(" ", 1)[1])
        return total

    def memory_mib(self, name: str) -> tuple[float, float]:
        """A service process's resident memory now and at its peak (VmRSS, VmHWM), in MiB."""
        fields: dict[str, float] = {}
        status = Path(f"/proc/{self.procs[name].pid}/status").read_text()
        for line in status.splitlines():
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                fields[key] = int(value.split()[0]) / 1024
        return fields.get("VmRSS", 0.0), fields.get("VmHWM", 0.0)

    def report_memory(self, indent: str = "   ") -> None:
        """Each service's RSS now and at its peak, as a ratio to MEMORY_TARGET_MIB."""
        for name, _ in self.names:
            now, peak = self.memory_mib(name)
            verdict = "met" if peak < MEMORY_TARGET_MIB else "NOT met"
            print(
                f"{indent}{name:<22} RSS {now:6.1f} MiB, peak {peak:6.1f} MiB (ratio "
                f"{peak / MEMORY_TARGET_MIB:.2f} to the {MEMORY_TARGET_MIB:.0f} MiB target: "
                f"{verdict})",
                flush=True,
            )

    async def stop(self) -> None:
        for proc in self.procs.values():
            if proc.returncode is None:
                proc.terminate()
        for proc in self.procs.values():
            try:
                await asyncio.wait_for(proc.wait(), 30)
            except TimeoutError:
                proc.kill()
                await proc.wait()


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def service_env(cluster: Cluster, nats_url: str, *, raise_kube_qps: bool = True) -> dict[str, str]:
    """The services' environment: the cluster's env file, NATS, and k8s-watcher at KUBE_QPS
    (at its service default when not `raise_kube_qps`)."""
    env = {
        **os.environ,
        **cluster.env,
        "NATS_URL": nats_url,
        "LOG_LEVEL": os.environ.get("BENCH_LOG_LEVEL", "error"),
    }
    if raise_kube_qps:
        env.update({"KUBE_QPS": str(KUBE_QPS), "KUBE_BURST": str(int(2 * KUBE_QPS))})
    return env


async def create_nodeset(
    cluster: Cluster,
    name: str = NODESET,
    replicas: int = 0,
    template: dict[str, Any] | None = None,
    **spec: Any,
) -> None:
    """A NodeSet of the benchmark's Slurm cluster (by default the benchmark's, at 0 replicas,
    with its pod template); `spec`: more of its spec."""
    await cluster.call(
        "POST",
        NODESETS_PATH,
        {
            "apiVersion": "nodeflow.dev/v1alpha1",
            "kind": "NodeSet",
            "metadata": {"name": name, "namespace": NS},
            "spec": {
                "replicas": replicas,
                "slurmCluster": CLUSTER,
                "template": template if template is not None else TEMPLATE,
                **spec,
            },
        },
    )


async def run(
    cluster: Cluster, nats_url: str, deadline: Deadline, nats_pid: int | None = None
) -> list[StepFigures]:
    """The NodeSet steps on `cluster`, each reported as it settles; their figures."""
    settled_steps: list[StepFigures] = []
    nodes = await cluster.node_names()
    raw = await raw_create_rate(cluster, nodes)
    pinned = await pinned_ceiling(cluster, nodes)
    print(
        f"   {len(nodes)} nodes; {cluster.name} raw pod create {raw:.0f} pods/s "
        f"({RAW_PODS} pods, {RAW_IN_FLIGHT} in flight); pinned pods create -> Ready "
        f"{pinned:.1f} pods/s ({PINNED_SAMPLE} pods)",
        flush=True,
    )
    bus = await Bus.connect(nats_url, options=BusOptions(name="bench-nodeset"))
    await ensure_topology(bus.js, streams=STREAMS, kv_buckets=KV_BUCKETS)
    writes = WriteCounter()
    outcomes = await bus.nc.subscribe("outcome.k8s.v1.>", cb=writes.on_outcome)
    env = service_env(cluster, nats_url)
    watcher_defaults = K8sWatcherConfig()
    controller_defaults = NodeSetControllerConfig()
    syncer_defaults = SyncerOptions()
    print(
        f"   settings: k8s-watcher kube_qps={KUBE_QPS:g} kube_burst={int(2 * KUBE_QPS)} "
        f"(service default {watcher_defaults.kube_qps:g}/{watcher_defaults.kube_burst}) "
        f"command_concurrency={watcher_defaults.command_concurrency}; nodeset-controller "
        f"(defaults) debounce={controller_defaults.debounce_seconds:g}s "
        f"resync={controller_defaults.resync_seconds:g}s "
        f"publish_window={controller_defaults.publish_window} "
        f"max_commands_in_flight={controller_defaults.max_commands_in_flight}; slurm-syncer "
        f"(defaults) poll={syncer_defaults.poll_interval:g}s "
        f"updates={syncer_defaults.max_concurrent_updates}",
        flush=True,
    )
    services = Services(cluster.run_dir / "services", env)
    assert cluster.session is not None
    cpu = CpuMeter()
    try:
        await services.start(cluster.session)
        for name, pid in cluster.processes().items():
            cpu.watch(name, pid)
        cpu.watch("nats-server", nats_pid)
        for name, proc in services.procs.items():
            cpu.watch(name, proc.pid)
        await create_nodeset(cluster)

        async def empty_status() -> bool:
            return (await cluster.nodeset_status()).get("desiredNumberScheduled") == 0

        await wait_until(empty_status, "empty NodeSet status", deadline)
        steps = [(0, SMALL), (SMALL, 0)]
        if NODES > SMALL:
            steps += [(0, NODES), (NODES, 0)]
        for start, end in steps:
            writes.take()
            cpu.take()
            seconds = await scale(cluster, end, deadline)
            used = cpu.take()
            unwritten = await slurm_states_written(cluster, deadline) if end > start else ""
            step = StepFigures(start, end, seconds, used, writes.take())
            settled_steps.append(step)
            report(step.label, step.pods, seconds, raw, pinned)
            report_writes(step.label, step.pods, step.writes, unwritten)
            report_cpu(step.label, step.pods, seconds, used, pinned)
            drained = (await cluster.nodeset_status()).get("numberDrain")
            if drained:
                # Pods recreated on nodes drained by the previous scale-in keep Slurm's DRAIN
                # until slurm-syncer clears it; the status reports it as it is.
                print(f"   note: numberDrain={drained} after the step", flush=True)
            if end == NODES == 4000:  # the target; other sizes have none yet
                verdict = "met" if seconds < TARGET_SECONDS else "NOT met"
                print(f"   target 0 -> {NODES} under {TARGET_SECONDS:.0f} s: {verdict}", flush=True)
    finally:
        with contextlib.suppress(aiohttp.ClientError, RuntimeError, KeyError):
            session = cluster.session
            figures = {
                series: await services.metric(session, "nodeset-controller", series)
                for series in (
                    "nodeflow_nodeset_controller_plans_total",
                    "nodeflow_nodeset_controller_messages_total",
                    "nodeflow_nodeset_controller_deferred_changes_total",
                )
            }
            print(
                f"   controller: {figures['nodeflow_nodeset_controller_plans_total']:.0f} plans, "
                f"{figures['nodeflow_nodeset_controller_messages_total']:.0f} messages, "
                f"{figures['nodeflow_nodeset_controller_deferred_changes_total']:.0f} changes "
                "deferred by the in-flight window",
                flush=True,
            )
        services.report_memory()
        await services.stop()
        await outcomes.unsubscribe()
        await bus.close()
    return settled_steps
