"""Kubernetes API emulator benchmark: one line per figure, each with its target.

* pod creates per second through kubernetes-asyncio over HTTP (64 in flight), target >= 2,000/s,
  with the emulator process's CPU use during the run (busy fraction, CPU per create), which
  shows whether the client or the emulator limits the figure
* time to list 50,000 pods over HTTP (one request, JSON decoded by the client)
* RSS of a store holding 10,000 nodes and 50,000 pods, target < 2 GiB

The emulator runs in a child process (as it does in the dev stack), so client and server do not
share one core.  ``python -m bench.kube_api`` runs it; ``--serve`` is the child's entry point.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes_asyncio import client, config

from clustersim.kube.server import serve
from clustersim.kube.store import Store

CREATE_COUNT = 6_000
CONCURRENCY = 64
LIST_PODS = 50_000
MEMORY_NODES = 10_000
MEMORY_PODS = 50_000
CREATE_TARGET = 2_000.0
MEMORY_TARGET_MIB = 2_048.0


def node_manifest(i: int) -> dict[str, Any]:
    name = f"gpu-node-{i:05d}"
    conditions = [
        {
            "type": t,
            "status": "False",
            "reason": f"Kubelet{t}",
            "message": "ok",
            "lastHeartbeatTime": "2025-01-01T00:00:00Z",
            "lastTransitionTime": "2025-01-01T00:00:00Z",
        }
        for t in ("MemoryPressure", "DiskPressure", "PIDPressure")
    ] + [
        {
            "type": "Ready",
            "status": "True",
            "reason": "KubeletReady",
            "message": "ready",
            "lastHeartbeatTime": "2025-01-01T00:00:00Z",
            "lastTransitionTime": "2025-01-01T00:00:00Z",
        }
    ]
    resources = {"cpu": "128", "memory": "2Ti", "nvidia.com/gpu": "8", "pods": "110"}
    return {
        "metadata": {
            "name": name,
            "labels": {
                "kubernetes.io/hostname": name,
                "nvidia.com/gpu.product": "H100",
                "topology.kubernetes.io/zone": f"block-{i // 32}",
            },
        },
        "spec": {"providerID": f"sim://{name}"},
        "status": {
            "capacity": resources,
            "allocatable": resources,
            "conditions": conditions,
            "addresses": [
                {"type": "InternalIP", "address": f"10.0.{i // 250}.{i % 250}"},
                {"type": "Hostname", "address": name},
            ],
            "nodeInfo": {"kubeletVersion": "v1.32.0", "containerRuntimeVersion": "sim://1"},
        },
    }


def pod_manifest(i: int, node: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "containers": [
            {
                "name": "slurmd",
                "image": "registry.local/slurmd:24.11",
                "resources": {"limits": {"nvidia.com/gpu": "8"}, "requests": {"cpu": "4"}},
                "env": [{"name": "SLURM_CLUSTER", "value": "sim"}],
            }
        ],
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    }
    if node:
        spec["nodeName"] = node
    return {
        "metadata": {"name": f"slurmd-{i:06d}", "labels": {"app": "slurmd", "nodeset": "ns-a"}},
        "spec": spec,
    }


def preload(store: Store, nodes: int, pods: int) -> None:
    for i in range(nodes):
        store.create("nodes", node_manifest(i))
    for i in range(pods):
        node = f"gpu-node-{i % max(nodes, 1):05d}" if nodes else None
        store.create("pods", pod_manifest(i, node))
        store.patch(
            "pods",
            f"slurmd-{i:06d}",
            {
                "status": {
                    "phase": "Running",
                    "podIP": f"10.1.{i // 250 % 250}.{i % 250}",
                    "conditions": [{"type": "Ready", "status": "True"}],
                }
            },
            subresource="status",
        )


async def serve_forever(kubeconfig: Path, nodes: int, pods: int) -> None:
    store = Store()
    preload(store, nodes, pods)
    async with serve(store, kubeconfig_path=kubeconfig.with_suffix(".tmp")):
        kubeconfig.with_suffix(".tmp").rename(kubeconfig)
        await asyncio.Event().wait()


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU a process has used so far (Linux /proc; 0.0 once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    # After the command name: state is field 3, utime 14 and stime 15 (man 5 proc).
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class ServerProcess:
    def __init__(self, nodes: int = 0, pods: int = 0) -> None:
        self.nodes, self.pods = nodes, pods
        self.dir = tempfile.TemporaryDirectory(prefix="bench-kube-")
        self.kubeconfig = Path(self.dir.name) / "kubeconfig"
        self.proc: asyncio.subprocess.Process | None = None

    async def __aenter__(self) -> Path:
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "bench.kube_api",
            "--serve",
            str(self.kubeconfig),
            "--nodes",
            str(self.nodes),
            "--pods",
            str(self.pods),
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 90
        while not self.kubeconfig.exists():
            if time.monotonic() > deadline or self.proc.returncode is not None:
                raise RuntimeError("emulator child process did not start")
            await asyncio.sleep(0.1)
        return self.kubeconfig

    def cpu_seconds(self) -> float:
        """User + system CPU the emulator process has used so far."""
        assert self.proc is not None
        return process_cpu_seconds(self.proc.pid)

    async def __aexit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.terminate()
            await self.proc.wait()
        self.dir.cleanup()


async def api_client(kubeconfig: Path) -> client.ApiClient:
    configuration = client.Configuration()
    await config.load_kube_config(config_file=str(kubeconfig), client_configuration=configuration)
    configuration.connection_pool_maxsize = CONCURRENCY
    return client.ApiClient(configuration)


@dataclass(frozen=True)
class CreateRun:
    rate: float  # creates per second, end to end
    server_busy: float  # fraction of the wall time the emulator process was on a CPU
    server_us_per_create: float  # emulator CPU per create, microseconds

    @property
    def server_capacity(self) -> float:
        """Creates/s the emulator's own CPU cost would allow with a client that costs nothing."""
        return 1e6 / self.server_us_per_create


