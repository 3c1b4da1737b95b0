"""The chaos tools, shared by the e2e chaos tests (through `tests/e2e/chaos_support.py`),
`make bench`'s kill -9 recovery figures (`bench/chaos.py`) and the real-cluster tests: the
launcher's whole stack, a recorder of safety violations that watches the Kubernetes API and
Slurm from outside, and a monkey that kill -9s services and nats-server at seeded random
points. They live in the simulator's package, which is dev-only (the runtime image leaves it
out), so that the benchmarks import nothing from tests/.

The recorder judges each rule from one ordered source where it can (one watch stream, or a
fresh Slurm query), so that two streams seen at slightly different moments never make a false
violation:

* `busy-pod-deleted` -- no NodeSet pod is deleted while its Slurm node runs a job. When the
  pod's deletion is first seen (deletionTimestamp, or its DELETED event), Slurm is asked at
  once; a job still RUNNING on the node named after the pod is a violation (our jobs end only
  by our own cancel, and a draining node starts none). A job that ends NODE_FAIL (its pod went
  away under it) is one too, in case the pod vanished before the question was answered.
* `two-pods-on-one-node` -- no two live NodeSet pods bound to one node, of one NodeSet or of
  any two (one slurmd per node); a pod of another NodeSet still terminating there counts too
  (its slurmd may still run).
* `duplicate-pod` -- a NodeSet never has more live pods than the highest `replicas` it was
  given, and a pod name (derived from its node's address) is never seen on two nodes.
* `rolling-budget` -- once armed for a NodeSet (steady `replicas`, all pods Ready), its
  unavailable pods (not Ready, terminating, or SlurmDelete=True) never exceed maxUnavailable.
* `maintenance-parallel` -- NodeMaintenances in progress (past Pending, deleting ones too:
  their node is still being released) never exceed maxParallelOperations of the
  MaintenanceOperatorConfig. Only a request whose node exists counts (upstream's scheduler
  counts no other): the node it was made for, by name and, once it names one in its Node
  ownerReference, by uid.
* `maintenance-gone-node-slot` -- no NodeMaintenance slot held by a request whose node is gone:
  at quiescence (`assert_quiescent`), no request whose node is gone still holds its finalizer
  while deleted, and, while one of them is in progress, no Pending request waits on an
  existing node that the limits would let start (fewer than maxParallelOperations in
  progress, and its node already unavailable or fewer than maxUnavailable nodes down).
* `maintenance-unavailable` -- nodes unavailable (cordoned or not Ready) never exceed its
  maxUnavailable (seen on the node stream alone; the tests cordon nothing themselves).
* `partial-gang` -- a PodGroup whose bound members are fewer than minMember while some
  members are still unbound. Binding a gang takes one API call per member, and a placer
  killed between two of them leaves the gang partial until its successor (after the lease
  TTL) finishes it from Kubernetes state, so a partial gang is a violation only when it stays
  partial for longer than `GANG_SETTLE_SECONDS`, and at quiescence (`assert_quiescent`) not
  at all.
* convergence -- each scenario's desired state is reached within `CONVERGE_SECONDS` of the
  last kill (`converged`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from nodeflow_contracts.pod_protocol import NODESET_LABEL, SLURM_DELETE_CONDITION
from nodeflow_contracts.slurm_api import prefix_from_openapi
from nodeflow_runtime.envfile import read_env_file
from nodeflow_runtime.launcher import SERVICES, env_key

NS = "default"
OPERATOR_NAMESPACE = "nodeflow-system"
POD_GROUP_LABEL = "pod-group.scheduling.sigs.k8s.io"
NODESETS = f"/apis/nodeflow.dev/v1alpha1/namespaces/{NS}/nodesets"
PODS = f"/api/v1/namespaces/{NS}/pods"
NODES = "/api/v1/nodes"
NODE_MAINTENANCES = f"/apis/maintenance.nvidia.com/v1alpha1/namespaces/{NS}/nodemaintenances"
OPERATOR_CONFIGS = (
    f"/apis/maintenance.nvidia.com/v1alpha1/namespaces/{OPERATOR_NAMESPACE}"
    "/maintenanceoperatorconfigs"
)
POD_GROUPS = f"/apis/scheduling.sigs.k8s.io/v1alpha1/namespaces/{NS}/podgroups"
TOPOLOGIES = "/apis/scheduling.koordinator.sh/v1alpha1/clusternetworktopologies"
NATS = "nats-server"

# Settings the whole stack runs with in the chaos tests: a short lease, so that a killed
# leader's successor takes over in seconds, and a quick Slurm poll. Everything else is the
# services' defaults.
CHAOS_ENV = {
    "LEADER_LEASE_TTL_SECONDS": "3",
    "SLURM_POLL_INTERVAL_SECONDS": "1",
}
GANG_SETTLE_SECONDS = 20.0
CONVERGE_SECONDS = 90.0
READY_LINE = "Ctrl-C stops everything"


def chaos_seed() -> int:
    """CHAOS_SEED from the environment (to replay a failure), else a fresh one; printed."""
    seed = int(os.environ.get("CHAOS_SEED") or random.SystemRandom().randrange(2**31))
    print(f"chaos seed {seed} (replay with CHAOS_SEED={seed})", flush=True)
    return seed


async def wait_until(
    check: Callable[[], Awaitable[bool]], timeout: float, what: str, interval: float = 0.2
) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:.0f} s")
        await asyncio.sleep(interval)


def condition(obj: dict[str, Any], kind: str) -> dict[str, Any] | None:
    for item in (obj.get("status") or {}).get("conditions") or []:
        if item.get("type") == kind:
            return dict(item)
    return None


def is_true(obj: dict[str, Any], kind: str) -> bool:
    return (condition(obj, kind) or {}).get("status") == "True"


def terminating(obj: dict[str, Any]) -> bool:
    return bool(obj["metadata"].get("deletionTimestamp"))


def pod_finished(pod: dict[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


class Kube:
    """The simulator's Kubernetes API over plain HTTP, as kubectl would call it."""

    def __init__(self, session: aiohttp.ClientSession, url: str) -> None:
        self.session = session
        self.url = url.rstrip("/")

    async def call(
        self, method: str, path: str, body: Any = None, content_type: str = "application/json"
    ) -> Any:
        async with self.session.request(
            method, self.url + path, json=body, headers={"Content-Type": content_type}
        ) as response:
            if response.status >= 400:
                raise RuntimeError(
                    f"{method} {path}: HTTP {response.status}: {await response.text()}"
                )
            return await response.json()

    async def create(self, path: str, body: dict[str, Any]) -> Any:
        return await self.call("POST", path, body)

    async def merge_patch(self, path: str, body: dict[str, Any]) -> Any:
        return await self.call("PATCH", path, body, "application/merge-patch+json")

    async def delete(self, path: str) -> Any:
        return await self.call("DELETE", path)

    async def items(self, path: str) -> list[dict[str, Any]]:
        return list((await self.call("GET", path))["items"])

    async def watch(
        self, path: str, on_list: Callable[[list[dict[str, Any]]], None]
    ) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        """List, then watch from the list's resourceVersion; list again when the watch ends or
        fails (`on_list` gets each listing, so the caller can notice objects gone meanwhile)."""
        while True:
            try:
                listed = await self.call("GET", path)
                on_list(list(listed["items"]))
                version = listed["metadata"]["resourceVersion"]
                query = f"?watch=true&resourceVersion={version}&timeoutSeconds=300"
                async with self.session.get(
                    self.url + path + query, timeout=aiohttp.ClientTimeout(total=None)
                ) as response:
                    if response.status >= 400:
                        raise RuntimeError(f"watch {path}: HTTP {response.status}")
                    async for raw in response.content:
                        if not raw.strip():
                            continue
                        event = json.loads(raw)
                        if event["type"] in ("ADDED", "MODIFIED", "DELETED"):
                            yield event["type"], event["object"]
                        elif event["type"] == "ERROR":
                            break
            except (aiohttp.ClientError, RuntimeError, TimeoutError) as exc:
                print(f"recorder: watch {path} restarts after {exc!r}", flush=True)
                await asyncio.sleep(0.2)


