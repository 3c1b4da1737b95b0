"""`kubectl nodeflow` (issue #35) on `make run`'s stack (the launcher, 16 nodes), as an
operator runs it: `.run/env` sourced (the kubeconfig, NATS' URL and the operators' NATS
credentials), the plugin found by kubectl on the PATH. A NodeMaintenance waiting for a slot is
explained by `why nodemaintenance` and `decisions` (both name the budget); every leader's
Kubernetes Lease is shown by `kubectl get leases` and checked by `doctor`, which names a
second scheduler serving koord-scheduler; a poison command is listed by
`dead-letters` with its error, shown whole by `dlq show` and replayed to its subject by
`dlq replay`."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
import os
import shutil
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from nodeflow_bus import Bus, BusOptions, Credentials
from nodeflow_contracts import subjects
from nodeflow_contracts.permissions import ADMIN_USER, lease_names
from nodeflow_runtime.envfile import read_env_file
from tests.e2e.test_make_run import read_until_ready
from tests.integration.topology_placer.conftest import gang_pod, pod_group_object, topology_object

pytestmark = pytest.mark.slow

STEP_TIMEOUT = 60.0
HELD = "waiting for a slot: 1 of 1 maxParallelOperations in progress"
MUST_GATHER_BLOCK = json.dumps(
    {"gatherStrategy": [{"layer": "BlockLayer", "strategy": "MustGather"}]}
)


def nodemaintenance(name: str, node: str) -> dict[str, Any]:
    return {
        "apiVersion": "maintenance.nvidia.com/v1alpha1",
        "kind": "NodeMaintenance",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"requestorID": "ops.example.com", "nodeName": node, "cordon": True},
    }


class Operator:
    """A shell with `.run/env` sourced and the plugin on the PATH."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir

    async def sh(self, script: str, stdin: str = "") -> str:
        bin_dir = str(Path(sys.executable).parent)
        process = await asyncio.create_subprocess_exec(
            "bash",
            "-c",
            f"set -euo pipefail\nset -a; . {self.run_dir}/env; set +a\n{script}",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            env={**os.environ, "PATH": f"{bin_dir}:{os.environ.get('PATH', '')}"},
        )
        output, _ = await process.communicate(stdin.encode())
        text = output.decode(errors="replace")
        assert process.returncode == 0, f"{script}\n---\n{text}"
        return text

    async def until_output(self, script: str, wanted: str) -> str:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + STEP_TIMEOUT
        while True:
            text = await self.sh(script)
            if wanted in text:
                return text
            assert loop.time() < deadline, f"{script!r} never said {wanted!r}:\n{text}"
            await asyncio.sleep(0.5)


@contextlib.asynccontextmanager
async def made_run(run_dir: Path, *launcher_args: str) -> AsyncIterator[Operator]:
    """`make run` (the launcher, with `launcher_args`) and an operator's shell on it; the
    launcher stopped as `make run` is, by SIGINT."""
    if shutil.which("kubectl") is None:
        pytest.skip("kubectl is not installed: the plugin runs under it")
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "nodeflow_runtime.launcher",
        "--run-dir",
        str(run_dir),
        "--nats-port",
        "0",
        "--log-level",
        "warning",
        *launcher_args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        await read_until_ready(process, timeout=300)
        yield Operator(run_dir)
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGINT)
            try:
                await asyncio.wait_for(process.wait(), 90)
            except TimeoutError:
                process.kill()
                await process.wait()
        # `make stop`: whatever the launcher left (a real control plane's components run in
        # sessions of their own) is stopped too.
        stop = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "nodeflow_runtime.launcher", "--stop", "--run-dir", str(run_dir)
        )
        await stop.wait()


@pytest.fixture
async def operator(tmp_path: Path) -> AsyncIterator[Operator]:
    async with made_run(tmp_path / "run") as running:
        yield running


async def test_kubectl_nodeflow_names_the_budget_the_leaders_and_the_dead_letters(
    operator: Operator,
) -> None:
    await why_nodemaintenance_names_the_budget(operator)
    await leases_and_doctor_name_every_leader(operator)
    await dead_letters_are_listed_shown_and_replayed(operator)


