"""The Slurm emulator on a real Kubernetes API server (`python -m clustersim --follow-kubeconfig`).

On KWOK nodes no container runs, so no slurmd starts in a NodeSet pod and no Slurm node ever
registers. In this mode the simulator emulates Slurm only and follows the pods of the API
server the kubeconfig names, as slurmd in those pods would: a NodeSet pod (label
`nodeflow.dev/nodeset`) that is Ready registers its Slurm node, one that stops being Ready or
is deleted marks it lost (clustersim.cluster.slurmwire decides both, as for the emulator's own
pods). It lists the pods, then watches from the list's resourceVersion; when the watch ends
or its resourceVersion is too old (410) it lists again, and a pod missing from the new list is
treated as deleted.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import structlog
from kubernetes_asyncio import client, config

from clustersim.cluster.slurmwire import NODESET_LABEL, PodKey, SlurmdRegistry
from clustersim.runner import SimulatorConfig, slurm_env, start_slurm_emulators
from clustersim.slurm.server import RunningSlurm
from nodeflow_bus.backoff import Backoff
from nodeflow_runtime.envfile import update_env_file

log = structlog.get_logger("clustersim.bridge")

Obj = dict[str, Any]
# Server-side watch timeout; the watch is then opened again from where it ended.
WATCH_TIMEOUT_SECONDS = 300
RETRY = Backoff(initial=0.2, factor=2.0, maximum=10.0)


class WatchExpired(Exception):
    """The watch's resourceVersion is too old (410 Gone): list again."""


def pod_key_of(pod: Obj) -> PodKey:
    return (str(pod["metadata"].get("namespace") or ""), str(pod["metadata"]["name"]))


class PodFollower:
    """Keeps `registry` in line with the NodeSet pods of a real API server."""

    def __init__(self, api: client.ApiClient, registry: SlurmdRegistry) -> None:
        self.core = client.CoreV1Api(api)
        self.registry = registry
        self.synced = asyncio.Event()
        self._resource_version = ""

    async def run(self) -> None:
        failures = 0
        while True:
            try:
                await self._list()
                failures = 0
                self.synced.set()
                while True:
                    await self._watch()
            except WatchExpired:
                log.info("pod watch expired; listing again")
            except (
                client.ApiException,
                aiohttp.ClientError,
                OSError,
                ValueError,
                KeyError,
                TimeoutError,
            ) as exc:
                failures += 1
                delay = RETRY.delay(failures)
                log.warning("pod list/watch failed", error=str(exc), retry_in=delay)
                await asyncio.sleep(delay)

    async def _list(self) -> None:
        # _preload_content=False: the aiohttp response (its stubs say the model), read as
        # plain JSON the way the emulator's actors see objects.
        response: Any = await self.core.list_pod_for_all_namespaces(
            label_selector=NODESET_LABEL, _preload_content=False
        )
        listed = json.loads(await response.read())
        pods = {pod_key_of(pod): pod for pod in listed.get("items") or []}
        # A pod that was registered and is no longer listed was deleted while not watched.
        for key in self.registry.registered() - set(pods):
            self.registry.apply(key, None, None)
        for key, pod in pods.items():
            await self._apply(key, pod)
        self._resource_version = str(listed["metadata"]["resourceVersion"])

    async def _watch(self) -> None:
        response: Any = await self.core.list_pod_for_all_namespaces(
            label_selector=NODESET_LABEL,
            watch=True,
            resource_version=self._resource_version,
            allow_watch_bookmarks=True,
            timeout_seconds=WATCH_TIMEOUT_SECONDS,
            # The client's own deadline after the server's, so the server ends the watch.
            _request_timeout=WATCH_TIMEOUT_SECONDS + 30,
            _preload_content=False,
        )
        async with response:
            while line := await response.content.readline():
                if line.strip():
                    await self._event(json.loads(line))

    async def _event(self, event: Obj) -> None:
        kind = event.get("type")
        obj: Obj = event.get("object") or {}
        if kind == "ERROR":
            if obj.get("code") == 410:
                raise WatchExpired
            raise ValueError(f"watch error: {obj.get('message')}")
        version = (obj.get("metadata") or {}).get("resourceVersion")
        if kind in ("ADDED", "MODIFIED"):
            await self._apply(pod_key_of(obj), obj)
        elif kind == "DELETED":
            self.registry.apply(pod_key_of(obj), None, None)
        if version:
            self._resource_version = str(version)

    async def _apply(self, key: PodKey, pod: Obj) -> None:
        node: Obj | None = None
        node_name = (pod.get("spec") or {}).get("nodeName")
        if node_name and self.registry.will_register(key, pod):
            node = await self._node(str(node_name))
        self.registry.apply(key, pod, node)

    async def _node(self, name: str) -> Obj | None:
        """The pod's Node, for the capacity a pod that requests nothing registers with."""
        try:
            response: Any = await self.core.read_node(name, _preload_content=False)
        except client.ApiException as exc:
            if exc.status == 404:
                return None
            raise
        node: Obj = json.loads(await response.read())
        return node


@dataclass
class RunningBridge:
    slurm: dict[str, RunningSlurm]
    kube_url: str
    env_path: Path


async def load_api_client(kubeconfig: Path) -> client.ApiClient:
    configuration = client.Configuration()
    await config.load_kube_config(config_file=str(kubeconfig), client_configuration=configuration)
    return client.ApiClient(configuration)


@contextlib.asynccontextmanager
async def run_slurm_bridge(
    simulator: SimulatorConfig, kubeconfig: Path
) -> AsyncIterator[RunningBridge]:
    """The Slurm emulators, registering the nodes of the NodeSet pods of the API server
    `kubeconfig` names; `<run-dir>/env` is written once the first list is applied, with
    KUBECONFIG pointing at that API server."""
    assert simulator.run_dir is not None, "the bridge writes its env file into a run dir"
    run_dir = Path(simulator.run_dir).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    async with contextlib.AsyncExitStack() as stack:
        slurm = await start_slurm_emulators(stack, simulator, run_dir)
        api = await load_api_client(kubeconfig)
        stack.push_async_callback(api.close)
        registry = SlurmdRegistry(
            {name: running.emulator for name, running in slurm.items()},
            simulator.default_slurm_cluster,
        )
        follower = PodFollower(api, registry)
        following = asyncio.create_task(follower.run(), name="slurm-pod-follower")

        async def stop_following() -> None:
            following.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await following

        stack.push_async_callback(stop_following)
        synced = asyncio.create_task(follower.synced.wait())
        await asyncio.wait({synced, following}, return_when=asyncio.FIRST_COMPLETED)
        if following.done():
            synced.cancel()
            following.result()  # it only ends by failing
        kube_url = str(api.configuration.host)
        env_path = run_dir / "env"
        slurm_dir = run_dir / "slurm"
        update_env_file(
            env_path,
            {
                "KUBECONFIG": str(kubeconfig.resolve()),
                "KUBE_API_URL": kube_url,
                **slurm_env(simulator, slurm, slurm_dir / "token", slurm_dir / "jwt_hs256.key"),
            },
        )
        log.info(
            "slurm bridge ready",
            kube=kube_url,
            slurm={name: running.url for name, running in slurm.items()},
            registered=len(registry.registered()),
        )
        yield RunningBridge(slurm=slurm, kube_url=kube_url, env_path=env_path)
