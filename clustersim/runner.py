"""Run the whole simulator in-process: the test entry point and the engine of the CLI.

    async with run_simulator(SimulatorConfig(nodes=4)) as sim:
        sim.kubeconfig_path, sim.kube_url, sim.store        # Kubernetes API emulator
        sim.slurm_url, sim.slurm_token(), sim.slurm["sim"]   # Slurm emulator(s)
        sim.make_node_not_ready("node-001"); sim.remove_node(...); sim.add_node()
        async with sim.api_client() as api: ...             # kubernetes-asyncio ApiClient
        await sim.wait_for(lambda: ..., timeout=5)

Start order matters: the store gets the CRDs and the nodes, the actors and the Slurm
emulators start, and only then does the Kubernetes API listen, so `GET /_sim/readyz` on the
kube port answers exactly when everything is up.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import secrets
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog
import yaml
from aiohttp import web

from clustersim.cluster.jobcontroller import JobController
from clustersim.cluster.kubelet import Kubelet, KubeletConfig, node_is_ready
from clustersim.cluster.loop import Controller, cancel_tasks
from clustersim.cluster.nodes import NodeAdmin
from clustersim.cluster.scheduler import DefaultScheduler
from clustersim.cluster.slurmwire import SlurmNodeSink, SlurmNodeWiring
from clustersim.cluster.spec import ClusterSpec, NodeSpec, merge_cli_overrides
from clustersim.kube.errors import AlreadyExists
from clustersim.kube.objects import Obj
from clustersim.kube.resources import alpha_resource_infos
from clustersim.kube.server import RunningServer, serve
from clustersim.kube.store import Store
from clustersim.localnats import LocalNats, install_local_nats
from clustersim.slurm.releases import DEFAULT_SLURM_VERSION
from clustersim.slurm.server import RunningSlurm, run_slurm_emulator
from nodeflow_contracts.skyhook import DEFAULT_SKYHOOK_NAMESPACE
from nodeflow_runtime.envfile import update_env_file

log = structlog.get_logger("clustersim.runner")

CRD_KIND = "CustomResourceDefinition"
INSTALL_NAMESPACE = "nodeflow-system"
SKYHOOK_NAMESPACE = DEFAULT_SKYHOOK_NAMESPACE
DEFAULT_CRD_DIR = Path(__file__).resolve().parents[1] / "k8s" / "crds"
TOKEN_LIFESPAN_SECONDS = 7 * 24 * 3600


@dataclass(frozen=True)
class SimulatorConfig:
    """Everything the simulator needs; defaults are tuned for fast tests."""

    nodes: int | None = None
    topology: str | None = None
    cluster: ClusterSpec = field(default_factory=lambda: ClusterSpec(nodes=4))
    kubelet_delay: float = 0.05
    job_runtime: float = 0.5
    failure_runtime: float | None = None
    job_backoff_seconds: float = 0.0
    reboot_seconds: float = 3.0  # a node a pod reboots is Ready=False this long
    run_dir: Path | None = None
    crd_dir: Path | None = DEFAULT_CRD_DIR
    slurm_clusters: Sequence[str] = ("sim",)
    slurm_user: str = "slurm"
    # The Slurm release emulated (clustersim.slurm.releases): the API versions it serves.
    slurm_version: str = DEFAULT_SLURM_VERSION
    slurm_driver_interval: float = 0.2
    kube_port: int = 0
    admin_port: int = 0
    start_admin_server: bool = True
    # `make run`'s nats-server on the host: shown in INSTALL_NAMESPACE as an install's Service
    # `nats`, its pod and the operators' Secret (clustersim.localnats); None: no NATS objects.
    local_nats: LocalNats | None = None
    # Alpha APIs served (`group/version=true`, as kube-apiserver's --runtime-config).
    runtime_config: Sequence[str] = ()

    def cluster_spec(self) -> ClusterSpec:
        return merge_cli_overrides(self.cluster, nodes=self.nodes, topology=self.topology)

    @property
    def default_slurm_cluster(self) -> str:
        return self.slurm_clusters[0]


def crd_documents(crd_dir: Path) -> list[Obj]:
    """Every CustomResourceDefinition in the directory's YAML files (other kinds skipped)."""
    documents: list[Obj] = []
    for path in sorted(crd_dir.glob("*.yaml")):
        for document in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            if isinstance(document, dict) and document.get("kind") == CRD_KIND:
                documents.append(document)
    return documents