async def why_nodemaintenance_names_the_budget(operator: Operator) -> None:
    """Two NodeMaintenances with maxParallelOperations 1: `why` and `decisions` say the
    second waits for the first's slot."""
    nodes = json.loads(await operator.sh("kubectl get nodes -o json"))["items"]
    first, second = sorted(n["metadata"]["name"] for n in nodes)[:2]
    # maxParallelOperations 1 (upstream's default): the first takes the one slot and keeps
    # it while Ready; the second waits for it.
    await operator.sh("kubectl apply -f -", stdin=json.dumps(nodemaintenance("first", first)))
    await operator.until_output(
        "kubectl get nodemaintenances.maintenance.nvidia.com first -o "
        "jsonpath='{.status.conditions[?(@.type==\"Ready\")].reason}'",
        "Ready",
    )
    await operator.sh("kubectl apply -f -", stdin=json.dumps(nodemaintenance("second", second)))

    verdict = await operator.until_output("kubectl nodeflow why nodemaintenance second", HELD)
    assert verdict.splitlines()[0] == (
        f"NodeMaintenance default/second (node {second}, requestor ops.example.com): "
        f"Pending: {HELD}"
    )
    assert "maintenance-scheduler" in verdict  # the latest decision, from NATS
    decisions = await operator.sh("kubectl nodeflow decisions --object default/second")
    assert f"NodeMaintenance default/second (node {second})  no-slot: {HELD}" in decisions
    first_decisions = await operator.sh(
        "kubectl nodeflow decisions --service maintenance-scheduler --object default/first"
    )
    assert "Scheduled" in first_decisions and "default/second" not in first_decisions


async def leases_and_doctor_name_every_leader(operator: Operator) -> None:
    """Who leads each controller, where kubectl looks, and `doctor` on a healthy stack."""

    async def lease_holders() -> dict[str, str]:
        leases = json.loads(await operator.sh("kubectl get leases -n nodeflow-system -o json"))
        return {
            lease["metadata"]["name"]: lease["spec"].get("holderIdentity", "")
            for lease in leases["items"]
        }

    wanted = {
        name
        for service in (
            "k8s-watcher",
            "slurm-syncer",
            "nodeset-controller",
            "maintenance-scheduler",
            "topology-placer",
        )
        for name in lease_names(service)
    }
    loop = asyncio.get_running_loop()
    deadline = loop.time() + STEP_TIMEOUT
    while not (wanted <= {n for n, holder in (await lease_holders()).items() if holder}):
        assert loop.time() < deadline, await lease_holders()
        await asyncio.sleep(0.5)
    table = await operator.sh("kubectl get leases -n nodeflow-system")
    assert "maintenance-scheduler-skyhook" in table

    # `doctor` on the healthy stack: every leader, NATS and the simulated Slurm cluster OK
    # (the services run as processes, not Deployments: said, not failed); exit 0.
    healthy = await operator.sh("kubectl nodeflow doctor")
    for service in wanted:
        assert f"OK    leader {service}  " in healthy, healthy
    assert "OK    nats  " in healthy and "OK    crd nodesets.nodeflow.dev  " in healthy
    assert "OK    scheduler koord-scheduler  served by topology-placer;" in healthy
    assert "SKIP  ready  not deployed as Deployments in nodeflow-system" in healthy
    assert any(
        line.startswith("OK    slurm ") and "slurmrestd API v0.0." in line
        for line in healthy.splitlines()
    ), healthy
    # A second scheduler leading as koord-scheduler (its leader election Lease): named, exit 1.
    second_scheduler = {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": "koord-scheduler", "namespace": "default"},
        "spec": {
            "holderIdentity": "koord-scheduler-0",
            "leaseDurationSeconds": 3600,
            "renewTime": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        },
    }
    await operator.sh("kubectl apply -f -", stdin=json.dumps(second_scheduler))
    racing = await operator.sh("kubectl nodeflow doctor || echo exit $?")
    assert (
        "FAIL  scheduler koord-scheduler  served by 2 schedulers (topology-placer, "
        "Lease default/koord-scheduler): they race to bind the same pods" in racing
    ), racing
    assert racing.splitlines()[-1] == "exit 1"
    await operator.sh("kubectl delete lease koord-scheduler -n default")


