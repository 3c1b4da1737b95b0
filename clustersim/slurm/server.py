"""slurmrestd over HTTP (aiohttp), JWT auth, faults, and a `/_sim/slurm/` admin API.

Each `SlurmEmulator` is one named cluster with its own aiohttp app; run several on several
ports for several clusters. `run_slurm_emulator()` serves one on 127.0.0.1 for tests. It is
one Slurm release (`slurm_version`, clustersim.slurm.releases: 24.11 or 26.05, the newest by
default) and serves the `/slurm/<version>/` paths of each API version that release serves,
each in its version's shapes, and `/openapi/v3` listing those paths as slurmrestd does (paths
only: the emulator has no schemas to give).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import structlog
from aiohttp import web

# msgspec-encoded, several times faster than the json module: a listing of thousands of
# nodes answers every poll.
from clustersim.kube.server import json_response
from clustersim.slurm import errors as e
from clustersim.slurm import render
from clustersim.slurm.auth import (
    DEFAULT_LIFESPAN_SECONDS,
    JsonWebKeys,
    mint_token,
    verify_token,
    write_key_file,
)
from clustersim.slurm.clock import Clock, ManualClock, SystemClock
from clustersim.slurm.errors import SlurmError
from clustersim.slurm.model import Partition, SlurmCluster
from clustersim.slurm.parse import parse_job_submit, parse_node_update, parse_reservation
from clustersim.slurm.releases import DEFAULT_SLURM_VERSION, SlurmRelease, slurm_release
from nodeflow_contracts.slurm_api import SlurmApiVersion

log = structlog.get_logger("clustersim.slurm")

ADMIN = "/_sim/slurm"
OPENAPI_PATHS = ("/openapi/v3", "/openapi", "/openapi.json")
DOWN_MODES = ("refuse", "503", "controller")
Json = dict[str, Any]


@dataclass
class Faults:
    """Injected failures. `down`: refuse connections, answer 503, or answer as slurmrestd
    does when slurmctld is unreachable (502 with an error); `latency` in seconds;
    `error_rate` answers 500; `errors_in_200_rate` answers 200 with an error and no data;
    `openapi_hidden` answers 404 to `/openapi/v3` (a proxy that passes only `/slurm/`);
    `doubled_error_answers` follows every error answer with a second, text/plain one on the
    same connection, as Slurm 26.05.5's slurmrestd does (aiohttp refuses such an exchange)."""

    down: str | None = None
    latency: float = 0.0
    error_rate: float = 0.0
    errors_in_200_rate: float = 0.0
    openapi_hidden: bool = False
    doubled_error_answers: bool = False
    seed: int = 0
    _rng: random.Random = field(default_factory=random.Random, repr=False, compare=False)

    def roll(self, rate: float) -> bool:
        return rate > 0 and self._rng.random() < rate

    def as_dict(self) -> Json:
        data = asdict(self)
        data.pop("_rng")
        return data


@dataclass
class Intercepted:
    """A fault on one endpoint (SlurmEmulator.intercept): its requests are counted, held
    until `release()` when `held`, then answered `status` (None: served as usual)."""

    path: str
    held: bool = False
    status: int | None = None
    requests: int = 0
    arrived: asyncio.Event = field(default_factory=asyncio.Event)
    released: asyncio.Event = field(default_factory=asyncio.Event)

    def release(self) -> None:
        self.released.set()

    def matches(self, request_path: str) -> bool:
        return request_path.rstrip("/").endswith(self.path)


@dataclass
class _Reply:
    """What a handler produced: the data keys of the body, plus warnings."""

    data: Json
    warnings: list[Json] = field(default_factory=list)