def apply_crds(store: Store, crd_dir: Path) -> list[str]:
    names = []
    for document in crd_documents(crd_dir):
        with contextlib.suppress(AlreadyExists):
            store.create("customresourcedefinitions.apiextensions.k8s.io", document)
        names.append(str(document["metadata"]["name"]))
    return names


class Simulator:
    """A running simulator. Admin helpers act synchronously on the store."""

    def __init__(
        self,
        config: SimulatorConfig,
        store: Store,
        run_dir: Path,
        nodes: NodeAdmin,
        slurm: dict[str, RunningSlurm],
    ) -> None:
        self.config = config
        self.store = store
        self.run_dir = run_dir
        self.nodes = nodes
        self.slurm = slurm
        self.kube: RunningServer | None = None
        self.admin_url = ""
        self.crds: list[str] = []
        self.token_file = run_dir / "slurm" / "token"
        self.jwt_key_file = run_dir / "slurm" / "jwt_hs256.key"

    # ---------------------------------------------------------------- endpoints

    @property
    def kube_url(self) -> str:
        assert self.kube is not None, "the Kubernetes API is not serving yet"
        return self.kube.url

    @property
    def kubeconfig_path(self) -> Path:
        return self.run_dir / "kubeconfig"

    @property
    def env_path(self) -> Path:
        return self.run_dir / "env"

    @property
    def default_slurm_cluster(self) -> str:
        return self.config.default_slurm_cluster

    @property
    def slurm_url(self) -> str:
        return self.slurm[self.default_slurm_cluster].url

    def slurm_token(self, user: str | None = None, cluster: str | None = None) -> str:
        running = self.slurm[cluster or self.default_slurm_cluster]
        return running.mint_token(user or self.config.slurm_user, TOKEN_LIFESPAN_SECONDS)

    def slurm_headers(self, user: str | None = None, cluster: str | None = None) -> dict[str, str]:
        who = user or self.config.slurm_user
        return {"X-SLURM-USER-NAME": who, "X-SLURM-USER-TOKEN": self.slurm_token(who, cluster)}

    def env(self) -> dict[str, str]:
        """The KEY=value pairs written to `<run-dir>/env`."""
        return {
            "KUBECONFIG": str(self.kubeconfig_path),
            "KUBE_API_URL": self.kube_url,
            **slurm_env(self.config, self.slurm, self.token_file, self.jwt_key_file),
            "SIM_ADMIN_URL": self.admin_url,
        }

    # ---------------------------------------------------------------- admin helpers

    def make_node_not_ready(self, name: str, *, unknown: bool = True) -> Obj:
        return self.nodes.set_ready(name, False, unknown=unknown)

    def make_node_ready(self, name: str) -> Obj:
        return self.nodes.set_ready(name, True)

    def remove_node(self, name: str) -> None:
        self.nodes.remove_node(name)

    def add_node(self, node: NodeSpec | None = None, **changes: Any) -> Obj:
        return self.nodes.add_node(node, **changes)

    def cordon_node(self, name: str, unschedulable: bool = True) -> Obj:
        return self.nodes.cordon(name, unschedulable)

    def node_names(self) -> list[str]:
        return [n["metadata"]["name"] for n in self.store.list("nodes").items]

    async def wait_for(
        self, predicate: Callable[[], Any], timeout: float = 5.0, interval: float = 0.02
    ) -> Any:
        """Poll until `predicate()` is truthy and return its value; TimeoutError otherwise."""
        deadline = time.monotonic() + timeout
        while True:
            value = predicate()
            if value:
                return value
            if time.monotonic() >= deadline:
                raise TimeoutError(f"condition not met within {timeout}s")
            await asyncio.sleep(interval)

    @contextlib.asynccontextmanager
    async def api_client(self) -> AsyncIterator[Any]:
        """A kubernetes-asyncio ApiClient for this simulator's kubeconfig."""
        from kubernetes_asyncio import client, config

        configuration = client.Configuration()
        await config.load_kube_config(
            config_file=str(self.kubeconfig_path), client_configuration=configuration
        )
        api = client.ApiClient(configuration=configuration)
        try:
            yield api
        finally:
            await api.close()


