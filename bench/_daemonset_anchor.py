"""The DaemonSet anchor of nodeset_real_kube: Kubernetes' own DaemonSet controller
(kube-controller-manager) rolling a DaemonSet over the same KWOK nodes, on the same control
plane, in the same run as the NodeSet steps, so each NodeSet step reads as a ratio to it
(issue #36: a NodeSet deploys like a DaemonSet, so it should roll out as fast).

Steps: 0 -> N Ready (the DaemonSet created; its pods scheduled by kube-scheduler, made
Running and Ready by KWOK), then N -> 0 by a nodeSelector no node matches (the controller
deletes every pod). Each step records its seconds, the CPU every control plane process used
and the API writes the API server's audit log names (real_kube.sh with KUBE_AUDIT=1), by
client: the DaemonSet controller, kube-scheduler, KWOK, ...

The parsing of the audit log and the comparison are pure (tested in tests/unit/bench); the
steps talk to the API server.
"""

from __future__ import annotations

import asyncio
import copy
import json
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from bench.nodeset_controller import (
    NS,
    TEMPLATE,
    CpuMeter,
    Deadline,
    StepFigures,
    ready,
    wait_until,
)

ANCHOR = "bench-anchor"
DAEMONSETS_PATH = f"/apis/apps/v1/namespaces/{NS}/daemonsets"
ANCHOR_LABEL = {"app": ANCHOR}
# A label no node carries: the DaemonSet's scale-in is its template no longer matching a node.
NOWHERE = {"bench.nodeflow.dev/no-node-has-this": "true"}
# The DaemonSet controller's own writes (kube-controller-manager with service-account
# credentials, as kubeadm runs it).
DAEMONSET_CONTROLLER = "system:serviceaccount:kube-system:daemon-set-controller"
# Our processes on the NodeSet side: the controller's share of the work a DaemonSet
# controller does alone.
OUR_PROCESSES = ("k8s-watcher", "nodeset-controller", "slurm-syncer", "nats-server")
# How long the audit log may trail the last answered request (batch mode).
AUDIT_SETTLE_SECONDS = 3.0

AuditKey = tuple[str, str, str]


def client_of(event: Mapping[str, Any]) -> str:
    """Who sent a write, in the benchmark's words: a kube-controller-manager controller by
    its service account, the scheduler, KWOK (it runs as the admin with its own user agent),
    or the user name and the user agent's first word."""
    user = str((event.get("user") or {}).get("username") or "")
    agent = str(event.get("userAgent") or "")
    if user.startswith("system:serviceaccount:kube-system:"):
        return "kube-controller-manager/" + user.rsplit(":", 1)[1]
    if user == "system:kube-controller-manager":
        return "kube-controller-manager"
    if user == "system:kube-scheduler":
        return "kube-scheduler"
    if agent.startswith("kwok"):
        return "kwok"
    return f"{user} ({agent.split('/', 1)[0] or 'no agent'})"


def audited_writes(lines: Iterable[str]) -> Counter[AuditKey]:
    """Answered write requests of audit log lines (JSON events), by client, verb and
    resource (with its subresource): the ones the API server accepted (code < 400)."""
    counted: Counter[AuditKey] = Counter()
    for line in lines:
        if not line.strip():
            continue
        event = json.loads(line)
        if event.get("stage") != "ResponseComplete":
            continue
        if int((event.get("responseStatus") or {}).get("code") or 0) >= 400:
            continue
        ref = event.get("objectRef") or {}
        resource = str(ref.get("resource") or "")
        if ref.get("subresource"):
            resource += "/" + str(ref["subresource"])
        counted[(client_of(event), str(event.get("verb") or ""), resource)] += 1
    return counted