class SlurmEmulator:
    """One emulated Slurm cluster behind slurmrestd. The Python API is for the simulator."""

    def __init__(
        self,
        name: str = "sim",
        *,
        key_path: Path,
        clock: Clock | None = None,
        admin_users: Sequence[str] = ("root", "slurm"),
        slurm_user: str = "slurm",
        partitions: Sequence[Partition] | None = None,
        key: bytes | None = None,
        jwks_path: Path | None = None,
        slurm_version: str = DEFAULT_SLURM_VERSION,
        **cluster_options: Any,
    ) -> None:
        self.name = name
        self.release: SlurmRelease = slurm_release(slurm_version)
        self.clock: Clock = clock or SystemClock()
        self.key_path = key_path
        self.key = write_key_file(key_path, key)
        # AuthAltParameters=jwks=<file>: RS256 tokens are checked against it, beside HS256.
        self.jwks = JsonWebKeys(jwks_path) if jwks_path is not None else None
        self.cluster = SlurmCluster(
            name,
            self.clock,
            admin_users=admin_users,
            slurm_user=slurm_user,
            partitions=partitions,
            invalid_resume_error=self.release.invalid_resume_error,
            **cluster_options,
        )
        self.proxy_users = frozenset({"root", slurm_user})
        self.faults = Faults()
        self.requests_served = 0
        self.intercepted: list[Intercepted] = []

    # ---- Python API used by the simulated kubelet / CLI ----

    def register_node(
        self,
        name: str,
        cpus: int,
        real_memory: int,
        gres: str = "",
        **options: Any,
    ) -> None:
        """A NodeSet pod became Ready: its slurmd registers; the node is IDLE."""
        self.cluster.register_node(name, cpus, real_memory, gres, **options)
        log.info("slurm_node_registered", cluster=self.name, node=name, cpus=cpus)

    def mark_lost(self, name: str) -> None:
        """The pod went away: the node is DOWN+NOT_RESPONDING with reason Not responding."""
        self.cluster.mark_lost(name)
        log.info("slurm_node_lost", cluster=self.name, node=name)

    def remove_node(self, name: str) -> None:
        self.cluster.remove_node(name)

    def node_state(self, name: str) -> list[str]:
        self.cluster.tick()
        return self.cluster.node_state(self.cluster.nodes[name])

    @property
    def api_versions(self) -> tuple[SlurmApiVersion, ...]:
        """The API versions served, oldest first."""
        return self.release.api_versions

    def node_json(self, name: str, version: SlurmApiVersion | None = None) -> Json:
        self.cluster.tick()
        return self._render_node(self.cluster.nodes[name], version or self.release.newest)

    def _render_node(self, node: Any, version: SlurmApiVersion) -> Json:
        return render.node(self.cluster, node, version, self.release.release)

    def mint_token(self, user: str = "root", lifespan: int = DEFAULT_LIFESPAN_SECONDS) -> str:
        return mint_token(self.key, user, self.clock.now(), lifespan)

    def set_faults(self, **changes: Any) -> None:
        for key, value in changes.items():
            if key not in (
                "down",
                "latency",
                "error_rate",
                "errors_in_200_rate",
                "openapi_hidden",
                "doubled_error_answers",
                "seed",
            ):
                raise ValueError(f"unknown fault {key!r}")
            if key == "down" and value is not None and value not in DOWN_MODES:
                raise ValueError(f"down must be one of {DOWN_MODES} or None")
            setattr(self.faults, key, value)
            if key == "seed":
                self.faults._rng.seed(value)
        log.info("slurm_faults_set", cluster=self.name, **self.faults.as_dict())

    def intercept(self, path: str, *, held: bool = False, status: int | None = None) -> Intercepted:
        """Count the requests of the endpoint whose path (under `/slurm/<version>`) ends with
        `path`, hold each until released when `held` (a slow slurmctld answering one query),
        then answer `status` if given (a failing one); until clear_faults."""
        fault = Intercepted(path, held=held, status=status)
        self.intercepted.append(fault)
        return fault

    def clear_faults(self) -> None:
        for fault in self.intercepted:
            fault.release()
        self.intercepted = []
        self.faults = Faults()

    async def drive(self, interval: float = 0.5) -> None:
        """Tick in real time forever (the live stack's driver task)."""
        while True:
            self.cluster.tick()
            await asyncio.sleep(interval)

    # ---- HTTP ----

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._faults_middleware])
        for version in self.release.api_versions:
            for method, path, handler_name in _routes(version):
                endpoint = self._endpoint(getattr(self, handler_name), version)
                app.router.add_route(method, version.prefix + path, endpoint)
                app.router.add_route(method, version.prefix + path + "/", endpoint)
        for path in OPENAPI_PATHS:
            app.router.add_get(path, self._openapi)
        app.router.add_get(ADMIN + "/state", self._admin_state)
        app.router.add_post(ADMIN + "/faults", self._admin_faults)
        app.router.add_delete(ADMIN + "/faults", self._admin_clear_faults)
        app.router.add_post(ADMIN + "/nodes", self._admin_register)
        app.router.add_post(ADMIN + "/nodes/{name}/lost", self._admin_lost)
        app.router.add_delete(ADMIN + "/nodes/{name}", self._admin_remove)
        app.router.add_post(ADMIN + "/token", self._admin_token)
        app.router.add_post(ADMIN + "/clock/advance", self._admin_advance)
        return app

    @web.middleware
    async def _faults_middleware(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        if request.path.startswith(ADMIN):
            return await handler(request)
        self.requests_served += 1
        if self.faults.latency > 0:
            await asyncio.sleep(self.faults.latency)
        for fault in [f for f in self.intercepted if f.matches(request.path)]:
            fault.requests += 1
            fault.arrived.set()
            if fault.held:
                await fault.released.wait()
            if fault.status is not None:
                return web.Response(status=fault.status, text="Simulated failure")
        if self.faults.down == "503":
            return web.Response(status=503, text="Service Unavailable")
        response = await handler(request)
        if self.faults.doubled_error_answers and response.status >= 400:
            await _answer_twice(request, response)
        return response

    def _endpoint(
        self, handler: Callable[[web.Request, str], Awaitable[_Reply]], version: SlurmApiVersion
    ) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        async def endpoint(request: web.Request) -> web.StreamResponse:
            request[_API_KEY] = version
            return await self._serve(request, handler)

        return endpoint

    def openapi_document(self) -> Json:
        """The OpenAPI document of the versions served: their paths, with no schemas."""
        paths: Json = {}
        for route in self.app_routes:
            method, path = route
            paths.setdefault(path, {})[method.lower()] = {"responses": {"200": {}}}
        major, minor, micro = self.release.version_parts
        return {
            "openapi": "3.0.3",
            "info": {
                "title": "Slurm REST API",
                "version": f"Slurm-{self.release.release}",
                "x-slurm": {
                    "data_parsers": [
                        {"plugin": version.name, "flags": ["NONE"]}
                        for version in self.release.api_versions
                    ],
                    "openapi": ["openapi/slurmctld"],
                    "version": {"major": major, "micro": micro, "minor": minor},
                    "release": self.release.release,
                },
            },
            "paths": paths,
        }

    @property
    def app_routes(self) -> list[tuple[str, str]]:
        """(method, path) of every `/slurm/` route served, as the OpenAPI document lists them."""
        return [
            (method, version.prefix + path + ("/" if path in _LISTED_WITH_SLASH else ""))
            for version in self.release.api_versions
            for method, path, _ in _routes(version)
        ]

    async def _openapi(self, request: web.Request) -> web.StreamResponse:
        # slurmrestd authenticates every request (rest_auth/jwt wants a token) but serves its
        # document without asking slurmctld anything: a token is needed, not a valid one.
        if not request.headers.get("X-SLURM-USER-TOKEN"):
            return web.Response(status=401, text="Authentication failure")
        if self.faults.openapi_hidden:
            return web.Response(status=404, text="Not Found")
        return json_response(self.openapi_document())

    async def _serve(
        self, request: web.Request, handler: Callable[[web.Request, str], Awaitable[_Reply]]
    ) -> web.StreamResponse:
        source = _client_source(request)
        token = request.headers.get("X-SLURM-USER-TOKEN")
        header_user = request.headers.get("X-SLURM-USER-NAME")
        if not token:
            # rest_auth/jwt finds no credentials: slurmrestd rejects before any handler.
            return web.Response(status=401, text="Authentication failure")
        check = verify_token(
            self.key, token, header_user, self.clock.now(), self.proxy_users, self.jwks
        )
        if check.user is None:
            # slurmrestd does not check tokens: slurmctld refuses the RPC, and slurmrestd
            # 24.11.5 answers 511 with the failed query in `errors` (seen on a real one).
            operation = getattr(handler, "__name__", "")
            failure = SlurmError(
                e.SLURM_PROTOCOL_AUTHENTICATION_ERROR,
                _AUTH_FAILURE_DESCRIPTION.get(operation, "Failure to query"),
                _AUTH_FAILURE_SOURCE.get(operation, "_op_handler"),
            )
            log.info("slurm_token_refused", cluster=self.name, problem=check.problem)
            return self._error_response(request, failure, source, header_user)
        user = check.user
        if self.faults.down == "controller":
            failure = SlurmError(
                e.SLURMCTLD_COMMUNICATIONS_CONNECTION_ERROR,
                "Unable to contact slurmctld",
                "slurm_load_ctl_conf()",
            )
            return self._error_response(request, failure, source, user)
        if self.faults.roll(self.faults.error_rate):
            failure = SlurmError(e.SLURM_ERROR, "Simulated internal failure", "clustersim")
            return self._error_response(request, failure, source, user)
        self.cluster.tick()
        try:
            reply = await handler(request, user)
        except _ErrorsIn200 as partial:
            partial_body = {
                **partial.data,
                "meta": render.meta(self.cluster, source, user, self.release, _api(request)),
                "errors": [partial.entry],
                "warnings": [],
            }
            return json_response(partial_body)
        except SlurmError as failure:
            if failure.error_number == e.SLURM_NO_CHANGE_IN_DATA:
                return web.Response(status=304)
            return self._error_response(request, failure, source, user)
        body: Json = {
            **reply.data,
            "meta": render.meta(self.cluster, source, user, self.release, _api(request)),
            "errors": [],
            "warnings": reply.warnings,
        }
        if self.faults.roll(self.faults.errors_in_200_rate):
            body = _emptied(body)
            body["errors"].append(
                SlurmError(
                    e.SLURMCTLD_COMMUNICATIONS_CONNECTION_ERROR,
                    "Simulated failure answered with HTTP 200",
                    "clustersim",
                ).as_entry()
            )
        return json_response(body)

    def _error_response(
        self,
        request: web.Request,
        failure: SlurmError,
        source: str,
        user: str | None,
        status: int | None = None,
    ) -> web.Response:
        body = {
            "meta": render.meta(self.cluster, source, user, self.release, _api(request)),
            "errors": [failure.as_entry()],
            "warnings": [],
        }
        code = status if status is not None else e.http_status_for(failure.error_number)
        return json_response(body, code)

    # ---- slurmrestd handlers ----

    async def _ping(self, request: web.Request, user: str) -> _Reply:
        return _Reply({"pings": [render.ping(self.cluster, _api(request))]})

    async def _nodes(self, request: web.Request, user: str) -> _Reply:
        _not_modified_since(request, self.cluster.last_node_update)
        version = _api(request)
        nodes = [self._render_node(n, version) for n in self.cluster.nodes.values()]
        return _Reply({"nodes": nodes, "last_update": render.no_val(self.cluster.last_node_update)})

    async def _node(self, request: web.Request, user: str) -> _Reply:
        name = request.match_info["node_name"]
        node = self.cluster.nodes.get(name)
        last_update = render.no_val(self.cluster.last_node_update)
        if node is None:
            # slurmctld answers an empty list without an error code, so slurmrestd reports
            # the failure inside an HTTP 200 body: clients must read `errors`.
            failure = {"description": f"Failure to query node {name}", "source": "_dump_nodes"}
            raise _ErrorsIn200({"nodes": [], "last_update": last_update}, failure)
        return _Reply(
            {"nodes": [self._render_node(node, _api(request))], "last_update": last_update}
        )

    async def _update_node(self, request: web.Request, user: str) -> _Reply:
        update = parse_node_update(await _json_body(request), _api(request))
        self.cluster.update_node(
            request.match_info["node_name"],
            user,
            update.states,
            update.reason,
            update.comment,
            update.reason_user,
        )
        return _Reply({}, [render.warning(w, "_update_node") for w in update.warnings])

    async def _delete_node(self, request: web.Request, user: str) -> _Reply:
        self.cluster.delete_node(request.match_info["node_name"], user)
        return _Reply({})

    async def _jobs(self, request: web.Request, user: str) -> _Reply:
        _not_modified_since(request, self.cluster.last_job_update)
        jobs = [render.job(self.cluster, j, _api(request)) for j in self.cluster.jobs.values()]
        return _Reply(
            {
                "jobs": jobs,
                "last_backfill": render.no_val(self.cluster.last_job_update),
                "last_update": render.no_val(self.cluster.last_job_update),
            }
        )

    async def _job(self, request: web.Request, user: str) -> _Reply:
        job = self.cluster.get_job(_job_id(request))
        return _Reply(
            {
                "jobs": [render.job(self.cluster, job, _api(request))],
                "last_backfill": render.no_val(self.cluster.last_job_update),
                "last_update": render.no_val(self.cluster.last_job_update),
            }
        )

    async def _cancel_job(self, request: web.Request, user: str) -> _Reply:
        job_id = _job_id(request)
        if self.cluster.cancel_job(job_id, user):
            return _Reply({})
        warning = render.warning(f"Job {job_id} was already completed", "_handle_job_delete")
        return _Reply({}, [warning])

    async def _submit(self, request: web.Request, user: str) -> _Reply:
        version = _api(request)
        parsed = parse_job_submit(await _json_body(request), version)
        job_id = self.cluster.submit_job(parsed.request, user)
        result = {
            "job_id": job_id,
            "step_id": "batch",
            "error_code": 0,
            "error": "No error",
            "job_submit_user_msg": "",
        }
        answer = {
            "result": result,
            "job_id": job_id,
            "step_id": "batch",
            "job_submit_user_msg": "",
        }
        return _Reply(
            {key: value for key, value in answer.items() if key in version.job_submit_fields},
            [render.warning(w, "job_submit_req") for w in parsed.warnings],
        )

    async def _reservations(self, request: web.Request, user: str) -> _Reply:
        reservations = [render.reservation(r) for r in self.cluster.reservations.values()]
        return _Reply({"reservations": reservations, "last_update": render.no_val(None)})

    async def _reservation(self, request: web.Request, user: str) -> _Reply:
        name = request.match_info["reservation_name"]
        found = self.cluster.reservations.get(name)
        if found is None:
            raise SlurmError(
                e.ESLURM_RESERVATION_INVALID, f"Reservation {name!r} not found", "_op_handler"
            )
        return _Reply(
            {"reservations": [render.reservation(found)], "last_update": render.no_val(None)}
        )

    async def _create_reservation(self, request: web.Request, user: str) -> _Reply:
        parsed = parse_reservation(await _json_body(request), _api(request))
        created = self.cluster.create_reservation(
            user,
            parsed.name,
            parsed.nodes,
            parsed.start,
            parsed.minutes,
            parsed.flags,
            parsed.users,
        )
        return _Reply(
            {"reservations": [render.reservation(created)]},
            [render.warning(w, "_create_reservation") for w in parsed.warnings],
        )

    async def _delete_reservation(self, request: web.Request, user: str) -> _Reply:
        self.cluster.delete_reservation(user, request.match_info["reservation_name"])
        return _Reply({})

    # ---- admin API (dev/test only; no auth, loopback only) ----

    async def _admin_state(self, request: web.Request) -> web.Response:
        self.cluster.tick()
        nodes = {n.name: self.cluster.node_state(n) for n in self.cluster.nodes.values()}
        jobs = {
            str(j.job_id): {"state": j.state, "nodes": list(j.allocation)}
            for j in self.cluster.jobs.values()
        }
        return web.json_response(
            {"cluster": self.name, "nodes": nodes, "jobs": jobs, "faults": self.faults.as_dict()}
        )

    async def _admin_faults(self, request: web.Request) -> web.Response:
        body = await _admin_json(request)
        if body.get("down") == "refuse":
            raise web.HTTPBadRequest(text="refuse mode needs the Python API (RunningSlurm)")
        try:
            self.set_faults(**body)
        except (TypeError, ValueError) as exc:
            raise web.HTTPBadRequest(text=str(exc)) from exc
        return web.json_response(self.faults.as_dict())

    async def _admin_clear_faults(self, request: web.Request) -> web.Response:
        self.clear_faults()
        return web.json_response(self.faults.as_dict())

    async def _admin_register(self, request: web.Request) -> web.Response:
        body = await _admin_json(request)
        try:
            self.register_node(**body)
        except (TypeError, ValueError) as exc:
            raise web.HTTPBadRequest(text=str(exc)) from exc
        return web.json_response(self.node_json(body["name"]))

    async def _admin_lost(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if name not in self.cluster.nodes:
            raise web.HTTPNotFound(text=f"no node {name}")
        self.mark_lost(name)
        return web.json_response(self.node_json(name))

    async def _admin_remove(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if name not in self.cluster.nodes:
            raise web.HTTPNotFound(text=f"no node {name}")
        self.remove_node(name)
        return web.json_response({"removed": name})

    async def _admin_token(self, request: web.Request) -> web.Response:
        body = await _admin_json(request)
        token = self.mint_token(
            str(body.get("user", "root")), int(body.get("lifespan", DEFAULT_LIFESPAN_SECONDS))
        )
        return web.json_response({"token": token})

    async def _admin_advance(self, request: web.Request) -> web.Response:
        if not isinstance(self.clock, ManualClock):
            raise web.HTTPConflict(text="the clock is the wall clock; it cannot be advanced")
        body = await _admin_json(request)
        self.clock.advance(float(body.get("seconds", 0)))
        self.cluster.tick()
        return web.json_response({"now": self.clock.now()})


_API_KEY = web.RequestKey("slurm_api", SlurmApiVersion)
# Method, path under the version's prefix, handler (its name also picks the auth failure text).
_SLURM_ROUTES = (
    ("GET", "/ping", "_ping"),
    ("GET", "/nodes", "_nodes"),
    ("GET", "/node/{node_name}", "_node"),
    ("POST", "/node/{node_name}", "_update_node"),
    ("DELETE", "/node/{node_name}", "_delete_node"),
    ("GET", "/jobs", "_jobs"),
    ("GET", "/job/{job_id}", "_job"),
    ("DELETE", "/job/{job_id}", "_cancel_job"),
    ("POST", "/job/submit", "_submit"),
    ("GET", "/reservations", "_reservations"),
    ("GET", "/reservation/{reservation_name}", "_reservation"),
)
# From v0.0.43 (Slurm 25.05) on; Slurm 24.11's slurmrestd only lists reservations. (26.05's
# v0.0.42 also has DELETE /reservation/{name}: not emulated, Nodeflow writes with v0.0.43+.)
_RESERVATION_WRITE_ROUTES = (
    ("POST", "/reservation", "_create_reservation"),
    ("DELETE", "/reservation/{reservation_name}", "_delete_reservation"),
)


def _routes(version: SlurmApiVersion) -> tuple[tuple[str, str, str], ...]:
    if version.writes_reservations:
        return _SLURM_ROUTES + _RESERVATION_WRITE_ROUTES
    return _SLURM_ROUTES


# slurmrestd's document lists these with a trailing slash (/slurm/v0.0.42/nodes/).
_LISTED_WITH_SLASH = frozenset({"/ping", "/nodes", "/jobs", "/reservations"})


async def _answer_twice(request: web.Request, response: web.StreamResponse) -> None:
    """Send `response` with `Connection: Close`, then a second text/plain answer of the same
    status on the same connection (what Slurm 26.05.5's slurmrestd sends for an error)."""
    response.force_close()
    await response.prepare(request)
    await response.write_eof()
    text = (response.reason or "error").encode()
    second = (
        f"HTTP/1.1 {response.status} {response.reason}\r\nConnection: Close\r\n"
        f"Content-Length: {len(text)}\r\nContent-Type: text/plain\r\n\r\n"
    ).encode() + text
    if request.transport is not None:
        request.transport.write(second)


def _api(request: web.Request) -> SlurmApiVersion:
    """The API version of the path the request came in on."""
    return request[_API_KEY]


_AUTH_FAILURE_DESCRIPTION = {
    "_nodes": "Failure to query nodes",
    "_node": "Failure to query nodes",
    "_jobs": "Failure to query jobs",
    "_job": "Failure to query jobs",
    "_ping": "Failure to ping controllers",
    "_update_node": "Failure to update node",
    "_delete_node": "Failure to delete node",
    "_cancel_job": "Failure to signal job",
    "_submit": "Batch job submission failed",
}
_AUTH_FAILURE_SOURCE = {
    "_nodes": "_dump_nodes",
    "_node": "_dump_nodes",
    "_update_node": "_update_node",
    "_delete_node": "_delete_node",
    "_submit": "slurm_submit_batch_job()",
}


class _ErrorsIn200(Exception):
    """A failure slurmrestd reports inside an HTTP 200 body."""

    def __init__(self, data: Json, entry: Json) -> None:
        super().__init__(entry["description"])
        self.data = data
        self.entry = entry


def _not_modified_since(request: web.Request, last_update: float) -> None:
    raw = request.query.get("update_time")
    if raw is None:
        return
    if not raw.lstrip("-").isdigit():
        raise SlurmError(e.ESLURM_REST_INVALID_QUERY, "update_time must be an integer", "query")
    if int(raw) >= int(last_update):
        raise SlurmError(e.SLURM_NO_CHANGE_IN_DATA, "No change since update_time", "query")


def _job_id(request: web.Request) -> int:
    raw = request.match_info["job_id"]
    if not raw.isdigit():
        raise SlurmError(e.ESLURM_INVALID_JOB_ID, f"Invalid JobId={raw}", "_op_handler_job")
    return int(raw)


async def _json_body(request: web.Request) -> object:
    text = await request.text()
    if not text.strip():
        raise SlurmError(e.ESLURM_REST_INVALID_QUERY, "Request body is empty", "body")
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise SlurmError(e.ESLURM_REST_FAIL_PARSING, f"Invalid JSON: {exc}", "body") from exc


async def _admin_json(request: web.Request) -> Json:
    try:
        body = await request.json() if request.can_read_body else {}
    except json.JSONDecodeError as exc:
        raise web.HTTPBadRequest(text=f"invalid JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise web.HTTPBadRequest(text="expected a JSON object")
    return body


def _client_source(request: web.Request) -> str:
    peer = request.transport.get_extra_info("peername") if request.transport else None
    if isinstance(peer, tuple) and len(peer) >= 2:
        return f"[{peer[0]}]:{peer[1]}"
    return "[unknown]"


def _emptied(body: Json) -> Json:
    """The body of a query that failed: every data list empty, meta kept."""
    return {key: ([] if isinstance(value, list) else value) for key, value in body.items()}


@dataclass
class RunningSlurm:
    """An emulator served on 127.0.0.1 (what `run_slurm_emulator` yields)."""

    url: str
    key_path: Path
    emulator: SlurmEmulator
    port: int
    _runner: web.AppRunner
    _site: web.TCPSite | None

    @property
    def cluster(self) -> SlurmCluster:
        return self.emulator.cluster

    @property
    def api_versions(self) -> tuple[SlurmApiVersion, ...]:
        """The API versions served, oldest first."""
        return self.emulator.api_versions

    @property
    def api_prefix(self) -> str:
        """`/slurm/<newest version served>`, the one a client that negotiates would choose."""
        return self.emulator.release.newest.prefix

    def mint_token(self, user: str = "root", lifespan: int = DEFAULT_LIFESPAN_SECONDS) -> str:
        return self.emulator.mint_token(user, lifespan)

    def headers(self, user: str = "root") -> dict[str, str]:
        return {"X-SLURM-USER-NAME": user, "X-SLURM-USER-TOKEN": self.mint_token(user)}

    async def go_down(self, mode: str = "refuse") -> None:
        """Make slurmrestd unreachable: connections refused, or the given answer mode."""
        if mode == "refuse":
            if self._site is not None:
                await self._site.stop()
                self._site = None
            self.emulator.faults.down = "refuse"
            return
        self.emulator.set_faults(down=mode)

    async def come_back(self) -> None:
        if self._site is None:
            self._site = web.TCPSite(self._runner, "127.0.0.1", self.port)
            await self._site.start()
        self.emulator.faults.down = None


@contextlib.asynccontextmanager
async def run_slurm_emulator(
    name: str = "sim",
    *,
    clock: Clock | None = None,
    key_path: Path | None = None,
    driver_interval: float | None = None,
    **options: Any,
) -> AsyncIterator[RunningSlurm]:
    """Serve a fresh emulator on 127.0.0.1:<free port> until the block ends.

    With the wall clock a driver task ticks every `driver_interval` seconds (0.5 by
    default); with a ManualClock nothing moves unless the test advances it.
    """
    chosen_clock = clock or SystemClock()
    with tempfile.TemporaryDirectory(prefix=f"slurm-{name}-") as tmp:
        path = key_path or Path(tmp) / "jwt_hs256.key"
        emulator = SlurmEmulator(name, key_path=path, clock=chosen_clock, **options)
        runner = web.AppRunner(emulator.app(), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = _bound_port(site)
        interval = driver_interval
        if interval is None and isinstance(chosen_clock, SystemClock):
            interval = 0.5
        driver = asyncio.create_task(emulator.drive(interval)) if interval else None
        running = RunningSlurm(
            url=f"http://127.0.0.1:{port}",
            key_path=path,
            emulator=emulator,
            port=port,
            _runner=runner,
            _site=site,
        )
        try:
            yield running
        finally:
            if driver is not None:
                driver.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await driver
            await runner.cleanup()


def _bound_port(site: web.TCPSite) -> int:
    server = site._server
    sockets = getattr(server, "sockets", None)
    if not sockets:
        raise RuntimeError("the emulator's site has no listening socket")
    return int(sockets[0].getsockname()[1])
