"""`make run KUBE=real` (launcher --kube real) and `make stop`: the launcher starts a real
control plane of its own (tools/kube/real_kube.sh, state under the run dir, the simulator's
nodes as KWOK nodes, our CRDs), the Slurm emulator following its NodeSet pods, and the
services against it; a NodeSet there gets a Ready pod whose Slurm node registers. `make stop`
after the launcher was killed -9 still stops the control plane and every service."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

import aiohttp
import pytest

from nodeflow_runtime.envfile import read_env_file
from nodeflow_runtime.launcher import pid_alive
from tests.e2e.chaos_support import READY_LINE, LauncherOutput, Slurm
from tests.realkube.support import STEP_TIMEOUT, kubectl, until

pytestmark = [pytest.mark.real_kube, pytest.mark.timeout(600)]

NODESET = """
apiVersion: nodeflow.dev/v1alpha1
kind: NodeSet
metadata: {name: made, namespace: default}
spec:
  replicas: 1
  slurmCluster: sim
  template:
    spec:
      containers:
        - {name: slurmd, image: "slurmd:24.11", resources: {requests: {cpu: "1"}}}
"""


async def test_make_run_kube_real_runs_the_stack_on_its_own_control_plane_and_make_stop_ends_it(
    tmp_path: Path,
) -> None:
    run_dir = tmp_path / "run"
    launcher = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "nodeflow_runtime.launcher",
        "--run-dir",
        str(run_dir),
        "--kube",
        "real",
        "--nodes",
        "2",
        "--nats-port",
        "0",
        "--log-level",
        "warning",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    output = LauncherOutput(launcher)
    component_pids: list[int] = []
    try:
        await output.wait_for(READY_LINE, 0, timeout=300)
        env = read_env_file(run_dir / "env")
        kubeconfig = Path(env["KUBECONFIG"])
        assert kubeconfig == run_dir / "real-kube" / "kubeconfig"
        _, nodes, _ = await kubectl("get", "nodes", "-o", "name", kubeconfig=kubeconfig)
        assert len(nodes.split()) == 2
        # The services' namespace is the deploy manifest's, Pod Security labels included.
        _, enforce, _ = await kubectl(
            "get",
            "namespace",
            "nodeflow-system",
            "-o",
            "jsonpath={.metadata.labels.pod-security\\.kubernetes\\.io/enforce}",
            kubeconfig=kubeconfig,
        )
        assert enforce == "restricted"
        await kubectl("apply", "-f", "-", kubeconfig=kubeconfig, stdin=NODESET)
        async with aiohttp.ClientSession() as session:
            slurm = Slurm(session, env)

            async def registered() -> bool:
                return any("IDLE" in states for states in (await slurm.nodes()).values())

            await until(registered, "the NodeSet pod's Slurm node IDLE", STEP_TIMEOUT * 2)
        component_pids = [
            int(path.read_text()) for path in (run_dir / "real-kube" / "pids").iterdir()
        ]
        assert len(component_pids) == 5  # etcd, the three Kubernetes components, KWOK
    finally:
        # The launcher dies without stopping anything; `make stop` must clean up after it.
        if launcher.returncode is None:
            launcher.send_signal(signal.SIGKILL)
            await launcher.wait()
        await output.close()
        stop = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "nodeflow_runtime.launcher", "--stop", "--run-dir", str(run_dir)
        )
        await stop.wait()
    assert stop.returncode == 0
    assert not (run_dir / "real-kube").exists()

    async def all_gone() -> bool:
        return not [pid for pid in component_pids if pid_alive(pid)]

    await until(all_gone, "every control plane component stopped")