class Slurm:
    """The simulator's slurmrestd, as a user's script would call it."""

    def __init__(
        self, session: aiohttp.ClientSession, env: dict[str, str], cluster: str | None = None
    ) -> None:
        """`cluster` reads that cluster's `SLURM_<CLUSTER>_*` settings first, as slurm-syncer
        does for a stack of several clusters; without it, the single-cluster `SLURM_*` ones."""
        self.session = session
        prefix = f"SLURM_{cluster.upper()}_" if cluster else "SLURM_"
        self.url = (env.get(prefix + "URL") or env["SLURM_URL"]).rstrip("/")
        token_file = env.get(prefix + "TOKEN_FILE") or env["SLURM_TOKEN_FILE"]
        self.headers = {
            "X-SLURM-USER-NAME": env.get(prefix + "USER") or env.get("SLURM_USER", "slurm"),
            "X-SLURM-USER-TOKEN": Path(token_file).read_text().strip(),
        }
        self.api: str | None = None

    async def call(self, method: str, path: str, body: Any = None) -> Any:
        if self.api is None:
            # The newest API version both slurmrestd and Nodeflow speak, as slurm-syncer picks.
            async with self.session.get(self.url + "/openapi/v3", headers=self.headers) as reply:
                self.api = prefix_from_openapi(await reply.json())
        async with self.session.request(
            method, self.url + self.api + path, json=body, headers=self.headers
        ) as response:
            if response.status >= 400:
                raise RuntimeError(f"slurmrestd {method} {path}: HTTP {response.status}")
            return await response.json()

    async def nodes(self) -> dict[str, list[str]]:
        listed = await self.call("GET", "/nodes")
        return {node["name"]: list(node.get("state") or []) for node in listed["nodes"]}

    async def jobs(self) -> dict[int, tuple[list[str], str]]:
        """job id -> (its states, its node list)."""
        listed = await self.call("GET", "/jobs")
        return {
            int(job["job_id"]): (list(job.get("job_state") or []), str(job.get("nodes") or ""))
            for job in listed["jobs"]
        }

    async def run_job(self, node: str) -> int:
        job = {
            "name": "chaos",
            "script": "#!/bin/bash\nsleep infinity\n",
            "current_working_directory": "/tmp",
            "environment": ["PATH=/bin"],
            "required_nodes": [node],
            "minimum_nodes": 1,
            "time_limit": {"infinite": True, "set": True},
        }
        reply = await self.call("POST", "/job/submit", {"job": job})
        return int(reply["job_id"])

    async def end_job(self, job: int) -> None:
        await self.call("DELETE", f"/job/{job}")