async def dead_letters_are_listed_shown_and_replayed(operator: Operator) -> None:
    """A poison command: k8s-watcher cannot decode it and dead-letters it with the error."""
    env = read_env_file(operator.run_dir / "env")
    bus = await Bus.connect(
        env["NATS_URL"],
        credentials=Credentials.from_env(env),
        options=BusOptions(name="e2e-poison", initial_connect_deadline=5.0),
    )
    try:
        await bus.publish(subjects.k8s_command(ADMIN_USER, "patch"), b"{not json")
    finally:
        await bus.close()
    letters = await operator.until_output(
        "kubectl nodeflow dead-letters", f"cmd.k8s.v1.{ADMIN_USER}.patch"
    )
    poison = subjects.k8s_command(ADMIN_USER, "patch")
    row = next(line.split() for line in letters.splitlines() if f"  {poison}  " in line)
    assert row[2:4] == [poison, "decode"] and row[-2:] == ["{not", "json"]
    shown = await operator.sh(f"kubectl nodeflow dlq show {row[0]}")
    assert "Nodeflow-Error-Kind: decode" in shown and "(9 bytes, not JSON):\n  '{not json'" in shown
    # Replayed to its subject (no fix: k8s-watcher dead-letters it again, under a new number).
    replayed = await operator.sh(f"kubectl nodeflow dlq replay {row[0]}")
    assert f"{row[0]} dlq.{poison} -> {poison}: replayed as " in replayed
    again = await operator.until_output(
        f"kubectl nodeflow dlq list --subject {poison}", "1 dead letters"
    )
    assert again.splitlines()[1].split()[0] != row[0]


SLURM = (
    'slurm() { curl -s -H "X-SLURM-USER-NAME: $SLURM_USER" '
    '-H "X-SLURM-USER-TOKEN: $(cat "$SLURM_TOKEN_FILE")" -H "Content-Type: application/json" '
    '"$SLURM_URL/slurm/v0.0.42$1" "${@:2}"; }\n'
)
EXAMPLES = Path(__file__).resolve().parents[2] / "k8s" / "examples"


async def test_kubectl_nodeflow_why_pod_names_the_job_that_holds_a_scale_in(
    operator: Operator,
) -> None:
    await why_pod_names_the_busy_node_that_holds_a_scale_in(operator)


async def why_pod_names_the_busy_node_that_holds_a_scale_in(operator: Operator) -> None:
    """A NodeSet scaled in while a job runs on all its nodes: the pods to remove are marked
    for deletion and kept; `why pod` says so, and that their Slurm node is busy."""
    await operator.sh(f"kubectl apply -f {EXAMPLES / 'nodeset.yaml'}")  # 4 replicas
    await operator.until_output(
        SLURM + "slurm /nodes | jq -r '[.nodes[] | select(.state == [\"IDLE\"])] | length'",
        "4",
    )
    await operator.sh(
        SLURM + 'slurm /job/submit -X POST -d \'{"job": {"name": "train", '
        '"minimum_nodes": 4, "script": "#!/bin/bash\\nsleep 3600\\n", '
        '"current_working_directory": "/tmp", "environment": ["PATH=/bin"]}}\''
    )
    await operator.until_output(
        SLURM + "slurm /jobs | jq -r '.jobs[] | .job_state | join(\",\")'", "RUNNING"
    )
    await operator.sh("kubectl scale nodeset gpu --replicas=2")
    marked = (
        await operator.until_output(
            "kubectl get pods -l nodeflow.dev/nodeset=gpu -o json | jq -r '.items[] | "
            'select(any(.status.conditions[]; .type == "SlurmDelete")) | .metadata.name\'',
            "gpu",
        )
    ).split()
    job_id = (await operator.sh(SLURM + "slurm /jobs | jq -r '.jobs[0].job_id'")).strip()
    # slurm-syncer names the job it read on the busy node (docs/slurm-syncer.md rule 19).
    verdict = await operator.until_output(
        f"kubectl nodeflow why pod {marked[0]}", f"allocated to jobs {job_id} as of "
    )
    assert "marked for deletion: SlurmDelete=True" in verdict
    assert f"Slurm node sim/{marked[0]}:" in verdict
    assert "(not deleted while it runs a job)" in verdict
    assert "NodeSet: default/gpu" in verdict
    # The NodeSet says the same where kubectl looks: ScaleDownWaiting names the busy pods
    # (each once slurm-syncer has drained its node).
    for name in marked:
        waiting = await operator.until_output(
            "kubectl get nodeset gpu -o jsonpath='"
            '{.status.conditions[?(@.type=="ScaleDownWaiting")].reason} '
            '{.status.conditions[?(@.type=="ScaleDownWaiting")].message}\'',
            f"{name} (node busy with jobs, draining)",
        )
        assert waiting.startswith("PodsBusy 2 pods wait: ")
    # `why nodeset` joins the replicas with that condition and the controller's decisions.
    nodeset = await operator.sh("kubectl nodeflow why nodeset gpu")
    assert nodeset.splitlines()[0].startswith("NodeSet default/gpu: ")
    assert "2 replicas wanted; 4 pods, " in nodeset.splitlines()[0]
    held = next(line for line in nodeset.splitlines() if line.startswith("ScaleDownWaiting="))
    assert held.startswith("ScaleDownWaiting=True PodsBusy: 2 pods wait: ")
    assert all(f"{name} (node busy with jobs, draining)" in held for name in marked)