async def bench_creates(*, decode_models: bool) -> CreateRun:
    server = ServerProcess()
    async with server as kubeconfig:
        api = await api_client(kubeconfig)
        core: Any = client.CoreV1Api(api)
        queue: asyncio.Queue[int] = asyncio.Queue()
        for i in range(CREATE_COUNT):
            queue.put_nowait(i)

        async def worker() -> None:
            while not queue.empty():
                i = queue.get_nowait()
                await core.create_namespaced_pod(
                    "default", pod_manifest(i), _preload_content=decode_models
                )

        cpu_before = server.cpu_seconds()
        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
        elapsed = time.perf_counter() - started
        server_cpu = server.cpu_seconds() - cpu_before
        await api.close()
    return CreateRun(CREATE_COUNT / elapsed, server_cpu / elapsed, 1e6 * server_cpu / CREATE_COUNT)


async def bench_list() -> tuple[float, int]:
    async with ServerProcess(nodes=1_000, pods=LIST_PODS) as kubeconfig:
        api = await api_client(kubeconfig)
        core: Any = client.CoreV1Api(api)
        started = time.perf_counter()
        response = await core.list_pod_for_all_namespaces(_preload_content=False)
        body = json.loads(await response.read())
        elapsed = time.perf_counter() - started
        await api.close()
    return elapsed, len(body["items"])


def rss_mib() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def bench_memory() -> tuple[float, float]:
    before = rss_mib()
    store = Store()  # the whole store stays referenced until after the RSS reading
    started = time.perf_counter()
    preload(store, MEMORY_NODES, MEMORY_PODS)
    elapsed = time.perf_counter() - started
    after = rss_mib()
    assert len(store.list("pods").items) == MEMORY_PODS
    del before
    return after, elapsed


def _create_line(label: str, run: CreateRun) -> str:
    return (
        f"kube_api pod creates/s via kubernetes-asyncio ({CONCURRENCY} in flight, {label}): "
        f"{run.rate:,.0f}/s (target >= {CREATE_TARGET:,.0f}/s; emulator busy "
        f"{run.server_busy:.0%} of the time, {run.server_us_per_create:,.0f} us CPU per create, "
        f"i.e. ~{run.server_capacity:,.0f}/s if the client cost nothing)"
    )


async def main() -> None:
    # kubernetes-asyncio spends most of its CPU turning responses into V1Pod models; the raw
    # figure (same requests, response body left undecoded) shows what the emulator sustains.
    # The emulator's own CPU time per create (read from /proc for the child process) says
    # which side limits each figure.
    raw = await bench_creates(decode_models=False)
    print(_create_line("raw responses", raw), flush=True)
    modelled = await bench_creates(decode_models=True)
    bound = "client-bound" if modelled.server_busy < 0.8 else "server-bound"
    print(_create_line(f"responses decoded to V1Pod; {bound}", modelled), flush=True)
    elapsed, count = await bench_list()
    print(f"kube_api list {count:,} pods over HTTP: {elapsed:.2f} s (no target)", flush=True)
    rss, load_time = bench_memory()
    print(
        f"kube_api RSS with {MEMORY_NODES:,} nodes + {MEMORY_PODS:,} pods: {rss:,.0f} MiB "
        f"(target < {MEMORY_TARGET_MIB:,.0f} MiB; loaded in-process in {load_time:.1f} s)",
        flush=True,
    )


def _cli() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--serve", type=Path)
    parser.add_argument("--nodes", type=int, default=0)
    parser.add_argument("--pods", type=int, default=0)
    args = parser.parse_args()
    if args.serve:
        os.environ.setdefault("PYTHONUNBUFFERED", "1")
        asyncio.run(serve_forever(args.serve, args.nodes, args.pods))
    else:
        asyncio.run(main())


if __name__ == "__main__":
    _cli()