@dataclass
class Violation:
    rule: str
    detail: str
    at: float = field(default_factory=time.monotonic)

    def __str__(self) -> str:
        return f"[{self.rule}] {self.detail}"


@dataclass
class RollingBudget:
    replicas: int
    max_unavailable: int
    worst: int = 0


class Recorder:
    """Watches pods, nodes, NodeSets, NodeMaintenances, the MaintenanceOperatorConfig and
    PodGroups through the Kubernetes API and polls Slurm's jobs; records every violation of
    the rules in this module's docstring."""

    def __init__(
        self, kube: Kube, slurm: Slurm, gang_settle_seconds: float = GANG_SETTLE_SECONDS
    ) -> None:
        self.kube = kube
        self.slurm = slurm
        self.gang_settle_seconds = gang_settle_seconds
        self.violations: list[Violation] = []
        self.pods: dict[str, dict[str, Any]] = {}
        self.nodes: dict[str, dict[str, Any]] = {}
        self.nodesets: dict[str, dict[str, Any]] = {}
        self.maintenances: dict[str, dict[str, Any]] = {}
        self.operator_config: dict[str, Any] | None = None
        self.pod_groups: dict[str, dict[str, Any]] = {}
        self.most_replicas: dict[str, int] = {}
        self.node_of_pod_name: dict[str, str] = {}
        self.rolling: dict[str, RollingBudget] = {}
        self.most_in_maintenance = 0
        self.most_unavailable_nodes = 0
        self.partial_since: dict[str, float] = {}
        self.partial_reported: set[str] = set()
        self.deletions_seen: set[str] = set()  # pod uids whose deletion was judged
        self.job_states: dict[int, list[str]] = {}
        self._listed: set[str] = set()
        self._tasks: list[asyncio.Task[None]] = []

    # --- lifecycle ---------------------------------------------------------------------

    async def start(self) -> None:
        sources: list[tuple[str, str, Callable[[str, dict[str, Any]], None]]] = [
            ("pods", PODS, self._on_pod),
            ("nodes", NODES, self._on_node),
            ("nodesets", NODESETS, self._on_nodeset),
            ("nodemaintenances", NODE_MAINTENANCES, self._on_maintenance),
            ("operatorconfigs", OPERATOR_CONFIGS, self._on_operator_config),
            ("podgroups", POD_GROUPS, self._on_pod_group),
        ]
        for name, path, handler in sources:
            self._tasks.append(asyncio.create_task(self._follow(name, path, handler)))
        self._tasks.append(asyncio.create_task(self._poll_slurm()))
        self._tasks.append(asyncio.create_task(self._tick_gangs()))

        async def listed() -> bool:
            return len(self._listed) == len(sources)

        await wait_until(listed, 30, "the recorder's first listings")

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _follow(
        self, name: str, path: str, handler: Callable[[str, dict[str, Any]], None]
    ) -> None:
        known: dict[str, dict[str, Any]] = {}

        def on_list(items: list[dict[str, Any]]) -> None:
            present = {item["metadata"]["name"]: item for item in items}
            for gone in set(known) - set(present):
                handler("DELETED", known.pop(gone))
            for item in items:
                known[item["metadata"]["name"]] = item
                handler("MODIFIED", item)
            self._listed.add(name)

        async for kind, obj in self.kube.watch(path, on_list):
            if kind == "DELETED":
                known.pop(obj["metadata"]["name"], None)
            else:
                known[obj["metadata"]["name"]] = obj
            handler(kind, obj)

    def record(self, rule: str, detail: str) -> None:
        if any(v.rule == rule and v.detail == detail for v in self.violations):
            return  # the same broken state seen again on a later event
        violation = Violation(rule, detail)
        print(f"recorder: VIOLATION {violation}", flush=True)
        self.violations.append(violation)

    # --- pods: busy-pod-deleted, two-pods-on-one-node, duplicate-pod, rolling-budget ---------

    def _on_pod(self, kind: str, pod: dict[str, Any]) -> None:
        name = pod["metadata"]["name"]
        if kind == "DELETED":
            self.pods.pop(name, None)
        else:
            self.pods[name] = pod
        nodeset = (pod["metadata"].get("labels") or {}).get(NODESET_LABEL)
        if nodeset is None:
            return
        uid = pod["metadata"].get("uid", "")
        if (kind == "DELETED" or terminating(pod)) and uid not in self.deletions_seen:
            self.deletions_seen.add(uid)
            self._tasks.append(asyncio.create_task(self._judge_deletion(name)))
        node = (pod.get("spec") or {}).get("nodeName")
        if node and kind != "DELETED":
            first = self.node_of_pod_name.setdefault(name, node)
            if first != node:
                self.record("duplicate-pod", f"pod name {name} seen on {first} and on {node}")
            self._check_one_nodeset_pod_per_node(node)
        self._check_nodeset_pods(nodeset)

    def _check_one_nodeset_pod_per_node(self, node: str) -> None:
        """two-pods-on-one-node over every NodeSet: at most one live NodeSet pod on `node`,
        and none of another NodeSet beside one still terminating there."""
        live: list[str] = []
        owners: set[str] = set()
        for other in self.pods.values():
            owner = (other["metadata"].get("labels") or {}).get(NODESET_LABEL)
            if owner is None or (other.get("spec") or {}).get("nodeName") != node:
                continue
            if pod_finished(other):
                continue
            owners.add(owner)
            if not terminating(other):
                live.append(f"{owner}/{other['metadata']['name']}")
        if len(live) > 1 or len(owners) > 1:
            self.record("two-pods-on-one-node", f"node {node}: {sorted(live)} of {sorted(owners)}")

    async def _judge_deletion(self, pod_name: str) -> None:
        try:
            jobs = await self.slurm.jobs()
        except (aiohttp.ClientError, RuntimeError, TimeoutError) as exc:
            self.record("busy-pod-deleted", f"{pod_name}: Slurm unreadable at deletion: {exc!r}")
            return
        # The chaos tests' jobs run on one node each, so `nodes` is a plain name, not a range.
        running = [
            job
            for job, (states, nodes) in jobs.items()
            if "RUNNING" in states and pod_name in nodes.split(",")
        ]
        if running:
            self.record(
                "busy-pod-deleted", f"pod {pod_name} deleted while Slurm runs job(s) {running}"
            )

    def live_pods(self, nodeset: str) -> list[dict[str, Any]]:
        return [
            p
            for p in self.pods.values()
            if (p["metadata"].get("labels") or {}).get(NODESET_LABEL) == nodeset
            and not terminating(p)
            and not pod_finished(p)
        ]

    def _check_nodeset_pods(self, nodeset: str) -> None:
        live = self.live_pods(nodeset)
        most = self.most_replicas.get(nodeset)
        if most is not None and len(live) > most:
            names = sorted(p["metadata"]["name"] for p in live)
            self.record(
                "duplicate-pod", f"NodeSet {nodeset}: {len(live)} live pods > {most}: {names}"
            )
        budget = self.rolling.get(nodeset)
        if budget is not None:
            available = sum(
                1 for p in live if is_true(p, "Ready") and not is_true(p, SLURM_DELETE_CONDITION)
            )
            unavailable = max(0, budget.replicas - available)
            budget.worst = max(budget.worst, unavailable)
            if unavailable > budget.max_unavailable:
                self.record(
                    "rolling-budget",
                    f"NodeSet {nodeset}: {unavailable} unavailable > maxUnavailable "
                    f"{budget.max_unavailable}",
                )

    def arm_rolling_budget(self, nodeset: str, replicas: int, max_unavailable: int) -> None:
        """From now on, `nodeset` (steady at `replicas`) may have at most `max_unavailable`
        pods unavailable."""
        self.rolling[nodeset] = RollingBudget(replicas, max_unavailable)
        self._check_nodeset_pods(nodeset)

    def _on_nodeset(self, kind: str, obj: dict[str, Any]) -> None:
        name = obj["metadata"]["name"]
        if kind == "DELETED":
            self.nodesets.pop(name, None)
            return
        self.nodesets[name] = obj
        replicas = int((obj.get("spec") or {}).get("replicas") or 0)
        self.most_replicas[name] = max(self.most_replicas.get(name, 0), replicas)

    # --- maintenance budgets ------------------------------------------------------------

    def _limit(self, key: str, total: int, round_up: bool) -> int | None:
        spec = (self.operator_config or {}).get("spec") or {}
        value = spec.get(key)
        if value is None:
            return 1 if key == "maxParallelOperations" else None
        if isinstance(value, str) and value.endswith("%"):
            exact = int(value[:-1]) * total / 100
            return -int(-exact // 1) if round_up else int(exact)
        limit = int(value)
        return None if key == "maxParallelOperations" and limit == 0 else limit

    def node_exists_for(self, maintenance: dict[str, Any]) -> bool:
        """Whether the node the request was made for exists: its name, and the uid its Node
        ownerReference names (a node that took the name is another)."""
        node = self.nodes.get(str(maintenance["spec"]["nodeName"]))
        if node is None:
            return False
        owners = [
            r
            for r in maintenance["metadata"].get("ownerReferences") or ()
            if r.get("kind") == "Node"
        ]
        return all(r.get("uid") == node["metadata"].get("uid") for r in owners)

    def in_progress(self, maintenance: dict[str, Any]) -> bool:
        return (condition(maintenance, "Ready") or {}).get("reason") not in (None, "", "Pending")

    def in_maintenance(self) -> set[str]:
        return {
            str(m["spec"]["nodeName"])
            for m in self.maintenances.values()
            if self.in_progress(m) and self.node_exists_for(m)
        }

    def gone_node_slots(self) -> list[str]:
        """maintenance-gone-node-slot at rest: what requests of gone nodes still hold."""
        holders = sorted(
            name
            for name, m in self.maintenances.items()
            if self.in_progress(m) and not self.node_exists_for(m)
        )
        held = [
            f"request {name} of a gone node still holds its finalizer while deleted"
            for name, m in sorted(self.maintenances.items())
            if not self.node_exists_for(m)
            and m["metadata"].get("deletionTimestamp")
            and "maintenance.nvidia.com/finalizer" in (m["metadata"].get("finalizers") or ())
        ]
        if not holders:
            return held
        busy = self.in_maintenance()
        limit = self._limit("maxParallelOperations", len(self.nodes), round_up=True)
        down_limit = self._limit("maxUnavailable", len(self.nodes), round_up=False)
        down = self.unavailable_nodes() | busy
        for name, m in sorted(self.maintenances.items()):
            node = str(m["spec"]["nodeName"])
            if (
                (condition(m, "Ready") or {}).get("reason") != "Pending"
                or m["metadata"].get("deletionTimestamp")
                or not self.node_exists_for(m)
                or node in busy
            ):
                continue
            slot_free = limit is None or len(busy) < limit
            budget_free = down_limit is None or node in down or len(down) < down_limit
            if slot_free and budget_free:
                held.append(
                    f"request {name} on {node} waits with a slot free while requests of gone "
                    f"nodes {holders} are in progress"
                )
        return held

    def unavailable_nodes(self) -> set[str]:
        return {
            name
            for name, node in self.nodes.items()
            if (node.get("spec") or {}).get("unschedulable") or not is_true(node, "Ready")
        }

    def _on_maintenance(self, kind: str, obj: dict[str, Any]) -> None:
        name = obj["metadata"]["name"]
        if kind == "DELETED":
            self.maintenances.pop(name, None)
            return
        self.maintenances[name] = obj
        busy = self.in_maintenance()
        self.most_in_maintenance = max(self.most_in_maintenance, len(busy))
        limit = self._limit("maxParallelOperations", len(self.nodes), round_up=True)
        if limit is not None and len(busy) > limit:
            self.record(
                "maintenance-parallel",
                f"{len(busy)} nodes in maintenance {sorted(busy)} > maxParallelOperations {limit}",
            )

    def _on_node(self, kind: str, obj: dict[str, Any]) -> None:
        name = obj["metadata"]["name"]
        if kind == "DELETED":
            self.nodes.pop(name, None)
            return
        self.nodes[name] = obj
        down = self.unavailable_nodes()
        self.most_unavailable_nodes = max(self.most_unavailable_nodes, len(down))
        limit = self._limit("maxUnavailable", len(self.nodes), round_up=False)
        if limit is not None and len(down) > limit:
            self.record(
                "maintenance-unavailable",
                f"{len(down)} nodes unavailable {sorted(down)} > maxUnavailable {limit}",
            )

    def _on_operator_config(self, kind: str, obj: dict[str, Any]) -> None:
        if obj["metadata"]["name"] == "default":
            self.operator_config = None if kind == "DELETED" else obj

    # --- gangs ------------------------------------------------------------------------

    def _on_pod_group(self, kind: str, obj: dict[str, Any]) -> None:
        name = obj["metadata"]["name"]
        if kind == "DELETED":
            self.pod_groups.pop(name, None)
        else:
            self.pod_groups[name] = obj

    def gang_members(self, group: str) -> list[dict[str, Any]]:
        return [
            p
            for p in self.pods.values()
            if (p["metadata"].get("labels") or {}).get(POD_GROUP_LABEL) == group
            and not terminating(p)
        ]

    def partial_gangs(self) -> dict[str, str]:
        """PodGroups bound in part: some members bound, fewer than minMember, others not."""
        partial: dict[str, str] = {}
        for name, group in self.pod_groups.items():
            min_member = int((group.get("spec") or {}).get("minMember") or 1)
            members = self.gang_members(name)
            bound = [p for p in members if (p.get("spec") or {}).get("nodeName")]
            if bound and len(bound) < min_member and len(bound) < len(members):
                partial[name] = f"{len(bound)} of minMember {min_member} bound"
        return partial

    async def _tick_gangs(self) -> None:
        while True:
            now = time.monotonic()
            partial = self.partial_gangs()
            for name in set(self.partial_since) - set(partial):
                del self.partial_since[name]
            for name, what in partial.items():
                since = self.partial_since.setdefault(name, now)
                settle = self.gang_settle_seconds
                if now - since > settle and name not in self.partial_reported:
                    self.partial_reported.add(name)
                    self.record("partial-gang", f"PodGroup {name}: {what} for over {settle:g} s")
            await asyncio.sleep(0.25)

    # --- Slurm ------------------------------------------------------------------------

    async def _poll_slurm(self) -> None:
        while True:
            try:
                jobs = await self.slurm.jobs()
            except (aiohttp.ClientError, RuntimeError, TimeoutError):
                jobs = {}
            for job, (states, nodes) in jobs.items():
                if "NODE_FAIL" in states and "NODE_FAIL" not in self.job_states.get(job, []):
                    self.record(
                        "busy-pod-deleted", f"job {job} on {nodes} ended NODE_FAIL: {states}"
                    )
                self.job_states[job] = states
            await asyncio.sleep(0.25)

    # --- verdicts ---------------------------------------------------------------------

    def assert_no_violation(self) -> None:
        assert not self.violations, "safety rules broken:\n" + "\n".join(
            str(v) for v in self.violations
        )

    def assert_quiescent(self) -> None:
        """At rest: no violation recorded, no gang left bound in part, no maintenance slot
        held by a request whose node is gone."""
        partial = self.partial_gangs()
        assert not partial, f"partial gangs at quiescence: {partial}"
        for detail in self.gone_node_slots():
            self.record("maintenance-gone-node-slot", detail)
        self.assert_no_violation()

    async def converged(
        self, desired: Callable[[], bool], last_kill: float, what: str, within: float = 0.0
    ) -> float:
        """Wait until `desired()` holds; it must within `within` (CONVERGE_SECONDS by default)
        of `last_kill`. Returns the seconds it took after the last kill."""
        bound = within or CONVERGE_SECONDS
        while not desired():
            assert time.monotonic() - last_kill < bound, (
                f"{what}: not converged within {bound:.0f} s of the last kill"
            )
            await asyncio.sleep(0.2)
        return time.monotonic() - last_kill


class LauncherOutput:
    """The launcher's output lines, collected in the background, to wait for one."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.lines: list[str] = []
        self._process = process
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        assert self._process.stdout is not None
        while line := await self._process.stdout.readline():
            self.lines.append(line.decode(errors="replace").rstrip())

    async def wait_for(self, text: str, after: int, timeout: float) -> int:
        """The index of the first line at or after `after` that contains `text`."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for index in range(after, len(self.lines)):
                if text in self.lines[index]:
                    return index
            if self._process.returncode is not None:
                break
            await asyncio.sleep(0.05)
        raise AssertionError(
            f"no launcher line with {text!r} in {timeout:.0f} s:\n" + "\n".join(self.lines[-40:])
        )

    async def close(self) -> None:
        self._reader.cancel()
        await asyncio.gather(self._reader, return_exceptions=True)


@dataclass
class Stack:
    """The launcher's stack as a test sees it."""

    run_dir: Path
    launcher: asyncio.subprocess.Process
    output: LauncherOutput
    env: dict[str, str]
    session: aiohttp.ClientSession
    kube: Kube
    slurm: Slurm

    def child_pid(self, name: str) -> int:
        # The launcher rewrites children.json at each restart: a read mid-write is retried.
        for _ in range(50):
            try:
                children = json.loads((self.run_dir / "children.json").read_text())
            except json.JSONDecodeError:
                time.sleep(0.02)
                continue
            return int(children[name]["pid"])
        raise AssertionError("children.json unreadable")

    async def service_ready(self, service: str) -> bool:
        try:
            async with self.session.get(
                f"{self.env[env_key(service)]}/readyz", timeout=aiohttp.ClientTimeout(total=2)
            ) as response:
                return response.status == 200
        except (aiohttp.ClientError, TimeoutError):
            return False

    async def all_ready(self) -> bool:
        answers = await asyncio.gather(*(self.service_ready(s) for s, _ in SERVICES))
        return all(answers)


@contextlib.asynccontextmanager
async def launched_stack(
    run_dir: Path, nodes: int, topology: str, settings: dict[str, str] | None = None
) -> AsyncIterator[Stack]:
    """`python -m nodeflow_runtime.launcher` with `settings` in its environment (CHAOS_ENV
    unless given; {} keeps every service default); stopped with SIGINT at the end (and killed
    if it overstays)."""
    launcher = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "nodeflow_runtime.launcher",
        "--run-dir",
        str(run_dir),
        "--nodes",
        str(nodes),
        "--topology",
        topology,
        "--nats-port",
        "0",
        "--log-level",
        "warning",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env={
            **os.environ,
            **(CHAOS_ENV if settings is None else settings),
            "PYTHONUNBUFFERED": "1",
        },
    )
    output = LauncherOutput(launcher)
    try:
        async with aiohttp.ClientSession() as session:
            await output.wait_for(READY_LINE, 0, timeout=150)
            env = read_env_file(run_dir / "env")
            kube = Kube(session, env["KUBE_API_URL"])
            yield Stack(run_dir, launcher, output, env, session, kube, Slurm(session, env))
    finally:
        if launcher.returncode is None:
            launcher.send_signal(signal.SIGINT)
            try:
                await asyncio.wait_for(launcher.wait(), 90)
            except TimeoutError:
                launcher.kill()
                await launcher.wait()
        await output.close()