async def test_kubectl_nodeflow_rollout_undo_rolls_the_nodeset_pods_back(
    operator: Operator,
) -> None:
    """Rule 7e through the plugin: a NodeSet's template changed makes a second
    ControllerRevision and the pods roll to it; `rollout undo` puts the first template back,
    the pods roll back, and the first template's revision is made again as 3, never duplicated."""
    manifest = yaml.safe_load((EXAMPLES / "nodeset.yaml").read_text())
    manifest["spec"]["replicas"] = 2
    manifest["spec"]["updateStrategy"]["rollingUpdate"]["maxUnavailable"] = "100%"
    await operator.sh("kubectl apply -f -", stdin=json.dumps(manifest))
    hashes = (
        "kubectl get pods -l nodeflow.dev/nodeset=gpu -o json | jq -r "
        "'[.items[] | select(.metadata.deletionTimestamp == null) | "
        '.metadata.labels["controller-revision-hash"]] | unique | join(",")\''
    )
    first = await rollout_settled(operator, revisions=1)
    await operator.until_output(hashes, first)

    await operator.sh(
        'kubectl patch nodeset gpu --type=json -p \'[{"op": "replace", '
        '"path": "/spec/template/spec/containers/0/image", '
        '"value": "ghcr.io/nodeflow/slurmd:25.05"}]\''
    )
    second = await rollout_settled(operator, revisions=2)
    assert second != first
    history = await operator.sh("kubectl nodeflow rollout history nodeset gpu")
    assert "slurmd=ghcr.io/nodeflow/slurmd:24.11" in history
    assert "slurmd=ghcr.io/nodeflow/slurmd:25.05" in history

    undone = await operator.sh("kubectl nodeflow rollout undo nodeset gpu")
    assert undone.strip() == "nodeset.nodeflow.dev/gpu rolled back to revision 1"
    image = await operator.sh(
        "kubectl get nodeset gpu -o jsonpath='{.spec.template.spec.containers[0].image}'"
    )
    assert image == "ghcr.io/nodeflow/slurmd:24.11"
    assert await rollout_settled(operator, revisions=2, newest=3) == first
    revisions = json.loads(
        await operator.sh("kubectl get controllerrevisions -l nodeflow.dev/nodeset=gpu -o json")
    )["items"]
    assert sorted(r["revision"] for r in revisions) == [2, 3]
    assert {r["metadata"]["name"]: r["revision"] for r in revisions}[f"gpu-{first}"] == 3