def slurm_env(
    config: SimulatorConfig, slurm: dict[str, RunningSlurm], token_file: Path, jwt_key_file: Path
) -> dict[str, str]:
    """The Slurm half of `<run-dir>/env`: the default cluster's SLURM_URL and friends, and
    per cluster the SLURM_<CLUSTER>_URL, _TOKEN_FILE, _JWT_KEY_FILE and _USER slurm-syncer
    reads."""
    values = {
        "SLURM_CLUSTERS": ",".join(config.slurm_clusters),
        "SLURM_URL": slurm[config.default_slurm_cluster].url,
        "SLURM_TOKEN_FILE": str(token_file),
        "SLURM_JWT_KEY_FILE": str(jwt_key_file),
        "SLURM_USER": config.slurm_user,
    }
    for name, running in slurm.items():
        prefix = f"SLURM_{_env_suffix(name)}_"
        values[prefix + "URL"] = running.url
        values[prefix + "TOKEN_FILE"] = str(token_file)
        values[prefix + "JWT_KEY_FILE"] = str(jwt_key_file)
        values[prefix + "USER"] = config.slurm_user
    return values


async def start_slurm_emulators(
    stack: contextlib.AsyncExitStack, config: SimulatorConfig, run_dir: Path
) -> dict[str, RunningSlurm]:
    """One emulated slurmctld+slurmrestd per configured cluster, stopped with `stack`, all
    signing with one key (`<run-dir>/slurm/jwt_hs256.key`), and a token for the Slurm user
    in `<run-dir>/slurm/token` (both 0600)."""
    slurm_dir = run_dir / "slurm"
    slurm_dir.mkdir(parents=True, exist_ok=True)
    key = secrets.token_bytes(32)  # one key for every emulated cluster: one token file
    slurm: dict[str, RunningSlurm] = {}
    for name in config.slurm_clusters:
        slurm[name] = await stack.enter_async_context(
            run_slurm_emulator(
                name,
                key_path=slurm_dir / f"{name}.jwt_hs256.key",
                key=key,
                slurm_user=config.slurm_user,
                slurm_version=config.slurm_version,
                driver_interval=config.slurm_driver_interval,
                # As tools/slurm/real_slurm.sh configures Slurm: a NodeSet pod that comes
                # back re-registers its node even when it was drained before it went away.
                return_to_service=2,
            )
        )
    (slurm_dir / "jwt_hs256.key").write_bytes(key)
    os.chmod(slurm_dir / "jwt_hs256.key", 0o600)
    token = slurm[config.default_slurm_cluster].mint_token(
        config.slurm_user, TOKEN_LIFESPAN_SECONDS
    )
    (slurm_dir / "token").write_text(token + "\n", encoding="utf-8")
    os.chmod(slurm_dir / "token", 0o600)
    return slurm


def _env_suffix(name: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in name).upper()