@dataclass
class Kill:
    target: str
    at: float
    back_at: float = 0.0  # restarted and ready again (every service, for nats-server)

    @property
    def recovery(self) -> float:
        return self.back_at - self.at


class Monkey:
    """kill -9 of the named services and nats-server, each after a seeded random pause. After
    a kill it mostly waits for the launcher to bring the victim back before the next one, but
    with probability `overlap` it strikes again while the victim is still restarting (so a
    service may come back to a dead NATS, or NATS die under a service's start)."""

    def __init__(self, stack: Stack, rng: random.Random, overlap: float = 0.3) -> None:
        self.stack = stack
        self.rng = rng
        self.overlap = overlap
        self.kills: list[Kill] = []
        self.half_done = asyncio.Event()

    @property
    def last_kill(self) -> float:
        return self.kills[-1].at if self.kills else time.monotonic()

    def strike(self, target: str) -> tuple[Kill, int]:
        """kill -9 `target` now; returns the kill and the launcher's line count at that moment."""
        seen = len(self.stack.output.lines)
        pid = self.stack.child_pid(target)
        os.kill(pid, signal.SIGKILL)
        kill = Kill(target, time.monotonic())
        print(f"chaos: kill -9 {target} (pid {pid})", flush=True)
        self.kills.append(kill)
        return kill, seen

    async def until_back(self, kill: Kill, seen: int) -> Kill:
        output = self.stack.output
        if kill.target == NATS:
            seen = await output.wait_for("nats-server restarted", seen, timeout=90)
            await wait_until(self.stack.all_ready, 90, "every service ready after NATS restarted")
        else:
            await output.wait_for(f"{kill.target} ready again", seen, timeout=120)
        kill.back_at = time.monotonic()
        print(f"chaos: {kill.target} back after {kill.recovery:.1f} s", flush=True)
        return kill

    async def kill(self, target: str) -> Kill:
        """kill -9 `target` and wait until it is back."""
        return await self.until_back(*self.strike(target))

    async def run(self, targets: Iterable[str], pause: tuple[float, float]) -> list[Kill]:
        order = list(targets)
        self.rng.shuffle(order)
        overlapping = [self.rng.random() < self.overlap for _ in order]
        print(f"chaos: kills in order {order}, next one without waiting: {overlapping}")
        recoveries: list[asyncio.Task[Kill]] = []
        try:
            for index, target in enumerate(order):
                await asyncio.sleep(self.rng.uniform(*pause))
                recovery = asyncio.create_task(self.until_back(*self.strike(target)))
                recoveries.append(recovery)
                if not overlapping[index]:
                    await recovery
                if index + 1 >= len(order) / 2:
                    self.half_done.set()
            await asyncio.gather(*recoveries)
        finally:
            for recovery in recoveries:
                recovery.cancel()
            await asyncio.gather(*recoveries, return_exceptions=True)
        self.half_done.set()
        return self.kills


@contextlib.asynccontextmanager
async def recording(
    stack: Stack, gang_settle_seconds: float = GANG_SETTLE_SECONDS
) -> AsyncIterator[Recorder]:
    recorder = Recorder(stack.kube, stack.slurm, gang_settle_seconds)
    await recorder.start()
    try:
        yield recorder
    finally:
        await recorder.stop()


def summary(kills: list[Kill]) -> str:
    return ", ".join(f"{k.target} {k.recovery:.1f} s" for k in kills)