async def rollout_settled(operator: Operator, *, revisions: int, newest: int = 0) -> str:
    """Waits until the NodeSet has `revisions` ControllerRevisions (the newest numbered
    `newest`, default `revisions`) and every pod runs the update revision; its hash."""
    newest = newest or revisions
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 4 * STEP_TIMEOUT
    while True:
        nodeset = json.loads(await operator.sh("kubectl get nodeset gpu -o json"))
        listed = json.loads(
            await operator.sh("kubectl get controllerrevisions -l nodeflow.dev/nodeset=gpu -o json")
        )["items"]
        pods = json.loads(await operator.sh("kubectl get pods -l nodeflow.dev/nodeset=gpu -o json"))
        status = nodeset.get("status") or {}
        update = status.get("updateRevision", "")
        running = {
            p["metadata"]["labels"].get("controller-revision-hash")
            for p in pods["items"]
            if not p["metadata"].get("deletionTimestamp")
        }
        numbers = sorted(r["revision"] for r in listed)
        # The newest revision's name: until the status names it, the rollout has not begun
        # (the status and the pods may still show the revision before the change).
        newest_name = next((r["metadata"]["name"] for r in listed if r["revision"] == newest), None)
        done = (
            len(listed) == revisions
            and numbers[-1:] == [newest]
            and update == newest_name
            and status.get("currentRevision") == update
            and len(pods["items"]) == nodeset["spec"]["replicas"]
            and {f"gpu-{h}" for h in running} == {update}
        )
        if done:
            return str(update).removeprefix("gpu-")
        assert loop.time() < deadline, (status, numbers, running)
        await asyncio.sleep(1.0)


async def test_kubectl_nodeflow_why_names_the_domain_a_gang_lacks_and_a_paused_skyhook(
    operator: Operator,
) -> None:
    await why_names_the_domain_a_gang_lacks_and_a_paused_skyhook(operator)


async def why_names_the_domain_a_gang_lacks_and_a_paused_skyhook(operator: Operator) -> None:
    """An impossible gang (MustGather in one block, every member larger than any node):
    `why gang` names the domain it could not find; a Skyhook paused with the plugin's own
    `skyhook pause`: `why skyhook` says it is paused."""
    docs = [topology_object(), pod_group_object("big", 4, MUST_GATHER_BLOCK)]
    docs += [gang_pod(f"big-{rank}", "big", gpus=9) for rank in range(4)]
    await operator.sh("kubectl apply -f -", stdin=yaml.safe_dump_all(docs))
    verdict = await operator.until_output(
        "kubectl nodeflow why gang big", "no BlockLayer domain offers 4 slots"
    )
    assert verdict.splitlines()[0].startswith("PodGroup default/big: ")
    assert "topology-placer" in verdict  # its decision, from NATS

    await operator.sh(f"kubectl apply -f {EXAMPLES / 'skyhook.yaml'}")
    paused = await operator.sh("kubectl nodeflow skyhook pause gpu-init -y")
    assert "paused" in paused
    stopped = await operator.until_output("kubectl nodeflow why skyhook gpu-init", "(paused)")
    assert stopped.splitlines()[0].startswith("Skyhook gpu-init: ")


SLINKY_CHART_NODESET = (
    Path(__file__).resolve().parents[1] / "fixtures" / "slinky" / "chart-default.yaml"
)


