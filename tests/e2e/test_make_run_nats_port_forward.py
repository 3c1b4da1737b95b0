"""`kubectl nodeflow` on `make run`'s stack as on a cluster (issue #35): an operator who exports
only `.run/env`'s KUBECONFIG, no NATS_* at all, runs `decisions`, `dlq list`, `why` and
`doctor`, and each reaches the stack's nats-server by the CLI's own port-forward (the Service
`nats` of nodeflow-system, a Ready pod behind it, `pods/portforward`) as nodeflow-admin with
the password of the Secret `nodeflow-admin-nats`, as the simulator shows them
(clustersim.localnats). The NATS pod is on no node, so a drain never waits for it."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from nodeflow_bus import Bus, BusOptions, Credentials
from nodeflow_contracts import subjects
from nodeflow_contracts.permissions import ADMIN_USER
from nodeflow_runtime.envfile import read_env_file
from tests.e2e.test_kubectl_nodeflow import Operator, made_run, nodemaintenance

pytestmark = pytest.mark.slow

NAMESPACE = "nodeflow-system"


class KubeconfigOnly(Operator):
    """A shell with only `export KUBECONFIG=.run/kubeconfig` (none of the NATS_* variables
    `.run/env` also names, nor the test's own) and the plugin on the PATH."""

    def __init__(self, run_dir: Path) -> None:
        super().__init__(run_dir)
        self.kubeconfig = read_env_file(run_dir / "env")["KUBECONFIG"]

    async def sh(self, script: str, stdin: str = "") -> str:
        bin_dir = str(Path(sys.executable).parent)
        environment = {
            k: v for k, v in os.environ.items() if not k.startswith(("NATS_", "KUBE"))
        } | {"PATH": f"{bin_dir}:{os.environ.get('PATH', '')}"}
        process = await asyncio.create_subprocess_exec(
            "bash",
            "-c",
            f"set -euo pipefail\nexport KUBECONFIG={self.kubeconfig}\n{script}",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            env=environment,
        )
        output, _ = await process.communicate(stdin.encode())
        text = output.decode(errors="replace")
        assert process.returncode == 0, f"{script}\n---\n{text}"
        # Nothing on stderr but what the command says (no asyncio traceback at its exit).
        assert "Traceback" not in text, f"{script}\n---\n{text}"
        return text


@pytest.fixture
async def stack(tmp_path: Path) -> AsyncIterator[Operator]:
    async with made_run(tmp_path / "run", "--nodes", "4") as running:
        yield running


async def test_rule_on_make_run_the_nats_verbs_reach_nats_by_the_clis_own_port_forward(
    stack: Operator,
) -> None:
    shell = KubeconfigOnly(stack.run_dir)

    # The install's shapes (k8s/nats): Service `nats` selecting the StatefulSet's pod, whose
    # named port `client` is 4222; the pod Running and Ready, on no node.
    service = json.loads(await shell.sh(f"kubectl get service nats -n {NAMESPACE} -o json"))
    assert {p["name"]: p["targetPort"] for p in service["spec"]["ports"]} == {
        "client": "client",
        "monitor": "monitor",
    }
    pod = json.loads(await shell.sh(f"kubectl get pod nats-0 -n {NAMESPACE} -o json"))
    assert pod["metadata"]["labels"] == service["spec"]["selector"]
    assert pod["status"]["phase"] == "Running" and not pod["spec"].get("nodeName")

    # A decision a running service published (maintenance-scheduler, for a NodeMaintenance
    # whose drain ends: nothing of NATS' is on the node).
    nodes = json.loads(await shell.sh("kubectl get nodes -o json"))["items"]
    node = sorted(n["metadata"]["name"] for n in nodes)[0]
    await shell.sh("kubectl apply -f -", stdin=json.dumps(nodemaintenance("first", node)))
    await shell.until_output(
        "kubectl get nodemaintenances.maintenance.nvidia.com first -o "
        "jsonpath='{.status.conditions[?(@.type==\"Ready\")].reason}'",
        "Ready",
    )
    decisions = await shell.until_output(
        "kubectl nodeflow decisions --object default/first", "Ready: Draining -> Ready"
    )
    assert (
        f"maintenance-scheduler  NodeMaintenance default/first (node {node})  Scheduled: "
        in decisions
    ), decisions
    verdict = await shell.sh("kubectl nodeflow why nodemaintenance first")
    assert "latest decisions:" in verdict and "not read" not in verdict, verdict

    # A dead letter: a command k8s-watcher cannot decode.
    env = read_env_file(stack.run_dir / "env")
    poison = subjects.k8s_command(ADMIN_USER, "patch")
    bus = await Bus.connect(
        env["NATS_URL"],
        credentials=Credentials.from_env(env),
        options=BusOptions(name="e2e-poison", initial_connect_deadline=5.0),
    )
    try:
        await bus.publish(poison, b"{not json")
    finally:
        await bus.close()
    letters = await shell.until_output("kubectl nodeflow dlq list", f"  {poison}  ")
    row = next(line.split() for line in letters.splitlines() if f"  {poison}  " in line)
    assert row[2:4] == [poison, "decode"], letters
    assert letters.splitlines()[-1] == "1 dead letters", letters

    doctor = await shell.sh("kubectl nodeflow doctor")
    checks = {line[6:].split("  ", 1)[0]: line[:4].strip() for line in doctor.splitlines()}
    assert checks["nats"] == "OK" and checks["nats streams"] == "OK", doctor
    assert checks[f"secret {NAMESPACE}/{ADMIN_USER}-nats"] == "OK", doctor
    assert checks["slurm sim"] == "OK", doctor