def admin_app(sim: Simulator) -> web.Application:
    """The admin API behind SIM_ADMIN_URL: break and mend nodes from other processes."""

    async def readyz(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def list_nodes(_: web.Request) -> web.Response:
        nodes = [
            {
                "name": n["metadata"]["name"],
                "ready": node_is_ready(n),
                "unschedulable": bool(n.get("spec", {}).get("unschedulable")),
            }
            for n in sim.store.list("nodes").items
        ]
        return web.json_response({"nodes": nodes})

    async def body_of(request: web.Request) -> dict[str, Any]:
        if not request.can_read_body:
            return {}
        body = await request.json()
        if not isinstance(body, dict):
            raise web.HTTPBadRequest(text="expected a JSON object")
        return body

    async def not_ready(request: web.Request) -> web.Response:
        body = await body_of(request)
        node = sim.make_node_not_ready(
            request.match_info["name"], unknown=bool(body.get("unknown", True))
        )
        return web.json_response(node)

    async def ready(request: web.Request) -> web.Response:
        return web.json_response(sim.make_node_ready(request.match_info["name"]))

    async def cordon(request: web.Request) -> web.Response:
        return web.json_response(sim.cordon_node(request.match_info["name"], True))

    async def uncordon(request: web.Request) -> web.Response:
        return web.json_response(sim.cordon_node(request.match_info["name"], False))

    async def remove(request: web.Request) -> web.Response:
        sim.remove_node(request.match_info["name"])
        return web.json_response({"removed": request.match_info["name"]})

    async def add(request: web.Request) -> web.Response:
        body = await body_of(request)
        changes: dict[str, Any] = {}
        if "name" in body:
            changes["name"] = str(body["name"])
        spec = sim.nodes.next_node_spec(**changes)
        if "labels" in body:
            spec = dataclasses.replace(spec, labels={**spec.labels, **body["labels"]})
        return web.json_response(sim.add_node(spec), status=201)

    @web.middleware
    async def api_errors(
        request: web.Request, handler: Callable[[web.Request], Any]
    ) -> web.StreamResponse:
        from clustersim.kube.errors import ApiError

        try:
            response: web.StreamResponse = await handler(request)
            return response
        except ApiError as exc:
            return web.json_response(exc.status(), status=exc.code)

    app = web.Application(middlewares=[api_errors])
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/nodes", list_nodes)
    app.router.add_post("/nodes", add)
    app.router.add_post("/nodes/{name}/not-ready", not_ready)
    app.router.add_post("/nodes/{name}/ready", ready)
    app.router.add_post("/nodes/{name}/cordon", cordon)
    app.router.add_post("/nodes/{name}/uncordon", uncordon)
    app.router.add_delete("/nodes/{name}", remove)
    return app


@contextlib.asynccontextmanager
async def _serve_admin(sim: Simulator, port: int) -> AsyncIterator[str]:
    runner = web.AppRunner(admin_app(sim), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    server = site._server
    sockets = getattr(server, "sockets", None) or []
    bound = int(sockets[0].getsockname()[1]) if sockets else port
    try:
        yield f"http://127.0.0.1:{bound}"
    finally:
        await runner.cleanup()


@contextlib.asynccontextmanager
async def run_simulator(config: SimulatorConfig | None = None) -> AsyncIterator[Simulator]:
    """Start the store, nodes, actors, Slurm emulator(s) and the API; stop them on exit."""
    config = config or SimulatorConfig()
    async with contextlib.AsyncExitStack() as stack:
        if config.run_dir is None:
            run_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="clustersim-")))
        else:
            run_dir = Path(config.run_dir).resolve()
            run_dir.mkdir(parents=True, exist_ok=True)
        store = Store()
        for info in alpha_resource_infos(config.runtime_config):
            store.register(info)
        crds = apply_crds(store, config.crd_dir) if config.crd_dir is not None else []
        # Our install's namespaces, as `kubectl apply -k k8s/` would have made them: the
        # services' own objects (maintenance-scheduler's MaintenanceOperatorConfig `default`)
        # and the Skyhook stage Jobs.
        for namespace in (INSTALL_NAMESPACE, SKYHOOK_NAMESPACE):
            store.create(
                "namespaces",
                {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}},
            )
        if config.local_nats is not None:
            install_local_nats(store, config.local_nats, INSTALL_NAMESPACE)
        nodes = NodeAdmin(store, config.cluster_spec())
        nodes.register_all()

        slurm = await start_slurm_emulators(stack, config, run_dir)
        sim = Simulator(config, store, run_dir, nodes, slurm)
        sim.crds = crds

        sinks: dict[str, SlurmNodeSink] = {name: r.emulator for name, r in slurm.items()}
        actors: list[Controller[Any]] = [
            DefaultScheduler(store),
            Kubelet(
                store,
                KubeletConfig(
                    start_delay=config.kubelet_delay,
                    job_runtime=config.job_runtime,
                    failure_delay=config.failure_runtime,
                    reboot_seconds=config.reboot_seconds,
                ),
            ),
            JobController(store, backoff_seconds=config.job_backoff_seconds),
            SlurmNodeWiring(store, sinks, config.default_slurm_cluster),
        ]
        tasks = [asyncio.create_task(actor.run(), name=actor.name) for actor in actors]
        stack.push_async_callback(cancel_tasks, tasks)

        if config.start_admin_server:
            sim.admin_url = await stack.enter_async_context(_serve_admin(sim, config.admin_port))
        sim.kube = await stack.enter_async_context(
            serve(store, port=config.kube_port, kubeconfig_path=sim.kubeconfig_path)
        )
        update_env_file(sim.env_path, sim.env())
        log.info(
            "simulator ready",
            kube=sim.kube_url,
            slurm=sim.slurm_url,
            nodes=len(sim.node_names()),
            run_dir=str(run_dir),
        )
        yield sim