async def test_kubectl_nodeflow_migrates_a_slinky_nodeset_and_releases_a_deleted_nodesets_claims(
    operator: Operator, tmp_path: Path
) -> None:
    """`migrate slinky` turns Slinky's chart NodeSet into ours, which the API server admits
    (a server-side dry run against our CRD); `release-claim` refuses a node its NodeSet pod
    runs on; a NodeSet deleted leaves its claims on its nodes, and `release-claim` removes one
    once its pods are gone, then finds nothing left."""
    ours = tmp_path / "ours.yaml"
    notes = await operator.sh(
        f"kubectl nodeflow migrate slinky --slurm-cluster sim --accept-changes "
        f"< {SLINKY_CHART_NODESET} > {ours}"
    )
    assert "note: NodeSet slurm/slurm-worker-slinky:" in notes
    await operator.sh(
        "kubectl create namespace slurm --dry-run=client -o yaml | kubectl apply -f -"
    )
    admitted = await operator.sh(f"kubectl apply --dry-run=server -f {ours}")
    assert "nodeset.nodeflow.dev/slurm-worker-slinky created (server dry run)" in admitted

    await operator.sh(f"kubectl apply -f {EXAMPLES / 'nodeset.yaml'}")  # 4 replicas
    claimed = (
        await operator.until_output(
            "kubectl get nodes -o json | jq -r '.items[] | "
            'select(.metadata.annotations["nodeflow.dev/nodeset"] == "default.gpu") | '
            ".metadata.name' | wc -l | tr -d ' '",
            "4",
        )
    ).strip()
    assert claimed == "4"
    node = (
        await operator.sh(
            "kubectl get nodes -o json | jq -r '[.items[] | "
            'select(.metadata.annotations["nodeflow.dev/nodeset"] == "default.gpu") | '
            ".metadata.name] | first'"
        )
    ).strip()
    refused = await operator.sh(f"kubectl nodeflow release-claim {node} || true")
    # Its NodeSet pod still runs there: never released, whatever --force says.
    assert f"error: node/{node} not released: NodeSet pods still on it (default/gpu-" in refused
    await operator.sh("kubectl delete nodeset gpu --wait=false")
    await operator.until_output(
        "kubectl get pods -l nodeflow.dev/nodeset=gpu -o name | wc -l | tr -d ' '", "0"
    )
    released = await operator.sh(f"kubectl nodeflow release-claim {node}")
    assert released.strip() == (
        f"node/{node} claim released (was NodeSet default/gpu; NodeSet default/gpu no longer "
        "exists; no NodeSet pod on the node)"
    )
    annotation = await operator.sh(
        f"kubectl get node {node} -o jsonpath='{{.metadata.annotations.nodeflow\\.dev/nodeset}}'"
    )
    assert annotation.strip() == ""
    again = await operator.sh(f"kubectl nodeflow release-claim {node}")
    assert again.strip() == f"node/{node} has no NodeSet claim: nothing to release"


VERBS_NODES = ("node-014", "node-015")
VERBS_MANIFESTS = """
apiVersion: skyhook.nvidia.com/v1alpha1
kind: DeploymentPolicy
metadata:
  name: all-at-once
spec:
  default:
    budget:
      percent: 100
    strategy:
      fixed:
        initialBatch: 2
---
apiVersion: skyhook.nvidia.com/v1alpha1
kind: Skyhook
metadata:
  name: verbs
spec:
  nodeSelectors:
    matchLabels:
      nodeflow.dev/e2e-skyhook: verbs
  deploymentPolicy: all-at-once
  packages:
    tuning:
      version: 1.0.0
      image: registry.local/tuning
---
apiVersion: nodewright.nvidia.com/v1alpha1
kind: NodeWright
metadata:
  name: stuck
spec:
  nodeSelectors:
    matchLabels:
      nodeflow.dev/e2e-skyhook: stuck
  deploymentPolicy: no-such-policy
  packages:
    hello:
      version: 1.1.1
      image: ghcr.io/nvidia/skyhook-packages/shellscript
"""


