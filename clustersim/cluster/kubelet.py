"""One simulated kubelet for every node (plus the pod garbage collector for lost nodes).

Per pod bound to a Ready node: after `start_delay` the pod runs (or its image pull fails);
finite pods finish after their runtime; deleted pods stop after their grace period, get a
terminal phase and are removed with a grace-0, uid-preconditioned delete. A node whose Ready
condition is not True has a dead kubelet: its pods freeze (and deletions hang) until it
returns, as on a real cluster. Pods bound to a node that no longer exists are failed with
DisruptionTarget/DeletionByPodGC and force-deleted, as the pod GC controller does.

A pod's init containers run in order first; a Skyhook package pod's follow the agent contract
(`agent.run_init_containers`: the copy into the node's simulated host, then the stage and its
check by image and arguments). A pod that runs a reboot (`podlife.requests_reboot`, or the
Skyhook agent's node_restart interrupt, `agent.requests_reboot`) reboots its node once it
exits 0: the node is Ready=False (KubeletNotReady, not-ready taint) for
`reboot_seconds`, then comes back Ready with a new `status.nodeInfo.bootID`; the containers the
reboot killed restart (restartCount + 1, last state terminated/Unknown/255) or, with
restartPolicy Never, their pod fails.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import structlog

from clustersim.cluster.agent import (
    Step,
    chain_outcome,
    run_init_containers,
    with_init_statuses,
)
from clustersim.cluster.agent import (
    requests_reboot as agent_reboots,
)
from clustersim.cluster.loop import Controller, Obj, pod_key
from clustersim.cluster.nodes import set_node_ready
from clustersim.cluster.podlife import (
    Outcome,
    crashloop_status,
    image_outcome,
    is_pod_ready,
    killed_by_reboot,
    lost_in_reboot_status,
    merge_conditions,
    pod_outcome,
    requests_reboot,
    running_status,
    runtime_seconds,
    stop_seconds,
    terminated_status,
    unpullable_message,
    waiting_status,
)
from clustersim.kube.errors import Conflict, NotFound
from clustersim.kube.objects import now_rfc3339
from clustersim.kube.store import Store

log = structlog.get_logger("clustersim.kubelet")

PodKey = tuple[str, str]


@dataclass(frozen=True)
class NodeBoot:
    """Work-queue key: the node `name` is rebooting and comes back when it is due."""

    name: str


KubeletKey = PodKey | NodeBoot


@dataclass(frozen=True)
class KubeletConfig:
    start_delay: float = 0.2  # bound -> Running (or ErrImagePull)
    job_runtime: float = 5.0  # how long finite pods with a normal image run
    failure_delay: float | None = None  # how long :fail / :oom pods run; default start_delay
    pull_error_seconds: float = 0.5  # ErrImagePull shows this long before ImagePullBackOff
    # A deleted pod's containers exit this long after SIGTERM (slurmd exits promptly); the
    # grace period only bounds it. STOP_ANNOTATION sets it per pod.
    stop_seconds: float = 0.5
    reboot_seconds: float = 3.0  # how long a rebooting node stays Ready=False

    @property
    def failure_runtime(self) -> float:
        return self.start_delay if self.failure_delay is None else self.failure_delay


@dataclass
class _PodRun:
    uid: str
    seen_at: float
    pod_ip: str
    start_time: str = field(default_factory=now_rfc3339)
    started_at: float | None = None
    stage: str = "new"  # new | pull-error | pull-backoff | running | crashloop | done
    deleting_since: float | None = None
    backoff_at: float = 0.0  # when ErrImagePull turns into ImagePullBackOff
    restarts: int = 0
    last_state: dict[str, Any] | None = None  # how the previous container ended
    # How its init containers ran this start (agent.run_init_containers); None: not yet.
    steps: list[Step] | None = None


def node_is_ready(node: Obj) -> bool:
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in (node.get("status") or {}).get("conditions") or []
    )


def node_internal_ip(node: Obj) -> str:
    for address in (node.get("status") or {}).get("addresses") or []:
        if address.get("type") == "InternalIP":
            return str(address.get("address"))
    return ""


class PodIpAllocator:
    """Hands out pod IPs from 10.128.0.0/9 in order, skipping .0 and .255 addresses."""

    def __init__(self) -> None:
        self._counter = itertools.count(1)

    def next(self) -> str:
        while True:
            n = next(self._counter)
            if n & 0xFF not in (0, 0xFF):
                return f"10.{128 + ((n >> 16) & 0x7F)}.{(n >> 8) & 0xFF}.{n & 0xFF}"


class Kubelet(Controller[KubeletKey]):
    name = "kubelet"
    watched = ("pods", "nodes")

    def __init__(self, store: Store, config: KubeletConfig) -> None:
        super().__init__(store)
        self.config = config
        self._runs: dict[PodKey, _PodRun] = {}
        self._ips = PodIpAllocator()
        self._boots_due: dict[str, float] = {}  # rebooting node -> when it is Ready again
        # Each node's simulated host: the Skyhook copy dirs package pods copied there.
        self.host_dirs: dict[str, set[str]] = {}

    # ------------------------------------------------------------------ events

    def keys_for(
        self, resource: str, event: str, obj: Obj, old: Obj | None
    ) -> Iterable[KubeletKey]:
        if resource == "pods":
            if obj.get("spec", {}).get("nodeName") or event == "DELETED":
                return (pod_key(obj),)
            return ()
        if event == "DELETED" or node_is_ready(obj) != (old is not None and node_is_ready(old)):
            return self._pods_on(obj["metadata"]["name"])
        return ()

    def initial_keys(self) -> Iterable[KubeletKey]:
        return [pod_key(p) for p in self.store.list("pods").items if p["spec"].get("nodeName")]

    def _pods_on(self, node_name: str) -> list[PodKey]:
        pods = self.store.list("pods", field_selector=f"spec.nodeName={node_name}").items
        return [pod_key(p) for p in pods]

    # ------------------------------------------------------------------ reconcile

    def _now(self) -> float:
        return asyncio.get_running_loop().time()

    def reconcile(self, key: KubeletKey) -> float | None:
        if isinstance(key, NodeBoot):
            return self._boot(key.name)
        namespace, name = key
        try:
            pod = self.store.get("pods", name, namespace)
        except NotFound:
            self._runs.pop(key, None)
            return None
        node_name = pod["spec"].get("nodeName")
        if not node_name:
            return None
        try:
            node = self.store.peek("nodes", node_name)
        except NotFound:
            self._collect_orphan(pod)
            return None
        if not node_is_ready(node):
            return None  # dead kubelet: nothing progresses until the node is back
        run = self._runs.get(key)
        if run is None or run.uid != pod["metadata"]["uid"]:
            run = self._adopt(pod)
            self._runs[key] = run
        if pod["metadata"].get("deletionTimestamp"):
            return self._terminate(pod, node, run)
        phase = (pod.get("status") or {}).get("phase")
        if phase in ("Succeeded", "Failed"):
            run.stage = "done"
            return None
        if run.started_at is None:
            return self._start(pod, node, run)
        return self._progress(pod, node, run)

    def _adopt(self, pod: Obj) -> _PodRun:
        """Track a pod; one the store already shows running (e.g. after a restart) keeps going."""
        status = pod.get("status") or {}
        ip = status.get("podIP") or self._pod_ip(pod)
        run = _PodRun(uid=pod["metadata"]["uid"], seen_at=self._now(), pod_ip=str(ip))
        if status.get("phase") == "Running":
            run.started_at = self._now()
            run.stage = "crashloop" if not is_pod_ready(pod) and _crashlooping(pod) else "running"
            run.start_time = str(status.get("startTime") or run.start_time)
        return run

    def _pod_ip(self, pod: Obj) -> str:
        if pod["spec"].get("hostNetwork"):
            return ""  # filled with the node's address when the status is written
        return self._ips.next()

    def _ips_for(self, node: Obj, run: _PodRun) -> tuple[str, str]:
        host_ip = node_internal_ip(node)
        return host_ip, run.pod_ip or host_ip

    def _outcome(self, pod: Obj, run: _PodRun) -> Outcome:
        """The pod's fate: its init containers' first failure (run once per start), else its
        containers'."""
        if pod["spec"].get("initContainers"):
            if run.steps is None:
                host = self.host_dirs.setdefault(str(pod["spec"].get("nodeName")), set())
                run.steps = run_init_containers(pod, host)
            failed = chain_outcome(run.steps)
            if failed is not None:
                return failed
        return pod_outcome(pod)

    def _write(
        self, pod: Obj, run: _PodRun, status: dict[str, Any], mode: str, killed: bool = False
    ) -> None:
        if run.steps:
            status = with_init_statuses(
                status,
                pod,
                run.steps,
                mode=mode,
                now=now_rfc3339(),
                started=run.start_time,
                killed=killed,
            )
        self._write_status(pod, status)

    def _write_status(self, pod: Obj, status: Obj) -> None:
        meta = pod["metadata"]
        self.store.patch(
            "pods",
            meta["name"],
            {"metadata": {"uid": meta["uid"]}, "status": status},
            namespace=meta["namespace"],
            subresource="status",
            copy_result=False,
        )

    def _start(self, pod: Obj, node: Obj, run: _PodRun) -> float | None:
        wait = run.seen_at + self.config.start_delay - self._now()
        if wait > 0:
            return wait
        host_ip, pod_ip = self._ips_for(node, run)
        outcome = self._outcome(pod, run)
        now = now_rfc3339()
        if outcome is Outcome.UNPULLABLE:
            image = _first_unpullable_image(pod)
            if run.stage == "new":
                reason, message = unpullable_message(image, backoff=False)
                run.stage = "pull-error"
                self._write(
                    pod,
                    run,
                    waiting_status(pod, host_ip, pod_ip, run.start_time, now, reason, message),
                    "pulling",
                )
                run.backoff_at = self._now() + self.config.pull_error_seconds
                return self.config.pull_error_seconds
            if run.stage == "pull-error":
                if (remaining := run.backoff_at - self._now()) > 0:
                    return remaining
                reason, message = unpullable_message(image, backoff=True)
                run.stage = "pull-backoff"
                self._write(
                    pod,
                    run,
                    waiting_status(pod, host_ip, pod_ip, run.start_time, now, reason, message),
                    "pulling",
                )
            return None
        run.started_at = self._now()
        run.stage = "running"
        self._write(
            pod,
            run,
            running_status(pod, host_ip, pod_ip, run.start_time, now, run.restarts, run.last_state),
            "running",
        )
        return self._due(pod, run)

    def _due(self, pod: Obj, run: _PodRun) -> float | None:
        outcome = self._outcome(pod, run)
        if outcome is Outcome.RUN_FOREVER or run.started_at is None:
            return None
        if outcome is Outcome.SUCCEED:
            duration = runtime_seconds(pod, self.config.job_runtime)
        else:
            duration = runtime_seconds(pod, self.config.failure_runtime)
        return max(0.0, run.started_at + duration - self._now())

    def _progress(self, pod: Obj, node: Obj, run: _PodRun) -> float | None:
        host_ip, pod_ip = self._ips_for(node, run)
        now = now_rfc3339()
        if run.stage == "crashloop":
            return None
        due = self._due(pod, run)
        if due is None:
            if not is_pod_ready(pod):  # back from a NotReady node
                self._write(
                    pod, run, running_status(pod, host_ip, pod_ip, run.start_time, now), "running"
                )
            return None
        if due > 0:
            if not is_pod_ready(pod):
                self._write(
                    pod, run, running_status(pod, host_ip, pod_ip, run.start_time, now), "running"
                )
            return due
        outcome = self._outcome(pod, run)
        if pod["spec"].get("restartPolicy", "Always") == "Always" and outcome in (
            Outcome.FAIL,
            Outcome.OOM,
        ):
            run.stage = "crashloop"
            self._write_status(
                pod, crashloop_status(pod, host_ip, pod_ip, run.start_time, now, outcome, 1)
            )
            return None
        run.stage = "done"
        status = terminated_status(pod, host_ip, pod_ip, run.start_time, now, outcome)
        self._write(pod, run, status, "terminated")
        if status["phase"] == "Succeeded" and (requests_reboot(pod) or agent_reboots(pod)):
            self._start_reboot(node["metadata"]["name"])
        return None

    # ------------------------------------------------------------------ reboot

    def _start_reboot(self, node_name: str) -> None:
        if node_name in self._boots_due:
            return
        self._boots_due[node_name] = self._now() + self.config.reboot_seconds
        set_node_ready(self.store, node_name, False, unknown=False)
        log.info("node rebooting", node=node_name, seconds=self.config.reboot_seconds)
        self.queue.add_after(NodeBoot(node_name), self.config.reboot_seconds)

    def _boot(self, node_name: str) -> float | None:
        due = self._boots_due.get(node_name)
        if due is None:
            return None
        if (wait := due - self._now()) > 0:
            return wait
        try:
            self.store.patch(
                "nodes",
                node_name,
                {"status": {"nodeInfo": {"bootID": str(uuid.uuid4())}}},
                subresource="status",
            )
        except NotFound:
            self._boots_due.pop(node_name, None)
            return None
        now = now_rfc3339()
        for key in self._pods_on(node_name):
            self._lose_containers(key, now)
        del self._boots_due[node_name]
        # Ready last: the readiness flip queues every pod on the node to start again.
        set_node_ready(self.store, node_name, True)
        log.info("node rebooted", node=node_name)
        return None

    def _lose_containers(self, key: PodKey, now: str) -> None:
        """The reboot killed the pod's running containers: restart them, or fail the pod."""
        run = self._runs.get(key)
        if run is None or run.started_at is None or run.stage == "done":
            return  # nothing ran yet (or any more): it simply starts once the node is back
        if run.deleting_since is not None:
            return
        try:
            pod = self.store.get("pods", key[1], key[0])
        except NotFound:
            return
        if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            return
        if pod["spec"].get("restartPolicy", "Always") == "Never":
            run.stage = "done"
            with contextlib.suppress(NotFound, Conflict):
                self._write_status(pod, lost_in_reboot_status(pod, now))
            return
        started = (pod.get("status") or {}).get("startTime") or run.start_time
        run.restarts += 1
        run.last_state = killed_by_reboot(str(started), now)
        run.started_at = None
        run.stage = "new"
        run.steps = None  # a restarted pod runs its init containers again
        run.seen_at = self._now()

    def _terminate(self, pod: Obj, node: Obj, run: _PodRun) -> float | None:
        now_mono = self._now()
        if run.deleting_since is None:
            run.deleting_since = now_mono
        grace = int(pod["metadata"].get("deletionGracePeriodSeconds") or 0)
        stop = stop_seconds(pod, self.config.stop_seconds)
        wait = run.deleting_since + min(grace, stop) - now_mono
        if wait > 0:
            return wait
        meta = pod["metadata"]
        if (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed"):
            host_ip, pod_ip = self._ips_for(node, run)
            status = terminated_status(
                pod,
                host_ip,
                pod_ip,
                run.start_time,
                now_rfc3339(),
                self._outcome(pod, run),
                killed=True,
            )
            self._write(pod, run, status, "terminated", killed=run.started_at is not None)
        with contextlib.suppress(NotFound, Conflict):
            self.store.delete(
                "pods",
                meta["name"],
                meta["namespace"],
                grace_period_seconds=0,
                preconditions={"uid": meta["uid"]},
            )
        run.stage = "done"
        return None

    def _collect_orphan(self, pod: Obj) -> None:
        """Pod GC: the node is gone, so the pod fails with DeletionByPodGC and is removed."""
        meta = pod["metadata"]
        now = now_rfc3339()
        status = dict(pod.get("status") or {})
        if status.get("phase") not in ("Succeeded", "Failed"):
            status["phase"] = "Failed"
            status["conditions"] = merge_conditions(
                status.get("conditions") or [],
                [
                    {
                        "type": "DisruptionTarget",
                        "status": "True",
                        "reason": "DeletionByPodGC",
                        "message": "PodGC: node no longer exists",
                        "lastProbeTime": None,
                        "lastTransitionTime": now,
                    },
                    {
                        "type": "Ready",
                        "status": "False",
                        "reason": "PodFailed",
                        "lastProbeTime": None,
                        "lastTransitionTime": now,
                    },
                ],
            )
            try:
                self._write_status(pod, status)
            except (NotFound, Conflict):
                return
        with contextlib.suppress(NotFound, Conflict):
            self.store.delete(
                "pods",
                meta["name"],
                meta["namespace"],
                grace_period_seconds=0,
                preconditions={"uid": meta["uid"]},
            )
        self._runs.pop(pod_key(pod), None)


def _crashlooping(pod: Obj) -> bool:
    return any(
        ((c.get("state") or {}).get("waiting") or {}).get("reason") == "CrashLoopBackOff"
        for c in (pod.get("status") or {}).get("containerStatuses") or []
    )


def _first_unpullable_image(pod: Obj) -> str:
    """The image that does not pull, init containers first (they are pulled first)."""
    for container in (*(pod["spec"].get("initContainers") or ()), *pod["spec"]["containers"]):
        image = str(container.get("image") or "")
        if image_outcome(image, True) is Outcome.UNPULLABLE:
            return image
    return ""