class AuditLog:
    """The audit log's writes since the last `take()` (read from where it stopped)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0

    def take(self) -> Counter[AuditKey]:
        try:
            with self.path.open("rb") as log:
                log.seek(self.offset)
                data = log.read()
        except FileNotFoundError:
            return Counter()
        # A line still being written waits for the next take.
        complete = data[: data.rfind(b"\n") + 1]
        self.offset += len(complete)
        return audited_writes(complete.decode().splitlines())


@dataclass(frozen=True)
class Comparison:
    """A NodeSet step beside the DaemonSet's step of the same size."""

    label: str
    rate_ratio: float  # NodeSet pods/s over the DaemonSet's: the target is >= 1.0
    our_cpu_ms: float  # per pod, OUR_PROCESSES together
    controller_cpu_ms: float  # per pod, kube-controller-manager
    all_cpu_ms: tuple[float, float]  # per pod, every process: NodeSet's step, DaemonSet's
    our_writes: float  # per pod, every write k8s-watcher applied for us
    controller_writes: float  # per pod, the DaemonSet controller's writes

    @property
    def cpu_ratio(self) -> float:
        """Our CPU per pod over kube-controller-manager's: the target is <= 1.0."""
        return self.our_cpu_ms / self.controller_cpu_ms if self.controller_cpu_ms else float("inf")


def per_pod_ms(cpu: Mapping[str, float], names: Iterable[str], pods: int) -> float:
    return 1000 * sum(cpu.get(name, 0.0) for name in names) / pods if pods else 0.0


def compare(nodeset: StepFigures, daemonset: StepFigures, daemonset_writes: float) -> Comparison:
    """The ratios of issue #36 for one pair of steps of the same size and direction."""
    pods = nodeset.pods
    nodeset_rate = pods / nodeset.seconds if nodeset.seconds > 0 else float("inf")
    daemonset_rate = daemonset.pods / daemonset.seconds if daemonset.seconds > 0 else float("inf")
    return Comparison(
        label=nodeset.label,
        rate_ratio=nodeset_rate / daemonset_rate,
        our_cpu_ms=per_pod_ms(nodeset.cpu, OUR_PROCESSES, pods),
        controller_cpu_ms=per_pod_ms(daemonset.cpu, ("kube-controller-manager",), daemonset.pods),
        all_cpu_ms=(
            per_pod_ms(nodeset.cpu, nodeset.cpu, pods),
            per_pod_ms(daemonset.cpu, daemonset.cpu, daemonset.pods),
        ),
        our_writes=sum(nodeset.writes.values()) / pods if pods else 0.0,
        controller_writes=daemonset_writes,
    )


def controller_writes_per_pod(audited: Counter[AuditKey], pods: int) -> float:
    writes = sum(count for (client, _, _), count in audited.items() if client_is_daemonset(client))
    return writes / pods if pods else 0.0


def client_is_daemonset(client: str) -> bool:
    return client == "kube-controller-manager/" + DAEMONSET_CONTROLLER.rsplit(":", 1)[1]


def report_comparison(comparison: Comparison) -> None:
    print(
        f"   {comparison.label:<14} NodeSet / DaemonSet: rate {comparison.rate_ratio:.2f} x "
        f"(target >= 1.0); controller CPU per pod {comparison.our_cpu_ms:.1f} ms "
        f"({' + '.join(OUR_PROCESSES)}) vs kube-controller-manager "
        f"{comparison.controller_cpu_ms:.1f} ms: {comparison.cpu_ratio:.2f} x (target <= 1.0); "
        f"every process {comparison.all_cpu_ms[0]:.1f} vs {comparison.all_cpu_ms[1]:.1f} ms; "
        f"API writes per pod {comparison.our_writes:.2f} (ours) vs "
        f"{comparison.controller_writes:.2f} (the DaemonSet controller's)",
        flush=True,
    )


def report_audited(label: str, pods: int, audited: Counter[AuditKey]) -> None:
    total = sum(audited.values())
    shown = ", ".join(
        f"{client} {verb} {resource} {count / pods:.2f}"
        for (client, verb, resource), count in sorted(audited.items())
        if count / pods >= 0.01
    )
    print(f"   {label:<14} API writes per pod {total / pods:5.2f} ({shown})", flush=True)


class Cluster(Protocol):
    async def call(
        self, method: str, path: str, body: Any = None, content_type: str = "application/json"
    ) -> Any: ...

    async def pods(self, selector: str) -> list[dict[str, Any]]: ...

    def processes(self) -> dict[str, int]: ...