@pytest.mark.timeout(480)  # nine waits on the controller, each bounded on its own
async def test_kubectl_nodeflow_skyhook_verbs_steer_the_controller_and_why_names_what_holds_it(
    operator: Operator,
) -> None:
    """The Skyhook verbs against the running controller, each where it is needed: a node
    ignored runs nothing (`why skyhook` names it) until unignored; `package logs` shows the
    stages the agent ran; `package rerun` runs the package again on one node; `disable` and
    `enable` are read back by `why`; `reset` while paused runs nothing until `resume`, then
    every stage again on every node (the earlier Complete Jobs prove nothing). A NodeWright
    naming a DeploymentPolicy that does not exist: `why nodewright` names it."""
    await operator.sh(f"kubectl label node {' '.join(VERBS_NODES)} nodeflow.dev/e2e-skyhook=verbs")
    # Apart: a blocked object of the same priority ahead of `verbs` by name would hold it.
    await operator.sh("kubectl label node node-013 nodeflow.dev/e2e-skyhook=stuck")
    first, ignored = VERBS_NODES
    assert (await operator.sh(f"kubectl nodeflow skyhook node ignore {ignored}")).strip() == (
        f"node/{ignored} ignored"
    )
    await operator.sh("kubectl apply -f -", stdin=VERBS_MANIFESTS)

    stuck = await operator.until_output(
        "kubectl nodeflow why nodewright stuck", "DeploymentPolicyNotFound=True"
    )
    assert stuck.splitlines()[0].startswith("NodeWright stuck: blocked; ")
    assert "DeploymentPolicy no-such-policy does not exist" in stuck

    held = await operator.until_output(
        "kubectl nodeflow skyhook node status --skyhook verbs | "
        f'awk \'$1 == "{first}" && $3 == "complete" {{ print "done" }}; {{ print }}\'',
        "done",
    )
    assert ignored not in held  # it ran nothing
    why = await operator.sh("kubectl nodeflow why skyhook verbs")
    assert f"NodesIgnored=True NodesIgnored: Node [{ignored}] has ignore label set." in why
    assert await jobs_on(operator, ignored) == 0

    await operator.sh(f"kubectl nodeflow skyhook node unignore {ignored}")
    await until_jobs(operator, {first: 2, ignored: 2})
    await operator.until_output("kubectl nodeflow why skyhook verbs", "Skyhook verbs: complete;")
    status = await operator.sh("kubectl nodeflow skyhook package status tuning --skyhook verbs")
    assert [line.split() for line in status.splitlines()[1:]] == [
        [node, "tuning", "1.0.0", "config", "complete", "0"] for node in VERBS_NODES
    ]
    logs = await operator.sh(
        f"kubectl nodeflow skyhook package logs tuning --skyhook verbs --node {first} "
        "--stage config"
    )
    assert "container tuning-config (exit 0)" in logs
    assert "container tuning-configcheck (exit 0)" in logs
    assert ": config /root /var/lib/skyhook/verbs/tuning-1.0.0-" in logs

    rerun = await operator.sh(
        f"kubectl nodeflow skyhook package rerun tuning --skyhook verbs --node {first} -y"
    )
    assert "package tuning|1.0.0 reset on 1 node(s)" in rerun
    await until_jobs(operator, {first: 4, ignored: 2})  # apply and config again, there only
    await operator.until_output("kubectl nodeflow why skyhook verbs", "Skyhook verbs: complete;")

    await operator.sh("kubectl nodeflow skyhook disable verbs -y")
    await operator.until_output("kubectl nodeflow why skyhook verbs", "complete (disabled);")
    await operator.sh("kubectl nodeflow skyhook enable verbs -y")
    enabled = await operator.sh("kubectl nodeflow why skyhook verbs")
    assert "(disabled)" not in enabled.splitlines()[0]

    # Reset while paused (the controller has read the pause first): the controller reads
    # the reset (no node complete) and starts nothing until resumed.
    await operator.sh("kubectl nodeflow skyhook pause verbs -y")
    await operator.until_output(
        "kubectl nodeflow why skyhook verbs", "Ready=False Paused: paused: no new stage starts"
    )
    reset = await operator.sh("kubectl nodeflow skyhook reset verbs -y")
    assert "2 node(s) reset" in reset and "batch state reset" in reset
    paused = await operator.until_output("kubectl nodeflow why skyhook verbs", " 0/2 complete")
    assert "(paused)" in paused.splitlines()[0]
    assert await jobs_on(operator, first) == 4 and await jobs_on(operator, ignored) == 2
    await operator.sh("kubectl nodeflow skyhook resume verbs -y")
    await until_jobs(operator, {first: 6, ignored: 4})
    await operator.until_output("kubectl nodeflow why skyhook verbs", "Skyhook verbs: complete;")


async def jobs_on(operator: Operator, node: str) -> int:
    """The Skyhook `verbs`' stage Jobs on the node (their TTL keeps them a day)."""
    listed = await operator.sh(
        "kubectl get jobs -n skyhook -o name "
        f"-l skyhook.nvidia.com/name=verbs,skyhook.nvidia.com/node={node}"
    )
    return len(listed.split())


async def until_jobs(operator: Operator, wanted: dict[str, int]) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 2 * STEP_TIMEOUT
    while True:
        seen = {node: await jobs_on(operator, node) for node in wanted}
        if seen == wanted:
            return
        assert all(seen[n] <= wanted[n] for n in wanted), (seen, wanted)
        assert loop.time() < deadline, (seen, wanted)
        await asyncio.sleep(0.5)