def anchor_daemonset() -> dict[str, Any]:
    """The NodeSet benchmark's pod template as a DaemonSet's, tolerating every taint (as node
    agents do), so it runs on exactly the nodes the NodeSet does."""
    template = copy.deepcopy(TEMPLATE)
    template["metadata"]["labels"] = dict(ANCHOR_LABEL)
    template["spec"]["tolerations"] = [{"operator": "Exists"}]
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": ANCHOR, "namespace": NS},
        "spec": {
            "selector": {"matchLabels": dict(ANCHOR_LABEL)},
            "updateStrategy": {"type": "RollingUpdate"},
            "template": template,
        },
    }


async def anchor_status(cluster: Cluster) -> dict[str, Any]:
    found = await cluster.call("GET", f"{DAEMONSETS_PATH}/{ANCHOR}")
    status = dict(found.get("status") or {})
    status["generation"] = found["metadata"].get("generation")
    return status


async def settle(cluster: Cluster, pods: int, deadline: Deadline, what: str) -> None:
    """Until the DaemonSet's status and its pods both say `pods` Ready (0: none left)."""

    async def status_says_so() -> bool:
        status = await anchor_status(cluster)
        return (
            status.get("observedGeneration") == status["generation"]
            and status.get("desiredNumberScheduled") == pods
            and status.get("currentNumberScheduled") == pods
            and status.get("numberReady") == pods
        )

    async def settled() -> bool:
        if not await status_says_so():
            return False
        listed = await cluster.pods("app=" + ANCHOR)
        return len(listed) == pods and all(ready(p) for p in listed)

    async def progress() -> str:
        listed = await cluster.pods("app=" + ANCHOR)
        return f"{len(listed)} pods, {sum(1 for p in listed if ready(p))} ready"

    await wait_until(settled, what, deadline, progress)


async def run_anchor(
    cluster: Cluster, nodes: int, audit: AuditLog, deadline: Deadline
) -> tuple[dict[tuple[int, int], StepFigures], dict[tuple[int, int], float]]:
    """The DaemonSet's two steps, reported as they settle; their figures and the DaemonSet
    controller's writes per pod of each."""
    cpu = CpuMeter()
    for name, pid in cluster.processes().items():
        cpu.watch(name, pid)
    figures: dict[tuple[int, int], StepFigures] = {}
    controller: dict[tuple[int, int], float] = {}
    for start, end in ((0, nodes), (nodes, 0)):
        audit.take()
        cpu.take()
        started = time.perf_counter()
        if end:
            await cluster.call("POST", DAEMONSETS_PATH, anchor_daemonset())
        else:
            await cluster.call(
                "PATCH",
                f"{DAEMONSETS_PATH}/{ANCHOR}",
                {"spec": {"template": {"spec": {"nodeSelector": NOWHERE}}}},
                "application/merge-patch+json",
            )
        await settle(cluster, end, deadline, f"DaemonSet {start} -> {end}")
        seconds = time.perf_counter() - started
        used = cpu.take()
        await asyncio.sleep(AUDIT_SETTLE_SECONDS)
        audited = audit.take()
        step = StepFigures(start, end, seconds, used, Counter())
        figures[(start, end)] = step
        controller[(start, end)] = controller_writes_per_pod(audited, step.pods)
        rate = step.pods / seconds if seconds > 0 else float("inf")
        print(f"   DaemonSet {step.label:<14} {seconds:7.1f} s {rate:7.1f} pods/s", flush=True)
        report_audited(f"DaemonSet {step.label}", step.pods, audited)
        shown = ", ".join(f"{name} {1000 * cpu_s / step.pods:.1f}" for name, cpu_s in used.items())
        print(
            f"   DaemonSet {step.label:<14} CPU ms per pod "
            f"{1000 * sum(used.values()) / step.pods:5.1f} ({shown})",
            flush=True,
        )
    await cluster.call("DELETE", f"{DAEMONSETS_PATH}/{ANCHOR}")
    return figures, controller


def report_against_anchor(
    nodeset: Iterable[StepFigures],
    daemonset: Mapping[tuple[int, int], StepFigures],
    controller_writes: Mapping[tuple[int, int], float],
) -> list[Comparison]:
    """Each NodeSet step that has a DaemonSet step of the same size and direction, compared."""
    compared = []
    for step in nodeset:
        anchor = daemonset.get((step.start, step.end))
        if anchor is None:
            continue
        comparison = compare(step, anchor, controller_writes[(step.start, step.end)])
        report_comparison(comparison)
        compared.append(comparison)
    return compared
